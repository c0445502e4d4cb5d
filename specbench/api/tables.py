"""`plan --target`'s static answer: speculative decoding priced from NVIDIA's measured kernel tables,
with no run (docs/guides/plan-gpus-you-do-not-have.md), and the pieces every plan on
the tables shares: the target and its drafters, their acceptance, their precision, their TP."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.api.errors import UsageError
from specbench.api.inputs import check_grid, check_price

PUBLISHED = "published:"  # --acceptance published:NAME (fit.published_acceptance's presets)

DTYPE_OF = {None: "bf16", "fp8": "fp8", "nvfp4": "fp4"}  # the tables' names back to --dtype's


@dataclass
class TablePrice:
    """ESTIMATES, not measurements: `table` holds one row per TP, prompt length, acceptance, draft,
    K and batch size (fit.table_plan.plan_on_tables' columns), the baseline's rows with draft `AR`."""
    table: Any  # a pandas DataFrame
    decisions: Any  # per TP, prompt length, acceptance and draft: the crossover and K schedule
    slo_choices: Any  # per TP, prompt length and acceptance: the batch that meets the TPOT asked; None: no --slo
    tables: str  # the tables' label: GPU, backend and version
    target: str
    device: str  # the tables' system name
    backend: str
    tp: list[int]
    output_tokens: int
    alpha_from: str
    price: float | None  # $ per GPU-hour; None: costs are in GPU-hours
    price_note: str
    drafters: dict[str, str]  # name -> what it is ('llama3-8b, fp8', 'EAGLE head', ...)
    dtype: str = "bf16"  # --dtype's; "checkpoint" for a mixture of experts at its checkpoint's precisions
    draft_dtype: str = "bf16"
    kv_cache_dtype: str = "auto"
    precision: str = ""  # ' (fp8, fp8 KV cache)' after the target's name where either is not 16-bit
    transferred: str = ""  # the α measured with another target
    left_out: list[str] = field(default_factory=list)  # drafters not priced, and why
    corrected: list[str] = field(default_factory=list)  # what a run's --calibrate corrected, one line each
    notes: list[str] = field(default_factory=list)
    step_notes: list[str] = field(default_factory=list)  # steps the tables price below what an engine runs
    host: dict = field(default_factory=dict)  # the host, launch and executor overheads priced in
    seconds: float = 0.0
    layout: dict = field(default_factory=dict)  # a mixture-of-experts target's dp and expert_parallel

    @property
    def unit(self) -> str:
        return "$/1M tok" if self.price is not None else "GPU-h/1M tok"

    @property
    def answer(self) -> str:
        """The answer in one sentence: the cheapest way to meet --slo, or where each drafter stops paying."""
        label = f"ESTIMATE on the {self.device} kernel tables" + published_said(self.alpha_from)
        if self.slo_choices is not None:
            return f"{label}: {slo_answer(self.slo_choices, self.unit)}."
        from specbench.fit.decisions import where_it_pays
        from specbench.fit.table_plan import best_k

        best = best_k(self.table)
        cases: dict[str, list] = {}
        for (draft, _, _, _), group in best.groupby(["draft", "tp", "context_length", "acceptance"], sort=False):
            group = group.sort_values("batch_size")
            cases.setdefault(draft, []).append((group["batch_size"].tolist(), group["highest_speedup"].tolist(),
                                                group["speedup"].tolist()))
        if not cases and not self.table["fits"].any():
            largest = int(self.table["largest_batch"].max())
            return f"{label}: no batch size asked fits (the largest that does: B = {largest}, without speculation)."
        return f"{label}: {where_it_pays(cases) or 'no drafter priced'}."

    def to_dict(self) -> dict:
        """As `plan --target ... --json` prints it."""
        import json

        records = lambda frame: json.loads(frame.to_json(orient="records"))  # noqa: E731
        return {"estimate": f"ESTIMATE from {self.tables}", "tables": self.tables, "target": self.target,
                "dtype": self.dtype, "draft_dtype": self.draft_dtype, "kv_cache_dtype": self.kv_cache_dtype,
                "device": self.device, "backend": self.backend, "tp": self.tp, **self.layout,
                "output_tokens": self.output_tokens,
                "alpha_from": self.alpha_from, "acceptance_transferred": self.transferred or None,
                "drafts_left_out": self.left_out, "price": self.price_note, "price_per_gpu_hour": self.price,
                "drafters": self.drafters, "seconds": round(self.seconds, 3), "corrected_by": self.corrected or None,
                "notes": list(self.notes) or None, "step_notes": self.step_notes or None, **self.host,
                "answer": self.answer, "predictions": records(self.table), "decisions": records(self.decisions),
                "slo": records(self.slo_choices) if self.slo_choices is not None else None}


def published_said(alpha_from: str | None) -> str:
    """What an answer's first line adds where its acceptance is a published preset."""
    return ", acceptance PUBLISHED not measured" if alpha_from and "PUBLISHED" in alpha_from else ""


def slo_answer(slo_table, unit: str) -> str:
    """The cheapest configuration that meets the TPOT asked, over every TP, prompt length and acceptance."""
    target = slo_table["tpot_ms_target"].iloc[0]
    met = slo_table.dropna(subset=["cheapest"])
    if met.empty:
        return f"nothing priced meets TPOT ≤ {target:g} ms"
    costs = met.apply(lambda r: min(c for c in (r["ar_cost_per_1m"], r["sd_cost_per_1m"])
                                    if c is not None and c == c), axis=1)
    from specbench.schema import AR

    best = met.loc[costs.idxmin()]
    how = (f"no speculation at B = {int(best['ar_batch'])}" if best["cheapest"] == AR else
           f"{best['sd_draft']} K={int(best['sd_k'])} at B = {int(best['sd_batch'])}")
    return f"the cheapest that meets TPOT ≤ {target:g} ms is {how} on TP{best['tp']}, {costs.min():.3g} {unit}"


def price(target: str, *, drafts: Sequence[str] = ("1b", "8b"), alpha: str | float | None = None,
          acceptance: Path | str | None = None, device: str = "h100", backend: str = "vllm",
          tp: Sequence[int] = (1,), draft_tp: int | None = None, ks: Sequence[int] = (1, 2, 3, 4, 6, 8),
          batch_sizes: Sequence[int] = (1, 2, 4, 8, 16, 32, 64), context_lengths: Sequence[int] = (1024,),
          output_tokens: int = 128, gpu_price: float | None = None, slo: str | None = None,
          calibrate: Path | str | None = None, dtype: str | None = None, draft_dtype: str | None = None,
          kv_cache_dtype: str = "auto", dp: int = 1, expert_parallel: bool = False) -> TablePrice:
    """`plan --target`: `target` (an alias or a config directory) and `drafts` (aliases, sizes,
    config directories, ngram, eagle, eagle3, mtp, mtp:N) priced per TP, prompt length, K and batch
    size on `device`'s kernel tables. `alpha`: an i.i.d. α, or the command's text, a list 0.6,0.7
    or a per-position profile 0.9/0.8/0.7; `acceptance`: a run whose measured α to use (one of the
    two is needed). `draft_tp`: 1 or the target's (None: the target's). `slo`: tpot=SECONDS, the
    batch that meets it per TP. `calibrate`: a GPU run whose measurements correct the tables'
    16-bit forwards. `dtype`, `draft_dtype`: bf16, fp8 or fp4; `kv_cache_dtype`: auto or fp8. A
    mixture-of-experts target: `dp` data-parallel attention ranks of TP GPUs each, and
    `expert_parallel` whole experts per GPU (vLLM's --data-parallel-size, --enable-expert-parallel)."""
    from specbench.fit import kernel_tables
    from specbench.fit import table_plan as tp_plan
    from specbench.fit.prices import tables_gpu_price

    started = time.perf_counter()
    gemm_quant, draft_gemm_quant = check_precision(dtype, kv_cache_dtype, draft_dtype)
    if calibrate is not None and (gemm_quant or draft_gemm_quant or kv_cache_dtype != "auto"):
        raise UsageError("--calibrate corrects the tables' 16-bit forwards by what a run measured: leave --dtype, "
                         "--draft-dtype and --kv-cache-dtype out with it")
    ks, sizes, contexts = list(ks), list(batch_sizes), list(context_lengths)
    check_grid(ks, sizes, contexts, output_tokens)
    check_price(gpu_price, 1)
    if alpha is None and acceptance is None:
        raise UsageError("planning on the tables needs an acceptance: --alpha 0.6,0.7,0.8 or --acceptance RUN "
                         "(a run's measured α)")
    tp_sizes = check_tp(tp, draft_tp)
    tpot = None
    if slo is not None:
        from specbench.fit import parse_slo

        bounds = dict(parse_slo(slo).bounds)
        if set(bounds) != {"tpot"}:
            raise UsageError(f"--slo on the tables takes a TPOT target only (tpot=SECONDS), got {slo!r}")
        tpot = bounds["tpot"] * 1000
    system = kernel_tables.check_device(device, backend)
    family, target_name, target_config, drafters = target_and_drafters(target, drafts)
    layout_notes = check_layout(target_name, target_config, dp, expert_parallel, gemm_quant, tp_sizes)
    check_fits_context(target_name, target_config, max(contexts), output_tokens,
                       f"--context-lengths {max(contexts)} + --max-new-tokens {output_tokens}")
    drafters, accepted, left_out, transferred, alpha_from = gather_acceptance(drafters, alpha, acceptance, target_name,
                                                                              family)
    corrections, measured_models, corrected = _corrections(Path(calibrate), system, backend) \
        if calibrate is not None else ({}, [], [])
    price_per_hour, price_note = tables_gpu_price(system, gpu_price)
    planner = tp_plan.TablePlanner(target_config, target_name, system, backend, corrections, measured_models,
                                   gemm_quant=gemm_quant, kv_cache_dtype=kv_cache_dtype,
                                   draft_gemm_quant=draft_gemm_quant, dp=dp, expert_parallel=expert_parallel)
    for drafter in drafters:
        source = planner.draft_source(drafter)
        if source is not None:
            corrected.append(f"  {drafter.name}'s forwards: the corrections of {source.name} "
                             f"({source.parameters / 1e9:.1f}B parameters), the measured model nearest its size")
    table, unpriced = tp_plan.plan_on_tables(planner, drafters, accepted, ks, sizes, contexts, tp_sizes,
                                             output_tokens, price_per_hour, draft_tp)
    left_out += unpriced
    if not table.empty and not (table["largest_batch"] > 0).any():  # the weights alone fill the GPUs
        largest = max(tp_sizes)
        need = planner.memory(None, largest, largest, min(contexts) + output_tokens)
        more = " or more --dp with --ep" if layout_notes else ""
        raise UsageError(f"{target_name} fits no batch on {system}: at TP{largest}{f' × DP{dp}' if dp > 1 else ''} "
                         f"its weights alone take {need.weights / 2 ** 30:.0f} GiB of each GPU's "
                         f"{need.usable / 2 ** 30:.0f} GiB (with the runtime's {need.reserved / 2 ** 30:.1f} GiB); "
                         f"give a larger --tp{more}, or a GPU with more memory (--device)")
    moe = bool(layout_notes)  # check_layout's notes are a mixture of experts' alone
    if moe:  # how the simulator did on NVIDIA's measured MoE serving
        from specbench.fleet.tables import moe_silicon_check

        layout_notes.append(moe_silicon_check(system, target_name, backend))
    layout_notes += tp_plan.launch_floor_notes(planner, table, drafters)
    table, step_notes = tp_plan.flag_steps(table)
    if not (table["draft"] != tp_plan.AR).any():  # the baseline alone answers nothing of speculation
        raise UsageError(f"no draft could be priced, so there is nothing to set beside the baseline: "
                         f"{'; '.join(left_out) or 'no draft asked for'}")
    return TablePrice(table, tp_plan.decisions(table), tp_plan.slo_choices(table, tpot) if tpot is not None else None,
                      kernel_tables.label(system, backend), target_name, system, backend, tp_sizes, output_tokens,
                      alpha_from, price_per_hour, price_note,
                      {d.name: drafter_label(d, draft_gemm_quant) for d in drafters},
                      "checkpoint" if moe and gemm_quant is None else DTYPE_OF[gemm_quant],
                      DTYPE_OF[draft_gemm_quant], kv_cache_dtype, precision_label(gemm_quant, kv_cache_dtype),
                      transferred, left_out, corrected, layout_notes, step_notes, planner.described_host(),
                      time.perf_counter() - started,
                      {"dp": dp, "expert_parallel": expert_parallel} if moe else {})


def check_layout(name: str, config: dict, dp: int, expert_parallel: bool, gemm_quant: str | None,
                 tp_sizes: Sequence[int] = (1,)) -> list[str]:
    """--dp and --ep, which apply to a mixture-of-experts target alone: one line refusing them for a
    dense one, else the notes saying how its experts are laid out and priced."""
    from specbench.fit import kernel_tables
    from specbench.models import routed_experts

    if dp < 1:
        raise UsageError(f"--dp must be >= 1, got {dp}")
    moe = routed_experts(config)
    if moe is None:
        if dp != 1 or expert_parallel:
            raise UsageError(f"--dp and --ep lay out a mixture-of-experts model's experts; {name} is dense: "
                             f"leave them out (its GPUs are its --tp)")
        return []
    uneven = [tp * dp for tp in tp_sizes if moe.experts % (tp * dp)]
    if expert_parallel and uneven:
        raise UsageError(f"--ep puts whole experts on each of TP × DP = {uneven[0]} GPUs, which does not divide "
                         f"{name}'s {moe.experts} experts: give a --tp and --dp whose product does")
    quants = {"gemm": gemm_quant, "moe": gemm_quant} if gemm_quant else kernel_tables.model_quants(config)
    spread = "whole experts on each GPU (EP)" if expert_parallel else "each expert split over the GPUs"
    gpus = f"all TP × {dp} GPUs, the attention split over TP in each of {dp} data-parallel ranks (a batch split " \
        f"evenly over them)" if dp > 1 else "its TP's GPUs"
    notes = [f"{name} is a mixture of experts ({moe.describe()}): its experts at {quants['moe']} and its other "
             f"weights at {quants['gemm']} ({'--dtype' if gemm_quant else 'its checkpoint'}'s), {spread}, over "
             f"{gpus}; a step's expert GEMMs priced at the tokens it routes (a verify's K + 1 a row), on the "
             f"tables' MoE timings, which NVIDIA measured with power-law expert popularity"]
    if quants["gemm"] == "fp8_block":
        notes.append("the tables' fp8_block GEMM timings are flat in the batch, several times their fp8 and 16-bit "
                     "ones at small batches (docs/validation.md, section 7): a decode step here may be priced too "
                     "dear, and speculation's gain with it")
    return notes


def parse_alphas(text: str) -> list[tuple[float, ...]]:
    """`0.6,0.7,0.8`: each an i.i.d. α in [0, 1), or a per-position profile `0.9/0.8/0.7`."""
    from specbench.synthetic import parse_alpha

    profiles = [parse_alpha(item.strip()) for item in text.split(",") if item.strip()]
    if not profiles or any(p[-1] >= 1 for p in profiles):
        raise UsageError(f"--alpha needs values in [0, 1) (0.6,0.7 or a profile 0.9/0.8), got {text!r}")
    return profiles


def check_precision(dtype: str | None, kv_cache_dtype: str,
                    draft_dtype: str | None = None) -> tuple[str | None, str | None]:
    """--dtype, --draft-dtype and --kv-cache-dtype on the tables: the target's and a draft model's
    GEMM quantisation as the tables name it (None: 16-bit), or one line naming what they take."""
    from specbench.fit.table_plan import GEMM_QUANTS
    from specbench.fleet.tables import KV_CACHE_DTYPES

    for flag, value in (("--dtype", dtype), ("--draft-dtype", draft_dtype)):
        if (value or "bf16") not in GEMM_QUANTS:
            raise UsageError(f"{flag} on the tables must be one of {', '.join(GEMM_QUANTS)}, got {value!r}")
    if kv_cache_dtype not in KV_CACHE_DTYPES:
        raise UsageError(f"--kv-cache-dtype must be {' or '.join(KV_CACHE_DTYPES)}, got {kv_cache_dtype!r}")
    return GEMM_QUANTS[dtype or "bf16"], GEMM_QUANTS[draft_dtype or "bf16"]


def drafter_label(drafter, draft_gemm_quant: str | None) -> str:
    """'llama3-8b', or 'llama3-8b, fp8' for a draft model whose GEMMs are not 16-bit."""
    quantised = drafter.draft_kind.takes_draft_dtype and draft_gemm_quant is not None
    return f"{drafter.label}, {DTYPE_OF[draft_gemm_quant]}" if quantised else drafter.label


def precision_label(gemm_quant: str | None, kv_cache_dtype: str) -> str:
    """' (fp8, fp8 KV cache)' after the target's name where either is not 16-bit, else ''."""
    parts = ([DTYPE_OF[gemm_quant]] if gemm_quant else []) + ([f"{kv_cache_dtype} KV cache"]
                                                               if kv_cache_dtype != "auto" else [])
    return f" ({', '.join(parts)})" if parts else ""


def check_tp(tp: Sequence[int], draft_tp: int | None) -> list[int]:
    """The target's TP sizes (each >= 1), with the draft model's TP (1 or the target's, vLLM's rule;
    None: the target's)."""
    tp_sizes = list(tp)
    if not tp_sizes or any(t < 1 for t in tp_sizes):
        raise UsageError(f"--tp sizes must be >= 1, got {','.join(map(str, tp_sizes))!r}")
    bad = [t for t in tp_sizes if draft_tp is not None and draft_tp not in (1, t)]
    if bad:
        raise UsageError(f"--draft-tp must be 1 or the target's TP (vLLM's rule), got {draft_tp} with --tp {bad[0]}")
    return tp_sizes


def check_fits_context(target_name: str, target_config: dict, prompt_tokens: int, output_tokens: int,
                       asked: str) -> None:
    """One line where a request of `prompt_tokens` in and `output_tokens` out is longer than the
    target's context: vLLM refuses it (a prompt plus max_tokens past max_model_len, which defaults
    to the model's max_position_embeddings), so no figure the tables give for it means anything."""
    limit = int(target_config.get("max_position_embeddings") or 0)
    if limit and prompt_tokens + output_tokens > limit:
        raise UsageError(f"{asked}: {prompt_tokens + output_tokens} tokens a request, past {target_name}'s "
                         f"{limit}-token context (vLLM refuses such requests)")


def target_and_drafters(target: str, drafts: Sequence[str]) -> tuple[str | None, str, dict, list]:
    """(the target's family, its name, its config, the drafters `drafts` names), none downloaded."""
    from specbench.fit import table_plan as tp_plan
    from specbench.models import lookup_alias

    spec = lookup_alias(target)
    family = spec.family if spec else None
    target_name, target_config = tp_plan.model_config(target)
    return family, target_name, target_config, tp_plan.parse_drafters(list(drafts), target_name, target_config, family)


def gather_acceptance(drafters: list, alpha: str | float | None, acceptance: Path | str | None, target_name: str,
                      family: str | None) -> tuple[list, list, list[str], str, str]:
    """What each drafter accepts, from --alpha and/or a run (--acceptance): (the drafters that have
    an acceptance, their Acceptance rows, left-out lines, the transferred-acceptance warning, where
    the α came from). A drafter without one is named in a left-out line, never planned silently."""
    from specbench.fit import table_plan as tp_plan
    from specbench.models import lookup_alias

    left_out: list[str] = []
    transferred = ""
    accepted, sources = [], []
    if alpha is not None:
        alpha = alpha if isinstance(alpha, str) else f"{alpha:g}"
        priced = [d for d in drafters if not d.draft_kind.alpha_needs_a_run]
        accepted += tp_plan.given_acceptance(priced, parse_alphas(alpha))
        sources.append(f"--alpha {alpha}")
        if acceptance is None:
            left_out += [f"{d.name}: n-gram acceptance depends on the text, so it must come from a run "
                         f"(--acceptance RUN)" for d in drafters if d.draft_kind.alpha_needs_a_run]
    if acceptance is not None and str(acceptance).startswith(PUBLISHED):
        from specbench.fit.published_acceptance import preset

        accepted += _published(drafters, str(acceptance), target_name, left_out)
        sources.append(preset(str(acceptance)).describe())
    elif acceptance is not None:
        from specbench.results import load_run, recorded_config

        run = load_run(acceptance)
        run_target = recorded_config(run.meta)["grid"].get("target", "?")
        measured, missing = tp_plan.run_acceptance(run.cells, run.steps, run_target, drafters, family, str(run.path),
                                                   run.requests)
        accepted += measured
        left_out += missing if alpha is None else [line.replace(" (give --alpha to plan it)", " (planned at --alpha only)")
                                                   for line in missing]
        sources.append(str(run.path))
        theirs = lookup_alias(run_target)
        if measured and (theirs.alias if theirs else run_target) != target_name:
            transferred = (f"the α was measured with target {run_target} ({run.path}) and is applied to "
                           f"{target_name}; a draft accepted by one target is not always accepted as often by another")
    if not accepted:
        raise UsageError("no drafter has an acceptance to plan with: " + "; ".join(left_out))
    drafters = [d for d in drafters if any(a.draft == d.name for a in accepted)]
    alpha_from = " and ".join(sources)
    return drafters, accepted, left_out, transferred, alpha_from


def _published(drafters: list, reference: str, target_name: str, left_out: list[str]) -> list:
    """The preset's acceptance for each drafter of its kind (a line in `left_out` for the others),
    refused where no drafter is of its kind or the target is not the one it was measured on."""
    from specbench.fit.published_acceptance import preset
    from specbench.fit.table_plan import Acceptance

    found = preset(reference)
    if found.target != target_name:
        raise UsageError(f"--acceptance {reference} was measured on {found.target}, not {target_name}: a drafter's "
                         f"acceptance does not carry to another target (--alpha to plan at a typed α)")
    matching = [d for d in drafters if d.draft_kind.name == found.drafter]
    kind = {"mtp": "an MTP", "eagle3": "an EAGLE-3", "eagle": "an EAGLE", "model": "a draft model"}.get(
        found.drafter, f"a {found.drafter}")
    if not matching:
        raise UsageError(f"--acceptance {reference} is {kind} drafter's; give --drafts {found.drafter}"
                         if found.drafter != "model" else f"--acceptance {reference} is a draft model's; give "
                                                          f"--drafts with that model")
    left_out += [f"{d.name}: --acceptance {reference} is {kind} drafter's, not this one's"
                 for d in drafters if d not in matching]
    return [Acceptance(d.name, f"{PUBLISHED}{found.name}", found.alpha, (), found.source) for d in matching]


def _corrections(path: Path, system: str, backend: str) -> tuple[dict, list, list[str]]:
    """The tables' corrections by a native or vLLM run measured on a GPU the tables hold, and the
    lines that say so. Each correction is measured / tables on the run's own GPU's tables; a run
    from another GPU than the plan's carries them over (the engine's overhead over vLLM's kernels,
    not the GPU's: specbench/data/measured.json's finding cross_gpu_correction)."""
    from specbench.fit.calibration import calibrate, calibrate_served, run_system
    from specbench.fit.kernel_tables import backend_version
    from specbench.results import load_run

    run = load_run(path)
    gpus = (run.meta.get("hardware") or {}).get("gpus") or []
    if not gpus:
        raise UsageError(f"--calibrate needs a run measured on a GPU; {run.path} ran on a CPU, whose forwards say "
                         f"nothing of a GPU's")
    measured_system = run_system(run.meta)
    if measured_system is None or backend_version(measured_system, backend) is None:
        raise UsageError(f"--calibrate: {run.path} ran on {gpus[0]['name']}, which the {backend} tables do not hold, "
                         f"so its forwards have nothing to be compared with; give a run from a GPU they hold")
    engine = (run.meta.get("engine") or {}).get("name", "native")
    if engine not in ("native", "vllm"):
        raise UsageError(f"--calibrate: {run.path} measured an endpoint, whose engine and TP specbench does not "
                         f"know; give a native or vLLM run")
    if engine == "vllm":
        found = calibrate_served(run.cells, run.meta, measured_system, backend)
        how = f"vLLM at TP{found.tp}, per step from TPOT × τ"
    else:
        found = calibrate(run.cells, run.steps, run.requests, run.meta, measured_system, backend)
        how = "the native engine at TP1"
    kinds = found.by_kind()
    if not kinds:
        raise UsageError(f"--calibrate: {run.path} has no finished cells to correct the tables by")
    carried = "" if measured_system == system else f" on {measured_system}'s tables, carried to {system}'s"
    lines = [f"the tables scaled by what {run.path} measured ({found.target} on {gpus[0]['name']}, {how}; "
             f"measured / tables per kind{carried}, through each measured B and held beyond, carried to the plan's "
             f"models and TP):"]
    lines += [f"  {kind}: {correction.describe()}" for kind, correction in kinds.items()]
    return kinds, found.measured_models(), lines
