"""Tiny randomly initialised transformers models, built in the test process."""

from __future__ import annotations

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM


def tiny_model(
    family: str = "llama",
    layers: int = 2,
    seed: int = 0,
    vocab: int = 97,
    hidden: int = 64,
    dtype: torch.dtype = torch.float64,
    logit_scale: float = 1.0,
) -> torch.nn.Module:
    """float64 by default so that greedy ties cannot flip between batched and unbatched math."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  tie_word_embeddings=False)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    else:
        raise ValueError(family)
    model.config._attn_implementation = "sdpa"
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    return model.to(dtype).eval()


def random_prompts(lengths: list[int], vocab: int = 97, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture(scope="session")
def llama_target():
    return tiny_model("llama", layers=4, seed=0)


@pytest.fixture(scope="session")
def llama_draft():
    return tiny_model("llama", layers=2, seed=1)
