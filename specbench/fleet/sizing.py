"""How many replicas a traffic needs at an SLO (issue 40): the fewest that still meet it when the
traffic is `headroom` heavier than asked (the stated utilisation margin: near the knee a small
error in a step's price is a large error in latency, so the answer keeps away from it), and what
that fleet does at the traffic itself: latency percentiles, goodput, time at large batches, GPUs
and dollars.

The search doubles the replicas until the SLO is met, then halves the gap to the last count that
missed (more replicas never serve a traffic worse, so the first count that meets it is the
answer); fleets that cannot meet it are stopped early (router.SloWatch)."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from specbench.fleet.replica import ReplicaSpec, Speculation, StepCost
from specbench.fleet.router import FleetOutcome, SloWatch, simulate_fleet

HOURS_PER_MONTH = 730  # 365 × 24 / 12
MOST_REPLICAS = 1024


@dataclass(frozen=True)
class Traffic:
    """Requests at 1× speed: arrival seconds (sorted, from 0), prompt and output tokens."""

    name: str
    arrivals_s: np.ndarray
    prompts: np.ndarray
    outputs: np.ndarray

    def __post_init__(self) -> None:
        if not len(self.arrivals_s) or not len(self.arrivals_s) == len(self.prompts) == len(self.outputs):
            raise ValueError("a traffic needs at least one request, with an arrival, a prompt and an output each")

    @property
    def duration_s(self) -> float:
        return float(self.arrivals_s[-1] - self.arrivals_s[0])

    def rate(self, scale: float = 1.0) -> float:
        """Requests per second at `scale` × speed."""
        return len(self.arrivals_s) / self.duration_s * scale if self.duration_s > 0 else math.inf

    def output_tokens_per_s(self, scale: float = 1.0) -> float:
        return float(self.outputs.sum()) / self.duration_s * scale if self.duration_s > 0 else math.inf


@dataclass(frozen=True)
class Objective:
    """Bounds in seconds (ttft, tpot, e2e) that `percentile` % of requests meet."""

    bounds: tuple[tuple[str, float], ...]
    percentile: int = 99

    def watch(self, count: int) -> SloWatch:
        return SloWatch(dict(self.bounds), self.percentile, count)


def judged(fleet: FleetOutcome, objective: Objective) -> dict:
    """Percentiles of TTFT, TPOT and E2E (ms), the share of requests meeting every bound, and
    whether the objective's percentile of each bounded metric is within its bound."""
    out = fleet.outcome
    metrics = {"ttft": out.ttft_s, "tpot": out.tpot_s, "e2e": out.e2e_s}
    served = ~np.isnan(out.finish_s)
    good = served.copy()
    for name, bound in objective.bounds:
        values = np.nan_to_num(metrics[name], nan=0.0 if name == "tpot" else np.inf)
        good &= np.where(served, values <= bound, False)
    row: dict = {}
    for name, values in metrics.items():
        kept = values[served & ~np.isnan(values)]
        for p in (50, 90, 99):
            row[f"{name}_p{p}_ms"] = float(np.percentile(kept, p)) * 1e3 if len(kept) else math.nan
    meets = not fleet.stopped and bool(served.all())
    for name, bound in objective.bounds:
        values = np.nan_to_num(metrics[name], nan=0.0 if name == "tpot" else np.inf)
        meets = meets and float(np.percentile(values, objective.percentile)) <= bound
    row["good_share"] = float(good.mean())
    row["meets_slo"] = meets
    return row


def fleet_at(traffic: Traffic, scale: float, cost: StepCost, spec: ReplicaSpec, replicas: int,
             speculation: Speculation | None, router: str, objective: Objective | None = None) -> FleetOutcome:
    """`traffic` at `scale` × speed through `replicas` replicas (stopped early once `objective`
    cannot be met)."""
    return simulate_fleet(traffic.prompts, traffic.outputs, traffic.arrivals_s / scale, cost, spec, replicas, router,
                          speculation, objective.watch(len(traffic.prompts)) if objective else None)


def fewest_replicas(traffic: Traffic, scale: float, cost: StepCost, spec: ReplicaSpec,
                    speculation: Speculation | None, objective: Objective, router: str, headroom: float,
                    at_least: int = 1, most: int = MOST_REPLICAS) -> int | None:
    """The fewest replicas meeting `objective` at `scale × (1 + headroom)` × speed (None: not even
    `most`). `at_least`: a count known to miss or to be the answer's floor (a lighter traffic's)."""
    heavier = scale * (1 + headroom)

    def meets(replicas: int) -> bool:
        return judged(fleet_at(traffic, heavier, cost, spec, replicas, speculation, router, objective),
                      objective)["meets_slo"]

    low, high = at_least - 1, max(1, at_least)  # low: misses (0: nothing known); high: to try
    while not meets(high):
        low = high
        if high >= most:
            return None
        high = min(most, high * 2)
    while high - low > 1:
        middle = (low + high) // 2
        if meets(middle):
            high = middle
        else:
            low = middle
    return high


def monthly_dollars(replicas: int, gpus_per_replica: int, price_per_gpu_hour: float | None) -> float:
    return replicas * gpus_per_replica * price_per_gpu_hour * HOURS_PER_MONTH if price_per_gpu_hour else math.nan
