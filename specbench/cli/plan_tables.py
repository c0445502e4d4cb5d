"""`specbench plan --target MODEL --device GPU --tp 4,8`: speculative decoding priced from NVIDIA's
measured kernel tables, with no run (docs/performance-model.md, "Planning on kernel tables")."""

from __future__ import annotations

import json
import math
import time
from pathlib import Path

from rich.table import Table

from specbench.cli.common import UsageError, console, split_list
from specbench.cli.render import print_table


def parse_alphas(text: str) -> list[tuple[float, ...]]:
    """`0.6,0.7,0.8`: each an i.i.d. α in [0, 1), or a per-position profile `0.9/0.8/0.7`."""
    from specbench.synthetic import parse_alpha

    profiles = [parse_alpha(item.strip()) for item in text.split(",") if item.strip()]
    if not profiles or any(p[-1] >= 1 for p in profiles):
        raise UsageError(f"--alpha needs values in [0, 1) (0.6,0.7 or a profile 0.9/0.8), got {text!r}")
    return profiles


def plan_from_tables(target: str, drafts: str, device: str, backend: str, tps: str, draft_tp: str | None,
                     ks: list[int], sizes: list[int], contexts: list[int], output_tokens: int,
                     alpha: str | None, acceptance: Path | None, gpu_price: float | None, slo: str | None,
                     json_output: bool, calibrate: Path | None = None, notes: list[str] = (),
                     gemm_quant: str | None = None, kv_cache_dtype: str = "auto",
                     draft_gemm_quant: str | None = None) -> None:
    from specbench.fit import kernel_tables
    from specbench.fit import table_plan as tp_plan
    from specbench.fit.prices import tables_gpu_price

    started = time.perf_counter()
    if alpha is None and acceptance is None:
        raise UsageError("planning on the tables needs an acceptance: --alpha 0.6,0.7,0.8 or --acceptance RUN "
                         "(a run's measured α)")
    tp_sizes, draft_tp_size = parse_tp(tps, draft_tp)
    tpot = None
    if slo is not None:
        from specbench.fit import parse_slo

        bounds = dict(parse_slo(slo).bounds)
        if set(bounds) != {"tpot"}:
            raise UsageError(f"--slo on the tables takes a TPOT target only (tpot=SECONDS), got {slo!r}")
        tpot = bounds["tpot"] * 1000
    system = kernel_tables.check_device(device, backend)
    family, target_name, target_config, drafters = target_and_drafters(target, drafts)
    check_fits_context(target_name, target_config, max(contexts), output_tokens,
                       f"--context-lengths {max(contexts)} + --max-new-tokens {output_tokens}")
    drafters, accepted, left_out, transferred, alpha_from = gather_acceptance(drafters, alpha, acceptance, target_name,
                                                                              family)
    corrections, measured_models, corrected = _corrections(calibrate, system, backend) \
        if calibrate is not None else ({}, [], [])
    price, price_note = tables_gpu_price(system, gpu_price)
    planner = tp_plan.TablePlanner(target_config, target_name, system, backend, corrections, measured_models,
                                   gemm_quant=gemm_quant, kv_cache_dtype=kv_cache_dtype,
                                   draft_gemm_quant=draft_gemm_quant)
    precision = precision_label(gemm_quant, kv_cache_dtype)
    for drafter in drafters:
        source = planner.draft_source(drafter)
        if source is not None:
            corrected.append(f"  {drafter.name}'s forwards: the corrections of {source.name} "
                             f"({source.parameters / 1e9:.1f}B parameters), the measured model nearest its size")
    table, unpriced = tp_plan.plan_on_tables(planner, drafters, accepted, ks, sizes, contexts, tp_sizes,
                                             output_tokens, price, draft_tp_size)
    left_out += unpriced
    table, step_notes = tp_plan.flag_steps(table)
    if not (table["draft"] != tp_plan.AR).any():  # the baseline alone answers nothing of speculation
        raise UsageError(f"no draft could be priced, so there is nothing to set beside the baseline: "
                         f"{'; '.join(left_out) or 'no draft asked for'}")
    decided = tp_plan.decisions(table)
    slo_table = tp_plan.slo_choices(table, tpot) if tpot is not None else None
    seconds = time.perf_counter() - started
    label = kernel_tables.label(system, backend)
    unit = "$/1M tok" if price is not None else "GPU-h/1M tok"
    if json_output:
        records = lambda frame: json.loads(frame.to_json(orient="records"))  # noqa: E731
        print(json.dumps({"estimate": f"ESTIMATE from {label}", "tables": label, "target": target_name,
                          "dtype": DTYPE_OF[gemm_quant], "draft_dtype": DTYPE_OF[draft_gemm_quant],
                          "kv_cache_dtype": kv_cache_dtype,
                          "device": system, "backend": backend, "tp": tp_sizes, "output_tokens": output_tokens,
                          "alpha_from": alpha_from, "acceptance_transferred": transferred or None,
                          "drafts_left_out": left_out, "price": price_note, "price_per_gpu_hour": price,
                          "drafters": {d.name: drafter_label(d, draft_gemm_quant) for d in drafters},
                          "seconds": round(seconds, 3),
                          "corrected_by": corrected or None, "notes": list(notes) or None,
                          "step_notes": step_notes or None,
                          **planner.described_host(),
                          "predictions": records(table), "decisions": records(decided),
                          "slo": records(slo_table) if slo_table is not None else None}, indent=2))
        return
    console.print(f"[bold red]ESTIMATE[/] from {label}: {target_name}{precision} with "
                  f"{', '.join(f'{d.name} ({drafter_label(d, draft_gemm_quant)})' for d in drafters)}; "
                  f"α from {alpha_from}; "
                  f"{output_tokens} output tokens per request; prices {price_note}; not measurements",
                  highlight=False, soft_wrap=True)
    for line in [*notes] + ([f"TRANSFERRED ACCEPTANCE: {transferred}"] if transferred else []) + \
            [f"left out: {why}" for why in left_out] + [("CORRECTED: " if not n else "") + line
                                                        for n, line in enumerate(corrected)]:
        console.print(line, highlight=False, soft_wrap=True)
    print_table_plan(table, decided, unit)
    if slo_table is not None:
        print_slo(slo_table, unit)
    print_step_notes(step_notes)
    console.print(f"{len(table)} cells priced in {seconds:.1f} s", highlight=False)


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
    quantised = drafter.kind == "model" and draft_gemm_quant is not None
    return f"{drafter.label}, {DTYPE_OF[draft_gemm_quant]}" if quantised else drafter.label


