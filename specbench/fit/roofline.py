"""The time of one forward pass from the model's shapes and a few fitted efficiencies.

A forward of `rows` rows with `positions` new positions each, attending over `context` cache
columns, reads every weight once (shared by the batch) and each row's keys and values over its
context, and does 2 x parameters flops per position plus the attention's. Its time is about

    t = overhead + per_row * rows + per_position * positions + per_row_position * rows * positions
        + max(weight_bytes / bandwidth, linear_flops / flop_rate)
        + kv_cost * rows * context * kv_bytes_per_token + attention_cost * attention_flops

- `max(...)`: the weights' roofline. Decode at small batch reads the weights faster than it can
  use them (memory-bound, flat in the batch); past the ridge point (flop_rate / bandwidth flops per
  byte) the matrix products are compute-bound and the time grows with rows x positions.
- The attention terms stay outside the max: at decode widths (a few positions per row) attention
  reads each row's cache once whatever the weights do, so it adds to the step; its cost grows with
  batch x context, which is why long contexts keep decode memory-bound at large batches.
- `overhead` (kernel launches, the host's loop) and the per-row, per-position and
  per-row-position terms (sampling, acceptance, bookkeeping) are what a roofline leaves out.
  Forwards of very few rows x positions run other kernels (matrix-vector products on a GPU at one
  row; on a CPU the native engine's projections use dense weights up to three rows and
  oneDNN-packed ones from four): they are fitted apart, as an offset from the main model.

The coefficients are fitted by non-negative least squares on relative errors, with the ridge
point found by a one-dimensional search. Where the run's forwards do not decide a coefficient (all
of them memory-bound, say, so the flop rate is unseen), the device's measured copy bandwidth and
matrix-multiply rate decide it: each is a prior the fit is pulled towards, weakly, so that data
which do decide it win. Shapes come from the model's config (layers, heads, KV heads, dimensions,
dtype): Llama/Qwen/Mistral-style decoders. A mixture of experts' flops are its active parameters'
(each token's top-k experts) and its weight reads the experts a forward's rows x positions tokens
choose, routing taken as uniform (`Architecture.weights_read`): more of them the wider the forward.

Where the sweep measured the engine's bare forward at a range of row counts (`ForwardProfile`),
that curve replaces the `max(...)`: the device's own efficiency at each size (a CPU's products
get cheaper per row as they grow, which one flop rate cannot draw), scaled by a fitted factor.
The roofline is fitted beside it, for other devices. Forwards slower than most of those that did
more work (`slower_than_larger`) are left out of every fit.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
from scipy.optimize import nnls

from specbench.shapes import DTYPE_BYTES, Architecture  # noqa: F401  (the roofline's shapes)

# Datasheet peaks for `plan --device`: HBM bandwidth (bytes/s) and dense (no sparsity) tensor-core
# FLOP/s at bf16/fp16, and plain fp32 (no TF32). Sources: NVIDIA H100 Tensor Core GPU datasheet
# (SXM5: 3.35 TB/s, 989 TFLOPS bf16 dense, 67 TFLOPS fp32), H200 datasheet (4.8 TB/s, the same
# compute as H100 SXM), A100 datasheet (80GB SXM4: 2.039 TB/s, 312 TFLOPS bf16, 19.5 fp32), L40S
# datasheet (864 GB/s, 362 TFLOPS bf16 dense, 91.6 fp32).
DEVICES = {
    "h100": {"name": "NVIDIA H100 SXM", "bandwidth": 3.35e12, "bf16": 989e12, "fp32": 67e12},
    "h200": {"name": "NVIDIA H200 SXM", "bandwidth": 4.8e12, "bf16": 989e12, "fp32": 67e12},
    "a100": {"name": "NVIDIA A100 80GB SXM", "bandwidth": 2.039e12, "bf16": 312e12, "fp32": 19.5e12},
    "l40s": {"name": "NVIDIA L40S", "bandwidth": 0.864e12, "bf16": 362e12, "fp32": 91.6e12},
}

RIDGES = np.logspace(0, 5, 101)  # flops per byte searched for the ridge point
BANDWIDTH_PRIOR_WEIGHT = 1.0  # a 2x miss of the prior costs about as much as one point off by 50%
KV_PRIOR_WEIGHT = 0.3  # attention kernels stray further from the copy bandwidth than weight reads
WEIGHTS_COLUMN, KV_COLUMN, ATTENTION_COLUMN = 4, 5, 6
GROWTH_COLUMNS = (1, 2, 3)  # per row, per position, per row-position
HUBER, ROBUST_ROUNDS = 0.1, 3
GROWTH_PENALTY = 0.1  # a term that makes up half of every forward costs like one point off by 5%
PROFILE_PRIOR_WEIGHT = 0.1  # the steps may run slower than the bare forward (other work, a warmer cache): data decide
RIDGE_PRIOR_WEIGHT = 0.3  # per (ln ratio)^2: a 2x miss of the measured matmul rate costs as one point off by 38%


def device_key(name: str) -> str | None:
    """The DEVICES key of a GPU name ("NVIDIA H100 80GB HBM3" -> "h100"), or None."""
    compact = name.lower().replace(" ", "").replace("-", "")
    return next((key for key in DEVICES if key in compact), None)


def peak_flops(device: str, dtype: str) -> float:
    entry = DEVICES[device]
    return entry["fp32"] if DTYPE_BYTES.get(dtype, 2) >= 4 else entry["bf16"]


def visible_context(context, positions, quantum: int = 1):
    """Cache columns a forward attends over: the context and the new positions, rounded up to
    the engine's length quantum (fixed-shape CUDA-graph steps attend over whole buckets)."""
    columns = np.asarray(context, float) + np.asarray(positions, float)
    return np.ceil(columns / quantum) * quantum if quantum > 1 else columns


