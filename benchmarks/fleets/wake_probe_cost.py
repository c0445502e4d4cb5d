"""Does the sweep's wake probe slow a server that shares its core? During a trace replay the sweep
runs specbench.measure.WakeProbe: a process that sleeps 1 ms at a time (a thousand wakes a second)
to catch the machine's own stalls. With one one-core server on this 2-core VM it runs on the other
core; with two servers it must share a core with one of them, and each wake preempts that server's
worker (niced to 10, as the vLLM engine starts CPU servers).

A lone request (512-token prompt, 200 tokens out) on a server on core 0, six times, alternately
with and without a wake probe pinned to core 0: its TPOT and TTFT.

    python benchmarks/fleets/wake_probe_cost.py    # ~3 min; writes wake_probe_cost.md
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import start_server  # noqa: E402
from scrape_cost import PROMPT, TOKENS, one  # noqa: E402

from specbench.measure import _WAKE_PROBE  # noqa: E402

HERE = Path(__file__).resolve().parent
TRIES = 6


def main() -> None:
    (HERE / "servers").mkdir(exist_ok=True)
    server = start_server(0, "wake-probe-cost")
    found: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    try:
        asyncio.run(one(server.url, 0, False))  # warm-up
        for n in range(TRIES):
            probed = n % 2 == 1
            probe = subprocess.Popen(["taskset", "-c", "0", sys.executable, "-c", _WAKE_PROBE, str(os.getpid())],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) if probed else None
            try:
                ttft, tpot, _ = asyncio.run(one(server.url, 10 + n, False))
            finally:
                if probe is not None:
                    probe.terminate()
                    probe.wait()
            found[probed].append((ttft, tpot))
            print(f"wake probe on the server's core={probed}: TTFT {ttft:.3f} s, TPOT {tpot * 1e3:.1f} ms", flush=True)
    finally:
        server.stop()
    lines = ["# A lone request on a one-core vLLM CPU server, with and without the sweep's wake probe on its core", "",
             f"{PROMPT}-token prompt, {TOKENS} tokens out, SmolLM2-135M fp32, tries alternated.", "",
             "| wake probe on the server's core | TTFT per try | TPOT per try | TPOT median |", "|---|---|---|---|"]
    for probed in (False, True):
        lines.append(f"| {'yes' if probed else 'no'} | {' '.join(f'{t:.3f}' for t, _ in found[probed])} s | "
                     f"{' '.join(f'{p * 1e3:.1f}' for _, p in found[probed])} ms | "
                     f"{np.median([p for _, p in found[probed]]) * 1e3:.1f} ms |")
    (HERE / "wake_probe_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
