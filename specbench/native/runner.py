"""The native engine behind the sweep: loads the target and drafts once, runs every cell of the
grid with specbench's own loop, and checks greedy cells token for token against the baseline
(a divergence at a numerical near-tie of the target's logits is told apart from a real mismatch)."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

import torch

from specbench.drafter_kinds import drafter_kind
from specbench.engines import CellOutcome, Engine, Stage
from specbench.grid import Cell, SweepConfig
from specbench.lossless import TOP_LOGPROBS, ScoredToken, greedy_check
from specbench.measure import OwnCpu
from specbench.models import (
    DEFAULT_TARGET, DraftSpec, ResolvedModel, load_tokenizer, lookup_alias, model_family, parse_draft_spec, parse_dtype,
)
from specbench.native.drafters import Drafter, ModelDrafter, NGramDrafter, SelfDrafter
from specbench.native.engine import GenerationConfig, GenerationResult, generate_autoregressive, generate_speculative
from specbench.native.forward import CausalLM
from specbench.native.lean import Projection
from specbench.native.loading import LoadedModel, check_tokenizers_compatible, family_of, load_model, share_vocabulary
from specbench.native.measure import (
    PeakMemory, acceptance_summary, copy_bandwidth, decode_step_bytes, forward_profile, matmul_rate, phase_times,
    request_rows, step_rows,
)
from specbench.native.placement import free_bytes, memory_budget, parse_devices, placement_devices
from specbench.native.random_models import (
    LayerScaler, build_random_model, layers_that_fit, rescale_result, synthetic_acceptance, unsupported_attention,
)
from specbench.native.sampling import SamplingParams
from specbench.schema import TURNS, measured_columns
from specbench.shapes import Architecture, engine_shapes
from specbench.synthetic import (
    config_parameters, describe_random_model, expected_acceptance, parse_alpha, random_model_record, shipped_config,
)
from specbench.workloads import encode_prompt


def validate_native(config: SweepConfig) -> None:
    """The native engine's own checks of a config: devices, CUDA graphs, draft kinds."""
    devices = parse_devices(config.engine.device)
    if devices[0].startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"--device {config.engine.device}: CUDA is not available on this machine")
    for name in devices:
        if ":" in name and int(name.split(":")[1]) >= torch.cuda.device_count():
            raise ValueError(f"--device {name}: this machine has {torch.cuda.device_count()} CUDA devices")
    if config.engine.cuda_graphs and (not devices[0].startswith("cuda") or len(devices) > 1):
        raise ValueError(f"--cuda-graphs needs the models on one CUDA device, got --device {config.engine.device}")
    if config.grid.synthetic:
        target_alias, target_config = shipped_config(config.grid.target)
        models = [(target_alias, target_config)]
        for label in config.grid.drafts:
            spec = parse_draft_spec(label)
            if drafter_kind(spec.kind).separate_model:
                models.append(shipped_config(spec.model, model_family(target_alias)))
        for alias, raw in models:
            if (why := unsupported_attention(raw)) is not None:
                raise ValueError(f"--weights random on the native engine: {alias} has {why}, which the engine's "
                                 f"cache does not run as the model does; --engine vllm runs it")


