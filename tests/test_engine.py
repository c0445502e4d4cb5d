import pytest
import torch
from conftest import random_prompts, tiny_model

from specbench.native.drafters import ModelDrafter, NGramDrafter, SelfDrafter, VocabMismatchError
from specbench.native.engine import GenerationConfig, generate_autoregressive, generate_speculative
from specbench.native.forward import CausalLM, check_forward_matches
from specbench.native.sampling import SamplingParams

PROMPT_LENGTHS = {1: [11], 3: [5, 23, 12], 8: [3, 17, 9, 30, 6, 14, 21, 8]}


def repetitive_prompts(lengths, seed=0):
    """Prompts that repeat themselves, so that an n-gram lookup finds matches."""
    prompts = random_prompts([max(2, n // 3) for n in lengths], seed=seed)
    return [(p * 4)[:n] for p, n in zip(prompts, lengths)]


def make_drafter(kind, target, draft):
    if kind == "model":
        return ModelDrafter(draft)
    if kind == "self":
        return SelfDrafter(target, 2)
    return NGramDrafter(max_ngram=3)


@pytest.mark.parametrize("lean", [True, False])
@pytest.mark.parametrize("family", ["llama", "qwen2", "qwen3"])
def test_cached_forward_matches_transformers(family, lean):
    model = tiny_model(family, layers=3)
    wrapped = CausalLM.from_hf(model, lean=lean)
    assert (wrapped.lean is not None) == lean
    assert check_forward_matches(wrapped, model) < 1e-9


def test_lean_forward_fuses_projections_without_copying_weights():
    model = tiny_model("llama", layers=2)
    lean = CausalLM.from_hf(model).lean
    attention, mlp = model.model.layers[0].self_attn, model.model.layers[0].mlp
    fused_qkv, fused_gate_up = lean.layers[0].qkv.weight, lean.layers[0].gate_up.weight
    for module in (attention.q_proj, attention.k_proj, attention.v_proj):
        assert module.weight.untyped_storage().data_ptr() == fused_qkv.untyped_storage().data_ptr()
    for module in (mlp.gate_proj, mlp.up_proj):
        assert module.weight.untyped_storage().data_ptr() == fused_gate_up.untyped_storage().data_ptr()
    assert CausalLM.from_hf(model).lean is lean  # wrapping again reuses it (no second fusion)
    # transformers' own forward still reads the same (viewed) weights
    assert check_forward_matches(CausalLM.from_hf(model, lean=False), model) < 1e-9


def test_autoregressive_matches_transformers_generate(llama_target):
    prompts = random_prompts([4, 19, 10])
    ours = generate_autoregressive(llama_target, prompts, GenerationConfig(max_new_tokens=24))
    for prompt, tokens in zip(prompts, ours.tokens):
        expected = llama_target.generate(torch.tensor([prompt]), max_new_tokens=24, min_new_tokens=24,
                                         do_sample=False)[0, len(prompt):].tolist()
        assert tokens == expected


@pytest.mark.parametrize("drafter_kind", ["model", "self", "ngram"])
@pytest.mark.parametrize("k", [1, 2, 5])
@pytest.mark.parametrize("batch_size", [1, 3, 8])
def test_greedy_speculative_equals_autoregressive(llama_target, llama_draft, drafter_kind, k, batch_size):
    prompts = repetitive_prompts(PROMPT_LENGTHS[batch_size], seed=batch_size)
    config = GenerationConfig(max_new_tokens=25)
    autoregressive = generate_autoregressive(llama_target, prompts, config)
    drafter = make_drafter(drafter_kind, llama_target, llama_draft)
    speculative = generate_speculative(llama_target, drafter, prompts, config, k=k)
    assert speculative.tokens == autoregressive.tokens
    assert all(len(t) == 25 for t in speculative.tokens)
    for step in speculative.steps:
        assert all(0 <= a <= d <= k for a, d in zip(step.accepted, step.drafted))


def test_greedy_lossless_on_qwen2():
    target, draft = tiny_model("qwen2", layers=3, seed=3), tiny_model("qwen2", layers=1, seed=4)
    prompts = random_prompts([7, 15, 4, 22])
    config = GenerationConfig(max_new_tokens=20)
    expected = generate_autoregressive(target, prompts, config).tokens
    assert generate_speculative(target, ModelDrafter(draft), prompts, config, 3).tokens == expected


def test_a_draft_with_fewer_padded_rows_shares_the_targets_ids():
    """Qwen2.5-7B's embedding has 152,064 rows and its 0.5B draft's 151,936 (one tokenizer): random
    weights of such a pair (H100, 2026-11-25) are not a vocabulary mismatch: both sample and verify
    the ids they share, and greedy speculation still reproduces the target's tokens."""
    from specbench.native.loading import share_vocabulary

    target = CausalLM.from_hf(tiny_model("qwen2", layers=3, seed=3, vocab=101))
    draft = CausalLM.from_hf(tiny_model("qwen2", layers=1, seed=4, vocab=97))
    with pytest.raises(VocabMismatchError):
        ModelDrafter(draft).check_compatible(target)
    share_vocabulary(target, [draft])
    assert target.vocab_size == draft.vocab_size == 97
    prompts = random_prompts([7, 15, 4])
    config = GenerationConfig(max_new_tokens=20)
    expected = generate_autoregressive(target, prompts, config).tokens
    assert max(max(tokens) for tokens in expected) < 97
    assert generate_speculative(target, ModelDrafter(draft), prompts, config, 3).tokens == expected


def test_identical_draft_accepts_everything(llama_target):
    prompts = random_prompts([6, 13, 9])
    k = 4
    result = generate_speculative(llama_target, ModelDrafter(llama_target), prompts,
                                  GenerationConfig(max_new_tokens=31), k=k)
    for step in result.steps:
        assert step.accepted == [k] * len(step.request_ids)  # tau = K + 1 on every step
    # 1 token from the prefill, then 30 more in steps of K + 1 = 5.
    assert len(result.steps) == 6


def test_different_draft_accepts_fewer(llama_target, llama_draft):
    prompts = random_prompts([6, 13, 9])
    result = generate_speculative(llama_target, ModelDrafter(llama_draft), prompts,
                                  GenerationConfig(max_new_tokens=30), k=4)
    accepted = sum(sum(s.accepted) for s in result.steps)
    drafted = sum(sum(s.drafted) for s in result.steps)
    assert accepted < drafted


def test_row_output_does_not_depend_on_other_rows(llama_target, llama_draft):
    prompts = random_prompts([9, 4, 27, 15, 6])
    config = GenerationConfig(max_new_tokens=20)
    together = generate_speculative(llama_target, ModelDrafter(llama_draft), prompts, config, 3).tokens
    for row, prompt in enumerate(prompts):
        alone = generate_speculative(llama_target, ModelDrafter(llama_draft), [prompt], config, 3).tokens[0]
        assert alone == together[row]


def test_stop_at_eos(llama_target, llama_draft):
    prompts = random_prompts([5, 12])
    free_run = generate_autoregressive(llama_target, prompts, GenerationConfig(max_new_tokens=30)).tokens
    eos = free_run[0][6]
    config = GenerationConfig(max_new_tokens=30, stop_at_eos=True, eos_token_ids=(eos,))
    for result in (generate_autoregressive(llama_target, prompts, config),
                   generate_speculative(llama_target, ModelDrafter(llama_draft), prompts, config, 3)):
        for free, stopped in zip(free_run, result.tokens):
            cut = free.index(eos) + 1 if eos in free else len(free)
            assert stopped == free[:cut]


def test_records_and_timings(llama_target, llama_draft):
    prompts = random_prompts([5, 12, 8])
    result = generate_speculative(llama_target, ModelDrafter(llama_draft), prompts,
                                  GenerationConfig(max_new_tokens=16), 3)
    assert result.prefill_s > 0 and result.total_s >= result.steps[-1].end_s
    for tokens, times in zip(result.tokens, result.emission_s):
        assert len(times) == len(tokens) == 16
        assert times == sorted(times) and times[0] == pytest.approx(result.prefill_s)
    for step in result.steps:
        assert step.draft_s > 0 and step.verify_s > 0
        assert all(e <= a + 1 for e, a in zip(step.emitted, step.accepted))
    assert sum(sum(s.emitted) for s in result.steps) + len(prompts) == result.num_generated


def test_vocab_mismatch_is_a_clear_error(llama_target):
    other = tiny_model("llama", vocab=101)
    with pytest.raises(VocabMismatchError, match="101.*97"):
        generate_speculative(llama_target, ModelDrafter(other), [[1, 2, 3]], GenerationConfig(max_new_tokens=4), 2)


def test_invalid_arguments(llama_target):
    with pytest.raises(ValueError, match="K"):
        generate_speculative(llama_target, NGramDrafter(), [[1, 2]], GenerationConfig(max_new_tokens=4), 0)
    with pytest.raises(ValueError):
        GenerationConfig(max_new_tokens=0)
    with pytest.raises(ValueError):
        SamplingParams(temperature=-1)
    with pytest.raises(ValueError):
        SelfDrafter(llama_target, 4)  # as deep as the target


def test_sampled_runs_are_seeded(llama_target, llama_draft):
    prompts = random_prompts([5, 12])
    config = GenerationConfig(max_new_tokens=12, sampling=SamplingParams(temperature=0.8, top_p=0.9), seed=7)
    first = generate_speculative(llama_target, ModelDrafter(llama_draft), prompts, config, 3).tokens
    second = generate_speculative(llama_target, ModelDrafter(llama_draft), prompts, config, 3).tokens
    assert first == second


def test_decode_step_bytes_counts_weights_once_and_kv_per_row():
    from specbench.native.measure import copy_bandwidth, decode_step_bytes, roofline_tokens_per_s

    model = CausalLM.from_hf(tiny_model("llama", layers=2, hidden=64, dtype=torch.float32))
    element = 4
    embedding = 97 * 64 * element  # only the batch's rows of it are read
    weights = sum(p.numel() for p in model.hf_model.parameters()) * element - embedding
    kv_per_token = 2 * 2 * 2 * 16 * element  # K and V, 2 layers, 2 KV heads of dim 16
    assert decode_step_bytes(model, 1, 10) == weights + 10 * kv_per_token + 64 * element
    assert decode_step_bytes(model, 3, 10) == weights + 3 * (10 * kv_per_token + 64 * element)
    bandwidth = copy_bandwidth("cpu", 16 << 20, repeats=3)
    assert 1e8 < bandwidth < 1e13
    assert roofline_tokens_per_s(model, 3, 10, bandwidth) == pytest.approx(3 * bandwidth / decode_step_bytes(model, 3, 10))


def test_the_matmul_roof_takes_a_fraction_of_a_second_in_a_slow_dtype(monkeypatch):
    """A dtype the CPU multiplies slowly (bf16 without bf16 instructions: about 1 GFLOP/s) is timed on
    products small enough for PRODUCT_BUDGET_S, not at 1024, where seven took 16 s of every native
    sweep's start; a fast one keeps the full size. Here a product's time is stood in for: a clock
    that advances by each product's FLOP at the stood-in rate."""
    from specbench.native import measure

    sizes, elapsed, flops_per_s = [], [0.0], [1e9]
    real_mm = torch.mm

    def mm(a, b):
        sizes.append(a.shape[0])
        elapsed[0] += 2 * a.shape[0] ** 3 / flops_per_s[0]
        return real_mm(a, b)

    class StoodInClock:
        def __init__(self, device):
            pass

        def now(self):
            return elapsed[0]

    monkeypatch.setattr(measure, "Clock", StoodInClock)
    monkeypatch.setattr(torch, "mm", mm)
    rate = measure.matmul_rate("cpu", torch.float32)  # as a 1 GFLOP/s dtype: 2·256³ FLOP in 34 ms
    # three 256-products say how large fits: (0.1 s at 1 GFLOP/s) ** (1/3), in 64s
    assert rate == pytest.approx(1e9) and sizes == [256] * 3 + [320] * 7
    assert elapsed[0] < 1.0
    sizes.clear()
    flops_per_s[0] = 1e12
    measure.matmul_rate("cpu", torch.float32)
    assert sizes == [256] * 3 + [1024] * 7
    sizes.clear()
    measure.matmul_rate("cpu", torch.float32, size=128)  # a size given is the size timed
    assert sizes == [128] * 7


def test_ngram_lookup_latest_and_earliest_match():
    import numpy as np

    sequence = np.array([1, 2, 3, 9, 1, 2, 4, 7, 1, 2])
    assert NGramDrafter(max_ngram=2)._lookup(sequence, 3).tolist() == [4, 7, 1]
    assert NGramDrafter(max_ngram=2, earliest=True)._lookup(sequence, 3).tolist() == [3, 9, 1]
    assert NGramDrafter(max_ngram=2)._lookup(np.array([5, 6, 7]), 3).tolist() == []  # no earlier match


def test_earliest_ngram_drafts_what_transformers_prompt_lookup_drafts():
    """The benchmark compares engines on the same drafts: our earliest-match lookup must propose
    exactly what transformers' PromptLookupCandidateGenerator proposes."""
    import numpy as np
    from transformers.generation.candidate_generator import PromptLookupCandidateGenerator

    generator = torch.Generator().manual_seed(0)
    ours = NGramDrafter(max_ngram=2, earliest=True)
    for _ in range(200):
        sequence = torch.randint(0, 6, (1, int(torch.randint(2, 40, (1,), generator=generator))), generator=generator)
        theirs = PromptLookupCandidateGenerator(num_output_tokens=4, max_matching_ngram_size=2, max_length=1000)
        candidates, _ = theirs.get_candidates(sequence)
        expected = candidates[0, sequence.shape[1]:].tolist()
        assert ours._lookup(np.asarray(sequence[0]), 4).tolist() == expected, sequence.tolist()
