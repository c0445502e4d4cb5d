"""A server process specbench starts, and the guarantee that it never outlives specbench.

The server runs in a session (process group) of its own, so that the terminal's Ctrl-C reaches
specbench alone and specbench stops the server's whole group itself: SIGTERM, then SIGKILL after a
grace period. On Linux the server is also told to die with its parent (PR_SET_PDEATHSIG), for the
one case no code of ours runs: specbench killed with SIGKILL. Everything it prints goes to a log
file in the run directory; a server that exits or never answers /health is one error naming that
log, with its last lines kept next to it.
"""

from __future__ import annotations

import functools
import os
import signal
import socket
import subprocess
import sys
import threading
import time
import urllib.error
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import psutil

LOG_TAIL_LINES = 40
# A port found free can be taken (by any process's outgoing connection) before the server binds
# it; a server started on a free port is restarted on another this many times when that happens.
PORT_RETRIES = 3


class ServerError(RuntimeError):
    """A server that did not start or stopped answering; the message names its log."""


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind((host, 0))
        return probe.getsockname()[1]


def _die_with_parent(nice: int = 0) -> None:
    """In the child before exec: a new session, SIGTERM when the parent dies (Linux), and `nice`."""
    os.setsid()
    if nice:
        os.nice(nice)
        # Where the kernel schedules each session as a group (Linux's autogroup, on by default),
        # a process's nice only ranks it within its own session, which is the server's alone: the
        # nice that ranks it against the client is its session's.
        try:
            with open("/proc/self/autogroup", "w") as autogroup:
                autogroup.write(str(nice))
        except OSError:
            pass
    if sys.platform.startswith("linux"):
        import ctypes

        # The signal comes when the *thread* that forked the server ends, not its process (prctl(2)):
        # servers are started from the thread that runs the sweep (the main thread, or a Ray task's),
        # which outlives them. A server started from a short-lived thread would die with that thread
        # (fleet/workers.py met this with a pool's workers and polls its parent process instead).
        try:
            ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1
        except OSError:
            pass


def root_cause(path: Path) -> str:
    """The last exception line a server logged ("AssertionError: ..."), or ''."""
    import re

    pattern = re.compile(r"\b([A-Z]\w*(?:Error|Exception)): (.+)$")
    found = ""
    try:
        for line in path.read_text(errors="replace").splitlines():
            match = pattern.search(line)
            if match and "EngineDeadError" not in match.group(1) and "Traceback" not in line:
                found = f"{match.group(1)}: {match.group(2).strip()}"
    except OSError:
        return ""
    return found[:300]


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


