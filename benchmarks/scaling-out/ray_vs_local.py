"""--executor ray against the local executor, on this machine (issue 28's measurements).

    python benchmarks/scaling-out/ray_vs_local.py vllm OUT     # a vLLM CPU grid: wall-time ratio, speed-ups compared
    python benchmarks/scaling-out/ray_vs_local.py native OUT   # a native grid on a two-node local cluster: same cells and
                                                   # tokens, both nodes used; and 1 node vs 2 equal nodes
    python benchmarks/scaling-out/ray_vs_local.py figure OUT   # speedups.png from the vLLM summary

Each run's directory is kept under OUT with a summary.json; the numbers quoted in
benchmarks/scaling-out/README.md come from there."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

# Two drafts at two K: four speculative servers, the smallest grid where placement has a choice.
# (benchmarks/scaling-out/ray/ ran the first version of the executor on `--k 2` alone.)
VLLM_GRID = ["--engine", "vllm", "--drafts", "ngram,smollm2-135m", "--k", "2,4", "--batch-sizes", "1,4",
             "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "32", "--num-prompts", "4",
             "--repeats", "2", "--dtype", "fp32", "--enforce-eager"]
NATIVE_GRID = ["--drafts", "ngram,smollm2-135m@bf16", "--k", "1,2,3,4", "--batch-sizes", "1,4", "--temperatures", "0",
               "--workloads", "chat", "--max-new-tokens", "32", "--num-prompts", "4"]


def sweep(args: list[str], output: Path, env: dict | None = None) -> float:
    """The sweep's wall time; a run already complete under `output` (with its .wall) is reused."""
    wall = output.parent / f"{output.name}.wall"
    if wall.exists() and json.loads((output / "run.json").read_text()).get("status") == "complete":
        return float(wall.read_text())
    started, before = time.monotonic(), cpu_times()
    done = subprocess.run([sys.executable, "-m", "specbench.cli", "sweep", *args, "--output", str(output)],
                          env={**os.environ, **(env or {})}, capture_output=True, text=True)
    busy, total = (after - earlier for after, earlier in zip(cpu_times(), before))
    (output.parent / f"{output.name}.log").write_text(done.stdout + done.stderr)
    if done.returncode != 0:
        raise SystemExit(f"sweep {output.name} exited {done.returncode}: see {output.name}.log")
    wall.write_text(str(time.monotonic() - started))
    (output.parent / f"{output.name}.cores").write_text(str(busy / total * os.cpu_count()))
    return float(wall.read_text())


