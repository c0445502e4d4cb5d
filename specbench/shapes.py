"""Forward shapes as plain numbers and functions (no torch): a decoder's shapes from its config
(`Architecture`), and the native engine's own (length buckets, dense rows, prefill groups).

The native engine runs with these; it records its numbers in run.json (`engine_shapes`), and the
judge prices a run's forwards from what the run recorded (`recorded_shapes`), these defaults only
for runs older than that record. So the judge never imports the engine."""

from __future__ import annotations

from dataclasses import asdict, dataclass

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
    """What a decoder's forward reads and computes, from its config."""

    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    vocab: int
    tied_embeddings: bool
    bytes_per_parameter: int

    @classmethod
    def from_config(cls, config: dict, dtype: str) -> "Architecture":
        if (moe := routed_experts(config)) is not None:  # its forward reads a step's experts, not one MLP
            raise ValueError(f"a mixture-of-experts model ({moe.describe()}) has no dense shape")
        hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
        return cls(layers=int(config["num_hidden_layers"]), hidden=hidden, heads=heads,
                   kv_heads=int(config.get("num_key_value_heads") or heads),
                   head_dim=int(config.get("head_dim") or hidden // heads),
                   intermediate=int(config["intermediate_size"]), vocab=int(config["vocab_size"]),
                   tied_embeddings=bool(config.get("tie_word_embeddings")),
                   bytes_per_parameter=DTYPE_BYTES.get(str(dtype).replace("torch.", ""), 2))

    @classmethod
    def from_dict(cls, values: dict) -> "Architecture":
        return cls(**{key: values[key] for key in cls.__dataclass_fields__})

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def layer_parameters(self) -> int:
        attention = 2 * self.hidden * self.heads * self.head_dim + 2 * self.hidden * self.kv_heads * self.head_dim
        return attention + 3 * self.hidden * self.intermediate + 2 * self.hidden

    @property
    def linear_parameters(self) -> int:
        """Parameters every position multiplies: the layers and the output head."""
        return self.layers * self.layer_parameters + self.vocab * self.hidden

    @property
    def weight_bytes(self) -> int:
        """Read once per forward: the layers, the head and the final norm (the input embedding
        only at the batch's rows, unless it is the head too)."""
        return (self.linear_parameters + self.hidden) * self.bytes_per_parameter

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
