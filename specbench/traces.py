"""Request traces: when each request arrived and how long its input and output were, read from
Mooncake JSONL, the Azure LLM inference trace CSV or BurstGPT CSV, and the slice of one a sweep
replays (`--trace`, `--trace-window`, `--trace-speedup`, `--trace-max-requests`).

A replay keeps the trace's arrival times (scaled) and lengths exactly; what public traces leave out
is the text, which the sweep fills with real content of the trace's kind (workloads.trace_records).
Rows out of time order are sorted, rows the target cannot hold are skipped, and both are counted.
Rows recorded at one instant are spread evenly to the trace's next instant (`spread_ties`), for
every reader alike: what a served replay sends is what `plan` simulates.
"""

from __future__ import annotations

import gzip
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd

from specbench.workloads import WORKLOADS_DIR

TRACES_DIR = WORKLOADS_DIR / "traces"
SHIPPED = {  # name -> (file under workloads/traces/, the workload its prompts take their questions from)
    "azure-code": ("AzureLLMInferenceTrace_code.csv", "code"),
    "azure-conv": ("AzureLLMInferenceTrace_conv.csv", "chat"),
    "mooncake-conv": ("mooncake_conversation_trace.jsonl.gz", "chat"),
}


class TraceError(ValueError):
    """A trace that cannot be replayed: reported as one line, exit 2."""


MOONCAKE_HASH_BLOCK = 512  # tokens each of a Mooncake trace's hash ids stands for (its README)


def _seconds(value: float) -> str:
    """A time in a trace as messages show it: to the millisecond, never in exponent notation."""
    return f"{round(value, 3):.12g}"


def _span(start: float, end: float) -> str:
    return f"{_seconds(start)}–{_seconds(end)}"


@dataclass(frozen=True)
class TraceRequest:
    arrival_s: float  # seconds from the trace's first request (scaled, in a replay: from the window's start)
    input_tokens: int
    output_tokens: int
    text: str = ""  # the request's own text, where the trace has it
    # what its prompt shares with others, where the trace says (Mooncake): a hash id per block of
    # the trace's `hash_block_tokens`, equal ids for equal blocks after equal prefixes
    hash_ids: tuple[int, ...] = ()


@dataclass
class Trace:
    name: str
    requests: list[TraceRequest]
    workload: str = ""  # the kind of content its prompts need (chat, code); "" = unknown
    source: str = ""
    out_of_order: int = 0  # rows sorted into time order
    dropped: dict[str, int] = field(default_factory=dict)  # rows left out on reading, by reason
    hash_block_tokens: int = 0  # tokens each of its requests' hash ids stands for (0: it has none)
    spread: int = 0  # rows recorded at an instant an earlier row had, moved towards the next (spread_ties)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s if self.requests else 0.0

    def stats(self) -> dict:
        """Requests, duration, mean rate and input/output length percentiles."""
        inputs = np.array([r.input_tokens for r in self.requests], dtype=float)
        outputs = np.array([r.output_tokens for r in self.requests], dtype=float)
        duration = self.duration_s
        row = {"requests": len(self.requests), "duration_s": duration,
               "rate": len(self.requests) / duration if duration > 0 else float("nan")}
        for name, values in (("input", inputs), ("output", outputs)):
            for p in (50, 90, 99):
                row[f"{name}_p{p}"] = float(np.percentile(values, p)) if len(values) else float("nan")
        return row


