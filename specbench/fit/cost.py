"""The speed-up model: step times from the roofline forward-time model, acceptance from the α fit.

- A decode step of the autoregressive baseline at batch B is one target forward of B rows x 1
  position; a speculative step is the draft's proposal (K draft forwards for a model draft, a
  search of the context for n-gram) and one target forward of K + 1 positions (one position on
  steps where no row drafted anything).
- Every forward's time comes from `roofline.ForwardTimeModel`, fitted once per run on all of its
  measured forwards (they share the hardware and the models whatever the workload), at the
  context each step really attended over: the batch's longest prompt plus the tokens decoded so
  far, averaged over the decode.
- speed-up = end-to-end time of the baseline / of speculation, both with their prefills, the
  speculative side running until the slowest of its B rows is done: a row needs about n / mean
  steps with variance n var / mean^3 (renewal theory), and a static batch waits for its slowest row.
- Acceptance: i.i.d. α per (draft, workload, temperature, context length); tokens per step
  from α, K and the share of rows that drafted anything (n-gram finds no match on some).

A served engine exposes no step times: its decode step is the median time per output token
(TPOT) of the baseline and TPOT x τ of a speculative cell; the target's part is the same roofline
fitted on the baseline's steps, the draft's part what speculation adds beyond verifying K + 1
positions, linear in B, K and B x K.

Here: the models of one traffic group (`CostModel`, `ServedCostModel`) and `cost_models`, a run's.
Beside it: `step_times` and `prefill_times` (the fits), `cell_predictions` (the run's own cells
predicted), `validation` (held out, and what to know before trusting a prediction) and `what_if`
(the table `plan RUN` prints).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from specbench.fit.acceptance import expected_max_normal, expected_tau, tokens_per_step_moments
from specbench.fit.cells import TRAFFIC, base_draft, label_synthetic, ok_closed_loop, with_context
from specbench.fit.roofline import fit_forward_time
from specbench.fit.step_times import LinearTime, StepTimes, architectures, device_priors, fit_step_times, run_dtype
from specbench.schema import AR
from specbench.step_model.native_fit import NativeFitStep

DECODE_SAMPLES = 16  # points of the decode at which step times are averaged (the context grows)


# --- one traffic group ---------------------------------------------------------------------------

def expected_longest(lengths: np.ndarray, rows: int) -> float:
    """E[the longest of `rows` prompts drawn from `lengths`] (with replacement)."""
    ordered = np.sort(np.asarray(lengths, float))
    if not len(ordered):
        return float("nan")
    n = len(ordered)
    cumulative = (np.arange(1, n + 1) / n) ** rows
    return float(np.sum(ordered * np.diff(np.concatenate([[0.0], cumulative]))))


@dataclass
class CostModel:
    """Speed-up predictions for one (workload, temperature, context length): the run's step times
    with this traffic's prompts, output length and drafts' coverage."""

    times: StepTimes
    prompt_lengths: np.ndarray  # the prompts measured (a sample of this traffic)
    new_tokens: int
    coverage: dict[str, float] = field(default_factory=dict)  # draft -> share of row-steps that drafted
    measured_batch_sizes: list[int] = field(default_factory=list)
    measured_ks: dict[str, list[int]] = field(default_factory=dict)

    def ks_measured(self, draft: str) -> list[int]:
        """The K measured for a draft: its own label's, else those of any label of the same draft
        (a timing run's `1b α=0.8` for the `1b` of another run's α)."""
        return self.measured_ks.get(draft) or sorted(
            {k for label, ks in self.measured_ks.items() if base_draft(label) == base_draft(draft) for k in ks})

    def _contexts(self, batch_size: int, prompt_tokens: float | None) -> np.ndarray:
        """The longest row's cached tokens at evenly spread points of the decode."""
        longest = prompt_tokens if prompt_tokens else expected_longest(self.prompt_lengths, batch_size)
        return longest + np.linspace(0, max(self.new_tokens - 1, 0), DECODE_SAMPLES)

    def prompt_tokens(self) -> float:
        return float(np.mean(self.prompt_lengths))

    def batch_prompts(self, batch_size: int, prompt_tokens: float | None = None) -> np.ndarray:
        """A batch's prompt lengths: all `prompt_tokens` long, else evenly spread quantiles of the
        measured prompts."""
        if prompt_tokens:
            return np.full(batch_size, float(prompt_tokens))
        return np.quantile(self.prompt_lengths, (np.arange(batch_size) + 0.5) / batch_size)

    def step(self, draft: str | None = None) -> NativeFitStep:
        """The run's fitted step for `draft` (None: the target alone), as a step model."""
        return NativeFitStep(self.times, draft)

    def _over_decode(self, price, batch_size: int, k: int, prompt_tokens: float | None) -> float:
        """`price` (a step's seconds, or a part of it) averaged over the decode's contexts."""
        return float(np.mean([price(NativeFitStep.decoding(batch_size, context, k))
                              for context in self._contexts(batch_size, prompt_tokens)]))

    def t_ar(self, batch_size: int, prompt_tokens: float | None = None) -> float:
        return self._over_decode(self.step().seconds, batch_size, 0, prompt_tokens)

    def t_verify(self, batch_size: int, positions: int, prompt_tokens: float | None = None) -> float:
        return self._over_decode(self.step().seconds, batch_size, positions - 1, prompt_tokens)

    def t_draft(self, draft: str, k: int, batch_size: int, prompt_tokens: float | None = None) -> float:
        return self._over_decode(self.step(draft).proposing_s, batch_size, k, prompt_tokens)

    def _any_row(self, draft: str, batch_size: int) -> float:
        """Share of steps where at least one of B rows drafted (each does with its coverage)."""
        return 1 - (1 - self.coverage.get(draft, 1.0)) ** batch_size

    def step_time(self, draft: str, k: int, batch_size: int, prompt_tokens: float | None = None) -> float:
        any_row = self._any_row(draft, batch_size)
        verify = any_row * self.t_verify(batch_size, k + 1, prompt_tokens) + \
            (1 - any_row) * self.t_ar(batch_size, prompt_tokens)
        return self.t_draft(draft, k, batch_size, prompt_tokens) + verify

    def decode_speedup(self, alpha: float, draft: str, k: int, batch_size: int,
                       prompt_tokens: float | None = None) -> float:
        """The steady-state τ T_ar / (T_draft(K) + T_verify(K + 1)), without prefills or the tail."""
        tokens, _ = tokens_per_step_moments(alpha, k, self.coverage.get(draft, 1.0))
        return tokens * self.t_ar(batch_size, prompt_tokens) / self.step_time(draft, k, batch_size, prompt_tokens)

    def speculative_steps(self, alpha: float, draft: str, k: int, batch_size: int) -> float:
        mean, variance = tokens_per_step_moments(alpha, k, self.coverage.get(draft, 1.0))
        decoded = self.new_tokens - 1
        return decoded / mean + expected_max_normal(batch_size) * math.sqrt(decoded * variance / mean ** 3)

    def ar_seconds(self, batch_size: int, prompt_tokens: float | None = None) -> float:
        """A batch's end-to-end time without speculation: prefill and decode."""
        prompts = NativeFitStep.prefilling(self.batch_prompts(batch_size, prompt_tokens))
        return self.step().seconds(prompts) + (self.new_tokens - 1) * self.t_ar(batch_size, prompt_tokens)

    def speedup(self, alpha: float, draft: str, k: int, batch_size: int, prompt_tokens: float | None = None) -> float:
        """End to end, as measured: prefill, draft prefill and the decode steps of the slowest row."""
        prompts = NativeFitStep.prefilling(self.batch_prompts(batch_size, prompt_tokens))
        speculative = self.step(draft).seconds(prompts) \
            + self.speculative_steps(alpha, draft, k, batch_size) * self.step_time(draft, k, batch_size, prompt_tokens)
        return self.ar_seconds(batch_size, prompt_tokens) / speculative

    def tokens_per_s(self, batch_size: int, prompt_tokens: float | None = None) -> float:
        return batch_size * self.new_tokens / self.ar_seconds(batch_size, prompt_tokens)


