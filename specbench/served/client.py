"""The load generator for served engines: one request function that streams an OpenAI-compatible
completion and timestamps every token as it arrives, and a closed loop that keeps B requests in
flight (what `vllm bench serve --max-concurrency B` does), or an open loop that sends each request
at its arrival time whatever the server is doing (`vllm bench serve --request-rate R`: Poisson
arrivals, gamma with a burstiness factor).

Prompts go as token ids, so that every engine gets exactly the ids the native engine gets (the
chat template is applied once, by specbench). A streamed chunk may carry several tokens (a
speculative step emits them together): they are counted as tokens that arrived at that chunk's
time, so inter-token latency keeps the zeros of a burst, as on the native engine. The client's own
CPU time is measured in its thread, so that every cell shows it is far below the latencies it
reports.

One load may be spread over several servers of the same model (a small fleet): a client-side
router picks each request's server when it is sent, as a serving gateway would, `least-outstanding`
(the fewest requests this client has in flight there; ties: the one chosen longest ago),
`round-robin`, or `prefix-aware` (llm-d's default scheduling profile, `schema.endpoint_picker_scores`:
the prompt's share this client has already sent each server, as the endpoint picker's approximate
prefix-cache scorer keeps it, in the servers' own KV blocks, and each server's queue and KV cache
use read from its /metrics every 50 ms, as the endpoint picker refreshes them) — the routers the
fleet simulator (specbench.fleet.router) models.
"""

from __future__ import annotations

import asyncio
import gc
import json
import math
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Awaitable, Callable, Sequence

import aiohttp
import numpy as np

from specbench.schema import ROUTER_METRICS_INTERVAL_S, ROUTERS, chain_keys, endpoint_picker_scores
from specbench.served.prometheus import Snapshot

# the prefix-aware router's unit of a prompt: the servers' KV cache block (their cache_config_info),
# this where they do not say (vLLM's block on a GPU)
PREFIX_BLOCK_TOKENS = 16
# what the prefix-aware router reads of each server (every schema.ROUTER_METRICS_INTERVAL_S)
ROUTER_METRICS = ("vllm:num_requests_waiting", "vllm:kv_cache_usage_perc", "vllm:cache_config_info")


@dataclass
class StreamedRequest:
    index: int
    prompt_tokens: int
    sent_s: float = 0.0  # when it was sent, seconds from the start of its load run
    scheduled_s: float = 0.0  # open loop: its arrival time (when it was due to be sent)
    usage_tokens: int = 0  # completion tokens the server's final usage chunk reports (0 if none)
    arrivals_s: list[float] = field(default_factory=list)  # per output token, seconds after sending
    tokens: list[int] = field(default_factory=list)
    error: str = ""
    replica: int = 0  # which of the load's servers it went to (0 with one server)

    @property
    def ttft_s(self) -> float:
        return self.arrivals_s[0] if self.arrivals_s else float("nan")

    @property
    def e2e_s(self) -> float:
        return self.arrivals_s[-1] if self.arrivals_s else float("nan")

    @property
    def output_tokens(self) -> int:
        """Tokens received; the usage count where a server streams text without token ids."""
        return max(len(self.tokens), self.usage_tokens)


@dataclass
class LoadRun:
    requests: list[StreamedRequest]
    wall_s: float  # first request sent -> last token received
    client_cpu_s: float  # CPU time of the client's thread over the run
    origin_s: float = float("nan")  # time.perf_counter() at the start, from which `sent_s` counts

    @property
    def output_tokens(self) -> int:
        return sum(r.output_tokens for r in self.requests)

    @property
    def errors(self) -> list[str]:
        return [f"request {r.index}: {r.error}" for r in self.requests if r.error]


def prompt_block_keys(prompt: Sequence[int], block_tokens: int = PREFIX_BLOCK_TOKENS) -> tuple[int, ...]:
    """One key per whole block of a prompt's token ids, chained (`schema.chain_keys`): a block's key
    stands for every token up to its end, so equal keys mean equal prefixes."""
    return chain_keys(tuple(prompt[start:start + block_tokens])
                      for start in range(0, len(prompt) - block_tokens + 1, block_tokens))


