"""Where a model's weights go when one device is not enough: contiguous blocks of decoder layers
on several devices (pipeline style, one device busy at a time), with accelerate's hooks moving
the hidden state from block to block. The KV cache follows: each layer's keys and values live on
that layer's device (see `CausalLM.new_cache`)."""

from __future__ import annotations

import torch


def parse_devices(device: str) -> list[str]:
    """`cpu`, `cuda`, `cuda:N`, or a comma list of CUDA devices to spread the target over."""
    devices = [d.strip() for d in device.split(",") if d.strip()]
    if not devices:
        raise ValueError("--device is empty")
    for name in devices:
        if not (name == "cpu" or name == "cuda" or (name.startswith("cuda:") and name[5:].isdigit())):
            raise ValueError(f"--device must be cpu, cuda, cuda:N or a list cuda:0,cuda:1,…; got {name!r}")
    if len(devices) > 1 and "cpu" in devices:
        raise ValueError("--device lists several devices to spread the target over: name CUDA devices only")
    return devices


def _decoder_prefix(hf_model: torch.nn.Module) -> str:
    decoder = hf_model.get_decoder()
    return next(name for name, module in hf_model.named_modules() if module is decoder)


def layer_device_map(hf_model: torch.nn.Module, devices: list[str], shares: list[float] | None = None) -> dict[str, str]:
    """A device map for `hf_model` (accelerate's / from_pretrained's format) that gives each device a
    contiguous block of decoder layers, sized by `shares` (e.g. free memory; equal by default).
    The embedding and whatever else the decoder holds go with the first block; the final norm
    and the head with the last, unless the head is tied to the embedding (then the first)."""
    prefix = _decoder_prefix(hf_model)
    decoder = hf_model.get_decoder()
    num_layers = len(decoder.layers)
    shares = shares or [1.0] * len(devices)
    total = sum(shares)
    bounds, running = [], 0.0
    for share in shares:
        running += share
        bounds.append(round(num_layers * running / total))
    device_map: dict[str, str] = {}
    start = 0
    for device, end in zip(devices, bounds):
        for index in range(start, end):
            device_map[f"{prefix}.layers.{index}"] = device
        start = end
    for name, _ in decoder.named_children():
        if name != "layers":
            device_map[f"{prefix}.{name}"] = devices[-1] if "norm" in name else devices[0]
    output = hf_model.get_output_embeddings()
    tied = output.weight is hf_model.get_input_embeddings().weight
    for name, module in hf_model.named_children():
        if module is output:
            device_map[name] = devices[0] if tied else devices[-1]
    return device_map


def dispatch(hf_model: torch.nn.Module, device_map: dict[str, str], force_hooks: bool = False) -> torch.nn.Module:
    """Move every block to its device and hook it so inputs follow (accelerate.dispatch_model)."""
    from accelerate import dispatch_model

    return dispatch_model(hf_model, device_map, force_hooks=force_hooks)


def free_bytes(device: str) -> float:
    """Free memory of a CUDA device, or the RAM available to this process."""
    if device.startswith("cuda"):
        return float(torch.cuda.mem_get_info(torch.device(device))[0])
    import psutil

    return float(psutil.virtual_memory().available)


def memory_budget(device: str) -> float:
    """Bytes of weights a run may place on `device`: most of its free memory, or of the free RAM."""
    return free_bytes(device) * (0.8 if device.startswith("cuda") else 0.6)


def free_memory_shares(devices: list[str]) -> list[float]:
    return [free_bytes(d) for d in devices]


def _bare_cuda_on_several_gpus(devices: list[str]) -> bool:
    return devices == ["cuda"] and torch.cuda.is_available() and torch.cuda.device_count() > 1


def placement_devices(device: str, model_bytes: int) -> list[str]:
    """The devices a model of `model_bytes` goes on: those named, or with a bare `cuda` on a
    machine with several GPUs, all of them when it does not fit in the first's memory budget."""
    devices = parse_devices(device)
    if _bare_cuda_on_several_gpus(devices):
        if model_bytes > memory_budget("cuda:0"):
            return [f"cuda:{index}" for index in range(torch.cuda.device_count())]
    return devices


def may_spread(device: str) -> bool:
    """Whether `device` could place one model on several devices (worth sizing the model first)."""
    devices = parse_devices(device)
    return len(devices) > 1 or _bare_cuda_on_several_gpus(devices)
