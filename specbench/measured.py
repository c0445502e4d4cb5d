"""What specbench measured, shipped as data (specbench/data/), and where each figure comes from.

- `measured.json`: each constant the planner and the simulator price with (the host's time a step,
  the executor's, the API server's, a launch without CUDA graphs, graph pieces, a burst's spacing)
  with its unit, and the findings docstrings cite by name; each with the committed result (`source`),
  date, machine and command that measured it.
- `validation.json`: the validation figures a plan prints (the simulator against NVIDIA's measured
  rows, against vLLM CPU replays, speculation's direction by the size of its effect). The commands
  that compute them write them here (`write_validation`), so a plan says what the last run found."""

from __future__ import annotations

import json
import math
from datetime import date
from functools import cache
from importlib import resources
from pathlib import Path

# what each entry says of where it was measured; a constant also has its value and unit
WHERE_FIELDS = ("what", "source", "date", "machine", "command")
CONSTANT_FIELDS = ("value", "unit", *WHERE_FIELDS)
# the source tree's copy, which the validation commands write (they run from a checkout)
VALIDATION_PATH = Path(__file__).parent / "data" / "validation.json"


@cache
def _read(name: str) -> dict:
    return json.loads(resources.files("specbench").joinpath("data", name).read_text())


def constants() -> dict[str, dict]:
    return _read("measured.json")["constants"]


def findings() -> dict[str, dict]:
    return _read("measured.json")["findings"]


def value(name: str):
    """A measured constant's value in its unit: a number, or a dict of a fit's terms."""
    found = constants()[name]["value"]
    return dict(found) if isinstance(found, dict) else found


def described(name: str) -> str:
    """Where a constant was measured, as --json says it: 'what it is (specbench's source)'."""
    entry = constants()[name]
    return f"{entry['what']} (specbench's {entry['source']})"


def validation(section: str) -> dict:
    """One section of validation.json: "silicon", "silicon_moe", "replay" or "direction_by_effect"."""
    return _read("validation.json")[section]


def _rounded(x: float) -> float:
    return round(float(x), 3)  # a tenth of a per cent, as a plan prints them


def _simulated(table):
    """The rows a silicon check simulated (`not_simulated` empty)."""
    return table[table["not_simulated"].isna() | (table["not_simulated"] == "")]


def _error_figures(rows) -> dict:
    """Simulated rows, and the median |error| and signed median of their mean TPOT and TTFT."""
    errors = {metric: rows[f"sim_{metric}_error"] for metric in ("tpot", "ttft")}
    return {"rows": len(rows), **{f"{metric}_median_abs": _rounded(errors[metric].abs().median()) for metric in errors},
            **{f"{metric}_median": _rounded(errors[metric].median()) for metric in errors}}


def silicon_figures(table) -> dict:
    """The silicon check from silicon.py's rows (silicon.csv): per GPU, and per GPU and TP, the
    simulated rows and the median |error| and signed median of their mean TPOT and TTFT."""
    done = _simulated(table)
    return {"by_system": {system: _error_figures(rows) for system, rows in done.groupby("system")},
            "by_system_tp": {system: {str(tp): _error_figures(at) for tp, at in rows.groupby("tp")}
                             for system, rows in done.groupby("system")}}


def silicon_moe_figures(table) -> dict:
    """The mixture-of-experts silicon check from silicon_moe.py's rows (silicon_moe.csv): per GPU,
    and per GPU and model (by its alias), the simulated rows and the median |error| and signed
    median of their mean TPOT and TTFT; and the rows not simulated."""
    from specbench.models import lookup_alias

    done = _simulated(table)
    alias = lambda hub: (lookup_alias(hub) or lookup_alias(hub.removesuffix("-FP8"))).alias  # noqa: E731
    return {"by_system": {system: _error_figures(rows) for system, rows in done.groupby("system")},
            "by_system_model": {system: {alias(model): _error_figures(at) for model, at in rows.groupby("model")}
                                for system, rows in done.groupby("system")},
            "not_simulated": int(len(table) - len(done))}


def replay_figures(table) -> dict:
    """The replay check from cpu_replays.py's cells (cpu_replays.csv), predicted with the
    calibration's acceptance: median |error| of p50 TTFT, TPOT and E2E, and the signs of
    speculation's effect predicted right."""
    metrics = ("ttft", "tpot", "e2e")
    signs = table[[f"{metric}_sign_right_calibration" for metric in metrics]]
    return {"cells": len(table),
            **{f"{metric}_median_abs": _rounded(table[f"{metric}_error_calibration"].abs().median())
               for metric in metrics},
            "signs_right": int(signs.sum().sum()), "signs": int(signs.notna().sum().sum())}


def direction_figures(bands: list[tuple[float, int, int]]) -> dict:
    """decided_signs.py's bands of |predicted effect|, each (upper bound, right, predictions); the
    last band's bound, infinite, is written as null."""
    return {"bands": [{"below": None if math.isinf(below) else below, "right": int(right),
                       "predictions": int(predictions)} for below, right, predictions in bands]}


def write_validation(section: str, figures: dict, *, what: str, source: str, machine: str, command: str,
                     when: str | None = None, path: Path = VALIDATION_PATH) -> None:
    """Put one section's figures, and where they come from, into validation.json (the others kept).
    Figures a rerun reproduces keep the date they were first computed, so the file changes only
    when they do."""
    found = json.loads(path.read_text()) if path.exists() else {}
    before = found.get(section, {})
    if when is None:
        same = all(before.get(key) == value for key, value in figures.items()) and before.get("source") == source
        when = before["date"] if same and "date" in before else date.today().isoformat()
    found[section] = {"what": what, "source": source, "date": when, "machine": machine, "command": command,
                      **figures}
    path.write_text(json.dumps(found, indent=2, ensure_ascii=False) + "\n")
    _read.cache_clear()
