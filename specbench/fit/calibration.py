"""The kernel tables corrected by a run measured on the same kind of GPU.

The tables are vLLM's kernels, timed by NVIDIA; a run's forwards are one engine on one machine
(the native engine's llama3-8b decode runs 1.30-1.36x the tables on an H100). Each kind of forward
gets its own correction, fitted on the run's measured forwards at the same shapes:

- the target's decode (one position per row);
- its verify (K + 1 positions);
- each draft model's decode;
- the target's prefill (its first token's time) and each draft's (which follows it).

A correction is measured / tables as a function of log2(rows): by default (`interp`) the line
through each measured batch size's median ratio, held at the nearest measured size's beyond them
(a constant where the run measured one size). Two reasons for not extrapolating: the tables'
kernels already carry how a forward grows with the batch, so what is left (the engine's own
overhead) has no trend to trust past the last size measured; and a least-squares line in log2 B
(`loglinear`) does not even reproduce the sizes it was fitted on. Checked by hiding each H100 run's
largest batch size (specbench/data/measured.json's finding held_out_correction). `TableForward`
turns a corrected table into the forward-time model the cost model asks (`seconds(rows, positions,
context)`), so a calibrated plan and the held-out check use exactly the arithmetic the run's own
roofline uses.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from specbench.drafter_kinds import drafter_kind
from specbench.fit import kernel_tables
from specbench.fit.cells import ok_closed_loop
from specbench.models import lookup_alias, model_family, parse_draft_spec
from specbench.results import recorded_config
from specbench.schema import AR
from specbench.synthetic import config_parameters, shipped_config


@dataclass(frozen=True)
class Correction:
    """measured / tables as a function of the rows of a forward."""

    intercept: float = 1.0
    slope: float = 0.0  # per doubling of rows
    points: int = 0
    rows: tuple[int, ...] = ()  # the batch sizes it was fitted on
    # `interp`: (log2 rows, ratio) at each measured size, joined by lines and held flat beyond them
    knots: tuple[tuple[float, float], ...] = ()

    @classmethod
    def fit(cls, rows: np.ndarray, ratios: np.ndarray, shape: str = "interp") -> "Correction":
        """`shape`: `interp` (through each measured batch size's median ratio, flat beyond them),
        `loglinear` (least squares over every measured batch size), `constant` (their median), `last`
        (the largest size's), `last2` (the line through the two largest)."""
        rows, ratios = np.asarray(rows, float), np.asarray(ratios, float)
        keep = np.isfinite(ratios) & (ratios > 0)
        rows, ratios = rows[keep], ratios[keep]
        if not len(ratios):
            return cls()
        sizes = tuple(sorted({int(r) for r in rows}))
        # one weight per batch size (a B=1 cell has more steps than a B=64 one, not more say)
        per_size = pd.DataFrame({"x": np.log2(rows), "y": ratios}).groupby("x")["y"].median()
        x, y = per_size.index.to_numpy(), per_size.to_numpy()
        if len(x) < 2 or shape == "constant":
            return cls(float(np.median(y)), 0.0, len(ratios), sizes)
        if shape == "last":
            return cls(float(y[-1]), 0.0, len(ratios), sizes)
        if shape == "interp":
            return cls(float(y[0]), 0.0, len(ratios), sizes, tuple(zip(map(float, x), map(float, y))))
        if shape == "last2":
            x, y = x[-2:], y[-2:]
        elif shape != "loglinear":
            raise ValueError(f"correction shape must be interp, loglinear, constant, last or last2, got {shape!r}")
        slope, intercept = np.polyfit(x, y, 1)
        return cls(float(intercept), float(slope), len(ratios), sizes)

    def __call__(self, rows) -> np.ndarray:
        if self.knots:
            x, y = zip(*self.knots)
            return np.interp(np.log2(np.maximum(np.asarray(rows, float), 1)), x, y)
        return np.maximum(self.intercept + self.slope * np.log2(np.maximum(np.asarray(rows, float), 1)), 0.05)

    def describe(self) -> str:
        if not self.points:
            return "uncorrected (nothing measured)"
        at = ", ".join(f"{float(self(r)):.2f}× at B={r}" for r in self.rows)
        return f"{at} ({self.points} points)"


@dataclass
class TableForward:
    """A forward-time model on the tables: `seconds(rows, positions, context)` as the cost model asks
    it, each forward a decode (positions 1), a verify (positions > 1) or, for `prefill`, a prefill of
    `positions` tokens per row."""

    forward: kernel_tables.Forward
    decode: Correction = field(default_factory=Correction)
    verify: Correction = field(default_factory=Correction)
    prefill: bool = False

    def _one(self, rows: float, positions: float, context: float) -> float:
        rows, positions, context = max(int(round(rows)), 1), max(int(round(positions)), 1), int(round(context))
        if self.prefill:
            return self.forward.prefill_ms(rows, positions) / 1000 * float(self.decode(rows))
        if positions == 1:
            return self.forward.decode_ms(rows, context) / 1000 * float(self.decode(rows))
        return self.forward.verify_ms(rows, context, positions) / 1000 * float(self.verify(rows))

    def table_prefill_ms(self, lengths) -> float:
        """A whole batch's prefill on the uncorrected tables: its forwards as the engine groups them."""
        from specbench.fit.prefill_times import prefill_forwards

        return float(sum(self.forward.prefill_ms(rows, positions) for rows, positions in prefill_forwards(lengths)))

    def batch_prefill_s(self, lengths) -> float:
        """A whole batch's prefill (a `prefill` model): its forwards on the tables, corrected at the
        batch's size, as `_prefill_correction` fitted it (not at each forward's rows: a batch of
        varied prompts runs several forwards of a few rows each)."""
        return self.table_prefill_ms(lengths) / 1000 * float(self.decode(len(lengths)))

    def seconds(self, rows, positions, context) -> np.ndarray:
        r, p, c = np.broadcast_arrays(np.asarray(rows, float), np.asarray(positions, float), np.asarray(context, float))
        out = np.array([self._one(*x) for x in zip(r.ravel(), p.ravel(), c.ravel())], float).reshape(r.shape)
        return out if out.shape else out[()]

    def proposal_s(self, k: int, rows, context):
        """A draft model's K proposals: K decodes."""
        return k * self.seconds(rows, 1, context)

    def corrected(self, decode: Correction, verify: Correction | None = None) -> "TableForward":
        return TableForward(self.forward, decode, verify or self.verify, self.prefill)


def _table_ms(model: TableForward, rows, positions, context) -> np.ndarray:
    """The uncorrected table in ms, point by point."""
    return np.asarray(TableForward(model.forward, prefill=model.prefill).seconds(rows, positions, context)) * 1000


@dataclass(frozen=True)
class MeasuredModel:
    """One model a native run measured, with its decode and prefill corrections: what a plan's draft
    of about its size takes (a small model's forwards are launch-bound where a large one's are not)."""

    name: str
    parameters: int
    decode: Correction
    prefill: Correction | None = None


@dataclass
class Calibration:
    """A run's forwards against the tables: the corrected step times, and what each correction is."""

    times: object  # fit.step_times.StepTimes (None from a served run: it has no forwards to model)
    corrections: dict[str, Correction]
    system: str
    backend: str
    target: str = ""
    drafts: tuple[str, ...] = ()
    tp: int = 1  # the TP the run measured, and the tables were compiled at
    parameters: dict[str, int] = field(default_factory=dict)  # each measured model's (target, draft labels)

    def by_kind(self) -> dict[str, Correction]:
        """What a plan of other models takes from this run: the target's decode, verify and prefill
        corrections, and its (first) model draft's decode and prefill as every draft's (`draft`,
        `draft prefill`); from a served run, the whole speculative step's (`step`) in place of verify
        and draft."""
        kinds = {kind: self.corrections[f"{self.target} {kind}"] for kind in ("decode", "verify", "prefill", "step")
                 if f"{self.target} {kind}" in self.corrections}
        for label in self.drafts:
            if f"{label} decode" in self.corrections:
                kinds["draft"] = self.corrections[f"{label} decode"]
                if f"{label} prefill" in self.corrections:
                    kinds["draft prefill"] = self.corrections[f"{label} prefill"]
                break
        return kinds

    def measured_models(self) -> list[MeasuredModel]:
        """The target and each model draft of a native run, by size (a served run: none, its
        corrections are per step)."""
        found = []
        for name, size in self.parameters.items():
            if f"{name} decode" in self.corrections:
                found.append(MeasuredModel(name, size, self.corrections[f"{name} decode"],
                                           self.corrections.get(f"{name} prefill")))
        return sorted(found, key=lambda model: model.parameters)


def nearest_measured(models: list[MeasuredModel], parameters: float) -> MeasuredModel:
    """The measured model nearest in size (log parameters) to a model of `parameters`."""
    return min(models, key=lambda model: abs(np.log(model.parameters / max(parameters, 1.0))))


def run_configs(meta: dict) -> tuple[str, dict, dict[str, tuple[str, dict]]]:
    """(target name, its config, {draft label: (name, config)}) of a run: the shipped configs of its
    registry aliases (what a timing-only run built, and what a real one loaded)."""
    config = recorded_config(meta)["grid"]
    name, target = shipped_config(config.get("target", ""))
    family = model_family(name)
    drafts = {}
    for label in config.get("drafts", []):
        try:
            spec = parse_draft_spec(label)
        except ValueError:
            continue
        if drafter_kind(spec.kind).separate_model and lookup_alias(spec.model, family) is not None:
            drafts[label] = shipped_config(spec.model, family)
    return name, target, drafts


def calibrate(cells: pd.DataFrame, steps: pd.DataFrame, requests: pd.DataFrame, meta: dict, system: str,
              backend: str = "vllm", correct: bool = True, shape: str = "interp",
              correct_prefill: bool = True) -> Calibration:
    """The run's step times on the tables of `system` (at TP1, as the native engine runs), each
    kind of forward corrected by the run's own (`correct=False`: the bare tables; `shape`: how a
    correction varies with the batch, `Correction.fit`)."""
    from specbench.fit.prefill_times import measured_draft_prefills, measured_prefills
    from specbench.fit.step_times import StepTimes, _points, fit_step_times, forward_table

    target_name, target_config, draft_configs = run_configs(meta)
    cells = ok_closed_loop(cells)
    target = TableForward(kernel_tables.Forward(target_config, system, backend, 1, name=target_name))
    prefill = TableForward(target.forward, prefill=True)
    drafts, draft_prefill = {}, {}
    for label, (name, config) in draft_configs.items():
        forward = kernel_tables.Forward(config, system, backend, 1, name=name)
        drafts[label], draft_prefill[label] = TableForward(forward), TableForward(forward, prefill=True)
    corrections: dict[str, Correction] = {}
    forwards = forward_table(cells, steps, requests)
    if correct and not forwards.empty:
        full = forwards[forwards["rows"] == forwards["batch_size"]]
        points = _points(full, "target_s", ["cell_id", "positions"])
        for what, mine in (("decode", points[points["positions"] == 1]), ("verify", points[points["positions"] > 1])):
            table = _table_ms(target, mine["rows"], mine["positions"], mine["context"])
            corrections[f"{target_name} {what}"] = Correction.fit(mine["rows"], mine["seconds"] * 1000 / table, shape)
        target = target.corrected(corrections[f"{target_name} decode"], corrections[f"{target_name} verify"])
        drafting = full[(full["mode"] != AR) & (full["drafted"] > 0)]
        for label, mine in drafting.groupby("draft"):
            if label not in drafts:
                continue
            per = _points(mine.assign(positions=1), "draft_s", ["cell_id"])
            table = _table_ms(drafts[label], per["rows"], 1, per["context"])
            corrections[f"{label} decode"] = Correction.fit(per["rows"], per["seconds"] / per["k"] * 1000 / table,
                                                            shape)
            drafts[label] = drafts[label].corrected(corrections[f"{label} decode"])
        # the target's prefill ends with the first token; the draft's prefill comes after it
        batches = measured_prefills(cells, requests) if not requests.empty else []
        if batches:
            corrections[f"{target_name} prefill"] = _prefill_correction(prefill, batches, shape)
            if correct_prefill:
                prefill = prefill.corrected(corrections[f"{target_name} prefill"])
        for label, batches in measured_draft_prefills(cells, requests, draft_prefill).items():
            corrections[f"{label} prefill"] = _prefill_correction(draft_prefill[label], batches, shape)
            if correct_prefill:
                draft_prefill[label] = draft_prefill[label].corrected(corrections[f"{label} prefill"])
    # drafts the tables do not hold (n-gram: a search on the host) keep the run's own fitted time;
    # the roofline is fitted only where the run has one
    speculative = set(cells.loc[cells["mode"] != AR, "draft"]) if not cells.empty else set()
    fitted = fit_step_times(cells, steps, requests, meta) if speculative - set(drafts) else None
    if fitted is not None:
        for label, model in fitted.drafts.items():
            drafts.setdefault(label, model)
    times = StepTimes(target, drafts, prefill, draft_prefill)
    sizes = {target_name: config_parameters(target_config),
             **{label: config_parameters(config) for label, (_, config) in draft_configs.items()}}
    return Calibration(times, corrections, system, backend, target_name, tuple(draft_configs), 1, sizes)


def run_system(meta: dict) -> str | None:
    """The tables' system of the GPU a run measured on (`h100_sxm`); None for a CPU run or a GPU
    specbench does not know."""
    from specbench.fit.roofline import device_key

    gpus = (meta.get("hardware") or {}).get("gpus") or []
    key = device_key(gpus[0]["name"]) if gpus else None
    return kernel_tables.system_name(key) if key else None


def predicted_with(times, cells: pd.DataFrame, steps: pd.DataFrame, requests: pd.DataFrame,
                   meta: dict) -> pd.DataFrame:
    """Every speculative cell of a run predicted with step times from elsewhere (`times`: another
    GPU's corrections carried, the bare tables) and the run's own α: the columns of `fit.held_out`."""
    from specbench.fit.validation import _finished, _predict_held_out, _with_side

    ok = _finished(cells)
    return _with_side(_predict_held_out(cells, steps, requests, meta, set(ok["cell_id"]), ok,
                                        step_times=lambda *_: times))


def carried(source: Calibration, cells: pd.DataFrame, steps: pd.DataFrame, requests: pd.DataFrame, meta: dict,
            system: str, backend: str = "vllm") -> object:
    """A run's step times (fit.step_times.StepTimes) on `system`'s tables, corrected by `source`, a run
    measured on another GPU's tables, as `plan --calibrate` corrects a plan: the target's forwards by
    `source`'s target's, each model draft's by those of `source`'s measured model nearest its size.
    Checked on the committed H100 and H200 runs (measured.json's finding cross_gpu_correction)."""
    from specbench.fit.step_times import StepTimes

    bare = calibrate(cells, steps, requests, meta, system, backend, correct=False).times
    found, name = source.corrections, source.target
    models = source.measured_models()
    _, _, draft_configs = run_configs(meta)

    def draft_source(label: str) -> MeasuredModel | None:
        config = draft_configs.get(label)
        return nearest_measured(models, config_parameters(config[1])) if config and models else None

    def fix(model, correction):
        return model.corrected(correction) if correction is not None and model is not None else model

    target = bare.target.corrected(found[f"{name} decode"], found[f"{name} verify"])
    drafts, draft_prefill = dict(bare.drafts), dict(bare.draft_prefill)
    for label in draft_configs:
        nearest = draft_source(label)
        if nearest is not None and isinstance(drafts.get(label), TableForward):
            drafts[label] = fix(drafts[label], nearest.decode)
            draft_prefill[label] = fix(draft_prefill.get(label), nearest.prefill)
    return StepTimes(target, drafts, fix(bare.prefill, found.get(f"{name} prefill")), draft_prefill)


def _prefill_correction(model: TableForward, batches: list[tuple[object, list[int], float]],
                        shape: str) -> Correction:
    """measured / tables for whole batches' prefills (chunked as the engine chunks them), by rows."""
    table = [model.table_prefill_ms(lengths) for _, lengths, _ in batches]
    return Correction.fit(np.array([len(lengths) for _, lengths, _ in batches]),
                          np.array([s for _, _, s in batches]) * 1000 / np.array(table, float), shape)


def calibrate_served(cells: pd.DataFrame, meta: dict, system: str, backend: str = "vllm") -> Calibration:
    """A served run (vLLM) against the tables: it times requests, not forwards, so its corrections
    are per step, from each cell's mean TPOT at its batch size (the mean context: prompt plus half
    the output): the autoregressive decode step (TPOT), the whole speculative step (TPOT × τ, the
    tokens a step yields, over K draft decodes plus the verify on the tables; n-gram: the verify)
    and the prefill (the mean TTFT of a batch sent at once)."""
    target_name, target_config, draft_configs = run_configs(meta)
    cells = ok_closed_loop(cells)
    tp = int((recorded_config(meta)["engine"].get("vllm") or {}).get("tensor_parallel_size") or 1)
    target = kernel_tables.Forward(target_config, system, backend, tp, name=target_name)
    drafts = {label: kernel_tables.Forward(config, system, backend, tp, name=name)  # vLLM's default draft TP
              for label, (name, config) in draft_configs.items()}
    rows: dict[str, list[tuple[int, float]]] = {"decode": [], "step": [], "prefill": []}
    for cell in cells.itertuples():
        b, k = int(cell.batch_size), int(cell.k or 0)
        context = int(cell.prompt_tokens_mean + cell.max_new_tokens / 2)
        if cell.mode == AR:
            rows["decode"].append((b, cell.tpot_mean_s * 1000 / target.decode_ms(b, context)))
        elif cell.tau == cell.tau and k > 0 and (cell.draft in drafts or str(cell.draft).startswith("ngram")):
            tables = target.verify_ms(b, context, k + 1)
            tables += k * drafts[cell.draft].decode_ms(b, context) if cell.draft in drafts else 0.0
            rows["step"].append((b, cell.tpot_mean_s * cell.tau * 1000 / tables))
        if cell.ttft_mean_s == cell.ttft_mean_s:
            rows["prefill"].append((b, cell.ttft_mean_s * 1000 / target.prefill_ms(b, int(cell.prompt_tokens_mean))))
    corrections = {f"{target_name} {kind}": Correction.fit(np.array([b for b, _ in points]),
                                                           np.array([r for _, r in points]))
                   for kind, points in rows.items() if points}
    return Calibration(None, corrections, system, backend, target_name, tuple(draft_configs), tp)


def held_out_on_tables(cells: pd.DataFrame, steps: pd.DataFrame, requests: pd.DataFrame, meta: dict, system: str,
                       backend: str = "vllm", correct: bool = True, shape: str = "interp",
                       correct_prefill: bool = True) -> pd.DataFrame:
    """The largest batch size hidden: the tables corrected on the smaller sizes predict each of its
    speculative cells, with α from the smaller sizes (`speedup_error`) and with the cell's own α and
    prompts (`speedup_error_at_traffic`): the columns of `fit.held_out`, by the same arithmetic."""
    from specbench.fit.validation import MIN_BATCH_SIZES_FOR_HOLDOUT, _finished, _predict_held_out, _with_side

    ok = _finished(cells)
    sizes = sorted(ok["batch_size"].unique().astype(int).tolist()) if not ok.empty else []
    if len(sizes) < MIN_BATCH_SIZES_FOR_HOLDOUT:  # as the roofline's check: two sizes to fit on, at least
        return pd.DataFrame()
    largest = sizes[-1]
    corrected = lambda *train: calibrate(*train, meta, system, backend, correct, shape, correct_prefill).times  # noqa: E731
    predicted = _predict_held_out(cells, steps, requests, meta, set(ok[ok["batch_size"] < largest]["cell_id"]),
                                  ok[ok["batch_size"] == largest], step_times=corrected)
    if predicted.empty:
        return predicted
    return _with_side(predicted.assign(held_out_batch_size=largest, trained_on=",".join(map(str, sizes[:-1]))))
