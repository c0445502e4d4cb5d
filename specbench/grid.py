"""The measured grid: what a sweep is asked to run (SweepConfig) and its cells.

Every (workload, load, temperature) group has one autoregressive cell and, on the same prompts
and seeds, one speculative cell per draft x K. The load is a batch size (on a served engine: the
number of requests kept in flight, a closed loop) or, on a served engine, a request rate (an open
loop: requests arrive at Poisson or gamma times whatever the server does). A run uses one or the
other. A draft with a K schedule (`ngram@schedule:{1-4: 3, 5+: off}`) is one cell per group, run
at the K its schedule gives (on a server: the schedule itself, K chosen per engine step).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, field, fields, is_dataclass, replace
from pathlib import Path
from typing import Iterable, Protocol

from specbench.drafter_kinds import drafter_kind
from specbench.models import (
    DEFAULT_TARGET, default_dtype, dtype_name, lookup_alias, parse_draft_spec, parse_dtype, resolve_model,
)
from specbench.results import nested_config, recorded_config
from specbench.schema import AR, ROUTERS
from specbench.synthetic import parse_alpha, shipped_config

ENGINES = ("native", "vllm", "endpoint")
SERVED_ENGINES = ("vllm", "endpoint")
SCHEDULE_MARK = "@schedule:"
OPEN_ENDED = 1 << 20  # the end of a schedule's last range ("33+")
MIN_CONTEXT_LENGTH = 128


# --- K schedules -------------------------------------------------------------------------------

Schedule = list[tuple[int, int, int]]  # (first batch size, last batch size, K); K = 0 is off


def split_schedule(draft: str) -> tuple[str, Schedule | None]:
    """`ngram@schedule:{1-8: 4, 9-32: 2, 33+: off}` -> ("ngram", [(1, 8, 4), (9, 32, 2), (33, OPEN_ENDED, 0)])."""
    base, mark, text = draft.partition(SCHEDULE_MARK)
    return (draft, None) if not mark else (base, parse_schedule(text, draft))


def parse_schedule(text: str, where: str = "") -> Schedule:
    """A K schedule as `check` prints it, `{1-8: 4, 9-32: 2, 33+: off}` (braces optional; `=` for
    `:`, `;` or `/` for `,`, 0 for off). The ranges must cover every batch size from 1 up."""
    label = f"draft {where!r}: " if where else ""
    body = text.strip()
    if body.startswith("{") and body.endswith("}"):
        body = body[1:-1]
    entries = [e.strip() for e in re.split(r"[,;/]", body) if e.strip()]
    if not entries:
        raise ValueError(f"{label}an empty K schedule (e.g. @schedule:{{1-8: 4, 9+: off}})")
    schedule: Schedule = []
    for entry in entries:
        m = re.fullmatch(r"(\d+)(?:\s*-\s*(\d+)|(\+))?\s*[:=]\s*(off|\d+)", entry)
        if not m:
            raise ValueError(f"{label}cannot read {entry!r} of the K schedule (write FIRST-LAST: K, FIRST+: K or N: K)")
        first = int(m.group(1))
        last = OPEN_ENDED if m.group(3) else int(m.group(2) or first)
        k = 0 if m.group(4) == "off" else int(m.group(4))
        if last < first:
            raise ValueError(f"{label}range {entry!r} ends before it starts")
        schedule.append((first, last, k))
    schedule.sort()
    expected = 1
    for first, last, _ in schedule:
        if first != expected:
            raise ValueError(f"{label}the K schedule must cover every batch size from 1 up without overlaps "
                             f"(expected a range starting at {expected}, got {first})")
        expected = last + 1
    if schedule[-1][1] != OPEN_ENDED:
        first, last, k = schedule[-1]
        schedule[-1] = (first, OPEN_ENDED, k)  # vLLM carries the last K forward too
    if max(k for _, _, k in schedule) < 1:
        raise ValueError(f"{label}the K schedule never drafts (every K is off)")
    return schedule


def schedule_k(schedule: Schedule, batch_size: int) -> int:
    for first, last, k in schedule:
        if first <= batch_size <= last:
            return k
    return schedule[-1][2]


def format_schedule(schedule: Schedule) -> str:
    parts = []
    for first, last, k in schedule:
        span = f"{first}+" if last == OPEN_ENDED else (f"{first}-{last}" if last != first else f"{first}")
        parts.append(f"{span}: {k if k else 'off'}")
    return "{" + ", ".join(parts) + "}"


def vllm_schedule(schedule: Schedule) -> list[list[int]]:
    """vLLM's `num_speculative_tokens_per_batch_size`: inclusive [start, end, K] ranges."""
    return [[first, last, k] for first, last, k in schedule]


