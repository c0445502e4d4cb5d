"""A sweep: every cell of the grid measured by one engine (native or vLLM), written to a run
directory as it goes, each speculative cell paired with its group's autoregressive baseline and,
when greedy, checked token for token against it.

`run_sweep` is the notebook entry point; the CLI only renders its events.
"""

from __future__ import annotations

import gc
import math
from dataclasses import asdict, dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

import pandas as pd

from specbench.engines import CellMeasurement, CellOutcome, Engine, Stage, StageFailed, open_engine
from specbench.executors.where import where_columns
from specbench.fit.noise import BRACKETED, SIDE_BY_SIDE, runs_list
from specbench.grid import (  # noqa: F401
    AR, Cell, SweepConfig, VllmOptions, describe_plan, plan_cells, requests_per_cell, split_schedule, target_shape,
)
from specbench.lossless import PROBE_MIN_TOKENS, PROBE_TOKENS, sampled_check
from specbench.models import lookup_alias, parse_draft_spec, resolve_model
from specbench.results import (
    COPIES, append_part, hardware_info, merge_parts, new_run_dir, now_iso, read_table, versions, write_json, write_table,
)
from specbench.synthetic import shipped_config
from specbench.workloads import Workload, load_workload, long_context_records, trace_records


# Each engine's own checks of a sweep's configuration, imported only for the engine that runs (the
# native engine's module loads torch; vLLM's and an endpoint's do not need it).
ENGINE_CHECKS = {"native": ("specbench.native.runner", "validate_native"),
                 "endpoint": ("specbench.served.endpoint", "validate_endpoint"),
                 "vllm": ("specbench.served.vllm_engine", "validate_vllm")}


def check_config(config: SweepConfig) -> None:
    """One-line errors for bad input, before anything loads: the grid's values (`SweepConfig.validate`),
    the SLO, where the cells run (the executor) and what the chosen engine can run."""
    import importlib

    from specbench.executors import validate_executor
    from specbench.fit.slo import parse_slo

    config.validate()
    if config.slo:
        parse_slo(config.slo)
    validate_executor(config)
    module, function = ENGINE_CHECKS[config.engine]
    getattr(importlib.import_module(module), function)(config)


def preflight(config: SweepConfig) -> dict[str, Workload]:
    """Everything checkable without loading weights: grid values, model references, workloads,
    and what must fit the target (its context, its layers). Returns the loaded workloads."""
    check_config(config)
    shape = target_shape(config)
    check_context_limit(config, shape)
    check_self_drafts(config, shape)
    workloads = {name: load_workload(name) for name in config.workloads}
    check_prompt_lengths(config, workloads, shape)
    if config.engine == "vllm":
        import sys

        from specbench.served.vllm_engine import installed_vllm_version

        installed_vllm_version(config.vllm.python or sys.executable)  # one line saying how to install it
    if config.engine == "endpoint":  # an unreachable server is the likelier mistake than a missing tokenizer
        from specbench.served.endpoint import check_reachable

        check_reachable(config)
    if config.synthetic:
        target_alias, _ = shipped_config(config.target)
        family = lookup_alias(target_alias).family
        for draft in config.drafts:
            spec = parse_draft_spec(split_schedule(draft)[0], allow_served=config.engine != "native")
            if spec.kind == "model":
                shipped_config(spec.model, family)
        return workloads
    target = resolve_model(config.target, allow_download=config.allow_download)
    family = target.spec.family if target.spec else None
    for draft in config.drafts if config.engine != "endpoint" else []:  # an endpoint's draft is a label
        spec = parse_draft_spec(split_schedule(draft)[0], allow_served=config.engine != "native")
        if spec.kind == "model":
            resolve_model(spec.model, family=family, allow_download=config.allow_download)
    return workloads


def _positions_needed(config: SweepConfig, prompt_tokens: int) -> int:
    return prompt_tokens + config.max_new_tokens + 2 * max(config.ks, default=0) + 8


def check_context_limit(config: SweepConfig, shape: dict | None = None) -> None:
    """A one-line error, before anything loads, when the longest prompt asked for plus the new
    tokens (and a step's drafts) would not fit the target's context."""
    limit = (shape or {}).get("max_position_embeddings")
    longest = max(config.context_lengths, default=0)
    needed = _positions_needed(config, longest)
    if limit and needed > limit:
        asked = f"--context-lengths {longest} + " if longest else ""
        raise ValueError(f"{asked}--max-new-tokens {config.max_new_tokens} needs {needed} positions; "
                         f"{config.target} has a {limit}-token context")


