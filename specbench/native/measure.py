"""From the native engine's records to the figures of a cell: request and step rows, acceptance,
phase times, bare forward timings, the memory-bandwidth roofline and peak memory (definitions in
specbench.measure)."""

from __future__ import annotations

import os
from dataclasses import dataclass

import numpy as np
import psutil
import torch

from specbench.measure import PeakSampler
from specbench.native.engine import Clock, GenerationResult
from specbench.native.forward import CausalLM
from specbench.shapes import Architecture


def request_rows(result: GenerationResult, request_ids: list[str], offset_s: float = 0.0) -> list[dict]:
    """One row per request of one batch. Its times count from the batch's start; `offset_s` is
    when the batch started within its repeat (a cell runs its batches one after another)."""
    rows = []
    for index, (tokens, times) in enumerate(zip(result.tokens, result.emission_s)):
        ttft = times[0] if times else float("nan")
        e2e = times[-1] if times else float("nan")
        gaps = np.diff(times).tolist() if len(times) > 1 else []
        rows.append({
            "request_id": request_ids[index],
            "prompt_tokens": result.prompt_lengths[index],
            "output_tokens": len(tokens),
            "ttft_s": ttft,
            "e2e_s": e2e,
            "tpot_s": (e2e - ttft) / (len(tokens) - 1) if len(tokens) > 1 else float("nan"),
            "itl_s": gaps,
            "start_offset_s": offset_s,
            "tokens": list(tokens),
        })
    return rows


def step_rows(result: GenerationResult, request_ids: list[str]) -> list[dict]:
    """One row per (step, active request)."""
    rows = []
    for step in result.steps:
        for row, request in enumerate(step.request_ids):
            rows.append({
                "step": step.step, "request_id": request_ids[request], "batch_rows": len(step.request_ids),
                "drafted": step.drafted[row], "accepted": step.accepted[row], "emitted": step.emitted[row],
                "verify_tokens": step.verify_tokens,
                "draft_s": step.draft_s, "verify_s": step.verify_s, "overhead_s": step.overhead_s,
                "end_s": step.end_s,
            })
    return rows


