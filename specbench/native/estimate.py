"""How long a native sweep on a CPU will take, told before anything loads: every forward the
cells will run, priced from the models' shapes and this machine's probe (`Rates`: matmul_rate per
dtype, copy_bandwidth). A forward costs its weights' bytes over the bandwidth, its products' FLOPs
over the dtype's rate (a CPU without bf16 instructions multiplies bf16 tens of times slower than
fp32: that shows here), and the engine's own per-layer overhead. Rough by design (acceptance is
assumed, prompt lengths are guessed from characters): it says the order of the wait and where it
goes, so that the sweep can say which cells are slow before it runs them."""

from __future__ import annotations

import math
import os
from dataclasses import dataclass, field

from specbench.drafter_kinds import drafter_kind
from specbench.grid import Cell, GridOptions, SweepConfig, plan_cells, requests_per_cell, split_schedule, target_shape
from specbench.models import dtype_name, lookup_alias, parse_draft_spec
from specbench.shapes import Architecture
from specbench.synthetic import shipped_config

# the native engine's Python and kernel-launch cost per layer of a forward, beyond its bytes and
# FLOPs: 7 ms of a 24 ms smollm2-135m decode step (30 layers) on the 2-core AVX512 VM
LAYER_OVERHEAD_S = 2.5e-4
ASSUMED_ACCEPTANCE = {"ngram": 0.35, "model": 0.8, "self": 0.6}  # per position, before a cell measures it
TEMPLATE_TOKENS = 24  # a chat template's tokens around a prompt (smollm2's system turn and markers)
CHARS_PER_TOKEN = 4.0
WARMUP_TOKENS = 8  # runner.CellRun.warm_up: the first batch, this many tokens
PROBE_MIN_TOKENS, PROBE_TOKENS = 256, 16  # lossless.py: a sampled cell's scored positions, its top-ups
RATES_ENV = "SPECBENCH_PROBE_RATES"  # "float32=30e9,bfloat16=5e8,bandwidth=8e9": another machine's probe


@dataclass(frozen=True)
class Rates:
    """A machine's probe: FLOP/s of square products per dtype (torch's name) and copy bytes/s."""

    flops: dict[str, float]
    bandwidth: float
    source: str = "measured"

    def describe(self) -> str:
        short = {"float32": "fp32", "bfloat16": "bf16", "float16": "fp16", "float64": "fp64"}
        products = ", ".join(f"{short.get(name, name)} {rate / 1e9:.3g}" for name, rate in sorted(self.flops.items()))
        return f"{self.source}: products {products} GFLOP/s, copies {self.bandwidth / 1e9:.3g} GB/s"


def probe_rates(dtypes: list[str], device: str = "cpu") -> Rates:
    """This machine's rates for `dtypes` (torch names), measured in about a second (matmul_rate
    keeps a slow dtype's products short), or as SPECBENCH_PROBE_RATES gives them: what another
    machine would run (the tests, and a what-if)."""
    given = os.environ.get(RATES_ENV, "").strip()
    if given:
        values = {}
        for part in given.split(","):
            name, _, value = part.partition("=")
            try:
                values[name.strip() if name.strip() == "bandwidth" else dtype_name(name.strip())] = float(value)
            except ValueError:
                raise ValueError(f"{RATES_ENV}: cannot read {part!r} (write float32=30e9,bfloat16=5e8,"
                                 f"bandwidth=8e9)") from None
        missing = [d for d in dtypes if d not in values] + ([] if "bandwidth" in values else ["bandwidth"])
        if missing:
            raise ValueError(f"{RATES_ENV} gives no {', '.join(missing)}")
        return Rates({d: values[d] for d in dtypes}, values["bandwidth"], RATES_ENV)
    from specbench.models import parse_dtype
    from specbench.native.measure import copy_bandwidth, matmul_rate

    return Rates({d: matmul_rate(device, parse_dtype(d)) for d in dtypes},
                 copy_bandwidth(device, 128 << 20, repeats=4))


@dataclass
class Estimate:
    """Seconds a sweep will take: per cell (its repeats, warm-up and lossless check) and the start
    (loading is not counted: a cached model loads in seconds)."""

    cells: dict[Cell, float]
    start_s: float
    rates: Rates
    dtypes: dict[str, str] = field(default_factory=dict)  # model label -> dtype it runs in

    @property
    def seconds(self) -> float:
        return self.start_s + sum(self.cells.values())

    def by_draft(self) -> dict[str, float]:
        shares: dict[str, float] = {}
        for cell, seconds in self.cells.items():
            shares[cell.draft] = shares.get(cell.draft, 0.0) + seconds
        return shares


def prompt_tokens(config: SweepConfig, workloads: dict) -> dict[str, float]:
    """Each workload's mean prompt length in tokens, guessed from characters (no tokenizer loads)."""
    lengths = {}
    for name, workload in workloads.items():
        records = getattr(workload, "records", None) or []
        chars = sum(len(r.text) for r in records) / len(records) if records else 400
        lengths[name] = chars / CHARS_PER_TOKEN + (TEMPLATE_TOKENS if config.engine.chat_template else 0)
    return lengths


def _architecture(reference: str, family: str | None, dtype: str) -> Architecture | None:
    try:
        return Architecture.from_config(shipped_config(reference, family)[1], dtype)
    except Exception:
        pass
    shape = target_shape(SweepConfig(grid=GridOptions(target=reference)))  # a local model's config.json
    try:
        return Architecture.from_config(shape, dtype) if shape else None
    except Exception:
        return None


