"""How long `specbench --help`, `check` and `plan` on a committed run take to start and answer, and
whether they import torch or matplotlib (issue 38: the judge's commands should load neither).
Each command runs REPEATS times in a fresh process against the checkout given (default: this one);
the median wall time is printed.

    python benchmarks/floors/startup.py [CHECKOUT]
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPEATS = 5
RUN = "tests/fixtures/gpu/h100-2026-11-23/synthetic-llama3-8b-1b-graphs"
COMMANDS = {"specbench --help": ["--help"], f"specbench check {RUN}": ["check", RUN],
            f"specbench plan {RUN}": ["plan", RUN]}
PROBE = ("import sys, atexit, runpy; sys.argv = ['specbench', *sys.argv[1:]]; "
         "atexit.register(lambda: sys.stderr.write('LOADED ' + ' '.join(m for m in ('torch', 'matplotlib') "
         "if m in sys.modules) + '\\n')); runpy.run_module('specbench.cli', run_name='__main__')")


def measure(checkout: Path) -> None:
    env = {**os.environ, "PYTHONPATH": str(checkout)}
    print(f"| command ({checkout}) | median wall s over {REPEATS} | imports |\n|---|---|---|")
    for label, args in COMMANDS.items():
        times, loaded = [], ""
        for _ in range(REPEATS):
            started = time.perf_counter()
            done = subprocess.run([sys.executable, "-c", PROBE, *args], cwd=checkout, env=env, capture_output=True,
                                  text=True)
            times.append(time.perf_counter() - started)
            loaded = next((line[7:] for line in done.stderr.splitlines() if line.startswith("LOADED")), "?")
        print(f"| `{label}` | {statistics.median(times):.2f} | {loaded.strip() or 'neither torch nor matplotlib'} |")


if __name__ == "__main__":
    measure(Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]).resolve())