def check_self_drafts(config: SweepConfig, shape: dict | None) -> None:
    """self:N drafts with the target's first N layers: N must be fewer than the target has."""
    layers = (shape or {}).get("num_hidden_layers")
    for draft in config.drafts:
        base = split_schedule(draft)[0]
        if layers and base.startswith("self:"):
            n = parse_draft_spec(base, allow_served=True).layers
            if n >= layers:
                raise ValueError(f"draft {draft!r}: {config.target} has {layers} layers; a self-draft uses fewer "
                                 f"(self:1 to self:{layers - 1})")


MAX_PROMPT_CHARS = 1 << 22  # 4 Mi characters: more than any model's context holds, whatever it is


def check_prompt_lengths(config: SweepConfig, workloads: dict[str, Workload], shape: dict | None) -> None:
    """A prompt that cannot fit the target's context (or is over MAX_PROMPT_CHARS) is refused
    before anything loads: generating from it would fail, or exhaust memory first. A prompt of at
    most as many characters as there are free positions fits (a token covers at least one
    character); only longer ones are tokenized to know."""
    limit = (shape or {}).get("max_position_embeddings")
    room = limit - _positions_needed(config, 0) if limit else None
    tokenizer = None
    for name, workload in workloads.items():
        if config.context_lengths or config.trace or not workload.records:
            continue  # prompts built to the context lengths or a trace's, checked against the context already
        longest = max(workload.records, key=lambda record: len(record.text))
        chars = len(longest.text)
        if chars > MAX_PROMPT_CHARS or (room is not None and chars > 32 * room):
            where = f"; {config.target} has a {limit}-token context" if limit else ""
            raise ValueError(f"workload {name}: prompt {longest.id} is {chars:,} characters, over the size limit"
                             f"{where}")
        if room is None or chars + 64 <= room or config.synthetic:
            continue
        if tokenizer is None:
            from specbench.models import load_tokenizer
            from specbench.workloads import encode_prompt

            tokenizer = load_tokenizer(config.target, config.allow_download, config.trust_remote_code)
        tokens = len(encode_prompt(longest, tokenizer, config.chat_template))
        if tokens > room:
            raise ValueError(f"workload {name}: prompt {longest.id} is {tokens} tokens; with --max-new-tokens "
                             f"{config.max_new_tokens} it needs {_positions_needed(config, tokens)} positions and "
                             f"{config.target} has a {limit}-token context")


# --- resuming a run ----------------------------------------------------------------------------

# SweepConfig fields that name cells (a resume may add values: new cells, old ones kept), and those
# that change what a cell measures (a resume must keep them). The rest (--slo, downloads) may change.
GRID_FIELDS = ("drafts", "ks", "batch_sizes", "request_rates", "temperatures", "workloads", "context_lengths",
               "alphas")
MEASURED_FIELDS = ("target", "max_new_tokens", "num_prompts", "repeats", "seed", "dtype", "device", "top_p", "top_k",
                   "chat_template", "weights", "target_layers", "cuda_graphs", "engine", "vllm", "burstiness",
                   "endpoint", "baseline_endpoint", "trace", "trace_window", "trace_speedup", "trace_max_requests")
OPTION_NAMES = {"ks": "k", "alphas": "alpha", "allow_download": "download"}  # field -> its CLI option


def resumed_config(previous: dict, config: SweepConfig, given: set[str] | None = None) -> tuple[SweepConfig, list[str]]:
    """The config to resume a run with: the run's own settings, except those given on the command
    line (`given`: field names; None = all). A grid setting given replaces the run's (cells already
    measured are kept, new ones added); a measurement setting given must equal the run's, or the
    resume is refused with one line naming each difference. Returns the config and notes."""
    from dataclasses import fields

    asked = asdict(config)
    merged, conflicts, notes = dict(asked), [], []
    for item in fields(SweepConfig):
        name = item.name
        if name not in previous:
            continue
        before, now = previous[name], asked[name]
        if given is not None and name not in given:
            merged[name] = before
        elif name in MEASURED_FIELDS and _normal(before) != _normal(now):
            conflicts.append(f"--{OPTION_NAMES.get(name, name).replace('_', '-')} {_shown(now)} (the run: "
                             f"{_shown(before)})")
        elif name in GRID_FIELDS and _normal(before) != _normal(now):
            notes.append(f"--{OPTION_NAMES.get(name, name).replace('_', '-')} {_shown(now)} replaces the run's "
                         f"{_shown(before)}: its cells already measured are kept")
    if conflicts:
        raise ValueError("--resume would mix cells measured under other settings: " + "; ".join(conflicts)
                         + ". Leave those options out to resume with the run's, or start a new run")
    merged["vllm"] = VllmOptions(**merged["vllm"]) if isinstance(merged["vllm"], dict) else merged["vllm"]
    return SweepConfig(**merged), notes


