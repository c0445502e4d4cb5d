"""Does a random-weight, synthetic-acceptance run predict a real run's speed-ups?

Loads the real default pair (smollm2-135m fp32 target, its bf16 copy as draft) and the same
architectures with random weights into one process. For each (temperature, batch size) a
calibration pass finds the per-position acceptance profile each real speculative cell will
measure (same seeds, so the same acceptance), then the real cells and their random-weight twins,
each simulating its real twin's profile, take turns repeat by repeat. A speed-up is the ratio of
a speculative repeat to the autoregressive repeat measured in the same round, and the table gives
the median over repeats, so machine drift between minutes hits both sides of every ratio and
both the real and the synthetic cells. Writes
benchmarks/performance-model/SYNTHETIC_VALIDATION.md. Not part of the test suite (about 15 minutes on 2 cores):

    python benchmarks/performance-model/validate_synthetic.py [--repeats 5] [--output benchmarks/performance-model/SYNTHETIC_VALIDATION.md]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import replace
from datetime import date
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import pandas as pd  # noqa: E402

from specbench.native.measure import acceptance_summary  # noqa: E402
from specbench.results import hardware_info, versions  # noqa: E402
from specbench.grid import Cell, GridOptions, LoadOptions, SweepConfig  # noqa: E402
from specbench.native.runner import CellRun, _prompt_ids, load_models, load_random_models  # noqa: E402
from specbench.workloads import load_workload  # noqa: E402

DRAFT = "smollm2-135m@bf16"


def conditional_profile(by_position: list[float]) -> str:
    """Per-position conditional acceptance (P(i accepted | i-1 accepted)) from the measured
    unconditional rates accepted_at_i / drafted_at_i."""
    rates = [min(max(r, 1e-6), 1.0) for r in by_position]
    conditional = [rates[0]] + [min(1.0, b / a) for a, b in zip(rates, rates[1:])]
    return "/".join(f"{c:.3f}" for c in conditional)


def paired_speedup(speculative: CellRun, baseline: CellRun) -> float:
    return statistics.median(s / b for s, b in zip(speculative.throughput_per_repeat, baseline.throughput_per_repeat))


def measure_in_turns(runs, repeats: int) -> None:
    runs = list(runs)
    for run in runs:
        run.warm_up()
    for repeat in range(repeats):
        for run in runs:
            run.measure(repeat)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--num-prompts", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=48)
    parser.add_argument("--ks", default="2,4")
    parser.add_argument("--batch-sizes", default="1,4")
    parser.add_argument("--temperatures", default="0,0.7")
    parser.add_argument("--output", type=Path, default=Path(__file__).with_name("SYNTHETIC_VALIDATION.md"))
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    batch_sizes = [int(b) for b in args.batch_sizes.split(",")]
    temperatures = [float(t) for t in args.temperatures.split(",")]

    started = time.perf_counter()
    grid = GridOptions(drafts=[DRAFT], ks=ks, temperatures=temperatures, workloads=["chat"],
                       max_new_tokens=args.max_new_tokens, num_prompts=args.num_prompts, repeats=args.repeats)
    load = LoadOptions(batch_sizes=batch_sizes)
    real_config = SweepConfig(grid=grid, load=load)
    real_models = load_models(real_config)
    workload = load_workload("chat")
    rows = []
    for temperature in temperatures:
        for batch_size in batch_sizes:
            records = workload.sample(args.num_prompts * batch_size, real_config.grid.seed)
            ids = [r.id for r in records]
            real_prompts = [_prompt_ids(r, real_models, real_config) for r in records]
            # The profile each synthetic cell simulates: what its real twin accepts. Generation is
            # seeded per repeat and batch, so a pass with the measured repeats' seeds reproduces
            # the measured acceptance exactly (checked below); its timings are discarded.
            profiles = {}
            for k in ks:
                calibration = CellRun(real_models, Cell("chat", batch_size, temperature, DRAFT, k), real_prompts, ids,
                                      real_config)
                for repeat in range(args.repeats):
                    calibration.measure(repeat)
                profiles[k] = conditional_profile(acceptance_summary(calibration.results, k).by_position)
            synthetic_config = SweepConfig(grid=replace(grid, weights="random",
                                                        alphas=list(dict.fromkeys(profiles.values()))), load=load)
            random_models = load_random_models(synthetic_config)
            random_prompts = [_prompt_ids(r, random_models, synthetic_config) for r in records]
            # Real and random cells, all taking turns repeat by repeat in this one process.
            runs = {("real", 0): CellRun(real_models, Cell("chat", batch_size, temperature), real_prompts, ids,
                                         real_config),
                    ("random", 0): CellRun(random_models, Cell("chat", batch_size, temperature), random_prompts, ids,
                                           synthetic_config)}
            for k in ks:
                runs[("real", k)] = CellRun(real_models, Cell("chat", batch_size, temperature, DRAFT, k), real_prompts,
                                            ids, real_config)
                runs[("random", k)] = CellRun(random_models, Cell("chat", batch_size, temperature, DRAFT, k,
                                                                  profiles[k]), random_prompts, ids, synthetic_config)
            measure_in_turns(runs.values(), args.repeats)
            for k in ks:
                measured = conditional_profile(acceptance_summary(runs[("real", k)].results, k).by_position)
                assert measured == profiles[k], f"calibration {profiles[k]} != measured {measured}"
            for k in ks:
                real = acceptance_summary(runs[("real", k)].results, k)
                synthetic = acceptance_summary(runs[("random", k)].results, k)
                real_speedup = paired_speedup(runs[("real", k)], runs[("real", 0)])
                synthetic_speedup = paired_speedup(runs[("random", k)], runs[("random", 0)])
                rows.append({"T": temperature, "B": batch_size, "K": k, "simulated profile": profiles[k],
                             "real α": real.alpha, "synthetic α": synthetic.alpha,
                             "real τ": real.tau, "synthetic τ": synthetic.tau,
                             "real AR tok/s": statistics.median(runs[("real", 0)].throughput_per_repeat),
                             "random AR tok/s": statistics.median(runs[("random", 0)].throughput_per_repeat),
                             "real speed-up": real_speedup, "synthetic speed-up": synthetic_speedup,
                             "error": synthetic_speedup / real_speedup - 1})
                print(rows[-1], flush=True)
            del random_models, runs
    table = pd.DataFrame(rows)
    hardware, version = hardware_info(), versions()
    command = " ".join(["python benchmarks/performance-model/validate_synthetic.py", *sys.argv[1:]])
    lines = [
        "# Random weights + synthetic acceptance vs the real run",
        "",
        f"{date.today()} · {hardware['cpu']} ({hardware['cpu_count']} cores, torch threads {hardware['torch_threads']})"
        f" · torch {version['torch']} · transformers {version['transformers']} · specbench {version['specbench_git']}"
        f" · {time.perf_counter() - started:.0f} s",
        "",
        f"Command: `{command}`. Real: smollm2-135m (fp32) drafted by {DRAFT}, chat prompts, "
        f"{args.max_new_tokens} new tokens, {args.num_prompts} batches per cell, {args.repeats} repeats. Synthetic: "
        "the same architectures with random weights in the same process, each speculative cell simulating the "
        "per-position acceptance profile its real twin measured (conditional rates). Real and random cells take "
        "turns repeat by repeat; each speed-up is the median over repeats of speculative / autoregressive "
        "tokens/s measured in the same round.",
        "",
        "| " + " | ".join(table.columns) + " |",
        "|" + "---|" * len(table.columns),
    ]
    for row in table.itertuples(index=False):
        values = []
        for column, value in zip(table.columns, row):
            if column == "error":
                values.append(f"{value:+.1%}")
            elif column in ("T", "B", "K"):
                values.append(f"{value:g}")
            elif isinstance(value, float):
                values.append(f"{value:.3f}")
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
