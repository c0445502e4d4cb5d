"""What a step mixing one prompt's chunks with a decode costs on a one-core vLLM CPU server, by the
prompt's length: mixed_step.md's question at every length prefill_lengths.md timed alone.

For each length, twice: a request decoding (512-token prompt), and 3 s into it the prompt (1 token
out). The decode's gaps longer than 0.3 s, in the order they came, are the steps it shared with the
prompt's chunks (a decode step alone takes ~55 ms); the decode is cancelled a second after the
prompt's first token. Beside them, each chunk's step as the price fitted on the closed-loop
calibration has it (fleet_check.py's): the decode row and the chunk's tokens and (query, key) pairs.

    python benchmarks/fleets/mixed_lengths.py    # ~5 min (seconds once the .csv exists)
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
from prefill_lengths import fitted_price  # noqa: E402

from specbench.served.client import StreamedRequest, stream_completion  # noqa: E402
from specbench.step_model import StepShape  # noqa: E402

HERE = Path(__file__).resolve().parent
LENGTHS = [512, 1024, 2000, 2047, 3072, 4094, 6141]
SHORT, DELAY_S, TRIES, SHARED_GAP_S = 512, 3.0, 2, 0.3


def payload(length: int, tokens: int, seed: int) -> dict:
    rng = np.random.default_rng(seed)
    return {"model": "specbench-target", "prompt": rng.integers(100, 40000, length).tolist(), "max_tokens": tokens,
            "min_tokens": tokens, "ignore_eos": True, "stream": True, "temperature": 0.0, "return_token_ids": True}


async def one(url: str, length: int, seed: int) -> tuple[StreamedRequest, StreamedRequest]:
    async with aiohttp.ClientSession() as session:
        origin = time.perf_counter()
        decode, prompt = StreamedRequest(1, SHORT), StreamedRequest(0, length)
        decoding = asyncio.create_task(stream_completion(session, url, payload(SHORT, 2000, seed + 1), decode,
                                                         origin))
        await asyncio.sleep(DELAY_S)
        await stream_completion(session, url, payload(length, 1, seed), prompt, origin)
        await asyncio.sleep(1.0)
        decoding.cancel()
        try:
            await decoding
        except asyncio.CancelledError:
            pass
        if prompt.error:
            raise RuntimeError(f"{length} tokens: {prompt.error}")
        return prompt, decode


def predicted_chunks(price, budget: int, length: int, context: int) -> list[float]:
    """Each step the decode shares with the prompt's chunks (budget - 1 tokens each), as priced."""
    steps, done = [], 0
    while done < length:
        n = min(budget - 1, length - done)
        shape = StepShape(n, 1, prefill_chunks=((n, done),), decode_context=context)  # n × (done + n / 2) pairs
        steps.append(price.cost(None).seconds(shape))
        done += n
    return steps


def measure() -> pd.DataFrame:
    (HERE / "servers").mkdir(exist_ok=True)
    server = start_server(0, "mixed-lengths")
    rows = []
    try:
        url = server.url + "/v1/completions"
        asyncio.run(one(url, 64, 1))  # warm-up, not recorded
        order = [(length, t) for length in LENGTHS for t in range(TRIES)]
        np.random.default_rng(1).shuffle(order)
        for n, (length, t) in enumerate(order):
            prompt, decode = asyncio.run(one(url, length, 100 + n))
            arrivals = np.asarray(decode.arrivals_s) + decode.sent_s  # on the load's clock
            gaps = np.diff(arrivals)
            ends = arrivals[1:]
            sent = prompt.sent_s
            shared = [float(g) for g, end in zip(gaps, ends) if g > SHARED_GAP_S and end > sent]
            quiet = gaps[(ends < sent)]
            rows.append({"prompt_tokens": length, "attempt": t, "ttft_s": float(prompt.ttft_s),
                         "shared_gaps_s": " ".join(f"{g:.3f}" for g in shared), "shared_total_s": sum(shared),
                         "decode_gap_median_s": float(np.median(quiet)) if len(quiet) else float("nan")})
            print(rows[-1], flush=True)
    finally:
        server.stop()
    frame = pd.DataFrame(rows).sort_values(["prompt_tokens", "attempt"])
    frame.to_csv(HERE / "mixed_lengths.csv", index=False)
    return frame


def main() -> None:
    csv = HERE / "mixed_lengths.csv"
    frame = pd.read_csv(csv, dtype={"shared_gaps_s": str}) if csv.exists() else measure()
    price, spec = fitted_price()
    lines = ["# One prompt beside a decode on a one-core vLLM CPU server (SmolLM2-135M fp32)", "",
             "The decode's gaps over 0.3 s, in order, are the steps it shared with the prompt's chunks; predicted: "
             "the price fitted on the closed-loop calibration (fleet_check.py's).", "",
             "| prompt tokens | try | its TTFT | the decode's shared steps, in order | predicted | their sum | "
             "predicted | the decode's step alone |", "|---|---|---|---|---|---|---|---|"]
    for row in frame.itertuples():
        chunks = predicted_chunks(price, spec.max_num_batched_tokens, int(row.prompt_tokens), SHORT + 60)
        lines.append(f"| {row.prompt_tokens} | {row.attempt + 1} | {row.ttft_s:.2f} s | {row.shared_gaps_s} s | "
                     f"{' '.join(f'{c:.3f}' for c in chunks)} s | {row.shared_total_s:.2f} s | {sum(chunks):.2f} s | "
                     f"{row.decode_gap_median_s * 1e3:.0f} ms |")
    (HERE / "mixed_lengths.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
