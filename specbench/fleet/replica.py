"""One served replica, simulated step by step as vLLM v1's scheduler runs it (issue 40).

Each engine step the scheduler fills a token budget (`max_num_batched_tokens`): first the running
requests in the order they were admitted (a decoding request takes one token, a request still in
its prefill takes the next chunk of its prompt that fits), then waiting requests, first come first
served, while the budget, `max_num_seqs` and the KV cache allow. A request whose next tokens find no
free KV block preempts the most recently admitted running request, which goes back to the front of
the queue and computes its prompt and output again (vLLM's recompute preemption); a step that
preempted admits no waiting request, and a waiting request is admitted only when its whole prompt
fits in the free KV blocks (`reserve_full_input`, vLLM's default). With async scheduling
(`async_scheduling`, vLLM's default on a GPU since v0.14) each step is scheduled while the one before
it runs: it sees only the requests that arrived before that one started, and the slots and blocks of
the requests that one finishes are free a step later. `fleet.vllm_oracle` runs vLLM's own scheduler
(and its `AsyncScheduler`, driven as its engine core drives it) on the same requests and step
prices, and the tests hold the two timelines equal.
The step's time comes from a `step_model.StepModel` given each step's `StepShape` (the kernel
tables' mixed prefill+decode step with the host's time per step, `fleet.tables.step_cost`, or a
run's fitted model, `step_model.ServedStep`; a plain function of (prefill tokens, decode rows[,
K]) prices the kernels alone); the step that finishes a
prompt emits its first token, each decode step one token per row.

Speculative decoding (`Speculation`): each decoding row drafts K tokens and the target verifies
K + 1 positions; the row emits 1 + the tokens accepted, drawn each step from the per-position
acceptance (P(position i accepted), as a run measures it; `fleet.acceptance_draws`), so rows move apart as
real ones do.
The step is priced with its K (`StepShape.k`: the draft's K forwards and the verify),
each decoding row takes K + 1 of the token budget and K + 1 KV slots, and K may follow the running
batch (a K schedule: {rows: K}, 0 turning speculation off).

Automatic prefix caching (`ReplicaSpec.prefix_caching`, vLLM's `--enable-prefix-caching`): every
full unit of a request's tokens (`prefix_unit_blocks` KV blocks; one block, vLLM's own granularity,
by default) is known by a key, the units of a prompt that requests share by the keys the request
brings (`Replica.add(prefix=...)`: a shared system prompt, a trace's hash ids), every other unit by
a key of its own. A request admitted from the queue starts from the longest run of its keys the
cache holds (at most its tokens less one: the last is computed again for its logits), and the step
computes only the rest; a unit is cached as soon as a step schedules its last token, and a freed
unit stays cached until its blocks are taken again, the least recently freed first, after every
free block that holds nothing cached (`fleet.prefix_cache.PrefixCache`, vLLM's block pool). With units of more than one
block the cache is coarser than vLLM's (a unit is found or evicted whole); a unit two requests both
compute, each before the other cached it, is cached twice, as vLLM caches it.

Modelled: the token budget, chunked prefill mixed into decode steps, the sequence limit, FCFS
admission, KV capacity in blocks, recompute preemption, automatic prefix caching, closed-loop
clients or timed arrivals, speculation with measured acceptance, async scheduling's one step of lag,
the API server's own time in each request's TTFT and E2E (`request_overhead_s`, and a part per
prompt token).
Not modelled: the long-prefill threshold, the API server's time as a queue of its own, and with async
scheduling and speculation the K + 1 slots a row that finished on accepted drafts still takes in the
step scheduled before that was known.

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
from typing import Callable

import numpy as np

from specbench.fleet.acceptance_draws import AcceptanceDraws
from specbench.fleet.prefix_cache import OwnRun, PrefixCache
from specbench.schema import chain_keys
from specbench.step_model import StepModel, StepShape, as_step_model

MOST_STEPS_DRAWN = 512  # a speculative decode-only stretch draws its rows' acceptance this many steps at most


@dataclass(frozen=True)
class Speculation:
    """Speculative decoding on a replica: K draft tokens a step (or a schedule of K by running rows),
    and the chance each draft position is accepted at a decoding row's step (position i: P(the
    first i+1 drafts all accepted), non-increasing: `acceptance_by_position`, per draft, times the
    share of row-steps that drafted; `fit.acceptance.row_step_acceptance`)."""

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
    # vLLM's `scheduler_reserve_full_isl` (on by default in current vLLM): a waiting request is
    # admitted only when the KV cache holds its whole prompt, not only its first chunk
    reserve_full_input: bool = True
    # vLLM's `--async-scheduling` (its default on a GPU since v0.14, never on its CPU backend nor with
    # n-gram drafting): step N + 1 is scheduled while step N runs, before N's tokens are known
    async_scheduling: bool = False
    # vLLM's `--enable-prefix-caching` (its default on a GPU): a prompt's cached prefix is not computed
    # again; the cache's unit in KV blocks (1: vLLM's own; a trace's hash ids may cover more)
    prefix_caching: bool = False
    prefix_unit_blocks: int = 1
    # the API server's own time per request (HTTP, tokenizing, the first token's way back to the
    # client), and per prompt token: in every request's TTFT and E2E, not in the engine's steps (a
    # served fit's `overhead_s`; on the kernel tables `fit.host_cost.VLLM_API_SERVER_REQUEST`)
    request_overhead_s: float = 0.0
    request_overhead_per_prompt_token_s: float = 0.0

    def __post_init__(self) -> None:
        for name in ("max_num_seqs", "max_num_batched_tokens", "kv_capacity_tokens", "block_size",
                     "prefix_unit_blocks"):
            if getattr(self, name) < 1:
                raise ValueError(f"{name} must be >= 1, got {getattr(self, name)}")
        for name in ("request_overhead_s", "request_overhead_per_prompt_token_s"):
            if not getattr(self, name) >= 0:
                raise ValueError(f"{name} must be >= 0, got {getattr(self, name)}")

    def api_server_s(self, prompt_tokens):
        """The API server's time for requests of `prompt_tokens` (a number or an array)."""
        return self.request_overhead_s + self.request_overhead_per_prompt_token_s * prompt_tokens

    @property
    def kv_blocks(self) -> int:
        return self.kv_capacity_tokens // self.block_size

    @property
    def prefix_unit_tokens(self) -> int:
        return self.prefix_unit_blocks * self.block_size


