"""Timing without the weights: real architectures with random weights, acceptance at a chosen rate.

This module holds what every engine shares (the shipped configs, acceptance profiles); the native
engine builds the random models in specbench.native.random_models, the vLLM engine loads the same
configs with `--load-format dummy`.

Step times depend on shapes, dtype, batch size and context length, not on weight values; the
acceptance rate depends on the models and the data, not on the hardware. So a model built from
its config with random weights runs the same kernels in the same time as the real one, and
`synthetic_acceptance` replaces the accept/reject decision (meaningless between random models)
by draws at a chosen rate. The loop does exactly the work a real run would at that rate:
the same drafting, verification and cache rollback.
"""

from __future__ import annotations

import json
import math
from importlib import resources

from specbench.models import REGISTRY, ModelNotAvailable, lookup_alias, mlp_parameters


def shipped_config(alias: str, family: str | None = None) -> tuple[str, dict]:
    """(alias, config dict) of a registry model, shipped with specbench (no download)."""
    spec = lookup_alias(alias, family)
    if spec is None:
        raise ModelNotAvailable(f"--weights random needs a registry alias (got {alias!r}); aliases: "
                                f"{', '.join(sorted(REGISTRY))}")
    text = resources.files("specbench").joinpath("configs", f"{spec.alias}.json").read_text()
    return spec.alias, json.loads(text)


def config_parameters(config: dict, num_layers: int | None = None) -> int:
    """Parameter count of a Llama/Qwen2-style config (embeddings counted once when tied), every
    routed and shared expert of a mixture-of-experts config counted."""
    config = config.get("text_config") or config
    hidden, heads = config["hidden_size"], config["num_attention_heads"]
    kv_heads, head_dim = config["num_key_value_heads"], config.get("head_dim") or hidden // heads
    attention = hidden * heads * head_dim * 2 + 2 * hidden * kv_heads * head_dim
    if config["model_type"] == "qwen2":
        attention += heads * head_dim + 2 * kv_heads * head_dim  # q, k, v biases
    all_layers = config["num_hidden_layers"]
    layer = attention + 2 * hidden + mlp_parameters(config) / all_layers  # an MoE's experts spread over its layers
    embeddings = config["vocab_size"] * hidden * (1 if config.get("tie_word_embeddings") else 2)
    layers = all_layers if num_layers is None else num_layers
    return int(layers * layer) + embeddings + hidden


# --- acceptance at a chosen rate ---------------------------------------------------------------

def parse_alpha(text: str) -> tuple[float, ...]:
    """"0.8" (i.i.d.) or "0.9/0.8/0.7" (per position: the probability that position i is
    accepted given that positions before it were; the last value repeats)."""
    try:
        values = tuple(float(v) for v in text.split("/"))
    except ValueError:
        raise ValueError(f"--alpha: {text!r} is not a number or a / separated profile") from None
    if not values or any(not 0 <= v <= 1 or math.isnan(v) for v in values):
        raise ValueError(f"--alpha values must be in [0, 1], got {text!r}")
    return values


def expected_acceptance(profile: tuple[float, ...], k: int) -> tuple[float, float]:
    """(accepted / drafted, tau) that `profile` gives at K drafts per step."""
    reach = 1.0
    accepted = 0.0
    for position in range(k):
        reach *= profile[min(position, len(profile) - 1)]
        accepted += reach
    return accepted / k, 1 + accepted