def native_dtypes(config: SweepConfig) -> dict[str, str]:
    """The dtype (torch name) each model of a native CPU sweep runs in: "target" and each model draft."""
    target = dtype_name(config.engine.dtype) if config.engine.dtype else "float32"
    dtypes = {"target": target}
    for draft in config.grid.drafts:
        spec = parse_draft_spec(split_schedule(draft)[0])
        if drafter_kind(spec.kind).separate_model:
            dtypes[draft] = dtype_name(spec.dtype) if spec.dtype else target
    return dtypes


def estimate_native(config: SweepConfig, rates: Rates, tokens: dict[str, float],
                    cells: list[Cell] | None = None) -> Estimate | None:
    """The estimate of `cells` (default: the whole plan) of a native CPU sweep with real weights;
    None where it does not apply or a model's shape is not known without loading it."""
    if config.engine.name != "native" or not config.engine.device.startswith("cpu") or config.grid.synthetic \
            or config.load.trace:
        return None
    dtypes = native_dtypes(config)
    target_entry = lookup_alias(config.grid.target)
    family = target_entry.family if target_entry else None
    target = _architecture(config.grid.target, None, dtypes["target"])
    if target is None:
        return None
    drafts: dict[str, tuple[Architecture, str]] = {}
    for draft in config.grid.drafts:
        spec = parse_draft_spec(split_schedule(draft)[0])
        kind = drafter_kind(spec.kind)
        if kind.separate_model:
            shape = _architecture(spec.model, family, dtypes[draft])
            if shape is None:
                return None
            drafts[draft] = (shape, dtypes[draft])
        elif kind.target_prefix_layers:
            layers = min(spec.layers, target.layers)
            drafts[draft] = (target.with_layers(layers), dtypes["target"])

    def forward(shape: Architecture, dtype: str, calls: float, rows: float, context: float = 0.0) -> float:
        flops = float(shape.linear_flops(rows, 1)) + float(shape.attention_flops(rows, 1, context))
        reads = float(shape.weights_read(rows / calls)) if calls else 0.0  # a mixture of experts': its tokens' experts
        return calls * (reads / rates.bandwidth + shape.layers * LAYER_OVERHEAD_S) \
            + flops / rates.flops[dtype]

    def generation(cell: Cell, batch: int, requests: int, new_tokens: int, prompt: float) -> float:
        """One generation of `requests` prompts, `batch` at a time, `new_tokens` each."""
        batches = math.ceil(requests / batch)
        context = prompt + new_tokens / 2
        seconds = forward(target, dtypes["target"], batches, requests * prompt, prompt)
        if not cell.is_speculative:
            return seconds + forward(target, dtypes["target"], batches * (new_tokens - 1),
                                     requests * (new_tokens - 1), context)
        base = split_schedule(cell.draft)[0]
        kind = parse_draft_spec(base).kind
        alpha = float(cell.alpha.split("/")[0]) if cell.alpha else ASSUMED_ACCEPTANCE.get(kind, 0.6)
        k = max(cell.k, 1)
        tau = (1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1
        steps = math.ceil((new_tokens - 1) / tau)
        seconds += forward(target, dtypes["target"], batches * steps, requests * steps * (k + 1), context)
        if cell.draft in drafts:
            shape, dtype = drafts[cell.draft]
            seconds += forward(shape, dtype, batches, requests * prompt, prompt)
            seconds += forward(shape, dtype, batches * steps * k, requests * steps * k, context)
        return seconds

    estimated = {}
    for cell in plan_cells(config) if cells is None else cells:
        prompt = cell.context_length or tokens.get(cell.workload, 100.0)
        requests = requests_per_cell(config, cell.batch_size)
        batch = cell.batch_size or 1
        seconds = config.grid.repeats * generation(cell, batch, requests, config.grid.max_new_tokens, prompt)
        if config.engine.warmup:
            seconds += generation(cell, batch, batch, min(WARMUP_TOKENS, config.grid.max_new_tokens), prompt)
        if cell.is_speculative and cell.temperature > 0:  # the sampled check: top-ups, then every output scored
            short = max(0, PROBE_MIN_TOKENS - requests * config.grid.max_new_tokens)
            extra = math.ceil(short / min(PROBE_TOKENS, config.grid.max_new_tokens))
            if extra:
                seconds += generation(cell, batch, extra, min(PROBE_TOKENS, config.grid.max_new_tokens), prompt)
            scored = requests + extra
            seconds += forward(target, dtypes["target"], scored, scored * (prompt + config.grid.max_new_tokens), prompt)
        estimated[cell] = seconds
    # the start: each model's forward profile (runner.measured_profiles: sizes up to twice the
    # widest step, 6 forwards each) and the probes
    widest = max(config.load.batch_sizes or [1]) * (max(config.grid.ks or [0]) + 1)
    sizes = [s for s in (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256) if s <= 2 * widest]
    start = sum(forward(target, dtypes["target"], 6, 6 * s, 16) for s in sizes)
    for label, (shape, dtype) in drafts.items():
        if drafter_kind(parse_draft_spec(split_schedule(label)[0]).kind).separate_model:
            start += sum(forward(shape, dtype, 6, 6 * s, 16) for s in sizes
                         if s <= 2 * max(config.load.batch_sizes or [1]))
    return Estimate(estimated, start + 2.0, rates, dtypes)
