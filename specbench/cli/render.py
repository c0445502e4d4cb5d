"""Printing: tables and the text of verdicts, plans and analyses. No command logic lives here."""

from __future__ import annotations

import json

from rich.markup import escape
from rich.table import Table

from specbench.cli.common import console, errors


def column_blocks(table: Table, width: int, keep: int = 1) -> list[Table]:
    """`table` as it is where its columns fit in `width`; otherwise split into tables of the columns
    that fit, one after another, each opening with the first `keep` (the row's names), so that no
    header or number is folded a few characters a line (a 16-column table in an 80-column terminal).
    The kept columns take at most half the width: the widest of them folds (a K schedule's text)."""
    from rich.measure import Measurement

    limits: dict[int, int] = {}

    def block(indices: list[int]) -> Table:
        part = Table(title=table.title, title_justify=table.title_justify, header_style=table.header_style)
        for index in indices:
            column = table.columns[index]
            part.add_column(column.header, justify=column.justify, overflow="fold", no_wrap=column.no_wrap,
                            max_width=limits.get(index, column.max_width))
        for row in range(table.row_count):
            part.add_row(*[table.columns[index]._cells[row] for index in indices])
        return part

    def wanted(indices: list[int]) -> int:
        return Measurement.get(console, console.options.update(max_width=10**6), block(indices)).maximum

    every = list(range(len(table.columns)))
    if width <= 0 or wanted(every) <= width or len(every) <= keep + 1:
        return [table]
    kept = list(range(keep))
    excess = wanted(kept) - width // 2
    if excess > 0:  # the widest kept column folds by what the kept ones exceed half the width by
        widths = {index: wanted([index]) - 4 for index in kept}  # (less a lone column's borders and padding)
        widest = max(widths, key=widths.get)
        limits[widest] = max(8, widths[widest] - excess)
    blocks, current = [], list(kept)
    for index in every[keep:]:
        if len(current) > keep and wanted(current + [index]) > width:
            blocks.append(current)
            current = list(kept)
        current.append(index)
    blocks.append(current)
    parts = [block(indices) for indices in blocks]
    if table.title:
        for number, part in enumerate(parts, start=1):
            part.title = f"{table.title} ({number}/{len(parts)})"
    return parts


def print_table(table: Table, keep: int = 1) -> None:
    """A table on the console, split into column blocks where the terminal is too narrow for it."""
    for part in column_blocks(table, console.width, keep):
        console.print(part)


def print_notes(notes: list[str]) -> None:
    """The caveats under an answer's tables: `notes:`, then one indented line each."""
    if notes:
        console.print("notes:", highlight=False)
        for line in notes:
            console.print(f"  {line}", highlight=False, soft_wrap=True)


def fmt(value, spec: str = ".2f", empty: str = "–") -> str:
    try:
        if value is None or value != value:
            return empty
        return format(value, spec)
    except (TypeError, ValueError):
        return str(value)


def as_text(value) -> str:
    return "" if value is None or (isinstance(value, float) and value != value) else str(value)


def load_text(row: dict) -> str:
    """A cell's load: its batch size (B=4) or, open-loop, its request rate (4/s)."""
    from specbench.grid import format_rate

    rate = row.get("request_rate")
    if rate is not None and rate == rate and rate > 0:
        return format_rate(rate) + "/s"
    return as_text(row.get("batch_size"))


def cells_table(cells, title: str = "cells", limit: int | None = None) -> Table:
    """The key columns of a cells table: one row per cell."""
    table = Table(title=title, title_justify="left", header_style="bold")
    for column, justify in (("workload", "left"), ("load", "right"), ("T", "right"), ("draft", "left"), ("K", "right"),
                            ("tok/s", "right"), ("speed-up", "right"), ("α", "right"), ("τ", "right"),
                            ("TPOT p50 ms", "right"), ("lossless", "left"), ("status", "left")):
        table.add_column(column, overflow="fold", justify=justify)
    import pandas as pd

    from specbench.fit import label_cells

    frame = cells if isinstance(cells, pd.DataFrame) else pd.DataFrame(list(cells))
    rows = label_cells(frame).to_dict("records")  # synthetic acceptance and context length in the labels
    for row in rows[-limit:] if limit else rows:
        baseline = row.get("draft") == "autoregressive"
        speedup = row.get("speedup")
        speed_text = "–"
        if baseline:
            speed_text = "1×"
        elif speedup is not None and speedup == speedup:
            speed_text = f"[green]{speedup:.2f}×[/]" if speedup >= 1 else f"[red]{speedup:.2f}×[/]"
        lossless = as_text(row.get("lossless")).replace("n/a (sampled)", "n/a")
        if lossless == "MISMATCH":
            lossless = f"[bold red]{lossless}[/]"
        status = as_text(row.get("status"))
        tpot = row.get("tpot_p50_s")
        table.add_row(
            as_text(row.get("workload")), load_text(row), fmt(row.get("temperature"), "g"),
            "AR" if baseline else as_text(row.get("draft")), "" if baseline else as_text(row.get("k")),
            fmt(row.get("tokens_per_s"), ".1f"), speed_text, fmt(row.get("alpha")), fmt(row.get("tau")),
            fmt(tpot * 1e3 if tpot is not None else None, ".1f"), lossless,
            status if status == "ok" else f"[red]{status}[/]",
        )
    return table


