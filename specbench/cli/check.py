"""`specbench check`: the rollout gate, a verdict and an exit code a pipeline acts on."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Optional

import typer

from specbench.cli.common import (UsageError, at_context, console, fail, known_errors, measured_batch_sizes,
                                  on_hardware, runnable_advice, split_list, token_count)
from specbench.cli.render import gate_text, print_gate_warnings, slo_gate_text

def check(
    run_dir: Optional[Path] = typer.Argument(None, help="Run directory (default: the latest under results/)."),
    batch_sizes: Optional[str] = typer.Option(None, help="Batch sizes that must meet the bar (default: every "
                                                         "batch size the run measured), e.g. 32,64."),
    min_speedup: Optional[float] = typer.Option(None, help="The bar: speed-up at least this (default 1.0; not "
                                                           "with --slo)."),
    draft: Optional[str] = typer.Option(None, help="Judge this draft (default: the best one at those batch sizes)."),
    workloads: Optional[str] = typer.Option(None, help="Only these workloads (default: all; the worst counts)."),
    temperatures: Optional[str] = typer.Option(None, help="Only these temperatures (default: all; the worst counts)."),
    context_length: Optional[str] = typer.Option(None, help="Only cells at this context length in tokens (4k = "
                                                            "4096; default: every length, the worst counts)."),
    slo: Optional[str] = typer.Option(None, help="Judge the SLO instead: speculation must not lower the highest "
                                                 "load meeting it, e.g. ttft=1.0,tpot=0.05[,p90] (default: the "
                                                 "run's --slo on a request-rate run)."),
    allow_incomplete: bool = typer.Option(False, help="Judge a run that did not finish (stopped, failed cells) on "
                                                      "what it measured, instead of exit 2."),
    hardware: Optional[str] = typer.Option(None, help="A cluster run on several kinds of GPU: judge the cells of "
                                                      "this one (a part of its name, e.g. H100)."),
    json_output: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
) -> None:
    """Rollout gate: does speculation meet the bar at every named batch size (with --slo: not lower
    the highest load meeting the SLO)? Exit 0 pass, 1 fail, 2 cannot answer (bad input, missing
    cells, an incomplete run), 3 inconclusive (an interval straddles the bar), 4 internal error."""
    from specbench.fit import completeness, open_loop, parse_slo
    from specbench.gate import INTERNAL_ERROR, UNANSWERABLE, evaluate, evaluate_slo
    from specbench.results import load_run
    from specbench.grid import base_speculative_configs

    slo_result = None
    bar_given, min_speedup = min_speedup is not None, 1.0 if min_speedup is None else min_speedup
    try:
        if not (math.isfinite(min_speedup) and min_speedup > 0):
            raise UsageError(f"--min-speedup must be a positive number, got {min_speedup:g}")
        run = on_hardware(load_run(run_dir), hardware)
        state = completeness(run.meta, run.cells)  # of the whole run, before any filter
        if context_length is not None:
            run = at_context(run, token_count(context_length))
            state = state.at_context(token_count(context_length))
        chosen_workloads = split_list(workloads, str, "--workloads") if workloads else None
        chosen_temperatures = split_list(temperatures, float, "--temperatures") if temperatures else None
        recorded = (run.meta.get("config") or {}).get("slo") or ""
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
            slo_result = evaluate_slo(run.cells, run.requests, parse_slo(slo or recorded), draft,
                                      chosen_workloads, chosen_temperatures, state, allow_incomplete)
        else:
            sizes = split_list(batch_sizes, int, "--batch-sizes") if batch_sizes else measured_batch_sizes(run.cells)
            if any(b < 1 for b in sizes):
                raise UsageError(f"--batch-sizes must be >= 1, got {batch_sizes}")
            result = evaluate(run.cells, sizes, min_speedup, draft, chosen_workloads, chosen_temperatures,
                              base_speculative_configs(run.meta, run.cells["draft"]), state, allow_incomplete,
                              run.requests, run.steps, run.baseline_copies)
    except known_errors() as error:
        if json_output:
            print(json.dumps({"exit_code": UNANSWERABLE, "verdict": "CANNOT ANSWER", "message": str(error)}))
            raise typer.Exit(UNANSWERABLE)
        fail(str(error))
    except Exception as error:  # a bug: a pipeline's verdict.json still gets its JSON; exit 4 as always
        if json_output:
            print(json.dumps({"exit_code": INTERNAL_ERROR, "verdict": "ERROR",
                              "message": f"internal error (a bug in specbench, not a verdict): "
                                         f"{type(error).__name__}: {(str(error).splitlines() or [''])[0]}"}))
        raise
    for answered in (slo_result, None if slo_result is not None else result):
        if answered is not None:
            runnable_advice(answered, run)
    if slo_result is not None:
        if json_output:
            print(json.dumps(slo_result.to_dict(), indent=2))
        else:
            unit = "request rate" if slo_result.load == "request_rate" else "concurrency"
            console.print(f"does speculation keep the highest {unit} meeting the SLO ({slo_result.slo})? "
                          f"(run {run.path})", highlight=False, soft_wrap=True)
            console.print(slo_gate_text(slo_result), highlight=False, soft_wrap=True)
            print_gate_warnings(slo_result.warnings)
        raise typer.Exit(slo_result.exit_code)
    if json_output:
        print(json.dumps(result.to_dict(), indent=2))
    else:
        which = "" if batch_sizes else " (every batch size the run measured; --batch-sizes to choose)"
        console.print(f"does speculation keep ≥ {min_speedup:g}× at batch size(s) {', '.join(map(str, sizes))}?{which} "
                      f"(run {run.path})", highlight=False, soft_wrap=True)
        console.print(gate_text(result), highlight=False, soft_wrap=True)
        print_gate_warnings(result.warnings)
    raise typer.Exit(result.exit_code)

