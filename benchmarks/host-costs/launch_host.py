"""What a forward that runs without a CUDA graph costs its host on a GPU server (issue 40, part 2).

The kernel tables price a step's GPU time. vLLM replays CUDA graphs for small decode steps, but a
step that carries a long prefill chunk (more tokens than the largest captured size, 512 by default)
runs its compiled forward without a graph, and InferenceMAX's B200 servers (`cudagraph_mode:
FULL_DECODE_ONLY`) ran every step that carried a prefill that way: the host launches each kernel,
layer after layer. Such a step takes at least that launch time, however fast the GPU is, and the
launch time does not shrink with tensor parallelism (each TP worker launches the same kernels).
This measures it on a GPU server's own CPU, with no vLLM (the device image has none):

- a decoder of a real model's layer count and kernel structure, one TP shard of it (fused
  residual add and RMSNorm, QKV, the q/k norms where the model has them, rotary, a KV-cache write,
  causal attention, O, an opaque all-reduce stand-in where TP > 1, gate-up, SiLU·mul, down), bf16;
- run eager (unfused torch ops), and compiled by torch.compile one layer a call (Inductor, no CUDA
  graph: the elementwise work fused as vLLM's own kernels and compile passes fuse it, one compiled
  piece a layer as vLLM's piecewise forward calls them), over T tokens;
- `host_ms`: from the call until the forward returns, nothing synchronised (the host's launch
  time, while the GPU is not the bottleneck); `wall_ms`: until the GPU has finished; `gpu_ms`: the
  same forward replayed from a CUDA graph (GPU time alone).
- `width`: `real` (the TP shard's own sizes: launch and GPU time together) or `narrow` (the same
  kernels at hidden 256, so the GPU never holds the host back: launch time alone).

Also the host's speed beside this VM's: a pure-Python loop and a small CPU torch op (µs each), to
say how far the host constants measured on this VM (host_step.py) carry to a GPU server's CPU.

    python benchmarks/host-costs/launch_host.py --out DIR --modes compiled,eager   # on the GPU (~3 min)
    python benchmarks/host-costs/launch_host.py --host-speed-only    # this VM's host speed
    python benchmarks/host-costs/launch_host.py --summarize FILE.jsonl  # FILE.md beside it

Writes DIR/launch_host.jsonl (one line a measurement) and prints a table. `--summarize` writes the
measurements as a markdown table with the per-layer medians specbench/data/measured.json's
`compiled_launch` holds (compiled, up to 1,024 tokens: TP1 alone, and every TP > 1 shard together).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import time
from statistics import median
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from specbench.results import cpu_name  # noqa: E402  (pandas and the run tables' schema: no engine)


@dataclass(frozen=True)
class Shard:
    """One TP shard of a decoder: the sizes one GPU holds."""

    name: str
    layers: int
    hidden: int
    q_heads: int
    kv_heads: int
    head_dim: int
    intermediate: int
    qk_norm: bool
    tp: int

    def narrow(self) -> Shard:
        """The same kernels at sizes the GPU runs in microseconds."""
        return Shard(self.name, self.layers, 256, self.q_heads, self.kv_heads, self.head_dim, 384, self.qk_norm, self.tp)


def shard(name: str, layers: int, hidden: int, heads: int, kv_heads: int, intermediate: int,
          qk_norm: bool, tp: int) -> Shard:
    return Shard(name, layers, hidden, heads // tp, max(1, kv_heads // tp), 128, intermediate // tp,
                 qk_norm, tp)


SHARDS = {
    "tiny-tp2": shard("tiny", 4, 512, 8, 2, 1024, True, 2),  # a rehearsal on a CPU
    "llama3-70b-tp8": shard("llama3-70b", 80, 8192, 64, 8, 28672, False, 8),
    "llama3-70b-tp4": shard("llama3-70b", 80, 8192, 64, 8, 28672, False, 4),
    "qwen3-32b-tp2": shard("qwen3-32b", 64, 5120, 64, 8, 25600, True, 2),
    "llama3-8b-tp1": shard("llama3-8b", 32, 4096, 32, 8, 14336, False, 1),
}


@torch.library.custom_op("specbench_bench::all_reduce_stand_in", mutates_args=())
def all_reduce_stand_in(x: torch.Tensor) -> torch.Tensor:
    """An opaque op in the compiled graph with one kernel, where vLLM's all-reduce is its custom op."""
    return x.clone()


