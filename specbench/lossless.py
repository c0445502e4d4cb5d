"""Is a speculative cell's output what the target alone would have produced? Checked on every
cell with real weights, whichever engine ran it.

- Greedy: token for token against the baseline's output for the same prompts. At a divergence the
  target's logit gap between the two candidates tells a numerical near-tie (batched and unbatched
  arithmetic may legitimately pick different argmaxes there) from a real MISMATCH.
- Sampled: outputs are random, so the check is statistical, and it needs no baseline. At every
  generated position the target's top-20 raw log-probabilities (what vLLM's API returns; the
  native engine uses the same) bound the probability p(x) that sampling at the cell's temperature
  (top-k, top-p) picks the token x it picked. For an alternative distribution q fixed before the
  token is drawn, the product over positions of (1 - ε) + ε q(x)/p(x) has expectation at most 1
  under correct sampling, whatever the dependence between positions (a test supermartingale), so
  by Ville's inequality it reaches 1/α with probability at most α. specbench averages such
  products over three alternatives (uniform over the vocabulary: garbage tokens; the argmax alone:
  a sampler too greedy; the target at temperature 1: one too hot) and three mixing weights ε, and
  a cell whose average reaches 1/SAMPLED_ALPHA is a MISMATCH. p(x) enters through an upper bound,
  which keeps the test valid. It catches a broken sampler, not a subtle bias: specbench's own
  sampler is tested for that directly (tests/test_sampling_distribution.py). A sampled
  speculative cell's measured outputs are topped up with untimed ones at its settings to at least
  PROBE_MIN_TOKENS positions.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

SAMPLED_ALPHA = 1e-3  # false alarms on a correct engine: at most 1 cell in 1000
PROBE_MIN_TOKENS = 256  # scored positions per sampled cell
PROBE_TOKENS = 16  # tokens per untimed top-up request
TOP_LOGPROBS = 20


@dataclass
class ScoredToken:
    """One generated token as the target sees it."""

    rank: int  # 1 when it is the target's argmax
    logprob: float  # its raw log-probability
    top: list[float]  # the target's top raw log-probabilities, descending


def greedy_check(prompts: list[list[int]], expected: list[list[int]], got: list[list[int]],
                 gap: Callable[[list[int], int, int], float], tolerance: float, tie_note: str = "") -> tuple[str, str]:
    """("exact" | "near-tie" | "MISMATCH", detail). `gap(context, expected_token, got_token)` is
    the target's logit gap between the two candidates after `context`."""
    ties, mismatches = [], []
    for index, (prompt, e, g) in enumerate(zip(prompts, expected, got)):
        if e == g:
            continue
        if len(e) != len(g) and e[: len(g)] == g[: len(e)]:
            mismatches.append(f"request {index}: {len(g)} tokens instead of {len(e)}")
            continue
        position = next(i for i, (a, b) in enumerate(zip(e, g)) if a != b)
        size = gap(prompt + e[:position], e[position], g[position])
        (ties if size <= tolerance else mismatches).append(f"request {index} token {position} (gap {size:.2e})")
    if mismatches:
        return "MISMATCH", "; ".join(mismatches[:3])
    if ties:
        return "near-tie", f"{len(ties)}/{len(prompts)} requests diverge at a near-tie{tie_note}: " + "; ".join(ties[:3])
    return "exact", ""


def position_probabilities(top: list[float], temperature: float, top_k: int, top_p: float,
                           vocab_size: int) -> tuple[float, float, float]:
    """(low, high) bounds on the probability that sampling picks the argmax, and an upper bound on
    the probability that it picks a token outside the listed top, from the top raw log-probs.

    p_T(x) = p(x)^(1/T) / Z. The listed tokens' terms of Z are known; the N unlisted tokens hold
    the remaining mass R, each at most the last listed p, so their terms add up to at most
    p_last^(1/T - 1) R when T <= 1, and to at most N^(1 - 1/T) R^(1/T) (the uniform split, by
    concavity) when T > 1. Top-k within the list is exact; top-p divides by the nucleus' mass,
    which lies in [top_p, 1]."""
    power = 1.0 / temperature
    probs = [math.exp(v) for v in top]
    weights = [p ** power for p in probs]
    if top_k and top_k <= len(weights):
        low = high = weights[0] / sum(weights[:top_k])
        outside = 0.0
    else:
        rest = max(0.0, 1.0 - sum(probs))
        unlisted = max(0, vocab_size - len(probs))
        if power >= 1:
            tail = probs[-1] ** (power - 1) * rest
        else:
            tail = unlisted ** (1 - power) * rest ** power if unlisted else 0.0
        listed = sum(weights)
        low, high, outside = weights[0] / (listed + tail), weights[0] / listed, tail / (listed + tail)
    if top_p < 1.0:
        high, outside = min(1.0, high / top_p), min(1.0, outside / top_p)
    return low, high, outside


