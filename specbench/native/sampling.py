"""Turning logits into tokens: temperature, top-k and top-p warping, seeded sampling."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.grid import check_sampling


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 0.0
    top_p: float = 1.0
    top_k: int = 0  # 0 = off

    def __post_init__(self) -> None:
        check_sampling(self.temperature, self.top_p, self.top_k)

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


def logits_to_probs(logits: torch.Tensor, params: SamplingParams) -> torch.Tensor:
    """Warped probabilities over the last dimension, in float32.

    Draft and target go through this same function so that speculative sampling reproduces the
    target's *warped* distribution exactly.
    """
    logits = logits.float() / max(params.temperature, 1e-6)
    if params.top_k and params.top_k < logits.shape[-1]:
        kth_largest = torch.topk(logits, params.top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth_largest, float("-inf"))
    if params.top_p < 1.0:
        sorted_logits, sorted_index = torch.sort(logits, dim=-1, descending=True)
        sorted_probs = sorted_logits.softmax(dim=-1)
        # Drop a token when the tokens strictly more likely than it already cover top_p.
        mass_before = sorted_probs.cumsum(dim=-1) - sorted_probs
        drop_sorted = mass_before >= params.top_p
        drop = drop_sorted.scatter(-1, sorted_index, drop_sorted)
        logits = logits.masked_fill(drop, float("-inf"))
    return logits.softmax(dim=-1)


def sample_from_probs(probs: torch.Tensor, generator: torch.Generator | None) -> torch.Tensor:
    """One token per row of a [N, V] matrix of (possibly unnormalised) probabilities, by inverse
    transform: the first token whose cumulative probability (in float64) exceeds a uniform draw.
    One random number per row, where torch.multinomial's exponential race draws V of them (ten
    times slower on CPU) and checks its input with a read back to the host (a synchronisation
    per call on CUDA). A zero-probability token is never drawn: its cumulative sum equals its
    predecessor's."""
    cdf = probs.double().cumsum(dim=-1)
    uniform = torch.rand((probs.shape[0], 1), generator=generator, device=probs.device, dtype=torch.float64)
    return torch.searchsorted(cdf, uniform * cdf[:, -1:], right=True).squeeze(-1).clamp_max_(probs.shape[-1] - 1)


def choose_next_tokens(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None
) -> torch.Tensor:
    """Greedy argmax at temperature 0, else a sample from the warped distribution. [N, V] -> [N]."""
    if params.greedy:
        return logits.argmax(dim=-1)
    return sample_from_probs(logits_to_probs(logits, params), generator)