def progress_line(row: dict, done: int, total: int, elapsed_s: float) -> str:
    """One finished cell as a plain line, for logs: id, tokens/s, speed-up, acceptance, checks, status."""
    parts = [f"[{done}/{total}]", as_text(row.get("cell_id")), f"{fmt(row.get('tokens_per_s'), '.1f')} tok/s"]
    if row.get("draft") not in (None, "autoregressive"):
        parts.append(f"{fmt(row.get('speedup'), '.2f')}×")
        parts.append(f"α {fmt(row.get('alpha'))}")
    if as_text(row.get("lossless")):
        parts.append(as_text(row.get("lossless")))
    status = as_text(row.get("status"))
    parts.append(status if status == "ok" else f"{status}: {as_text(row.get('message'))}")
    minutes, seconds = divmod(int(elapsed_s), 60)
    parts.append(f"({minutes}m{seconds:02d}s)")
    return "  ".join(parts)


def frame_table(frame, title: str, columns: list[str], formats: dict[str, str] | None = None) -> Table:
    from pandas.api.types import is_numeric_dtype

    formats = formats or {}
    table = Table(title=title, title_justify="left", header_style="bold")
    present = [c for c in columns if c in frame]
    for column in present:
        table.add_column(column, overflow="fold", justify="right" if is_numeric_dtype(frame[column]) else "left")
    for row in frame[present].itertuples(index=False):
        table.add_row(*[fmt(v, formats.get(c, ".3g")) if isinstance(v, float) else as_text(v) for c, v in zip(present, row)])
    return table


def print_warnings(warnings: list[str]) -> None:
    """measurement_warnings' messages, as warnings."""
    for message in warnings:
        errors.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def print_analysis(analysis) -> None:
    from specbench.fit import b_star_rule

    if not analysis.alphas.empty:
        print_table(frame_table(analysis.alphas, "α fit (i.i.d. MLE, 95% interval)",
                                   ["draft", "workload", "temperature", "alpha_iid", "alpha_low", "alpha_high",
                                    "acceptance_rate"], {"alpha_iid": ".3f", "alpha_low": ".3f", "alpha_high": ".3f",
                                                         "acceptance_rate": ".3f", "temperature": "g"}), keep=3)
        from specbench.report import ALPHA_NOTE

        console.print(f"  {ALPHA_NOTE}", highlight=False, soft_wrap=True)
    if not analysis.predicted.empty:
        p = analysis.predicted
        print_table(frame_table(p, "performance model: predicted vs measured (in-sample)",
                                   ["draft", "workload", "temperature", "context_length", "batch_size", "k",
                                    "tau_measured", "tau_predicted", "speedup_measured", "speedup_predicted",
                                    "speedup_error"], {"speedup_error": "+.1%", "temperature": "g"}), keep=6)
    print_trust(analysis.trust)
    if not analysis.crossovers.empty:
        print_table(frame_table(analysis.crossovers, "crossover batch size B*",
                                   ["draft", "workload", "temperature", "crossover"], {"temperature": "g"}), keep=3)
        console.print(f"  {b_star_rule()}; `worst case` rows: at each batch size the least favourable workload and "
                      f"temperature (what `check` judges)", highlight=False, soft_wrap=True)



def print_trust(lines: list[str]) -> None:
    """The performance model's held-out and in-sample errors, before any prediction is read."""
    if lines:
        console.print("[bold]how far the performance model's predictions can be trusted[/]")
        for line in lines:
            console.print(f"  {line}", highlight=False, soft_wrap=True)


def text_table(header: list[str], rows: list[list[str]]) -> list[str]:
    """Plain aligned columns, for a terminal, a CI log and summary.md alike."""
    widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
    return ["  ".join(cell.ljust(width) for cell, width in zip(row, widths)).rstrip() for row in [header, *rows]]


