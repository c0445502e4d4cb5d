"""How far a run's timings can be trusted: drift between baselines, a busy machine, repeat ranges,
and how fast the autoregressive baseline is (against the roofline and another engine)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench.fit.cells import closed_loop, label_context, ok_closed_loop, ok_real
from specbench.schema import AR, SEND_LAG_GOAL_S
from specbench.workloads import LENGTH_TOLERANCE


def repeat_range(runs) -> tuple[float, float] | None:
    """(min, max) of a cell's repeat-by-repeat speed-ups (`speedup_runs`); None with fewer than
    two finite ones."""
    values = [float(x) for x in runs if np.isfinite(x)] if isinstance(runs, (list, tuple, np.ndarray)) else []
    return (min(values), max(values)) if len(values) > 1 else None


def baseline_drift(cells: pd.DataFrame, tolerance: float = 1.3) -> list[str]:
    """Autoregressive baselines that do the same work per decode step (same workload and batch
    size, so the same prompts; only the temperature differs) but whose measured step times differ
    by more than `tolerance`: the machine's speed changed during the sweep. Each speed-up pairs
    a cell with its own group's baseline, so drift *between* groups cancels, but the same drift
    *inside* a group (cells run one after another unless --repeats interleaves them) does not."""
    return [message for _, _, message in drifted_groups(cells, tolerance)]


def _baseline_steps(cells: pd.DataFrame) -> pd.DataFrame:
    """Measured autoregressive cells with `step_s`, their decode step time (each context length
    its own workload: a longer context is other work, not drift)."""
    ok = label_context(ok_closed_loop(cells))
    if ok.empty or not ({"step_verify_s", "tpot_p50_s"} & set(ok.columns)):
        return pd.DataFrame()
    baselines = ok[ok["mode"] == AR].copy()
    if "estimated" in baselines:
        baselines = baselines[~baselines["estimated"].fillna(False).astype(bool)]
    # A decode step: the native engine's measured step, else (a served engine) the median TPOT.
    native = baselines["step_verify_s"] + baselines["step_overhead_s"].fillna(0.0) \
        if "step_verify_s" in baselines else pd.Series(float("nan"), index=baselines.index)
    served = baselines["tpot_p50_s"] if "tpot_p50_s" in baselines else native
    baselines["step_s"] = native.fillna(served)
    return baselines


def drifted_groups(cells: pd.DataFrame, tolerance: float = 1.3) -> list[tuple[str, int, str]]:
    """(workload, batch size, message) of each group whose baselines drifted apart."""
    baselines = _baseline_steps(cells)
    found = []
    if baselines.empty:
        return found
    for (workload, batch_size), group in baselines.groupby(["workload", "batch_size"]):
        group = group.dropna(subset=["step_s"])
        if len(group) < 2:
            continue
        fast, slow = group.loc[group["step_s"].idxmin()], group.loc[group["step_s"].idxmax()]
        if slow["step_s"] > tolerance * fast["step_s"]:
            found.append((workload, int(batch_size),
                f"{workload} B={batch_size}: the same autoregressive decode step took {fast['step_s'] * 1e3:.1f} ms "
                f"at T={fast['temperature']:g} and {slow['step_s'] * 1e3:.1f} ms at T={slow['temperature']:g} "
                f"({slow['step_s'] / fast['step_s']:.2f}×): the machine's speed drifted during the sweep"))
    return found


DRIFT_ADVICE = ("speed-ups inside such a group are skewed by the drift; --repeats 3 or more interleaves a group's "
                "cells and takes medians")


BUSY_LOAD = 1.5  # load average per core above which a CPU machine was busy with other work (older runs)
BUSY_OTHER_SHARE = 0.25  # ... or the share of its cores other processes kept busy (at least half a core)


def other_load(cells: pd.DataFrame) -> pd.Series:
    """The load average each cell saw less what specbench's own processes (itself, the servers it
    started and their workers) used while it measured (`own_cpu_cores`; older runs: the whole load)."""
    own = cells["own_cpu_cores"].fillna(0.0) if "own_cpu_cores" in cells else 0.0
    return cells["load_average"] - own


def _busy_cells(cells: pd.DataFrame, cores: int) -> pd.DataFrame:
    """Cells of a CPU run measured while other work kept the machine busy: other processes' CPU
    (`other_cpu_cores`) above BUSY_OTHER_SHARE of the cores; runs before that column was
    recorded, the load average less specbench's own CPU above BUSY_LOAD per core."""
    if cells.empty or "load_average" not in cells or "device" not in cells or not (cells["device"] == "cpu").any():
        return cells.iloc[0:0]
    by_load = other_load(cells) > BUSY_LOAD * cores
    if "other_cpu_cores" not in cells:
        return cells[by_load]
    measured = cells["other_cpu_cores"]
    return cells[measured.gt(max(0.5, BUSY_OTHER_SHARE * cores)) | (measured.isna() & by_load)]


