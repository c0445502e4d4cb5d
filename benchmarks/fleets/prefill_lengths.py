"""What one prompt's prefill costs on a one-core vLLM CPU server, by its length, across the
2,048-token step budget that chunks it: the question mixed_step.md leaves (a 4,096-token prompt's
first chunk cost 9.5 s beside a decode, more than a whole 2k prompt alone).

Each prompt is sent alone (random token ids, 1 token out, prefix caching off, two tries at each
length, the order shuffled), so its TTFT is its prefill's steps and the server's own work. Beside
it, the step price fitted on the closed-loop calibration (fleet_check.py's) simulates the same.

    python benchmarks/fleets/prefill_lengths.py    # ~6 min (seconds once the .csv exists)
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

HERE = Path(__file__).resolve().parent
LENGTHS = [256, 512, 1024, 1536, 2000, 2047, 2100, 2560, 3072, 4094, 5120, 6141]
TRIES = 2


def payload(length: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"model": "specbench-target", "prompt": rng.integers(100, 40000, length).tolist(), "max_tokens": 1,
            "min_tokens": 1, "ignore_eos": True, "stream": True, "temperature": 0.0, "return_token_ids": True}


async def one(url: str, length: int, seed: int) -> float:
    async with aiohttp.ClientSession() as session:
        request = StreamedRequest(0, length)
        await stream_completion(session, url + "/v1/completions", payload(length, seed), request, time.perf_counter())
        if request.error:
            raise RuntimeError(f"{length} tokens: {request.error}")
        return float(request.ttft_s)


def fitted_price():
    """The step price fleet_check.py fits: the two closed-loop calibrations of server A."""
    runs = [load_run(HERE / "one-core-calibration"), load_run(HERE / "one-core-calibration-4k")]
    cells = pd.concat([r.cells for r in runs], ignore_index=True)
    requests = pd.concat([r.requests for r in runs], ignore_index=True)
    return fit_served(cells, requests, runs[0].meta, "one-core-calibration")


def measure() -> pd.DataFrame:
    (HERE / "servers").mkdir(exist_ok=True)
    server = start_server(0, "prefill-lengths")
    rows = []
    try:
        asyncio.run(one(server.url, 64, 1))  # warm-up, not recorded
        order = [(length, t) for length in LENGTHS for t in range(TRIES)]
        np.random.default_rng(0).shuffle(order)
        for n, (length, t) in enumerate(order):
            ttft = asyncio.run(one(server.url, length, 100 + n))
            rows.append({"prompt_tokens": length, "try": t, "ttft_s": ttft})
            print(f"{length:>5} tokens: {ttft:.2f} s", flush=True)
    finally:
        server.stop()
    frame = pd.DataFrame(rows).sort_values(["prompt_tokens", "try"])
    frame.to_csv(HERE / "prefill_lengths.csv", index=False)
    return frame


def main() -> None:
    csv = HERE / "prefill_lengths.csv"
    frame = pd.read_csv(csv) if csv.exists() else measure()
    price, spec = fitted_price()
    table = frame.groupby("prompt_tokens")["ttft_s"].agg(["median", "min", "max"]).reset_index()
    budget = spec.max_num_batched_tokens
    lines = ["# One prompt alone on a one-core vLLM CPU server (SmolLM2-135M fp32, 2,048-token step budget)", "",
             "Predicted: the step price fitted on the closed-loop calibration (fleet_check.py's), simulated.", "",
             "| prompt tokens | chunks | TTFT median (min-max) | s per 1k tokens | predicted | error |",
             "|---|---|---|---|---|---|"]
    for row in table.itertuples():
        chunks = -(-int(row.prompt_tokens) // budget)
        out = simulate(np.array([int(row.prompt_tokens)]), np.array([1]), price.cost(None), spec,
                       arrivals_s=np.array([0.0]))
        predicted = float(out.ttft_s[0] + price.overhead_s)
        lines.append(f"| {row.prompt_tokens} | {chunks} | {row.median:.2f} s ({row.min:.2f}-{row.max:.2f}) | "
                     f"{row.median / row.prompt_tokens * 1000:.2f} | {predicted:.2f} s | "
                     f"{predicted / row.median - 1:+.1%} |")
    (HERE / "prefill_lengths.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
