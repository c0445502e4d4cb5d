"""`specbench report`: charts, one HTML page and a Markdown summary of a run."""

from __future__ import annotations

from pathlib import Path
from typing import Optional

import typer
from rich.markup import escape

from specbench.api.runs import measured_batch_sizes, on_hardware, runnable_advice
from specbench.cli.common import check_price, console, errors, fail, known_errors
from specbench.cli.render import gate_text, print_analysis, print_warnings, slo_gate_text

def report(
    run_dir: Optional[Path] = typer.Argument(None, help="Run directory (default: the latest under results/)."),
    gpu_price: Optional[float] = typer.Option(None, help="$ per GPU-hour (per machine-hour on a CPU run)."),
    gpus: int = typer.Option(1, help="Devices the deployment uses (multiplies the hourly price)."),
    output: Optional[Path] = typer.Option(None, help="Where to write (default: RUN_DIR/report)."),
    slo: Optional[str] = typer.Option(None, help="Goodput and capacity under this SLO, e.g. ttft=1.0,tpot=0.05[,p90] "
                                                 "(default: the run's --slo)."),
    reference: Optional[Path] = typer.Option(None, help="A run of the same grid on another engine (e.g. --engine vllm): "
                                                       "the baseline's tokens/s is compared with its baseline's, and a "
                                                       "baseline far slower is a warning."),
    hardware: Optional[str] = typer.Option(None, help="A cluster run on several kinds of GPU: report the cells of "
                                                      "this one (a part of its name, e.g. H100)."),
) -> None:
    """Charts (PNG), one self-contained HTML page and a Markdown summary of a run."""
    from specbench.fit import completeness, parse_slo
    from specbench.gate import evaluate, evaluate_slo
    from specbench.report import write_report
    from specbench.results import load_run, recorded_config
    from specbench.grid import base_speculative_configs

    try:
        check_price(gpu_price, gpus)
        run = on_hardware(load_run(run_dir), hardware)
        if slo:
            parse_slo(slo)
        measured = measured_batch_sizes(run.cells)
        state = completeness(run.meta, run.cells)
        verdict = evaluate(run.cells, measured, base_configs=base_speculative_configs(run.meta, run.cells["draft"]),
                           state=state, allow_incomplete=True, requests=run.requests, steps=run.steps,
                           copies=run.baseline_copies) if measured else None
        if verdict is not None:
            runnable_advice(verdict, run)
        verdict_text = gate_text(verdict) if verdict else ""
        sections = {"rollout check at every measured batch size": verdict_text} if verdict_text else {}
        slo_text = slo or recorded_config(run.meta)["gate"].get("slo") or ""
        if slo_text:
            slo_result = evaluate_slo(run.cells, run.requests, parse_slo(slo_text), state=state,
                                      allow_incomplete=True)
            runnable_advice(slo_result, run)
            sections["rollout check under the SLO"] = slo_gate_text(slo_result)
        reference_run = load_run(reference) if reference is not None else None
        out_dir, analysis = write_report(run, output, gpu_price, gpus, sections, slo_text or None, verdict,
                                         reference_run)
    except KeyboardInterrupt:
        errors.print("[yellow]interrupted:[/] no report written (a report written before is kept as it was)",
                     highlight=False)
        raise
    except known_errors() as error:
        fail(str(error))
    if analysis.answer:
        console.print(f"[bold]{escape(analysis.answer)}[/]", highlight=False, soft_wrap=True)
    if analysis.baseline_note:
        console.print(escape(analysis.baseline_note), highlight=False, soft_wrap=True)
    print_analysis(analysis)
    print_warnings(analysis.warnings)
    for text in sections.values():  # the verdict's answer line is the one printed first
        lines = [line for line in text.splitlines() if line != analysis.answer]
        console.print("\n".join(lines), highlight=False, soft_wrap=True)
    console.print(f"report: [bold]{out_dir / 'report.html'}[/] (charts: {', '.join(p.name for p in sorted(out_dir.glob('*.png')))}; "
                  f"summary.md)")

