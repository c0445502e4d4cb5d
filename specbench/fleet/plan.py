"""Closed-loop serving simulated on the kernel tables: a target at each TP size, served by one
vLLM-like replica to C clients sending fixed-length requests, without speculation and with each
drafter × K at each acceptance (issue 40; how NVIDIA's measured rows were taken, so the same
simulator is checked against them: benchmarks/fleet-2026-11-25/silicon.py).

`closed_loop_table` is what `specbench plan --target … --concurrency …` prints, as a DataFrame a
notebook can use."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench.fit import kernel_tables
from specbench.fit.table_plan import Acceptance, Drafter, TablePlanner
from specbench.fleet.replica import Outcome, Speculation, simulate
from specbench.fleet.tables import replica_spec, step_cost
from specbench.schema import AR, LARGE_BATCH

REQUESTS_PER_CLIENT = 12  # each client's first and last request are left out (warm-up, drain)


def closed_loop(cost, spec, concurrency: int, isl: int, osl: int, speculation: Speculation | None = None,
                requests_per_client: int = REQUESTS_PER_CLIENT) -> tuple[Outcome, np.ndarray]:
    """C clients, their first requests a C-th of a request's lifetime apart (a benchmark's steady
    state, not its first burst), each sending its next when the last finished. Returns the outcome
    and the mask of requests measured (each client's first, and the drain at the end, left out)."""
    cycle = cost(min(isl, spec.max_num_batched_tokens), 0) + osl * cost(0, concurrency)
    count = concurrency * requests_per_client
    out = simulate(np.full(count, isl), np.full(count, osl), cost, spec, concurrency=concurrency,
                   client_starts_s=np.arange(concurrency) * cycle / concurrency, client_turnaround_s=1e-3,
                   speculation=speculation)
    keep = np.ones(count, bool)
    keep[:concurrency] = False
    keep[np.argsort(out.finish_s)[-concurrency:]] = False
    return out, keep


def _row(out: Outcome, keep: np.ndarray, gpus: int) -> dict:
    ttft, tpot, e2e = out.ttft_s[keep] * 1e3, out.tpot_s[keep] * 1e3, out.e2e_s[keep] * 1e3
    measured = out.finish_s[keep]
    span = float(measured.max() - out.arrival_s[keep].min()) if len(measured) else float("nan")
    tokens = float(out.output_tokens[keep].sum())
    return {**{f"ttft_p{p}_ms": float(np.percentile(ttft, p)) for p in (50, 90, 99)},
            **{f"tpot_p{p}_ms": float(np.nanpercentile(tpot, p)) for p in (50, 90, 99)},
            **{f"e2e_p{p}_ms": float(np.percentile(e2e, p)) for p in (50, 90, 99)},
            "tokens_per_s": tokens / span, "tokens_per_s_per_gpu": tokens / span / gpus,
            "share_at_large_batch": out.share_at_least(LARGE_BATCH), "preemptions": out.preemptions}


def closed_loop_table(planner: TablePlanner, drafters: list[Drafter], accepted: list[Acceptance], tps: list[int],
                      draft_tp: int | None, ks: list[int], concurrencies: list[int], isl: int, osl: int,
                      gemm_quant: str | None = None) -> tuple[pd.DataFrame, list[str]]:
    """One row per TP × concurrency × configuration (the baseline; each drafter × K × acceptance):
    TTFT, TPOT and E2E percentiles, tokens/s per GPU, the share of time at B >= 32, and TPOT's
    speed-up over the baseline. Drafters the tables cannot price here are named in the lines."""
    rows, left_out = [], []
    for drafter in drafters:
        if drafter.kind == "mtp":
            left_out.append(f"{drafter.name}: the fleet simulator prices draft models, EAGLE heads and n-gram "
                            f"drafting; MTP is priced by `plan --target` without --concurrency")
    for tp in tps:
        target = planner.forward(planner.target, tp) if gemm_quant is None else kernel_tables.Forward(
            planner.target, planner.system, planner.backend, tp, name=planner.target_name, gemm_quant=gemm_quant)
        spec = replica_spec(planner.target, planner.system, tp, gemm_quant)
        base_cost = step_cost(target, isl, osl)
        for concurrency in concurrencies:
            out, keep = closed_loop(base_cost, spec, concurrency, isl, osl)
            base = _row(out, keep, tp)
            rows.append({"tp": tp, "concurrency": concurrency, "draft": AR, "k": 0, "acceptance": "", **base,
                         "tpot_speedup": 1.0})
            for acceptance in accepted:
                drafter = next((d for d in drafters if d.name == acceptance.draft), None)
                if drafter is None or drafter.kind == "mtp":
                    continue
                size = tp if draft_tp is None else draft_tp
                draft = planner.forward(drafter.config, size, name=drafter.label) if drafter.config else None
                cost = step_cost(target, isl, osl, draft)
                with_draft = replica_spec(planner.target, planner.system, tp, gemm_quant, drafter.config, size) \
                    if drafter.config else spec
                for k in ks:
                    out, keep = closed_loop(cost, with_draft, concurrency, isl, osl,
                                            Speculation(k, acceptance.reach_at(k), seed=k))
                    row = _row(out, keep, tp)
                    rows.append({"tp": tp, "concurrency": concurrency, "draft": drafter.name, "k": k,
                                 "acceptance": acceptance.key, **row,
                                 "tpot_speedup": base["tpot_p50_ms"] / row["tpot_p50_ms"]})
    return pd.DataFrame(rows), left_out
