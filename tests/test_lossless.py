"""The lossless checks on their own: greedy classification, and the sampled check's calibration
(a correct sampler passes, broken ones are caught) on simulated target distributions."""

from __future__ import annotations

import math

import numpy as np
import pytest

from specbench.lossless import ScoredToken, greedy_check, position_probabilities, sampled_check

VOCAB = 400


def target_logprobs(rng: np.random.Generator, previous: int) -> np.ndarray:
    """A peaked, context-dependent next-token distribution (raw log-probabilities)."""
    logits = rng.normal(0, 2.5, VOCAB)
    logits[(previous * 7 + 3) % VOCAB] += 4.0  # the context makes one continuation likely
    return logits - np.logaddexp.reduce(logits)


def warp(logprobs: np.ndarray, temperature: float, top_k: int, top_p: float) -> np.ndarray:
    """The same warping as specbench.native.sampling.logits_to_probs."""
    logits = logprobs / temperature
    if top_k:
        logits = np.where(logits < np.sort(logits)[-top_k], -np.inf, logits)
    probs = np.exp(logits - logits.max())
    probs /= probs.sum()
    if top_p < 1:
        order = np.argsort(-probs)
        before = np.cumsum(probs[order]) - probs[order]
        drop = np.zeros(VOCAB, dtype=bool)
        drop[order[before >= top_p]] = True
        probs = np.where(drop, 0.0, probs)
        probs /= probs.sum()
    return probs


def sample_outputs(seed: int, temperature: float, top_k: int = 0, top_p: float = 1.0, sampler=None,
                   requests: int = 8, tokens: int = 32) -> list[list[ScoredToken]]:
    """Outputs drawn token by token (each position depends on the one before), scored as the
    engines score them: rank, raw log-probability, top-20 raw log-probabilities."""
    rng = np.random.default_rng(seed)
    outputs = []
    for _ in range(requests):
        previous, output = int(rng.integers(VOCAB)), []
        for _ in range(tokens):
            logprobs = target_logprobs(rng, previous)
            probs = (sampler or warp)(logprobs, temperature, top_k, top_p)
            token = int(rng.choice(VOCAB, p=probs))
            rank = 1 + int((logprobs > logprobs[token]).sum())
            output.append(ScoredToken(rank, float(logprobs[token]), sorted(logprobs, reverse=True)[:20]))
            previous = token
        outputs.append(output)
    return outputs


@pytest.mark.parametrize("temperature, top_k, top_p", [(0.7, 0, 1.0), (1.0, 0, 1.0), (1.3, 0, 1.0), (0.7, 5, 1.0),
                                                       (0.8, 0, 0.9), (0.7, 50, 0.95)])
def test_a_correct_sampler_passes(temperature, top_k, top_p):
    verdicts = [sampled_check(sample_outputs(seed, temperature, top_k, top_p), temperature, top_k, top_p, VOCAB)[0]
                for seed in range(12)]
    assert verdicts == ["consistent"] * 12


def test_broken_samplers_are_caught():
    hotter = lambda lp, t, k, p: warp(lp, 2.0, k, p)  # noqa: E731 - samples at T=2 while claiming T=0.7
    greedy = lambda lp, t, k, p: np.eye(VOCAB)[int(np.argmax(lp))]  # noqa: E731 - ignores the temperature

    def garbage(logprobs, t, k, p):  # a third of the tokens from the tail, uniformly
        probs = 0.67 * warp(logprobs, t, k, p)
        tail = np.argsort(-logprobs)[100:]
        probs[tail] += 0.33 / len(tail)
        return probs

    for sampler, temperature in ((hotter, 0.7), (greedy, 1.0), (garbage, 0.7)):
        verdict, detail, figures = sampled_check(sample_outputs(1, temperature, sampler=sampler), temperature, 0, 1.0,
                                                 VOCAB)
        assert verdict == "MISMATCH", (sampler, detail)
        assert "do not follow the target's distribution" in detail and figures["sampled_positions"] == 256


def test_argmax_bounds_contain_the_exact_probability():
    rng = np.random.default_rng(0)
    for temperature in (0.5, 0.7, 1.0, 1.5):
        for top_k, top_p in ((0, 1.0), (7, 1.0), (0, 0.8)):
            logprobs = target_logprobs(rng, int(rng.integers(VOCAB)))
            exact = warp(logprobs, temperature, top_k, top_p)[int(np.argmax(logprobs))]
            low, high, outside = position_probabilities(sorted(logprobs, reverse=True)[:20], temperature, top_k,
                                                        top_p, VOCAB)
            assert low - 1e-12 <= exact <= high + 1e-12
            exact_outside = np.sort(warp(logprobs, temperature, top_k, top_p))[::-1][20:].sum()
            assert exact_outside <= outside + 1e-12


def test_greedy_check_tells_a_near_tie_from_a_mismatch():
    prompts, expected = [[1, 2], [3], [4]], [[5, 6, 7], [8, 9], [1, 1]]
    got = [[5, 6, 7], [8, 10], [1]]
    gaps = {9: 1e-6, 10: 1e-6}
    verdict, detail = greedy_check(prompts, expected, got, lambda context, e, g: gaps.get(e, 1.0), 1e-4)
    assert verdict == "MISMATCH" and "request 2: 1 tokens instead of 2" in detail
    verdict, detail = greedy_check(prompts[:2], expected[:2], got[:2], lambda context, e, g: gaps[e], 1e-4)
    assert verdict == "near-tie" and "request 1 token 1" in detail
    assert greedy_check(prompts, expected, expected, lambda *a: math.inf, 1e-4) == ("exact", "")
