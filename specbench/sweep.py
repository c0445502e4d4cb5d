"""A sweep: every cell of the grid measured by one engine (native or vLLM), written to a run
directory as it goes, each speculative cell paired with its group's autoregressive baseline and,
when greedy, checked token for token against it.

`run_sweep` is the notebook entry point; the CLI only renders its events.
"""

from __future__ import annotations

import gc
import math
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable

import pandas as pd

from specbench.engines import CellMeasurement, CellOutcome, Engine, Stage, StageFailed, open_engine
from specbench.grid import (  # noqa: F401
    AR, Cell, SweepConfig, VllmOptions, describe_plan, plan_cells, requests_per_cell, split_schedule,
)
from specbench.lossless import PROBE_MIN_TOKENS, PROBE_TOKENS, sampled_check
from specbench.models import lookup_alias, parse_draft_spec, resolve_model
from specbench.results import (
    append_part, hardware_info, merge_parts, new_run_dir, now_iso, read_table, versions, write_json, write_table,
)
from specbench.synthetic import shipped_config
from specbench.workloads import Workload, load_workload, long_context_records


def preflight(config: SweepConfig) -> dict[str, Workload]:
    """Everything checkable without loading weights: grid values, model references, workloads.
    Returns the loaded workloads."""
    config.validate()
    check_context_limit(config)
    workloads = {name: load_workload(name) for name in config.workloads}
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


def check_context_limit(config: SweepConfig) -> None:
    """A one-line error, before anything loads, when the longest prompt asked for plus the new
    tokens (and a step's drafts) would not fit the target's context (registry models: their
    shipped config says how long it is)."""
    try:
        _, shipped = shipped_config(config.target)
    except Exception:
        return  # a model by path: its engine finds out when it loads
    limit = shipped.get("max_position_embeddings")
    longest = max(config.context_lengths, default=0)
    needed = longest + config.max_new_tokens + 2 * max(config.ks, default=0) + 8
    if limit and needed > limit:
        asked = f"--context-lengths {longest} + " if longest else ""
        raise ValueError(f"{asked}--max-new-tokens {config.max_new_tokens} needs {needed} positions; "
                         f"{config.target} has a {limit}-token context")


# --- the sweep ---------------------------------------------------------------------------------

@dataclass
class SweepEvent:
    kind: str  # "loaded" | "stage" | "start" | "done"
    cell: Cell | None = None
    row: dict | None = None
    index: int = 0
    total: int = 0
    message: str = ""


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

    def close(self) -> None:
        merge_parts(self.run_dir)

    def baseline_requests(self, cell_id: str, repeat: int | None = 0) -> list[dict] | None:
        """A finished cell's request rows of one repeat (every repeat with None), in request
        order; None if it has none."""
        rows = [r for r in self._requests.get(cell_id, []) if repeat is None or r["repeat"] == repeat]
        return rows or None


def _pair_with_baseline(tables: SweepTables, cell: Cell, row: dict) -> None:
    """The speed-up over the cell's own group baseline: `speedup` from the medians, and
    `speedup_runs` repeat by repeat (the group's cells take turns, so repeat i of both ran side
    by side); their spread is the measurement noise the gate reports."""
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
    row["baseline_tokens_per_s"] = float(baseline["tokens_per_s"])
    row["speedup"] = row["tokens_per_s"] / row["baseline_tokens_per_s"]
    runs, baseline_runs = list(row["tokens_per_s_runs"]), list(baseline["tokens_per_s_runs"])
    row["speedup_runs"] = [ours / theirs for ours, theirs in zip(runs, baseline_runs)]  # round by round


def _failure_row(cell: Cell, status: str, message: str) -> dict:
    return {"cell_id": cell.id, "status": status, "message": message,
            "mode": "speculative" if cell.is_speculative else AR, "workload": cell.workload, "draft": cell.draft,
            "k": cell.k, "batch_size": cell.batch_size, "temperature": cell.temperature,
            "request_rate": cell.request_rate, "context_length": cell.context_length}


