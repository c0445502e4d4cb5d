"""The run tables' contract: every column of the cells, requests and steps tables, with its type,
unit and meaning, and the vocabulary they share (modes, pairing kinds, the large batch,
the send-lag goal).

This module is the one door between measuring and judging: engines write rows in these columns
(the shared part of a cells row built here, by `grid_columns` and `measured_columns`; each engine
adds only its own), `results.py` validates tables against it, and the judge (fit, gate, report,
plan) reads these columns and nothing engine-specific. docs/reference/tables.md is generated from it.

It imports nothing of specbench and loads neither torch nor pandas.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable, Protocol, Sequence

import numpy as np

# --- the vocabulary ----------------------------------------------------------------------------

AR = "autoregressive"  # the baseline's mode, and its `draft`
SPECULATIVE = "speculative"

# How a speculative cell's repeats pair with its baseline's (fit.noise reads them):
TURNS = "turns"  # native: a group's cells take turns repeat by repeat
SIDE_BY_SIDE = "side-by-side"  # served: the baseline server measured alternately beside this one
BRACKETED = "bracketed"  # served: the baselines measured before and after (unpaired)
SEQUENTIAL = "sequential"  # older served runs: one after the other

# The rollout question's "large batch": a trace replay's share of time at B >= this, check's default
LARGE_BATCH = 32
# How a load is spread over several servers, measured (served.client) and simulated (fleet.router) alike:
# the fewest requests in flight (ties: the server chosen longest ago), in turn, or by llm-d's default
# scheduling profile (`endpoint_picker_scores`)
ROUTERS = ("least-outstanding", "round-robin", "prefix-aware")
# The default profile of the Gateway API Inference Extension's endpoint picker, on which llm-d's
# scheduler builds: prefix-cache-scorer 3, queue-scorer 1, kv-cache-utilization-scorer 1
PREFIX_WEIGHT, QUEUE_WEIGHT, KV_WEIGHT = 3.0, 1.0, 1.0
# how often the prefix-aware router reads each server's queue and KV cache (its /metrics: the
# endpoint picker's default refresh), served and simulated alike
ROUTER_METRICS_INTERVAL_S = 0.05
# A trace request sent later than this after its arrival time is late (docs/reference/tables.md: late_sends)
SEND_LAG_GOAL_S = 0.005



def stalled_by_machine(machine_stall_s, send_lag_s):
    """Whether a late request was the machine's delay (the `late_sends_machine` column): the machine
    itself stalled (measure.WakeProbe) for at least half of its lateness while it was due. Scalars
    or pandas Series alike."""
    return machine_stall_s >= send_lag_s / 2


def chain_keys(prefix) -> tuple:
    """A prompt's unit keys made to name everything before them too, as vLLM's block hashes chain
    (two prompts share a unit only if they agree up to it): the prefix-aware router's keys, simulated
    (fleet.replica) and served (served.client) alike."""
    chained, key = [], 0
    for unit in prefix:
        key = hash((key, unit))
        chained.append(key)
    return tuple(chained)


def endpoint_picker_scores(cached_shares: Sequence[float], waiting: Sequence[float],
                           free_shares: Sequence[float]) -> list[float]:
    """The `prefix-aware` router's score of each server, the highest taking the request: 3 × the
    share of the request's prompt its prefix cache holds + 1 × its queue score (requests waiting,
    min-max normalised across the servers: the shortest queue 1, the longest 0, all equal 1) + 1 ×
    its KV cache's free share."""
    low, high = min(waiting), max(waiting)
    return [PREFIX_WEIGHT * share + QUEUE_WEIGHT * (1.0 if high == low else (high - queue) / (high - low))
            + KV_WEIGHT * free for share, queue, free in zip(cached_shares, waiting, free_shares)]


PERCENTILES = (50, 90, 99)
LATENCIES = ("ttft", "itl", "itl_chunk", "tpot", "e2e")  # each as _p50_s, _p90_s, _p99_s, _mean_s

# Who writes a column: every row (failed ones too), every measured row, or only some.
EVERY_ROW = "every row"
MEASURED = "every measured row"


