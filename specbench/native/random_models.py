"""Random-weight models for the native engine (timing-only runs), acceptance drawn at a chosen
rate, and full-depth estimates from a layer subset when a model does not fit."""

from __future__ import annotations

from dataclasses import dataclass

import torch

from specbench.native.drafters import Proposal
from specbench.native.forward import CausalLM
from specbench.native.rejection import Acceptance
from specbench.native.sampling import SamplingParams, logits_to_probs, sample_from_probs
from specbench.synthetic import config_parameters, shipped_config


@dataclass
class RandomModel:
    model: CausalLM
    alias: str
    full_layers: int  # the real model's depth
    built_layers: int  # the depth actually built (fewer when only a subset fits)

    @property
    def is_subset(self) -> bool:
        return self.built_layers < self.full_layers


def build_random_model(alias: str, dtype: torch.dtype, device: str | list[str], family: str | None = None,
                       num_layers: int | None = None, seed: int = 0) -> RandomModel:
    """The architecture of `alias` with random weights (N(0, 0.02)), optionally only its first
    `num_layers` decoder layers (plus embedding and head); on one device, or spread over a list
    of devices in contiguous blocks of layers."""
    from transformers import AutoConfig, AutoModelForCausalLM

    from specbench.native.placement import dispatch, layer_device_map

    devices = [device] if isinstance(device, str) else list(device)
    name, raw = shipped_config(alias, family)
    config = AutoConfig.for_model(**raw)
    full = config.num_hidden_layers
    if num_layers is not None:
        config.num_hidden_layers = max(1, min(num_layers, full))
    config._attn_implementation = "sdpa"
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config, dtype=dtype)
    device_map = layer_device_map(model, devices) if len(devices) > 1 else {"": devices[0]}
    for module_name, target_device in device_map.items():
        (model.get_submodule(module_name) if module_name else model).to_empty(device=target_device)
    generators: dict[torch.device, torch.Generator] = {}
    with torch.no_grad():
        for module_name, parameter in model.named_parameters():
            if "norm" in module_name:
                parameter.fill_(1.0)
            elif module_name.endswith("bias"):
                parameter.zero_()
            else:
                if parameter.device not in generators:
                    generators[parameter.device] = torch.Generator(device=parameter.device).manual_seed(seed)
                parameter.normal_(0.0, 0.02, generator=generators[parameter.device])
    # Buffers (rotary inverse frequencies) are not parameters: rebuild that module for real.
    decoder = model.get_decoder()
    decoder.rotary_emb = type(decoder.rotary_emb)(config=model.config).to(devices[0])
    model.tie_weights()
    if len(devices) > 1:
        model = dispatch(model, device_map, force_hooks=True)
    model.eval()
    return RandomModel(CausalLM.from_hf(model, name=f"{name} (random weights)"), name, full, config.num_hidden_layers)


def unsupported_attention(config: dict) -> str | None:
    """Why the native engine's cache (per-head keys and values, one full causal mask for every
    layer) cannot run a config's attention as the model does; None where it can."""
    config = config.get("text_config") or config
    if config.get("kv_lora_rank"):
        return f"multi-head latent attention (kv_lora_rank {config['kv_lora_rank']}: one latent cached a token)"
    kinds = sorted(set(config.get("layer_types") or []) - {"full_attention"})
    if kinds:
        return f"{', '.join(kinds)} layers"
    if config.get("sliding_window") and config.get("use_sliding_window", True):
        return f"sliding-window attention ({config['sliding_window']} tokens)"
    if config.get("attention_chunk_size"):
        return f"chunked attention ({config['attention_chunk_size']} tokens)"
    return None


