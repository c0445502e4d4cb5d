"""`specbench plan --target MODEL --device GPU --tp 4` with a served load, simulated step by step
on the kernel tables with and without speculation (specbench.fleet; docs/fleet.md):

- `--concurrency 4,16,64 --input-len 8192 --output-len 1024`: one replica, closed-loop clients;
- `--trace azure-conv --trace-speedup 1,2,4 --slo ttft=2,tpot=0.05,p90`: the fewest replicas behind
  a router that meet the SLO at each traffic scale, and what they cost."""

from __future__ import annotations

import dataclasses
import json
import math
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import typer
from rich.table import Table

from specbench.cli.common import UsageError, console, errors, stop_code
from specbench.cli.render import print_table
from specbench.fit.table_plan import GEMM_QUANTS
from specbench.fleet.sizing import HOURS_PER_MONTH, MOST_REPLICAS


@dataclass(frozen=True)
class TrafficAsk:
    """A trace to size a fleet for: which of it, at which scales, to which SLO, and how."""

    trace: str
    window: str = ""
    scales: tuple[float, ...] | list[float] = (1.0,)
    slo: str = ""
    headroom: float = 0.2
    router: str = "least-outstanding"
    chart: Path | None = None
    gpu_price: float | None = None

    def check(self) -> None:
        from specbench.fleet.router import ROUTERS

        if not self.scales or any(not (math.isfinite(s) and s > 0) for s in self.scales):
            raise UsageError(f"--trace-speedup must be positive numbers, got "
                             f"{','.join(f'{s:g}' for s in self.scales)}")
        if not (math.isfinite(self.headroom) and 0 <= self.headroom <= 10):
            raise UsageError(f"--headroom must be a share of extra traffic in [0, 10] (0.2: 1.2×), got "
                             f"{self.headroom:g}")
        if self.router not in ROUTERS:
            raise UsageError(f"--router must be one of {', '.join(ROUTERS)}, got {self.router!r}")
        if self.chart is not None and self.chart.suffix.lower() != ".png":
            raise UsageError(f"--chart {self.chart}: write a .png file")


@dataclass(frozen=True)
class FleetAsk:
    """What the command line asked for on the kernel tables: the models and GPUs, and the load
    (closed-loop clients, or `traffic`)."""

    target: str
    drafts: str
    device: str
    backend: str
    tps: str
    draft_tp: str | None
    ks: list[int]
    alpha: str | None
    acceptance: Path | None
    dtype: str | None
    concurrencies: list[int]
    input_len: int
    output_len: int
    traffic: TrafficAsk | None = None
    clients: str = "steady"  # fleet.plan.CLIENTS
    prefix_len: int = 0  # a closed loop's prompts open with this many tokens in common (a system prompt)
    kv_cache_dtype: str = "auto"  # fleet.tables.KV_BYTES
    draft_dtype: str | None = None  # a draft model's GEMMs (GEMM_QUANTS); None: 16-bit
    # vLLM's server flags; None: its default on that GPU (fleet.tables.ServerFlags)
    max_num_seqs: int | None = None
    max_num_batched_tokens: int | None = None
    async_scheduling: bool | None = None
    prefix_caching: bool | None = None
    gpu_price: float | None = None  # $ per GPU-hour for a closed loop (a trace's: traffic.gpu_price)
    slo: str | None = None  # a closed loop's objective (a trace's: traffic.slo)
    chart: Path | None = None  # a closed loop's chart (a trace's: traffic.chart)

    def server(self):
        from specbench.fleet.tables import ServerFlags

        return ServerFlags(kv_cache_dtype=self.kv_cache_dtype, max_num_seqs=self.max_num_seqs,
                           max_num_batched_tokens=self.max_num_batched_tokens, async_scheduling=self.async_scheduling,
                           prefix_caching=self.prefix_caching)


