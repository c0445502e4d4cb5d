"""The fleet simulator against NVIDIA's measured vLLM serving rows (issue 40, part 2): every dense
vLLM aggregated row of aiconfigurator-core's `systems/silicon_sample.csv` (Llama-3.1-70B,
Qwen3-32B, Llama-3.1-8B; H100, H200, B200; TP 1-8; concurrency 4-144) simulated at its own model,
GPU, TP, precision, concurrency and lengths, with nothing fitted to those rows.

Each row is a closed loop of C clients (C: the row's concurrency) run as the benchmark that
measured it: InferenceMAX's client (`fleet.plan.INFERENCEMAX`: benchmark_serving.py, random
prompts of 0.8-1× the row's lengths, 10·C requests, all C clients started at once, the means over
every request). The Llama-3.1-70B rows (225 of 339) are InferenceMAX's own length pairs and
concurrencies; the csv does not say how the Qwen3-32B and Llama-3.1-8B rows were taken, and they are
simulated the same way. The steady state (`fleet.plan.STEADY`: clients started apart, the first
and last requests left out) is shown beside: the clients' start alone moves TTFT by half. Steps
are priced by the kernel tables' mixed prefill+decode step, the host's time per step measured by
`benchmarks/host-costs/host_step.py` (attention on an fp8 KV cache at a 16-bit one's speed
where the rows' vLLM read it so: `attention_kv_quant`), and, for a step vLLM runs outside CUDA graphs, the
host's time to launch its kernels measured by `benchmarks/host-costs/launch_host.py` on an
H100 server (`specbench.fleet.tables`), each request's TTFT holding the API server's own time measured
by `benchmarks/host-costs/api_server.py`, the replica
as vLLM's defaults and the GPU's memory make it, admitting as the rows' vLLM did: every row was
measured on a vLLM from before `scheduler_reserve_full_isl` (vLLM PR #37307, March 2026; the
Llama-3.1-70B rows in October 2025, the others on vLLM 0.12), which admitted a waiting request when
its first chunk fitted the KV cache, not its whole prompt.

    python benchmarks/silicon-rows/silicon.py [--limit N] [--out DIR] [--fp8-static]

Writes silicon.csv (every row: measured, simulated, errors, or why it was not simulated) and
silicon.md (median |error| per GPU, length pair, model and precision, beside aiconfigurator's own
estimate of the same rows where silicon_aic.csv, written by silicon_aic.py, is there). Without
--limit or --fp8-static, also the silicon check a plan on the tables prints: specbench/data/validation.json's
"silicon" (`specbench.measured.silicon_figures`).
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specbench.fit import kernel_tables  # noqa: E402
from specbench.fit.table_plan import parameters  # noqa: E402
from specbench.fleet.plan import INFERENCEMAX, STEADY, closed_loop  # noqa: E402
from specbench.fit.host_cost import COMPILED_LAUNCH, VLLM_HOST_STEP, HostCost, LaunchCost  # noqa: E402
from specbench.fleet.tables import ServerFlags, replica_spec, step_cost  # noqa: E402
from specbench.measured import silicon_figures, write_validation  # noqa: E402
from specbench.results import cpu_name  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import silicon_aic  # noqa: E402  (the rows and their models, shared with aiconfigurator's own estimate)
from silicon_aic import MODELS  # noqa: E402

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
SILICON_WHAT = ("the fleet simulator's mean TPOT and TTFT against NVIDIA's measured vLLM serving rows (every dense "
                "aggregated row of aiconfigurator-core 0.12's silicon_sample.csv, nothing fitted to them), the clients "
                "as InferenceMAX's benchmark ran them")


def shown(path: Path) -> str:
    """`path` as the repository names it, where it is inside it."""
    path = path.resolve()
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def dense_vllm_rows() -> list[dict]:
    return silicon_aic.dense_vllm_rows(kernel_tables.silicon_rows_path())


def served_as(row: dict) -> ServerFlags:
    """How the row's server was configured, where the benchmark that measured it says so.

    The Llama-3.1-70B rows are InferenceMAX's (measured 2025-10-29, vllm/vllm-openai:v0.10.2). Its
    launch scripts of that day (SemiAnalysisAI/InferenceX at 9596d23: benchmarks/70b_fp8_h100_slurm.sh,
    70b_fp8_h200_slurm.sh, 70b_fp8_b200_docker.sh, 70b_fp4_b200_docker.sh) served every GPU with
    `kv-cache-dtype: fp8`, `max-num-batched-tokens: 8192`, `async-scheduling: true` and
    `no-enable-prefix-caching: true`, and
    `--max-num-seqs` the concurrency (H100, H200) or 512 (B200), and on B200 `cudagraph_mode:
    FULL_DECODE_ONLY` (every step that carries a prefill outside CUDA graphs). H100 and H200 kept
    0.10.2's default, PIECEWISE (each layer's attention between graph pieces, decodes too; vLLM made
    FULL_AND_PIECEWISE its default after 0.10.2, vllm-project/vllm#25444). The csv does not say how the
    Qwen3-32B and Llama-3.1-8B rows were served: vLLM's defaults for them, as of the vLLM the four
    Qwen3-32B rows that name their server ran (0.12, in Dynamo's vllm-runtime 0.8.0), which scheduled
    synchronously (async scheduling became vLLM's default in 0.14) and cached prefixes (random prompts
    share none: a preempted request finds its own)."""
    if row["model_path"] != "meta-llama/Llama-3.1-70B":
        return ServerFlags(async_scheduling=False)
    b200 = row["system"].startswith("b200")
    return ServerFlags(kv_cache_dtype="fp8", max_num_batched_tokens=8192, max_num_seqs=512 if b200 else int(row["batch_size"]),
                       async_scheduling=True, prefix_caching=False,
                       cudagraph_mode="FULL_DECODE_ONLY" if b200 else "PIECEWISE")


def attention_kv_quant(row: dict, server: ServerFlags) -> str | None:
    """The KV-cache precision the tables price the row's attention at (None: 16-bit): the server's
    `--kv-cache-dtype`, but for the Llama-3.1-70B rows on H100 and H200. Their vLLM 0.10.2 (released
    2025-09-13) ran Hopper's attention on its FlashAttention 3 build, whose fp8 tiles for head size 128
    a decode then used were tuned only on 2025-09-29 (vllm-project/flash-attention#96, commit 07602ad:
    "with the current mainline config, FP8 decoding is not faster at all than BF16"): those rows read
    an fp8 cache at a 16-bit one's speed, while it held twice the tokens. The tables are vLLM 0.24's."""
    hopper = row["system"].startswith(("h100", "h200"))
    if row["model_path"] == "meta-llama/Llama-3.1-70B" and hopper:
        return None
    return None if server.kv_cache_dtype == "auto" else server.kv_cache_dtype


# The rows whose checkpoints carry static per-tensor activation scales: InferenceMAX served the 70B fp8 rows
# from nvidia/Llama-3.3-70B-Instruct-FP8, and the 8B rows name nvidia/Llama-3.1-8B-Instruct-FP8, both ModelOpt
# FP8 (quant_algo FP8), which vLLM runs with kFp8StaticTensorSym activations (ModelOptFp8LinearMethod). The
# tables' fp8 GEMMs were timed with dynamic activations (aiconfigurator's collector: Fp8Config
# activation_scheme="dynamic"); aiconfigurator prices such a checkpoint as fp8_static, the same GEMM less its
# separately measured cost of computing the scale. Only with --fp8-static (see main).
STATIC_FP8_CHECKPOINTS = ("meta-llama/Llama-3.1-70B", "nvidia/Llama-3.1-8B-Instruct-FP8")


def gemm_quant(row: dict, fp8_static: bool = False) -> str | None:
    """The tables' GEMM mode the row is priced at: the csv's, or fp8_static for a static-scale checkpoint's fp8
    rows where `fp8_static` asks for it."""
    quant = row["gemm_quant_mode"] or None
    if fp8_static and quant == "fp8" and row["model_path"] in STATIC_FP8_CHECKPOINTS:
        return "fp8_static"
    return quant


def priced_row(row: dict, forwards: dict, server: ServerFlags, host: HostCost | None = VLLM_HOST_STEP,
               launch: LaunchCost | None = COMPILED_LAUNCH, fp8_static: bool = False):
    """The row's step cost and replica at its model, GPU, TP and precision, its server's flags as
    `server` says, the host's time per step `host` and to launch a step outside CUDA graphs `launch`
    (None: the kernels' alone), its GEMMs at `gemm_quant(row, fp8_static)`; `forwards` caches the priced
    forwards across rows."""
    system, tp = row["system"], int(row["tp_size"])
    quant = gemm_quant(row, fp8_static)
    config = kernel_tables.shipped_model_config(MODELS[row["model_path"]])
    kv_quant = attention_kv_quant(row, server)
    key = (row["model_path"], system, tp, quant, kv_quant)
    if key not in forwards:
        forwards[key] = kernel_tables.Forward(config, system, "vllm", tp, name=row["model_path"], gemm_quant=quant,
                                              kv_quant=kv_quant)
    # the rows' vLLM admitted on the first chunk's blocks (see the docstring)
    spec = dataclasses.replace(server.applied(replica_spec(config, system, tp, quant,
                                                           kv_cache_dtype=server.kv_cache_dtype)),
                               reserve_full_input=False)
    cost = step_cost(forwards[key], int(row["isl"]), int(row["osl"]), async_scheduling=spec.async_scheduling,
                     host=host, launch=launch, cudagraph_mode=server.cudagraph_mode)
    return cost, spec


def mean_latencies(row: dict, cost, spec, clients) -> dict:
    """The row's closed loop run by `clients`: mean TTFT and TPOT (ms) over the requests measured, and preemptions."""
    out, keep = closed_loop(cost, spec, int(row["batch_size"]), int(row["isl"]), int(row["osl"]), clients=clients)
    return {"ttft_ms": float(np.mean(out.ttft_s[keep])) * 1e3, "tpot_ms": float(np.nanmean(out.tpot_s[keep])) * 1e3,
            "preemptions": out.preemptions}


def simulate_row(row: dict, forwards: dict, fp8_static: bool = False) -> dict:
    cost, spec = priced_row(row, forwards, served_as(row), fp8_static=fp8_static)
    found = {"kv_tokens": spec.kv_capacity_tokens}
    for clients, prefix in ((INFERENCEMAX, "sim"), (STEADY, "steady")):
        found |= {f"{prefix}_{name}": value for name, value in mean_latencies(row, cost, spec, clients).items()}
    return found


# a row whose own throughput implies its prompts' GEMMs alone at over this share of its GPUs' dense
# tensor peak, its decodes beside them, was not measured computing every prompt token
IMPLAUSIBLE_PREFILL_SHARE = 0.5


def prefill_peak_share(row: dict) -> float:
    """The compute the row's measured throughput implies for its prompts, as a share of its GPUs'
    dense tensor-core peak at its precision: requests/s by Little's law (C / (TTFT + (output - 1)
    · TPOT)) × the prompt's tokens × 2 FLOPs per layer weight (attention and the decodes left out:
    a floor on the work)."""
    config = kernel_tables.shipped_model_config(MODELS[row["model_path"]])
    layer_weights = parameters(config) - parameters(config, 0)
    e2e_s = (float(row["silicon_ttft_ms"]) + (int(row["osl"]) - 1) * float(row["silicon_tpot_ms"])) / 1e3
    flops = int(row["batch_size"]) / e2e_s * int(row["isl"]) * 2 * layer_weights
    return flops / (kernel_tables.tensor_flops(row["system"], row["precision"] or "bf16") * int(row["tp_size"]))


def _median_abs(errors: pd.Series) -> float:
    return errors.abs().median()


# GPUs whose rows share a model, precision, TP, concurrency and lengths (InferenceMAX measured the
# Llama-3.1-70B ones with one image, checkpoint, server flags and client on each GPU)
GPU_PAIRS = (("h200_sxm", "h100_sxm"), ("b200_sxm", "h200_sxm"), ("b200_sxm", "h100_sxm"))
SAME_ROW = ["model", "precision", "tp", "concurrency", "lengths"]


def gpu_pair_lines(done: pd.DataFrame) -> list[str]:
    """The same row on two GPUs: how much faster one measured than the other, and how much faster the
    simulator and aiconfigurator say, their medians, and the simulator's ratio against the measured one
    by length pair and TP. What a GPU's own constant (its tables, its host) would fix shows here apart
    from what the model, the client or the server would."""
    lines = ["The same row on two GPUs (the model, precision, TP, concurrency and lengths alike): the median "
             "ratio of their mean TPOT and TTFT, measured, simulated and aiconfigurator's; then the simulated "
             "ratio against the measured one (median, %) by length pair and TP, below zero where the simulator "
             "makes the first GPU the faster by more than it measured.", "",
             "| GPUs | rows | TPOT measured | simulated | aiconfigurator | TTFT measured | simulated | aiconfigurator |",
             "|---|---|---|---|---|---|---|---|"]
    gaps = []
    for first, second in GPU_PAIRS:
        pair = done[done["system"] == first].merge(done[done["system"] == second], on=SAME_ROW, suffixes=("_a", "_b"))
        if pair.empty:
            continue
        ratio = {f"{who}_{metric}": pair[f"{who}_{metric}_ms_a"] / pair[f"{who}_{metric}_ms_b"]
                 for who in ("silicon", "sim", "aic") for metric in ("tpot", "ttft")}
        lines.append(f"| {first} / {second} | {len(pair)} | " + " | ".join(
            f"{ratio[f'{who}_{metric}'].median():.3f}" for metric in ("tpot", "ttft") for who in ("silicon", "sim", "aic"))
            + " |")
        for metric in ("tpot", "ttft"):
            gap = pair.assign(gap=(ratio[f"sim_{metric}"] / ratio[f"silicon_{metric}"] - 1) * 100)
            grid = gap.pivot_table(index="lengths", columns="tp", values="gap", aggfunc="median")
            gaps += [f"{first} / {second}, {metric.upper()}: simulated ratio against measured, % (rows: lengths; "
                     "columns: TP)", "", "| lengths | " + " | ".join(f"TP{tp}" for tp in grid.columns) + " |",
                     "|---|" + "---|" * len(grid.columns)]
            gaps += [f"| {lengths} | " + " | ".join("" if value != value else f"{value:+.0f}" for value in values) + " |"
                     for lengths, values in grid.iterrows()]
            gaps.append("")
    return lines + [""] + gaps


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=0, help="only the first N rows (a quick look)")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--fp8-static", action="store_true",
                        help="price the static-scale FP8 checkpoints' rows (STATIC_FP8_CHECKPOINTS) at "
                             "aiconfigurator's fp8_static GEMMs, not the tables' dynamic fp8 (a check, not the "
                             "headline: docs/fleet-validation.md)")
    args = parser.parse_args()
    rows = dense_vllm_rows()[:args.limit or None]
    forwards: dict = {}
    results = []
    started = time.perf_counter()
    for row in rows:
        base = {"id": row["id"], "model": row["model_path"], "system": row["system"], "precision": row["precision"]
                or "bf16", "tp": int(row["tp_size"]), "concurrency": int(row["batch_size"]),
                "lengths": f"{row['isl']}/{row['osl']}", "silicon_ttft_ms": float(row["silicon_ttft_ms"]),
                "silicon_tpot_ms": float(row["silicon_tpot_ms"]), "prefill_peak_share": prefill_peak_share(row)}
        try:
            base |= simulate_row(row, forwards, args.fp8_static)
            for prefix in ("sim", "steady"):
                base[f"{prefix}_tpot_error"] = base[f"{prefix}_tpot_ms"] / base["silicon_tpot_ms"] - 1
                base[f"{prefix}_ttft_error"] = base[f"{prefix}_ttft_ms"] / base["silicon_ttft_ms"] - 1
            base["not_simulated"] = ""
        except (ValueError, kernel_tables.TablesUnavailable) as error:
            base["not_simulated"] = str(error).splitlines()[0]
        results.append(base)
    table = pd.DataFrame(results)
    seconds = time.perf_counter() - started
    aic_path = HERE / "silicon_aic.csv"
    if aic_path.exists():
        aic = pd.read_csv(aic_path)
        table = table.merge(aic, on="id", how="left")
        table["aic_tpot_error"] = table["aic_tpot_ms"] / table["silicon_tpot_ms"] - 1
        table["aic_ttft_error"] = table["aic_ttft_ms"] / table["silicon_ttft_ms"] - 1
    else:
        table["aic_tpot_error"] = table["aic_ttft_error"] = np.nan
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "silicon.csv", index=False)
    if not args.limit and not args.fp8_static:  # the headline: what a plan on the tables says of its GPU
        write_validation("silicon", silicon_figures(table), what=SILICON_WHAT, source=shown(args.out / "silicon.csv"),
                         machine=f"NVIDIA's rows (H100, H200, B200) simulated on {cpu_name()}, {os.cpu_count()} CPUs",
                         command="python benchmarks/silicon-rows/silicon.py")
    done = table[table["not_simulated"] == ""]
    lines = [f"# The fleet simulator against NVIDIA's measured vLLM rows ({len(table)} dense aggregated rows, "
             f"{len(done)} simulated, {seconds:.0f} s)", "",
             "Median |error| of the simulated mean TPOT and TTFT against the measured ones, nothing fitted to these "
             "rows; the clients run as InferenceMAX's benchmark (silicon.py says how). Beside: aiconfigurator 0.12's "
             "own estimate of the same rows (silicon_aic.py), and the simulator's TTFT with clients started apart "
             "(a steady state). Signed medians in brackets.", ""]
    for by in ("system", "lengths", "model", "precision"):
        grouped = done.groupby(by).agg(rows=("id", "count"), tpot=("sim_tpot_error", _median_abs),
                                       ttft=("sim_ttft_error", _median_abs), tpot_bias=("sim_tpot_error", "median"),
                                       ttft_bias=("sim_ttft_error", "median"), aic_rows=("aic_tpot_error", "count"),
                                       aic_tpot=("aic_tpot_error", _median_abs), aic_ttft=("aic_ttft_error", _median_abs),
                                       steady_ttft=("steady_ttft_error", "median"))
        lines += [f"| {by} | rows | TPOT | TTFT | aiconfigurator rows | aiconfigurator TPOT | aiconfigurator TTFT "
                  f"| TTFT, clients started apart |", "|---|---|---|---|---|---|---|---|"]
        lines += [f"| {key} | {int(g.rows)} | {g.tpot:.1%} ({g.tpot_bias:+.1%}) | {g.ttft:.1%} ({g.ttft_bias:+.1%}) "
                  f"| {int(g.aic_rows)} | {g.aic_tpot:.1%} | {g.aic_ttft:.1%} | ({g.steady_ttft:+.1%}) |"
                  for key, g in grouped.iterrows()]
        lines.append("")
    both = done[done["aic_tpot_error"].notna()]
    lines += [f"All {len(done)} simulated rows: median |TPOT error| {_median_abs(done['sim_tpot_error']):.1%}, median "
              f"|TTFT error| {_median_abs(done['sim_ttft_error']):.1%}; TPOT within 10 %: "
              f"{(done['sim_tpot_error'].abs() <= 0.1).mean():.0%} of rows, TTFT within 20 %: "
              f"{(done['sim_ttft_error'].abs() <= 0.2).mean():.0%}. With clients started apart: "
              f"{_median_abs(done['steady_tpot_error']):.1%} and {_median_abs(done['steady_ttft_error']):.1%}.", ""]
    if len(both):
        lines += [f"On the {len(both)} rows aiconfigurator estimates: the simulator {_median_abs(both['sim_tpot_error']):.1%} "
                  f"TPOT, {_median_abs(both['sim_ttft_error']):.1%} TTFT; aiconfigurator "
                  f"{_median_abs(both['aic_tpot_error']):.1%} TPOT, {_median_abs(both['aic_ttft_error']):.1%} TTFT.", ""]
        fast = both[both["prefill_peak_share"] > IMPLAUSIBLE_PREFILL_SHARE]
        if len(fast):
            rest = both.drop(fast.index)
            models = ", ".join(f"{n} {model}" for model, n in fast["model"].value_counts().items())
            lines += [f"{len(fast)} of them ({models}) imply their prompts' GEMMs alone at over "
                      f"{IMPLAUSIBLE_PREFILL_SHARE:.0%} of their GPUs' dense tensor peak (up to "
                      f"{fast['prefill_peak_share'].max():.0%}; `prefill_peak_share`: requests/s by Little's law × "
                      f"the prompt × 2 FLOPs a layer weight), their decodes beside them: measured so fast only if "
                      f"much of each prompt was not computed (its KV found in vLLM's prefix cache, for instance). "
                      f"The other {len(rest)}: the simulator {_median_abs(rest['sim_tpot_error']):.1%} TPOT, "
                      f"{_median_abs(rest['sim_ttft_error']):.1%} TTFT; aiconfigurator "
                      f"{_median_abs(rest['aic_tpot_error']):.1%} TPOT, {_median_abs(rest['aic_ttft_error']):.1%} "
                      f"TTFT.", ""]
        missing = table[table["aic_tpot_error"].isna() & table["aic_error"].notna()]
        if len(missing):
            lines += [f"aiconfigurator gave no estimate for {len(missing)} rows"] + [
                f"- {n} × {why}" for why, n in missing["aic_error"].value_counts().items()] + [""]
    lines += gpu_pair_lines(done)
    skipped = table[table["not_simulated"] != ""]
    if len(skipped):
        lines += [f"Not simulated: {len(skipped)} rows"] + [f"- {n} × {why}" for why, n in
                                                           skipped["not_simulated"].value_counts().items()]
    (args.out / "silicon.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
