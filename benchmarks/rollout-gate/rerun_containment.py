"""How often a run's 95 % speed-up interval contains an identical rerun's point.

    python benchmarks/rollout-gate/rerun_containment.py RUN_A RUN_B

For every speculative cell the two runs share, each run's interval (as `check` builds it: by the
cells' `pairing`, specbench.fit.noise.cell_interval; a served run from before pairing existed also
gets the paired-t interval it was given then, on its repeat-by-repeat ratios) is asked whether it
contains the other run's speed-up. Intervals that are honest about the noise between two runs
should contain the rerun's point most of the time (about 83 % for two independent, equally noisy
measurements under normality, more where the rerun is less noisy)."""

from __future__ import annotations

import sys

import pandas as pd

from specbench.fit.evidence import speedup_interval
from specbench.fit.noise import cell_interval, pairing
from specbench.results import load_run


def speculative(path: str) -> pd.DataFrame:
    cells = load_run(path).cells
    return cells[(cells["mode"] != "autoregressive") & (cells["status"] == "ok")].set_index("cell_id")


def contained(interval, point: float) -> bool | None:
    return None if interval is None else interval[0] <= point <= interval[1]


def main(first: str, second: str) -> None:
    a, b = speculative(first), speculative(second)
    rows = []
    for cell_id in sorted(set(a.index) & set(b.index)):
        for mine, theirs, name in ((a, b, "A"), (b, a, "B")):
            row = mine.loc[cell_id].to_dict()
            point = float(theirs.loc[cell_id, "speedup"])
            now = cell_interval(row)
            paired_t = speedup_interval(row.get("speedup_runs"))  # the pre-pairing interval: ratios of repeat i
            rows.append({"cell_id": cell_id, "run": name, "pairing": pairing(row), "speedup": float(row["speedup"]),
                         "other_run_speedup": point,
                         "interval": "–" if now is None else f"{now[0]:.3f}–{now[1]:.3f}",
                         "contains": contained(now, point),
                         "paired_t_interval": "–" if paired_t is None else f"{paired_t[0]:.3f}–{paired_t[1]:.3f}",
                         "paired_t_contains": contained(paired_t, point)})
    table = pd.DataFrame(rows)
    print(table.to_string(index=False))
    for column in ("contains", "paired_t_contains"):
        known = table[column].dropna()
        if len(known):
            print(f"{column}: {int(known.sum())} of {len(known)} ({known.mean():.0%})")


if __name__ == "__main__":
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    main(sys.argv[1], sys.argv[2])
