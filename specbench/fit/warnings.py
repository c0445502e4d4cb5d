"""Every warning about how far a run's timings can be trusted, gathered in one list: the busy
machine, late sends, a trace's lengths, speed-ups above what acceptance allows, drifting baselines
and nodes that disagree. Each rule lives with its topic (fit.trust, fit.physics, fit.nodes)."""

from __future__ import annotations

import pandas as pd

from specbench.fit.nodes import node_warnings
from specbench.fit.noise import run_noise
from specbench.fit.physics import bound_warning
from specbench.fit.trust import DRIFT_ADVICE, baseline_drift, busy_machine, late_sends, trace_lengths


def measurement_warnings(cells: pd.DataFrame, copies: pd.DataFrame | None = None, noise=None) -> list[str]:
    """Every warning about how far a run's timings can be trusted, for the console, plan, summary and
    HTML. `copies`: a cluster run's baselines measured again on other nodes (fit.nodes). `noise`:
    the run's fit.noise.RunNoise, as the gate measures it (run_noise with the run's requests and
    steps), so that the bound warning flags exactly the cells the gate leaves undecided for it;
    None: measured from the cells alone."""
    noise = noise if noise is not None else run_noise(cells)
    warnings = [message for message in [busy_machine(cells), late_sends(cells), trace_lengths(cells),
                                        bound_warning(cells, noise)] if message]
    drift = baseline_drift(cells)
    return warnings + drift + ([DRIFT_ADVICE] if drift else []) + node_warnings(cells, copies)
