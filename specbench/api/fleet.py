"""A fleet at a trace and an SLO (specbench.fleet; docs/fleet.md): the fewest replicas behind a
router that meet the SLO at each traffic scale, with and without speculation, and what they cost;
replicas priced on the kernel tables (`size_fleet`) or the servers a vLLM run measured
(`size_fleet_on_run`)."""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.api.closed_loop import OnProgress
from specbench.api.errors import UsageError
from specbench.api.inputs import check_price
from specbench.api.replicas import Simulated


@dataclass
class FleetSizes(Simulated):
    """SIMULATED, not measured: `table` holds one row per TP, traffic scale, and configuration
    (fleet.sizing.size_fleets' columns: replicas, GPUs, cost, latencies at the size found);
    `answers` the sentences per TP × scale and the fewest GPUs per scale."""
    table: Any  # a pandas DataFrame
    head: dict  # what the replicas rest on: the tables or the run, the server flags, the acceptance
    traffic: Any  # fleet.sizing.Traffic: the trace's requests at 1×
    replay: Any  # traces' replay of it: what was skipped
    slo: Any  # fit.slo's parsed SLO
    scales: list[float]
    headroom: float
    router: str
    price: float | None  # $ per GPU-hour (or server-hour); None: costs in device-hours
    price_note: str
    replica: str = ""  # what one replica is, in words (a run's servers); "" on the tables
    answers: list[str] = field(default_factory=list)

    def to_dict(self) -> dict:
        """As `plan --trace ... --json` prints it."""
        import json

        traffic = self.traffic
        return {**self.head, "trace": traffic.name, "requests": len(traffic.prompts),
                "duration_s": traffic.duration_s, "skipped": self.replay.notes(), "slo": self.slo.text,
                "headroom": self.headroom, "router": self.router, "price": self.price_note,
                "prefix_unit_tokens": traffic.prefix_unit_tokens if traffic.prefixes is not None else None,
                "price_per_gpu_hour": self.price, "drafts_left_out": self.left_out, "answers": self.answers,
                "chart": str(self.chart) if self.chart else None, "seconds": round(self.seconds, 3),
                "rows": json.loads(self.table.to_json(orient="records"))}


def size_fleet(target: str, *, trace: str, slo: str, trace_window: str = "", scales: Sequence[float] = (1.0,),
               headroom: float = 0.2, router: str = "least-outstanding", drafts: Sequence[str] = ("1b", "8b"),
               alpha: str | float | None = None, acceptance: Path | str | None = None, device: str = "h100",
               backend: str = "vllm", tp: Sequence[int] = (1,), draft_tp: int | None = None,
               ks: Sequence[int] = (1, 2, 3, 4, 6, 8), dtype: str | None = None, draft_dtype: str | None = None,
               kv_cache_dtype: str = "auto", max_num_seqs: int | None = None,
               max_num_batched_tokens: int | None = None, async_scheduling: bool | None = None,
               prefix_caching: bool | None = None, gpu_price: float | None = None, chart: Path | str | None = None,
               on_progress: OnProgress | None = None) -> FleetSizes:
    """`plan --target --trace --slo`: serve `trace` (azure-conv, azure-code, mooncake-conv or a file;
    `trace_window` START:DURATION of it) at each of `scales` by vLLM-like replicas on `device`'s
    kernel tables behind `router` (least-outstanding, round-robin, prefix-aware), and find the
    fewest that meet `slo` (ttft=,tpot=,e2e=,pNN) at 1 + `headroom` times the traffic, without
    speculation and with each drafter × K. `chart`: a PNG of replicas against traffic scale. The
    other arguments as api.closed_loop's."""
    from specbench.api.replicas import check_chart, load_traffic, tables_replica
    from specbench.fit.prices import tables_gpu_price
    from specbench.fit.slo import parse_slo
    from specbench.fleet.plan import traffic_table
    from specbench.fleet.sizing import Objective

    started = time.perf_counter()
    chart = check_chart(chart)
    if slo is None:
        raise UsageError("--trace sizes the fleet that meets an SLO: give --slo (e.g. ttft=2,tpot=0.05,p90)")
    ks, scales = list(ks), list(scales)
    if any(x < 1 for x in ks):
        raise UsageError("--k must be >= 1")
    check_price(gpu_price, 1)
    replica = tables_replica(target, drafts=drafts, alpha=alpha, acceptance=acceptance, device=device,
                             backend=backend, tp=tp, draft_tp=draft_tp, dtype=dtype, draft_dtype=draft_dtype,
                             kv_cache_dtype=kv_cache_dtype, clients="steady", max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens, async_scheduling=async_scheduling,
                             prefix_caching=prefix_caching,
                             check_load=lambda: _check_traffic(scales, headroom, router), fits=None)
    parsed = parse_slo(slo)
    traffic, replay = load_traffic(trace, trace_window,
                                   int(replica.target_config.get("max_position_embeddings") or 0))
    price, price_note = tables_gpu_price(replica.planner.system, gpu_price)
    table, unpriced = traffic_table(replica.planner, replica.drafters, replica.accepted, replica.tp, replica.draft_tp,
                                    ks, traffic, scales, Objective(parsed.bounds, parsed.percentile), headroom,
                                    router, replica.gemm_quant, price, replica.server, on_progress)
    found = FleetSizes(table, replica.head, traffic, replay, parsed, scales, headroom, router, price, price_note,
                       where=replica.planner.system.split("_")[0].upper(), left_out=replica.left_out + unpriced,
                       transferred=replica.transferred, chart=chart)
    return _answered(found, started)


