"""The measured grid: what a sweep is asked to run (SweepConfig) and its cells.

Every (workload, batch size, temperature) group has one autoregressive cell and, on the same
prompts and seeds, one speculative cell per draft x K. On a served engine the batch size is the
number of requests kept in flight (closed-loop concurrency).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from specbench.models import DEFAULT_TARGET

AR = "autoregressive"
ENGINES = ("native", "vllm")


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


@dataclass
class SweepConfig:
    target: str = DEFAULT_TARGET
    drafts: list[str] = field(default_factory=lambda: ["ngram", "smollm2-135m@bf16"])
    ks: list[int] = field(default_factory=lambda: [2, 4])
    batch_sizes: list[int] = field(default_factory=lambda: [1, 4, 16])
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
    engine: str = "native"
    vllm: VllmOptions = field(default_factory=VllmOptions)

    @property
    def torch_dtype(self):
        """The target's dtype: --dtype, else the device's default."""
        from specbench.models import default_dtype, parse_dtype

        return parse_dtype(self.dtype) if self.dtype else default_dtype(self.device)

    @property
    def synthetic(self) -> bool:
        return self.weights == "random"

    def validate(self) -> None:
        """One-line errors for bad input, before anything loads."""
        from specbench.models import parse_draft_spec, parse_dtype
        from specbench.native.sampling import SamplingParams
        from specbench.synthetic import parse_alpha

        if self.engine not in ENGINES:
            raise ValueError(f"--engine must be one of {', '.join(ENGINES)}, got {self.engine!r}")
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
        for draft in self.drafts:
            parse_draft_spec(draft, allow_served=self.engine != "native")
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
        if self.engine == "native":
            from specbench.native.runner import validate_native

            validate_native(self)
        else:
            from specbench.served.vllm_engine import validate_vllm

            validate_vllm(self)


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
    larger ones), baseline first, then draft x K. (A served engine regroups them by server.)"""
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
