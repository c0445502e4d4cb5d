"""A stand-in for vLLM's OpenAI-compatible server, for the tests that need no real vLLM: the same
command line, /health, /metrics (spec-decode counters, histograms, cache_config_info) and streamed
/v1/completions with token ids. Tokens are deterministic, so greedy runs with and without a
`--speculative-config` agree; a speculative server streams K+1 tokens a chunk and counts each
chunk as a draft with K proposed and K accepted.

FAKE_VLLM_MODE picks a misbehaviour: exit_at_start (exit_at_start_speculative: a server with a
--speculative-config alone), never_healthy, die_once=N (exit in the middle
of the N-th completion, once: FAKE_VLLM_MARKER records that a server died), child (start a
grandchild that sleeps), garbage (sampled tokens the "target" ranks 500th). FAKE_VLLM_API_KEY makes
/v1 answer 401 without that bearer token. FAKE_VLLM_START_S delays its start (loading, as a real
server's). FAKE_VLLM_DRIFT=PATH:RATE slows every server alike as the
machine works (a drifting machine): each step takes 4 ms x (1 + RATE x the steps every server has
taken so far, one byte each appended to PATH). Counting steps, not seconds, keeps the drift the same
on a slow machine: a drift in wall time compounds there (slower steps, more time, slower steps).
A speculative step costs FAKE_VLLM_VERIFY_COST (1.2) plain steps, as a real draft and verify do: at the
same cost its speed-up would sit exactly on what acceptance allows (K + 1), and any noise on a busy
machine would put it above, where the gate rightly calls it unexplained.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import time

from aiohttp import web

MODE = os.environ.get("FAKE_VLLM_MODE", "")
VERIFY_COST = float(os.environ.get("FAKE_VLLM_VERIFY_COST", "1.2"))
DRIFT = os.environ["FAKE_VLLM_DRIFT"].rsplit(":", 1) if os.environ.get("FAKE_VLLM_DRIFT") else None


def step_s() -> float:
    """One step's time on the (drifting) machine; counts the step where the machine drifts."""
    base = float(os.environ.get("FAKE_VLLM_STEP_S", "0.004"))
    if DRIFT is None:
        return base
    # O_APPEND writes of one byte are atomic, so servers running side by side count every step
    counter = os.open(DRIFT[0], os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    try:
        os.write(counter, b"s")
        steps_before = os.fstat(counter).st_size - 1
    finally:
        os.close(counter)
    return base * (1 + float(DRIFT[1]) * steps_before)


VOCAB = 1000
COUNTERS = {"drafts": 0, "draft_tokens": 0, "accepted": 0, "generated": 0, "requests": 0,
            "ttft_sum": 0.0, "ttft_count": 0, "itl_sum": 0.0, "itl_count": 0}


def token_at(prompt: list[int], index: int) -> int:
    return (sum(prompt) * 31 + index * 7) % VOCAB


def top_logprobs(token: int) -> dict:
    """The fake target's top 20 at any position: `token` first with most of the mass."""
    entries = {str(token): {"logprob": -0.05, "rank": 1, "decoded_token": "x"}}
    for rank in range(2, 21):
        entries[str((token + rank) % VOCAB)] = {"logprob": -6.0 - 0.1 * rank, "rank": rank, "decoded_token": "y"}
    return entries


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--speculative-config", default=None)
    parser.add_argument("--max-model-len", type=int, default=None)
    args, _ = parser.parse_known_args()
    spec = json.loads(args.speculative_config) if args.speculative_config else None
    k = int(spec["num_speculative_tokens"]) if spec else 0
    if MODE == "exit_at_start" or (MODE == "exit_at_start_speculative" and spec):
        print("ValueError: the fake model path does not hold a model", flush=True)
        sys.exit(3)
    time.sleep(float(os.environ.get("FAKE_VLLM_START_S", "0")))
    if MODE == "child":
        subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
    die_at = int(MODE.split("=")[1]) if MODE.startswith("die_once=") else None
    marker = os.environ.get("FAKE_VLLM_MARKER", "")

    async def health(request):
        if MODE == "never_healthy":
            return web.Response(status=503)
        return web.Response(text="")

    api_key = os.environ.get("FAKE_VLLM_API_KEY", "")

    @web.middleware
    async def authorize(request, handler):  # as vLLM's --api-key: /v1 routes need the bearer token
        if api_key and request.path.startswith("/v1") and request.headers.get("Authorization") != f"Bearer {api_key}":
            return web.json_response({"error": "Unauthorized"}, status=401)
        return await handler(request)

    async def models(request):
        card = {"id": "fake-model", "object": "model", "max_model_len": args.max_model_len}
        return web.json_response({"object": "list", "data": [card]})

    async def metrics(request):
        labels = 'engine="0",model_name="fake"'
        lines = [
            f'vllm:cache_config_info{{{labels},kv_cache_size_tokens="{4096 if not spec else 2048}",'
            f'kv_cache_max_concurrency="2.0",kv_cache_memory_bytes="1048576",num_gpu_blocks="32",block_size="128"}} 1.0',
            f"vllm:generation_tokens_total{{{labels}}} {COUNTERS['generated']}",
            f"vllm:num_requests_running{{{labels}}} {COUNTERS.get('running', 0)}",
            f"vllm:num_requests_waiting{{{labels}}} 0",
            f"vllm:request_success_total{{{labels}}} {COUNTERS['requests']}",
            f"vllm:time_to_first_token_seconds_sum{{{labels}}} {COUNTERS['ttft_sum']}",
            f"vllm:time_to_first_token_seconds_count{{{labels}}} {COUNTERS['ttft_count']}",
            f"vllm:inter_token_latency_seconds_sum{{{labels}}} {COUNTERS['itl_sum']}",
            f"vllm:inter_token_latency_seconds_count{{{labels}}} {COUNTERS['itl_count']}",
        ]
        if spec:
            lines += [f"vllm:spec_decode_num_drafts_total{{{labels}}} {COUNTERS['drafts']}",
                      f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {COUNTERS['draft_tokens']}",
                      f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {COUNTERS['accepted']}"]
            lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{p}"}} '
                      f"{COUNTERS['drafts']}" for p in range(k)]
        return web.Response(text="\n".join(lines) + "\n")

    async def completions(request):
        body = await request.json()
        prompt = list(body["prompt"])
        count = int(body["max_tokens"])
        if args.max_model_len and len(prompt) + count > args.max_model_len:  # as vLLM refuses it
            return web.json_response({"error": {"message": f"This model's maximum context length is "
                                                           f"{args.max_model_len} tokens", "code": 400}}, status=400)
        garbage = MODE == "garbage" and body.get("temperature", 0) > 0
        tokens = [(token_at(prompt, i) + (500 if garbage else 0)) % VOCAB for i in range(count)]
        if not body.get("stream"):
            choice = {"index": 0, "text": "", "token_ids": tokens, "finish_reason": "length"}
            if body.get("prompt_logprobs") is not None:
                choice["prompt_logprobs"] = [None] + [_prompt_entry(prompt, p) for p in range(1, len(prompt))]
            if body.get("logprobs"):
                choice["logprobs"] = {"top_logprobs": [{f"token_id:{t}": v["logprob"] for t, v in
                                                         top_logprobs(token_at(prompt, 0)).items()}]}
            return web.json_response({"choices": [choice]})
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        COUNTERS["received"] = COUNTERS.get("received", 0) + 1
        COUNTERS["running"] = COUNTERS.get("running", 0) + 1
        if die_at is not None and COUNTERS["received"] == die_at and not os.path.exists(marker):
            open(marker, "w").close()
            await response.write(b'data: {"choices": [{"index": 0, "text": "t", "token_ids": [1]}]}\n\n')
            print("RuntimeError: the fake engine core died", flush=True)
            os._exit(7)
        step = k + 1
        for start in range(0, count, step):
            await asyncio.sleep(step_s() * (VERIFY_COST if spec else 1.0))
            chunk = tokens[start:start + step]
            data = {"choices": [{"index": 0, "text": "t" * len(chunk), "token_ids": chunk,
                                 "finish_reason": None if start + step < count else "length"}]}
            await response.write(f"data: {json.dumps(data)}\n\n".encode())
            if spec:
                COUNTERS["drafts"] += 1
                COUNTERS["draft_tokens"] += k
                COUNTERS["accepted"] += len(chunk) - 1
            COUNTERS["itl_sum" if start else "ttft_sum"] += 0.004
            COUNTERS["itl_count" if start else "ttft_count"] += 1
        COUNTERS["generated"] += count
        COUNTERS["requests"] += 1
        COUNTERS["running"] -= 1
        await response.write(b"data: [DONE]\n\n")
        return response

    def _prompt_entry(sequence: list[int], position: int) -> dict:
        """Prompt logprobs at `position`: the fake target expects the token its generator makes."""
        actual = sequence[position]
        entries = top_logprobs(actual if MODE != "garbage" else (actual - 500) % VOCAB)
        if str(actual) not in entries:
            entries[str(actual)] = {"logprob": -12.0, "rank": 500, "decoded_token": "z"}
        return entries

    app = web.Application(middlewares=[authorize])
    app.router.add_get("/health", health)
    app.router.add_get("/v1/models", models)
    app.router.add_get("/metrics", metrics)
    app.router.add_post("/v1/completions", completions)
    print(f"fake vLLM on port {args.port}", flush=True)
    web.run_app(app, host="127.0.0.1", port=args.port, print=None)


if __name__ == "__main__":
    main()
