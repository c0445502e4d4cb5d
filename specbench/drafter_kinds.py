"""The kinds of drafter, each one class: what it costs a speculative step, what it holds in memory,
what it does on the host, and how an engine runs it. Every other module asks a drafter's kind
(`drafter_kind(name)`) instead of comparing its name.

A kind states, as the planner prices it:
- its forwards per step (`forwards_per_step`, `draft_ms`; MTP's layers ride in the target's own
  forward instead: `in_target_forward`), and the positions its first draft forward runs over
  (`first_draft_positions`);
- its weights and KV cache beside the target's (`draft_weight_bytes`, `draft_kv_bytes_per_token`);
- its host work (`host_drafting`: an n-gram lookup, which vLLM schedules synchronously).
And, for the engines: whether it is a checkpoint of its own (`separate_model`), whether vLLM runs
it and with what --speculative-config (`runs_on_vllm`, `vllm_config`), and which run's acceptance
measures it (`is_measured_by`).

A new kind is one class here and one line in KINDS.
"""

from __future__ import annotations

from specbench.models import lookup_alias, routed_experts
from specbench.synthetic import config_parameters

BYTES_PER_VALUE = 2  # bf16 weights and KV cache, as the kernel tables price them


def kv_bytes_per_token(config: dict, tp: int, layers: int | None = None) -> float:
    """K and V per token on one GPU: KV heads split over TP, replicated where TP exceeds them; for
    multi-head latent attention (MLA) the latent and its rotary part, held whole on every GPU."""
    config = config.get("text_config") or config
    layers = config["num_hidden_layers"] if layers is None else layers
    if config.get("kv_lora_rank"):
        return layers * (config["kv_lora_rank"] + config.get("qk_rope_head_dim", 0)) * BYTES_PER_VALUE
    heads = config["num_attention_heads"]
    kv_heads = config.get("num_key_value_heads") or heads
    head_dim = config.get("head_dim") or config["hidden_size"] // heads
    per_gpu = max(1.0, kv_heads / tp)
    return 2 * layers * per_gpu * head_dim * BYTES_PER_VALUE


def kv_bytes_per_row(config: dict, tp: int, tokens: int) -> float:
    """The KV cache of one row of `tokens` tokens on one GPU: a sliding-window layer (gpt-oss's every
    other layer) keeps its window's tokens alone, as vLLM's hybrid KV cache holds it."""
    text = config.get("text_config") or config
    window = int(text.get("sliding_window") or 0)
    types = text.get("layer_types") or []
    windowed = sum(1 for kind in types if kind == "sliding_attention") if window else 0
    per_layer = kv_bytes_per_token(config, tp, 1)
    return per_layer * ((int(text["num_hidden_layers"]) - windowed) * tokens + windowed * min(tokens, window))


class DrafterKind:
    """A kind of drafter. The defaults are a drafter with no forwards, weights or host work of its own."""

    name = ""
    # a checkpoint of its own (a draft model): loaded beside the target, at --draft-tp, with its own
    # prefill, kernel launches and graph pieces
    separate_model = False
    takes_draft_dtype = False  # its GEMMs at --draft-dtype; otherwise 16-bit
    # its layers run inside the target's forward (aiconfigurator's `nextn`): no draft forwards, K its layers
    in_target_forward = False
    # drafting is host work: its own host time each step, and vLLM schedules the step synchronously
    host_drafting = False
    alpha_needs_a_run = False  # its acceptance depends on the text: --alpha cannot stand for it
    runs_on_vllm = True
    # --weights random can build it: no checkpoint, a registry model's config, or the target's layers
    random_weights = True
    target_prefix_layers = False  # it is the target's first `layers` layers (a self-draft)

    def forwards_per_step(self, k: int) -> int:
        """Draft forwards a speculative step at K runs beside the target's verify."""
        return 0

    def first_draft_positions(self, k: int) -> int:
        """Positions a row of a step's first draft forward, as vLLM 0.32's proposers run it
        (`SpecDecodeBaseProposer.set_inputs_first_pass`): every token the target verified (K + 1:
        the last step's token and its K drafts) and one more slot for the token sampled after them
        (`DraftModelProposer`)."""
        return k + 2

    def draft_ms(self, forward, k: int, decode_ms: float, rows: int, context: float, positions: int) -> float:
        """A step's draft forwards on `forward` (the drafter's, a kernel_tables.Forward): K of
        `decode_ms` (one position a row), the first over `positions` a row."""
        return 0.0

    def ks(self, ks: list[int], layers: int) -> list[int]:
        """The K a plan prices this drafter at, of those asked."""
        return ks

    def draft_tp(self, tp: int, draft_tp: int) -> int:
        """The TP its forwards run at: the target's, or --draft-tp for a model of its own."""
        return draft_tp if self.separate_model else tp

    def draft_weight_bytes(self, drafter, target: dict, tp: int, draft_tp: int, target_bytes: float,
                           draft_bytes: float, target_weights: float = 0.0) -> float:
        """Its weights on the fullest GPU, beside the target's (`drafter`: a table_plan.Drafter;
        `target_bytes` a target weight's bytes, `target_weights` the target's weights on that GPU)."""
        return 0.0

    def draft_kv_bytes_per_token(self, drafter, target: dict, tp: int, draft_tp: int) -> float:
        """Its KV cache per token on one GPU, beside the target's."""
        return 0.0

    def is_measured_by(self, run_draft: str, drafter_name: str, family: str | None, run_family: str | None) -> bool:
        """Whether a run's draft (its model, `ngram`, `eagle`, ...) measured this drafter's acceptance."""
        return run_draft == drafter_name

    def vllm_config(self, spec, k: int, draft_model: str | None = None) -> dict:
        """vLLM's --speculative-config of `spec` (a models.DraftSpec) at K; `draft_model` replaces a
        draft model's reference (its hub id)."""
        raise ValueError(f"draft {spec.text!r} does not run on vLLM")


