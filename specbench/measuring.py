"""The measuring loop: an engine's stages and turns, each cell warmed up, measured repeat by repeat,
paired with its group's baseline, checked for losslessness, and written to the run's tables as it
finishes.

Executors call `measure_here` with a `SweepWork` (the cells left to measure and where each finished
one goes); they never see the sweep that planned them. `sweep.run_sweep` plans, opens the run
directory and hands the work to an executor.
"""

from __future__ import annotations

import gc
import importlib
import math
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path
from typing import Callable

import pandas as pd

from specbench.engines import CellMeasurement, CellOutcome, Engine, Stage, StageFailed
from specbench.grid import AR, Cell, SweepConfig, requests_per_cell, with_setting
from specbench.lossless import PROBE_MIN_TOKENS, PROBE_TOKENS, sampled_check
from specbench.results import COPIES, append_part, merge_parts, read_table, write_table
from specbench.schema import BRACKETED, SIDE_BY_SIDE, grid_columns, runs_list
from specbench.traces import Replay
from specbench.where import where_columns
from specbench.workloads import Workload, long_context_records, trace_records


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


def pair_with_baseline(tables: SweepTables, cell: Cell, row: dict) -> None:
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
    node_id: str = "local"  # the cluster node measuring them (where.py: a column of every row)
    # after every stage, in this process: repeats added until a verdict is decided (the sweep's
    # --until-decided, which judges with gate); returns the note run.json keeps
    more_repeats: Callable[["CellLoop", list[Cell]], str] | None = None
    replay: Replay | None = None  # a trace sweep's requests, built once by the sweep's preflight

    @cached_property
    def position(self) -> dict[str, int]:
        return {cell.id: index for index, cell in enumerate(self.planned)}


# The engines by --engine name (grid.ENGINES): the module, the class and its own checks of a config.
# Only the chosen one is imported (the native engine's module loads torch; vLLM's and an endpoint's
# do not need it). Adding an engine: a name in grid.ENGINES, a line here, its module.
ENGINES = {"native": ("specbench.native.runner", "NativeEngine", "validate_native"),
           "vllm": ("specbench.served.vllm_engine", "VllmEngine", "validate_vllm"),
           "endpoint": ("specbench.served.endpoint", "EndpointEngine", "validate_endpoint")}


def check_engine(config: SweepConfig) -> None:
    """The chosen engine's own checks of a config (one-line ValueErrors), before anything loads."""
    module, _, check = ENGINES[config.engine.name]
    getattr(importlib.import_module(module), check)(config)


def open_engine(config: SweepConfig, run_dir: Path, replay: Replay | None = None) -> Engine:
    """The chosen engine, its implementation imported only now."""
    module, name, _ = ENGINES[config.engine.name]
    return getattr(importlib.import_module(module), name)(config, run_dir, replay)


def measure_here(work: SweepWork) -> None:
    """The cells measured in this process, one engine: its stages in turn (bracketed served runs
    closed after), then --until-decided's added repeats."""
    config, tables, meta = work.config, work.tables, work.meta
    engine = open_engine(config, tables.run_dir, work.replay)
    loop = CellLoop(config, engine, tables, work.workloads, work.on_event, work.position, len(work.planned),
                    node_id=work.node_id, replay=work.replay)
    try:
        # building a 70B at random takes minutes: say so first
        if config.engine.name == "native" and config.grid.synthetic:
            work.on_event(SweepEvent("stage", message=f"building the target {config.grid.target} and drafts "
                                                      f"{', '.join(config.grid.drafts)} with random weights (timing "
                                                      f"only; a large model takes a minute or more)…"))
        message = engine.open()
        engine.annotate(meta)
        work.save_meta()
        work.on_event(SweepEvent("loaded", message=message, index=len(work.planned) - len(work.todo),
                                 total=len(work.planned)))
        for stage in engine.stages(work.todo):
            loop.run_stage(stage)
            engine.annotate(meta)
            work.save_meta()
        if getattr(engine, "pairing", "") == BRACKETED:
            close_brackets(loop, work.planned)
        if work.more_repeats is not None:  # --until-decided: the sweep's judge decides what to measure again
            meta["until_decided"] = work.more_repeats(loop, work.planned)
    finally:
        engine.close()