DTYPE_OF = {None: "bf16", "fp8": "fp8", "nvfp4": "fp4"}  # the tables' names back to --dtype's


def precision_label(gemm_quant: str | None, kv_cache_dtype: str) -> str:
    """' (fp8, fp8 KV cache)' after the target's name where either is not 16-bit, else ''."""
    parts = ([DTYPE_OF[gemm_quant]] if gemm_quant else []) + ([f"{kv_cache_dtype} KV cache"]
                                                               if kv_cache_dtype != "auto" else [])
    return f" ({', '.join(parts)})" if parts else ""


def parse_tp(tps: str, draft_tp: str | None) -> tuple[list[int], int | None]:
    """--tp sizes (each >= 1) and --draft-tp (1 or the target's TP, vLLM's rule; None: the target's)."""
    tp_sizes = split_list(tps, int, "--tp")
    if any(t < 1 for t in tp_sizes):
        raise UsageError(f"--tp sizes must be >= 1, got {tps!r}")
    if draft_tp in (None, "tp"):
        return tp_sizes, None
    draft_tp_size = split_list(draft_tp, int, "--draft-tp")[0]
    bad = [t for t in tp_sizes if draft_tp_size not in (1, t)]
    if bad:
        raise UsageError(f"--draft-tp must be 1 or the target's TP (vLLM's rule), got {draft_tp_size} with "
                         f"--tp {bad[0]}")
    return tp_sizes, draft_tp_size


def check_fits_context(target_name: str, target_config: dict, prompt_tokens: int, output_tokens: int,
                       asked: str) -> None:
    """One line where a request of `prompt_tokens` in and `output_tokens` out is longer than the
    target's context: vLLM refuses it (a prompt plus max_tokens past max_model_len, which defaults
    to the model's max_position_embeddings), so no figure the tables give for it means anything."""
    limit = int(target_config.get("max_position_embeddings") or 0)
    if limit and prompt_tokens + output_tokens > limit:
        raise UsageError(f"{asked}: {prompt_tokens + output_tokens} tokens a request, past {target_name}'s "
                         f"{limit}-token context (vLLM refuses such requests)")


def target_and_drafters(target: str, drafts: str) -> tuple[str | None, str, dict, list]:
    """(the target's family, its name, its config, the drafters --drafts names), none downloaded."""
    from specbench.fit import table_plan as tp_plan
    from specbench.models import lookup_alias

    spec = lookup_alias(target)
    family = spec.family if spec else None
    target_name, target_config = tp_plan.model_config(target)
    return family, target_name, target_config, tp_plan.parse_drafters(split_list(drafts, str, "--drafts"),
                                                                      target_name, target_config, family)


