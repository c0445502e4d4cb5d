"""A run measured on several machines (--executor ray): each speed-up is paired on one node, and
these checks say what the nodes' baselines tell about each other.

- Every baseline measured on more than one node (its copies, results.COPIES) is a calibration of
  the nodes: its spread across them is reported, and a difference beyond the measurement's noise
  is a warning naming the nodes.
- Cells measured on different kinds of GPU (or CPU) are not one population: check and report take
  no speed-up across two of them (`hardware_kinds`)."""

from __future__ import annotations

import pandas as pd

from specbench.fit.noise import CONFIDENCE, unpaired_interval
from specbench.schema import runs_list

# without repeats on both sides, two nodes' baselines are judged against this spread (the drift
# warning's tolerance, fit.trust.baseline_drift)
SINGLE_RUN_TOLERANCE = 1.3


def _node_name(row) -> str:
    node = str(row.get("node_id") or "")
    return f"{row.get('host') or '?'} ({node[:8]})" if node and node != "local" else str(row.get("host") or "local")


def baseline_measurements(cells: pd.DataFrame, copies: pd.DataFrame | None) -> pd.DataFrame:
    """Every measurement of the baselines measured on more than one node: the cells table's and
    their copies, one row each with its node."""
    if copies is None or copies.empty or cells.empty or "node_id" not in copies:
        return pd.DataFrame()
    ok = copies[copies["status"] == "ok"] if "status" in copies else copies
    first = cells[cells["cell_id"].isin(ok["cell_id"]) & (cells["status"] == "ok")]
    return pd.concat([first, ok], ignore_index=True)


def node_spread(cells: pd.DataFrame, copies: pd.DataFrame | None) -> dict | None:
    """The nodes' calibration: how many baselines were measured on several nodes and their largest
    fast/slow ratio of tokens/s. None for a run on one node."""
    measured = baseline_measurements(cells, copies)
    if measured.empty:
        return None
    ratios = [float(group["tokens_per_s"].max() / group["tokens_per_s"].min())
              for _, group in measured.groupby("cell_id") if len(group) > 1 and group["tokens_per_s"].min() > 0]
    if not ratios:
        return None
    return {"baselines": len(ratios), "nodes": int(measured["node_id"].nunique()), "largest_ratio": max(ratios),
            "median_ratio": float(pd.Series(ratios).median())}


def node_disagreements(cells: pd.DataFrame, copies: pd.DataFrame | None,
                       confidence: float = CONFIDENCE) -> list[str]:
    """One line per baseline whose nodes disagree beyond its noise: the interval of the two nodes'
    ratio (from their repeats) excludes 1, or, with one repeat a side, the ratio exceeds
    SINGLE_RUN_TOLERANCE."""
    measured = baseline_measurements(cells, copies)
    found = []
    for cell_id, group in measured.groupby("cell_id", sort=False) if not measured.empty else []:
        rows = group.to_dict("records")
        fast = max(rows, key=lambda r: r["tokens_per_s"])
        slow = min(rows, key=lambda r: r["tokens_per_s"])
        if fast is slow or not slow["tokens_per_s"] > 0:
            continue
        ratio = fast["tokens_per_s"] / slow["tokens_per_s"]
        fast_runs, slow_runs = runs_list(fast.get("tokens_per_s_runs")), runs_list(slow.get("tokens_per_s_runs"))
        interval = unpaired_interval(fast_runs, slow_runs, confidence)
        if interval is not None and min(len(fast_runs), len(slow_runs)) >= 2:
            beyond, why = interval[0] > 1, f"{confidence:.0%} interval {interval[0]:.2f}–{interval[1]:.2f}×"
        else:
            beyond, why = ratio > SINGLE_RUN_TOLERANCE, f"one repeat a side: over {SINGLE_RUN_TOLERANCE:g}×"
        if beyond:
            found.append(f"baseline {cell_id} ran {ratio:.2f}× faster on {_node_name(fast)} than on "
                         f"{_node_name(slow)} ({why}): the nodes differ beyond noise; each speed-up is paired on "
                         f"its own node, but their speed-ups are not interchangeable")
    return found


def hardware_kinds(cells: pd.DataFrame) -> list[str]:
    """The kinds of hardware (GPU models, or the CPU) the run's measured cells ran on."""
    if cells.empty or "gpu_model" not in cells:
        return []
    ok = cells[cells["status"] == "ok"] if "status" in cells else cells
    return sorted({str(kind) for kind in ok["gpu_model"].dropna() if str(kind)})


def node_warnings(cells: pd.DataFrame, copies: pd.DataFrame | None) -> list[str]:
    """The warnings of a run measured on several nodes (none for one node)."""
    warnings = node_disagreements(cells, copies)
    kinds = hardware_kinds(cells)
    if len(kinds) > 1:
        warnings.append(f"cells ran on {len(kinds)} kinds of hardware ({'; '.join(kinds)}): each speed-up is paired "
                        f"on its own node, and no verdict or chart takes one across two kinds (--hardware picks one)")
    return warnings


def spread_text(spread: dict | None) -> str:
    if not spread:
        return ""
    return (f"{spread['baselines']} baseline(s) measured again by another pairing group, on {spread['nodes']} "
            f"node(s): the measurements agree within {(spread['largest_ratio'] - 1) * 100:.0f} % (median "
            f"{(spread['median_ratio'] - 1) * 100:.0f} %)")

