"""The report's analysis of a run: every figure it shows (α fit, predictions, held-out checks,
B*, costs, goodput and capacity, a trace's paired speed-ups), its tables, and its answer in one
sentence. It reads the run's tables and the judge (`fit`, `gate`), and draws nothing (charts.py)."""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from specbench.fit import (
    AR, Slo, alpha_table, b_star_rule, baseline_note, baseline_speed, best_k_by_batch, capacity_ratio, capacity_text,
    cost_per_million, crossover_table, default_gpu_price, held_out, held_out_context, label_cells, label_context,
    load_column, measurement_warnings, parse_slo, predictions, slo_capacity, slo_table, slow_baseline_warning,
    trust_lines,
)
from specbench.fit.noise import run_noise
from specbench.fit.physics import with_bounds
from specbench.fit.replay import replay_answer, replay_table, send_lag_summary
from specbench.gate import slo_judged_draft
from specbench.results import Run, recorded_config

ALPHA_NOTE = ("alpha_iid: the per-token acceptance probability fitted under the i.i.d. model (accepted / "
              "(accepted + rejections)), what τ(α, K) and the performance model use; acceptance_rate: accepted / "
              "drafted, vLLM's acceptance rate and the cells' `alpha` column. The second is lower for K > 1: drafts "
              "after a rejected one are drafted but never tried.")
TABLE_NOTES = {"alpha fit": ALPHA_NOTE}


@dataclass
class Analysis:
    run: Run
    cells: pd.DataFrame  # ok, non-synthetic cells
    alphas: pd.DataFrame
    predicted: pd.DataFrame
    best: pd.DataFrame
    crossovers: pd.DataFrame
    costs: pd.DataFrame
    cost_unit: str
    price_note: str
    warnings: list[str]  # measurement_warnings: on the console, the page and the summary
    answer: str = ""  # the first paragraph: the answer in one sentence
    load: str = "batch_size"  # what the run varied: batch_size (closed loop) or request_rate (open loop)
    slo: Slo | None = None
    goodput: pd.DataFrame | None = None  # slo_table: per cell
    capacity: pd.DataFrame | None = None  # slo_capacity with the cost at each capacity
    price: float | None = None
    gpus: int = 1
    baseline: pd.DataFrame | None = None  # baseline_speed: against the roofline and a reference run
    baseline_note: str = ""
    reference: str = ""  # the reference run's engine, when one was given
    held_out: pd.DataFrame | None = None  # fit.held_out: the largest batch sizes predicted from the smaller
    held_out_context: pd.DataFrame | None = None  # fit.held_out_context: the longest context from the shorter
    trust: list[str] = field(default_factory=list)  # how far the performance model's predictions can be trusted
    replayed: pd.DataFrame | None = None  # fit.replay.replay_table: a trace run's paired per-request speed-ups


def engine_label(meta: dict) -> str:
    engine = meta.get("engine") or {"name": "native"}
    if engine.get("name") == "vllm":
        return f"vLLM {engine.get('version', '')}".strip()
    return "specbench's native engine" if engine.get("name") == "native" else str(engine.get("name"))


def analyse(run: Run, gpu_price: float | None = None, gpus: int = 1, slo: str | None = None,
            reference: Run | None = None) -> Analysis:
    """Every figure of the report. `slo` (default: the run's --slo) adds goodput and capacity;
    `reference`, a run of the same grid on another engine, is what the baseline is compared with."""
    a = _analyse(run, gpu_price, gpus)
    a.load = load_column(run.cells)
    a.reference = engine_label(reference.meta) if reference is not None else ""
    a.baseline = baseline_speed(run.cells, reference.cells if reference is not None else None)
    a.baseline_note = baseline_note(a.baseline, a.reference)
    if run.meta.get("trace"):
        a.replayed = replay_table(run.cells, run.requests)
    slow = slow_baseline_warning(a.baseline, a.reference)
    if slow:
        a.warnings = [slow] + a.warnings
    text = slo or recorded_config(run.meta)["gate"].get("slo") or ""
    if text:
        a.slo = parse_slo(text)
        a.goodput = slo_table(run.cells, run.requests, a.slo)
        capacity = slo_capacity(a.goodput)
        if not capacity.empty:
            capacity["cost_per_1m"] = cost_per_million(capacity["tokens_per_s"], a.price, gpus)
        a.capacity = capacity
    return a


