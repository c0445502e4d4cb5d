"""What specbench answers on every committed run, to show that a refactor changed no behaviour
(issue 38): `check`'s exit code and text, `report`'s exit code and text (its answer sentence, tables,
warnings and verdicts; the charts are drawn but not compared) and `plan --json`'s figures.

    python benchmarks/floors/behaviour.py snapshot benchmarks/floors/behaviour_before.json
    python benchmarks/floors/behaviour.py compare benchmarks/floors/behaviour_before.json \
        benchmarks/floors/behaviour_after.json

`compare` prints every difference and exits 1 if there is one. Timings (`seconds`, "priced in")
and the temporary report directory are left out of the comparison: they differ between two runs
of the same code.
"""

from __future__ import annotations

import json
import os
import re
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
VOLATILE = [
    (re.compile(r"\d+(\.\d+)? s\b"), "<s>"),  # "priced in 1.2 s", "(17 s)"
    (re.compile(r"/tmp/[^\s'\"]+"), "<tmp>"),
]


def committed_runs() -> list[Path]:
    return sorted(path.parent for folder in ("benchmarks", "tests/fixtures") for path in (ROOT / folder).rglob("run.json")
                  if (path.parent / "cells.parquet").exists())


def _clean(text: str) -> str:
    for pattern, replacement in VOLATILE:
        text = pattern.sub(replacement, text)
    return text


def _plan_figures(output: str) -> object:
    try:
        plan = json.loads(output)
    except ValueError:
        return _clean(output)
    plan.pop("seconds", None)
    return plan


def snapshot(out: Path) -> None:
    from typer.testing import CliRunner

    from specbench.cli import app

    runner = CliRunner()
    os.chdir(ROOT)  # runs named relative to the checkout, as a user names them: the text then
    answers: dict[str, dict] = {}  # holds no absolute path, and two checkouts compare
    started = time.perf_counter()
    for run in committed_runs():
        name = str(run.relative_to(ROOT))
        with tempfile.TemporaryDirectory() as scratch:
            check = runner.invoke(app, ["check", name])
            report = runner.invoke(app, ["report", name, "--output", str(Path(scratch) / "report")])
            plan = runner.invoke(app, ["plan", name, "--json"])
        answers[name] = {
            "check": {"exit": check.exit_code, "text": _clean(check.output)},
            "report": {"exit": report.exit_code, "text": _clean(report.output)},
            "plan": {"exit": plan.exit_code, "figures": _plan_figures(plan.output)},
        }
        print(f"{name}: check {check.exit_code}, report {report.exit_code}, plan {plan.exit_code}", flush=True)
    out.write_text(json.dumps(answers, indent=1, sort_keys=True) + "\n")
    print(f"{len(answers)} runs in {time.perf_counter() - started:.0f} s -> {out}")


def _differences(before: object, after: object, where: str) -> list[str]:
    if isinstance(before, dict) and isinstance(after, dict):
        found = []
        for key in sorted(set(before) | set(after)):
            if key not in before or key not in after:
                found.append(f"{where}/{key}: only {'after' if key not in before else 'before'}")
            else:
                found += _differences(before[key], after[key], f"{where}/{key}")
        return found
    if isinstance(before, list) and isinstance(after, list) and len(before) == len(after):
        return [line for i, (b, a) in enumerate(zip(before, after)) for line in _differences(b, a, f"{where}[{i}]")]
    if before != after:
        if isinstance(before, str) and isinstance(after, str):
            lines_before, lines_after = before.splitlines(), after.splitlines()
            changed = [f"    - {b}\n    + {a}" for b, a in zip(lines_before, lines_after) if b != a]
            if len(lines_before) != len(lines_after):
                changed.append(f"    ({len(lines_before)} lines before, {len(lines_after)} after)")
            return [f"{where}:\n" + "\n".join(changed[:6])]
        return [f"{where}: {before!r} -> {after!r}"]
    return []


def compare(before_path: Path, after_path: Path) -> int:
    before, after = json.loads(before_path.read_text()), json.loads(after_path.read_text())
    found = _differences(before, after, "")
    for line in found:
        print(line)
    print(f"{len(before)} runs before, {len(after)} after: "
          f"{'no difference' if not found else f'{len(found)} differences'}")
    return 1 if found else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "snapshot":
        snapshot(Path(sys.argv[2]))
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(Path(sys.argv[2]), Path(sys.argv[3])))
    else:
        sys.exit(__doc__)
