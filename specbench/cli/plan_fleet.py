"""`specbench plan --target MODEL --device GPU --tp 4 --concurrency 4,16,64 --input-len 8192
--output-len 1024`: one replica simulated step by step on the kernel tables, with and without
speculation, at each concurrency (specbench.fleet; docs/performance-model.md, "The fleet simulator")."""

from __future__ import annotations

import json
import time
from pathlib import Path

from rich.table import Table

from specbench.cli.common import UsageError, console

QUANTS = {"bf16": None, "fp16": None, "fp8": "fp8", "fp4": "nvfp4"}


def plan_fleet(target: str, drafts: str, device: str, backend: str, tps: str, draft_tp: str | None, ks: list[int],
               concurrencies: list[int], input_len: int, output_len: int, alpha: str | None,
               acceptance: Path | None, dtype: str | None, json_output: bool) -> None:
    from specbench.cli.plan_tables import gather_acceptance, parse_tp, target_and_drafters
    from specbench.fit import kernel_tables
    from specbench.fit import table_plan as tp_plan
    from specbench.fleet.plan import closed_loop_table

    started = time.perf_counter()
    if input_len < 1 or output_len < 1 or any(c < 1 for c in concurrencies):
        raise UsageError("--concurrency, --input-len and --output-len must be >= 1")
    if (dtype or "bf16") not in QUANTS:
        raise UsageError(f"--dtype on the tables must be one of {', '.join(QUANTS)}, got {dtype!r}")
    tp_sizes, draft_tp_size = parse_tp(tps, draft_tp)
    system = kernel_tables.check_device(device, backend)
    family, target_name, target_config, drafters = target_and_drafters(target, drafts)
    if alpha is None and acceptance is None:  # the baseline alone: speculation needs an acceptance
        left_out = [f"{', '.join(d.name for d in drafters)}: no acceptance to simulate speculation with (--alpha "
                    f"0.6,0.7,0.8 or --acceptance RUN): the baseline alone"]
        drafters, accepted, transferred, alpha_from = [], [], "", "nowhere (no speculation simulated)"
    else:
        drafters, accepted, left_out, transferred, alpha_from = gather_acceptance(
            drafters, alpha, acceptance, target_name, family)
    planner = tp_plan.TablePlanner(target_config, target_name, system, backend)
    table, unpriced = closed_loop_table(planner, drafters, accepted, tp_sizes, draft_tp_size, ks, concurrencies,
                                        input_len, output_len, QUANTS[dtype or "bf16"])
    left_out += unpriced
    label = f"SIMULATED on {kernel_tables.label(system, backend)}"
    seconds = time.perf_counter() - started
    if json_output:
        print(json.dumps({"estimate": label, "target": target_name, "device": system, "backend": backend,
                          "dtype": dtype or "bf16", "input_len": input_len, "output_len": output_len,
                          "alpha_from": alpha_from, "acceptance_transferred": transferred or None,
                          "drafts_left_out": left_out, "seconds": round(seconds, 3),
                          "rows": json.loads(table.to_json(orient="records"))}, indent=2))
        return
    console.print(f"[bold red]SIMULATED[/] {label.removeprefix('SIMULATED on ')}: {target_name} "
                  f"({dtype or 'bf16'}), one vLLM-like replica, closed loop of C clients, {input_len} tokens in and "
                  f"{output_len} out; α from {alpha_from}; not measurements", highlight=False, soft_wrap=True)
    for line in ([f"TRANSFERRED ACCEPTANCE: {transferred}"] if transferred else []) + \
            [f"left out: {why}" for why in left_out]:
        console.print(line, highlight=False, soft_wrap=True)
    for (tp, concurrency), group in table.groupby(["tp", "concurrency"], sort=False):
        shown = Table(title=f"TP{tp}, {concurrency} clients", title_justify="left", header_style="bold")
        for column in ("draft", "K", "acceptance", "TTFT p50 ms", "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms",
                       "E2E p50 s", "tok/s/GPU", "TPOT speed-up", "time at B≥32"):
            shown.add_column(column, overflow="fold")
        for row in group.itertuples():
            shown.add_row(row.draft, str(row.k) if row.k else "", row.acceptance, f"{row.ttft_p50_ms:.0f}",
                          f"{row.ttft_p99_ms:.0f}", f"{row.tpot_p50_ms:.1f}", f"{row.tpot_p99_ms:.1f}",
                          f"{row.e2e_p50_ms / 1e3:.2f}", f"{row.tokens_per_s_per_gpu:.0f}", f"{row.tpot_speedup:.2f}×",
                          f"{row.share_at_large_batch:.0%}")
        console.print(shown)
    console.print(f"{len(table)} configurations simulated in {seconds:.1f} s", highlight=False)
