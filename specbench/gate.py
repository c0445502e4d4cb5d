"""The rollout gate: does speculation meet the bar at the batch sizes that matter?

Per draft, the speed-up at a batch size is the best over K there (the K you would deploy at that
size), and the worst over the run's workloads and temperatures (a gate should not pass on the
friendliest traffic). A draft passes when every named batch size meets `min_speedup`.
With several repeats each speed-up also has the range of its repeat-by-repeat ratios; a range
that straddles the bar means the verdict there is within the machine's noise, and says so.
Exit codes: 0 pass, 1 fail, 2 the run lacks the cells to answer.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

import pandas as pd

from specbench.fit import best_k_by_batch, crossover, k_schedule, pick_best_draft, repeat_range, worst_case_by_batch

PASS, FAIL, UNANSWERABLE = 0, 1, 2


def format_speedup(value: float, bar: float) -> str:
    """A speed-up with enough decimals (3 to 6) that it never prints as the bar it missed or
    cleared: 0.9996 against 1.0 is "0.9996×", not "1.000×"."""
    for decimals in range(3, 7):
        text = f"{value:.{decimals}f}"
        if value == bar or text != f"{bar:.{decimals}f}":
            break
    return text + "×"


@dataclass
class DraftVerdict:
    draft: str
    passes: bool | None  # None: cannot answer
    speedups: dict[int, float]  # named B -> worst-case best-K speed-up
    best_k: dict[int, int]  # named B -> K that achieves it (in the worst workload)
    schedule: str  # recommended K per batch size over every measured B
    crossover: str
    missing: list[int] = field(default_factory=list)
    ranges: dict[int, tuple[float, float]] = field(default_factory=dict)  # named B -> repeats' min, max

    def within_noise(self, bar: float) -> list[int]:
        """Named batch sizes whose repeats fell on both sides of the bar."""
        return [b for b, (low, high) in self.ranges.items() if low < bar <= high]


@dataclass
class GateResult:
    exit_code: int
    draft: str | None  # the draft the verdict is for
    batch_sizes: list[int]
    min_speedup: float
    verdicts: list[DraftVerdict]
    message: str

    def to_dict(self) -> dict:
        return asdict(self)


def evaluate(cells: pd.DataFrame, batch_sizes: list[int], min_speedup: float = 1.0,
             draft: str | None = None, workloads: list[str] | None = None,
             temperatures: list[float] | None = None) -> GateResult:
    best = best_k_by_batch(cells)
    if not best.empty and workloads:
        best = best[best["workload"].isin(workloads)]
    if not best.empty and temperatures is not None:
        best = best[best["temperature"].isin(temperatures)]
    if best.empty:
        return GateResult(UNANSWERABLE, draft, batch_sizes, min_speedup, [],
                          "the run has no finished speculative cells (with a baseline) to judge")
    drafts = sorted(best["draft"].unique())
    if draft is not None and draft not in drafts:
        return GateResult(UNANSWERABLE, draft, batch_sizes, min_speedup, [],
                          f"draft {draft!r} is not in this run (drafts: {', '.join(drafts)})")

    worst_all = worst_case_by_batch(best)
    verdicts = []
    for name in drafts:
        worst = worst_all[worst_all["draft"] == name]  # worst workload/temperature of the best-K speed-up, per B
        by_batch = {int(r.batch_size): (float(r.speedup), int(r.k)) for r in worst.itertuples()}
        ranges = {int(r.batch_size): repeat_range(getattr(r, "speedup_runs", None)) for r in worst.itertuples()}
        ranges = {b: spread for b, spread in ranges.items() if spread and b in batch_sizes}
        missing = [b for b in batch_sizes if b not in by_batch]
        speedups = {b: by_batch[b][0] for b in batch_sizes if b in by_batch}
        best_k = {b: by_batch[b][1] for b in batch_sizes if b in by_batch}
        measured = sorted(by_batch)
        schedule = k_schedule(measured, [by_batch[b][1] if by_batch[b][0] >= min_speedup else None for b in measured])
        found = crossover(measured, [by_batch[b][0] for b in measured], threshold=min_speedup)
        passes = None if missing else all(s >= min_speedup for s in speedups.values())
        verdicts.append(DraftVerdict(name, passes, speedups, best_k, schedule, found.text, missing, ranges))

    if draft is None:  # judge the best draft (best_draft_rule) at the named batch sizes
        name = pick_best_draft(worst_all, batch_sizes)
        chosen = next(v for v in verdicts if v.draft == name) if name else verdicts[0]
    else:
        chosen = next(v for v in verdicts if v.draft == draft)
    measured = sorted(best["batch_size"].unique().tolist())
    if chosen.passes is None:
        return GateResult(UNANSWERABLE, chosen.draft, batch_sizes, min_speedup, verdicts,
                          f"no measurement at batch size(s) {', '.join(map(str, chosen.missing))} "
                          f"(measured: {', '.join(map(str, measured))}); sweep them or use `specbench plan` "
                          f"for a prediction")
    failing = [b for b, s in chosen.speedups.items() if s < min_speedup]
    if failing:
        message = (f"{chosen.draft}: speculation is below {min_speedup:g}× at batch size(s) "
                   + ", ".join(f"{b} ({format_speedup(chosen.speedups[b], min_speedup)})" for b in failing))
        return GateResult(FAIL, chosen.draft, batch_sizes, min_speedup, verdicts, message + _noise_note(chosen, min_speedup))
    return GateResult(PASS, chosen.draft, batch_sizes, min_speedup, verdicts,
                      f"{chosen.draft}: at least {min_speedup:g}× at every batch size in "
                      f"{', '.join(map(str, batch_sizes))}" + _noise_note(chosen, min_speedup))


def _noise_note(verdict: DraftVerdict, bar: float) -> str:
    noisy = verdict.within_noise(bar)
    if not noisy:
        return ""
    spans = ", ".join(f"B={b}: {verdict.ranges[b][0]:.3f}×–{verdict.ranges[b][1]:.3f}×" for b in noisy)
    return (f"; within noise: repeats fell on both sides of {bar:g}× ({spans}), so more --repeats or a "
            f"--min-speedup margin decides")
