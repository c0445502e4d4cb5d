"""How many replicas a traffic needs at an SLO (issue 40): the fewest that still meet it when the
traffic is `headroom` heavier than asked (the stated utilisation margin: near the knee a small
error in a step's price is a large error in latency, so the answer keeps away from it), and what
that fleet does at the traffic itself: latency percentiles, goodput, time at large batches, GPUs
and dollars.

The search doubles the replicas until the SLO is met, then halves the gap to the last count that
missed (more replicas never serve a traffic worse, so the first count that meets it is the
answer); fleets that cannot meet it are stopped early (router.SloWatch)."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specbench.fleet.replica import Outcome, ReplicaSpec, Speculation
from specbench.step_model import StepModel
from specbench.fleet.router import FleetOutcome, SloWatch, simulate_fleet
from specbench.fleet.workers import in_processes
from specbench.schema import AR, LARGE_BATCH

HOURS_PER_MONTH = 730  # 365 × 24 / 12
# every configuration's acceptance drawn from the same uniforms (common random numbers): two that
# behave alike (K = 3, and a K schedule that stays at 3) get the same answer, and what differs
# between configurations near the knee is theirs, not their draws'
COMMON_SEED = 0
MOST_REPLICAS = 1024
# a fleet that routed fewer requests a replica than this (stopped early) is not asked which replicas
# its router left idle
IDLE_AFTER = 4
# a traffic whose scaled span is shorter than this many of its time scale (its requests' p50 E2E,
# or the SLO's TTFT or E2E bound where longer) is a burst: its fleet's queues absorb it whole, and
# meeting the SLO says nothing of the rate it is scaled to (a fleet 20 % short of that rate takes
# several bounds' time to fall behind by one)
BURST_LIFETIMES = 10


@dataclass(frozen=True)
class Traffic:
    """Requests at 1× speed: arrival seconds (sorted, from 0), prompt and output tokens."""

    name: str
    arrivals_s: np.ndarray
    prompts: np.ndarray
    outputs: np.ndarray
    # what prompts share, where the trace says (Mooncake's hash ids): per request, a key for each of its
    # prompt's leading units of `prefix_unit_tokens` (equal keys up to a unit: equal tokens up to it)
    prefixes: list[tuple] | None = None
    prefix_unit_tokens: int = 0

    def __post_init__(self) -> None:
        if not len(self.arrivals_s) or not len(self.arrivals_s) == len(self.prompts) == len(self.outputs):
            raise ValueError("a traffic needs at least one request, with an arrival, a prompt and an output each")
        if self.prefixes is not None and (len(self.prefixes) != len(self.prompts) or self.prefix_unit_tokens < 1):
            raise ValueError("a traffic's prefixes need one tuple of keys per request and a unit of tokens")

    def replica_for(self, spec: ReplicaSpec) -> ReplicaSpec:
        """`spec` caching prefixes in this traffic's units (vLLM caches block by block; a trace
        that keys its prompts by larger units is found and evicted unit by unit)."""
        if self.prefixes is None or not spec.prefix_caching:
            return spec
        if self.prefix_unit_tokens % spec.block_size:
            raise ValueError(f"{self.name}'s prefixes come in units of {self.prefix_unit_tokens} tokens, not a "
                             f"multiple of the replica's {spec.block_size}-token KV blocks")
        return dataclasses.replace(spec, prefix_unit_blocks=self.prefix_unit_tokens // spec.block_size)

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


UNSERVED_S = 1e300  # a request never served: later than any bound (finite, so percentiles interpolate)


def slo_verdict(out: Outcome, objective: Objective, mask: np.ndarray | None = None) -> tuple[float, bool]:
    """Over the requests in `mask` (every one by default): the share meeting every bound, and
    whether the objective's percentile of each bounded metric is within its bound (a request not
    served misses every bound; a one-token output has no TPOT and misses no TPOT bound)."""
    chosen = np.ones(len(out.finish_s), bool) if mask is None else mask
    good, meets = ~np.isnan(out.finish_s[chosen]), True
    for _, bound, values in _bounded(out, objective, chosen):
        good &= values <= bound
        meets = meets and float(np.percentile(values, objective.percentile)) <= bound
    return float(good.mean()), meets


def _bounded(out: Outcome, objective: Objective, chosen: np.ndarray):
    """(metric, bound, each chosen request's value) for every bound of `objective`, as the SLO judges
    them: a request not served at `UNSERVED_S`, a one-token output's TPOT at 0."""
    metrics = {"ttft": out.ttft_s, "tpot": out.tpot_s, "e2e": out.e2e_s}
    served = ~np.isnan(out.finish_s[chosen])
    for name, bound in objective.bounds:
        values = np.nan_to_num(metrics[name][chosen], nan=0.0 if name == "tpot" else np.inf)
        yield name, bound, np.where(served, values, UNSERVED_S)


def judged(fleet: FleetOutcome, objective: Objective) -> dict:
    """Percentiles of TTFT, TPOT, E2E and the pooled inter-token latency (ms), the share of requests
    meeting every bound, and whether the objective's percentile of each bounded metric is within
    its bound."""
    out = fleet.outcome
    metrics = {"ttft": out.ttft_s, "tpot": out.tpot_s, "e2e": out.e2e_s}
    served = ~np.isnan(out.finish_s)
    row: dict = {}
    for name, values in metrics.items():
        kept = values[served & ~np.isnan(values)]
        for p in (50, 90, 99):
            row[f"{name}_p{p}_ms"] = float(np.percentile(kept, p)) * 1e3 if len(kept) else math.nan
    for p in (50, 90, 99):
        row[f"itl_p{p}_ms"] = out.itl_percentile(p) * 1e3
        row[f"itl_chunk_p{p}_ms"] = out.itl_chunk_percentile(p) * 1e3
    good_share, meets = slo_verdict(out, objective)
    row["good_share"] = good_share
    row["prefix_hit_share"] = out.prefix_hit_share()  # the prompt tokens found in the prefix cache
    row["meets_slo"] = not fleet.stopped and bool(served.all()) and meets
    return row


def fleet_at(traffic: Traffic, scale: float, cost: StepModel, spec: ReplicaSpec, replicas: int,
             speculation: Speculation | None, router: str, objective: Objective | None = None) -> FleetOutcome:
    """`traffic` at `scale` × speed through `replicas` replicas (stopped early once `objective`
    cannot be met)."""
    return simulate_fleet(traffic.prompts, traffic.outputs, traffic.arrivals_s / scale, cost, traffic.replica_for(spec),
                          replicas, router, speculation, objective.watch(len(traffic.prompts)) if objective else None,
                          traffic.prefixes)


def _duration(seconds: float) -> str:
    return f"{seconds:.3g} s" if seconds >= 1 else f"{seconds * 1e3:.3g} ms"


def alone(traffic: Traffic, cost: StepModel, spec: ReplicaSpec, speculation: Speculation | None,
          objective: Objective) -> tuple[bool, str]:
    """Whether the SLO holds with every request served alone (no queue, no neighbours; if not, no
    number of replicas meets it: each request's own prefill and decode are too slow), and the bounds
    it misses there with what the requests reach ("p90 TTFT 1.02 s against 500 ms"; "" where none)."""
    apart = np.arange(len(traffic.prompts)) * 1e7  # far enough apart that none overlaps another
    lonely = Traffic(traffic.name, apart, traffic.prompts, traffic.outputs, traffic.prefixes, traffic.prefix_unit_tokens)
    fleet = fleet_at(lonely, 1.0, cost, spec, 1, speculation, "round-robin")
    if judged(fleet, objective)["meets_slo"]:
        return True, ""
    out = fleet.outcome
    reached = [(name, bound, float(np.percentile(values, objective.percentile)))
               for name, bound, values in _bounded(out, objective, np.ones(len(out.finish_s), bool))]
    return False, ", ".join(f"p{objective.percentile} {name.upper()} {_duration(value)} against {_duration(bound)}"
                            for name, bound, value in reached if value > bound)


def fewest_replicas(traffic: Traffic, scale: float, cost: StepModel, spec: ReplicaSpec,
                    speculation: Speculation | None, objective: Objective, router: str, headroom: float,
                    at_least: int = 1, most: int = MOST_REPLICAS, idle: list | None = None) -> int | None:
    """The fewest replicas meeting `objective` at `scale × (1 + headroom)` × speed (None: not even
    `most`, or the router leaves replicas idle: `idle` then gets how many it had and how many it
    used). `at_least`: a count known to miss or to be the answer's floor (a lighter traffic's)."""
    heavier = scale * (1 + headroom)
    used: dict[int, int] = {}  # replicas tried: how many of them the router sent a request

    def meets(replicas: int) -> bool:
        fleet = fleet_at(traffic, heavier, cost, spec, replicas, speculation, router, objective)
        routed = fleet.replica_of[fleet.replica_of >= 0]
        # (a fleet stopped early has routed too few to say which replicas its router leaves idle)
        used[replicas] = len(np.unique(routed)) if len(routed) >= IDLE_AFTER * replicas else replicas
        return judged(fleet, objective)["meets_slo"]

    low, high = at_least - 1, max(1, at_least)  # low: misses (0: nothing known); high: to try
    while not meets(high):
        # behind prefix-aware a replica no prompt's prefix is cached on can lose every request to ones
        # whose KV caches are nearly as free: where the fleet grew and its router used none of the
        # replicas added, more would sit idle too
        stuck = router == "prefix-aware" and low >= 1 and used[high] <= low
        low = high
        if high >= most or stuck:
            if stuck and idle is not None:
                idle.append((high, used[high]))
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


@dataclass(frozen=True)
class Configuration:
    """One way to serve the target at one TP: the baseline, or a drafter at K with an acceptance,
    and the step price and replica that go with it."""

    tp: int
    draft: str
    k: int
    acceptance: str
    cost: StepModel
    spec: ReplicaSpec
    speculation: Speculation | None
    schedule: str = ""  # a K schedule by running batch ({1-8: 4, 9+: off}); `k` is then its deepest K

    @property
    def label(self) -> str:
        if self.speculation is None:
            return "without speculation"
        k = f"K schedule {self.schedule}" if self.schedule else f"K={self.k}"
        return f"{self.draft} {k}" + (f" ({self.acceptance})" if self.acceptance else "")


def size_fleets(found: list[Configuration], traffic: Traffic, scales: list[float], objective: Objective,
                headroom: float, router: str, price_per_gpu_hour: float | None = None,
                workers: int | None = None, on_progress: Progress | None = None) -> pd.DataFrame:
    """One row per TP × traffic scale × configuration: the fewest replicas meeting `objective` at
    the scale × (1 + `headroom`), and at the scale itself with that many replicas: latency
    percentiles, goodput, the share of each replica's time at B >= 32, GPUs, $ a month and $ per 1M
    output tokens (NaN without a price; `replicas` NaN where even MOST_REPLICAS miss, where the
    router left replicas of a missing fleet idle (`idle_at` replicas, `used_at` used), or where
    `reachable` is false: a request served alone already misses the objective). Each configuration
    is sized on one of `workers` processes (None: one per core; `workers.in_processes`), and
    `on_progress` told of each as it finishes (`Progress`)."""

    def sized(configuration: Configuration) -> list[dict]:
        return _sized(configuration, traffic, sorted(scales), objective, headroom, router, price_per_gpu_hour)

    def said(index: int, rows: list[dict]) -> str:  # "TP4 1b K=3 (α 0.7): 2 at 1×, 3 at 2×" (replicas)
        return f"{_tp_named(found, index)}{found[index].label}: " + ", ".join(
            f"{int(row['replicas']) if row['replicas'] == row['replicas'] else 'none'} at {row['scale']:g}×"
            for row in rows)

    by_configuration = in_processes(sized, found, workers, progress_counter(on_progress, len(found), said))
    # scale by scale, each in the configurations' order
    rows = [rows_of[at] for at in range(len(scales)) for rows_of in by_configuration]
    table = pd.DataFrame(rows)
    # the tables' order: per TP, each scale, its configurations
    return table.sort_values(["tp", "scale"], kind="stable").reset_index(drop=True)


# on_progress(done, total, label): `done` of `total` configurations simulated, `label` the one just
# finished and its answer in a few words; called with 0 done (and no label) before the first
Progress = Callable[[int, int, str], None]


def progress_counter(on_progress: Progress | None, total: int, label: Callable[[int, object], str]):
    """An `in_processes` on_done that tells `on_progress` how many of `total` are done, and which."""
    if on_progress is None:
        return None
    on_progress(0, total, "")
    done = [0]

    def on_done(index: int, result) -> None:
        done[0] += 1
        on_progress(done[0], total, label(index, result))

    return on_done


def fleet_figures(configuration: Configuration, traffic: Traffic, scale: float, replicas: int, router: str,
                  objective: Objective, price_per_gpu_hour: float | None) -> dict:
    """`replicas` replicas of `configuration` serving `traffic` at `scale`: latency percentiles and
    the SLO's verdict (`judged`), goodput, the share of each replica's time at B >= 32, the batch
    the busiest replica runs at for 90 % of its time (where a price fitted on a run is read:
    served.beyond_measured), preemptions, $ a month and $ per 1M output tokens."""
    fleet = fleet_at(traffic, scale, configuration.cost, configuration.spec, replicas, configuration.speculation,
                     router)
    shares = fleet.share_at_least(LARGE_BATCH)
    figures = judged(fleet, objective)
    monthly = monthly_dollars(replicas, configuration.tp, price_per_gpu_hour)
    return {**figures, "goodput_rps": figures["good_share"] * traffic.rate(scale),
            "share_at_large_batch_mean": float(np.mean(shares)), "share_at_large_batch_max": float(np.max(shares)),
            "running_p90": float(np.max(fleet.running_percentile(90))), "preemptions": fleet.outcome.preemptions,
            "dollars_per_month": monthly,
            "dollars_per_million_tokens": monthly / HOURS_PER_MONTH / 3600 / traffic.output_tokens_per_s(scale) * 1e6}


def _tp_named(found: list[Configuration], index: int) -> str:
    """"TP4 " where the configurations span several TP sizes."""
    return f"TP{found[index].tp} " if len({c.tp for c in found}) > 1 else ""


def _sized(configuration: Configuration, traffic: Traffic, scales: list[float], objective: Objective,
           headroom: float, router: str, price_per_gpu_hour: float | None) -> list[dict]:
    """`size_fleets`' rows for one configuration, one per scale (ascending)."""
    rows = []
    tp = configuration.tp
    floor = 1  # a heavier traffic needs no fewer replicas
    # whether any number of replicas can meet the objective (a request alone does)
    reachable, alone_missed = alone(traffic, configuration.cost, configuration.spec, configuration.speculation,
                                    objective)
    for scale in scales:
        idle: list[tuple[int, int]] = []
        replicas = fewest_replicas(traffic, scale, configuration.cost, configuration.spec,
                                   configuration.speculation, objective, router, headroom,
                                   at_least=floor, idle=idle) if reachable else None
        row = {"tp": tp, "reachable": reachable, "alone_misses": alone_missed, "scale": scale,
               "draft": configuration.draft, "k": configuration.k,
               # where the router left replicas idle: how many a missing fleet had, and used
               "idle_at": idle[0][0] if idle else math.nan, "used_at": idle[0][1] if idle else math.nan,
               "k_schedule": configuration.schedule, "acceptance": configuration.acceptance,
               "configuration": configuration.label, "request_rate": traffic.rate(scale),
               "replicas": replicas if replicas else math.nan, "gpus": replicas * tp if replicas else math.nan}
        if replicas:
            floor = replicas
            row.update(fleet_figures(configuration, traffic, scale, replicas, router, objective, price_per_gpu_hour))
        # the traffic's time scale: the SLO's TTFT and E2E bounds, and its requests' p50 E2E where sized
        lifetimes = [bound for name, bound in objective.bounds if name in ("ttft", "e2e")]
        lifetimes += [row["e2e_p50_ms"] / 1e3] if replicas else []
        span_s = traffic.duration_s / scale
        row.update({"span_s": span_s, "burst": span_s < BURST_LIFETIMES * max(lifetimes, default=0.0)})
        rows.append(row)
    return rows


def fleets_as_they_are(found: list[Configuration], traffic: Traffic, scales: list[float], replicas: int,
                       objective: Objective, router: str, price_per_gpu_hour: float | None = None,
                       workers: int | None = None, on_progress: Progress | None = None) -> pd.DataFrame:
    """One row per TP × traffic scale × configuration: `replicas` replicas of it, as they are (not
    sized), serving the traffic at the scale: latency percentiles, goodput and the share meeting
    `objective` (no bounds: every request served), the share of time at B >= 32, $ per 1M tokens;
    `tpot_speedup` and `e2e_speedup`: the baseline's TPOT and E2E p50 at that TP and scale over the
    configuration's (E2E counts the queue a loaded fleet builds, which TPOT does not)."""

    def simulated(configuration: Configuration) -> list[dict]:
        return [{"tp": configuration.tp, "scale": scale, "draft": configuration.draft, "k": configuration.k,
                 "k_schedule": configuration.schedule, "acceptance": configuration.acceptance,
                 "configuration": configuration.label, "request_rate": traffic.rate(scale), "replicas": replicas,
                 "gpus": replicas * configuration.tp,
                 **fleet_figures(configuration, traffic, scale, replicas, router, objective, price_per_gpu_hour)}
                for scale in sorted(scales)]

    def said(index: int, rows: list[dict]) -> str:  # "TP4 1b K=3 (α 0.7): TPOT p50 12 ms at 1×, 30 ms at 4×"
        return f"{_tp_named(found, index)}{found[index].label}: TPOT p50 " + ", ".join(
            f"{row['tpot_p50_ms']:.0f} ms at {row['scale']:g}×" for row in rows)

    by_configuration = in_processes(simulated, found, workers, progress_counter(on_progress, len(found), said))
    table = pd.DataFrame([row for rows in by_configuration for row in rows])
    base = table[table["draft"] == AR].set_index(["tp", "scale"])
    for metric in ("tpot", "e2e"):
        table[f"{metric}_speedup"] = [base[f"{metric}_p50_ms"].get((tp, scale), math.nan) / value for tp, scale, value
                                      in zip(table["tp"], table["scale"], table[f"{metric}_p50_ms"])]
    return table.sort_values(["tp", "scale"], kind="stable").reset_index(drop=True)
