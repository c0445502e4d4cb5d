"""From a sweep's tables to a model of it: alpha, tau, step costs, speed-up, crossover, dollars.

- alpha (i.i.d.): each draft position is accepted with probability alpha, independently, until the
  first rejection. A step that drafted k tokens and kept a is a run of a successes followed by one
  failure when a < k (none when a = k): the likelihood over steps is alpha^S (1 - alpha)^F with
  S = accepted tokens and F = steps with a rejection, so the MLE is S / (S + F), with a Wilson
  interval. (The sweep's `alpha` column, accepted / drafted, is vLLM's acceptance rate; it counts
  positions after a rejection as failures and is lower.)
- tau(alpha, K) = (1 - alpha^(K+1)) / (1 - alpha), tokens per target forward.
- speed-up(K, B) = tau * T_ar(B) / (K * T_draft(B) + T_verify(B, K + 1)) from per-step times
  measured in the sweep (T_verify includes acceptance and bookkeeping, T_ar likewise); the
  end-to-end prediction adds the prefills, as the measured tokens/s include them.
- crossover B*: the batch size where the best speed-up over K falls below 1, interpolated
  between measured batch sizes on a log2 scale.
- $ per 1M output tokens = price per hour x devices / (tokens/s x 3600) x 1e6.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

AR = "autoregressive"
Z95 = 1.959964

# On-demand $/GPU-hour defaults, to override with --gpu-price: H100 and A100 from Vidur's table
# (early 2024); the others are typical cloud list prices of 2024-2025. Prices move; pass yours.
GPU_PRICES_PER_HOUR = {"H200": 5.00, "H100": 4.25, "A100-80GB": 2.21, "A100": 2.21, "L40S": 1.80,
                       "L4": 0.80, "A10G": 1.01}


# --- acceptance ------------------------------------------------------------------------------

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
    successes = int(accepted[used].sum())
    rejections = int((accepted[used] < drafted[used]).sum())
    trials = successes + rejections
    alpha = successes / trials if trials else float("nan")
    low, high = wilson_interval(successes, trials)
    return AlphaFit(alpha, low, high, successes, rejections)


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


def alpha_table(cells: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """One row per (draft, workload, temperature): fitted alpha with its interval, pooling K and B."""
    speculative = _ok_real(cells)
    speculative = speculative[speculative["mode"] != AR] if not speculative.empty else speculative
    if speculative.empty:
        return pd.DataFrame()
    counts = acceptance_counts(speculative, steps)
    merged = counts.merge(speculative[["cell_id", "draft", "workload", "temperature"]], on="cell_id")
    rows = []
    for (draft, workload, temperature), group in merged.groupby(["draft", "workload", "temperature"]):
        successes, rejections = int(group["accepted"].sum()), int(group["rejections"].sum())
        trials = successes + rejections
        low, high = wilson_interval(successes, trials)
        rows.append({"draft": draft, "workload": workload, "temperature": temperature,
                     "alpha_iid": successes / trials if trials else float("nan"),
                     "alpha_low": low, "alpha_high": high, "accepted": successes, "rejections": rejections,
                     "acceptance_rate": successes / max(1, int(group["drafted"].sum()))})
    return pd.DataFrame(rows)


def _ok_real(cells: pd.DataFrame) -> pd.DataFrame:
    if cells.empty:
        return cells
    keep = cells["status"] == "ok"
    if "synthetic" in cells:
        keep &= ~cells["synthetic"].fillna(False).astype(bool)
    return cells[keep]


def closed_loop(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells measured at a batch size (or concurrency), not at a request rate."""
    if cells.empty or "request_rate" not in cells:
        return cells
    return cells[cells["request_rate"].fillna(0) == 0]


