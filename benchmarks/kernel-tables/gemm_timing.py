"""The kernel tables' GEMM times beside a second timing of the same shapes on the GPU at hand.

Issue 40, part 2. The simulator prices every forward from aiconfigurator's measured GEMM tables
(vLLM's bf16 `torch.nn.functional.linear` and its CUTLASS fp8 kernel), with isolated spikes along m
removed (`specbench.fit.kernel_tables.despiked_gemm`). This times the tables' own grid shapes that
Llama-3.1-8B and -70B's linear layers fall on, at the tables' m up to 513, so that here one can see:

- whether the tables' times hold on this GPU (the bf16 rows run the tables' own kernel source, torch's
  linear, on a newer torch and cuBLAS);
- whether the tables' rare spikes along m come back in a second timing (if not, they were the timing's,
  and the despike rule is right to remove them).

Each cell is a CUDA graph of `--calls` back-to-back GEMMs replayed and timed with CUDA events (launch
excluded, as the tables' collector times them), in two modes: `hot`, one weight (what a collector that
reuses its weight sees; a weight under the L2's 60 MB stays in it), and `cold`, the calls cycling through
enough weight copies to overflow the L2, as a decode step's layers do. fp8 is torch._scaled_mm with
per-tensor scales (cuBLASLt), not vLLM's CUTLASS kernel: a second opinion on fp8, not the same kernel.

    python benchmarks/kernel-tables/gemm_timing.py --out DIR        # on the GPU (~1 min)
    python benchmarks/kernel-tables/gemm_timing.py --compare FILE.jsonl --device h200   # here
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "host-costs"))
from launch_host import begin  # noqa: E402
from piecewise_decode import gpu_ms  # noqa: E402

# (n, k) of the tables' grid that these models' linear layers are (or fall nearest to)
SHAPES = {
    "llama3-8b tp1 qkv": (6144, 4096),
    "llama3-8b tp1 o": (4096, 4096),
    "llama3-8b tp1 down-ish (k 16384)": (4096, 16384),
    "llama3-70b tp2 qkv": (5120, 8192),
    "llama3-70b tp2 o": (8192, 4096),
    "llama3-70b tp4 qkv": (2560, 8192),
    "llama3-70b tp4 o": (8192, 2048),
    "llama3-70b tp4 down": (8192, 7168),
    "llama3-70b tp8 o": (8192, 1024),
    "llama3-70b tp8 gate_up": (7168, 8192),
    "llama3-70b tp8 down": (8192, 3584),
}
ROWS = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 32, 33, 48, 49, 64, 65, 96, 97, 128, 129,
        160, 161, 192, 193, 224, 225, 256, 257, 512, 513]
DETAIL_ROWS = (1, 4, 8, 16, 64, 128, 256, 512, 1024, 2048, 4096, 8192)
L2_BYTES = 60 * 2**20


class Gemm:
    """One (n, k) weight in `dtype`, in `copies` copies, and a call computing x @ w.T on the next copy."""

    def __init__(self, n: int, k: int, dtype: str, copies: int):
        self.dtype = dtype
        weights = [torch.randn(n, k, device="cuda", dtype=torch.bfloat16) / k**0.5 for _ in range(copies)]
        if dtype == "fp8":
            self.weights = [w.to(torch.float8_e4m3fn).t() for w in weights]  # column-major, as _scaled_mm wants
            self.scale = torch.ones((), device="cuda")
        else:
            self.weights = weights
        self.k = k

    def inputs(self, rows: int) -> torch.Tensor:
        x = torch.randn(rows, self.k, device="cuda", dtype=torch.bfloat16)
        return x.to(torch.float8_e4m3fn) if self.dtype == "fp8" else x

    def call(self, x: torch.Tensor, index: int) -> torch.Tensor:
        w = self.weights[index % len(self.weights)]
        if self.dtype == "fp8":
            return torch._scaled_mm(x, w, self.scale, self.scale, out_dtype=torch.bfloat16)
        return F.linear(x, w)


def time_cell(gemm: Gemm, rows: int, calls: int, repeats: int) -> float:
    """Median ms a GEMM over `repeats` replays of a graph of `calls` GEMMs."""
    x = gemm.inputs(rows)
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for i in range(3):
            gemm.call(x, i)
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        for i in range(calls):
            gemm.call(x, i)
    graph.replay()
    graph.replay()
    return gpu_ms(graph, repeats) / calls


def measure(out: Path, budget_s: float, calls: int, repeats: int, dtypes: list[str], modes: list[str],
            rows_list: list[int] = ROWS, filename: str = "gemm_timing.jsonl") -> None:
    path, write = begin(out, filename)
    deadline = time.monotonic() + budget_s
    for dtype in dtypes:
        for mode in modes:
            for name, (n, k) in SHAPES.items():
                if time.monotonic() > deadline:
                    print(f"[gemm] out of time at {dtype} {mode} {name}", flush=True)
                    print(f"wrote {path}", flush=True)
                    return
                size = n * k * (1 if dtype == "fp8" else 2)
                copies = 1 if mode == "hot" else min(64, max(2, -(-3 * L2_BYTES // size)))
                times, errors = {}, {}
                try:
                    gemm = Gemm(n, k, dtype, copies)
                    for rows in rows_list:
                        try:
                            times[rows] = time_cell(gemm, rows, calls, repeats)
                        except Exception as error:  # fp8 on a GPU without it, a shape cuBLASLt refuses
                            errors[str(rows)] = f"{type(error).__name__}: {error}"[:200]
                except Exception as error:  # memory
                    errors["weights"] = f"{type(error).__name__}: {error}"[:200]
                finally:
                    gemm = None
                    torch.cuda.empty_cache()
                if errors:
                    print(f"[gemm] {dtype} {mode} {name}: {len(errors)} errors, first {next(iter(errors.values()))}",
                          flush=True)
                if not times:
                    write({"dtype": dtype, "mode": mode, "shape": name, "n": n, "k": k, "errors": errors})
                    continue
                write({"dtype": dtype, "mode": mode, "shape": name, "n": n, "k": k, "copies": copies,
                       "ms": {str(m): t for m, t in times.items()}, "errors": errors})
                print(f"{dtype:5s} {mode:4s} {name:34s} " + " ".join(
                    f"m {m}: {t * 1e3:.1f}" for m, t in list(times.items())[::max(1, len(times) // 5)]) + " µs",
                    flush=True)
    print(f"wrote {path}", flush=True)


def compare(paths: list[Path], device: str) -> str:
    """Markdown: the measured times of one or more measurement files beside the tables' (as shipped
    and despiked) for the same shapes and m."""
    import pandas as pd

    from specbench.fit import kernel_tables

    rows = [json.loads(line) for path in paths for line in path.read_text().splitlines()]
    speed = next((r["host_speed"] for r in rows if "host_speed" in r), {})
    system = kernel_tables.system_name(device)
    table_path = (Path(kernel_tables.despiked_systems(system, "vllm")) / "data" / system / "gemm" / "vllm"
                  / str(kernel_tables.backend_version(system, "vllm")) / "gemm_perf.parquet")
    despiked = pd.read_parquet(table_path)  # the mirror's despiked copy; the package's own file is as shipped
    shipped = pd.read_parquet(kernel_tables._systems_dir() / table_path.relative_to(
        kernel_tables.despiked_systems(system, "vllm")))
    key = ["gemm_dtype", "m", "n", "k"]
    tables = shipped[key + ["latency"]].merge(despiked[key + ["latency"]].rename(columns={"latency": "despiked"}), on=key)
    measured = pd.DataFrame([
        {"gemm_dtype": "bfloat16" if r["dtype"] == "bf16" else "fp8", "mode": r["mode"], "shape": r["shape"],
         "n": r["n"], "k": r["k"], "m": int(m), "measured": t}
        for r in rows if "ms" in r for m, t in r["ms"].items()])
    both = measured.merge(tables, on=key, how="left")
    both["ratio"] = both["measured"] / both["latency"]
    lines = [f"# The kernel tables' GEMMs ({system}, vLLM {kernel_tables.backend_version(system, 'vllm')}) beside "
             f"a timing on {speed.get('gpu')} (torch {speed.get('torch')})", "",
             "ratio: measured / table (as shipped), medians over the shapes (rows of the tables' grid that "
             "Llama-3.1-8B and -70B's linear layers fall on). hot: one weight; cold: weights cycled past the L2. "
             "fp8 here is cuBLASLt (torch._scaled_mm), the table's is vLLM's CUTLASS kernel.", "",
             "| dtype | mode | m 1-8 | m 9-17 | m 32-129 | m 160-257 | m 512-513 | m 1024-8192 | all |",
             "|---|---|---|---|---|---|---|---|---|"]
    bands = [(1, 8), (9, 17), (32, 129), (160, 257), (512, 513), (1024, 8192)]
    for (dtype, mode), group in both.groupby(["gemm_dtype", "mode"], sort=False):
        cells = [f"{group[group.m.between(a, b)].ratio.median():.2f}" for a, b in bands]
        lines.append(f"| {dtype} | {mode} | " + " | ".join(cells) + f" | {group.ratio.median():.2f} |")
    # the table's spikes (shipped above despiked) at these shapes: does the second timing see them?
    spikes = both[(both.mode == "hot") & (both.latency > both.despiked * 1.0001)]
    lines += ["", f"Spikes the despike rule removed at these shapes and m: {len(spikes)}."]
    if len(spikes):
        lines += ["", "| dtype | shape | m | table | despiked | measured here |", "|---|---|---|---|---|---|"]
        for _, r in spikes.iterrows():
            lines.append(f"| {r.gemm_dtype} | {r['shape']} | {r.m} | {r.latency * 1e3:.1f} µs | "
                         f"{r.despiked * 1e3:.1f} µs | {r.measured * 1e3:.1f} µs |")
    # the second timing's own spikes along m, by the tables' rule (kernel_tables.despiked_gemm)
    hot = measured[measured["mode"] == "hot"].rename(columns={"measured": "latency"})
    own = int((kernel_tables.despiked_gemm(hot)["latency"].to_numpy() != hot["latency"].to_numpy()).sum())
    lines += ["", f"Isolated spikes (over {kernel_tables.SPIKE_RATIO}x both m-neighbours) in the timing here: {own}."]
    lines += ["", "| dtype | mode | shape | " + " | ".join(f"m {m}" for m in DETAIL_ROWS)
              + " |", "|---|---|---|" + "---|" * len(DETAIL_ROWS)]
    for (dtype, mode, shape), group in both.groupby(["gemm_dtype", "mode", "shape"], sort=False):
        by_m = group.set_index("m")
        cells = []
        for m in DETAIL_ROWS:
            r = by_m.loc[m] if m in by_m.index else None
            cells.append("" if r is None else f"{r.measured * 1e3:.1f} / {r.latency * 1e3:.1f}")
        lines.append(f"| {dtype} | {mode} | {shape} | " + " | ".join(cells) + " |")
    lines += ["", "Each cell: measured here / the table, µs."]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=Path(os.environ.get("OUT", "/tmp/gemm_timing")))
    parser.add_argument("--budget-s", type=float, default=90.0, help="stop starting shapes after this")
    parser.add_argument("--calls", type=int, default=20, help="GEMMs in a graph")
    parser.add_argument("--repeats", type=int, default=7, help="graph replays timed")
    parser.add_argument("--dtypes", default="bf16,fp8")
    parser.add_argument("--modes", default="hot,cold")
    parser.add_argument("--rows", default=",".join(map(str, ROWS)), help="the m to time (a prefill's: 1024,...,8192)")
    parser.add_argument("--name", default="gemm_timing.jsonl", help="the measurements' file under --out")
    parser.add_argument("--compare", type=Path, nargs="+", help="gemm_timing*.jsonl: their comparison, written "
                        "beside the first")
    parser.add_argument("--device", default="h200", help="the tables' GPU to compare with")
    args = parser.parse_args()
    if args.compare:
        text = compare(args.compare, args.device)
        args.compare[0].with_suffix(".md").write_text(text)
        print(text)
        return
    if not torch.cuda.is_available():
        sys.exit("gemm_timing.py: needs CUDA (it replays CUDA graphs)")
    measure(args.out, args.budget_s, args.calls, args.repeats, args.dtypes.split(","), args.modes.split(","),
            [int(m) for m in args.rows.split(",")], args.name)


if __name__ == "__main__":
    main()
