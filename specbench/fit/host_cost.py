"""A vLLM engine step's time on its host, outside the model's kernels: what the kernel tables (GPU
time) do not hold. With synchronous scheduling the GPU waits for it every step; with async
scheduling (vLLM's default on a GPU since v0.14, never for n-gram drafting) it runs beside the GPU's
step, which then takes the longer of the two. And a step that runs outside CUDA graphs takes at
least as long as its host needs to launch its kernels, however fast the GPU (`LaunchCost`)."""

from __future__ import annotations

from dataclasses import asdict, dataclass

from specbench import measured


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


# The measured constants below are read from specbench/data/measured.json (`specbench.measured`),
# which says for each the committed result, date, machine and command that measured it; tests hold
# each to that result.

# vLLM 0.32's engine core (its GPUModelRunner's host path, run by its CPU build) on this project's
# 2-core AMD EPYC VM. A GPU server's host CPU and vLLM version differ; this is the one measured.
VLLM_HOST_STEP = HostCost(**measured.value("vllm_host_step"))
VLLM_HOST_STEP_SOURCE = measured.described("vllm_host_step")
# What vLLM 0.32's multiprocess executor adds to a step (every server at TP > 1 runs its model runners
# in worker processes): the step's two calls to a worker (execute_model, sample_tokens) less the
# worker's own time in them, on the same VM. One worker's cost: the wait for the slowest of several
# is not in it.
MULTIPROC_EXECUTOR_STEP = HostCost(**measured.value("multiproc_executor_step"))
MULTIPROC_EXECUTOR_STEP_SOURCE = measured.described("multiproc_executor_step")


@dataclass(frozen=True)
class SpeculationHostCost:
    """Speculation's own host time in a step (ms), beyond the baseline's: its proposer and the
    scheduler's and runner's handling of draft tokens, linear in the rows that speculate and, for a
    proposer that scans each row's context on the host (n-gram lookup), in their context tokens."""

    intercept_ms: float
    per_row_ms: float
    per_context_token_ms: float  # a row's context scanned once by the proposer

    def ms(self, rows: int, context: float) -> float:
        return self.intercept_ms + self.per_row_ms * rows + self.per_context_token_ms * rows * context


# vLLM 0.32's ngram drafting (K=2, prompt lookup 1-3) against its baseline on a 2-core AMD EPYC VM, in
# the same sittings: the host's own phases of a decode step (schedule, update_from_output,
# _prepare_inputs, _bookkeeping_sync, propose_draft_token_ids), and the lookup (`batch_propose_numba`,
# one thread: 0.715 ns a context token) timed on its own.
NGRAM_HOST_STEP = SpeculationHostCost(**measured.value("ngram_host_step"))
NGRAM_HOST_STEP_SOURCE = measured.described("ngram_host_step")


@dataclass(frozen=True)
class ApiServerCost:
    """What a vLLM API server adds to each request's TTFT (and E2E) outside its engine core, in ms:
    the HTTP request, the prompt's tokenizing, its way to the engine core and the first token's way
    back, detokenized and streamed; linear in the prompt's tokens."""

    intercept_ms: float
    per_prompt_token_ms: float

    def ms(self, prompt_tokens: int = 0) -> float:
        return self.intercept_ms + self.per_prompt_token_ms * prompt_tokens


# vLLM 0.32's OpenAI API server (/v1/completions, streamed) in front of its CPU engine core on the same
# VM: a client's TTFT less the engine core's own queue and prefill time (its timestamps, from the
# server's histograms), one request at a time, prompts of 16-4,096 tokens.
VLLM_API_SERVER_REQUEST = ApiServerCost(**measured.value("vllm_api_server_request"))
VLLM_API_SERVER_REQUEST_SOURCE = measured.described("vllm_api_server_request")


def described(host: HostCost | LaunchCost | SpeculationHostCost | ApiServerCost | None) -> dict | None:
    """What --json says of the host time a plan priced: its terms and where they were measured."""
    if host is None:
        return None
    source = {VLLM_HOST_STEP: VLLM_HOST_STEP_SOURCE, COMPILED_LAUNCH: COMPILED_LAUNCH_SOURCE,
              NGRAM_HOST_STEP: NGRAM_HOST_STEP_SOURCE,
              MULTIPROC_EXECUTOR_STEP: MULTIPROC_EXECUTOR_STEP_SOURCE,
              VLLM_API_SERVER_REQUEST: VLLM_API_SERVER_REQUEST_SOURCE}.get(host, "given")
    return {**asdict(host), "measured": source}


def served_step_ms(kernels_ms: float, host_ms: float, async_scheduling: bool) -> float:
    """A step's time from its kernels' and its host's: the longer with async scheduling, else both."""
    return max(kernels_ms, host_ms) if async_scheduling else kernels_ms + host_ms


