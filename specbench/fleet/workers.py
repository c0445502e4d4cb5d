"""Simulations side by side: one configuration's simulations per worker process, on every core.

A fleet simulation is plain Python on one core, and the configurations a plan compares (the
baseline, each draft × K, the K schedules) are independent of each other, so they run in forked
worker processes, each on the configurations it is handed, and come back in the order asked. Forked,
not spawned: a configuration prices its steps with closures over the kernel tables that pickle
cannot carry, and a forked worker has them already. Every simulation draws from its own seeds, so
the results are the same on one process or many (`tests/test_fleet.py` holds them equal).
"""

from __future__ import annotations

import multiprocessing
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Sequence
from typing import TypeVar

Item = TypeVar("Item")
Result = TypeVar("Result")

_forked: tuple[Callable, Sequence] | None = None  # what the forked workers run: (work, items)
_parent = 0  # the process that forks them
# Held back from a worker until _worker_signals has set its handlers: a fork copies the parent's
# Python handlers (the CLI's raise), and a SIGTERM that Pool.terminate sends a worker before its
# initializer ran was caught by the copy and lost, leaving the worker waiting on the task queue's
# lock the terminating parent holds, and the parent joining it for ever (seen once in CI).
STOP_SIGNALS = {signal.SIGINT, signal.SIGTERM}


def cores() -> int:
    """The cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # (not on Linux)
        return os.cpu_count() or 1


def _worker_signals() -> None:
    """A worker ends when the process that forked it does, however that ends (_end_with_the_parent):
    a process specbench starts never outlives it. Ctrl-C is the parent's to handle (it stops the
    pool), and the SIGTERM that stops the pool ends a worker quietly: the handlers the CLI installed,
    which the fork copied, would print a stopped worker's traceback instead."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    _end_with_the_parent()
    signal.pthread_sigmask(signal.SIG_UNBLOCK, STOP_SIGNALS)  # one sent since the fork arrives now, as set above


def _end_with_the_parent() -> None:
    """SIGTERM to this worker once its parent process has gone (it is then another's child). Not
    Linux's PR_SET_PDEATHSIG, which fires when the *thread* that forked a worker ends: the pool forks
    the workers that replace dead ones from its own worker-handler thread, which ends as the pool
    terminates; such a worker was killed while it waited on the task queue, holding the queue's lock,
    and the terminating parent waited for that lock for ever (the pool's exit hung so in two runs
    of tests/test_fleet.py in a row here). Polled every 0.1 s by a thread of the worker's own."""
    parent = _parent

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(0.1)
        os.kill(os.getpid(), signal.SIGTERM)

    threading.Thread(target=watch, name="specbench-parent-watch", daemon=True).start()


def _run(index: int):
    work, items = _forked
    return index, work(items[index])


def in_processes(work: Callable[[Item], Result], items: Sequence[Item], workers: int | None = None,
                 on_done: Callable[[int, Result], None] | None = None) -> list[Result]:
    """`work(item)` for every item, in order, on up to `workers` forked processes (None: one per
    core; 1, a single item, a system without fork, or a call from a worker: here, one after
    another). The results must pickle; the items need not. `on_done(index, result)` is called
    here, in this process, as each item finishes (in the order they finish)."""
    global _forked, _parent
    workers = min(cores() if workers is None else workers, len(items))
    # (fork is safe on Linux only; a worker, itself daemonic, may start no workers of its own)
    if workers <= 1 or not sys.platform.startswith("linux") or multiprocessing.current_process().daemon:
        results = []
        for index, item in enumerate(items):
            results.append(work(item))
            if on_done is not None:
                on_done(index, results[-1])
        return results
    _forked, _parent = (work, items), os.getpid()
    try:
        held = signal.pthread_sigmask(signal.SIG_BLOCK, STOP_SIGNALS)  # the workers fork with them held
        try:
            pool = multiprocessing.get_context("fork").Pool(workers, initializer=_worker_signals)
        finally:
            signal.pthread_sigmask(signal.SIG_SETMASK, held)
        with pool:
            # one item a task, handed out as workers free up: simulations differ in length; each
            # result taken as it comes (a caller shows progress, and keeps what finished on Ctrl-C)
            results: list = [None] * len(items)
            for index, result in pool.imap_unordered(_run, range(len(items)), chunksize=1):
                results[index] = result
                if on_done is not None:
                    on_done(index, result)
            return results
    finally:
        _forked = None
