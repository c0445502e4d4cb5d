"""A replica's steps priced from NVIDIA's kernel tables (fit/kernel_tables.py) and the host's own
time per engine step (fit/host_cost.py), and the replica a vLLM server on that GPU would be: its default
token budget and sequence limit, and the KV cache its memory leaves at a tensor-parallel size."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from specbench.fit import kernel_tables
from specbench.fit.host_cost import (
    COMPILED_LAUNCH,
    VLLM_API_SERVER_REQUEST,
    MULTIPROC_EXECUTOR_STEP,
    NGRAM_HOST_STEP,
    ApiServerCost,
    PIECEWISE_LAYER_MS,
    VLLM_HOST_STEP,
    HostCost,
    LaunchCost,
    SpeculationHostCost,
    check_cudagraph_mode,
    graph_bound_ms,
    served_step_ms,
)
from specbench.drafter_kinds import DrafterKind, drafter_kind
from specbench.fit.table_plan import KV_BYTES, Drafter, memory
from specbench.fleet.replica import ReplicaSpec, StepCost
from specbench.measured import validation

GIB = 1024 ** 3
# what `plan --kv-cache-dtype` offers: the model's own 16 bits, or fp8 (the tables' kvcache_quant_mode)
KV_CACHE_DTYPES = ("auto", "fp8")


@dataclass(frozen=True)
class SiliconCheck:
    """How far this simulator's mean TPOT and TTFT were from NVIDIA's measured vLLM serving rows on
    one GPU (every row simulated, nothing fitted to them): specbench/data/validation.json's "silicon",
    which the silicon check's command writes and names."""

    rows: int
    tpot_median_abs: float
    tpot_median: float
    ttft_median_abs: float
    ttft_median: float

    def described(self, system: str) -> str:
        return (f"checked on {self.rows} of NVIDIA's measured vLLM rows on {system}: median |error| TPOT "
                f"{self.tpot_median_abs:.1%}, TTFT {self.ttft_median_abs:.1%}; signed medians "
                f"{self.tpot_median:+.1%} and {self.ttft_median:+.1%} (below zero: simulated faster than measured; "
                f"docs/fleet-validation.md)")

    def brief(self) -> str:
        """The same at one TP, as the line's tail says it."""
        return (f"TPOT {self.tpot_median_abs:.1%} ({self.tpot_median:+.1%}), "
                f"TTFT {self.ttft_median_abs:.1%} ({self.ttft_median:+.1%})")


SILICON_CHECKS = {system: SiliconCheck(**figures) for system, figures in validation("silicon")["by_system"].items()}


# The same per GPU and TP: the errors differ by TP more than by anything else on a GPU (B200's TTFT:
# -14 % signed at TP1, -27 % at TP8, where an eager prefill step's launches outlast its kernels;
# docs/fleet-validation.md), so a plan at a TP says that TP's
SILICON_CHECKS_BY_TP = {(system, int(tp)): SiliconCheck(**figures)
                        for system, by_tp in validation("silicon")["by_system_tp"].items()
                        for tp, figures in by_tp.items()}
TP_CHECK_MIN_ROWS = 5  # fewer rows at a TP say nothing of it (H100 has one TP1 row)


def silicon_check(system: str, backend: str = "vllm", tps: tuple[int, ...] = ()) -> str:
    """One line on how far to trust a simulation on `system`'s `backend` tables: its check against
    NVIDIA's measured vLLM rows, or that it has none; then the same at each of `tps`."""
    found = SILICON_CHECKS.get(system) if backend == "vllm" else None
    if not found:
        return (f"UNCHECKED on {system}'s {backend} tables: the simulator was checked on NVIDIA's measured vLLM "
                f"rows on {', '.join(SILICON_CHECKS)} alone")
    per_tp = []
    for tp in tps:
        at = SILICON_CHECKS_BY_TP.get((system, tp))
        rows = at.rows if at else 0
        per_tp.append(f"TP{tp}: {at.brief()} ({rows} rows)" if rows >= TP_CHECK_MIN_ROWS else
                      f"TP{tp}: unchecked ({rows} row{'s' if rows != 1 else ''})")
    return found.described(system) + (f"; at {', '.join(per_tp)}" if per_tp else "")


