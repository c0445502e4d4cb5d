"""The figures the field reports, defined once for every engine.

Definitions (compatible with vLLM's spec-decode metrics and the load tools' latency metrics):
- TTFT: request start (the batch's prefill start) to its first emitted token.
- ITL: gaps between consecutive emitted tokens of a request. Tokens that one speculative step
  emits together arrive together, so ITL has zeros in it: that burstiness is real and kept.
- TPOT: (e2e - TTFT) / (tokens - 1). e2e: request start to its last token.
- alpha (acceptance rate): accepted draft tokens / drafted tokens.
- tau (acceptance length): tokens emitted per target forward = 1 + accepted / verify steps,
  counted per row (vLLM's "mean acceptance length").
- acceptance at draft position i: steps whose i-th draft was accepted / steps that drafted an
  i-th token.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from typing import Callable

RAY_TASK_TITLE = "ray::measure_group"  # a Ray worker's process title while it runs a pairing group


def _children(process) -> list:
    import psutil

    try:
        return process.children(recursive=True)
    except psutil.Error:
        return []


class OwnCpu:
    """The CPU this process and every process it started (a server's engine and workers) use while
    the block runs, in cores (CPU seconds per wall second), summed over every time it is entered:
    what specbench itself adds to the machine's load average. In a Ray task (--executor ray) the
    other specbench tasks on this machine count too: they run on cores of their own."""

    def __init__(self) -> None:
        self.cpu_s = 0.0
        self.wall_s = 0.0
        self.machine_cpu_s = 0.0  # every process's on this machine, ours included
        self._start: tuple[float, dict[int, float], float] | None = None

    @staticmethod
    def _machine_cpu_s() -> float:
        import psutil

        times = psutil.cpu_times()
        return sum(times) - times.idle - getattr(times, "iowait", 0.0)

    @staticmethod
    def _cpu_by_pid() -> dict[int, float]:
        import psutil

        me = psutil.Process()
        roots = [me]
        if " ".join(me.cmdline()[:1]).startswith(RAY_TASK_TITLE):  # the groups measured beside this one
            roots += [p for p in psutil.process_iter(["cmdline"]) if p.pid != me.pid
                      and " ".join(p.info["cmdline"] or [])[:len(RAY_TASK_TITLE)] == RAY_TASK_TITLE]
        found = {}
        for process in [tree for root in roots for tree in [root] + _children(root)]:
            try:
                times = process.cpu_times()
                found[process.pid] = times.user + times.system
            except psutil.Error:
                continue
        return found

    def __enter__(self) -> "OwnCpu":
        if self._start is None:
            self._start = (time.monotonic(), self._cpu_by_pid(), self._machine_cpu_s())
        return self

    def __exit__(self, *exc) -> None:
        if self._start is None:
            return
        started, before, machine_before = self._start
        self._start = None
        after = self._cpu_by_pid()
        self.machine_cpu_s += self._machine_cpu_s() - machine_before
        self.wall_s += time.monotonic() - started
        self.cpu_s += sum(max(0.0, used - before.get(pid, 0.0)) for pid, used in after.items())

    @property
    def cores(self) -> float:
        return self.cpu_s / self.wall_s if self.wall_s > 0 else float("nan")

    @property
    def other_cores(self) -> float:
        """The cores other work kept busy meanwhile: the machine's CPU time less ours. (The load
        average cannot tell: a vLLM CPU server's spinning OpenMP threads count in it many times
        over, at a CPU use of about one core.)"""
        return max(0.0, self.machine_cpu_s - self.cpu_s) / self.wall_s if self.wall_s > 0 else float("nan")


class PeriodicSampler:
    """Calls `sample()` every `interval_s` in a background thread while the block runs."""

    def __init__(self, interval_s: float) -> None:
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def sample(self) -> None:
        raise NotImplementedError

    def _loop(self) -> None:
        while not self._stop.wait(self.interval_s):
            self.sample()

    def __enter__(self):
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class PeakSampler(PeriodicSampler):
    """The largest value `read()` returns while the block runs, sampled every `interval_s` in a
    background thread (and at both ends)."""

    def __init__(self, read: Callable[[], int], interval_s: float) -> None:
        super().__init__(interval_s)
        self.read = read
        self.peak = 0

    def sample(self) -> None:
        self.peak = max(self.peak, self.read())

    def __enter__(self) -> "PeakSampler":
        self.peak = self.read()
        return super().__enter__()

    def __exit__(self, *exc) -> None:
        super().__exit__(*exc)
        self.sample()


# Sleeps 1 ms at a time and prints every wake more than 0.5 ms late as "due lateness" (perf_counter
# seconds: CLOCK_MONOTONIC, the same clock in every process), after a first line that says it runs;
# leaves when its parent has gone.
_WAKE_PROBE = """
import os, sys, time
parent, wakes = int(sys.argv[1]), 0
sys.stdout.write("running\\n")
sys.stdout.flush()
while True:
    due = time.perf_counter() + 0.001
    time.sleep(0.001)
    late = time.perf_counter() - due
    if late > 0.0005:
        sys.stdout.write(f"{due:.6f} {late:.6f}\\n")
        sys.stdout.flush()
    wakes += 1
    if wakes % 500 == 0 and os.getppid() != parent:
        break
"""


class WakeProbe:
    """A process beside the client, while the block runs, that only sleeps a millisecond at a time
    and notes each wake more than half a millisecond late: the machine's own stalls (a virtual
    machine's host taking its cores away, other work), which delay every process on it, the client
    included. A request sent late while the probe was late too was delayed by the machine, not by
    the client. It costs about 1 % of a core."""

    def __init__(self) -> None:
        self.stalls: list[tuple[float, float]] = []  # (due, how late), perf_counter seconds
        self._process = None
        self._output = None

    def __enter__(self) -> "WakeProbe":
        self._output = tempfile.TemporaryFile()
        self._process = subprocess.Popen([sys.executable, "-c", _WAKE_PROBE, str(os.getpid())], stdout=self._output,
                                         stdin=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        # The load starts once the probe runs: its interpreter's start-up takes tens of ms of CPU
        # that would otherwise compete with the first requests' sends.
        deadline = time.monotonic() + 10
        while os.fstat(self._output.fileno()).st_size == 0 and self._process.poll() is None \
                and time.monotonic() < deadline:
            time.sleep(0.005)
        return self

    def __exit__(self, *exc) -> None:
        self._process.terminate()
        try:
            self._process.wait(timeout=5)
        except subprocess.TimeoutExpired:
            self._process.kill()
            self._process.wait()
        self._output.seek(0)
        for line in self._output.read().decode().splitlines()[1:]:
            due, late = line.split()
            self.stalls.append((float(due), float(late)))
        self._output.close()

    @property
    def longest_s(self) -> float:
        return max((late for _, late in self.stalls), default=0.0)

    def during(self, start: float, end: float) -> float:
        """The longest stall that overlapped [start, end] (perf_counter seconds), 0 if none."""
        return max((late for due, late in self.stalls if due < end and due + late > start), default=0.0)