class NativeEngine(Engine):
    name = "native"

    def __init__(self, config: SweepConfig, run_dir, replay=None) -> None:
        super().__init__(config, run_dir, replay)
        self.models: Models | None = None

    def open(self) -> str:
        config = self.config
        models = self.models = load_models(config)
        if config.engine.cuda_graphs:
            for model in [models.target.model] + [loaded.model for loaded in models.draft_models.values()]:
                model.use_static_steps()  # CUDA graphs (validate() checked the device)
        message = f"target {models.target.name} from {models.target.resolved.source} ({models.target.load_s:.1f}s)"
        if models.synthetic:
            message += ("; TIMING-ONLY: random weights, synthetic acceptance at α = " + ", ".join(config.grid.alphas))
            scaled = [f"target {models.target_scaler.built_layers}/{models.target_scaler.full_layers} layers"] \
                if models.target_scaler else []
            scaled += [f"{label} {s.built_layers}/{s.full_layers} layers" for label, s in models.draft_scalers.items()]
            if scaled:
                message += "; ESTIMATE: built " + ", ".join(scaled) + ", step times scaled to full depth"
            target = models.random_records["target"]
            if target["mixture_of_experts"]:
                message += f"; {target['model']}: {describe_random_model(target)}"
        models.copy_bandwidth = measured_bandwidth(models.target.model.device)
        dtypes = {models.target.model.dtype} | {loaded.model.dtype for loaded in models.draft_models.values()}
        models.matmul_rates = {str(d).replace("torch.", ""): measured_matmul_rate(models.target.model.device, d)
                               for d in dtypes}
        models.profiles = measured_profiles(models, config)
        return message

    def annotate(self, meta: dict) -> None:
        super().annotate(meta)
        if self.models is not None:
            meta["hardware"]["copy_bandwidth_bytes_per_s"] = self.models.copy_bandwidth
            target_dtype = str(self.models.target.model.dtype).replace("torch.", "")
            meta["hardware"]["matmul_flops_per_s"] = self.models.matmul_rates[target_dtype]
            meta["hardware"]["matmul_dtype"] = target_dtype
            meta["hardware"]["matmul_flops_per_s_by_dtype"] = self.models.matmul_rates
            meta["architectures"] = self.models.architectures()
            meta["engine"]["forward_shapes"] = engine_shapes()  # what the judge prices the forwards with
            if self.models.profiles:
                meta["profiles"] = self.models.profiles

            if Projection._dense_limits:  # the CPU's measured crossover from dense to packed products
                meta["hardware"]["dense_max_rows"] = max(Projection._dense_limits.values())
            meta["estimated"] = self.models.target_scaler is not None or bool(self.models.draft_scalers)
            if self.models.random_records:
                meta["random_weights"] = self.models.random_records

    def encode(self, record) -> list[int]:
        return _prompt_ids(record, self.models, self.config)

    def stages(self, cells: list[Cell]) -> list[Stage]:
        groups: dict[str, list[Cell]] = {}
        for cell in cells:
            groups.setdefault(cell.group, []).append(cell)
        return [NativeStage(self, list(groups.values()))] if groups else []

    def lossless_check(self, prompts, baseline: list[dict], outcome: CellOutcome) -> tuple[str, str]:
        return lossless_check(self.models.target.model, prompts, [list(r["tokens"]) for r in baseline],
                              outcome.outputs)

    def score(self, prompts: list[list[int]], outputs: list[list[int]]) -> list[list[ScoredToken]]:
        return score_outputs(self.models.target.model, prompts, outputs)

    @property
    def vocab_size(self) -> int:
        return self.models.target.model.vocab_size

    def failure_status(self, error: BaseException) -> str:
        if isinstance(error, torch.cuda.OutOfMemoryError):
            return "oom"
        status = super().failure_status(error)
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return status


class NativeStage(Stage):
    """Every cell of the run, on the models loaded once; a (workload, batch, temperature) group's
    cells take turns."""

    def __init__(self, engine: NativeEngine, turns: list[list[Cell]]) -> None:
        super().__init__("native engine", turns)
        self.engine = engine

    def measurement(self, cell: Cell, prompts, prompt_ids) -> "CellRun":
        return CellRun(self.engine.models, cell, prompts, prompt_ids, self.engine.config)


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
    matmul_rates: dict = field(default_factory=dict)  # dtype -> FLOP/s of square products there
    profiles: dict = field(default_factory=dict)  # "target" and "drafts" -> forward_profile, for the performance model
    random_records: dict = field(default_factory=dict)  # random weights: "target" and "drafts" -> random_model_record

    def architectures(self) -> dict:
        """The shapes the performance model reads (specbench.fit.roofline), at full depth."""
        def shape(model: CausalLM, scaler: LayerScaler | None) -> dict:
            config = model.config.to_dict()
            if scaler is not None:
                config["num_hidden_layers"] = scaler.full_layers
            return Architecture.from_config(config, str(model.dtype).replace("torch.", "")).to_dict()

        drafts = {label: shape(loaded.model, self.draft_scalers.get(label)) for label, loaded in self.draft_models.items()}
        return {"target": shape(self.target.model, self.target_scaler), "drafts": drafts}

    def drafter(self, label: str) -> Drafter:
        """The native engine's proposer of the draft's kind (the kinds it runs: ngram, self, model)."""
        spec = self.drafts[label]
        proposers = {"ngram": lambda: NGramDrafter(max_ngram=spec.ngram),
                     "self": lambda: SelfDrafter(self.target.model, spec.layers),
                     "model": lambda: ModelDrafter(self.draft_models[label].model, name=label)}
        return proposers[spec.kind]()


def _context_estimate(config: SweepConfig) -> int:
    return 96 + config.grid.max_new_tokens // 2