def format_rate(rate: float) -> str:
    return "inf" if math.isinf(rate) else f"{rate:g}"


@dataclass
class VllmOptions:
    """How the vLLM engine starts its servers (ignored by the native engine)."""

    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    max_model_len: int | None = None
    gpu_memory_utilization: float | None = None
    enforce_eager: bool = False
    extra_args: str = ""  # anything else, appended to the server's command line (shell-style quoting)
    python: str | None = None  # the Python that runs the server (another environment); default: this one
    startup_timeout_s: float = 900.0
    # how a speculative server's repeats pair with the baseline's: auto, side-by-side (both servers
    # up, repeats alternating) or bracketed (baseline before and after) — specbench.fit.noise
    pairing: str = "auto"
    # vLLM's own backend for a server spread over several nodes ("ray"); default: vLLM's choice
    distributed_executor_backend: str = ""
    # speculative decoding with pipeline parallelism, which vLLM has open bugs in, run anyway
    allow_pp_speculation: bool = False


def default_drafts(engine: str = "native") -> list[str]:
    """The drafts a sweep runs when none are named: prompt lookup and the default target's bf16 copy
    (the realistic two-model draft on a CPU) on the native engine; on vLLM, which runs a draft model
    in the target's dtype, the same model at the target's dtype."""
    return ["ngram", "smollm2-135m@bf16" if engine == "native" else "smollm2-135m"]


@dataclass
class GridOptions:
    """What the cells are (target, drafts, K, temperatures, workloads, prompt lengths) and what
    each measures (requests, output length, repeats, seed, sampling, real or random weights)."""

    target: str = DEFAULT_TARGET
    # None: the engine's own (`default_drafts`; an endpoint's label, none for plain servers alone),
    # chosen once the engine is known (SweepConfig), so an engine="vllm" sweep runs what vLLM can
    drafts: list[str] | None = None
    # None: [2, 4]; an endpoint's [0] (its server speculates as configured, K unknown to specbench)
    ks: list[int] | None = None
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.7])
    workloads: list[str] = field(default_factory=lambda: ["chat", "code"])
    context_lengths: list[int] = field(default_factory=list)  # prompts built to these lengths; [] = as they come
    max_new_tokens: int = 48
    num_prompts: int = 4
    repeats: int = 1
    seed: int = 0
    top_p: float = 1.0
    top_k: int = 0
    weights: str = "real"  # "random": timing-only, architectures from shipped configs
    alphas: list[str] = field(default_factory=list)  # synthetic acceptance profiles (random weights)
    target_layers: int | None = None  # random weights: build only this many target layers, scale

    @property
    def synthetic(self) -> bool:
        return self.weights == "random"


@dataclass
class LoadOptions:
    """How requests arrive: a closed loop at each batch size, an open loop at each request rate,
    or a trace's own arrivals (served engines); a run uses one of the three."""

    batch_sizes: list[int] = field(default_factory=lambda: [1, 4, 16])
    request_rates: list[float] = field(default_factory=list)  # open loop (served engines); replaces batch sizes
    burstiness: float = 1.0  # gamma shape of inter-arrival times: 1 is Poisson, < 1 burstier
    trace: str = ""  # served engines: replay this request trace (a shipped name or a file; specbench.traces)
    trace_window: str = ""  # START:DURATION in the trace's seconds ("" = all of it)
    trace_speedup: float = 1.0  # the trace's time scale: 0.5 replays it at half speed
    trace_max_requests: int = 0  # at most this many of the window's requests (0 = all)


