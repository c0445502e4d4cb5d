"""Calibrate on one GPU, plan another: the kernel tables of an H200, corrected by what the native
engine measured on an H100, predict the speed-ups the same engine then measured on an H200.

The corrections are the engine's own overhead over vLLM's kernels (measured / tables per kind of
forward, `fit.calibration`). If they are the engine's and not the GPU's, an H100 run's corrections
carried to the H200's tables predict the H200 run as well as the H200 run's own corrections do.
For each pair of committed runs of the same models (synthetic weights, α 0.8, CUDA graphs, B 1-128):

- bare: the H200 tables uncorrected;
- carried: the H200 tables corrected by the H100 run (every batch size it measured);
- own: the H200 tables corrected by the H200 run itself (in-sample: what carrying can at best reach);
- own, largest B held out: corrected on the H200 run's smaller sizes, the largest predicted;
- the H100 run's own fitted step times (its roofline) carried to the H200 by datasheet bandwidth and
  FLOP/s, what `plan H100_RUN --device h200` does, no tables.

Each predicts every speculative cell's speed-up over the baseline with the run's own α. Writes
cross_gpu.md beside this file.

    python benchmarks/kernel-tables/cross_gpu.py
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from specbench.fit import device_key
from specbench.fit.calibration import calibrate, carried, held_out_on_tables, predicted_with, run_system
from specbench.fit.step_times import StepTimes, fit_step_times
from specbench.results import load_run

HERE = Path(__file__).parent
GPU = Path(__file__).resolve().parents[2] / "tests" / "fixtures" / "gpu"  # the runs the tests read too
PAIRS = [("h100-2026-11-25/synthetic-llama3-8b", "h200-2026-11-28/synthetic-llama3-8b"),
         ("h100-2026-11-25/synthetic-llama3.2-3b", "h200-2026-11-28/synthetic-llama3.2-3b"),
         ("h100-2026-11-25/synthetic-qwen2.5-7b", "h200-2026-11-28/synthetic-qwen2.5-7b")]


def predicted(run, times: StepTimes) -> pd.DataFrame:
    return predicted_with(times, run.cells, run.steps, run.requests, run.meta)


def summary(frame: pd.DataFrame) -> str:
    errors = frame["speedup_error"].abs()
    return f"{errors.median() * 100:.1f} % (max {errors.max() * 100:.0f} %), {int(frame['same_side'].sum())}/{len(frame)}"


def roofline_carried(source, target) -> StepTimes:
    """`source`'s own fitted step times (the roofline) carried to `target`'s GPU by datasheet bandwidth
    and FLOP/s, the efficiencies kept: what `plan SOURCE_RUN --device GPU` does."""
    gpus = [device_key(run.meta["hardware"]["gpus"][0]["name"]) for run in (source, target)]
    return fit_step_times(source.cells, source.steps, source.requests, source.meta).on_datasheet(*gpus)


def main() -> None:
    columns = ["bare tables", "tables × the other GPU's run's corrections", "tables × the run's own",
               "own, largest B held out", "the other GPU's roofline carried by datasheet peaks"]
    lines = []
    details = []
    for direction in ("H100 → H200", "H200 → H100"):
        pooled: dict[str, list[pd.DataFrame]] = {name: [] for name in columns}
        lines += ["", f"| {direction} | cells | " + " | ".join(columns) + " |", "|---|---|" + "---|" * len(columns)]
        for h100_path, h200_path in PAIRS:
            source_path, target_path = (h100_path, h200_path) if direction.startswith("H100") else (h200_path, h100_path)
            source, target = load_run(GPU / source_path), load_run(GPU / target_path)
            frames = (target.cells, target.steps, target.requests, target.meta)
            system = run_system(target.meta)
            other = calibrate(source.cells, source.steps, source.requests, source.meta, run_system(source.meta))
            row = {columns[0]: predicted(target, calibrate(*frames, system, correct=False).times),
                   columns[1]: predicted(target, carried(other, *frames, system)),
                   columns[2]: predicted(target, calibrate(*frames, system).times),
                   columns[3]: held_out_on_tables(*frames, system),
                   columns[4]: predicted(target, roofline_carried(source, target))}
            for name, frame in row.items():
                pooled[name].append(frame)
            lines.append(f"| {target_path} | {len(row[columns[1]])} | "
                         + " | ".join(summary(frame) for frame in row.values()) + " |")
            if direction.startswith("H100"):
                details.append(row[columns[1]].assign(run=target_path))
        lines.append("| **pooled** | | " + " | ".join(summary(pd.concat(frames, ignore_index=True))
                                                    for frames in pooled.values()) + " |")
    detail = pd.concat(details, ignore_index=True)
    text = ("# Calibrated on one GPU, predicting another\n\n"
            "Median |error| of the predicted speed-up over the baseline (max), and how many cells the prediction "
            "put on the measured side of 1×. The runs: `benchmarks/gpu/h100-2026-11-25/` and "
            "`benchmarks/gpu/h200-2026-11-28/` (the native engine, CUDA graphs, synthetic weights at α 0.8, "
            "K 2 and 4, B 1-128); the tables: aiconfigurator-core's h100_sxm and h200_sxm, vLLM. Each row is the "
            "run predicted, on its own GPU's tables.\n"
            + "\n".join(lines) + "\n\nEach H200 cell, predicted from the H100 run's corrections:\n\n"
            + "| run | cell | measured | predicted | error |\n|---|---|---|---|---|\n"
            + "\n".join(f"| {r.run} | {r.cell_id} | {r.speedup_measured:.3f}× | {r.speedup_predicted:.3f}× | "
                        f"{r.speedup_error * 100:+.1f} % |" for r in detail.itertuples()) + "\n")
    (HERE / "cross_gpu.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
