"""Acceptance: the i.i.d. α fit (MLE with a Wilson interval), τ(α, K), the per-row token moments
the slowest-row term needs, and the per-draft α table."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specbench.fit.cells import TRAFFIC, label_synthetic, ok_real, with_context
from specbench.schema import AR
from specbench.synthetic import parse_alpha

Z95 = 1.959964


@dataclass
class AlphaFit:
    alpha: float
    low: float
    high: float
    accepted: int
    rejections: int

    @property
    def trials(self) -> int:
        return self.accepted + self.rejections


def wilson_interval(successes: int, trials: int, z: float = Z95) -> tuple[float, float]:
    if trials == 0:
        return float("nan"), float("nan")
    p = successes / trials
    denominator = 1 + z * z / trials
    centre = (p + z * z / (2 * trials)) / denominator
    half = z * math.sqrt(p * (1 - p) / trials + z * z / (4 * trials * trials)) / denominator
    # The interval holds p (rounding can put p = 1 a hair above centre + half).
    return max(0.0, min(p, centre - half)), min(1.0, max(p, centre + half))


def fit_alpha(drafted: np.ndarray, accepted: np.ndarray) -> AlphaFit:
    """MLE of the i.i.d. acceptance probability from per-step (drafted, accepted) counts."""
    drafted, accepted = np.asarray(drafted), np.asarray(accepted)
    used = drafted > 0
    return alpha_from_counts(int(accepted[used].sum()), int((accepted[used] < drafted[used]).sum()))


def alpha_from_counts(successes: int, rejections: int) -> AlphaFit:
    """The i.i.d. MLE and its 95 % Wilson interval from pooled counts: each accepted draft token a
    success, each step that rejected one a failure (α̂ = accepted / (accepted + rejections)). The
    one estimator `fit_alpha` (per-step counts) and `alpha_table` (a run's pooled cells) share."""
    trials = successes + rejections
    low, high = wilson_interval(successes, trials)
    return AlphaFit(successes / trials if trials else float("nan"), low, high, successes, rejections)


def expected_tau(alpha: float, k: int | np.ndarray) -> float | np.ndarray:
    """E[tokens per target forward] with K drafts at i.i.d. acceptance alpha."""
    k = np.asarray(k, dtype=float)
    if alpha >= 1 - 1e-12:
        return k + 1
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def tokens_per_step_moments(alpha: float, k: int, coverage: float = 1.0) -> tuple[float, float]:
    """Mean and variance of tokens a row gains per step: 1 + accepted, where accepted is a
    geometric count truncated at K (P(a) = alpha^a (1 - alpha) for a < K, alpha^K at K); with
    probability 1 - coverage the row drafted nothing and gains exactly 1."""
    accepted = np.arange(k + 1)
    probs = alpha ** accepted * np.where(accepted < k, 1 - alpha, 1.0)
    mean = float((probs * (1 + accepted)).sum())
    second = float((probs * (1 + accepted) ** 2).sum())
    mixed_mean = coverage * mean + (1 - coverage)
    mixed_second = coverage * second + (1 - coverage)
    return mixed_mean, mixed_second - mixed_mean ** 2


def expected_max_normal(count: int) -> float:
    """E[max of `count` standard normals] (Blom's approximation); 0 for one."""
    if count <= 1:
        return 0.0
    from statistics import NormalDist

    return NormalDist().inv_cdf((count - 0.375) / (count + 0.25))


def leviathan_speedup(alpha: float, k: int, cost_ratio: float) -> float:
    """(1 - alpha^(K+1)) / ((1 - alpha)(K c + 1)), c = T_draft / T_target (Leviathan et al. 2023)."""
    return float(expected_tau(alpha, k)) / (k * cost_ratio + 1)


def acceptance_counts(cells: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """Per speculative cell: accepted tokens, rejections (draft steps that rejected one of their
    drafts) and drafted tokens; from the steps table where a cell has steps (the native engine),
    else from the cell's own counters (a served engine's spec-decode metrics)."""
    rows = []
    with_steps = set(steps["cell_id"]) if not steps.empty else set()
    if with_steps:
        used = steps[steps["drafted"] > 0]
        for cell_id, group in used.groupby("cell_id"):
            rows.append({"cell_id": cell_id, "accepted": int(group["accepted"].sum()),
                         "rejections": int((group["accepted"] < group["drafted"]).sum()),
                         "drafted": int(group["drafted"].sum())})
    if "rejections" in cells:
        served = cells[~cells["cell_id"].isin(with_steps) & cells["rejections"].notna()]
        for row in served.itertuples():
            rows.append({"cell_id": row.cell_id, "accepted": int(row.accepted), "rejections": int(row.rejections),
                         "drafted": int(row.drafted)})
    return pd.DataFrame(rows, columns=["cell_id", "accepted", "rejections", "drafted"])


def alpha_table(cells: pd.DataFrame, steps: pd.DataFrame, include_synthetic: bool = False) -> pd.DataFrame:
    """One row per (draft, workload, temperature, context length): fitted alpha with its interval,
    pooling K and B. Synthetic-acceptance cells only with `include_synthetic` (as their own
    drafts, `draft α=0.8`): their α is the profile's, measured back, not the models'."""
    finished = label_synthetic(cells[cells["status"] == "ok"]) if include_synthetic and not cells.empty else ok_real(cells)
    speculative = with_context(finished)
    speculative = speculative[speculative["mode"] != AR] if not speculative.empty else speculative
    if speculative.empty:
        return pd.DataFrame()
    counts = acceptance_counts(speculative, steps)
    merged = counts.merge(speculative[["cell_id", "draft", "k"] + TRAFFIC], on="cell_id")
    rows = []
    for (draft, workload, temperature, context), group in merged.groupby(["draft"] + TRAFFIC):
        fit = alpha_from_counts(int(group["accepted"].sum()), int(group["rejections"].sum()))
        row = {"draft": draft, "workload": workload, "temperature": temperature, "context_length": context,
               "alpha_iid": fit.alpha, "alpha_low": fit.low, "alpha_high": fit.high, "accepted": fit.accepted,
               "rejections": fit.rejections, "acceptance_rate": fit.accepted / max(1, int(group["drafted"].sum())),
               "alpha_source": "fitted"}
        simulated = simulated_alpha(draft, group["k"])
        if simulated is not None:  # a timing-only run: the α it was asked to simulate, not its few draws
            row.update(alpha_iid=simulated, alpha_low=simulated, alpha_high=simulated, alpha_source="simulated")
        rows.append(row)
    return pd.DataFrame(rows)


def drafting_share(cell: dict, requests: pd.DataFrame | None) -> float:
    """The share of a cell's decoding row-steps that drafted anything.

    vLLM counts acceptance per position over the drafts it made, but a drafter may propose nothing
    for a row at a step: n-gram drafting finds no match for 18-34 % of them on chat traces, and
    such a row emits one token. The drafts (`num_drafts`) over the decode steps the cell's requests
    took (their output tokens less their first and less the accepted ones). 1 where the counters or
    the requests are missing (a draft model always proposes)."""
    drafts, accepted = cell.get("num_drafts"), cell.get("accepted")
    if requests is None or requests.empty or drafts is None or accepted is None:
        return 1.0
    drafts, accepted = float(drafts), float(accepted)
    if not np.isfinite(drafts) or not np.isfinite(accepted) or drafts <= 0:
        return 1.0
    mine = requests[(requests["cell_id"] == cell["cell_id"]) & (requests["output_tokens"] >= 1)]
    steps = float(mine["output_tokens"].sum()) - len(mine) - accepted
    return min(1.0, drafts / steps) if steps > 0 else 1.0


def row_step_acceptance(cell: dict, requests: pd.DataFrame | None) -> tuple[float, ...]:
    """The cell's acceptance per position for *every* decoding row-step (what a replica or a
    static batch draws): each position's rate per draft times the cell's `drafting_share`; empty
    where the cell recorded no rates."""
    reach = cell.get("acceptance_by_position")
    if reach is None or not isinstance(reach, (list, tuple, np.ndarray)) or not len(reach):
        return ()
    share = drafting_share(cell, requests)
    return tuple(share * float(x) for x in reach)


def acceptance_by_position(cells: pd.DataFrame, requests: pd.DataFrame | None = None) -> np.ndarray:
    """Per draft position i, the share of tokens drafted at i that were accepted (the chance a
    step's position i is accepted), averaged over the cells of one draft at their deepest K; NaN at
    a position no cell measured, empty where the cells recorded none (an endpoint's gauges). With
    the run's `requests`, per decoding row-step (`row_step_acceptance`): a row n-gram drafting
    proposed nothing for counts as a step that accepted nothing."""
    import warnings

    if cells.empty or "acceptance_by_position" not in cells:
        return np.array([])
    deepest = cells[cells["k"] == cells["k"].max()]
    k = int(deepest["k"].iloc[0])
    rates = [np.asarray(row_step_acceptance(cell, requests), dtype=float) for cell in deepest.to_dict("records")]
    rates = [r for r in rates if len(r) == k]
    if not rates:
        return np.array([])
    with warnings.catch_warnings():  # a position no cell measured stays NaN
        warnings.simplefilter("ignore", RuntimeWarning)
        return np.nanmean(np.stack(rates), axis=0)


def simulated_alpha(label: str, ks) -> float | None:
    """The i.i.d. α a synthetic draft's label (`1b α=0.8`, `1b α=0.9/0.8/0.7`) simulates: the
    profile's expected accepted drafts over accepted plus rejections (the fitted α's own
    definition) at the cells' K; None for a real draft."""
    _, mark, text = label.partition(" α=")
    if not mark:
        return None
    profile = parse_alpha(text)
    accepted = rejections = 0.0
    for k in (int(k) for k in ks if k and k > 0):
        reach = 1.0
        for position in range(k):
            reach *= profile[min(position, len(profile) - 1)]
            accepted += reach
        rejections += 1 - reach  # a step ends in a rejection unless all K were accepted
    return accepted / (accepted + rejections) if accepted + rejections > 0 else None