@all_reduce_stand_in.register_fake
def _(x: torch.Tensor) -> torch.Tensor:
    return torch.empty_like(x)


def rms_norm(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    x32 = x.float()
    return (x32 * torch.rsqrt(x32.pow(2).mean(-1, keepdim=True) + 1e-6)).to(x.dtype) * weight


def rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    half = x.shape[-1] // 2
    x1, x2 = x[..., :half], x[..., half:]
    return torch.cat((x1 * cos - x2 * sin, x2 * cos + x1 * sin), dim=-1)


def make_weights(s: Shard, device: str) -> list[dict[str, torch.Tensor]]:
    q, kv, d = s.q_heads * s.head_dim, s.kv_heads * s.head_dim, s.head_dim

    def w(*shape: int) -> torch.Tensor:
        return torch.randn(*shape, device=device, dtype=torch.bfloat16) * 0.02

    layers = []
    for _ in range(s.layers):
        layer = {"ln1": torch.ones(s.hidden, device=device, dtype=torch.bfloat16), "qkv": w(s.hidden, q + 2 * kv),
                 "o": w(q, s.hidden), "ln2": torch.ones(s.hidden, device=device, dtype=torch.bfloat16),
                 "gate_up": w(s.hidden, 2 * s.intermediate), "down": w(s.intermediate, s.hidden)}
        if s.qk_norm:
            layer["q_norm"] = torch.ones(d, device=device, dtype=torch.bfloat16)
            layer["k_norm"] = torch.ones(d, device=device, dtype=torch.bfloat16)
        layers.append(layer)
    return layers


def make_layer(s: Shard):
    """One decoder layer over one sequence of T new tokens: the kernels a vLLM step launches for it. The
    sizes come from the weights, so that one function serves both widths."""
    head_dim = s.head_dim

    def layer(h: torch.Tensor, residual: torch.Tensor, w: dict[str, torch.Tensor], cos: torch.Tensor,
              sin: torch.Tensor, slots: torch.Tensor, k_cache: torch.Tensor,
              v_cache: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = h.shape[0]
        q_size = w["o"].shape[0]
        kv_size = (w["qkv"].shape[1] - q_size) // 2
        q_heads, kv_heads = q_size // head_dim, kv_size // head_dim
        residual = h + residual
        x = rms_norm(residual, w["ln1"])
        q, k, v = (x @ w["qkv"]).split([q_size, kv_size, kv_size], dim=-1)
        q = q.view(tokens, q_heads, head_dim)
        k = k.view(tokens, kv_heads, head_dim)
        v = v.view(tokens, kv_heads, head_dim)
        if s.qk_norm:
            q, k = rms_norm(q, w["q_norm"]), rms_norm(k, w["k_norm"])
        q, k = rotary(q, cos, sin), rotary(k, cos, sin)
        k_cache.index_copy_(0, slots, k)
        v_cache.index_copy_(0, slots, v)
        attn = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1),
                                              is_causal=True, enable_gqa=True)
        h = attn.transpose(0, 1).reshape(tokens, q_size) @ w["o"]
        if s.tp > 1:
            h = all_reduce_stand_in(h)
        residual = h + residual
        x = rms_norm(residual, w["ln2"])
        gate, up = (x @ w["gate_up"]).chunk(2, dim=-1)
        h = (F.silu(gate) * up) @ w["down"]
        if s.tp > 1:
            h = all_reduce_stand_in(h)
        return h, residual

    return layer


