"""One served replica, simulated step by step as vLLM v1's scheduler runs it (issue 40).

Each engine step the scheduler fills a token budget (`max_num_batched_tokens`): first the running
requests in the order they were admitted (a decoding request takes one token, a request still in
its prefill takes the next chunk of its prompt that fits), then waiting requests, first come first
served, while the budget, `max_num_seqs` and the KV cache allow. A request whose next tokens find no
free KV block preempts the most recently admitted running request, which goes back to the front of
the queue and computes its prompt and output again (vLLM's recompute preemption). The step's time
comes from a `StepCost` (the kernel tables' mixed prefill+decode step, or a run's fitted model);
the step that finishes a prompt emits its first token, each decode step one token per row.

Speculative decoding (`Speculation`): each decoding row drafts K tokens and the target verifies
K + 1 positions; the row emits 1 + the tokens accepted, drawn each step from the per-position
acceptance (P(position i accepted), as a run measures it), so rows move apart as real ones do.
The step is priced with its K (`cost(prefill, rows, k)`: the draft's K forwards and the verify),
each decoding row takes K + 1 of the token budget and K + 1 KV slots, and K may follow the running
batch (a K schedule: {rows: K}, 0 turning speculation off).

Modelled: the token budget, chunked prefill mixed into decode steps, the sequence limit, FCFS
admission, KV capacity in blocks, recompute preemption, closed-loop clients or timed arrivals,
speculation with measured acceptance. Not modelled: prefix caching, the long-prefill threshold,
async scheduling's overlap, the detokenizer and API server's own time.

Decode-only stretches are skipped over in one go: while no request arrives, finishes or prefills,
every step has the same rows, so n steps cost n times one step (the step cost depends on the rows
and the prefill tokens, not on each row's context: the tables price decode attention at the
request shape's mean context, as aiconfigurator's own estimate does).
"""

from __future__ import annotations

import heapq
import math
from collections import deque
from dataclasses import dataclass, field
from typing import Protocol

import numpy as np


class StepCost(Protocol):
    def __call__(self, prefill_tokens: int, decode_rows: int, k: int = 0) -> float:
        """Seconds of one engine step running `prefill_tokens` prompt tokens and `decode_rows` decodes
        (each drafting `k` tokens and verifying k + 1 when speculating)."""


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding on a replica: K draft tokens a step (or a schedule of K by running rows),
    and the chance each draft position is accepted (position i: P(the first i+1 drafts all
    accepted), non-increasing, as `acceptance_by_position` measures it)."""

    k: int = 0
    acceptance: tuple[float, ...] = ()
    schedule: tuple[tuple[int, int], ...] = ()  # (from this many running rows, K), ascending; overrides k
    seed: int = 0

    def __post_init__(self) -> None:
        if self.k < 0 or any(k < 0 for _, k in self.schedule):
            raise ValueError("K must be >= 0")
        deepest = max([self.k, *(k for _, k in self.schedule)])
        if deepest and len(self.acceptance) < deepest:
            raise ValueError(f"acceptance needs {deepest} positions (one per draft token), got {len(self.acceptance)}")
        if any(not 0 <= p <= 1 for p in self.acceptance) or any(
                later > earlier + 1e-12 for earlier, later in zip(self.acceptance, self.acceptance[1:])):
            raise ValueError("acceptance by position must lie in [0, 1] and not increase")

    def k_at(self, rows: int) -> int:
        chosen = self.k
        for start, k in self.schedule:
            if rows >= start:
                chosen = k
        return chosen


@dataclass(frozen=True)
class ReplicaSpec:
    """What bounds one server's batch (vLLM's flags of the same names; the KV cache in tokens)."""

    max_num_seqs: int = 1024
    max_num_batched_tokens: int = 8192
    kv_capacity_tokens: int = 1 << 40
    block_size: int = 16

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "kv_capacity_tokens", "block_size"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")

    @property
    def kv_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size


@dataclass
class _Request:
    index: int
    arrival_s: float
    prompt: int
    output: int
    computed: int = 0  # tokens in the KV cache (the prompt, then the output but its newest token)
    generated: int = 0  # output tokens emitted
    to_prefill: int = 0  # tokens its prefill computes: the prompt, after a preemption its output too
    blocks: int = 0  # KV blocks held
    first_token_s: float = math.nan
    preemptions: int = 0

    def __post_init__(self) -> None:
        self.to_prefill = self.prompt

    @property
    def prefilling(self) -> bool:
        return self.computed < self.to_prefill


@dataclass
class Outcome:
    """Per request (in index order): when it arrived, got its first token and finished."""

    arrival_s: np.ndarray
    first_token_s: np.ndarray
    finish_s: np.ndarray
    output_tokens: np.ndarray
    preemptions: int = 0
    steps: int = 0
    # (seconds, running rows) at each change of the running set: the batch the replica ran at
    timeline: list[tuple[float, int]] = field(default_factory=list)

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s

    @property
    def e2e_s(self) -> np.ndarray:
        return self.finish_s - self.arrival_s

    @property
    def tpot_s(self) -> np.ndarray:
        """(e2e - TTFT) / (output tokens - 1), NaN for one-token outputs."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.output_tokens > 1, (self.finish_s - self.first_token_s)
                            / (self.output_tokens - 1), np.nan)

    def share_at_least(self, rows: int) -> float:
        """The share of time the replica ran at least `rows` requests (B >= 32: speculation's worry)."""
        if len(self.timeline) < 2:
            return 0.0
        times = np.array([t for t, _ in self.timeline] + [self.timeline[-1][0]])
        counts = np.array([n for _, n in self.timeline])
        spans = np.diff(times)
        return float(spans[counts >= rows].sum() / spans.sum()) if spans.sum() > 0 else 0.0


