"""What a verdict's evidence is worth: confidence intervals of speed-ups from repeats and of SLO
percentiles over requests, and whether the run that holds them finished.

A speed-up's repeats are paired (a group's cells take turns, so repeat i of a draft and of its
baseline ran side by side); the interval is Student's t on the log of the paired ratios. A
percentile's interval comes from the order statistics of the cell's requests. Either decides a
bar only when it lies wholly on one side of it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from specbench.fit.cells import label_cells
from specbench.grid import SweepConfig, plan_cells
from specbench.schema import grid_columns
from specbench.traces import ReplayRecord

CONFIDENCE = 0.95
MAX_REPEATS_SUGGESTED = 100

PASS, FAIL, INCONCLUSIVE = "pass", "fail", "inconclusive"


def _logs(runs) -> np.ndarray:
    values = np.asarray([float(x) for x in runs] if isinstance(runs, (list, tuple, np.ndarray)) else [], dtype=float)
    values = values[np.isfinite(values) & (values > 0)]
    return np.log(values)


def _t(confidence: float, dof: int) -> float:
    from scipy.stats import t

    return float(t.ppf(0.5 + confidence / 2, dof))


def speedup_interval(runs, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """The confidence interval of a cell's speed-up from its repeat-by-repeat ratios
    (`speedup_runs`); None with fewer than two."""
    logs = _logs(runs)
    if len(logs) < 2:
        return None
    half = _t(confidence, len(logs) - 1) * logs.std(ddof=1) / math.sqrt(len(logs))
    return float(np.exp(logs.mean() - half)), float(np.exp(logs.mean() + half))


def repeats_to_decide(runs, bar: float, confidence: float = CONFIDENCE) -> int | None:
    """How many repeats in all would put the interval on one side of `bar`, if the mean and the
    spread of the repeats so far held; None when none would (the mean sits on the bar) or more
    than MAX_REPEATS_SUGGESTED."""
    logs = _logs(runs)
    if len(logs) < 2:
        return None
    gap, spread = abs(logs.mean() - math.log(bar)), logs.std(ddof=1)
    if gap == 0:
        return None
    for n in range(len(logs), MAX_REPEATS_SUGGESTED + 1):
        if _t(confidence, n - 1) * spread / math.sqrt(n) < gap:
            return n
    return None


@dataclass
class Judgement:
    decision: str  # pass / fail / inconclusive
    reason: str  # why, in a few words (printed after the point)


def cannot_reach(bound: float | None, bar: float, drafted: float) -> bool:
    """Acceptance alone rules the bar out: the bound is below it, or on it while the drafts cost
    something (nothing accepted, yet drafts were verified: strictly slower than the bound)."""
    if bound is None:
        return False
    return bound < bar or (bound <= bar and drafted > 0)


def lies_above(bound: float | None, interval: tuple[float, float] | None = None,
               band: tuple[float, float] | None = None) -> bool:
    """Whether a speed-up's evidence lies above what acceptance allows: its interval (repeats), or
    for one comparison the run's noise band around it, wholly above `bound`. A point over the bound
    with neither is not called above it (the gate decides nothing on it anyway: no measure of noise).
    The gate (`judge`) and the warning (fit.physics.bound_warning) both ask this, so they never
    disagree."""
    if bound is None or not math.isfinite(bound):
        return False
    evidence = interval if interval is not None else band
    return evidence is not None and math.isfinite(evidence[0]) and evidence[0] > bound


def judge(point: float, interval: tuple[float, float] | None, bar: float, marked: bool = False,
          bound: float | None = None, tokens_per_forward: float | None = None, drafted: float = 0.0,
          band: tuple[float, float] | None = None, band_note: str = "") -> Judgement:
    """pass / fail / inconclusive for one speed-up, and why (fit.physics for the bounds).

    - Acceptance alone: when the tokens per target forward (counted, not timed) are below the bar,
      or on it with drafts verified, the point fails whatever was timed.
    - Evidence lying wholly above `bound` (tokens per forward × the step's non-draft share; the
      interval, or one comparison's noise band: `lies_above`, the rule the warning uses)
      is not explained by acceptance and decides nothing.
    - With repeats the interval (as its pairing allows, fit.noise.cell_interval) decides.
    - One comparison: `band`, the run's noise band around the point, decides; without one, or
      when a measurement warning marks the cell, it is inconclusive."""
    if cannot_reach(tokens_per_forward, bar, drafted):
        return Judgement(FAIL, f"acceptance allows at most {tokens_per_forward:.3f}× ({tokens_per_forward:.3f} "
                               f"tokens per target forward)")
    if interval is not None:
        low, high = interval
        if lies_above(bound, interval):
            return Judgement(INCONCLUSIVE, f"its interval lies above what acceptance allows ({bound:.3f}×): "
                                           f"not explained by acceptance: noise")
        decision = PASS if low >= bar else FAIL if high < bar else INCONCLUSIVE
        return Judgement(decision, "interval straddles the bar" if decision == INCONCLUSIVE else "interval")
    if not math.isfinite(point):
        return Judgement(INCONCLUSIVE, "no speed-up")
    if marked:
        return Judgement(INCONCLUSIVE, "a measurement warning marks it")
    if band is None:
        return Judgement(INCONCLUSIVE, band_note or "one comparison, and no measure of the run's noise")
    low, high = band
    if high < bar:
        return Judgement(FAIL, f"its noise band {low:.3f}×–{high:.3f}× lies below the bar")
    if lies_above(bound, band=band):
        return Judgement(INCONCLUSIVE, f"its noise band {low:.3f}×–{high:.3f}× lies above what acceptance allows "
                                       f"({bound:.3f}×): not explained by acceptance: noise")
    if low >= bar:
        return Judgement(PASS, f"its noise band {low:.3f}×–{high:.3f}× clears the bar")
    return Judgement(INCONCLUSIVE, f"within noise ({low:.3f}×–{high:.3f}×)")


def combine_any(decisions: list[str]) -> str:
    """Several K at one point: it passes when one K passes, fails when every K fails."""
    return PASS if PASS in decisions else FAIL if decisions and all(d == FAIL for d in decisions) else INCONCLUSIVE


def combine_all(decisions: list[str]) -> str:
    """Several points that must all pass (workloads, temperatures, batch sizes)."""
    return FAIL if FAIL in decisions else PASS if decisions and all(d == PASS for d in decisions) else INCONCLUSIVE


# --- percentiles over requests -----------------------------------------------------------------

def percentile_interval(values, percentile: float, confidence: float = CONFIDENCE) -> tuple[float, float]:
    """A distribution-free confidence interval of the `percentile` of the population `values` were
    drawn from: order statistics whose ranks the binomial distribution bounds. Too few values to
    bound it from above (fewer than requests_to_bound) leave the upper end infinite; a plain
    bootstrap would instead never look past the largest value seen, which is what p99 of a few
    dozen requests is."""
    from scipy.stats import binom

    ordered = np.sort(np.asarray(values, dtype=float))
    n, p, tail = len(ordered), percentile / 100, (1 - confidence) / 2
    if n == 0:
        return float("nan"), float("nan")
    ranks = np.arange(1, n + 1)
    below = binom.sf(ranks - 1, n, p)  # P(the l-th smallest is at most the percentile) = P(Bin(n, p) >= l)
    above = binom.cdf(ranks - 1, n, p)  # P(the u-th smallest is at least it) = P(Bin(n, p) <= u - 1)
    lower_ranks, upper_ranks = ranks[below >= 1 - tail], ranks[above >= 1 - tail]
    low = float(ordered[lower_ranks[-1] - 1]) if len(lower_ranks) else -math.inf
    high = float(ordered[upper_ranks[0] - 1]) if len(upper_ranks) else math.inf
    return low, high


def requests_to_bound(percentile: float, confidence: float = CONFIDENCE) -> int:
    """The fewest requests whose largest value bounds the percentile from above at `confidence`:
    p99 368, p95 72, p90 36, p50 6."""
    return math.ceil(math.log((1 - confidence) / 2) / math.log(percentile / 100))


# --- is the run complete? ----------------------------------------------------------------------

@dataclass
class Completeness:
    status: str  # run.json's status: complete, interrupted, failed, running (or killed while running)
    planned: int
    finished: int  # cells with a row, measured or not
    # planned cells without a row, labelled as cells are (fit.label_cells); empty when the plan is unknown
    missing: pd.DataFrame = field(default_factory=pd.DataFrame)

    @property
    def stopped(self) -> bool:
        """The sweep did not run to its end: nothing it measured can carry a verdict alone."""
        return self.status != "complete"

    def describe(self) -> str:
        """One sentence on a sweep that did not run to its end; empty when it did."""
        if not self.stopped:
            return ""
        state = {"running": "still running, or was killed before it could record that it stopped"}.get(
            self.status, self.status)
        return f"the sweep is {state}: {self.finished} of {self.planned} planned cells finished"

    def missing_in(self, drafts: list[str], batch_sizes: list[int] | None, workloads: list[str] | None = None,
                   temperatures: list[float] | None = None) -> list[str]:
        """Ids of planned cells without a row among those a verdict judges (`batch_sizes` None:
        at every load)."""
        gone = self.missing
        if gone.empty:
            return []
        gone = gone[gone["draft"].isin(drafts)]
        if batch_sizes is not None:
            gone = gone[gone["batch_size"].isin(batch_sizes)]
        if workloads:
            gone = gone[gone["workload"].isin(workloads)]
        if temperatures is not None:
            gone = gone[gone["temperature"].isin(temperatures)]
        return gone["cell_id"].tolist()

    def at_context(self, length: int) -> "Completeness":
        gone = self.missing
        return Completeness(self.status, self.planned, self.finished,
                            gone[gone["context_length"] == length] if not gone.empty else gone)


def completeness(meta: dict, cells: pd.DataFrame) -> Completeness:
    """Whether a run finished, from its run.json (status, plan) and its cells."""
    present = set(cells["cell_id"]) if not cells.empty and "cell_id" in cells else set()
    planned = _planned_cells(meta)
    missing = pd.DataFrame()
    if planned is not None:
        gone = [{**grid_columns(c, "not measured"), "synthetic_alpha": c.alpha} for c in planned if c.id not in present]
        missing = label_cells(pd.DataFrame(gone)) if gone else missing
    count = len(planned) if planned is not None else int((meta.get("plan") or {}).get("cells") or len(cells))
    return Completeness(str(meta.get("status") or "unknown"), count, len(cells), missing)


def _planned_cells(meta: dict):
    """The run's planned cells, rebuilt from its recorded config; None when it cannot be."""
    recorded = meta.get("config")
    if not recorded:
        return None
    try:
        config = SweepConfig.from_dict(recorded)
        # a trace run's cells from the replay run.json kept, not the trace read again
        replay = ReplayRecord.from_dict(meta["trace"]) if config.load.trace else None
        return plan_cells(config, replay)
    except Exception:  # a run.json from an older version, or edited by hand
        return None
