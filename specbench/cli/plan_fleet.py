"""`specbench plan` with a served load, as tables and sentences: api.closed_loop's answer (one
replica under closed-loop clients, `--concurrency`) and api.size_fleet's (the fewest replicas
behind a router that meet an SLO at a trace, `--trace --slo`), each on the kernel tables (`--target`)
or a vLLM run's servers (RUN_DIR); and the progress line while they simulate."""

from __future__ import annotations

import math
from contextlib import contextmanager

import typer
from rich.table import Table

from specbench.api.replicas import load_traffic, server_note  # noqa: F401  (load_traffic: benchmarks import it here)
from specbench.cli.common import console, errors, stop_code
from specbench.cli.render import print_notes, print_table
from specbench.fleet.sizing import HOURS_PER_MONTH, MOST_REPLICAS


def _head_notes(head: dict, what: str, left_out: list[str], transferred: str) -> list[str]:
    """What a served plan rests on, one note each: the source (SIMULATED), the check on NVIDIA's rows,
    the acceptance, what lies beyond the run, what was left out."""
    kv = server_note(head) + (f", draft models {head['draft_dtype']}" if head.get("draft_dtype", "bf16") != "bf16"
                               else "")
    alpha = f"α from {head['alpha_from']}" if head.get("alpha_from") else "no speculation simulated"
    return [f"[bold red]SIMULATED[/] {head['estimate'].removeprefix('SIMULATED on ')}: {head['target']} "
            f"({head['dtype']}{kv}), {what}; {alpha}; not measurements"] + \
        ([head["checked"]] if head.get("checked") else []) + list(head.get("layout") or []) + \
        ([f"TRANSFERRED ACCEPTANCE: {transferred}"] if transferred else []) + \
        [f"BEYOND THE RUN: {why}" for why in head.get("beyond_measured", [])] + \
        [f"left out: {why}" for why in left_out]


@contextmanager
def progress(doing: str):
    """A progress line on stderr while a plan simulates (left off --json's stdout, and gone when
    done; none where stderr is not a terminal), yielding the library's on_progress(done, total,
    label). On Ctrl-C (or SIGTERM) it prints what had finished, one line each, and exits 130 (143)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    shown = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("configurations,"),
                     TimeElapsedColumn(), TextColumn("elapsed, about"), TimeRemainingColumn(), TextColumn("left"),
                     console=errors, transient=True, disable=not errors.is_terminal)
    task = shown.add_task(doing, total=None)
    finished: list[str] = []

    def on_progress(done: int, total: int, label: str) -> None:
        if label:
            finished.append(label)
        shown.update(task, completed=done, total=total)

    try:
        with shown:
            yield on_progress
    except KeyboardInterrupt:
        errors.print(f"[yellow]stopped[/] after {len(finished)} configuration{'s' if len(finished) != 1 else ''}"
                     + (" (SIMULATED):" if finished else ""), highlight=False)
        for label in finished:
            errors.print(f"  {label}", highlight=False, soft_wrap=True, markup=False)
        raise typer.Exit(stop_code()) from None


def print_closed_loop(loop) -> None:
    """api.ClosedLoop: a table per TP × clients with its sentence, the capacity, the chart's path."""
    from specbench.fleet.plan import CLIENTS, loop_label

    clients = CLIENTS[loop.clients]
    groups = list(loop.table.groupby(["tp", "concurrency"], sort=False))
    how = ("started apart, the steady state" if not clients.together else
           f"all started at once, {clients.requests_per_client} requests each, "
           + (f"lengths {clients.shortest_share:g}-1× these, every request measured (as InferenceMAX's benchmark)"
              if clients.shortest_share < 1 else "every request measured (as vllm bench serve, a sweep cell)"))
    shared = f" (the first {loop.prefix_len} the same in every prompt)" if loop.prefix_len else ""
    console.print(f"[bold]{loop.answer}[/]", highlight=False, soft_wrap=True)
    notes = _head_notes(loop.head, f"{loop.replica}, closed loop of C clients ({how}), {loop.input_len} tokens "
                                   f"in{shared} and {loop.output_len} out; prices {loop.price_note}", loop.left_out,
                        loop.transferred)
    unit = "$/1M tok" if loop.price is not None else f"{loop.device}-h/1M tok"
    for ((tp, concurrency), group), answer in zip(groups, loop.answers):
        shown = Table(title=loop_label(tp, concurrency, loop.device), title_justify="left", header_style="bold")
        for column in ("draft", "K", "acceptance", "TTFT p50 ms", "TTFT p99 ms", "TTFT mean ms", "TPOT p50 ms",
                       "TPOT p99 ms", "chunk ITL p50 ms", "chunk ITL p99 ms", "E2E p50 s", f"tok/s/{loop.device}", unit,
                       "TPOT speed-up", "mean B", "time at B≥32") + (("good", "meets SLO") if loop.slo else ()):
            shown.add_column(column, overflow="fold")
        for row in group.itertuples():
            shown.add_row(row.draft, f"schedule {row.k_schedule}" if row.k_schedule else str(row.k) if row.k else "",
                          row.acceptance, f"{row.ttft_p50_ms:.0f}",
                          f"{row.ttft_p99_ms:.0f}", f"{row.ttft_mean_ms:.0f}", f"{row.tpot_p50_ms:.1f}",
                          f"{row.tpot_p99_ms:.1f}", f"{row.itl_chunk_p50_ms:.1f}", f"{row.itl_chunk_p99_ms:.1f}",
                          f"{row.e2e_p50_ms / 1e3:.2f}", f"{row.tokens_per_s_per_gpu:.0f}",
                          f"{row.dollars_per_million_tokens if loop.price is not None else row.gpu_hours_per_million_tokens:.2f}",
                          f"{row.tpot_speedup:.2f}×", f"{row.mean_running_batch:.1f}",
                          f"{row.share_at_large_batch:.0%}",
                          *((f"{row.good_share:.1%}", "yes" if row.meets_slo else "no") if loop.slo else ()))
        print_table(shown, keep=3)
        if answer:
            console.print(answer, highlight=False, soft_wrap=True)
    for line in loop.capacity:
        console.print(line, highlight=False, soft_wrap=True)
    if loop.chart is not None:
        console.print(f"chart: {loop.chart}", highlight=False, soft_wrap=True)
    print_notes(notes + [f"{len(loop.table)} configurations simulated in {loop.seconds:.1f} s"])


