"""Sampled speculative decoding must reproduce the target's distribution exactly.

Each test compares empirical counts against exact probabilities with a chi-square test, and
shows that the same test rejects a sampler whose residual step is wrong (resampling from p
instead of normalise(max(0, p - q)) after a rejection).
"""

import copy
import itertools

import pytest
import torch
from conftest import tiny_model
from scipy.stats import chisquare
from transformers.generation.logits_process import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

import specbench.native.rejection as rejection
from specbench.native.drafters import ModelDrafter, NGramDrafter
from specbench.native.engine import GenerationConfig, generate_speculative
from specbench.native.sampling import SamplingParams, logits_to_probs

pytestmark = pytest.mark.integration  # tiny models sampled many thousands of times: 20 s in all

P_VALUE_FLOOR = 1e-3


def chi_square_p_value(observed: torch.Tensor, probs: torch.Tensor) -> float:
    """Goodness of fit, pooling cells whose expected count is below 5."""
    observed, probs = observed.double().flatten(), probs.double().flatten()
    expected = probs / probs.sum() * observed.sum()
    if (observed[expected == 0] > 0).any():
        return 0.0  # a token the target can never produce
    observed, expected = observed[expected > 0], expected[expected > 0]
    small = expected < 5
    if small.any():
        observed = torch.cat([observed[~small], observed[small].sum()[None]])
        expected = torch.cat([expected[~small], expected[small].sum()[None]])
    return float(chisquare(observed.numpy(), expected.numpy()).pvalue)


def wrong_residual(p, q):
    return p


# --- the rejection sampler alone, on fixed distributions ---------------------------------------

def first_two_emitted(p, q, rows=60_000, seed=0):
    """Rows share target p [K+1, V] and draft q [K, V]; returns the first and second emitted
    tokens of each row (second = -1 when the step emitted only one)."""
    generator = torch.Generator().manual_seed(seed)
    k = q.shape[0]
    drafts = torch.stack([torch.multinomial(q[i], rows, replacement=True, generator=generator) for i in range(k)], 1)
    result = rejection.accept_rejection_sampling(
        drafts, torch.full((rows,), k), q.expand(rows, -1, -1), p.expand(rows, -1, -1), generator)
    emitted = torch.cat([drafts, torch.zeros(rows, 1, dtype=torch.long)], 1)
    emitted[torch.arange(rows), result.accepted_counts] = result.next_tokens
    second = torch.where(result.accepted_counts >= 1, emitted[:, 1], -1)
    return emitted[:, 0], second


def fixed_distributions(vocab=6, k=2, seed=0):
    generator = torch.Generator().manual_seed(seed)
    p = (torch.randn(k + 1, vocab, generator=generator) * 1.5).softmax(-1)
    q = (torch.randn(k, vocab, generator=generator) * 1.5).softmax(-1)
    q[:, 0] = 0.0  # a token the draft never proposes but the target likes
    return p, q / q.sum(-1, keepdim=True)


def test_rejection_sampler_reproduces_target_per_position():
    p, q = fixed_distributions()
    first, second = first_two_emitted(p, q)
    assert chi_square_p_value(torch.bincount(first, minlength=6), p[0]) > P_VALUE_FLOOR
    second = second[second >= 0]
    assert chi_square_p_value(torch.bincount(second, minlength=6), p[1]) > P_VALUE_FLOOR


def test_chi_square_catches_a_wrong_residual(monkeypatch):
    monkeypatch.setattr(rejection, "residual_distribution", wrong_residual)
    p, q = fixed_distributions()
    first, _ = first_two_emitted(p, q)
    assert chi_square_p_value(torch.bincount(first, minlength=6), p[0]) < P_VALUE_FLOOR


def test_one_hot_drafts_reproduce_target():
    p, _ = fixed_distributions(k=1)
    rows = 60_000
    drafts = torch.full((rows, 1), 3)  # an n-gram drafter always proposing token 3
    generator = torch.Generator().manual_seed(1)
    result = rejection.accept_rejection_sampling(drafts, torch.ones(rows, dtype=torch.long), None,
                                                 p.expand(rows, -1, -1), generator)
    first = torch.where(result.accepted_counts >= 1, 3, result.next_tokens)
    assert chi_square_p_value(torch.bincount(first, minlength=6), p[0]) > P_VALUE_FLOOR


# --- end to end: the engine with tiny models ---------------------------------------------------

VOCAB = 5
PROMPT = [1, 3, 0, 2, 4, 1]


