"""A native run's step times: the shapes, dtype and hardware it measured on, one row per decode step
it ran, and the roofline forward-time models fitted on them (`StepTimes`, `fit_step_times`)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from specbench.drafter_kinds import drafter_kind
from specbench.fit.cells import TRAFFIC, base_draft, ok_closed_loop, with_context
from specbench.fit.prefill_times import fit_prefills
from specbench.fit.roofline import (
    DEVICES, Architecture, ForwardProfile, ForwardTimeModel, device_key, fit_forward_time, peak_flops,
)
from specbench.models import model_family, parse_draft_spec
from specbench.results import recorded_config
from specbench.schema import AR
from specbench.shapes import recorded_shapes
from specbench.synthetic import shipped_config

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
    name = recorded_config(meta)["grid"].get("target", "")
    try:
        alias, config = shipped_config(name)
    except Exception:
        return None, {}
    target = Architecture.from_config(config, dtype)
    family = model_family(alias)
    drafts = {}
    for label in recorded_config(meta)["grid"].get("drafts", []):
        try:
            spec = parse_draft_spec(label)
            if drafter_kind(spec.kind).separate_model:
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


@dataclass
class SearchTime(LinearTime):
    """A draft without a model (n-gram search, a layer subset): one fitted time a step
    (`search_features`), whatever K's forwards."""

    def proposal_s(self, k: int, rows, context):
        return self.seconds(search_features(np.full(np.shape(context), rows), context, k))


def search_features(rows, context, k) -> dict[str, np.ndarray]:
    """A draft without a model (n-gram search, a layer subset): per step, per row, per row and
    cached token (the search scans the context), and per drafted token."""
    rows, context, k = (np.asarray(x, float) for x in (rows, context, k))
    return {"fixed": np.ones_like(rows), "rows": rows, "row_context": rows * context, "drafted": rows * k}


@dataclass
class StepTimes:
    """A run's hardware and models as forward times: fitted once, shared by every traffic group."""

    # each a forward-time model (a fitted roofline, or the kernel tables corrected by the run:
    # calibration.TableForward), read through seconds(rows, positions, context); a draft's also
    # through proposal_s (its K proposals: a model's forwards, or a search's fitted time, SearchTime)
    # and a prefill's through batch_prefill_s
    target: ForwardTimeModel
    drafts: dict[str, ForwardTimeModel | SearchTime]
    prefill: ForwardTimeModel | None
    draft_prefill: dict[str, ForwardTimeModel]

    def target_s(self, rows, positions, context) -> np.ndarray:
        return self.target.seconds(rows, positions, context)

    def draft_s(self, draft: str, k: int, rows, context) -> np.ndarray:
        """Proposing K tokens for `rows` rows at `context` (a whole draft step)."""
        model = self.drafts.get(base_draft(draft))
        if model is None:
            return np.full(np.shape(context), np.nan)
        return model.proposal_s(k, rows, context)

    @staticmethod
    def _prefill(model: ForwardTimeModel | None, lengths) -> float:
        return 0.0 if model is None else float(model.batch_prefill_s(lengths))

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
            drafts[draft] = SearchTime.fit(search_features(points["rows"], points["context"], points["k"]),
                                           points["seconds"].to_numpy())
    prefill, draft_prefill = fit_prefills(cells, requests, target_arch, draft_archs, (bandwidth, flops))
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
