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
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from specbench.fit.acceptance import alpha_table, expected_max_normal, expected_tau, tokens_per_step_moments
from specbench.fit.cells import TRAFFIC, base_draft, closed_loop, label_synthetic, ok_closed_loop, with_context
from specbench.fit.prices import cost_per_million
from specbench.fit.roofline import (
    DEVICES, Architecture, ForwardProfile, ForwardTimeModel, device_key, fit_forward_time, peak_flops,
)
from specbench.models import lookup_alias, parse_draft_spec
from specbench.schema import AR
from specbench.shapes import prefill_groups, recorded_shapes
from specbench.synthetic import shipped_config

DECODE_SAMPLES = 16  # points of the decode at which step times are averaged (the context grows)
MIN_STEPS = 3  # forwards a (cell, positions) median needs to be a point of the fit


# --- what the run measured on ---------------------------------------------------------------------

def architectures(meta: dict, cells: pd.DataFrame) -> tuple[Architecture | None, dict[str, Architecture]]:
    """The target's and each model draft's shapes: recorded in run.json by newer sweeps, else from
    the shipped config of a registry alias."""
    recorded = meta.get("architectures") or {}
    if recorded.get("target"):
        target = Architecture.from_dict(recorded["target"])
        drafts = {label: Architecture.from_dict(values) for label, values in (recorded.get("drafts") or {}).items()}
        return target, drafts
    dtype = run_dtype(cells)
    name = (meta.get("config") or {}).get("target", "")
    try:
        alias, config = shipped_config(name)
    except Exception:
        return None, {}
    target = Architecture.from_config(config, dtype)
    family = lookup_alias(alias).family
    drafts = {}
    for label in (meta.get("config") or {}).get("drafts", []):
        try:
            spec = parse_draft_spec(label)
            if spec.kind == "model":
                drafts[label] = Architecture.from_config(shipped_config(spec.model, family)[1], spec.dtype or dtype)
        except Exception:
            continue
    return target, drafts


def run_dtype(cells: pd.DataFrame) -> str:
    """The target's dtype as the cells recorded it (bfloat16 where they did not)."""
    return str(cells["dtype"].dropna().iloc[0]) if "dtype" in cells and cells["dtype"].notna().any() else "bfloat16"


def device_priors(meta: dict, dtype: str) -> tuple[float | None, float | None]:
    """(bandwidth, flop rate) the fit is pulled towards: the sweep's measured copy bandwidth and
    matrix-multiply rate, else the datasheet of a known GPU."""
    hardware = meta.get("hardware") or {}
    bandwidth = hardware.get("copy_bandwidth_bytes_per_s")
    # the rate in this dtype where the sweep measured it; else the one it measured (another dtype's
    # rate is a better prior than none)
    flops = (hardware.get("matmul_flops_per_s_by_dtype") or {}).get(dtype) or hardware.get("matmul_flops_per_s")
    gpus = hardware.get("gpus") or []
    key = device_key(gpus[0]["name"]) if gpus else None
    if key and not flops:
        flops = peak_flops(key, dtype)
    if key and not bandwidth:
        bandwidth = DEVICES[key]["bandwidth"]
    good = lambda value: float(value) if value and math.isfinite(float(value)) and value > 0 else None  # noqa: E731
    return good(bandwidth), good(flops)


def forward_table(cells: pd.DataFrame, steps: pd.DataFrame, requests: pd.DataFrame) -> pd.DataFrame:
    """One row per decode step of the native engine: rows, positions verified, the longest row's
    cached tokens (`context`), target seconds (verify + bookkeeping) and draft seconds."""
    if steps.empty or requests.empty:
        return pd.DataFrame()
    keys = ["cell_id", "repeat", "batch_index", "request_id"]
    steps = steps.sort_values(keys + ["step"])
    before = steps.groupby(keys, sort=False)["emitted"].cumsum() - steps["emitted"]
    prompts = requests.drop_duplicates(keys).set_index(keys)["prompt_tokens"]
    cached = prompts.reindex(pd.MultiIndex.from_frame(steps[keys])).to_numpy() + before.to_numpy()
    steps = steps.assign(cached=cached)
    table = steps.groupby(["cell_id", "repeat", "batch_index", "step"], sort=False).agg(
        rows=("batch_rows", "first"), positions=("verify_tokens", "first"), context=("cached", "max"),
        verify_s=("verify_s", "first"), overhead_s=("overhead_s", "first"), draft_s=("draft_s", "first"),
        drafted=("drafted", "max")).reset_index()
    table["target_s"] = table["verify_s"] + table["overhead_s"].fillna(0.0)
    columns = ["cell_id", "mode", "draft", "k", "batch_size"] + TRAFFIC
    return table.merge(with_context(cells)[columns], on="cell_id")


