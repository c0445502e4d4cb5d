"""A vLLM engine step's time on its host, outside the model's kernels: what the kernel tables (GPU
time) do not hold. With synchronous scheduling the GPU waits for it every step; with async
scheduling (vLLM's default on a GPU since v0.14, never for n-gram drafting) it runs beside the GPU's
step, which then takes the longer of the two."""

from __future__ import annotations

from dataclasses import asdict, dataclass


@dataclass(frozen=True)
class HostCost:
    """Scheduling a step, preparing its inputs and booking its tokens, in ms: linear in the step's
    running requests, the new requests it admits and their prompt tokens."""

    intercept_ms: float
    per_running_row_ms: float
    per_new_request_ms: float
    per_prompt_token_ms: float

    def ms(self, running_rows: int, new_requests: int = 0, prompt_tokens: int = 0) -> float:
        return (self.intercept_ms + self.per_running_row_ms * running_rows + self.per_new_request_ms * new_requests
                + self.per_prompt_token_ms * prompt_tokens)


# vLLM 0.32's engine core (its GPUModelRunner's host path, run by its CPU build) on this project's
# 2-core AMD EPYC VM, measured by benchmarks/fleet-2026-11-27/host_step.py (host_step.json; a test
# holds the two equal). A GPU server's host CPU and vLLM version differ; this is the one measured.
VLLM_HOST_STEP = HostCost(intercept_ms=0.742, per_running_row_ms=0.0240, per_new_request_ms=0.0233,
                          per_prompt_token_ms=0.000149)
VLLM_HOST_STEP_SOURCE = ("vLLM 0.32's engine core on a 2-core AMD EPYC VM "
                         "(specbench's benchmarks/fleet-2026-11-27/host_step.md)")


def described(host: HostCost | None) -> dict | None:
    """What --json says of the host time a plan priced: its terms and where they were measured."""
    if host is None:
        return None
    return {**asdict(host), "measured": VLLM_HOST_STEP_SOURCE if host == VLLM_HOST_STEP else "given"}


def served_step_ms(kernels_ms: float, host_ms: float, async_scheduling: bool) -> float:
    """A step's time from its kernels' and its host's: the longer with async scheduling, else both."""
    return max(kernels_ms, host_ms) if async_scheduling else kernels_ms + host_ms
