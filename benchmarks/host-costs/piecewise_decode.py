"""What a decode step costs when its attention runs between CUDA-graph pieces (issue 40, part 2).

vLLM 0.10.2 (the image of NVIDIA's measured Llama-3.1-70B rows on H100 and H200) replayed decode
steps under `cudagraph_mode: PIECEWISE` by default: the layers' GEMMs and elementwise work replay
from one CUDA graph per piece, and each layer's attention (its KV-cache write and kernel) is called
from Python between two pieces. A step then costs the host one graph launch and one attention call a
layer, and the GPU waits wherever the host falls behind it. The kernel tables price GPU time alone
(as a full-graph replay would run). This measures the difference on a GPU, with no vLLM (the device
image has none):

- one TP shard of a real decoder's decode step (its layer count and sizes; bf16 weights, one layer's
  weights shared by every layer so that 70B shards fit; every layer its own KV cache), B rows each
  `context` tokens deep: fused-free residual add and RMSNorm, QKV, the q/k norms where the model has
  them, rotary, the KV-cache write and attention (one custom op, as vLLM's
  `unified_attention_with_output`), O, an all-reduce stand-in where TP > 1, gate-up, SiLU·mul, down;
- `full_ms`: the whole step replayed from one CUDA graph (GPU time: what the tables price);
- `piecewise_ms`: the same step as L + 1 graph pieces with the attention op called eagerly between
  them (until the GPU is done), and `piecewise_host_ms` until the last call returns;
- `width`: `real`, or `narrow` (hidden 256, one row: the GPU never holds the host back, so the wall
  time is the host's per layer).

    python benchmarks/host-costs/piecewise_decode.py --out DIR      # on the GPU (~2 min)
    python benchmarks/host-costs/piecewise_decode.py --summarize FILE.jsonl

The stand-in's host work is less than vLLM's: vLLM's piecewise backend checks each piece's shapes in
Python, and its attention op reads a forward context and calls FlashAttention's own wrapper; the
numbers here are a floor on the host's part.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from dataclasses import asdict
from pathlib import Path
from statistics import median

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
from launch_host import (  # noqa: E402
    Shard,
    all_reduce_stand_in,
    begin,
    heading,
    read_measurements,
    rms_norm,
    rotary,
    shard,
    time_calls,
    write_summary,
)

SHARDS = {
    "tiny-tp2": shard("tiny", 4, 512, 8, 2, 1024, True, 2),  # a rehearsal on a CPU
    "llama3-70b-tp2": shard("llama3-70b", 80, 8192, 64, 8, 28672, False, 2),
    "llama3-70b-tp4": shard("llama3-70b", 80, 8192, 64, 8, 28672, False, 4),
    "llama3-70b-tp8": shard("llama3-70b", 80, 8192, 64, 8, 28672, False, 8),
    # bf16 at TP16 reads the weight bytes an fp8 shard at TP8 reads (NVIDIA's 70B rows are fp8)
    "llama3-70b-tp16": shard("llama3-70b", 80, 8192, 64, 8, 28672, False, 16),
    "qwen3-32b-tp4": shard("qwen3-32b", 64, 5120, 64, 8, 25600, True, 4),
    "llama3-8b-tp1": shard("llama3-8b", 32, 4096, 32, 8, 14336, False, 1),
}


@torch.library.custom_op("specbench_bench::decode_attention", mutates_args=("k_cache", "v_cache", "out"))
def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, k_cache: torch.Tensor,
                     v_cache: torch.Tensor, out: torch.Tensor) -> None:
    """Write one new token's K and V into the last slot of each row's cache and attend over the
    cache: q [B, H, D], k/v [B, KVH, D], caches [B, KVH, C, D], out [B, H·D]."""
    k_cache.select(2, -1).copy_(k)
    v_cache.select(2, -1).copy_(v)
    attn = F.scaled_dot_product_attention(q.unsqueeze(2), k_cache, v_cache, enable_gqa=True)
    out.copy_(attn.reshape(out.shape))


def weights(s: Shard, device: str) -> dict[str, torch.Tensor]:
    q, kv = s.q_heads * s.head_dim, s.kv_heads * s.head_dim

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=torch.bfloat16) * 0.02

    ones = {name: torch.ones(size, device=device, dtype=torch.bfloat16)
            for name, size in (("ln1", s.hidden), ("ln2", s.hidden), ("q_norm", s.head_dim), ("k_norm", s.head_dim))}
    return {**ones, "qkv": w(s.hidden, q + 2 * kv), "o": w(q, s.hidden), "gate_up": w(s.hidden, 2 * s.intermediate),
            "down": w(s.intermediate, s.hidden)}


class DecodeStep:
    """One decode step of B rows through a shard's layers, split at attention as vLLM splits it."""

    def __init__(self, s: Shard, rows: int, context: int, device: str):
        self.s, self.rows = s, rows
        self.w = weights(s, device)
        shape = (rows, s.kv_heads, context, s.head_dim)
        self.k_cache = [torch.zeros(shape, device=device, dtype=torch.bfloat16) for _ in range(s.layers)]
        self.v_cache = [torch.zeros(shape, device=device, dtype=torch.bfloat16) for _ in range(s.layers)]
        self.h = torch.randn(rows, s.hidden, device=device, dtype=torch.bfloat16)
        angles = torch.full((rows, s.head_dim // 2), float(context), device=device)
        self.cos, self.sin = angles.cos()[:, None, :].to(torch.bfloat16), angles.sin()[:, None, :].to(torch.bfloat16)
        q_size = s.q_heads * s.head_dim
        # the attention op's outputs, read by the next piece (static addresses, as graphs need)
        self.attn_out = [torch.zeros(rows, q_size, device=device, dtype=torch.bfloat16) for _ in range(s.layers)]
        self.qkv: list[tuple[torch.Tensor, torch.Tensor, torch.Tensor]] = [None] * s.layers  # type: ignore[list-item]
        self.residual: list[torch.Tensor] = [None] * s.layers  # type: ignore[list-item]
        self.final: torch.Tensor | None = None

    def pre_attention(self, layer: int, h: torch.Tensor, residual: torch.Tensor) -> None:
        s, w = self.s, self.w
        q_size, kv_size = s.q_heads * s.head_dim, s.kv_heads * s.head_dim
        residual = h + residual
        x = rms_norm(residual, w["ln1"])
        q, k, v = (x @ w["qkv"]).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(self.rows, s.q_heads, s.head_dim)
        k = k.view(self.rows, s.kv_heads, s.head_dim)
        v = v.view(self.rows, s.kv_heads, s.head_dim)
        if s.qk_norm:
            q, k = rms_norm(q, w["q_norm"]), rms_norm(k, w["k_norm"])
        self.qkv[layer] = (rotary(q, self.cos, self.sin), rotary(k, self.cos, self.sin), v)
        self.residual[layer] = residual

    def post_attention(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        s, w = self.s, self.w
        h = self.attn_out[layer] @ w["o"]
        if s.tp > 1:
            h = all_reduce_stand_in(h)
        residual = h + self.residual[layer]
        x = rms_norm(residual, w["ln2"])
        gate, up = (x @ w["gate_up"]).chunk(2, dim=-1)
        h = (F.silu(gate) * up) @ w["down"]
        if s.tp > 1:
            h = all_reduce_stand_in(h)
        return h, residual

    def attention(self, layer: int) -> None:
        q, k, v = self.qkv[layer]
        torch.ops.specbench_bench.decode_attention(q, k, v, self.k_cache[layer], self.v_cache[layer],
                                                   self.attn_out[layer])

    def piece(self, index: int) -> None:
        """Piece `index`: layer index-1's work after attention and layer index's before it."""
        if index == 0:
            h, residual = self.h, torch.zeros_like(self.h)
        else:
            h, residual = self.post_attention(index - 1)
        if index < self.s.layers:
            self.pre_attention(index, h, residual)
        else:
            self.final = h + residual

    def whole(self) -> None:
        for index in range(self.s.layers + 1):
            self.piece(index)
            if index < self.s.layers:
                self.attention(index)


def capture(call, pool) -> torch.cuda.CUDAGraph:
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        call()
    return graph


def timed(call, repeats: int) -> tuple[float, float]:
    """Median host time (until `call` returns) and wall time (until the GPU is done), ms."""
    host, wall = time_calls(call, "cuda", repeats)
    return median(host), median(wall)


def gpu_ms(graph: torch.cuda.CUDAGraph, repeats: int) -> float:
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return median(times)


def measure(key: str, width: str, rows: int, context: int, repeats: int) -> dict:
    s = SHARDS[key] if width == "real" else SHARDS[key].narrow()
    step = DecodeStep(s, rows, context, "cuda")
    warm = torch.cuda.Stream()
    warm.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(warm):  # allocator and kernels warmed before capture
        for _ in range(2):
            step.whole()
    torch.cuda.current_stream().wait_stream(warm)
    torch.cuda.synchronize()
    full = capture(step.whole, None)  # its own memory pool; the pieces share one, as vLLM's do
    pool = torch.cuda.graph_pool_handle()
    pieces = [capture(lambda i=i: step.piece(i), pool) for i in range(s.layers + 1)]

    def piecewise() -> None:
        for index, graph in enumerate(pieces):
            graph.replay()
            if index < s.layers:
                step.attention(index)

    for _ in range(3):
        full.replay()
        piecewise()
    torch.cuda.synchronize()
    full_gpu = gpu_ms(full, repeats)
    _, full_wall = timed(full.replay, repeats)
    host, wall = timed(piecewise, repeats)
    row = {"shard": key, "width": width, "rows": rows, "context": context, "layers": s.layers, "tp": s.tp,
           "full_ms": full_gpu, "full_wall_ms": full_wall, "piecewise_ms": wall, "piecewise_host_ms": host,
           "repeats": repeats, "sizes": asdict(s)}
    return row  # its graphs and caches freed with this frame; the caller empties the allocator's cache


def summarize(path: Path) -> str:
    speed, done = read_measurements(path)
    lines = [heading("A decode step with attention between CUDA-graph pieces", speed), "",
             "full: the step replayed from one CUDA graph (GPU time); piecewise: the layers' pieces replayed from "
             "graphs with each layer's attention op called between them, until the GPU is done (host: until the "
             "last call returns). Medians, ms; a layer: per decoder layer.", "",
             "| shard | width | rows | context | full | piecewise | host | piecewise − full | a layer: full | "
             "a layer: host | a layer: extra |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in done:
        n = r["layers"]
        extra = r["piecewise_ms"] - r["full_ms"]
        lines.append(f"| {r['shard']} | {r['width']} | {r['rows']} | {r['context']} | {r['full_ms']:.2f} | "
                     f"{r['piecewise_ms']:.2f} | {r['piecewise_host_ms']:.2f} | {extra:+.2f} | "
                     f"{r['full_ms'] / n * 1e3:.0f} µs | {r['piecewise_host_ms'] / n * 1e3:.0f} µs | "
                     f"{extra / n * 1e3:+.0f} µs |")
    narrow = [r["piecewise_host_ms"] / r["layers"] for r in done if r["width"] == "narrow"]
    if narrow:
        lines += ["", f"Narrow (the host alone): median {median(narrow) * 1e3:.0f} µs a layer "
                  f"(a graph piece's replay and an attention op's call)."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/piecewise_decode")))
    parser.add_argument("--shards", default="llama3-70b-tp8,llama3-70b-tp4,llama3-70b-tp2,qwen3-32b-tp4,llama3-8b-tp1")
    parser.add_argument("--rows", default="1,4,16,64")
    parser.add_argument("--contexts", default="2048")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--budget-s", type=float, default=200.0, help="stop starting measurements after this")
    parser.add_argument("--summarize", type=Path, help="a piecewise_decode.jsonl: write its markdown beside it")
    args = parser.parse_args()
    if args.summarize:
        write_summary(args.summarize, summarize)
        return
    if not torch.cuda.is_available():
        sys.exit("piecewise_decode.py: needs CUDA (it replays CUDA graphs)")
    path, write = begin(args.out, "piecewise_decode.jsonl")
    deadline = time.monotonic() + args.budget_s
    cells = [(key, "narrow", 1, 256) for key in args.shards.split(",")[:2]]
    cells += [(key, "real", int(rows), int(context)) for key in args.shards.split(",")
              for context in args.contexts.split(",") for rows in args.rows.split(",")]
    for key, width, rows, context in cells:
        if time.monotonic() > deadline:
            print(f"[piecewise] out of time at {key} {width} B={rows} C={context}", flush=True)
            break
        try:
            row = measure(key, width, rows, context, args.repeats)
        except Exception as error:  # one cell failing (memory, a kernel) leaves the others
            message = f"{type(error).__name__}: {error}"[:300]
            print(f"[piecewise] {key} {width} B={rows} C={context}: {message}", flush=True)
            write({"shard": key, "width": width, "rows": rows, "context": context, "error": message})
            continue
        finally:
            torch.cuda.empty_cache()
        write(row)
        print(f"{key:16s} {width:6s} B={rows:3d} C={context:5d}  full {row['full_ms']:7.2f}  piecewise "
              f"{row['piecewise_ms']:7.2f}  host {row['piecewise_host_ms']:7.2f} ms  "
              f"({(row['piecewise_ms'] - row['full_ms']) / row['layers'] * 1e3:+.0f} µs a layer)", flush=True)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