@dataclass
class ServedCostModel(CostModel):
    """A served engine's model (see the module docstring): `iteration_extra` is the draft's part of
    a speculative iteration, linear in B, K and B x K."""

    iteration_extra: dict[str, LinearTime] = field(default_factory=dict)  # draft -> its part of an iteration
    ttft: LinearTime | None = None

    def step_time(self, draft: str, k: int, batch_size: int, prompt_tokens: float | None = None) -> float:
        extra = self.iteration_extra.get(base_draft(draft))
        if extra is None:
            return float("nan")
        added = float(extra.seconds(_draft_features(float(k), float(batch_size))))
        return self.t_verify(batch_size, k + 1, prompt_tokens) + added

    def decode_speedup(self, alpha: float, draft: str, k: int, batch_size: int,
                       prompt_tokens: float | None = None) -> float:
        return float(expected_tau(alpha, k)) * self.t_ar(batch_size, prompt_tokens) / \
            self.step_time(draft, k, batch_size, prompt_tokens)

    def _contexts(self, batch_size: int, prompt_tokens: float | None) -> np.ndarray:
        mean = prompt_tokens if prompt_tokens else self.prompt_tokens()  # paged attention reads each row's own
        return mean + np.linspace(0, max(self.new_tokens - 1, 0), DECODE_SAMPLES)

    def _ttft(self, batch_size: int) -> float:
        return float(self.ttft.seconds({"fixed": 1.0, "rows": float(batch_size)})) if self.ttft else 0.0

    def ar_seconds(self, batch_size: int, prompt_tokens: float | None = None) -> float:
        return self._ttft(batch_size) + (self.new_tokens - 1) * self.t_ar(batch_size, prompt_tokens)

    def speedup(self, alpha: float, draft: str, k: int, batch_size: int, prompt_tokens: float | None = None) -> float:
        """Per request, TTFT plus its decode steps: e2e time, which sets closed-loop throughput."""
        speculative = self._ttft(batch_size) + (self.new_tokens - 1) * \
            self.step_time(draft, k, batch_size, prompt_tokens) / float(expected_tau(alpha, k))
        return self.ar_seconds(batch_size, prompt_tokens) / speculative