def gather_acceptance(drafters: list, alpha: str | None, acceptance: Path | None, target_name: str,
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
        priced = [d for d in drafters if d.kind != "ngram"]
        accepted += tp_plan.given_acceptance(priced, parse_alphas(alpha))
        sources.append(f"--alpha {alpha}")
        if acceptance is None:
            left_out += [f"{d.name}: n-gram acceptance depends on the text, so it must come from a run "
                         f"(--acceptance RUN)" for d in drafters if d.kind == "ngram"]
    if acceptance is not None:
        from specbench.results import load_run

        run = load_run(acceptance)
        run_target = (run.meta.get("config") or {}).get("target", "?")
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


def print_table_plan(table, decided, unit: str) -> None:
    from specbench.fit import AR
    from specbench.fit.table_plan import best_k

    best = best_k(table)
    ar = table[table["draft"] == AR].set_index(["tp", "context_length", "batch_size"])
    for (tp, context, acceptance), group in best.groupby(["tp", "context_length", "acceptance"]):
        shown = Table(title=f"TP{tp}, {context}-token prompts, {acceptance}: best K per batch size",
                      title_justify="left", header_style="bold")
        for column in ("draft", "B", "K", "τ", "AR step ms", "SD step ms", "AR tok/s/GPU", "SD tok/s/GPU",
                       "tok/s/user", "speed-up", f"AR {unit}", f"SD {unit}", "GiB/GPU"):
            shown.add_column(column, overflow="fold")
        for row in group.itertuples():
            base = ar.loc[(tp, context, row.batch_size)]
            mark = lambda flagged: " †" if flagged else ""  # noqa: E731  (flag_steps: see the notes)
            shown.add_row(row.draft, str(row.batch_size), str(row.k), f"{row.tau:.2f}",
                          f"{row.ar_step_ms:.2f}{mark(base.get('step_flag'))}",
                          f"{row.step_ms:.2f}{mark(getattr(row, 'step_flag', ''))}", f"{base['tokens_per_s_per_gpu']:.0f}", f"{row.tokens_per_s_per_gpu:.0f}",
                          f"{row.tokens_per_s_per_user:.0f}", f"{row.speedup:.2f}×", f"{base['cost_per_1m']:.3g}",
                          f"{row.cost_per_1m:.3g}", f"{row.memory_gib:.0f}")
        print_table(shown, keep=3)
        for row in decided[(decided["tp"] == tp) & (decided["context_length"] == context)
                           & (decided["acceptance"] == acceptance)].itertuples():
            console.print(f"  {row.draft}: {row.crossover}; K schedule {row.k_schedule}", highlight=False,
                          soft_wrap=True)
    unfit = table[~table["fits"]]
    for (tp, context, draft), group in unfit.groupby(["tp", "context_length", "draft"]):
        largest = int(group["largest_batch"].iloc[0])
        console.print(f"  does not fit: TP{tp}, {context}-token prompts, {draft}: B = "
                      f"{', '.join(str(b) for b in sorted(set(group['batch_size'])))} "
                      + (f"(the largest batch that fits is {largest})" if largest else
                         "(no batch fits: the weights alone exceed the GPUs' memory)"),
                      highlight=False, soft_wrap=True)


def print_step_notes(step_notes: list[str]) -> None:
    """The step times marked † in the tables above, one line each."""
    if step_notes:
        console.print("notes: † marks a step the tables price below what an engine can run", highlight=False)
        for line in step_notes:
            console.print(f"  † {line}", highlight=False, soft_wrap=True)


def print_slo(slo_table, unit: str) -> None:
    target = slo_table["tpot_ms_target"].iloc[0]
    shown = Table(title=f"TPOT ≤ {target:g} ms: the batch with the most tokens/s per GPU that meets it",
                  title_justify="left", header_style="bold")
    for column in ("TP", "prompt", "acceptance", "AR B", f"AR {unit}", "SD draft, K, B", f"SD {unit}", "cheapest"):
        shown.add_column(column, overflow="fold")
    for row in slo_table.itertuples():
        none = lambda v: v is None or (isinstance(v, float) and math.isnan(v))  # noqa: E731
        shown.add_row(str(row.tp), str(row.context_length), row.acceptance,
                      "–" if none(row.ar_batch) else str(int(row.ar_batch)),
                      "–" if none(row.ar_cost_per_1m) else f"{row.ar_cost_per_1m:.3g}",
                      "–" if none(row.sd_batch) else f"{row.sd_draft}, {int(row.sd_k)}, {int(row.sd_batch)}",
                      "–" if none(row.sd_cost_per_1m) else f"{row.sd_cost_per_1m:.3g}", row.cheapest or "none meets it")
    print_table(shown, keep=3)
    met = slo_table.dropna(subset=["cheapest"])
    if not met.empty:
        costs = met.apply(lambda r: min(c for c in (r["ar_cost_per_1m"], r["sd_cost_per_1m"])
                                        if c is not None and c == c), axis=1)
        best = met.loc[costs.idxmin()]
        console.print(f"  cheapest that meets it: TP{best['tp']}, {best['context_length']}-token prompts, "
                      f"{best['acceptance']}: {best['cheapest']} ({costs.min():.3g} {unit})", highlight=False,
                      soft_wrap=True)


def _corrections(path: Path, system: str, backend: str) -> tuple[dict, list, list[str]]:
    """The tables' corrections by a native or vLLM run measured on a GPU the tables hold, and the
    lines that say so. Each correction is measured / tables on the run's own GPU's tables; a run
    from another GPU than the plan's carries them over (the engine's overhead over vLLM's kernels,
    not the GPU's: benchmarks/tables-2026-11-28/cross_gpu.md)."""
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
