"""Speculative decoding priced on measured kernel tables, for GPUs and tensor-parallel sizes a run
did not measure (`specbench plan --target ... --device h100 --tp 4,8`).

A step, per batch of B rows at a context of C cached tokens (the mean over the decode, prompt plus
half the output), each forward from `kernel_tables`:
- autoregressive: one target decode at B and C;
- speculative with a draft model or an EAGLE-style head: K draft forwards at B (the draft at
  `draft_tp`, 1 or the target's TP as vLLM allows) plus one target verify of K + 1 new positions
  per row over C as prefix. The first draft forward runs over every token the target verified
  and, for a draft model, the one sampled after them (K + 2 positions a row; an EAGLE head, K + 1),
  as vLLM's proposers run it (`first_draft_positions`): K one-token decodes plus what the first
  forward's extra positions add (`Forward.extra_positions_ms`); an EAGLE-3 head also fuses three
  target layers' features over those positions (a 3 × hidden → hidden GEMM);
- n-gram lookup: the verify alone (drafting is a CPU lookup; its α must come from a run);
- MTP with N layers: aiconfigurator's own pricing (the target compiled with `nextn` N: its decode
  step carries the N layers and a verify of N + 1 tokens per row as decode rows), K = N.

A request's time is the batch's prefill (target, and the draft's own) plus its decode steps:
osl - 1 autoregressive ones, or (osl - 1) / E[tokens per step] speculative ones, E from the
acceptance (i.i.d. α, or the run's per-position acceptance). Tokens/s per GPU divides the batch's
output by that time and the GPUs of one replica (TP); per user it is 1 / TPOT, TPOT that time over
the output tokens after the first (in continuous batching a request's steps share the prefills of
the requests that join while it decodes, as aiconfigurator's TPOT does; `decode_tpot_ms` is the
decode step alone over the tokens it yields). Memory: both models' weights and their KV cache for B rows of prompt, output
and K lookahead tokens, plus the tables' NCCL and runtime reserve, against 90 % of the GPU's HBM
(vLLM's default --gpu-memory-utilization). A batch that does not fit is marked and not priced.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import pandas as pd

from specbench.fit import kernel_tables
from specbench.fit.acceptance import acceptance_by_position, alpha_table
from specbench.fit.cells import base_draft, label_synthetic
from specbench.fit.host_cost import (
    COMPILED_LAUNCH,
    GRAPH_CAPTURE_TOKENS,
    MULTIPROC_EXECUTOR_STEP,
    NGRAM_HOST_STEP,
    VLLM_HOST_STEP,
    HostCost,
    LaunchCost,
    SpeculationHostCost,
    described,
)
from specbench.fit.prices import cost_per_million
from specbench.drafter_kinds import BYTES_PER_VALUE, DrafterKind, drafter_kind, kv_bytes_per_row
from specbench.step_model.overheads import NO_OVERHEADS, Overheads
from specbench.step_model.static_tables import StaticTablesStep
from specbench.models import REGISTRY, lookup_alias, routed_expert_parameters, routed_experts, shipped_hub_config
from specbench.schema import AR
from specbench.synthetic import config_parameters, shipped_config

GPU_MEMORY_UTILIZATION = 0.9  # vLLM's default share of HBM it may use
# Bytes per weight by the GEMMs' quantisation (the tables' names); the KV cache stays 16-bit, as
# vLLM keeps it unless --kv-cache-dtype says otherwise (KV_BYTES).
WEIGHT_BYTES = {None: 2, "": 2, "bfloat16": 2, "float16": 2, "fp8": 1, "fp8_static": 1, "fp8_block": 1, "nvfp4": 0.5,
                "int4_wo": 0.5, "int8_wo": 1,
                # MXFP4: 4-bit values and one 8-bit scale per 32 (gpt-oss's experts)
                "w4a16_mxfp4": 4.25 / 8}
KV_BYTES = {"auto": 2, "bfloat16": 2, "float16": 2, "fp8": 1}  # per value, by vLLM's --kv-cache-dtype
# what `plan --dtype` offers for the target's GEMMs, by the tables' names (None: the model's 16 bits)
GEMM_QUANTS = {"bf16": None, "fp16": None, "fp8": "fp8", "fp4": "nvfp4"}


@dataclass(frozen=True)
class Drafter:
    """A proposer as the tables price it."""

    name: str  # as written: "1b", "ngram", "eagle", "mtp:2"
    kind: str  # a drafter_kinds.KINDS name: "model" | "ngram" | "eagle" | "eagle3" | "mtp"
    config: dict | None = None  # the model priced for K draft decodes (model, eagle, eagle3)
    label: str = ""  # what it is: "llama3.2-1b", "EAGLE head: 1 layer of llama3-70b"
    layers: int = 0  # MTP layers

    @property
    def draft_kind(self) -> DrafterKind:
        return drafter_kind(self.kind)


@dataclass(frozen=True)
class Acceptance:
    """What one traffic accepts of one drafter: i.i.d. α, and per-position acceptance where measured
    (`reach[i]`: the share of steps whose draft position i + 1 was accepted)."""

    draft: str
    key: str  # "α 0.7", "chat T=0"
    alpha: float
    reach: tuple[float, ...] = ()
    source: str = ""

    def tokens_per_step(self, k: int) -> float:
        """E[tokens per verify] at K: 1 + the expected accepted drafts (measured positions first,
        then each further position at α times the last one's reach)."""
        return 1.0 + sum(self.reach_at(k))

    def reach_at(self, k: int) -> tuple[float, ...]:
        """P(draft position i accepted) for i = 1..K: the measured reach first, then each further
        position at α times the last one's."""
        reach = [r for r in self.reach if r == r]
        out, last = [], 1.0
        for position in range(k):
            last = reach[position] if position < len(reach) else last * self.alpha
            out.append(last)
        return tuple(out)


@dataclass(frozen=True)
class Memory:
    weights: float  # bytes on the fullest GPU
    kv_per_row: float  # bytes per row (prompt + output + K lookahead) on that GPU
    reserved: float
    usable: float
    # data-parallel attention ranks: each holds the KV cache of its own share of the rows
    ranks: int = 1

    def need(self, batch_size: int) -> float:
        return self.weights + self.reserved + -(-batch_size // self.ranks) * self.kv_per_row

    def largest_batch(self) -> int:
        free = self.usable - self.weights - self.reserved
        return max(0, int(free // self.kv_per_row)) * self.ranks if self.kv_per_row > 0 else 0


def parameters(config: dict, layers: int | None = None) -> int:

    return config_parameters(config, layers)


def target_weight_bytes(target: dict, tp: int, dp: int, gemm_quant: str | None) -> float:
    """The target's weights on one GPU. A dense model's at `gemm_quant`'s bytes, split over TP. A
    mixture-of-experts model's routed experts spread over all tp × dp GPUs (by expert or within
    each) at its MoE precision, the rest (attention, shared experts, embeddings) split over TP in
    each data-parallel rank at its GEMMs' precision: `gemm_quant` where --dtype names one (both
    parts then), else its checkpoint's (`kernel_tables.model_quants`)."""
    routed = routed_expert_parameters(target)
    if not routed:
        return parameters(target) * WEIGHT_BYTES.get(gemm_quant, BYTES_PER_VALUE) / tp
    quants = {"gemm": gemm_quant, "moe": gemm_quant} if gemm_quant else kernel_tables.model_quants(target)
    unknown = [q for q in quants.values() if q not in WEIGHT_BYTES]
    if unknown:
        raise ValueError(f"no bytes per weight known for {unknown[0]} weights")
    return (parameters(target) - routed) * WEIGHT_BYTES[quants["gemm"]] / tp \
        + routed * WEIGHT_BYTES[quants["moe"]] / (tp * dp)


def memory(target: dict, drafter: Drafter | None, tp: int, draft_tp: int, tokens_per_row: int,
           device: kernel_tables.Device, gemm_quant: str | None = None, kv_cache_dtype: str = "auto",
           draft_gemm_quant: str | None = None, dp: int = 1) -> Memory:
    """The target's weights (`target_weight_bytes`) and the drafter's its kind states (an MTP head's
    as the target's, a draft model's at `draft_gemm_quant`'s, an EAGLE head's at 16 bits), every KV
    cache at `kv_cache_dtype`'s (vLLM's one cache config serves the draft too; MLA's latent cache
    and sliding windows as `kv_bytes_per_row` holds them), each of `dp` ranks holding its rows'."""
    weight_bytes = WEIGHT_BYTES.get(gemm_quant, BYTES_PER_VALUE)
    weights = target_weight_bytes(target, tp, dp, gemm_quant)
    kv = kv_bytes_per_row(target, tp, tokens_per_row)
    if drafter is not None:
        kind = drafter.draft_kind
        draft_bytes = WEIGHT_BYTES.get(draft_gemm_quant, BYTES_PER_VALUE) if kind.takes_draft_dtype else BYTES_PER_VALUE
        weights += kind.draft_weight_bytes(drafter, target, tp, draft_tp, weight_bytes, draft_bytes, weights)
        kv += kind.draft_kv_bytes_per_token(drafter, target, tp, draft_tp) * tokens_per_row
    kv *= KV_BYTES[kv_cache_dtype] / BYTES_PER_VALUE
    return Memory(weights, kv, float(device.reserved_bytes.get(tp, max(device.reserved_bytes.values()))),
                  GPU_MEMORY_UTILIZATION * device.memory_bytes, dp)


@dataclass
class TablePlanner:
    """The tables' forwards for one target on one system and backend, compiled once per TP size,
    which its steps (`step_model.StaticTablesStep`) are priced on; `corrections` (by kind: decode,
    verify, draft, prefill, draft prefill; from a served run decode, step and prefill) scale them as
    a measured run did (`calibration.Calibration.by_kind`). Without
    corrections each step also takes vLLM's host time (`host`; None: the kernels' alone), beside the
    kernels (async scheduling, vLLM's default) or after them (n-gram drafting, which vLLM schedules
    synchronously), and a step vLLM runs outside CUDA graphs (over 512 tokens: a long prefill, a
    verify of many rows) at least the host's time to launch its kernels (`launch`); a run's
    corrections hold its own host's time."""

    target: dict
    target_name: str
    system: str
    backend: str
    corrections: dict = field(default_factory=dict)
    # a native run's measured models (calibration.MeasuredModel): each draft takes the decode and
    # prefill corrections of the one nearest its size, not the run's draft's whatever its size
    measured_models: list = field(default_factory=list)
    host: HostCost | None = VLLM_HOST_STEP
    # the host's time to launch a step that runs outside CUDA graphs (fleet.tables.step_cost's floor)
    launch: LaunchCost | None = COMPILED_LAUNCH
    # n-gram drafting's own host time a step, beside the host's (fleet.tables.step_cost's too)
    speculation_host: SpeculationHostCost | None = NGRAM_HOST_STEP
    # what vLLM's multiprocess executor adds to the host's time of a step at TP > 1
    executor: HostCost | None = MULTIPROC_EXECUTOR_STEP
    # the target's GEMMs as the tables name their quantisation (GEMM_QUANTS: fp8, nvfp4; None: 16-bit)
    # and every model's KV cache as vLLM's --kv-cache-dtype (KV_BYTES: auto, fp8)
    gemm_quant: str | None = None
    kv_cache_dtype: str = "auto"
    # a draft model's GEMMs (its checkpoint's quantisation; None: 16-bit); an EAGLE head stays 16-bit
    draft_gemm_quant: str | None = None
    # a mixture-of-experts target's layout beyond TP: data-parallel attention ranks (vLLM's
    # --data-parallel-size; a batch is split evenly over them) and whole experts per GPU
    # (--enable-expert-parallel); kernel_tables.moe_sizes
    dp: int = 1
    expert_parallel: bool = False
    _forwards: dict = field(default_factory=dict)

    def rank_rows(self, batch_size: int) -> int:
        """The rows of the busiest data-parallel rank: what each of its steps computes."""
        return -(-batch_size // self.dp)

    @property
    def kv_quant(self) -> str | None:
        """The tables' kvcache_quant_mode for `kv_cache_dtype` (None: the model's 16 bits)."""
        return None if KV_BYTES[self.kv_cache_dtype] == BYTES_PER_VALUE else self.kv_cache_dtype

    def memory(self, drafter: Drafter | None, tp: int, draft_tp: int, tokens_per_row: int) -> Memory:
        return memory(self.target, drafter, tp, draft_tp, tokens_per_row, kernel_tables.device(self.system),
                      self.gemm_quant, self.kv_cache_dtype, self.draft_gemm_quant, self.dp)

    @property
    def overheads(self) -> Overheads:
        """What each step adds to its kernels (`step_model.Overheads`): none where a run's corrections
        hold its own host's time."""
        if self.corrections:
            return NO_OVERHEADS
        return Overheads(host=self.host, launch=self.launch, speculation_host=self.speculation_host,
                         executor=self.executor)

    def described_host(self) -> dict:
        """What --json says the steps were priced with beside the kernels (each cost's terms and
        where it was measured); each None where a run's corrections hold the host's own time."""
        costs = {"host_step": self.host, "launch_without_graph": self.launch,
                 "ngram_host_step": self.speculation_host, "executor_step": self.executor}
        return {key: None if self.corrections else described(cost) for key, cost in costs.items()}

    def forward(self, config: dict, tp: int, nextn: int = 0, name: str = "",
                kv_quant: str | None = None, gemm_quant: str | None = None) -> kernel_tables.Forward:
        """`config`'s forward at `tp`: its GEMMs at `gemm_quant` (None: the target's at the planner's
        `gemm_quant`, any other model's at 16 bits), the KV cache at `kv_quant` (None: the planner's
        `kv_cache_dtype`)."""
        target = config is self.target
        gemm_quant = gemm_quant if gemm_quant is not None else (self.gemm_quant if target else None)
        kv_quant = kv_quant if kv_quant is not None else self.kv_quant
        if kv_quant is None and target and routed_experts(config) is not None:
            kv_quant = "bfloat16"  # vLLM's "auto" keeps 16 bits where the tables would read an fp8 checkpoint's as fp8
        key = (id(config), tp, nextn, kv_quant, gemm_quant)
        if key not in self._forwards:
            layout = {"dp": self.dp, "expert_parallel": self.expert_parallel} if target else {}
            self._forwards[key] = kernel_tables.Forward(config, self.system, self.backend, tp, nextn,
                                                        name or self.target_name, gemm_quant=gemm_quant,
                                                        kv_quant=kv_quant, **layout)
        return self._forwards[key]

    def draft_forward(self, drafter: Drafter, tp: int) -> kernel_tables.Forward:
        """A drafter's own forward: a draft model's GEMMs at `draft_gemm_quant`, an EAGLE head's at 16 bits."""
        return self.forward(drafter.config, tp, name=drafter.label,
                            gemm_quant=self.draft_gemm_quant if drafter.draft_kind.takes_draft_dtype else None)

    def scale(self, kind: str, batch_size: int) -> float:
        """The run's correction of `kind` (decode, verify, prefill, step) at `batch_size`; 1 without one."""
        correction = self.corrections.get(kind)
        return float(correction(batch_size)) if correction is not None else 1.0

    def draft_source(self, drafter: Drafter):
        """The measured model whose corrections `drafter`'s forwards take, or None."""
        from specbench.fit.calibration import nearest_measured

        if not self.measured_models or drafter.config is None:
            return None
        return nearest_measured(self.measured_models, config_parameters(drafter.config))

    def draft_scale(self, drafter: Drafter, kind: str, batch_size: int) -> float:
        """`draft` (decode) or `draft prefill`: the nearest measured model's correction, else the
        run's draft's (`by_kind`), else, for the prefill, the target's."""
        source = self.draft_source(drafter)
        correction = None if source is None else source.decode if kind == "draft" else source.prefill
        if correction is not None:
            return float(correction(batch_size))
        if kind == "draft prefill" and kind not in self.corrections:
            kind = "prefill"
        return self.scale(kind, batch_size)


def launch_floor_notes(planner: TablePlanner, table: pd.DataFrame, drafters: list[Drafter]) -> list[str]:
    """A line where speculative steps are priced at the launch floor (`graph_bound_ms`: a step of
    over GRAPH_CAPTURE_TOKENS tokens runs outside CUDA graphs and lasts at least the host's launch
    of its kernels), which makes K and batch choices jump around that many tokens a step."""
    if planner.launch is None or planner.corrections or "step_ms" not in table:
        return []
    layers = int((planner.target.get("text_config") or planner.target)["num_hidden_layers"])
    floored: dict[int, tuple[float, int]] = {}
    for drafter in drafters:
        extra = int(drafter.config["num_hidden_layers"]) if drafter.draft_kind.separate_model and drafter.config else 0
        for tp in sorted(set(table["tp"])):
            floor = planner.overheads.launch_ms([(layers, tp)] + ([(extra, tp)] if extra else []))
            rows = table[(table["draft"] == drafter.name) & (table["tp"] == tp)]
            at = int(((rows["step_ms"] - floor).abs() <= 1e-9 * floor).sum())
            if at:
                floored[tp] = (floor, floored.get(tp, (floor, 0))[1] + at)
    return [f"at TP{tp}, {count} speculative steps are priced at the launch floor, {floor:.1f} ms whatever their "
            f"tokens: a step of over {GRAPH_CAPTURE_TOKENS} tokens runs outside CUDA graphs and lasts at least the "
            f"host's launch of its kernels ({planner.launch.ms(1, tp):.3g} ms a layer, measured for a dense layer "
            f"on an H100 host), so the best K and the speed-up jump where B × (K + 1) passes {GRAPH_CAPTURE_TOKENS}"
            for tp, (floor, count) in floored.items()]


def first_draft_positions(kind: str | DrafterKind, k: int) -> int:
    """Positions a row of a speculative step's first draft forward (`DrafterKind.first_draft_positions`)."""
    return drafter_kind(kind).first_draft_positions(k)


def check_tp(config: dict, tp: int, what: str, option: str = "--tp") -> None:
    """TP must split the attention heads, and the KV heads or be a multiple of them."""
    heads, kv_heads = config["num_attention_heads"], config["num_key_value_heads"]
    if tp < 1 or heads % tp or (kv_heads % tp and tp % kv_heads):
        raise ValueError(f"TP{tp} does not divide {what}'s {heads} attention heads and {kv_heads} KV heads; "
                         f"give {option} a TP that does ({', '.join(str(t) for t in (1, 2, 4, 8, 16) if not heads % t)})")


def plan_on_tables(planner: TablePlanner, drafters: list[Drafter], acceptances: list[Acceptance], ks: list[int],
                   batch_sizes: list[int], contexts: list[int], tps: list[int], output_tokens: int,
                   price_per_hour: float | None, draft_tp: int | None = None) -> tuple[pd.DataFrame, list[str]]:
    """One row per (TP, context, acceptance, drafter, K, B), and one autoregressive row per (TP,
    context, B): step times, tokens/s per GPU and per user, speed-up, $ per 1M tokens and memory;
    and a line for each drafter the tables cannot price there (a kernel they did not measure)."""
    rows, left_out = [], []
    for tp in tps:
        check_tp(planner.target, tp, planner.target_name)
        for drafter in drafters:
            if drafter.draft_kind.separate_model:
                check_tp(drafter.config, draft_tp or tp, drafter.label, "--draft-tp")
        for context in contexts:
            ar_rows, ar = _autoregressive(planner, batch_sizes, context, tp, output_tokens)
            rows += ar_rows
            for drafter in drafters:
                mine = [a for a in acceptances if a.draft == drafter.name]
                try:
                    rows += _speculative(planner, drafter, mine, ks, batch_sizes, context, tp,
                                         drafter.draft_kind.draft_tp(tp, draft_tp or tp), output_tokens, ar)
                except kernel_tables.TablesUnavailable as error:
                    left_out.append(f"{drafter.name} at TP{tp}: {error}")
    table = pd.DataFrame(rows)
    for column in ("ar_step_ms", "step_ms", "decode_tpot_ms", "tpot_ms", "tokens_per_s_per_gpu",
                   "tokens_per_s_per_user", "speedup"):
        if column not in table:
            table[column] = float("nan")
    table["cost_per_1m"] = cost_per_million(table["tokens_per_s_per_gpu"], price_per_hour, 1)
    return table, list(dict.fromkeys(left_out))


def _autoregressive(planner: TablePlanner, batch_sizes: list[int], context: int, tp: int,
                    output_tokens: int) -> tuple[list[dict], dict[int, tuple[float, float]]]:
    """The baseline's rows, and B -> (tokens/s per GPU, step ms) for the batches that fit."""
    need = planner.memory(None, tp, tp, context + output_tokens)
    priced = StaticTablesStep(planner, tp)
    rows, ar = [], {}
    for b in batch_sizes:
        fits = need.need(b) <= need.usable
        row = {"tp": tp, "context_length": context, "acceptance": "", "draft": AR, "k": 0, "batch_size": b,
               "fits": fits, "largest_batch": need.largest_batch(), "memory_gib": need.need(b) / 2 ** 30,
               "alpha": float("nan"), "tau": 1.0}
        if fits:
            rank = planner.rank_rows(b)
            step = priced.seconds(priced.decoding(rank, context + output_tokens // 2)) * 1000
            total = priced.seconds(priced.prefilling(rank, context)) * 1000 + (output_tokens - 1) * step
            ar[b] = (b * output_tokens / total * 1000 / (tp * planner.dp), step)
            row.update(ar_step_ms=step, step_ms=step, decode_tpot_ms=step, tpot_ms=_tpot(total, output_tokens),
                       tokens_per_s_per_gpu=ar[b][0], tokens_per_s_per_user=1000 / _tpot(total, output_tokens),
                       speedup=1.0)
        rows.append(row)
    return rows, ar


def _speculative(planner: TablePlanner, drafter: Drafter, acceptances: list[Acceptance], ks: list[int],
                 batch_sizes: list[int], context: int, tp: int, draft_tp: int, output_tokens: int,
                 ar: dict[int, tuple[float, float]]) -> list[dict]:
    rows = []
    priced = StaticTablesStep(planner, tp, drafter, draft_tp)
    prefills: dict[int, float] = {}  # B -> the batch's prefill, the same at every K
    for k in drafter.draft_kind.ks(ks, drafter.layers):
        need = planner.memory(drafter, tp, draft_tp, context + output_tokens + k)
        for b in batch_sizes:
            fits = need.need(b) <= need.usable and b in ar
            rank = planner.rank_rows(b)
            step = priced.seconds(priced.decoding(rank, context + output_tokens // 2, k)) * 1000 if fits \
                else float("nan")
            if fits and b not in prefills:
                prefills[b] = priced.seconds(priced.prefilling(rank, context)) * 1000
            prefill = prefills.get(b, 0.0)
            for acceptance in acceptances:
                tau = acceptance.tokens_per_step(k)
                row = {"tp": tp, "context_length": context, "acceptance": acceptance.key, "draft": drafter.name,
                       "k": k, "batch_size": b, "fits": fits, "largest_batch": need.largest_batch(),
                       "memory_gib": need.need(b) / 2 ** 30, "alpha": acceptance.alpha, "tau": tau}
                if fits:
                    total = prefill + (output_tokens - 1) / tau * step
                    per_gpu = b * output_tokens / total * 1000 / (tp * planner.dp)
                    row.update(ar_step_ms=ar[b][1], step_ms=step, decode_tpot_ms=step / tau,
                               tpot_ms=_tpot(total, output_tokens), tokens_per_s_per_gpu=per_gpu,
                               tokens_per_s_per_user=1000 / _tpot(total, output_tokens), speedup=per_gpu / ar[b][0])
                rows.append(row)
    return rows


def _tpot(batch_ms: float, output_tokens: int) -> float:
    """A user's time per output token in continuous batching's steady state: while one request
    decodes, the batch's other slots turn over, so its steps share the batch's prefills (the
    decode step alone is `decode_tpot_ms`)."""
    return batch_ms / max(output_tokens - 1, 1)


K_TIE = 0.01  # speed-ups within 1 % of the best are one K apart by the tables' own interpolation
# a K schedule that never drafts deeper at a larger batch, taken where it costs no batch more than 3 % beyond
# the tie: the tables' GEMM times jitter by a few % from one row count to the next, and a step of 40 tokens
# dearer than one of 56 flips the per-batch best between K = 4 and 6; the optimum itself only falls with B
K_MONOTONE = 0.03


def flag_steps(table: pd.DataFrame) -> tuple[pd.DataFrame, list[str]]:
    """Step times the tables give that no engine could run, marked and not smoothed: the tables
    interpolate between measured shapes and carry their timings' jitter, and a speed-up resting on
    such a step is overstated by as much. Flagged (`step_flag`) are a speculative step (a draft and
    a verify of K + 1 positions a row) priced at or below the plain decode step at its batch, and a
    plain decode step priced below the one at a smaller batch. The raw figures stay as they are, so
    --json holds what the tables said; one `notes:` line per series says where and by how much."""
    table = table.assign(step_flag="")
    notes = []
    if table.empty or "step_ms" not in table:
        return table, notes
    keys = ["tp", "context_length"]
    for (tp, context), group in table[table["fits"] & table["step_ms"].notna()].groupby(keys):
        where = f"TP{tp}, {context}-token prompts"
        ar = group[group["draft"] == AR].sort_values("batch_size")
        falls = ar[ar["step_ms"] < ar["step_ms"].cummax().shift(fill_value=0)]
        if not falls.empty:
            table.loc[falls.index, "step_flag"] = "AR step falls with B"
            worst = (1 - falls["step_ms"] / ar["step_ms"].cummax().shift().loc[falls.index]).max()
            notes.append(f"{where}: the plain decode step is priced below a smaller batch's at B = "
                         f"{', '.join(str(b) for b in falls['batch_size'])} (up to {worst:.0%} lower); the tables' "
                         f"timings disagree between neighbouring shapes there")
        sd = group[(group["draft"] != AR) & (group["step_ms"] <= group["ar_step_ms"])]
        for (acceptance, draft), rows in sd.groupby(["acceptance", "draft"]):
            table.loc[rows.index, "step_flag"] = "SD step ≤ AR step"
            gap = (1 - rows["step_ms"] / rows["ar_step_ms"])
            ks = sorted(set(int(k) for k in rows["k"]))
            notes.append(f"{where}, {acceptance}: {draft}'s speculative step (K = {', '.join(map(str, ks))}) is "
                         f"priced at or below the plain decode step at B = "
                         f"{', '.join(str(b) for b in sorted(set(rows['batch_size'])))} (by up to {gap.max():.1%}); "
                         f"a draft and a verify cannot cost less than one decode, so its speed-up there is "
                         f"overstated by at least that much")
    return table, notes


def best_k(table: pd.DataFrame) -> pd.DataFrame:
    """Per (TP, context, acceptance, draft, B): the K of the schedule a server would load. At each
    batch a K within 1 % of the highest predicted speed-up (of the batches that fit) is a tie and
    costs nothing, the smaller K preferred (never a tie across 1×); over the batches that speculate
    (highest ≥ 1×), the K never rises with B where the best such schedule loses at most 3 % beyond
    the tie at any batch (K_MONOTONE), else each batch keeps its own best. The tables interpolate
    between measured shapes and jitter, so the per-batch best alone flips between K = 4 and 6 from
    one batch size to the next, which no optimum does."""
    sd = table[(table["draft"] != AR) & table["fits"] & table["speedup"].notna()]
    if sd.empty:
        return sd
    keys = ["tp", "context_length", "acceptance", "draft", "batch_size"]
    sd = sd.assign(highest_speedup=sd.groupby(keys)["speedup"].transform("max"))
    allowed = sd[(sd["speedup"] >= 1) | (sd["highest_speedup"] < 1)]  # never a tie across 1x
    tied = allowed["speedup"] >= allowed["highest_speedup"] * (1 - K_TIE)  # K_TIE exactly as before: loss 0
    allowed = allowed.assign(loss=(1 - allowed["speedup"] / allowed["highest_speedup"] - K_TIE).where(~tied, 0.0))
    chosen = [_schedule_rows(group) for _, group in allowed.groupby(keys[:-1], sort=False)]
    return pd.concat(chosen).drop(columns="loss").sort_values(keys).reset_index(drop=True)


def _schedule_rows(group: pd.DataFrame) -> pd.DataFrame:
    """One drafter's rows, one per batch size: the non-increasing K schedule of least worst loss
    (then least total loss, then the smallest Ks) where that loss is within K_MONOTONE, else each
    batch's smallest tied K."""
    per_batch = group.loc[group[group["loss"] == 0].groupby("batch_size")["k"].idxmin()]
    speculating = sorted(per_batch.loc[per_batch["highest_speedup"] >= 1, "batch_size"])
    if len(speculating) < 2:
        return per_batch
    losses = {b: dict(zip(rows["k"], rows["loss"])) for b, rows in group.groupby("batch_size") if b in speculating}
    row_of = {(b, k): index for index, b, k in zip(group.index, group["batch_size"], group["k"])}
    # best[k]: (worst loss, total loss, sum of K, the Ks so far) of the schedules ending at K = k
    best = {k: (loss, loss, k, (k,)) for k, loss in losses[speculating[0]].items()}
    for b in speculating[1:]:
        best = {k: min((max(w, loss), t + loss, n + k, ks + (k,)) for previous, (w, t, n, ks) in best.items()
                       if previous >= k)
                for k, loss in losses[b].items() if any(previous >= k for previous in best)}
        if not best:
            return per_batch
    worst, _, _, ks = min(best.values())
    if worst > K_MONOTONE:
        return per_batch
    picked = dict(zip(speculating, ks))
    return group.loc[[row_of[b, picked[b]] if b in picked else index
                      for b, index in zip(per_batch["batch_size"], per_batch.index)]]


def decisions(table: pd.DataFrame, bar: float = 1.0) -> pd.DataFrame:
    """Per (TP, context, acceptance, draft): B* (where the best-K speed-up falls below the bar) and
    the K schedule a server would load (off where the best K is below the bar)."""
    from specbench.fit.decisions import crossover, k_schedule

    best = best_k(table)
    rows = []
    for (tp, context, acceptance, draft), group in best.groupby(["tp", "context_length", "acceptance", "draft"]):
        found = crossover(group["batch_size"].tolist(), group["highest_speedup"].tolist(), bar, sizes="predicted")
        schedule = k_schedule(group["batch_size"].tolist(),
                              [int(k) if s >= bar else None for k, s in zip(group["k"], group["highest_speedup"])])
        rows.append({"tp": tp, "context_length": context, "acceptance": acceptance, "draft": draft,
                     "b_star": found.batch_size, "crossover": found.text, "k_schedule": schedule,
                     "best_speedup": float(group["highest_speedup"].max()),
                     **dict(zip(("ar_cheapest_per_1m", "sd_cheapest_per_1m"), _cheapest(table, group)))})
    return pd.DataFrame(rows)


def _cheapest(table: pd.DataFrame, best: pd.DataFrame) -> tuple[float, float]:
    """($ per 1M tokens at the cheapest batch without speculation, and with it at its best K) over
    the batch sizes that fit: what speculation saves where each runs at its highest throughput."""
    tp, context = best["tp"].iloc[0], best["context_length"].iloc[0]
    ar = table[(table["draft"] == AR) & table["fits"] & (table["tp"] == tp) & (table["context_length"] == context)]
    return float(ar["cost_per_1m"].min()), float(best["cost_per_1m"].min())


def slo_choices(table: pd.DataFrame, tpot_ms: float) -> pd.DataFrame:
    """Per TP, context and acceptance: the largest batch that meets the TPOT target without
    speculation and with it (any drafter, K), and which of the two is cheaper per 1M tokens."""
    met = table[table["fits"] & (table["tpot_ms"] <= tpot_ms)]
    rows = []
    for (tp, context), group in table.groupby(["tp", "context_length"]):
        ar = met[(met["tp"] == tp) & (met["context_length"] == context) & (met["draft"] == AR)]
        ar_best = ar.sort_values("tokens_per_s_per_gpu").iloc[-1] if not ar.empty else None
        for acceptance in sorted(set(group["acceptance"]) - {""}):
            sd = met[(met["tp"] == tp) & (met["context_length"] == context) & (met["acceptance"] == acceptance)]
            sd_best = sd.sort_values("tokens_per_s_per_gpu").iloc[-1] if not sd.empty else None
            choices = [c for c in (ar_best, sd_best) if c is not None]
            cheapest = min(choices, key=lambda c: c["cost_per_1m"]) if choices else None
            rows.append({
                "tp": tp, "context_length": context, "acceptance": acceptance, "tpot_ms_target": tpot_ms,
                "ar_batch": int(ar_best["batch_size"]) if ar_best is not None else None,
                "ar_tokens_per_s_per_gpu": float(ar_best["tokens_per_s_per_gpu"]) if ar_best is not None else None,
                "ar_cost_per_1m": float(ar_best["cost_per_1m"]) if ar_best is not None else None,
                "sd_draft": sd_best["draft"] if sd_best is not None else None,
                "sd_k": int(sd_best["k"]) if sd_best is not None else None,
                "sd_batch": int(sd_best["batch_size"]) if sd_best is not None else None,
                "sd_tokens_per_s_per_gpu": float(sd_best["tokens_per_s_per_gpu"]) if sd_best is not None else None,
                "sd_cost_per_1m": float(sd_best["cost_per_1m"]) if sd_best is not None else None,
                "cheapest": None if cheapest is None else (AR if cheapest["draft"] == AR else "speculative"),
            })
    return pd.DataFrame(rows)


# --- what the plan prices: models by name, drafters, acceptance -----------------------------------

def model_config(reference: str, family: str | None = None) -> tuple[str, dict]:
    """(name, config) of a registry alias, size or hub id (shipped with specbench), a directory
    holding a config.json, a config .json file, or a Hugging Face id whose config aiconfigurator-core
    ships: no download, so a missing config is one clear line, and one the tables cannot price
    (`refuse_unpriced`) is refused in one line naming what they lack."""
    import json
    from pathlib import Path

    if lookup_alias(reference, family) is not None:
        name, config = shipped_config(reference, family)
        refuse_unpriced(name, config)
        return name, decoder_config(config)
    path = Path(reference).expanduser()
    file = path / "config.json" if path.is_dir() else path
    if file.is_file():
        try:
            config = json.loads(file.read_text())
        except (json.JSONDecodeError, UnicodeDecodeError) as error:
            raise ValueError(f"{file}: not a JSON model config ({error})") from None
        if not isinstance(config, dict):
            raise ValueError(f"{file}: not a JSON model config (a JSON object)")
        name = path.name if path.is_dir() else path.stem
    elif (shipped := shipped_hub_config(reference)) is not None:
        name, config = shipped
    else:
        raise ValueError(f"no config for model {reference!r} is available offline: use an alias (`specbench models` "
                         f"lists them), a size inside the target's family, a Hugging Face id whose config "
                         f"aiconfigurator-core ships, or a directory holding the model's config.json "
                         f"(huggingface-cli download MODEL config.json)")
    refuse_unpriced(name, config)
    text = config.get("text_config") or config
    missing = [key for key in ("hidden_size", "num_attention_heads", "num_hidden_layers", "vocab_size",
                               "intermediate_size") if key not in text]
    if missing:
        raise ValueError(f"{file if file.is_file() else name}: a model config needs {', '.join(missing)}")
    text.setdefault("num_key_value_heads", text["num_attention_heads"])
    if text.get("model_type") in PRICED_MOE_ARCHITECTURES:
        return name, decoder_config(config)
    by_architecture = {architecture: model_type for model_type, architecture in PRICED_ARCHITECTURES.items()}
    config.setdefault("model_type", by_architecture.get((config.get("architectures") or [None])[0], "llama"))
    config.setdefault("architectures", [PRICED_ARCHITECTURES[config["model_type"]]])  # what the tables' engine reads
    return name, config


def decoder_config(config: dict) -> dict:
    """The config of what decodes: a multimodal checkpoint's decoder (Kimi-K2.5's text_config, which
    names its own architecture) is priced alone, its vision tower being no part of a decode step."""
    text = config.get("text_config")
    return text if text and text.get("architectures") else config


# The decoders the tables' planner prices, by model_type, with the architecture name the tables'
# engine reads: aiconfigurator's LLAMA family (grouped-query attention, one gated MLP a layer), and
# the mixture-of-experts families it models (routed and shared experts, the router; DeepSeek's and
# Kimi's multi-head latent attention; gpt-oss's sliding-window layers)
PRICED_ARCHITECTURES = {"llama": "LlamaForCausalLM", "qwen2": "Qwen2ForCausalLM", "qwen3": "Qwen3ForCausalLM"}
PRICED_MOE_ARCHITECTURES = {"qwen3_moe": "Qwen3MoeForCausalLM", "gpt_oss": "GptOssForCausalLM",
                            "deepseek_v3": "DeepseekV3ForCausalLM", "kimi_k2": "DeepseekV3ForCausalLM",
                            "minimax_m2": "MiniMaxM2ForCausalLM"}


def unpriced_parts(config: dict) -> list[str]:
    """What in `config` the tables' planner cannot price, each in a few words: chunked attention
    layers, sliding windows outside gpt-oss's, routed experts or MLA outside the families it prices,
    an architecture it does not know (named only where nothing more specific explains it). Empty:
    a decoder it prices."""
    text = config.get("text_config") or config
    model_type = text.get("model_type") or config.get("model_type")
    architecture = (config.get("architectures") or [None])[0]
    moe_family = model_type in PRICED_MOE_ARCHITECTURES
    parts = []
    if (moe := routed_experts(text)) is not None and not moe_family:
        try:
            total, active = (config_parameters({"model_type": "llama", **text}, active=used) / 1e9
                             for used in (False, True))
            size = f"; {total:.1f}B parameters in all, {active:.1f}B active a token"
        except (KeyError, TypeError, ValueError, ZeroDivisionError):
            size = ""
        parts.append(f"mixture-of-experts layers of a family the tables do not model ({moe.describe()}{size})")
    if text.get("kv_lora_rank") and not moe_family:
        parts.append(f"multi-head latent attention (MLA, a {text['kv_lora_rank']}-wide latent KV cache) outside "
                     f"DeepSeek's and Kimi's families")
    if text.get("attention_chunk_size"):
        parts.append(f"chunked attention layers ({text['attention_chunk_size']}-token chunks)")
    windowed = [kind for kind in text.get("layer_types") or [] if kind not in ("full_attention", "sliding_attention")]
    if windowed or (text.get("use_sliding_window") and model_type != "gpt_oss"):
        parts.append("sliding-window attention layers")
    if model_type:
        known = model_type in PRICED_ARCHITECTURES or moe_family
    else:
        known = architecture is None or architecture in PRICED_ARCHITECTURES.values()
    if not known and not parts:
        named = ", ".join(f"{key} {value}" for key, value in (("model_type", model_type), ("architectures", architecture))
                          if value)
        parts.append(f"an architecture the planner does not know ({named})")
    return parts


def refuse_unpriced(name: str, config: dict) -> None:
    """A config the tables cannot price is refused in one line naming what they lack, rather than
    priced as a model it is not."""
    parts = unpriced_parts(config)
    if not parts:
        return
    listed = parts[0] if len(parts) == 1 else f"{', '.join(parts[:-1])} and {parts[-1]}"
    raise ValueError(f"{name} cannot be priced on the kernel tables: it has {listed}; the planner prices dense "
                     f"{', '.join(PRICED_ARCHITECTURES)} decoders and the {', '.join(PRICED_MOE_ARCHITECTURES)} "
                     f"mixture-of-experts families, so it is refused rather than priced as one of them; measure it "
                     f"where it runs (specbench sweep --engine vllm --target MODEL_DIR)")


def parse_drafters(names: list[str], target_name: str, target: dict, family: str | None) -> list[Drafter]:
    """`1b`, `llama3-8b`, a config path, `ngram`, `eagle`, `eagle3`, `mtp` or `mtp:N`."""
    import re

    drafters = []
    for name in names:
        if name == "ngram" or re.fullmatch(r"ngram:\d+", name):
            drafters.append(Drafter(name, "ngram", label="n-gram lookup"))
        elif name in ("eagle", "eagle3"):
            head = drafter_kind(name)
            drafters.append(Drafter(name, name, head.draft_config(target), head.label(target_name, target)))
        elif m := re.fullmatch(r"mtp(?::(\d+))?", name):
            layers = int(m.group(1) or 1)
            if layers < 1:
                raise ValueError(f"draft {name!r}: MTP needs at least 1 layer (mtp:N)")
            text = target.get("text_config") or target
            if routed_experts(text) is not None and not text.get("num_nextn_predict_layers"):
                raise ValueError(f"draft {name!r}: {target_name}'s checkpoint has no MTP layers (its config declares "
                                 f"no num_nextn_predict_layers): price eagle3 or a draft model for it")
            drafters.append(Drafter(name, "mtp", label=f"MTP: {layers} layer(s) of {target_name}", layers=layers))
        else:
            base = name.partition("@")[0]
            spec = lookup_alias(base, family)
            if spec is None and family is not None and re.fullmatch(r"\d+(\.\d+)?[bm]", base.lower()):
                sizes = ", ".join(known.size for known in REGISTRY.values() if known.family == family)
                raise ValueError(f"draft {name!r}: {family} has no {base} model (its sizes: {sizes}); --drafts "
                                 f"names the drafts (its default, 1b,8b, is llama3's)")
            label, config = model_config(base, family)
            same_family = spec is not None and family is not None and spec.family == family  # one tokenizer,
            # whatever the padding of its embedding (Qwen2.5's 0.5B has 151936 rows, its 72B 152064)
            if not same_family and config.get("vocab_size") != target.get("vocab_size"):
                raise ValueError(f"draft {name!r} ({label}) has a vocabulary of {config.get('vocab_size')} tokens, "
                                 f"the target {target.get('vocab_size')}: it cannot draft for {target_name}")
            drafters.append(Drafter(name, "model", config, label))
    return drafters


def given_acceptance(drafters: list[Drafter], alphas: list[tuple[float, ...]]) -> list[Acceptance]:
    """--alpha 0.6,0.7,0.8 (each i.i.d., or a / profile per position) for every drafter."""
    out = []
    for profile in alphas:
        key = "α " + "/".join(f"{v:g}" for v in profile)
        reach, last = [], 1.0
        for value in profile:
            last *= value
            reach.append(last)
        for drafter in drafters:
            out.append(Acceptance(drafter.name, key, profile[-1], tuple(reach) if len(profile) > 1 else (),
                                  "--alpha"))
    return out


def run_acceptance(cells: pd.DataFrame, steps: pd.DataFrame, run_target: str, drafters: list[Drafter],
                   family: str | None, source: str,
                   requests: pd.DataFrame | None = None) -> tuple[list[Acceptance], list[str]]:
    """Each drafter's α per (workload, temperature[, context]) from a run, with its per-position
    acceptance at the deepest K measured (per decoding row-step where the run's `requests` and
    draft counters say how many row-steps drafted nothing: an n-gram miss emits one token); and a
    line for every drafter the run has no α for (never taken from another pair)."""
    alphas = alpha_table(cells, steps, include_synthetic=True)
    run_spec = lookup_alias(run_target)
    run_family = run_spec.family if run_spec else family

    def same(run_label: str, drafter: Drafter) -> bool:
        model = base_draft(run_label).partition("@")[0]
        return drafter.draft_kind.is_measured_by(model, drafter.name, family, run_family)

    labelled = label_synthetic(cells[cells["status"] == "ok"]) if not cells.empty else cells
    out, missing = [], []
    for drafter in drafters:
        found = alphas[alphas["draft"].map(lambda label: same(label, drafter))] if not alphas.empty else alphas
        if found.empty:
            missing.append(f"{drafter.name}: no α for it in {source} (give --alpha to plan it)")
            continue
        for row in found.itertuples():
            context = row.context_length
            key = f"{row.workload} T={row.temperature:g}" + (f" {int(context)} tok" if context == context and context else "")
            mine = labelled[(labelled["draft"] == row.draft) & (labelled["workload"] == row.workload)
                            & (labelled["temperature"] == row.temperature)] if not labelled.empty else labelled
            simulated = row.alpha_source == "simulated"
            reach = () if simulated else tuple(float(x) for x in acceptance_by_position(mine, requests))
            if simulated:  # a timing-only run: the α it was asked to simulate
                key += f" (simulated α {row.alpha_iid:.2f})"
            elif row.draft != drafter.name:
                key += f" ({row.draft})"
            out.append(Acceptance(drafter.name, key, float(row.alpha_iid), reach,
                                  source + (" (the α it simulated: a timing-only run)" if simulated else "")))
    return out, missing