@dataclass(eq=False)  # hashed by identity: a step's chunks are keyed by request
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
    finish_s: float = math.nan
    preemptions: int = 0
    # prefix caching (`PrefixCache`): the keys of its prompt's leading units that others may share, the
    # cached units of those it holds, and how many of its own units (those after them: no one else's) it holds
    prefix: tuple = ()
    units: list = field(default_factory=list)
    own_units: int = 0
    commit_at: int = 0  # tokens scheduled at which its next unit is full (0: not known)
    free_run: "OwnRun | None" = None  # its own units left cached by its latest preemption
    cached_tokens: int = -1  # tokens its first admission found in the prefix cache (-1: not admitted yet)

    def __post_init__(self) -> None:
        self.to_prefill = self.prompt

    def shared_units(self, unit_tokens: int) -> int:
        """How many of its units others may share: those of its prefix that its prompt fills."""
        return min(len(self.prefix), self.prompt // unit_tokens)

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
    # every inter-token gap of every request, pooled (as vllm bench serve pools ITL): distinct gaps
    # and how many tokens arrived after each (tokens a speculative step emits together: gaps of 0)
    itl_gaps_s: np.ndarray = field(default_factory=lambda: np.zeros(0))
    itl_counts: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    # prefix caching: each request's prompt tokens, and those its first admission found cached (0
    # without prefix caching, and for a request never admitted: `cached_tokens_of`)
    prompt_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    cached_tokens: np.ndarray = field(default_factory=lambda: np.zeros(0, int))
    # each request's API server time (`ReplicaSpec.api_server_s` of its prompt), in its TTFT and E2E
    api_server_s: np.ndarray | float = 0.0

    def prefix_hit_share(self) -> float:
        """The share of the prompts' tokens found in the prefix cache (0 without prefix caching)."""
        prompts = self.prompt_tokens.sum()
        return float(self.cached_tokens.sum() / prompts) if prompts else 0.0

    def itl_percentile(self, p: float) -> float:
        """The pooled inter-token latency's `p`th percentile, per token (seconds; NaN without decode
        tokens): a speculative step's tokens after a row's first are gaps of 0, as a sweep's `itl_*`."""
        return weighted_percentile(self.itl_gaps_s, self.itl_counts, p)

    def itl_chunk_percentile(self, p: float) -> float:
        """The same per streamed chunk, as `vllm bench serve` and a sweep's `itl_chunk_*` count it:
        the gaps of 0 left out, each step's gap to a row counted once however many tokens it emitted."""
        chunks = self.itl_gaps_s > 0
        return weighted_percentile(self.itl_gaps_s[chunks], self.itl_counts[chunks], p)

    @property
    def ttft_s(self) -> np.ndarray:
        return self.first_token_s - self.arrival_s + self.api_server_s

    @property
    def e2e_s(self) -> np.ndarray:
        return self.finish_s - self.arrival_s + self.api_server_s

    @property
    def tpot_s(self) -> np.ndarray:
        """(e2e - TTFT) / (output tokens - 1), NaN for one-token outputs."""
        with np.errstate(invalid="ignore", divide="ignore"):
            return np.where(self.output_tokens > 1, (self.finish_s - self.first_token_s)
                            / (self.output_tokens - 1), np.nan)

    def share_at_least(self, rows: int) -> float:
        """The share of time the replica ran at least `rows` requests (B >= 32: speculation's worry)."""
        return share_at_least(self.timeline, rows)

    def mean_running(self) -> float:
        """The time-weighted mean of the running rows: the batch the replica ran at on average."""
        return mean_running(self.timeline)


def weighted_percentile(values: np.ndarray, counts: np.ndarray, p: float) -> float:
    """The `p`th percentile of `values`, each counted `counts` times (the smallest value whose
    cumulative share reaches p %); NaN when nothing is counted."""
    values, counts = np.asarray(values, float), np.asarray(counts, float)
    if not counts.sum():
        return math.nan
    order = np.argsort(values, kind="stable")
    cumulative = np.cumsum(counts[order])
    return float(values[order][np.searchsorted(cumulative, p / 100 * cumulative[-1])])


def cached_tokens_of(requests: list[_Request], count: int) -> np.ndarray:
    """Per request index (`count` of them), the prompt tokens its first admission found cached (0
    for one never admitted)."""
    cached = np.zeros(count, int)
    for request in requests:
        cached[request.index] = max(request.cached_tokens, 0)
    return cached


def pooled_itl(replicas: list["Replica"]) -> tuple[np.ndarray, np.ndarray]:
    """Every replica's inter-token gaps, pooled: (gaps, counts)."""
    gaps = [g for r in replicas for g in r.itl_gap_s] + [0.0]
    counts = [c for r in replicas for c in r.itl_count] + [sum(r.itl_zeros for r in replicas)]
    return np.array(gaps, float), np.array(counts, int)


def _rows_and_spans(timeline: list[tuple[float, int]]) -> tuple[np.ndarray, np.ndarray]:
    """A timeline's running rows at each change and how long each held (the last: 0 s)."""
    times = np.array([t for t, _ in timeline] + [timeline[-1][0]])
    return np.array([n for _, n in timeline], float), np.diff(times)


def share_at_least(timeline: list[tuple[float, int]], rows: int) -> float:
    """The share of a timeline's time (from its first change to its last) spent at >= `rows` rows."""
    if len(timeline) < 2:
        return 0.0
    counts, spans = _rows_and_spans(timeline)
    return float(spans[counts >= rows].sum() / spans.sum()) if spans.sum() > 0 else 0.0


def mean_running(timeline: list[tuple[float, int]]) -> float:
    """A timeline's running rows averaged over its time (from its first change to its last)."""
    if len(timeline) < 2:
        return float(timeline[0][1]) if timeline else 0.0
    counts, spans = _rows_and_spans(timeline)
    return float((counts * spans).sum() / spans.sum()) if spans.sum() > 0 else float(counts.mean())


def running_percentile(timeline: list[tuple[float, int]], p: float) -> float:
    """The `p`th percentile of the running rows over a timeline's time (0 for an empty one): the
    batch the replica ran at for all but (100 - p) % of its time."""
    if len(timeline) < 2:
        return float(timeline[0][1]) if timeline else 0.0
    counts, spans = _rows_and_spans(timeline)
    return weighted_percentile(counts, spans, p) if spans.sum() > 0 else float(counts.max())


def blocks_for(tokens: int, block_size: int) -> int:
    """KV blocks `tokens` take."""
    return -(-tokens // block_size)


def check_fits(index: int, prompt: int, output: int, spec: ReplicaSpec) -> None:
    """One line if a request is empty or needs more KV cache than the replica has."""
    if prompt < 1 or output < 1:
        raise ValueError("every request needs a prompt and an output of at least one token")
    if blocks_for(prompt + output, spec.block_size) > spec.kv_blocks:
        raise ValueError(f"request {index} ({prompt} + {output} tokens) needs more KV cache than the replica "
                         f"has ({spec.kv_capacity_tokens} tokens)")


class Replica:
    """One server, stepped: requests are `add`ed with their arrival time (before or as the replica
    reaches it) and `advance` runs its engine steps up to a time. A router advances every replica
    of a fleet to each arrival, reads `outstanding`, and adds the request where it chooses;
    `simulate` drives one replica alone."""

    def __init__(self, cost: StepModel | Callable[..., float], spec: ReplicaSpec,
                 speculation: Speculation | None = None, publishes: bool = False) -> None:
        self.model, self.spec, self.speculation = as_step_model(cost), spec, speculation
        self.draws = AcceptanceDraws(speculation.acceptance if speculation else (), speculation.seed if speculation else 0)
        self.pending: list[tuple[float, int, _Request]] = []  # (arrival, index, request): not yet arrived
        self.waiting: deque[_Request] = deque()
        self.running: list[_Request] = []
        self.free_blocks = spec.kv_blocks  # with prefix caching: the free cached units' blocks too
        self.cache = PrefixCache(spec.prefix_unit_blocks, spec.prefix_unit_tokens) if spec.prefix_caching else None
        self.now, self.steps, self.preemptions = 0.0, 0, 0
        self.step_ended = -1.0  # when the latest step that computed something ended
        self.step_started = 0.0  # when the latest step began (async scheduling schedules the next one then)
        # async scheduling: the requests the latest step finished, their slots and KV blocks still
        # held while the next step is scheduled (vLLM learns they finished only after that)
        self.held: list[_Request] = []
        self.timeline: list[tuple[float, int]] = [(0.0, 0)]
        self.last_finished: list[_Request] = []  # the latest step's, finished at `now`
        # inter-token latency: each step's time and the decode tokens that arrived a step after the
        # row's last (a step's own time is every decoding row's gap), and the tokens that came with
        # another of the same step (a speculative step's accepted drafts: gaps of 0)
        self.itl_gap_s: list[float] = []
        self.itl_count: list[int] = []
        self.itl_zeros = 0
        # what the server reports as each step ends (`publishes`: a router reads it), oldest first:
        # (time, requests waiting, KV blocks in use) as vLLM's engine core makes its scheduler stats
        # (`Scheduler.make_stats`, sent with the step's outputs: what /metrics shows until the next)
        self.published: deque[tuple[float, int, int]] | None = deque([(0.0, 0, 0)]) if publishes else None

    def add(self, index: int, arrival_s: float, prompt: int, output: int, prefix: tuple = ()) -> _Request:
        """A request of `prompt` tokens in and `output` out, arriving at `arrival_s`; with prefix
        caching, `prefix` keys its prompt's leading units (`spec.prefix_unit_tokens` each) that other
        requests may share: two requests share a unit when their keys agree up to it."""
        check_fits(index, prompt, output, self.spec)
        request = _Request(index, float(arrival_s), int(prompt), int(output), prefix=chain_keys(prefix))
        heapq.heappush(self.pending, (request.arrival_s, index, request))
        return request

    def _publish(self) -> None:
        """The scheduler's stats now: those `update_from_output` makes at the end of a step (the
        requests that arrived during it not among the waiting: they reach the scheduler with the
        next), with async scheduling after the next step was scheduled."""
        published = self.published
        if published is None:
            return
        entry = (self.now, len(self.waiting), self.spec.kv_blocks - self.free_blocks)
        if published[-1][0] >= self.now:
            published[-1] = entry
        else:
            published.append(entry)

    def published_at(self, at_s: float) -> tuple[int, float]:
        """What the server last reported by `at_s` (needs `publishes`): the requests waiting
        (`vllm:num_requests_waiting`) and its KV cache's free share (1 - `vllm:kv_cache_usage_perc`).
        Times asked must not go back."""
        published = self.published
        while len(published) > 1 and published[1][0] <= at_s:
            published.popleft()
        _, waiting, used = published[0]
        return waiting, 1.0 - used / self.spec.kv_blocks

    def cached_share(self, prompt: int, keys: tuple) -> float:
        """The share of a prompt's units (of `prompt` tokens, `keys` chained: `chain_keys`) whose run
        from the first this replica's prefix cache holds now (0 without prefix caching)."""
        if self.cache is None or not keys:
            return 0.0
        units = max(prompt // self.cache.unit_tokens, 1)
        return len(self.cache.found(keys[:units])) / units

    def outstanding(self, at_s: float) -> int:
        """Requests added and not finished by `at_s` (a step under way at `at_s` has not finished
        its rows yet): what a least-outstanding-requests router counts."""
        late = len(self.last_finished) if self.now > at_s else 0
        return len(self.pending) + len(self.waiting) + len(self.running) + late

    def advance(self, until_s: float = math.inf) -> list[_Request]:
        """Every step that starts before `until_s` (the last may end after it); the requests that
        finished, in order."""
        finished: list[_Request] = []
        while self.now < until_s:
            self._arrive_for_step()
            if not self.running and not self.waiting:
                if not self.pending or self.pending[0][0] >= until_s:
                    break
                self.now = self.pending[0][0]  # idle until the next arrival
                continue
            finished += self.step(until_s)
        return finished

    def _arrive_for_step(self) -> None:
        """The arrivals the next step's schedule sees: every one by now, or with async scheduling
        (vLLM's `--async-scheduling`: a step is scheduled while the one before it runs) those that
        arrived before the running step started, unless the engine was idle."""
        if self.spec.async_scheduling and (self.running or self.waiting):
            self._arrive(self.step_started)
        else:
            if self.held:  # the engine learns the last step's finished requests: it reports them gone
                self._release_held()
                self._publish()
            self._arrive(self.now)

    def _release_held(self) -> None:
        for request in self.held:
            self._release(request)
        self.held = []

    def _take(self, request: _Request, blocks: int) -> None:
        """`blocks` more KV blocks for `request` (the caller checked they are free)."""
        self._take_free(blocks)
        request.blocks += blocks

    def _take_each(self, requests: list[_Request], tokens: list[int]) -> None:
        """The KV blocks each of `requests` needs for `tokens` more (the caller checked they are
        free), taken at once: the cached units that many blocks evict are those one request after
        another would."""
        block_size = self.spec.block_size
        extras = [-(-(r.computed + t) // block_size) - r.blocks for r, t in zip(requests, tokens)]
        blocks = sum(e for e in extras if e > 0)
        if blocks:
            self._take_free(blocks)
            for request, extra in zip(requests, extras):
                if extra > 0:
                    request.blocks += extra

    def _take_free(self, blocks: int) -> None:
        """`blocks` of the free blocks taken; with prefix caching, the cached units they come from
        (after the free blocks that hold nothing cached) are forgotten."""
        cache = self.cache
        if cache is not None:
            plain_free = self.free_blocks - cache.free_units * cache.unit_blocks
            if blocks > plain_free:
                cache.evict_for(blocks, plain_free)
        self.free_blocks -= blocks

    def _release(self, request: _Request) -> None:
        """Free `request`'s KV blocks; with prefix caching its cached units stay cached, free once no
        other request holds them, its last unit the first to be evicted."""
        freed = request.blocks
        if self.cache is not None:  # its blocks in no cached unit, and the cached units no one else holds
            units_freed, units_held = self.cache.release(request)
            freed += (units_freed - units_held) * self.cache.unit_blocks
            request.commit_at = 0
        self.free_blocks += freed
        request.blocks = 0

    def _commit(self, request: _Request, tokens: int) -> None:
        """Prefix caching: cache `request`'s shared units whose last token is among its first `tokens`
        (a step scheduled them; no further than the tokens it has: drafts are not cached)."""
        cache = self.cache
        unit_tokens = cache.unit_tokens
        full = min(tokens, request.prompt + request.generated) // unit_tokens
        shared = request.shared_units(unit_tokens)
        while len(request.units) < min(full, shared):
            request.units.append(cache.register(request.prefix[len(request.units)]))
        # its own units no other request looks for: counted when it lets them go (`PrefixCache.release`)
        request.commit_at = (len(request.units) + 1) * unit_tokens if len(request.units) < shared else math.inf

    def _arrive(self, t: float) -> None:
        while self.pending and self.pending[0][0] <= t:
            self.waiting.append(heapq.heappop(self.pending)[2])

    def _preempt_last(self) -> None:
        victim = self.running.pop()
        self._release(victim)
        # its output so far stays sent; the prompt and that output are computed again (vLLM's recompute;
        # with prefix caching, from where its own cached units, if not evicted yet, leave off)
        victim.computed, victim.to_prefill = 0, victim.prompt + victim.generated
        victim.preemptions += 1
        self.preemptions += 1
        self.waiting.appendleft(victim)

    def _price(self, prefill_tokens: int, decodes: list[_Request], k: int, grown: int = 0,
               prefills: dict | None = None) -> float:
        """The step's seconds from its model: its prompt chunks, its decoding rows (their context,
        each grown by `grown` tokens, where the model reads it) and K."""
        chunks = tuple((n, r.computed) for r, n in prefills.items()) if prefills else ()
        context = sum(r.computed for r in decodes) + grown * len(decodes) if self.model.reads_context else 0.0
        return self.model.seconds(StepShape(prefill_tokens, len(decodes), k, chunks, context))

    def step(self, until_s: float = math.inf) -> list[_Request]:
        """One engine step (or a stretch of identical decode-only steps, up to the next known
        arrival or `until_s`, whichever is first); the requests it finished."""
        k = self._step_k()
        prefills: dict[_Request, int] = {}  # prompt tokens each prefilling request computes this step
        decodes: list[_Request] = []
        preempted_before = self.preemptions
        budget = self._schedule_running(k, prefills, decodes)
        single = self._admit_waiting(budget, prefills, decodes, preempted_before)
        preempted = self.preemptions != preempted_before
        if self.spec.async_scheduling and self.now == self.step_ended:  # the step before's stats come once
            self._publish()  # this one is scheduled (after an idle spell there was no step before)
        if not prefills and not decodes:
            if preempted:  # the one running request gave its blocks back (with async scheduling the blocks
                # the step before finished were still held): vLLM runs the step empty, in no time
                self.step_started = self.now
                self.last_finished = []
                if not self.spec.async_scheduling:
                    self._publish()
                return []
            raise RuntimeError("the replica scheduled nothing although requests are waiting")  # a lone request fits
        # a step that preempted admitted no one; the next may admit what waits (the freed blocks): not stretched
        single = single or (preempted and bool(self.waiting))
        step_s, repeat, emitted = self._run_steps(prefills, decodes, k, single, until_s)
        return self._record(prefills, decodes, step_s, repeat, emitted)

    def _step_k(self) -> int:
        """This step's K, by the rows decoding now (a K schedule); 0 without speculation."""
        speculation, running = self.speculation, self.running
        if speculation is None:
            return 0
        if speculation.schedule:
            decoding = sum(1 for r in running if r.computed >= r.to_prefill)
            return speculation.k_at(decoding) if decoding else 0
        if any(r.computed >= r.to_prefill for r in running):  # (one K: whether any row decodes)
            return speculation.k
        return 0

    def _schedule_running(self, k: int, prefills: dict, decodes: list) -> int:
        """The running requests into the step, in admission order, while the token budget lasts: a
        decode takes K + 1 slots, a prefill its next chunk; a request whose KV blocks run out preempts
        the most recently admitted (itself, if it is the last). The budget left."""
        running, cache = self.running, self.cache
        block_size = self.spec.block_size
        budget = self.spec.max_num_batched_tokens
        position = 0
        decode_need = 1 + k
        while position < len(running) and budget > 0:
            request = running[position]
            computed = request.computed
            prefilling = computed < request.to_prefill
            need = min(request.to_prefill - computed, budget) if prefilling else decode_need
            if need > budget:  # a decode needs its K + 1 slots in the budget
                break
            reach = computed + need
            extra = -(-reach // block_size) - request.blocks
            if extra > 0:
                while extra > self.free_blocks and running[-1] is not request:
                    self._preempt_last()
                if extra > self.free_blocks:  # it is the last one left: it preempts itself
                    self._preempt_last()
                    break
                self._take(request, extra)
            if cache is not None and reach >= request.commit_at:
                self._commit(request, reach)
            if prefilling:
                prefills[request] = need
            else:
                decodes.append(request)
            budget -= need
            position += 1
        return budget

    def _admit_waiting(self, budget: int, prefills: dict, decodes: list, preempted_before: int) -> bool:
        """Waiting requests into the step, first come first served, while the budget, the sequence
        limit and the KV cache allow; none in a step that preempted (as vLLM's scheduler: the blocks a
        preemption freed go to the running requests, the queue waits). With async scheduling, the
        requests the step before finished let go of their slots and blocks here. Whether the step
        must run alone (not stretched): the next step may admit what still waits."""
        waiting, spec = self.waiting, self.spec
        single = False
        while True:
            while (waiting and budget > 0 and len(self.running) + len(self.held) < spec.max_num_seqs
                   and self.preemptions == preempted_before):
                request = waiting[0]  # (computed is 0: new, or preempted)
                need = self._admit(request, budget)
                if not need:
                    break
                prefills[request] = need
                budget -= need
            held = bool(self.held)  # (their blocks come with them)
            # what the requests the step before finished held is free from the next step on (async
            # scheduling): a request still waiting may be admitted then, so this step is not stretched;
            # if this one found nothing to run (vLLM runs it empty, in no time), that next one is now
            single = single or (held and bool(waiting))
            self._release_held()
            if prefills or decodes or not held:
                return single

    def _admit(self, request: _Request, budget: int) -> int:
        """The first waiting request admitted, if its KV blocks are free: the prompt tokens it computes
        this step (0: it waits). With prefix caching it starts where the longest run of its units the
        cache holds ends."""
        spec, cache = self.spec, self.cache
        block_size = spec.block_size
        hits, own = cache.hits(request) if cache is not None else ([], 0)
        hit_tokens = (len(hits) + own) * spec.prefix_unit_tokens
        hit_blocks = (len(hits) + own) * spec.prefix_unit_blocks
        need = min(request.to_prefill - hit_tokens, budget)
        blocks = -(-(hit_tokens + need) // block_size)
        # a cached unit no one holds sits among the free blocks: taking it back takes them
        retaken = cache.free_cached_blocks(hits, own) if cache is not None else 0
        # admission asks for the whole prompt's blocks (or only this chunk's); the chunk's are taken
        admitted = (-(-request.to_prefill // block_size) if spec.reserve_full_input else blocks) - hit_blocks
        if admitted + retaken > self.free_blocks:
            return 0
        self.waiting.popleft()
        request.computed, request.blocks = hit_tokens, hit_blocks
        if request.cached_tokens < 0:
            request.cached_tokens = hit_tokens
        if cache is not None:
            cache.take_back(request, hits, own)
            self.free_blocks -= retaken
            request.units, request.own_units = hits, own
        self._take(request, blocks - hit_blocks)
        if cache is not None:
            self._commit(request, hit_tokens + need)
        self.running.append(request)
        return need

    def _next_arrival(self, until_s: float) -> float:
        """Where a stretch must end: the next known arrival, or `until_s` if sooner."""
        return min(self.pending[0][0] if self.pending else math.inf, until_s)

    def _run_steps(self, prefills: dict, decodes: list, k: int, single: bool,
                   until_s: float) -> tuple[float, int, list[int]]:
        """The scheduled step priced, stretched over the identical decode-only steps after it where it
        may be: (seconds a step, steps run, with speculation the tokens each decoding row emits over
        them; else [])."""
        prefill_tokens = sum(prefills.values())
        if k > 0 and decodes:  # each row's accepted drafts drawn every step (rows move apart)
            return self._speculative_steps(prefills, prefill_tokens, decodes, k, single, until_s)
        if prefill_tokens == 0 and not single:
            return (*self._decode_stretch(decodes, until_s), [])
        return self._price(prefill_tokens, decodes, k, prefills=prefills), 1, []

    def _speculative_steps(self, prefills: dict, prefill_tokens: int, decodes: list, k: int, single: bool,
                           until_s: float) -> tuple[float, int, list[int]]:
        """A speculative step, or a decode-only stretch of them to the next arrival or the first finish:
        (seconds a step, steps, each row's tokens over them), the rows' acceptance drawn every step."""
        block_size = self.spec.block_size
        step_s = self._price(prefill_tokens, decodes, k, prefills=prefills)
        left = [r.output - r.generated for r in decodes]
        steps = 1
        if prefill_tokens == 0 and not single:
            # a stretch ends at the next arrival: before the step it arrives in, or with async
            # scheduling after it (that step was scheduled before the arrival either way)
            lag = 1 if self.spec.async_scheduling else 0
            next_arrival = self._next_arrival(until_s)
            most = min(left)
            if math.isfinite(next_arrival):
                most = min(most, int((next_arrival - self.now) // step_s) + lag)
            steps = max(1, min(most, MOST_STEPS_DRAWN))
        steps, totals, first = self.draws.stretch(k, left, steps)
        if steps > 1:
            totals = list(map(min, totals, left))
            grow = sum(-(-(r.computed + t) // block_size) - r.blocks for r, t in zip(decodes, totals))
            if grow > self.free_blocks:  # the KV cache would run out within the stretch: one step
                steps = 1
        if steps == 1:
            totals = list(map(min, first, left))
        else:  # the blocks beyond the first step's K + 1 slots, reserved above
            self._take_each(decodes, totals)
        return step_s, steps, totals

    def _decode_stretch(self, decodes: list, until_s: float) -> tuple[float, int]:
        """Plain decode-only steps to the next arrival, the first finish or the KV cache's limit:
        (seconds a step, steps)."""
        block_size = self.spec.block_size
        lag = 1 if self.spec.async_scheduling else 0  # (as in `_speculative_steps`)
        left = min(r.output - r.generated for r in decodes)
        next_arrival = self._next_arrival(until_s)
        step_s = self._price(0, decodes, 0)
        repeat = max(1, min(left, int((next_arrival - self.now) // step_s + lag)
                            if math.isfinite(next_arrival) else left))
        if self.model.reads_context and repeat > 1:  # the rows' context grows along the stretch: its middle
            step_s = self._price(0, decodes, 0, grown=repeat // 2)
        # KV: every row grows by `repeat` tokens; stop early if the blocks would run out
        while repeat > 1:
            grow = sum(-(-(r.computed + repeat) // block_size) - r.blocks for r in decodes)
            if grow <= self.free_blocks:
                break
            repeat //= 2
        if repeat > 1:
            self._take_each(decodes, [repeat] * len(decodes))
        return step_s, repeat

    def _record(self, prefills: dict, decodes: list, step_s: float, repeat: int,
                emitted: list[int]) -> list[_Request]:
        """The steps run: the clock, the inter-token gaps, each request's tokens, the requests
        finished (their blocks freed, or held a step with async scheduling), the stats and the
        timeline. The requests finished, in order."""
        if decodes:
            # one gap per step that gave a row tokens (every step gives every row one at least, and no
            # row finishes before a stretch's last step); a speculative step's further tokens: gaps of 0
            gapped = len(decodes) * repeat
            self.itl_gap_s.append(step_s)
            self.itl_count.append(gapped)
            if emitted:
                self.itl_zeros += sum(emitted) - gapped
        self.step_started = self.now + step_s * (repeat - 1)
        self.now += step_s * repeat
        self.step_ended = self.now
        self.steps += repeat
        now = self.now
        finished = self._emit(prefills, decodes, repeat, emitted)
        if self.cache is not None and repeat > 1:  # what the stretch's later steps scheduled
            for request in decodes:
                if request.computed >= request.commit_at:
                    self._commit(request, request.computed)
        for request in finished:
            self.running.remove(request)
            if self.spec.async_scheduling:
                self.held.append(request)
            else:
                self._release(request)
            request.finish_s = now
        self.last_finished = finished
        if not self.spec.async_scheduling:
            self._publish()
        if finished or len(self.running) != self.timeline[-1][1]:
            self.timeline.append((now, len(self.running)))
        return finished

    def _emit(self, prefills: dict, decodes: list, repeat: int, emitted: list[int]) -> list[_Request]:
        """Each request's tokens computed and emitted over the steps (the step that ends a prefill
        samples the first token); the requests that have all their output now, in order."""
        now = self.now
        finished = []
        for request, n in prefills.items():
            request.computed += n
            if request.computed == request.to_prefill:  # the step that ends a prefill samples a token
                request.generated += 1
                if request.first_token_s != request.first_token_s:
                    request.first_token_s = now
                if request.generated >= request.output:
                    finished.append(request)
        if emitted:  # a speculative step: the accepted drafts and the target's own token
            for request, n in zip(decodes, emitted):
                request.computed += n
                request.generated += n
                if request.generated >= request.output:
                    finished.append(request)
        else:
            for request in decodes:
                request.computed += repeat
                request.generated += repeat
                if request.generated >= request.output:
                    finished.append(request)
        return finished


def simulate(prompts: np.ndarray, outputs: np.ndarray, cost: StepModel | Callable[..., float], spec: ReplicaSpec,
             arrivals_s: np.ndarray | None = None, concurrency: int | None = None,
             client_starts_s: np.ndarray | None = None, client_turnaround_s: float = 0.0,
             speculation: Speculation | None = None, prefixes: list[tuple] | None = None) -> Outcome:
    """Requests through one replica: at `arrivals_s` (open loop), or from `concurrency` clients that
    each send their next request when the last one finished (closed loop, as `vllm bench serve
    --max-concurrency` and NVIDIA's measured rows), client j first at `client_starts_s[j]` (default
    all at 0); its next request reaches the engine `client_turnaround_s` after the last one's final
    token (its HTTP round trip: the engine has started its next step by then, so the request waits
    for it). `speculation`: each decode step drafts and verifies (see `Speculation`). Prompts and
    outputs in tokens. `prefixes`: per request, the keys of its prompt's units others may share (with
    `spec.prefix_caching`; see `Replica.add`)."""
    prompts, outputs = np.asarray(prompts, int), np.asarray(outputs, int)
    count = len(prompts)
    prefix_of = (lambda i: ()) if prefixes is None else (lambda i: prefixes[i])
    if (arrivals_s is None) == (concurrency is None):
        raise ValueError("give arrivals (open loop) or a concurrency (closed loop), one of them")
    if count == 0:
        raise ValueError("no requests to simulate")
    replica = Replica(cost, spec, speculation)
    for i in range(count):  # every request's KV need checked before any step
        check_fits(i, int(prompts[i]), int(outputs[i]), spec)
    requests: list[_Request] = []
    if arrivals_s is not None:
        requests = [replica.add(i, at, prompts[i], outputs[i], prefix_of(i))
                    for i, at in enumerate(np.asarray(arrivals_s, float))]
        replica.advance()
    else:
        if concurrency < 1:
            raise ValueError(f"concurrency must be >= 1, got {concurrency}")
        sent = min(int(concurrency), count)
        starts = np.zeros(sent) if client_starts_s is None else np.asarray(client_starts_s, float)[:sent]
        requests = [replica.add(i, starts[i], prompts[i], outputs[i], prefix_of(i)) for i in range(sent)]
        while len(requests) < count or replica.running or replica.waiting or replica.pending:
            replica._arrive_for_step()
            if not replica.running and not replica.waiting:
                replica.now = replica.pending[0][0]  # idle until a client's next request
                continue
            for _ in replica.step():
                if len(requests) < count:  # that client sends its next request now
                    i = len(requests)
                    requests.append(replica.add(i, replica.now + client_turnaround_s, prompts[i], outputs[i],
                                                prefix_of(i)))
    return Outcome(np.array([r.arrival_s for r in requests]), np.array([r.first_token_s for r in requests]),
                   np.array([r.finish_s for r in requests]), outputs.copy(), replica.preemptions, replica.steps,
                   replica.timeline, *pooled_itl([replica]), prompts.copy(), cached_tokens_of(requests, count),
                   spec.api_server_s(prompts))