@dataclass
class Replay:
    """The requests a sweep sends: the trace's slice, its times scaled and starting at 0."""

    trace: str
    requests: list[TraceRequest]
    window: tuple[float, float]  # trace seconds replayed: start, end
    speedup: float
    workload: str
    out_of_order: int = 0
    skipped: dict[str, int] = field(default_factory=dict)  # reason -> rows of the window left out
    in_window: int = 0  # requests the window holds (more than replayed when --trace-max-requests cut it)
    span: tuple[float, float] | None = None  # trace seconds of the first and last request replayed
    cut: bool = False  # --trace-max-requests stopped the replay before the window's end
    hash_block_tokens: int = 0  # tokens each of its requests' hash ids stands for (0: none)
    spread: int = 0  # the trace's rows recorded at an earlier row's instant, spread to the next (spread_ties)

    @property
    def duration_s(self) -> float:
        return self.requests[-1].arrival_s if self.requests else 0.0

    @property
    def request_count(self) -> int:
        return len(self.requests)

    @property
    def output_tokens_mean(self) -> float:
        return sum(r.output_tokens for r in self.requests) / max(1, len(self.requests))

    @property
    def rate(self) -> float:
        """Mean requests per second as replayed (the cells' `request_rate`)."""
        span = self.duration_s
        return len(self.requests) / span if span > 0 else math.inf

    def describe(self) -> str:
        start, end = self.window
        if self.cut and self.span is not None:  # what was replayed, not the whole window it came from
            first, last = self.span
            return (f"{self.trace} {_span(first, last)} s (the first {len(self.requests)} of the {self.in_window} "
                    f"requests in {_span(start, end)} s, --trace-max-requests) at {self.speedup:g}× speed")
        return f"{self.trace} {_span(start, end)} s at {self.speedup:g}× speed"

    def notes(self) -> list[str]:
        """What was changed or left out, one phrase each (the report says them)."""
        notes = [f"{self.out_of_order} row(s) out of time order, sorted"] if self.out_of_order else []
        if self.spread:
            notes.append(f"{self.spread} of the trace's rows recorded at an earlier row's instant, spread evenly to "
                         f"its next")
        notes += [f"{count} row(s) skipped: {reason}" for reason, count in self.skipped.items() if count]
        return notes

    def to_dict(self) -> dict:
        return {"trace": self.trace, "window": list(self.window), "speedup": self.speedup,
                "workload": self.workload, "requests": len(self.requests), "duration_s": self.duration_s,
                "rate": self.rate, "output_tokens_mean": self.output_tokens_mean, "out_of_order": self.out_of_order,
                "spread": self.spread, "skipped": dict(self.skipped),
                "in_window": self.in_window, "span": list(self.span) if self.span else None, "cut": self.cut,
                "describe": self.describe()}


# --- reading --------------------------------------------------------------------------------------

def spread_ties(arrivals_s: np.ndarray) -> np.ndarray:
    """Arrival times (sorted) with the requests a trace recorded at one instant spread evenly up to
    its next recorded instant (the last instant's over the median gap between instants): a trace's
    resolution, not its traffic. Mooncake's conversation trace records its 12,031 requests in 3 s
    buckets, ten at a time; sent at one instant they would reach a gateway as one burst, which a
    router reading the servers' published state sends to one server."""
    arrivals = np.asarray(arrivals_s, float)
    instants, first, counts = np.unique(arrivals, return_index=True, return_counts=True)
    if len(instants) == len(arrivals):
        return arrivals.copy()
    gaps = np.diff(instants)
    last_gap = float(np.median(gaps)) if len(gaps) else 0.0
    spans = np.append(gaps, last_gap)
    position = np.arange(len(arrivals)) - np.repeat(first, counts)  # each request's place among its instant's
    return arrivals + position * np.repeat(spans / counts, counts)


def load_trace(spec: str) -> Trace:
    """A shipped trace by name (azure-code, azure-conv, mooncake-conv) or a file: .jsonl (Mooncake;
    .jsonl.gz gzipped), or .csv (Azure LLM trace, BurstGPT: told apart by their columns)."""
    if spec in SHIPPED:
        file, workload = SHIPPED[spec]
        path = TRACES_DIR / file
        if not path.exists():
            raise TraceError(f"--trace {spec}: {path} is missing (set SPECBENCH_WORKLOADS to the workloads/ directory)")
        trace = _read(path, spec)
        trace.workload = workload
        return trace
    path = Path(spec)
    if not path.exists():
        raise TraceError(f"--trace {spec}: no such file, and not a shipped trace ({', '.join(SHIPPED)})")
    if path.is_dir():
        raise TraceError(f"--trace {spec}: a directory, not a trace file")
    return _read(path, path.name.removesuffix(".gz").removesuffix(".jsonl") if _is_jsonl(path) else path.stem)


def _is_jsonl(path: Path) -> bool:
    return path.name.endswith((".jsonl", ".jsonl.gz"))


