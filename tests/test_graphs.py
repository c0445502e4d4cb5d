"""Fixed-shape decode steps (the CUDA-graph path) run eagerly on CPU: same tokens as the
ragged eager path, one reused cache, padded batch buckets."""

from __future__ import annotations

import pytest
import torch
from conftest import random_prompts, tiny_model

from specbench.native.drafters import ModelDrafter, NGramDrafter, SelfDrafter
from specbench.native.engine import GenerationConfig, generate_autoregressive, generate_speculative
from specbench.native.forward import CausalLM
from specbench.native.graphs import LENGTH_QUANTUM, batch_buckets
from specbench.native.kvcache import RaggedKVCache, to_device
from specbench.native.sampling import SamplingParams

# Five rows of different lengths: buckets 1, 2, 4, 5, and rows finish at different steps.
PROMPTS = random_prompts([5, 9, 3, 12, 7], seed=3)


def static(model, length_quantum: int = LENGTH_QUANTUM) -> CausalLM:
    return CausalLM.from_hf(model).use_static_steps(capture=False, length_quantum=length_quantum)


def test_batch_buckets():
    assert batch_buckets(1) == [1]
    assert batch_buckets(4) == [1, 2, 4]
    assert batch_buckets(5) == [1, 2, 4, 5]
    assert batch_buckets(8) == [1, 2, 4, 8]