# --- fitted times --------------------------------------------------------------------------------

@dataclass
class LinearTime:
    """seconds = coefficients . features, non-negative, fitted on relative errors."""

    names: tuple[str, ...]
    coefficients: tuple[float, ...]

    @classmethod
    def fit(cls, features: dict[str, np.ndarray], seconds: np.ndarray) -> "LinearTime":
        matrix = np.stack([np.asarray(v, float) for v in features.values()], axis=1)
        seconds = np.asarray(seconds, float)
        coefficients, _ = nnls(matrix / seconds[:, None], np.ones_like(seconds))
        return cls(tuple(features), tuple(float(c) for c in coefficients))

    def seconds(self, features: dict[str, np.ndarray]) -> np.ndarray:
        return sum(c * np.asarray(features[name], float) for name, c in zip(self.names, self.coefficients))


def search_features(rows, context, k) -> dict[str, np.ndarray]:
    """A draft without a model (n-gram search, a layer subset): per step, per row, per row and
    cached token (the search scans the context), and per drafted token."""
    rows, context, k = (np.asarray(x, float) for x in (rows, context, k))
    return {"fixed": np.ones_like(rows), "rows": rows, "row_context": rows * context, "drafted": rows * k}


@dataclass
class StepTimes:
    """A run's hardware and models as forward times: fitted once, shared by every traffic group."""

    target: ForwardTimeModel
    drafts: dict[str, ForwardTimeModel | LinearTime]  # model drafts: per-token forward; others: per step
    prefill: ForwardTimeModel | None
    draft_prefill: dict[str, ForwardTimeModel]

    def target_s(self, rows, positions, context) -> np.ndarray:
        return self.target.seconds(rows, positions, context)

    def draft_s(self, draft: str, k: int, rows, context) -> np.ndarray:
        """Proposing K tokens for `rows` rows at `context` (a whole draft step)."""
        model = self.drafts.get(base_draft(draft))
        if model is None:
            return np.full(np.shape(context), np.nan)
        if isinstance(model, LinearTime):  # a search (n-gram): per step, not per token
            return model.seconds(search_features(np.full(np.shape(context), rows), context, k))
        return k * model.seconds(rows, 1, context)  # a model: a roofline, or corrected kernel tables

    @staticmethod
    def _prefill(model: ForwardTimeModel | None, lengths) -> float:
        if model is None:
            return 0.0
        if hasattr(model, "batch_prefill_s"):  # corrected tables: corrected as they were fitted, by the batch
            return float(model.batch_prefill_s(lengths))
        return float(sum(model.seconds(rows, positions, 0) for rows, positions in prefill_forwards(lengths)))

    def prefill_s(self, lengths) -> float:
        """The target's prefill of a batch with these prompt lengths."""
        return self._prefill(self.prefill, lengths)

    def draft_prefill_s(self, draft: str, lengths) -> float:
        return self._prefill(self.draft_prefill.get(base_draft(draft)), lengths)

    def on_device(self, measured: tuple[float, float], target: tuple[float, float]) -> "StepTimes":
        drafts = {d: m.on_device(measured, target) if isinstance(m, ForwardTimeModel) else m for d, m in self.drafts.items()}
        return StepTimes(self.target.on_device(measured, target), drafts,
                         self.prefill.on_device(measured, target) if self.prefill else None,
                         {d: m.on_device(measured, target) for d, m in self.draft_prefill.items()})

    def on_datasheet(self, measured: str, device: str) -> "StepTimes":
        """Carried from the GPU `measured` (a `DEVICES` key) to `device` by their datasheet bandwidth and
        FLOP/s at the run's dtype, the fitted efficiencies kept: what `plan RUN --device GPU` prices."""
        dtype = "float32" if self.target.architecture.bytes_per_parameter >= 4 else "bfloat16"
        peaks = lambda key: (DEVICES[key]["bandwidth"], peak_flops(key, dtype))  # noqa: E731
        return self.on_device(peaks(measured), peaks(device))