def print_fleet(sized) -> None:
    """api.FleetSizes: a table per TP × traffic scale, the sentences, the chart's path."""
    table, traffic, replay, device = sized.table, sized.traffic, sized.replay, sized.device
    cached = (table["prefix_hit_share"] > 0).any() if "prefix_hit_share" in table else False
    shares = (f"; its prompts share prefixes as its hash ids say ({traffic.prefix_unit_tokens}-token blocks)"
              + (", found in each replica's prefix cache" if cached else "") if traffic.prefixes is not None else "")
    if sized.router == "prefix-aware" and traffic.prefixes is None:  # (an Azure trace carries no hash ids)
        shares = "; no prefixes in it, so the router weighs the servers' queues and free KV cache alone"
    console.print(f"[bold]{sized.answer}[/]", highlight=False, soft_wrap=True)
    notes = _head_notes(sized.head, f"replicas behind a {sized.router} router serving {traffic.name} "
                            f"({len(traffic.prompts)} requests, {traffic.rate():.2f} req/s at 1×{shares}); sized to "
                            f"{sized.slo.describe()} at {1 + sized.headroom:g}× each traffic; prices "
                            f"{sized.price_note}", sized.left_out + replay.notes(), sized.transferred)
    unit = "$" if sized.price is not None else f"{device}-h"
    shared = traffic.prefixes is not None  # the trace says what its prompts share: the prefix cache's hits shown
    columns = ["configuration", "replicas", f"{device}s", f"{unit}/month", f"{unit}/1M tok", "TTFT p50 ms",
               "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "chunk ITL p99 ms", "E2E p50 s", "good", "time at B≥32"]
    columns += ["prompt found cached"] if shared else []
    for (tp, scale), group in table.groupby(["tp", "scale"], sort=False):
        if group["replicas"].isna().all():  # no configuration sized: its sentence below says why, a blank table not
            continue
        shown = Table(title=f"{f'TP{tp}, ' if device == 'GPU' else ''}{traffic.name} at {scale:g}× "
                            f"({traffic.rate(scale):.2f} req/s)", title_justify="left", header_style="bold")
        for column in columns:
            shown.add_column(column, overflow="fold")
        for row in group.itertuples():
            if not row.replicas == row.replicas:
                idle = getattr(row, "idle_at", math.nan)
                shown.add_row(row.configuration, "none (alone misses)" if not row.reachable else
                              f"none (uses {int(row.used_at)} of {int(idle)})" if idle == idle else f">{MOST_REPLICAS}",
                              *[""] * (len(columns) - 2))
                continue
            monthly = row.dollars_per_month if sized.price is not None else row.gpus * HOURS_PER_MONTH
            per_million = row.dollars_per_million_tokens if sized.price is not None else \
                row.gpus / (traffic.output_tokens_per_s(scale) * 3600) * 1e6
            shown.add_row(row.configuration, str(int(row.replicas)), str(int(row.gpus)), f"{monthly:,.0f}",
                          f"{per_million:.2f}", f"{row.ttft_p50_ms:.0f}", f"{row.ttft_p99_ms:.0f}",
                          f"{row.tpot_p50_ms:.1f}", f"{row.tpot_p99_ms:.1f}", f"{row.itl_chunk_p99_ms:.0f}",
                          f"{row.e2e_p50_ms / 1e3:.1f}",
                          f"{row.good_share:.1%}", f"{row.share_at_large_batch_mean:.0%} (max "
                                                   f"{row.share_at_large_batch_max:.0%})",
                          *([f"{row.prefix_hit_share:.0%}"] if shared else []))
        print_table(shown, keep=1)
    for sentence in sized.answers:
        console.print(sentence, highlight=False, soft_wrap=True)
    if sized.chart is not None:
        console.print(f"chart: {sized.chart}", highlight=False)
    print_notes(notes + [f"{len(table)} configurations sized in {sized.seconds:.1f} s"])


def print_fleet_as_is(fleet) -> None:
    """api.FleetAsIs: a table per TP × traffic scale (latency percentiles per configuration), the
    chart's path, then the notes."""
    table, traffic, device = fleet.table, fleet.traffic, fleet.device
    console.print(f"[bold]{fleet.answer}[/]", highlight=False, soft_wrap=True)
    slo = f", judged at {fleet.slo.describe()}" if fleet.slo else ""
    notes = _head_notes(fleet.head, f"{fleet.replicas} replica{'s' if fleet.replicas > 1 else ''} as they are behind a {fleet.router} router serving "
                                    f"{traffic.name} ({len(traffic.prompts)} requests, {traffic.rate():.2f} req/s at "
                                    f"1×){slo}; prices {fleet.price_note}", fleet.left_out + fleet.replay.notes(),
                        fleet.transferred)
    unit = "$" if fleet.price is not None else f"{device}-h"
    columns = ["configuration", "TTFT p50 ms", "TTFT p90 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p90 ms",
               "TPOT p99 ms", "E2E p50 s", "E2E p90 s", "E2E p99 s", "E2E speed-up", "TPOT speed-up", "time at B≥32"]
    columns += [f"{unit}/1M tok"] + (["good", "meets SLO"] if fleet.slo else [])
    for (tp, scale), group in table.groupby(["tp", "scale"], sort=False):
        shown = Table(title=f"{f'TP{tp}, ' if device == 'GPU' else ''}{fleet.replicas} × {traffic.name} at "
                            f"{scale:g}× ({traffic.rate(scale):.2f} req/s)", title_justify="left", header_style="bold")
        for column in columns:
            shown.add_column(column, overflow="fold")
        for row in group.itertuples():
            per_million = row.dollars_per_million_tokens if fleet.price is not None else \
                row.gpus / (traffic.output_tokens_per_s(scale) * 3600) * 1e6
            shown.add_row(row.configuration, f"{row.ttft_p50_ms:.0f}", f"{row.ttft_p90_ms:.0f}",
                          f"{row.ttft_p99_ms:.0f}", f"{row.tpot_p50_ms:.1f}", f"{row.tpot_p90_ms:.1f}",
                          f"{row.tpot_p99_ms:.1f}", f"{row.e2e_p50_ms / 1e3:.1f}", f"{row.e2e_p90_ms / 1e3:.1f}",
                          f"{row.e2e_p99_ms / 1e3:.1f}", f"{row.e2e_speedup:.2f}×", f"{row.tpot_speedup:.2f}×",
                          f"{row.share_at_large_batch_mean:.0%}", f"{per_million:.2f}",
                          *((f"{row.good_share:.1%}", "yes" if row.meets_slo else "no") if fleet.slo else ()))
        print_table(shown, keep=1)
    if fleet.chart is not None:
        console.print(f"chart: {fleet.chart}", highlight=False)
    print_notes(notes + [f"{len(table)} configurations × scales simulated in {fleet.seconds:.1f} s"])