@dataclass(frozen=True)
class ForwardProfile:
    """The engine's bare forward measured at sweep start (`native.measure.forward_profile`): seconds
    of `tokens` rows of one new position over a short context. Its shape in the token count is the
    hardware's own efficiency curve (memory-bound and flat at first, then products that use the
    cores better as they grow), which a roofline with one flop rate draws as a straight line."""

    tokens: tuple[float, ...]
    seconds: tuple[float, ...]

    @classmethod
    def from_dict(cls, values: dict | None) -> "ForwardProfile | None":
        if not values or len(values.get("tokens") or []) < 2:
            return None
        pairs = sorted((float(t), float(s)) for t, s in zip(values["tokens"], values["seconds"]) if s > 0)
        return cls(tuple(t for t, _ in pairs), tuple(s for _, s in pairs)) if len(pairs) >= 2 else None

    def to_dict(self) -> dict:
        return {"tokens": list(self.tokens), "seconds": list(self.seconds)}

    def __call__(self, tokens) -> np.ndarray:
        """Interpolated; past the largest measured size, on at the last two sizes' rate per token
        (compute-bound products grow linearly)."""
        known, seconds = np.asarray(self.tokens), np.asarray(self.seconds)
        tokens = np.asarray(tokens, float)
        rate = max((seconds[-1] - seconds[-2]) / (known[-1] - known[-2]), 0.0)
        return np.where(tokens > known[-1], seconds[-1] + rate * (tokens - known[-1]),
                        np.interp(tokens, known, seconds))