class OwnForwards(DrafterKind):
    """A drafter running forwards of its own: K a step, with the weights and KV cache of its config."""

    def forwards_per_step(self, k: int) -> int:
        return k

    def draft_ms(self, forward, k: int, decode_ms: float, rows: int, context: float, positions: int) -> float:
        return k * decode_ms + forward.extra_positions_ms(rows, context, positions)

    def draft_weight_bytes(self, drafter, target: dict, tp: int, draft_tp: int, target_bytes: float,
                           draft_bytes: float, target_weights: float = 0.0) -> float:
        return config_parameters(drafter.config) * draft_bytes / draft_tp if drafter.config else 0.0

    def draft_kv_bytes_per_token(self, drafter, target: dict, tp: int, draft_tp: int) -> float:
        return kv_bytes_per_token(drafter.config, draft_tp) if drafter.config else 0.0


class DraftModel(OwnForwards):
    """A smaller model of the target's family (one tokenizer): its own checkpoint, prefill and KV cache."""

    name = "model"
    separate_model = True
    takes_draft_dtype = True

    def vllm_config(self, spec, k: int, draft_model: str | None = None) -> dict:
        return {"method": "draft_model", "model": draft_model or spec.model, "num_speculative_tokens": k}

    def is_measured_by(self, run_draft: str, drafter_name: str, family: str | None, run_family: str | None) -> bool:
        ours, theirs = lookup_alias(drafter_name.partition("@")[0], family), lookup_alias(run_draft, run_family)
        return (ours is not None and theirs is not None and ours.alias == theirs.alias) or run_draft == drafter_name


