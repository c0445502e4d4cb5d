"""The rollout gate: does speculation meet the bar at the batch sizes that matter?

Per draft, the speed-up at a batch size is the best over K there (the K you would deploy at that
size), and the worst over the run's workloads and temperatures (a gate should not pass on the
friendliest traffic). A draft passes when every named batch size meets `min_speedup`.
With repeats, each speed-up has a confidence interval (fit.evidence); a batch size is decided only
when an interval lies wholly on one side of the bar, else the verdict is inconclusive and says how
many repeats would decide it. A run that did not finish cannot pass (nor fail) unless asked to.
Exit codes: EXIT_CODES.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field

import pandas as pd

from specbench.fit import (
    AR, CONFIDENCE, Completeness, Slo, best_k_by_batch, capacity_ratio, capacity_text, combine_all, combine_any,
    crossover, judge, label_cells, load_column, marked_cells, measurement_warnings, ok_closed_loop, pick_best_draft,
    repeats_to_decide, requests_to_bound, schedule_ranges, slo_capacity, slo_table, speedup_headline,
    vllm_speculative_config, worst_case_by_batch,
)
from specbench.fit.evidence import FAIL as FAILS, INCONCLUSIVE as UNDECIDED, PASS as PASSES
from specbench.fit.noise import RunNoise, cell_interval, pairing, repeats_behind, run_noise
from specbench.fit.physics import tokens_per_forward, with_bounds
from specbench.grid import format_schedule
from specbench.schema import SIDE_BY_SIDE, TURNS

PASS, FAIL, UNANSWERABLE, INCONCLUSIVE, INTERNAL_ERROR = 0, 1, 2, 3, 4
EXIT_CODES = {
    PASS: "pass: speculation meets the bar",
    FAIL: "fail: it does not",
    UNANSWERABLE: "cannot answer: bad input, a run without the cells to judge, or an incomplete run",
    INCONCLUSIVE: "inconclusive: a confidence interval straddles the bar (more repeats or requests decide it)",
    INTERNAL_ERROR: "internal error: specbench itself failed (a bug; the message says where the traceback is)",
}
FINISH_ADVICE = ("finish the sweep (`specbench sweep --resume --output RUN`), or pass --allow-incomplete to judge "
                 "what was measured")
DECISION_LABELS = {"pass": "PASS", "fail": "FAIL", "inconclusive": "NOISE"}  # a draft's, a point's; else "N/A "
VERDICTS = {PASS: "PASS", FAIL: "FAIL", UNANSWERABLE: "CANNOT ANSWER", INCONCLUSIVE: "INCONCLUSIVE"}


def format_speedup(value: float, bar: float, fewest: int = 3) -> str:
    """A speed-up with enough decimals (`fewest` to 6) that it never prints as the bar it missed or
    cleared: 0.9996 against 1.0 is "0.9996×", not "1.000×"."""
    for decimals in range(fewest, 7):
        text = f"{value:.{decimals}f}"
        if value == bar or text != f"{bar:.{decimals}f}":
            break
    return text + "×"


@dataclass
class DraftVerdict:
    draft: str
    passes: bool | None  # None: cannot answer, or inconclusive
    speedups: dict[int, float]  # named B -> worst-case best-K speed-up
    best_k: dict[int, int]  # named B -> K that achieves it (in the worst workload)
    schedule: str  # recommended K per batch size over every measured B (off where not shown to pay)
    crossover: str
    missing: list[int] = field(default_factory=list)
    intervals: dict[int, tuple[float, float]] = field(default_factory=dict)  # named B -> CI of that speed-up
    # the schedule as a complete vLLM --speculative-config (None: the draft's config is unknown, or it never pays)
    speculative_config: dict | None = None
    decisions: dict[int, str] = field(default_factory=dict)  # named B -> pass / fail / inconclusive
    repeats_to_decide: dict[int, int | None] = field(default_factory=dict)  # inconclusive B -> repeats in all
    marks: dict[int, str] = field(default_factory=dict)  # named B -> the warning that marks its worst cell
    ks_measured: int = 0
    headline: str = ""
    repeats: dict[int, int] = field(default_factory=dict)  # named B -> repeats its decision rests on
    reasons: dict[int, str] = field(default_factory=dict)  # named B -> why it is decided (or not)
    bounds: dict[int, float] = field(default_factory=dict)  # named B -> what acceptance allows there
    above_bound: list[str] = field(default_factory=list)  # the draft's cells above what acceptance allows
    cells: dict[int, str] = field(default_factory=dict)  # named B -> the cell the decision rests on

    @property
    def decision(self) -> str:
        return "missing" if self.missing else combine_all(list(self.decisions.values()))


@dataclass
class GateResult:
    exit_code: int
    draft: str | None  # the draft the verdict is for
    batch_sizes: list[int]
    min_speedup: float
    verdicts: list[DraftVerdict]
    message: str
    verdict: str = ""  # PASS, FAIL, INCONCLUSIVE, CANNOT ANSWER
    warnings: list[str] = field(default_factory=list)  # every measurement warning, incompleteness first
    incomplete: str = ""  # why the run is not complete; "" when it is
    confidence: float = CONFIDENCE
    headline: str = ""
    advice: str = ""  # what would settle an inconclusive or incomplete verdict
    noise: dict = field(default_factory=dict)  # the run's noise band of a single comparison (fit.noise)
    above_bound: list[dict] = field(default_factory=list)  # cells above what acceptance allows

    def __post_init__(self) -> None:
        self.verdict = self.verdict or VERDICTS.get(self.exit_code, "")

    def to_dict(self) -> dict:
        return asdict(self)


def _judged(cells: pd.DataFrame, min_speedup: float, workloads: list[str] | None,
            temperatures: list[float] | None, noise: RunNoise | None = None) -> pd.DataFrame:
    """Every finished speculative cell with a speed-up, its bound, interval, repeats and decision
    against the bar (and why)."""
    sd = ok_closed_loop(label_cells(cells))
    sd = sd[(sd["mode"] != AR) & sd["speedup"].notna()].copy() if not sd.empty else sd
    if sd.empty:
        return sd
    if workloads:
        sd = sd[sd["workload"].isin(workloads)]
    if temperatures is not None:
        sd = sd[sd["temperature"].isin(temperatures)]
    noise = noise or run_noise(cells)
    marks = marked_cells(cells)
    sd = with_bounds(sd, noise)
    records = sd.to_dict("records")
    sd["interval"] = [cell_interval(r) for r in records]
    sd["repeats_behind"] = [repeats_behind(r) for r in records]
    sd["pairing"] = [pairing(r) for r in records]
    sd["mark"] = [marks.get(c, "") for c in sd["cell_id"]]
    judgements = [judge(float(r["speedup"]), interval, min_speedup, bool(mark), _or_none(r["speedup_bound"]),
                        tokens_per_forward(r), _or_none(r.get("drafted")) or 0.0,
                        noise.interval(r["cell_id"], float(r["speedup"])), "" if noise.drift is not None
                        else noise.describe())
                  for r, interval, mark in zip(records, sd["interval"], sd["mark"])]
    sd["decision"] = [j.decision for j in judgements]
    sd["reason"] = [j.reason for j in judgements]
    return sd


SEVERITY = {FAILS: 0, UNDECIDED: 1, PASSES: 2}


def _point_row(rows: pd.DataFrame) -> dict:
    """One (workload, temperature, batch size) point over its K: it passes when one K passes (the
    fastest passing K speaks for it), fails when every K fails, else is open (the fastest open K)."""
    decision = combine_any(list(rows["decision"]))
    candidates = rows[rows["decision"] == decision] if decision != FAILS else rows
    return candidates.loc[candidates["speedup"].idxmax()].to_dict() | {"decision": decision}


def _deciding_rows(judged: pd.DataFrame) -> dict[int, dict]:
    """One draft's decision per batch size and the cell behind it: at each (workload, temperature)
    the best of its K, then the worst of those (a fail before an open point before a pass, then
    the lowest speed-up)."""
    points = [_point_row(rows) for _, rows in judged.groupby(["workload", "temperature", "batch_size"])]
    by_batch: dict[int, dict] = {}
    for row in points:
        b = int(row["batch_size"])
        held = by_batch.get(b)
        if held is None or (SEVERITY[row["decision"]], row["speedup"]) < (SEVERITY[held["decision"]], held["speedup"]):
            by_batch[b] = row
    return by_batch


def undecided_cells(cells: pd.DataFrame, draft: str, batch_sizes: list[int], min_speedup: float = 1.0, *,
                    requests: pd.DataFrame | None, steps: pd.DataFrame | None) -> list[str]:
    """The draft's cells at the (workload, temperature, batch size) points whose decision is
    inconclusive: what more repeats of (with their baselines) can decide."""
    judged = _judged(cells, min_speedup, None, None, run_noise(cells, requests, steps))
    if judged.empty:
        return []
    judged = judged[(judged["draft"] == draft) & judged["batch_size"].isin(batch_sizes)]
    keys = ["workload", "temperature", "batch_size"]
    open_points = judged.groupby(keys)["decision"].agg(lambda d: combine_any(list(d)))
    open_points = set(open_points[open_points == UNDECIDED].index)
    return [row.cell_id for row in judged.itertuples() if (row.workload, row.temperature, row.batch_size) in open_points]


def evaluate(cells: pd.DataFrame, batch_sizes: list[int], *, state: Completeness | None,
             requests: pd.DataFrame | None, steps: pd.DataFrame | None, min_speedup: float = 1.0,
             draft: str | None = None, workloads: list[str] | None = None,
             temperatures: list[float] | None = None, base_configs: dict[str, dict] | None = None,
             allow_incomplete: bool = False, copies: pd.DataFrame | None = None) -> GateResult:
    """`state`: whether the run finished (`fit.completeness(run.meta, run.cells)`, of the whole
    run); None: judged as complete. `requests`, `steps`: the run's tables, from which the noise band
    of a single comparison is measured (fit.noise). The three are required so that no caller judges
    a run as complete, or without its noise band, by leaving them out; `specbench.api.check` passes
    a run's own. `base_configs`: each draft's own --speculative-config, to which the recommended
    schedule is added. `copies`: a cluster run's baselines measured again on other nodes (their
    disagreement is a warning, fit.nodes)."""
    noise = run_noise(cells, requests, steps)
    warnings = measurement_warnings(cells, copies, noise)
    incomplete = state.describe() if state is not None else ""  # a sweep that stopped, whatever it judges

    def unanswerable(name: str | None, verdicts: list[DraftVerdict], message: str) -> GateResult:
        return GateResult(UNANSWERABLE, name, batch_sizes, min_speedup, verdicts, message,
                          warnings=([incomplete] if incomplete else []) + warnings, incomplete=incomplete,
                          noise=noise.to_dict())

    best = best_k_by_batch(cells)
    if not best.empty and workloads:
        best = best[best["workload"].isin(workloads)]
    if not best.empty and temperatures is not None:
        best = best[best["temperature"].isin(temperatures)]
    if best.empty:
        return unanswerable(draft, [], "the run has no finished speculative cells (with a baseline) to judge"
                            + (f" ({incomplete})" if incomplete else ""))
    drafts = sorted(best["draft"].unique())
    if draft is not None and draft not in drafts:
        return unanswerable(draft, [], f"draft {draft!r} is not in this run (drafts: {', '.join(drafts)})")

    judged = _judged(cells, min_speedup, workloads, temperatures, noise)
    worst_all = worst_case_by_batch(best)
    verdicts = [_draft_verdict(name, worst_all[worst_all["draft"] == name], judged[judged["draft"] == name],
                               batch_sizes, min_speedup, (base_configs or {}).get(name)) for name in drafts]

    if draft is None:  # judge the best draft (best_draft_rule) at the named batch sizes
        name = pick_best_draft(worst_all, batch_sizes)
        chosen = next(v for v in verdicts if v.draft == name) if name else verdicts[0]
    else:
        chosen = next(v for v in verdicts if v.draft == draft)
    if chosen.missing:
        measured = sorted(best["batch_size"].unique().tolist())
        return unanswerable(chosen.draft, verdicts,
                            f"no measurement at batch size(s) {', '.join(map(str, chosen.missing))} "
                            f"(measured: {', '.join(map(str, measured))}); sweep them or use `specbench plan` "
                            f"for a prediction")
    gaps = _evidence_gaps(cells, chosen.draft, batch_sizes, workloads, temperatures)
    if gaps["mismatched"]:
        return unanswerable(chosen.draft, verdicts,
                            f"{chosen.draft}: {len(gaps['mismatched'])} cell(s) failed the lossless check "
                            f"({', '.join(gaps['mismatched'][:3])}): their speed-ups are not those of a correct "
                            f"engine")
    absent = state.missing_in([chosen.draft, AR], batch_sizes, workloads, temperatures) if state is not None else []
    for ids, what in ((gaps["failed"], "failed"), (absent, "were planned but have no row")):
        if ids:
            gap = f"{len(ids)} cell(s) it judges {what} ({', '.join(ids[:3])}{', …' if len(ids) > 3 else ''})"
            incomplete = f"{incomplete}; {gap}" if incomplete else gap
    result = _verdict(chosen, batch_sizes, min_speedup, verdicts)
    result.headline = chosen.headline
    result.noise = noise.to_dict()
    result.above_bound = [{"cell_id": row.cell_id, "speedup": float(row.speedup), "bound": float(row.speedup_bound)}
                          for row in judged[judged["above_bound"]].itertuples()]
    result.warnings = ([incomplete] if incomplete else []) + warnings
    result.incomplete = incomplete
    if incomplete and not allow_incomplete:
        refused = unanswerable(chosen.draft, verdicts, f"incomplete evidence: {incomplete}; on the cells measured "
                                                       f"the verdict would be {result.verdict} ({result.message})")
        refused.advice = FINISH_ADVICE
        return refused
    if incomplete:
        result.message += f" (judged on an incomplete run, --allow-incomplete: {incomplete})"
    return result


def _evidence_gaps(cells: pd.DataFrame, draft: str, batch_sizes: list[int], workloads: list[str] | None,
                   temperatures: list[float] | None) -> dict[str, list[str]]:
    """Cells the verdict would judge (the draft's and the baselines at the named batch sizes) that
    failed, and those that failed the lossless check."""
    labelled = label_cells(cells)
    if labelled.empty or "status" not in labelled:
        return {"failed": [], "mismatched": []}
    mine = labelled[labelled["draft"].isin([draft, AR]) & labelled["batch_size"].isin(batch_sizes)]
    if workloads:
        mine = mine[mine["workload"].isin(workloads)]
    if temperatures is not None:
        mine = mine[mine["temperature"].isin(temperatures)]
    mismatched = mine[mine["lossless"] == "MISMATCH"]["cell_id"].tolist() if "lossless" in mine else []
    failed = [c for c in mine[mine["status"] == "failed"]["cell_id"] if c not in mismatched]
    return {"failed": failed, "mismatched": mismatched}


def _draft_verdict(name: str, worst: pd.DataFrame, judged: pd.DataFrame, batch_sizes: list[int], bar: float,
                   base_config: dict | None) -> DraftVerdict:
    """`worst`: the draft's worst-case best-K rows per batch size (B*); `judged`: every one of its cells."""
    rows = _deciding_rows(judged) if not judged.empty else {}
    measured = sorted(rows)
    speedups = {b: float(rows[b]["speedup"]) for b in measured}
    # K is on only where it is shown to pay: a batch size decided PASS, with the K that passed there
    schedule = schedule_ranges(measured, [int(rows[b]["k"]) if rows[b]["decision"] == PASSES else None
                                          for b in measured])
    best = {int(r.batch_size): float(r.speedup) for r in worst.itertuples()}
    found = crossover(sorted(best), [best[b] for b in sorted(best)], threshold=bar)
    named = [b for b in batch_sizes if b in rows]
    picked = {b: rows[b] for b in named}
    decisions = {b: row["decision"] for b, row in picked.items()}
    verdict = DraftVerdict(
        name, None, {b: speedups[b] for b in named}, {b: int(row["k"]) for b, row in picked.items()},
        format_schedule(schedule), found.text, [b for b in batch_sizes if b not in rows],
        {b: tuple(row["interval"]) for b, row in picked.items() if row["interval"]},
        vllm_speculative_config(base_config, schedule) if base_config is not None else None, decisions,
        {b: repeats_to_decide(row.get("speedup_runs"), bar) if row["pairing"] in (TURNS, SIDE_BY_SIDE) else None
         for b, row in picked.items() if row["decision"] == UNDECIDED},
        {b: row["mark"] for b, row in picked.items() if row["mark"]},
        int(judged["k"].nunique()) if not judged.empty else 0,
        repeats={b: int(row["repeats_behind"]) for b, row in picked.items()},
        reasons={b: row["reason"] for b, row in picked.items()},
        bounds={b: float(row["speedup_bound"]) for b, row in picked.items() if pd.notna(row["speedup_bound"])},
        above_bound=sorted(judged[judged["above_bound"]]["cell_id"]) if not judged.empty else [],
        cells={b: row["cell_id"] for b, row in picked.items()})
    verdict.passes = {PASSES: True, FAILS: False}.get(verdict.decision)
    undecided = [b for b in measured if rows[b]["decision"] == UNDECIDED]
    verdict.headline = speedup_headline(name, speedups, found.text, verdict.schedule, verdict.ks_measured, undecided,
                                        {b: int(rows[b]["repeats_behind"]) for b in measured})
    return verdict


def _verdict(chosen: DraftVerdict, batch_sizes: list[int], bar: float, verdicts: list[DraftVerdict]) -> GateResult:
    decision = chosen.decision
    failing = [b for b, d in chosen.decisions.items() if d == FAILS]
    if decision == FAILS:
        message = (f"{chosen.draft}: speculation is below {bar:g}× at batch size(s) "
                   + ", ".join(f"{b} ({format_speedup(chosen.speedups[b], bar)}{evidence_text(chosen, b)})"
                               for b in failing))
        return GateResult(FAIL, chosen.draft, batch_sizes, bar, verdicts, message)
    if decision == UNDECIDED:
        parts = []
        for b, d in chosen.decisions.items():
            if d != UNDECIDED:
                continue
            if b in chosen.intervals and chosen.reasons.get(b) == "interval straddles the bar":
                low, high = chosen.intervals[b]
                needed = chosen.repeats_to_decide.get(b)
                more = (f"about {needed} repeats in all would decide it if the spread holds" if needed
                        else "it sits on the bar: no practical number of repeats decides it, a --min-speedup "
                             "margin does")
                parts.append(f"B={b}: {format_speedup(chosen.speedups[b], bar)}, {CONFIDENCE:.0%} interval "
                             f"{low:.3f}×–{high:.3f}× from {_repeats_text(chosen, b)} straddles {bar:g}× ({more})")
            else:
                parts.append(f"B={b}: {format_speedup(chosen.speedups[b], bar)}{evidence_text(chosen, b)}")
        message = f"{chosen.draft}: inconclusive, within the measurement's noise at " + "; ".join(parts)
        return GateResult(INCONCLUSIVE, chosen.draft, batch_sizes, bar, verdicts, message,
                          advice="`specbench sweep --resume --output RUN --until-decided` adds repeats where they "
                                 "decide")
    shown = "; ".join(f"B={b} {format_speedup(chosen.speedups[b], bar)}{evidence_text(chosen, b)}"
                      for b in chosen.speedups)
    return GateResult(PASS, chosen.draft, batch_sizes, bar, verdicts,
                      f"{chosen.draft}: at least {bar:g}× at every batch size in {', '.join(map(str, batch_sizes))} "
                      f"({shown})")


def _repeats_text(verdict: DraftVerdict, batch_size: int) -> str:
    n = verdict.repeats.get(batch_size, 1)
    return f"{n} repeat{'s' if n != 1 else ''}"


def evidence_text(verdict: DraftVerdict, batch_size: int) -> str:
    """What a batch size's decision rests on: its interval or noise band, its repeats, and why."""
    reason = verdict.reasons.get(batch_size, "")
    mark = verdict.marks.get(batch_size)
    if batch_size in verdict.intervals and reason in ("interval", "interval straddles the bar"):
        low, high = verdict.intervals[batch_size]
        return f", {CONFIDENCE:.0%} interval {low:.3f}×–{high:.3f}× from {_repeats_text(verdict, batch_size)}"
    if reason == "a measurement warning marks it" and mark:
        return f"; {_repeats_text(verdict, batch_size)}, and {mark} (--repeats 3 gives an interval)"
    return f"; {_repeats_text(verdict, batch_size)}: {reason}" if reason else ""


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
    # the capacities within the requests' noise: (beyond doubt, at most) — fit.slo_capacity
    baseline_bounds: tuple[float | None, float | None] = (None, None)
    bounds: tuple[float | None, float | None] = (None, None)
    decision: str = ""  # pass / fail / inconclusive ("" when neither meets the SLO at any load)


@dataclass
class SloGateResult:
    exit_code: int
    draft: str | None
    slo: str
    load: str  # "request_rate" or "batch_size"
    verdicts: list[SloVerdict]
    message: str
    verdict: str = ""
    warnings: list[str] = field(default_factory=list)
    incomplete: str = ""
    confidence: float = CONFIDENCE
    advice: str = ""

    def __post_init__(self) -> None:
        self.verdict = self.verdict or VERDICTS.get(self.exit_code, "")

    def to_dict(self) -> dict:
        return asdict(self)


def _slo_decision(ours: tuple, theirs: tuple) -> str:
    """Speculation keeps the capacity beyond doubt when its lowest possible capacity is at least the
    baseline's highest possible one; lowers it beyond doubt when its highest is below the baseline's lowest."""
    low = lambda value: -math.inf if value is None else value  # noqa: E731 (None: no load meets it)
    if low(ours[0]) >= low(theirs[1]):
        return PASSES
    return FAILS if low(ours[1]) < low(theirs[0]) else UNDECIDED


def slo_verdicts(capacity: pd.DataFrame, name: str) -> list[SloVerdict]:
    """A draft's verdict per (workload, temperature): its capacity under the SLO against the
    baseline's (`slo_capacity` rows), each within the noise of its requests."""
    baseline = capacity[capacity["mode"] == AR]
    out = []
    for row in capacity[(capacity["mode"] != AR) & (capacity["draft"] == name)].itertuples():
        base = baseline[(baseline["workload"] == row.workload) & (baseline["temperature"] == row.temperature)]
        if base.empty:
            continue
        b = base.iloc[0]
        ours = None if pd.isna(row.max_load) else float(row.max_load)
        theirs = None if pd.isna(b["max_load"]) else float(b["max_load"])
        passes = None if ours is None and theirs is None else (theirs is None or (ours or 0) >= theirs)
        bounds = (_or_none(row.max_load_low), _or_none(row.max_load_high))
        baseline_bounds = (_or_none(b["max_load_low"]), _or_none(b["max_load_high"]))
        out.append(SloVerdict(row.workload, float(row.temperature), theirs, ours,
                              None if pd.isna(row.k) else int(row.k), float(row.max_measured_load), passes,
                              float(b["tokens_per_s"]), float(row.tokens_per_s), baseline_bounds, bounds,
                              # n/a only when both miss the SLO beyond doubt from the lowest load on
                              "" if bounds[1] is None and baseline_bounds[1] is None
                              else _slo_decision(bounds, baseline_bounds)))
    return out


def slo_judged_draft(capacity: pd.DataFrame, by_draft: dict[str, list[SloVerdict]] | None = None) -> str | None:
    """The draft `check --slo` judges when none is named: the one whose least favourable capacity
    ratio (over the workloads and temperatures it decides) is highest. The report's answer names
    the same one. None without speculative rows."""
    drafts = sorted(capacity[capacity["mode"] != AR]["draft"].unique()) if not capacity.empty else []
    if not drafts:
        return None
    by_draft = by_draft or {name: slo_verdicts(capacity, name) for name in drafts}

    def score(name: str) -> float:
        ratios = [capacity_ratio(v.capacity, v.baseline_capacity) for v in by_draft[name] if v.decision]
        return min(ratios) if ratios else -1.0

    return max(drafts, key=score)


def evaluate_slo(cells: pd.DataFrame, requests: pd.DataFrame, slo: Slo, *, state: Completeness | None,
                 draft: str | None = None, workloads: list[str] | None = None,
                 temperatures: list[float] | None = None, allow_incomplete: bool = False) -> SloGateResult:
    """Speculation must not lower the highest load (request rate, or concurrency) at which every
    measured load up to it meets the SLO, for any workload and temperature. The draft judged is
    `draft`, else the one whose worst ratio of capacities is highest. Each capacity is also taken
    within the noise of its requests (order-statistic intervals of the percentiles): where the intervals
    leave it open, the verdict is inconclusive. Exit 2 when the run lacks the cells or requests, is
    incomplete, or no load meets the SLO with or without speculation. `state`: as `evaluate`'s,
    required (None judges the run as complete)."""
    column = load_column(cells)
    warnings = measurement_warnings(cells, noise=run_noise(cells, requests))
    incomplete = state.describe() if state is not None else ""
    table = slo_table(cells, requests, slo)
    if not table.empty and workloads:
        table = table[table["workload"].isin(workloads)]
    if not table.empty and temperatures is not None:
        table = table[table["temperature"].isin(temperatures)]

    def unanswerable(message: str, name: str | None = draft, verdicts: list | None = None) -> SloGateResult:
        return SloGateResult(UNANSWERABLE, name, slo.text, column, verdicts or [], message,
                             warnings=([incomplete] if incomplete else []) + warnings, incomplete=incomplete)

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

    by_draft = {name: slo_verdicts(capacity, name) for name in drafts}
    name = draft or slo_judged_draft(capacity, by_draft)
    verdicts = by_draft[name]
    if not verdicts or all(not v.decision for v in verdicts):
        return unanswerable(f"no measured load meets {slo.describe()}, with or without speculation: measure "
                            f"lower loads or relax the SLO", name, verdicts)
    unit = "request rate" if column == "request_rate" else "concurrency"
    decision = combine_all([v.decision for v in verdicts if v.decision])
    if decision == FAILS:
        worst = next(v for v in verdicts if v.decision == FAILS)
        result = SloGateResult(FAIL, name, slo.text, column, verdicts,
                               f"{name}: speculation lowers the highest {unit} meeting {slo.describe()} "
                               f"({worst.workload}, T={worst.temperature:g}: "
                               f"{capacity_text(worst.capacity, worst.max_measured, column)} against "
                               f"{capacity_text(worst.baseline_capacity, worst.max_measured, column)} without)")
    elif decision == UNDECIDED:
        open_ = [v for v in verdicts if v.decision == UNDECIDED]
        spans = "; ".join(f"{v.workload}, T={v.temperature:g}: with {name} {bounds_text(v.bounds, column)}, "
                          f"without {bounds_text(v.baseline_bounds, column)}" for v in open_)
        needed = requests_to_bound(slo.percentile)
        result = SloGateResult(INCONCLUSIVE, name, slo.text, column, verdicts,
                               f"{name}: inconclusive: within the requests' noise the highest {unit} meeting "
                               f"{slo.describe()} could be ({spans}); a load is open while the {CONFIDENCE:.0%} "
                               f"interval of a bounded p{slo.percentile} straddles its bound",
                               advice=f"more requests per load (--num-prompts): a p{slo.percentile} is bounded "
                                      f"from above only from {needed} requests on")
    else:
        result = SloGateResult(PASS, name, slo.text, column, verdicts,
                               f"{name}: speculation does not lower the highest {unit} meeting {slo.describe()} "
                               f"in any workload and temperature, beyond the requests' noise")
    absent = state.missing_in([name, AR], None, workloads, temperatures) if state is not None else []
    if absent:
        gap = f"{len(absent)} cell(s) it judges were planned but have no row ({', '.join(absent[:3])})"
        incomplete = f"{incomplete}; {gap}" if incomplete else gap
    result.warnings = ([incomplete] if incomplete else []) + warnings
    result.incomplete = incomplete
    if incomplete and not allow_incomplete:
        refused = unanswerable(f"incomplete evidence: {incomplete}; on the cells measured the verdict would be "
                               f"{result.verdict} ({result.message})", name, verdicts)
        refused.advice = FINISH_ADVICE
        return refused
    if incomplete:
        result.message += f" (judged on an incomplete run, --allow-incomplete: {incomplete})"
    return result


def _or_none(value) -> float | None:
    return None if value is None or pd.isna(value) else float(value)


def bounds_text(bounds: tuple, column: str) -> str:
    low, high = bounds
    name = "R" if column == "request_rate" else "B"
    text = lambda value: "no load" if value is None else f"{value:g}"  # noqa: E731
    return f"{name} = {text(low)}" if low == high else f"{name} between {text(low)} and {text(high)}"