def size_fleet_on_run(run: Path | str | None, *, trace: str, slo: str, trace_window: str = "",
                      scales: Sequence[float] = (1.0,), headroom: float = 0.2, router: str = "least-outstanding",
                      prefix_caching: bool | None = None, gpu_price: float | None = None,
                      chart: Path | str | None = None, extrapolate: bool = False,
                      on_progress: OnProgress | None = None) -> FleetSizes:
    """`plan RUN --trace --slo`: the fleet sized on the step price fitted on a vLLM run
    (fleet.served), one replica one server as that run's were, caching prefixes if `prefix_caching`
    says so (None: as specbench's servers run, not caching). Refused where the trace's prompts (p90)
    run more than 2× past the run's longest (fleet.served.out_of_reach) unless `extrapolate`, which
    holds the price past the run (fleet.served.held_price). The other arguments as size_fleet's."""
    from specbench.api.replicas import check_chart, load_traffic, served_run
    from specbench.fit.slo import parse_slo
    from specbench.fleet.served import beyond_measured, measured_reach, out_of_reach, served_context
    from specbench.fleet.sizing import Objective, size_fleets

    started = time.perf_counter()
    if slo is None:
        raise UsageError("--trace sizes the fleet that meets an SLO: give --slo (e.g. ttft=2,tpot=0.05,p90)")
    check_price(gpu_price, 1)
    scales = list(scales)
    _check_traffic(scales, headroom, router)
    chart = check_chart(chart)
    parsed = parse_slo(slo)

    def within_reach(measured) -> None:
        prompts = load_traffic(trace, trace_window, served_context(measured.meta))[0].prompts
        past = out_of_reach(measured_reach(measured.cells, measured.requests), measured.meta, prompts)
        if past and not extrapolate:
            raise UsageError(f"--trace {trace} on {measured.path}: {past}")

    measured, found, _, head = served_run(run, prefix_caching, extrapolate, within_reach)
    # rows past the servers' context (vLLM refuses them) or past a server's whole KV cache are left out
    limit = min(c.spec.kv_capacity_tokens for c in found)
    traffic, replay = load_traffic(trace, trace_window, min(limit, served_context(measured.meta) or limit))
    table = size_fleets(found, traffic, scales, Objective(parsed.bounds, parsed.percentile), headroom, router,
                        gpu_price, on_progress=on_progress)
    head["beyond_measured"] = beyond_measured(table, measured_reach(measured.cells, measured.requests),
                                              traffic.prompts, traffic.name)
    cache = "" if prefix_caching is None else f" ({'prefix caching on' if prefix_caching else 'no prefix caching'})"
    sized = FleetSizes(table, head, traffic, replay, parsed, scales, headroom, router, gpu_price,
                       "given" if gpu_price is not None else "none (device-hours)",
                       replica=f"{head['target']} servers as measured in {measured.path}{cache}", device="server",
                       chart=chart)
    return _answered(sized, started)


def _check_traffic(scales: list[float], headroom: float, router: str) -> None:
    from specbench.fleet.router import ROUTERS

    if not scales or any(not (math.isfinite(s) and s > 0) for s in scales):
        raise UsageError(f"--trace-speedup must be positive numbers, got {','.join(f'{s:g}' for s in scales)}")
    if not (math.isfinite(headroom) and 0 <= headroom <= 10):
        raise UsageError(f"--headroom must be a share of extra traffic in [0, 10] (0.2: 1.2×), got {headroom:g}")
    if router not in ROUTERS:
        raise UsageError(f"--router must be one of {', '.join(ROUTERS)}, got {router!r}")


def _answered(sized: FleetSizes, started: float) -> FleetSizes:
    """The fleet with its sentences per TP × scale, the fewest GPUs per scale, and its chart drawn."""
    from specbench.api.replicas import replay_evidence, server_note
    from specbench.fleet.plan import answer, fewest_gpus, replicas_chart

    caveat = ", EXTRAPOLATED past the batches or prompts its run measured" if sized.head.get("beyond_measured") else ""
    if sized.router == "prefix-aware" and sized.traffic.prefixes is not None:
        # measured on two vLLM CPU servers: its routing and cache hits as simulated, the tail of the
        # herding it does on prompts new to every server only at the pace those servers ran, and
        # at the calibration's in one sitting of two (docs/fleet.md)
        caveat += ", the prefix-aware router's tail likely worse"
    evidence = replay_evidence(sized.head, sized.device)
    sized.answers = [answer(group, sized.traffic.name, sized.head["target"], sized.where, sized.slo.describe(),
                            sized.headroom, sized.replica, caveat, evidence)
                     for _, group in sized.table.groupby(["tp", "scale"], sort=False)]
    sized.answers += [text for text in (fewest_gpus(sized.table, scale) for scale in sorted(set(sized.scales)))
                      if text]
    if sized.chart is not None:
        title = f"SIMULATED: {sized.head['target']}{server_note(sized.head)}" \
                + (f" on {sized.where}" if sized.where else "")
        replicas_chart(sized.table, sized.chart, title + f", {sized.traffic.name}; {sized.slo.describe()} at "
                                                         f"{1 + sized.headroom:g}× the traffic; {sized.router} router")
    sized.seconds = time.perf_counter() - started
    return sized
