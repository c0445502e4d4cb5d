"""The fleet simulator against NVIDIA's measured vLLM serving rows of mixture-of-experts models: every
aggregated vLLM row of aiconfigurator-core's `systems/silicon_sample.csv` for gpt-oss-120b, Kimi-K2.5,
MiniMax-M2.5 and Qwen3-235B-A22B-FP8 (H100, H200, B200, B300) simulated at its own model, GPU, TP,
expert layout, precision, concurrency and lengths, with nothing fitted to those rows.

Each row is run as `silicon.py` runs the dense ones: a closed loop of C clients as InferenceMAX's
benchmark client (`fleet.plan.INFERENCEMAX`), steps priced by the kernel tables' mixed prefill+decode
step (`kernel_tables.Forward` with the row's expert layout), the host's, launch and executor costs and
the API server's time per request as `silicon.py` prices them. The layout: experts split over the TP
GPUs where the row's moe_tp_size is its tp_size, whole experts per GPU (vLLM's
--enable-expert-parallel) where its moe_ep_size is. A row whose experts span more GPUs than its
attention's TP (attention_dp_size > 1, or moe_tp_size × moe_ep_size above tp_size where the csv gives
no attention_dp_size) runs data-parallel attention ranks, which the replica simulator does not model:
counted, not simulated.

The precision: the row's gemm_quant_mode / moe_quant_mode (always equal in these rows) where the
tables price it on that GPU. Where they do not, the checkpoint's own precision where that is what the
row ran (`RAN_CHECKPOINT`: gpt-oss-120b's "fp4" rows served openai/gpt-oss-120b, whose experts are
MXFP4 and its other weights 16-bit; Kimi-K2.5's "int4" rows served moonshotai/Kimi-K2.5, INT4
weight-only experts, 16-bit attention; MiniMax-M2.5's and Qwen3-235B-A22B-FP8's "fp8" rows served
their own block-scaled FP8 checkpoints); any other row the tables cannot price is counted, not
simulated. The rows labelled "fp8" whose checkpoint is block-scaled FP8 are also simulated at the
checkpoint's fp8_block (the columns ckpt_*), beside the label's per-tensor fp8.

The server: the rows are InferenceMAX's runs (vllm/vllm-openai 0.11-0.19 images); its launch scripts
turn prefix caching off and schedule asynchronously (`served_as`); everything else is vLLM's default on
that GPU (16-bit KV cache, its batched-token budget and sequence limit, 90 % of the GPUs' memory).
Rows on a vLLM before 0.19 admit a waiting request when its first chunk fits the KV cache
(`reserve_full_input=False`, as in `silicon.py`).

    python benchmarks/silicon-rows/silicon_moe.py [--limit N] [--out DIR] [--workers N]

Writes silicon_moe.csv (every row: measured, simulated, errors, the precision and layout priced, or why
it was not simulated) and silicon_moe.md (median |error| and signed medians per model and GPU, per
layout, and the rows not simulated by reason). aiconfigurator's own estimate is shown where
silicon_aic.csv holds the row.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import os
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from specbench.fit import kernel_tables  # noqa: E402
from specbench.fit.host_cost import COMPILED_LAUNCH, VLLM_HOST_STEP  # noqa: E402
from specbench.fit.table_plan import decoder_config  # noqa: E402
from specbench.fleet.plan import INFERENCEMAX  # noqa: E402
from specbench.fleet.tables import ServerFlags, replica_spec, step_cost  # noqa: E402
from specbench.fleet.workers import in_processes  # noqa: E402
from specbench.measured import silicon_moe_figures, write_validation  # noqa: E402
from specbench.results import cpu_name  # noqa: E402

from silicon import _median_abs, mean_latencies, shown  # noqa: E402

SILICON_MOE_WHAT = ("the fleet simulator's mean TPOT and TTFT against NVIDIA's measured vLLM serving rows of "
                    "mixture-of-experts models (every aggregated MoE row of aiconfigurator-core 0.12's "
                    "silicon_sample.csv without data-parallel attention, nothing fitted to them), the clients as "
                    "InferenceMAX's benchmark ran them")

HERE = Path(__file__).resolve().parent
MOE_MODELS = ("openai/gpt-oss-120b", "moonshotai/Kimi-K2.5", "MiniMaxAI/MiniMax-M2.5", "Qwen/Qwen3-235B-A22B-FP8")
# (model, the row's precision label) whose rows served the model's own checkpoint (see the docstring)
RAN_CHECKPOINT = {("openai/gpt-oss-120b", "fp4"), ("moonshotai/Kimi-K2.5", "int4"),
                  ("MiniMaxAI/MiniMax-M2.5", "fp8"), ("Qwen/Qwen3-235B-A22B-FP8", "fp8")}


def moe_vllm_rows(source: Path | None = None) -> list[dict]:
    """The aggregated vLLM rows of `source` (silicon_sample.csv) whose model is one of MOE_MODELS."""
    with open(source or kernel_tables.silicon_rows_path()) as handle:
        return [row for row in csv.DictReader(handle)
                if row["backend"] == "vllm" and row["mode"] == "agg" and row["model_path"] in MOE_MODELS]


def _size(value: str) -> int:
    return int(float(value)) if value else 0


def layout(row: dict) -> tuple[int, int, bool]:
    """(tp, attention data-parallel ranks, expert_parallel) of the row: its experts over moe_tp_size ×
    moe_ep_size GPUs, its attention over tp_size in each of attention_dp_size ranks (where the csv gives
    none, as many as the experts' GPUs leave)."""
    tp, moe_tp, moe_ep = _size(row["tp_size"]), _size(row["moe_tp_size"]) or 1, _size(row["moe_ep_size"]) or 1
    dp = _size(row["attention_dp_size"]) or max(1, moe_tp * moe_ep // tp)
    return tp, dp, moe_ep > 1 and moe_ep == tp * dp


def served_as(row: dict) -> ServerFlags:
    """InferenceMAX's launch scripts for these models (SemiAnalysisAI/InferenceX benchmarks/gptoss_fp4_*.sh,
    single_node/minimaxm2.5_fp8_h200.sh) set `async-scheduling: true` (vLLM's default from 0.14) and
    `no-enable-prefix-caching`; the other flags they set changed from run to run and the csv does not
    record them, so vLLM's defaults on that GPU stand. The Qwen3-235B-A22B-FP8 rows (vLLM 0.12, not
    InferenceMAX's) on vLLM 0.12's defaults, as `silicon.py` serves its vLLM 0.12 rows: synchronous
    scheduling, prefix caching on."""
    if (row["backend_version"] or "").startswith("0.12"):
        return ServerFlags(async_scheduling=False)
    return ServerFlags(async_scheduling=True, prefix_caching=False)


def model_config(model: str) -> dict:
    """The decoder's config as the tables read it (Kimi-K2.5's text_config)."""
    return decoder_config(kernel_tables.shipped_model_config(model))


def priced_forward(row: dict, quant: str | None, forwards: dict) -> kernel_tables.Forward:
    """The row's forward at `quant` (None: the checkpoint's precisions), its KV cache 16-bit as vLLM's
    --kv-cache-dtype auto keeps it; `forwards` caches them across rows (a TablesUnavailable too)."""
    tp, dp, expert_parallel = layout(row)
    key = (row["model_path"], row["system"], tp, expert_parallel, quant)
    if key not in forwards:
        try:
            forward = kernel_tables.Forward(model_config(row["model_path"]), row["system"], "vllm", tp,
                                            name=row["model_path"], gemm_quant=quant, kv_quant="bfloat16",
                                            expert_parallel=expert_parallel)
            forward.decode_ms(1, int(row["isl"]))  # the tables load the kernels they lack only when asked
            forward.mixed_ms(int(row["isl"]), 1, int(row["isl"]), int(row["osl"]))
            forwards[key] = forward
        except (ValueError, kernel_tables.TablesUnavailable) as error:
            forwards[key] = error
    if isinstance(forwards[key], Exception):
        raise forwards[key]
    return forwards[key]


def precision(row: dict, forwards: dict) -> tuple[str | None, str]:
    """(the tables' GEMM mode the row is priced at, None for the checkpoint's, and how it was chosen); a
    TablesUnavailable where neither the row's label nor, where the row ran it, the checkpoint's precision
    can be priced."""
    label = row["gemm_quant_mode"] or None
    try:
        priced_forward(row, label, forwards)
        return label, "the row's"
    except kernel_tables.TablesUnavailable as error:
        if (row["model_path"], row["precision"]) not in RAN_CHECKPOINT:
            raise kernel_tables.TablesUnavailable(f"{label} unpriced, and the row did not run the checkpoint's "
                                                  f"precision: {kernel_tables.what_is_missing(str(error))}") from None
    priced_forward(row, None, forwards)
    return None, "the checkpoint's (the row's unpriced)"


def simulated(row: dict, quant: str | None, forwards: dict) -> dict:
    """The row's mean TTFT and TPOT, its replica's KV capacity and preemptions, its GEMMs at `quant`."""
    forward = priced_forward(row, quant, forwards)
    tp, _, _ = layout(row)
    server = served_as(row)
    config = model_config(row["model_path"])
    before_full_isl = not (row["backend_version"] or "").startswith("0.19")
    spec = dataclasses.replace(server.applied(replica_spec(config, row["system"], tp, quant,
                                                           kv_cache_dtype=server.kv_cache_dtype)),
                               reserve_full_input=not before_full_isl)
    cost = step_cost(forward, int(row["isl"]), int(row["osl"]), async_scheduling=spec.async_scheduling,
                     host=VLLM_HOST_STEP, launch=COMPILED_LAUNCH, cudagraph_mode=server.cudagraph_mode)
    return {"kv_tokens": spec.kv_capacity_tokens} | mean_latencies(row, cost, spec, INFERENCEMAX)


_FORWARDS: dict = {}  # each worker process's own


def simulate_row(row: dict) -> dict:
    """One row of silicon_moe.csv."""
    tp, dp, expert_parallel = layout(row)
    base = {"id": row["id"], "model": row["model_path"], "system": row["system"], "precision": row["precision"],
            "quant_label": row["gemm_quant_mode"], "tp": tp, "attention_dp": dp,
            "layout": "EP" if expert_parallel else "TP", "concurrency": int(float(row["batch_size"])),
            "lengths": f"{row['isl']}/{row['osl']}", "vllm": row["backend_version"],
            "silicon_ttft_ms": float(row["silicon_ttft_ms"]), "silicon_tpot_ms": float(row["silicon_tpot_ms"]),
            "not_simulated": ""}
    if dp > 1:
        base["not_simulated"] = "data-parallel attention (the replica simulator models no DP ranks)"
        return base
    try:
        quant, chosen = precision(row, _FORWARDS)
        found = simulated(row, quant, _FORWARDS)
        base |= {"quant_priced": quant or "checkpoint", "quant_from": chosen, "kv_tokens": found["kv_tokens"],
                 "sim_ttft_ms": found["ttft_ms"], "sim_tpot_ms": found["tpot_ms"],
                 "preemptions": found["preemptions"]}
        if quant is not None and (row["model_path"], row["precision"]) in RAN_CHECKPOINT:
            try:  # the label priced, and the checkpoint the row ran differs from it: that too
                ckpt = simulated(row, None, _FORWARDS)
                base |= {"ckpt_ttft_ms": ckpt["ttft_ms"], "ckpt_tpot_ms": ckpt["tpot_ms"]}
            except (ValueError, kernel_tables.TablesUnavailable):
                pass
    except (ValueError, kernel_tables.TablesUnavailable) as error:
        base["not_simulated"] = reason(str(error))
    return base


def reason(message: str) -> str:
    """A not-simulated row's reason, in words that group alike rows (no paths, shapes or TP sizes)."""
    first = message.splitlines()[0]
    if "do not fit" in first:
        return "the weights do not fit the GPUs' memory at this TP"
    if "quantisation blocks" in first:
        return "the checkpoint's precision unpriced here: its experts' MLP split over TP breaks its 128-wide blocks"
    if "MoE data missing" in first:
        return "the label's precision unpriced on this GPU (the tables' MoE kernels lack it) and not what the row ran"
    if "tensor cores" in first:
        return "the label's precision unpriced on this GPU (no such tensor cores) and not what the row ran"
    return first.split(": ", 1)[-1][:160]


def _errors(table: pd.DataFrame) -> pd.DataFrame:
    for who in ("sim", "ckpt", "aic"):
        for metric in ("tpot", "ttft"):
            column = f"{who}_{metric}_ms"
            table[f"{who}_{metric}_error"] = (table[column] / table[f"silicon_{metric}_ms"] - 1
                                              if column in table else np.nan)
    return table


def grouped_lines(done: pd.DataFrame, by: list[str]) -> list[str]:
    stats = done.groupby(by).agg(rows=("id", "count"), tpot=("sim_tpot_error", _median_abs),
                                 tpot_bias=("sim_tpot_error", "median"), ttft=("sim_ttft_error", _median_abs),
                                 ttft_bias=("sim_ttft_error", "median"), ckpt_rows=("ckpt_tpot_error", "count"),
                                 ckpt_tpot=("ckpt_tpot_error", "median"), ckpt_ttft=("ckpt_ttft_error", "median"),
                                 aic_rows=("aic_tpot_error", "count"), aic_tpot=("aic_tpot_error", _median_abs),
                                 aic_ttft=("aic_ttft_error", _median_abs))
    lines = [f"| {' | '.join(by)} | rows | TPOT | TTFT | meets ≤ 8 % / ≤ 20 % | at the checkpoint's fp8_block "
             f"(rows, signed TPOT, TTFT) | aiconfigurator rows |",
             "|" + "---|" * (len(by) + 6)]
    for key, g in stats.iterrows():
        key = key if isinstance(key, tuple) else (key,)
        meets = ("yes" if g.tpot <= 0.08 else "no") + " / " + ("yes" if g.ttft <= 0.20 else "no")
        ckpt = f"{int(g.ckpt_rows)}: {g.ckpt_tpot:+.1%}, {g.ckpt_ttft:+.1%}" if g.ckpt_rows else ""
        aic = f"{int(g.aic_rows)}: {g.aic_tpot:.1%}, {g.aic_ttft:.1%}" if g.aic_rows else "0"
        lines.append(f"| {' | '.join(str(k) for k in key)} | {int(g.rows)} | {g.tpot:.1%} ({g.tpot_bias:+.1%}) | "
                     f"{g.ttft:.1%} ({g.ttft_bias:+.1%}) | {meets} | {ckpt} | {aic} |")
    return lines + [""]


def _per_op(model: str, system: str, tp: int, quant: str, rows: int = 32) -> dict[str, float]:
    """A decode step of `rows` rows at 2,048 tokens of context on the tables, ms by op kind."""
    forward = kernel_tables.Forward(model_config(model), system, "vllm", tp, name=model, gemm_quant=quant,
                                    kv_quant="bfloat16")
    found = {"attention GEMMs": 0.0, "MoE": 0.0, "all": 0.0}
    for op in forward._engine.decode_step_per_op(rows, 2048, 2):
        found["all"] += float(op[1])
        if op[0] in ("generation_qkv_gemm", "generation_proj_gemm"):
            found["attention GEMMs"] += float(op[1])
        elif op[0] == "generation_moe":
            found["MoE"] += float(op[1])
    return found


KERNEL_CHECKS = (("MiniMaxAI/MiniMax-M2.5", "h200_sxm", 4), ("MiniMaxAI/MiniMax-M2.5", "b200_sxm", 4),
                 ("Qwen/Qwen3-235B-A22B-FP8", "h200_sxm", 4))


def kernel_lines() -> list[str]:
    """The fp8 rows' two precisions on the tables, op by op: where the errors of the fp8-labelled rows come from."""
    lines = ["## The fp8 rows' precisions on the tables", "",
             "A decode step of 32 rows at 2,048 tokens of context, TP4, experts split over TP (ms on the tables, "
             "by op): the label's per-tensor fp8 against the block-scaled fp8_block these checkpoints hold, "
             "beside 16-bit. Where the tables' fp8_block attention GEMMs cost many times the 16-bit ones (MiniMax-M2.5 "
             "priced at fp8_block: its H100 and B300 rows, and the columns at the checkpoint's fp8_block), or their "
             "per-tensor fp8 MoE many times the block-scaled one (Qwen3-235B-A22B-FP8 at its label), the rows priced "
             "there are slow by as much.", "",
             "| model | GPU | precision | step | attention GEMMs (qkv + proj) | MoE |", "|---|---|---|---|---|---|"]
    for model, system, tp in KERNEL_CHECKS:
        for quant in ("bfloat16", "fp8", "fp8_block"):
            try:
                ops = _per_op(model, system, tp, quant)
            except (ValueError, kernel_tables.TablesUnavailable):
                continue
            lines.append(f"| {model} | {system} | {quant} | {ops['all']:.1f} | {ops['attention GEMMs']:.2f} | "
                         f"{ops['MoE']:.2f} |")
    return lines + [""]


def report(table: pd.DataFrame, seconds: float, workers: int, aic_note: str) -> list[str]:
    done = table[table["not_simulated"] == ""]
    skipped = table[table["not_simulated"] != ""]
    lines = [f"# The fleet simulator against NVIDIA's measured vLLM rows of mixture-of-experts models "
             f"({len(table)} aggregated rows, {len(done)} simulated)", "",
             "Median |error| of the simulated mean TPOT and TTFT against the measured ones (signed medians in "
             "brackets), nothing fitted to these rows; the clients as InferenceMAX's benchmark ran them, the "
             "experts laid out as each row's moe_tp_size / moe_ep_size (silicon_moe.py says how, and how the "
             "precision is chosen). The issue's targets: median |TPOT error| ≤ 8 % and |TTFT error| ≤ 20 % per "
             "model and GPU. Where a row's label is per-tensor fp8 and its checkpoint block-scaled FP8, the "
             "signed medians at the checkpoint's fp8_block are shown beside.", "",
             f"{aic_note}", "", "## Per model and GPU", ""]
    lines += grouped_lines(done, ["model", "system"])
    lines += ["## Per model, GPU and expert layout (TP: each expert split over the TP GPUs; EP: whole experts "
              "per GPU)", ""]
    lines += grouped_lines(done, ["model", "system", "layout"])
    lines += ["## Per model, GPU and the precision priced", ""]
    lines += grouped_lines(done, ["model", "system", "quant_label", "quant_priced"])
    lines += ["## Per model, GPU and length pair", ""]
    lines += grouped_lines(done, ["model", "system", "lengths"])
    lines += kernel_lines()
    lines += [f"All {len(done)} simulated rows: median |TPOT error| {_median_abs(done['sim_tpot_error']):.1%} "
              f"({done['sim_tpot_error'].median():+.1%}), median |TTFT error| "
              f"{_median_abs(done['sim_ttft_error']):.1%} ({done['sim_ttft_error'].median():+.1%}).", ""]
    lines += [f"Not simulated: {len(skipped)} of {len(table)} rows"] + [
        f"- {n} × {why}" for why, n in skipped["not_simulated"].value_counts().items()]
    by_model = skipped.groupby(["model", "system", "not_simulated"]).size()
    lines += ["", "| model | system | reason | rows |", "|---|---|---|---|"] + [
        f"| {model} | {system} | {why} | {n} |" for (model, system, why), n in by_model.items()]
    lines += ["", f"Simulated on {cpu_name()} in {seconds:.0f} s, {workers} worker processes. Regenerate with "
              "`python benchmarks/silicon-rows/silicon_moe.py`."]
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--limit", type=int, default=0, help="only the first N rows (a quick look)")
    parser.add_argument("--out", type=Path, default=HERE)
    parser.add_argument("--workers", type=int, default=None, help="processes (default: one a core)")
    args = parser.parse_args()
    rows = moe_vllm_rows()[:args.limit or None]
    started = time.perf_counter()
    workers = min(args.workers or os.cpu_count() or 1, len(rows))
    table = pd.DataFrame(in_processes(simulate_row, rows, workers=workers))
    seconds = time.perf_counter() - started
    aic_path = HERE / "silicon_aic.csv"
    aic = pd.read_csv(aic_path) if aic_path.exists() else pd.DataFrame(columns=["id"])
    held = aic[aic["id"].isin(table["id"])]
    if len(held):
        table = table.merge(held, on="id", how="left")
        aic_note = f"aiconfigurator's own estimate (silicon_aic.csv): {held['aic_tpot_ms'].notna().sum()} of these rows."
    else:
        aic_note = (f"aiconfigurator's own estimate: none. {shown(aic_path)} holds aiconfigurator 0.12's `cli "
                    f"estimate` for the dense rows silicon.py simulates alone ({len(aic)} rows, none of these); "
                    "estimating these rows needs aiconfigurator's CLI environment (silicon_aic.py), which this "
                    "run did not have.")
    table = _errors(table)
    args.out.mkdir(parents=True, exist_ok=True)
    table.to_csv(args.out / "silicon_moe.csv", index=False)
    if not args.limit:  # what a plan of a mixture of experts on the tables says of its check
        write_validation("silicon_moe", silicon_moe_figures(table), what=SILICON_MOE_WHAT,
                         source=shown(args.out / "silicon_moe.csv"),
                         machine=f"NVIDIA's rows (H100, H200, B200, B300) simulated on {cpu_name()}, "
                                 f"{os.cpu_count()} CPUs",
                         command="python benchmarks/silicon-rows/silicon_moe.py")
    lines = report(table, seconds, workers, aic_note)
    (args.out / "silicon_moe.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