@dataclass(frozen=True)
class Column:
    name: str
    dtype: str  # "str", "int", "float", "bool", "list[float]", "list[int]"
    unit: str  # "s", "tokens/s", "bytes", "cores", "tokens", "share", "count", "" (none)
    meaning: str
    written_by: str = MEASURED  # EVERY_ROW, MEASURED, or the engines/cases that write it

    @property
    def numeric(self) -> bool:
        return self.dtype in ("int", "float")


def _latency_columns() -> list[Column]:
    meanings = {"ttft": "time to first token: the request's start (its batch's prefill start, or its send) to "
                        "its first token",
                "itl": "gaps between a request's consecutive tokens, one per token (a speculative step's accepted "
                       "tokens arrive together: its zeros kept)",
                "itl_chunk": "gaps between consecutive chunks of tokens that arrive together, as `vllm bench serve` "
                             "counts ITL",
                "tpot": "(e2e - TTFT) / (output tokens - 1), per request",
                "e2e": "the request's start to its last token"}
    return [Column(f"{name}_{stat}_s", "float", "s", f"{meanings[name]}: {stat.replace('p', 'percentile ')}"
                   if stat != "mean" else f"{meanings[name]}: mean")
            for name in LATENCIES for stat in (*(f"p{p}" for p in PERCENTILES), "mean")]


