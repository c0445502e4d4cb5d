"""Several replicas behind a router (issue 40): each arriving request goes to one replica, chosen
as a serving gateway chooses (llm-d, vLLM's production stack, a Kubernetes service):

- `least-outstanding`: the replica with the fewest requests sent and not yet finished (ties: the
  one that has waited longest since it was last chosen), which needs every replica's state at the
  arrival, so the replicas are simulated together, each advanced to every arrival in turn;
- `round-robin`: in turn, whatever their load;
- `prefix-aware`: the default scheduling profile of the Gateway API Inference Extension's endpoint
  picker, on which llm-d's scheduler builds (`schema.endpoint_picker_scores`, the served client's
  rule too): each replica scored 3 × the share of the request's prompt units its prefix cache holds
  (the precise prefix-cache scorer, which reads the servers' own caches) + 1 × its queue score
  (requests waiting, min-max normalised across the replicas: the shortest queue 1, the longest 0, all
  equal 1) + 1 × its KV cache's free share, the highest score taking it (ties: as
  least-outstanding). Without prefix caching, the queue and the KV cache alone. The queue and the
  KV cache are what each server last reported when the router last read them (every
  `schema.ROUTER_METRICS_INTERVAL_S`): vLLM's scheduler stats as each step ends (`Replica.published_at`,
  held to vLLM's own `make_stats` in tests/test_replica_vs_vllm_scheduler.py), which do not count
  the requests that arrived during the step. Requests arriving together therefore see the same
  reports and go to one server. Checked against two vLLM CPU servers behind specbench's client
  routing the same way (specbench/data/measured.json's finding prefix_router_check): where
  requests went and what their caches found as predicted; prompts new to every server herd onto one
  several at a time, and the tail that costs (p90 TTFT 5.2 s measured) is predicted at 5.1 s once
  the steps are priced at the pace the other router's replay of the same sitting ran at (2.2 s at
  the calibration's).

An `SloWatch` stops a fleet early once so many requests have missed the SLO that its percentile
cannot be met any more: near and past the knee a queue grows without end, and simulating the rest
of an hour of it tells nothing more (the sizing search runs many such fleets).
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from specbench.fleet.replica import (
    Outcome, Replica, ReplicaSpec, Speculation, cached_tokens_of, chain_keys, pooled_itl, running_percentile,
    share_at_least,
)
from specbench.schema import ROUTER_METRICS_INTERVAL_S, ROUTERS, endpoint_picker_scores
from specbench.step_model import StepModel

CHECK_EVERY = 256  # arrivals between two looks at the SLO's misses


@dataclass
class SloWatch:
    """Bounds in seconds (`ttft`, `tpot`, `e2e`) that `percentile` % of the requests must meet.
    `hopeless` says when more requests have missed than the percentile allows of all `count`."""

    bounds: dict[str, float]
    percentile: float
    count: int
    missed: int = 0  # finished requests that missed a bound
    # the API server's time in each TTFT and E2E (the replicas' `api_server_s`, set by simulate_fleet)
    api_server_s: Callable[[int], float] = lambda prompt_tokens: 0.0

    @property
    def allowed(self) -> float:
        # more misses than this put the interpolated percentile above the bound (np.percentile's
        # linear rule: the q-quantile sits at q(n-1), so (1-q)n + 1 values above push it over)
        return (1 - self.percentile / 100) * self.count + 1

    def finished(self, requests) -> None:
        for request in requests:
            if self.misses(request, request.finish_s):
                self.missed += 1

    def misses(self, request, now: float) -> bool:
        """Whether `request` misses a bound, as far as `now` shows it."""
        first = request.first_token_s if request.first_token_s == request.first_token_s else now
        api_s = self.api_server_s(request.prompt)
        if first - request.arrival_s + api_s > self.bounds.get("ttft", math.inf):
            return True
        if now - request.arrival_s + api_s > self.bounds.get("e2e", math.inf):
            return True
        if "tpot" in self.bounds and request.finish_s == request.finish_s and request.output > 1:
            return (request.finish_s - request.first_token_s) / (request.output - 1) > self.bounds["tpot"]
        return False

    def hopeless(self, replicas: list[Replica], now: float) -> bool:
        if self.missed > self.allowed:
            return True
        late = sum(self.misses(r, now) for replica in replicas for r in replica.waiting)
        return self.missed + late > self.allowed


@dataclass
class FleetOutcome:
    """Every request's times (index order, NaN where a stopped fleet never served it), the replica
    each went to, and each replica's running-batch timeline."""

    outcome: Outcome
    replica_of: np.ndarray
    timelines: list[list[tuple[float, int]]] = field(default_factory=list)
    stopped: bool = False  # an SloWatch stopped it: the SLO cannot be met

    def share_at_least(self, rows: int) -> list[float]:
        """Per replica, the share of its time at >= `rows` running requests."""
        return [share_at_least(timeline, rows) for timeline in self.timelines]

    def running_percentile(self, p: float) -> list[float]:
        """Per replica, the `p`th percentile of its running rows over its time."""
        return [running_percentile(timeline, p) for timeline in self.timelines]