def exact_joint(target, params, new_tokens=3):
    """P(x1, x2, x3 | PROMPT) under the warped target, by enumerating prefixes."""
    joint = torch.ones([VOCAB] * new_tokens, dtype=torch.float64)
    with torch.no_grad():
        for depth in range(new_tokens):
            for prefix in itertools.product(range(VOCAB), repeat=depth):
                logits = target(torch.tensor([PROMPT + list(prefix)])).logits[0, -1]
                probs = logits_to_probs(logits, params).double()
                # joint[prefix] has one axis per remaining token; this one is the first.
                joint[prefix] *= probs.reshape([VOCAB] + [1] * (new_tokens - depth - 1))
    return joint


def empirical_joint(target, drafter, params, k, rows=8000, seed=0):
    config = GenerationConfig(max_new_tokens=3, sampling=params, seed=seed)
    result = generate_speculative(target, drafter, [PROMPT] * rows, config, k=k)
    tokens = torch.tensor(result.tokens)
    index = tokens[:, 0] * VOCAB * VOCAB + tokens[:, 1] * VOCAB + tokens[:, 2]
    return torch.bincount(index, minlength=VOCAB**3)


@pytest.fixture(scope="module")
def peaky_pair():
    target = tiny_model("llama", layers=2, seed=10, vocab=VOCAB, hidden=32, logit_scale=25.0)
    far = tiny_model("llama", layers=1, seed=11, vocab=VOCAB, hidden=32, logit_scale=25.0)
    close = copy.deepcopy(target)  # the target with a perturbed head: moderate acceptance
    generator = torch.Generator().manual_seed(12)
    with torch.no_grad():
        head = close.lm_head.weight
        head.add_(torch.randn(head.shape, generator=generator, dtype=head.dtype) * head.std() * 0.7)
    return target, {"far": far, "close": close}


@pytest.mark.parametrize("params", [SamplingParams(temperature=1.0),
                                    SamplingParams(temperature=0.7, top_k=3, top_p=0.9)])
@pytest.mark.parametrize("k", [1, 2])
@pytest.mark.parametrize("draft_kind", ["far", "close"])
def test_speculative_sampling_matches_target_joint(peaky_pair, params, k, draft_kind):
    target, drafts = peaky_pair
    exact = exact_joint(target, params)
    observed = empirical_joint(target, ModelDrafter(drafts[draft_kind]), params, k)
    assert chi_square_p_value(observed, exact) > P_VALUE_FLOOR


def test_speculative_ngram_sampling_matches_target_joint(peaky_pair):
    target, _ = peaky_pair
    params = SamplingParams(temperature=1.0)
    observed = empirical_joint(target, NGramDrafter(max_ngram=2), params, k=2)
    # the prompt ends in 1 and has "1 3" earlier, so the lookup drafts 3 and more
    assert chi_square_p_value(observed, exact_joint(target, params)) > P_VALUE_FLOOR


def test_end_to_end_test_catches_a_wrong_residual(peaky_pair, monkeypatch):
    target, drafts = peaky_pair
    params = SamplingParams(temperature=1.0)
    exact = exact_joint(target, params)
    monkeypatch.setattr(rejection, "residual_distribution", wrong_residual)
    observed = empirical_joint(target, ModelDrafter(drafts["close"]), params, k=2)
    assert chi_square_p_value(observed, exact) < P_VALUE_FLOOR


def test_warping_matches_transformers():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(4, 50, generator=generator) * 3
    params = SamplingParams(temperature=0.7, top_k=10, top_p=0.8)
    warped = logits
    for warper in (TemperatureLogitsWarper(0.7), TopKLogitsWarper(10), TopPLogitsWarper(0.8)):
        warped = warper(None, warped)
    torch.testing.assert_close(logits_to_probs(logits, params), warped.softmax(-1))


def test_sampler_draws_each_token_with_its_probability():
    """Inverse-transform sampling: unnormalised rows, zero-probability tokens never drawn, and the
    frequencies of 200k draws pass a chi-square test against the row's distribution (and fail it
    against a slightly different one)."""
    from scipy.stats import chisquare

    from specbench.native.sampling import sample_from_probs

    weights = torch.tensor([[0.0, 3.0, 0.0, 1.0, 0.5, 0.0, 2.5, 3.0]]).repeat(200_000, 1)
    drawn = sample_from_probs(weights, torch.Generator().manual_seed(0))
    counts = torch.bincount(drawn, minlength=8).double()
    expected = weights[0].double() / weights[0].double().sum() * len(drawn)
    assert counts[weights[0] == 0].sum() == 0
    nonzero = weights[0] > 0
    assert chisquare(counts[nonzero], expected[nonzero]).pvalue > 1e-3
    skewed = expected.clone()
    skewed[1], skewed[3] = skewed[1] - 2000, skewed[3] + 2000  # 1 % of the mass moved
    assert chisquare(counts[nonzero], skewed[nonzero]).pvalue < 1e-6
