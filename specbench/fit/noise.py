"""How far one comparison can be trusted: each speed-up's interval by how its repeats were paired,
and, for a speed-up without one, the run's measured noise band.

Pairing (the `pairing` column of a speculative cell):
- `turns` (native engine): a group's cells take turns repeat by repeat, so repeat i of a draft and
  of its baseline ran side by side; Student's t on the log of the paired ratios.
- `side-by-side` (served, both servers up): each repeat of the speculative server alternates with
  one of the baseline server (baseline_tokens_per_s_runs); paired as above.
- `bracketed` (served, one server at a time): the baseline measured before and after the
  speculative server; two-sample t on the logs, unpaired, so the drift between the brackets widens it.
- `sequential` (served runs before pairing existed): every baseline repeat ran before every
  speculative one; the repeats carry no interval, and the speed-up is judged as one comparison.

A comparison without an interval is decided only outside the run's noise band: z × sqrt(drift² +
requests²) on the log scale, where drift is the root mean square of the log ratio of two timings of
the same work at different times (autoregressive baselines of one workload and batch size at other
temperatures, the native engine's repeats of a baseline, each native baseline's second half of
decode steps against its first, and a served baseline measured again beside a speculative server
against its own cell), and requests is the standard error of the per-request speed-ups
(TPOT, paired by request). Without a measured drift a single comparison is never decided.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from itertools import combinations

import numpy as np
import pandas as pd

from specbench.fit.cells import label_context, ok_closed_loop
from specbench.fit.evidence import CONFIDENCE, _logs, _t, speedup_interval
from specbench.fit.trust import _baseline_steps
from specbench.schema import AR, BRACKETED, SEQUENTIAL, SIDE_BY_SIDE, TURNS, runs_list

PAIRINGS = {
    TURNS: "repeats take turns (repeat i of a draft and of its baseline ran side by side)",
    SIDE_BY_SIDE: "both servers up, repeats alternating between them",
    BRACKETED: "the baseline measured before and after the speculative server (unpaired interval)",
    SEQUENTIAL: "every baseline repeat before every speculative one (no interval: one comparison)",
}


def pairing(row: dict) -> str:
    """How a speculative cell's repeats pair with its baseline's (older rows: by engine)."""
    value = row.get("pairing")
    if isinstance(value, str) and value in PAIRINGS:
        return value
    return SEQUENTIAL if row.get("engine") in ("vllm", "endpoint") else TURNS


def unpaired_interval(ours, theirs, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """Interval of mean(ours) / mean(theirs) on the log scale from two unpaired samples (pooled
    variance, so one side may have a single run); None without a spread to estimate."""
    a, b = _logs(ours), _logs(theirs)
    dof = len(a) + len(b) - 2
    if len(a) < 1 or len(b) < 1 or dof < 1:
        return None
    pooled = (((a - a.mean()) ** 2).sum() + ((b - b.mean()) ** 2).sum()) / dof
    half = _t(confidence, dof) * math.sqrt(pooled * (1 / len(a) + 1 / len(b)))
    centre = a.mean() - b.mean()
    return float(math.exp(centre - half)), float(math.exp(centre + half))


def cell_interval(row: dict, confidence: float = CONFIDENCE) -> tuple[float, float] | None:
    """A speculative cell's speed-up interval as its pairing allows; None: one comparison."""
    how = pairing(row)
    if how == SEQUENTIAL:
        return None
    if how == BRACKETED:
        return unpaired_interval(runs_list(row.get("tokens_per_s_runs")),
                                 runs_list(row.get("baseline_tokens_per_s_runs")), confidence)
    return speedup_interval(row.get("speedup_runs"), confidence)


def repeats_behind(row: dict) -> int:
    """How many repeats a cell's decision rests on: its paired ratios, the fewer side of a
    bracket, or 1 (one comparison) for sequential served repeats."""
    how = pairing(row)
    if how == SEQUENTIAL:
        return 1
    if how == BRACKETED:
        return min(len(runs_list(row.get("tokens_per_s_runs"))),
                   len(runs_list(row.get("baseline_tokens_per_s_runs")))) or 1
    return max(1, len(runs_list(row.get("speedup_runs"))))


