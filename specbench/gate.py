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

from specbench.fit import (
    Slo, best_k_by_batch, capacity_ratio, capacity_text, crossover, load_column, pick_best_draft, repeat_range,
    schedule_ranges, slo_capacity, slo_table, vllm_speculative_config, worst_case_by_batch,
)
from specbench.grid import format_schedule

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
    # the schedule as a complete vLLM --speculative-config (None: the draft's config is unknown, or it never pays)
    speculative_config: dict | None = None

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
             temperatures: list[float] | None = None, base_configs: dict[str, dict] | None = None) -> GateResult:
    """`base_configs`: each draft's own --speculative-config, to which the recommended schedule is added."""
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
        schedule = schedule_ranges(measured, [by_batch[b][1] if by_batch[b][0] >= min_speedup else None
                                              for b in measured])
        found = crossover(measured, [by_batch[b][0] for b in measured], threshold=min_speedup)
        passes = None if missing else all(s >= min_speedup for s in speedups.values())
        base = (base_configs or {}).get(name)
        config = vllm_speculative_config(base, schedule) if base is not None else None
        verdicts.append(DraftVerdict(name, passes, speedups, best_k, format_schedule(schedule), found.text, missing,
                                     ranges, config))

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


# --- the same question under an SLO ------------------------------------------------------------

@dataclass
class SloVerdict:
    workload: str
    temperature: float
    baseline_capacity: float | None  # the highest load meeting the SLO without speculation (None: none)
    capacity: float | None  # ... with the draft, best K per load
    k: int | None
    max_measured: float
    passes: bool | None
    baseline_tokens_per_s: float = float("nan")  # at the baseline's capacity
    tokens_per_s: float = float("nan")  # at the draft's capacity


@dataclass
class SloGateResult:
    exit_code: int
    draft: str | None
    slo: str
    load: str  # "request_rate" or "batch_size"
    verdicts: list[SloVerdict]
    message: str

    def to_dict(self) -> dict:
        return asdict(self)


def evaluate_slo(cells: pd.DataFrame, requests: pd.DataFrame, slo: Slo, draft: str | None = None,
                 workloads: list[str] | None = None, temperatures: list[float] | None = None) -> SloGateResult:
    """Speculation must not lower the highest load (request rate, or concurrency) at which every
    measured load up to it meets the SLO, for any workload and temperature. The draft judged is
    `draft`, else the one whose worst ratio of capacities is highest. Exit 2 when the run lacks
    the cells or requests, or no load meets the SLO with or without speculation."""
    column = load_column(cells)
    table = slo_table(cells, requests, slo)
    if not table.empty and workloads:
        table = table[table["workload"].isin(workloads)]
    if not table.empty and temperatures is not None:
        table = table[table["temperature"].isin(temperatures)]

    def unanswerable(message: str) -> SloGateResult:
        return SloGateResult(UNANSWERABLE, draft, slo.text, column, [], message)

    if table.empty:
        return unanswerable("the run has no finished cells with per-request records to judge the SLO on")
    capacity = slo_capacity(table)
    baseline = capacity[capacity["mode"] == "autoregressive"]
    speculative = capacity[capacity["mode"] != "autoregressive"]
    if baseline.empty or speculative.empty:
        return unanswerable("the run needs both autoregressive and speculative cells (an --endpoint run needs "
                            "--baseline-endpoint)")
    drafts = sorted(speculative["draft"].unique())
    if draft is not None and draft not in drafts:
        return unanswerable(f"draft {draft!r} is not in this run (drafts: {', '.join(drafts)})")

    def verdicts_for(name: str) -> list[SloVerdict]:
        out = []
        for row in speculative[speculative["draft"] == name].itertuples():
            base = baseline[(baseline["workload"] == row.workload) & (baseline["temperature"] == row.temperature)]
            if base.empty:
                continue
            b = base.iloc[0]
            ours = None if pd.isna(row.max_load) else float(row.max_load)
            theirs = None if pd.isna(b["max_load"]) else float(b["max_load"])
            passes = None if ours is None and theirs is None else (theirs is None or (ours or 0) >= theirs)
            out.append(SloVerdict(row.workload, float(row.temperature), theirs, ours,
                                  None if pd.isna(row.k) else int(row.k), float(row.max_measured_load), passes,
                                  float(b["tokens_per_s"]), float(row.tokens_per_s)))
        return out

    by_draft = {name: verdicts_for(name) for name in drafts}

    def score(name: str) -> float:
        ratios = [capacity_ratio(v.capacity, v.baseline_capacity) for v in by_draft[name] if v.passes is not None]
        return min(ratios) if ratios else -1.0

    name = draft or max(drafts, key=score)
    verdicts = by_draft[name]
    if not verdicts or all(v.passes is None for v in verdicts):
        return SloGateResult(UNANSWERABLE, name, slo.text, column, verdicts,
                             f"no measured load meets {slo.describe()}, with or without speculation: measure "
                             f"lower loads or relax the SLO")
    failing = [v for v in verdicts if v.passes is False]
    unit = "request rate" if column == "request_rate" else "concurrency"
    if failing:
        worst = failing[0]
        return SloGateResult(FAIL, name, slo.text, column, verdicts,
                             f"{name}: speculation lowers the highest {unit} meeting {slo.describe()} "
                             f"({worst.workload}, T={worst.temperature:g}: "
                             f"{capacity_text(worst.capacity, worst.max_measured, column)} against "
                             f"{capacity_text(worst.baseline_capacity, worst.max_measured, column)} without)")
    return SloGateResult(PASS, name, slo.text, column, verdicts,
                         f"{name}: speculation does not lower the highest {unit} meeting {slo.describe()} "
                         f"in any workload and temperature")
