"""Forward shapes as plain numbers and functions (no torch): a decoder's shapes from its config
(`Architecture`), and the native engine's own (length buckets, dense rows, prefill groups).

The native engine runs with these; it records its numbers in run.json (`engine_shapes`), and the
judge prices a run's forwards from what the run recorded (`recorded_shapes`), these defaults only
for runs older than that record. So the judge never imports the engine."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace

import numpy as np

from specbench.models import routed_experts

DTYPE_BYTES = {"float32": 4, "fp32": 4, "bfloat16": 2, "bf16": 2, "float16": 2, "fp16": 2, "float64": 8}

LENGTH_QUANTUM = 256  # CUDA-graph steps: cache columns in multiples of this, so batches share a cache
DENSE_MAX_ROWS = 3  # CPU projections: the most rows the dense product is ever chosen for (else packed)
PREFILL_PADDING = 0.1  # the share of padded positions a prefill group may compute


def prefill_groups(lengths: list[int], padding: float = PREFILL_PADDING) -> list[slice]:
    """Consecutive rows, grouped while padding them to their longest costs at most `padding` of
    the group's real tokens. The engine orders a batch's rows by prompt length, so groups are
    rows of similar length; a batch of equal lengths is one group. Measured on SmolLM2-135M (2
    CPU cores, 32 chat prompts of 39-95 tokens): 2.1 s in groups against 2.8 s padded to the
    longest and 3.2 s row by row."""
    groups, start = [], 0
    for end in range(1, len(lengths) + 1):
        if end == len(lengths) or (end + 1 - start) * max(lengths[start:end + 1]) > \
                (1 + padding) * sum(lengths[start:end + 1]):
            groups.append(slice(start, end))
            start = end
    return groups


def engine_shapes() -> dict:
    """The native engine's shape numbers, as a run records them (run.json: engine.forward_shapes)."""
    return {"length_quantum": LENGTH_QUANTUM, "dense_max_rows": DENSE_MAX_ROWS}


def recorded_shapes(meta: dict) -> dict:
    """The shape numbers a run's engine recorded; the current defaults for runs before the record."""
    return engine_shapes() | ((meta.get("engine") or {}).get("forward_shapes") or {})


