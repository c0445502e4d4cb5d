"""One forward pass of a causal LM over a RaggedKVCache.

`CausalLM` holds a transformers decoder and its output head. Calling the decoder and the head
separately lets a pass compute logits only where they are needed (the last real token of each
ragged row in a prefill or a draft step; all positions in a verify step).
"""

from __future__ import annotations

import copy
from typing import Literal

import torch

from specbench.shapes import prefill_groups
from specbench.native.graphs import LENGTH_QUANTUM, StaticSteps
from specbench.native.kvcache import RaggedKVCache
from specbench.native.lean import LeanDecoder, packing_fits, supports_lean

# Architectures whose logits are exactly head(decoder(x)) with full causal attention everywhere.
# Others may work; `check_forward_matches` tells.
KNOWN_GOOD_MODEL_TYPES = {"llama", "qwen2", "qwen3", "mistral", "granite"}


class CausalLM:
    def __init__(self, decoder: torch.nn.Module, head: torch.nn.Module, config, name: str = "") -> None:
        self.decoder = decoder
        self.head = head
        self.config = config
        self.name = name or getattr(config, "_name_or_path", "") or config.model_type
        self.attention = getattr(config, "_attn_implementation", None) or "sdpa"
        # Set when draft and target share a tokenizer but pad their output layers differently.
        self.vocab_limit: int | None = None
        self.hf_model: torch.nn.Module | None = None  # the transformers model, when built from one
        self.static_steps: StaticSteps | None = None  # fixed-shape decode steps (CUDA graphs)
        self.lean: LeanDecoder | None = None  # specbench's own forward of the decoder, where it has one

    @classmethod
    def from_hf(cls, model: torch.nn.Module, name: str = "", lean: bool = True) -> "CausalLM":
        """Wrap a transformers causal LM. `lean` (default): run the decoder with specbench's lean
        forward when the architecture has one (specbench.native.lean); else transformers' own."""
        model.eval()
        wrapped = cls(model.get_decoder(), model.get_output_embeddings(), model.config, name=name)
        wrapped.hf_model = model
        if lean and supports_lean(wrapped.decoder, model.config):
            # Built once per model: building fuses its projection weights in place.
            if getattr(model, "_specbench_lean", None) is None:
                # Normal tensors even when first wrapped inside inference mode: the fused weights
                # replace the model's own, which may later run outside it.
                with torch.inference_mode(False), torch.no_grad():
                    pack = wrapped.device.type == "cpu" and packing_fits(model)
                    model._specbench_lean = LeanDecoder(wrapped.decoder, model.config, wrapped.head, pack=pack)
            wrapped.use_lean(model._specbench_lean)
        return wrapped

    def use_lean(self, lean: LeanDecoder | None) -> "CausalLM":
        self.lean = lean
        if lean is not None:
            self.attention = "sdpa"  # the lean forward takes a boolean mask
        return self

    @classmethod
    def wrap(cls, model: "CausalLM | torch.nn.Module") -> "CausalLM":
        return model if isinstance(model, CausalLM) else cls.from_hf(model)

    def truncated(self, num_layers: int, allow_zero: bool = False) -> "CausalLM":
        """The first `num_layers` decoder layers with the final norm and head: an early-exit
        draft sharing every weight with this model (no extra memory). Zero layers (embedding,
        norm and head only) serves timing estimates."""
        total = self.config.num_hidden_layers
        lowest = 0 if allow_zero else 1
        if not lowest <= num_layers < total:
            raise ValueError(f"self-draft needs {lowest} <= N < {total} layers (the target has {total}), got {num_layers}")
        config = copy.deepcopy(self.config)
        config.num_hidden_layers = num_layers
        if getattr(config, "layer_types", None):
            config.layer_types = list(config.layer_types)[:num_layers]
        decoder = copy.copy(self.decoder)
        decoder._modules = dict(self.decoder._modules)
        decoder.layers = torch.nn.ModuleList(list(self.decoder.layers)[:num_layers])
        decoder.config = config
        draft = CausalLM(decoder, self.head, config, name=f"{self.name}[:{num_layers} layers]")
        draft.vocab_limit = self.vocab_limit
        draft.attention = self.attention
        if self.lean is not None:
            draft.use_lean(self.lean.truncated(num_layers, decoder, config))
        if self.static_steps is not None:
            draft.use_static_steps(self.static_steps.capture, length_quantum=self.static_steps.length_quantum)
        return draft

    def use_static_steps(self, capture: bool | None = None, length_quantum: int = LENGTH_QUANTUM) -> "CausalLM":
        """Run decode steps (`step`) at fixed shapes over one reused cache, replayed from CUDA
        graphs when `capture` (default: on CUDA); cache and attention lengths in multiples of
        `length_quantum` columns. See specbench.native.graphs."""
        capture = self.device.type == "cuda" if capture is None else capture
        self.static_steps = StaticSteps(self, capture, length_quantum)
        return self

    @property
    def vocab_size(self) -> int:
        return self.vocab_limit or self.head.weight.shape[0]

    @property
    def device(self) -> torch.device:
        return self.head.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.head.weight.dtype

    def parameter_bytes(self) -> int:
        seen: set[int] = set()
        total = 0
        for module in (self.decoder, self.head):
            for parameter in module.parameters():
                if id(parameter) not in seen:
                    seen.add(id(parameter))
                    total += parameter.numel() * parameter.element_size()
        return total

    def kv_heads_and_dim(self) -> tuple[int, int]:
        """Key/value heads per layer and their size: what one cached position holds per layer."""
        config = self.config
        num_heads = config.num_attention_heads
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // num_heads
        return getattr(config, "num_key_value_heads", None) or num_heads, head_dim

    def new_cache(self, batch_size: int, max_length: int) -> RaggedKVCache:
        num_kv_heads, head_dim = self.kv_heads_and_dim()
        return RaggedKVCache(
            num_layers=self.config.num_hidden_layers,
            batch_size=batch_size,
            num_kv_heads=num_kv_heads,
            head_dim=head_dim,
            max_length=max_length,
            dtype=self.dtype,
            device=self.device,
            layer_devices=self.layer_devices(),
        )

    def decode_cache(self, batch_size: int, max_length: int) -> RaggedKVCache:
        """The cache a generation decodes into: with static steps, the model's one reused cache
        (length rounded up); otherwise a new one."""
        if self.static_steps is not None:
            return self.static_steps.cache_for(batch_size, max_length)
        return self.new_cache(batch_size, max_length)

    def devices(self) -> list[torch.device]:
        """Every device holding a weight of this model (several when it is spread)."""
        found: list[torch.device] = []
        for parameter in list(self.decoder.parameters()) + list(self.head.parameters()):
            if parameter.device not in found:
                found.append(parameter.device)
        return found

    def layer_devices(self) -> list[torch.device] | None:
        """Each decoder layer's device when the model is spread over several, else None."""
        devices = [next(layer.parameters()).device for layer in self.decoder.layers]
        return devices if len(set(devices)) > 1 else None

    def forward(
        self,
        cache: RaggedKVCache,
        input_ids: torch.Tensor,  # [B, T]
        logits_at: Literal["all", "last"] = "all",
        num_valid: torch.Tensor | None = None,  # [B]: real tokens per row (right-padded input)
        rows: slice = slice(None),  # the cache rows input_ids belong to (default: all)
    ) -> torch.Tensor:
        """Append input_ids to every row of the cache (the caller then commits lengths) and
        return logits: [B, T, V] for "all", [B, V] at each row's last real token for "last"."""
        positions, mask = cache.prepare(input_ids.shape[1], self.attention, rows)
        return self.logits_for(cache, input_ids, positions, mask, logits_at, num_valid)

    def prefill(self, cache: RaggedKVCache, tokens: torch.Tensor, lengths: list[int]) -> torch.Tensor:
        """Feed each row's first lengths[b] tokens of `tokens` [B, >= max(lengths)] into an empty
        cache and commit them; returns the logits [B, V] at each row's last one. Rows go in
        groups of consecutive rows of similar length (see `prefill_groups`), so that short
        prompts are not padded to the longest one's length."""
        logits = []
        for group in prefill_groups(lengths):
            width = max(lengths[group])
            if width == 0:  # a draft fed nothing yet (a one-token prompt): no logits to read
                logits.append(torch.zeros(len(lengths[group]), self.vocab_size, dtype=self.dtype, device=tokens.device))
                continue
            logits.append(self.forward(cache, tokens[group, :width], logits_at="last", rows=group,
                                       num_valid=torch.tensor(lengths[group], device=tokens.device)))
        cache.set_lengths(lengths)
        return torch.cat(logits) if len(logits) > 1 else logits[0]

    def step(
        self,
        cache: RaggedKVCache,
        input_ids: torch.Tensor,  # [B, T], T small: a decode, draft or verify step
        logits_at: Literal["all", "last"] = "all",
        num_valid: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """`forward` for a decode step: the same result, from a fixed-shape (graph-replayed)
        step when static steps are on. With them, the returned logits are only valid until the
        model's next step."""
        if self.static_steps is not None:
            return self.static_steps.run(cache, input_ids, logits_at, num_valid)
        return self.forward(cache, input_ids, logits_at, num_valid)

    def logits_for(self, cache: RaggedKVCache, input_ids: torch.Tensor, positions: torch.Tensor,
                   mask: torch.Tensor, logits_at: str, num_valid: torch.Tensor | None) -> torch.Tensor:
        """The decoder and head over a cache already bound to `positions` and `mask`."""
        if self.lean is not None:
            hidden = self.lean(input_ids, positions, mask, cache)
        else:
            hidden = self.decoder(
                input_ids=input_ids,
                position_ids=positions,
                attention_mask=mask,
                past_key_values=cache,
                use_cache=True,
            ).last_hidden_state
        if logits_at == "last":
            if num_valid is None:
                hidden = hidden[:, -1]
            else:
                rows = torch.arange(hidden.shape[0], device=hidden.device)
                hidden = hidden[rows, num_valid - 1]
        logits = self.lean.head(hidden) if self.lean is not None else self.head(hidden)
        return logits[..., : self.vocab_limit] if self.vocab_limit else logits


def check_forward_matches(model: CausalLM, reference: torch.nn.Module, tokens: int = 12, atol: float = 1e-3) -> float:
    """Largest |logit| difference between our cached ragged path and transformers' own forward
    on a short sequence; raises when it exceeds atol (an architecture this engine cannot run)."""
    generator = torch.Generator().manual_seed(0)
    ids = torch.randint(0, model.vocab_size, (1, tokens), generator=generator).to(model.device)
    with torch.inference_mode():
        expected = reference(input_ids=ids, use_cache=False).logits.float()
        cache = model.new_cache(1, tokens + 4)
        first = model.forward(cache, ids[:, : tokens // 2])
        cache.set_lengths([tokens // 2])
        second = model.forward(cache, ids[:, tokens // 2 :])
        ours = torch.cat([first, second], dim=1).float()
    error = (ours - expected).abs().max().item()
    scale = expected.abs().max().item()
    if error > atol * max(1.0, scale):
        raise ValueError(
            f"{model.name}: cached forward differs from transformers by {error:.3g} "
            f"(model_type={model.config.model_type}); this architecture is not supported"
        )
    return error