CELLS: tuple[Column, ...] = (
    # the grid point
    Column("cell_id", "str", "", "workload|B|T|draft|K (workload|C4096|B… at a context length)", EVERY_ROW),
    Column("status", "str", "", "ok, failed, oom or skipped", EVERY_ROW),
    Column("message", "str", "", "the error, or what interrupted the cell", EVERY_ROW),
    Column("mode", "str", "", "autoregressive (a baseline) or speculative", EVERY_ROW),
    Column("workload", "str", "", "the prompt set", EVERY_ROW),
    Column("draft", "str", "", "the draft (autoregressive for baselines)", EVERY_ROW),
    Column("k", "int", "tokens", "draft tokens per step (0 for baselines)", EVERY_ROW),
    Column("batch_size", "int", "requests", "closed-loop batch size (0 on open-loop cells)", EVERY_ROW),
    Column("temperature", "float", "", "sampling temperature (0: greedy)", EVERY_ROW),
    Column("request_rate", "float", "requests/s", "the offered open-loop rate (0 on closed-loop cells)", EVERY_ROW),
    Column("context_length", "int", "tokens", "prompts built to this length (0: the prompts as they are)", EVERY_ROW),
    # what ran
    Column("engine", "str", "", "native, vllm or endpoint"),
    Column("requests", "int", "requests", "requests per repeat"),
    Column("repeats", "int", "count", "repeats measured"),
    Column("prompt_tokens_mean", "float", "tokens", "mean prompt length"),
    Column("max_new_tokens", "int", "tokens", "the output length asked for"),
    Column("output_tokens", "int", "tokens", "output tokens over every repeat"),
    Column("tokens_per_s", "float", "tokens/s", "output tokens / batch wall time (prefill included), median over "
                                                "repeats"),
    Column("tokens_per_s_runs", "list[float]", "tokens/s", "tokens_per_s of each repeat"),
    Column("wall_s", "float", "s", "measured wall time over every repeat"),
    *_latency_columns(),
    # the speed-up (the sweep pairs each speculative cell with its group's baseline)
    Column("baseline_tokens_per_s", "float", "tokens/s", "the matching autoregressive cell's tokens_per_s (side by "
                                                         "side: the median of baseline_tokens_per_s_runs)"),
    Column("speedup", "float", "", "tokens_per_s / baseline_tokens_per_s"),
    Column("speedup_runs", "list[float]", "", "the speed-up repeat by repeat, as pairing allows"),
    Column("pairing", "str", "", "how the repeats paired with the baseline's: turns, side-by-side, bracketed, "
                                 "sequential", "speculative cells"),
    Column("baseline_tokens_per_s_runs", "list[float]", "tokens/s", "the baseline repeats this cell is compared with",
           "side-by-side and bracketed cells"),
    # acceptance
    Column("alpha", "float", "share", "accepted draft tokens / drafted tokens (vLLM's acceptance rate)",
           "speculative cells"),
    Column("tau", "float", "tokens", "tokens emitted per target forward per row = 1 + accepted / verify steps "
                                     "(vLLM's acceptance length)", "speculative cells"),
    Column("drafted", "int", "tokens", "draft tokens proposed", "speculative cells"),
    Column("accepted", "int", "tokens", "draft tokens accepted", "speculative cells"),
    Column("acceptance_by_position", "list[float]", "share", "per draft position i: accepted at i / drafted at i",
           "speculative cells"),
    Column("num_drafts", "int", "count", "draft steps (per row): the α fit's counts", "speculative cells"),
    Column("rejections", "int", "count", "draft steps that rejected a draft token", "speculative cells"),
    # phases (the native engine's step-level timings)
    Column("prefill_share", "float", "share", "share of wall time in the prefill", "native"),
    Column("draft_share", "float", "share", "share of wall time drafting", "native"),
    Column("verify_share", "float", "share", "share of wall time in the verify pass", "native"),
    Column("overhead_share", "float", "share", "share of wall time in bookkeeping", "native"),
    Column("step_draft_s", "float", "s", "median time per full-batch step drafting K tokens", "native"),
    Column("step_verify_s", "float", "s", "median time per full-batch step of the verify pass (one decode step for "
                                          "AR)", "native"),
    Column("step_overhead_s", "float", "s", "median bookkeeping time per full-batch step", "native"),
    Column("target_forwards", "int", "count", "target forwards", "native"),
    Column("prefill_s", "float", "s", "median target prefill per batch (ends with the first token)", "native"),
    Column("draft_prefill_s", "float", "s", "median draft prefill per batch", "native"),
    Column("roofline_step_s", "float", "s", "the fastest a decode step could be: bytes it must read over the copy "
                                            "bandwidth measured at the start", "native baselines"),
    Column("roofline_fraction", "float", "share", "roofline_step_s over the measured decode step", "native baselines"),
    # memory
    Column("peak_memory_bytes", "int", "bytes", "measured peak: process RSS on CPU, NVML device memory on CUDA"),
    Column("peak_torch_bytes", "int", "bytes", "torch's peak allocated", "native"),
    Column("memory_kind", "str", "", "rss or gpu"),
    Column("target_param_bytes", "int", "bytes", "the target's weights"),
    Column("target_kv_cache_bytes", "int", "bytes", "the target's KV cache"),
    Column("draft_param_bytes", "int", "bytes", "the draft's weights (0 for self:N and ngram)"),
    Column("draft_kv_cache_bytes", "int", "bytes", "the draft's KV cache"),
    Column("draft_memory_bytes", "int", "bytes", "what the draft adds: its weights and KV cache"),
    # where and how it ran
    Column("device", "str", "", "cpu, cuda, cuda:N"),
    Column("dtype", "str", "", "the models' dtype"),
    Column("load_average", "float", "", "the 1-minute load average after the cell"),
    Column("own_cpu_cores", "float", "cores", "CPU specbench's own processes (a server it started included) used "
                                              "while the cell measured"),
    Column("other_cpu_cores", "float", "cores", "CPU every other process on the machine used while the cell "
                                                "measured: the busy-machine warning's measure"),
    Column("synthetic", "bool", "", "timing-only cell (--weights random)"),
    Column("synthetic_alpha", "str", "", "the simulated acceptance profile (timing-only cells)"),
    Column("synthetic_expected_alpha", "float", "share", "the α the simulated profile implies",
           "timing-only speculative cells"),
    Column("synthetic_expected_tau", "float", "tokens", "the τ the simulated profile implies",
           "timing-only speculative cells"),
    Column("cuda_graphs", "bool", "", "steps replayed from CUDA graphs", "native, vllm"),
    Column("graph_captures_timed", "int", "count", "CUDA graphs captured inside measured repeats"),
    Column("estimated", "bool", "", "step times scaled from a layer subset to full depth"),
    Column("target_layers_built", "int", "count", "the target's layers built", "native"),
    Column("target_layers_full", "int", "count", "the target's layers at full depth", "native"),
    Column("node_id", "str", "", "the Ray node (local on the local executor)"),
    Column("host", "str", "", "the machine"),
    Column("gpu_model", "str", "", "the GPU model(s) used (no GPU (CPU model) on a CPU, endpoint for a server "
                                   "specbench did not start)"),
    Column("gpu_uuids", "str", "", "their NVML UUIDs"),
    Column("gpu_driver", "str", "", "their driver"),
    Column("torch_version", "str", "", "torch's version"),
    Column("engine_version", "str", "", "the engine's version"),
    # lossless checks (the sweep)
    Column("lossless", "str", "", "greedy: exact, near-tie, MISMATCH; sampled: consistent, MISMATCH; n/a "
                                  "(synthetic); unchecked", "speculative cells"),
    Column("lossless_detail", "str", "", "what the lossless check found", "speculative cells"),
    Column("sampled_positions", "int", "count", "positions the sampled check scored", "sampled speculative cells"),
    Column("sampled_argmax_share", "float", "share", "how often the target's argmax was picked",
           "sampled speculative cells"),
    Column("sampled_outside_top_share", "float", "share", "how often a token outside the target's top 20 was picked",
           "sampled speculative cells"),
    Column("sampled_logprob_mean", "float", "", "the target's mean log-prob per token", "sampled speculative cells"),
    Column("sampled_evidence_log10", "float", "", "log10 of the evidence against correct sampling (>= 3: MISMATCH)",
           "sampled speculative cells"),
    # served cells
    Column("server_ttft_mean_s", "float", "s", "the server's own mean TTFT", "served"),
    Column("server_itl_mean_s", "float", "s", "the server's own mean ITL (per engine step)", "served"),
    Column("server_queue_mean_s", "float", "s", "vLLM's mean queue time", "served"),
    Column("burstiness", "float", "", "the gamma shape of the open-loop gaps", "served"),
    Column("achieved_request_rate", "float", "requests/s", "requests / measured time", "served"),
    Column("send_lag_max_s", "float", "s", "the latest a request was sent after its arrival time", "served"),
    Column("k_schedule", "str", "", "a scheduled draft's schedule", "served"),
    Column("k_drafted_mean", "float", "tokens", "drafted tokens per draft from the server's counters (the K the "
                                                "server really used)", "served speculative cells"),
    Column("client_cpu_per_token_s", "float", "s", "the client's CPU time per output token", "served"),
    Column("kv_cache_tokens", "float", "tokens", "the KV-cache capacity vLLM reports", "vllm"),
    Column("kv_cache_max_concurrency", "float", "requests", "the concurrency vLLM reports it can hold", "vllm"),
    Column("server_ready_s", "float", "s", "the server's start-up time", "vllm"),
    Column("endpoint", "str", "", "the URL measured", "endpoint"),
    Column("acceptance_source", "str", "", "where α and τ came from (vLLM's counters, SGLang's gauges or "
                                           "/server_info, or none)", "endpoint speculative cells"),
    # every served cell: the batch the server really ran at (vLLM's running gauge, sampled) and the
    # machine's stalls (a probe process), instruments a closed loop runs as a trace replay does
    Column("machine_stall_max_s", "float", "s", "the machine's longest stall (a probe process's latest wake)",
           "served"),
    Column("running_mean", "float", "requests", "the server's running requests (each server's, with several): mean",
           "served"),
    Column("running_max", "float", "requests", "the server's running requests: maximum", "served"),
    Column("running_share_large", "float", "share", "share of samples at B >= LARGE_BATCH", "served"),
    Column("running_timeline_s", "list[float]", "s", "the first repeat's samples: seconds from the start", "served"),
    Column("running_timeline", "list[float]", "requests", "the first repeat's samples: running (summed over servers)",
           "served"),
    Column("waiting_timeline", "list[float]", "requests", "the first repeat's samples: waiting", "served"),
    # trace replays
    Column("trace", "str", "", "what was replayed (azure-conv 600–720 s at 0.05× speed)", "trace"),
    Column("send_lag_p50_s", "float", "s", "how late the client sent requests against their trace times: median",
           "trace"),
    Column("send_lag_p99_s", "float", "s", "the same, percentile 99 (above the send-lag goal: a warning)", "trace"),
    Column("late_sends", "int", "requests", "requests sent later than the send-lag goal", "trace"),
    Column("late_sends_machine", "int", "requests", "late requests the machine itself stalled for (at least half the "
                                                    "lateness)", "trace"),
    Column("trace_prompt_error_max", "float", "share", "largest relative difference between a prompt's tokens and "
                                                       "the trace's input length", "trace"),
    Column("trace_prompt_misses", "int", "requests", "prompts further from the trace's length than 2 % or 8 tokens",
           "trace"),
    Column("trace_output_mismatches", "int", "requests", "outputs whose length differs from the trace's", "trace"),
)