@dataclass(frozen=True)
class Architecture:
    """What a decoder's forward reads and computes, from its config. A mixture of experts keeps
    its routed experts apart (`experts` > 0): each MoE layer routes a token to `experts_per_token`
    of `experts` MLPs of width `expert_intermediate`, beside shared experts of width
    `shared_intermediate` and a router; its other `layers - moe_layers` layers keep one MLP of
    width `intermediate`."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    bytes_per_parameter: int
    experts: int = 0
    experts_per_token: int = 0
    expert_intermediate: int = 0
    shared_intermediate: int = 0
    moe_layers: int = 0

    @classmethod
    def from_config(cls, config: dict, dtype: str) -> "Architecture":
        config = config.get("text_config") or config
        if config.get("kv_lora_rank"):  # its cache and attention are not the heads' shapes below
            raise ValueError(f"{config.get('model_type', 'this model')}'s multi-head latent attention "
                             f"(kv_lora_rank {config['kv_lora_rank']}) has no shape here")
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        moe = routed_experts(config)
        routed = dict(experts=moe.experts, experts_per_token=moe.per_token, expert_intermediate=moe.intermediate,
                      shared_intermediate=moe.shared_intermediate, moe_layers=moe.moe_layers) if moe else {}
        return cls(layers=int(config["num_hidden_layers"]), hidden=hidden, heads=heads,
                   kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or hidden // heads),
                   intermediate=int(config.get("intermediate_size") or 0), vocab=int(config["vocab_size"]),
                   tied_embeddings=bool(config.get("tie_word_embeddings")),
                   bytes_per_parameter=DTYPE_BYTES.get(str(dtype).replace("torch.", ""), 2), **routed)

    @classmethod
    def from_dict(cls, values: dict) -> "Architecture":
        # shapes recorded before the experts' fields were are dense
        return cls(**{key: values[key] for key in cls.__dataclass_fields__ if key in values})

    def to_dict(self) -> dict:
        return asdict(self)

    def with_layers(self, layers: int) -> "Architecture":
        """The first `layers` layers (a self-draft's); a mixture of experts' dense layers come
        first (DeepSeek's first_k_dense_replace)."""
        dense = self.layers - self.moe_layers
        return replace(self, layers=layers, moe_layers=max(0, layers - dense) if self.experts else 0)

    @property
    def is_moe(self) -> bool:
        return self.experts > 0

    def describe_experts(self) -> str:
        return (f"{self.experts} experts, top-{self.experts_per_token}, in {self.moe_layers} of {self.layers} layers"
                + (", shared experts" if self.shared_intermediate else "")) if self.is_moe else "dense"

    @property
    def _attention_parameters(self) -> int:
        return 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim

    @property
    def expert_parameters(self) -> int:
        """One routed expert's gated MLP."""
        return 3 * self.hidden * self.expert_intermediate

    def _mlp_parameters(self, routed: float) -> float:
        """Every layer's MLP weights with `routed` routed experts counted in each MoE layer."""
        dense = (self.layers - self.moe_layers) * 3 * self.hidden * self.intermediate
        if not self.is_moe:
            return dense
        per_layer = routed * self.expert_parameters + 3 * self.hidden * self.shared_intermediate \
            + self.hidden * self.experts  # the router
        return dense + self.moe_layers * per_layer

    @property
    def layer_parameters(self) -> int:
        """A layer's parameters that one position multiplies (of a mixture of experts: its top-k
        experts, averaged over the layers)."""
        mlp = self._mlp_parameters(self.experts_per_token) / self.layers if self.layers else 0
        return int(self._attention_parameters + mlp + 2 * self.hidden)

    @property
    def linear_parameters(self) -> int:
        """Parameters every position multiplies: the layers and the output head."""
        return self.layers * self.layer_parameters + self.vocab * self.hidden

    @property
    def weight_bytes(self) -> int:
        """Every weight a forward may read: the layers (every expert), the head and the final norm
        (the input embedding only at the batch's rows, unless it is the head too)."""
        return int(self.weights_read(float("inf")))

    def distinct_experts(self, tokens):
        """The expected routed experts a layer reads for `tokens` tokens routed in one forward,
        each its top-k of E, routing uniform: E·(1 − (1 − k/E)^T) (specbench.fit.experts)."""
        tokens = np.asarray(tokens, float)
        if not self.is_moe:
            return np.zeros_like(tokens)
        return self.experts * (1.0 - (1.0 - self.experts_per_token / self.experts) ** tokens)

    def weights_read(self, tokens):
        """Bytes of weights a forward of `tokens` positions (rows x positions) reads: all of a
        dense model's; of a mixture of experts, the routed experts its tokens choose and the rest."""
        fixed = (self.layers * (self._attention_parameters + 2 * self.hidden) + self._mlp_parameters(0)
                 + self.vocab * self.hidden + self.hidden)
        routed = self.moe_layers * self.distinct_experts(tokens) * self.expert_parameters
        return (fixed + routed) * self.bytes_per_parameter

    @property
    def kv_bytes_per_token(self) -> int:
        return 2 * self.layers * self.kv_heads * self.head_dim * self.bytes_per_parameter

    def linear_flops(self, rows, positions):
        return 2.0 * self.linear_parameters * np.asarray(rows, float) * np.asarray(positions, float)

    def kv_bytes(self, rows, context):
        return np.asarray(rows, float) * np.asarray(context, float) * self.kv_bytes_per_token

    def attention_flops(self, rows, positions, context):
        return (4.0 * self.layers * self.heads * self.head_dim * np.asarray(rows, float)
                * np.asarray(positions, float) * np.asarray(context, float))