def layers_that_fit(config: dict, dtype: torch.dtype, budget_bytes: float, minimum: int = 2) -> int:
    """The most decoder layers (of config's) whose weights fit in `budget_bytes`."""
    bytes_per = torch.finfo(dtype).bits // 8
    head = config_parameters(config, 0) * bytes_per
    per_layer = (config_parameters(config, 1) - config_parameters(config, 0)) * bytes_per
    return max(minimum, min(config["num_hidden_layers"], int((budget_bytes - head) // per_layer)))


# --- acceptance at a chosen rate ---------------------------------------------------------------

def synthetic_acceptance(profile: tuple[float, ...]):
    """An AcceptFn for `generate_speculative` that keeps position i with probability
    profile[i] until the first rejection; the next token is the target's argmax there."""

    def accept(proposal: Proposal, target_logits: torch.Tensor, params: SamplingParams,
               generator: torch.Generator | None) -> Acceptance:
        batch_size, positions = target_logits.shape[0], target_logits.shape[1] - 1
        rates = torch.tensor([profile[min(i, len(profile) - 1)] for i in range(positions)],
                             device=target_logits.device)
        uniform = torch.rand((batch_size, positions), generator=generator, device=target_logits.device)
        drafted = torch.arange(positions, device=target_logits.device)[None, :] < proposal.lengths[:, None]
        keep = (uniform < rates[None, :]) & drafted
        accepted = keep.long().cumprod(dim=-1).sum(dim=-1)
        rows = torch.arange(batch_size, device=target_logits.device)
        if params.greedy:
            return Acceptance(accepted, target_logits[rows, accepted].argmax(dim=-1))
        # The same warping and sampling work as the real rejection sampler does.
        probs = logits_to_probs(target_logits, params)
        return Acceptance(accepted, sample_from_probs(probs[rows, accepted], generator))

    return accept


# --- models larger than the device: time a layer subset, scale by depth -------------------------

class LayerScaler:
    """Estimates a full-depth model's forward time from a subset of its layers.

    A forward costs embedding + final norm + head (T0) plus the decoder layers; the subset's
    layer part (T_sub - T0) scales with depth: T_full = T0 + (T_sub - T0) * full / built. T0 and
    T_sub are timed as bare forwards at each (batch, tokens) shape the run uses."""

    def __init__(self, model: CausalLM, full_layers: int, context: int, repeats: int = 5) -> None:
        self.model = model
        self.full_layers = full_layers
        self.built_layers = model.config.num_hidden_layers
        self.context = context
        self.repeats = repeats
        self.head_only = model.truncated(0, allow_zero=True)
        self._factors: dict[tuple[int, int], float] = {}

    def _time(self, model: CausalLM, batch: int, tokens: int) -> float:
        from specbench.native.measure import time_forward

        return time_forward(model, batch, tokens, self.context, self.repeats)

    def factor(self, batch: int, tokens: int) -> float:
        key = (batch, tokens)
        if key not in self._factors:
            subset = self._time(self.model, batch, tokens)
            head = min(self._time(self.head_only, batch, tokens), subset)
            full = head + (subset - head) * self.full_layers / self.built_layers
            self._factors[key] = full / subset
        return self._factors[key]


def rescale_result(result, target_factor, draft_factor=None):
    """A GenerationResult whose target phases (prefill, verify) and, if given, draft phases are
    multiplied by the estimated full-depth factors, with the timeline (emission times, step
    ends) rebuilt from the scaled phases."""
    import dataclasses

    batch = len(result.tokens)
    prompt = max(result.prompt_lengths)
    clock = result.prefill_s * target_factor(batch, prompt)
    emission = [[clock] for _ in result.tokens]
    prefill = clock
    draft_prefill = result.draft_prefill_s * (draft_factor(batch, prompt) if draft_factor and result.draft_prefill_s else 1.0)
    clock += draft_prefill
    steps = []
    for step in result.steps:
        rows = len(step.request_ids)
        draft_s = step.draft_s * (draft_factor(rows, 1) if draft_factor and step.draft_s else 1.0)
        verify_s = step.verify_s * target_factor(rows, step.verify_tokens)
        clock += draft_s + verify_s
        for request, count in zip(step.request_ids, step.emitted):
            emission[request].extend([clock] * count)
        clock += step.overhead_s
        steps.append(dataclasses.replace(step, draft_s=draft_s, verify_s=verify_s, end_s=clock))
    emission = [times[: len(tokens)] for times, tokens in zip(emission, result.tokens)]
    return dataclasses.replace(result, emission_s=emission, steps=steps, prefill_s=prefill,
                               draft_prefill_s=draft_prefill, total_s=clock)