@pytest.mark.parametrize("drafter_kind", ["model", "ngram", "self"])
@pytest.mark.parametrize("k", [1, 3])
@pytest.mark.parametrize("length_quantum", [LENGTH_QUANTUM, 8])
def test_static_steps_reproduce_eager_greedy(llama_target, llama_draft, drafter_kind, k, length_quantum):
    config = GenerationConfig(max_new_tokens=20)
    expected = generate_autoregressive(llama_target, PROMPTS, config).tokens
    target = static(llama_target, length_quantum)
    assert generate_autoregressive(target, PROMPTS, config).tokens == expected
    drafter = {"model": lambda: ModelDrafter(static(llama_draft, length_quantum)), "ngram": NGramDrafter,
               "self": lambda: SelfDrafter(target, 2)}[drafter_kind]()
    result = generate_speculative(target, drafter, PROMPTS, config, k)
    assert result.tokens == expected
    # Rows finished at different steps: the verify step ran at several padded batch sizes; with a
    # quantum of 8 columns, at several attention lengths too (sequences grow from 3 to ~40).
    verify_buckets = {key[0] for key in target.static_steps._steps if key[2] == "all"}
    assert verify_buckets == {1, 2, 4, 5}
    lengths = {key[4] for key in target.static_steps._steps}
    longest = target.static_steps.cache.max_length
    assert lengths == set(range(length_quantum, longest + 1, length_quantum))
    assert len(lengths) == (1 if length_quantum == LENGTH_QUANTUM else longest // 8) and longest // 8 >= 4
    if drafter_kind == "self":
        assert drafter.model.static_steps is not None


def test_static_steps_sample_like_eager(llama_target, llama_draft):
    config = GenerationConfig(max_new_tokens=16, sampling=SamplingParams(0.8), seed=5)
    eager = generate_speculative(llama_target, ModelDrafter(llama_draft), PROMPTS, config, 3)
    fixed = generate_speculative(static(llama_target), ModelDrafter(static(llama_draft)), PROMPTS, config, 3)
    assert fixed.tokens == eager.tokens
    assert [s.accepted for s in fixed.steps] == [s.accepted for s in eager.steps]


def test_one_cache_reused_between_calls(llama_target):
    target = static(llama_target)
    config = GenerationConfig(max_new_tokens=6)
    first = generate_autoregressive(target, PROMPTS, config)
    cache, steps = target.static_steps.cache, dict(target.static_steps._steps)
    assert cache.max_length % LENGTH_QUANTUM == 0 and cache.allocated_rows == len(PROMPTS)
    again = generate_autoregressive(target, PROMPTS, config)
    assert again.tokens == first.tokens
    assert target.static_steps.cache is cache and target.static_steps._steps.keys() == steps.keys()
    generate_autoregressive(target, PROMPTS[:2], config)  # another batch: a new cache, graphs dropped
    assert target.static_steps.cache is not cache and target.static_steps.cache.allocated_rows == 2


def test_checks_on_a_separate_cache_stay_eager(llama_target):
    target = static(llama_target)
    generate_autoregressive(target, PROMPTS, GenerationConfig(max_new_tokens=4))
    shared = target.static_steps.cache
    other = target.new_cache(1, 8)
    ids = torch.tensor([[1, 2, 3]])
    assert torch.equal(target.step(other, ids), target.forward(target.new_cache(1, 8), ids))
    assert target.static_steps.cache is shared


def test_select_rows_compacts_in_place():
    cache = RaggedKVCache(num_layers=1, batch_size=3, num_kv_heads=1, head_dim=1, max_length=4,
                          dtype=torch.float32, device="cpu")
    for row in range(3):
        cache.keys[0][row] = row
    buffer = cache.keys[0]
    cache.set_lengths([1, 2, 3])
    cache.select_rows([0, 2])
    assert cache.keys[0] is buffer and cache.lengths == [1, 3]
    assert buffer[:2, 0, 0, 0].tolist() == [0.0, 2.0]


@pytest.mark.parametrize("device", ["cpu"] + (["cuda"] if torch.cuda.is_available() else []))
def test_to_device_copies_host_integers(device):
    import numpy as np

    values = np.array([[3, 1], [4, 1]])
    on_device = to_device(values, device)
    values[0, 0] = 9  # the tensor is a copy: later host writes do not reach it
    assert on_device.dtype == torch.long and on_device.device.type == device
    assert on_device.tolist() == [[3, 1], [4, 1]] and to_device([5, 6], device).tolist() == [5, 6]


def test_capture_needs_cuda(llama_target):
    with pytest.raises(ValueError, match="CUDA graphs need a CUDA device"):
        CausalLM.from_hf(llama_target).use_static_steps(capture=True)


def test_cuda_graphs_flag_needs_cuda():
    from specbench.sweep import SweepConfig, check_config
    from specbench.grid import EngineOptions

    with pytest.raises(ValueError, match="--cuda-graphs needs"):
        check_config(SweepConfig(engine=EngineOptions(cuda_graphs=True)))


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("length_quantum", [LENGTH_QUANTUM, 8])
def test_cuda_graph_replay_matches_eager(length_quantum):
    target = tiny_model("llama", layers=4, seed=0).cuda()  # float64: no greedy tie can flip
    draft = tiny_model("llama", layers=2, seed=1).cuda()
    config = GenerationConfig(max_new_tokens=20)
    expected = generate_autoregressive(target, PROMPTS, config).tokens
    graphed = CausalLM.from_hf(target).use_static_steps(length_quantum=length_quantum)
    assert generate_autoregressive(graphed, PROMPTS, config).tokens == expected
    graphed_draft = CausalLM.from_hf(draft).use_static_steps(length_quantum=length_quantum)
    result = generate_speculative(graphed, ModelDrafter(graphed_draft), PROMPTS, config, 3)
    assert result.tokens == expected
    assert graphed.static_steps.captures > 0
    assert all(s.draft_s > 0 and s.verify_s > 0 for s in result.steps)  # the draft/verify event split


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_graphs_survive_a_new_batch_size():
    """A sweep moves from batch size to batch size: the cache is reallocated, its graphs dropped,
    and the next ones captured into a fresh pool (reusing the emptied pool trips an allocator
    assert, seen on an H100)."""
    target = tiny_model("llama", layers=2, seed=0).cuda()
    config = GenerationConfig(max_new_tokens=12)
    graphed = CausalLM.from_hf(target).use_static_steps()
    for prompts in (PROMPTS[:1], PROMPTS, PROMPTS[:2], PROMPTS[:1]):
        expected = generate_autoregressive(target, prompts, config).tokens
        assert generate_autoregressive(graphed, prompts, config).tokens == expected


def test_a_shorter_request_reuses_the_longer_cache(llama_target):
    target = static(llama_target)
    long_cache = target.decode_cache(2, 3 * LENGTH_QUANTUM)
    assert target.decode_cache(2, 2 * LENGTH_QUANTUM - 5) is long_cache  # fits, at most 2x longer
    assert target.decode_cache(2, 10) is not long_cache  # far shorter: attention would cover too much


def test_fixed_shape_step_logits_equal_the_ragged_forward(llama_target):
    """Step by step over several length buckets (quantum 8) and a shrinking batch: the logits of
    a fixed-shape step equal the ragged forward's (float64), for 1-token and 3-token steps."""
    eager, fixed = CausalLM.from_hf(llama_target), static(llama_target, length_quantum=8)
    prompts = random_prompts([5, 11, 2], seed=4)
    caches = [eager.new_cache(3, 64), fixed.decode_cache(3, 64)]
    width = max(map(len, prompts))
    ids = torch.tensor([p + [0] * (width - len(p)) for p in prompts])
    for model, cache in zip((eager, fixed), caches):
        model.forward(cache, ids, logits_at="last", num_valid=torch.tensor([len(p) for p in prompts]))
        cache.set_lengths([len(p) for p in prompts])
    generator = torch.Generator().manual_seed(1)
    for step in range(14):
        if step == 7:  # a request finishes: the batch shrinks to rows 0 and 2
            for cache in caches:
                cache.select_rows([0, 2])
        tokens = 1 if step % 2 else 3
        new = torch.randint(0, 97, (caches[0].batch_size, tokens), generator=generator)
        expected = eager.forward(caches[0], new, logits_at="all")
        got = fixed.step(caches[1], new, logits_at="all")
        torch.testing.assert_close(got, expected, rtol=0, atol=1e-10)
        for cache in caches:
            cache.set_lengths([n + tokens for n in cache.lengths])
