"""A replica's steps priced from NVIDIA's kernel tables (fit/kernel_tables.py) and the host's own
time per engine step (fit/host_cost.py), and the replica a vLLM server on that GPU would be: its default
token budget and sequence limit, and the KV cache its memory leaves at a tensor-parallel size."""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

from specbench.fit import kernel_tables
from specbench.fit.host_cost import VLLM_API_SERVER_REQUEST, ApiServerCost, check_cudagraph_mode
from specbench.drafter_kinds import DrafterKind
from specbench.fit.table_plan import KV_BYTES, Drafter, memory
from specbench.fleet.replica import ReplicaSpec
from specbench.measured import validation
from specbench.step_model import MixedTablesStep, Overheads

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

    def described(self, system: str, rows: str = "vLLM rows") -> str:
        return (f"checked on {self.rows} of NVIDIA's measured {rows} on {system}: median |error| TPOT "
                f"{self.tpot_median_abs:.1%}, TTFT {self.ttft_median_abs:.1%}; signed medians "
                f"{self.tpot_median:+.1%} and {self.ttft_median:+.1%} (below zero: simulated faster than measured; "
                f"docs/validation.md)")

    def brief(self) -> str:
        """The same at one TP, as the line's tail says it."""
        return (f"TPOT {self.tpot_median_abs:.1%} ({self.tpot_median:+.1%}), "
                f"TTFT {self.ttft_median_abs:.1%} ({self.ttft_median:+.1%})")


SILICON_CHECKS = {system: SiliconCheck(**figures) for system, figures in validation("silicon")["by_system"].items()}


# The same per GPU and TP: the errors differ by TP more than by anything else on a GPU (B200's TTFT:
# -14 % signed at TP1, -27 % at TP8, where an eager prefill step's launches outlast its kernels;
# docs/validation.md), so a plan at a TP says that TP's
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


def moe_silicon_check(system: str, target: str, backend: str = "vllm") -> str:
    """One line on how far to trust a simulation of a mixture-of-experts `target` (an alias) on
    `system`'s tables: the check against NVIDIA's measured vLLM MoE rows on that GPU, the target's
    own where they hold it (validation.json's "silicon_moe")."""
    try:
        found = validation("silicon_moe")
    except KeyError:
        found = {}
    on_gpu = found.get("by_system", {}).get(system) if backend == "vllm" else None
    if not on_gpu:
        return (f"UNCHECKED for a mixture of experts on {system}'s {backend} tables: no measured MoE rows there "
                f"were simulated")
    line = SiliconCheck(**on_gpu).described(system, "vLLM MoE rows")
    own = found.get("by_system_model", {}).get(system, {}).get(target)
    if own:
        line += f"; {target}'s own {own['rows']} rows: {SiliconCheck(**own).brief()}"
    return line + " (targets ≤ 8 % TPOT, ≤ 20 % TTFT)"


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
              async_scheduling: bool, draft_kind: str | DrafterKind = "model", **overheads) -> MixedTablesStep:
    """The replica's step on the tables (`step_model.MixedTablesStep`) for requests of `isl` tokens
    in and `osl` out, with `draft` (a draft model's or an EAGLE head's forward; none for n-gram
    drafting) as `draft_kind` runs it. The host's time overlaps the kernels with `async_scheduling`;
    `overheads` are `step_model.Overheads`'s other fields (host, launch, speculation_host, executor,
    cudagraph_mode, piecewise_layer_ms; each cost None: none), vLLM's as measured where not given."""
    return MixedTablesStep(forward, isl, osl, draft, draft_kind,
                           Overheads(async_scheduling=async_scheduling, **overheads))


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
                 draft_kind: str = "model", draft_layers: int = 0) -> ReplicaSpec:
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
    drafter = Drafter("draft", draft_kind, draft) if draft is not None else \
        Drafter("draft", draft_kind, layers=draft_layers) if draft_layers else None  # MTP: its layers
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
