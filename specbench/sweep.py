"""The measured grid: every (workload, batch size, temperature) has one autoregressive cell and,
on the same prompts and seeds, one speculative cell per draft x K.

`run_sweep` is the notebook entry point; the CLI only renders its events.
"""

from __future__ import annotations

import gc
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import torch

from specbench.drafters import Drafter, ModelDrafter, NGramDrafter, SelfDrafter
from specbench.engine import GenerationConfig, GenerationResult, generate_autoregressive, generate_speculative
from specbench.forward import CausalLM
from specbench.measure import (
    PeakMemory, acceptance_summary, copy_bandwidth, decode_step_bytes, percentiles, phase_times, request_rows, step_rows,
)
from specbench.models import (
    DEFAULT_TARGET, DraftSpec, LoadedModel, check_tokenizers_compatible, default_dtype, family_of, load_model,
    lookup_alias, parse_draft_spec, parse_dtype, resolve_model,
)
from specbench.results import (
    append_part, hardware_info, merge_parts, new_run_dir, now_iso, read_table, versions, write_json, write_table,
)
from specbench.placement import free_bytes, memory_budget, parse_devices, placement_devices
from specbench.sampling import SamplingParams
from specbench.synthetic import (
    LayerScaler, build_random_model, config_parameters, expected_acceptance, layers_that_fit,
    parse_alpha, rescale_result, shipped_config, synthetic_acceptance,
)
from specbench.workloads import Workload, encode_prompt, load_workload

AR = "autoregressive"


@dataclass
class SweepConfig:
    target: str = DEFAULT_TARGET
    drafts: list[str] = field(default_factory=lambda: ["ngram", "smollm2-135m@bf16"])
    ks: list[int] = field(default_factory=lambda: [2, 4])
    batch_sizes: list[int] = field(default_factory=lambda: [1, 4])
    temperatures: list[float] = field(default_factory=lambda: [0.0, 0.7])
    workloads: list[str] = field(default_factory=lambda: ["chat", "code"])
    max_new_tokens: int = 48
    num_prompts: int = 4
    repeats: int = 1
    seed: int = 0
    dtype: str | None = None
    device: str = "cpu"
    top_p: float = 1.0
    top_k: int = 0
    chat_template: bool = True
    warmup: bool = True
    allow_download: bool = False
    trust_remote_code: bool = False
    weights: str = "real"  # "random": timing-only, architectures from shipped configs
    alphas: list[str] = field(default_factory=list)  # synthetic acceptance profiles (random weights)
    target_layers: int | None = None  # random weights: build only this many target layers, scale
    cuda_graphs: bool = False  # decode steps at fixed shapes, replayed from CUDA graphs

    @property
    def torch_dtype(self) -> torch.dtype:
        """The target's dtype: --dtype, else the device's default."""
        return parse_dtype(self.dtype) if self.dtype else default_dtype(self.device)

    @property
    def synthetic(self) -> bool:
        return self.weights == "random"

    def validate(self) -> None:
        """One-line errors for bad input, before anything loads."""
        for name, values in (("--drafts", self.drafts), ("--k", self.ks), ("--batch-sizes", self.batch_sizes),
                             ("--temperatures", self.temperatures), ("--workloads", self.workloads)):
            if not values:
                raise ValueError(f"{name} is empty")
            if len(set(values)) != len(values):
                raise ValueError(f"{name} repeats a value: {values}")
        if any(k < 1 for k in self.ks):
            raise ValueError(f"K must be >= 1, got {self.ks}")
        if any(b < 1 for b in self.batch_sizes):
            raise ValueError(f"batch sizes must be >= 1, got {self.batch_sizes}")
        if any(t < 0 or not math.isfinite(t) for t in self.temperatures):
            raise ValueError(f"temperatures must be finite and >= 0, got {self.temperatures}")
        for name, value in (("--max-new-tokens", self.max_new_tokens), ("--num-prompts", self.num_prompts),
                            ("--repeats", self.repeats)):
            if value < 1:
                raise ValueError(f"{name} must be >= 1, got {value}")
        SamplingParams(temperature=1.0, top_p=self.top_p, top_k=self.top_k)
        if self.dtype:
            parse_dtype(self.dtype)
        devices = parse_devices(self.device)
        if devices[0].startswith("cuda") and not torch.cuda.is_available():
            raise ValueError(f"--device {self.device}: CUDA is not available on this machine")
        for name in devices:
            if ":" in name and int(name.split(":")[1]) >= torch.cuda.device_count():
                raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA devices")
        if self.cuda_graphs and (not devices[0].startswith("cuda") or len(devices) > 1):
            raise ValueError(f"--cuda-graphs needs the models on one CUDA device, got --device {self.device}")
        for draft in self.drafts:
            parse_draft_spec(draft)
        if self.weights not in ("real", "random"):
            raise ValueError(f"--weights must be real or random, got {self.weights!r}")
        if self.synthetic and not self.alphas:
            raise ValueError("--weights random needs --alpha (acceptance rates to simulate, e.g. 0.6,0.8)")
        if self.alphas and not self.synthetic:
            raise ValueError("--alpha simulates acceptance and needs --weights random")
        if len(set(self.alphas)) != len(self.alphas):
            raise ValueError(f"--alpha repeats a value: {self.alphas}")
        for alpha in self.alphas:
            parse_alpha(alpha)
        if self.target_layers is not None and (self.target_layers < 1 or not self.synthetic):
            raise ValueError("--target-layers must be >= 1 and needs --weights random")


