"""measure.py again, with the machine's speed measured beside every run (instance_noise.md: this
VM's speed drifts 10-20 % between server starts, the size of part 4's targets).

A probe is three lone requests (512-token prompt, 100 tokens out) on one server, nothing else
running: its median TPOT and TTFT. Probes run on server A before and after the calibration, before
and after the one-server replay, and on both servers before and after the two-server replay.

    python benchmarks/fleets/probed.py          # ~25 min; writes probed/ and probed/probes.csv
    python benchmarks/fleets/fleet_check.py --probed

The runs are the same as measure.py's (its calibration grid and its 20-request azure-conv replay at
0.025x), into probed/; a step whose run.json exists is skipped, and its probes kept.
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import CALIBRATIONS, COMMON, start_server, sweep, trace  # noqa: E402

from specbench.served.client import StreamedRequest, stream_completion  # noqa: E402

HERE = Path(__file__).resolve().parent
OUT = HERE / "probed"
PROBE_PROMPT, PROBE_TOKENS, PROBE_REQUESTS = 512, 100, 3


async def _lone(url: str, seed: int) -> StreamedRequest:
    rng = np.random.default_rng(seed)
    payload = {"model": "specbench-target", "prompt": rng.integers(100, 40000, PROBE_PROMPT).tolist(),
               "max_tokens": PROBE_TOKENS, "min_tokens": PROBE_TOKENS, "ignore_eos": True, "stream": True,
               "temperature": 0.0, "return_token_ids": True}
    async with aiohttp.ClientSession() as session:
        request = StreamedRequest(0, PROBE_PROMPT)
        await stream_completion(session, url + "/v1/completions", payload, request, time.perf_counter())
    if request.error:
        raise RuntimeError(f"probe: {request.error}")
    return request


def probe(server, server_name: str, when: str, rows: list[dict]) -> None:
    found = [asyncio.run(_lone(server.url, 1000 + len(rows) * 10 + i)) for i in range(PROBE_REQUESTS)]
    tpot = float(np.median([np.mean(np.diff(r.arrivals_s)) for r in found]))
    ttft = float(np.median([r.ttft_s for r in found]))
    rows.append({"server": server_name, "when": when, "tpot_s": tpot, "ttft_s": ttft, "at": time.time()})
    print(f"probe {server_name} {when}: TPOT {tpot * 1e3:.1f} ms, TTFT {ttft:.3f} s", flush=True)
    pd.DataFrame(rows).to_csv(OUT / "probes.csv", index=False)


def main() -> None:
    OUT.mkdir(exist_ok=True)
    (HERE / "servers").mkdir(exist_ok=True)
    csv = OUT / "probes.csv"
    rows: list[dict] = pd.read_csv(csv).to_dict("records") if csv.exists() else []
    servers = []
    try:
        a = start_server(0, "probed-A-core0")
        servers.append(a)
        if not all((OUT / name / "run.json").exists() for name in CALIBRATIONS):
            probe(a, "A", "before calibration", rows)
            for name, grid in CALIBRATIONS.items():
                if not (OUT / name / "run.json").exists():
                    sweep("--baseline-endpoint", a.url, "--workloads", "chat", "--max-new-tokens", "64",
                          *COMMON, *grid, "--output", str(OUT / name))
            probe(a, "A", "after calibration", rows)
        if not (OUT / "one-server" / "run.json").exists():
            probe(a, "A", "before one-server", rows)
            sweep("--baseline-endpoint", a.url, *COMMON, *trace(0.025), "--output", str(OUT / "one-server"))
            probe(a, "A", "after one-server", rows)
        b = start_server(1, "probed-B-core1")
        servers.append(b)
        if not (OUT / "two-servers" / "run.json").exists():
            probe(a, "A", "before two-servers", rows)
            probe(b, "B", "before two-servers", rows)
            sweep("--baseline-endpoint", f"{a.url},{b.url}", *COMMON, *trace(0.025),
                  "--output", str(OUT / "two-servers"))
            probe(a, "A", "after two-servers", rows)
            probe(b, "B", "after two-servers", rows)
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    main()