def open_loop(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells measured at a request rate (open loop)."""
    if cells.empty or "request_rate" not in cells:
        return cells.iloc[0:0]
    return cells[cells["request_rate"].fillna(0) > 0]


def _ok(cells: pd.DataFrame) -> pd.DataFrame:
    """Finished closed-loop cells: what every batch-size analysis reads."""
    return closed_loop(cells[cells["status"] == "ok"]) if not cells.empty else cells


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
    """Measured autoregressive cells with `step_s`, their decode step time."""
    ok = _ok(cells)
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


def busy_machine(cells: pd.DataFrame, cores: int | None = None) -> str | None:
    """A warning when CPU cells ran while the machine's load average was well above its cores."""
    import os

    if cells.empty or "load_average" not in cells or "device" not in cells or not (cells["device"] == "cpu").any():
        return None
    cores = cores or os.cpu_count() or 1
    busy = cells[cells["load_average"] > 1.5 * cores]
    if not len(busy):
        return None
    return (f"the machine was busy (load average above {1.5 * cores:g} on {cores} cores) during {len(busy)} cell(s); "
            f"their timings include the other work")


# --- how fast the baseline is ------------------------------------------------------------------

SLOW_BASELINE = 0.8  # a baseline below this share of the deployed engine's tokens/s flatters speculation
BASELINE_KEYS = ["workload", "batch_size", "temperature"]


def _baselines(cells: pd.DataFrame) -> pd.DataFrame:
    """Finished, real (not synthetic) closed-loop autoregressive cells."""
    if cells.empty or "mode" not in cells:
        return cells.iloc[0:0]
    ok = closed_loop(_ok_real(cells))
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


def measurement_warnings(cells: pd.DataFrame) -> list[str]:
    """Every warning about how far a run's timings can be trusted, for the console, plan, summary and HTML."""
    warnings = [message for message in [busy_machine(cells)] if message]
    drift = baseline_drift(cells)
    return warnings + drift + ([DRIFT_ADVICE] if drift else [])


def drifted_keys(cells: pd.DataFrame) -> set[tuple[str, int]]:
    """(workload, batch size) groups whose baselines drifted: charts mark them."""
    return {(workload, batch_size) for workload, batch_size, _ in drifted_groups(cells)}


# --- cost model --------------------------------------------------------------------------------

@dataclass
class CostModel:
    """Per-step times (seconds) measured in a run, for one workload and temperature.

    Step times come from full-batch steps (every row still active) of the steps table, so that
    verify time is keyed by how many positions the target really verified (an n-gram step
    verifies only as many as its longest proposal)."""

    ar_step: dict[int, float]  # B -> T_ar (decode step incl. bookkeeping)
    draft_per_token: dict[tuple[str, int], float]  # (draft, B) -> T_draft per proposed token
    verify: dict[tuple[int, int], float]  # (B, positions) -> T_verify incl. acceptance and bookkeeping
    prefill: dict[int, float]  # B -> target prefill
    draft_prefill: dict[tuple[str, int], float]
    coverage: dict[str, float]  # draft -> share of row-steps that drafted anything (1 for models)
    step_coverage: dict[tuple[str, int], float]  # (draft, B) -> share of steps where any row drafted
    new_tokens: int

    @staticmethod
    def _line(points: list[tuple[float, float]], x: float) -> float:
        """Least-squares a + b x through `points` (b >= 0: more work never costs less)."""
        if not points:
            return float("nan")
        xs = np.array([p[0] for p in points], dtype=float)
        ys = np.array([p[1] for p in points], dtype=float)
        if len(set(xs)) < 2:
            return float(ys.mean())
        slope, intercept = np.polyfit(xs, ys, 1)
        if slope < 0:
            slope, intercept = 0.0, ys.mean()
        return float(intercept + slope * x)

    def _target_points(self) -> list[tuple[float, float]]:
        """Every measured target forward as (token positions B x n, seconds)."""
        return [(b, t) for b, t in self.ar_step.items()] + [(b * n, t) for (b, n), t in self.verify.items()]

    def _by_batch(self, table: dict[int, float], batch_size: int) -> float:
        """Measured at B when it was, else a line in B through every measured size."""
        if batch_size in table:
            return table[batch_size]
        return self._line(list(table.items()), batch_size)

    def measured_batch_sizes(self) -> list[int]:
        return sorted(self.ar_step)

    def t_ar(self, batch_size: int) -> float:
        """A decode step at B: measured, else from the target's cost line in token positions."""
        if batch_size in self.ar_step:
            return self.ar_step[batch_size]
        return self._line(self._target_points(), batch_size)

    def t_draft(self, draft: str, batch_size: int) -> float:
        return self._by_batch({b: t for (d, b), t in self.draft_per_token.items() if d == draft}, batch_size)

    def t_verify(self, batch_size: int, positions: int) -> float:
        """Verifying `positions` per row at B: measured, else from the target's cost line in token
        positions B x n, fitted over every autoregressive and verify forward of the run (a forward's
        cost is flat in m while memory-bound and linear once compute-bound)."""
        if (batch_size, positions) in self.verify:
            return self.verify[(batch_size, positions)]
        if positions == 1 and batch_size in self.ar_step:
            return self.ar_step[batch_size]
        return self._line(self._target_points(), batch_size * positions)

    def decode_speedup(self, alpha: float, draft: str, k: int, batch_size: int) -> float:
        """The steady-state formula tau * T_ar / (K T_draft + T_verify(K+1)), with the share of
        steps a partial drafter (n-gram) leaves empty verifying a single position."""
        tokens, step = self._step(alpha, draft, k, batch_size)
        return tokens * self.t_ar(batch_size) / step

    def _step(self, alpha: float, draft: str, k: int, batch_size: int) -> tuple[float, float]:
        tokens, _ = tokens_per_step_moments(alpha, k, self.coverage.get(draft, 1.0))
        return tokens, self._step_time(draft, k, batch_size)

    def _step_time(self, draft: str, k: int, batch_size: int) -> float:
        any_row = self.step_coverage.get((draft, batch_size), self.coverage.get(draft, 1.0))
        verify = any_row * self.t_verify(batch_size, k + 1) + (1 - any_row) * self.t_verify(batch_size, 1)
        return k * self.t_draft(draft, batch_size) + verify

    def speculative_steps(self, alpha: float, draft: str, k: int, batch_size: int) -> float:
        """Steps until the slowest of B rows has its new_tokens - 1 decoded tokens: a row needs
        about n / mean steps with variance n var / mean^3 (renewal theory), and a static batch
        runs until its slowest row is done."""
        mean, variance = tokens_per_step_moments(alpha, k, self.coverage.get(draft, 1.0))
        decoded = self.new_tokens - 1
        return decoded / mean + expected_max_normal(batch_size) * math.sqrt(decoded * variance / mean ** 3)

    def speedup(self, alpha: float, draft: str, k: int, batch_size: int) -> float:
        """End to end, as measured: prefill, draft prefill and the decode steps of the slowest row
        (the tail steps, with rows already finished, are costed at the full-batch step time)."""
        decoded = self.new_tokens - 1
        prefill = self._by_batch(self.prefill, batch_size)
        draft_prefill = self._by_batch({b: t for (d, b), t in self.draft_prefill.items() if d == draft}, batch_size)
        autoregressive = prefill + decoded * self.t_ar(batch_size)
        steps = self.speculative_steps(alpha, draft, k, batch_size)
        speculative = prefill + (0 if np.isnan(draft_prefill) else draft_prefill) + steps * self._step_time(draft, k, batch_size)
        return autoregressive / speculative


@dataclass
class ServedCostModel(CostModel):
    """The cost model of a served engine, which exposes no step times: a decode step of B
    requests in flight is the median time per output token (TPOT) of the autoregressive cell, and
    a speculative step is TPOT x the measured τ of the speculative cell (a step emits τ tokens per
    request). Unmeasured K: a line in K through the measured K of that draft and B (draft cost
    grows with K); unmeasured B: a line in B. With a cell's own step time, its prediction checks
    the acceptance model (τ from the fitted α); step times enter only where they were not measured.
    Prefill is the median TTFT (continuous batching: arrivals prefill between decode steps)."""

    iteration: dict[tuple[str, int, int], float] = field(default_factory=dict)  # (draft, K, B) -> step time

    def _step_time(self, draft: str, k: int, batch_size: int) -> float:
        if (draft, k, batch_size) in self.iteration:
            return self.iteration[(draft, k, batch_size)]
        same_b = [(kk, t) for (d, kk, b), t in self.iteration.items() if d == draft and b == batch_size]
        if len({kk for kk, _ in same_b}) >= 2:
            return self._line(same_b, k)
        same_k = {b: t for (d, kk, b), t in self.iteration.items() if d == draft and kk == k}
        if same_k:
            return self._by_batch(same_k, batch_size)
        return float("nan")

    def decode_speedup(self, alpha: float, draft: str, k: int, batch_size: int) -> float:
        return float(expected_tau(alpha, k)) * self.t_ar(batch_size) / self._step_time(draft, k, batch_size)

    def speedup(self, alpha: float, draft: str, k: int, batch_size: int) -> float:
        """Per request, prefill plus its decode steps: e2e time, which sets closed-loop throughput."""
        decoded = self.new_tokens - 1
        prefill = self._by_batch(self.prefill, batch_size)
        autoregressive = prefill + decoded * self.t_ar(batch_size)
        speculative = prefill + decoded * self._step_time(draft, k, batch_size) / float(expected_tau(alpha, k))
        return autoregressive / speculative


def served_cost_models(cells: pd.DataFrame) -> dict[tuple[str, float], CostModel]:
    """One ServedCostModel per (workload, temperature) from cells without steps."""
    models: dict = {}
    for (workload, temperature), group in cells.groupby(["workload", "temperature"]):
        ar, sd = group[group["mode"] == AR], group[group["mode"] != AR]
        ar_step = {int(r.batch_size): float(r.tpot_p50_s) for r in ar.itertuples() if np.isfinite(r.tpot_p50_s)}
        if not ar_step:
            continue
        prefill = {int(r.batch_size): float(r.ttft_p50_s) for r in ar.itertuples()}
        iteration = {(r.draft, int(r.k), int(r.batch_size)): float(r.tpot_p50_s) * float(r.tau)
                     for r in sd.itertuples() if np.isfinite(r.tpot_p50_s) and np.isfinite(r.tau)}
        presence = {(d, b): float("nan") for d, _, b in iteration}
        models[(workload, temperature)] = ServedCostModel(
            ar_step, presence, {}, prefill, {}, {}, {}, int(group["max_new_tokens"].max()), iteration)
    return models


def cost_models(cells: pd.DataFrame, steps: pd.DataFrame) -> dict[tuple[str, float], CostModel]:
    """One cost model per (workload, temperature) from the ok cells and their steps; a served
    engine's cells (no steps) get a ServedCostModel."""
    cells = _ok(cells)
    models: dict = {}
    if cells.empty:
        return models
    with_steps = set(steps["cell_id"]) if not steps.empty else set()
    served = cells[~cells["cell_id"].isin(with_steps)]
    if "engine" in served:
        served = served[served["engine"].fillna("native") != "native"]
    else:
        served = served.iloc[0:0]
    if len(served):
        models.update(served_cost_models(served))
    if steps.empty:
        return models
    columns = ["cell_id", "mode", "draft", "k", "batch_size", "workload", "temperature"]
    merged = steps.merge(cells[columns], on="cell_id")
    full = merged[merged["batch_rows"] == merged["batch_size"]]
    per_step = full.drop_duplicates(["cell_id", "repeat", "batch_index", "step"])
    for (workload, temperature), group in cells.groupby(["workload", "temperature"]):
        mine = per_step[(per_step["workload"] == workload) & (per_step["temperature"] == temperature)]
        rows = merged[(merged["workload"] == workload) & (merged["temperature"] == temperature)]
        ar = mine[mine["mode"] == AR]
        sd = mine[mine["mode"] != AR]
        ar_step = {int(b): float((g["verify_s"] + g["overhead_s"]).median()) for b, g in ar.groupby("batch_size")}
        if not ar_step:
            continue
        verify = {(int(b), int(n)): float((g["verify_s"] + g["overhead_s"]).median())
                  for (b, n), g in sd.groupby(["batch_size", "verify_tokens"])}
        draft_per_token = {(d, int(b)): float((g["draft_s"] / g["k"]).median()) for (d, b), g in sd.groupby(["draft", "batch_size"])}
        sd_rows = rows[rows["mode"] != AR]
        coverage = {d: float((g["drafted"] > 0).mean()) for d, g in sd_rows.groupby("draft")}
        step_coverage = {(d, int(b)): float((g["verify_tokens"] > 1).mean()) for (d, b), g in sd.groupby(["draft", "batch_size"])}
        ar_cells, sd_cells = group[group["mode"] == AR], group[group["mode"] != AR]
        prefill = {int(b): float(g["prefill_s"].median()) for b, g in ar_cells.groupby("batch_size")} \
            if "prefill_s" in group else {}
        draft_prefill = {(d, int(b)): float(g["draft_prefill_s"].median())
                         for (d, b), g in sd_cells.groupby(["draft", "batch_size"])} if "draft_prefill_s" in group else {}
        models[(workload, temperature)] = CostModel(ar_step, draft_per_token, verify, prefill, draft_prefill,
                                                    coverage, step_coverage, int(group["max_new_tokens"].max()))
    return models


def predictions(cells: pd.DataFrame, steps: pd.DataFrame, alphas: pd.DataFrame) -> pd.DataFrame:
    """Every ok speculative cell with its predicted tau and speed-up next to the measured ones."""
    models = cost_models(cells, steps)
    rows = []
    for row in closed_loop(_ok_real(cells)).to_dict("records"):
        if row["mode"] == AR:
            continue
        fit = alphas[(alphas["draft"] == row["draft"]) & (alphas["workload"] == row["workload"])
                     & (alphas["temperature"] == row["temperature"])]
        model = models.get((row["workload"], row["temperature"]))
        if fit.empty or model is None:
            continue
        alpha, k, b = float(fit["alpha_iid"].iloc[0]), int(row["k"]), int(row["batch_size"])
        predicted = model.speedup(alpha, row["draft"], k, b)
        rows.append({
            "cell_id": row["cell_id"], "draft": row["draft"], "workload": row["workload"],
            "temperature": row["temperature"], "k": k, "batch_size": b,
            "tau_measured": row["tau"], "tau_predicted": float(expected_tau(alpha, k)),
            "speedup_measured": row["speedup"], "speedup_predicted": predicted,
            "speedup_decode_predicted": model.decode_speedup(alpha, row["draft"], k, b),
            "speedup_error": predicted / row["speedup"] - 1 if row["speedup"] else float("nan"),
        })
    return pd.DataFrame(rows)


# --- decisions ---------------------------------------------------------------------------------

def label_synthetic(cells: pd.DataFrame) -> pd.DataFrame:
    """Synthetic-acceptance cells count as their own draft, `draft α=0.8`, everywhere downstream.
    The α moves from `synthetic_alpha` into the label, so labelling twice changes nothing."""
    if cells.empty or "synthetic_alpha" not in cells:
        return cells
    cells = cells.copy()
    alpha = cells["synthetic_alpha"].fillna("").astype(str)
    cells["draft"] = [f"{d} α={a}" if a else d for d, a in zip(cells["draft"], alpha)]
    cells["synthetic_alpha"] = ""
    return cells


def best_k_by_batch(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (draft, workload, temperature, B): the measured best K and its speed-up."""
    sd = _ok(label_synthetic(cells))
    sd = sd[(sd["mode"] != AR) & sd["speedup"].notna()] if not sd.empty else sd
    if sd.empty:
        return pd.DataFrame()
    index = sd.groupby(["draft", "workload", "temperature", "batch_size"])["speedup"].idxmax()
    columns = ["draft", "workload", "temperature", "batch_size", "k", "speedup"]
    columns += ["speedup_runs"] if "speedup_runs" in sd else []
    return sd.loc[index, columns].reset_index(drop=True)


@dataclass
class Crossover:
    batch_size: float | None  # interpolated B* where best speed-up falls below 1; None if no crossing
    text: str


def _crossing(b0: int, s0: float, b1: int, s1: float, threshold: float) -> float:
    fraction = (s0 - threshold) / (s0 - s1)
    return 2 ** (math.log2(b0) + fraction * (math.log2(b1) - math.log2(b0)))


def crossover(batch_sizes: list[int], speedups: list[float], threshold: float = 1.0) -> Crossover:
    """B*: where the best speed-up falls from >= threshold to below it, interpolated in log2 B.
    The text also says where speculation starts paying when it is below at small batches (on a
    compute-bound CPU, say, it can improve with batch size)."""
    points = sorted(zip(batch_sizes, speedups))
    if not points:
        return Crossover(None, "no data")
    rises, falls = [], []
    for (b0, s0), (b1, s1) in zip(points, points[1:]):
        if s0 < threshold <= s1:
            rises.append((_crossing(b0, s0, b1, s1, threshold), b0, b1))
        elif s0 >= threshold > s1:
            falls.append((_crossing(b0, s0, b1, s1, threshold), b0, b1))
    parts = []
    if points[0][1] < threshold:
        parts.append(f"below {threshold:g}× at B = {points[0][0]}")
    if rises:
        at, b0, b1 = rises[0]
        parts.append(f"≥ {threshold:g}× from B ≈ {at:.1f} (between {b0} and {b1})")
    if falls:
        at, b0, b1 = falls[-1]
        parts.append(f"B* ≈ {at:.1f} (between {b0} and {b1})")
        return Crossover(at, "; ".join(parts))
    if points[-1][1] >= threshold:
        parts.append(f"no slowdown up to B = {points[-1][0]}")
    elif not rises:
        parts[-1] = f"below {threshold:g}× at every measured B (up to {points[-1][0]})" if len(points) > 1 else parts[-1]
    return Crossover(None, "; ".join(parts))


WORST_CASE = "worst case"  # the workload label of rows taken over every workload and temperature


def b_star_rule(bar: float = 1.0) -> str:
    return (f"B* = the batch size where the best-K speed-up falls below {bar:g}×, interpolated in log2(B) "
            f"between the measured sizes either side of it")


def best_draft_rule(bar: float = 1.0) -> str:
    return (f"best draft = the one whose lowest speed-up over the batch sizes judged is highest (at each batch size: "
            f"the best K, the worst workload and temperature); bar {bar:g}×")


def worst_case_by_batch(best: pd.DataFrame) -> pd.DataFrame:
    """Per (draft, B) of a best_k_by_batch frame: the best-K speed-up of the least favourable
    workload and temperature, with the K, workload and temperature where it occurs. What the gate judges."""
    if best.empty:
        return best
    return best.loc[best.groupby(["draft", "batch_size"])["speedup"].idxmin()].sort_values(
        ["draft", "batch_size"]).reset_index(drop=True)


def pick_best_draft(worst: pd.DataFrame, batch_sizes: list[int]) -> str | None:
    """The draft best_draft_rule names, among drafts measured at every one of `batch_sizes`."""
    scores = {}
    for draft, rows in worst.groupby("draft"):
        judged = rows[rows["batch_size"].isin(batch_sizes)]
        if len(judged) == len(set(batch_sizes)):
            scores[draft] = (judged["speedup"].min(), judged["speedup"].mean())
    return max(scores, key=scores.get) if scores else None


def crossover_table(cells: pd.DataFrame, threshold: float = 1.0) -> pd.DataFrame:
    """B* per draft, workload and temperature, and per draft over the worst case of them
    (workload `worst case`): the one the gate reports."""
    best = best_k_by_batch(cells)
    rows = []
    if best.empty:
        return pd.DataFrame()
    for (draft, workload, temperature), group in best.groupby(["draft", "workload", "temperature"]):
        found = crossover(group["batch_size"].tolist(), group["speedup"].tolist(), threshold)
        rows.append({"draft": draft, "workload": workload, "temperature": temperature,
                     "crossover_batch_size": found.batch_size, "crossover": found.text})
    for draft, group in worst_case_by_batch(best).groupby("draft"):
        found = crossover(group["batch_size"].tolist(), group["speedup"].tolist(), threshold)
        rows.append({"draft": draft, "workload": WORST_CASE, "temperature": float("nan"),
                     "crossover_batch_size": found.batch_size, "crossover": found.text})
    return pd.DataFrame(rows)


def k_schedule(batch_sizes: list[int], best_k: list[int | None]) -> str:
    """`{1-8: 5, 9-32: 2, 33+: off}`: each measured B covers the sizes above the previous one."""
    from specbench.grid import format_schedule

    return format_schedule(schedule_ranges(batch_sizes, best_k))


# --- money -------------------------------------------------------------------------------------

def default_gpu_price(hardware: dict) -> tuple[float | None, str]:
    """(price per GPU-hour, which GPU) from run.json's hardware, or (None, reason) on a CPU."""
    gpus = hardware.get("gpus") or []
    if not gpus:
        return None, "CPU run: pass --gpu-price (price per machine-hour) for dollars"
    name = gpus[0]["name"].upper().replace(" ", "")
    for key, price in GPU_PRICES_PER_HOUR.items():
        if key.replace("-", "") in name.replace("-", ""):
            return price, key
    return None, f"no default price for {gpus[0]['name']}: pass --gpu-price"


def cost_per_million(tokens_per_s: float | np.ndarray, price_per_hour: float | None, devices: int = 1):
    """$ per 1M output tokens, or device-hours per 1M tokens when no price is known."""
    hours = 1e6 / (np.asarray(tokens_per_s, dtype=float) * 3600) * devices
    return hours * price_per_hour if price_per_hour is not None else hours


# --- what-if -----------------------------------------------------------------------------------

def plan_table(models: dict[tuple[str, float], CostModel], alphas: pd.DataFrame, drafts: list[str],
               ks: list[int], batch_sizes: list[int], price_per_hour: float | None = None,
               devices: int = 1) -> pd.DataFrame:
    """Predicted speed-up, tokens/s and cost for every (workload, temperature, draft, K, B),
    measured or not: alpha from `alphas`, step times from `models`. Labelled predictions."""
    rows = []
    for (workload, temperature), model in models.items():
        measured = model.measured_batch_sizes()
        for b in batch_sizes:
            decoded = model.new_tokens - 1
            ar_time = model._by_batch(model.prefill, b) + decoded * model.t_ar(b)
            ar_tokens_per_s = b * model.new_tokens / ar_time
            rows.append({"workload": workload, "temperature": temperature, "draft": AR, "k": 0, "batch_size": b,
                         "alpha_iid": float("nan"), "tau": 1.0, "speedup": 1.0, "tokens_per_s": ar_tokens_per_s,
                         "extrapolated": not measured[0] <= b <= measured[-1]})
            for draft in drafts:
                fit = alphas[(alphas["draft"] == draft) & (alphas["workload"] == workload)
                             & (alphas["temperature"] == temperature)]
                if fit.empty or not any(d == draft for d, _ in model.draft_per_token):
                    continue
                alpha = float(fit["alpha_iid"].iloc[0])
                for k in ks:
                    speedup = model.speedup(alpha, draft, k, b)
                    if not np.isfinite(speedup):  # a served engine's step time at an unmeasured K
                        continue
                    rows.append({"workload": workload, "temperature": temperature, "draft": draft, "k": k,
                                 "batch_size": b, "alpha_iid": alpha, "tau": float(expected_tau(alpha, k)),
                                 "speedup": speedup, "tokens_per_s": ar_tokens_per_s * speedup,
                                 "extrapolated": not measured[0] <= b <= measured[-1]})
    table = pd.DataFrame(rows)
    if not table.empty:
        table["cost_per_1m"] = cost_per_million(table["tokens_per_s"], price_per_hour, devices)
        table["predicted"] = True
    return table


# --- service-level objectives: goodput and the load a server carries ---------------------------

SLO_METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "e2el": "e2e_s"}
SLO_PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class Slo:
    """Bounds in seconds on per-request TTFT, TPOT and end-to-end latency, and the percentile of
    a cell's requests that must meet each for the cell to meet the SLO."""

    bounds: tuple[tuple[str, float], ...]  # (metric, seconds)
    percentile: int = 99

    @property
    def text(self) -> str:
        parts = [f"{metric}={bound:g}" for metric, bound in self.bounds]
        return ",".join(parts + [f"p{self.percentile}"])

    def describe(self) -> str:
        names = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "e2e latency"}
        return f"p{self.percentile} " + " and ".join(
            f"{names[m]} ≤ {b * 1e3:g} ms" if b < 1 else f"{names[m]} ≤ {b:g} s" for m, b in self.bounds)