def _draft_features(k, rows) -> dict:
    """A served draft's part of an iteration: fixed, per row, per drafted token, per row and token."""
    k, rows = np.asarray(k, float), np.asarray(rows, float)
    return {"fixed": np.ones_like(k * rows), "rows": rows, "drafted": k, "drafted_rows": k * rows}


def _served_models(cells: pd.DataFrame, requests: pd.DataFrame, meta: dict) -> dict:
    """ServedCostModels per traffic group from cells without steps (TPOT and τ)."""
    target_arch, _ = architectures(meta, cells)
    if target_arch is None:
        return {}
    dtype = run_dtype(cells)
    bandwidth, flops = device_priors(meta, dtype)
    ar = cells[(cells["mode"] == AR) & cells["tpot_p50_s"].notna()]
    if ar.empty:
        return {}
    context = ar["prompt_tokens_mean"] + ar["max_new_tokens"] / 2
    points = pd.DataFrame({"rows": ar["batch_size"], "positions": 1, "context": context, "seconds": ar["tpot_p50_s"]})
    target = fit_forward_time(points, target_arch, bandwidth, flops)
    times = StepTimes(target, {}, None, {})
    extra = {}
    speculative = cells[(cells["mode"] != AR) & cells["tpot_p50_s"].notna() & cells["tau"].notna()]
    for draft, mine in speculative.groupby("draft"):
        iteration = mine["tpot_p50_s"] * mine["tau"]
        context = mine["prompt_tokens_mean"] + mine["max_new_tokens"] / 2
        verify = target.seconds(mine["batch_size"], mine["k"].astype(float) + 1, context)
        added = np.maximum((iteration - verify).to_numpy(float), 1e-6)
        extra[base_draft(draft)] = LinearTime.fit(
            _draft_features(mine["k"].to_numpy(float), mine["batch_size"].to_numpy(float)), added)
    ttft = LinearTime.fit({"fixed": np.ones(len(ar)), "rows": ar["batch_size"].to_numpy(float)},
                          ar["ttft_p50_s"].to_numpy(float)) if ar["ttft_p50_s"].notna().all() else None
    models = {}
    for key, group in with_context(cells).groupby(TRAFFIC):
        prompts = requests[requests["cell_id"].isin(group["cell_id"])]["prompt_tokens"].to_numpy(float) \
            if not requests.empty else group["prompt_tokens_mean"].to_numpy(float)
        models[key] = ServedCostModel(times, prompts, int(group["max_new_tokens"].max()), {},
                                      sorted(group["batch_size"].unique().astype(int).tolist()),
                                      _measured_ks(group), extra, ttft)
    return models


