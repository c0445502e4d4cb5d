"""How many of a mixture-of-experts layer's routed experts one step reads: the expected number of
distinct experts that the step's routed tokens choose, each token its top-k of E.

A decode step of B rows routes B tokens; a verify of K drafts routes B·(K + 1). At small B the
layer reads only the experts those tokens chose, so a verify reads more expert weights than a
decode; at large B both touch nearly every expert and cost about the same in weight reads."""

from __future__ import annotations

import math
from collections.abc import Sequence


def expected_distinct_experts(tokens: int, experts: int, per_token: int,
                              popularity: Sequence[float] | None = None) -> float:
    """The expected number of distinct routed experts that `tokens` routed tokens touch in one
    layer, each choosing `per_token` distinct experts (top-k) of `experts`, tokens independent.

    Uniform routing (`popularity` None): a token picks each expert with probability k/E, so
    E·(1 − (1 − k/E)^T), exactly. Skewed routing (`popularity`: each expert's share p_i of the
    choices, any positive weights): Σ_i 1 − (1 − q_i)^T, q_i the probability that a token's top-k
    holds expert i (`inclusion_probabilities`: an approximation, see there).

    The planner does not compute with it: it prices an MoE layer at the tokens a step routes on
    NVIDIA's tables, which timed the kernel at each token count under a skewed load
    (power_law_1.01, aiconfigurator's default, which its serving estimates rest on). This formula
    is the check that those timings are the expert reads it describes: up to 64 tokens a line
    through it explains R² 0.95-0.99 of the tables' time, uniform routing for their even load and
    a Zipf popularity for their skewed one (docs/validation.md, section 7). Uniform
    routing touches the most experts for a given k (1 − (1 − q)^T is concave in q), so it bounds
    the reads a verify adds from above; trained routers are balanced over a batch, yet tokens of
    one sequence share experts more than independent ones, which the skewed load stands for."""
    if tokens < 0 or experts < 1 or not 1 <= per_token <= experts:
        raise ValueError(f"expected distinct experts needs tokens >= 0 and 1 <= k <= E, got T={tokens}, "
                         f"E={experts}, k={per_token}")
    if popularity is None:
        return experts * (1.0 - (1.0 - per_token / experts) ** tokens)
    if len(popularity) != experts:
        raise ValueError(f"popularity has {len(popularity)} shares for {experts} experts")
    return sum(1.0 - (1.0 - q) ** tokens for q in inclusion_probabilities(popularity, per_token))


def inclusion_probabilities(popularity: Sequence[float], per_token: int) -> list[float]:
    """q_i: the probability that expert i is among a token's k distinct experts, when the k are
    drawn without replacement in proportion to `popularity` (p_i, normalised here; successive or
    Plackett-Luce sampling). Σ q_i = k.

    That sampling has no closed form for q_i. It is the k smallest of X_i / p_i with X_i ~ Exp(1)
    independent (order sampling), so expert i is drawn when X_i / p_i falls below the k-th smallest
    of them; holding that threshold at the t that expects k draws gives Rosén's approximation
    q_i = 1 − exp(−p_i·t), Σ_i (1 − exp(−p_i·t)) = k, solved by bisection. It is exact for uniform
    p; with E = 64, k = 4 and Zipf popularity (s up to 1.5) the distinct experts it gives are within
    2 % of a simulated router's (tests/test_experts.py)."""
    total = float(sum(popularity))
    if not popularity or total <= 0 or any(p < 0 for p in popularity):
        raise ValueError("popularity needs non-negative shares that sum above 0")
    shares = [p / total for p in popularity]
    reachable = sum(1 for p in shares if p > 0)
    if per_token > reachable:
        raise ValueError(f"a token takes {per_token} distinct experts but only {reachable} have a share above 0")
    if per_token == reachable:
        return [1.0 if p > 0 else 0.0 for p in shares]

    def drawn(t: float) -> float:
        return sum(-math.expm1(-p * t) for p in shares)

    low, high = 0.0, 1.0
    while drawn(high) < per_token:
        high *= 2
    for _ in range(100):
        middle = (low + high) / 2
        low, high = (middle, high) if drawn(middle) < per_token else (low, middle)
    t = (low + high) / 2
    return [-math.expm1(-p * t) for p in shares]


def zipf_popularity(experts: int, exponent: float = 1.0) -> list[float]:
    """A skewed popularity: expert i (from 1) chosen in proportion to 1 / i^exponent."""
    weights = [1.0 / (i ** exponent) for i in range(1, experts + 1)]
    total = sum(weights)
    return [w / total for w in weights]
