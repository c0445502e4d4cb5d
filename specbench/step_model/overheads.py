"""The one place a step's kernel time becomes a served step's: CUDA-graph handling (a launch floor
outside graphs, graph pieces' time per layer), the host's time per step, the multiprocess
executor's at TP > 1, and a host-drafting proposer's own work, overlapped with the kernels under
async scheduling or after them. The static planner's step (`static_tables.StaticTablesStep`) and the
replica's tables step (`mixed_tables.MixedTablesStep`) compose them here."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterable

from specbench.drafter_kinds import DrafterKind
from specbench.fit.host_cost import (
    COMPILED_LAUNCH,
    MULTIPROC_EXECUTOR_STEP,
    NGRAM_HOST_STEP,
    PIECEWISE_LAYER_MS,
    VLLM_HOST_STEP,
    HostCost,
    LaunchCost,
    SpeculationHostCost,
    check_cudagraph_mode,
    graph_bound_ms,
    served_step_ms,
)


@dataclass(frozen=True)
class Overheads:
    """What a served engine adds to a step's kernels; each cost None (or 0) adds nothing. The
    defaults are vLLM's on a GPU as measured (specbench/data/measured.json)."""

    host: HostCost | None = VLLM_HOST_STEP  # the host's time per step
    launch: LaunchCost | None = COMPILED_LAUNCH  # launching a step's kernels outside CUDA graphs
    speculation_host: SpeculationHostCost | None = NGRAM_HOST_STEP  # a host-drafting proposer's own work
    executor: HostCost | None = MULTIPROC_EXECUTOR_STEP  # vLLM's multiprocess executor at TP > 1
    cudagraph_mode: str = "FULL_AND_PIECEWISE"  # which steps replay CUDA graphs
    piecewise_layer_ms: float = PIECEWISE_LAYER_MS  # a layer of a step replayed as graph pieces
    # the host's time overlaps the kernels' (vLLM's default on a GPU); a host-drafting kind
    # schedules synchronously whatever this says, as vLLM turns async scheduling off for it
    async_scheduling: bool = True

    def __post_init__(self) -> None:
        check_cudagraph_mode(self.cudagraph_mode)

    def launch_ms(self, forwards: Iterable[tuple[int, int]]) -> float:
        """The host's launch of every kernel of the given forwards, (layers, TP) each: the floor of
        a step outside CUDA graphs."""
        if self.launch is None:
            return 0.0
        return sum(self.launch.ms(layers, tp) for layers, tp in forwards)

    def host_ms(self, rows: int, new_requests: int, prompt_tokens: int, tp: int, drafter: DrafterKind | None,
                speculating_rows: int = 0, context: float = 0.0) -> float | None:
        """The host's time of a step of `rows` requests (`new_requests` of them prefilling
        `prompt_tokens`), the executor's at `tp` > 1, and a host-drafting `drafter`'s work at its
        `speculating_rows` and their mean `context`; None where no host time is priced."""
        if self.host is None:
            return None
        host_ms = self.host.ms(rows, new_requests, prompt_tokens)
        if self.executor is not None and tp > 1:
            host_ms += self.executor.ms(rows, new_requests, prompt_tokens)
        if self.speculation_host is not None and drafter is not None and drafter.host_drafting and speculating_rows:
            host_ms += self.speculation_host.ms(speculating_rows, context)
        return host_ms

    def step_ms(self, kernels_ms: float, tokens: int, prompt_tokens: int, graph_layers: int, launch_ms: float,
                host_ms: float | None, drafter: DrafterKind | None) -> float:
        """A served step from its kernels' time: the CUDA-graph handling of a step of `tokens`
        (`prompt_tokens` of them a prefill's; `graph_layers` the layers its forwards run, `launch_ms`
        the launch of their kernels), then the host's `host_ms` (None: none) beside the kernels or
        after them."""
        ms = graph_bound_ms(kernels_ms, tokens, prompt_tokens, graph_layers, launch_ms, self.cudagraph_mode,
                            self.piecewise_layer_ms)
        if host_ms is None:
            return ms
        asynchronous = self.async_scheduling and not (drafter is not None and drafter.host_drafting)
        return served_step_ms(ms, host_ms, asynchronous)


# a run's corrected kernels hold its own host's time: nothing is added to them
NO_OVERHEADS = Overheads(host=None, launch=None, speculation_host=None, executor=None, piecewise_layer_ms=0.0)
