"""The expected number of distinct routed experts a step touches, against a simulated router:
T tokens, each drawing k distinct experts of E (uniformly, or in proportion to a skewed popularity)."""

from __future__ import annotations

import numpy as np
import pytest

from specbench.fit.experts import expected_distinct_experts, inclusion_probabilities, zipf_popularity

EXPERTS, PER_TOKEN, TRIALS = 64, 4, 300


def simulated_distinct(tokens: int, popularity: np.ndarray, rng: np.random.Generator) -> float:
    """The mean number of distinct experts over TRIALS steps of `tokens` tokens, each token's k
    distinct experts drawn without replacement in proportion to `popularity` (Gumbel top-k)."""
    keys = np.log(popularity) + rng.gumbel(size=(TRIALS, tokens, len(popularity)))
    chosen = np.argpartition(-keys, PER_TOKEN - 1, axis=2)[:, :, :PER_TOKEN]
    touched = np.zeros((TRIALS, len(popularity)), dtype=bool)
    np.put_along_axis(touched, chosen.reshape(TRIALS, -1), True, axis=1)
    return float(touched.sum(axis=1).mean())


@pytest.mark.parametrize("skewed", [False, True], ids=["uniform", "zipf"])
@pytest.mark.parametrize("tokens", [1, 3, 8, 32, 128])
def test_the_formula_matches_a_simulated_router(tokens, skewed):
    rng = np.random.default_rng(tokens)
    popularity = np.array(zipf_popularity(EXPERTS, 1.0)) if skewed else np.full(EXPERTS, 1 / EXPERTS)
    expected = expected_distinct_experts(tokens, EXPERTS, PER_TOKEN, list(popularity) if skewed else None)
    simulated = simulated_distinct(tokens, popularity, rng)
    # uniform: exact, so the simulation's own noise; skewed: Rosén's approximation of top-k inclusion
    assert expected == pytest.approx(simulated, rel=0.01 if not skewed else 0.04, abs=0.15)


def test_skew_touches_fewer_experts_than_uniform_routing():
    for tokens in (2, 8, 64):
        uniform = expected_distinct_experts(tokens, EXPERTS, PER_TOKEN)
        assert expected_distinct_experts(tokens, EXPERTS, PER_TOKEN, zipf_popularity(EXPERTS, 1.0)) < uniform
    # equal shares are the uniform case, and the inclusion probabilities sum to k
    assert expected_distinct_experts(16, EXPERTS, PER_TOKEN, [1.0] * EXPERTS) == \
        pytest.approx(expected_distinct_experts(16, EXPERTS, PER_TOKEN))
    assert sum(inclusion_probabilities(zipf_popularity(EXPERTS, 1.2), PER_TOKEN)) == pytest.approx(PER_TOKEN)


@pytest.mark.parametrize("experts, per_token", [(64, 4), (128, 8), (256, 8)])  # E=128, k=8: Qwen3-30B-A3B
def test_a_verify_reads_more_experts_than_a_decode_at_small_batch_and_the_same_at_large(experts, per_token):
    k_drafts = 3
    for batch in (1, 4):
        decode = expected_distinct_experts(batch, experts, per_token)
        verify = expected_distinct_experts(batch * (k_drafts + 1), experts, per_token)
        assert verify > 2.5 * decode
    decode = expected_distinct_experts(256, experts, per_token)
    verify = expected_distinct_experts(256 * (k_drafts + 1), experts, per_token)
    assert verify / decode < 1.01 and verify <= experts and decode > 0.99 * experts


def test_the_simulated_router_agrees_on_decode_against_verify():
    rng = np.random.default_rng(7)
    uniform = np.full(EXPERTS, 1 / EXPERTS)
    assert simulated_distinct(4, uniform, rng) > 3 * simulated_distinct(1, uniform, rng)  # B=1, K=3
    assert simulated_distinct(64 * 4, uniform, rng) == pytest.approx(simulated_distinct(64, uniform, rng), rel=0.02)


@pytest.mark.parametrize("bad", [dict(tokens=-1), dict(per_token=0), dict(per_token=65), dict(popularity=[1.0] * 3)])
def test_impossible_routing_is_refused(bad):
    arguments = dict(tokens=4, experts=EXPERTS, per_token=PER_TOKEN) | bad
    with pytest.raises(ValueError):
        expected_distinct_experts(**arguments)