@dataclass
class EndpointOptions:
    """The running servers the endpoint engine measures."""

    urls: str = ""  # a running OpenAI-compatible server to measure; URL1,URL2: several of one model
    baseline_urls: str = ""  # ... and the same model served without speculation
    api_key_env: str = "OPENAI_API_KEY"  # the environment variable an endpoint's API key is read from
    router: str = "least-outstanding"  # several endpoints: which gets each request (schema.ROUTERS)


@dataclass
class EngineOptions:
    """The engine that runs the cells and how it loads the models: the native engine's options,
    the vLLM servers' (`vllm`) and the endpoints' (`endpoint`)."""

    name: str = "native"  # one of ENGINES
    dtype: str | None = None
    device: str = "cpu"
    chat_template: bool = True
    warmup: bool = True
    allow_download: bool = False
    trust_remote_code: bool = False
    cuda_graphs: bool = False  # decode steps at fixed shapes, replayed from CUDA graphs
    vllm: VllmOptions = field(default_factory=VllmOptions)
    endpoint: EndpointOptions = field(default_factory=EndpointOptions)

    @property
    def torch_dtype(self):
        """The target's dtype: --dtype, else the device's default."""
        return parse_dtype(self.dtype) if self.dtype else default_dtype(self.device)

    @property
    def baseline_only(self) -> bool:
        """Plain servers measured alone (--baseline-endpoint without --endpoint): baseline cells only."""
        return self.name == "endpoint" and not self.endpoint.urls and bool(self.endpoint.baseline_urls)


@dataclass
class ExecutorOptions:
    """Where cells run: this process, or "ray" (a cluster; specbench.executors)."""

    name: str = "local"
    ray_address: str = ""  # ray: the cluster (default RAY_ADDRESS, else a local instance)


@dataclass
class GateOptions:
    """What the verdict is judged against: the SLO run.json records for report and check, and
    --until-decided's repeats."""

    slo: str = ""  # e.g. "ttft=1.0,tpot=0.05": recorded for report and check (they can override it)
    until_decided: bool = False  # after the grid, add repeats where check's verdict is inconclusive
    max_repeats: int = 12  # ... up to this many per cell
    min_speedup: float = 1.0  # the bar that verdict is about


