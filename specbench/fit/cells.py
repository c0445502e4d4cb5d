"""Which cells an analysis reads: finished, real (not synthetic), closed or open loop; synthetic
cells labelled as their own draft."""

from __future__ import annotations

import pandas as pd

from specbench.schema import AR  # noqa: F401  (the cells analyses name baselines by it)


def ok_real(cells: pd.DataFrame) -> pd.DataFrame:
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


def ok_closed_loop(cells: pd.DataFrame) -> pd.DataFrame:
    """Finished closed-loop cells: what every batch-size analysis reads."""
    return closed_loop(cells[cells["status"] == "ok"]) if not cells.empty else cells




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



TRAFFIC = ["workload", "temperature", "context_length"]  # what a cell's acceptance and prompts depend on


def with_context(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells with a `context_length` column (0: the workload's own prompts; runs before the
    context-length axis have none)."""
    if cells.empty or ("context_length" in cells and cells["context_length"].notna().all()):
        return cells
    cells = cells.copy()
    cells["context_length"] = cells["context_length"].fillna(0).astype(int) if "context_length" in cells else 0
    return cells


def label_context(cells: pd.DataFrame) -> pd.DataFrame:
    """Cells at a set context length count as their own workload, `chat@4096`, in decisions and
    charts (B* per context length); idempotent."""
    if cells.empty or "context_length" not in cells or not (cells["context_length"].fillna(0) > 0).any():
        return cells
    cells = cells.copy()
    context = cells["context_length"].fillna(0).astype(int)
    cells["workload"] = [w if not c or str(w).endswith(f"@{c}") else f"{w}@{c}"
                         for w, c in zip(cells["workload"], context)]
    return cells


def label_cells(cells: pd.DataFrame) -> pd.DataFrame:
    """Both labels: synthetic acceptance into the draft, context length into the workload."""
    return label_context(label_synthetic(cells))


def base_draft(label: str) -> str:
    """The draft a label names, without its simulated acceptance (`1b α=0.8` -> `1b`): what its
    step times belong to."""
    return str(label).split(" α=")[0]
