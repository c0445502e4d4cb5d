"""`specbench plan --target MODEL --device GPU --tp 4,8`: api.price's answer, speculative decoding
priced from NVIDIA's measured kernel tables with no run, as tables and lines."""

from __future__ import annotations

import math

from rich.table import Table

from specbench.cli.common import console, split_list
from specbench.cli.render import print_notes, print_table


def target_and_drafters(target: str, drafts: str) -> tuple[str | None, str, dict, list]:
    """--target and --drafts' text: (the target's family, its name, its config, the drafters)."""
    from specbench.api.tables import target_and_drafters

    return target_and_drafters(target, split_list(drafts, str, "--drafts"))


def print_price(priced) -> None:
    """api.TablePrice as the command prints it: the answer, a table per TP, prompt length and
    acceptance, the SLO's choice, then notes: what it rests on and the step notes."""
    console.print(f"[bold]{priced.answer}[/]", highlight=False, soft_wrap=True)
    layout = priced.layout
    print_table_plan(priced.table, priced.decisions, priced.unit,
                     (f" × DP{layout['dp']}" if layout.get("dp", 1) > 1 else "")
                     + (" with EP" if layout.get("expert_parallel") else ""))
    if priced.slo_choices is not None:
        print_slo(priced.slo_choices, priced.unit)
    source = (f"[bold red]ESTIMATE[/] from {priced.tables}: {priced.target}{priced.precision} with "
              f"{', '.join(f'{name} ({label})' for name, label in priced.drafters.items())}; α from "
              f"{priced.alpha_from}; {priced.output_tokens} output tokens per request, its prompt's prefill counted "
              f"in tok/s, speed-up and $; prices {priced.price_note}; not measurements")
    notes = [source, *priced.notes] + ([f"TRANSFERRED ACCEPTANCE: {priced.transferred}"] if priced.transferred else []) \
        + [f"left out: {why}" for why in priced.left_out] \
        + [("CORRECTED: " if not n else "") + line for n, line in enumerate(priced.corrected)] \
        + [f"† {line}" for line in priced.step_notes] \
        + [f"{len(priced.table)} cells priced in {priced.seconds:.1f} s"]
    if priced.step_notes:
        notes.insert(len(notes) - 1 - len(priced.step_notes), "† marks a step the tables price below what an engine can run")
    print_notes(notes)


def print_table_plan(table, decided, unit: str, layout: str = "") -> None:
    """`layout`: what follows each TP in the titles (" × DP8 with EP")."""
    from specbench.fit import AR
    from specbench.fit.table_plan import best_k

    best = best_k(table)
    ar = table[table["draft"] == AR].set_index(["tp", "context_length", "batch_size"])
    for (tp, context, acceptance), group in best.groupby(["tp", "context_length", "acceptance"]):
        shown = Table(title=f"TP{tp}{layout}, {context}-token prompts, {acceptance}: best K per batch size",
                      title_justify="left", header_style="bold")
        for column in ("draft", "B", "K", "τ", "AR step ms", "SD step ms", "AR tok/s/GPU", "SD tok/s/GPU",
                       "tok/s/user", "speed-up", f"AR {unit}", f"SD {unit}", "GiB/GPU"):
            shown.add_column(column, overflow="fold")
        for row in group.itertuples():
            base = ar.loc[(tp, context, row.batch_size)]
            mark = lambda flagged: " †" if flagged else ""  # noqa: E731  (flag_steps: see the notes)
            shown.add_row(row.draft, str(row.batch_size), str(row.k), f"{row.tau:.2f}",
                          f"{row.ar_step_ms:.2f}{mark(base.get('step_flag'))}",
                          f"{row.step_ms:.2f}{mark(getattr(row, 'step_flag', ''))}", f"{base['tokens_per_s_per_gpu']:.0f}", f"{row.tokens_per_s_per_gpu:.0f}",
                          f"{row.tokens_per_s_per_user:.0f}", f"{row.speedup:.2f}×", f"{base['cost_per_1m']:.3g}",
                          f"{row.cost_per_1m:.3g}", f"{row.memory_gib:.0f}")
        print_table(shown, keep=3)
        for row in decided[(decided["tp"] == tp) & (decided["context_length"] == context)
                           & (decided["acceptance"] == acceptance)].itertuples():
            console.print(f"  {row.draft}: {row.crossover}; K schedule {row.k_schedule}", highlight=False,
                          soft_wrap=True)
    unfit = table[~table["fits"]]
    for (tp, context, draft), group in unfit.groupby(["tp", "context_length", "draft"]):
        largests = sorted({int(b) for b in group["largest_batch"]})  # a deeper K holds more KV a row
        largest = str(largests[0]) if len(largests) == 1 else f"{largests[0]} to {largests[-1]}, by K"
        console.print(f"  does not fit: TP{tp}{layout}, {context}-token prompts, {draft}: B = "
                      f"{', '.join(str(b) for b in sorted(set(group['batch_size'])))} "
                      + (f"(the largest batch that fits is {largest})" if largests[-1] else
                         "(no batch fits: the weights alone exceed the GPUs' memory)"),
                      highlight=False, soft_wrap=True)


def print_slo(slo_table, unit: str) -> None:
    target = slo_table["tpot_ms_target"].iloc[0]
    shown = Table(title=f"TPOT ≤ {target:g} ms: the batch with the most tokens/s per GPU that meets it",
                  title_justify="left", header_style="bold")
    for column in ("TP", "prompt", "acceptance", "AR B", f"AR {unit}", "SD draft, K, B", f"SD {unit}", "cheapest"):
        shown.add_column(column, overflow="fold")
    for row in slo_table.itertuples():
        none = lambda v: v is None or (isinstance(v, float) and math.isnan(v))  # noqa: E731
        shown.add_row(str(row.tp), str(row.context_length), row.acceptance,
                      "–" if none(row.ar_batch) else str(int(row.ar_batch)),
                      "–" if none(row.ar_cost_per_1m) else f"{row.ar_cost_per_1m:.3g}",
                      "–" if none(row.sd_batch) else f"{row.sd_draft}, {int(row.sd_k)}, {int(row.sd_batch)}",
                      "–" if none(row.sd_cost_per_1m) else f"{row.sd_cost_per_1m:.3g}", row.cheapest or "none meets it")
    print_table(shown, keep=3)