def _analyse(run: Run, gpu_price: float | None = None, gpus: int = 1) -> Analysis:
    cells = run.cells[run.cells["status"] == "ok"].copy() if not run.cells.empty else run.cells
    alphas = label_context(alpha_table(cells, run.steps))  # real acceptance only: synthetic cells are excluded there
    predicted = predictions(run.cells, run.steps, run.requests, run.meta)  # synthetic cells too: their α is set
    validation = held_out(run.cells, run.steps, run.requests, run.meta)
    by_context = held_out_context(run.cells, run.steps, run.requests, run.meta)
    cells = label_cells(cells)
    price, note = (gpu_price, "price given") if gpu_price is not None else default_gpu_price(run.meta.get("hardware", {}))
    unit = "$ per 1M tokens" if price is not None else "device-hours per 1M tokens"
    if price is not None and gpu_price is None:
        note = f"default {note} price ${price:.2f}/GPU-hour (override with --gpu-price)"
    costs = cells[["cell_id", "mode", "draft", "k", "workload", "temperature", "batch_size", "tokens_per_s"]].copy() \
        if not cells.empty else pd.DataFrame()
    if not costs.empty:
        costs["cost_per_1m"] = cost_per_million(costs["tokens_per_s"], price, gpus)
    return Analysis(run, cells, alphas, predicted, best_k_by_batch(cells), crossover_table(cells), costs, unit,
                    note + (f"; {gpus} devices" if gpus != 1 else ""),
                    measurement_warnings(run.cells, run.baseline_copies, run_noise(run.cells, run.requests, run.steps)),
                    price=price, gpus=gpus, held_out=validation, held_out_context=by_context,
                    trust=trust_lines(run, predicted, validation, by_context))


def _load_points(a: Analysis) -> pd.DataFrame:
    """Per (draft, workload, temperature, load): the autoregressive cell and each draft's best-K
    cell (most tokens/s), with the load in `load` and per-user tokens/s (1 / TPOT p50)."""
    cells = a.cells[a.cells[a.load].fillna(0) > 0] if a.load in a.cells else a.cells.iloc[0:0]
    if cells.empty:
        return cells
    cells = cells.assign(load=cells[a.load].astype(float), per_user=1.0 / cells["tpot_p50_s"])
    sd = cells[cells["mode"] != AR]
    best = sd.loc[sd.groupby(["draft", "workload", "temperature", "load"])["tokens_per_s"].idxmax()] if len(sd) else sd
    return pd.concat([cells[cells["mode"] == AR], best])


def _load_name(a: Analysis, value: float) -> str:
    if a.load == "request_rate":
        return "∞/s" if math.isinf(value) else f"{value:g}/s"
    return f"B={value:g}"


