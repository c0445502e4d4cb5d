"""A run's own speculative cells predicted by its cost models, next to what they measured (and the α
the models take: `fitted_alpha`)."""

from __future__ import annotations

import numpy as np
import pandas as pd

from specbench.fit.acceptance import alpha_table, expected_tau
from specbench.fit.cells import TRAFFIC, closed_loop, label_synthetic, with_context
from specbench.fit.cost import cost_models
from specbench.schema import AR


def model_alphas(cells: pd.DataFrame, steps: pd.DataFrame) -> pd.DataFrame:
    """α per (draft, traffic) for the model, synthetic cells included as their own drafts."""
    return alpha_table(cells, steps, include_synthetic=True)


def fitted_alpha(alphas: pd.DataFrame, draft: str, key: tuple) -> float | None:
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
    return predict_cells(with_context(label_synthetic(closed_loop(cells[cells["status"] == "ok"]))), models, alphas)


def predict_cells(cells: pd.DataFrame, models: dict, alphas: pd.DataFrame, fitted_context: int | None = None
                   ) -> pd.DataFrame:
    """Each speculative cell's predicted τ and speed-up next to the measured ones: from the model
    of its own traffic group or, given `fitted_context`, from that context length's model at the
    cell's own prompt length."""
    rows = []
    for row in cells.to_dict("records"):
        if row["mode"] == AR or not np.isfinite(row.get("speedup", np.nan)):
            continue
        key = (row["workload"], row["temperature"], row["context_length"] if fitted_context is None else fitted_context)
        model, alpha = models.get(key), fitted_alpha(alphas, row["draft"], key)
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