def simulate_fleet(prompts: np.ndarray, outputs: np.ndarray, arrivals_s: np.ndarray, cost: StepModel,
                   spec: ReplicaSpec, replicas: int, router: str = "least-outstanding",
                   speculation: Speculation | None = None, watch: SloWatch | None = None,
                   prefixes: list[tuple] | None = None) -> FleetOutcome:
    """Requests arriving at `arrivals_s` (sorted), spread over `replicas` identical replicas by
    `router`. Each replica draws its own acceptance (its speculation's seed plus its number).
    `prefixes`: per request, the keys of its prompt's shared units (`Replica.add`), for replicas that
    cache prefixes (each its own cache)."""
    prompts, outputs = np.asarray(prompts, int), np.asarray(outputs, int)
    arrivals = np.asarray(arrivals_s, float)
    if router not in ROUTERS:
        raise ValueError(f"router must be one of {', '.join(ROUTERS)}, got {router!r}")
    if replicas < 1:
        raise ValueError(f"replicas must be >= 1, got {replicas}")
    if not len(prompts) or len(prompts) != len(outputs) or len(prompts) != len(arrivals):
        raise ValueError("give one prompt length, output length and arrival time per request (at least one)")
    if (np.diff(arrivals) < 0).any():
        raise ValueError("arrival times must be sorted")
    if watch is not None:
        watch.api_server_s = spec.api_server_s
    fleet = [Replica(cost, spec, None if speculation is None else
                     Speculation(speculation.k, speculation.acceptance, speculation.schedule, speculation.seed + n),
                     publishes=router == "prefix-aware")
             for n in range(replicas)]
    chosen_at = np.full(replicas, -math.inf)  # when each replica was last chosen (the tie-break)
    replica_of = np.full(len(prompts), -1)  # (-1: not routed, the fleet stopped before it arrived)
    added = []
    stopped = False
    for i, at in enumerate(arrivals):
        if router == "round-robin":
            target = i % replicas
        else:
            loads, queues, found, free = [], [], [], []
            keys = chain_keys(prefixes[i]) if prefixes is not None and router == "prefix-aware" else ()
            # the queues and KV caches as the router's latest read of the servers' reports found them
            read_s = math.floor(at / ROUTER_METRICS_INTERVAL_S) * ROUTER_METRICS_INTERVAL_S
            for n, replica in enumerate(fleet):
                finished = replica.advance(at)
                if watch is not None:
                    watch.finished(finished)
                loads.append((replica.outstanding(at), chosen_at[n], n))
                if router == "prefix-aware":
                    waiting, free_share = replica.published_at(read_s)
                    queues.append(waiting)
                    found.append(replica.cached_share(int(prompts[i]), keys))
                    free.append(free_share)
            if router == "prefix-aware":
                scores = endpoint_picker_scores(found, queues, free)
                target = min(range(replicas), key=lambda n: (-scores[n], loads[n]))
            else:
                target = min(loads)[2]
            chosen_at[target] = at
        replica_of[i] = target
        added.append(fleet[target].add(i, at, prompts[i], outputs[i], () if prefixes is None else prefixes[i]))
        if watch is not None and i % CHECK_EVERY == CHECK_EVERY - 1:
            if router == "round-robin":  # advanced only here: each replica's own arrivals bound its skips
                for replica in fleet:
                    watch.finished(replica.advance(at))
            if watch.hopeless(fleet, at):
                stopped = True
                break
    if not stopped:
        for replica in fleet:
            finished = replica.advance()
            if watch is not None:
                watch.finished(finished)
    count = len(prompts)
    first, finish = np.full(count, np.nan), np.full(count, np.nan)
    for request in added:
        first[request.index], finish[request.index] = request.first_token_s, request.finish_s
    outcome = Outcome(arrivals.copy(), first, finish, outputs.copy(), sum(r.preemptions for r in fleet),
                      sum(r.steps for r in fleet), [], *pooled_itl(fleet), prompts.copy(),
                      cached_tokens_of(added, count), spec.api_server_s(prompts))
    return FleetOutcome(outcome, replica_of, [r.timeline for r in fleet], stopped)