@dataclass(frozen=True)
class LaunchCost:
    """The host's time to launch a compiled forward's kernels one by one, per decoder layer (ms), for
    a step that runs outside CUDA graphs. Tensor parallelism does not shorten it: every TP worker
    launches the same kernels, and each of a layer's two all-reduces is one more launch."""

    per_layer_ms: float  # TP1
    per_layer_tp_ms: float  # TP > 1: the layer's two all-reduces launched too

    def ms(self, layers: int, tp: int) -> float:
        return layers * (self.per_layer_tp_ms if tp > 1 else self.per_layer_ms)


# A decoder layer's compiled forward (Inductor, one compiled call a layer as vLLM's piecewise forward
# makes it, 17-18 kernels) launched without a CUDA graph from an H100 server's host CPU (torch 2.11):
# the median over 5 token counts of Llama-3-8B at TP1 (0.471 ms a layer) and of Llama-3-70B at TP8 and
# Qwen3-32B at TP2 together (0.687).
COMPILED_LAUNCH = LaunchCost(**measured.value("compiled_launch"))
COMPILED_LAUNCH_SOURCE = measured.described("compiled_launch")
# vLLM's largest CUDA-graph-captured step by default (max_cudagraph_capture_size): a step of more
# tokens (a long prefill chunk) runs its compiled forward without a graph
GRAPH_CAPTURE_TOKENS = 512
# vLLM's --compilation-config cudagraph_mode values, and whether a step that carries a prefill can
# replay a graph under each (FULL_DECODE_ONLY: decode-only steps alone)
CUDAGRAPH_MODES = {"FULL_AND_PIECEWISE": True, "PIECEWISE": True, "FULL": True, "FULL_DECODE_ONLY": False}


def check_cudagraph_mode(cudagraph_mode: str) -> str:
    """`cudagraph_mode` if vLLM has it, else a one-line ValueError naming the ones it has."""
    if cudagraph_mode not in CUDAGRAPH_MODES:
        raise ValueError(f"cudagraph_mode {cudagraph_mode!r}: one of {', '.join(CUDAGRAPH_MODES)}")
    return cudagraph_mode


# A decode step replayed as CUDA-graph pieces, each layer's attention (its KV-cache write and kernel)
# called between two pieces as vLLM's PIECEWISE mode runs it, against the same step from one graph
# (torch 2.11, no vLLM), on two H100 machines (median 11.2 µs over 33 cells, 12.4 and 9.5 by machine)
# and an H200 (9.7 µs over 34): 7-20 µs more a decoder layer, median 10.0 over all 67 cells, of
# Llama-3-70B at TP 2/4/8 (and at TP16 in bf16, an fp8 TP8 shard's weight bytes), Qwen3-32B at TP4
# and Llama-3-8B at TP1, 1-128 rows, 2k and 8k of context. One constant for both GPUs: the H200's
# cells differ from the H100's by less than the two H100 machines' did. The GPU's time between
# pieces, not the host's: the host's calls ran ahead of the GPU in every cell.
PIECEWISE_LAYER_MS = measured.value("piecewise_layer_ms")
PIECEWISE_SOURCE = measured.described("piecewise_layer_ms")


def runs_without_graph(tokens: int, prefill_tokens: int, cudagraph_mode: str = "FULL_AND_PIECEWISE",
                       capture_tokens: int = GRAPH_CAPTURE_TOKENS) -> bool:
    """Whether vLLM runs a step of `tokens` (`prefill_tokens` of them a prefill's) outside CUDA graphs."""
    return tokens > capture_tokens or (prefill_tokens > 0 and not CUDAGRAPH_MODES[cudagraph_mode])


def runs_piecewise(tokens: int, prefill_tokens: int, cudagraph_mode: str = "FULL_AND_PIECEWISE",
                   capture_tokens: int = GRAPH_CAPTURE_TOKENS) -> bool:
    """Whether vLLM replays a step as graph pieces with each layer's attention between them: every
    graphed step under PIECEWISE (vLLM's default until 0.11), one that carries a prefill under
    FULL_AND_PIECEWISE (decode-only steps, a verify's too, replay one full graph)."""
    if runs_without_graph(tokens, prefill_tokens, cudagraph_mode, capture_tokens):
        return False
    return cudagraph_mode == "PIECEWISE" or (cudagraph_mode == "FULL_AND_PIECEWISE" and prefill_tokens > 0)


def graph_bound_ms(kernels_ms: float, tokens: int, prefill_tokens: int, layers: int, launch_ms: float,
                   cudagraph_mode: str = "FULL_AND_PIECEWISE", piecewise_layer_ms: float = PIECEWISE_LAYER_MS) -> float:
    """A step's kernel time as vLLM's CUDA-graph handling makes it: a step replayed as graph pieces
    (`runs_piecewise`) adds `piecewise_layer_ms` for each of the `layers` its forwards run; a step
    outside graphs (`runs_without_graph`) lasts at least `launch_ms`, the host's launch of its
    kernels. `step_model.Overheads` composes every step's through it."""
    if piecewise_layer_ms and runs_piecewise(tokens, prefill_tokens, cudagraph_mode):
        kernels_ms += layers * piecewise_layer_ms
    if launch_ms and runs_without_graph(tokens, prefill_tokens, cudagraph_mode):
        kernels_ms = max(kernels_ms, launch_ms)
    return kernels_ms
