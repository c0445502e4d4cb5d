"""The served measurement: a cell measured on an OpenAI-compatible server, whichever started it.

The vLLM engine (vllm_engine.py) starts a server per speculative configuration; the endpoint
engine (endpoint.py) measures servers the user runs. Both are siblings over this module: the load
(closed loop at a concurrency, open loop at a rate, or a trace's arrivals: served/client.py), the
requests table, the server's counters scraped around each repeat, the running batch of a trace
replay, the greedy and sampled lossless checks, and the shared part of each cell's row. Each adds
only what it alone knows (its servers, its memory, where its acceptance comes from).
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time
import urllib.request
from pathlib import Path
from typing import Callable

import numpy as np

from specbench.engines import CellOutcome, Engine, Stage
from specbench.grid import Cell, SweepConfig, format_schedule, split_schedule
from specbench.lossless import TOP_LOGPROBS, ScoredToken, greedy_check
from specbench.measure import OwnCpu, PeakSampler, PeriodicSampler, WakeProbe
from specbench.schema import (
    LARGE_BATCH, SEND_LAG_GOAL_S, SEQUENTIAL, SIDE_BY_SIDE, measured_columns, stalled_by_machine,
)
from specbench.served.client import LoadRun, arrival_times, run_closed_loop, run_open_loop
from specbench.served.prometheus import Snapshot, delta, histogram_mean_delta
from specbench.shapes import Architecture
from specbench.synthetic import expected_acceptance, parse_alpha
from specbench.traces import Replay
from specbench.workloads import encode_prompt, within_length

# Near-tie tolerance for a greedy divergence: the target's logit gap (a logprob difference) between
# the two candidate tokens, by dtype. Batched and unbatched arithmetic differ by about this much.
TIE_TOLERANCE = {"float32": 2e-3, "float16": 5e-2, "bfloat16": 2.5e-1}
COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total")
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"


KV_CACHE_LABELS = ("kv_cache_size_tokens", "kv_cache_max_concurrency", "kv_cache_memory_bytes", "num_gpu_blocks",
                   "block_size")


def kv_cache_labels(snapshot: Snapshot) -> dict:
    """What a vLLM server's /metrics says of its KV cache (`vllm:cache_config_info`'s labels; None
    where a label is missing): what the run records and the fleet simulator's replica holds."""
    labels = snapshot.info_labels("vllm:cache_config_info")
    return {key: labels.get(key) for key in KV_CACHE_LABELS}


def dtype_name(config: SweepConfig) -> str:
    """--dtype, else bf16 on a GPU and fp32 on a CPU, as vLLM's --dtype spells it."""
    return str(config.engine.torch_dtype).replace("torch.", "")


def server_k(draft: str, k: int) -> int:
    """The K a server is started with: a scheduled draft's largest (vLLM clamps the schedule to it)."""
    _, schedule = split_schedule(draft)
    return max(entry[2] for entry in schedule) if schedule else k


