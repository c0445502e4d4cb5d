"""Where a sweep's cells run, behind one interface (after AIPerf's RunExecutor): the sweep hands an
executor its cells left to measure and a run directory's tables, and gets every finished cell
written there, whichever executor measured it.

- `local` (the default): this process, one engine, stage after stage.
- `ray`: a Ray cluster. Cells are split into pairing groups (speculative cells plus the baseline
  they are compared with), each measured on one node, so that every speed-up is taken against a
  baseline measured beside it on the same hardware (executors.ray_cluster).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from specbench.grid import SweepConfig
    from specbench.measuring import SweepWork

EXECUTORS = ("local", "ray")
RAY_INSTALL = "pip install 'specbench[ray]'"


class Executor(ABC):
    def preflight(self) -> None:
        """One-line errors (ValueError) for what can be checked before the run directory is written:
        a cluster that cannot be reached."""

    @abstractmethod
    def run(self, work: "SweepWork") -> None:
        """Measure work.todo, adding every finished cell to work.tables as it finishes and telling
        work.on_event; KeyboardInterrupt (Ctrl-C, SIGTERM) propagates once what finished is saved."""


class LocalExecutor(Executor):
    """Every cell in this process, as specbench has always measured them."""

    def run(self, work: "SweepWork") -> None:
        from specbench.measuring import measure_here

        measure_here(work)


def validate_executor(config: "SweepConfig") -> None:
    """One-line errors for --executor and what it cannot do."""
    if config.executor.name not in EXECUTORS:
        raise ValueError(f"--executor must be one of {', '.join(EXECUTORS)}, got {config.executor.name!r}")
    if config.executor.ray_address and config.executor.name != "ray":
        raise ValueError("--ray-address needs --executor ray")
    if config.executor.name != "ray":
        return
    if config.engine.name == "endpoint":
        raise ValueError("--executor ray places engines on a cluster's nodes; an --endpoint is already running "
                         "somewhere: leave out --executor")
    if config.gate.until_decided:
        raise ValueError("--until-decided adds repeats on the local executor only: leave out --executor ray, or "
                         "give the cluster run more --repeats")
    import importlib.util

    if importlib.util.find_spec("ray") is None:
        raise ValueError(f"--executor ray needs Ray: {RAY_INSTALL}")


def open_executor(config: "SweepConfig") -> Executor:
    if config.executor.name == "ray":
        from specbench.executors.ray_cluster import RayExecutor

        return RayExecutor(config.executor.ray_address)
    return LocalExecutor()