class CellLoop:
    """The loop over an engine's stages and turns: warm up, repeats in turns, record."""

    def __init__(self, config: SweepConfig, engine: Engine, tables: SweepTables, workloads: dict[str, Workload],
                 on_event: Callable[[SweepEvent], None], position: dict[str, int], total: int,
                 first_repeat: int = 0, where: dict | None = None, node_id: str = "local",
                 replay: Replay | None = None) -> None:
        self.config, self.engine, self.tables, self.workloads = config, engine, tables, workloads
        self.replay = replay
        self._where, self.node_id = where, node_id
        self.on_event, self.position, self.total = on_event, position, total
        # > 0: repeats added to cells measured before (--until-decided), numbered from here
        self.first_repeat = first_repeat
        # (workload, temperature, draft, k) -> (context length, batch size) of each out-of-memory cell
        self.out_of_memory_at: dict[tuple, list[tuple[int, int]]] = {}
        self._prompts: dict[str, tuple[list[list[int]], list[str]]] = {}

    def again(self, first_repeat: int, repeats: int | None = None) -> "CellLoop":
        """A loop measuring more repeats of cells this one measured, numbered from `first_repeat`
        (`repeats` of them; default the sweep's): same engine, tables, prompts and replay."""
        config = self.config if repeats is None else with_setting(self.config, "grid.repeats", repeats)
        loop = CellLoop(config, self.engine, self.tables, self.workloads, self.on_event, self.position, self.total,
                        first_repeat=first_repeat, where=self.where, node_id=self.node_id, replay=self.replay)
        loop._prompts = self._prompts
        return loop

    @property
    def where(self) -> dict:
        """Where this sweep's cells run (after the engine opened: it knows its versions then)."""
        if self._where is None:
            self._where = where_columns(self.engine, self.node_id)
        return self._where

    def prompts(self, cell: Cell) -> tuple[list[list[int]], list[str]]:
        """The group's prompts (token ids) and their ids: the same for every cell of the group."""
        if cell.group not in self._prompts:
            records = self.workloads[cell.workload].sample(requests_per_cell(self.config, cell.batch_size, self.replay),
                                                           self.config.grid.seed)
            if cell.context_length:
                records = long_context_records(records, cell.workload, cell.context_length, self.engine.encode,
                                               self.config.grid.seed)
            if self.replay is not None:  # one prompt per trace request, at its input length
                records = trace_records(self.replay.requests, self.workloads[cell.workload].records,
                                        cell.workload, self.engine.encode, self.config.grid.seed)
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
            row = {**grid_columns(cell, "skipped", skipped), **self.where}
            tables.add(row, [], [])
        elif error is not None:  # recorded, and the sweep goes on
            status = self.engine.failure_status(error)
            if status == "oom":
                self.out_of_memory_at.setdefault((cell.workload, cell.temperature, cell.draft, cell.k), []).append(
                    (cell.context_length, cell.batch_size))
            first_line = str(error).splitlines()[0] if str(error) else ""
            row = {**grid_columns(cell, status, f"{type(error).__name__}: {first_line}"), **self.where}
            tables.add(row, [], [])
        else:
            row, requests, steps = outcome.row, outcome.requests, outcome.steps
            row.update(self.where)
            row["context_length"] = cell.context_length
            if not cell.is_speculative:
                pass  # the baseline itself: nothing to compare
            elif self.config.grid.synthetic:
                row["lossless"] = "n/a (synthetic)"
            else:
                verdict, detail = self.lossless(cell, outcome)
                row["lossless"], row["lossless_detail"] = verdict, detail
                if verdict == "MISMATCH":
                    row["status"], row["message"] = "failed", f"lossless check failed: {detail}"
            pair_with_baseline(tables, cell, row)
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
        if cell.is_speculative and cell.temperature == 0 and not self.config.grid.synthetic:
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
            for repeat in range(self.config.grid.repeats):
                last = repeat == self.config.grid.repeats - 1
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
        if outcome is not None and cell.is_speculative and cell.temperature > 0 and not self.config.grid.synthetic \
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
        length = min(PROBE_TOKENS, self.config.grid.max_new_tokens)
        missing = max(0, PROBE_MIN_TOKENS - sum(map(len, measured)))
        extra = [prompts[(len(measured) + i) % len(prompts)] for i in range(math.ceil(missing / length))]
        outputs = measured + (run.sample(extra, length) if extra else [])
        scored = self.engine.score(contexts + extra, outputs)
        config = self.config
        verdict, detail, figures = sampled_check(scored, cell.temperature, config.grid.top_k, config.grid.top_p,
                                                 self.engine.vocab_size)
        outcome.row.update(figures)
        outcome.row["lossless"], outcome.row["lossless_detail"] = verdict, detail
        return True


# --- bracketed served runs ----------------------------------------------------------------------

def close_brackets(sweep: "CellLoop", planned: list[Cell], only: list[Cell] | None = None) -> None:
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
    again = sweep.again(first_repeat=done)
    for stage in sweep.engine.stages(baselines):
        again.run_stage(stage)
    for cell in speculative:
        row = tables.row(cell.id)
        row["pairing"] = BRACKETED
        pair_with_baseline(tables, cell, row)
        tables.replace(row, [], [])
