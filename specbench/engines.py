"""What the sweep asks of an engine, and what it gets back.

An engine measures cells. It groups them into stages, each run under one setup (the native engine
loads its models once for every cell; the vLLM engine starts one server per speculative
configuration), and inside a stage into turns: cells that take turns repeat by repeat, so that slow
drift of the machine hits a baseline and its speculative cells alike. A cell's measurement warms
up (excluded from every figure), measures repeats, and finishes into a CellOutcome: one row of the
cells table and its rows of the requests and steps tables, in the same columns whichever engine
ran. Sweep, fit, report, check and plan read those tables and nothing engine-specific.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from specbench.grid import Cell, SweepConfig
from specbench.lossless import ScoredToken
from specbench.traces import Replay


@dataclass
class CellOutcome:
    row: dict
    requests: list[dict]
    steps: list[dict]  # empty on engines without step-level detail
    outputs: list[list[int]]  # generated tokens of repeat 0, request order


class CellMeasurement(Protocol):
    throughput_per_repeat: list[float]

    def warm_up(self) -> None: ...

    def measure(self, repeat: int) -> None: ...

    def finish(self) -> CellOutcome: ...

    def sample(self, prompts: list[list[int]], max_tokens: int) -> list[list[int]]:
        """Outputs at the cell's settings, untimed (the sampled lossless check's probe)."""
        ...


class StageFailed(RuntimeError):
    """A stage's setup failed (a server that does not start): its cells are recorded as failed."""


class Stage(ABC):
    """Cells measured under one setup. Entering it sets that up (loads, starts a server), leaving
    it tears that down, whatever happened in between."""

    def __init__(self, label: str, turns: list[list[Cell]]) -> None:
        self.label = label
        self.turns = turns

    @property
    def cells(self) -> list[Cell]:
        return [cell for turn in self.turns for cell in turn]

    def __enter__(self) -> "Stage":
        return self

    def __exit__(self, *exc) -> None:
        return None

    def describe(self) -> str:
        """A line for the console once the stage is set up."""
        return self.label

    @abstractmethod
    def measurement(self, cell: Cell, prompts: list[list[int]], prompt_ids: list[str]) -> CellMeasurement: ...


class Engine(ABC):
    name: str
    scores_samples = True  # the sampled check can score outputs with the target
    scores_samples_note = ""  # why not, when it cannot

    def __init__(self, config: SweepConfig, run_dir: Path, replay: Replay | None = None) -> None:
        self.config = config
        self.run_dir = run_dir  # where the run's tables (and a served engine's server logs) go
        self.replay = replay  # a trace sweep's requests (grid.build_replay), None otherwise

    @abstractmethod
    def open(self) -> str:
        """Load what every cell needs (models or a tokenizer); returns a line saying what loaded."""

    def close(self) -> None:
        return None

    @abstractmethod
    def encode(self, record) -> list[int]:
        """A workload record's prompt as the token ids every cell of its group is given."""

    @abstractmethod
    def stages(self, cells: list[Cell]) -> list[Stage]: ...

    @abstractmethod
    def lossless_check(self, prompts: list[list[int]], baseline: list[dict], outcome: CellOutcome) -> tuple[str, str]:
        """("exact" | "near-tie" | "MISMATCH", detail) of a greedy speculative cell against the
        repeat-0 request rows of its baseline."""

    @abstractmethod
    def score(self, prompts: list[list[int]], outputs: list[list[int]]) -> list[list[ScoredToken]]:
        """Each generated token as the target sees it after its prompt and the tokens before it
        (rank, raw log-probability, the top-20 raw log-probabilities): the sampled check's data."""

    @property
    @abstractmethod
    def vocab_size(self) -> int: ...

    def annotate(self, meta: dict) -> None:
        """Add what the engine knows to run.json's dict: at least meta["engine"]["name"]."""
        meta["engine"] = {"name": self.name}

    def failure_status(self, error: BaseException) -> str:
        """"oom" (the sweep skips larger batches of that configuration) or "failed"."""
        text = str(error).lower()
        return "oom" if "out of memory" in text or "can't allocate memory" in text else "failed"
