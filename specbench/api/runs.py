"""Picking a run's cells (one kind of hardware, one context length) and making a verdict's advice
runnable as printed, for the gate and the report alike."""

from __future__ import annotations

from specbench.api.errors import UsageError


def on_hardware(run, hardware: str | None):
    """The run's cells on one kind of hardware: a speed-up is never taken across two (fit.nodes).
    A run on several kinds needs --hardware; one on a single kind is returned as it is."""
    from specbench.fit.nodes import hardware_kinds

    kinds = hardware_kinds(run.cells)
    if hardware is None:
        if len(kinds) > 1:
            raise UsageError(f"the run's cells ran on {len(kinds)} kinds of hardware ({'; '.join(kinds)}): no speed-up "
                             f"is taken across two; pass --hardware to pick one")
        return run
    chosen = [kind for kind in kinds if hardware.lower() in kind.lower()]
    if len(chosen) != 1:
        raise UsageError(f"--hardware {hardware}: the run's cells ran on {'; '.join(kinds) or 'unrecorded hardware'}"
                         + (" (it names several)" if chosen else ""))
    return keep_cells(run, run.cells[run.cells["gpu_model"] == chosen[0]])


def keep_cells(run, chosen):
    """The run with only the `chosen` cells, and their requests, steps and baseline copies."""
    from dataclasses import replace

    keep = set(chosen["cell_id"])
    pick = lambda frame: frame[frame["cell_id"].isin(keep)] if frame is not None and not frame.empty else frame  # noqa: E731
    return replace(run, cells=chosen, requests=pick(run.requests), steps=pick(run.steps),
                   baseline_copies=pick(run.baseline_copies))


def at_context(run, length: int):
    """The run with only its cells (and their requests and steps) at one context length."""
    from specbench.fit import with_context

    cells = with_context(run.cells)
    chosen = cells[cells["context_length"] == length]
    if chosen.empty:
        measured = sorted(int(c) for c in cells["context_length"].unique())
        raise UsageError(f"--context-length {length}: the run measured context lengths "
                         f"{', '.join(str(c) if c else '0 (the prompts as they are)' for c in measured)}")
    return keep_cells(run, chosen)


def measured_batch_sizes(cells) -> list[int]:
    """Batch sizes with at least one finished cell, ascending."""
    if cells.empty or "batch_size" not in cells:
        return []
    from specbench.fit import closed_loop

    ok = closed_loop(cells[cells["status"] == "ok"] if "status" in cells else cells)
    return sorted(int(b) for b in ok["batch_size"].dropna().unique())


def runnable_advice(result, run) -> None:
    """A verdict's advice made runnable as printed: the run's own path for RUN, and where
    --until-decided already spent its budget, a bigger budget instead of the same again."""
    from specbench.results import recorded_config

    result.advice = result.advice.replace("--output RUN", f"--output {run.path}")
    if str(run.meta.get("until_decided") or "").startswith("budget spent") and "--until-decided" in result.advice:
        max_repeats = recorded_config(run.meta)["gate"].get("max_repeats", "?")
        result.advice = (f"--until-decided already spent its budget here ({max_repeats} repeats): "
                         f"`specbench sweep --resume --output {run.path} --until-decided --max-repeats "
                         f"{2 * max_repeats if isinstance(max_repeats, int) else 'N'}` adds more, or "
                         "a --min-speedup margin decides a speed-up that sits on the bar")
