"""A lean decoder forward for Llama-family models, in the style of gpt-fast.

transformers' decoder spends a decode step on a CPU mostly outside its matrix products: per layer
it launches three projections for q, k and v, two for gate and up, a seven-operation RMSNorm
twice, rotary embeddings for q and k separately, mask handling and Python dispatch through
several module layers. At batch 1 on a small model that is about a third of the step. This
forward computes the same function with fewer, larger operations:

- q, k and v come from one fused projection, gate and up from another (the transformers modules'
  weights become views into the fused matrices, so no weight is held twice);
- RMSNorm is one `torch.nn.functional.rms_norm` (in float32, as transformers computes it); rotary embeddings are applied to q and k at once;
- attention is one `scaled_dot_product_attention` over the ragged cache under the engine's
  boolean mask, with grouped-query heads folded into the query rows (no repeated keys);
- on a CPU, projections run on weights packed once in oneDNN's blocked layout (`Projection`),
  where MKL's dense small-M products stream the weights badly; at one to three rows the dense
  product serves where it measured faster on this CPU.

Logits agree with transformers' to float rounding (fused products sum in another order);
`check_forward_matches` bounds the difference when a model is loaded. Architectures outside
`LEAN_MODEL_TYPES`, other activations, or models spread over several devices keep
transformers' forward.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from specbench.shapes import DENSE_MAX_ROWS

LEAN_MODEL_TYPES = {"llama", "qwen2", "qwen3", "mistral"}


def supports_lean(decoder: torch.nn.Module, config) -> bool:
    """Llama-family decoders with SiLU gating, full causal attention in every layer, on one device."""
    if config.model_type not in LEAN_MODEL_TYPES or getattr(config, "hidden_act", "silu") != "silu":
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    if any(kind != "full_attention" for kind in getattr(config, "layer_types", None) or []):
        return False
    layers = getattr(decoder, "layers", None)
    if not layers or not hasattr(decoder, "rotary_emb") or not hasattr(decoder, "norm"):
        return False
    devices = {p.device for p in decoder.parameters()}
    return len(devices) == 1 and all(
        hasattr(layer, "self_attn") and hasattr(layer.self_attn, "q_proj") and hasattr(layer, "mlp")
        and hasattr(layer.mlp, "gate_proj") for layer in layers)


def _fuse(modules: list[torch.nn.Linear]) -> tuple[torch.Tensor, torch.Tensor | None]:
    """One weight (and bias) for several projections of the same input; the modules' own
    parameters become views into it, so memory is not doubled."""
    weight = torch.cat([m.weight.detach() for m in modules])
    biases = [m.bias for m in modules]
    bias = None
    if any(b is not None for b in biases):
        bias = torch.cat([b.detach() if b is not None else weight.new_zeros(m.weight.shape[0])
                          for m, b in zip(modules, biases)])
    start = 0
    for module in modules:
        rows = module.weight.shape[0]
        module.weight.data = weight[start:start + rows]
        if module.bias is not None:
            module.bias.data = bias[start:start + rows]
        start += rows
    return weight, bias


def packing_fits(model: torch.nn.Module) -> bool:
    """Whether packed copies of a CPU model's weights (as many bytes again) fit comfortably: in a
    third of the memory available now. A large model keeps its dense weights only."""
    import psutil

    weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
    return weight_bytes < psutil.virtual_memory().available / 3


def can_pack(weight: torch.Tensor) -> bool:
    """Whether oneDNN can hold this weight packed: CPU builds with it, float32 (bfloat16 where
    the CPU has AVX512-BF16)."""
    if weight.device.type != "cpu" or not torch.backends.mkldnn.is_available():
        return False
    if weight.dtype == torch.bfloat16:
        return torch.ops.mkldnn._is_mkldnn_bf16_supported()
    return weight.dtype == torch.float32


class Projection:
    """y = x W^T + b. On a CPU, W is also held packed in oneDNN's blocked layout, used for inputs
    of more rows than `dense_max_rows`. Which is faster at a few rows depends on the CPU, so it is
    measured once per weight shape: on SmolLM2-135M's weights (2 cores, float32) an Intel Xeon
    took 22.8 ms dense against 26.1 packed over every projection at 2 rows, while an AMD EPYC took
    91 against 44 µs on the fused q/k/v weight at 2 rows and was faster packed even at one row;
    from 4 rows packed wins on both (MKL's small-M products stream the weight badly). The packed
    copy costs as much memory as the weight (the measured peak includes it)."""

    PACK_HINT = 32  # rows oneDNN tunes the layout for; measured flat from 8 to 32 rows
    DENSE_MAX_ROWS = DENSE_MAX_ROWS  # the most rows the dense product is ever chosen for (specbench.shapes)
    _dense_limits: dict = {}  # (shape, dtype) -> rows up to which the dense product was faster here

    def __init__(self, weight: torch.Tensor, bias: torch.Tensor | None = None, pack: bool = False) -> None:
        self.weight, self.bias = weight, bias
        self.packed = None
        self.dense_max_rows = self.DENSE_MAX_ROWS
        if pack and can_pack(weight):
            try:
                self.packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), self.PACK_HINT)
            except RuntimeError:  # a oneDNN build without this layout: the dense weight serves
                self.packed = None
        if self.packed is not None:
            key = (tuple(weight.shape), weight.dtype)
            if key not in Projection._dense_limits:
                Projection._dense_limits[key] = self._measure_dense_limit()
            self.dense_max_rows = Projection._dense_limits[key]

    def _packed(self, x: torch.Tensor) -> torch.Tensor:
        return torch.ops.mkldnn._linear_pointwise(x, self.packed, self.bias, "none", [], "")

    def _measure_dense_limit(self, repeats: int = 5, calls: int = 10) -> int:
        """Rows (0 to DENSE_MAX_ROWS) up to which the dense product beat the packed one, each
        row count timed as the best of `repeats` x `calls` products."""
        import time

        def best(product, x) -> float:
            product(x)
            times = []
            for _ in range(repeats):
                started = time.perf_counter()
                for _ in range(calls):
                    product(x)
                times.append(time.perf_counter() - started)
            return min(times)

        limit = 0
        with torch.inference_mode():
            for rows in range(1, self.DENSE_MAX_ROWS + 1):
                x = torch.randn(rows, self.weight.shape[1], dtype=self.weight.dtype)
                if best(lambda v: F.linear(v, self.weight, self.bias), x) >= best(self._packed, x):
                    break
                limit = rows
        return limit

    def __call__(self, x: torch.Tensor) -> torch.Tensor:
        if self.packed is None or x.numel() <= self.dense_max_rows * x.shape[-1]:
            return F.linear(x, self.weight, self.bias)
        return self._packed(x)

    def packed_bytes(self) -> int:
        return self.weight.numel() * self.weight.element_size() if self.packed is not None else 0


@dataclass
class LeanLayer:
    input_norm: torch.Tensor
    qkv: Projection
    q_norm: torch.Tensor | None  # Qwen3's per-head norms
    k_norm: torch.Tensor | None
    o: Projection
    post_norm: torch.Tensor
    gate_up: Projection
    down: Projection

    @classmethod
    def from_hf(cls, layer: torch.nn.Module, pack: bool) -> "LeanLayer":
        attn, mlp = layer.self_attn, layer.mlp
        q_norm = getattr(attn, "q_norm", None)
        k_norm = getattr(attn, "k_norm", None)
        return cls(layer.input_layernorm.weight, Projection(*_fuse([attn.q_proj, attn.k_proj, attn.v_proj]), pack),
                   q_norm.weight if q_norm is not None else None, k_norm.weight if k_norm is not None else None,
                   Projection(attn.o_proj.weight, attn.o_proj.bias, pack), layer.post_attention_layernorm.weight,
                   Projection(*_fuse([mlp.gate_proj, mlp.up_proj]), pack),
                   Projection(mlp.down_proj.weight, mlp.down_proj.bias, pack))

    def projections(self) -> list[Projection]:
        return [self.qkv, self.o, self.gate_up, self.down]


def _rms_norm(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """transformers' Llama RMSNorm: normalised in float32, cast back, then scaled."""
    if x.dtype == torch.float32 and weight.dtype == torch.float32:
        return F.rms_norm(x, (x.shape[-1],), weight, eps)
    return weight * F.rms_norm(x.float(), (x.shape[-1],), eps=eps).to(x.dtype)


def _rotate(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotary embedding on the last dimension (transformers' rotate_half convention)."""
    half = x.shape[-1] // 2
    rotated = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rotated * sin


class LeanDecoder:
    """Callable like the engine calls transformers' decoder: hidden states [B, T, hidden] after
    the final norm, for `input_ids` at `positions` over the cache, under `mask` [B, 1, T, visible]
    (boolean, True = attend)."""

    def __init__(self, decoder: torch.nn.Module, config, head: torch.nn.Module | Projection,
                 layers: list[LeanLayer] | None = None, pack: bool = True) -> None:
        self.decoder = decoder
        self.layers = layers if layers is not None else [LeanLayer.from_hf(layer, pack) for layer in decoder.layers]
        self.head = head if isinstance(head, Projection) else Projection(head.weight, head.bias, pack)
        self.num_heads = config.num_attention_heads
        self.num_kv_heads = getattr(config, "num_key_value_heads", None) or self.num_heads
        self.head_dim = getattr(config, "head_dim", None) or config.hidden_size // self.num_heads
        self.eps = config.rms_norm_eps
        self.scale = decoder.layers[0].self_attn.scaling if len(decoder.layers) else self.head_dim ** -0.5

    def truncated(self, num_layers: int, decoder: torch.nn.Module, config) -> "LeanDecoder":
        return LeanDecoder(decoder, config, self.head, self.layers[:num_layers])

    def packed_bytes(self) -> int:
        """Memory of the packed weight copies (0 off CPU)."""
        return sum(p.packed_bytes() for layer in self.layers for p in layer.projections()) + self.head.packed_bytes()

    def __call__(self, input_ids: torch.Tensor, positions: torch.Tensor, mask: torch.Tensor, cache) -> torch.Tensor:
        batch, width = input_ids.shape
        heads, kv_heads, dim = self.num_heads, self.num_kv_heads, self.head_dim
        groups = heads // kv_heads
        hidden = self.decoder.embed_tokens(input_ids)
        cos, sin = self.decoder.rotary_emb(hidden, position_ids=positions)  # [B, T, D]
        cos, sin = cos[:, :, None, :], sin[:, :, None, :]
        # Grouped-query attention without repeating keys: the `groups` query heads that share a
        # key head become extra query rows of it, so the mask repeats once per group.
        mask = mask.expand(batch, 1, width, mask.shape[-1])
        if groups > 1:
            mask = mask[:, :, None].expand(batch, 1, groups, width, mask.shape[-1]).reshape(
                batch, 1, groups * width, mask.shape[-1])
        q_size, kv_size = heads * dim, kv_heads * dim
        for index, layer in enumerate(self.layers):
            x = _rms_norm(hidden, layer.input_norm, self.eps)
            qkv = layer.qkv(x)
            if layer.q_norm is not None:
                q = _rms_norm(qkv[..., :q_size].unflatten(-1, (heads, dim)), layer.q_norm, self.eps)
                k = _rms_norm(qkv[..., q_size:q_size + kv_size].unflatten(-1, (kv_heads, dim)), layer.k_norm, self.eps)
                q, k = _rotate(q, cos, sin), _rotate(k, cos, sin)
            else:
                qk = _rotate(qkv[..., :q_size + kv_size].unflatten(-1, (heads + kv_heads, dim)), cos, sin)
                q, k = qk[:, :, :heads], qk[:, :, heads:]
            v = qkv[..., q_size + kv_size:].unflatten(-1, (kv_heads, dim))
            keys, values = cache.update(k.transpose(1, 2), v.transpose(1, 2), index)
            # [B, T, H, D] -> [B, Hkv, groups * T, D]: query head h = kv * groups + g.
            q = q.view(batch, width, kv_heads, groups, dim).permute(0, 2, 3, 1, 4).reshape(
                batch, kv_heads, groups * width, dim)
            attended = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask, scale=self.scale)
            attended = attended.view(batch, kv_heads, groups, width, dim).permute(0, 3, 1, 2, 4).reshape(
                batch, width, q_size)
            hidden = hidden + layer.o(attended)
            x = _rms_norm(hidden, layer.post_norm, self.eps)
            gate, up = layer.gate_up(x).chunk(2, dim=-1)
            hidden = hidden + layer.down(F.silu(gate) * up)
        return self.decoder.norm(hidden)
