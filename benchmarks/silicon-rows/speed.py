"""How fast the fleet simulator is (issue 40, part 5: a one-hour trace × 20 configurations in
under 60 s on this 2-core CPU).

The whole azure-conv trace (one hour, 19,366 requests) at 1× through a fleet of llama3-70b
replicas on the H100 tables behind a least-outstanding router, for 20 configurations: the
baseline, and 1b and 8b drafts at K = 1..4 at α 0.7 and 0.8 (with a K schedule each where the
tables pick one), at TP4 with 2 replicas; one simulation each, timed, the configurations side by
side on every core (`fleet.workers`, as `plan --trace` runs them); the trace read once.

    python benchmarks/silicon-rows/speed.py

Writes speed.md next to this file.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specbench.cli.plan_fleet import load_traffic  # noqa: E402
from specbench.cli.plan_tables import target_and_drafters  # noqa: E402
from specbench.fit import kernel_tables  # noqa: E402
from specbench.fit.table_plan import Acceptance, TablePlanner  # noqa: E402
from specbench.fleet.plan import configurations  # noqa: E402
from specbench.fleet.sizing import fleet_at  # noqa: E402
from specbench.fleet.workers import cores, in_processes  # noqa: E402

HERE = Path(__file__).resolve().parent
REPLICAS, TP = 2, 4


def python_loop_s() -> float:
    """Seconds this machine's Python takes for ten million plain loop iterations: the simulator is
    Python, so its times compare across VMs through this (two 2-core VMs named "AMD EPYC" differed 4-5x)."""
    began, total = time.perf_counter(), 0
    for i in range(10_000_000):
        total += i * i % 7
    return time.perf_counter() - began


def main() -> None:
    loop_s = python_loop_s()
    started = time.perf_counter()
    family, name, config, drafters = target_and_drafters("llama3-70b", "1b,8b")
    traffic, _ = load_traffic("azure-conv", "", int(config["max_position_embeddings"]))
    planner = TablePlanner(config, name, kernel_tables.check_device("h100", "vllm"), "vllm")
    accepted = [Acceptance(d.name, f"α {a:g}", a) for d in drafters for a in (0.7, 0.8)]
    isl, osl = int(round(traffic.prompts.mean())), int(round(traffic.outputs.mean()))
    found = configurations(planner, drafters, accepted, TP, None, [1, 2, 3, 4], isl, osl, schedules=True)[:20]
    prepared = time.perf_counter() - started
    lines = [f"# Fleet simulator speed: {traffic.name} (one hour, {len(traffic.prompts)} requests) at 1×, "
             f"{REPLICAS} llama3-70b TP{TP} replicas on the H100 tables, least-outstanding", "",
             "| configuration | simulated s | p50 TPOT ms | requests |", "|---|---|---|---|"]

    def simulated(configuration) -> tuple[float, float, int]:
        began = time.perf_counter()
        fleet = fleet_at(traffic, 1.0, configuration.cost, configuration.spec, REPLICAS, configuration.speculation,
                         "least-outstanding")
        return (time.perf_counter() - began, float(np.nanmedian(fleet.outcome.tpot_s)),
                int(np.isfinite(fleet.outcome.finish_s).sum()))

    began = time.perf_counter()
    timed = in_processes(simulated, found)  # one configuration a worker, a worker a core
    wall = time.perf_counter() - began
    for configuration, (seconds, tpot_s, served) in zip(found, timed):
        lines.append(f"| {configuration.label} | {seconds:.2f} | {tpot_s * 1e3:.1f} | {served} |")
    lines += ["", f"{len(found)} configurations simulated in {wall:.1f} s on {cores()} worker processes (the target: "
                  f"under 60 s; {sum(s for s, _, _ in timed):.1f} s of simulation, one after another), plus "
                  f"{prepared:.1f} s to read the trace and price the configurations; this {os.cpu_count()}-core VM, "
                  f"whose Python runs ten million plain loop iterations in {loop_s:.1f} s."]
    (HERE / "speed.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
