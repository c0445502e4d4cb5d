"""The kernel tables corrected by a measured run, checked the way the roofline is: hide the largest
batch size of each committed H100 and H200 run, correct the tables on the smaller sizes, predict every
speculative cell at the hidden size, and compare with what was measured. Beside it: the run's own
roofline (`fit.held_out`) and the bare tables. Writes held_out_corrected.md beside this file.

    python benchmarks/kernel-tables/held_out_corrected.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

from specbench.fit import held_out
from specbench.fit.calibration import held_out_on_tables, run_system
from specbench.fit.kernel_tables import TablesUnavailable
from specbench.results import load_run

sys.path.insert(0, str(Path(__file__).parent))
from native_vs_tables import H200_RUNS  # noqa: E402

HERE = Path(__file__).parent
# Every committed GPU run the tables can price (smollm2-135m they cannot: no attention data for its heads).
RUNS = ["tests/fixtures/gpu/h100-2026-11-23/synthetic-llama3-8b-1b-graphs",
        "tests/fixtures/gpu/h100-2026-11-23/synthetic-llama3-8b-1b-context",
        "tests/fixtures/gpu/h100-2026-11-22/synthetic-llama3-8b-1b-graphs",
        "tests/fixtures/gpu/h100-2026-11-25/synthetic-llama3-8b",
        "tests/fixtures/gpu/h100-2026-11-25/synthetic-llama3.2-3b",
        "tests/fixtures/gpu/h100-2026-11-25/synthetic-qwen2.5-7b", *H200_RUNS]
VARIANTS = {"corrected (through each size, flat beyond: the default)": dict(shape="interp"),
            "corrected, log-linear (the default before 2026-11-26)": dict(shape="loglinear"),
            "corrected, constant": dict(shape="constant"),
            "corrected, the largest size's": dict(shape="last"),
            "corrected, the two largest sizes' line": dict(shape="last2"),
            "corrected, prefill bare": dict(shape="interp", correct_prefill=False),
            "bare tables": dict(correct=False)}


def summary(frame: pd.DataFrame) -> str:
    if frame.empty:
        return "–"
    errors = frame["speedup_error"].abs()
    return (f"{errors.median() * 100:.1f} % (max {errors.max() * 100:.0f} %), "
            f"{int(frame['same_side'].sum())}/{len(frame)}")


def main() -> None:
    results: dict[str, list[pd.DataFrame]] = {name: [] for name in ["roofline (the run's own)", *VARIANTS]}
    lines = ["| run | held out | " + " | ".join(results) + " |", "|---|---|" + "---|" * len(results)]
    for path in RUNS:
        run = load_run(path)
        roofline = held_out(run.cells, run.steps, run.requests, run.meta)
        if not roofline.empty:
            roofline = roofline[roofline["held_out_batch_size"] == roofline["held_out_batch_size"].max()]
        row = {"roofline (the run's own)": roofline}
        try:
            for name, options in VARIANTS.items():
                row[name] = held_out_on_tables(run.cells, run.steps, run.requests, run.meta, run_system(run.meta),
                                               **options)
        except TablesUnavailable as error:
            lines.append(f"| {path.removeprefix('tests/fixtures/gpu/')} | – | the tables cannot price it: {error} |")
            continue
        for name, frame in row.items():
            results[name].append(frame)
        held = roofline["held_out_batch_size"].iloc[0] if not roofline.empty else "–"
        lines.append(f"| {path.removeprefix('tests/fixtures/gpu/')} | B={held} | "
                     + " | ".join(summary(frame) for frame in row.values()) + " |")
    pooled = {name: pd.concat(frames, ignore_index=True) for name, frames in results.items() if frames}
    lines.append("| **pooled** | | " + " | ".join(summary(frame) for frame in pooled.values()) + " |")
    text = ("Median |error| of the predicted speed-up at the held-out (largest) batch size (max), and how many "
            "cells the prediction put on the measured side of 1×.\n\n" + "\n".join(lines) + "\n")
    (HERE / "held_out_corrected.md").write_text(text)
    print(text)
    detail = pooled["corrected (through each size, flat beyond: the default)"]
    print(detail[["cell_id", "speedup_measured", "speedup_predicted", "speedup_error"]].round(3).to_string(index=False))


if __name__ == "__main__":
    main()