@dataclass
class ForwardTimeModel:
    """Seconds of one forward (see the module docstring); `visible_context` is applied inside."""

    architecture: Architecture
    overhead_s: float
    per_row_s: float
    per_position_s: float  # per position verified, whatever the rows (the acceptance loop)
    per_row_position_s: float
    seconds_per_weight_byte: float  # 1 / effective bandwidth for the weights
    ridge: float  # flops per byte where the weights turn compute-bound: flop rate / bandwidth
    seconds_per_kv_byte: float
    seconds_per_attention_flop: float
    length_quantum: int = 1
    small_rows: int = 0  # up to this many rows x positions the products run other kernels ...
    small_offset_s: float = 0.0  # ... which cost this much more than the model says (or less) ...
    small_offset_per_position_s: float = 0.0  # ... and this much per row-position
    points: int = 0  # forwards (medians) it was fitted on
    profile: ForwardProfile | None = None  # measured: then the weights' term is profile_scale x profile(rows x positions)
    profile_scale: float = 0.0
    roofline: "ForwardTimeModel | None" = None  # the same forwards fitted without the profile: moves to other devices
    left_out: tuple[str, ...] = ()  # forwards slower than most that did more work (`slower_than_larger`)

    @property
    def bandwidth(self) -> float:
        return 1 / self.seconds_per_weight_byte if self.seconds_per_weight_byte > 0 else math.inf

    @property
    def flop_rate(self) -> float:
        return self.ridge * self.bandwidth

    def seconds(self, rows, positions, context):
        arch = self.architecture
        visible = visible_context(context, positions, self.length_quantum)
        m = np.asarray(rows, float) * np.asarray(positions, float)
        if self.profile is not None:
            weights = self.profile_scale * self.profile(m)
        else:
            weights = self.seconds_per_weight_byte * np.maximum(arch.weights_read(m),
                                                                arch.linear_flops(rows, positions) / self.ridge)
        offset = np.where(m <= self.small_rows, self.small_offset_s + self.small_offset_per_position_s * m, 0.0)
        return (self.overhead_s + offset + self.per_row_s * np.asarray(rows, float)
                + self.per_position_s * np.asarray(positions, float)
                + self.per_row_position_s * np.asarray(rows, float) * np.asarray(positions, float)
                + weights + self.seconds_per_kv_byte * arch.kv_bytes(rows, visible)
                + self.seconds_per_attention_flop * arch.attention_flops(rows, positions, visible))

    def proposal_s(self, k: int, rows, context):
        """A draft model's K proposals: K forwards of one position a row."""
        return k * self.seconds(rows, 1, context)

    def batch_prefill_s(self, lengths) -> float:
        """A batch's prefill: the forwards the native engine groups its prompts into (`prefill_forwards`)."""
        from specbench.fit.prefill_times import prefill_forwards

        return float(sum(self.seconds(rows, positions, 0) for rows, positions in prefill_forwards(lengths)))

    def bound(self, rows, positions, context) -> np.ndarray:
        """'memory' or 'compute': which side of the ridge the weights are on."""
        flops = self.architecture.linear_flops(rows, positions)
        weights = self.architecture.weights_read(np.asarray(rows, float) * np.asarray(positions, float))
        return np.where(flops / self.ridge > weights, "compute", "memory")

    def on_device(self, measured_peaks: tuple[float, float], target_peaks: tuple[float, float]) -> "ForwardTimeModel":
        """The same efficiencies (fitted / peak) on another device's peaks (bandwidth, flop rate):
        memory terms scale with bandwidth, compute terms with the flop rate, overheads stay. A
        profiled model moves its roofline fit (a profile is this device's only)."""
        if self.roofline is not None:
            return self.roofline.on_device(measured_peaks, target_peaks)
        bandwidth_ratio = target_peaks[0] / measured_peaks[0]
        flops_ratio = target_peaks[1] / measured_peaks[1]
        return replace(self, seconds_per_weight_byte=self.seconds_per_weight_byte / bandwidth_ratio,
                       ridge=self.ridge * flops_ratio / bandwidth_ratio,
                       seconds_per_kv_byte=self.seconds_per_kv_byte / bandwidth_ratio,
                       seconds_per_attention_flop=self.seconds_per_attention_flop / flops_ratio)


def fit_forward_time(points: pd.DataFrame, architecture: Architecture, bandwidth_prior: float | None = None,
                     flops_prior: float | None = None, length_quantum: int = 1, small_rows: int = 0,
                     small_shared: bool = False, profile: ForwardProfile | None = None) -> ForwardTimeModel:
    """Fit on forwards measured at (rows, positions, context) -> seconds, the columns of `points`.
    Optional columns: `weight` (how many forwards a point stands for) and `measurement` (points
    that share one are forwards timed together, their `seconds` the sum: a prefill in groups).

    Forwards of at most `small_rows` rows x positions run other kernels and get an offset of their
    own (a line in rows x positions through their residuals). Whether they also inform the main
    fit (their kernels scale like the others) or not (another regime: a CPU's dense small-M
    products at two rows can cost three times the packed ones at four) is decided by the data:
    with three or more row counts, the choice that better predicts the largest from the others;
    else `small_shared` (default: apart).

    Given the engine's measured `profile`, its curve is the weights' term (scaled by a fitted
    factor pulled towards 1) and the few-rows regimes need no offset: it measured them. Forwards
    `slower_than_larger` are left out (and named in `left_out`)."""
    odd = slower_than_larger(points, small_rows) if "measurement" not in points else np.zeros(len(points), bool)
    left_out = tuple(_label(row) for row in points[odd].to_dict("records"))
    points = points[~odd]
    roofline = _fit_roofline(points, architecture, bandwidth_prior, flops_prior, length_quantum, small_rows,
                             small_shared)
    if profile is None or "measurement" in points:
        return replace(roofline, left_out=left_out)
    # the roofline's own weight-read cost and ridge, for `bound` (the profile's curve replaces them in `seconds`)
    return replace(_fit(points, architecture, bandwidth_prior, flops_prior, length_quantum, profile),
                   seconds_per_weight_byte=roofline.seconds_per_weight_byte, ridge=roofline.ridge,
                   roofline=roofline, left_out=left_out)