def _normal(value):
    """Settings as JSON has them (tuples as lists, ints and floats alike)."""
    if isinstance(value, dict):
        return {key: _normal(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [_normal(item) for item in value]
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) else value


def _shown(value) -> str:
    if isinstance(value, list):
        return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in value)
    if isinstance(value, dict):
        return ", ".join(f"{k}={v}" for k, v in value.items())
    return "default" if value is None else str(value)


# --- the sweep ---------------------------------------------------------------------------------

@dataclass
class SweepEvent:
    kind: str  # "loaded" | "stage" | "start" | "done"
    cell: Cell | None = None
    row: dict | None = None
    index: int = 0
    total: int = 0
    message: str = ""
    requests: list[dict] | None = None  # "done": the cell's request and step rows, as the tables got them
    steps: list[dict] | None = None


class SweepTables:
    """The tables of a run being written: the cells table in memory and rewritten after every
    cell; requests and steps appended per cell as part files (merged by `close`). Keeps every
    cell's requests for the lossless checks of the cells that follow."""

    def __init__(self, run_dir: Path) -> None:
        self.run_dir = run_dir
        self.cells = read_table(run_dir, "cells")
        requests = read_table(run_dir, "requests")
        self._requests: dict[str, list[dict]] = {}
        if len(requests):
            for cell_id, rows in requests.groupby("cell_id", sort=False):
                self._requests[cell_id] = rows.to_dict("records")

    def finished_ids(self) -> set[str]:
        return set(self.cells["cell_id"]) if len(self.cells) else set()

    def add(self, row: dict, requests: list[dict], steps: list[dict]) -> None:
        new_row = pd.DataFrame([row])
        self.cells = new_row if self.cells.empty else pd.concat([self.cells, new_row], ignore_index=True)
        if requests:
            append_part(self.run_dir, "requests", pd.DataFrame(requests))
            self._requests[row["cell_id"]] = list(requests)
        if steps:
            append_part(self.run_dir, "steps", pd.DataFrame(steps))
        write_table(self.run_dir, "cells", self.cells)

    def replace(self, row: dict, requests: list[dict], steps: list[dict]) -> None:
        """A cell measured again with more repeats: its row replaced (in place), its new requests
        and steps added to those it had."""
        at = int(self.cells.index[self.cells["cell_id"] == row["cell_id"]][0])
        self.cells = pd.concat([self.cells.iloc[:at], pd.DataFrame([row]), self.cells.iloc[at + 1:]],
                               ignore_index=True)
        if requests:
            append_part(self.run_dir, "requests", pd.DataFrame(requests))
            self._requests.setdefault(row["cell_id"], []).extend(requests)
        if steps:
            append_part(self.run_dir, "steps", pd.DataFrame(steps))
        write_table(self.run_dir, "cells", self.cells)

    def add_copy(self, row: dict) -> None:
        """A baseline measured again on another node (a cluster run): kept beside the cells table,
        where the first measurement stands. A copy from the same node replaces the one it had."""
        copies = read_table(self.run_dir, COPIES)
        if not copies.empty:
            copies = copies[~((copies["cell_id"] == row["cell_id"]) & (copies["node_id"] == row.get("node_id")))]
        new_row = pd.DataFrame([row])
        write_table(self.run_dir, COPIES, new_row if copies.empty else pd.concat([copies, new_row], ignore_index=True))

    def row(self, cell_id: str) -> dict:
        return self.cells[self.cells["cell_id"] == cell_id].iloc[0].to_dict()

    def close(self) -> None:
        merge_parts(self.run_dir)

    def baseline_requests(self, cell_id: str, repeat: int | None = 0) -> list[dict] | None:
        """A finished cell's request rows of one repeat (every repeat with None), in request
        order; None if it has none."""
        rows = [r for r in self._requests.get(cell_id, []) if repeat is None or r["repeat"] == repeat]
        return rows or None


