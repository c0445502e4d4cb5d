"""Dollars: default GPU prices and the cost of 1M output tokens."""

from __future__ import annotations

import numpy as np

# On-demand $/GPU-hour defaults, to override with --gpu-price: H100 and A100 from Vidur's table
# (early 2024); the others are typical cloud list prices of 2024-2025. Prices move; pass yours.
GPU_PRICES_PER_HOUR = {"H200": 5.00, "H100": 4.25, "A100-80GB": 2.21, "A100": 2.21, "L40S": 1.80,
                       "L4": 0.80, "A10G": 1.01}



def default_gpu_price(hardware: dict) -> tuple[float | None, str]:
    """(price per GPU-hour, which GPU) from run.json's hardware, or (None, reason) on a CPU."""
    gpus = hardware.get("gpus") or []
    if not gpus:
        return None, "CPU run: pass --gpu-price (price per machine-hour) for dollars"
    name = gpus[0]["name"].upper().replace(" ", "")
    for key, price in GPU_PRICES_PER_HOUR.items():
        if key.replace("-", "") in name.replace("-", ""):
            return price, key
    return None, f"no default price for {gpus[0]['name']}: pass --gpu-price"


def tables_gpu_price(system: str, given: float | None) -> tuple[float | None, str]:
    """(price per GPU-hour, where it came from) for a kernel-table system (`h100_sxm`): `given`
    (--gpu-price), else the GPU's default price, else None and why."""
    if given is not None:
        return given, "given"
    return default_gpu_price({"gpus": [{"name": system.replace("_", " ")}]})


def cost_per_million(tokens_per_s: float | np.ndarray, price_per_hour: float | None, devices: int = 1):
    """$ per 1M output tokens, or device-hours per 1M tokens when no price is known."""
    hours = 1e6 / (np.asarray(tokens_per_s, dtype=float) * 3600) * devices
    return hours * price_per_hour if price_per_hour is not None else hours