REQUESTS: tuple[Column, ...] = (
    Column("cell_id", "str", "", "the cell", EVERY_ROW),
    Column("repeat", "int", "count", "the repeat", EVERY_ROW),
    Column("batch_index", "int", "count", "the batch within the repeat", EVERY_ROW),
    Column("request_id", "str", "", "the prompt's id", EVERY_ROW),
    Column("prompt_tokens", "int", "tokens", "the prompt's length", EVERY_ROW),
    Column("output_tokens", "int", "tokens", "tokens generated", EVERY_ROW),
    Column("ttft_s", "float", "s", "time to first token", EVERY_ROW),
    Column("e2e_s", "float", "s", "start to last token", EVERY_ROW),
    Column("tpot_s", "float", "s", "(e2e - TTFT) / (tokens - 1)", EVERY_ROW),
    Column("itl_s", "list[float]", "s", "the gaps between consecutive tokens", EVERY_ROW),
    Column("start_offset_s", "float", "s", "when the request's batch started (or it was sent), seconds into its "
                                           "repeat", EVERY_ROW),
    Column("tokens", "list[int]", "", "the generated token ids", EVERY_ROW),
    Column("arrival_s", "float", "s", "when it was due, seconds into the repeat", "served"),
    Column("send_lag_s", "float", "s", "how late the client sent it", "served"),
    Column("replica", "int", "count", "which of the cell's servers served it (an --endpoint list; 0 with one)",
           "served"),
    Column("trace_input_tokens", "int", "tokens", "the input length the trace gave", "trace"),
    Column("trace_output_tokens", "int", "tokens", "the output length the trace gave", "trace"),
    Column("machine_stall_s", "float", "s", "the machine's longest stall while the request was due and not yet sent",
           "trace"),
)