@dataclass(frozen=True)
class Cell:
    workload: str
    batch_size: int
    temperature: float
    draft: str = AR
    k: int = 0
    alpha: str = ""  # synthetic acceptance profile ("" = real acceptance)

    @property
    def group(self) -> str:
        """The (workload, batch, temperature) group: shared prompts and baseline."""
        return f"{self.workload}|B{self.batch_size}|T{self.temperature:g}"

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


def plan_cells(config: SweepConfig) -> list[Cell]:
    """Run order: workload, temperature, batch size ascending (so an out-of-memory skips the
    larger ones), baseline first, then draft x K."""
    cells = []
    for workload in config.workloads:
        for temperature in config.temperatures:
            for batch_size in sorted(config.batch_sizes):
                cells.append(Cell(workload, batch_size, temperature))
                for draft in config.drafts:
                    for k in config.ks:
                        for alpha in config.alphas or [""]:
                            cells.append(Cell(workload, batch_size, temperature, draft, k, alpha))
    return cells


def requests_per_cell(config: SweepConfig, batch_size: int) -> int:
    """At least --num-prompts, rounded up to whole batches."""
    return math.ceil(max(config.num_prompts, batch_size) / batch_size) * batch_size


def describe_plan(config: SweepConfig) -> dict:
    cells = plan_cells(config)
    requests = sum(requests_per_cell(config, c.batch_size) for c in cells) * config.repeats
    return {"cells": len(cells), "baseline_cells": sum(not c.is_speculative for c in cells),
            "speculative_cells": sum(c.is_speculative for c in cells), "requests": requests,
            "output_tokens": requests * config.max_new_tokens}


# --- loading -----------------------------------------------------------------------------------

@dataclass
class Models:
    target: LoadedModel
    drafts: dict[str, DraftSpec]
    draft_models: dict[str, LoadedModel]  # by draft label, for kind "model"
    synthetic: bool = False
    target_scaler: LayerScaler | None = None  # set when only a layer subset of the target was built
    draft_scalers: dict[str, LayerScaler] = field(default_factory=dict)
    copy_bandwidth: float = float("nan")  # bytes/s on the target's device, for the roofline

    def drafter(self, label: str) -> Drafter:
        spec = self.drafts[label]
        if spec.kind == "ngram":
            return NGramDrafter(max_ngram=spec.ngram)
        if spec.kind == "self":
            return SelfDrafter(self.target.model, spec.layers)
        return ModelDrafter(self.draft_models[label].model, name=label)


def preflight(config: SweepConfig) -> dict[str, Workload]:
    """Everything checkable without loading weights: grid values, model references, workloads.
    Returns the loaded workloads."""
    config.validate()
    workloads = {name: load_workload(name) for name in config.workloads}
    if config.synthetic:
        target_alias, _ = shipped_config(config.target)
        family = lookup_alias(target_alias).family
        for draft in config.drafts:
            spec = parse_draft_spec(draft)
            if spec.kind == "model":
                shipped_config(spec.model, family)
        return workloads
    target = resolve_model(config.target, allow_download=config.allow_download)
    family = target.spec.family if target.spec else None
    for draft in config.drafts:
        spec = parse_draft_spec(draft)
        if spec.kind == "model":
            resolve_model(spec.model, family=family, allow_download=config.allow_download)
    return workloads