def _points(frame: pd.DataFrame, seconds: str, by: list[str]) -> pd.DataFrame:
    """Medians per group of forwards (with how many each stands for)."""
    grouped = frame.groupby(by).agg(rows=("rows", "first"), context=("context", "median"),
                                    seconds=(seconds, "median"), k=("k", "first"), weight=(seconds, "size"),
                                    temperature=("temperature", "first"))
    if "positions" not in by:
        grouped["positions"] = frame.groupby(by)["positions"].first()
    grouped = grouped.reset_index()
    return grouped[grouped["weight"] >= MIN_STEPS]


def fit_step_times(cells: pd.DataFrame, steps: pd.DataFrame, requests: pd.DataFrame, meta: dict) -> StepTimes | None:
    """The forward-time models of a native run's finished closed-loop cells; None without the
    target's shapes or steps."""
    cells = ok_closed_loop(cells)
    target_arch, draft_archs = architectures(meta, cells)
    forwards = forward_table(cells, steps, requests)
    if target_arch is None or forwards.empty:
        return None
    full = forwards[forwards["rows"] == forwards["batch_size"]]
    # CUDA-graph steps attend over whole length buckets (the engine's length quantum)
    graphs = "cuda_graphs" in cells and cells["cuda_graphs"].fillna(False).astype(bool).any()
    shapes = recorded_shapes(meta)
    quantum = int(shapes["length_quantum"]) if graphs else 1
    dtype = run_dtype(cells)
    bandwidth, flops = device_priors(meta, dtype)
    target_points = _points(full, "target_s", ["cell_id", "positions"])
    if target_points.empty:
        return None
    small, shared = small_rows(cells, meta)
    profiles = meta.get("profiles") or {}
    target = fit_forward_time(target_points, target_arch, bandwidth, flops, quantum, small, shared,
                              ForwardProfile.from_dict(profiles.get("target")))
    drafts: dict = {}
    drafting = full[(full["mode"] != AR) & (full["drafted"] > 0)]
    for draft, mine in drafting.groupby("draft"):
        points = _points(mine.assign(positions=1), "draft_s", ["cell_id"])
        if points.empty:
            continue
        if draft in draft_archs:
            per_token = points.assign(seconds=points["seconds"] / points["k"])
            draft_dtype = "bfloat16" if draft_archs[draft].bytes_per_parameter == 2 else "float32"
            drafts[draft] = fit_forward_time(per_token, draft_archs[draft], bandwidth,
                                             device_priors(meta, draft_dtype)[1], quantum, small, shared,
                                             ForwardProfile.from_dict((profiles.get("drafts") or {}).get(draft)))
        else:
            drafts[draft] = LinearTime.fit(search_features(points["rows"], points["context"], points["k"]),
                                           points["seconds"].to_numpy())
    prefill, draft_prefill = _fit_prefills(cells, requests, target_arch, draft_archs, (bandwidth, flops))
    return StepTimes(target, drafts, prefill, draft_prefill)