def gate_answer(result) -> str:
    """The verdict in one sentence: the line a pipeline's log shows first."""
    from specbench.gate import FAIL, INCONCLUSIVE, PASS, format_speedup

    head = f"{result.verdict} (exit {result.exit_code})" + (" on an incomplete run" if result.incomplete else "")
    chosen = next((v for v in result.verdicts if v.draft == result.draft), None)
    if chosen is None or result.exit_code not in (PASS, FAIL, INCONCLUSIVE):
        return f"{head}: {result.message}"
    bar = result.min_speedup

    def at(decision: str) -> str:
        return ", ".join(f"B={b} ({format_speedup(chosen.speedups[b], bar)})"
                         for b, d in chosen.decisions.items() if d == decision)

    if result.exit_code == FAIL:
        return f"{head}: speculation with {chosen.draft} is below {bar:g}× at {at('fail')}"
    if result.exit_code == INCONCLUSIVE:
        return f"{head}: speculation with {chosen.draft} is within noise of {bar:g}× at {at('inconclusive')}"
    return f"{head}: speculation with {chosen.draft} keeps at least {bar:g}× at B={', '.join(map(str, chosen.speedups))}"


def gate_text(result, question: str = "") -> str:
    """The answer line, a row per draft (its speed-up, K and decision at each batch size judged, its
    K schedule and B*), then the notes: what each decision rests on and what the terms mean."""
    from specbench.fit import b_star_rule, best_draft_rule
    from specbench.gate import DECISION_LABELS, evidence_text, format_speedup

    bar = result.min_speedup
    header = ["draft", "verdict", *(f"B={b}" for b in result.batch_sizes), "K schedule", "crossing the bar"]
    rows, notes = [], [f"question: {question}"] if question else []
    notes.append(f"verdict: {result.verdict}: {result.message} (exit {result.exit_code})")
    for v in result.verdicts:
        at = [f"{format_speedup(v.speedups[b], bar)} K={v.best_k[b]} "
              f"{DECISION_LABELS.get(v.decisions.get(b), 'N/A').strip()}" if b in v.speedups else "not measured"
              for b in result.batch_sizes]
        rows.append([v.draft, DECISION_LABELS.get(v.decision, "N/A").strip(), *at, v.schedule, v.crossover])
        evidence = {b: evidence_text(v, b).lstrip(";, ") for b in v.speedups}
        notes += [f"{v.draft} at B={b}: {text}" for b, text in evidence.items() if text]
        if v.ks_measured == 1:
            notes.append(f"{v.draft}: one K measured, so no K comparison")
    if result.advice:
        notes.append(f"next: {result.advice}")
    if result.noise.get("text") and any(n == 1 for v in result.verdicts for n in v.repeats.values()):
        notes.append(result.noise["text"])
    notes += [best_draft_rule(bar), f"{b_star_rule(bar)}, over the worst workload and temperature",
              "K schedule = at each measured batch size the fastest K shown to pay there (its interval, or one "
              "repeat's noise band, above the bar; never where that evidence lies above what acceptance allows), "
              "off elsewhere"]
    lines = [gate_answer(result), *(text_table(header, rows) if rows else []), "notes:", *(f"  {n}" for n in notes)]
    for v in result.verdicts:
        if v.speculative_config:
            lines.append(f"vLLM, {v.draft}: --speculative-config '{json.dumps(v.speculative_config)}'")
    return "\n".join(lines)


def slo_gate_text(result, question: str = "") -> str:
    from specbench.fit import capacity_text
    from specbench.gate import DECISION_LABELS, bounds_text

    lines = [f"{result.verdict} (exit {result.exit_code}): {result.message}"]
    for v in result.verdicts:
        state = DECISION_LABELS.get(v.decision, "N/A ")
        with_k = f" (K={v.k})" if v.k is not None else ""
        if v.bounds[0] != v.bounds[1] or v.baseline_bounds[0] != v.baseline_bounds[1]:
            with_k += f" [within noise: {bounds_text(v.bounds, result.load)} with, " \
                      f"{bounds_text(v.baseline_bounds, result.load)} without]"
        lines.append(f"{state} {v.workload}, T={v.temperature:g}: with {result.draft} "
                     f"{capacity_text(v.capacity, v.max_measured, result.load)}{with_k}, {fmt(v.tokens_per_s, '.1f')} tok/s; "
                     f"without {capacity_text(v.baseline_capacity, v.max_measured, result.load)}, "
                     f"{fmt(v.baseline_tokens_per_s, '.1f')} tok/s")
    lines += ["notes:", *([f"  question: {question}"] if question else [])]
    if result.advice:
        lines.append(f"  next: {result.advice}")
    lines.append("  capacity = the highest measured load up to which every measured load meets the SLO (at each load "
                 "the best K); a load meets it when the SLO's percentile of every bounded metric over its requests is "
                 "within the bound")
    return "\n".join(lines)


def print_gate_warnings(warnings: list[str]) -> None:
    """A verdict's warnings, on stdout with the verdict (a pipeline's log keeps them together)."""
    for message in warnings:
        console.print(f"[yellow]warning:[/] {escape(message)}", highlight=False, soft_wrap=True)