def answer(a: Analysis, gate_result=None) -> str:
    """The report's first paragraph: its answer in one sentence, with numbers."""
    if a.replayed is not None:
        sentence = replay_answer(a.replayed, a.run.meta["trace"].get("describe", ""))
        if sentence:
            return sentence
    if a.capacity is not None and not a.capacity.empty and a.slo is not None:
        cap = a.capacity
        base, spec = cap[cap["mode"] == AR], cap[cap["mode"] != AR]
        if not base.empty and not spec.empty:
            # The draft `check --slo` judges (gate.slo_judged_draft), at its least favourable
            # (workload, temperature): the lowest ratio of capacities.
            judged = slo_judged_draft(cap)
            worst = {}
            for row in spec[spec["draft"] == judged].itertuples():
                b = base[(base["workload"] == row.workload) & (base["temperature"] == row.temperature)]
                if b.empty:
                    continue
                ratio = capacity_ratio(row.max_load, b["max_load"].iloc[0])
                if row.draft not in worst or ratio < worst[row.draft][0]:
                    worst[row.draft] = (ratio, row, b.iloc[0])
            if worst:
                ratio, row, b = worst[judged]
                kind = "request rate" if a.load == "request_rate" else "concurrency"
                verb = "raises" if ratio > 1 else ("keeps" if ratio == 1 else "lowers")
                cost = ""
                if pd.notna(row.cost_per_1m) and pd.notna(b["cost_per_1m"]):
                    money = (lambda v: f"${v:.3g}") if a.price is not None else (lambda v: f"{v:.3g} device-hours")
                    cost = (f", at {money(row.cost_per_1m)} per 1M output tokens there against {money(b['cost_per_1m'])}"
                            + (" (pass --gpu-price for dollars)" if a.price is None else ""))
                k = f", K={int(row.k)}" if pd.notna(row.k) else ""
                if ratio == 1 and pd.notna(row.max_load) and row.max_load >= row.max_measured_load:
                    return (f"Under {a.slo.describe()}, every measured {kind} up to "
                            f"{capacity_text(row.max_load, math.inf, a.load)} meets the SLO with and without "
                            f"speculation ({row.draft}{k}; {row.workload}, T={row.temperature:g}), where it gives "
                            f"{row.tokens_per_s:.1f} output tokens/s against {b['tokens_per_s']:.1f}{cost}; measure "
                            f"higher loads to find where they part.")
                return (f"Under {a.slo.describe()}, speculation with {row.draft}{k} {verb} the highest {kind} one "
                        f"server sustains from {capacity_text(b['max_load'], b['max_measured_load'], a.load)} to "
                        f"{capacity_text(row.max_load, row.max_measured_load, a.load)} ({row.workload}, "
                        f"T={row.temperature:g}: the least favourable workload and temperature){cost}.")
    if gate_result is not None and getattr(gate_result, "headline", ""):
        incomplete = f" Judged on an incomplete run: {gate_result.incomplete}." if gate_result.incomplete else ""
        return gate_result.headline + incomplete
    points = _load_points(a)
    if len(points) and a.load == "request_rate":
        sd = points[points["mode"] != AR]
        if len(sd):
            top = sd["load"].replace(np.inf, np.nan).max()
            at = points[points["load"] == top]
            base, spec = at[at["mode"] == AR], at[at["mode"] != AR].sort_values("tpot_p50_s")
            if len(base) and len(spec):
                s0, b0 = spec.iloc[0], base.iloc[0]
                return (f"At {top:g} requests/s, {s0['draft']} (K={int(s0['k'])}) gives each user a TPOT p50 of "
                        f"{s0['tpot_p50_s'] * 1e3:.1f} ms against {b0['tpot_p50_s'] * 1e3:.1f} ms without speculation "
                        f"({s0['workload']}, T={s0['temperature']:g}); pass --slo for the highest rate that meets an SLO.")
    return ""


