"""Served traffic simulated on the kernel tables (issue 40): a target at each TP size, without
speculation and with each drafter × K at each acceptance (`configurations`), either

- as one vLLM-like replica serving C closed-loop clients (`closed_loop_table`; `Clients` says how
  they send: a steady state, or as InferenceMAX's benchmark, which took NVIDIA's measured rows, so
  the same simulator is checked against them: specbench/data/validation.json's "silicon"), or
- as a fleet of replicas behind a router serving a trace at one or more speeds, sized to the
  fewest replicas that meet an SLO with headroom (`traffic_table`, over `sizing.size_fleets`,
  which also sizes a vLLM run's own configurations: `served.served_configurations`).

They are what `specbench plan --target … --concurrency …` and `… --trace … --slo …` print, as
DataFrames a notebook can use."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specbench import measured
from specbench.fit import kernel_tables
from specbench.fit.prices import cost_per_million
from specbench.fit.table_plan import Acceptance, Drafter, TablePlanner
from specbench.fleet.replica import Outcome, ReplicaSpec, Speculation, blocks_for, simulate
from specbench.fleet.sizing import (BURST_LIFETIMES, COMMON_SEED, MOST_REPLICAS, Configuration, Objective, Progress,
                                    Traffic, progress_counter, size_fleets, slo_verdict)
from specbench.fleet.tables import ServerFlags, replica_spec, step_cost
from specbench.fleet.workers import in_processes
from specbench.schema import AR, LARGE_BATCH
from specbench.step_model import StepModel, StepShape, as_step_model

REQUESTS_PER_CLIENT = 12  # each client's first and last request are left out (warm-up, drain)


@dataclass(frozen=True)
class Clients:
    """How C closed-loop clients send their requests and which of them are measured. A closed
    loop's TTFT depends on it more than on the GPU: clients started together stay in waves whose
    prefills queue behind each other; clients started apart do not."""

    name: str
    together: bool  # all C first requests at once (a benchmark's burst), else a C-th of a lifetime apart
    requests_per_client: int
    shortest_share: float  # each request's lengths uniform in [share·L, L] (1.0: every request L)
    measure_all: bool  # the means over every request (a benchmark's report), else the steady state's
    seed: int = 0

    def lengths(self, count: int, isl: int, osl: int) -> tuple[np.ndarray, np.ndarray]:
        if self.shortest_share >= 1.0:
            return np.full(count, isl), np.full(count, osl)
        rng = np.random.default_rng(self.seed)  # as benchmark_serving's random dataset: randint(int(r·L), L + 1)
        return (rng.integers(int(isl * self.shortest_share), isl + 1, count),
                rng.integers(max(1, int(osl * self.shortest_share)), osl + 1, count))


# A benchmark's burst does not reach the engine at one instant: its client sends one request at a
# time (specbench's own 0.11-0.16 ms apart: measured.json's finding client_send_spacing), the API
# server takes them in one after another (0.77 ms a request before it stamps one's arrival, a burst
# of 1-32 on vLLM 0.32: measured.json's burst_spacing_s, which says where; a test holds this to it),
# and the idle engine starts its first step on the first to arrive, the others queued behind that
# step. At the clients' next requests the cohorts that first step made persist (fixed lengths end
# together).
BURST_SPACING_S = measured.value("burst_spacing_s")

# a steady state: what one replica serves once the benchmark's start is forgotten
STEADY = Clients("steady", together=False, requests_per_client=REQUESTS_PER_CLIENT, shortest_share=1.0,
                 measure_all=False)
# InferenceMAX's client (SemiAnalysis; the setup of NVIDIA's measured Llama-3.1-70B vLLM rows: the
# same length pairs and concurrencies): benchmark_serving.py --dataset-name random
# --random-range-ratio 0.8 --num-prompts 10·C --max-concurrency C --request-rate inf --ignore-eos,
# every request in its means
INFERENCEMAX = Clients("inferencemax", together=True, requests_per_client=10, shortest_share=0.8, measure_all=True)
# `vllm bench serve --max-concurrency C` on fixed-length prompts (its random dataset's default range
# ratio, 0) and specbench's own sweep cells at batch size C (`sweep --num-prompts 10·C`): all at once,
# every request the given lengths, every one in the medians
BENCH = Clients("bench", together=True, requests_per_client=10, shortest_share=1.0, measure_all=True)
CLIENTS = {clients.name: clients for clients in (STEADY, INFERENCEMAX, BENCH)}


def closed_loop(cost: StepModel, spec: ReplicaSpec, concurrency: int, isl: int, osl: int,
                speculation: Speculation | None = None, clients: Clients = STEADY,
                prefix_len: int = 0) -> tuple[Outcome, np.ndarray]:
    """C `clients` (together: their first requests BURST_SPACING_S apart), each sending its next
    request 1 ms after its last one's final token; every prompt's first `prefix_len` tokens the same
    (a system prompt: with the replica's prefix caching, found cached after the first). Returns the
    outcome and the mask of requests measured (STEADY leaves out each client's first, and the drain
    at the end)."""
    count = concurrency * clients.requests_per_client
    prompts, outputs = clients.lengths(count, isl, osl)
    shared = tuple(("system prompt", unit) for unit in range(prefix_len // spec.prefix_unit_tokens))
    if clients.together:
        starts = np.arange(concurrency) * BURST_SPACING_S
    else:
        model = as_step_model(cost)
        cycle = model.seconds(StepShape(min(isl, spec.max_num_batched_tokens), 0)) \
            + osl * model.seconds(StepShape(0, concurrency))
        starts = np.arange(concurrency) * cycle / concurrency
    out = simulate(prompts, outputs, cost, spec, concurrency=concurrency, client_starts_s=starts,
                   client_turnaround_s=1e-3, speculation=speculation, prefixes=[shared] * count if shared else None)
    keep = np.ones(count, bool)
    if not clients.measure_all:
        keep[:concurrency] = False
        keep[np.argsort(out.finish_s)[-concurrency:]] = False
    return out, keep


def _span_s(out: Outcome, keep: np.ndarray) -> float:
    """From the first measured request's arrival to the last one's finish."""
    return float(out.finish_s[keep].max() - out.arrival_s[keep].min()) if keep.any() else float("nan")


def _row(out: Outcome, keep: np.ndarray, gpus: int) -> dict:
    ttft, tpot, e2e = out.ttft_s[keep] * 1e3, out.tpot_s[keep] * 1e3, out.e2e_s[keep] * 1e3
    span = _span_s(out, keep)
    tokens = float(out.output_tokens[keep].sum())
    return {**{f"ttft_p{p}_ms": float(np.percentile(ttft, p)) for p in (50, 90, 99)},
            **{f"tpot_p{p}_ms": float(np.nanpercentile(tpot, p)) for p in (50, 90, 99)},
            **{f"e2e_p{p}_ms": float(np.percentile(e2e, p)) for p in (50, 90, 99)},
            **{f"itl_p{p}_ms": out.itl_percentile(p) * 1e3 for p in (50, 90, 99)},
            **{f"itl_chunk_p{p}_ms": out.itl_chunk_percentile(p) * 1e3 for p in (50, 90, 99)},
            "ttft_mean_ms": float(np.mean(ttft)), "tpot_mean_ms": float(np.nanmean(tpot)),
            "tokens_per_s": tokens / span, "tokens_per_s_per_gpu": tokens / span / gpus,
            "share_at_large_batch": out.share_at_least(LARGE_BATCH), "mean_running_batch": out.mean_running(),
            "preemptions": out.preemptions, "prefix_hit_share": out.prefix_hit_share()}


def requests_cached(spec: ReplicaSpec, isl: int, osl: int) -> int:
    """How many requests of `isl` + `osl` tokens the replica's KV cache holds at once."""
    return spec.kv_blocks // blocks_for(isl + osl, spec.block_size)


def configurations(planner: TablePlanner, drafters: list[Drafter], accepted: list[Acceptance], tp: int,
                   draft_tp: int | None, ks: list[int], isl: int, osl: int,
                   gemm_quant: str | None = None, schedules: bool = False,
                   server: ServerFlags = ServerFlags()) -> list[Configuration]:
    """The baseline, then each drafter × acceptance × K the tables price, at `tp`; steps
    priced for requests of `isl` tokens in and `osl` out, each replica a vLLM server with `server`'s
    flags (its KV cache at `--kv-cache-dtype`, a draft model's too, as vLLM's). `schedules`: each
    drafter × acceptance's K schedule too (`_scheduled`)."""
    kv_cache_dtype = server.kv_cache_dtype
    if (planner.gemm_quant, planner.kv_cache_dtype) != (gemm_quant, kv_cache_dtype):  # the K schedules' too
        planner = dataclasses.replace(planner, gemm_quant=gemm_quant, kv_cache_dtype=kv_cache_dtype)
    target = planner.forward(planner.target, tp)  # its KV cache, and a draft model's, at the planner's
    spec = server.applied(replica_spec(planner.target, planner.system, tp, gemm_quant, kv_cache_dtype=kv_cache_dtype))
    priced = {"host": planner.host, "launch": planner.launch, "cudagraph_mode": server.cudagraph_mode,
              "speculation_host": planner.speculation_host, "executor": planner.executor}
    found = [Configuration(tp, AR, 0, "", step_cost(target, isl, osl, async_scheduling=spec.async_scheduling, **priced),
                           spec, None)]
    for acceptance in accepted:
        drafter = next((d for d in drafters if d.name == acceptance.draft), None)
        if drafter is None:
            continue
        kind = drafter.draft_kind
        if kind.in_target_forward:  # MTP: the target compiled with its K layers, each K a forward of its own
            mtp_spec = server.applied(replica_spec(planner.target, planner.system, tp, gemm_quant,
                                                   kv_cache_dtype=kv_cache_dtype, draft_kind=drafter.kind,
                                                   draft_layers=drafter.layers))
            for k in kind.ks(ks, drafter.layers):
                cost = step_cost(planner.forward(planner.target, tp, k), isl, osl,
                                 async_scheduling=mtp_spec.async_scheduling, draft_kind=drafter.kind, **priced)
                found.append(Configuration(tp, drafter.name, k, acceptance.key, cost, mtp_spec,
                                           Speculation(k, acceptance.reach_at(k), seed=COMMON_SEED)))
            continue
        size = tp if draft_tp is None else draft_tp
        draft = planner.draft_forward(drafter, size) if drafter.config else None
        with_draft = server.applied(replica_spec(planner.target, planner.system, tp, gemm_quant, drafter.config,
                                                 size, kv_cache_dtype, draft_gemm_quant=planner.draft_gemm_quant
                                                 if kind.takes_draft_dtype else None, draft_kind=drafter.kind),
                                    kind.host_drafting) \
            if drafter.config else server.applied(spec, kind.host_drafting)
        cost = step_cost(target, isl, osl, draft, async_scheduling=with_draft.async_scheduling,
                         draft_kind=drafter.kind, **priced)
        found += [Configuration(tp, drafter.name, k, acceptance.key, cost, with_draft,
                                Speculation(k, acceptance.reach_at(k), seed=COMMON_SEED)) for k in ks]
        if schedules:
            found += _scheduled(planner, drafter, acceptance, tp, draft_tp, ks, isl, osl, cost, with_draft)
    return found


SCHEDULE_BATCHES = [1, 2, 4, 8, 16, 32, 64, 128, 256, 512]


def _scheduled(planner: TablePlanner, drafter: Drafter, acceptance: Acceptance, tp: int, draft_tp: int | None,
               ks: list[int], isl: int, osl: int, cost: StepModel, spec: ReplicaSpec) -> list[Configuration]:
    """The K schedule `plan --target` picks for this drafter and acceptance (the best of `ks` by
    running batch on the tables' static batches at the traffic's mean lengths, off where no K
    speeds up; the target's GEMMs and the KV cache as `planner`'s), as one more configuration, where
    it is not one K everywhere."""
    from specbench.fit.decisions import format_schedule, schedule_ranges
    from specbench.fit.table_plan import best_k, plan_on_tables

    try:
        table, _ = plan_on_tables(planner, [drafter], [acceptance], ks, SCHEDULE_BATCHES, [isl], [tp], osl, None,
                                  draft_tp)
    except (kernel_tables.TablesUnavailable, ValueError):
        return []
    best = best_k(table[table["fits"]]) if "fits" in table else pd.DataFrame()
    if best.empty:
        return []
    ranges = schedule_ranges(best["batch_size"].tolist(),
                             [int(k) if s >= 1 else None for k, s in zip(best["k"], best["highest_speedup"])])
    if len(ranges) == 1 and ranges[0][2]:  # one K at every batch: that K's configuration already
        return []
    if not any(k for _, _, k in ranges):  # off at every batch: the baseline with a draft loaded, not speculation
        return []
    deepest = max(k for _, _, k in ranges)
    speculation = Speculation(0, acceptance.reach_at(max(deepest, 1)), tuple((first, k) for first, _, k in ranges),
                              seed=COMMON_SEED)
    return [Configuration(tp, drafter.name, deepest, acceptance.key, cost, spec, speculation,
                          schedule=format_schedule(ranges))]


def closed_loop_table(planner: TablePlanner, drafters: list[Drafter], accepted: list[Acceptance], tps: list[int],
                      draft_tp: int | None, ks: list[int], concurrencies: list[int], isl: int, osl: int,
                      gemm_quant: str | None = None, clients: Clients = STEADY,
                      server: ServerFlags = ServerFlags(), price_per_gpu_hour: float | None = None,
                      objective: Objective | None = None, prefix_len: int = 0,
                      on_progress: Progress | None = None) -> pd.DataFrame:
    """One row per TP × concurrency × configuration (the baseline; each drafter × K × acceptance,
    and each drafter's K schedule where it is not one K everywhere; `k_schedule` names it):
    TTFT, TPOT and E2E percentiles (and TTFT's and TPOT's means, as a benchmark reports them),
    tokens/s per GPU, the share of time at B >= 32 and the mean running batch, how many requests
    the KV cache holds, TPOT's and tokens/s's speed-ups over the baseline, and GPU-hours (and $ at
    `price_per_gpu_hour`) per 1M output tokens, the clients sending as `clients` says; with an
    `objective`, the share of requests meeting it, the goodput (requests/s meeting it) and whether
    its percentiles hold; every prompt opening with the same `prefix_len` tokens. `on_progress` is
    told of each simulation as it finishes."""
    found = [configurations(planner, drafters, accepted, tp, draft_tp, ks, isl, osl, gemm_quant, schedules=True,
                            server=server) for tp in tps]
    total, rows = sum(len(mine) for mine in found) * len(concurrencies), []
    for mine in found:  # each TP's counted on from the last's
        rows += closed_loop_rows(mine, concurrencies, isl, osl, clients, price_per_gpu_hour, objective, prefix_len,
                                 _counted_from(on_progress, len(rows), total))
    return pd.DataFrame(rows)


def _counted_from(on_progress: Progress | None, before: int, total: int) -> Progress | None:
    """`on_progress` for a part of `total` simulations that starts after `before` of them."""
    if on_progress is None:
        return None

    def told(done: int, _: int, label: str) -> None:
        if done or not before:  # (the 0 done of a later part is not news)
            on_progress(before + done, total, label)

    return told


def closed_loop_rows(found: list[Configuration], concurrencies: list[int], isl: int, osl: int,
                     clients: Clients = STEADY, price_per_gpu_hour: float | None = None,
                     objective: Objective | None = None, prefix_len: int = 0,
                     on_progress: Progress | None = None) -> list[dict]:
    """`closed_loop_table`'s rows for configurations `found` (the baseline first), at each
    concurrency: on the kernel tables one TP's, or the steps fitted on a served run
    (`fleet.served.served_configurations`, a replica one server: "GPU" reads "server" there);
    `on_progress` told of each simulation as it finishes."""
    asked = [(concurrency, configuration) for concurrency in concurrencies for configuration in found]

    def simulated(pair: tuple[int, Configuration]) -> tuple[Outcome, np.ndarray]:
        concurrency, configuration = pair
        return closed_loop(configuration.cost, configuration.spec, concurrency, isl, osl, configuration.speculation,
                           clients, prefix_len)

    def said(index: int, result: tuple[Outcome, np.ndarray]) -> str:
        concurrency, configuration = asked[index]
        out, keep = result
        tpot = np.asarray(out.tpot_s)[keep]
        return (f"TP{configuration.tp} {concurrency} clients, {configuration.label}: p50 TPOT "
                f"{np.nanmedian(tpot) * 1e3 if np.isfinite(tpot).any() else math.nan:.1f} ms")

    # side by side, a worker process a core
    outcomes = iter(in_processes(simulated, asked, on_done=progress_counter(on_progress, len(asked), said)))
    rows = []
    for concurrency in concurrencies:
        base = None
        for configuration in found:
            out, keep = next(outcomes)
            row = _row(out, keep, configuration.tp)
            if objective is not None:
                good_share, meets = slo_verdict(out, objective, keep)
                row |= {"good_share": good_share, "meets_slo": meets,
                        "goodput_rps": good_share * keep.sum() / _span_s(out, keep)}
            base = base or row
            rows.append({"tp": configuration.tp, "concurrency": concurrency, "draft": configuration.draft,
                         "k": configuration.k, "k_schedule": configuration.schedule,
                         "acceptance": configuration.acceptance, **row,
                         "kv_cache_requests": requests_cached(configuration.spec, isl, osl),
                         "max_num_seqs": configuration.spec.max_num_seqs,
                         "tpot_speedup": base["tpot_p50_ms"] / row["tpot_p50_ms"],
                         "throughput_speedup": row["tokens_per_s_per_gpu"] / base["tokens_per_s_per_gpu"],
                         "gpu_hours_per_million_tokens": float(cost_per_million(row["tokens_per_s_per_gpu"], None)),
                         "dollars_per_million_tokens": float(cost_per_million(row["tokens_per_s_per_gpu"],
                                                                              price_per_gpu_hour))
                         if price_per_gpu_hour is not None else math.nan})
    return rows


def loop_label(tp: int, concurrency: int, device: str = "GPU") -> str:
    """"TP4, 16 clients" (on the kernel tables) or "1 client" (a served run's one server): what one
    TP × concurrency of a closed loop is called, in its table's title and its sentence alike."""
    return (f"TP{tp}, " if device == "GPU" else "") + f"{concurrency} client{'s' if concurrency != 1 else ''}"


def row_label(row, acceptance: bool = True) -> str:
    """"1b K=3 (α 0.7)", "8b K schedule {1-32: 3, 33+: 1}": one row's configuration."""
    if row["draft"] == AR:
        return AR
    k = f"K schedule {row['k_schedule']}" if row.get("k_schedule") else f"K={int(row['k'])}"
    return f"{row['draft']} {k}" + (f" ({row['acceptance']})" if acceptance and row["acceptance"] else "")


def _configurations(rows: pd.DataFrame, acceptances: bool, drafts: bool = True) -> str:
    """"autoregressive, 1b K=2,3, 8b K=3 (α 0.7)": the configurations in `rows`, by drafter and
    acceptance (`acceptances`: named; `drafts`: False leaves the drafters' names out)."""
    names = []
    schedule = rows["k_schedule"] if "k_schedule" in rows else pd.Series("", index=rows.index)
    for (draft, acceptance), group in rows.groupby(["draft", "acceptance"], sort=False):
        if draft == AR:
            names.append(AR)
            continue
        fixed = group[schedule[group.index] == ""]
        ks = ",".join(str(int(k)) for k in sorted(fixed["k"].unique()))
        labels = ([f"K={ks}"] if ks else []) + [f"K schedule {s}" for s in schedule[group.index] if s]
        names.append((f"{draft} " if drafts else "") + " and ".join(labels)
                     + (f" ({acceptance})" if acceptances else ""))
    return ", ".join(names)


# simulated throughputs within 1 % of each other are a tie: no step price is known that well
SERVES_TIE = 0.01


def _rate(tokens_per_s: float) -> str:
    """Tokens/s to the unit above 100, to three digits below (a CPU server's 1.00, not 1)."""
    return f"{tokens_per_s:.0f}" if tokens_per_s >= 100 else f"{tokens_per_s:#.3g}"


def closed_loop_answer(rows: pd.DataFrame, slo: str = "", device: str = "GPU",
                       evidence: Callable[[float], str] | None = None) -> str:
    """One sentence for one TP × concurrency of `closed_loop_table`: the speculative configuration
    that serves the most tokens/s per GPU against the baseline, and, where speculation runs fewer
    requests at once than the baseline (a draft's weights and KV cache leave less room), that its
    lower TPOT is partly a smaller batch's, paid for in queueing; with an objective (`slo` its
    words), which configurations meet it and which of those serves the most. Every figure simulated.
    `device`: what one replica's devices are called (a served run's replica is one "server");
    `evidence`: what the checks say of a predicted change of tokens/s that size ("" where nothing)."""
    base = rows[rows["draft"] == AR].iloc[0]
    where = loop_label(int(base["tp"]), int(base["concurrency"]), device)
    speculative = rows[rows["draft"] != AR]
    several = speculative["acceptance"].nunique() > 1  # name each configuration's acceptance
    met = ""
    if "meets_slo" in rows:
        meeting = rows[rows["meets_slo"].astype(bool)]
        if meeting.empty:
            met = f"At {slo}: no configuration meets it"
        else:
            most = meeting.sort_values("tokens_per_s_per_gpu", ascending=False).iloc[0]
            met = (f"At {slo}: met by {_configurations(meeting, several)}"
                   + ("" if len(meeting) == 1 else
                      f"; of those {_configurations(most.to_frame().T, several)} serves the most "
                      f"({most['tokens_per_s_per_gpu']:.0f} tokens/s per {device})"))
    if speculative.empty:
        return f"{where}: {met[0].lower()}{met[1:]} (SIMULATED)" if met else ""

    best = speculative.sort_values("tokens_per_s_per_gpu", ascending=False).iloc[0]
    price = best.get("dollars_per_million_tokens", math.nan)
    dollars = (f"; ${price:.2f} against ${base['dollars_per_million_tokens']:.2f} per 1M tokens"
               if math.isfinite(price) else "")
    figures = (f"{_rate(best['tokens_per_s_per_gpu'])} against {_rate(base['tokens_per_s_per_gpu'])} tokens/s "
               f"per {device} "
               f"({best['throughput_speedup']:.2f}×{dollars}), TPOT p50 {best['tpot_p50_ms']:.1f} against "
               f"{base['tpot_p50_ms']:.1f} ms, TTFT p50 {best['ttft_p50_ms'] / 1e3:.2f} against "
               f"{base['ttft_p50_ms'] / 1e3:.2f} s")
    told = evidence(best["throughput_speedup"] - 1) if evidence is not None else ""
    figures += f" ({told})" if told else ""
    if best["throughput_speedup"] >= 1 + SERVES_TIE:
        text = f"{where}: speculation serves the most with {row_label(best, several)}: {figures}"
    elif best["throughput_speedup"] > 1 - SERVES_TIE:
        text = (f"{where}: speculation serves as much as autoregressive (within {SERVES_TIE:.0%}), at best "
                f"{row_label(best, several)}: {figures}")
    else:
        text = (f"{where}: no speculation serves more than autoregressive; the closest, {row_label(best, several)}: "
                f"{figures}")
    # a closed loop's TPOT falls when fewer requests run: speculation whose batch is smaller than the
    # baseline's buys part of its TPOT with waiting, which tokens/s and TTFT show and TPOT hides
    smaller = speculative[speculative["mean_running_batch"] < 0.9 * base["mean_running_batch"]]
    if not smaller.empty and int(base["concurrency"]) > 1:  # a lone client leaves no one waiting
        def cache_note(held: int) -> str:  # the KV cache, where it holds fewer requests than the clients
            return f", its KV cache holding {held}" if held < int(base["concurrency"]) else ""

        digits = 1 if base["mean_running_batch"] < 10 else 0  # a few requests: tenths tell them apart

        def batch(low: float, high: float) -> str:
            return f"{low:.{digits}f}" if f"{low:.{digits}f}" == f"{high:.{digits}f}" else \
                f"{low:.{digits}f}–{high:.{digits}f}"

        drafts = []
        for draft, group in smaller.groupby("draft", sort=False):
            drafts.append(f"{draft} {batch(group['mean_running_batch'].min(), group['mean_running_batch'].max())}"
                          f"{cache_note(int(group['kv_cache_requests'].min()))}")
        text += (f". Fewer requests run at once with speculation (on average {'; '.join(drafts)}; autoregressive "
                 f"{batch(base['mean_running_batch'], base['mean_running_batch'])}"
                 f"{cache_note(int(base['kv_cache_requests']))}): their lower TPOT is partly a smaller batch's, the "
                 "other clients waiting (TTFT)")
    return text + (f". {met}" if met else "") + " (SIMULATED)"


def closed_loop_capacity(table: pd.DataFrame, slo: str, device: str = "GPU") -> list[str]:
    """Per TP: the most clients of those simulated at which each drafter (at its best K) and the
    baseline still meet the objective. One sentence each, labelled SIMULATED (`device` as
    `closed_loop_answer`'s)."""
    if "meets_slo" not in table:
        return []
    found = []
    for tp, rows in table.groupby("tp", sort=False):
        asked = ", ".join(str(c) for c in sorted(rows["concurrency"].unique()))
        parts = []
        for draft, group in rows.groupby("draft", sort=False):
            meeting = group[group["meets_slo"].astype(bool)]
            if meeting.empty:
                parts.append(f"{draft} none")
                continue
            most = int(meeting["concurrency"].max())
            there = meeting[meeting["concurrency"] == most]
            which = _configurations(there, there["acceptance"].nunique() > 1, drafts=False)
            parts.append(f"{draft} {most}" + ("" if draft == AR else f" ({which})"))
        who = f"TP{int(tp)}, the most clients one replica serves" if device == "GPU" else \
            f"The most clients one {device} serves"
        found.append(f"{who} at {slo}, of {asked}: {'; '.join(parts)} (SIMULATED)")
    return found


def traffic_table(planner: TablePlanner, drafters: list[Drafter], accepted: list[Acceptance], tps: list[int],
                  draft_tp: int | None, ks: list[int], traffic: Traffic, scales: list[float], objective: Objective,
                  headroom: float, router: str, gemm_quant: str | None = None,
                  price_per_gpu_hour: float | None = None,
                  server: ServerFlags = ServerFlags(),
                  on_progress: Progress | None = None) -> pd.DataFrame:
    """`size_fleets` for every configuration of `traffic_configurations`; `on_progress` told of
    each configuration as it is sized."""
    found = traffic_configurations(planner, drafters, accepted, tps, draft_tp, ks, traffic, gemm_quant, server)
    return size_fleets(found, traffic, scales, objective, headroom, router, price_per_gpu_hour,
                       on_progress=on_progress)


def traffic_configurations(planner: TablePlanner, drafters: list[Drafter], accepted: list[Acceptance],
                           tps: list[int], draft_tp: int | None, ks: list[int], traffic: Traffic,
                           gemm_quant: str | None = None, server: ServerFlags = ServerFlags()) -> list[Configuration]:
    """Every configuration the kernel tables price at each TP (and each drafter's K schedule),
    requests priced at the traffic's mean lengths."""
    isl, osl = int(round(traffic.prompts.mean())), int(round(traffic.outputs.mean()))
    return [c for tp in tps for c in configurations(planner, drafters, accepted, tp, draft_tp, ks, isl, osl,
                                                    gemm_quant, schedules=True, server=server)]


def answer(rows: pd.DataFrame, traffic: str, target: str, where: str, slo: str, headroom: float,
           replica: str = "", caveat: str = "", evidence: Callable[[float], str] | None = None) -> str:
    """One sentence for one TP × scale of `traffic_table`: the replicas needed without speculation
    and with the configuration that needs fewest (then costs least, then has the lowest p50 TPOT),
    and the dollars between them. Every figure simulated; `caveat` follows SIMULATED in its label;
    `evidence`: what the checks say of a change of the replica count that size ("" where nothing)."""
    base = rows[rows["draft"] == AR].iloc[0]
    tp, scale = int(base["tp"]), float(base["scale"])

    def missed(row) -> str:
        """What a request `row`'s configuration serves alone misses the SLO by (": p90 TTFT …"), or ""."""
        return f": {row['alone_misses']}" if row.get("alone_misses") else ""

    def fleet(row, of: str = "") -> str:
        """How many replicas `row` needs, `of` (what a replica is) said right after "replicas"."""
        if not row["replicas"] == row["replicas"]:
            if not row.get("reachable", True):
                return f"no number of replicas{of} (a request served alone misses the SLO{missed(row)})"
            if row.get("idle_at", math.nan) == row.get("idle_at", math.nan):
                return (f"no number of replicas{of} behind this router (of {int(row['idle_at'])} it used "
                        f"{int(row['used_at'])}: a prefix every prompt opens with, cached on those, outscores "
                        "the others' idle KV caches)")
            return f"more than {MOST_REPLICAS} replicas{of}"
        count = int(row["replicas"])
        return f"{count} replica{'s' if count != 1 else ''}{of}"

    of = " of " + (replica or f"{target} TP{tp} on {where}")
    at = f"{traffic} at {scale:g}× ({base['request_rate']:.2f} req/s)"
    head = f"{at} needs {fleet(base, of)} without speculation"
    speculative = rows[(rows["draft"] != AR) & rows["replicas"].notna()]
    tail = f" (SIMULATED{caveat}; {slo}, met at {1 + headroom:g}× the traffic)"
    if "burst" in rows and rows["burst"].any():  # (rows sized by size_fleets carry it)
        tail += (f"; a BURST, not a rate: at {scale:g}× the traffic lasts {base['span_s']:.3g} s, under "
                 f"{BURST_LIFETIMES} times its requests' p50 E2E or the SLO's bound, so the replicas' queues absorb "
                 f"it whole (a longer --trace-window or a smaller --trace-speedup sizes a sustained rate)")
    if speculative.empty:
        others = rows[rows["draft"] != AR]
        unreachable = not others.get("reachable", pd.Series([True])).any()
        if not base.get("reachable", True) and (others.empty or unreachable):  # one clause: "no number … meets"
            which = "without speculation" if others.empty else "with speculation or without"
            return (f"{at}: no number of replicas{of} meets the SLO {which} (a request served alone misses "
                    f"it{missed(base)}) (SIMULATED{caveat}; {slo})")
        if others.empty:
            return head + tail
        if not unreachable and others.get("idle_at", pd.Series([math.nan])).notna().any():
            return head + f" and {fleet(others[others['idle_at'].notna()].iloc[0])} with speculation" + tail
        return head + (" nor with any speculation" if unreachable
                       else f" and more than {MOST_REPLICAS} with every speculation") + tail
    best = speculative.sort_values(["replicas", "dollars_per_month", "tpot_p50_ms"]).iloc[0]
    if not base["replicas"] == base["replicas"]:
        return head + f" and {fleet(best)} with {best['configuration']}" + tail
    saved = int(base["replicas"]) - int(best["replicas"])
    money = base["dollars_per_month"] - best["dollars_per_month"]
    dollars = f": ${abs(money):,.0f} a month {'less' if money > 0 else 'more'}" if money == money and money else ""
    told = evidence(int(best["replicas"]) / int(base["replicas"]) - 1) if evidence is not None and saved else ""
    dollars += f" ({told})" if told else ""
    if saved > 0:
        middle = f" and {fleet(best)} with {best['configuration']}{dollars}"
    elif saved == 0:
        middle = (f"; speculation saves no replica ({best['configuration']} needs as many; p50 TPOT "
                  f"{base['tpot_p50_ms']:.0f} → {best['tpot_p50_ms']:.0f} ms)")
    else:
        middle = f"; every speculation needs more: {fleet(best)} with {best['configuration']}{dollars}"
    return head + middle + tail


def fewest_gpus(table: pd.DataFrame, scale: float) -> str:
    """Across TP sizes at one traffic scale: the fewest GPUs without speculation and with it (the
    sentence a plan over several TPs adds)."""
    rows = table[(table["scale"] == scale) & table["gpus"].notna()]
    if rows.empty or rows["tp"].nunique() < 2:
        return ""

    def least(frame: pd.DataFrame) -> str:
        if frame.empty:
            return "none meets it"
        best = frame.sort_values(["gpus", "dollars_per_month", "tpot_p50_ms"]).iloc[0]
        return f"{int(best['gpus'])} GPUs (TP{int(best['tp'])} × {int(best['replicas'])}" + \
            ("" if best["draft"] == AR else f", {best['configuration']}") + ")"

    base, speculative = rows[rows["draft"] == AR], rows[rows["draft"] != AR]
    text = f"at {scale:g}×, of every TP: the fewest GPUs without speculation are {least(base)}"
    return text + (f", with it {least(speculative)}" if (table["draft"] != AR).any() else "") + " (SIMULATED)"




def _saved(fig, path, title: str) -> None:
    """`fig` under its wrapped title, written to `path` and closed."""
    import matplotlib.pyplot as plt

    _wrapped_title(fig, title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _wrapped_title(fig, title: str) -> None:
    """`title` above the figure in lines as wide as the figure holds (9 pt: about 13 characters an inch)."""
    import textwrap

    fig.suptitle("\n".join(textwrap.wrap(title, int(fig.get_figwidth() * 13))), fontsize=9)


def closed_loop_chart(table: pd.DataFrame, path, title: str, device: str = "GPU") -> None:
    """Against the clients: tokens/s per GPU (top; per `device`) and TPOT p50 (bottom), one line per
    configuration, one column per TP: where each configuration's throughput stops growing."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    tps = sorted(table["tp"].unique())
    fig, axes = plt.subplots(2, len(tps), figsize=(max(6.4, 5.2 * len(tps)), 7.0), squeeze=False, sharex="col")
    labels = table.apply(row_label, axis=1)
    for column, tp in enumerate(tps):
        rows = table[table["tp"] == tp]
        for n, (label, group) in enumerate(rows.groupby(labels[rows.index], sort=False)):
            group = group.sort_values("concurrency")
            baseline = (group["draft"] == AR).all()
            # equal values overlap: each later line drawn thinner, with smaller markers, over the earlier
            style = {"marker": "o", "markersize": max(3.0, 9.0 - 1.2 * n), "linewidth": max(1.0, 3.0 - 0.4 * n),
                     "alpha": 0.85, "label": label}
            style |= {"color": "black", "linestyle": "--"} if baseline else {}
            axes[0][column].plot(group["concurrency"], group["tokens_per_s_per_gpu"], **style)
            axes[1][column].plot(group["concurrency"], group["tpot_p50_ms"], **style)
        clients = sorted(int(c) for c in rows["concurrency"].unique())
        axes[0][column].set_title(f"TP{tp}" if device == "GPU" else f"one {device}", fontsize=10)
        axes[0][column].set_ylabel(f"output tokens/s per {device} (simulated)")
        axes[1][column].set_ylabel("TPOT p50, ms (simulated)")
        axes[1][column].set_xlabel("closed-loop clients")
        for ax in (axes[0][column], axes[1][column]):
            ax.set_xscale("log", base=2)
            ax.set_xticks(clients, [str(c) for c in clients])
            ax.minorticks_off()
            ax.grid(alpha=0.3)
        axes[0][column].legend(fontsize=7)
    _saved(fig, path, title)


def latency_chart(table: pd.DataFrame, path, title: str) -> None:
    """E2E p50 against traffic scale on a fleet as it is, one line per configuration, one panel per
    TP; a dotted line where each drafter's best configuration stops beating the baseline there."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import matplotlib.ticker

    from specbench.fit.decisions import crossover

    tps = sorted(table["tp"].unique())
    fig, axes = plt.subplots(1, len(tps), figsize=(max(6.4, 5.2 * len(tps)), 4.2), squeeze=False)
    for ax, tp in zip(axes[0], tps):
        rows = table[table["tp"] == tp]
        for n, (label, group) in enumerate(rows.groupby("configuration", sort=False)):
            group = group.sort_values("scale")
            baseline = (group["draft"] == AR).all()
            ax.plot(group["scale"], group["e2e_p50_ms"] / 1e3, marker="o", markersize=max(3.0, 7.0 - n),
                    color="black" if baseline else None, linestyle="--" if baseline else "-", label=label,
                    alpha=0.85)
        for draft, group in rows[rows["draft"] != AR].groupby("draft", sort=False):
            best = group.groupby("scale")["e2e_speedup"].max().sort_index()
            found = crossover(best.index.tolist(), best.tolist())
            if found.batch_size is not None:
                ax.axvline(found.batch_size, linestyle=":", color="grey")
                ax.text(found.batch_size, ax.get_ylim()[1], f" {draft} stops paying ≈ {found.batch_size:.2g}×",
                        fontsize=7, va="top", rotation=90)
        ax.set_xscale("log", base=2)
        ax.xaxis.set_major_formatter(matplotlib.ticker.FuncFormatter(lambda x, _: f"{x:g}×"))
        ax.set_xlabel("traffic scale (× the trace's request rate)")
        ax.set_yscale("log")  # a fleet past its capacity queues: E2E grows by orders of magnitude
        ax.set_ylabel("E2E p50 s (simulated)")
        ax.set_title(f"TP{tp}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _saved(fig, path, title)


def replicas_chart(table: pd.DataFrame, path, title: str) -> None:
    """Replicas needed against traffic scale, one line per configuration, one panel per TP; a scale
    no number of replicas meets (or more than the search tried) marked by a triangle at the top."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.ticker import MaxNLocator

    tps = sorted(table["tp"].unique())
    fig, axes = plt.subplots(1, len(tps), figsize=(max(6.4, 5.2 * len(tps)), 4.2), squeeze=False)
    for ax, tp in zip(axes[0], tps):
        groups = list(table[table["tp"] == tp].groupby("configuration", sort=False))
        most = table.loc[table["tp"] == tp, "replicas"].max()
        top = most * 1.15 + 1 if most == most else 2.0  # from 0 (one point alone would otherwise get a span
        # under one replica, in fractions)
        unmet = False
        for n, (label, group) in enumerate(groups):
            group = group.sort_values("scale")
            baseline = (group["draft"] == AR).all()
            # equal counts overlap: each later line drawn thinner, with smaller markers, over the earlier
            (line,) = ax.plot(group["scale"], group["replicas"], marker="o", markersize=max(3.0, 9.0 - 1.5 * n),
                              linewidth=max(1.0, 3.0 - 0.5 * n), color="black" if baseline else None,
                              linestyle="--" if baseline else "-", label=label, alpha=0.85)
            none = group["replicas"].isna()
            if none.any():
                unmet = True
                ax.plot(group.loc[none, "scale"], [top * (0.97 - 0.03 * n)] * int(none.sum()), marker="^",
                        linestyle="none", markersize=max(4.0, 9.0 - 1.5 * n), color=line.get_color(), alpha=0.85)
        if unmet:
            ax.text(0.01, 0.99, "▲ no number of replicas meets the SLO", transform=ax.transAxes, fontsize=7,
                    va="top", ha="left")
        ax.set_ylim(0, top)
        ax.set_xlabel("traffic scale (× the trace's request rate)")
        ax.set_ylabel("replicas needed (simulated)")
        ax.set_title(f"TP{tp}", fontsize=10)
        ax.yaxis.set_major_locator(MaxNLocator(integer=True))
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _saved(fig, path, title)
