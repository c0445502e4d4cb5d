"""The committed H100 runs' measured forwards against the uncorrected kernel tables (aiconfigurator-core,
h100_sxm, vLLM): the ratio measured / tables per batch size, for the target's decode step, its
K + 1-position verify and the draft's decode. The native engine's steps are specbench's own
PyTorch loop (CUDA graphs), the tables vLLM's kernels.

    python benchmarks/tables-2026-11-25/native_vs_tables.py
"""

from __future__ import annotations

import sys

import numpy as np

from specbench.fit import kernel_tables
from specbench.results import load_run
from specbench.synthetic import shipped_config

RUNS = ["benchmarks/gpu/h100-2026-11-23/synthetic-llama3-8b-1b-graphs",
        "benchmarks/gpu/h100-2026-11-22/synthetic-llama3-8b-1b-graphs",
        "benchmarks/gpu/h100-2026-11-22/synthetic-llama3-8b-1b-graphs-b128-256"]


def main() -> None:
    target = kernel_tables.Forward(shipped_config("llama3-8b")[1], "h100_sxm", "vllm", 1)
    draft = kernel_tables.Forward(shipped_config("llama3.2-1b")[1], "h100_sxm", "vllm", 1)
    print(f"tables: {kernel_tables.label('h100_sxm', 'vllm')}\n")
    print("| run | B | context | AR step measured / tables (ms) | ratio | verify K=2 measured / tables | ratio "
          "| 1b draft forward measured / tables | ratio |")
    print("|---|---|---|---|---|---|---|---|---|")
    for path in RUNS:
        run = load_run(path)
        cells, steps = run.cells[run.cells["status"] == "ok"], run.steps
        for b in sorted(set(cells["batch_size"])):
            here = cells[cells["batch_size"] == b]
            ar = here[here["mode"] == "autoregressive"]
            sd = here[(here["mode"] != "autoregressive") & (here["k"] == 2)]
            context = int(here["prompt_tokens_mean"].mean() + here["max_new_tokens"].mean() / 2)
            ar_steps = steps[steps["cell_id"].isin(ar["cell_id"]) & (steps["batch_rows"] == b)]
            sd_steps = steps[steps["cell_id"].isin(sd["cell_id"]) & (steps["batch_rows"] == b) & (steps["drafted"] > 0)]
            measured_ar = float(np.median(ar_steps["verify_s"])) * 1000 if len(ar_steps) else float("nan")
            measured_verify = float(np.median(sd_steps["verify_s"])) * 1000 if len(sd_steps) else float("nan")
            measured_draft = float(np.median(sd_steps["draft_s"])) * 1000 / 2 if len(sd_steps) else float("nan")
            tables_ar, tables_verify = target.decode_ms(b, context), target.verify_ms(b, context, 3)
            tables_draft = draft.decode_ms(b, context)
            print(f"| {path.split('/')[-2]}/{path.split('/')[-1]} | {b} | {context} | {measured_ar:.2f} / {tables_ar:.2f} "
                  f"| {measured_ar / tables_ar:.2f} | {measured_verify:.2f} / {tables_verify:.2f} "
                  f"| {measured_verify / tables_verify:.2f} | {measured_draft:.2f} / {tables_draft:.2f} "
                  f"| {measured_draft / tables_draft:.2f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
