"""What-if: the cost models at sizes, K, drafts, context and output lengths the run did not measure,
as the table `plan RUN` prints (`plan_table`), each prediction beside the measurement where one exists."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench.fit.acceptance import expected_tau
from specbench.fit.cell_predictions import fitted_alpha
from specbench.fit.cells import closed_loop, label_synthetic, with_context
from specbench.fit.prices import cost_per_million
from specbench.schema import AR


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
                    alpha = fitted_alpha(alphas, draft, key)
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
