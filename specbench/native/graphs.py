"""Fixed-shape decode steps, replayed from CUDA graphs.

Eager decoding of a small model on a GPU is bound by kernel launches, not by the GPU: every
layer launches a dozen kernels from Python, and a 135M-parameter model finishes each of them
faster than the next one is launched. A CUDA graph records one step's kernels once and replays
them with a single launch. That needs fixed shapes and fixed addresses, which this module
arranges around the engine's ragged cache without changing the loop:

- one cache per model, allocated for (batch, length rounded up to LENGTH_QUANTUM) and kept
  between generate calls of that batch size that fit in it; rows leaving the batch are
  compacted in place;
- a step attends over the cache's first columns up to the longest row rounded up to
  LENGTH_QUANTUM (a length bucket), under the mask: attention reads at most one quantum per row
  more than the ragged path does, whatever the cache's length;
- a step's rows are padded up to a bucket (powers of two up to the cache's rows, and the cache's
  rows) with dead rows, so a batch shrinking as requests finish replays a few graphs, not one
  per size. Dead rows compute on whatever their buffers hold and write only into cache rows no
  live request uses;
- inputs are copied into static buffers before a replay, and the logits come back in a static
  output buffer (shared by the length buckets of a shape), valid until the next replay of any
  graph of the model.

A graph is captured per (bucket, tokens per row, which logits, ragged input or not, length
bucket) the first time it is needed, together with the same step at every smaller batch bucket
and every longer length bucket (and LOWER_BUCKETS shorter ones), so that a warm-up run captures
what the measured runs replay.
`captures` counts the shapes built (eagerly run ones too); a capture inside a timed run costs
two eager steps plus the capture.

Off CUDA the same fixed-shape steps run eagerly (capture=False): everything but the capture
itself, which is what the tests exercise on CPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import torch

from specbench.native.kvcache import RaggedKVCache
from specbench.shapes import LENGTH_QUANTUM

if TYPE_CHECKING:
    from specbench.native.forward import CausalLM

LOWER_BUCKETS = 2  # length buckets captured below the first one a batch needs (other batches start near it)


def batch_buckets(allocated_rows: int) -> list[int]:
    """Step sizes a cache of `allocated_rows` rows is padded to: powers of two below it, and it."""
    buckets = [1 << i for i in range(max(allocated_rows - 1, 0).bit_length()) if 1 << i < allocated_rows]
    return buckets + [allocated_rows]


@dataclass
class _Step:
    input_ids: torch.Tensor  # [R, T]
    positions: torch.Tensor  # [R, T]
    num_valid: torch.Tensor | None  # [R]
    visible: int  # cache columns attended (a length bucket)
    logits: torch.Tensor | None = None  # the graph's output
    graph: "torch.cuda.CUDAGraph | None" = None


class StaticSteps:
    def __init__(self, model: "CausalLM", capture: bool, length_quantum: int = LENGTH_QUANTUM) -> None:
        if capture and model.device.type != "cuda":
            raise ValueError(f"CUDA graphs need a CUDA device; {model.name} is on {model.device}")
        if model.layer_devices() is not None:
            raise ValueError(f"CUDA graphs need the model on one device; {model.name} is spread over several")
        self.model = model
        self.capture = capture
        self.length_quantum = length_quantum
        self.cache: RaggedKVCache | None = None
        self._steps: dict[tuple, _Step] = {}
        self._outputs: dict[tuple, torch.Tensor] = {}
        self._pool = torch.cuda.graph_pool_handle() if capture else None
        self.captures = 0  # fixed-shape steps built: CUDA graphs captured, or eager shapes off CUDA

    def cache_for(self, batch_size: int, max_length: int) -> RaggedKVCache:
        """The model's one decode cache, emptied, with at least `max_length` columns. It is
        reused (graphs and all) for the same batch size while it is long enough and at most
        twice the rounded length asked for (attention covers every column); otherwise it is
        reallocated and every graph dropped."""
        length = self._round_up(max_length)
        cache = self.cache
        if cache is not None and cache.allocated_rows == batch_size and length <= cache.max_length <= 2 * length:
            cache.reset(batch_size)
            return cache
        self.cache, self._steps, self._outputs = None, {}, {}  # free buffers and graphs before allocating
        if self.capture:
            # The dropped graphs were the old pool's last users: capturing into it again trips the
            # caching allocator's assert (use_count > 0), so the new graphs get a new pool.
            self._pool = torch.cuda.graph_pool_handle()
            torch.cuda.empty_cache()
        self.cache = self.model.new_cache(batch_size, length)
        return self.cache

    def run(
        self,
        cache: RaggedKVCache,
        input_ids: torch.Tensor,
        logits_at: Literal["all", "last"],
        num_valid: torch.Tensor | None,
    ) -> torch.Tensor:
        """CausalLM.forward for a decode step, at a fixed shape (and from a graph on CUDA)."""
        if cache is not self.cache:  # a cache made elsewhere (a one-off check): eager
            return self.model.forward(cache, input_ids, logits_at, num_valid)
        rows, width = input_ids.shape
        positions = cache.next_positions(width)  # raises on overflow
        bucket = next(b for b in batch_buckets(cache.allocated_rows) if b >= rows)
        visible = self._round_up(max(cache.lengths) + width)
        key = (bucket, width, logits_at, num_valid is not None, visible)
        if key not in self._steps:
            # The whole family at once: every smaller batch bucket, every length bucket. Their
            # capture passes write this step's rows with other numerics (another batch shape, or
            # attention cut short), and the real step below rewrites them.
            smaller_buckets = [b for b in batch_buckets(cache.allocated_rows) if b <= bucket]
            # Length buckets from just below this one up: a batch's steps only attend further as it
            # decodes (a long-context cache would otherwise capture dozens of buckets it never uses).
            lowest = max(self.length_quantum, visible - LOWER_BUCKETS * self.length_quantum)
            for smaller in smaller_buckets:
                for length in range(lowest, cache.max_length + 1, self.length_quantum):
                    family_key = (smaller, *key[1:4], length)
                    if family_key not in self._steps:
                        self._steps[family_key] = self._new_step(
                            cache, smaller, length, input_ids, positions, logits_at, num_valid)
        step = self._steps[key]
        step.input_ids[:rows].copy_(input_ids)
        step.positions[:rows].copy_(positions)
        if num_valid is not None:
            step.num_valid[:rows].copy_(num_valid)
        if step.graph is not None:
            step.graph.replay()
            logits = step.logits
        else:
            logits = self._compute(cache, step, logits_at)
        return logits[:rows]

    def _round_up(self, length: int) -> int:
        return math.ceil(length / self.length_quantum) * self.length_quantum

    def _compute(self, cache: RaggedKVCache, step: _Step, logits_at: str) -> torch.Tensor:
        mask = cache.bind(step.positions, step.visible, self.model.attention)
        return self.model.logits_for(cache, step.input_ids, step.positions, mask, logits_at, step.num_valid)

    def _new_step(self, cache, bucket, visible, input_ids, positions, logits_at, num_valid) -> _Step:
        """Static buffers for one shape, their first rows holding the current step's inputs (so
        that passes run while capturing write only what the real step writes), the rest padding:
        token 0 at positions 0.. of dead rows."""
        rows, width = input_ids.shape
        live = min(rows, bucket)
        device = input_ids.device
        ids = torch.zeros((bucket, width), dtype=input_ids.dtype, device=device)
        ids[:live] = input_ids[:live]
        where = torch.arange(width, device=device).repeat(bucket, 1)
        where[:live] = positions[:live]
        valid = None
        if num_valid is not None:
            valid = torch.ones(bucket, dtype=num_valid.dtype, device=device)
            valid[:live] = num_valid[:live]
        step = _Step(ids, where, valid, visible)
        self.captures += 1
        if self.capture:
            side = torch.cuda.Stream()
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):  # lazy initialisation (cuBLAS workspaces…) off the graph
                for _ in range(2):
                    warm = self._compute(cache, step, logits_at)
            torch.cuda.current_stream().wait_stream(side)
            # One output buffer per (batch bucket, width, logits): the length buckets' graphs share
            # it instead of each holding its own [rows, width, vocab] logits in the pool.
            output_key = (bucket, width, logits_at)
            if output_key not in self._outputs:
                self._outputs[output_key] = torch.empty_like(warm)
            del warm
            step.logits = self._outputs[output_key]
            step.graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(step.graph, pool=self._pool, capture_error_mode="thread_local"):
                step.logits.copy_(self._compute(cache, step, logits_at))
            torch.cuda.synchronize()
        return step