def summary_tables(a: Analysis) -> dict[str, pd.DataFrame]:
    cells, load = a.cells, a.load  # load: batch_size, or request_rate on an open-loop run
    columns = ["workload", load, "temperature", "draft", "k", "tokens_per_s", "speedup", "speedup_bound",
               "above_bound", "pairing", "alpha", "tau", "ttft_p50_s", "itl_p50_s", "itl_p99_s", "itl_chunk_p50_s",
               "itl_chunk_p99_s", "tpot_p50_s", "lossless"]
    cells = with_bounds(cells, run_noise(a.run.cells, a.run.requests, a.run.steps)) \
        if not cells.empty and "speedup" in cells else cells
    cell_table = cells[[c for c in columns if c in cells]].sort_values(["workload", "temperature", load, "draft", "k"]) \
        if not cells.empty else pd.DataFrame()
    tables = {"cells": cell_table}
    if "roofline_fraction" in cells:
        baseline = cells[cells["roofline_fraction"].notna()].copy()
        if len(baseline):
            baseline["decode_step_ms"] = (baseline["step_verify_s"] + baseline["step_overhead_s"]) * 1e3
            baseline["roofline_step_ms"] = baseline["roofline_step_s"] * 1e3
            tables["autoregressive baseline vs memory-bandwidth roofline"] = baseline[
                ["workload", "batch_size", "temperature", "decode_step_ms", "roofline_step_ms", "roofline_fraction"]
            ].sort_values(["workload", "temperature", "batch_size"])
    if a.reference and a.baseline is not None and "of_reference" in a.baseline:
        tables[f"autoregressive baseline vs {a.reference} (the reference run)"] = a.baseline
    if "kv_cache_tokens" in cells and cells["kv_cache_tokens"].notna().any():
        served = cells.copy()
        served["peak_memory_gib"] = served["peak_memory_bytes"] / 1024 ** 3
        for name in ("ttft_mean_s", "server_ttft_mean_s", "itl_mean_s", "itl_chunk_mean_s", "server_itl_mean_s"):
            served[name.replace("_s", "_ms")] = served[name] * 1e3 if name in served else float("nan")
        served["client_cpu_per_token_us"] = served["client_cpu_per_token_s"] * 1e6
        tables["server: KV-cache capacity, memory, and the server's own latencies next to the client's (ITL: "
               "itl per token, itl_chunk per chunk as vllm bench serve counts it, server per engine step)"] = served[
            ["workload", load, "temperature", "draft", "k", "kv_cache_tokens", "kv_cache_max_concurrency",
             "peak_memory_gib", "ttft_mean_ms", "server_ttft_mean_ms", "itl_mean_ms", "itl_chunk_mean_ms",
             "server_itl_mean_ms",
             "client_cpu_per_token_us"]].sort_values(["workload", "temperature", load, "draft", "k"])
    if not a.alphas.empty:
        tables["alpha fit"] = a.alphas
    if not a.predicted.empty:
        tables["predicted vs measured (in-sample)"] = a.predicted.drop(columns=["cell_id"])
    if a.held_out is not None and not a.held_out.empty:
        tables["held out: each of the largest batch sizes predicted from the smaller ones"] = a.held_out[
            ["held_out_batch_size", "trained_on", "draft", "workload", "temperature", "context_length", "k",
             "speedup_measured", "speedup_predicted", "speedup_error", "same_side"]]
    if a.held_out_context is not None and not a.held_out_context.empty:
        tables["held out: the longest context length predicted from the shorter ones"] = a.held_out_context.drop(
            columns=["cell_id"])
    if not a.crossovers.empty:
        tables[f"crossover batch size ({b_star_rule()}; per workload and temperature, and their worst case)"] = \
            a.crossovers
    if not a.costs.empty:
        tables[a.cost_unit] = a.costs.drop(columns=["cell_id", "mode"])
    if a.replayed is not None:
        trace, replayed = a.run.meta["trace"], a.replayed
        if not replayed.empty:
            notes = "; ".join(f"{n} row(s) skipped: {why}" for why, n in (trace.get("skipped") or {}).items()) or \
                "no row skipped"
            sorted_rows = f"; {trace['out_of_order']} row(s) out of time order, sorted" if trace.get("out_of_order") else ""
            lag = send_lag_summary(a.run.cells, a.run.requests)
            tables[f"trace replay: {trace.get('describe', '')}, {trace.get('requests')} requests ({notes}{sorted_rows})"
                   f"{'; ' + lag if lag else ''}; speed-ups per request, baseline / speculative (> 1: faster), "
                   f"95 % intervals"] = replayed
    failed = a.run.cells[a.run.cells["status"] != "ok"] if not a.run.cells.empty else pd.DataFrame()
    if len(failed):
        tables["cells that did not finish"] = failed[["cell_id", "status", "message"]]
    return tables