def _pair_with_baseline(tables: SweepTables, cell: Cell, row: dict) -> None:
    """The speed-up over the cell's own group baseline: `speedup` from the medians, and
    `speedup_runs` repeat by repeat; their spread is the measurement noise the gate reports. Which
    baseline measurement it pairs with depends on `pairing` (fit.noise): side by side, the
    baseline repeats measured alternately with this cell's (`baseline_tokens_per_s_runs`);
    bracketed, every repeat of the baseline cell, before and after (unpaired); otherwise the
    baseline cell's repeats in turn (native) or in sequence (a served run without pairing)."""
    if cell.is_speculative:
        cells = tables.cells
        match = cells[(cells["cell_id"] == cell.baseline_id)
                      & (cells["status"] == "ok")] if not cells.empty and "tokens_per_s" in cells else []
        if not len(match):
            row["baseline_tokens_per_s"], row["speedup"], row["speedup_runs"] = float("nan"), float("nan"), []
            return
        baseline = match.iloc[0]
    else:
        baseline = row  # a baseline is its own
    runs = list(row["tokens_per_s_runs"])
    how = row.get("pairing") if cell.is_speculative else None
    beside = runs_list(row.get("baseline_tokens_per_s_runs")) if how == SIDE_BY_SIDE else []
    baseline_runs = beside or runs_list(baseline["tokens_per_s_runs"])
    if how == BRACKETED:
        row["baseline_tokens_per_s_runs"] = baseline_runs
    row["baseline_tokens_per_s"] = float(pd.Series(baseline_runs).median()) if how in (SIDE_BY_SIDE, BRACKETED) \
        else float(baseline["tokens_per_s"])
    row["speedup"] = row["tokens_per_s"] / row["baseline_tokens_per_s"]
    if how == BRACKETED:  # no repeat pairs with another: each against the baseline's median
        row["speedup_runs"] = [ours / row["baseline_tokens_per_s"] for ours in runs]
    else:
        row["speedup_runs"] = [ours / theirs for ours, theirs in zip(runs, baseline_runs)]  # round by round


def _failure_row(cell: Cell, status: str, message: str) -> dict:
    return {"cell_id": cell.id, "status": status, "message": message,
            "mode": "speculative" if cell.is_speculative else AR, "workload": cell.workload, "draft": cell.draft,
            "k": cell.k, "batch_size": cell.batch_size, "temperature": cell.temperature,
            "request_rate": cell.request_rate, "context_length": cell.context_length}


@dataclass
class SweepWork:
    """What an executor is handed: the cells left to measure, and where each finished one goes.
    `tables` takes every finished cell; `meta` is run.json's dict (an engine adds to it) and
    `save_meta` writes it."""

    config: SweepConfig
    planned: list[Cell]  # every cell of the grid, in plan order
    todo: list[Cell]  # those not finished yet
    tables: SweepTables
    workloads: dict[str, Workload]
    on_event: Callable[[SweepEvent], None]
    meta: dict
    save_meta: Callable[[], None] = lambda: None
    node_id: str = "local"  # the cluster node measuring them (executors.where: a column of every row)

    @cached_property
    def position(self) -> dict[str, int]:
        return {cell.id: index for index, cell in enumerate(self.planned)}


def run_sweep(
    config: SweepConfig,
    results_root: Path = Path("results"),
    resume_dir: Path | None = None,
    on_event: Callable[[SweepEvent], None] = lambda event: None,
) -> Path:
    """Run every cell not already finished; returns the run directory. Where the cells run is the
    executor's business (--executor: this process, or a Ray cluster); the run directory is written
    here only, as each cell finishes. Ctrl-C stops after writing what finished (KeyboardInterrupt
    propagates)."""
    from specbench.executors import open_executor

    workloads = preflight(config)
    executor = open_executor(config)
    executor.preflight()  # an unreachable cluster fails here, before a run directory says "running"
    run_dir = resume_dir or new_run_dir(Path(results_root), config.target)
    tables = SweepTables(run_dir)
    meta = {"config": asdict(config), "plan": describe_plan(config), "started": now_iso(), "status": "running",
            "hardware": hardware_info(), "versions": versions(), "seed": config.seed,
            "synthetic": config.synthetic, "engine": {"name": config.engine}}
    if config.trace:
        from specbench.traces import replay_for

        meta["trace"] = replay_for(config).to_dict()
    previous = run_dir / "run.json"
    if resume_dir and previous.exists():
        import json

        meta["resumed_from_started"] = json.loads(previous.read_text()).get("started")
    write_json(run_dir / "run.json", meta)

    cells = plan_cells(config)
    done = tables.finished_ids()
    work = SweepWork(config, cells, [cell for cell in cells if cell.id not in done], tables, workloads, on_event,
                     meta, lambda: write_json(run_dir / "run.json", meta))
    try:
        executor.run(work)
        meta["status"] = "complete"
    except KeyboardInterrupt:
        # a signal after the last cell finished leaves a complete run: every planned cell has its row
        meta["status"] = "complete" if {cell.id for cell in cells} <= tables.finished_ids() else "interrupted"
        raise
    except Exception as error:
        meta["status"] = "failed"
        meta["error"] = (str(error).splitlines() or [type(error).__name__])[0]
        raise
    finally:
        tables.close()
        meta["finished"] = now_iso()
        write_json(run_dir / "run.json", meta)
    return run_dir