def make_forward(layer):
    """The shard's forward: its layers one after another, each a call of `layer` (eager, or compiled
    once and called per layer, as vLLM's piecewise-compiled forward calls one compiled piece per layer)."""

    def forward(h: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, slots: torch.Tensor,
                weights: list[dict[str, torch.Tensor]], k_cache: torch.Tensor, v_cache: torch.Tensor) -> torch.Tensor:
        residual = torch.zeros_like(h)
        for i, w in enumerate(weights):
            h, residual = layer(h, residual, w, cos, sin, slots, k_cache[i], v_cache[i])
        return h + residual

    return forward


def inputs(s: Shard, tokens: int, device: str, cache_tokens: int) -> tuple:
    h = torch.randn(tokens, s.hidden, device=device, dtype=torch.bfloat16)
    angles = torch.arange(tokens, device=device, dtype=torch.float32)[:, None] * torch.ones(
        s.head_dim // 2, device=device)
    cos, sin = angles.cos()[:, None, :].to(torch.bfloat16), angles.sin()[:, None, :].to(torch.bfloat16)
    slots = torch.arange(tokens, device=device) % cache_tokens
    return h, cos, sin, slots


def sync(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


def time_calls(call, device: str, repeats: int) -> tuple[list[float], list[float]]:
    """Host time (until the call returns) and wall time (until the device is done) of each call, in ms."""
    host, wall = [], []
    for _ in range(repeats):
        sync(device)
        start = time.perf_counter()
        call()
        returned = time.perf_counter()
        sync(device)
        done = time.perf_counter()
        host.append((returned - start) * 1e3)
        wall.append((done - start) * 1e3)
    return host, wall


def graph_ms(call, repeats: int) -> float:
    """GPU time of the call replayed from a CUDA graph (median, ms)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        call()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        call()
    graph.replay()
    torch.cuda.synchronize()
    times = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    del graph
    return median(times)


def count_kernels(call) -> int | None:
    """GPU kernels one call launches (torch.profiler); None where the profiler cannot see them."""
    try:
        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CUDA]) as prof:
            call()
            torch.cuda.synchronize()
        return sum(1 for e in prof.events() if e.device_type.name == "CUDA")
    except Exception as error:  # the measurement goes on without the count
        print(f"[launch_host] kernel count unavailable: {type(error).__name__}: {error}", flush=True)
        return None


def measure_shard(key: str, widths: list[str], token_counts: list[int], modes: list[str], device: str,
                  repeats: int, write, deadline: float) -> None:
    """Every mode and width of one shard; one compile per shard serves both widths (dynamic sizes)."""
    cache_tokens = max(token_counts)
    held = {}
    for width in widths:
        s = SHARDS[key] if width == "real" else SHARDS[key].narrow()
        k_cache = torch.zeros(s.layers, cache_tokens, s.kv_heads, s.head_dim, device=device, dtype=torch.bfloat16)
        held[width] = (s, make_weights(s, device), k_cache, torch.zeros_like(k_cache))
    layer = make_layer(SHARDS[key])  # the layer structure; the sizes come from the tensors
    for mode in modes:
        if mode == "compiled":
            # static sizes, one compile for each token count and width: a whole 80-layer forward
            # compiled with dynamic sizes stalled for minutes in dynamo's symbolic shapes
            torch._dynamo.reset()
            torch._dynamo.config.cache_size_limit = 64
            forward = make_forward(torch.compile(layer, fullgraph=True, dynamic=False))
        else:
            forward = make_forward(layer)
        for width in widths:
            s, weights, k_cache, v_cache = held[width]
            for tokens in token_counts if width == "real" else token_counts[:2]:
                if time.monotonic() > deadline:
                    print(f"[launch_host] out of time at {key} {mode} {width} T={tokens}", flush=True)
                    return
                h, cos, sin, slots = inputs(s, tokens, device, cache_tokens)

                def call() -> torch.Tensor:
                    return forward(h, cos, sin, slots, weights, k_cache, v_cache)

                try:
                    started = time.perf_counter()
                    call()
                    sync(device)
                    first_s = time.perf_counter() - started
                    time_calls(call, device, 2)  # warm-up, excluded
                    host, wall = time_calls(call, device, repeats)
                except Exception as error:  # one mode failing (no compiler for Inductor, say) leaves the others
                    message = f"{type(error).__name__}: {error}"[:300]
                    print(f"[launch_host] {key} {mode} {width} T={tokens}: {message}", flush=True)
                    write({"shard": key, "width": width, "mode": mode, "tokens": tokens, "error": message})
                    break
                gpu = kernels = None
                if device == "cuda":
                    try:
                        gpu = graph_ms(call, repeats)
                    except Exception as error:
                        print(f"[launch_host] no graph for {key} {mode} {width} T={tokens}: {error}"[:300], flush=True)
                    if tokens == token_counts[0]:
                        kernels = count_kernels(call)
                row = {"shard": key, "width": width, "mode": mode, "tokens": tokens, "layers": s.layers, "tp": s.tp,
                       "host_ms": median(host), "wall_ms": median(wall), "gpu_ms": gpu, "kernels": kernels,
                       "first_call_s": first_s, "repeats": repeats, "sizes": asdict(s)}
                write(row)
                print(f"{key:16s} {mode:8s} {width:6s} T={tokens:5d}  host {row['host_ms']:8.2f} ms  wall "
                      f"{row['wall_ms']:8.2f} ms  gpu {gpu if gpu is None else round(gpu, 2)} ms  kernels {kernels}  "
                      f"first call {first_s:.1f} s", flush=True)
    held.clear()
    torch._dynamo.reset()
    if device == "cuda":
        torch.cuda.empty_cache()


def host_speed() -> dict:
    """This host's speed at the work vLLM's host path does: Python bytecode and small torch CPU ops."""
    def python_loop() -> None:
        table: dict[int, int] = {}
        for i in range(200_000):
            table[i & 1023] = table.get(i & 1023, 0) + i
    runs = []
    for _ in range(5):
        start = time.perf_counter()
        python_loop()
        runs.append((time.perf_counter() - start) / 200_000 * 1e6)
    a, b = torch.ones(8), torch.ones(8)
    ops = []
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(20_000):
            torch.add(a, b)
        ops.append((time.perf_counter() - start) / 20_000 * 1e6)
    row = {"python_loop_us_per_iteration": min(runs), "torch_cpu_op_us": min(ops), "cpu": cpu_name(),
           "python": platform.python_version(), "torch": torch.__version__, "threads": torch.get_num_threads()}
    if torch.cuda.is_available():
        x = torch.ones(8, device="cuda")
        torch.cuda.synchronize()
        launches = []
        for _ in range(5):
            start = time.perf_counter()
            for _ in range(5_000):
                x.add_(1.0)
            launches.append((time.perf_counter() - start) / 5_000 * 1e6)
            torch.cuda.synchronize()
        row["cuda_eager_launch_us"] = min(launches)
    return row


def read_measurements(path: Path) -> tuple[dict, list[dict]]:
    """A measurements file's host speed and the cells that measured (those that failed left out)."""
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    speed = next((r["host_speed"] for r in rows if "host_speed" in r), {})
    return speed, [r for r in rows if "shard" in r and "error" not in r]


def heading(what: str, speed: dict) -> str:
    return f"# {what}: {speed.get('gpu')} on {speed.get('cpu')} (torch {speed.get('torch')})"


def appender(path: Path):
    """A function that appends one measurement to `path` as a JSON line (a cell's row survives a later crash)."""
    def write(row: dict) -> None:
        with path.open("a") as handle:
            handle.write(json.dumps(row) + "\n")

    return write


def begin(out: Path, filename: str) -> tuple[Path, Callable[[dict], None]]:
    """`out`/`filename` to append measurements to, its writer, and this host's speed written first."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / filename
    write = appender(path)
    speed = host_speed()
    speed["gpu"] = torch.cuda.get_device_name() if torch.cuda.is_available() else None
    write({"host_speed": speed})
    print(json.dumps(speed), flush=True)
    return path, write


def write_summary(path: Path, summarize: Callable[[Path], str]) -> None:
    """`summarize(path)`'s markdown written beside the measurements (path.md) and printed."""
    text = summarize(path)
    path.with_suffix(".md").write_text(text)
    print(text)


def summarize(path: Path) -> str:
    """The measurements as markdown, and the per-layer launch medians the simulator takes."""
    speed, done = read_measurements(path)
    lines = [heading("Launching a forward without a CUDA graph", speed), "",
             "host: from the call until the forward returns (the host's launches); wall: until the GPU is done; "
             "GPU: the same forward replayed from a CUDA graph. narrow: the same kernels at hidden 256 (launch "
             "time alone). Medians of each cell's repeats, ms.", "",
             "| shard | mode | width | tokens | host | wall | GPU | host a layer | kernels |", "|---|---|---|---|---|---|---|---|---|"]
    for r in done:
        gpu = "" if r["gpu_ms"] is None else f"{r['gpu_ms']:.1f}"
        lines.append(f"| {r['shard']} | {r['mode']} | {r['width']} | {r['tokens']} | {r['host_ms']:.1f} | "
                     f"{r['wall_ms']:.1f} | {gpu} | {r['host_ms'] / r['layers']:.3f} | {r['kernels'] or ''} |")
    per_layer = [(r["tp"], r["host_ms"] / r["layers"]) for r in done if r["mode"] == "compiled" and r["tokens"] <= 1024]
    tp1 = [ms for tp, ms in per_layer if tp == 1]
    tps = [ms for tp, ms in per_layer if tp > 1]
    if tp1 and tps:
        lines += ["", f"Compiled, up to 1,024 tokens, host time a layer: TP1 median {median(tp1):.3f} ms "
                  f"({len(tp1)} cells), TP > 1 (with the two all-reduce stand-ins) median {median(tps):.3f} ms "
                  f"({len(tps)} cells): `specbench.fit.host_cost.COMPILED_LAUNCH`."]
    if speed:
        lines += ["", f"This host: {speed['python_loop_us_per_iteration']:.3f} µs a Python loop iteration, "
                  f"{speed['torch_cpu_op_us']:.2f} µs a small CPU torch op, "
                  f"{speed.get('cuda_eager_launch_us', float('nan')):.1f} µs an eager CUDA launch."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/launch_host")))
    parser.add_argument("--shards", default="llama3-70b-tp8,qwen3-32b-tp2,llama3-8b-tp1")
    parser.add_argument("--widths", default="narrow,real")
    parser.add_argument("--tokens", default="16,256,1024,4096")
    parser.add_argument("--modes", default="eager,compiled")
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--budget-s", type=float, default=240.0, help="stop starting measurements after this")
    parser.add_argument("--host-speed-only", action="store_true")
    parser.add_argument("--summarize", type=Path, help="a launch_host.jsonl: write its markdown beside it")
    args = parser.parse_args()
    if args.summarize:
        write_summary(args.summarize, summarize)
        return
    path, write = begin(args.out, "launch_host.jsonl")
    device = "cuda" if torch.cuda.is_available() else "cpu"
    if args.host_speed_only:
        return
    deadline = time.monotonic() + args.budget_s
    token_counts = [int(t) for t in args.tokens.split(",")]
    for key in args.shards.split(","):
        measure_shard(key, args.widths.split(","), token_counts, args.modes.split(","), device, args.repeats,
                      write, deadline)
    print(f"wrote {path}", flush=True)


if __name__ == "__main__":
    main()
