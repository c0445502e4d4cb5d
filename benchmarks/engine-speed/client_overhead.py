"""What the load generator costs: specbench's streaming client against a server that answers
instantly, so every microsecond measured is the client's.

A stand-in OpenAI-compatible server (a subprocess, on the other core) streams token ids as fast as
it can, one or several per chunk; the closed-loop client (specbench.served.client) keeps B requests
in flight. Reported: the client's CPU time per token (its own thread, as every vLLM cell records in
`client_cpu_per_token_s`) and the most tokens per second it can take in. Compare with the ITL the
cells report: the client must be far below it to be invisible in the numbers.

    python benchmarks/engine-speed/client_overhead.py [--concurrency 1,4,16,64] [--tokens 256] [--requests 64]
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import textwrap
import time

from specbench.served.client import run_closed_loop
from specbench.served.server import free_port

SERVER = textwrap.dedent("""
    import json, sys
    from aiohttp import web

    async def completions(request):
        body = await request.json()
        count, per_chunk = int(body["max_tokens"]), int(body.get("per_chunk", 1))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for start in range(0, count, per_chunk):
            ids = list(range(start, min(count, start + per_chunk)))
            await response.write(("data: " + json.dumps({"choices": [{"index": 0, "text": "x" * len(ids),
                                  "token_ids": ids, "finish_reason": None}]}) + "\\n\\n").encode())
        await response.write(b"data: [DONE]\\n\\n")
        return response

    async def health(request):
        return web.Response(text="")

    app = web.Application()
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/health", health)
    web.run_app(app, host="127.0.0.1", port=int(sys.argv[1]), print=None)
""")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--concurrency", default="1,4,16,64")
    parser.add_argument("--tokens", type=int, default=256, help="tokens per request")
    parser.add_argument("--requests", type=int, default=64)
    parser.add_argument("--per-chunk", default="1,3", help="tokens per streamed chunk (speculation sends several)")
    args = parser.parse_args()
    port = free_port()
    server = subprocess.Popen([sys.executable, "-c", SERVER, str(port)])
    try:
        import urllib.request

        for _ in range(100):
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=1)
                break
            except OSError:
                time.sleep(0.1)
        url = f"http://127.0.0.1:{port}/v1/completions"
        print("| B in flight | tokens per chunk | client CPU per token | client tokens/s (its ceiling) |")
        print("|---|---|---|---|")
        for per_chunk in (int(x) for x in args.per_chunk.split(",")):
            for concurrency in (int(x) for x in args.concurrency.split(",")):
                payloads = [{"prompt": [1, 2, 3], "max_tokens": args.tokens, "stream": True, "per_chunk": per_chunk}
                            for _ in range(args.requests)]
                run_closed_loop(url, payloads[:concurrency], concurrency, [3] * concurrency)  # warm-up
                run = run_closed_loop(url, payloads, concurrency, [3] * len(payloads))
                assert not run.errors and run.output_tokens == args.tokens * args.requests, run.errors[:1]
                print(f"| {concurrency} | {per_chunk} | {run.client_cpu_s / run.output_tokens * 1e6:.1f} µs | "
                      f"{run.output_tokens / run.wall_s:,.0f} |", flush=True)
    finally:
        server.terminate()
        server.wait(timeout=10)
    return 0


if __name__ == "__main__":
    sys.exit(main())