def parse_slo(text: str) -> Slo:
    """`ttft=1.0,tpot=0.05` (seconds), optionally `,p90` for the percentile (default p99);
    `ttft:1.0` as vLLM's --goodput writes it is read too (still seconds)."""
    bounds: dict[str, float] = {}
    percentile = 99
    for entry in [e.strip() for e in text.split(",") if e.strip()]:
        if entry.lower().lstrip("p").isdigit() and entry.lower().startswith("p"):
            percentile = int(entry[1:])
            if percentile not in SLO_PERCENTILES:
                raise ValueError(f"--slo: percentile {entry} must be one of "
                                 + ", ".join(f"p{p}" for p in SLO_PERCENTILES))
            continue
        name, sep, value = entry.replace(":", "=").partition("=")
        name = name.strip().lower()
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"--slo: cannot read {entry!r} (write ttft=SECONDS,tpot=SECONDS,e2e=SECONDS[,p90])")
        try:
            bound = float(value)
        except ValueError:
            raise ValueError(f"--slo: {entry!r} needs a number of seconds") from None
        if not bound > 0 or not math.isfinite(bound):
            raise ValueError(f"--slo: {entry!r} must be a positive number of seconds")
        bounds["e2e" if name == "e2el" else name] = bound
    if not bounds:
        raise ValueError(f"--slo {text!r} names no bound (e.g. ttft=1.0,tpot=0.05)")
    return Slo(tuple(bounds.items()), percentile)


