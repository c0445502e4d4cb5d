"""How far a prediction can be trusted: the largest batch sizes (and the longest context) held out,
predicted from the rest with the whole model refitted, and the lines a reader should know before
trusting a prediction (`trust_lines`)."""

from __future__ import annotations

import pandas as pd

from specbench.fit.cell_predictions import model_alphas, predict_cells
from specbench.fit.cells import closed_loop, label_synthetic, with_context
from specbench.fit.cost import ServedCostModel, cost_models
from specbench.fit.step_times import fit_step_times, step_time_notes

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
    predicted = predict_cells(label_synthetic(tested), models, model_alphas(train[0], train[1]), fitted_context)
    native = [model.times for model in models.values() if not isinstance(model, ServedCostModel)]
    times = native[0] if native and fitted_context is None else None
    if predicted.empty or times is None:
        return predicted
    own = [pick(frame, set(tested["cell_id"])) for frame in (cells, steps, requests)]
    at_traffic = predict_cells(label_synthetic(tested), cost_models(*own, meta, times=times),
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