def measure_here(work: SweepWork) -> None:
    """The cells measured in this process, one engine: its stages in turn (bracketed served runs
    closed after), then --until-decided's added repeats."""
    config, tables, meta = work.config, work.tables, work.meta
    engine = open_engine(config, tables.run_dir)
    sweep = _Sweep(config, engine, tables, work.workloads, work.on_event, work.position, len(work.planned),
                   node_id=work.node_id)
    try:
        if config.engine == "native" and config.synthetic:  # building a 70B at random takes minutes: say so first
            work.on_event(SweepEvent("stage", message=f"building the target {config.target} and drafts "
                                                      f"{', '.join(config.drafts)} with random weights (timing only; "
                                                      f"a large model takes a minute or more)…"))
        message = engine.open()
        engine.annotate(meta)
        work.save_meta()
        work.on_event(SweepEvent("loaded", message=message, index=len(work.planned) - len(work.todo),
                                 total=len(work.planned)))
        for stage in engine.stages(work.todo):
            sweep.run_stage(stage)
            engine.annotate(meta)
            work.save_meta()
        if getattr(engine, "pairing", "") == BRACKETED:
            close_brackets(sweep, work.planned)
        if config.until_decided:
            meta["until_decided"] = add_repeats_until_decided(sweep, work.planned)
    finally:
        engine.close()