def load_column(cells: pd.DataFrame) -> str:
    """What a run varied: request_rate (open loop) or batch_size (closed loop)."""
    return "request_rate" if not open_loop(cells).empty else "batch_size"


def load_label(column: str) -> str:
    return "request rate (req/s)" if column == "request_rate" else "concurrency (B)"


def slo_table(cells: pd.DataFrame, requests: pd.DataFrame, slo: Slo) -> pd.DataFrame:
    """Per finished cell of the run's load kind: goodput (requests meeting every bound per second
    of the cell's measured time, as `vllm bench serve --goodput` counts it), the share of good
    requests, each bounded metric at the SLO's percentile, and whether the cell meets the SLO
    (every bounded metric's percentile within its bound)."""
    column = load_column(cells)
    ok = cells[cells["status"] == "ok"] if not cells.empty else cells
    ok = open_loop(ok) if column == "request_rate" else closed_loop(ok)
    if ok.empty or requests.empty:
        return pd.DataFrame()
    ok = label_synthetic(ok)
    by_cell = dict(tuple(requests.groupby("cell_id", sort=False)))
    rows = []
    for cell in ok.to_dict("records"):
        mine = by_cell.get(cell["cell_id"])
        if mine is None:
            continue
        good = np.ones(len(mine), dtype=bool)
        figures = {}
        for metric, bound in slo.bounds:
            values = mine[SLO_METRICS[metric]].astype(float).fillna(0.0 if metric == "tpot" else np.inf).to_numpy()
            good &= values <= bound
            figures[f"{metric}_p{slo.percentile}_s"] = float(np.percentile(values, slo.percentile))
        meets = all(figures[f"{m}_p{slo.percentile}_s"] <= b for m, b in slo.bounds)
        wall = float(cell.get("wall_s") or float("nan"))
        rows.append({"cell_id": cell["cell_id"], "mode": cell["mode"], "draft": cell["draft"], "k": cell["k"],
                     "workload": cell["workload"], "temperature": cell["temperature"], "load": float(cell[column]),
                     "requests": len(mine), "good_requests": int(good.sum()),
                     "good_fraction": float(good.mean()), "goodput_rps": float(good.sum()) / wall if wall else float("nan"),
                     "achieved_request_rate": len(mine) / wall if wall else float("nan"),
                     "tokens_per_s": float(cell["tokens_per_s"]), "meets_slo": meets, **figures})
    return pd.DataFrame(rows)


