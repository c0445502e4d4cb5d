"""Where a cell ran: a column set of every row of the cells table (node, host, the GPUs it used,
driver, torch and engine versions), so that no speed-up is ever taken across two machines' kinds."""

from __future__ import annotations

import os
import socket

from specbench import __version__
from specbench.results import cpu_name


def visible_gpus() -> tuple[list[tuple[str, str]], str]:
    """([(model, uuid)] of the GPUs this process may use (CUDA_VISIBLE_DEVICES: indices or UUIDs),
    the driver version); ([], "") without NVML."""
    try:
        import pynvml

        pynvml.nvmlInit()
    except Exception:
        return [], ""

    def text(value) -> str:
        return value.decode() if isinstance(value, bytes) else str(value)

    handles = [pynvml.nvmlDeviceGetHandleByIndex(i) for i in range(pynvml.nvmlDeviceGetCount())]
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None:
        by_uuid = {text(pynvml.nvmlDeviceGetUUID(h)): h for h in handles}
        chosen = []
        for entry in (e.strip() for e in visible.split(",") if e.strip()):
            if entry.isdigit() and int(entry) < len(handles):
                chosen.append(handles[int(entry)])
            elif entry in by_uuid or f"GPU-{entry}" in by_uuid:
                chosen.append(by_uuid.get(entry) or by_uuid[f"GPU-{entry}"])
        handles = chosen
    gpus = [(text(pynvml.nvmlDeviceGetName(h)), text(pynvml.nvmlDeviceGetUUID(h))) for h in handles]
    return gpus, text(pynvml.nvmlSystemGetDriverVersion())


def used_gpus(engine_name: str, device: str) -> tuple[list[tuple[str, str]], str]:
    """The GPUs a cell measured here runs on: none on a CPU run or an endpoint (its server's are its
    own); the native engine's --device; a vLLM server's visible GPUs."""
    if device == "cpu" or engine_name == "endpoint":
        return [], ""
    gpus, driver = visible_gpus()
    if engine_name == "native":
        indices = [int(d.split(":")[1]) if ":" in d else 0 for d in device.split(",")]
        gpus = [gpus[i] for i in indices if i < len(gpus)]
    return gpus, driver


def where_columns(engine, node_id: str = "local") -> dict:
    """The placement columns of the rows `engine` measures in this process."""
    import torch

    name = getattr(engine, "name", "")
    gpus, driver = used_gpus(name, engine.config.engine.device)
    models = sorted({model for model, _ in gpus})
    if name == "endpoint":
        model = "endpoint"
    else:
        model = ",".join(models) if models else f"no GPU ({cpu_name()})"
    version = getattr(engine, "version", "") or (f"specbench {__version__}" if name == "native" else "")
    return {"node_id": node_id, "host": socket.gethostname(), "gpu_model": model,
            "gpu_uuids": ",".join(uuid for _, uuid in gpus), "gpu_driver": driver,
            "torch_version": torch.__version__, "engine_version": str(version)}
