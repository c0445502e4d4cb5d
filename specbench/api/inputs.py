"""Checks of the numbers the API takes, each refusing with the line the command prints."""

from __future__ import annotations

import math

from specbench.api.errors import UsageError


def check_price(gpu_price: float | None, gpus: int) -> None:
    if gpu_price is not None and not (math.isfinite(gpu_price) and gpu_price >= 0):
        raise UsageError(f"--gpu-price must be a number of dollars >= 0, got {gpu_price:g}")
    if gpus < 1:
        raise UsageError(f"--gpus must be >= 1, got {gpus}")


def check_grid(ks: list[int], sizes: list[int], contexts: list[int], max_new_tokens: int | None) -> None:
    """K, batch sizes, context lengths and output tokens asked of a plan, each >= 1."""
    if any(x < 1 for x in ks + sizes + contexts + [max_new_tokens or 1]):
        raise UsageError("--k, --batch-sizes, --context-lengths and --max-new-tokens must be >= 1")


def check_alpha(alpha: float | None) -> None:
    """A run's plan takes one i.i.d. α, in [0, 1)."""
    if alpha is not None and not 0 <= alpha < 1:
        raise UsageError(f"--alpha must be in [0, 1), got {alpha:g}")