def _read(path: Path, name: str) -> Trace:
    if _is_jsonl(path):
        frame, dropped, names = _mooncake(path)
    elif path.suffix == ".csv":
        frame, dropped, names = _csv(path)
    else:
        raise TraceError(f"--trace {path}: not a trace format specbench reads (.jsonl or .jsonl.gz: Mooncake; "
                         f".csv: Azure LLM trace or BurstGPT)")
    if frame.empty:
        raise TraceError(f"--trace {path}: no requests in it")
    frame = frame.reset_index(drop=True)
    seconds_per_unit = 1e-3 if _is_jsonl(path) else 1.0  # Mooncake's timestamps are in ms

    def refuse(bad: pd.Series, column: str, what: str) -> None:
        """One line naming the first bad row as the file numbers it, and the file's own column name."""
        at = int(bad.to_numpy().argmax())
        value = frame[column].iloc[at]
        shown = f"{value:g}" if isinstance(value, (int, float, np.number)) else repr(value)
        raise TraceError(f"--trace {path}: {frame['where'].iloc[at]}: {names[column]} {what} ({shown})")

    for column in ("arrival_s", "input_tokens", "output_tokens"):
        values = pd.to_numeric(frame[column], errors="coerce")
        bad = values.isna() | ~np.isfinite(values)
        if bad.any():
            refuse(bad, column, "is not a number")
        frame[column] = values
    if (frame["arrival_s"] < 0).any():
        refuse(frame["arrival_s"] < 0, "arrival_s", "is negative")
    for column in ("input_tokens", "output_tokens"):
        if (frame[column] < 1).any():
            refuse(frame[column] < 1, column, "must be at least 1")
    frame["arrival_s"] = frame["arrival_s"] * seconds_per_unit
    out_of_order = int((frame["arrival_s"].diff() < 0).sum())
    frame = frame.sort_values("arrival_s", kind="stable").reset_index(drop=True)
    start = float(frame["arrival_s"].iloc[0])
    arrivals = spread_ties(frame["arrival_s"].to_numpy() - start)
    spread = len(arrivals) - len(np.unique(frame["arrival_s"]))
    texts = frame["text"] if "text" in frame else [""] * len(frame)
    hashes = frame["hash_ids"] if "hash_ids" in frame else [()] * len(frame)
    requests = [TraceRequest(float(t), int(i), int(o), str(x) if isinstance(x, str) else "", h)
                for t, i, o, x, h in zip(arrivals, frame["input_tokens"], frame["output_tokens"], texts, hashes)]
    return Trace(name, requests, source=str(path), out_of_order=out_of_order, dropped=dropped,
                 hash_block_tokens=MOONCAKE_HASH_BLOCK if "hash_ids" in frame else 0, spread=spread)


def _require(frame: pd.DataFrame, columns: list[str], path: Path, what: str) -> None:
    missing = [c for c in columns if c not in frame]
    if missing:
        raise TraceError(f"--trace {path}: {what} needs column(s) {', '.join(missing)}; it has "
                         f"{', '.join(map(str, frame.columns)) or 'none'}")


def _mooncake(path: Path) -> tuple[pd.DataFrame, dict, dict]:
    """Mooncake JSONL: `timestamp` in milliseconds, `input_length`, `output_length`, optional
    `hash_ids` (a list of ints, one per 512 tokens of the input: what a prompt shares with others,
    for the fleet simulator's prefix cache; a served replay sends the text and runs its server without
    prefix caching) and text (`text` or `prompt`)."""
    rows, lines = [], []
    try:
        text = gzip.decompress(path.read_bytes()).decode() if path.suffix == ".gz" else path.read_text()
    except (OSError, EOFError, UnicodeDecodeError) as error:
        raise TraceError(f"--trace {path}: cannot be read as {'gzipped ' if path.suffix == '.gz' else ''}text "
                         f"({error})") from None
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        try:
            row = json.loads(line)
        except json.JSONDecodeError as error:
            raise TraceError(f"--trace {path}: line {number} is not JSON ({error.msg})") from None
        if not isinstance(row, dict):
            raise TraceError(f"--trace {path}: line {number} is JSON but not an object ({type(row).__name__}); a "
                             f"Mooncake trace has one request object per line")
        rows.append(row)
        lines.append(f"line {number}")
    frame = pd.DataFrame(rows)
    _require(frame, ["timestamp", "input_length", "output_length"], path, "a Mooncake trace")
    out = pd.DataFrame({"arrival_s": frame["timestamp"],
                        "input_tokens": frame["input_length"], "output_tokens": frame["output_length"],
                        "where": lines})
    for column in ("text", "prompt"):
        if column in frame:
            out["text"] = frame[column]
            break
    if "hash_ids" in frame:
        for at, ids in enumerate(frame["hash_ids"]):
            if not isinstance(ids, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in ids):
                if ids is None or (isinstance(ids, float) and math.isnan(ids)):
                    continue  # a row without them: shares nothing
                raise TraceError(f"--trace {path}: {lines[at]}: hash_ids is not a list of integers ({ids!r:.40})")
        out["hash_ids"] = [tuple(ids) if isinstance(ids, list) else () for ids in frame["hash_ids"]]
    return out, {}, {"arrival_s": "timestamp", "input_tokens": "input_length", "output_tokens": "output_length"}