class ServedEngine(Engine):
    """What every served engine shares: prompts tokenized with the target's tokenizer and sent as
    token ids to an OpenAI-compatible server (`current`: the one being asked now), greedy outputs
    checked against the baseline's with the server's own log-probabilities at a divergence, sampled
    outputs scored by the server's prompt log-probabilities. The vLLM engine starts its servers; an
    endpoint's are running already."""

    served_name = ""  # the "model" every request names
    headers: dict | None = None  # sent with every request (an endpoint's API key)

    def __init__(self, config: SweepConfig, run_dir: Path, replay: Replay | None = None) -> None:
        super().__init__(config, run_dir, replay)
        self.tokenizer = None
        self.target_dir = ""
        self.dtype = dtype_name(config)
        self._vocab_size = 0
        self.current = None  # the server requests go to now (a ServerProcess or a RemoteServer)
        self.pairing, self.pairing_reason = "", ""  # how speculative repeats pair with the baseline's

    def encode(self, record) -> list[int]:
        if self.tokenizer is None:
            ids = [ord(c) for c in record.text[::4]]
        else:
            ids = encode_prompt(record, self.tokenizer, self.config.engine.chat_template)
        if self.config.grid.synthetic:
            ids = [i % self._vocab_size for i in ids]
        return ids

    def lossless_check(self, prompts, baseline: list[dict], outcome: CellOutcome) -> tuple[str, str]:
        """Token ids against the baseline server's at the same concurrency. At a divergence the
        target (on the running server, one request alone) gives the logit gap between the two
        candidates: within the dtype's tolerance it is a numerical near-tie, else a MISMATCH."""
        note = " (vLLM's bf16 outputs can differ between batch sizes even without speculation)" \
            if self.dtype != "float32" else ""
        return greedy_check(prompts, [list(r["tokens"]) for r in baseline], outcome.outputs, self.logit_gap,
                            TIE_TOLERANCE[self.dtype], note)

    def _complete(self, payload: dict) -> dict:
        """One non-streaming completion on the running server."""
        payload = {"model": self.served_name, **payload}
        request = urllib.request.Request(self.current.url + "/v1/completions", data=json.dumps(payload).encode(),
                                         headers={"Content-Type": "application/json", **(self.headers or {})})
        with urllib.request.urlopen(request, timeout=300) as response:
            return json.loads(response.read())

    def score(self, prompts: list[list[int]], outputs: list[list[int]]) -> list[list[ScoredToken]]:
        """The running server's target scores each output: the prompt log-probabilities (top 20,
        with the chosen token's rank) of prompt + output, at the output's positions."""
        scored = []
        for prompt, tokens in zip(prompts, outputs):
            if not tokens or self.current is None:
                scored.append([])
                continue
            body = self._complete({"prompt": list(prompt) + list(tokens), "max_tokens": 1, "temperature": 0.0,
                                   "prompt_logprobs": TOP_LOGPROBS})
            entries = body["choices"][0]["prompt_logprobs"][len(prompt):]
            output = []
            for entry, token in zip(entries, tokens):
                top = sorted((v for v in entry.values() if v["rank"] <= TOP_LOGPROBS), key=lambda v: v["rank"])
                chosen = entry[str(token)]
                output.append(ScoredToken(int(chosen["rank"]), float(chosen["logprob"]), [v["logprob"] for v in top]))
            scored.append(output)
        return scored

    @property
    def vocab_size(self) -> int:
        if not self._vocab_size:
            self._vocab_size = int(json.loads((Path(self.target_dir) / "config.json").read_text())["vocab_size"])
        return self._vocab_size

    def logit_gap(self, context: list[int], expected: int, got: int) -> float:
        """|logprob(expected) - logprob(got)| of the target after `context` (inf when either is
        not among its top 20)."""
        if self.current is None:
            return float("inf")
        try:
            body = self._complete({"prompt": context, "max_tokens": 1, "temperature": 0.0, "logprobs": 20,
                                   "return_tokens_as_token_ids": True})
            top = body["choices"][0]["logprobs"]["top_logprobs"][0]
        except (OSError, KeyError, IndexError, ValueError):
            return float("inf")
        by_id = {int(key.split(":", 1)[1]): value for key, value in top.items() if key.startswith("token_id:")}
        if expected not in by_id or got not in by_id:
            return float("inf")
        return abs(by_id[expected] - by_id[got])

    def failure_status(self, error: BaseException) -> str:
        return "oom" if "out of memory" in str(error).lower() else "failed"

    def architectures(self) -> dict:
        """The target's shapes for the performance model (specbench.fit.roofline), from its config."""
        path = Path(self.target_dir) / "config.json" if self.target_dir else None
        if path is None or not path.exists():
            return {}
        try:
            shape = Architecture.from_config(json.loads(path.read_text()), str(self.dtype).replace("torch.", ""))
        except (KeyError, ValueError, TypeError):
            return {}
        return {"target": shape.to_dict(), "drafts": {}}


def server_memory(server, cuda: bool) -> Callable[[], int]:
    """What a server's processes hold now (`server`: anything with a `process_tree()`): resident set sizes summed over the process tree (CPU),
    or the GPU memory NVML attributes to those processes (the devices' used memory where NVML
    shows no processes, as inside some containers)."""
    def read() -> int:
        tree = server.process_tree()
        if not cuda:
            total = 0
            for process in tree:
                try:
                    total += process.memory_info().rss
                except Exception:
                    pass
            return total
        try:
            import pynvml

            pynvml.nvmlInit()
            pids = {p.pid for p in tree}
            used = device_used = 0
            for index in range(pynvml.nvmlDeviceGetCount()):
                handle = pynvml.nvmlDeviceGetHandleByIndex(index)
                device_used += int(pynvml.nvmlDeviceGetMemoryInfo(handle).used)
                for process in pynvml.nvmlDeviceGetComputeRunningProcesses(handle):
                    if process.pid in pids and process.usedGpuMemory:
                        used += int(process.usedGpuMemory)
            return used or device_used
        except Exception:
            return 0
    return read