class Eagle(OwnForwards):
    """An EAGLE head: one decoder layer at the target's width, with its embedding and LM head, fed the
    target's last hidden states; 16-bit, at the target's TP."""

    name = "eagle"
    random_weights = False  # a trained head's checkpoint

    def first_draft_positions(self, k: int) -> int:
        """The K + 1 tokens the target verified: the head shifts its inputs by one and needs no slot."""
        return k + 1

    # the trained heads of mixture-of-experts and MLA targets (SpecForge's EAGLE-3 configs for gpt-oss,
    # Qwen3-235B-A22B and DeepSeek-V3: github.com/sgl-project/SpecForge, configs/*-eagle3.json) are one
    # dense Llama layer at the target's width, an MLP about 6 × that width, and a 32,000-token LM head
    HEAD_MLP_WIDTH = 6
    HEAD_VOCAB = 32000

    def draft_config(self, target: dict) -> dict:
        """The head's layer: the target's own for a dense target; for a mixture-of-experts or MLA
        target, the dense layer its trained heads have (`HEAD_MLP_WIDTH`, `HEAD_VOCAB`)."""
        if self.uses_target_layer(target):
            return {**target, "num_hidden_layers": 1}
        text = target.get("text_config") or target
        hidden = int(text["hidden_size"])
        mla = bool(text.get("kv_lora_rank"))  # MLA's heads have no GQA shape: the heads' Llama layer of 128
        heads = hidden // 128 if mla else int(text["num_attention_heads"])
        return {"model_type": "llama", "architectures": ["LlamaForCausalLM"], "hidden_size": hidden,
                "num_hidden_layers": 1, "num_attention_heads": heads,
                "num_key_value_heads": 8 if mla else int(text.get("num_key_value_heads") or heads),
                "head_dim": 128 if mla else int(text.get("head_dim") or hidden // heads),
                "intermediate_size": self.HEAD_MLP_WIDTH * hidden, "vocab_size": self.HEAD_VOCAB,
                "max_position_embeddings": int(text.get("max_position_embeddings") or 131072),
                "rms_norm_eps": 1e-5, "tie_word_embeddings": False, "torch_dtype": "bfloat16"}

    @staticmethod
    def uses_target_layer(target: dict) -> bool:
        """Whether the head is one of the target's own layers: a dense target with grouped-query
        attention (for an MoE or MLA target it is the dense layer its trained heads have)."""
        text = target.get("text_config") or target
        return routed_experts(text) is None and not text.get("kv_lora_rank")

    def head_layer(self, target_name: str, target: dict | None) -> str:
        """What the head's layer is, in a few words."""
        if target is None or self.uses_target_layer(target):
            return f"1 layer of {target_name}"
        return f"1 dense layer at {target_name}'s width, as its trained heads"

    def label(self, target_name: str, target: dict | None = None) -> str:
        return f"EAGLE head: {self.head_layer(target_name, target)}"

    def vllm_config(self, spec, k: int, draft_model: str | None = None) -> dict:
        return {"method": self.name, "model": spec.model, "num_speculative_tokens": k}


class Eagle3(Eagle):
    """An EAGLE-3 head: the EAGLE head, fed three target layers' hidden states fused into one by a
    GEMM (3 × hidden → hidden, vLLM's `fc`, replicated on every GPU) over each position of the first
    draft forward."""

    name = "eagle3"
    FUSED_LAYERS = 3

    def fuse_gemm(self, hidden_size: int) -> tuple[int, int]:
        """(n, k) of the fusing GEMM's weight."""
        return hidden_size, self.FUSED_LAYERS * hidden_size

    def draft_ms(self, forward, k: int, decode_ms: float, rows: int, context: float, positions: int) -> float:
        return super().draft_ms(forward, k, decode_ms, rows, context, positions) + forward.gemm_ms(
            rows * positions, *self.fuse_gemm(forward.hidden_size))

    def draft_weight_bytes(self, drafter, target: dict, tp: int, draft_tp: int, target_bytes: float,
                           draft_bytes: float, target_weights: float = 0.0) -> float:
        n, k = self.fuse_gemm((target.get("text_config") or target)["hidden_size"])
        return super().draft_weight_bytes(drafter, target, tp, draft_tp, target_bytes, draft_bytes) \
            + n * k * BYTES_PER_VALUE

    def label(self, target_name: str, target: dict | None = None) -> str:
        return f"EAGLE-3 head: {self.head_layer(target_name, target)} over {self.FUSED_LAYERS} of its layers' features"


class Mtp(DrafterKind):
    """Multi-token prediction: N layers of the target's own, priced as aiconfigurator prices them
    (the target compiled with `nextn` N); K = N."""

    name = "mtp"
    in_target_forward = True
    random_weights = False  # the checkpoint's own MTP layers

    def vllm_config(self, spec, k: int, draft_model: str | None = None) -> dict:
        return {"method": "mtp", "num_speculative_tokens": k}

    def ks(self, ks: list[int], layers: int) -> list[int]:
        return [layers]

    def draft_weight_bytes(self, drafter, target: dict, tp: int, draft_tp: int, target_bytes: float,
                           draft_bytes: float, target_weights: float = 0.0) -> float:
        # a layer's share of the target's weights on the GPU, its embeddings and final norm left out
        # (a mixture-of-experts layer's experts spread as the target's are)
        text = target.get("text_config") or target
        outside_layers = config_parameters(target, 0) * target_bytes / tp
        return (target_weights - outside_layers) / text["num_hidden_layers"] * drafter.layers

    def draft_kv_bytes_per_token(self, drafter, target: dict, tp: int, draft_tp: int) -> float:
        return kv_bytes_per_token(target, tp, drafter.layers)


class Ngram(DrafterKind):
    """Prompt lookup: drafts from n-grams of the text so far, on the host."""

    name = "ngram"
    host_drafting = True
    alpha_needs_a_run = True

    def vllm_config(self, spec, k: int, draft_model: str | None = None) -> dict:
        return {"method": "ngram", "num_speculative_tokens": k, "prompt_lookup_max": spec.ngram,
                "prompt_lookup_min": 1}

    def is_measured_by(self, run_draft: str, drafter_name: str, family: str | None, run_family: str | None) -> bool:
        return run_draft.startswith("ngram")


class SelfDraft(DrafterKind):
    """The target's first N layers drafting for it (specbench's native engine only)."""

    name = "self"
    runs_on_vllm = False
    target_prefix_layers = True


class JsonConfig(DrafterKind):
    """A speculative config passed to vLLM as written (`json:{...}`)."""

    name = "json"
    random_weights = False  # whatever the config names

    def vllm_config(self, spec, k: int, draft_model: str | None = None) -> dict:
        import json

        config = json.loads(spec.json)
        config.setdefault("num_speculative_tokens", k)
        return config


KINDS: dict[str, DrafterKind] = {kind.name: kind for kind in (
    DraftModel(),
    Eagle(),
    Eagle3(),
    Mtp(),
    Ngram(),
    SelfDraft(),
    JsonConfig(),
)}


def drafter_kind(name: str | DrafterKind) -> DrafterKind:
    """The kind named `name` (a DraftSpec's or a table_plan.Drafter's `kind`)."""
    if isinstance(name, DrafterKind):
        return name
    try:
        return KINDS[name]
    except KeyError:
        raise ValueError(f"no drafter kind {name!r}; the kinds: {', '.join(KINDS)}") from None
