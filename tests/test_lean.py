"""The lean forward (specbench.native.lean) against transformers', with the packed CPU weights."""

import pytest
import torch
from conftest import random_prompts, tiny_model

from specbench.native.drafters import ModelDrafter, SelfDrafter
from specbench.native.engine import GenerationConfig, generate_autoregressive, generate_speculative
from specbench.native.forward import CausalLM, check_forward_matches
from specbench.native.lean import Projection, can_pack
from specbench.native.runner import lossless_check
from specbench.native.sampling import SamplingParams

packing = pytest.mark.skipif(not can_pack(torch.zeros(1)), reason="this torch build has no oneDNN packed weights")


@packing
def test_packed_projection_agrees_with_the_dense_one_and_few_rows_can_stay_dense():
    torch.manual_seed(0)
    weight, bias = torch.randn(96, 64), torch.randn(96)
    projection = Projection(weight, bias, pack=True)
    assert projection.packed is not None and projection.packed_bytes() == weight.numel() * 4
    for shape in [(1, 1, 64), (8, 1, 64), (4, 3, 64), (2, 40, 64)]:
        x = torch.randn(shape)
        assert torch.allclose(projection(x), torch.nn.functional.linear(x, weight, bias), atol=1e-4)
    assert 0 <= projection.dense_max_rows <= Projection.DENSE_MAX_ROWS  # measured on this CPU
    projection.dense_max_rows = 3
    for few_rows in (torch.randn(1, 1, 64), torch.randn(1, 3, 64)):  # where dense measured faster: dense
        assert torch.equal(projection(few_rows), torch.nn.functional.linear(few_rows, weight, bias))
    assert Projection(weight.double(), pack=True).packed is None  # oneDNN has no float64


@packing
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_float32_lean_forward_with_packed_weights_matches_transformers(family):
    model = tiny_model(family, layers=3, dtype=torch.float32)
    wrapped = CausalLM.from_hf(model)
    assert wrapped.lean.head.packed is not None and wrapped.lean.packed_bytes() > 0
    assert check_forward_matches(wrapped, model, tokens=24, atol=1e-4) < 1e-4


@packing
@pytest.mark.parametrize("drafter", ["model", "self"])
def test_float32_speculative_decoding_stays_lossless_with_packed_weights(drafter):
    """Verify passes (several rows) run on the packed weights and autoregressive steps of one row
    on the dense ones: greedy speculative output must still be the baseline's, up to numerical
    near-ties, which the lossless check tells apart."""
    target = CausalLM.from_hf(tiny_model("llama", layers=4, seed=0, dtype=torch.float32))
    draft = ModelDrafter(tiny_model("llama", layers=2, seed=1, dtype=torch.float32)) if drafter == "model" \
        else SelfDrafter(target, 2)
    prompts = random_prompts([5, 23, 12, 9])
    config = GenerationConfig(max_new_tokens=20)
    for batch in ([prompts[0]], prompts):
        baseline = generate_autoregressive(target, batch, config)
        speculative = generate_speculative(target, draft, batch, config, k=3)
        status, detail = lossless_check(target, batch, baseline.tokens, speculative.tokens)
        assert status in ("exact", "near-tie"), detail


@packing
def test_sampled_generation_runs_on_packed_weights():
    target = CausalLM.from_hf(tiny_model("llama", layers=2, seed=0, dtype=torch.float32))
    config = GenerationConfig(max_new_tokens=12, sampling=SamplingParams(temperature=0.8), seed=3)
    result = generate_speculative(target, SelfDrafter(target, 1), random_prompts([6, 11]), config, 2)
    assert all(len(t) == 12 for t in result.tokens)


def test_prefill_groups_rows_of_similar_length():
    from specbench.shapes import prefill_groups

    assert prefill_groups([7]) == [slice(0, 1)]
    assert prefill_groups([3, 3, 3, 3]) == [slice(0, 4)]
    assert prefill_groups([39, 45, 50, 52, 60, 61, 70, 95]) == [slice(0, 2), slice(2, 4), slice(4, 7), slice(7, 8)]
    assert prefill_groups([0, 0, 5]) == [slice(0, 2), slice(2, 3)]  # a draft with nothing to feed yet
    for lengths in ([1, 100], [5, 9, 9, 30, 31, 200]):
        groups = prefill_groups(lengths)
        assert [i for g in groups for i in range(len(lengths))[g]] == list(range(len(lengths)))
        for group in groups:
            part = lengths[group]
            assert len(part) == 1 or len(part) * max(part) <= 1.1 * sum(part)


def test_grouped_prefill_gives_each_row_what_it_gets_alone():
    """Prompts of very different lengths: the batched run (rows ordered by length, prefilled in
    groups) gives every request exactly its unbatched tokens, in the order the prompts came."""
    target = CausalLM.from_hf(tiny_model("llama", layers=3, seed=2))
    prompts = random_prompts([40, 3, 17, 41, 2, 90, 18], seed=5)
    config = GenerationConfig(max_new_tokens=9)
    batched = generate_autoregressive(target, prompts, config)
    assert batched.prompt_lengths == [len(p) for p in prompts]
    for prompt, tokens in zip(prompts, batched.tokens):
        assert generate_autoregressive(target, [prompt], config).tokens[0] == tokens
    draft = ModelDrafter(tiny_model("llama", layers=1, seed=3))
    assert generate_speculative(target, draft, prompts, config, k=2).tokens == batched.tokens