def _fit_roofline(points: pd.DataFrame, architecture: Architecture, bandwidth_prior: float | None,
                  flops_prior: float | None, length_quantum: int, small_rows: int,
                  small_shared: bool) -> ForwardTimeModel:
    """The roofline fit, with the few-rows regime apart or shared (see `fit_forward_time`)."""
    m = points["rows"].to_numpy(float) * points["positions"].to_numpy(float)
    small = m <= small_rows
    fit = lambda frame, shared: _fit_with_small(frame, architecture, bandwidth_prior, flops_prior,  # noqa: E731
                                                length_quantum, small_rows, shared)
    if "measurement" in points or not small.any() or small.all():
        return _fit(points, architecture, bandwidth_prior, flops_prior, length_quantum)
    row_counts = sorted(points["rows"].unique())
    shared = small_shared
    if len(row_counts) >= 3:
        largest = (points["rows"] == row_counts[-1]).to_numpy()
        tested = points[largest]
        errors = {}
        for choice in (False, True):
            model = fit(points[~largest], choice)
            predicted = model.seconds(tested["rows"], tested["positions"], tested["context"])
            errors[choice] = float(np.median(np.abs(predicted / tested["seconds"].to_numpy(float) - 1)))
        shared = errors[True] < errors[False]
    return fit(points, shared)


INCONSISTENT_MARGIN = 0.25  # a forward this much slower than a larger one of the same run is not its hardware
INCONSISTENT_CONTEXT = 0.75  # ... where the larger one attended over at least this share of its context


def _label(point: dict) -> str:
    where = point.get("cell_id") or f"B={int(point['rows'])}"
    return f"{where} ({int(point['positions'])} position{'s' if point['positions'] != 1 else ''})"


def slower_than_larger(points: pd.DataFrame, small_rows: int = 0) -> np.ndarray:
    """Forwards measured slower, by more than INCONSISTENT_MARGIN, than most of those that did at least as
    much (as many rows and positions, most of the context) in the same kernel regime, at the same
    temperature (an optional column: sampling costs more than argmax): no smooth model of the
    hardware has that, so it is a measurement's hiccup or another code path (an eager fallback,
    a kernel choice at one shape), and fitting it bends every prediction."""
    rows, positions = points["rows"].to_numpy(float), points["positions"].to_numpy(float)
    context, seconds = points["context"].to_numpy(float), points["seconds"].to_numpy(float)
    small = rows * positions <= small_rows
    kind = points["temperature"].to_numpy(float) if "temperature" in points else np.zeros(len(points))
    larger = ((rows[None, :] >= rows[:, None]) & (positions[None, :] >= positions[:, None])
              & (context[None, :] >= INCONSISTENT_CONTEXT * context[:, None]) & (small[None, :] == small[:, None])
              & (kind[None, :] == kind[:, None]))
    np.fill_diagonal(larger, False)
    faster = (larger & (seconds[None, :] * (1 + INCONSISTENT_MARGIN) < seconds[:, None])).sum(axis=1)
    # most of them, not one: a single faster twin is the machine's noise (a CPU's drift between cells)
    return (faster >= 2) & (faster >= 0.5 * larger.sum(axis=1))


def _fit_with_small(points: pd.DataFrame, architecture: Architecture, bandwidth_prior, flops_prior, length_quantum: int,
                    small_rows: int, shared: bool) -> ForwardTimeModel:
    m = points["rows"].to_numpy(float) * points["positions"].to_numpy(float)
    small = m <= small_rows
    if small.all() or not small.any():
        return _fit(points, architecture, bandwidth_prior, flops_prior, length_quantum)
    model = _fit(points if shared else points[~small], architecture, bandwidth_prior, flops_prior, length_quantum)
    mine = points[small]
    residual = mine["seconds"].to_numpy(float) - model.seconds(mine["rows"], mine["positions"], mine["context"])
    sizes = m[small]
    slope, intercept = np.polyfit(sizes, residual, 1) if len(set(sizes)) > 1 else (0.0, float(np.median(residual)))
    model.small_rows, model.small_offset_s, model.small_offset_per_position_s = small_rows, float(intercept), float(slope)
    model.points = len(points)
    return model