def step_time_notes(times: StepTimes | None) -> list[str]:
    """What the forward times rest on (a profile measured at the sweep's start, or the roofline
    alone) and which forwards the fit left out, one line each."""
    if times is None:
        return []
    models = {"target": times.target} | {d: m for d, m in times.drafts.items() if isinstance(m, ForwardTimeModel)}
    profiled = [f"{name} {int(m.profile.tokens[0])}–{int(m.profile.tokens[-1])} rows, weighted ×{m.profile_scale:.2f}"
                for name, m in models.items() if m.profile is not None]
    unused = [name for name, m in models.items() if m.profile is not None and m.profile_scale < 0.05]
    lines = [f"step times: from each model's forward profiled at the sweep's start ({'; '.join(profiled)}), "
             f"plus fitted per-step, per-row and KV terms (the weight: how much of the profiled time the fit keeps, "
             f"1 = all of it" + (f"; near 0 for {', '.join(unused)}: its steps' own per-step and per-row terms "
                                 f"explain its forwards, and the profile adds nothing" if unused else "") + ")"
             if profiled else
             "step times: the roofline alone (the run has no forward profile: CUDA graphs, a layer-scaled model, "
             "a served engine or an older sweep)"]
    left_out = [label for m in models.values() for label in m.left_out]
    if left_out:
        lines.append(f"left out of the step-time fit, slower than most forwards that did more work (another code "
                     f"path or a hiccup, not the hardware): {', '.join(left_out)}")
    return lines


def small_rows(cells: pd.DataFrame, meta: dict) -> tuple[int, bool]:
    """(rows x positions up to which the native engine's products run other kernels, whether those
    forwards scale like the others): matrix-vector at one row on a GPU (apart); on a CPU dense
    weights up to the crossover the sweep measured, chosen only where faster (alike), or in runs
    from before it was measured up to the engine's dense row limit, however slow (apart)."""
    devices = cells["device"].dropna().astype(str) if "device" in cells else pd.Series(dtype=str)
    if not devices.empty and not devices.str.startswith("cpu").any():
        return 1, False
    measured = (meta.get("hardware") or {}).get("dense_max_rows")
    return (int(measured), True) if measured is not None else (int(recorded_shapes(meta)["dense_max_rows"]), False)


def prefill_forwards(lengths) -> list[tuple[int, int]]:
    """(rows, positions) of each forward a batch's prefill runs: rows ordered by length and
    grouped as the native engine groups them (`prefill_groups`), each group padded to its longest."""
    ordered = sorted(int(x) for x in lengths)
    return [(len(ordered[g]), max(ordered[g])) for g in prefill_groups(ordered)]


def _prefill_points(batches: list[tuple[object, list[int], float]]) -> pd.DataFrame:
    """Fit points of prefills: (measurement id, the batch's prompt lengths, seconds)."""
    rows = [{"measurement": key, "rows": r, "positions": p, "context": 0.0, "seconds": seconds}
            for key, lengths, seconds in batches for r, p in prefill_forwards(lengths)]
    return pd.DataFrame(rows)


def measured_prefills(cells: pd.DataFrame, requests: pd.DataFrame) -> list[tuple[object, list[int], float]]:
    """Every measured batch of these cells: (its key, its prompt lengths, its prefill's seconds, which
    end with its first token)."""
    mine = requests[requests["cell_id"].isin(cells["cell_id"])]
    return [(key, group["prompt_tokens"].tolist(), float(group["ttft_s"].min()))
            for key, group in mine.groupby(["cell_id", "repeat", "batch_index"]) if group["ttft_s"].notna().all()]


def measured_draft_prefills(cells: pd.DataFrame, requests: pd.DataFrame,
                            drafts) -> dict[str, list[tuple[object, list[int], float]]]:
    """Each of `drafts`' measured prefills: a cell's draft prefill (the median of its batches) with
    its first batch's prompt lengths, as `measured_prefills` gives the target's."""
    if requests.empty or "draft_prefill_s" not in cells:
        return {}
    mine = requests[requests["cell_id"].isin(cells["cell_id"])]
    first = mine[(mine["repeat"] == 0) & (mine["batch_index"] == 0)].groupby("cell_id")["prompt_tokens"].apply(list)
    found: dict[str, list] = {}
    for row in cells[(cells["mode"] != AR) & cells["draft"].isin(list(drafts))].itertuples():
        if row.cell_id in first.index and row.draft_prefill_s > 0:
            found.setdefault(row.draft, []).append((row.cell_id, first[row.cell_id], float(row.draft_prefill_s)))
    return found


