"""A run's prefills: the forwards a batch's prefill runs, the prefills each batch measured, and the
target's and drafts' prefill times fitted on them."""

from __future__ import annotations

import pandas as pd

from specbench.fit.roofline import Architecture, ForwardTimeModel, fit_forward_time
from specbench.schema import AR
from specbench.shapes import prefill_groups


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


def fit_prefills(cells: pd.DataFrame, requests: pd.DataFrame, target: Architecture, drafts: dict[str, Architecture],
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