EPSILONS = (0.05, 0.2, 0.5)
HUGE_LOG_RATIO = 50.0  # a token the warping excludes (outside top-k): as good as impossible


def log_ratio_bounds(token: ScoredToken, temperature: float, top_k: int, top_p: float,
                     vocab_size: int) -> tuple[float, float, float]:
    """Lower bounds on log q(x)/p(x) at one position for the three alternatives q (uniform, the
    argmax alone, the target at temperature 1), from an upper bound on p(x), the probability that
    sampling picks the token x that was picked."""
    power = 1.0 / temperature
    listed = token.top
    weights = [math.exp(v * power) for v in listed]
    chosen = math.exp(token.logprob * power)
    argmax_high = position_probabilities(listed, temperature, top_k, top_p, vocab_size)[1]
    if top_k and top_k <= len(listed):
        if token.rank > top_k:
            return HUGE_LOG_RATIO, -math.inf, HUGE_LOG_RATIO
        p_high = chosen / sum(weights[:top_k])
    else:
        p_high = chosen / (sum(weights) + (chosen if token.rank > len(listed) else 0.0))
    if top_p < 1.0:
        p_high = min(1.0, p_high / top_p)
    log_p = math.log(max(p_high, 1e-300))
    uniform = -math.log(vocab_size) - log_p
    argmax = -max(log_p, math.log(argmax_high)) if token.rank == 1 else -math.inf  # q(x) = 1 at the argmax
    raw = token.logprob - log_p
    return uniform, argmax, raw


def evidence(tokens: list[ScoredToken], temperature: float, top_k: int, top_p: float, vocab_size: int) -> float:
    """log of the test supermartingale's value: the mean over alternatives and ε of
    prod_t (1 - ε) + ε q(x_t)/p(x_t)."""
    import numpy as np

    ratios = np.array([log_ratio_bounds(t, temperature, top_k, top_p, vocab_size) for t in tokens])  # [n, 3]
    logs = [np.logaddexp(math.log(1 - epsilon), math.log(epsilon) + ratios[:, alternative]).sum()
            for alternative in range(3) for epsilon in EPSILONS]
    return float(np.logaddexp.reduce(logs) - math.log(len(logs)))


def sampled_check(outputs: list[list[ScoredToken]], temperature: float, top_k: int, top_p: float,
                  vocab_size: int, alpha: float = SAMPLED_ALPHA) -> tuple[str, str, dict]:
    """("consistent" | "MISMATCH" | "unchecked", detail, figures) for a sampled cell's outputs."""
    tokens = [t for output in outputs for t in output]
    n = len(tokens)
    if n == 0:
        return "unchecked", "no scored tokens", {}
    listed = min(len(t.top) for t in tokens)
    argmax = sum(t.rank == 1 for t in tokens)
    outside = sum(t.rank > listed for t in tokens)
    bounds = [position_probabilities(t.top[:listed], temperature, top_k, top_p, vocab_size) for t in tokens]
    low, high = sum(b[0] for b in bounds), sum(b[1] for b in bounds)
    log_evidence = evidence(tokens, temperature, top_k, top_p, vocab_size)
    figures = {"sampled_positions": n, "sampled_argmax_share": argmax / n,
               "sampled_outside_top_share": outside / n,
               "sampled_logprob_mean": sum(t.logprob for t in tokens) / n,
               "sampled_evidence_log10": log_evidence / math.log(10)}
    detail = (f"over {n} sampled positions the argmax was picked at {argmax / n:.0%} (the target: "
              f"{low / n:.0%}–{high / n:.0%}), a token outside the target's top {listed} at {outside / n:.1%}; "
              f"mean target log-prob per token {figures['sampled_logprob_mean']:.2f}; evidence against "
              f"correct sampling 10^{figures['sampled_evidence_log10']:.1f}")
    if log_evidence >= math.log(1 / alpha):
        return ("MISMATCH", f"sampled outputs do not follow the target's distribution: {detail} (a correct "
                f"sampler reaches 10^{math.log10(1 / alpha):.0f} with probability < {alpha:g})", figures)
    return "consistent", f"{detail}: below the 10^{math.log10(1 / alpha):.0f} that flags a broken sampler", figures