# --- the noise band of one comparison ----------------------------------------------------------

def z_score(confidence: float = CONFIDENCE) -> float:
    from scipy.stats import norm

    return float(norm.ppf(0.5 + confidence / 2))


@dataclass
class RunNoise:
    """The run's measured noise, on the log scale of a speed-up."""

    drift: float | None  # RMS log ratio of two same-work cells measured apart; None: nothing measured it
    comparisons: int  # how many comparisons measured it
    sources: list[str] = field(default_factory=list)
    request_se: dict[str, float] = field(default_factory=dict)  # speculative cell_id -> SE over its requests
    confidence: float = CONFIDENCE

    def sigma(self, cell_id: str) -> float | None:
        if self.drift is None:
            return None
        return math.sqrt(self.drift ** 2 + self.request_se.get(cell_id, 0.0) ** 2)

    def band(self, cell_id: str) -> float | None:
        """Half-width of the band on the log scale (None: unmeasured)."""
        sigma = self.sigma(cell_id)
        return None if sigma is None else z_score(self.confidence) * sigma

    def interval(self, cell_id: str, point: float) -> tuple[float, float] | None:
        band = self.band(cell_id)
        if band is None or not (math.isfinite(point) and point > 0):
            return None
        return point * math.exp(-band), point * math.exp(band)

    def describe(self) -> str:
        if self.drift is None:
            return ("no measure of the drift between cells (no two baselines of the same work, no repeated "
                    "baseline): a single comparison decides nothing")
        return (f"one comparison's noise: ±{self.drift * 100:.1f} % (RMS log ratio of {self.comparisons} same-work "
                f"comparisons: {', '.join(self.sources)}), with each cell's request spread added")

    def to_dict(self) -> dict:
        return {"drift": self.drift, "comparisons": self.comparisons, "sources": self.sources,
                "confidence": self.confidence, "text": self.describe()}


MIN_STEPS_TO_SPLIT = 8


def baseline_half_drifts(cells: pd.DataFrame, steps: pd.DataFrame | None) -> list[float]:
    """Per measured autoregressive cell and repeat (native engine: its steps table), the log ratio
    of its mean decode step in the second half of its steps to the first: how far the machine's
    speed moved over one cell's time, the time that separates a group's cells."""
    if steps is None or steps.empty or cells.empty or not {"cell_id", "verify_s"} <= set(steps):
        return []
    ok = cells[(cells["status"] == "ok") & (cells["mode"] == AR)] if "status" in cells else cells[cells["mode"] == AR]
    mine = steps[steps["cell_id"].isin(set(ok["cell_id"]))]
    order = [c for c in ("batch_index", "step") if c in mine]
    drifts = []
    for _, rows in mine.groupby(["cell_id", "repeat"] if "repeat" in mine else ["cell_id"]):
        rows = rows.sort_values(order) if order else rows
        times = (rows["verify_s"] + (rows["overhead_s"].fillna(0.0) if "overhead_s" in rows else 0.0)).to_numpy(float)
        times = times[np.isfinite(times) & (times > 0)]
        if len(times) >= MIN_STEPS_TO_SPLIT:
            half = len(times) // 2
            drifts.append(math.log(times[half:].mean() / times[:half].mean()))
    return drifts


