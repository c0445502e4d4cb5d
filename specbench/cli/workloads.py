"""`specbench workloads`: the prompt sets and their prompt lengths."""

from __future__ import annotations

import typer
from rich.table import Table

from specbench.cli.common import console, errors, quiet_libraries

def workloads(
    tokenizer: str = typer.Option("smollm2-135m", help="Model whose tokenizer measures prompt lengths."),
    chat_template: bool = typer.Option(True),
) -> None:
    """Prompt sets, their sizes and prompt-length statistics."""
    quiet_libraries()
    from specbench.models import ModelNotAvailable, load_tokenizer
    from specbench.workloads import WorkloadError, available_workloads, encode_prompt, length_stats, load_workload

    try:
        tok = load_tokenizer(tokenizer)
    except ModelNotAvailable as error:
        errors.print(f"[yellow]{error}; prompt lengths in characters instead[/]")
        tok = None
    unit = "tokens" if tok is not None else "chars"
    table = Table(title=f"workloads (prompt lengths in {unit})", title_justify="left", header_style="bold")
    for column in ("name", "prompts", "categories", "mean", "p50", "max", "source"):
        table.add_column(column, overflow="fold")
    for name in available_workloads():
        try:
            workload = load_workload(name)
        except WorkloadError as error:
            table.add_row(name, "–", "–", "–", "–", "–", f"[dim]{error}[/]")
            continue
        lengths = [len(encode_prompt(r, tok, chat_template)) if tok else len(r.text) for r in workload.records]
        stats = length_stats(lengths)
        categories = len({r.category.split("/")[0] for r in workload.records})
        table.add_row(name, str(stats["count"]), str(categories), f"{stats['mean']:.0f}", str(stats["p50"]),
                      str(stats["max"]), workload.source)
    console.print(table)
    console.print("Also: any .jsonl/.csv/.parquet file (FILE::COLUMN to pick the column) or hf:ORG/NAME[:SPLIT[:COLUMN]].")
    from specbench.traces import SHIPPED, TraceError, load_trace

    traces = Table(title="request traces (sweep --trace NAME; lengths in tokens)", title_justify="left",
                   header_style="bold")
    for column in ("name", "questions from", "requests", "duration s", "req/s", "input p50/p90/p99",
                   "output p50/p90/p99"):
        traces.add_column(column, overflow="fold")
    for name in SHIPPED:
        try:
            trace = load_trace(name)
        except TraceError as error:
            traces.add_row(name, "–", "–", "–", "–", "–", f"[dim]{error}[/]")
            continue
        stats = trace.stats()
        traces.add_row(name, trace.workload, str(stats["requests"]), f"{stats['duration_s']:.0f}", f"{stats['rate']:.2f}",
                       "/".join(f"{stats[f'input_p{p}']:.0f}" for p in (50, 90, 99)),
                       "/".join(f"{stats[f'output_p{p}']:.0f}" for p in (50, 90, 99)))
    console.print(traces)
    console.print("Also: a Mooncake .jsonl (or .jsonl.gz), an Azure LLM trace .csv or a BurstGPT .csv "
                  "(workloads/traces/README.md).")