def print_check(result, every_batch_size: bool) -> None:
    """A check's question, its verdict and the run's warnings (`every_batch_size`: none was named)."""
    verdict, run = result.verdict, result.run
    if result.judges_slo:
        unit = "request rate" if verdict.load == "request_rate" else "concurrency"
        question = f"does speculation keep the highest {unit} meeting the SLO ({verdict.slo})? (run {run.path})"
        console.print(escape(slo_gate_text(verdict, question)), highlight=False, soft_wrap=True)
    else:
        which = " (every batch size the run measured; --batch-sizes to choose)" if every_batch_size else ""
        question = (f"does speculation keep ≥ {verdict.min_speedup:g}× at batch size(s) "
                    f"{', '.join(map(str, verdict.batch_sizes))}?{which} (run {run.path})")
        console.print(escape(gate_text(verdict, question)), highlight=False, soft_wrap=True)
    print_gate_warnings(verdict.warnings)


def print_prediction(prediction) -> None:
    """`plan RUN`'s answer: where its step times and α come from, what it rests on, the tables."""
    from specbench import fit

    console.print(f"[bold]{prediction.answer}[/]", highlight=False, soft_wrap=True)
    print_warnings(prediction.warnings)
    print_plan(prediction.table, prediction.batch_sizes,
               "$/1M tok" if prediction.price is not None else "device-h/1M tok")
    label = "[bold red]ESTIMATE[/] for " + prediction.estimate if prediction.estimate else "[bold yellow]PREDICTIONS[/]"
    source = (f"{label} from step times of {prediction.step_times_from} and α of {prediction.alpha_from} (not "
              f"measurements; {prediction.price_note}); {prediction.output_tokens} output tokens per request"
              + (" (--max-new-tokens)" if prediction.output_tokens_given else " (the run's; --max-new-tokens to change)"))
    print_notes([source] + ([f"TRANSFERRED ACCEPTANCE: {prediction.transferred}"] if prediction.transferred else [])
                + [f"left out: {why}" for why in prediction.left_out] + list(prediction.trust)
                + [f"{fit.b_star_rule()}; {fit.best_draft_rule()}"])


def print_plan(table, sizes: list[int], unit: str) -> None:
    from specbench.fit import AR, crossover, pick_best_draft
    from specbench.gate import format_speedup

    keys = ["workload", "temperature", "context_length"]
    for (workload, temperature, context), group in table.groupby(keys):
        best = group[group["draft"] != AR].sort_values("speedup", ascending=False) \
            .drop_duplicates(["draft", "batch_size"]).sort_values(["draft", "batch_size"])
        if best.empty:
            continue
        where = f"{workload}" + (f" at {int(context)} tokens" if context else "") + f", T={temperature:g}"
        shown = Table(title=f"predicted best K per batch size: {where}", title_justify="left", header_style="bold")
        for column in ("draft", "B", "best K", "α (i.i.d. fit)", "τ", "speed-up", "measured", "tok/s", unit):
            shown.add_column(column, overflow="fold")
        for row in best.itertuples():
            mark = "*" if row.extrapolated_b else "~" if row.interpolated_b else ""
            measured = getattr(row, "speedup_measured", float("nan"))
            shown.add_row(row.draft, f"{row.batch_size}{mark}", f"{row.k}{'†' if row.extrapolated_k else ''}",
                          f"{row.alpha_iid:.2f}", f"{row.tau:.2f}", format_speedup(row.speedup, 1.0, fewest=2),
                          format_speedup(measured, 1.0, fewest=2) if measured == measured else "–",
                          f"{row.tokens_per_s:.1f}", f"{row.cost_per_1m:.3g}")
        print_table(shown, keep=2)
        for draft, rows in best.groupby("draft"):
            found = crossover(rows["batch_size"].tolist(), rows["speedup"].tolist(), sizes="predicted")
            console.print(f"  {draft}: predicted {found.text}", highlight=False)
        leader = pick_best_draft(best, sizes)
        if leader:
            console.print(f"  predicted best draft: {leader}", highlight=False)
        if "speedup_measured" in best and best["speedup_measured"].notna().any():
            console.print("  measured = the run's own speed-up at that draft, K and B, beside the model's (which was "
                          "fitted on it)", highlight=False, soft_wrap=True)
        marks = []
        if group["interpolated_b"].any():
            marks.append("~ a batch size between measured ones (interpolated)")
        if group["extrapolated_b"].any():
            marks.append("* a batch size outside the measured ones")
        if best["extrapolated_k"].any():
            marks.append("† a K outside the measured ones (its draft and verify costs from the model alone)")
        if group["extrapolated_context"].any():
            marks.append("a context length not measured: prompts of that length, α as measured at the run's own")
        if marks:
            console.print("  " + "; ".join(marks) + ": sweep them before relying on them", highlight=False,
                          soft_wrap=True)
