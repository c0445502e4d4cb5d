"""A fleet at a trace and an SLO (specbench.fleet; docs/guides/size-a-fleet.md): the fewest replicas behind a
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

    @property
    def answer(self) -> str:
        """The answer in one sentence: per traffic scale, the fewest GPUs (or servers) that meet the SLO
        without speculation and with it, over every TP."""
        from specbench.api.tables import published_said
        from specbench.schema import AR

        def least(frame) -> str:
            count = 0 if frame.empty else int(frame["gpus"].min())
            return f"{count} {self.device}{'s' if count > 1 else ''}" if count else "no size meets it"

        clauses = []
        for scale, rows in self.table.groupby("scale", sort=True):
            rows = rows[rows["gpus"].notna()]
            base, speculative = rows[rows["draft"] == AR], rows[rows["draft"] != AR]
            clauses.append(f"at {scale:g}× traffic, {least(base)} without speculation"
                           + (f", {least(speculative)} with it" if (self.table["draft"] != AR).any() else ""))
        found = "; ".join(clauses) or f"no configuration meets it at {', '.join(f'{s:g}×' for s in self.scales)}"
        return (f"SIMULATED fleet for {self.traffic.name} at {self.slo.describe()}"
                f"{published_said(self.head.get('alpha_from'))}: {found}.")

    def to_dict(self) -> dict:
        """As `plan --trace ... --json` prints it."""
        import json

        traffic = self.traffic
        return {"answer": self.answer, **self.head, "trace": traffic.name, "requests": len(traffic.prompts),
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
               on_progress: OnProgress | None = None, expert_parallel: bool = False) -> FleetSizes:
    """`plan --target --trace --slo`: serve `trace` (azure-conv, azure-code, mooncake-conv or a file;
    `trace_window` START:DURATION of it) at each of `scales` by vLLM-like replicas on `device`'s
    kernel tables behind `router` (least-outstanding, round-robin, prefix-aware), and find the
    fewest that meet `slo` (ttft=,tpot=,e2e=,pNN) at 1 + `headroom` times the traffic, without
    speculation and with each drafter × K. `chart`: a PNG of replicas against traffic scale. The
    other arguments as api.closed_loop's."""
    from specbench.api.replicas import check_chart
    from specbench.fit.slo import parse_slo
    from specbench.fleet.plan import traffic_table
    from specbench.fleet.sizing import Objective

    started = time.perf_counter()
    chart = check_chart(chart)
    if slo is None:
        raise UsageError("--trace sizes the fleet that meets an SLO: give --slo (e.g. ttft=2,tpot=0.05,p90)")
    ks, scales = list(ks), list(scales)
    replica, traffic, replay, price, price_note = _on_tables(
        target, trace, trace_window, ks, gpu_price, lambda: _check_traffic(scales, headroom, router),
        drafts=drafts, alpha=alpha, acceptance=acceptance, device=device, backend=backend, tp=tp, draft_tp=draft_tp,
        dtype=dtype, draft_dtype=draft_dtype, kv_cache_dtype=kv_cache_dtype, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, async_scheduling=async_scheduling,
        prefix_caching=prefix_caching, expert_parallel=expert_parallel)
    parsed = parse_slo(slo)
    table = traffic_table(replica.planner, replica.drafters, replica.accepted, replica.tp, replica.draft_tp,
                                    ks, traffic, scales, Objective(parsed.bounds, parsed.percentile), headroom,
                                    router, replica.gemm_quant, price, replica.server, on_progress)
    found = FleetSizes(table, replica.head, traffic, replay, parsed, scales, headroom, router, price, price_note,
                       where=replica.planner.system.split("_")[0].upper(), left_out=replica.left_out,
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
    from specbench.api.replicas import check_chart
    from specbench.fit.slo import parse_slo
    from specbench.fleet.served import beyond_measured, measured_reach
    from specbench.fleet.sizing import Objective, size_fleets

    started = time.perf_counter()
    if slo is None:
        raise UsageError("--trace sizes the fleet that meets an SLO: give --slo (e.g. ttft=2,tpot=0.05,p90)")
    check_price(gpu_price, 1)
    scales = list(scales)
    _check_traffic(scales, headroom, router)
    chart = check_chart(chart)
    parsed = parse_slo(slo)

    measured, found, head, traffic, replay = _on_run(run, trace, trace_window, prefix_caching, extrapolate)
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


def _on_tables(target: str, trace: str, trace_window: str, ks: list[int], gpu_price: float | None, check_load,
               **options):
    """A fleet's replica on the kernel tables (api.replicas.tables_replica with `options`), the
    trace's traffic within the target's context, and the GPU's price: (replica, traffic, replay,
    price, its note)."""
    from specbench.api.replicas import load_traffic, tables_replica
    from specbench.fit.prices import tables_gpu_price

    if any(x < 1 for x in ks):
        raise UsageError("--k must be >= 1")
    check_price(gpu_price, 1)
    replica = tables_replica(target, **options, clients="steady", check_load=check_load, fits=None)
    traffic, replay = load_traffic(trace, trace_window, int(replica.target_config.get("max_position_embeddings") or 0))
    price, price_note = tables_gpu_price(replica.planner.system, gpu_price)
    return replica, traffic, replay, price, price_note


def _on_run(run: Path | str | None, trace: str, trace_window: str, prefix_caching: bool | None,
            extrapolate: bool):
    """A vLLM run's servers for a fleet (api.replicas.served_run), refused where the trace's prompts
    (p90) run more than 2× past the run's longest (fleet.served.out_of_reach) unless `extrapolate`;
    and the trace's traffic without the requests past the servers' context (vLLM refuses them) or a
    server's whole KV cache: (the run, its configurations, the head, traffic, replay)."""
    from specbench.api.replicas import load_traffic, served_run
    from specbench.fleet.served import measured_reach, out_of_reach, served_context

    def within_reach(measured) -> None:
        prompts = load_traffic(trace, trace_window, served_context(measured.meta))[0].prompts
        past = out_of_reach(measured_reach(measured.cells, measured.requests), measured.meta, prompts)
        if past and not extrapolate:
            raise UsageError(f"--trace {trace} on {measured.path}: {past}")

    measured, found, _, head = served_run(run, prefix_caching, extrapolate, within_reach)
    limit = min(c.spec.kv_capacity_tokens for c in found)
    traffic, replay = load_traffic(trace, trace_window, min(limit, served_context(measured.meta) or limit))
    return measured, found, head, traffic, replay


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
        # at the calibration's in one sitting of two (docs/guides/size-a-fleet.md)
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


@dataclass
class FleetAsIs(Simulated):
    """SIMULATED, not measured: a given number of replicas, as they are, serving a trace at each
    traffic scale, without speculation and with each configuration. `table` holds one row per TP,
    scale and configuration (fleet.sizing.fleets_as_they_are's columns)."""
    table: Any  # a pandas DataFrame
    head: dict
    traffic: Any
    replay: Any
    slo: Any  # fit.slo's parsed SLO; None: none asked
    scales: list[float]
    replicas: int
    router: str
    price: float | None
    price_note: str
    replica: str = ""

    @property
    def answer(self) -> str:
        """The answer in one sentence: per drafter, up to which traffic scale its best configuration's
        E2E p50 beats the baseline's on these replicas (E2E, not TPOT: a loaded fleet's queue is where
        speculation's longer steps turn into a loss)."""
        from specbench.api.tables import published_said
        from specbench.fit.decisions import speedup_cases, where_it_pays
        from specbench.schema import AR

        speculative = self.table[self.table["draft"] != AR]
        cases = speedup_cases(speculative, ["tp", "acceptance"], "scale", "e2e_speedup")
        found = where_it_pays(cases, at="{}× traffic", near="≈ {}× traffic") or "no speculation simulated"
        noun = f"{self.replicas} {self.device if self.device != 'GPU' else 'replica'}{'s' if self.replicas > 1 else ''}"

        return (f"SIMULATED, {noun} serving {self.traffic.name}{published_said(self.head.get('alpha_from'))}, "
                f"E2E p50: {found}.")

    def to_dict(self) -> dict:
        """As `plan --trace ... --replicas N --json` prints it."""
        import json

        traffic = self.traffic
        return {"answer": self.answer, **self.head, "trace": traffic.name, "requests": len(traffic.prompts),
                "duration_s": traffic.duration_s, "skipped": self.replay.notes(),
                "slo": self.slo.text if self.slo else None, "replicas": self.replicas, "router": self.router,
                "price": self.price_note, "price_per_gpu_hour": self.price, "drafts_left_out": self.left_out,
                "chart": str(self.chart) if self.chart else None, "seconds": round(self.seconds, 3),
                "rows": json.loads(self.table.to_json(orient="records"))}


def fleet_as_is(target: str, *, trace: str, replicas: int, slo: str | None = None, trace_window: str = "",
                scales: Sequence[float] = (1.0,), router: str = "least-outstanding",
                drafts: Sequence[str] = ("1b", "8b"), alpha: str | float | None = None,
                acceptance: Path | str | None = None, device: str = "h100", backend: str = "vllm",
                tp: Sequence[int] = (1,), draft_tp: int | None = None, ks: Sequence[int] = (1, 2, 3, 4, 6, 8),
                dtype: str | None = None, draft_dtype: str | None = None, kv_cache_dtype: str = "auto",
                max_num_seqs: int | None = None, max_num_batched_tokens: int | None = None,
                async_scheduling: bool | None = None, prefix_caching: bool | None = None,
                gpu_price: float | None = None, chart: Path | str | None = None,
                on_progress: OnProgress | None = None, expert_parallel: bool = False) -> FleetAsIs:
    """`plan --target --trace --replicas N`: `replicas` vLLM-like replicas on `device`'s kernel tables,
    as they are (not sized), serving `trace` at each of `scales`, without speculation and with each
    drafter × K: latency percentiles per scale, and where speculation turns from a gain into a loss
    as the traffic rises. `slo`: judged too, where given. The other arguments as size_fleet's."""
    from specbench.api.replicas import check_chart
    from specbench.fleet.plan import traffic_configurations
    from specbench.fleet.sizing import fleets_as_they_are

    started = time.perf_counter()
    chart = check_chart(chart)
    ks, scales = list(ks), list(scales)
    replica, traffic, replay, price, price_note = _on_tables(
        target, trace, trace_window, ks, gpu_price, lambda: _check_fleet(scales, replicas, router),
        drafts=drafts, alpha=alpha, acceptance=acceptance, device=device, backend=backend, tp=tp, draft_tp=draft_tp,
        dtype=dtype, draft_dtype=draft_dtype, kv_cache_dtype=kv_cache_dtype, max_num_seqs=max_num_seqs,
        max_num_batched_tokens=max_num_batched_tokens, async_scheduling=async_scheduling,
        prefix_caching=prefix_caching, expert_parallel=expert_parallel)
    objective, parsed = _objective(slo)
    found = traffic_configurations(replica.planner, replica.drafters, replica.accepted, replica.tp, replica.draft_tp,
                                   ks, traffic, replica.gemm_quant, replica.server)
    table = fleets_as_they_are(found, traffic, scales, replicas, objective, router, price, on_progress=on_progress)
    simulated = FleetAsIs(table, replica.head, traffic, replay, parsed, scales, replicas, router, price, price_note,
                          where=replica.planner.system.split("_")[0].upper(),
                          left_out=replica.left_out,
                          transferred=replica.transferred, chart=chart)
    return _drawn(simulated, started)


def fleet_as_is_on_run(run: Path | str | None, *, trace: str, replicas: int, slo: str | None = None,
                       trace_window: str = "", scales: Sequence[float] = (1.0,), router: str = "least-outstanding",
                       prefix_caching: bool | None = None, gpu_price: float | None = None,
                       chart: Path | str | None = None, extrapolate: bool = False,
                       on_progress: OnProgress | None = None) -> FleetAsIs:
    """`plan RUN --trace --replicas N`: `replicas` servers as a vLLM run measured them (the step price
    fitted on it), serving `trace` at each of `scales`. The other arguments as size_fleet_on_run's."""
    from specbench.api.replicas import check_chart
    from specbench.fleet.served import beyond_measured, measured_reach
    from specbench.fleet.sizing import fleets_as_they_are

    started = time.perf_counter()
    check_price(gpu_price, 1)
    scales = list(scales)
    _check_fleet(scales, replicas, router)
    chart = check_chart(chart)
    objective, parsed = _objective(slo)

    measured, found, head, traffic, replay = _on_run(run, trace, trace_window, prefix_caching, extrapolate)
    table = fleets_as_they_are(found, traffic, scales, replicas, objective, router, gpu_price, on_progress=on_progress)
    head["beyond_measured"] = beyond_measured(table, measured_reach(measured.cells, measured.requests),
                                              traffic.prompts, traffic.name, who="the fleets")
    simulated = FleetAsIs(table, head, traffic, replay, parsed, scales, replicas, router, gpu_price,
                          "given" if gpu_price is not None else "none (device-hours)",
                          replica=f"{head['target']} servers as measured in {measured.path}", device="server",
                          chart=chart)
    return _drawn(simulated, started)


def _check_fleet(scales: list[float], replicas: int, router: str) -> None:
    if not (isinstance(replicas, int) and replicas >= 1):
        raise UsageError(f"--replicas must be a whole number >= 1, got {replicas}")
    _check_traffic(scales, 0.0, router)


def _objective(slo: str | None):
    """The SLO judged (no bounds where none is asked: every request served counts as good)."""
    from specbench.fit.slo import parse_slo
    from specbench.fleet.sizing import Objective

    if slo is None:
        return Objective(()), None
    parsed = parse_slo(slo)
    return Objective(parsed.bounds, parsed.percentile), parsed


def _drawn(simulated: FleetAsIs, started: float) -> FleetAsIs:
    """The fleet with its chart drawn: TPOT p50 against traffic scale, per configuration."""
    from specbench.api.replicas import server_note
    from specbench.fleet.plan import latency_chart

    if simulated.chart is not None:
        title = f"SIMULATED: {simulated.head['target']}{server_note(simulated.head)}" \
                + (f" on {simulated.where}" if simulated.where else "")
        latency_chart(simulated.table, simulated.chart,
                      title + f", {simulated.replicas} replica{'s' if simulated.replicas > 1 else ''}, "
                             f"{simulated.traffic.name}; {simulated.router} router")
    simulated.seconds = time.perf_counter() - started
    return simulated