def plan_fleet(ask: FleetAsk, json_output: bool) -> None:
    from specbench.cli.plan_tables import check_fits_context, gather_acceptance, parse_tp, target_and_drafters
    from specbench.fit import kernel_tables
    from specbench.fit import table_plan as tp_plan
    from specbench.fit.host_cost import PIECEWISE_LAYER_MS, PIECEWISE_SOURCE, VLLM_API_SERVER_REQUEST, described
    from specbench.fleet.tables import silicon_check

    started = time.perf_counter()
    _check(ask)
    tp_sizes, draft_tp_size = parse_tp(ask.tps, ask.draft_tp)
    system = kernel_tables.check_device(ask.device, ask.backend)
    family, target_name, target_config, drafters = target_and_drafters(ask.target, ask.drafts)
    if ask.traffic is None:  # (a trace's rows past the context are left out, and counted, as it is read)
        check_fits_context(target_name, target_config, ask.input_len, ask.output_len,
                           f"--input-len {ask.input_len} + --output-len {ask.output_len}")
    if ask.alpha is None and ask.acceptance is None:  # the baseline alone: speculation needs an acceptance
        left_out = [f"{', '.join(d.name for d in drafters)}: no acceptance to simulate speculation with (--alpha "
                    f"0.6,0.7,0.8 or --acceptance RUN): the baseline alone"]
        drafters, accepted, transferred, alpha_from = [], [], "", None  # the head says: no speculation simulated
    else:
        drafters, accepted, left_out, transferred, alpha_from = gather_acceptance(
            drafters, ask.alpha, ask.acceptance, target_name, family)
    planner = tp_plan.TablePlanner(target_config, target_name, system, ask.backend,
                                   draft_gemm_quant=GEMM_QUANTS[ask.draft_dtype or "bf16"])
    label = f"SIMULATED on {kernel_tables.label(system, ask.backend)}"
    server = ask.server()
    head = {"estimate": label, "target": target_name, "device": system, "backend": ask.backend,
            "dtype": ask.dtype or "bf16", "draft_dtype": ask.draft_dtype or "bf16",
            "kv_cache_dtype": ask.kv_cache_dtype, "max_num_seqs": ask.max_num_seqs,
            "max_num_batched_tokens": ask.max_num_batched_tokens, "async_scheduling": ask.async_scheduling,
            "server_flags": server.described(), **planner.described_host(),
            "graph_pieces": {"per_layer_ms": PIECEWISE_LAYER_MS, "cudagraph_mode": server.cudagraph_mode,
                             "measured": PIECEWISE_SOURCE}, "api_server": described(VLLM_API_SERVER_REQUEST),
            "alpha_from": alpha_from,
            "acceptance_transferred": transferred or None,
            "checked": silicon_check(system, ask.backend, tuple(tp_sizes))}
    if ask.traffic is None:
        _closed_loop(ask, planner, drafters, accepted, tp_sizes, draft_tp_size, head, left_out, transferred,
                     json_output, started)
    else:
        _traffic(ask, planner, drafters, accepted, tp_sizes, draft_tp_size, head, left_out, transferred,
                 target_config, json_output, started)


def _check(ask: FleetAsk) -> None:
    from specbench.cli.plan_tables import check_precision
    from specbench.fleet.plan import CLIENTS

    if ask.clients not in CLIENTS:
        raise UsageError(f"--clients must be one of {', '.join(CLIENTS)}, got {ask.clients!r}")
    check_precision(ask.dtype, ask.kv_cache_dtype, ask.draft_dtype)
    ask.server()  # its flags checked (one line each)
    if ask.traffic is not None:
        ask.traffic.check()
        return
    if ask.input_len < 1 or ask.output_len < 1 or any(c < 1 for c in ask.concurrencies):
        raise UsageError("--concurrency, --input-len and --output-len must be >= 1")
    if not 0 <= ask.prefix_len < ask.input_len:
        raise UsageError(f"--prefix-len {ask.prefix_len}: the tokens every prompt shares, from 0 to less than "
                         f"--input-len ({ask.input_len})")


def _server_note(head: dict) -> str:
    """", KV cache fp8, 4096 tokens a step" where the replica's server flags are not vLLM's defaults."""
    flags = head.get("server_flags") or ""
    return f", {flags}" if flags else ""