def slo_capacity(table: pd.DataFrame) -> pd.DataFrame:
    """Per (workload, temperature) and per draft (the best K at each load, the one that meets the
    SLO with most goodput) next to the autoregressive baseline: the highest measured load up to
    which every measured load meets the SLO, the tokens/s there, and the K used there."""
    if table.empty:
        return pd.DataFrame()
    rows = []
    for (workload, temperature), group in table.groupby(["workload", "temperature"]):
        for draft, mine in group.groupby("draft"):
            per_load = []
            for load, at in mine.groupby("load"):
                best = at.sort_values(["meets_slo", "goodput_rps", "tokens_per_s"], ascending=False).iloc[0]
                per_load.append((float(load), best))
            per_load.sort(key=lambda item: item[0])
            capacity, chosen = None, None
            for load, best in per_load:
                if not best["meets_slo"]:
                    break
                capacity, chosen = load, best
            rows.append({"workload": workload, "temperature": temperature, "draft": draft,
                         "mode": per_load[0][1]["mode"], "max_load": capacity,
                         "max_measured_load": per_load[-1][0], "min_measured_load": per_load[0][0],
                         "k": int(chosen["k"]) if chosen is not None else None,
                         "tokens_per_s": float(chosen["tokens_per_s"]) if chosen is not None else float("nan"),
                         "goodput_rps": float(chosen["goodput_rps"]) if chosen is not None else float("nan")})
    return pd.DataFrame(rows)