@dataclass
class AcceptanceSummary:
    drafted: int
    accepted: int
    verify_rows: int  # (step, row) pairs with at least one drafted token
    by_position: list[float]  # acceptance rate at draft position 1..K
    rejections: int = 0  # (step, row) pairs that rejected one of their drafts

    @property
    def alpha(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def tau(self) -> float:
        return 1 + self.accepted / self.verify_rows if self.verify_rows else float("nan")


def acceptance_summary(results: list[GenerationResult], k: int) -> AcceptanceSummary:
    drafted_at = np.zeros(k)
    accepted_at = np.zeros(k)
    drafted = accepted = verify_rows = rejections = 0
    positions = np.arange(1, k + 1)
    for result in results:
        for step in result.steps:
            for d, a in zip(step.drafted, step.accepted):
                drafted += d
                accepted += a
                verify_rows += d > 0
                rejections += a < d
                drafted_at += positions <= d
                accepted_at += positions <= a
    by_position = [float(a / d) if d else float("nan") for a, d in zip(accepted_at, drafted_at)]
    return AcceptanceSummary(drafted, accepted, verify_rows, by_position, rejections)


def phase_times(results: list[GenerationResult]) -> dict[str, float]:
    """Where the decode time went, and the per-step medians the cost model uses."""
    draft = sum(s.draft_s for r in results for s in r.steps)
    verify = sum(s.verify_s for r in results for s in r.steps)
    overhead = sum(s.overhead_s for r in results for s in r.steps)
    prefill = sum(r.prefill_s + r.draft_prefill_s for r in results)
    total = sum(r.total_s for r in results)
    steps = [s for r in results for s in r.steps]
    # Per-step medians over steps with the full batch only: the tail of a run, where finished
    # rows have left, runs at a smaller batch size.
    full = [s for r in results for s in r.steps if len(s.request_ids) == len(r.tokens)] or steps
    return {
        "prefill_share": prefill / total if total else float("nan"),
        "draft_share": draft / total if total else float("nan"),
        "verify_share": verify / total if total else float("nan"),
        "overhead_share": overhead / total if total else float("nan"),
        "step_draft_s": float(np.median([s.draft_s for s in full])) if full else float("nan"),
        "step_verify_s": float(np.median([s.verify_s for s in full])) if full else float("nan"),
        "step_overhead_s": float(np.median([s.overhead_s for s in full])) if full else float("nan"),
        "target_forwards": len(steps),
        "prefill_s": float(np.median([r.prefill_s for r in results])) if results else float("nan"),
        "draft_prefill_s": float(np.median([r.draft_prefill_s for r in results])) if results else float("nan"),
    }


def time_forward(model: CausalLM, batch: int, tokens: int, context: int, repeats: int = 5, warmup: int = 1) -> float:
    """Median seconds of one bare forward of `tokens` new positions per row over `context` cached
    ones (logits at every new position), warm-up excluded: the unit step times are built from."""
    clock = Clock(model.device)
    ids = torch.zeros((batch, tokens), dtype=torch.long, device=model.device)
    samples = []
    with torch.inference_mode():
        for attempt in range(warmup + repeats):
            cache = model.decode_cache(batch, context + tokens)
            cache.set_lengths([context] * batch)
            started = clock.now()
            model.step(cache, ids, logits_at="all" if tokens > 1 else "last")
            if attempt >= warmup:
                samples.append(clock.now() - started)
    return float(np.median(samples))


PROFILE_TOKENS = (1, 2, 3, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128, 192, 256, 384, 512, 768, 1024, 1536, 2048,
                  3072, 4096)
PROFILE_CONTEXT = 16  # cached positions each row attends over: enough to run attention, too few to cost


def forward_profile(model: CausalLM, max_tokens: int, budget_s: float = 1.0, repeats: int = 5) -> dict:
    """The engine's bare decode forward at a growing number of rows (one new position each, over
    PROFILE_CONTEXT cached ones): {"tokens": [...], "seconds": [...]}, the curve the performance
    model scales instead of assuming one flop rate (`fit.roofline.ForwardProfile`). Sizes up to
    `max_tokens` (rows x positions of the largest step the run plans) or until one forward takes
    `budget_s`; warm-up excluded, medians."""
    tokens, seconds = [], []
    for size in PROFILE_TOKENS:
        if size > max(max_tokens, PROFILE_TOKENS[0]):
            break
        try:
            elapsed = time_forward(model, size, 1, PROFILE_CONTEXT, repeats=repeats)
        except (RuntimeError, MemoryError):  # out of memory at this size: the profile ends here
            break
        tokens.append(size)
        seconds.append(elapsed)
        if elapsed > budget_s:
            break
    return {"tokens": tokens, "seconds": seconds, "context": PROFILE_CONTEXT}


# --- memory-bandwidth roofline ----------------------------------------------------------------

def copy_bandwidth(device: torch.device | str, num_bytes: int | None = None, repeats: int = 10) -> float:
    """Measured memory bandwidth in bytes/s: the best of `dst.copy_(src)` over buffers far larger
    than any cache (STREAM's convention: the roofline is what the memory can do at its best),
    counting the read and the write (2 x num_bytes per copy)."""
    device = torch.device(device)
    num_bytes = num_bytes or (2 << 30 if device.type == "cuda" else 256 << 20)
    source = torch.empty(num_bytes // 4, dtype=torch.float32, device=device).fill_(1.0)
    destination = torch.empty_like(source)
    clock = Clock(device)
    samples = []
    for attempt in range(repeats + 2):
        started = clock.now()
        destination.copy_(source)
        if attempt >= 2:
            samples.append(clock.now() - started)
    del source, destination
    return 2 * num_bytes / min(samples)


PRODUCT_BUDGET_S = 0.1  # the longest one square product of matmul_rate may take (its size shrinks to fit)


def matmul_rate(device: torch.device | str, dtype: torch.dtype, size: int | None = None, repeats: int = 5) -> float:
    """Measured matrix-multiply rate in FLOP/s: the best of square products in the models' dtype
    (the compute roof the performance model's fit is pulled towards). Without a `size`: 8192 on
    CUDA, 1024 on a CPU, or smaller where one product would take over PRODUCT_BUDGET_S: a CPU
    without bf16 instructions multiplies bf16 at about 1 GFLOP/s, where seven 1024-products took 16 s
    of every sweep's start (a 256-product, timed first the same way, says how large fits)."""
    device = torch.device(device)
    if size is None:
        size = 8192 if device.type == "cuda" else 1024
        probe = min(256, size)
        seconds = 2 * probe ** 3 / matmul_rate(device, dtype, probe, repeats=1)
        scale = (PRODUCT_BUDGET_S / max(seconds, 1e-9)) ** (1 / 3)
        size = max(probe, min(size, int(probe * scale) // 64 * 64))
    a = torch.randn(size, size, device=device).to(dtype)
    b = torch.randn(size, size, device=device).to(dtype)
    clock = Clock(device)
    samples = []
    with torch.inference_mode():
        for attempt in range(repeats + 2):
            started = clock.now()
            torch.mm(a, b)
            if attempt >= 2:
                samples.append(clock.now() - started)
    del a, b
    return 2 * size ** 3 / min(samples)


def decode_step_bytes(model: CausalLM, batch: int, context: int) -> int:
    """Bytes one autoregressive decode step must read at least: every weight once (shared by the
    batch) except the input embedding, of which only the batch's rows are read, and of a mixture
    of experts only the routed experts the batch's tokens are expected to choose; plus each row's
    K and V over its context."""
    config = model.config
    embedding = model.decoder.get_input_embeddings().weight
    tied = embedding is model.head.weight
    weights = model.parameter_bytes() - (0 if tied else embedding.numel() * embedding.element_size())
    kv_heads, head_dim = model.kv_heads_and_dim()
    element = torch.finfo(model.dtype).bits // 8
    shape = Architecture.from_config(config.to_dict(), str(model.dtype).replace("torch.", ""))
    if shape.is_moe:
        unread = shape.moe_layers * (shape.experts - float(shape.distinct_experts(batch))) * shape.expert_parameters
        weights -= int(unread * element)
    kv = 2 * config.num_hidden_layers * kv_heads * head_dim * context * element
    return weights + batch * (kv + config.hidden_size * element)


def roofline_tokens_per_s(model: CausalLM, batch: int, context: int, bandwidth: float) -> float:
    """The memory-bandwidth ceiling on autoregressive decode throughput: batch tokens per step, a
    step no faster than reading decode_step_bytes at the measured bandwidth."""
    return batch * bandwidth / decode_step_bytes(model, batch, context)


# --- memory ------------------------------------------------------------------------------------

def nvml_index(device: torch.device) -> int:
    """NVML numbers every GPU of the machine; torch only the visible ones, in CUDA_VISIBLE_DEVICES
    order."""
    index = device.index if device.index is not None else torch.cuda.current_device()
    visible = [v.strip() for v in os.environ.get("CUDA_VISIBLE_DEVICES", "").split(",") if v.strip()]
    if index < len(visible) and visible[index].isdigit():
        return int(visible[index])
    return index


class PeakMemory:
    """Peak memory while the block runs: on CUDA torch's peak allocated bytes and the devices' used
    memory sampled through NVML in a background thread, summed over the devices a model spans; on
    CPU the process's resident set size, sampled."""

    def __init__(self, device: torch.device | str | list, interval_s: float = 0.005) -> None:
        devices = device if isinstance(device, (list, tuple)) else [device]
        self.devices = [torch.device(d) for d in devices]
        self.device = self.devices[0]
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.peak_torch_bytes = 0
        self.kind = "gpu" if self.device.type == "cuda" else "rss"
        self._sampler: PeakSampler | None = None
        self._nvml_handles: list = []

    def _read(self) -> int:
        if self._nvml_handles:
            import pynvml

            return sum(int(pynvml.nvmlDeviceGetMemoryInfo(handle).used) for handle in self._nvml_handles)
        return psutil.Process(os.getpid()).memory_info().rss

    def __enter__(self) -> "PeakMemory":
        if self.kind == "gpu":
            for device in self.devices:
                torch.cuda.reset_peak_memory_stats(device)
            try:
                import pynvml

                pynvml.nvmlInit()
                self._nvml_handles = [pynvml.nvmlDeviceGetHandleByIndex(nvml_index(d)) for d in self.devices]
            except Exception:
                self._nvml_handles = []
        if self._nvml_handles or self.kind == "rss":
            self._sampler = PeakSampler(self._read, self.interval_s).__enter__()
        return self

    def __exit__(self, *exc) -> None:
        if self._sampler is not None:
            self._sampler.__exit__(*exc)
            self.peak_bytes = self._sampler.peak
        if self.kind == "gpu":
            self.peak_torch_bytes = sum(int(torch.cuda.max_memory_allocated(d)) for d in self.devices)
            if not self._nvml_handles:
                self.peak_bytes = self.peak_torch_bytes
