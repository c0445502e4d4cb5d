"""What acceptance allows: an upper bound on a speculative cell's speed-up from its own counters.

Every target forward (a prefill counts as one) yields one token, plus the drafts it accepts. Over
a cell's requests that is `output_tokens / (output_tokens - accepted)` tokens per forward, and a
speculative forward (K+1 positions a row, plus the draft's work) costs at least what an
autoregressive one does. So the speed-up in tokens/s is at most

    bound = tokens per forward × (verify + overhead) / (verify + overhead + draft)

where the factor is the share of a step that is not the draft's, from the cell's own measured step
times (the native engine; a served engine does not time the draft, so the factor is 1 there). With
several rows in a batch the slowest row sets the steps, which only lowers the real figure further.
A measured speed-up above the bound is not explained by acceptance: its excess is noise (a
drifting machine, a faster kernel for the wider verify shape), never speculation's. Whether a
speed-up *lies* above its bound is one rule (`lies_above`), for the gate and the warning alike:
its evidence must, not its bare point. A point a few per cent over the bound, within the run's
measured noise, is what noise on a healthy run looks like, and is not flagged.
"""

from __future__ import annotations

import math

import pandas as pd

from specbench.fit.cells import label_cells, ok_closed_loop
from specbench.fit.evidence import lies_above
from specbench.fit.noise import baseline_of, cell_interval
from specbench.schema import AR

COUNTED_ACCEPTANCE = "vllm:spec_decode counters"  # an endpoint's only source of counted tokens


def _number(row: dict, key: str) -> float:
    value = row.get(key)
    try:
        value = float(value)
    except (TypeError, ValueError):
        return float("nan")
    return value


def tokens_per_forward(row: dict) -> float | None:
    """Output tokens per target forward over the cell's requests (a prefill counts as one); None
    where acceptance was not counted (an endpoint read from gauges, an older row)."""
    source = row.get("acceptance_source")
    if row.get("engine") == "endpoint" and not (isinstance(source, str) and source.startswith(COUNTED_ACCEPTANCE)):
        return None
    output, accepted = _number(row, "output_tokens"), _number(row, "accepted")
    if not (math.isfinite(output) and math.isfinite(accepted)) or output <= 0 or not 0 <= accepted < output:
        return None
    return output / (output - accepted)


def draft_factor(row: dict) -> float:
    """The share of a speculative step that is not the draft's (1 where the draft is not timed)."""
    draft, verify, overhead = (_number(row, key) for key in ("step_draft_s", "step_verify_s", "step_overhead_s"))
    overhead = overhead if math.isfinite(overhead) else 0.0
    if not (math.isfinite(draft) and math.isfinite(verify)) or draft <= 0 or verify <= 0:
        return 1.0
    return (verify + overhead) / (verify + overhead + draft)


def speedup_bound(row: dict) -> float | None:
    """The most speed-up the cell's acceptance (and draft cost) allows; None where unknown."""
    tokens = tokens_per_forward(row)
    return None if tokens is None else tokens * draft_factor(row)


def with_bounds(cells: pd.DataFrame, noise=None) -> pd.DataFrame:
    """Cells with `speedup_bound` and `above_bound` (`lies_above`: the cell's interval, else its
    noise band from `noise`, a fit.noise.RunNoise, lies above the bound) columns."""
    cells = cells.copy()
    if cells.empty:
        cells["speedup_bound"], cells["above_bound"] = [], []
        return cells
    records = cells.to_dict("records")
    bounds = [speedup_bound(r) if r.get("mode") != AR else None for r in records]
    cells["speedup_bound"] = [float("nan") if b is None else b for b in bounds]
    flags = []
    for row, bound in zip(records, bounds):
        point = _number(row, "speedup")
        if bound is None or not math.isfinite(point):
            flags.append(False)
            continue
        band = noise.interval(row["cell_id"], point) if noise is not None else None
        flags.append(lies_above(bound, cell_interval(row), band))
    cells["above_bound"] = flags
    return cells


def above_bound(cells: pd.DataFrame, noise=None) -> pd.DataFrame:
    """Finished closed-loop speculative cells whose speed-up lies above what acceptance allows."""
    sd = ok_closed_loop(label_cells(cells))
    if sd.empty or "speedup" not in sd:
        return sd.iloc[0:0]
    sd = with_bounds(sd[sd["mode"] != AR], noise)
    return sd[sd["above_bound"]]


def bound_warning(cells: pd.DataFrame, noise=None) -> str | None:
    """One sentence naming the speed-ups whose evidence lies above their bound (`lies_above`, with
    `noise` the run's fit.noise.RunNoise); None when there are none. Where every comparison
    against one baseline lies above its bound, that baseline is named as the likely slow
    measurement: a slow baseline lifts every speed-up taken against it."""
    flagged = above_bound(cells, noise)
    if flagged.empty:
        return None
    shown = ", ".join(f"{row.cell_id} {row.speedup:.3f}× > {row.speedup_bound:.3f}×"
                      for row in flagged.head(4).itertuples())
    more = f" and {len(flagged) - 4} more" if len(flagged) > 4 else ""
    text = (f"{len(flagged)} speed-up(s) above what acceptance allows beyond the run's noise, not explained by "
            f"acceptance ({shown}{more}; bound = output tokens per target forward × the step's non-draft share); "
            f"the gate leaves such a comparison undecided")
    bounded = with_bounds(ok_closed_loop(label_cells(cells)), noise)
    bounded = bounded[(bounded["mode"] != AR) & bounded["speedup_bound"].notna()]
    against = baseline_of(cells)
    suspects = []
    for baseline in sorted({against.get(c) for c in flagged["cell_id"]} - {None}):
        paired = bounded[bounded["cell_id"].map(against.get) == baseline]
        if len(paired) >= 2 and paired["above_bound"].all():
            suspects.append((baseline, len(paired)))
    for baseline, count in suspects:
        text += (f"; all {count} comparisons against the baseline {baseline} lie above their bounds: that baseline is "
                 f"the likely slow measurement, not the drafts; measure its group again with --repeats 3 or more "
                 f"(a new run: each repeat of a draft then takes turns with one of the baseline)")
    return text