class _Sweep:
    """The loop over an engine's stages and turns: warm up, repeats in turns, record."""

    def __init__(self, config: SweepConfig, engine: Engine, tables: SweepTables, workloads: dict[str, Workload],
                 on_event: Callable[[SweepEvent], None], position: dict[str, int], total: int,
                 first_repeat: int = 0, where: dict | None = None, node_id: str = "local") -> None:
        self.config, self.engine, self.tables, self.workloads = config, engine, tables, workloads
        self._where, self.node_id = where, node_id
        self.on_event, self.position, self.total = on_event, position, total
        # > 0: repeats added to cells measured before (--until-decided), numbered from here
        self.first_repeat = first_repeat
        # (workload, temperature, draft, k) -> (context length, batch size) of each out-of-memory cell
        self.out_of_memory_at: dict[tuple, list[tuple[int, int]]] = {}
        self._prompts: dict[str, tuple[list[list[int]], list[str]]] = {}

    @property
    def where(self) -> dict:
        """Where this sweep's cells run (after the engine opened: it knows its versions then)."""
        if self._where is None:
            self._where = where_columns(self.engine, self.node_id)
        return self._where

    def prompts(self, cell: Cell) -> tuple[list[list[int]], list[str]]:
        """The group's prompts (token ids) and their ids: the same for every cell of the group."""
        if cell.group not in self._prompts:
            records = self.workloads[cell.workload].sample(requests_per_cell(self.config, cell.batch_size),
                                                           self.config.seed)
            if cell.context_length:
                records = long_context_records(records, cell.workload, cell.context_length, self.engine.encode,
                                               self.config.seed)
            if self.config.trace:  # one prompt per trace request, at its input length
                from specbench.traces import replay_for

                records = trace_records(replay_for(self.config).requests, self.workloads[cell.workload].records,
                                        cell.workload, self.engine.encode, self.config.seed)
            self._prompts[cell.group] = ([self.engine.encode(r) for r in records], [r.id for r in records])
        return self._prompts[cell.group]

    def skip_reason(self, cell: Cell) -> str | None:
        """Out of memory at a batch size skips the larger ones at that context length and longer."""
        failed = self.out_of_memory_at.get((cell.workload, cell.temperature, cell.draft, cell.k), []) + \
            self.out_of_memory_at.get((cell.workload, cell.temperature, AR, 0), [])
        for context, batch_size in failed:
            if cell.context_length >= context and cell.batch_size >= batch_size:
                where = f" at context length {context}" if context else ""
                return f"out of memory at batch size {batch_size}{where}"
        return None

    def record(self, cell: Cell, outcome: CellOutcome | None = None, error: BaseException | None = None,
               skipped: str | None = None) -> None:
        tables = self.tables
        if self.first_repeat:
            return self.add_repeats(cell, outcome, error or skipped)
        requests: list[dict] = []
        steps: list[dict] = []
        if skipped:
            row = {**_failure_row(cell, "skipped", skipped), **self.where}
            tables.add(row, [], [])
        elif error is not None:  # recorded, and the sweep goes on
            status = self.engine.failure_status(error)
            if status == "oom":
                self.out_of_memory_at.setdefault((cell.workload, cell.temperature, cell.draft, cell.k), []).append(
                    (cell.context_length, cell.batch_size))
            first_line = str(error).splitlines()[0] if str(error) else ""
            row = {**_failure_row(cell, status, f"{type(error).__name__}: {first_line}"), **self.where}
            tables.add(row, [], [])
        else:
            row, requests, steps = outcome.row, outcome.requests, outcome.steps
            row.update(self.where)
            row["context_length"] = cell.context_length
            if not cell.is_speculative:
                pass  # the baseline itself: nothing to compare
            elif self.config.synthetic:
                row["lossless"] = "n/a (synthetic)"
            else:
                verdict, detail = self.lossless(cell, outcome)
                row["lossless"], row["lossless_detail"] = verdict, detail
                if verdict == "MISMATCH":
                    row["status"], row["message"] = "failed", f"lossless check failed: {detail}"
            _pair_with_baseline(tables, cell, row)
            tables.add(row, requests, steps)
        gc.collect()
        self.on_event(SweepEvent("done", cell, row, self.position[cell.id], self.total, requests=requests,
                                 steps=steps))

    def add_repeats(self, cell: Cell, outcome: CellOutcome | None, problem) -> None:
        """A cell's added repeats folded into its row: tokens/s the median of every repeat, its
        requests and steps added; greedy outputs checked against the baseline's of the same repeat.
        A failure keeps what the cell had."""
        if outcome is None:
            self.on_event(SweepEvent("stage", message=f"{cell.id}: the added repeats failed ({problem}); "
                                                      f"the cell keeps its earlier ones"))
            return
        row = self.tables.row(cell.id)
        runs = [float(x) for x in row["tokens_per_s_runs"]] + list(outcome.row["tokens_per_s_runs"])
        row.update(tokens_per_s=float(pd.Series(runs).median()), tokens_per_s_runs=runs, repeats=len(runs),
                   wall_s=float(row.get("wall_s") or 0.0) + float(outcome.row.get("wall_s") or 0.0))
        if outcome.row.get("pairing") == SIDE_BY_SIDE and row.get("pairing") == SIDE_BY_SIDE:
            row["baseline_tokens_per_s_runs"] = runs_list(row["baseline_tokens_per_s_runs"]) + \
                runs_list(outcome.row["baseline_tokens_per_s_runs"])
        if cell.is_speculative and cell.temperature == 0 and not self.config.synthetic:
            verdict, detail = self.lossless(cell, outcome, repeat=self.first_repeat)
            if verdict == "MISMATCH":
                row.update(status="failed", lossless=verdict, lossless_detail=detail,
                           message=f"lossless check failed on an added repeat: {detail}")
        self.tables.replace(row, outcome.requests, outcome.steps)
        self.on_event(SweepEvent("stage", message=f"{cell.id}: {len(runs)} repeats, {row['tokens_per_s']:.1f} tok/s"))

    def lossless(self, cell: Cell, outcome: CellOutcome, repeat: int = 0) -> tuple[str, str]:
        """Greedy: token for token against the baseline. Sampled: `probe` has judged it already."""
        if cell.temperature > 0:
            return outcome.row.get("lossless", "unchecked"), outcome.row.get("lossless_detail", "")
        baseline = self.tables.baseline_requests(cell.baseline_id, repeat)
        if baseline is None:
            return "unchecked", "no baseline cell"
        return self.engine.lossless_check(self.prompts(cell)[0], baseline, outcome)

    def attempt(self, cell: Cell, action):
        """action(), or None after recording the cell as failed. A stage that fails as a whole
        (its server will not start) propagates."""
        try:
            return action()
        except (KeyboardInterrupt, StageFailed):
            raise
        except Exception as error:
            self.record(cell, error=error)
            return None

    def run_stage(self, stage: Stage) -> None:
        """Every turn of a stage. A stage that cannot be set up records its cells as failed; when
        it holds baselines nothing else can be compared, and the sweep stops with that error."""
        try:
            with stage:
                self.on_event(SweepEvent("stage", message=stage.describe()))
                for turn in stage.turns:
                    self.run_turn(stage, turn)
        except StageFailed as error:
            finished = self.tables.finished_ids()
            for cell in stage.cells:
                if cell.id not in finished:
                    self.record(cell, error=error)
            if any(not cell.is_speculative for cell in stage.cells):
                raise
            self.on_event(SweepEvent("stage_failed", message=str(error)))

    def run_turn(self, stage: Stage, turn: list[Cell]) -> None:
        """The turn's cells take turns repeat by repeat; each is recorded after its last repeat
        (and, on Ctrl-C, with the repeats it has: nothing measured is lost)."""
        runs: list[tuple[Cell, CellMeasurement]] = []
        for cell in turn:
            self.on_event(SweepEvent("start", cell, index=self.position[cell.id], total=self.total))
            if self.skip_reason(cell):
                self.record(cell, skipped=self.skip_reason(cell))
                continue
            prompts, prompt_ids = self.prompts(cell)
            run = self.attempt(cell, lambda: stage.measurement(cell, prompts, prompt_ids))
            if run is not None:
                runs.append((cell, run))
        try:
            for repeat in range(self.config.repeats):
                last = repeat == self.config.repeats - 1
                for entry in list(runs):
                    cell, run = entry
                    measured = self.attempt(cell, lambda: (run.warm_up() if repeat == 0 else None,
                                                           run.measure(self.first_repeat + repeat)))
                    if measured is None:
                        runs.remove(entry)
                    elif last:
                        runs.remove(entry)
                        self.finish(cell, run)
        except KeyboardInterrupt:
            runs = [(cell, run) for cell, run in runs if run.throughput_per_repeat]
            raise
        finally:
            for cell, run in runs:
                self.finish(cell, run)

    def finish(self, cell: Cell, run: CellMeasurement) -> None:
        outcome = self.attempt(cell, run.finish)
        if outcome is not None and cell.is_speculative and cell.temperature > 0 and not self.config.synthetic \
                and not self.first_repeat:  # a cell's sampled check judged its first repeats
            if not self.engine.scores_samples:
                outcome.row["lossless"] = "unchecked"
                outcome.row["lossless_detail"] = self.engine.scores_samples_note
            elif self.attempt(cell, lambda: self.probe(cell, run, outcome)) is None:
                return  # recorded as failed
        if outcome is not None:
            self.record(cell, outcome)

    def probe(self, cell: Cell, run: CellMeasurement, outcome: CellOutcome) -> bool:
        """The sampled check of a speculative cell: its measured outputs (every repeat), topped up
        with untimed ones at its settings to PROBE_MIN_TOKENS positions, scored by the target."""
        prompts = self.prompts(cell)[0]
        measured = [list(r["tokens"]) for r in outcome.requests]
        contexts = [prompts[i % len(prompts)] for i in range(len(measured))]
        length = min(PROBE_TOKENS, self.config.max_new_tokens)
        missing = max(0, PROBE_MIN_TOKENS - sum(map(len, measured)))
        extra = [prompts[(len(measured) + i) % len(prompts)] for i in range(math.ceil(missing / length))]
        outputs = measured + (run.sample(extra, length) if extra else [])
        scored = self.engine.score(contexts + extra, outputs)
        config = self.config
        verdict, detail, figures = sampled_check(scored, cell.temperature, config.top_k, config.top_p,
                                                 self.engine.vocab_size)
        outcome.row.update(figures)
        outcome.row["lossless"], outcome.row["lossless_detail"] = verdict, detail
        return True