def measured_matmul_rate(device: torch.device, dtype: torch.dtype) -> float:
    """FLOP/s of the device's matrix products in the target's dtype; NaN when they cannot run."""
    try:
        return matmul_rate(device, dtype)
    except (RuntimeError, MemoryError):
        return float("nan")


def measured_profiles(models: Models, config: SweepConfig) -> dict:
    """Each model's bare forward over the sizes the run's steps will have (`forward_profile`); none
    where the steps are not the profile's forwards: CUDA graphs replay fixed shapes, and a model
    built with only its first layers is timed scaled."""
    if config.engine.cuda_graphs or models.target_scaler is not None or models.draft_scalers:
        return {}
    widest = max(config.load.batch_sizes) * (max(config.grid.ks, default=0) + 1)
    profiles = {"target": forward_profile(models.target.model, 2 * widest)}
    profiles["drafts"] = {label: forward_profile(loaded.model, 2 * max(config.load.batch_sizes))
                          for label, loaded in models.draft_models.items()}
    return profiles


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

    started = time.perf_counter()
    dtype = config.engine.torch_dtype
    target_alias, target_config = shipped_config(config.grid.target)
    family = model_family(target_alias)
    bytes_per = torch.finfo(dtype).bits // 8
    drafts, draft_sizes = {}, {}
    for label in config.grid.drafts:
        spec = parse_draft_spec(label)
        drafts[label] = spec
        if drafter_kind(spec.kind).separate_model:
            draft_dtype = parse_dtype(spec.dtype) if spec.dtype else dtype
            alias, draft_config = shipped_config(spec.model, family)
            draft_sizes[label] = (alias, draft_config, draft_dtype,
                                  config_parameters(draft_config) * (torch.finfo(draft_dtype).bits // 8))
    draft_budget = sum(size for *_, size in draft_sizes.values())
    needed = config_parameters(target_config) * bytes_per + draft_budget
    target_devices = placement_devices(config.engine.device, needed)
    budget = sum(memory_budget(device) for device in target_devices)
    layers = config.grid.target_layers
    if layers is None and needed > budget:
        layers = layers_that_fit(target_config, dtype, max(budget - min(draft_budget, budget * 0.4), 0))
    target = build_random_model(target_alias, dtype, target_devices, num_layers=layers, seed=config.grid.seed)
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
                                   seed=config.grid.seed + seed)
        if built.is_subset:
            draft_scalers[label] = LayerScaler(built.model, built.full_layers, context)
        draft_models[label] = LoadedModel(built.model, tokenizer, ResolvedModel(label, lookup_alias(alias), "", None,
                                                                                 "random weights"), 0.0)
    share_vocabulary(target.model, [loaded.model for loaded in draft_models.values()])
    records = {"target": random_model_record(target_alias, target_config, target.built_layers),
               "drafts": {label: random_model_record(alias, draft_config, draft_models[label].model.config.num_hidden_layers)
                          for label, (alias, draft_config, *_) in draft_sizes.items()}}
    loaded = LoadedModel(target.model, tokenizer,
                         ResolvedModel(config.grid.target, lookup_alias(target_alias), "", None, "random weights"),
                         time.perf_counter() - started)
    return Models(loaded, drafts, draft_models, synthetic=True, target_scaler=target_scaler,
                  draft_scalers=draft_scalers, random_records=records)


def load_models(config: SweepConfig) -> Models:
    if config.grid.synthetic:
        return load_random_models(config)
    dtype = config.engine.torch_dtype
    target = load_model(config.grid.target, config.engine.device, dtype, allow_download=config.engine.allow_download,
                        trust_remote_code=config.engine.trust_remote_code)
    family = family_of(target)
    drafts, models = {}, {}
    for label in config.grid.drafts:
        spec = parse_draft_spec(label)
        drafts[label] = spec
        if not drafter_kind(spec.kind).separate_model:
            continue
        draft_dtype = parse_dtype(spec.dtype) if spec.dtype else dtype
        loaded = load_model(spec.model, str(target.model.devices()[0]), draft_dtype, family=family,
                            allow_download=config.engine.allow_download,
                            trust_remote_code=config.engine.trust_remote_code)
        check_tokenizers_compatible(target, loaded)
        models[label] = loaded
    return Models(target, drafts, models)




# --- one cell ----------------------------------------------------------------------------------

def _tie_tolerance(dtype: torch.dtype) -> float:
    return {torch.float64: 1e-9, torch.float32: 1e-4, torch.float16: 5e-3}.get(dtype, 3e-2)


def logit_gap(target: CausalLM, context: list[int], expected: int, got: int) -> float:
    """The target's logit gap between two candidate tokens after `context`, relative to its
    largest logit: near 0 is a numerical near-tie, where batched and unbatched arithmetic may
    legitimately pick different argmaxes."""
    with torch.inference_mode():
        cache = target.new_cache(1, len(context) + 1)
        logits = target.forward(cache, torch.tensor([context], device=target.device), logits_at="last")[0].float()
    gap = (logits[expected] - logits[got]).abs().item()
    return gap / max(1.0, logits.abs().max().item())


def lossless_check(target: CausalLM, prompts: list[list[int]], expected: list[list[int]],
                   got: list[list[int]]) -> tuple[str, str]:
    """("exact" | "near-tie" | "MISMATCH", detail) for a greedy speculative cell."""
    return greedy_check(prompts, expected, got, lambda context, e, g: logit_gap(target, context, e, g),
                        _tie_tolerance(target.dtype))


def score_outputs(target: CausalLM, prompts: list[list[int]], outputs: list[list[int]]) -> list[list[ScoredToken]]:
    """Each generated token's rank, raw log-probability and the target's top raw log-probabilities."""
    scored = []
    with torch.inference_mode():
        for prompt, tokens in zip(prompts, outputs):
            if not tokens:
                scored.append([])
                continue
            sequence = list(prompt) + list(tokens)
            cache = target.new_cache(1, len(sequence))
            logits = target.forward(cache, torch.tensor([sequence], device=target.device), logits_at="all")[0]
            logprobs = torch.log_softmax(logits[len(prompt) - 1: len(sequence) - 1, : target.vocab_size].double(), -1)
            chosen = logprobs[torch.arange(len(tokens)), torch.tensor(tokens, device=logprobs.device)]
            ranks = 1 + (logprobs > chosen[:, None]).sum(dim=-1)
            top = torch.topk(logprobs, min(TOP_LOGPROBS, logprobs.shape[-1]), dim=-1).values
            scored.append([ScoredToken(int(r), float(c), t.tolist()) for r, c, t in zip(ranks, chosen, top)])
    return scored


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
        self.sampling = SamplingParams(cell.temperature, config.grid.top_p if cell.temperature else 1.0,
                                       config.grid.top_k if cell.temperature else 0)
        self.batches = [list(range(i, i + cell.batch_size)) for i in range(0, len(prompts), cell.batch_size)]
        self.results: list[GenerationResult] = []
        self.request_table: list[dict] = []
        self.step_table: list[dict] = []
        self.throughput_per_repeat: list[float] = []
        self.outputs: list[list[int]] = [[] for _ in prompts]
        self.peak_bytes = self.peak_torch_bytes = 0
        self.memory_kind = ""
        self.timed_graph_captures = 0
        self.own_cpu = OwnCpu()  # what this process adds to the load average while it measures

    def _graph_captures(self) -> int:
        models = [self.models.target.model] + ([self.drafter.model] if isinstance(self.drafter, ModelDrafter) else [])
        return sum(m.static_steps.captures for m in models if m.static_steps is not None)

    def warm_up(self) -> None:
        """Excluded from every figure. With CUDA graphs it runs at full length, so that the
        graphs the measured runs replay are captured here."""
        if self.config.engine.warmup:
            tokens = self.config.grid.max_new_tokens
            length = tokens if self.config.engine.cuda_graphs else min(8, tokens)
            warm = GenerationConfig(max_new_tokens=length, sampling=self.sampling, seed=self.config.grid.seed)
            _generate(self.models, self.cell, self.drafter, [self.prompts[i] for i in self.batches[0]], warm)

    def measure(self, repeat: int) -> None:
        cell, config = self.cell, self.config
        tokens = seconds = 0.0
        first = not self.throughput_per_repeat  # its outputs are the ones checked (repeat 0, or a top-up's first)
        captures_before = self._graph_captures()
        with self.own_cpu, PeakMemory(self.models.target.model.devices()) as memory:
            for batch_index, rows in enumerate(self.batches):
                generation = GenerationConfig(max_new_tokens=config.grid.max_new_tokens, sampling=self.sampling,
                                              seed=config.grid.seed + 1000 * repeat + batch_index)
                result = _generate(self.models, cell, self.drafter, [self.prompts[i] for i in rows], generation)
                self.results.append(result)
                ids = [self.prompt_ids[i] for i in rows]
                for record in request_rows(result, ids, offset_s=seconds):
                    self.request_table.append({"cell_id": cell.id, "repeat": repeat, "batch_index": batch_index, **record})
                for record in step_rows(result, ids):
                    self.step_table.append({"cell_id": cell.id, "repeat": repeat, "batch_index": batch_index, **record})
                if first:
                    for i, out in zip(rows, result.tokens):
                        self.outputs[i] = out
                tokens += result.num_generated
                seconds += result.total_s
        self.throughput_per_repeat.append(tokens / seconds)
        self.timed_graph_captures += self._graph_captures() - captures_before
        self.peak_bytes = max(self.peak_bytes, memory.peak_bytes)
        self.peak_torch_bytes = max(self.peak_torch_bytes, memory.peak_torch_bytes)
        self.memory_kind = memory.kind

    def sample(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """Untimed outputs at the cell's settings and batch size (seeds apart from the measured)."""
        outputs = []
        for start in range(0, len(prompts), self.cell.batch_size):
            generation = GenerationConfig(max_new_tokens=max_tokens, sampling=self.sampling,
                                          seed=self.config.grid.seed + 500_000 + start)
            chunk = prompts[start:start + self.cell.batch_size]
            outputs.extend(_generate(self.models, self.cell, self.drafter, chunk, generation).tokens)
        return outputs

    def finish(self) -> CellOutcome:
        models, cell, config, drafter = self.models, self.cell, self.config, self.drafter
        prompts, results, request_table = self.prompts, self.results, self.request_table
        throughput_per_repeat, device = self.throughput_per_repeat, self.models.target.model.device
        phases = phase_times(results)
        row = {
            **measured_columns(cell, "native", request_table, [len(p) for p in prompts], throughput_per_repeat,
                               sum(r.total_s for r in results), config.grid.max_new_tokens, config.grid.repeats),
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
            "own_cpu_cores": self.own_cpu.cores, "other_cpu_cores": self.own_cpu.other_cores,
            "synthetic": models.synthetic, "synthetic_alpha": cell.alpha,
            # CUDA graphs captured inside measured runs (their capture time is in the figures).
            "cuda_graphs": config.engine.cuda_graphs, "graph_captures_timed": self.timed_graph_captures,
            "estimated": models.target_scaler is not None or cell.draft in models.draft_scalers,
            "target_layers_built": models.target.model.config.num_hidden_layers,
            "target_layers_full": models.target_scaler.full_layers if models.target_scaler else
            models.target.model.config.num_hidden_layers,
        }
        if drafter is None and not row["estimated"] and math.isfinite(models.copy_bandwidth):
            # How close the baseline's decode steps come to reading the weights and KV cache at
            # the measured memory bandwidth: far below 1 means the baseline itself is slow.
            context = int(row["prompt_tokens_mean"] + config.grid.max_new_tokens / 2)
            roofline = decode_step_bytes(models.target.model, cell.batch_size, context) / models.copy_bandwidth
            row["roofline_step_s"] = roofline
            row["roofline_fraction"] = roofline / (row["step_verify_s"] + row["step_overhead_s"])
        if drafter is not None:
            summary = acceptance_summary(results, cell.k)
            draft_kv = max(r.draft_kv_cache_bytes for r in results)
            row.update({
                "alpha": summary.alpha, "tau": summary.tau, "drafted": summary.drafted, "accepted": summary.accepted,
                "num_drafts": summary.verify_rows, "rejections": summary.rejections,
                "pairing": TURNS,  # fit.noise: a group's cells take turns repeat by repeat
                "acceptance_by_position": summary.by_position,
                "draft_param_bytes": drafter.parameter_bytes(), "draft_kv_cache_bytes": draft_kv,
                "draft_memory_bytes": drafter.parameter_bytes() + draft_kv,
            })
            if cell.alpha:
                row["synthetic_expected_alpha"], row["synthetic_expected_tau"] = expected_acceptance(parse_alpha(cell.alpha), cell.k)
        return CellOutcome(row, request_table, self.step_table, self.outputs)


def _prompt_ids(record, models: Models, config: SweepConfig) -> list[int]:
    """Token ids of a prompt; with random weights only their number matters (a proxy tokenizer
    measures it, or 4 characters a token), and they are kept inside the target's vocabulary."""
    tokenizer = models.target.tokenizer
    if tokenizer is not None:
        ids = encode_prompt(record, tokenizer, config.engine.chat_template)
    else:
        ids = [ord(c) for c in record.text[::4]]
    if models.synthetic:
        ids = [i % models.target.model.vocab_size for i in ids]
    return ids
