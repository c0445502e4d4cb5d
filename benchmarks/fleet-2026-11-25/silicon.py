"""The fleet simulator against NVIDIA's measured vLLM serving rows (issue 40, part 2): every dense
vLLM aggregated row of aiconfigurator-core's `systems/silicon_sample.csv` (Llama-3.1-70B,
Qwen3-32B, Llama-3.1-8B; H100, H200, B200; TP 1-8; concurrency 4-144) simulated at its own model,
GPU, TP, precision, concurrency and lengths, with nothing fitted to those rows.

Each row is a closed loop: C clients, each sending its next request (ISL tokens in, OSL out) when
its last finished. The clients start a C-th of a request's lifetime apart (a benchmark's steady
state, not its first burst), 12 requests each; the first and last request of each client are left
out of the means, as warm-up and drain. Steps are priced by the kernel tables' mixed prefill+decode
step (`specbench.fleet.tables`), the replica as vLLM's defaults and the GPU's memory make it.

    python benchmarks/fleet-2026-11-25/silicon.py [--limit N] [--out DIR]

Writes silicon.csv (every row: measured, simulated, errors, or why it was not simulated) and
silicon.md (median |error| per GPU and per length pair) next to this file.
"""

from __future__ import annotations

import argparse
import csv
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specbench.fit import kernel_tables  # noqa: E402
from specbench.fleet.plan import closed_loop  # noqa: E402
from specbench.fleet.tables import replica_spec, step_cost  # noqa: E402

HERE = Path(__file__).resolve().parent
# the rows' model ids -> the configs the package ships (same architecture; the FP8 8B is Llama-3.1-8B
# with FP8 GEMMs, which the row's precision gives)
MODELS = {"meta-llama/Llama-3.1-70B": "meta-llama/Meta-Llama-3.1-70B",
          "nvidia/Llama-3.1-8B-Instruct-FP8": "meta-llama/Meta-Llama-3.1-8B",
          "Qwen/Qwen3-32B": "Qwen/Qwen3-32B"}
REQUESTS_PER_CLIENT = 12  # fleet.plan.closed_loop: each client's next request 1 ms after its last token
# aiconfigurator's own vLLM correction, shown beside (not used by) the simulator: a per-request CPU
# dispatch cost of 0.8 ms per layer, which NVIDIA calibrated on this same corpus
AIC_DISPATCH_MS_PER_LAYER = 0.8


def dense_vllm_rows() -> list[dict]:
    with open(kernel_tables.silicon_rows_path()) as handle:
        return [row for row in csv.DictReader(handle)
                if row["backend"] == "vllm" and row["mode"] == "agg" and row["model_path"] in MODELS]


def simulate_row(row: dict, forwards: dict) -> dict:
    system, tp, concurrency = row["system"], int(row["tp_size"]), int(row["batch_size"])
    isl, osl = int(row["isl"]), int(row["osl"])
    quant = row["gemm_quant_mode"] or None
    config = kernel_tables.shipped_model_config(MODELS[row["model_path"]])
    key = (row["model_path"], system, tp, quant)
    if key not in forwards:
        forwards[key] = kernel_tables.Forward(config, system, "vllm", tp, name=row["model_path"], gemm_quant=quant)
    cost = step_cost(forwards[key], isl, osl)
    spec = replica_spec(config, system, tp, quant)
    out, keep = closed_loop(cost, spec, concurrency, isl, osl, requests_per_client=REQUESTS_PER_CLIENT)
    ttft_ms = float(np.mean(out.ttft_s[keep])) * 1e3
    return {"sim_ttft_ms": ttft_ms, "sim_tpot_ms": float(np.nanmean(out.tpot_s[keep])) * 1e3,
            "sim_ttft_plus_aic_dispatch_ms": ttft_ms + AIC_DISPATCH_MS_PER_LAYER * config["num_hidden_layers"],
            "preemptions": out.preemptions, "kv_tokens": spec.kv_capacity_tokens}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=0, help="only the first N rows (a quick look)")
    parser.add_argument("--out", type=Path, default=HERE)
    args = parser.parse_args()
    rows = dense_vllm_rows()[:args.limit or None]
    forwards: dict = {}
    results = []
    started = time.perf_counter()
    for row in rows:
        base = {"id": row["id"], "model": row["model_path"], "system": row["system"], "precision": row["precision"]
                or "bf16", "tp": int(row["tp_size"]), "concurrency": int(row["batch_size"]),
                "lengths": f"{row['isl']}/{row['osl']}", "silicon_ttft_ms": float(row["silicon_ttft_ms"]),
                "silicon_tpot_ms": float(row["silicon_tpot_ms"])}
        try:
            base |= simulate_row(row, forwards)
            base["tpot_error"] = base["sim_tpot_ms"] / base["silicon_tpot_ms"] - 1
            base["ttft_error"] = base["sim_ttft_ms"] / base["silicon_ttft_ms"] - 1
            base["ttft_error_with_aic_dispatch"] = base["sim_ttft_plus_aic_dispatch_ms"] / base["silicon_ttft_ms"] - 1
            base["not_simulated"] = ""
        except (ValueError, kernel_tables.TablesUnavailable) as error:
            base["not_simulated"] = str(error).splitlines()[0]
        results.append(base)
    table = pd.DataFrame(results)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "silicon.csv", index=False)
    done = table[table["not_simulated"] == ""]
    lines = [f"# The fleet simulator against NVIDIA's measured vLLM rows ({len(table)} dense aggregated rows, "
             f"{len(done)} simulated, {time.perf_counter() - started:.0f} s)", "",
             "Median |error| of the simulated mean TPOT and TTFT against the measured ones (no fitting to these rows).",
             ""]
    for by in ("system", "lengths", "model", "precision"):
        grouped = done.groupby(by).agg(rows=("id", "count"), tpot=("tpot_error", lambda e: e.abs().median()),
                                       ttft=("ttft_error", lambda e: e.abs().median()),
                                       tpot_bias=("tpot_error", "median"), ttft_bias=("ttft_error", "median"),
                                       ttft_aic=("ttft_error_with_aic_dispatch", lambda e: e.abs().median()))
        lines += [f"| {by} | rows | median abs TPOT error | median abs TTFT error | median TPOT error | median TTFT error "
                  f"| median abs TTFT error with aiconfigurator's dispatch cost |", "|---|---|---|---|---|---|---|"]
        lines += [f"| {key} | {int(g.rows)} | {g.tpot:.1%} | {g.ttft:.1%} | {g.tpot_bias:+.1%} | {g.ttft_bias:+.1%} | {g.ttft_aic:.1%} |"
                  for key, g in grouped.iterrows()]
        lines.append("")
    lines += [f"All simulated rows: median |TPOT error| {done['tpot_error'].abs().median():.1%}, median |TTFT error| "
              f"{done['ttft_error'].abs().median():.1%} ({done['ttft_error_with_aic_dispatch'].abs().median():.1%} with "
              f"aiconfigurator's dispatch cost added); TPOT within 10 %: {(done['tpot_error'].abs() <= 0.1).mean():.0%} "
              f"of rows.", ""]
    skipped = table[table["not_simulated"] != ""]
    if len(skipped):
        lines += [f"Not simulated: {len(skipped)} rows"] + [f"- {n} × {why}" for why, n in
                                                           skipped["not_simulated"].value_counts().items()]
    (args.out / "silicon.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