def busy_machine(cells: pd.DataFrame, cores: int | None = None) -> str | None:
    """A warning when CPU cells ran while other work kept the machine busy (specbench's own
    processes left out; an endpoint's server is not specbench's)."""
    import os

    cores = cores or os.cpu_count() or 1
    busy = _busy_cells(cells, cores)
    if not len(busy):
        return None
    endpoint = ("; an --endpoint server running on this machine counts as other work: specbench sees only its own "
                "processes (the client), not the endpoint's") \
        if "engine" in busy and (busy["engine"] == "endpoint").any() else ""
    ids = list(busy["cell_id"]) if "cell_id" in busy else []
    which = f" ({', '.join(ids[:4])}{', …' if len(ids) > 4 else ''})" if ids else ""
    if "other_cpu_cores" in busy and busy["other_cpu_cores"].notna().all():
        return (f"the machine was busy (other processes kept {busy['other_cpu_cores'].median():.1f} of its {cores} "
                f"cores busy, median) during {len(busy)} cell(s){which}; their timings include the other work"
                f"{endpoint}")
    mine = " less specbench's own processes" if "own_cpu_cores" in busy and busy["own_cpu_cores"].notna().any() else ""
    return (f"the machine was busy (load average{mine} above {BUSY_LOAD * cores:g} on {cores} cores) during "
            f"{len(busy)} cell(s){which}; their timings include the other work{endpoint}")




def late_sends(cells: pd.DataFrame, goal_s: float = SEND_LAG_GOAL_S) -> str | None:
    """A warning when a trace replay's client sent requests later than `goal_s` at p99: the server
    then saw other arrivals than the trace's. It says whose delay it was: the machine's, when a
    probe process beside the client (measure.WakeProbe) stalled too while each late request was
    due (a virtual machine's host or other work pausing every process), else the client's (short
    of CPU, by a busy machine or by the server itself when both share a small one)."""
    if cells.empty or "send_lag_p99_s" not in cells:
        return None
    late = cells[(cells["status"] == "ok") & (cells["send_lag_p99_s"] > goal_s)]
    if late.empty:
        return None
    head = (f"the client sent requests late in {len(late)} of {int(cells['send_lag_p99_s'].notna().sum())} trace "
            f"cell(s): send lag p99 up to {late['send_lag_p99_s'].max() * 1e3:.1f} ms (goal {goal_s * 1e3:g} ms), so the "
            f"server saw arrivals later than the trace's")
    if "late_sends_machine" not in late or late["late_sends"].isna().any():
        return head + "; the client was short of CPU"
    count, machine = int(late["late_sends"].sum()), int(late["late_sends_machine"].sum())
    stall = late["machine_stall_max_s"].max() * 1e3
    if count and machine == count:
        return (head + f"; the machine itself stalled each time (a probe process beside the client woke up to "
                f"{stall:.1f} ms late): every process paused, the client with it, as on a virtual machine whose host "
                f"takes its cores away; a quieter or bare-metal machine keeps the trace's times")
    return (head + f"; the client was short of CPU ({machine} of {count} late request(s) coincided with a stall of the "
            f"machine itself)")


def trace_lengths(cells: pd.DataFrame) -> str | None:
    """A warning when a trace replay's requests did not have the trace's lengths: outputs of another
    length (a server that ignores `min_tokens` or `ignore_eos`), or prompts further than
    LENGTH_TOLERANCE (or 8 tokens) from the trace's input lengths. Their latencies are then of other
    work."""
    if cells.empty or "trace_output_mismatches" not in cells:
        return None
    ok = cells[cells["status"] == "ok"]
    outputs = int(ok["trace_output_mismatches"].fillna(0).sum())
    prompts = int(ok["trace_prompt_misses"].fillna(0).sum()) if "trace_prompt_misses" in ok else 0
    found = []
    if outputs:
        found.append(f"{outputs} request(s) ended at another output length than the trace's (does the server honour "
                     f"min_tokens and ignore_eos?)")
    if prompts:
        found.append(f"{prompts} prompt(s) further from the trace's input length than {LENGTH_TOLERANCE * 100:g} % "
                     f"or 8 tokens")
    return ("the replay did not keep the trace's lengths: " + "; ".join(found) +
            ": those requests' latencies are of other work") if found else None


# --- how fast the baseline is ------------------------------------------------------------------

SLOW_BASELINE = 0.8  # a baseline below this share of the deployed engine's tokens/s flatters speculation
BASELINE_KEYS = ["workload", "batch_size", "temperature"]


