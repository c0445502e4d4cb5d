"""Decisions from measured speed-ups: the best K per batch size, B*, the best draft, the gate's
worst case, K schedules and the vLLM config that loads one."""

from __future__ import annotations

import math
from dataclasses import dataclass

import pandas as pd

from specbench.fit.cells import label_cells, ok_closed_loop
from specbench.grid import OPEN_ENDED, format_schedule, vllm_schedule
from specbench.schema import AR


def best_k_by_batch(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (draft, workload, temperature, B): the measured best K and its speed-up."""
    sd = ok_closed_loop(label_cells(cells))
    sd = sd[(sd["mode"] != AR) & sd["speedup"].notna()] if not sd.empty else sd
    if sd.empty:
        return pd.DataFrame()
    index = sd.groupby(["draft", "workload", "temperature", "batch_size"])["speedup"].idxmax()
    columns = ["draft", "workload", "temperature", "batch_size", "k", "speedup"]
    columns += ["speedup_runs"] if "speedup_runs" in sd else []
    return sd.loc[index, columns].reset_index(drop=True)


@dataclass
class Crossover:
    batch_size: float | None  # interpolated B* where best speed-up falls below 1; None if no crossing
    text: str


def _crossing(b0: int, s0: float, b1: int, s1: float, threshold: float) -> float:
    fraction = (s0 - threshold) / (s0 - s1)
    return 2 ** (math.log2(b0) + fraction * (math.log2(b1) - math.log2(b0)))


def crossover(batch_sizes: list[int], speedups: list[float], threshold: float = 1.0,
              sizes: str = "measured") -> Crossover:
    """B*: where the best speed-up falls from >= threshold to below it, interpolated in log2 B.
    The text also says where speculation starts paying when it is below at small batches (on a
    compute-bound CPU, say, it can improve with batch size). `sizes` says what the batch sizes
    are in the text ("measured", or "predicted" for plan's)."""
    points = sorted(zip(batch_sizes, speedups))
    if not points:
        return Crossover(None, "no data")
    rises, falls = [], []
    for (b0, s0), (b1, s1) in zip(points, points[1:]):
        if s0 < threshold <= s1:
            rises.append((_crossing(b0, s0, b1, s1, threshold), b0, b1))
        elif s0 >= threshold > s1:
            falls.append((_crossing(b0, s0, b1, s1, threshold), b0, b1))
    parts = []
    if points[0][1] < threshold:
        parts.append(f"below {threshold:g}× at B = {points[0][0]}")
    if rises:
        at, b0, b1 = rises[0]
        parts.append(f"≥ {threshold:g}× from B ≈ {at:.1f} (between {b0} and {b1})")
    if falls:
        at, b0, b1 = falls[-1]
        parts.append(f"B* ≈ {at:.1f} (between {b0} and {b1})")
        return Crossover(at, "; ".join(parts))
    if points[-1][1] >= threshold:
        parts.append(f"no slowdown up to B = {points[-1][0]}")
    elif not rises:
        parts[-1] = f"below {threshold:g}× at every {sizes} B (up to {points[-1][0]})" if len(points) > 1 else parts[-1]
    return Crossover(None, "; ".join(parts))


def where_it_pays(points: dict[str, list[tuple]], at: str = "B = {}", near: str = "B ≈ {}",
                  threshold: float = 1.0) -> str:
    """One clause per drafter over its cases: "1b still pays at B = 64, the largest asked", "8b stops
    paying at B ≈ 24"
    (the lowest B* of its cases), or "8b never pays"; joined by "; ". A case is (sizes, best
    speed-ups) or (sizes, best speed-ups, the speed-ups shown beside them), the "up to" figure the
    largest shown, and the size where it is. `at` and `near` word a size exactly and approximately ("{} clients")."""
    clauses: list = []
    paying: dict[str, list[tuple[str, float]]] = {}  # the largest size asked -> the drafts still paying there
    for draft, cases in points.items():
        found = [crossover(case[0], case[1], threshold) for case in cases if case[0]]
        falls = [c.batch_size for c in found if c.batch_size is not None]
        best, best_at = max(((value, size) for case in cases for size, value in zip(case[0], case[-1])),
                            default=(float("nan"), None))
        largest = max((max(case[0]) for case in cases if case[0]), default=0)
        within = f" in {len(falls)} of {len(found)} cases" if 0 < len(falls) < len(found) else ""
        if falls:
            clauses.append(f"{draft} stops paying at {near.format(_about(min(falls)))}{within}")
        elif best < threshold:
            clauses.append(f"{draft} never pays (at best {best:.2f}×)")
        elif all(c.text.startswith("no slowdown") for c in found):
            size = at.format(f"{largest:g}")
            if size not in paying:
                clauses.append(size)  # its place, filled below with every draft paying there
            where = at.format(f"{best_at:g}")
            paying.setdefault(size, []).append((draft, best, "1 client" if where == "1 clients" else where))
        else:  # below the bar at small sizes, above it later (a compute-bound CPU)
            clauses.append(f"{draft}: {found[0].text}")
    for size, drafts in paying.items():
        names, bests = " and ".join(d for d, *_ in drafts), ", ".join(f"{b:.2f}× at {where}" for _, b, where in drafts)
        said = f"{names} still {'pays' if len(drafts) == 1 else 'pay'} at {size}, the largest asked (up to {bests})"
        clauses[clauses.index(size)] = said
    return "; ".join(clauses)


def speedup_cases(rows: pd.DataFrame, cases: list[str], size: str, speedup: str) -> dict[str, list[tuple]]:
    """`where_it_pays`' cases from `rows` (speculative ones): per draft, for each group of `cases`
    columns, the sizes in `size` ascending and the best `speedup` at each (over K and schedules)."""
    found: dict[str, list[tuple]] = {}
    for (draft, *_), group in rows.groupby(["draft", *cases], sort=False, dropna=False):
        best = group.groupby(size)[speedup].max().sort_index()
        found.setdefault(draft, []).append((best.index.tolist(), best.tolist()))
    return found


def _about(size: float) -> str:
    """An interpolated size as B* lines print it: one decimal under 10, whole above."""
    return f"{size:.1f}" if size < 10 else f"{size:.0f}"


WORST_CASE = "worst case"  # the workload label of rows taken over every workload and temperature


def b_star_rule(bar: float = 1.0) -> str:
    return (f"B* = the batch size where the best-K speed-up falls below {bar:g}×, interpolated in log2(B) "
            f"between the measured sizes either side of it")


def best_draft_rule(bar: float = 1.0) -> str:
    return (f"best draft = the one whose lowest speed-up over the batch sizes judged is highest (at each batch size: "
            f"the best K, the worst workload and temperature); bar {bar:g}×")


def worst_case_by_batch(best: pd.DataFrame) -> pd.DataFrame:
    """Per (draft, B) of a best_k_by_batch frame: the best-K speed-up of the least favourable
    workload and temperature, with the K, workload and temperature where it occurs. What the gate judges."""
    if best.empty:
        return best
    return best.loc[best.groupby(["draft", "batch_size"])["speedup"].idxmin()].sort_values(
        ["draft", "batch_size"]).reset_index(drop=True)


def measured_answer(cells: pd.DataFrame) -> str:
    """A run's answer in one sentence: per draft, where its measured best-K speed-up (the worst
    workload and temperature) stops paying."""
    ok = cells[cells["status"] == "ok"] if "status" in cells else cells
    worst = worst_case_by_batch(best_k_by_batch(cells))
    cases = {draft: [(rows["batch_size"].tolist(), rows["speedup"].tolist())]
             for draft, rows in worst.groupby("draft", sort=False)} if not worst.empty else {}
    found = where_it_pays(cases) if cases else "no speculative cell has a speed-up"
    return f"MEASURED, {len(ok)} of {len(cells)} cells: {found} (the worst workload and temperature)."


def pick_best_draft(worst: pd.DataFrame, batch_sizes: list[int]) -> str | None:
    """The draft best_draft_rule names, among drafts measured at every one of `batch_sizes`."""
    scores = {}
    for draft, rows in worst.groupby("draft"):
        judged = rows[rows["batch_size"].isin(batch_sizes)]
        if len(judged) == len(set(batch_sizes)):
            scores[draft] = (judged["speedup"].min(), judged["speedup"].mean())
    return max(scores, key=scores.get) if scores else None


def crossover_table(cells: pd.DataFrame, threshold: float = 1.0) -> pd.DataFrame:
    """B* per draft, workload and temperature, and per draft over the worst case of them
    (workload `worst case`): the one the gate reports."""
    best = best_k_by_batch(cells)
    rows = []
    if best.empty:
        return pd.DataFrame()
    for (draft, workload, temperature), group in best.groupby(["draft", "workload", "temperature"]):
        found = crossover(group["batch_size"].tolist(), group["speedup"].tolist(), threshold)
        rows.append({"draft": draft, "workload": workload, "temperature": temperature,
                     "crossover_batch_size": found.batch_size, "crossover": found.text})
    for draft, group in worst_case_by_batch(best).groupby("draft"):
        found = crossover(group["batch_size"].tolist(), group["speedup"].tolist(), threshold)
        rows.append({"draft": draft, "workload": WORST_CASE, "temperature": float("nan"),
                     "crossover_batch_size": found.batch_size, "crossover": found.text})
    return pd.DataFrame(rows)


def k_schedule(batch_sizes: list[int], best_k: list[int | None]) -> str:
    """`{1-8: 5, 9-32: 2, 33+: off}`: each measured B covers the sizes above the previous one."""
    return format_schedule(schedule_ranges(batch_sizes, best_k))


def speedup_headline(draft: str, speedups: dict[int, float], crossover_text: str, schedule_text: str,
                     ks_measured: int, undecided: list[int] | None = None,
                     repeats: dict[int, int] | None = None) -> str:
    """The one-sentence answer report and check both print: the draft's best and worst measured
    batch sizes (the gate's worst case over workloads and temperatures), B*, and the K schedule."""
    if not speedups:
        return ""
    best, worst = max(speedups, key=speedups.get), min(speedups, key=speedups.get)
    at = f"{speedups[best]:.2f}× the autoregressive tokens/s at B={best}"
    if worst != best:
        at += f" and {speedups[worst]:.2f}× at B={worst}, its worst measured batch size"
    k = "at its best K" if ks_measured > 1 else "at the one K measured (no K comparison)"
    noise = (f"; within noise at B={', '.join(map(str, undecided))} (the schedule leaves it off there)"
             if undecided else "")
    evidence = ""
    if repeats:
        fewest, most = min(repeats.values()), max(repeats.values())
        evidence = (f" ({fewest} repeat{'s' if fewest != 1 else ''} per cell)" if fewest == most
                    else f" ({fewest}–{most} repeats per cell)")
    return (f"With {draft} {k}, speculation runs at {at} (the least favourable workload and temperature){evidence}; "
            f"{crossover_text}; recommended K schedule {schedule_text}{noise}.")


def vllm_speculative_config(base: dict, schedule: list[tuple[int, int, int]]) -> dict | None:
    """A complete `--speculative-config` for vLLM from a draft's own config and a K schedule
    (first batch size, last, K; K 0 = off): num_speculative_tokens is the largest K (vLLM clamps
    the schedule to it) and num_speculative_tokens_per_batch_size the schedule. None when the
    schedule never drafts (leave speculation off)."""
    largest = max((k for _, _, k in schedule), default=0)
    if largest < 1:
        return None

    config = {key: value for key, value in base.items() if key != "num_speculative_tokens_per_batch_size"}
    config["num_speculative_tokens"] = largest
    config["num_speculative_tokens_per_batch_size"] = vllm_schedule(schedule)
    return config


def schedule_ranges(batch_sizes: list[int], best_k: list[int | None]) -> list[tuple[int, int, int]]:
    """The K per batch size as (first, last, K) ranges, K 0 (None in `best_k`) for off: each
    measured B covers the sizes above the previous one, and the last range is open-ended."""
    ranges: list[tuple[int, int, int]] = []
    low = 1
    for b, k in sorted(zip(batch_sizes, best_k)):
        value = k or 0
        if ranges and ranges[-1][2] == value:
            ranges[-1] = (ranges[-1][0], b, value)
        else:
            ranges.append((low, b, value))
        low = b + 1
    if ranges:
        ranges[-1] = (ranges[-1][0], OPEN_ENDED, ranges[-1][2])
    return ranges
