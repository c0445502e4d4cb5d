"""The committed H100 and H200 runs' measured forwards against the uncorrected kernel tables (aiconfigurator-core,
h100_sxm, vLLM): the ratio measured / tables per batch size, for the target's decode step, its
K + 1-position verify and the draft's decode. The native engine's steps are specbench's own
PyTorch loop (CUDA graphs), the tables vLLM's kernels.

    python benchmarks/kernel-tables/native_vs_tables.py
"""

from __future__ import annotations

import sys

import numpy as np

from specbench.fit import kernel_tables
from specbench.fit.calibration import run_system
from specbench.results import load_run
from specbench.models import lookup_alias
from specbench.synthetic import shipped_config

RUNS = ["tests/fixtures/gpu/h100-2026-11-23/synthetic-llama3-8b-1b-graphs",
        "tests/fixtures/gpu/h100-2026-11-22/synthetic-llama3-8b-1b-graphs",
        "benchmarks/gpu/h100-2026-11-22/synthetic-llama3-8b-1b-graphs-b128-256",
        "tests/fixtures/gpu/h100-2026-11-25/synthetic-llama3-8b",
        "tests/fixtures/gpu/h100-2026-11-25/synthetic-llama3.2-3b",
        "tests/fixtures/gpu/h100-2026-11-25/synthetic-qwen2.5-7b"]
# the same three pairs on an H200 (the twenty-third session); held_out_corrected.py takes them too
H200_RUNS = ["tests/fixtures/gpu/h200-2026-11-28/synthetic-llama3-8b",
             "tests/fixtures/gpu/h200-2026-11-28/synthetic-llama3.2-3b",
             "tests/fixtures/gpu/h200-2026-11-28/synthetic-qwen2.5-7b"]


def median_ms(values) -> float:
    return float(np.median(values)) * 1000 if len(values) else float("nan")


def main() -> None:
    print(f"tables: {kernel_tables.label('h100_sxm', 'vllm')} and {kernel_tables.label('h200_sxm', 'vllm')}\n")
    print("| run | draft | B | context | AR step measured / tables (ms) | ratio | verify K=2 measured / tables "
          "| ratio | draft forward measured / tables | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for path in RUNS + H200_RUNS:
        run = load_run(path)
        system = run_system(run.meta)
        target_alias, target_config = shipped_config(run.meta["config"]["grid"]["target"])
        family = lookup_alias(target_alias).family
        target = kernel_tables.Forward(target_config, system, "vllm", 1)
        cells, steps = run.cells[run.cells["status"] == "ok"], run.steps
        for draft_label in run.meta["config"]["grid"]["drafts"]:
            draft = kernel_tables.Forward(shipped_config(draft_label, family)[1], system, "vllm", 1)
            for b in sorted(set(cells["batch_size"])):
                here = cells[cells["batch_size"] == b]
                ar = here[here["mode"] == "autoregressive"]
                sd = here[(here["mode"] != "autoregressive") & (here["k"] == 2) & (here["draft"] == draft_label)]
                context = int(here["prompt_tokens_mean"].mean() + here["max_new_tokens"].mean() / 2)
                ar_steps = steps[steps["cell_id"].isin(ar["cell_id"]) & (steps["batch_rows"] == b)]
                sd_steps = steps[steps["cell_id"].isin(sd["cell_id"]) & (steps["batch_rows"] == b)
                                 & (steps["drafted"] > 0)]
                measured_ar, measured_verify = median_ms(ar_steps["verify_s"]), median_ms(sd_steps["verify_s"])
                measured_draft = median_ms(sd_steps["draft_s"]) / 2
                tables_ar, tables_verify = target.decode_ms(b, context), target.verify_ms(b, context, 3)
                tables_draft = draft.decode_ms(b, context)
                print(f"| {path.split('/')[-2]}/{path.split('/')[-1]} | {draft_label} | {b} | {context} "
                      f"| {measured_ar:.2f} / {tables_ar:.2f} | {measured_ar / tables_ar:.2f} "
                      f"| {measured_verify:.2f} / {tables_verify:.2f} | {measured_verify / tables_verify:.2f} "
                      f"| {measured_draft:.2f} / {tables_draft:.2f} | {measured_draft / tables_draft:.2f} |")
    sys.stdout.flush()


if __name__ == "__main__":
    main()