def _baselines(cells: pd.DataFrame) -> pd.DataFrame:
    """Finished, real (not synthetic) closed-loop autoregressive cells."""
    if cells.empty or "mode" not in cells:
        return cells.iloc[0:0]
    ok = closed_loop(ok_real(cells))
    return ok[ok["mode"] == AR]


def baseline_speed(cells: pd.DataFrame, reference: pd.DataFrame | None = None) -> pd.DataFrame:
    """Each closed-loop autoregressive cell's tokens/s with what says whether it is fast: its
    decode step against the memory-bandwidth roofline (native runs record it) and, given the cells
    of a reference run on another engine (vLLM, say), that engine's baseline at the same workload,
    batch size and temperature (`of_reference` = ours / theirs)."""
    base = _baselines(cells)
    if base.empty:
        return pd.DataFrame()
    columns = BASELINE_KEYS + ["tokens_per_s"] + [c for c in ("roofline_fraction",) if c in base]
    table = base[columns].copy()
    if reference is not None:
        theirs = _baselines(reference)[BASELINE_KEYS + ["tokens_per_s"]].rename(
            columns={"tokens_per_s": "reference_tokens_per_s"})
        table = table.merge(theirs, on=BASELINE_KEYS, how="left")
        table["of_reference"] = table["tokens_per_s"] / table["reference_tokens_per_s"]
    return table.sort_values(["workload", "temperature", "batch_size"]).reset_index(drop=True)


def _span(values: pd.Series, fmt: str) -> str:
    low, high = values.min(), values.max()
    return format(low, fmt) if format(low, fmt) == format(high, fmt) else f"{format(low, fmt)}–{format(high, fmt)}"


def baseline_note(table: pd.DataFrame, reference_engine: str = "") -> str:
    """One sentence on the baseline's speed, against the roofline and the reference engine."""
    if table.empty:
        return ""
    parts = []
    if "roofline_fraction" in table and table["roofline_fraction"].notna().any():
        known = table[table["roofline_fraction"].notna()]
        parts.append(f"its decode steps reached {_span(known['roofline_fraction'] * 100, '.0f')}% of the "
                     f"memory-bandwidth roofline (B = {_span(known['batch_size'], 'd')})")
    if "of_reference" in table and table["of_reference"].notna().any():
        known = table[table["of_reference"].notna()]
        parts.append(f"its tokens/s were {_span(known['of_reference'], '.2f')}× {reference_engine or 'the reference'}'s "
                     f"on the same cells (B = {_span(known['batch_size'], 'd')})")
    elif "of_reference" in table:
        parts.append(f"{reference_engine or 'the reference run'} has no autoregressive cell at the same workload, "
                     f"batch size and temperature to compare with")
    return ("The autoregressive baseline: " + "; ".join(parts) + ".") if parts else ""


def slow_baseline_warning(table: pd.DataFrame, reference_engine: str = "the reference engine") -> str | None:
    """A warning when the baseline runs below SLOW_BASELINE of the deployed engine's tokens/s."""
    if table.empty or "of_reference" not in table:
        return None
    slow = table[table["of_reference"] < SLOW_BASELINE]
    if slow.empty:
        return None
    cells = ", ".join(f"{row.workload} B={row.batch_size} T={row.temperature:g}: {row.of_reference:.2f}×"
                      for row in slow.itertuples(index=False))
    return (f"the autoregressive baseline is far slower than {reference_engine} ({cells} of its tokens/s; below "
            f"{SLOW_BASELINE:g}×): every speed-up here is measured against a slow baseline, which flatters "
            f"speculation; measure the rollout on the deployed engine (--engine vllm)")


def drifted_keys(cells: pd.DataFrame) -> set[tuple[str, int]]:
    """(workload, batch size) groups whose baselines drifted: charts mark them."""
    return {(workload, batch_size) for workload, batch_size, _ in drifted_groups(cells)}


def marked_cells(cells: pd.DataFrame) -> dict[str, str]:
    """cell_id -> why a measurement warning marks it: its group's baselines drifted apart, or it
    ran on a busy machine. Without repeats such a speed-up cannot decide a verdict."""
    import os

    if cells.empty or "cell_id" not in cells:
        return {}
    labelled = label_context(cells)
    marks = {}
    drifted = drifted_keys(cells)
    for row in labelled.itertuples():
        if (row.workload, getattr(row, "batch_size", None)) in drifted:
            marks[row.cell_id] = f"{row.workload} B={int(row.batch_size)}: its baselines drifted apart"
    for cell_id in _busy_cells(cells, os.cpu_count() or 1)["cell_id"]:
        marks.setdefault(cell_id, "it ran on a busy machine")
    return marks