# --- bracketed served runs ----------------------------------------------------------------------

def close_brackets(sweep: "_Sweep", planned: list[Cell], only: list[Cell] | None = None) -> None:
    """A served run whose baseline server cannot run beside a speculative one: the baselines are
    measured again after the speculative servers (the closing bracket), and each speculative
    cell's speed-up is taken against both brackets, unpaired (fit.noise: the drift between them
    widens its interval). `only`: these speculative cells (default: every one not yet bracketed)."""
    tables = sweep.tables
    by_id = {cell.id: cell for cell in planned}
    ok = set(tables.cells[tables.cells["status"] == "ok"]["cell_id"]) if not tables.cells.empty else set()
    if only is None:
        only = [by_id[c] for c in ok if c in by_id and by_id[c].is_speculative
                and tables.row(c).get("pairing") != BRACKETED]
    speculative = [cell for cell in only if cell.id in ok and cell.baseline_id in ok and cell.baseline_id in by_id]
    baselines = [by_id[c] for c in sorted({cell.baseline_id for cell in speculative}, key=sweep.position.get)]
    if not baselines:
        return
    done = max(int(tables.row(cell.id)["repeats"]) for cell in baselines)
    sweep.on_event(SweepEvent("stage", message=f"closing the bracket: {len(baselines)} baseline cell(s) measured "
                                               f"again after the speculative servers"))
    again = _Sweep(sweep.config, sweep.engine, tables, sweep.workloads, sweep.on_event, sweep.position, sweep.total,
                   first_repeat=done, where=sweep.where)
    again._prompts = sweep._prompts
    for stage in sweep.engine.stages(baselines):
        again.run_stage(stage)
    for cell in speculative:
        row = tables.row(cell.id)
        row["pairing"] = BRACKETED
        _pair_with_baseline(tables, cell, row)
        tables.replace(row, [], [])


