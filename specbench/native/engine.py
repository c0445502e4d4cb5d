"""The decoding loops: autoregressive baseline and speculative decoding on the same machinery.

Tensors in, tokens and timings out; no I/O. Both loops run a static batch of prompts of different
lengths through a RaggedKVCache, emit up to `max_new_tokens` per request (EOS ignored unless
`stop_at_eos`), drop finished rows from the batch, and record what every step did and when every
token was emitted. On CUDA the clock synchronises the device before it is read, except for the
draft/verify boundary inside a speculative step, which is a CUDA event.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Callable, Sequence

import torch

from specbench.grid import draft_headroom
from specbench.native.drafters import Drafter, Proposal, SequenceBatch
from specbench.native.forward import CausalLM
from specbench.native.rejection import Acceptance, accept_greedy, accept_rejection_sampling
from specbench.native.sampling import SamplingParams, choose_next_tokens, logits_to_probs


@dataclass(frozen=True)
class GenerationConfig:
    max_new_tokens: int = 128
    sampling: SamplingParams = field(default_factory=SamplingParams)
    seed: int = 0
    stop_at_eos: bool = False
    eos_token_ids: tuple[int, ...] = ()

    def __post_init__(self) -> None:
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass
class StepRecord:
    """One decoding step over the active rows (one target forward)."""

    step: int
    request_ids: list[int]
    drafted: list[int]  # tokens drafted per row (0 in autoregressive steps)
    accepted: list[int]  # drafts kept per row
    emitted: list[int]  # tokens appended per row (accepted + 1, cut at the budget or EOS)
    verify_tokens: int  # positions per row in the target forward (1 in autoregressive steps)
    draft_s: float  # proposing K tokens (on CUDA between two events: no synchronisation mid-step)
    verify_s: float  # target forward + acceptance (the whole step in autoregressive decoding)
    overhead_s: float  # bookkeeping: cache commits, appends, finished-row removal
    end_s: float  # seconds since the run started


@dataclass
class GenerationResult:
    tokens: list[list[int]]  # new tokens per request, in input order
    emission_s: list[list[float]]  # when each of those tokens was emitted, seconds since start
    prompt_lengths: list[int]
    steps: list[StepRecord]
    prefill_s: float  # target prefill, ends with the first token
    draft_prefill_s: float
    total_s: float
    k: int = 0  # K; 0 for autoregressive
    drafter: str = ""
    kv_cache_bytes: int = 0  # the target's preallocated cache
    draft_kv_cache_bytes: int = 0

    @property
    def num_generated(self) -> int:
        return sum(len(t) for t in self.tokens)


AcceptFn = Callable[[Proposal, torch.Tensor, SamplingParams, torch.Generator | None], Acceptance]


def exact_acceptance(
    proposal: Proposal, target_logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> Acceptance:
    width = target_logits.shape[1] - 1
    drafts = proposal.tokens[:, :width]
    if width == 0:  # no row drafted anything (an n-gram lookup that found no match)
        zeros = torch.zeros(drafts.shape[0], dtype=torch.long, device=drafts.device)
        return Acceptance(zeros, choose_next_tokens(target_logits[:, 0], params, generator))
    if params.greedy:
        return accept_greedy(drafts, proposal.lengths, target_logits)
    draft_probs = None if proposal.probs is None else proposal.probs[:, :width]
    return accept_rejection_sampling(
        drafts, proposal.lengths, draft_probs, logits_to_probs(target_logits, params), generator
    )


class Clock:
    def __init__(self, device: torch.device) -> None:
        self.cuda = device.type == "cuda"
        self.synchronize = torch.cuda.synchronize if self.cuda else (lambda: None)
        self.synchronize()
        self.origin = time.perf_counter()

    def now(self) -> float:
        """Seconds since the start, once the device has finished everything queued."""
        self.synchronize()
        return time.perf_counter() - self.origin

    def mark(self) -> "float | torch.cuda.Event":
        """A point in the device's queue, without waiting for it (a CUDA event), so that timing a
        phase inside a step does not stop the host from queueing the next one. Read with
        `between` once a later `now()` has synchronised."""
        if not self.cuda:
            return self.now()
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def between(self, start: "float | torch.cuda.Event", end: "float | torch.cuda.Event") -> float:
        return start.elapsed_time(end) / 1e3 if self.cuda else end - start


class _Run:
    """State shared by both loops: committed tokens, per-request outputs, finishing rows."""

    def __init__(self, target: CausalLM, prompts: Sequence[Sequence[int]], config: GenerationConfig, extra: int):
        if not prompts:
            raise ValueError("no prompts")
        if any(len(p) == 0 for p in prompts):
            raise ValueError("empty prompt")
        self.config = config
        prompt_lists = [list(map(int, p)) for p in prompts]
        self.capacity = max(map(len, prompt_lists)) + config.max_new_tokens + extra
        # Rows in order of prompt length, so that the prefill runs rows of similar length together.
        order = sorted(range(len(prompt_lists)), key=lambda i: len(prompt_lists[i]))
        self.batch = SequenceBatch([prompt_lists[i] for i in order], self.capacity, target.device, order)
        self.prompt_lengths = [len(p) for p in prompt_lists]
        self.outputs: list[list[int]] = [[] for _ in prompt_lists]
        self.emission_s: list[list[float]] = [[] for _ in prompt_lists]
        self.eos = set(config.eos_token_ids)
        self.generator = torch.Generator(device=target.device).manual_seed(config.seed)

    def emit(self, new_tokens: list[list[int]], at: float) -> tuple[list[int], list[int]]:
        """Give each active row its new tokens, cut at the budget (and EOS); returns the
        emitted count per row and the rows that are still active."""
        emitted, still_active = [], []
        for row, tokens in enumerate(new_tokens):
            request = self.batch.request_ids[row]
            room = self.config.max_new_tokens - len(self.outputs[request])
            kept = tokens[:room]
            finished = len(kept) == room
            if self.config.stop_at_eos:
                for i, token in enumerate(kept):
                    if token in self.eos:
                        kept, finished = kept[: i + 1], True
                        break
            self.outputs[request].extend(kept)
            self.emission_s[request].extend([at] * len(kept))
            emitted.append(len(kept))
            if not finished:
                still_active.append(row)
        return emitted, still_active

    def result(self, steps, prefill_s, draft_prefill_s, total_s, k=0, drafter=None) -> GenerationResult:
        draft_cache = getattr(drafter, "cache", None)
        return GenerationResult(self.outputs, self.emission_s, self.prompt_lengths, steps,
                                prefill_s, draft_prefill_s, total_s, k, drafter.name if drafter else "",
                                self.target_cache.allocated_bytes, draft_cache.allocated_bytes if draft_cache else 0)


def _prefill(target: CausalLM, run: _Run) -> torch.Tensor:
    """Target prefill of the right-padded prompts; returns the first token of each row."""
    cache = target.decode_cache(run.batch.size, run.capacity)
    logits = target.prefill(cache, run.batch.tokens, run.batch.lengths)
    run.target_cache = cache
    return choose_next_tokens(logits, run.config.sampling, run.generator)


@torch.inference_mode()
def generate_autoregressive(
    target: CausalLM | torch.nn.Module, prompts: Sequence[Sequence[int]], config: GenerationConfig
) -> GenerationResult:
    target = CausalLM.wrap(target)
    run = _Run(target, prompts, config, extra=2)
    clock = Clock(target.device)
    batch = run.batch

    next_tokens = _prefill(target, run)
    host_next = next_tokens.tolist()
    prefill_s = clock.now()
    emitted, active = run.emit([[t] for t in host_next], prefill_s)
    batch.append(next_tokens[:, None], [[t] for t in host_next])

    steps: list[StepRecord] = []
    while active:
        if len(active) < batch.size:
            batch.select_rows(active)
            run.target_cache.select_rows(active)
        started = clock.now()
        cache = run.target_cache
        logits = target.step(cache, batch.last_tokens()[:, None], logits_at="last")
        next_tokens = choose_next_tokens(logits, config.sampling, run.generator)
        host_next = next_tokens.tolist()
        verified = clock.now()
        cache.set_lengths([n + 1 for n in cache.lengths])
        request_ids = list(batch.request_ids)
        emitted, active = run.emit([[t] for t in host_next], verified)
        batch.append(next_tokens[:, None], [[t] for t in host_next])
        ended = clock.now()
        zeros = [0] * len(request_ids)
        steps.append(StepRecord(len(steps), request_ids, zeros, zeros, emitted, 1, 0.0,
                                verified - started, ended - verified, ended))
    return run.result(steps, prefill_s, 0.0, clock.now())


@torch.inference_mode()
def generate_speculative(
    target: CausalLM | torch.nn.Module,
    drafter: Drafter,
    prompts: Sequence[Sequence[int]],
    config: GenerationConfig,
    k: int,
    accept: AcceptFn = exact_acceptance,
) -> GenerationResult:
    if k < 1:
        raise ValueError(f"K (draft tokens per step) must be >= 1, got {k}")
    target = CausalLM.wrap(target)
    drafter.check_compatible(target)
    run = _Run(target, prompts, config, extra=draft_headroom(k))
    clock = Clock(target.device)
    batch = run.batch

    next_tokens = _prefill(target, run)
    host_next = next_tokens.tolist()
    prefill_s = clock.now()
    emitted, active = run.emit([[t] for t in host_next], prefill_s)
    batch.append(next_tokens[:, None], [[t] for t in host_next])
    drafter.prefill(batch, run.capacity + k)
    draft_prefill_s = clock.now() - prefill_s

    steps: list[StepRecord] = []
    while active:
        if len(active) < batch.size:
            batch.select_rows(active)
            run.target_cache.select_rows(active)
            drafter.select_rows(active)
        started = clock.now()
        start_mark = clock.mark()
        proposal = drafter.propose(batch, k, config.sampling, run.generator)
        drafted_mark = clock.mark()  # no synchronisation: the verify pass queues behind the drafts

        # Verify: the pending last token and the drafts in one target forward. Only as many
        # positions as the longest proposal (an n-gram lookup may find fewer than K).
        width = max(proposal.host_lengths)
        cache = run.target_cache
        verify_input = torch.cat([batch.last_tokens()[:, None], proposal.tokens[:, :width]], dim=1)
        target_logits = target.step(cache, verify_input, logits_at="all")
        acceptance = accept(proposal, target_logits, config.sampling, run.generator)
        # Row b's new tokens: its first accepted drafts, then the correction or bonus token.
        candidates = torch.cat([proposal.tokens[:, :width], proposal.tokens[:, :1]], dim=1)
        rows = torch.arange(batch.size, device=target.device)
        candidates[rows, acceptance.accepted_counts] = acceptance.next_tokens
        host = torch.cat([acceptance.accepted_counts[:, None], candidates], dim=1).tolist()
        verified = clock.now()

        accepted = [row[0] for row in host]
        new_tokens = [row[1 : 2 + a] for row, a in zip(host, accepted)]
        # The target cache now holds the pending token and all drafts; keep pending + accepted.
        cache.set_lengths([n + a + 1 for n, a in zip(cache.lengths, accepted)])
        drafter.commit(accepted)
        request_ids = list(batch.request_ids)
        emitted, active = run.emit(new_tokens, verified)
        batch.append(candidates, new_tokens)
        ended = clock.now()
        draft_s = clock.between(start_mark, drafted_mark)
        steps.append(StepRecord(len(steps), request_ids, list(proposal.host_lengths), accepted, emitted, width + 1,
                                draft_s, verified - started - draft_s, ended - verified, ended))
    return run.result(steps, prefill_s, draft_prefill_s, clock.now(), k, drafter)