def _csv(path: Path) -> tuple[pd.DataFrame, dict, dict]:
    try:
        frame = pd.read_csv(path)
    except (pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as error:
        raise TraceError(f"--trace {path}: not a readable CSV ({str(error).splitlines()[0]})") from None
    frame.columns = [str(c).strip().lstrip("\ufeff") for c in frame.columns]
    rows = [f"row {n}" for n in range(1, len(frame) + 1)]  # data rows, the header not counted
    if "Request tokens" in frame or "Response tokens" in frame:  # BurstGPT
        _require(frame, ["Timestamp", "Request tokens", "Response tokens"], path, "a BurstGPT trace")
        failed = (pd.to_numeric(frame["Response tokens"], errors="coerce") == 0).to_numpy()  # its failed requests
        kept = frame[~failed]
        return pd.DataFrame({"arrival_s": kept["Timestamp"], "input_tokens": kept["Request tokens"],
                             "output_tokens": kept["Response tokens"],
                             "where": [r for r, drop in zip(rows, failed) if not drop]}), \
            ({"failed in the trace (0 response tokens)": int(failed.sum())} if failed.any() else {}), \
            {"arrival_s": "Timestamp", "input_tokens": "Request tokens", "output_tokens": "Response tokens"}
    _require(frame, ["TIMESTAMP", "ContextTokens", "GeneratedTokens"], path, "an Azure LLM trace")
    stamps = pd.to_datetime(frame["TIMESTAMP"], errors="coerce")
    if stamps.isna().any():
        row = int(stamps.isna().to_numpy().argmax()) + 1
        raise TraceError(f"--trace {path}: row {row}: TIMESTAMP {frame['TIMESTAMP'].iloc[row - 1]!r} is not a time")
    seconds = (stamps - stamps.min()).dt.total_seconds()
    return pd.DataFrame({"arrival_s": seconds, "input_tokens": frame["ContextTokens"],
                         "output_tokens": frame["GeneratedTokens"], "where": rows}), {}, \
        {"arrival_s": "TIMESTAMP", "input_tokens": "ContextTokens", "output_tokens": "GeneratedTokens"}


# --- the slice a sweep replays ----------------------------------------------------------------------

def parse_window(text: str) -> tuple[float, float | None]:
    """--trace-window START:DURATION in the trace's seconds (DURATION empty: to the end)."""
    start_text, separator, duration_text = text.partition(":")
    try:
        start = float(start_text) if start_text.strip() else 0.0
        duration = float(duration_text) if duration_text.strip() else None
    except ValueError:
        raise TraceError(f"--trace-window {text!r}: expected START:DURATION in seconds, e.g. 600:300") from None
    if not separator or start < 0 or (duration is not None and not (duration > 0 and math.isfinite(duration))) \
            or not math.isfinite(start):
        raise TraceError(f"--trace-window {text!r}: expected START:DURATION in seconds, START >= 0 and DURATION a "
                         f"finite number > 0 (or empty: to the end), e.g. 600:300")
    return start, duration


def replay(trace: Trace, window: str = "", speedup: float = 1.0, max_requests: int = 0, max_context: int = 0,
           min_input: int = 1, context_name: str = "the target's context") -> Replay:
    """The requests of `trace` in `window`, their times divided by `speedup` (0.5: half speed), at
    most `max_requests` of them; rows whose input plus output exceed `max_context` tokens (`context_name`
    says whose), or whose input is below `min_input` (shorter than the chat template alone), are
    skipped and counted."""
    if not (math.isfinite(speedup) and speedup > 0):
        raise TraceError(f"--trace-speedup must be a positive number, got {speedup:g}")
    if max_requests < 0:
        raise TraceError(f"--trace-max-requests must be >= 0, got {max_requests}")
    start, duration = parse_window(window) if window else (0.0, None)
    end = start + duration if duration is not None else trace.duration_s
    chosen = [r for r in trace.requests if start <= r.arrival_s <= end]
    if not chosen:
        raise TraceError(f"--trace-window {window}: no request of {trace.name} arrives in {_span(start, end)} s (the "
                         f"trace spans {_span(0, trace.duration_s)} s)")
    skipped = dict(trace.dropped)
    too_long, too_short, kept = [], [], []
    cut = False
    for request in chosen:  # in time order, up to max_requests kept: skips counted among the rows passed
        if max_requests and len(kept) == max_requests:
            cut = True
            break
        if max_context and request.input_tokens + request.output_tokens > max_context:
            too_long.append(request)
        elif request.input_tokens < min_input:
            too_short.append(request)
        else:
            kept.append(request)
    if too_long:
        skipped[f"input + output beyond {context_name} ({max_context} tokens)"] = len(too_long)
    if too_short:
        skipped[f"input shorter than the chat template alone ({min_input} tokens)"] = len(too_short)
    if not kept:
        raise TraceError(f"--trace {trace.name}: none of the {len(chosen)} request(s) in {_span(start, end)} s fits the "
                         f"target ({'; '.join(f'{n} {why}' for why, n in skipped.items())})")
    origin = kept[0].arrival_s
    scaled = [TraceRequest((r.arrival_s - origin) / speedup, r.input_tokens, r.output_tokens, r.text, r.hash_ids)
              for r in kept]
    return Replay(trace.name, scaled, (start, end if duration is not None else trace.duration_s), speedup,
                  trace.workload, trace.out_of_order, skipped, len(chosen),
                  (round(origin, 3), round(kept[-1].arrival_s, 3)), cut, trace.hash_block_tokens, trace.spread)


# --- a sweep's trace -------------------------------------------------------------------------------

MIN_TRACE_INPUT = 64  # tokens: a chat template and a short question need about this many


def sweep_replay(config, context_limit: int, context_name: str = "the target's context") -> Replay:
    """The replay a sweep's config asks for, read from its trace: built once by the sweep's
    preflight and carried to everything that plans or measures its cells (and into run.json). Rows
    that would not fit `context_limit` (input, output and a step's drafts, grid.draft_headroom
    already taken off; 0: no limit; `context_name` says whose) are skipped, as are inputs below
    MIN_TRACE_INPUT tokens."""
    load = config.load
    return replay(load_trace(load.trace), load.trace_window, load.trace_speedup, load.trace_max_requests,
                  context_limit, MIN_TRACE_INPUT, context_name)


@dataclass
class ReplayRecord:
    """What the plan needs of a replay, as run.json keeps it (`Replay.to_dict`): a run's cells are
    planned again from it without reading the trace."""

    rate: float
    request_count: int
    output_tokens_mean: float

    @classmethod
    def from_dict(cls, record: dict) -> "ReplayRecord":
        return cls(float(record["rate"]), int(record["requests"]), float(record.get("output_tokens_mean") or 0.0))


def check_trace_config(config) -> None:
    """One-line errors for --trace and the options beside it. The trace itself is read by the
    sweep's preflight, which builds the replay once (`grid.build_replay`)."""
    if config.engine.name not in ("vllm", "endpoint"):
        raise TraceError("--trace replays a trace's arrivals on a served engine (--engine vllm or --endpoint); the "
                         "native engine runs static batches")
    if config.load.request_rates:
        raise TraceError("--trace replays the trace's own arrivals: leave out --request-rates")
    if config.gate.until_decided:
        raise TraceError("--until-decided adds repeats to batch-size cells; a trace replay is judged with --slo")