@dataclass
class SweepConfig:
    """What a sweep is asked to run, in groups: the cells (`grid`), how requests arrive (`load`),
    the engine (`engine`), where cells run (`executor`) and what the verdict is judged against (`gate`)."""

    grid: GridOptions = field(default_factory=GridOptions)
    load: LoadOptions = field(default_factory=LoadOptions)
    engine: EngineOptions = field(default_factory=EngineOptions)
    executor: ExecutorOptions = field(default_factory=ExecutorOptions)
    gate: GateOptions = field(default_factory=GateOptions)

    def __post_init__(self) -> None:
        # a new GridOptions, not the caller's changed: one grid may serve configs of several engines
        grid, engine = self.grid, self.engine
        if grid.drafts is None:
            drafts = ([] if engine.baseline_only else ["endpoint"] if engine.name == "endpoint"
                      else default_drafts(engine.name))
            self.grid = grid = replace(grid, drafts=drafts)
        if grid.ks is None:
            self.grid = replace(grid, ks=[0] if engine.name == "endpoint" else [2, 4])

    @classmethod
    def from_dict(cls, values: dict) -> SweepConfig:
        """A config as run.json records it, nested or flat (`results.nested_config`); settings it
        does not know are left out, those it lacks take their defaults."""
        return _from_dict(cls, nested_config(values))

    def validate(self) -> None:
        """One-line errors for bad grid values, before anything loads. The engine's, the executor's
        and the SLO's own checks are the sweep's (`sweep.check_config`): the plan knows no engine."""
        grid, load, engine, gate = self.grid, self.load, self.engine, self.gate
        if engine.name not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {engine.name!r}")
        if load.trace:
            from specbench.traces import check_trace_config

            check_trace_config(self)
        loads = ("--request-rates", load.request_rates) if load.request_rates else ("--batch-sizes", load.batch_sizes)
        for name, values in (*([] if engine.baseline_only else [("--drafts", grid.drafts)]), ("--k", grid.ks),
                             *([] if load.trace else [loads]),
                             ("--temperatures", grid.temperatures), ("--workloads", grid.workloads)):
            if not values:
                raise ValueError(f"{name} is empty")
            if len(set(values)) != len(values):
                raise ValueError(f"{name} repeats a value: {values}")
        if any(k < 1 for k in grid.ks) and not (engine.name == "endpoint" and grid.ks == [0]):
            raise ValueError(f"K must be >= 1, got {grid.ks}")
        if any(b < 1 for b in load.batch_sizes):
            raise ValueError(f"batch sizes must be >= 1, got {load.batch_sizes}")
        if load.request_rates:
            if engine.name not in SERVED_ENGINES:
                raise ValueError("--request-rates needs a served engine (--engine vllm or --endpoint): "
                                 "the native engine runs static batches")
            if any(not rate > 0 for rate in load.request_rates):
                raise ValueError(f"request rates must be > 0 (inf: every request at once), got {load.request_rates}")
            if len(set(load.request_rates)) != len(load.request_rates):
                raise ValueError(f"--request-rates repeats a value: {load.request_rates}")
        if len(set(grid.context_lengths)) != len(grid.context_lengths):
            raise ValueError(f"--context-lengths repeats a value: {grid.context_lengths}")
        if any(c < MIN_CONTEXT_LENGTH for c in grid.context_lengths):
            raise ValueError(f"context lengths must be >= {MIN_CONTEXT_LENGTH} tokens (room for the workload's "
                             f"question), got {grid.context_lengths}")
        if engine.endpoint.router not in ROUTERS:
            raise ValueError(f"--router must be one of {', '.join(ROUTERS)}, got {engine.endpoint.router!r}")
        if not load.burstiness > 0:
            raise ValueError(f"--burstiness must be > 0, got {load.burstiness}")
        if any(t < 0 or not math.isfinite(t) for t in grid.temperatures):
            raise ValueError(f"temperatures must be finite and >= 0, got {grid.temperatures}")
        for name, value in (("--max-new-tokens", grid.max_new_tokens), ("--num-prompts", grid.num_prompts),
                            ("--repeats", grid.repeats)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        if not (math.isfinite(gate.min_speedup) and gate.min_speedup > 0):
            raise ValueError(f"--min-speedup must be a positive number, got {gate.min_speedup:g}")
        if gate.until_decided:
            if load.request_rates:
                raise ValueError("--until-decided adds repeats to speed-up cells; a request-rate run's SLO verdict "
                                 "narrows with more requests per load (--num-prompts)")
            if engine.name == "endpoint" and not engine.endpoint.baseline_urls:
                raise ValueError("--until-decided needs speed-ups: an endpoint run needs --baseline-endpoint")
            if gate.max_repeats < max(2, grid.repeats):
                raise ValueError(f"--max-repeats must be at least 2 and --repeats ({grid.repeats}), got "
                                 f"{gate.max_repeats}")
        check_sampling(1.0, grid.top_p, grid.top_k)
        if engine.dtype:
            dtype_name(engine.dtype)
        for draft in grid.drafts:
            base, schedule = split_schedule(draft)
            if schedule is not None and engine.name not in SERVED_ENGINES:
                raise ValueError(f"draft {draft!r}: a K schedule runs on a served engine (--engine vllm)")
            if engine.name != "endpoint":  # an endpoint's draft is a label
                parse_draft_spec(base, allow_served=engine.name != "native")
        if grid.weights not in ("real", "random"):
            raise ValueError(f"--weights must be real or random, got {grid.weights!r}")
        if grid.synthetic and not grid.alphas:
            raise ValueError("--weights random needs --alpha (acceptance rates to simulate, e.g. 0.6,0.8)")
        if grid.alphas and not grid.synthetic:
            raise ValueError("--alpha simulates acceptance and needs --weights random")
        if len(set(grid.alphas)) != len(grid.alphas):
            raise ValueError(f"--alpha repeats a value: {grid.alphas}")
        for alpha in grid.alphas:
            parse_alpha(alpha)
        if grid.target_layers is not None and (grid.target_layers < 1 or not grid.synthetic):
            raise ValueError("--target-layers must be >= 1 and needs --weights random")


def _from_dict(cls, values: dict):
    """`cls` of `values`: the fields it knows, its dataclass fields (the groups) built the same way."""
    known = {}
    for item in fields(cls):
        if item.name in values:
            value, group = values[item.name], item.default_factory
            known[item.name] = _from_dict(group, value) if is_dataclass(group) and isinstance(value, dict) else value
    return cls(**known)


def setting(config: SweepConfig, path: str):
    """A setting by its place in the groups: `setting(config, "load.batch_sizes")`."""
    value = config
    for name in path.split("."):
        value = getattr(value, name)
    return value


def with_setting(config, path: str, value):
    """A copy of `config` (a SweepConfig, or one of its groups) with the setting at `path` set to `value`."""
    head, _, rest = path.partition(".")
    return replace(config, **{head: with_setting(getattr(config, head), rest, value) if rest else value})


def check_sampling(temperature: float, top_p: float, top_k: int) -> None:
    """Sampling settings any engine can run (native.sampling.SamplingParams checks the same)."""
    if temperature < 0:
        raise ValueError(f"temperature must be >= 0, got {temperature}")
    if not 0 < top_p <= 1:
        raise ValueError(f"top_p must be in (0, 1], got {top_p}")
    if top_k < 0:
        raise ValueError(f"top_k must be >= 0, got {top_k}")


def draft_headroom(k: int) -> int:
    """Positions past a row's prompt and output that a speculative step may write: K drafted
    tokens, the verify's K + 1, and spare. Every check of what fits a context uses it (the sweep's
    context limit, a trace's rows); the native engine sizes its KV cache with it."""
    return 2 * k + 8


def positions_needed(config: SweepConfig, prompt_tokens: int) -> int:
    """The positions a row of `prompt_tokens` needs at the sweep's output length and largest K."""
    return prompt_tokens + config.grid.max_new_tokens + draft_headroom(max(config.grid.ks, default=0))


@dataclass(frozen=True)
class ContextLimit:
    """The longest request (prompt, output and a step's drafts) a sweep's servers take, and whose
    limit it is, as the errors and a trace's skipped rows say it."""

    tokens: int  # 0: not known
    whose: str = ""  # "llama3-8b has a 8192-token context"
    name: str = "the target's context"  # what a skipped trace row went beyond


ENDPOINTS_CONTEXT = "the endpoints' context"


def context_limit(config: SweepConfig, shape: dict | None = None, served_limit: int = 0) -> ContextLimit:
    """The smallest known of the target's own context (its max_position_embeddings, or vLLM's
    --max-model-len in its place where given: what its servers run at) and the context the user's
    endpoints say they serve (`served_limit`, their /v1/models max_model_len; 0: not asked)."""
    own = int(config.engine.vllm.max_model_len or 0)
    target = int((shape or {}).get("max_position_embeddings") or 0)
    known = [limit for limit in (
        ContextLimit(own, f"the vLLM servers run at --max-model-len {own}") if own else
        ContextLimit(target, f"{config.grid.target} has a {target}-token context"),
        ContextLimit(served_limit, f"the endpoints serve a {served_limit}-token context (/v1/models max_model_len)",
                     ENDPOINTS_CONTEXT)) if limit.tokens > 0]
    return min(known, key=lambda limit: limit.tokens) if known else ContextLimit(0)


def check_context_limit(config: SweepConfig, shape: dict | None = None, served_limit: int = 0) -> None:
    """A one-line error, before anything loads, when the longest prompt asked for plus the new
    tokens (and a step's drafts) would not fit the context the sweep's servers take
    (`context_limit`)."""
    limit = context_limit(config, shape, served_limit)
    longest = max(config.grid.context_lengths, default=0)
    needed = positions_needed(config, longest)
    if limit.tokens and needed > limit.tokens:
        asked = f"--context-lengths {longest} + " if longest else ""
        raise ValueError(f"{asked}--max-new-tokens {config.grid.max_new_tokens} needs {needed} positions; "
                         f"{limit.whose}")



def target_shape(config: SweepConfig) -> dict | None:
    """The target's config (layers, context length) without loading it: shipped for registry
    models, else a local model's config.json; None when neither is at hand."""
    try:
        return shipped_config(config.grid.target)[1]
    except Exception:
        pass
    if config.grid.synthetic or config.engine.name == "endpoint":
        return None
    try:
        import json

        target = resolve_model(config.grid.target, allow_download=False)
        path = Path(target.path) / "config.json"
        return json.loads(path.read_text()) if path.exists() else None
    except Exception:
        return None  # resolving it again later says why, in one line


# --- a draft as vLLM's --speculative-config (what the sweep serves and the gate recommends) ---


def synthetic_rates(profile: tuple[float, ...], k: int) -> list[float]:
    """vLLM's synthetic_acceptance_rates (position i: probability that the first i+1 drafts are
    all accepted) from specbench's per-position profile (position i accepted given the ones
    before were; the last value repeats)."""
    rates, reach = [], 1.0
    for position in range(k):
        reach *= profile[min(position, len(profile) - 1)]
        rates.append(reach)
    return rates


def speculative_config(spec, k: int, draft_model: str | None = None, alpha: str = "") -> dict:
    """The `--speculative-config` of a draft (a models.DraftSpec) at K, as its kind writes it."""
    config = drafter_kind(spec.kind).vllm_config(spec, k, draft_model)
    if alpha:
        config["rejection_sample_method"] = "synthetic"
        config["synthetic_acceptance_rates"] = synthetic_rates(parse_alpha(alpha), int(config["num_speculative_tokens"]))
    return config


def base_speculative_configs(meta: dict, drafts) -> dict[str, dict]:
    """Each draft's `--speculative-config` as a run used it: read from the command of a server
    the vLLM engine started for it, else (a native run) built from the draft's name, with a
    registry alias as its hub id. Drafts vLLM cannot run (self:N) and endpoints are left out;
    `drafts` may hold the autoregressive label (a cells table's draft column) and repeats."""
    import json

    drafts = sorted(set(drafts) - {AR})
    found: dict[str, dict] = {}
    for server in (meta.get("engine") or {}).get("servers") or []:
        command = server.get("command") or []
        if "--speculative-config" not in command:
            continue
        config = json.loads(command[command.index("--speculative-config") + 1])
        label = server.get("label", "")
        for draft in drafts:
            if draft not in found and (label == draft or label.startswith(f"{draft} K=")):
                found[draft] = {key: value for key, value in config.items()
                                if key not in ("num_speculative_tokens_per_batch_size", "rejection_sample_method",
                                               "synthetic_acceptance_rates")}
    if (meta.get("engine") or {}).get("name", "native") != "native":
        return found
    for draft in drafts:
        base, _ = split_schedule(draft)
        try:
            spec = parse_draft_spec(base, allow_served=True)
        except ValueError:
            continue
        kind = drafter_kind(spec.kind)
        if not kind.runs_on_vllm or draft in found:
            continue
        model = None
        if kind.separate_model:
            target = lookup_alias(str(recorded_config(meta)["grid"].get("target", "")))
            entry = lookup_alias(spec.model, target.family if target else None)
            model = entry.hub_id if entry else spec.model
        found[draft] = speculative_config(spec, 1, model)
    return found


@dataclass(frozen=True)
class Cell:
    workload: str
    batch_size: int  # closed loop: requests in flight (0 in an open-loop cell)
    temperature: float
    draft: str = AR
    k: int = 0  # a scheduled draft: the K its schedule gives at this batch size (its largest K open-loop)
    alpha: str = ""  # synthetic acceptance profile ("" = real acceptance)
    request_rate: float = 0.0  # open loop: requests per second (inf: all at once); 0 = closed loop
    context_length: int = 0  # prompts built to this many tokens; 0 = the workload's prompts as they are

    @property
    def load(self) -> str:
        return f"R{format_rate(self.request_rate)}" if self.request_rate else f"B{self.batch_size}"

    @property
    def traffic(self) -> str:
        """The workload, at its context length when one is set."""
        return f"{self.workload}|C{self.context_length}" if self.context_length else self.workload

    @property
    def group(self) -> str:
        """The (workload, context length, load, temperature) group: shared prompts and baseline."""
        return f"{self.traffic}|{self.load}|T{self.temperature:g}"

    @property
    def baseline_id(self) -> str:
        """The group's autoregressive cell: what this cell's speed-up and lossless check compare to."""
        return f"{self.group}|{AR}"

    @property
    def id(self) -> str:
        if self.draft == AR:
            return self.baseline_id
        return f"{self.group}|{self.draft}|K{self.k}" + (f"|a{self.alpha}" if self.alpha else "")

    @property
    def is_speculative(self) -> bool:
        return self.draft != AR


class ReplayShape(Protocol):
    """What planning a trace sweep needs of its replay (traces.Replay, or the ReplayRecord run.json
    keeps): the mean rate the cells are labelled with, the requests, their mean output length."""
    rate: float
    request_count: int
    output_tokens_mean: float


def _needs(replay: ReplayShape | None, config: SweepConfig) -> ReplayShape:
    if replay is None:
        raise ValueError(f"--trace {config.load.trace}: a trace sweep is planned with its replay (grid.build_replay)")
    return replay


def smallest_known(limits: Iterable[int]) -> int:
    """The smallest of the context limits that are known (> 0); 0 where none is."""
    return min((limit for limit in limits if limit > 0), default=0)


def build_replay(config: SweepConfig, served_limit: int = 0):
    """The trace's replay for this sweep, read once (a bad trace file fails here, in one line): rows
    that would not fit the target's context with a step's drafts are left out (`served_limit`: the
    context the user's endpoints say they serve, when smaller). None without --trace."""
    if not config.load.trace:
        return None
    from specbench.traces import sweep_replay

    limit = context_limit(config, target_shape(config), served_limit)
    room = max(0, limit.tokens - draft_headroom(max(config.grid.ks, default=0))) if limit.tokens else 0
    return sweep_replay(config, room, limit.name)


def plan_cells(config: SweepConfig, replay: ReplayShape | None = None) -> list[Cell]:
    """Run order: workload, context length, temperature, load ascending (so an out-of-memory skips the larger
    batches), baseline first, then draft x K. (A served engine regroups them by server.) An
    endpoint run without --baseline-endpoint has no baseline cells."""
    loads = [(0, rate) for rate in sorted(config.load.request_rates)] if config.load.request_rates \
        else [(b, 0.0) for b in sorted(config.load.batch_sizes)]
    if config.load.trace:  # one load: the trace replayed, labelled with its mean rate
        loads = [(0, round(_needs(replay, config).rate, 4))]
    with_baseline = config.engine.name != "endpoint" or bool(config.engine.endpoint.baseline_urls)
    cells = []
    for workload in config.grid.workloads:
        for context in config.grid.context_lengths or [0]:
            for temperature in config.grid.temperatures:
                for batch_size, rate in loads:
                    if with_baseline:
                        cells.append(Cell(workload, batch_size, temperature, request_rate=rate, context_length=context))
                    for draft in config.grid.drafts:
                        _, schedule = split_schedule(draft)
                        if schedule is not None:
                            k = schedule_k(schedule, batch_size) if batch_size else max(k for _, _, k in schedule)
                            cells.append(Cell(workload, batch_size, temperature, draft, k, request_rate=rate,
                                              context_length=context))
                            continue
                        for k in config.grid.ks:
                            for alpha in config.grid.alphas or [""]:
                                cells.append(Cell(workload, batch_size, temperature, draft, k, alpha, rate, context))
    return cells


def requests_per_cell(config: SweepConfig, batch_size: int, replay: ReplayShape | None = None) -> int:
    """At least --num-prompts, rounded up to whole batches (exactly --num-prompts open-loop)."""
    if config.load.trace:
        return _needs(replay, config).request_count
    if batch_size == 0:
        return config.grid.num_prompts
    return math.ceil(max(config.grid.num_prompts, batch_size) / batch_size) * batch_size


def describe_plan(config: SweepConfig, replay: ReplayShape | None = None) -> dict:
    cells = plan_cells(config, replay)
    requests = sum(requests_per_cell(config, c.batch_size, replay) for c in cells) * config.grid.repeats
    per_request = config.grid.max_new_tokens
    if config.load.trace:
        per_request = _needs(replay, config).output_tokens_mean
    return {"cells": len(cells), "baseline_cells": sum(not c.is_speculative for c in cells),
            "speculative_cells": sum(c.is_speculative for c in cells), "requests": requests,
            "output_tokens": round(requests * per_request)}