def _fit(points: pd.DataFrame, architecture: Architecture, bandwidth_prior: float | None, flops_prior: float | None,
         length_quantum: int, profile: ForwardProfile | None = None) -> ForwardTimeModel:
    rows = points["rows"].to_numpy(float)
    positions = points["positions"].to_numpy(float)
    visible = visible_context(points["context"].to_numpy(float), positions, length_quantum)
    arch = architecture
    measurement = points["measurement"].to_numpy() if "measurement" in points else np.arange(len(points))
    labels, index = np.unique(measurement, return_inverse=True)
    first = np.unique(index, return_index=True)[1]
    seconds = points["seconds"].to_numpy(float)[first]
    total = lambda column: np.bincount(index, weights=column, minlength=len(labels))  # noqa: E731
    scale = 1 / seconds  # relative errors: a 1 ms and a 100 ms forward count alike
    if "weight" in points:
        weight = points["weight"].to_numpy(float)[first]
        scale = scale * np.sqrt(weight / weight.mean())
    base = [total(c) for c in (np.ones_like(rows), rows, positions, rows * positions)]
    attention = [total(arch.kv_bytes(rows, visible)), total(arch.attention_flops(rows, positions, visible))]
    # Priors, one row each: (column, the value it is pulled towards, weight)
    priors = [(KV_COLUMN, 1 / bandwidth_prior, KV_PRIOR_WEIGHT)] if bandwidth_prior else []
    priors += [(ATTENTION_COLUMN, 1 / flops_prior, KV_PRIOR_WEIGHT)] if flops_prior else []
    prior_ridge = None
    if profile is not None:  # the profile's own scale: 1; no ridge to search, the profile measured it
        priors.append((WEIGHTS_COLUMN, 1.0, PROFILE_PRIOR_WEIGHT))
        weights_column = lambda ridge: total(profile(rows * positions))  # noqa: E731
        ridges = [math.nan]
    else:
        priors += [(WEIGHTS_COLUMN, 1 / bandwidth_prior, BANDWIDTH_PRIOR_WEIGHT)] if bandwidth_prior else []
        weights_column = lambda ridge: total(np.maximum(arch.weights_read(rows * positions),  # noqa: E731
                                                        arch.linear_flops(rows, positions) / ridge))
        ridges = RIDGES
        prior_ridge = flops_prior / bandwidth_prior if flops_prior and bandwidth_prior else None
    robust = np.ones_like(seconds)
    for _ in range(ROBUST_ROUNDS):
        best = _best_fit(weights_column, ridges, total, base, attention, seconds, scale * robust, priors, prior_ridge)
        relative = np.abs(best[3] / seconds - 1)
        # Huber weights: a point off by more than HUBER counts less (a timing hiccup, or a regime
        # no smooth model has, should not bend the extrapolation)
        robust = np.sqrt(np.minimum(1.0, HUBER / np.maximum(relative, 1e-12)))
    _, ridge, c, _ = best
    weights = float(c[4])  # seconds per weight byte, or the profile's scale
    return ForwardTimeModel(arch, float(c[0]), float(c[1]), float(c[2]), float(c[3]),
                            0.0 if profile else weights, float(ridge), float(c[5]), float(c[6]), length_quantum,
                            points=len(labels), profile=profile, profile_scale=weights if profile else 0.0)


def _best_fit(weights_column, ridges, total, base, attention, seconds, scale, priors, prior_ridge):
    """(loss, ridge, coefficients, fitted seconds) of the best ridge point."""
    best = None
    for ridge in ridges:
        weights = weights_column(ridge)
        unscaled = np.stack(base + [weights] + attention, axis=1)
        matrix = unscaled * scale[:, None]
        target = seconds * scale
        extra_rows, extra_target = [], []
        for column, value, strength in priors:
            row = np.zeros(matrix.shape[1])
            row[column] = strength / value
            extra_rows.append(row)
            extra_target.append(strength)
        for column in GROWTH_COLUMNS:  # shrink towards flat: growth only where the data show it
            row = np.zeros(matrix.shape[1])
            row[column] = GROWTH_PENALTY * np.median(matrix[:, column])
            extra_rows.append(row)
            extra_target.append(0.0)
        matrix, target = np.vstack([matrix] + extra_rows), np.concatenate([target, extra_target])
        coefficients, _ = nnls(matrix, target)
        loss = float(np.sum((matrix @ coefficients - target) ** 2))
        if prior_ridge:
            loss += RIDGE_PRIOR_WEIGHT * math.log(ridge / prior_ridge) ** 2
        if best is None or loss < best[0]:
            best = (loss, ridge, coefficients, unscaled @ coefficients)
    return best