def _measured_ks(cells: pd.DataFrame) -> dict[str, list[int]]:
    speculative = cells[cells["mode"] != AR]
    return {draft: sorted(mine["k"].astype(int).unique().tolist()) for draft, mine in speculative.groupby("draft")}


def cost_models(cells: pd.DataFrame, steps: pd.DataFrame, requests: pd.DataFrame, meta: dict,
                times: StepTimes | None = None) -> dict:
    """One CostModel per (workload, temperature, context length) of a run's finished closed-loop
    cells; synthetic cells count as their own drafts (`draft α=0.8`). Given `times` (step times
    fitted on other cells), the native groups use those and take only their traffic (prompts,
    coverage) from these cells; served groups are left out."""
    raw = with_context(ok_closed_loop(cells))
    cells = label_synthetic(raw)
    if cells.empty:
        return {}
    with_steps = set(steps["cell_id"]) if not steps.empty else set()
    served = cells[~cells["cell_id"].isin(with_steps)]
    if "engine" in served:
        served = served[served["engine"].fillna("native") != "native"]
    models: dict = {}
    if len(served) and times is None:
        models.update(_served_models(served, requests, meta))
    native = cells[cells["cell_id"].isin(with_steps)]
    if native.empty:
        return models
    times = times or fit_step_times(raw[raw["cell_id"].isin(native["cell_id"])], steps, requests, meta)
    if times is None:
        return models
    steps = steps[steps["cell_id"].isin(native["cell_id"])]
    speculative_rows = steps.merge(native[["cell_id", "draft", "mode"] + TRAFFIC], on="cell_id")
    speculative_rows = speculative_rows[speculative_rows["mode"] != AR]
    for key, group in native.groupby(TRAFFIC):
        baseline = group[group["mode"] == AR]
        if baseline.empty:
            continue
        prompts = requests[requests["cell_id"].isin(baseline["cell_id"])].drop_duplicates(
            ["cell_id", "repeat", "batch_index", "request_id"])["prompt_tokens"].to_numpy(float)
        mine = speculative_rows[(speculative_rows[TRAFFIC] == pd.Series(key, index=TRAFFIC)).all(axis=1)]
        coverage = {d: float((g["drafted"] > 0).mean()) for d, g in mine.groupby("draft")}
        models[key] = CostModel(times, prompts, int(group["max_new_tokens"].max()), coverage,
                                sorted(group["batch_size"].unique().astype(int).tolist()), _measured_ks(group))
    return models