STEPS: tuple[Column, ...] = (
    Column("cell_id", "str", "", "the cell", EVERY_ROW),
    Column("repeat", "int", "count", "the repeat", EVERY_ROW),
    Column("batch_index", "int", "count", "the batch within the repeat", EVERY_ROW),
    Column("step", "int", "count", "the decode step", EVERY_ROW),
    Column("request_id", "str", "", "the request", EVERY_ROW),
    Column("batch_rows", "int", "requests", "rows active in the step", EVERY_ROW),
    Column("drafted", "int", "tokens", "draft tokens proposed for this row", EVERY_ROW),
    Column("accepted", "int", "tokens", "of them accepted", EVERY_ROW),
    Column("emitted", "int", "tokens", "tokens emitted for this row", EVERY_ROW),
    Column("verify_tokens", "int", "tokens", "positions per row in the target forward: longest proposal + 1",
           EVERY_ROW),
    Column("draft_s", "float", "s", "the step's drafting time", EVERY_ROW),
    Column("verify_s", "float", "s", "the step's verify time", EVERY_ROW),
    Column("overhead_s", "float", "s", "the step's bookkeeping time", EVERY_ROW),
    Column("end_s", "float", "s", "when the step ended, seconds into its batch", EVERY_ROW),
)

TABLE_COLUMNS: dict[str, tuple[Column, ...]] = {"cells": CELLS, "requests": REQUESTS, "steps": STEPS}
# What every command reads from the cells table
REQUIRED_CELL_COLUMNS = ("cell_id", "mode", "status", "workload", "batch_size", "temperature", "draft", "k")


