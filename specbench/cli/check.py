"""`specbench check`: the rollout gate, a verdict and an exit code a pipeline acts on."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer

from specbench.cli.common import fail, known_errors, split_list, token_count
from specbench.cli.render import print_check


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
    allow_incomplete: bool = typer.Option(False, "--allow-incomplete", help="Judge a run that did not finish (stopped, failed cells) on "
                                                      "what it measured, instead of exit 2."),
    hardware: Optional[str] = typer.Option(None, help="A cluster run on several kinds of GPU: judge the cells of "
                                                      "this one (a part of its name, e.g. H100)."),
    json_output: bool = typer.Option(False, "--json", help="Print the verdict as JSON."),
) -> None:
    """Rollout gate: does speculation meet the bar at every named batch size (with --slo: not lower
    the highest load meeting the SLO)? Exit 0 pass, 1 fail, 2 cannot answer (bad input, missing
    cells, an incomplete run), 3 inconclusive (an interval straddles the bar), 4 internal error."""
    from specbench import api
    from specbench.gate import INTERNAL_ERROR, UNANSWERABLE

    try:
        result = api.check(run_dir, batch_sizes=split_list(batch_sizes, int, "--batch-sizes") if batch_sizes else None,
                           min_speedup=min_speedup, draft=draft,
                           workloads=split_list(workloads, str, "--workloads") if workloads else None,
                           temperatures=split_list(temperatures, float, "--temperatures") if temperatures else None,
                           context_length=token_count(context_length) if context_length is not None else None,
                           slo=slo, allow_incomplete=allow_incomplete, hardware=hardware)
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
    if json_output:
        print(json.dumps(result.verdict.to_dict(), indent=2))
    else:
        print_check(result, every_batch_size=not batch_sizes)
    raise typer.Exit(result.exit_code)
