"""What a step mixing a long prompt's chunks with a decode costs on a one-core vLLM CPU server,
against the step price fitted on the closed-loop calibration (fleet_check.py's): the question the
two-server replay's miss leaves (README: requests decoding through several 3-4k-token prefills).

1. A 4,096-token prompt alone (1 token out): its TTFT.
2. A request decoding (512-token prompt, 400 tokens out), and 5 s into it the same 4,096-token
   prompt: the decode's longest inter-token gaps (the steps it shared with the prompt's chunks)
   and the prompt's TTFT.
3. The fitted price's prediction of both (the simulator, the same requests at the same times).

The gaps it prints are sorted longest first, not in the order they came (2026-11-26: read as their
order, they said the first chunk was the dearer; mixed_lengths.py times them in order).

    python benchmarks/fleets/mixed_step.py    # ~3 min; writes mixed_step.md
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

from measure import start_server  # noqa: E402

from specbench.fleet.replica import simulate  # noqa: E402
from specbench.fleet.served import fit_served  # noqa: E402
from specbench.results import load_run  # noqa: E402
from specbench.served.client import StreamedRequest, stream_completion  # noqa: E402
from specbench.step_model import StepShape  # noqa: E402

HERE = Path(__file__).resolve().parent
LONG, SHORT, DECODE_TOKENS, DELAY_S = 4096, 512, 400, 5.0


def payload(length: int, tokens: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"model": "specbench-target", "prompt": rng.integers(100, 40000, length).tolist(), "max_tokens": tokens,
            "min_tokens": tokens, "ignore_eos": True, "stream": True, "temperature": 0.0, "return_token_ids": True}


async def run(url: str, with_decode: bool, seed: int) -> tuple[StreamedRequest, StreamedRequest | None]:
    async with aiohttp.ClientSession() as session:
        origin = time.perf_counter()
        long = StreamedRequest(0, LONG)
        if not with_decode:
            await stream_completion(session, url, payload(LONG, 1, seed), long, origin)
            return long, None
        decode = StreamedRequest(1, SHORT)

        async def later() -> None:
            await asyncio.sleep(DELAY_S)
            await stream_completion(session, url, payload(LONG, 1, seed), long, origin)

        await asyncio.gather(stream_completion(session, url, payload(SHORT, DECODE_TOKENS, seed + 1), decode, origin),
                             later())
        return long, decode


def predicted(price, spec, decode: StreamedRequest, long: StreamedRequest) -> tuple[float, float]:
    """The simulator's TTFT of the long prompt, and the decode's longest gap, at the measured send times."""
    out = simulate(np.array([SHORT, LONG]), np.array([DECODE_TOKENS, 1]), price.cost(None), spec,
                   arrivals_s=np.array([decode.sent_s, long.sent_s]) - decode.sent_s)
    return float(out.ttft_s[1] + price.overhead_s), float(out.itl_gaps_s.max())


def main() -> None:
    runs = [load_run(HERE / "one-core-calibration"), load_run(HERE / "one-core-calibration-4k")]
    cells = pd.concat([r.cells for r in runs], ignore_index=True)
    requests = pd.concat([r.requests for r in runs], ignore_index=True)
    price, spec = fit_served(cells, requests, runs[0].meta, "one-core-calibration")
    server = start_server(0, "mixed-step-A-core0")
    try:
        url = server.url + "/v1/completions"
        asyncio.run(run(url, False, 0))  # warm-up
        alone = [asyncio.run(run(url, False, seed))[0].ttft_s for seed in (1, 2)]
        mixed = [asyncio.run(run(url, True, seed)) for seed in (3, 4)]
    finally:
        server.stop()
    alone_predicted = float(simulate(np.array([LONG]), np.array([1]), price.cost(None), spec,
                                     arrivals_s=np.array([0.0])).ttft_s[0] + price.overhead_s)
    lines = ["# A 4,096-token prompt's chunks beside a decode, one-core vLLM CPU server (SmolLM2-135M fp32)", "",
             "| | measured | predicted (the calibration's fitted price) |", "|---|---|---|",
             f"| the 4k prompt alone: TTFT | {np.median(alone):.2f} s | {alone_predicted:.2f} s |"]
    for n, (long, decode) in enumerate(mixed, 1):
        gaps = np.sort(np.diff(decode.arrivals_s))[::-1]
        ttft, gap = predicted(price, spec, decode, long)
        lines += [f"| try {n}: the 4k prompt beside a decode: its TTFT | {long.ttft_s:.2f} s | {ttft:.2f} s |",
                  f"| try {n}: the decode's longest gap (the steps it shared with the chunks) | {gaps[0]:.2f} s "
                  f"(next: {gaps[1]:.2f} s, {gaps[2]:.2f} s) | {gap:.2f} s |",
                  f"| try {n}: the decode's median gap | {np.median(gaps) * 1e3:.0f} ms | "
                  f"{price.cost(None).seconds(StepShape(0, 1, decode_context=SHORT + DECODE_TOKENS // 2)) * 1e3:.0f} ms |"]
    (HERE / "mixed_step.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
