"""The rollout gate on a run, as `specbench check` judges it: the same defaults, the same verdict."""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from specbench.api.errors import UsageError
from specbench.api.runs import at_context, measured_batch_sizes, on_hardware, runnable_advice

if TYPE_CHECKING:
    from specbench.fit import Slo
    from specbench.gate import GateResult, SloGateResult
    from specbench.results import Run


@dataclass
class CheckResult:
    """A verdict and the cells it judged. `verdict` is a GateResult (speed-ups at batch sizes) or,
    on a request-rate or trace run or with an SLO, a SloGateResult (the highest load meeting it)."""
    verdict: GateResult | SloGateResult
    run: Run  # the run as judged: one kind of hardware, one context length where one was asked

    @property
    def exit_code(self) -> int:
        """0 pass, 1 fail, 2 cannot answer, 3 inconclusive (specbench.gate.EXIT_CODES)."""
        return self.verdict.exit_code

    @property
    def judges_slo(self) -> bool:
        from specbench.gate import SloGateResult

        return isinstance(self.verdict, SloGateResult)


def check(run_dir: Path | str | None = None, *, batch_sizes: list[int] | None = None,
          min_speedup: float | None = None, draft: str | None = None, workloads: list[str] | None = None,
          temperatures: list[float] | None = None, context_length: int | None = None,
          slo: str | Slo | None = None, allow_incomplete: bool = False, hardware: str | None = None) -> CheckResult:
    """Does speculation meet the bar at every named batch size (default: every batch size the run
    measured; bar default 1.0)? On a request-rate or trace run, or with `slo` (ttft=1.0,tpot=0.05[,p90]
    or a parsed Slo): does it keep the highest load meeting the SLO (default: the run's own --slo)?
    `run_dir` None: the latest run under results/. Only `workloads` and `temperatures` judged where
    given (the worst counts); `context_length` in tokens; `hardware` part of a GPU's name, for a
    cluster run on several kinds. A run that did not finish is judged only with `allow_incomplete`.
    Raises UsageError (or results.RunNotFound, ValueError) where the question cannot be asked."""
    from specbench.fit import completeness, open_loop, parse_slo
    from specbench.gate import evaluate, evaluate_slo
    from specbench.grid import base_speculative_configs
    from specbench.results import load_run, recorded_config

    bar_given, min_speedup = min_speedup is not None, 1.0 if min_speedup is None else min_speedup
    if not (math.isfinite(min_speedup) and min_speedup > 0):
        raise UsageError(f"--min-speedup must be a positive number, got {min_speedup:g}")
    run = on_hardware(load_run(run_dir), hardware)
    state = completeness(run.meta, run.cells)  # of the whole run, before any filter
    if context_length is not None:
        run, state = at_context(run, context_length), state.at_context(context_length)
    recorded = recorded_config(run.meta)["gate"].get("slo") or ""
    if slo or not open_loop(run.cells).empty:
        if not (slo or recorded):
            kind = "a trace replay" if run.meta.get("trace") else "a request-rate run"
            raise UsageError(f"{kind} is judged against an SLO (its sweep was given none): pass --slo "
                             f"ttft=SECONDS,tpot=SECONDS")
        for given, name in ((batch_sizes, "--batch-sizes"), (bar_given, "--min-speedup")):
            if given:  # never silently ignored: a pipeline would read the SLO's verdict as the bar's
                raise UsageError(f"{name} judges speed-ups at batch sizes; with --slo (or on a request-rate or "
                                 f"trace run) the verdict is whether speculation keeps the highest load meeting "
                                 f"the SLO, over every load the run measured: leave out {name}")
        slo = slo or recorded
        verdict = evaluate_slo(run.cells, run.requests, parse_slo(slo) if isinstance(slo, str) else slo,
                               state=state, draft=draft, workloads=workloads, temperatures=temperatures,
                               allow_incomplete=allow_incomplete)
    else:
        sizes = list(batch_sizes) if batch_sizes else measured_batch_sizes(run.cells)
        if any(b < 1 for b in sizes):
            raise UsageError(f"--batch-sizes must be >= 1, got {','.join(map(str, sizes))}")
        verdict = evaluate(run.cells, sizes, state=state, requests=run.requests, steps=run.steps,
                           min_speedup=min_speedup, draft=draft, workloads=workloads, temperatures=temperatures,
                           base_configs=base_speculative_configs(run.meta, run.cells["draft"]),
                           allow_incomplete=allow_incomplete, copies=run.baseline_copies)
    runnable_advice(verdict, run)
    return CheckResult(verdict, run)
