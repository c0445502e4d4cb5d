"""One replica under closed-loop clients, simulated step by step with and without speculation
(specbench.fleet; docs/guides/size-a-fleet.md): C clients, each sending its next request when its last finished,
on a replica priced on the kernel tables (`closed_loop`) or on the servers a vLLM run measured
(`closed_loop_on_run`)."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from specbench.api.errors import UsageError
from specbench.api.inputs import check_price
from specbench.api.replicas import Simulated

OnProgress = Callable[[int, int, str], None]  # (configurations done, of all, the one just finished)


@dataclass
class ClosedLoop(Simulated):
    """SIMULATED, not measured: `table` holds one row per TP, clients, draft and K
    (fleet.plan.closed_loop_table's columns); `answers` one sentence (or None) per TP × clients
    group, in the table's order, and `capacity` the most clients that meet the SLO."""
    table: Any  # a pandas DataFrame
    head: dict  # what the replica rests on: the tables or the run, the server flags, the acceptance
    concurrencies: list[int]
    input_len: int
    output_len: int
    clients: str
    prefix_len: int
    price: float | None  # $ per GPU-hour (or server-hour); None: costs in device-hours
    price_note: str
    slo: Any  # fit.slo's parsed SLO; None: none asked
    replica: str  # what one replica is, in words
    answers: list[str | None] = field(default_factory=list)
    capacity: list[str] = field(default_factory=list)

    @property
    def answer(self) -> str:
        """The answer in one sentence: per drafter, up to how many clients speculation serves more
        tokens/s than the baseline (its best K at each), over every TP and acceptance."""
        from specbench.api.tables import published_said
        from specbench.fit.decisions import speedup_cases, where_it_pays
        from specbench.schema import AR

        speculative = self.table[self.table["draft"] != AR]
        cases = speedup_cases(speculative, ["tp", "acceptance"], "concurrency", "throughput_speedup")
        found = where_it_pays(cases, at="{} clients", near="≈ {} clients") or "no speculation simulated"
        return (f"SIMULATED, one replica under closed-loop clients ({self.where or 'the run'})"
                f"{published_said(self.head.get('alpha_from'))}: {found}.")

    def to_dict(self) -> dict:
        """As `plan --concurrency ... --json` prints it."""
        import json

        return {"answer": self.answer, **self.head, "input_len": self.input_len, "output_len": self.output_len, "clients": self.clients,
                "prefix_len": self.prefix_len, "price": self.price_note, "price_per_gpu_hour": self.price,
                "drafts_left_out": self.left_out, "seconds": round(self.seconds, 3),
                "slo": self.slo.text if self.slo else None, "chart": str(self.chart) if self.chart else None,
                "answers": [text for text in self.answers if text] + self.capacity,
                "rows": json.loads(self.table.to_json(orient="records"))}


def closed_loop(target: str, *, concurrency: Sequence[int], input_len: int = 1024, output_len: int = 1024,
                drafts: Sequence[str] = ("1b", "8b"), alpha: str | float | None = None,
                acceptance: Path | str | None = None, device: str = "h100", backend: str = "vllm",
                tp: Sequence[int] = (1,), draft_tp: int | None = None, ks: Sequence[int] = (1, 2, 3, 4, 6, 8),
                clients: str = "steady", prefix_len: int = 0, dtype: str | None = None,
                draft_dtype: str | None = None, kv_cache_dtype: str = "auto", max_num_seqs: int | None = None,
                max_num_batched_tokens: int | None = None, async_scheduling: bool | None = None,
                prefix_caching: bool | None = None, gpu_price: float | None = None, slo: str | None = None,
                chart: Path | str | None = None, on_progress: OnProgress | None = None,
                expert_parallel: bool = False) -> ClosedLoop:
    """`plan --target --concurrency`: one vLLM-like replica priced on `device`'s kernel tables, each
    of `concurrency` closed-loop clients sending `input_len` tokens in and `output_len` out, without
    speculation and with each drafter × K (no `alpha` nor `acceptance`: the baseline alone).
    `clients`: steady, inferencemax or bench (fleet.plan.CLIENTS); `prefix_len`: tokens every prompt
    shares; the server options as vLLM's (None: its default on that GPU); `slo`: ttft=,tpot=,e2e=,pNN,
    who meets it; `chart`: a PNG of tokens/s per GPU and TPOT against the clients. The other
    arguments as api.price's."""
    from specbench.api.replicas import check_chart, tables_replica
    from specbench.fit.prices import tables_gpu_price
    from specbench.fit.slo import parse_slo
    from specbench.fleet.plan import CLIENTS, closed_loop_table
    from specbench.fleet.sizing import Objective

    started = time.perf_counter()
    chart = check_chart(chart)
    ks, concurrencies = list(ks), list(concurrency)
    if any(x < 1 for x in ks):
        raise UsageError("--k must be >= 1")
    check_price(gpu_price, 1)

    def check_load() -> None:
        _check_load(concurrencies, input_len, output_len, prefix_len)

    replica = tables_replica(target, drafts=drafts, alpha=alpha, acceptance=acceptance, device=device,
                             backend=backend, tp=tp, draft_tp=draft_tp, dtype=dtype, draft_dtype=draft_dtype,
                             kv_cache_dtype=kv_cache_dtype, clients=clients, max_num_seqs=max_num_seqs,
                             max_num_batched_tokens=max_num_batched_tokens, async_scheduling=async_scheduling,
                             prefix_caching=prefix_caching, check_load=check_load, fits=(input_len, output_len),
                             expert_parallel=expert_parallel)
    parsed = parse_slo(slo) if slo is not None else None
    price, price_note = tables_gpu_price(replica.planner.system, gpu_price)
    table = closed_loop_table(replica.planner, replica.drafters, replica.accepted, replica.tp,
                                        replica.draft_tp, ks, concurrencies, input_len, output_len, replica.gemm_quant,
                                        CLIENTS[clients], replica.server, price,
                                        Objective(parsed.bounds, parsed.percentile) if parsed else None, prefix_len,
                                        on_progress)
    found = ClosedLoop(table, replica.head, concurrencies, input_len, output_len, clients, prefix_len, price,
                       price_note, parsed, "one vLLM-like replica", where=replica.planner.system,
                       left_out=replica.left_out, transferred=replica.transferred, chart=chart)
    return _answered(found, started)


def closed_loop_on_run(run: Path | str | None, *, concurrency: Sequence[int], input_len: int = 1024,
                       output_len: int = 1024, clients: str = "steady", prefix_len: int = 0,
                       prefix_caching: bool | None = None, gpu_price: float | None = None, slo: str | None = None,
                       chart: Path | str | None = None, extrapolate: bool = False,
                       on_progress: OnProgress | None = None) -> ClosedLoop:
    """`plan RUN --concurrency`: closed-loop clients on one server as a vLLM run measured it (the
    step price fitted on the run, fleet.served), its baseline and every draft × K it measured, each
    with its measured acceptance. Refused more than 2× past the run's longest prompt or most
    requests at once (fleet.served.out_of_reach) unless `extrapolate`, which holds the price past
    the run (fleet.served.held_price). `prefix_caching`: None, the servers as measured (specbench's
    cache nothing). The other arguments as closed_loop's."""
    import numpy as np
    import pandas as pd

    from specbench.api.replicas import check_chart, served_run
    from specbench.api.tables import check_fits_context
    from specbench.fit.slo import parse_slo
    from specbench.fleet.plan import CLIENTS, closed_loop_rows, row_label
    from specbench.fleet.served import beyond_measured, measured_reach, out_of_reach, served_context
    from specbench.results import recorded_config
    from specbench.fleet.sizing import Objective

    started = time.perf_counter()
    if run is None:
        raise UsageError("--concurrency simulates served replicas: give --target MODEL (on the kernel tables) "
                         "or RUN_DIR (the servers a vLLM run measured)")
    check_price(gpu_price, 1)
    concurrencies = list(concurrency)
    if clients not in CLIENTS:
        raise UsageError(f"--clients must be one of {', '.join(CLIENTS)}, got {clients!r}")
    _check_load(concurrencies, input_len, output_len, prefix_len)
    chart = check_chart(chart)

    def within_reach(measured) -> None:
        check_fits_context(str(recorded_config(measured.meta)["grid"].get("target", "the target")),
                           {"max_position_embeddings": served_context(measured.meta)}, input_len, output_len,
                           f"--input-len {input_len} + --output-len {output_len}")
        past = out_of_reach(measured_reach(measured.cells, measured.requests), measured.meta, np.array([input_len]),
                            max(concurrencies))
        if past and not extrapolate:
            raise UsageError(f"--input-len {input_len} --concurrency {max(concurrencies)} on {measured.path}: "
                             + past)

    measured, found, _, head = served_run(run, prefix_caching, extrapolate, within_reach)
    parsed = parse_slo(slo) if slo is not None else None
    table = pd.DataFrame(closed_loop_rows(found, concurrencies, input_len, output_len, CLIENTS[clients], gpu_price,
                                          Objective(parsed.bounds, parsed.percentile) if parsed else None, prefix_len,
                                          on_progress))
    view = table.assign(configuration=table.apply(row_label, axis=1, acceptance=False),
                        running_p90=table["mean_running_batch"])
    head["beyond_measured"] = beyond_measured(view, measured_reach(measured.cells, measured.requests),
                                              np.array([input_len]), "the closed loop",
                                              "their mean running batch", who="the closed loops")
    loop = ClosedLoop(table, head, concurrencies, input_len, output_len, clients, prefix_len, gpu_price,
                      "given" if gpu_price is not None else "none (server-hours)", parsed,
                      f"one server as measured in {measured.path}", device="server", chart=chart)
    return _answered(loop, started)


def _check_load(concurrencies: list[int], input_len: int, output_len: int, prefix_len: int) -> None:
    if input_len < 1 or output_len < 1 or not concurrencies or any(c < 1 for c in concurrencies):
        raise UsageError("--concurrency, --input-len and --output-len must be >= 1")
    if not 0 <= prefix_len < input_len:
        raise UsageError(f"--prefix-len {prefix_len}: the tokens every prompt shares, from 0 to less than "
                         f"--input-len ({input_len})")


def _answered(loop: ClosedLoop, started: float) -> ClosedLoop:
    """The loop with its sentences per TP × clients, its capacity and its chart drawn."""
    from specbench.api.replicas import replay_evidence, server_note
    from specbench.fleet.plan import closed_loop_answer, closed_loop_capacity, closed_loop_chart

    if loop.chart is not None:
        closed_loop_chart(loop.table, loop.chart, f"SIMULATED: {loop.head['target']}{server_note(loop.head)}"
                                                  + (f" on {loop.where}" if loop.where else "")
                                                  + f", closed loop ({loop.clients}), {loop.input_len} tokens in "
                                                    f"and {loop.output_len} out", loop.device)
    slo_words = loop.slo.describe() if loop.slo else ""
    evidence = replay_evidence(loop.head, loop.device)
    loop.answers = [closed_loop_answer(group, slo_words, loop.device, evidence)
                    for _, group in loop.table.groupby(["tp", "concurrency"], sort=False)]
    loop.capacity = closed_loop_capacity(loop.table, slo_words, loop.device) if len(loop.concurrencies) > 1 else []
    loop.seconds = time.perf_counter() - started
    return loop