def _fit_prefills(cells: pd.DataFrame, requests: pd.DataFrame, target: Architecture, drafts: dict[str, Architecture],
                  priors: tuple[float | None, float | None]) -> tuple[ForwardTimeModel | None, dict]:
    """The target's prefill from every measured batch (its first token's time is the prefill's
    end), the drafts' from each cell's median draft prefill and its first batch's prompts."""
    if requests.empty:
        return None, {}
    points = _prefill_points(measured_prefills(cells, requests))
    prefill = fit_forward_time(points, target, *priors) if not points.empty else None
    draft_prefill = {}
    for draft, batches in measured_draft_prefills(cells, requests, drafts).items():
        points = _prefill_points(batches)
        if not points.empty:
            draft_prefill[draft] = fit_forward_time(points, drafts[draft], *priors)
    return prefill, draft_prefill


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

    def t_ar(self, batch_size: int, prompt_tokens: float | None = None) -> float:
        return float(np.mean(self.times.target_s(batch_size, 1, self._contexts(batch_size, prompt_tokens))))

    def t_verify(self, batch_size: int, positions: int, prompt_tokens: float | None = None) -> float:
        return float(np.mean(self.times.target_s(batch_size, positions, self._contexts(batch_size, prompt_tokens))))

    def t_draft(self, draft: str, k: int, batch_size: int, prompt_tokens: float | None = None) -> float:
        return float(np.mean(self.times.draft_s(draft, k, batch_size, self._contexts(batch_size, prompt_tokens))))

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
        prompts = self.batch_prompts(batch_size, prompt_tokens)
        return self.times.prefill_s(prompts) + (self.new_tokens - 1) * self.t_ar(batch_size, prompt_tokens)

    def speedup(self, alpha: float, draft: str, k: int, batch_size: int, prompt_tokens: float | None = None) -> float:
        """End to end, as measured: prefill, draft prefill and the decode steps of the slowest row."""
        prompts = self.batch_prompts(batch_size, prompt_tokens)
        speculative = self.times.prefill_s(prompts) + self.times.draft_prefill_s(draft, prompts) \
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