def _print_head(head: dict, what: str, left_out: list[str], transferred: str) -> None:
    kv = _server_note(head) + (f", draft models {head['draft_dtype']}" if head.get("draft_dtype", "bf16") != "bf16"
                               else "")
    alpha = f"α from {head['alpha_from']}" if head.get("alpha_from") else "no speculation simulated"
    console.print(f"[bold red]SIMULATED[/] {head['estimate'].removeprefix('SIMULATED on ')}: {head['target']} "
                  f"({head['dtype']}{kv}), {what}; {alpha}; not measurements", highlight=False,
                  soft_wrap=True)
    for line in ([head["checked"]] if head.get("checked") else []) + \
            ([f"TRANSFERRED ACCEPTANCE: {transferred}"] if transferred else []) + \
            [f"BEYOND THE RUN: {why}" for why in head.get("beyond_measured", [])] + \
            [f"left out: {why}" for why in left_out]:
        console.print(line, highlight=False, soft_wrap=True)


@contextmanager
def progress(doing: str):
    """A progress line on stderr while a plan simulates (left off --json's stdout, and gone when
    done; none where stderr is not a terminal), yielding the library's on_progress(done, total,
    label). On Ctrl-C (or SIGTERM) it prints what had finished, one line each, and exits 130 (143)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn, \
        TimeRemainingColumn

    shown = Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TextColumn("configurations,"),
                     TimeElapsedColumn(), TextColumn("elapsed, about"), TimeRemainingColumn(), TextColumn("left"),
                     console=errors, transient=True, disable=not errors.is_terminal)
    task = shown.add_task(doing, total=None)
    finished: list[str] = []

    def on_progress(done: int, total: int, label: str) -> None:
        if label:
            finished.append(label)
        shown.update(task, completed=done, total=total)

    try:
        with shown:
            yield on_progress
    except KeyboardInterrupt:
        errors.print(f"[yellow]stopped[/] after {len(finished)} configuration{'s' if len(finished) != 1 else ''}"
                     + (" (SIMULATED):" if finished else ""), highlight=False)
        for label in finished:
            errors.print(f"  {label}", highlight=False, soft_wrap=True, markup=False)
        raise typer.Exit(stop_code()) from None


@dataclass(frozen=True)
class ClosedLoopAsk:
    """The closed loop asked: C clients of `input_len` tokens in and `output_len` out."""

    concurrencies: list[int]
    input_len: int
    output_len: int
    clients: str = "steady"
    prefix_len: int = 0
    slo: str | None = None
    chart: Path | None = None

    def check(self) -> None:
        from specbench.fleet.plan import CLIENTS

        if self.clients not in CLIENTS:
            raise UsageError(f"--clients must be one of {', '.join(CLIENTS)}, got {self.clients!r}")
        if self.input_len < 1 or self.output_len < 1 or not self.concurrencies or any(c < 1 for c in self.concurrencies):
            raise UsageError("--concurrency, --input-len and --output-len must be >= 1")
        if not 0 <= self.prefix_len < self.input_len:
            raise UsageError(f"--prefix-len {self.prefix_len}: the tokens every prompt shares, from 0 to less than "
                             f"--input-len ({self.input_len})")
        if self.chart is not None and self.chart.suffix.lower() != ".png":
            raise UsageError(f"--chart {self.chart}: write a .png file")


def _closed_loop(ask, planner, drafters, accepted, tp_sizes, draft_tp_size, head, left_out, transferred,
                 json_output, started) -> None:
    from specbench.fit.prices import tables_gpu_price
    from specbench.fit.slo import parse_slo
    from specbench.fleet.plan import CLIENTS, closed_loop_table
    from specbench.fleet.sizing import Objective

    loop = ClosedLoopAsk(ask.concurrencies, ask.input_len, ask.output_len, ask.clients, ask.prefix_len, ask.slo,
                         ask.chart)
    slo = parse_slo(ask.slo) if ask.slo is not None else None
    price, price_note = tables_gpu_price(planner.system, ask.gpu_price)
    with progress("simulating") as on_progress:
        table, unpriced = closed_loop_table(planner, drafters, accepted, tp_sizes, draft_tp_size, ask.ks,
                                            ask.concurrencies, ask.input_len, ask.output_len,
                                            GEMM_QUANTS[ask.dtype or "bf16"], CLIENTS[ask.clients], ask.server(),
                                            price, Objective(slo.bounds, slo.percentile) if slo else None,
                                            ask.prefix_len, on_progress)
    _show_closed_loop(table, loop, head, left_out + unpriced, transferred, price, price_note, json_output, started,
                      where=planner.system, replica="one vLLM-like replica")


def plan_served_closed_loop(run_dir: Path | None, loop: ClosedLoopAsk, json_output: bool,
                            prefix_caching: bool | None = None, gpu_price: float | None = None,
                            extrapolate: bool = False) -> None:
    """`plan RUN --concurrency C --input-len N --output-len M`: C closed-loop clients on one server
    as a vLLM run measured it (the step price fitted on the run, `fleet.served`), its baseline and
    every draft × K it measured, each with its measured acceptance. Refused more than 2× past the
    run's longest prompt or most requests at once (`fleet.served.out_of_reach`) unless `extrapolate`,
    which holds the price past the run (`fleet.served.held_price`)."""
    from specbench.cli.plan_tables import check_fits_context
    from specbench.fit.slo import parse_slo
    from specbench.fleet.plan import CLIENTS, closed_loop_rows, row_label
    from specbench.fleet.served import beyond_measured, measured_reach, out_of_reach, served_context
    from specbench.fleet.sizing import Objective

    import numpy as np
    import pandas as pd

    started = time.perf_counter()
    loop.check()

    def within_reach(run) -> None:
        check_fits_context(str((run.meta.get("config") or {}).get("target", "the target")),
                           {"max_position_embeddings": served_context(run.meta)}, loop.input_len, loop.output_len,
                           f"--input-len {loop.input_len} + --output-len {loop.output_len}")
        past = out_of_reach(measured_reach(run.cells, run.requests), run.meta, np.array([loop.input_len]),
                            max(loop.concurrencies))
        if past and not extrapolate:
            raise UsageError(f"--input-len {loop.input_len} --concurrency {max(loop.concurrencies)} on {run.path}: "
                             + past)

    with progress("simulating") as on_progress:
        run, found, _, head = _served_run(run_dir, prefix_caching, extrapolate, within_reach)
        slo = parse_slo(loop.slo) if loop.slo is not None else None
        table = pd.DataFrame(closed_loop_rows(found, loop.concurrencies, loop.input_len, loop.output_len,
                                              CLIENTS[loop.clients], gpu_price,
                                              Objective(slo.bounds, slo.percentile) if slo else None, loop.prefix_len,
                                              on_progress))
    view = table.assign(configuration=table.apply(row_label, axis=1, acceptance=False),
                        running_p90=table["mean_running_batch"])
    head["beyond_measured"] = beyond_measured(view, measured_reach(run.cells, run.requests),
                                              np.array([loop.input_len]), "the closed loop",
                                              "their mean running batch", who="the closed loops")
    _show_closed_loop(table, loop, head, [], "", gpu_price,
                      "given" if gpu_price is not None else "none (server-hours)", json_output, started,
                      where="", replica=f"one server as measured in {run.path}", device="server")


def _replay_evidence(head: dict, device: str):
    """`fleet.served.direction_note` for a plan on a run whose servers the CPU replays checked (the
    sentences then say what those replays said of an effect that size), else None."""
    from specbench.fleet.served import direction_note

    return direction_note if device == "server" and head.get("checked", "").startswith("checked") else None


def _show_closed_loop(table, loop: ClosedLoopAsk, head, left_out, transferred, price, price_note, json_output,
                      started, where: str, replica: str, device: str = "GPU") -> None:
    """The closed loop's table per TP × concurrency, its sentences and chart (or JSON); `device`: what
    one replica's devices are called (GPUs on the kernel tables, a server for a measured run's)."""
    from specbench.fit.slo import parse_slo
    from specbench.fleet.plan import CLIENTS, closed_loop_answer, closed_loop_capacity, closed_loop_chart, loop_label

    clients = CLIENTS[loop.clients]
    slo = parse_slo(loop.slo) if loop.slo is not None else None
    if loop.chart is not None:
        closed_loop_chart(table, loop.chart, f"SIMULATED: {head['target']}{_server_note(head)}"
                                             + (f" on {where}" if where else "") + f", closed loop ({loop.clients}), "
                                             f"{loop.input_len} tokens in and {loop.output_len} out", device)
    seconds = time.perf_counter() - started
    groups = list(table.groupby(["tp", "concurrency"], sort=False))
    slo_words = slo.describe() if slo else ""
    answers = [closed_loop_answer(group, slo_words, device, _replay_evidence(head, device)) for _, group in groups]
    capacity = closed_loop_capacity(table, slo_words, device) if len(loop.concurrencies) > 1 else []
    if json_output:
        print(json.dumps({**head, "input_len": loop.input_len, "output_len": loop.output_len, "clients": loop.clients,
                          "prefix_len": loop.prefix_len,
                          "price": price_note, "price_per_gpu_hour": price,
                          "drafts_left_out": left_out, "seconds": round(seconds, 3),
                          "slo": slo.text if slo else None, "chart": str(loop.chart) if loop.chart else None,
                          "answers": [text for text in answers if text] + capacity,
                          "rows": json.loads(table.to_json(orient="records"))}, indent=2))
        return
    how = ("started apart, the steady state" if not clients.together else
           f"all started at once, {clients.requests_per_client} requests each, "
           + (f"lengths {clients.shortest_share:g}-1× these, every request measured (as InferenceMAX's benchmark)"
              if clients.shortest_share < 1 else "every request measured (as vllm bench serve, a sweep cell)"))
    shared = f" (the first {loop.prefix_len} the same in every prompt)" if loop.prefix_len else ""
    _print_head(head, f"{replica}, closed loop of C clients ({how}), {loop.input_len} tokens in{shared} "
                      f"and {loop.output_len} out; prices {price_note}", left_out, transferred)
    unit = "$/1M tok" if price is not None else f"{device}-h/1M tok"
    for ((tp, concurrency), group), answer in zip(groups, answers):
        shown = Table(title=loop_label(tp, concurrency, device), title_justify="left", header_style="bold")
        for column in ("draft", "K", "acceptance", "TTFT p50 ms", "TTFT p99 ms", "TTFT mean ms", "TPOT p50 ms",
                       "TPOT p99 ms", "chunk ITL p50 ms", "chunk ITL p99 ms", "E2E p50 s", f"tok/s/{device}", unit,
                       "TPOT speed-up", "mean B", "time at B≥32") + (("good", "meets SLO") if slo else ()):
            shown.add_column(column, overflow="fold")
        for row in group.itertuples():
            shown.add_row(row.draft, f"schedule {row.k_schedule}" if row.k_schedule else str(row.k) if row.k else "",
                          row.acceptance, f"{row.ttft_p50_ms:.0f}",
                          f"{row.ttft_p99_ms:.0f}", f"{row.ttft_mean_ms:.0f}", f"{row.tpot_p50_ms:.1f}",
                          f"{row.tpot_p99_ms:.1f}", f"{row.itl_chunk_p50_ms:.1f}", f"{row.itl_chunk_p99_ms:.1f}",
                          f"{row.e2e_p50_ms / 1e3:.2f}", f"{row.tokens_per_s_per_gpu:.0f}",
                          f"{row.dollars_per_million_tokens if price is not None else row.gpu_hours_per_million_tokens:.2f}",
                          f"{row.tpot_speedup:.2f}×", f"{row.mean_running_batch:.1f}",
                          f"{row.share_at_large_batch:.0%}",
                          *((f"{row.good_share:.1%}", "yes" if row.meets_slo else "no") if slo else ()))
        print_table(shown, keep=3)
        if answer:
            console.print(answer, highlight=False, soft_wrap=True)
    for line in capacity:
        console.print(line, highlight=False, soft_wrap=True)
    if loop.chart is not None:
        console.print(f"chart: {loop.chart}", highlight=False, soft_wrap=True)
    console.print(f"{len(table)} configurations simulated in {seconds:.1f} s", highlight=False)


def load_traffic(trace: str, window: str, context_limit: int):
    """The trace's requests at 1× (rows beyond the target's context skipped), as a fleet.Traffic,
    and the replay it came from (what was skipped)."""
    import numpy as np

    from specbench import traces
    from specbench.fleet.sizing import Traffic

    replay = traces.replay(traces.load_trace(trace), window, 1.0, max_context=context_limit)
    if len(replay.requests) < 2:
        raise UsageError(f"--trace {trace}: {len(replay.requests)} request in the window; a traffic needs two or more")
    requests = replay.requests
    start, end = replay.window
    name = f"{replay.trace} {start:g}–{end:.0f} s" if window else replay.trace
    shared = replay.hash_block_tokens and any(r.hash_ids for r in requests)
    traffic = Traffic(name, np.array([r.arrival_s for r in requests]),
                      np.array([r.input_tokens for r in requests]), np.array([r.output_tokens for r in requests]),
                      [r.hash_ids for r in requests] if shared else None, replay.hash_block_tokens if shared else 0)
    return traffic, replay


def _traffic(ask, planner, drafters, accepted, tp_sizes, draft_tp_size, head, left_out, transferred, target_config,
             json_output, started) -> None:
    from specbench.fit.prices import tables_gpu_price
    from specbench.fit.slo import parse_slo
    from specbench.fleet.plan import traffic_table
    from specbench.fleet.sizing import Objective

    wanted = ask.traffic
    slo = parse_slo(wanted.slo)
    traffic, replay = load_traffic(wanted.trace, wanted.window, int(target_config.get("max_position_embeddings") or 0))
    price, price_note = tables_gpu_price(planner.system, wanted.gpu_price)
    with progress("sizing") as on_progress:
        table, unpriced = traffic_table(planner, drafters, accepted, tp_sizes, draft_tp_size, ask.ks, traffic,
                                        list(wanted.scales), Objective(slo.bounds, slo.percentile), wanted.headroom,
                                        wanted.router, GEMM_QUANTS[ask.dtype or "bf16"], price, ask.server(),
                                        on_progress)
    where = f"{planner.system.split('_')[0].upper()}"
    _show_traffic(table, traffic, replay, slo, wanted, head, where, "", left_out + unpriced, transferred, price,
                  price_note, json_output, started)


def _served_run(run_dir: Path | None, prefix_caching: bool | None, held: bool = False, check=None):
    """A vLLM run's servers for the simulator: the run, its configurations (the step price fitted on
    it, `held` past what it measured; caching prefixes if `prefix_caching` says so, None: as
    specbench's servers run, not caching), the price, and the head --json and the header print.
    `check(run)` raises before the fit where the ask is out of the run's reach."""
    from specbench.fleet.served import replay_check, served_configurations
    from specbench.results import load_run

    run = load_run(run_dir)
    engine = (run.meta.get("engine") or {}).get("name", "native")
    if engine not in ("vllm", "endpoint"):
        raise UsageError(f"{run.path}: a {engine} run; plan RUN --trace or --concurrency fits a served step on a "
                         f"served run's requests (sweep --engine vllm or --endpoint), or plans on the kernel tables "
                         f"with --target MODEL")
    if check is not None:
        check(run)
    config = run.meta.get("config") or {}
    found, price = served_configurations(run.cells, run.requests, run.meta, str(run.path), held)
    if prefix_caching is not None:
        found = [dataclasses.replace(c, spec=dataclasses.replace(c.spec, prefix_caching=prefix_caching))
                 for c in found]
    head = {"estimate": f"SIMULATED on steps fitted on {run.path}", "target": str(config.get("target", "the target")),
            "device": "as measured", "backend": "vllm", "dtype": config.get("dtype") or "as measured",
            "alpha_from": f"{run.path} (each draft's measured acceptance per position)", "acceptance_transferred": None,
            "step_fitted": {**{name: float(getattr(price, name)) for name in (
                "floor_s", "fixed_s", "per_token_s", "per_context_token_s", "per_prefill_pair_s", "overhead_s",
                "head_share")}, "reread_cached_tokens": (None if math.isinf(price.reread_cached_tokens)
                                                         else float(price.reread_cached_tokens))},
            "server_flags": "" if prefix_caching is None else "prefix caching" if prefix_caching
            else "no prefix caching", "checked": replay_check(run.meta),
            "held": _held_said(price)}
    return run, found, price, head


