"""A trace replay judged as a rollout answer: per speculative configuration, its latency
percentiles against the baseline's on the same requests, its TPOT and E2E speed-ups with 95 %
intervals over the requests (each request is a pair: the baseline and speculation replayed it at
the same trace time), and the batch sizes the server ran at."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from specbench.fit.evidence import _logs, speedup_interval
from specbench.schema import AR, LARGE_BATCH, SEND_LAG_GOAL_S, stalled_by_machine


def paired_speedup(base: pd.DataFrame, spec: pd.DataFrame, column: str) -> tuple[float, float, float]:
    """Geometric mean of baseline / speculative `column` over requests replayed by both (same
    request and repeat), with its 95 % t-interval on the log scale (> 1: speculation lowered it).
    An interval that holds 1 means the replay did not decide which way speculation moved it."""
    joined = base[["request_id", "repeat", column]].merge(spec[["request_id", "repeat", column]],
                                                          on=["request_id", "repeat"], suffixes=("_base", "_spec"))
    ratios = (joined[f"{column}_base"] / joined[f"{column}_spec"]).to_numpy(dtype=float)
    logs = _logs(ratios)
    if len(logs) == 0:
        return math.nan, math.nan, math.nan
    interval = speedup_interval(ratios) or (math.nan, math.nan)
    return math.exp(float(logs.mean())), interval[0], interval[1]


def replay_table(cells: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """One row per speculative cell of a trace run: its and its baseline's TPOT and E2E p50/p99,
    the paired TPOT and E2E speed-ups (> 1: speculation faster) with intervals, and the share of
    time the server ran at B >= 32 with and without speculation."""
    if cells.empty or "trace" not in cells or requests.empty:
        return pd.DataFrame()
    ok = cells[(cells["status"] == "ok") & cells["trace"].notna()]
    rows = []
    for row in ok[ok["mode"] != AR].to_dict("records"):
        baseline = ok[(ok["mode"] == AR) & (ok["workload"] == row["workload"]) &
                      (ok["temperature"] == row["temperature"])]
        if baseline.empty:
            continue
        base = baseline.iloc[0]
        mine = requests[requests["cell_id"] == row["cell_id"]]
        theirs = requests[requests["cell_id"] == base["cell_id"]]
        tpot = paired_speedup(theirs, mine, "tpot_s")
        e2e = paired_speedup(theirs, mine, "e2e_s")
        rows.append({
            "workload": row["workload"], "temperature": row["temperature"], "draft": row["draft"], "k": row["k"],
            "trace": row["trace"], "requests": int(row["requests"]),
            "tpot_p50_ms": row["tpot_p50_s"] * 1e3, "tpot_p50_ms_baseline": base["tpot_p50_s"] * 1e3,
            "tpot_p99_ms": row["tpot_p99_s"] * 1e3, "tpot_p99_ms_baseline": base["tpot_p99_s"] * 1e3,
            "e2e_p50_s": row["e2e_p50_s"], "e2e_p50_s_baseline": base["e2e_p50_s"],
            "e2e_p99_s": row["e2e_p99_s"], "e2e_p99_s_baseline": base["e2e_p99_s"],
            "tpot_speedup": tpot[0], "tpot_speedup_low": tpot[1], "tpot_speedup_high": tpot[2],
            "e2e_speedup": e2e[0], "e2e_speedup_low": e2e[1], "e2e_speedup_high": e2e[2],
            "alpha": row.get("alpha"),
            "share_b32": row.get("running_share_large"), "share_b32_baseline": base.get("running_share_large"),
            "running_max": row.get("running_max"), "running_max_baseline": base.get("running_max"),
            "send_lag_p99_ms": max(row.get("send_lag_p99_s", math.nan), base.get("send_lag_p99_s", math.nan)) * 1e3,
            "output_mismatches": int(row.get("trace_output_mismatches", 0) or 0)
            + int(base.get("trace_output_mismatches", 0) or 0),
            "prompt_error_max": max(row.get("trace_prompt_error_max", 0.0), base.get("trace_prompt_error_max", 0.0)),
        })
    return pd.DataFrame(rows)


def send_lag_summary(cells: pd.DataFrame, requests: pd.DataFrame) -> str:
    """How late the client sent a trace run's requests, over the whole run: p50 and p99 against
    the goal, and how many of those later than the goal the machine itself stalled for."""
    if cells.empty or "trace" not in cells or requests.empty or "send_lag_s" not in requests:
        return ""
    ok = cells[(cells["status"] == "ok") & cells["trace"].notna()]
    lags = requests[requests["cell_id"].isin(ok["cell_id"])]
    if lags.empty:
        return ""
    late = lags[lags["send_lag_s"] > SEND_LAG_GOAL_S]
    text = (f"send lag p50 {lags['send_lag_s'].median() * 1e3:.2f} ms, p99 "
            f"{np.percentile(lags['send_lag_s'], 99) * 1e3:.2f} ms over {len(lags)} requests "
            f"(goal p99 ≤ {SEND_LAG_GOAL_S * 1e3:g} ms)")
    if not late.empty:
        text += f", {len(late)} sent later than {SEND_LAG_GOAL_S * 1e3:g} ms"
        if "machine_stall_s" in late:
            machine = int(stalled_by_machine(late["machine_stall_s"], late["send_lag_s"]).sum())
            text += f" ({machine} during a stall of the machine itself)"
    return text


def _change(new: float, old: float) -> str:
    """"lowers … by 12 %" / "raises … by 5 %"."""
    if not (np.isfinite(new) and np.isfinite(old)) or old <= 0:
        return "leaves unmeasured"
    change = new / old - 1
    return f"{'lowers' if change < 0 else 'raises'} {{}} by {abs(change) * 100:.0f} %"


def replay_answer(table: pd.DataFrame, describe: str) -> str:
    """One sentence: the configuration with the best paired TPOT speed-up, its p50 and p99 TPOT
    against the baseline's, its E2E speed-up, and how often the server ran at B >= 32."""
    if table.empty:
        return ""
    row = table.sort_values("tpot_speedup", ascending=False).iloc[0]
    p50 = _change(row["tpot_p50_ms"], row["tpot_p50_ms_baseline"]).format("p50 TPOT")
    p99 = _change(row["tpot_p99_ms"], row["tpot_p99_ms_baseline"]).format("p99")
    interval = (f" (95 % interval {row['tpot_speedup_low']:.3g}–{row['tpot_speedup_high']:.3g}×)"
                if np.isfinite(row["tpot_speedup_low"]) else "")
    share = row["share_b32"]
    batch = (f"; the server ran at B ≥ {LARGE_BATCH} for {share * 100:.0f} % of the time with speculation and "
             f"{row['share_b32_baseline'] * 100:.0f} % without (at most B = {row['running_max']:.0f})"
             if np.isfinite(share) and np.isfinite(row["share_b32_baseline"]) else
             f"; the server's running batch was not sampled (B ≥ {LARGE_BATCH} unknown)")
    return (f"On {describe}, {row['draft']} K={int(row['k'])} {p50} and {p99} ({row['workload']}, "
            f"T={row['temperature']:g}, {int(row['requests'])} requests): per request TPOT "
            f"{_times(row['tpot_speedup'])}{interval}, end to end {_times(row['e2e_speedup'])}{batch}.")


def _times(speedup: float) -> str:
    """A speed-up in words that agree with its number: 1.2× faster, 0.78× (slower), 1.00× (no change)."""
    if not np.isfinite(speedup):
        return "not measured"
    if f"{speedup:.3g}" in ("1", "1.00"):
        return "1.00× (no change)"
    return f"{speedup:.3g}× faster" if speedup > 1 else f"{speedup:.3g}× (slower)"
