"""Does reading a server's /metrics slow it? A trace replay samples the running batch from /metrics
every 0.25 s (served.measurement.RunningSampler); a closed-loop calibration does not. On a one-core
vLLM CPU server the API server that renders /metrics shares the core with the engine.

A lone request (512-token prompt, 200 tokens out), six times, alternately with and without a
client reading /metrics every 0.25 s: its TPOT and TTFT, and how long a scrape takes.

    python benchmarks/fleets/scrape_cost.py    # ~3 min; writes scrape_cost.md
"""

from __future__ import annotations

import asyncio
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import start_server  # noqa: E402

from specbench.served.client import StreamedRequest, stream_completion  # noqa: E402

HERE = Path(__file__).resolve().parent
PROMPT, TOKENS, INTERVAL_S, TRIES = 512, 200, 0.25, 6


def payload(seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"model": "specbench-target", "prompt": rng.integers(100, 40000, PROMPT).tolist(), "max_tokens": TOKENS,
            "min_tokens": TOKENS, "ignore_eos": True, "stream": True, "temperature": 0.0, "return_token_ids": True}


async def one(url: str, seed: int, scrape: bool) -> tuple[float, float, list[float]]:
    scrapes: list[float] = []
    async with aiohttp.ClientSession() as session:
        done = asyncio.Event()

        async def poll() -> None:
            while not done.is_set():
                started = time.perf_counter()
                async with session.get(url + "/metrics") as response:
                    await response.read()
                scrapes.append(time.perf_counter() - started)
                await asyncio.sleep(INTERVAL_S)

        poller = asyncio.create_task(poll()) if scrape else None
        request = StreamedRequest(0, PROMPT)
        await stream_completion(session, url + "/v1/completions", payload(seed), request, time.perf_counter())
        done.set()
        if poller is not None:
            await poller
    gaps = np.diff(request.arrivals_s)
    return float(request.ttft_s), float(np.mean(gaps)), scrapes


def main() -> None:
    (HERE / "servers").mkdir(exist_ok=True)
    server = start_server(0, "scrape-cost")
    found: dict[bool, list[tuple[float, float]]] = {False: [], True: []}
    scrape_s: list[float] = []
    try:
        asyncio.run(one(server.url, 0, False))  # warm-up
        for n in range(TRIES):
            scrape = n % 2 == 1
            ttft, tpot, scrapes = asyncio.run(one(server.url, 10 + n, scrape))
            found[scrape].append((ttft, tpot))
            scrape_s += scrapes
            print(f"scrape={scrape}: TTFT {ttft:.3f} s, TPOT {tpot * 1e3:.1f} ms", flush=True)
    finally:
        server.stop()
    lines = ["# A lone request on a one-core vLLM CPU server, with and without /metrics read every 0.25 s", "",
             f"{PROMPT}-token prompt, {TOKENS} tokens out, SmolLM2-135M fp32, tries alternated.", "",
             "| /metrics read | TTFT per try | TPOT per try | TPOT median |", "|---|---|---|---|"]
    for scrape in (False, True):
        ttfts = " ".join(f"{t:.3f}" for t, _ in found[scrape])
        tpots = " ".join(f"{p * 1e3:.1f}" for _, p in found[scrape])
        lines.append(f"| {'every 0.25 s' if scrape else 'no'} | {ttfts} s | {tpots} ms | "
                     f"{np.median([p for _, p in found[scrape]]) * 1e3:.1f} ms |")
    lines += ["", f"A scrape took {np.median(scrape_s) * 1e3:.0f} ms (median of {len(scrape_s)}; p90 "
                  f"{np.quantile(scrape_s, 0.9) * 1e3:.0f} ms), wall time seen by the client."]
    (HERE / "scrape_cost.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