@dataclass
class ServerState:
    """What the prefix-aware router last read of a server's /metrics."""

    waiting: float = 0.0  # requests queued, not yet scheduled
    kv_usage: float = 0.0  # the share of its KV cache in use
    block_tokens: int = 0  # its KV cache's block (0: not said)


class Router:
    """Which server each request goes to, decided when it is sent: `least-outstanding` counts the
    requests this client has sent to each server and not yet seen finish (ties: the server chosen
    longest ago, so an idle fleet is used in turn), `round-robin` takes them in turn,
    `prefix-aware` scores each server by `schema.endpoint_picker_scores` (ties: as least-outstanding)
    from the blocks of prompts this client has sent it (`held`) and its `states`."""

    def __init__(self, servers: int, kind: str = "least-outstanding", block_tokens: int = PREFIX_BLOCK_TOKENS) -> None:
        if kind not in ROUTERS:
            raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {kind!r}")
        if servers < 1:
            raise ValueError("a load needs at least one server")
        self.kind = kind
        self.outstanding = [0] * servers
        self.chosen_at = [-1] * servers  # the send number each server was last chosen at
        self.sent = 0
        self.block_tokens = block_tokens
        # prefix-aware: the keys of every prompt block sent to each server (the endpoint picker's
        # approximate prefix index: what was routed there, not what the server still holds)
        self.held: list[set[int]] = [set() for _ in range(servers)]
        self.states = [ServerState() for _ in range(servers)]  # refreshed from the servers' /metrics

    def choose(self, prompt: Sequence[int] = ()) -> int:
        servers = range(len(self.outstanding))
        if self.kind == "round-robin":
            server = self.sent % len(self.outstanding)
        elif self.kind == "prefix-aware":
            keys = prompt_block_keys(prompt, self.block_tokens)
            blocks = max(len(prompt) // self.block_tokens, 1)
            shares = [next((at for at, key in enumerate(keys) if key not in self.held[n]), len(keys)) / blocks
                      for n in servers]
            scores = endpoint_picker_scores(shares, [s.waiting for s in self.states],
                                            [1.0 - s.kv_usage for s in self.states])
            server = min(servers, key=lambda n: (-scores[n], self.outstanding[n], self.chosen_at[n], n))
            self.held[server].update(keys)
        else:
            server = min(servers, key=lambda n: (self.outstanding[n], self.chosen_at[n], n))
        self.chosen_at[server] = self.sent
        self.outstanding[server] += 1
        self.sent += 1
        return server

    def finished(self, server: int) -> None:
        self.outstanding[server] -= 1


async def read_server_state(session: aiohttp.ClientSession, completions_url: str,
                            timeout_s: float = 2.0) -> ServerState | None:
    """A server's queue and KV cache use from its /metrics (beside `completions_url`); None where
    it gave none in time."""
    try:
        async with session.get(completions_url.rsplit("/v1/", 1)[0] + "/metrics",
                               timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
            if response.status != 200:
                return None
            snapshot = Snapshot.parse(await response.text(), only=ROUTER_METRICS)
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError, ValueError):
        return None
    block = snapshot.info_labels("vllm:cache_config_info").get("block_size", "")
    return ServerState(snapshot.total("vllm:num_requests_waiting"), snapshot.total("vllm:kv_cache_usage_perc"),
                       int(block) if block.isdigit() else 0)


async def _refresh_state(session: aiohttp.ClientSession, url: str, server: int, routing: Router) -> None:
    """Keep `routing.states[server]` fresh until cancelled (the prefix-aware router over several
    servers), each server on its own so that a slow one delays no other's. A read that fails keeps
    the state last read: a server too busy to answer in time must not look idle (the router would
    send it more)."""
    while True:
        state = await read_server_state(session, url)
        if state is not None:
            routing.states[server] = state
        await asyncio.sleep(ROUTER_METRICS_INTERVAL_S)


def _urls(url: str | Sequence[str]) -> list[str]:
    urls = [url] if isinstance(url, str) else list(url)
    if not urls:
        raise ValueError("a load needs at least one server URL")
    return urls


def _token_ids(choice: dict) -> list[int] | None:
    ids = choice.get("token_ids")
    return list(ids) if ids is not None else None


async def stream_completion(session: aiohttp.ClientSession, url: str, payload: dict, request: StreamedRequest,
                            origin: float, headers: dict | None = None) -> StreamedRequest:
    """POST one streaming completion; fills `request` with token ids and their arrival times."""
    sent = time.perf_counter()
    request.sent_s = sent - origin
    try:
        async with session.post(url, json=payload, headers=headers) as response:
            if response.status != 200:
                body = (await response.text())[:300].replace("\n", " ")
                request.error = f"HTTP {response.status}: {body}"
                return request
            async for raw in response.content:
                arrived = time.perf_counter() - sent
                line = raw.strip()
                if not line.startswith(b"data:"):
                    continue
                data = line[5:].strip()
                if data == b"[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk:
                    request.error = str(chunk["error"])[:300]
                    return request
                if chunk.get("usage"):
                    request.usage_tokens = int(chunk["usage"].get("completion_tokens") or 0)
                for choice in chunk.get("choices") or []:
                    ids = _token_ids(choice)
                    if ids is None:  # a server without token ids: one token per non-empty text chunk
                        ids = [-1] if choice.get("text") else []
                    request.tokens.extend(ids)
                    request.arrivals_s.extend([arrived] * len(ids))
    except (aiohttp.ClientError, asyncio.TimeoutError, ConnectionError) as error:
        request.error = f"{type(error).__name__}: {error}"
    return request


@contextmanager
def _steady_client():
    """While a load runs, nothing in this process stalls the client for milliseconds: the objects
    already alive (models, tables) are frozen out of the garbage collector's scans, and a thread
    waiting for the GIL (the arrival timer, the loop after a sampler's scrape) gets it within half
    a millisecond instead of Python's default 5 ms."""
    gc.freeze()
    interval = sys.getswitchinterval()
    sys.setswitchinterval(0.0005)
    try:
        yield
    finally:
        sys.setswitchinterval(interval)
        gc.unfreeze()


async def _load(url: str | Sequence[str], payloads: list[dict], requests: list[StreamedRequest], timeout_s: float,
                headers: dict | None, drive: Callable[[Callable[[int], Awaitable[None]], float], Awaitable],
                router: str = "least-outstanding") -> LoadRun:
    """One load run: `drive(send, origin)` decides when request i is sent (`await send(i)`), the
    router to which of `url`'s servers; the session, the client's CPU time and the wall time (first
    send -> last token) are the same for every load shape."""
    urls = _urls(url)
    routing = Router(len(urls), router)
    timeout = aiohttp.ClientTimeout(total=None, sock_connect=30, sock_read=timeout_s)
    connector = aiohttp.TCPConnector(limit=0, force_close=False)
    async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
        watched = routing.kind == "prefix-aware" and len(urls) > 1
        if watched:  # before the clock starts: the first request is due at once
            first = await asyncio.gather(*(read_server_state(session, url, 10.0) for url in urls))
            routing.states = [state or ServerState() for state in first]
            # a prompt's blocks as the servers cache them: a shorter unit would score as shared a
            # part no server can hold (a system prompt within one block), and herd requests on it
            routing.block_tokens = max((s.block_tokens for s in routing.states), default=0) or routing.block_tokens
        origin = time.perf_counter()

        async def send(i: int) -> None:
            prompt = payloads[i].get("prompt")
            server = requests[i].replica = routing.choose(prompt if isinstance(prompt, list) else ())
            try:
                await stream_completion(session, urls[server], payloads[i], requests[i], origin, headers)
            finally:
                routing.finished(server)

        refreshes = [asyncio.create_task(_refresh_state(session, url, n, routing)) for n, url in enumerate(urls)] \
            if watched else []
        cpu = time.thread_time()
        try:
            with _steady_client():
                await drive(send, origin)
        finally:
            for refresh in refreshes:
                refresh.cancel()
            await asyncio.gather(*refreshes, return_exceptions=True)
        client_cpu = time.thread_time() - cpu
    ends = [r.sent_s + r.e2e_s for r in requests if r.arrivals_s]
    wall = max(ends) - min(r.sent_s for r in requests) if ends else float("nan")
    return LoadRun(requests, wall, client_cpu, origin)


async def _closed_loop(url: str | Sequence[str], payloads: list[dict], concurrency: int, prompt_lengths: list[int],
                       timeout_s: float, headers: dict | None, router: str) -> LoadRun:
    requests = [StreamedRequest(i, prompt_lengths[i]) for i in range(len(payloads))]
    queue: asyncio.Queue[int] = asyncio.Queue()
    for i in range(len(payloads)):
        queue.put_nowait(i)

    async def drive(send, origin: float) -> None:
        async def worker() -> None:
            while not queue.empty():
                await send(queue.get_nowait())

        await asyncio.gather(*(worker() for _ in range(min(concurrency, len(payloads)))))

    return await _load(url, payloads, requests, timeout_s, headers, drive, router)


def run_closed_loop(url: str | Sequence[str], payloads: list[dict], concurrency: int, prompt_lengths: list[int],
                    timeout_s: float = 600.0, headers: dict | None = None,
                    router: str = "least-outstanding") -> LoadRun:
    """Every payload streamed to `url` (several: spread over them by `router`) with `concurrency`
    requests in flight (closed loop: a new request starts when one finishes), in payload order."""
    return asyncio.run(_closed_loop(url, payloads, concurrency, prompt_lengths, timeout_s, headers, router))


def arrival_times(count: int, rate: float, burstiness: float = 1.0, seed: int = 0) -> list[float]:
    """Seconds from the start at which each of `count` requests arrives, as `vllm bench serve`
    draws them: gaps from a gamma distribution of shape `burstiness` and mean 1/rate (exponential,
    a Poisson process, at burstiness 1), rescaled so that the last arrives at count/rate. The same
    seed gives the same times. At an infinite rate every request arrives at once."""
    if math.isinf(rate):
        return [0.0] * count
    generator = np.random.default_rng(seed)
    gaps = generator.gamma(shape=burstiness, scale=1.0 / (rate * burstiness), size=count)
    times = np.cumsum(gaps)
    if count and times[-1] > 0:
        times *= (count / rate) / times[-1]
    return times.tolist()


async def _open_loop(url: str | Sequence[str], payloads: list[dict], arrivals_s: list[float],
                     prompt_lengths: list[int], timeout_s: float, headers: dict | None, router: str) -> LoadRun:
    requests = [StreamedRequest(i, prompt_lengths[i], scheduled_s=arrivals_s[i]) for i in range(len(payloads))]

    async def drive(send, origin: float) -> None:
        loop = asyncio.get_running_loop()
        started: list[asyncio.Task] = []
        all_started, stop = asyncio.Event(), threading.Event()

        def start(i: int) -> None:
            started.append(loop.create_task(send(i)))

        def timer() -> None:
            # A thread keeps the arrival times: it wakes within a tenth of a millisecond and wakes
            # the loop at once, where the loop's own timers round every sleep up to the next
            # millisecond and fire only once the loop has finished what it was doing.
            try:
                for i in sorted(range(len(payloads)), key=arrivals_s.__getitem__):
                    if stop.wait(max(0.0, arrivals_s[i] - (time.perf_counter() - origin))):
                        return
                    loop.call_soon_threadsafe(start, i)
                loop.call_soon_threadsafe(all_started.set)
            except RuntimeError:  # the loop closed under it: the run was interrupted
                pass

        thread = threading.Thread(target=timer, name="specbench-arrivals", daemon=True)
        thread.start()
        try:
            await all_started.wait()
            await asyncio.gather(*started)
        finally:
            stop.set()
            for task in started:
                task.cancel()

    return await _load(url, payloads, requests, timeout_s, headers, drive, router)


def run_open_loop(url: str | Sequence[str], payloads: list[dict], arrivals_s: list[float], prompt_lengths: list[int],
                  timeout_s: float = 600.0, headers: dict | None = None, router: str = "least-outstanding") -> LoadRun:
    """Payload i streamed to `url` (several: to the one `router` picks) from its arrival time
    arrivals_s[i] on, however many requests are already in flight (open loop)."""
    return asyncio.run(_open_loop(url, payloads, arrivals_s, prompt_lengths, timeout_s, headers, router))