# --- repeats until the verdict is decided ------------------------------------------------------

def add_repeats_until_decided(sweep: _Sweep, planned: list[Cell]) -> str:
    """--until-decided: while `check` (every measured batch size, --min-speedup) would say
    inconclusive, measure the cells that leave it open again (the judged draft's and their
    baselines, taking turns), doubling their repeats up to --max-repeats. Returns what happened."""
    from dataclasses import replace

    from specbench.fit import closed_loop
    from specbench.gate import INCONCLUSIVE, evaluate, undecided_cells

    config, tables = sweep.config, sweep.tables
    by_id = {cell.id: cell for cell in planned}
    while True:
        ok = closed_loop(tables.cells[tables.cells["status"] == "ok"])
        sizes = sorted(int(b) for b in ok["batch_size"].unique())
        requests, steps = read_table(tables.run_dir, "requests"), read_table(tables.run_dir, "steps")
        result = evaluate(tables.cells, sizes, config.min_speedup, requests=requests, steps=steps)
        if result.exit_code != INCONCLUSIVE:
            return f"decided: {result.verdict}: {result.message}"
        groups = {by_id[c].group for c in undecided_cells(tables.cells, result.draft, sizes, config.min_speedup,
                                                                requests, steps)
                  if c in by_id}
        chosen = [by_id[c] for c in ok["cell_id"] if c in by_id and by_id[c].group in groups
                  and by_id[c].draft in (AR, result.draft)]
        done = max(int(tables.row(cell.id)["repeats"]) for cell in chosen) if chosen else config.max_repeats
        if done >= config.max_repeats:
            return (f"budget spent: {config.max_repeats} repeats (--max-repeats) and still INCONCLUSIVE: "
                    f"{result.message}")
        extra = min(max(done, 2), config.max_repeats - done)
        sweep.on_event(SweepEvent("stage", message=f"--until-decided: {result.message}; {extra} more repeat(s) of "
                                                   f"{len(chosen)} cells ({', '.join(sorted(groups))})"))
        more = _Sweep(replace(config, repeats=extra), sweep.engine, tables, sweep.workloads, sweep.on_event,
                      sweep.position, sweep.total, first_repeat=done, where=sweep.where)
        more._prompts = sweep._prompts
        for stage in sweep.engine.stages(chosen):
            more.run_stage(stage)
        if getattr(sweep.engine, "pairing", "") == BRACKETED:  # the baselines again, after the speculative cells
            close_brackets(sweep, planned, [cell for cell in chosen if cell.is_speculative])
        for cell in chosen:  # speed-ups again, repeat by repeat over every repeat
            row = tables.row(cell.id)
            if cell.is_speculative and row["status"] == "ok":
                _pair_with_baseline(tables, cell, row)
                tables.replace(row, [], [])

