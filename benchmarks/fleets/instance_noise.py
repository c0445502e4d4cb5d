"""How much one one-core vLLM CPU server's speed differs from the next one's: the noise floor under
part 3's and part 4's targets (p50 TPOT within 10 %), where a calibration and a replay run minutes
apart and the replay's servers are other server processes.

Three servers started one after another, each taskset to core 0 as measure.py starts them; each
serves eight lone requests (512-token prompt, 200 tokens out, nothing else running). Per server:
the TPOT of each request, and the share of the core its three processes took (API server, engine
core, worker: vLLM 0.32 CPU runs them as separate processes, all on the one core here).

    python benchmarks/fleets/instance_noise.py    # ~7 min; writes instance_noise.md
"""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import numpy as np
import psutil

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import start_server  # noqa: E402
from scrape_cost import one  # noqa: E402

HERE = Path(__file__).resolve().parent
SERVERS, REQUESTS = 3, 8


def cpu_times(pid: int) -> dict[str, float]:
    """CPU seconds of the server's process tree, by process name."""
    root = psutil.Process(pid)
    found: dict[str, float] = {}
    for process in [root, *root.children(recursive=True)]:
        try:
            times = process.cpu_times()
            name = process.name()
        except psutil.NoSuchProcess:
            continue
        found[name] = found.get(name, 0.0) + times.user + times.system
    return found


def main() -> None:
    (HERE / "servers").mkdir(exist_ok=True)
    lines = ["# Lone requests on three one-core vLLM CPU servers started one after another", "",
             "512-token prompt, 200 tokens out, SmolLM2-135M fp32; each server taskset to core 0 (measure.py's "
             "start_server).", "",
             "| server | TPOT per request (ms) | median | TTFT median | CPU seconds per process while serving |",
             "|---|---|---|---|---|"]
    medians = []
    for n in range(SERVERS):
        server = start_server(0, f"instance-noise-{n}")
        try:
            asyncio.run(one(server.url, 0, False))  # warm-up
            pid = server.process.pid
            before = cpu_times(pid)
            found = [asyncio.run(one(server.url, 100 * n + i, False)) for i in range(REQUESTS)]
            after = cpu_times(pid)
        finally:
            server.stop()
        tpots = [tpot * 1e3 for _, tpot, _ in found]
        medians.append(float(np.median(tpots)))
        used = {name: after[name] - before.get(name, 0.0) for name in after}
        print(n, [f"{t:.1f}" for t in tpots], used, flush=True)
        lines.append(f"| {n + 1} | {' '.join(f'{t:.1f}' for t in tpots)} | {np.median(tpots):.1f} ms | "
                     f"{np.median([t for t, _, _ in found]):.3f} s | "
                     + ", ".join(f"{name} {seconds:.1f}" for name, seconds in sorted(used.items(), key=lambda x: -x[1])
                                 if seconds >= 0.05) + " |")
    lines += ["", f"Median TPOT across the servers: {min(medians):.1f}–{max(medians):.1f} ms "
                  f"({max(medians) / min(medians) - 1:.0%} apart)."]
    (HERE / "instance_noise.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
