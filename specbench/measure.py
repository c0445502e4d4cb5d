"""From engine records to the figures the field reports, and peak-memory sampling.

Definitions (compatible with vLLM's spec-decode metrics and the load tools' latency metrics):
- TTFT: request start (the batch's prefill start) to its first emitted token.
- ITL: gaps between consecutive emitted tokens of a request. Tokens that one speculative step
  emits together arrive together, so ITL has zeros in it: that burstiness is real and kept.
- TPOT: (e2e - TTFT) / (tokens - 1). e2e: request start to its last token.
- alpha (acceptance rate): accepted draft tokens / drafted tokens.
- tau (acceptance length): tokens emitted per target forward = 1 + accepted / verify steps,
  counted per row (vLLM's "mean acceptance length").
- acceptance at draft position i: steps whose i-th draft was accepted / steps that drafted an
  i-th token.
"""

from __future__ import annotations

import os
import threading
import time
from dataclasses import dataclass

import numpy as np
import psutil
import torch

from specbench.engine import Clock, GenerationResult
from specbench.forward import CausalLM

PERCENTILES = (50, 90, 99)


def percentiles(values, prefix: str) -> dict[str, float]:
    if len(values) == 0:
        return {f"{prefix}_p{p}_s": float("nan") for p in PERCENTILES} | {f"{prefix}_mean_s": float("nan")}
    array = np.asarray(values, dtype=float)
    out = {f"{prefix}_p{p}_s": float(np.percentile(array, p)) for p in PERCENTILES}
    out[f"{prefix}_mean_s"] = float(array.mean())
    return out


def request_rows(result: GenerationResult, request_ids: list[str], offset_s: float = 0.0) -> list[dict]:
    """One row per request of one batch. `offset_s` shifts times when a cell runs several batches."""
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

    @property
    def alpha(self) -> float:
        return self.accepted / self.drafted if self.drafted else float("nan")

    @property
    def tau(self) -> float:
        return 1 + self.accepted / self.verify_rows if self.verify_rows else float("nan")


def acceptance_summary(results: list[GenerationResult], num_draft_tokens: int) -> AcceptanceSummary:
    drafted_at = np.zeros(num_draft_tokens)
    accepted_at = np.zeros(num_draft_tokens)
    drafted = accepted = verify_rows = 0
    positions = np.arange(1, num_draft_tokens + 1)
    for result in results:
        for step in result.steps:
            for d, a in zip(step.drafted, step.accepted):
                drafted += d
                accepted += a
                verify_rows += d > 0
                drafted_at += positions <= d
                accepted_at += positions <= a
    by_position = [float(a / d) if d else float("nan") for a, d in zip(accepted_at, drafted_at)]
    return AcceptanceSummary(drafted, accepted, verify_rows, by_position)


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
            cache = model.new_cache(batch, context + tokens)
            cache.set_lengths([context] * batch)
            started = clock.now()
            model.forward(cache, ids, logits_at="all" if tokens > 1 else "last")
            if attempt >= warmup:
                samples.append(clock.now() - started)
    return float(np.median(samples))


# --- memory ------------------------------------------------------------------------------------

class PeakMemory:
    """Peak memory while the block runs: on CUDA torch's peak allocated bytes and the device's
    used memory sampled through NVML in a background thread; on CPU the process's resident set
    size, sampled."""

    def __init__(self, device: torch.device | str, interval_s: float = 0.005) -> None:
        self.device = torch.device(device)
        self.interval_s = interval_s
        self.peak_bytes = 0
        self.peak_torch_bytes = 0
        self.kind = "gpu" if self.device.type == "cuda" else "rss"
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._nvml_handle = None

    def _read(self) -> int:
        if self._nvml_handle is not None:
            import pynvml

            return int(pynvml.nvmlDeviceGetMemoryInfo(self._nvml_handle).used)
        return psutil.Process(os.getpid()).memory_info().rss

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak_bytes = max(self.peak_bytes, self._read())
            time.sleep(self.interval_s)

    def __enter__(self) -> "PeakMemory":
        if self.kind == "gpu":
            torch.cuda.reset_peak_memory_stats(self.device)
            try:
                import pynvml

                pynvml.nvmlInit()
                index = self.device.index if self.device.index is not None else torch.cuda.current_device()
                self._nvml_handle = pynvml.nvmlDeviceGetHandleByIndex(index)
            except Exception:
                self._nvml_handle = None
        if self._nvml_handle is not None or self.kind == "rss":
            self.peak_bytes = self._read()
            self._thread = threading.Thread(target=self._sample, daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()
            self.peak_bytes = max(self.peak_bytes, self._read())
        if self.kind == "gpu":
            self.peak_torch_bytes = int(torch.cuda.max_memory_allocated(self.device))
            if self._nvml_handle is None:
                self.peak_bytes = self.peak_torch_bytes