def _blocks_for(tokens: int, block_size: int) -> int:
    return -(-tokens // block_size)


def simulate(prompts: np.ndarray, outputs: np.ndarray, cost: StepCost, spec: ReplicaSpec,
             arrivals_s: np.ndarray | None = None, concurrency: int | None = None,
             client_starts_s: np.ndarray | None = None, client_turnaround_s: float = 0.0,
             speculation: Speculation | None = None) -> Outcome:
    """Requests through one replica: at `arrivals_s` (open loop), or from `concurrency` clients that
    each send their next request when the last one finished (closed loop, as `vllm bench serve
    --max-concurrency` and NVIDIA's measured rows), client j first at `client_starts_s[j]` (default
    all at 0); its next request reaches the engine `client_turnaround_s` after the last one's final
    token (its HTTP round trip: the engine has started its next step by then, so the request waits
    for it). `speculation`: each decode step drafts and verifies (see `Speculation`). Prompts and
    outputs in tokens."""
    prompts, outputs = np.asarray(prompts, int), np.asarray(outputs, int)
    count = len(prompts)
    if (arrivals_s is None) == (concurrency is None):
        raise ValueError("give arrivals (open loop) or a concurrency (closed loop), one of them")
    if count == 0:
        raise ValueError("no requests to simulate")
    if (prompts < 1).any() or (outputs < 1).any():
        raise ValueError("every request needs a prompt and an output of at least one token")
    too_big = [i for i in range(count) if _blocks_for(prompts[i] + outputs[i], spec.block_size) > spec.kv_blocks]
    if too_big:
        i = too_big[0]
        raise ValueError(f"request {i} ({prompts[i]} + {outputs[i]} tokens) needs more KV cache than the replica "
                         f"has ({spec.kv_capacity_tokens} tokens)")
    requests = [_Request(i, 0.0, int(prompts[i]), int(outputs[i])) for i in range(count)]
    pending: list[tuple[float, int]] = []  # (arrival, index): requests not yet arrived
    if arrivals_s is not None:
        for i, at in enumerate(np.asarray(arrivals_s, float)):
            requests[i].arrival_s = float(at)
            heapq.heappush(pending, (float(at), i))
        sent = count
    else:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        sent = min(int(concurrency), count)
        starts = np.zeros(sent) if client_starts_s is None else np.asarray(client_starts_s, float)[:sent]
        for i in range(sent):
            requests[i].arrival_s = float(starts[i])
            heapq.heappush(pending, (float(starts[i]), i))
    rng = np.random.default_rng(speculation.seed if speculation else 0)
    acceptance = np.asarray(speculation.acceptance if speculation else (), float)
    waiting: deque[_Request] = deque()
    running: list[_Request] = []
    free_blocks = spec.kv_blocks
    now, steps, preemptions, done = 0.0, 0, 0, 0
    finish = np.full(count, np.nan)
    timeline: list[tuple[float, int]] = [(0.0, 0)]

    def arrive_until(t: float) -> None:
        while pending and pending[0][0] <= t:
            _, i = heapq.heappop(pending)
            waiting.append(requests[i])

    def preempt_last() -> None:
        nonlocal free_blocks, preemptions
        victim = running.pop()
        free_blocks += victim.blocks
        # its output so far stays sent; the prompt and that output are computed again (vLLM's recompute)
        victim.blocks, victim.computed, victim.to_prefill = 0, 0, victim.prompt + victim.generated
        victim.preemptions += 1
        preemptions += 1
        waiting.appendleft(victim)

    while done < count:
        arrive_until(now)
        if not running and not waiting:
            now = pending[0][0]  # idle until the next arrival
            continue
        budget = spec.max_num_batched_tokens
        # this step's K, by the rows decoding now (a K schedule), 0 without speculation
        decoding = sum(1 for r in running if not r.prefilling)
        k = speculation.k_at(decoding) if speculation and decoding else 0
        chunks: dict[int, int] = {}  # request index -> tokens computed this step
        # 1. running requests, in admission order
        position = 0
        while position < len(running) and budget > 0:
            request = running[position]
            need = min(request.to_prefill - request.computed, budget) if request.prefilling else 1 + k
            if need > budget:  # a decode needs its K + 1 slots in the budget
                break
            held_after = request.computed + need
            extra = _blocks_for(held_after, spec.block_size) - request.blocks
            while extra > free_blocks and running[-1] is not request:
                preempt_last()
            if extra > free_blocks:  # it is the last one left: it preempts itself
                preempt_last()
                break
            free_blocks -= extra
            request.blocks += extra
            chunks[request.index] = need
            budget -= need
            position += 1
        # 2. waiting requests, first come first served
        while waiting and budget > 0 and len(running) < spec.max_num_seqs:
            request = waiting[0]
            need = min(request.to_prefill - request.computed, budget)
            blocks = _blocks_for(request.computed + need, spec.block_size)
            if blocks > free_blocks:
                break
            waiting.popleft()
            free_blocks -= blocks
            request.blocks = blocks
            running.append(request)
            chunks[request.index] = need
            budget -= need
        if not chunks:  # nothing fits: the queue waits for KV blocks (cannot happen: a lone request fits)
            raise RuntimeError("the replica scheduled nothing although requests are waiting")
        prefilling = {i for i in chunks if requests[i].prefilling}
        prefill_tokens = sum(chunks[i] for i in prefilling)
        decode_rows = len(chunks) - len(prefilling)
        repeat = 1
        emitted: dict[int, int] = {}  # decoding rows: tokens each emits this step
        if k > 0:  # speculation: each row's accepted drafts drawn, no skipping (rows move apart)
            draws = rng.random(len(chunks))
            for draw, i in zip(draws, chunks):
                if i not in prefilling:
                    accepted = int((draw < acceptance[:k]).sum())
                    emitted[i] = min(1 + accepted, requests[i].output - requests[i].generated)
            step_s = cost(prefill_tokens, decode_rows, k)
        elif prefill_tokens == 0:  # a decode-only stretch: skip to the next arrival, finish or KV limit
            left = min(requests[i].output - requests[i].generated for i in chunks)
            next_arrival = pending[0][0] if pending else math.inf
            step_s = cost(0, decode_rows)
            repeat = max(1, min(left, int((next_arrival - now) // step_s) if math.isfinite(next_arrival) else left))
            # KV: every row grows by `repeat` tokens; stop early if the blocks would run out
            while repeat > 1:
                grow = sum(_blocks_for(requests[i].computed + repeat, spec.block_size) - requests[i].blocks
                           for i in chunks)
                if grow <= free_blocks:
                    break
                repeat //= 2
            for i in chunks:
                request = requests[i]
                extra = _blocks_for(request.computed + repeat, spec.block_size) - request.blocks
                free_blocks -= max(extra, 0)
                request.blocks += max(extra, 0)
        else:
            step_s = cost(prefill_tokens, decode_rows)
        now += step_s * repeat
        steps += repeat
        finished = []
        for i, n in chunks.items():
            request = requests[i]
            if i in prefilling:
                request.computed += n
                if request.computed == request.to_prefill:  # the step that ends a prefill samples a token
                    request.generated += 1
                    if math.isnan(request.first_token_s):
                        request.first_token_s = now
            elif i in emitted:  # a speculative step: the accepted drafts and the target's own token
                request.computed += emitted[i]
                request.generated += emitted[i]
            else:
                request.computed += repeat
                request.generated += repeat
            if request.generated >= request.output:
                finished.append(request)
        for request in finished:
            running.remove(request)
            free_blocks += request.blocks
            request.blocks = 0
            finish[request.index] = now
            done += 1
            if concurrency is not None and sent < count:  # that client sends its next request now
                requests[sent].arrival_s = now + client_turnaround_s
                heapq.heappush(pending, (now + client_turnaround_s, sent))
                sent += 1
        if finished or len(running) != timeline[-1][1]:
            timeline.append((now, len(running)))
    return Outcome(np.array([r.arrival_s for r in requests]), np.array([r.first_token_s for r in requests]), finish,
                   outputs.copy(), preemptions, steps, timeline)
