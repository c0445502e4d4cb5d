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

from specbench.models import (
    ModelNotAvailable, attention_parameters, lookup_alias, mlp_parameters, routed_experts, shipped_hub_config,
)


def shipped_config(reference: str, family: str | None = None) -> tuple[str, dict]:
    """(name, config dict), no download: a registry alias, a bare size inside `family` or a registry
    model's hub id (its config shipped with specbench, named by the alias), or another hub id whose
    config aiconfigurator-core ships (named by the hub id)."""
    spec = lookup_alias(reference, family)
    if spec is not None:
        text = resources.files("specbench").joinpath("configs", f"{spec.alias}.json").read_text()
        return spec.alias, json.loads(text)
    shipped = shipped_hub_config(reference)
    if shipped is not None:
        return shipped
    raise ModelNotAvailable(f"no config for {reference!r} is shipped: --weights random takes an alias "
                            f"(`specbench models` lists them) or a Hugging Face id whose config aiconfigurator-core "
                            f"ships (zai-org/GLM-5, Qwen/Qwen3-VL-8B-Instruct, ...)")


def config_parameters(config: dict, num_layers: int | None = None, active: bool = False) -> int:
    """Parameter count of a decoder's config (embeddings counted once when tied), every routed and
    shared expert of a mixture-of-experts config counted, or with `active` the parameters a token
    uses: all but the routed experts it does not take (`mlp_parameters`). A model's next-token
    (MTP) layers are not counted: published sizes leave them out."""
    config = config.get("text_config") or config
    hidden, all_layers = config["hidden_size"], config["num_hidden_layers"]
    # an MoE's experts spread over its layers
    layer = attention_parameters(config) + 2 * hidden + mlp_parameters(config, active) / all_layers
    embeddings = config["vocab_size"] * hidden * (1 if config.get("tie_word_embeddings") else 2)
    layers = all_layers if num_layers is None else num_layers
    return int(layers * layer) + embeddings + hidden


def random_model_record(name: str, config: dict, built_layers: int) -> dict:
    """What run.json records of a model built with random weights: the layers built of all, its
    parameters in all and active a token (at full depth), and a mixture of experts' experts."""
    moe = routed_experts(config)
    record = {"model": name, "layers_built": built_layers,
              "layers_full": int((config.get("text_config") or config)["num_hidden_layers"]),
              "parameters": config_parameters(config), "active_parameters": config_parameters(config, active=True),
              "mixture_of_experts": None}
    if moe is not None:
        record["mixture_of_experts"] = {"experts": moe.experts, "experts_per_token": moe.per_token,
                                        "expert_intermediate": moe.intermediate,
                                        "shared_intermediate": moe.shared_intermediate, "moe_layers": moe.moe_layers}
    return record


def describe_random_model(record: dict) -> str:
    """One line of a `random_model_record`, after the model's name."""
    moe = record.get("mixture_of_experts")
    experts = (f"mixture of experts: {moe['experts']} experts, top-{moe['experts_per_token']}, in "
               f"{moe['moe_layers']} layers{' with shared experts' if moe['shared_intermediate'] else ''}; "
               f"{record['parameters'] / 1e9:.3g}B parameters, {record['active_parameters'] / 1e9:.3g}B active a token"
               if moe else f"dense, {record['parameters'] / 1e9:.3g}B parameters")
    return f"{record['layers_built']} of {record['layers_full']} layers built; {experts}"


def random_model_lines(meta: dict) -> list[str]:
    """A run's models built with random weights (run.json `random_weights`), a line each."""
    records = meta.get("random_weights") or {}
    named = ([(f"target {records['target']['model']}", records["target"])] if records.get("target") else []) + \
        [(f"draft {label}" + (f" ({record['model']})" if record["model"] != label else ""), record)
         for label, record in (records.get("drafts") or {}).items()]
    scaled = " (step times scaled to full depth)"
    return [f"random weights, {role}: {describe_random_model(record)}"
            + (scaled if record["layers_built"] < record["layers_full"] else "") for role, record in named]


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
