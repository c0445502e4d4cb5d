"""The figures the field reports, defined once for every engine.

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

import numpy as np

PERCENTILES = (50, 90, 99)


def percentiles(values, prefix: str) -> dict[str, float]:
    if len(values) == 0:
        return {f"{prefix}_p{p}_s": float("nan") for p in PERCENTILES} | {f"{prefix}_mean_s": float("nan")}
    array = np.asarray(values, dtype=float)
    out = {f"{prefix}_p{p}_s": float(np.percentile(array, p)) for p in PERCENTILES}
    out[f"{prefix}_mean_s"] = float(array.mean())
    return out