def cpu_times() -> tuple[float, float]:
    """(busy, all) jiffies of this machine's cores so far, from /proc/stat."""
    fields = [float(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    idle = fields[3] + fields[4]  # idle, iowait
    return sum(fields) - idle, sum(fields)


def cores_busy(output: Path) -> float | None:
    """The machine's cores busy on average during the sweep (any process: the sweep's own, servers'
    and Ray's, and the little else this machine runs)."""
    path = output.parent / f"{output.name}.cores"
    return float(path.read_text()) if path.exists() else None


def intervals(run_dir: Path) -> dict[str, tuple[float, tuple[float, float] | None]]:
    from specbench.fit.noise import cell_interval
    from specbench.results import load_run

    cells = load_run(run_dir).cells
    speculative = cells[(cells["mode"] == "speculative") & (cells["status"] == "ok")]
    return {row["cell_id"]: (float(row["speedup"]), cell_interval(row)) for row in speculative.to_dict("records")}


def compare(local: Path, ray: Path) -> list[dict]:
    ours, theirs = intervals(local), intervals(ray)
    rows = []
    for cell_id in sorted(ours):
        (a, a_band), (b, b_band) = ours[cell_id], theirs[cell_id]
        inside = lambda point, band: band is not None and band[0] <= point <= band[1]  # noqa: E731
        rows.append({"cell": cell_id, "local": a, "local_interval": a_band, "ray": b, "ray_interval": b_band,
                     "ray_in_local": inside(b, a_band), "local_in_ray": inside(a, b_band),
                     "overlap": a_band is not None and b_band is not None and a_band[0] <= b_band[1]
                     and b_band[0] <= a_band[1]})
    return rows


def vllm(out: Path) -> dict:
    env = {"VLLM_CPU_KVCACHE_SPACE": os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1")}  # four servers fit in 24 GiB
    local_s = sweep(VLLM_GRID, out / "vllm_local", env)
    ray_s = sweep([*VLLM_GRID, "--executor", "ray"], out / "vllm_ray", env)
    return {"grid": VLLM_GRID, "env": env, "local_wall_s": local_s, "ray_wall_s": ray_s,
            "ratio": local_s / ray_s, "cores_busy": {"local": cores_busy(out / "vllm_local"),
                                                     "ray": cores_busy(out / "vllm_ray")},
            "groups": groups(out / "vllm_ray"), "speedups": compare(out / "vllm_local", out / "vllm_ray")}


def native(out: Path) -> dict:
    from ray.cluster_utils import Cluster

    from specbench.results import load_run

    grid = NATIVE_GRID
    local_s = sweep(grid, out / "native_local")
    walls = {}
    for nodes in (1, 2):
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
        for _ in range(nodes):
            cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        try:
            walls[nodes] = sweep([*grid, "--executor", "ray"], out / f"native_ray_{nodes}node",
                                 {"RAY_ADDRESS": cluster.address})
        finally:
            cluster.shutdown()
    here, there = load_run(out / "native_local"), load_run(out / "native_ray_2node")

    def tokens(run) -> dict:
        return {(r.cell_id, r.repeat, r.request_id): list(r.tokens) for r in run.requests.itertuples()}

    measuring = {nodes: measuring_s(out / f"native_ray_{nodes}node") for nodes in walls}
    return {"grid": grid, "local_wall_s": local_s, "ray_wall_s": walls, "ray_measuring_s": measuring,
            "cores_busy": {"local": cores_busy(out / "native_local"),
                           **{f"ray_{n}node": cores_busy(out / f"native_ray_{n}node") for n in walls}},
            "groups": {nodes: groups(out / f"native_ray_{nodes}node") for nodes in walls},
            "same_cells": sorted(here.cells["cell_id"]) == sorted(there.cells["cell_id"]),
            "identical_greedy_tokens": tokens(here) == tokens(there),
            "nodes_used": int(there.cells["node_id"].nunique()),
            "two_nodes_vs_one_over_two": walls[2] / (walls[1] / 2),
            "two_nodes_vs_one_over_two_measuring": measuring[2] / (measuring[1] / 2),
            "goal": "within 1.25x of one node's time / 2, not counting the start: ray_measuring_s runs from the "
                    "first cell's start to the last group's end (ray_wall_s also counts Ray's connection, each "
                    "task's imports, model loads and hardware probes)"}


def groups(run_dir: Path) -> list[dict]:
    """Each pairing group's node, cells and times, from run.json."""
    executor = json.loads((run_dir / "run.json").read_text())["executor"]
    return [{"group": g["group"], "node": g["node_id"][:8], "cells": g.get("cells"),
             "start_s": g["first_cell_at"] - g["started_at"], "measuring_s": g["finished_at"] - g["first_cell_at"]}
            for g in executor["groups"]]


def measuring_s(run_dir: Path) -> float:
    """From the first cell's start on any node to the last group's end."""
    executor = json.loads((run_dir / "run.json").read_text())["executor"]
    return max(g["finished_at"] for g in executor["groups"]) - min(g["first_cell_at"] for g in executor["groups"])


def figure(out: Path) -> dict:
    """speedups.png: each speculative cell's speed-up and 95 % interval, local against Ray; and the
    wall times."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    summary = json.loads((out / "vllm_summary.json").read_text())
    rows = summary["speedups"]
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.6), gridspec_kw={"width_ratios": [3, 1]})
    low, high = 0.25, 4.0  # a log scale, clipped: two repeats give a wide t-interval; clipped ends are arrows
    for offset, name, colour in ((-0.12, "local", "#1f77b4"), (0.12, "ray", "#d62728")):
        xs = [i + offset for i in range(len(rows))]
        points = [row[name] for row in rows]
        bands = [[max(b[0], low), min(b[1], high)] for b in (row[f"{name}_interval"] or [p, p]
                                                             for row, p in zip(rows, points))]
        errors = [[p - b[0] for p, b in zip(points, bands)], [b[1] - p for p, b in zip(points, bands)]]
        left.errorbar(xs, points, yerr=errors, fmt="o", capsize=4, color=colour, label=f"--executor {name}")
        for x, row in zip(xs, rows):
            band = row[f"{name}_interval"]
            if band and band[1] > high:
                left.annotate("", (x, high * 1.12), (x, high), arrowprops={"arrowstyle": "->", "color": colour})
            if band and band[0] < low:
                left.annotate("", (x, low / 1.12), (x, low), arrowprops={"arrowstyle": "->", "color": colour})
    left.axhline(1.0, color="#888", lw=1, ls="--")
    left.set_yscale("log")
    left.set_ylim(low / 1.2, high * 1.2)
    left.set_yticks([0.25, 0.5, 1, 2, 4], ["0.25×", "0.5×", "1×", "2×", "4×"])
    left.minorticks_off()
    labels = [row["cell"].replace("chat|", "").replace("|T0", "").replace("|", "\n")
              for row in rows]
    left.set_xticks(range(len(rows)), labels, fontsize=8)
    left.set_ylabel("speed-up, 95 % interval (log scale, clipped: arrows)")
    left.set_title("vLLM CPU grid: the same cells, local and on Ray", fontsize=10)
    left.legend(fontsize=8, loc="upper right")
    left.grid(alpha=0.3, axis="y")
    right.bar(["local", "ray"], [summary["local_wall_s"] / 60, summary["ray_wall_s"] / 60], color=["#1f77b4", "#d62728"])
    right.set_ylabel("wall time (min)")
    right.set_title(f"{summary['ratio']:.2f}× faster on Ray", fontsize=10)
    fig.tight_layout()
    fig.savefig(out / "speedups.png", dpi=120)
    return {"figure": str(out / "speedups.png")}


if __name__ == "__main__":
    which, out = sys.argv[1], Path(sys.argv[2])
    out.mkdir(parents=True, exist_ok=True)
    summary = {"vllm": vllm, "native": native, "figure": figure}[which](out)
    (out / f"{which}_summary.json").write_text(json.dumps(summary, indent=2, default=str))
    print(json.dumps(summary, indent=2, default=lambda v: None if isinstance(v, float) and math.isnan(v) else str(v)))