def _held_said(price) -> str | None:
    """How the fitted step is read past the run (--extrapolate), in a sentence; None: as fitted."""
    held = price.held
    if held is None:
        return None
    tokens = (f"at its machine's compute roof ({held.token_rate_s(price) * 1e3:.2f} ms a token, from the matmul "
              f"rate the run recorded)" if held.token_s else
              f"at the fitted {price.per_token_s * 1e3:.2f} ms a token (the run recorded no matmul rate for a roof)")
    return (f"past the run's longest prompt ({held.prompt_tokens:,} tokens) a step's tokens are priced linearly "
            f"{tokens} and a prompt token's attention " + ("by the roof's pairs" if held.pair_s else
                                                          "as at that length") + "; a likely estimate only")


def plan_served_fleet(run_dir: Path | None, ask: TrafficAsk, json_output: bool,
                      prefix_caching: bool | None = None, extrapolate: bool = False) -> None:
    """`plan RUN --trace X --slo ...`: the fleet sized on the step price fitted on a vLLM run
    (fleet.served): one replica is one server as that run's were, caching prefixes if
    `prefix_caching` says so (None: as specbench's servers run, not caching; the fitted price
    prices a chunk's attention over a cached prefix per (query, key) pair). Refused where the
    trace's prompts (p90) run more than 2× past the run's longest (`fleet.served.out_of_reach`)
    unless `extrapolate`, which holds the price past the run (`fleet.served.held_price`)."""
    from specbench.fit.slo import parse_slo
    from specbench.fleet.served import beyond_measured, measured_reach, out_of_reach, served_context
    from specbench.fleet.sizing import Objective, size_fleets

    started = time.perf_counter()
    ask.check()
    slo = parse_slo(ask.slo)

    def within_reach(run) -> None:
        prompts = load_traffic(ask.trace, ask.window, served_context(run.meta))[0].prompts
        past = out_of_reach(measured_reach(run.cells, run.requests), run.meta, prompts)
        if past and not extrapolate:
            raise UsageError(f"--trace {ask.trace} on {run.path}: {past}")

    with progress("sizing") as on_progress:
        run, found, _, head = _served_run(run_dir, prefix_caching, extrapolate, within_reach)
        # rows past the servers' context (vLLM refuses them) or past a server's whole KV cache are left out
        limit = min(c.spec.kv_capacity_tokens for c in found)
        traffic, replay = load_traffic(ask.trace, ask.window, min(limit, served_context(run.meta) or limit))
        table = size_fleets(found, traffic, list(ask.scales), Objective(slo.bounds, slo.percentile), ask.headroom,
                            ask.router, ask.gpu_price, on_progress=on_progress)
    head["beyond_measured"] = beyond_measured(table, measured_reach(run.cells, run.requests), traffic.prompts,
                                              traffic.name)
    cache = "" if prefix_caching is None else f" ({'prefix caching on' if prefix_caching else 'no prefix caching'})"
    _show_traffic(table, traffic, replay, slo, ask, head, "", f"{head['target']} servers as measured in {run.path}{cache}",
                  [], "", ask.gpu_price, "given" if ask.gpu_price is not None else "none (device-hours)", json_output,
                  started, device="server")