def model_alphas(cells: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """α per (draft, traffic) for the model, synthetic cells included as their own drafts."""
    return alpha_table(cells, steps, include_synthetic=True)


def _alpha(alphas: pd.DataFrame, draft: str, key: tuple) -> float | None:
    if alphas.empty:
        return None
    match = alphas[(alphas["draft"] == draft) & (alphas[TRAFFIC] == pd.Series(key, index=TRAFFIC)).all(axis=1)]
    if match.empty or not np.isfinite(match["alpha_iid"].iloc[0]):
        return None
    return float(match["alpha_iid"].iloc[0])


def predictions(cells: pd.DataFrame, steps: pd.DataFrame, requests: pd.DataFrame, meta: dict,
                alphas: pd.DataFrame | None = None) -> pd.DataFrame:
    """Every ok speculative cell with its predicted τ and speed-up next to the measured ones
    (in-sample: the model was fitted on these cells)."""
    models = cost_models(cells, steps, requests, meta)
    alphas = model_alphas(cells, steps) if alphas is None else alphas
    return _predict_cells(with_context(label_synthetic(closed_loop(cells[cells["status"] == "ok"]))), models, alphas)


def _predict_cells(cells: pd.DataFrame, models: dict, alphas: pd.DataFrame, fitted_context: int | None = None
                   ) -> pd.DataFrame:
    """Each speculative cell's predicted τ and speed-up next to the measured ones: from the model
    of its own traffic group or, given `fitted_context`, from that context length's model at the
    cell's own prompt length."""
    rows = []
    for row in cells.to_dict("records"):
        if row["mode"] == AR or not np.isfinite(row.get("speedup", np.nan)):
            continue
        key = (row["workload"], row["temperature"], row["context_length"] if fitted_context is None else fitted_context)
        model, alpha = models.get(key), _alpha(alphas, row["draft"], key)
        if model is None or alpha is None:
            continue
        k, b = int(row["k"]), int(row["batch_size"])
        prompt = None if fitted_context is None else float(row["prompt_tokens_mean"])
        predicted = model.speedup(alpha, row["draft"], k, b, prompt)
        if not np.isfinite(predicted):
            continue
        rows.append({
            "cell_id": row["cell_id"], "draft": row["draft"], "workload": row["workload"],
            "temperature": row["temperature"], "context_length": row["context_length"], "k": k, "batch_size": b,
            "tau_measured": row.get("tau", np.nan), "tau_predicted": float(expected_tau(alpha, k)),
            "speedup_measured": row["speedup"], "speedup_predicted": predicted,
            "speedup_decode_predicted": model.decode_speedup(alpha, row["draft"], k, b, prompt),
            "speedup_error": predicted / row["speedup"] - 1 if row["speedup"] else float("nan"),
        })
    return pd.DataFrame(rows)


# --- how far a prediction can be trusted: the largest batch sizes held out -----------------------

MIN_BATCH_SIZES_FOR_HOLDOUT = 3


def _finished(cells: pd.DataFrame) -> pd.DataFrame:
    return with_context(closed_loop(cells[cells["status"] == "ok"])) if not cells.empty else cells


def _predict_held_out(cells: pd.DataFrame, steps: pd.DataFrame, requests: pd.DataFrame, meta: dict,
                      train_ids: set, tested: pd.DataFrame, fitted_context: int | None = None,
                      step_times=None) -> pd.DataFrame:
    """Fit the whole model (step times, α, coverage) on the `train_ids` cells only, predict `tested`.
    `speedup_error_at_traffic`: the error of the step-time model alone, fitted on the same cells
    but given the tested cells' own traffic (their α, coverage and prompts): what is left of the
    error when the smaller sizes' prompts are not the larger sizes' (native runs). `step_times`,
    a callable of the training cells, steps and requests, gives the step times instead of the
    roofline fit (the kernel tables corrected on them: `calibration.held_out_on_tables`)."""
    pick = lambda frame, ids: frame[frame["cell_id"].isin(ids)] if not frame.empty else frame  # noqa: E731
    train = [pick(frame, train_ids) for frame in (cells, steps, requests)]
    models = cost_models(*train, meta, times=step_times(*train) if step_times is not None else None)
    predicted = _predict_cells(label_synthetic(tested), models, model_alphas(train[0], train[1]), fitted_context)
    native = [model.times for model in models.values() if not isinstance(model, ServedCostModel)]
    times = native[0] if native and fitted_context is None else None
    if predicted.empty or times is None:
        return predicted
    own = [pick(frame, set(tested["cell_id"])) for frame in (cells, steps, requests)]
    at_traffic = _predict_cells(label_synthetic(tested), cost_models(*own, meta, times=times),
                                model_alphas(own[0], own[1]))
    if at_traffic.empty:
        return predicted
    return predicted.merge(at_traffic.set_index("cell_id")["speedup_error"].rename("speedup_error_at_traffic"),
                           left_on="cell_id", right_index=True, how="left")


def _with_side(table: pd.DataFrame) -> pd.DataFrame:
    """`same_side`: predicted and measured on the same side of 1x (the rollout question)."""
    if not table.empty:
        table["same_side"] = (table["speedup_predicted"] >= 1) == (table["speedup_measured"] >= 1)
    return table


def held_out(cells: pd.DataFrame, steps: pd.DataFrame, requests: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """Leave-largest-out: for each measured batch size with at least two smaller ones, fit the
    whole model on the smaller sizes only and predict every speculative cell at that size. Columns
    as `predictions`, plus `held_out_batch_size`, `trained_on` and `same_side`."""
    ok = _finished(cells)
    if ok.empty:
        return pd.DataFrame()
    sizes = sorted(ok["batch_size"].unique().astype(int).tolist())
    frames = []
    for index, size in enumerate(sizes[MIN_BATCH_SIZES_FOR_HOLDOUT - 1:], start=MIN_BATCH_SIZES_FOR_HOLDOUT - 1):
        predicted = _predict_held_out(cells, steps, requests, meta, set(ok[ok["batch_size"] < size]["cell_id"]),
                                      ok[ok["batch_size"] == size])
        if not predicted.empty:
            frames.append(predicted.assign(held_out_batch_size=size,
                                           trained_on=",".join(str(s) for s in sizes[:index])))
    return _with_side(pd.concat(frames, ignore_index=True)) if frames else pd.DataFrame()


def held_out_context(cells: pd.DataFrame, steps: pd.DataFrame, requests: pd.DataFrame, meta: dict) -> pd.DataFrame:
    """Leave-longest-context-out, for runs with two or more context lengths: fit on the shorter
    ones, predict every speculative cell at the longest from its prompt length alone, with the α
    fitted at the next shorter length (what `plan --context-lengths` does)."""
    ok = _finished(cells)
    contexts = sorted(c for c in ok["context_length"].unique() if c > 0) if not ok.empty else []
    if len(contexts) < 2:
        return pd.DataFrame()
    longest = contexts[-1]
    predicted = _predict_held_out(cells, steps, requests, meta, set(ok[ok["context_length"] < longest]["cell_id"]),
                                  ok[ok["context_length"] == longest], fitted_context=contexts[-2])
    return _with_side(predicted.assign(trained_on=",".join(str(c) for c in contexts[:-1]))) \
        if not predicted.empty else predicted


def _summary_line(what: str, group: pd.DataFrame) -> str:
    errors = group["speedup_error"].abs()
    line = (f"{what}: median |error| {errors.median() * 100:.1f}% (max {errors.max() * 100:.0f}%), same side of 1× "
            f"in {int(group['same_side'].sum())}/{len(group)} cells")
    if "speedup_error_at_traffic" in group and group["speedup_error_at_traffic"].notna().any():
        line += (f"; step times alone (given those cells' own α and prompts) "
                 f"{group['speedup_error_at_traffic'].abs().median() * 100:.1f}%")
    return line


def held_out_summary(table: pd.DataFrame, context: pd.DataFrame | None = None) -> list[str]:
    """One line per held-out batch size (and context length): median |error| and how often the
    side of 1x was right."""
    lines = []
    if context is not None and not context.empty:
        lines.append(_summary_line(f"context {context['context_length'].iloc[0]} predicted from contexts "
                                   f"{context['trained_on'].iloc[0]}", context))
    for size, group in (table.groupby("held_out_batch_size") if not table.empty else []):
        lines.append(_summary_line(f"B={size} predicted from B={group['trained_on'].iloc[0]}", group))
    return lines


# --- what-if -------------------------------------------------------------------------------------

def with_output_tokens(models: dict, tokens: int) -> dict:
    """The models predicting requests of `tokens` output tokens each instead of the run's own."""
    from dataclasses import replace

    return {key: replace(model, new_tokens=tokens) for key, model in models.items()}


def attach_measured(table: pd.DataFrame, cells: pd.DataFrame) -> pd.DataFrame:
    """`speedup_measured` beside each prediction the run measured (same traffic, draft, K and batch
    size at the prompts as they were): a prediction is never shown alone where a measurement exists."""
    if table.empty:
        return table
    ok = with_context(cells[(cells["status"] == "ok") & (cells["mode"] != AR)]) if "mode" in cells else cells.iloc[0:0]
    ok = label_synthetic(closed_loop(ok)) if not ok.empty else ok  # `draft α=0.8`: as the α table names drafts
    measured = {(w, float(t), int(c), d, int(k), int(b)): float(sp) for w, t, c, d, k, b, sp in zip(
        ok.get("workload", []), ok.get("temperature", []), ok.get("context_length", []), ok.get("draft", []),
        ok.get("k", []), ok.get("batch_size", []), ok.get("speedup", []))}
    table = table.copy()
    table["speedup_measured"] = [
        1.0 if row.draft == AR and row.measured_b and not row.extrapolated_context else
        measured.get((row.workload, float(row.temperature), int(row.context_length), row.draft, int(row.k),
                      int(row.batch_size)), float("nan")) if not row.extrapolated_context else float("nan")
        for row in table.itertuples()]
    return table


def plan_table(models: dict, alphas: pd.DataFrame, drafts: list[str], ks: list[int], batch_sizes: list[int],
               price_per_hour: float | None = None, devices: int = 1,
               context_lengths: list[int] | None = None) -> pd.DataFrame:
    """Predicted speed-up, tokens/s and cost for every (traffic, draft, K, B), measured or not,
    with `extrapolated_b` / `extrapolated_k` marks outside the measured sizes and K. Given context
    lengths, every traffic group is predicted at those prompt lengths too (α as measured)."""
    rows = []
    for key, model in models.items():
        workload, temperature, measured_context = key
        measured = model.measured_batch_sizes
        prompts = [(measured_context, None)] + [(c, float(c)) for c in (context_lengths or []) if c != measured_context]
        for context_label, prompt_tokens in prompts:
            for b in batch_sizes:
                ar_tokens_per_s = model.tokens_per_s(b, prompt_tokens)
                outside_b = not (measured and measured[0] <= b <= measured[-1])
                common = {"workload": workload, "temperature": temperature, "context_length": context_label,
                          "batch_size": b, "measured_b": b in measured, "extrapolated_b": outside_b,
                          "interpolated_b": not outside_b and b not in measured,
                          "extrapolated_context": prompt_tokens is not None, "output_tokens": model.new_tokens}
                rows.append({**common, "draft": AR, "k": 0, "alpha_iid": float("nan"), "tau": 1.0, "speedup": 1.0,
                             "tokens_per_s": ar_tokens_per_s, "extrapolated_k": False})
                for draft in drafts:
                    alpha = _alpha(alphas, draft, key)
                    if alpha is None:
                        continue
                    known = model.ks_measured(draft)
                    for k in ks:
                        speedup = model.speedup(alpha, draft, k, b, prompt_tokens)
                        if not np.isfinite(speedup):
                            continue
                        rows.append({**common, "draft": draft, "k": k, "alpha_iid": alpha,
                                     "tau": float(expected_tau(alpha, k)), "speedup": speedup,
                                     "tokens_per_s": ar_tokens_per_s * speedup,
                                     "extrapolated_k": not (known and known[0] <= k <= known[-1])})
    table = pd.DataFrame(rows)
    if not table.empty:
        table["extrapolated"] = table["extrapolated_b"] | table["extrapolated_k"] | table["extrapolated_context"]
        table["cost_per_1m"] = cost_per_million(table["tokens_per_s"], price_per_hour, devices)
        table["predicted"] = True
    return table


def trust_lines(run, predicted: pd.DataFrame, validation: pd.DataFrame,
                by_context: pd.DataFrame | None = None) -> list[str]:
    """What a reader should know before trusting a prediction: the held-out error (the largest
    batch sizes predicted from the smaller ones, the whole model refitted), and the in-sample fit."""
    lines = []
    if by_context is not None and not by_context.empty:
        lines += ["held out: " + line for line in held_out_summary(pd.DataFrame(), by_context)]
    if validation is not None and not validation.empty:
        lines += ["held out: " + line for line in held_out_summary(validation)]
    else:
        sizes = closed_loop(run.cells[run.cells["status"] == "ok"])["batch_size"].nunique() if not run.cells.empty else 0
        lines.append(f"held out: not measured (needs {MIN_BATCH_SIZES_FOR_HOLDOUT} or more batch sizes; the run has "
                     f"{sizes}): predictions beyond the measured sizes are untested")
    lines += step_time_notes(fit_step_times(run.cells, run.steps, run.requests, run.meta)) if not run.steps.empty else []
    if not predicted.empty:
        errors = predicted["speedup_error"].abs()
        lines.append(f"in-sample (fitted on the same cells): median |error| {errors.median() * 100:.1f}%, "
                     f"max {errors.max() * 100:.0f}% over {len(predicted)} cells")
    return lines
