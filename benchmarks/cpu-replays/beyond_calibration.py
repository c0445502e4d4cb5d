"""Are the CPU replays' cells predicted worse where they ran past the batches their calibration
measured? (`plan RUN --trace` now labels such fleets EXTRAPOLATED; this asks whether the label
also marks larger errors.)

For every committed part-3 sitting (its cpu_replays.md names the calibrations it was fitted on):
each replay cell's running batch (p90 over time of the server's sampled running requests) against
the most requests at once its draft's calibration cells ran (`fleet.served.measured_reach`), and
the cell's prediction errors (calibration α).

    python benchmarks/cpu-replays/beyond_calibration.py   # seconds; writes beyond_calibration.md
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specbench.fleet.replica import running_percentile  # noqa: E402
from specbench.fleet.served import MeasuredReach, measured_reach  # noqa: E402
from specbench.results import load_run, pool_runs  # noqa: E402
from specbench.schema import AR  # noqa: E402

SITTINGS = ["cpu-replays/first-sitting", "cpu-replays/replays-refit", "cpu-replays/first-sitting/below_knee",
            "cpu-replays/one-sitting", "cpu-replays/wide-sitting", "cpu-replays/wide-sitting/without-wide",
            "cpu-replays/full-sitting", "cpu-replays/full-sitting/without-wide",
            "cpu-replays/conv-600-sitting", "cpu-replays/conv-600-sitting/without-wide"]


def calibration_reach(summary: Path) -> dict[str, MeasuredReach]:
    """Per draft, the reach of the calibrations the sitting's price was fitted on (from its md's title), pooled."""
    title = summary.read_text().splitlines()[0]
    paths = re.search(r"fitted on (.*)\)$", title).group(1).split(", ")
    cells, requests, _ = pool_runs([load_run(ROOT / path) for path in paths])
    return measured_reach(cells, requests)


def cells() -> pd.DataFrame:
    rows = []
    for sitting in SITTINGS:
        summary = ROOT / "benchmarks" / sitting / "cpu_replays.md"
        reach = calibration_reach(summary)
        for _, cell in pd.read_csv(summary.with_suffix(".csv")).iterrows():
            measured = load_run(ROOT / cell.replay).cells.set_index("cell_id").loc[cell.cell_id]
            ran = running_percentile(list(zip(measured.running_timeline_s, measured.running_timeline)), 90)
            rows.append({"sitting": sitting, "replay": Path(cell.replay).name, "draft": cell.draft, "ran_p90": ran,
                         "calibrated": reach[cell.draft].rows, "beyond": ran > reach[cell.draft].rows,
                         **{m: cell[f"{m}_error_calibration"] for m in ("ttft", "tpot", "e2e")},
                         "tpot_sign_right": cell.tpot_sign_right_calibration})
    return pd.DataFrame(rows)


def main() -> None:
    table = cells()
    lines = ["# CPU replay cells past their calibration's batches: predicted worse?", "",
             "`python benchmarks/cpu-replays/beyond_calibration.py`: every committed part-3 sitting's cells "
             "(calibration α); a cell is *beyond* where the server ran more requests at once (p90 of its time) than "
             "its draft's calibration cells ever did.", "",
             "| cells | count | median abs TTFT | TPOT | E2E | speculation's TPOT sign right |", "|---|---|---|---|---|---|"]
    for beyond, group in table.groupby("beyond"):
        spec = group[group["draft"] != AR]
        lines.append(f"| {'beyond the calibration' if beyond else 'within it'} | {len(group)} | "
                     + " | ".join(f"{group[m].abs().median():.1%}" for m in ("ttft", "tpot", "e2e"))
                     + f" | {int(spec['tpot_sign_right'].sum())} of {len(spec)} |")
    lines += ["", "| sitting | replay | draft | ran (p90) | calibrated up to | TTFT | TPOT | E2E |",
              "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.sitting} | {r.replay} | {r.draft} | {r.ran_p90:.0f} | {r.calibrated} | {r.ttft:+.1%} | "
              f"{r.tpot:+.1%} | {r.e2e:+.1%} |" for r in table.itertuples()]
    (Path(__file__).resolve().parent / "beyond_calibration.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines[:8]))


if __name__ == "__main__":
    main()