@dataclass(eq=False)  # identity: a set of running servers holds them
class ServerProcess:
    """`command` run as a server on 127.0.0.1:`port`, its output in `log_path`."""

    command: list[str]
    log_path: Path
    port: int
    env: dict[str, str] = field(default_factory=dict)
    health_path: str = "/health"
    # A server computing on the CPU cores the client runs on is niced, so that the client, which
    # needs little CPU but needs it at once, sends each request at its time and timestamps each
    # token when it arrives instead of queueing behind the server it measures.
    nice: int = 0
    process: subprocess.Popen | None = None
    started_s: float = float("nan")
    ready_s: float = float("nan")  # seconds from start to the first healthy answer
    # The command for a port: set by on_free_port, where the server may move to another port.
    command_for_port: Callable[[int], list[str]] | None = None
    port_retries: int = PORT_RETRIES

    @classmethod
    def on_free_port(cls, command_for_port: Callable[[int], list[str]], log_path: Path, **options) -> "ServerProcess":
        """A server on a port free now, moved to another free port if that one is taken before it binds."""
        port = free_port()
        return cls(command_for_port(port), log_path, port, command_for_port=command_for_port, **options)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        self.log_path.parent.mkdir(parents=True, exist_ok=True)
        log = open(self.log_path, "ab")
        log.write(f"$ {'nice -n %d ' % self.nice if self.nice else ''}{' '.join(self.command)}\n".encode())
        log.flush()
        self.started_s = time.monotonic()
        try:
            self.process = subprocess.Popen(self.command, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                            env={**os.environ, **self.env},
                                            preexec_fn=functools.partial(_die_with_parent, self.nice))
        except OSError as error:
            raise ServerError(f"cannot start the server ({error}); command: {' '.join(self.command)}") from None
        finally:
            log.close()
        _running.add(self)

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def healthy(self, timeout_s: float = 2.0) -> bool:
        try:
            with urllib.request.urlopen(self.url + self.health_path, timeout=timeout_s) as response:
                return response.status == 200
        except (urllib.error.URLError, OSError, ValueError):
            return False

    def wait_until_healthy(self, timeout_s: float, what: str = "server") -> float:
        """Seconds it took; a ServerError naming the log when it exits or the time runs out."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if not self.alive():
                if self._port_was_taken():
                    self.port_retries -= 1
                    self.port = free_port()
                    self.command = self.command_for_port(self.port)
                    self.start()
                    continue
                code = self.process.returncode if self.process else None
                self.save_tail()
                cause = root_cause(self.log_path)
                raise ServerError(f"the {what} exited with code {code} before it was ready"
                                  + (f" ({cause})" if cause else "") + f"; see {self.log_path}")
            if self.healthy():
                self.ready_s = time.monotonic() - self.started_s
                return self.ready_s
            time.sleep(0.5)
        self.stop()
        self.save_tail()
        raise ServerError(f"the {what} did not answer {self.health_path} within {timeout_s:.0f} s; see {self.log_path}")

    def _port_was_taken(self) -> bool:
        """Its last start failed to bind its port, and it may move to another."""
        if self.command_for_port is None or self.port_retries <= 0:
            return False
        try:
            last_start = self.log_path.read_text(errors="replace").rsplit("\n$ ", 1)[-1]
        except OSError:
            return False
        return "address already in use" in last_start.lower()

    def save_tail(self) -> Path:
        """The log's last lines next to it (the log itself may be long)."""
        tail = self.log_path.with_name(self.log_path.stem + ".tail.txt")
        tail.write_text(log_tail(self.log_path) + "\n")
        return tail

    def process_tree(self) -> list[psutil.Process]:
        """The server and every process it started (engine cores, workers)."""
        if not self.alive():
            return []
        try:
            root = psutil.Process(self.process.pid)
            return [root] + root.children(recursive=True)
        except psutil.Error:
            return []

    def stop(self, grace_s: float = 20.0) -> None:
        """SIGTERM to the server's process group, SIGKILL to whatever is left after `grace_s`."""
        if self.process is None:
            return
        tree = self.process_tree()
        pgid = self.process.pid  # its own session: process group id = its pid
        for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
            try:
                os.killpg(pgid, sig)
            except (ProcessLookupError, PermissionError):
                pass
            for member in tree:  # children that left the group still count
                try:
                    member.send_signal(sig)
                except psutil.Error:
                    pass
            gone, alive = psutil.wait_procs(tree, timeout=wait) if tree else ([], [])
            try:
                self.process.wait(timeout=0 if not alive else 1)
            except subprocess.TimeoutExpired:
                pass
            if not alive and self.process.poll() is not None:
                break
        _running.discard(self)


# Servers not stopped yet: stopped at interpreter exit and on SIGTERM, whatever else happens.
_running: set[ServerProcess] = set()
_lock = threading.Lock()


def stop_all() -> None:
    with _lock:
        for server in list(_running):
            server.stop(grace_s=10.0)


def _on_sigterm(signum, frame) -> None:
    stop_all()
    raise SystemExit(128 + signum)


import atexit  # noqa: E402

atexit.register(stop_all)
if threading.current_thread() is threading.main_thread():
    try:
        if signal.getsignal(signal.SIGTERM) in (signal.SIG_DFL, None):
            signal.signal(signal.SIGTERM, _on_sigterm)
    except ValueError:
        pass