class ServedCellRun:
    """One cell on a stage's server (one vLLM started, or an endpoint): warm up, repeats (each a run
    of the cell's load over its prompts, the server's counters scraped around it), finish into the
    same columns as a native cell. An engine's own run adds its columns (`engine_columns`) and may
    read acceptance its own way (`acceptance_columns`)."""

    def __init__(self, stage: Stage, cell: Cell, prompts: list[list[int]], prompt_ids: list[str]) -> None:
        self.stage, self.cell, self.prompts, self.prompt_ids = stage, cell, prompts, prompt_ids
        self.config = stage.engine.config
        self.throughput_per_repeat: list[float] = []
        self.request_rate_per_repeat: list[float] = []  # completed requests per second of each repeat
        self.runs: list[LoadRun] = []
        self.request_table: list[dict] = []
        self.outputs: list[list[int]] = [[] for _ in prompts]
        self.counters: dict[str, float] = {}
        self.per_position: dict[int, float] = {}
        self.server_ttft: list[float] = []
        self.server_itl: list[float] = []
        self.server_queue: list[float] = []
        self.peak_bytes = 0
        self.memory_kind = ""
        # side by side: the baseline cell measured on the baseline server, alternating with this one
        self.companion: ServedCellRun | None = None
        self.own_cpu = OwnCpu()
        self.running: list[list[tuple]] = []  # per repeat, the server's batch (RunningSampler)
        self.machine_stall_max_s = 0.0  # the longest stall of the machine itself (WakeProbe)

    def payload(self, prompt: list[int], index: int, repeat: int, max_tokens: int) -> dict:
        cell, config = self.cell, self.config
        payload = {"model": self.stage.engine.served_name, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                   "ignore_eos": True, "return_token_ids": True, "temperature": cell.temperature}
        if config.load.trace:  # the trace's output length exactly, whatever the model would stop at
            payload["min_tokens"] = max_tokens
        if cell.temperature > 0:
            payload["seed"] = config.grid.seed + 1000 * repeat + index
            if config.grid.top_p < 1:
                payload["top_p"] = config.grid.top_p
            if config.grid.top_k > 0:
                payload["top_k"] = config.grid.top_k
        return payload

    @property
    def urls(self) -> list[str]:
        """Where the load goes: the stage's server, or each of its servers (an endpoint list)."""
        server = self.stage.server
        return [url + "/v1/completions" for url in getattr(server, "urls", [server.url])]

    @property
    def headers(self) -> dict | None:
        return self.stage.engine.headers

    @property
    def replay(self) -> Replay | None:
        """The trace this cell replays (--trace), else None."""
        return self.stage.engine.replay

    def arrivals(self, count: int, repeat: int) -> list[float]:
        """An open-loop cell's arrival times: a trace's, scaled; else one seeded draw per (sweep
        seed, repeat), so every cell of a group (baseline and speculative) gets the same traffic,
        run after run."""
        if self.replay is not None:
            return [request.arrival_s for request in self.replay.requests][:count]
        seed = [self.config.grid.seed, repeat, 7]
        return arrival_times(count, self.cell.request_rate, self.config.load.burstiness, seed=seed)

    def _load(self, prompts: list[list[int]], repeat: int, max_tokens: int | list[int],
              arrivals_s: list[float] | None = None) -> LoadRun:
        """The prompts streamed open-loop at `arrivals_s` when given, else closed-loop at the
        cell's concurrency (all at once in an open-loop cell: its warm-up and sampled-check probes).
        `max_tokens` per prompt (a trace's output lengths), or one for all."""
        lengths_out = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
        payloads = [self.payload(p, i, repeat, lengths_out[i]) for i, p in enumerate(prompts)]
        lengths = [len(p) for p in prompts]
        if arrivals_s is not None:
            run = run_open_loop(self.urls, payloads, arrivals_s, lengths, headers=self.headers,
                                router=self.config.engine.endpoint.router)
        else:
            concurrency = self.cell.batch_size or len(prompts)
            run = run_closed_loop(self.urls, payloads, concurrency, lengths, headers=self.headers,
                                  router=self.config.engine.endpoint.router)
        if run.errors:
            raise RuntimeError(f"{len(run.errors)} of {len(prompts)} requests failed ({self.stage.failure_note()}): "
                               + run.errors[0])
        return run

    def warm_up(self) -> None:
        """One round of B requests, excluded from every figure (first-use compilation, caches)."""
        if self.companion is not None:
            self.companion.warm_up()
        if self.config.engine.warmup:
            count = min(self.cell.batch_size or 4, len(self.prompts))
            self._load(self.prompts[:count], repeat=-1, max_tokens=min(16, self.config.grid.max_new_tokens))

    def sample(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """Untimed outputs at the cell's settings and concurrency (seeds apart from the measured)."""
        if self.replay is not None:  # a trace's requests are as long as the trace says
            max_tokens = [r.output_tokens for r in self.replay.requests][:len(prompts)] + \
                [max_tokens] * max(0, len(prompts) - len(self.replay.requests))
        run = self._load(prompts, repeat=500, max_tokens=max_tokens)
        return [list(request.tokens) for request in run.requests]

    def measure(self, repeat: int) -> None:
        """One repeat; side by side, one of the baseline's too, the order swapped every repeat so
        that a steady drift of the machine favours neither."""
        with self.own_cpu:
            if self.companion is None:
                return self._measure(repeat)
            for run in (self.companion, self) if repeat % 2 == 0 else (self, self.companion):
                run._measure(repeat)

    def _measure(self, repeat: int) -> None:
        first = not self.throughput_per_repeat  # its outputs are the ones checked
        server = self.stage.server
        before = self.stage.scrape()
        cuda = self.config.engine.device.startswith("cuda")
        replay = self.replay
        outputs = [r.output_tokens for r in replay.requests] if replay is not None else self.config.grid.max_new_tokens
        # Every cell runs the same instruments, a closed loop as a trace replay: on a server that
        # shares its core with them (a one-core CPU server) they cost it a few per cent, and a step
        # price fitted on closed-loop cells must carry that cost to the replays it predicts.
        with PeakSampler(server_memory(server, cuda), interval_s=0.1) as memory, \
                RunningSampler(self.stage.scrape) as batch, WakeProbe() as stalls:
            arrivals = self.arrivals(len(self.prompts), repeat) if self.cell.request_rate else None
            run = self._load(self.prompts, repeat, outputs, arrivals)
        self.running.append(batch.samples)
        self.machine_stall_max_s = max(self.machine_stall_max_s, stalls.longest_s)
        after = self._settled_snapshot(before, run)
        self.runs.append(run)
        self.count_acceptance(before, after)
        self.server_ttft.append(histogram_mean_delta(before, after, "vllm:time_to_first_token_seconds"))
        self.server_itl.append(histogram_mean_delta(before, after, "vllm:inter_token_latency_seconds"))
        self.server_queue.append(histogram_mean_delta(before, after, "vllm:request_queue_time_seconds"))
        self.peak_bytes = max(self.peak_bytes, memory.peak)
        self.memory_kind = "gpu" if cuda else "rss"
        for request in run.requests:
            gaps = np.diff(request.arrivals_s).tolist() if len(request.arrivals_s) > 1 else []
            tokens = request.output_tokens
            self.request_table.append({
                "cell_id": self.cell.id, "repeat": repeat, "batch_index": 0,
                "request_id": self.prompt_ids[request.index], "prompt_tokens": request.prompt_tokens,
                "output_tokens": tokens, "ttft_s": request.ttft_s, "e2e_s": request.e2e_s,
                "tpot_s": (request.e2e_s - request.ttft_s) / (tokens - 1) if tokens > 1 else float("nan"),
                "itl_s": gaps, "start_offset_s": request.sent_s, "tokens": list(request.tokens),
                "replica": request.replica,  # which of the cell's servers served it (0 with one)
                # open loop: when it was due (its arrival) and how late the client sent it
                "arrival_s": request.scheduled_s if self.cell.request_rate else request.sent_s,
                "send_lag_s": request.sent_s - request.scheduled_s if self.cell.request_rate else 0.0,
                **({"trace_input_tokens": replay.requests[request.index].input_tokens,
                    "trace_output_tokens": replay.requests[request.index].output_tokens,
                    # the machine's longest stall while this request was due and not yet sent
                    "machine_stall_s": stalls.during(run.origin_s + request.scheduled_s, run.origin_s + request.sent_s)}
                   if replay is not None else {}),
            })
            if first:
                self.outputs[request.index] = list(request.tokens)
        self.throughput_per_repeat.append(run.output_tokens / run.wall_s)
        self.request_rate_per_repeat.append(len(run.requests) / run.wall_s)

    def count_acceptance(self, before: Snapshot, after: Snapshot) -> None:
        """Adds one repeat's deltas of the server's spec-decode counters (whatever its method:
        they are vLLM's for every drafter) to the cell's."""
        for name in COUNTERS:
            self.counters[name] = self.counters.get(name, 0.0) + delta(before, after, name)
        for position, value in after.by_label(PER_POSITION, "position").items():
            previous = before.by_label(PER_POSITION, "position").get(position, 0.0)
            self.per_position[int(position)] = self.per_position.get(int(position), 0.0) + value - previous

    def _settled_snapshot(self, before: Snapshot, run: LoadRun, timeout_s: float = 5.0) -> Snapshot:
        """/metrics once the server has counted every token the client received (its stats can
        trail the last streamed chunk by a step)."""
        deadline = time.monotonic() + timeout_s
        while True:
            after = self.stage.scrape()
            counted = delta(before, after, "vllm:generation_tokens_total")
            if counted >= run.output_tokens or not after.has("vllm:generation_tokens_total") \
                    or time.monotonic() > deadline:
                return after
            time.sleep(0.05)

    def finish(self) -> CellOutcome:
        cell, config, engine = self.cell, self.config, self.stage.engine
        requests = self.request_table
        output_tokens = sum(row["output_tokens"] for row in requests)
        client_cpu = sum(run.client_cpu_s for run in self.runs)
        row = {
            **measured_columns(cell, engine.name, requests, [len(p) for p in self.prompts], self.throughput_per_repeat,
                               sum(run.wall_s for run in self.runs), config.grid.max_new_tokens, config.grid.repeats),
            # The server's own view, to cross-check the client's (its ITL is per engine step).
            "server_ttft_mean_s": _mean(self.server_ttft), "server_itl_mean_s": _mean(self.server_itl),
            "server_queue_mean_s": _mean(self.server_queue),
            "burstiness": config.load.burstiness if cell.request_rate else float("nan"),
            "achieved_request_rate": float(np.median(self.request_rate_per_repeat)),
            "send_lag_max_s": max((r["send_lag_s"] for r in requests), default=0.0),
            "k_schedule": _schedule_text(cell.draft),
            "client_cpu_per_token_s": client_cpu / output_tokens if output_tokens else float("nan"),
            "device": config.engine.device, "dtype": engine.dtype,
            "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
            "synthetic": config.grid.synthetic, "synthetic_alpha": cell.alpha,
            "graph_captures_timed": 0, "estimated": False,
            "own_cpu_cores": self.own_cpu.cores, "other_cpu_cores": self.own_cpu.other_cores,
            **self.engine_columns(),
        }
        row.update(batch_columns(self.running, self.machine_stall_max_s))
        if self.replay is not None:
            row.update(trace_columns(self.replay, requests))
        if self.companion is not None:
            row["baseline_tokens_per_s_runs"] = [float(x) for x in self.companion.throughput_per_repeat]
        if cell.is_speculative:
            row["pairing"] = SIDE_BY_SIDE if self.companion is not None else SEQUENTIAL
            row.update(self.acceptance_columns())
            if cell.alpha:
                row["synthetic_expected_alpha"], row["synthetic_expected_tau"] = expected_acceptance(
                    parse_alpha(cell.alpha), cell.k)
        return CellOutcome(row, requests, [], self.outputs)

    def engine_columns(self) -> dict:
        """The columns only this engine measures (memory, its server's own figures): none here."""
        return {}

    def acceptance_columns(self) -> dict:
        """α, τ, per-position acceptance and the K drafted, from the deltas of vLLM's spec-decode
        counters around each repeat."""
        cell = self.cell
        drafts = self.counters.get(COUNTERS[0], 0.0)
        drafted = self.counters.get(COUNTERS[1], 0.0)
        accepted = self.counters.get(COUNTERS[2], 0.0)
        by_position = [self.per_position.get(i, 0.0) for i in range(server_k(cell.draft, cell.k))]
        return {
            "alpha": accepted / drafted if drafted else float("nan"),
            "tau": 1 + accepted / drafts if drafts else float("nan"),
            "drafted": int(drafted), "accepted": int(accepted), "num_drafts": int(drafts),
            # Drafts that did not keep all K (exact when every draft had K tokens, as a draft
            # model's do; a shorter n-gram draft kept whole counts here too).
            "rejections": int(drafts - by_position[-1]) if by_position else 0,
            "acceptance_by_position": [v / drafts if drafts else float("nan") for v in by_position],
            # the mean K the server drafted with: a fixed K, or what a schedule chose per step
            "k_drafted_mean": drafted / drafts if drafts else float("nan"),
        }


class RunningSampler(PeriodicSampler):
    """The server's running and waiting requests (vLLM's `vllm:num_requests_running` and
    `_waiting` gauges), sampled from /metrics every `interval_s` while a trace replays: the batch
    sizes the server really ran at. Samples are (seconds from the start, running, waiting, each
    server's running): several servers (an --endpoint list) are summed, and each one's batch kept."""

    def __init__(self, scrape: Callable[[tuple[str, ...]], Snapshot], interval_s: float = 0.25) -> None:
        super().__init__(interval_s)
        self.scrape = scrape
        self.samples: list[tuple[float, float, float, tuple[float, ...]]] = []
        self.origin = time.monotonic()

    def sample(self) -> None:
        try:
            snapshot = self.scrape(("vllm:num_requests_running", "vllm:num_requests_waiting"))
        except OSError:
            return  # a scrape that failed is a sample missing, not a measurement lost
        if snapshot.has("vllm:num_requests_running"):
            per_server = tuple(snapshot.by_label("vllm:num_requests_running", "server").values())
            self.samples.append((time.monotonic() - self.origin, snapshot.total("vllm:num_requests_running"),
                                 snapshot.total("vllm:num_requests_waiting"), per_server))

    def __enter__(self) -> "RunningSampler":
        self.origin = time.monotonic()
        self.sample()
        return super().__enter__()


def batch_columns(running: list[list[tuple]], machine_stall_max_s: float = float("nan")) -> dict:
    """Every served cell's batch the server really ran at (with several servers: each server's
    batch, its samples pooled; the timeline: their sum) and the machine's longest stall."""
    samples = [s for repeat in running for s in repeat]
    counts = np.array([n for s in samples for n in (s[3] if len(s) > 3 and s[3] else (s[1],))], dtype=float)
    first = running[0] if running else []
    return {
        "machine_stall_max_s": machine_stall_max_s,
        "running_mean": float(counts.mean()) if len(counts) else float("nan"),
        "running_max": float(counts.max()) if len(counts) else float("nan"),
        "running_share_large": float((counts >= LARGE_BATCH).mean()) if len(counts) else float("nan"),
        "running_timeline_s": [round(s[0], 3) for s in first],
        "running_timeline": [s[1] for s in first],
        "waiting_timeline": [s[2] for s in first],
    }


def trace_columns(replay, requests: list[dict]) -> dict:
    """A trace cell's own columns: what was replayed, how late requests were sent (and how many of
    the late ones the machine itself stalled for), how closely prompts and outputs kept the trace's
    lengths."""
    lags = [r["send_lag_s"] for r in requests]
    late = [r for r in requests if r["send_lag_s"] > SEND_LAG_GOAL_S]
    prompt_error = [abs(r["prompt_tokens"] - r["trace_input_tokens"]) / r["trace_input_tokens"] for r in requests]
    return {
        "trace": replay.describe(),
        "send_lag_p50_s": float(np.percentile(lags, 50)) if lags else float("nan"),
        "send_lag_p99_s": float(np.percentile(lags, 99)) if lags else float("nan"),
        "late_sends": len(late),
        "late_sends_machine": sum(stalled_by_machine(r.get("machine_stall_s", 0.0), r["send_lag_s"]) for r in late),
        "trace_prompt_error_max": max(prompt_error, default=float("nan")),
        "trace_prompt_misses": sum(not within_length(r["prompt_tokens"], r["trace_input_tokens"]) for r in requests),
        "trace_output_mismatches": sum(r["output_tokens"] != r["trace_output_tokens"] for r in requests),
    }


def _schedule_text(draft: str) -> str:

    schedule = split_schedule(draft)[1]
    return format_schedule(schedule) if schedule else ""


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.fmean(finite) if finite else float("nan")