def _context_estimate(config: SweepConfig) -> int:
    return 96 + config.max_new_tokens // 2


def measured_bandwidth(device: torch.device) -> float:
    """Copy bandwidth of the target's device, over buffers that leave room for the run; NaN when
    even that does not fit."""
    budget = free_bytes(str(device)) * 0.1 if device.type == "cuda" else 256 << 20
    try:
        return copy_bandwidth(device, int(min(budget, 2 << 30)) // 4 * 4)
    except (RuntimeError, MemoryError):
        return float("nan")


def load_random_models(config: SweepConfig) -> Models:
    """Targets and drafts from the shipped configs with random weights; when the target does not
    fit, only its first layers (timings scaled to full depth by a LayerScaler)."""
    import time

    from specbench.models import ResolvedModel, load_tokenizer

    started = time.perf_counter()
    dtype = config.torch_dtype
    target_alias, target_config = shipped_config(config.target)
    family = lookup_alias(target_alias).family
    bytes_per = torch.finfo(dtype).bits // 8
    drafts, draft_sizes = {}, {}
    for label in config.drafts:
        spec = parse_draft_spec(label)
        drafts[label] = spec
        if spec.kind == "model":
            draft_dtype = parse_dtype(spec.dtype) if spec.dtype else dtype
            alias, draft_config = shipped_config(spec.model, family)
            draft_sizes[label] = (alias, draft_config, draft_dtype,
                                  config_parameters(draft_config) * (torch.finfo(draft_dtype).bits // 8))
    draft_budget = sum(size for *_, size in draft_sizes.values())
    needed = config_parameters(target_config) * bytes_per + draft_budget
    target_devices = placement_devices(config.device, needed)
    budget = sum(memory_budget(device) for device in target_devices)
    layers = config.target_layers
    if layers is None and needed > budget:
        layers = layers_that_fit(target_config, dtype, max(budget - min(draft_budget, budget * 0.4), 0))
    target = build_random_model(target_alias, dtype, target_devices, num_layers=layers, seed=config.seed)
    try:
        tokenizer = load_tokenizer(DEFAULT_TARGET)  # a proxy for prompt lengths; the ids are timing-only
    except Exception:
        tokenizer = None
    context = _context_estimate(config)
    target_scaler = LayerScaler(target.model, target.full_layers, context) if target.is_subset else None
    draft_models, draft_scalers = {}, {}
    # Drafts share the first device with (a part of) the target.
    left = budget - target.model.parameter_bytes() if len(target_devices) == 1 else memory_budget(target_devices[0])
    share = left / max(1, len(draft_sizes))
    for seed, (label, (alias, draft_config, draft_dtype, size)) in enumerate(draft_sizes.items(), start=1):
        draft_layers = None if size <= share else layers_that_fit(draft_config, draft_dtype, share)
        built = build_random_model(alias, draft_dtype, target_devices[0], num_layers=draft_layers,
                                   seed=config.seed + seed)
        if built.is_subset:
            draft_scalers[label] = LayerScaler(built.model, built.full_layers, context)
        draft_models[label] = LoadedModel(built.model, tokenizer, ResolvedModel(label, lookup_alias(alias), "", None,
                                                                                 "random weights"), 0.0)
    loaded = LoadedModel(target.model, tokenizer,
                         ResolvedModel(config.target, lookup_alias(target_alias), "", None, "random weights"),
                         time.perf_counter() - started)
    return Models(loaded, drafts, draft_models, synthetic=True, target_scaler=target_scaler,
                  draft_scalers=draft_scalers)


def load_models(config: SweepConfig) -> Models:
    if config.synthetic:
        return load_random_models(config)
    dtype = config.torch_dtype
    target = load_model(config.target, config.device, dtype, allow_download=config.allow_download,
                        trust_remote_code=config.trust_remote_code)
    family = family_of(target)
    drafts, models = {}, {}
    for label in config.drafts:
        spec = parse_draft_spec(label)
        drafts[label] = spec
        if spec.kind != "model":
            continue
        draft_dtype = parse_dtype(spec.dtype) if spec.dtype else dtype
        loaded = load_model(spec.model, str(target.model.devices()[0]), draft_dtype, family=family,
                            allow_download=config.allow_download, trust_remote_code=config.trust_remote_code)
        check_tokenizers_compatible(target, loaded)
        models[label] = loaded
    return Models(target, drafts, models)


# --- one cell ----------------------------------------------------------------------------------

def _tie_tolerance(dtype: torch.dtype) -> float:
    return {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 5e-3}.get(dtype, 3e-2)


def first_divergence(target: CausalLM, prompt: list[int], expected: list[int], got: list[int]) -> tuple[int, float]:
    """Position of the first differing token, and the target's logit gap between the two
    candidates there (relative to the largest logit): a gap near 0 is a numerical near-tie,
    where batched and unbatched arithmetic may legitimately pick different argmaxes."""
    position = next(i for i, (a, b) in enumerate(zip(expected, got)) if a != b)
    context = prompt + expected[:position]
    with torch.inference_mode():
        cache = target.new_cache(1, len(context) + 1)
        logits = target.forward(cache, torch.tensor([context], device=target.device), logits_at="last")[0].float()
    gap = (logits[expected[position]] - logits[got[position]]).abs().item()
    return position, gap / max(1.0, logits.abs().max().item())


def lossless_check(target: CausalLM, prompts: list[list[int]], expected: list[list[int]],
                   got: list[list[int]]) -> tuple[str, str]:
    """("exact" | "near-tie" | "MISMATCH", detail) for a greedy speculative cell."""
    tolerance = _tie_tolerance(target.dtype)
    ties, mismatches = [], []
    for index, (prompt, e, g) in enumerate(zip(prompts, expected, got)):
        if e == g:
            continue
        if len(e) != len(g) and e[: len(g)] == g[: len(e)]:
            mismatches.append(f"request {index}: {len(g)} tokens instead of {len(e)}")
            continue
        position, gap = first_divergence(target, prompt, e, g)
        (ties if gap <= tolerance else mismatches).append(f"request {index} token {position} (gap {gap:.2e})")
    if mismatches:
        return "MISMATCH", "; ".join(mismatches[:3])
    if ties:
        return "near-tie", f"{len(ties)}/{len(prompts)} requests diverge at a near-tie: " + "; ".join(ties[:3])
    return "exact", ""


@dataclass
class CellOutcome:
    row: dict
    requests: list[dict]
    steps: list[dict]
    outputs: list[list[int]]  # generated tokens of repeat 0, request order


def _generate(models: Models, cell: Cell, drafter: Drafter | None, prompts, config: GenerationConfig) -> GenerationResult:
    if drafter is None:
        result = generate_autoregressive(models.target.model, prompts, config)
    elif cell.alpha:
        result = generate_speculative(models.target.model, drafter, prompts, config, cell.k,
                                      accept=synthetic_acceptance(parse_alpha(cell.alpha)))
    else:
        result = generate_speculative(models.target.model, drafter, prompts, config, cell.k)
    draft_scaler = models.draft_scalers.get(cell.draft)
    if models.target_scaler is not None or draft_scaler is not None:
        unit = lambda batch, tokens: 1.0  # noqa: E731
        result = rescale_result(result, models.target_scaler.factor if models.target_scaler else unit,
                                draft_scaler.factor if draft_scaler else None)
    return result


class CellRun:
    """One cell's measurement in steps (warm up, measure a repeat, finish), so that the cells of
    a group can take turns repeat by repeat: slow drift of the machine then hits the baseline and
    the speculative cells alike instead of whichever cell ran during a slow minute."""

    def __init__(self, models: Models, cell: Cell, prompts: list[list[int]], prompt_ids: list[str],
                 config: SweepConfig) -> None:
        self.models, self.cell, self.prompts, self.prompt_ids, self.config = models, cell, prompts, prompt_ids, config
        self.drafter = models.drafter(cell.draft) if cell.is_speculative else None
        self.sampling = SamplingParams(cell.temperature, config.top_p if cell.temperature else 1.0,
                                       config.top_k if cell.temperature else 0)
        self.batches = [list(range(i, i + cell.batch_size)) for i in range(0, len(prompts), cell.batch_size)]
        self.results: list[GenerationResult] = []
        self.request_table: list[dict] = []
        self.step_table: list[dict] = []
        self.throughput_per_repeat: list[float] = []
        self.outputs: list[list[int]] = [[] for _ in prompts]
        self.peak_bytes = self.peak_torch_bytes = 0
        self.memory_kind = ""
        self.timed_graph_captures = 0

    def _graph_captures(self) -> int:
        models = [self.models.target.model] + ([self.drafter.model] if isinstance(self.drafter, ModelDrafter) else [])
        return sum(m.static_steps.captures for m in models if m.static_steps is not None)

    def warm_up(self) -> None:
        """Excluded from every figure. With CUDA graphs it runs at full length, so that the
        graphs the measured runs replay are captured here."""
        if self.config.warmup:
            length = self.config.max_new_tokens if self.config.cuda_graphs else min(8, self.config.max_new_tokens)
            warm = GenerationConfig(max_new_tokens=length, sampling=self.sampling, seed=self.config.seed)
            _generate(self.models, self.cell, self.drafter, [self.prompts[i] for i in self.batches[0]], warm)

    def measure(self, repeat: int) -> None:
        cell, config = self.cell, self.config
        tokens = seconds = 0.0
        captures_before = self._graph_captures()
        with PeakMemory(self.models.target.model.devices()) as memory:
            for batch_index, rows in enumerate(self.batches):
                generation = GenerationConfig(max_new_tokens=config.max_new_tokens, sampling=self.sampling,
                                              seed=config.seed + 1000 * repeat + batch_index)
                result = _generate(self.models, cell, self.drafter, [self.prompts[i] for i in rows], generation)
                self.results.append(result)
                ids = [self.prompt_ids[i] for i in rows]
                for record in request_rows(result, ids, offset_s=seconds):
                    self.request_table.append({"cell_id": cell.id, "repeat": repeat, "batch_index": batch_index, **record})
                for record in step_rows(result, ids):
                    self.step_table.append({"cell_id": cell.id, "repeat": repeat, "batch_index": batch_index, **record})
                if repeat == 0:
                    for i, out in zip(rows, result.tokens):
                        self.outputs[i] = out
                tokens += result.num_generated
                seconds += result.total_s
        self.throughput_per_repeat.append(tokens / seconds)
        self.timed_graph_captures += self._graph_captures() - captures_before
        self.peak_bytes = max(self.peak_bytes, memory.peak_bytes)
        self.peak_torch_bytes = max(self.peak_torch_bytes, memory.peak_torch_bytes)
        self.memory_kind = memory.kind

    def finish(self) -> CellOutcome:
        models, cell, config, drafter = self.models, self.cell, self.config, self.drafter
        prompts, results, request_table = self.prompts, self.results, self.request_table
        throughput_per_repeat, device = self.throughput_per_repeat, self.models.target.model.device
        frame = pd.DataFrame(request_table)
        itl = [gap for gaps in frame["itl_s"] for gap in gaps]
        phases = phase_times(results)
        interrupted = len(throughput_per_repeat) < config.repeats  # Ctrl-C during the group's repeats
        row = {
            "cell_id": cell.id, "status": "ok",
            "message": f"interrupted: {len(throughput_per_repeat)} of {config.repeats} repeats" if interrupted else "",
            "mode": "speculative" if drafter else AR,
            "workload": cell.workload, "draft": cell.draft, "k": cell.k, "batch_size": cell.batch_size,
            "temperature": cell.temperature, "requests": len(prompts), "repeats": len(throughput_per_repeat),
            "prompt_tokens_mean": float(np.mean([len(p) for p in prompts])),
            "max_new_tokens": config.max_new_tokens, "output_tokens": int(frame["output_tokens"].sum()),
            "tokens_per_s": float(np.median(throughput_per_repeat)),
            "tokens_per_s_runs": [float(x) for x in throughput_per_repeat],
            "wall_s": float(sum(r.total_s for r in results)),
            **percentiles(frame["ttft_s"], "ttft"), **percentiles(itl, "itl"),
            **percentiles(frame["tpot_s"].dropna(), "tpot"), **percentiles(frame["e2e_s"], "e2e"),
            **phases,
            # Measured peak (process RSS on CPU; device memory on CUDA) covers every model loaded
            # for the sweep; the analytic parts below separate the target from the draft.
            "peak_memory_bytes": self.peak_bytes, "peak_torch_bytes": self.peak_torch_bytes,
            "memory_kind": self.memory_kind,
            "target_param_bytes": models.target.model.parameter_bytes(),
            "target_kv_cache_bytes": max(r.kv_cache_bytes for r in results),
            "draft_param_bytes": 0, "draft_kv_cache_bytes": 0, "draft_memory_bytes": 0,
            "device": str(device), "dtype": str(models.target.model.dtype).replace("torch.", ""),
            # Another busy process on the machine inflates every timing: recorded so it shows.
            "load_average": os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan"),
            "synthetic": models.synthetic, "synthetic_alpha": cell.alpha,
            # CUDA graphs captured inside measured runs (their capture time is in the figures).
            "cuda_graphs": config.cuda_graphs, "graph_captures_timed": self.timed_graph_captures,
            "estimated": models.target_scaler is not None or cell.draft in models.draft_scalers,
            "target_layers_built": models.target.model.config.num_hidden_layers,
            "target_layers_full": models.target_scaler.full_layers if models.target_scaler else
            models.target.model.config.num_hidden_layers,
        }
        if drafter is None and not row["estimated"] and math.isfinite(models.copy_bandwidth):
            # How close the baseline's decode steps come to reading the weights and KV cache at
            # the measured memory bandwidth: far below 1 means the baseline itself is slow.
            context = int(row["prompt_tokens_mean"] + config.max_new_tokens / 2)
            roofline = decode_step_bytes(models.target.model, cell.batch_size, context) / models.copy_bandwidth
            row["roofline_step_s"] = roofline
            row["roofline_fraction"] = roofline / (row["step_verify_s"] + row["step_overhead_s"])
        if drafter is not None:
            summary = acceptance_summary(results, cell.k)
            draft_kv = max(r.draft_kv_cache_bytes for r in results)
            row.update({
                "alpha": summary.alpha, "tau": summary.tau, "drafted": summary.drafted, "accepted": summary.accepted,
                "acceptance_by_position": summary.by_position,
                "draft_param_bytes": drafter.parameter_bytes(), "draft_kv_cache_bytes": draft_kv,
                "draft_memory_bytes": drafter.parameter_bytes() + draft_kv,
            })
            if cell.alpha:
                row["synthetic_expected_alpha"], row["synthetic_expected_tau"] = expected_acceptance(parse_alpha(cell.alpha), cell.k)
        return CellOutcome(row, request_table, self.step_table, self.outputs)


def _warmed(run: CellRun) -> CellRun:
    run.warm_up()
    return run


def run_cell(models: Models, cell: Cell, prompts: list[list[int]], prompt_ids: list[str], config: SweepConfig) -> CellOutcome:
    """Warm up, every repeat, finish: one cell on its own."""
    run = CellRun(models, cell, prompts, prompt_ids, config)
    run.warm_up()
    for repeat in range(config.repeats):
        run.measure(repeat)
    return run.finish()


def _prompt_ids(record, models: Models, config: SweepConfig) -> list[int]:
    """Token ids of a prompt; with random weights only their number matters (a proxy tokenizer
    measures it, or 4 characters a token), and they are kept inside the target's vocabulary."""
    tokenizer = models.target.tokenizer
    if tokenizer is not None:
        ids = encode_prompt(record, tokenizer, config.chat_template)
    else:
        ids = [ord(c) for c in record.text[::4]]
    if models.synthetic:
        ids = [i % models.target.model.vocab_size for i in ids]
    return ids


def _failure_row(cell: Cell, status: str, message: str) -> dict:
    return {"cell_id": cell.id, "status": status, "message": message,
            "mode": "speculative" if cell.is_speculative else AR, "workload": cell.workload, "draft": cell.draft,
            "k": cell.k, "batch_size": cell.batch_size, "temperature": cell.temperature}


def _is_out_of_memory(error: BaseException) -> bool:
    text = str(error).lower()
    return isinstance(error, torch.cuda.OutOfMemoryError) or "out of memory" in text or "can't allocate memory" in text


# --- the sweep ---------------------------------------------------------------------------------

@dataclass
class SweepEvent:
    kind: str  # "loaded" | "start" | "done"
    cell: Cell | None = None
    row: dict | None = None
    index: int = 0
    total: int = 0
    message: str = ""


class SweepTables:
    """The tables of a run being written: the cells table in memory and rewritten after every
    cell; requests and steps appended per cell as part files (merged by `close`). Keeps the
    baselines' greedy outputs for the lossless check."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.cells = read_table(run_dir, "cells")
        requests = read_table(run_dir, "requests")
        self._outputs: dict[str, list[list[int]]] = {}
        if len(requests):
            for cell_id, rows in requests[requests["repeat"] == 0].groupby("cell_id", sort=False):
                self._outputs[cell_id] = [list(t) for t in rows["tokens"]]

    def finished_ids(self) -> set[str]:
        return set(self.cells["cell_id"]) if len(self.cells) else set()

    def add(self, row: dict, requests: list[dict], steps: list[dict]) -> None:
        new_row = pd.DataFrame([row])
        self.cells = new_row if self.cells.empty else pd.concat([self.cells, new_row], ignore_index=True)
        if requests:
            append_part(self.run_dir, "requests", pd.DataFrame(requests))
            first = [r for r in requests if r["repeat"] == 0]
            self._outputs[row["cell_id"]] = [list(r["tokens"]) for r in first]
        if steps:
            append_part(self.run_dir, "steps", pd.DataFrame(steps))
        write_table(self.run_dir, "cells", self.cells)

    def close(self) -> None:
        merge_parts(self.run_dir)

    def baseline_outputs(self, cell_id: str) -> list[list[int]] | None:
        return self._outputs.get(cell_id) or None


def _pair_with_baseline(tables: SweepTables, cell: Cell, row: dict) -> None:
    """The speed-up over the cell's own group baseline: `speedup` from the medians, and
    `speedup_runs` repeat by repeat (the group's cells take turns, so repeat i of both ran side
    by side); their spread is the measurement noise the gate reports."""
    if cell.is_speculative:
        cells = tables.cells
        match = cells[(cells["cell_id"] == cell.baseline_id)
                      & (cells["status"] == "ok")] if not cells.empty and "tokens_per_s" in cells else []
        if not len(match):
            row["baseline_tokens_per_s"], row["speedup"], row["speedup_runs"] = float("nan"), float("nan"), []
            return
        baseline = match.iloc[0]
    else:
        baseline = row  # a baseline is its own
    row["baseline_tokens_per_s"] = float(baseline["tokens_per_s"])
    row["speedup"] = row["tokens_per_s"] / row["baseline_tokens_per_s"]
    runs, baseline_runs = list(row["tokens_per_s_runs"]), list(baseline["tokens_per_s_runs"])
    row["speedup_runs"] = [ours / theirs for ours, theirs in zip(runs, baseline_runs)]  # round by round


def run_sweep(
    config: SweepConfig,
    results_root: Path = Path("results"),
    resume_dir: Path | None = None,
    on_event: Callable[[SweepEvent], None] = lambda event: None,
) -> Path:
    """Run every cell not already finished; returns the run directory. Ctrl-C stops after
    writing what finished (KeyboardInterrupt propagates)."""
    workloads = preflight(config)
    run_dir = resume_dir or new_run_dir(Path(results_root), config.target)
    tables = SweepTables(run_dir)
    meta = {"config": asdict(config), "plan": describe_plan(config), "started": now_iso(), "status": "running",
            "hardware": hardware_info(), "versions": versions(), "seed": config.seed,
            "synthetic": config.synthetic}
    previous = run_dir / "run.json"
    if resume_dir and previous.exists():
        import json

        meta["resumed_from_started"] = json.loads(previous.read_text()).get("started")
    write_json(run_dir / "run.json", meta)

    models = load_models(config)
    if config.cuda_graphs:
        for model in [models.target.model] + [loaded.model for loaded in models.draft_models.values()]:
            model.use_static_steps()  # CUDA graphs (validate() checked the device)
    message = f"target {models.target.name} from {models.target.resolved.source} ({models.target.load_s:.1f}s)"
    if models.synthetic:
        message += ("; TIMING-ONLY: random weights, synthetic acceptance at α = " + ", ".join(config.alphas))
        scaled = [f"target {models.target_scaler.built_layers}/{models.target_scaler.full_layers} layers"] \
            if models.target_scaler else []
        scaled += [f"{label} {s.built_layers}/{s.full_layers} layers" for label, s in models.draft_scalers.items()]
        if scaled:
            message += "; ESTIMATE: built " + ", ".join(scaled) + ", step times scaled to full depth"
        meta["estimated"] = bool(scaled)
    models.copy_bandwidth = measured_bandwidth(models.target.model.device)
    meta["hardware"]["copy_bandwidth_bytes_per_s"] = models.copy_bandwidth
    write_json(run_dir / "run.json", meta)
    on_event(SweepEvent("loaded", message=message))
    cells = plan_cells(config)
    done = tables.finished_ids()
    out_of_memory_at: dict[tuple, int] = {}  # (workload, temperature, draft, k) -> batch size
    try:
        def skip_reason(cell: Cell) -> str | None:
            at = out_of_memory_at.get((cell.workload, cell.temperature, cell.draft, cell.k),
                                      out_of_memory_at.get((cell.workload, cell.temperature, AR, 0)))
            return None if at is None else f"out of memory at batch size {at}"

        def record(index: int, cell: Cell, prompts, outcome: CellOutcome | None = None,
                   error: BaseException | None = None, skipped: str | None = None) -> None:
            if skipped:
                row = _failure_row(cell, "skipped", skipped)
                tables.add(row, [], [])
            elif error is not None:  # recorded, and the sweep goes on
                if _is_out_of_memory(error):
                    out_of_memory_at[(cell.workload, cell.temperature, cell.draft, cell.k)] = cell.batch_size
                    status = "oom"
                else:
                    status = "failed"
                row = _failure_row(cell, status, f"{type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}")
                tables.add(row, [], [])
                if torch.cuda.is_available():
                    torch.cuda.empty_cache()
            else:
                row = outcome.row
                if not cell.is_speculative:
                    pass  # the baseline itself: nothing to compare
                elif models.synthetic:
                    row["lossless"] = "n/a (synthetic)"
                elif cell.temperature == 0:
                    expected = tables.baseline_outputs(cell.baseline_id)
                    if expected is None:
                        row["lossless"], row["lossless_detail"] = "unchecked", "no baseline cell"
                    else:
                        verdict, detail = lossless_check(models.target.model, prompts, expected, outcome.outputs)
                        row["lossless"], row["lossless_detail"] = verdict, detail
                        if verdict == "MISMATCH":
                            row["status"], row["message"] = "failed", f"lossless check failed: {detail}"
                else:
                    row["lossless"] = "n/a (sampled)"
                _pair_with_baseline(tables, cell, row)
                tables.add(row, outcome.requests, outcome.steps)
            gc.collect()
            on_event(SweepEvent("done", cell, row, index, len(cells)))

        groups: dict[str, list[tuple[int, Cell]]] = {}
        for index, cell in enumerate(cells):
            groups.setdefault(cell.group, []).append((index, cell))
        for group, members in groups.items():
            pending = [(index, cell) for index, cell in members if cell.id not in done]
            if not pending:
                continue
            first = pending[0][1]
            records = workloads[first.workload].sample(requests_per_cell(config, first.batch_size), config.seed)
            prompts = [_prompt_ids(r, models, config) for r in records]
            prompt_ids = [r.id for r in records]
            def attempt(index: int, cell: Cell, action):
                """action(), or None after recording the cell as failed."""
                try:
                    return action()
                except KeyboardInterrupt:
                    raise
                except Exception as error:
                    record(index, cell, prompts, error=error)
                    return None

            runs: list[tuple[int, Cell, CellRun]] = []
            for index, cell in pending:
                on_event(SweepEvent("start", cell, index=index, total=len(cells)))
                if skip_reason(cell):
                    record(index, cell, prompts, skipped=skip_reason(cell))
                elif config.repeats == 1:
                    outcome = attempt(index, cell, lambda: run_cell(models, cell, prompts, prompt_ids, config))
                    if outcome is not None:
                        record(index, cell, prompts, outcome)
                else:  # several repeats: the group's cells take turns, one repeat each per round
                    run = attempt(index, cell, lambda: _warmed(CellRun(models, cell, prompts, prompt_ids, config)))
                    if run is not None:
                        runs.append((index, cell, run))
            try:
                for repeat in range(config.repeats if runs else 0):
                    for entry in list(runs):
                        index, cell, run = entry
                        if attempt(index, cell, lambda: run.measure(repeat) or True) is None:
                            runs.remove(entry)
            except KeyboardInterrupt:  # keep every repeat already measured: record those cells, then stop
                runs = [(index, cell, run) for index, cell, run in runs if run.throughput_per_repeat]
                raise
            finally:
                for index, cell, run in runs:
                    outcome = attempt(index, cell, run.finish)
                    if outcome is not None:
                        record(index, cell, prompts, outcome)
        meta["status"] = "complete"
    except KeyboardInterrupt:
        meta["status"] = "interrupted"
        raise
    finally:
        tables.close()
        meta["finished"] = now_iso()
        write_json(run_dir / "run.json", meta)
    return run_dir