def run_sweep(
    config: SweepConfig,
    results_root: Path = Path("results"),
    resume_dir: Path | None = None,
    on_event: Callable[[SweepEvent], None] = lambda event: None,
) -> Path:
    """Run every cell not already finished; returns the run directory. Ctrl-C stops after
    writing what finished (KeyboardInterrupt propagates)."""
    workloads = preflight(config)
    run_dir = resume_dir or new_run_dir(Path(results_root), config.target)
    tables = SweepTables(run_dir)
    meta = {"config": asdict(config), "plan": describe_plan(config), "started": now_iso(), "status": "running",
            "hardware": hardware_info(), "versions": versions(), "seed": config.seed,
            "synthetic": config.synthetic, "engine": {"name": config.engine}}
    previous = run_dir / "run.json"
    if resume_dir and previous.exists():
        import json

        meta["resumed_from_started"] = json.loads(previous.read_text()).get("started")
    write_json(run_dir / "run.json", meta)

    engine = open_engine(config, run_dir)
    cells = plan_cells(config)
    position = {cell.id: index for index, cell in enumerate(cells)}
    done = tables.finished_ids()
    sweep = _Sweep(config, engine, tables, workloads, on_event, position, len(cells))
    try:
        message = engine.open()
        engine.annotate(meta)
        write_json(run_dir / "run.json", meta)
        on_event(SweepEvent("loaded", message=message, index=len(done), total=len(cells)))
        for stage in engine.stages([cell for cell in cells if cell.id not in done]):
            sweep.run_stage(stage)
            engine.annotate(meta)
            write_json(run_dir / "run.json", meta)
        meta["status"] = "complete"
    except KeyboardInterrupt:
        meta["status"] = "interrupted"
        raise
    except Exception as error:
        meta["status"] = "failed"
        meta["error"] = (str(error).splitlines() or [type(error).__name__])[0]
        raise
    finally:
        engine.close()
        tables.close()
        meta["finished"] = now_iso()
        write_json(run_dir / "run.json", meta)
    return run_dir


class _Sweep:
    """The loop over an engine's stages and turns: warm up, repeats in turns, record."""

    def __init__(self, config: SweepConfig, engine: Engine, tables: SweepTables, workloads: dict[str, Workload],
                 on_event: Callable[[SweepEvent], None], position: dict[str, int], total: int) -> None:
        self.config, self.engine, self.tables, self.workloads = config, engine, tables, workloads
        self.on_event, self.position, self.total = on_event, position, total
        # (workload, temperature, draft, k) -> (context length, batch size) of each out-of-memory cell
        self.out_of_memory_at: dict[tuple, list[tuple[int, int]]] = {}
        self._prompts: dict[str, tuple[list[list[int]], list[str]]] = {}

    def prompts(self, cell: Cell) -> tuple[list[list[int]], list[str]]:
        """The group's prompts (token ids) and their ids: the same for every cell of the group."""
        if cell.group not in self._prompts:
            records = self.workloads[cell.workload].sample(requests_per_cell(self.config, cell.batch_size),
                                                           self.config.seed)
            if cell.context_length:
                records = long_context_records(records, cell.workload, cell.context_length, self.engine.encode,
                                               self.config.seed)
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
        if skipped:
            row = _failure_row(cell, "skipped", skipped)
            tables.add(row, [], [])
        elif error is not None:  # recorded, and the sweep goes on
            status = self.engine.failure_status(error)
            if status == "oom":
                self.out_of_memory_at.setdefault((cell.workload, cell.temperature, cell.draft, cell.k), []).append(
                    (cell.context_length, cell.batch_size))
            first_line = str(error).splitlines()[0] if str(error) else ""
            row = _failure_row(cell, status, f"{type(error).__name__}: {first_line}")
            tables.add(row, [], [])
        else:
            row = outcome.row
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
            tables.add(row, outcome.requests, outcome.steps)
        gc.collect()
        self.on_event(SweepEvent("done", cell, row, self.position[cell.id], self.total))

    def lossless(self, cell: Cell, outcome: CellOutcome) -> tuple[str, str]:
        """Greedy: token for token against the baseline. Sampled: `probe` has judged it already."""
        if cell.temperature > 0:
            return outcome.row.get("lossless", "unchecked"), outcome.row.get("lossless_detail", "")
        baseline = self.tables.baseline_requests(cell.baseline_id)
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
                                                           run.measure(repeat)))
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
        if outcome is not None and cell.is_speculative and cell.temperature > 0 and not self.config.synthetic:
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
