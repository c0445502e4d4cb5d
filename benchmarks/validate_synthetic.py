"""Does a random-weight, synthetic-acceptance run predict a real run's speed-ups?

Runs the real default pair (smollm2-135m fp32 target, its bf16 copy as draft) and then the same
grid with random weights, simulating at each (workload, temperature) the per-position acceptance
profile the real run measured. Writes benchmarks/SYNTHETIC_VALIDATION.md with both speed-ups per
cell. Not part of the test suite (several minutes); run it on a quiet machine:

    python benchmarks/validate_synthetic.py [--repeats 2] [--output benchmarks/SYNTHETIC_VALIDATION.md]
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from datetime import date
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd  # noqa: E402

from specbench.results import hardware_info, load_run, versions  # noqa: E402
from specbench.sweep import SweepConfig, run_sweep  # noqa: E402

DRAFT = "smollm2-135m@bf16"


def conditional_profile(by_position: list[float]) -> str:
    """Per-position conditional acceptance (P(i accepted | i-1 accepted)) from the measured
    unconditional rates accepted_at_i / drafted_at_i."""
    rates = [min(max(r, 1e-6), 1.0) for r in by_position]
    conditional = [rates[0]] + [min(1.0, b / a) for a, b in zip(rates, rates[1:])]
    return "/".join(f"{c:.3f}" for c in conditional)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--output", type=Path, default=Path(__file__).with_name("SYNTHETIC_VALIDATION.md"))
    args = parser.parse_args()

    grid = dict(drafts=[DRAFT], ks=[2, 4], batch_sizes=[1, 4], temperatures=[0.0, 0.7], workloads=["chat"],
                max_new_tokens=48, num_prompts=4, repeats=args.repeats)
    root = Path(tempfile.mkdtemp(prefix="specbench-validate-"))
    real_dir = run_sweep(SweepConfig(**grid), results_root=root)
    real = load_run(real_dir).cells
    rows = []
    for (workload, temperature, k), cells in real[real["mode"] == "speculative"].groupby(["workload", "temperature", "k"]):
        # The deepest K measured gives the most positions of the profile.
        deepest = real[(real["mode"] == "speculative") & (real["workload"] == workload)
                       & (real["temperature"] == temperature)].sort_values("k").iloc[-1]
        profile = conditional_profile(list(deepest["acceptance_by_position"]))
        synthetic_config = SweepConfig(**{**grid, "workloads": [workload], "temperatures": [temperature], "ks": [int(k)]},
                                       weights="random", alphas=[profile])
        synthetic = load_run(run_sweep(synthetic_config, results_root=root)).cells
        for cell in cells.to_dict("records"):
            twin = synthetic[(synthetic["mode"] == "speculative") & (synthetic["batch_size"] == cell["batch_size"])].iloc[0]
            rows.append({"workload": workload, "T": temperature, "B": cell["batch_size"], "K": int(k),
                         "simulated profile": profile, "real α": cell["alpha"], "synthetic α": twin["alpha"],
                         "real τ": cell["tau"], "synthetic τ": twin["tau"],
                         "real speed-up": cell["speedup"], "synthetic speed-up": twin["speedup"],
                         "error": twin["speedup"] / cell["speedup"] - 1})
    table = pd.DataFrame(rows).sort_values(["T", "B", "K"])
    hardware, version = hardware_info(), versions()
    lines = [
        "# Random weights + synthetic acceptance vs the real run",
        "",
        f"{date.today()} · {hardware['cpu']} ({hardware['cpu_count']} cores, torch threads {hardware['torch_threads']})"
        f" · torch {version['torch']} · transformers {version['transformers']} · specbench {version['specbench_git']}",
        "",
        f"Command: `python benchmarks/validate_synthetic.py --repeats {args.repeats}`. Real: smollm2-135m (fp32) "
        f"drafted by {DRAFT}, chat prompts, 48 new tokens, 4 prompts per cell, {args.repeats} repeats. Synthetic: the "
        "same architectures with random weights, acceptance simulated with the per-position profile the real run "
        "measured (conditional rates from its deepest K).",
        "",
        "| " + " | ".join(table.columns) + " |",
        "|" + "---|" * len(table.columns),
    ]
    for row in table.itertuples(index=False):
        values = []
        for column, value in zip(table.columns, row):
            if column == "error":
                values.append(f"{value:+.1%}")
            elif isinstance(value, float):
                values.append(f"{value:.3f}" if column != "T" else f"{value:g}")
            else:
                values.append(str(value))
        lines.append("| " + " | ".join(values) + " |")
    errors = table["error"].abs()
    lines += ["", f"Median |error| {errors.median():.1%}, max {errors.max():.1%} over {len(table)} cells; "
                  f"{(errors <= 0.10).sum()}/{len(table)} within 10%.", ""]
    args.output.write_text("\n".join(lines))
    print("\n".join(lines))
    return 0 if (errors <= 0.10).all() else 1


if __name__ == "__main__":
    sys.exit(main())