def _show_traffic(table, traffic, replay, slo, ask: TrafficAsk, head, where, replica, left_out, transferred, price,
                  price_note, json_output, started, device: str = "GPU") -> None:
    """The sized fleets as tables and sentences (or JSON); `device`: what one replica's devices
    are called (GPUs on the kernel tables, servers for a measured run's: one server a replica)."""
    from specbench.fleet.plan import answer, fewest_gpus, replicas_chart

    caveat = ", EXTRAPOLATED past the batches or prompts its run measured" if head.get("beyond_measured") else ""
    if ask.router == "prefix-aware" and traffic.prefixes is not None:
        # measured on two vLLM CPU servers: its routing and cache hits as simulated, the tail of the
        # herding it does on prompts new to every server only at the pace those servers ran, and
        # at the calibration's in one sitting of two (docs/fleet.md)
        caveat += ", the prefix-aware router's tail likely worse"
    evidence = _replay_evidence(head, device)
    sentences = [answer(group, traffic.name, head["target"], where, slo.describe(), ask.headroom, replica, caveat,
                        evidence)
                 for _, group in table.groupby(["tp", "scale"], sort=False)]
    sentences += [text for text in (fewest_gpus(table, scale) for scale in sorted(set(ask.scales))) if text]
    if ask.chart is not None:
        title = f"SIMULATED: {head['target']}{_server_note(head)}" + (f" on {where}" if where else "")
        replicas_chart(table, ask.chart, title + f", {traffic.name}; {slo.describe()} at {1 + ask.headroom:g}× "
                                                 f"the traffic; {ask.router} router")
    seconds = time.perf_counter() - started
    if json_output:
        print(json.dumps({**head, "trace": traffic.name, "requests": len(traffic.prompts),
                          "duration_s": traffic.duration_s, "skipped": replay.notes(), "slo": slo.text,
                          "headroom": ask.headroom, "router": ask.router, "price": price_note,
                          "prefix_unit_tokens": traffic.prefix_unit_tokens if traffic.prefixes is not None else None,
                          "price_per_gpu_hour": price, "drafts_left_out": left_out, "answers": sentences,
                          "chart": str(ask.chart) if ask.chart else None, "seconds": round(seconds, 3),
                          "rows": json.loads(table.to_json(orient="records"))}, indent=2))
        return
    cached = (table["prefix_hit_share"] > 0).any() if "prefix_hit_share" in table else False
    shares = (f"; its prompts share prefixes as its hash ids say ({traffic.prefix_unit_tokens}-token blocks)"
              + (", found in each replica's prefix cache" if cached else "") if traffic.prefixes is not None else "")
    if ask.router == "prefix-aware" and traffic.prefixes is None:  # (an Azure trace carries no hash ids)
        shares = "; no prefixes in it, so the router weighs the servers' queues and free KV cache alone"
    _print_head(head, f"replicas behind a {ask.router} router serving {traffic.name} ({len(traffic.prompts)} "
                      f"requests, {traffic.rate():.2f} req/s at 1×{shares}); sized to {slo.describe()} at "
                      f"{1 + ask.headroom:g}× each traffic; prices {price_note}", left_out + replay.notes(), transferred)
    unit = "$" if price is not None else f"{device}-h"
    shared = traffic.prefixes is not None  # the trace says what its prompts share: the prefix cache's hits shown
    columns = ["configuration", "replicas", f"{device}s", f"{unit}/month", f"{unit}/1M tok", "TTFT p50 ms",
               "TTFT p99 ms", "TPOT p50 ms", "TPOT p99 ms", "chunk ITL p99 ms", "E2E p50 s", "good", "time at B≥32"]
    columns += ["prompt found cached"] if shared else []
    for (tp, scale), group in table.groupby(["tp", "scale"], sort=False):
        if group["replicas"].isna().all():  # no configuration sized: its sentence below says why, a blank table not
            continue
        shown = Table(title=f"{f'TP{tp}, ' if device == 'GPU' else ''}{traffic.name} at {scale:g}× "
                            f"({traffic.rate(scale):.2f} req/s)", title_justify="left", header_style="bold")
        for column in columns:
            shown.add_column(column, overflow="fold")
        for row in group.itertuples():
            if not row.replicas == row.replicas:
                idle = getattr(row, "idle_at", math.nan)
                shown.add_row(row.configuration, "none (alone misses)" if not row.reachable else
                              f"none (uses {int(row.used_at)} of {int(idle)})" if idle == idle else f">{MOST_REPLICAS}",
                              *[""] * (len(columns) - 2))
                continue
            monthly = row.dollars_per_month if price is not None else row.gpus * HOURS_PER_MONTH
            per_million = row.dollars_per_million_tokens if price is not None else \
                row.gpus / (traffic.output_tokens_per_s(scale) * 3600) * 1e6
            shown.add_row(row.configuration, str(int(row.replicas)), str(int(row.gpus)), f"{monthly:,.0f}",
                          f"{per_million:.2f}", f"{row.ttft_p50_ms:.0f}", f"{row.ttft_p99_ms:.0f}",
                          f"{row.tpot_p50_ms:.1f}", f"{row.tpot_p99_ms:.1f}", f"{row.itl_chunk_p99_ms:.0f}",
                          f"{row.e2e_p50_ms / 1e3:.1f}",
                          f"{row.good_share:.1%}", f"{row.share_at_large_batch_mean:.0%} (max "
                                                   f"{row.share_at_large_batch_max:.0%})",
                          *([f"{row.prefix_hit_share:.0%}"] if shared else []))
        print_table(shown, keep=1)
    for sentence in sentences:
        console.print(sentence, highlight=False, soft_wrap=True)
    if ask.chart is not None:
        console.print(f"chart: {ask.chart}", highlight=False)
    console.print(f"{len(table)} configurations sized in {seconds:.1f} s", highlight=False)