def run_noise(cells: pd.DataFrame, requests: pd.DataFrame | None = None, steps: pd.DataFrame | None = None,
              confidence: float = CONFIDENCE) -> RunNoise:
    """The noise band's parts, measured on the run itself."""
    squares, sources = [], []
    halves = baseline_half_drifts(cells, steps)
    squares.extend(d * d for d in halves)
    if halves:
        sources.append(f"{len(halves)} baseline(s) split in halves")
    baselines = _baseline_steps(cells)
    pairs = 0
    if not baselines.empty:
        for _, group in baselines.dropna(subset=["step_s"]).groupby(["workload", "batch_size"]):
            steps = group["step_s"].tolist()
            for a, b in combinations(steps, 2):
                if a > 0 and b > 0:
                    squares.append(math.log(a / b) ** 2)
                    pairs += 1
    if pairs:
        sources.append(f"{pairs} pair(s) of baselines of one workload and batch size")
    repeated = 0
    ok = ok_closed_loop(cells) if not cells.empty else cells
    if not ok.empty and "tokens_per_s_runs" in ok:
        native = ok[(ok["mode"] == AR) & (ok["engine"].fillna("native") == "native")] if "engine" in ok \
            else ok[ok["mode"] == AR]
        for runs in native["tokens_per_s_runs"]:
            logs = _logs(runs)
            if len(logs) >= 2:  # the variance of a difference of two repeats, weighted by its dof
                squares.extend([2 * logs.var(ddof=1)] * (len(logs) - 1))
                repeated += len(logs) - 1
    if repeated:
        sources.append(f"{repeated} degree(s) of freedom from repeated baselines")
    companions = 0
    if not ok.empty and "baseline_tokens_per_s_runs" in ok:  # served, side by side: the baseline measured twice
        baselines = dict(zip(ok[ok["mode"] == AR]["cell_id"], ok[ok["mode"] == AR]["tokens_per_s"]))
        rows = {row["cell_id"]: row for row in ok.to_dict("records")}
        for cell_id, base in baseline_of(ok).items():
            row = rows[cell_id]
            beside = _logs(row.get("baseline_tokens_per_s_runs"))
            alone = baselines.get(base)
            if pairing(row) == SIDE_BY_SIDE and len(beside) and alone and alone > 0:
                squares.append((float(np.median(beside)) - math.log(alone)) ** 2)
                companions += 1
    if companions:
        sources.append(f"{companions} baseline(s) measured again beside a speculative server")
    drift = math.sqrt(sum(squares) / len(squares)) if squares else None
    return RunNoise(drift, pairs + repeated + len(halves) + companions, sources, request_spread(cells, requests),
                    confidence)


def baseline_of(cells: pd.DataFrame) -> dict[str, str]:
    """Speculative cell_id -> its group's autoregressive cell_id (same traffic, load, temperature)."""
    if cells.empty or "cell_id" not in cells:
        return {}
    labelled = label_context(cells)
    keys = [k for k in ("workload", "batch_size", "request_rate", "temperature") if k in labelled]
    bases = {tuple(row[k] for k in keys): row["cell_id"] for row in labelled[labelled["mode"] == AR].to_dict("records")}
    return {row["cell_id"]: bases[tuple(row[k] for k in keys)] for row in labelled[labelled["mode"] != AR].to_dict("records")
            if tuple(row[k] for k in keys) in bases}


def request_spread(cells: pd.DataFrame, requests: pd.DataFrame | None) -> dict[str, float]:
    """Speculative cell_id -> standard error of the mean log per-request speed-up (baseline TPOT
    over speculative TPOT, paired by repeat and request)."""
    if requests is None or requests.empty or not {"cell_id", "request_id", "tpot_s"} <= set(requests):
        return {}
    keys = ["repeat", "request_id"] if "repeat" in requests else ["request_id"]
    by_cell = {cell: rows.groupby(keys)["tpot_s"].mean() for cell, rows in requests.groupby("cell_id")}
    spread = {}
    for cell, base in baseline_of(cells).items():
        if cell not in by_cell or base not in by_cell:
            continue
        ours, theirs = by_cell[cell].align(by_cell[base], join="inner")
        ratios = np.log(theirs.to_numpy(float) / ours.to_numpy(float))
        ratios = ratios[np.isfinite(ratios)]
        if len(ratios) >= 2:
            spread[cell] = float(ratios.std(ddof=1) / math.sqrt(len(ratios)))
    return spread