def capacity_ratio(ours, theirs) -> float:
    """Speculation's capacity over the baseline's (None or NaN: meets the SLO at no load)."""
    ours = 0.0 if ours is None or pd.isna(ours) else float(ours)
    theirs = 0.0 if theirs is None or pd.isna(theirs) else float(theirs)
    if ours == theirs:
        return 1.0
    return ours / theirs if theirs else math.inf


def capacity_text(value, measured_max: float, column: str) -> str:
    unit = " req/s" if column == "request_rate" else ""
    name = "R" if column == "request_rate" else "B"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "meets it at no measured load"
    if not math.isfinite(value):
        return "rate inf (every request at once)"
    text = f"{name} = {value:g}{unit}"
    return text + (" (every measured load; the ceiling is higher)" if value >= measured_max else "")


# --- what a server can load ----------------------------------------------------------------------

def vllm_speculative_config(base: dict, schedule: list[tuple[int, int, int]]) -> dict | None:
    """A complete `--speculative-config` for vLLM from a draft's own config and a K schedule
    (first batch size, last, K; K 0 = off): num_speculative_tokens is the largest K (vLLM clamps
    the schedule to it) and num_speculative_tokens_per_batch_size the schedule. None when the
    schedule never drafts (leave speculation off)."""
    largest = max((k for _, _, k in schedule), default=0)
    if largest < 1:
        return None
    from specbench.grid import vllm_schedule

    config = {key: value for key, value in base.items() if key != "num_speculative_tokens_per_batch_size"}
    config["num_speculative_tokens"] = largest
    config["num_speculative_tokens_per_batch_size"] = vllm_schedule(schedule)
    return config


def schedule_ranges(batch_sizes: list[int], best_k: list[int | None]) -> list[tuple[int, int, int]]:
    """The K per batch size as (first, last, K) ranges, K 0 (None in `best_k`) for off: each
    measured B covers the sizes above the previous one, and the last range is open-ended."""
    from specbench.grid import OPEN_ENDED

    ranges: list[tuple[int, int, int]] = []
    low = 1
    for b, k in sorted(zip(batch_sizes, best_k)):
        value = k or 0
        if ranges and ranges[-1][2] == value:
            ranges[-1] = (ranges[-1][0], b, value)
        else:
            ranges.append((low, b, value))
        low = b + 1
    if ranges:
        ranges[-1] = (ranges[-1][0], OPEN_ENDED, ranges[-1][2])
    return ranges