@dataclass(frozen=True)
class ServerFlags:
    """The `vllm serve` flags of the same names a simulated replica runs with; None keeps vLLM's
    default on that GPU (`vllm_defaults`'s budget and sequence limit, blocks of 16, async scheduling
    on, prefix caching on). n-gram drafting always schedules synchronously: vLLM turns async
    scheduling off for it."""

    kv_cache_dtype: str = "auto"
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    block_size: int | None = None
    async_scheduling: bool | None = None
    prefix_caching: bool | None = None  # --enable-prefix-caching / --no-enable-prefix-caching
    # --compilation-config's cudagraph_mode: which steps replay CUDA graphs (step_cost's launch floor)
    cudagraph_mode: str = "FULL_AND_PIECEWISE"

    def __post_init__(self) -> None:
        if self.kv_cache_dtype not in KV_BYTES:
            raise ValueError(f"kv_cache_dtype {self.kv_cache_dtype!r}: one of {', '.join(KV_BYTES)}")
        check_cudagraph_mode(self.cudagraph_mode)
        for name in ("max_num_seqs", "max_num_batched_tokens", "block_size"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ValueError(f"--{name.replace('_', '-')} must be >= 1, got {value}")

    def applied(self, spec: ReplicaSpec, ngram: bool = False) -> ReplicaSpec:
        """`spec` (the replica vLLM's defaults give, `replica_spec`) with these flags set; a ValueError
        where vLLM would refuse them (fewer tokens a step than sequences)."""
        applied = dataclasses.replace(
            spec, max_num_seqs=self.max_num_seqs or spec.max_num_seqs,
            max_num_batched_tokens=self.max_num_batched_tokens or spec.max_num_batched_tokens,
            block_size=self.block_size or spec.block_size,
            async_scheduling=False if ngram else spec.async_scheduling if self.async_scheduling is None
            else self.async_scheduling,
            prefix_caching=spec.prefix_caching if self.prefix_caching is None else self.prefix_caching)
        if applied.max_num_batched_tokens < applied.max_num_seqs:  # vLLM's SchedulerConfig refuses it
            seqs = "--max-num-seqs" if self.max_num_seqs else "vLLM's default --max-num-seqs on this GPU"
            budget = "--max-num-batched-tokens" if self.max_num_batched_tokens else "vLLM's default budget"
            raise ValueError(f"{budget} {applied.max_num_batched_tokens} is below {seqs} ({applied.max_num_seqs}): "
                             "vLLM refuses to start with fewer tokens a step than sequences (raise the first or "
                             "lower the second)")
        return applied

    def described(self) -> str:
        """The flags set, as a header says them ("" for vLLM's defaults and a 16-bit KV cache)."""
        said = [f"KV cache {self.kv_cache_dtype}"] if self.kv_cache_dtype != "auto" else []
        said += [f"{self.max_num_batched_tokens} tokens a step"] if self.max_num_batched_tokens else []
        said += [f"{self.max_num_seqs} sequences"] if self.max_num_seqs else []
        said += [f"blocks of {self.block_size}"] if self.block_size else []
        said += [] if self.async_scheduling is None else [
            "async scheduling (not for n-gram drafting)" if self.async_scheduling else "synchronous scheduling"]
        said += [] if self.prefix_caching is None else [
            "prefix caching" if self.prefix_caching else "no prefix caching"]
        said += [] if self.cudagraph_mode == "FULL_AND_PIECEWISE" else [f"cudagraph_mode {self.cudagraph_mode}"]
        return ", ".join(said)


def step_cost(forward: kernel_tables.Forward, isl: int, osl: int, draft: kernel_tables.Forward | None = None, *,
              async_scheduling: bool, host: HostCost | None = VLLM_HOST_STEP,
              launch: LaunchCost | None = COMPILED_LAUNCH, cudagraph_mode: str = "FULL_AND_PIECEWISE",
              piecewise_layer_ms: float = PIECEWISE_LAYER_MS, draft_kind: str | DrafterKind = "model",
              speculation_host: SpeculationHostCost | None = NGRAM_HOST_STEP,
              executor: HostCost | None = MULTIPROC_EXECUTOR_STEP) -> StepCost:
    """Seconds per engine step from the tables' mixed prefill+decode step, for requests of `isl`
    tokens in and `osl` out (decode attention at their mean context), memoised per step shape. A
    prompt chunk is priced as aiconfigurator prices a mixed step's (its share of a fresh `isl`-token
    prefill); one that attends over tokens before it (an earlier chunk of its prompt, or a prefix
    found cached; `prefill_chunks`, (tokens, tokens before) per chunk, as the replica gives them)
    adds what that context adds to its attention on the tables (`Forward.over_context_ms`). A
    speculative step (k > 0) adds the draft model's k decode steps (none for n-gram drafting: no
    `draft`) and the verify's k extra positions per row (the target's verify of k + 1 positions
    less its one-token decode); the draft's forwards are as `draft_kind` (a drafter_kinds name)
    states them (`DrafterKind.draft_ms`): its first runs over `first_draft_positions` a row (the
    tokens the target verified, and a draft model's extra slot; an EAGLE head has none), which adds
    `Forward.extra_positions_ms` to its K decodes, and an EAGLE-3 head adds its fusing GEMM. The
    host's time (`host`; None: none) is added to the kernels' when the replica schedules
    synchronously, and overlaps them with `async_scheduling` (the step takes the longer of the two).
    A step's prompt tokens count as ceil(tokens / isl) requests, each new and running. A step of a
    kind drafting on the host (`draft_kind` "ngram", k > 0) adds speculation's own host work (`speculation_host` at its decoding rows and their mean
    context: the proposer's lookup, the handling of draft tokens; None: none), with the host's; a
    draft model's proposer works on the GPU, its host work beside the kernels is not priced. At
    TP > 1 the host's time also holds what vLLM's multiprocess executor adds (`executor`: the step's
    calls to its worker processes; None: none).
    A draft model also runs over every prompt chunk a step carries (its KV cache needs the prompt,
    and it proposes from the prompt's last token). A step vLLM runs outside CUDA graphs (more tokens
    than it captures, or a prefill under `cudagraph_mode` FULL_DECODE_ONLY) takes at least the
    host's time to launch the target's kernels and, with a draft model, the draft's first forward
    over the same tokens (`launch`; None: no such floor). A step replayed as graph pieces (every
    graphed step under PIECEWISE, one with a prefill under FULL_AND_PIECEWISE) adds
    `piecewise_layer_ms` for each layer of each forward it runs (the target's, and a draft model's
    prefill and K decodes)."""
    check_cudagraph_mode(cudagraph_mode)
    kind = drafter_kind(draft_kind)
    parts: dict[tuple[int, int, int], tuple[float, int, float | None]] = {}
    over_context: dict[tuple[int, int], float] = {}
    fresh: dict[tuple[int, int, int], float] = {}  # a step's seconds when no chunk attends over earlier tokens
    context = isl + osl // 2
    launch_ms = 0.0 if launch is None else launch.ms(forward.layers, forward.tp) + (
        0.0 if draft is None else launch.ms(draft.layers, draft.tp))

    def step_parts(prefill_tokens: int, decode_rows: int, k: int) -> tuple[float, int, float | None]:
        """(the kernels' ms, the layers the step's forwards run, the host's ms or None), memoised."""
        key = (prefill_tokens, decode_rows, k)
        if key not in parts:
            ms = forward.mixed_ms(prefill_tokens, decode_rows, isl, osl)
            if draft is not None and prefill_tokens > 0:
                ms += draft.mixed_ms(prefill_tokens, 0, isl, osl)
            if k > 0 and decode_rows > 0:
                ms += forward.verify_ms(decode_rows, context, k + 1) - forward.decode_ms(decode_rows, context)
                if draft is not None:
                    ms += kind.draft_ms(draft, k, draft.mixed_ms(0, decode_rows, isl, osl), decode_rows, context,
                                        kind.first_draft_positions(k))
            draft_forwards = 0 if draft is None else (prefill_tokens > 0) + (k if decode_rows > 0 else 0)
            layers = forward.layers + (0 if draft is None else draft_forwards * draft.layers)
            host_ms = None
            if host is not None:
                prompts = -(-prefill_tokens // max(isl, 1))
                host_ms = host.ms(decode_rows + prompts, prompts, prefill_tokens)
                if executor is not None and forward.tp > 1:
                    host_ms += executor.ms(decode_rows + prompts, prompts, prefill_tokens)
                if speculation_host is not None and kind.host_drafting and k > 0 and decode_rows > 0:
                    host_ms += speculation_host.ms(decode_rows, context)
            parts[key] = ms, layers, host_ms
        return parts[key]

    def over_context_ms(chunks) -> float:
        """What the step's prompt chunks add by attending over the tokens before them (the target's
        and a draft model's prefill), memoised at 16 tokens of each (a KV block)."""
        extra = 0.0
        for tokens, before in chunks:
            if before <= 0 or tokens <= 0:
                continue
            key = (-(-tokens // 16) * 16, before // 16 * 16)
            if key not in over_context:
                over_context[key] = forward.over_context_ms(*key) + (
                    0.0 if draft is None else draft.over_context_ms(*key))
            extra += over_context[key]
        return extra

    def priced(prefill_tokens: int, decode_rows: int, k: int, extra_ms: float) -> float:
        ms, layers, host_ms = step_parts(prefill_tokens, decode_rows, k)
        ms = graph_bound_ms(ms + extra_ms, prefill_tokens + decode_rows * (k + 1), prefill_tokens, layers, launch_ms,
                            cudagraph_mode, piecewise_layer_ms)
        if host_ms is not None:
            ms = served_step_ms(ms, host_ms, async_scheduling)
        return ms / 1e3

    def cost(prefill_tokens: int, decode_rows: int, k: int = 0, prefill_chunks=()) -> float:
        extra_ms = over_context_ms(prefill_chunks) if prefill_chunks else 0.0
        if extra_ms:
            return priced(prefill_tokens, decode_rows, k, extra_ms)
        key = (prefill_tokens, decode_rows, k)
        if key not in fresh:
            fresh[key] = priced(prefill_tokens, decode_rows, k, 0.0)
        return fresh[key]

    cost.uses_prefill_chunks = True
    return cost


def vllm_defaults(system: str) -> tuple[int, int]:
    """(max_num_batched_tokens, max_num_seqs) a vLLM API server picks on this GPU (vLLM 0.32's
    arg_utils: 16384 and 1024 from 160 GiB of memory, 8192 and 1024 from 70 GiB except A100s,
    2048 and 256 below)."""
    memory = kernel_tables.device(system).memory_bytes
    if memory >= 160 * GIB:
        return 16384, 1024
    if memory >= 70 * GIB and "a100" not in system:
        return 8192, 1024
    return 2048, 256


def replica_spec(config: dict, system: str, tp: int, gemm_quant: str | None = None, draft: dict | None = None,
                 draft_tp: int | None = None, kv_cache_dtype: str = "auto",
                 async_scheduling: bool = True, draft_gemm_quant: str | None = None,
                 prefix_caching: bool = True,
                 api_server: ApiServerCost | None = VLLM_API_SERVER_REQUEST,
                 draft_kind: str = "model") -> ReplicaSpec:
    """The replica vLLM would run: its default budget and sequence limit, async scheduling (its
    default on a GPU since v0.14; vLLM turns it off for n-gram drafting), prefix caching (its
    default in v1: what a request finds cached it does not compute), and the KV cache in
    tokens that 90 % of the GPUs' memory leaves after the weights (split over TP; a draft's too, as
    its `draft_kind` holds them: a draft model's at `draft_tp` and `draft_gemm_quant`'s bytes) and the tables' runtime reserve (a draft's KV
    shares every token's slot), at `kv_cache_dtype`'s bytes per value (vLLM's --kv-cache-dtype:
    "auto" keeps 16 bits): the static plan's `table_plan.memory` at one token a row. Each request's
    TTFT and E2E hold its API server's time (`api_server`, measured on vLLM's CPU build; None: none)."""
    if kv_cache_dtype not in KV_BYTES:
        raise ValueError(f"kv_cache_dtype {kv_cache_dtype!r}: one of {', '.join(KV_BYTES)}")
    drafter = Drafter("draft", draft_kind, draft) if draft is not None else None
    need = memory(config, drafter, tp, draft_tp or tp, 1, kernel_tables.device(system), gemm_quant, kv_cache_dtype,
                  draft_gemm_quant)
    if need.usable - need.weights - need.reserved <= 0:
        with_draft = " with the draft's" if drafter is not None else ""
        fp8 = ", or --dtype fp8" if gemm_quant is None else ""
        raise ValueError(f"the weights do not fit {system} at TP{tp}: {need.weights / GIB:.1f} GiB a GPU{with_draft} "
                         f"and the runtime's {need.reserved / GIB:.1f} GiB leave no KV cache in the "
                         f"{need.usable / GIB:.1f} GiB vLLM uses of each GPU (a larger --tp{fp8})")
    budget, seqs = vllm_defaults(system)
    api = api_server or ApiServerCost(0.0, 0.0)
    return ReplicaSpec(max_num_seqs=seqs, max_num_batched_tokens=budget, kv_capacity_tokens=need.largest_batch(),
                       async_scheduling=async_scheduling, prefix_caching=prefix_caching,
                       request_overhead_s=api.intercept_ms / 1e3,
                       request_overhead_per_prompt_token_s=api.per_prompt_token_ms / 1e3)