def unknown_columns(table: str, columns: Iterable[str]) -> list[str]:
    """Columns a table holds that the contract does not name."""
    known = {column.name for column in TABLE_COLUMNS[table]}
    return [name for name in columns if name not in known]


# --- the shared part of a cells row ---------------------------------------------------------------

class GridPoint(Protocol):
    """What a row needs of a cell (grid.Cell is one)."""
    id: str
    workload: str
    draft: str
    k: int
    batch_size: int
    temperature: float
    request_rate: float
    context_length: int

    @property
    def is_speculative(self) -> bool: ...


def grid_columns(cell: GridPoint, status: str = "ok", message: str = "") -> dict:
    """The columns every row has, failed and skipped ones too: the cell's grid point and status."""
    return {"cell_id": cell.id, "status": status, "message": message,
            "mode": SPECULATIVE if cell.is_speculative else AR, "workload": cell.workload, "draft": cell.draft,
            "k": cell.k, "batch_size": cell.batch_size, "temperature": cell.temperature,
            "request_rate": cell.request_rate, "context_length": cell.context_length}


def runs_list(value) -> list[float]:
    """A runs column's value (tokens_per_s_runs, speedup_runs, ...) as a list of floats: a list or
    an array as Parquet gives it back; anything else (NaN, missing) is empty."""
    return [float(x) for x in value] if isinstance(value, (list, tuple, np.ndarray)) else []


def percentiles(values, prefix: str) -> dict[str, float]:
    """`prefix`_p50_s, _p90_s, _p99_s and _mean_s of `values` (NaN when there are none)."""
    if len(values) == 0:
        return {f"{prefix}_p{p}_s": float("nan") for p in PERCENTILES} | {f"{prefix}_mean_s": float("nan")}
    array = np.asarray(values, dtype=float)
    out = {f"{prefix}_p{p}_s": float(np.percentile(array, p)) for p in PERCENTILES}
    out[f"{prefix}_mean_s"] = float(array.mean())
    return out


def chunk_gaps(gaps) -> list[float]:
    """Inter-token gaps as `vllm bench serve` counts ITL: one per chunk of tokens that arrive
    together (a speculative step's accepted tokens), where specbench's `itl_*` counts one per
    token, the chunk's zeros included. Its mean is therefore larger on speculative cells."""
    return [gap for gap in gaps if gap > 0]


def measured_columns(cell: GridPoint, engine: str, requests: Sequence[dict], prompt_lengths: Sequence[int],
                     tokens_per_s_runs: Sequence[float], wall_s: float, max_new_tokens: int,
                     repeats_asked: int) -> dict:
    """The shared part of a measured cell's row, whichever engine measured it: its grid point,
    what ran, throughput, and the latency percentiles of its request rows (REQUESTS' columns)."""
    repeats = len(tokens_per_s_runs)
    itl = [gap for row in requests for gap in row["itl_s"]]
    message = f"interrupted: {repeats} of {repeats_asked} repeats" if repeats < repeats_asked else ""
    return {
        **grid_columns(cell, "ok", message), "engine": engine,
        "requests": len(prompt_lengths), "repeats": repeats,
        "prompt_tokens_mean": float(np.mean(prompt_lengths)) if len(prompt_lengths) else float("nan"),
        "max_new_tokens": max_new_tokens, "output_tokens": int(sum(row["output_tokens"] for row in requests)),
        "tokens_per_s": float(np.median(tokens_per_s_runs)) if repeats else float("nan"),
        "tokens_per_s_runs": [float(x) for x in tokens_per_s_runs], "wall_s": float(wall_s),
        **percentiles([row["ttft_s"] for row in requests], "ttft"), **percentiles(itl, "itl"),
        **percentiles(chunk_gaps(itl), "itl_chunk"),
        **percentiles([row["tpot_s"] for row in requests if not math.isnan(row["tpot_s"])], "tpot"),
        **percentiles([row["e2e_s"] for row in requests], "e2e"),
    }
