"""The Ray executor: pairing groups (executors.groups) as Ray tasks, one node each.

The driver (this process) is the only writer of the run directory. Each task measures its group
with the local executor's code in a scratch directory on its node, and sends every event (a cell
started, a cell finished with its rows) through a Ray queue as it happens; the driver writes each
finished cell at once, so --resume, progress lines and run.json behave as on the local executor.

A group asks for what its engine needs: a vLLM server's GPUs (TP x PP), the native engine's
devices, or one core on a CPU, where the task binds itself and its servers to cores no other
group on that machine holds. A task lost with its node or worker has its unfinished cells retried
once on another node; then they are recorded as failed, with the reason. Ctrl-C and SIGTERM
cancel the tasks (each stops its servers and sends what finished) and propagate.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import shutil
import signal
import socket
import tempfile
import threading
import time
from dataclasses import dataclass, field, replace
from pathlib import Path

from specbench.executors import RAY_INSTALL, Executor
from specbench.executors.groups import PairingGroup, WorkEstimate, pairing_groups
from specbench.grid import SweepConfig, plan_cells, with_setting
from specbench.measuring import SweepEvent, SweepTables, SweepWork, measure_here
from specbench.results import hardware_info, versions
from specbench.schema import grid_columns
from specbench.traces import Replay
from specbench.workloads import load_workload

# what a task inherits from the driver's environment (model caches, offline switches, vLLM's knobs)
FORWARDED_ENV = ("SPECBENCH_", "VLLM_", "HF_", "TRANSFORMERS_", "FAKE_VLLM", "PYTHONPATH")
STOP_GRACE_S = 10.0  # after a cancel, how long tasks get to stop their servers and send what finished; then killed
REACH_TIMEOUT_S = 3.0  # how long the cluster's address may take to accept a connection


def import_ray():
    try:
        import ray
    except ImportError:
        raise ValueError(f"--executor ray needs Ray: {RAY_INSTALL}") from None
    return ray


# --- what a group asks for ---------------------------------------------------------------------

@dataclass
class GroupNeeds:
    cpus: float = 1.0
    gpus: float = 0.0
    cores: int = 0  # CPU runs: cores the task binds itself (and its servers) to
    spans_nodes: bool = False  # a vLLM server bigger than a node: vLLM's own Ray backend places it

    def options(self) -> dict:
        return {"num_cpus": self.cpus, "num_gpus": self.gpus}

    def cluster_slots(self, nodes: list[dict], server_gpus: int) -> int:
        """How many groups the cluster runs at once: per node, or (a server bigger than a node) as
        many servers as the cluster's GPUs hold."""
        if self.spans_nodes:
            return max(1, int(sum(node["Resources"].get("GPU", 0) for node in nodes) // server_gpus))
        return sum(self.slots(node["Resources"]) for node in nodes)

    def slots(self, resources: dict) -> int:
        """How many groups a node with these resources runs at once."""
        counts = [int(resources.get("CPU", 0) // self.cpus)] if self.cpus else []
        if self.gpus:
            counts.append(int(resources.get("GPU", 0) // self.gpus))
        return min(counts) if counts else 1


def group_needs(config: SweepConfig, nodes: list[dict]) -> GroupNeeds:
    if config.engine.device == "cpu":
        return GroupNeeds(cpus=1, cores=1)
    if config.engine.name == "vllm":
        gpus = config.engine.vllm.tensor_parallel_size * config.engine.vllm.pipeline_parallel_size
        largest = max((node["Resources"].get("GPU", 0) for node in nodes), default=0)
        if gpus > largest:
            return GroupNeeds(cpus=1, gpus=0, spans_nodes=True)
        return GroupNeeds(cpus=1, gpus=gpus)
    from specbench.native.placement import parse_devices

    return GroupNeeds(cpus=1, gpus=len(parse_devices(config.engine.device)))


def config_on_node(config: SweepConfig, needs: GroupNeeds, gpus: int) -> SweepConfig:
    """The config a task runs: devices renumbered to those Ray gave it (CUDA_VISIBLE_DEVICES), and
    a server bigger than a node on vLLM's Ray backend."""
    if config.engine.device == "cpu":
        return config
    if needs.spans_nodes:
        backend = config.engine.vllm.distributed_executor_backend or "ray"
        vllm = replace(config.engine.vllm, distributed_executor_backend=backend)
        return replace(config, engine=replace(config.engine, device="cuda", vllm=vllm))
    if config.engine.name == "vllm":
        return with_setting(config, "engine.device", "cuda")  # the server sees the task's GPUs only
    return with_setting(config, "engine.device", ",".join(f"cuda:{i}" for i in range(gpus)) if gpus > 1 else "cuda:0")


@contextlib.contextmanager
def claimed_cores(count: int):
    """`count` cores of this machine no other specbench task holds (a lock file each, so that
    simulated nodes on one machine share them correctly); [] when none is free or none is asked."""
    held: list[tuple[int, object]] = []
    if count > 0:
        directory = Path(tempfile.gettempdir()) / "specbench-cores"
        directory.mkdir(exist_ok=True)
        for core in sorted(os.sched_getaffinity(0)):
            if len(held) == count:
                break
            handle = open(directory / f"core-{core}.lock", "w")
            try:
                fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
                held.append((core, handle))
            except BlockingIOError:
                handle.close()
    try:
        yield [core for core, _ in held]
    finally:
        for _, handle in held:
            handle.close()


@contextlib.contextmanager
def bound_to(cores: list[int]):
    """The group on `cores`: this process, its torch threads and the servers it starts (their
    compute threads by VLLM_CPU_OMP_THREADS_BIND), so that two groups never compete for a core.
    (Binding only the compute threads, the API servers and load generators float: measured no
    faster: specbench/data/measured.json's finding ray_compute_threads_binding.) Undone after: Ray
    reuses its workers."""
    if not cores:
        yield
        return
    import torch

    affinity, threads = os.sched_getaffinity(0), torch.get_num_threads()
    bind = os.environ.get("VLLM_CPU_OMP_THREADS_BIND")
    os.sched_setaffinity(0, cores)
    torch.set_num_threads(len(cores))
    os.environ["VLLM_CPU_OMP_THREADS_BIND"] = ",".join(map(str, cores))
    try:
        yield
    finally:
        os.sched_setaffinity(0, affinity)
        torch.set_num_threads(threads)
        if bind is None:
            os.environ.pop("VLLM_CPU_OMP_THREADS_BIND", None)
        else:
            os.environ["VLLM_CPU_OMP_THREADS_BIND"] = bind


def first_lines_of_ray_errors() -> None:
    """Ray prints every error the cluster sends the driver in full: a lost node's raylet is its last
    20 log lines, a [state-dump] of ~25 lines, more than once. The sweep says what a lost node means
    in one line ("lost ...; retried once"), so Ray's own message is cut to its first line, once. Ray's
    listener calls its module's print_to_stdstream, the one place to do it (a private name: if a
    Ray release renames it, its messages are printed whole, as before)."""
    try:
        from ray._private import worker as ray_worker
    except ImportError:
        return
    printer = getattr(ray_worker, "print_to_stdstream", None)
    if printer is None or getattr(printer, "first_lines", False):
        return

    seen: set[str] = set()  # the same error sent again (each raylet reports its peer) is printed once

    def print_first_lines(data, ignore_prefix: bool = False):
        if isinstance(data, dict) and data.get("pid") == "raylet":
            lines = [(str(line).splitlines() or [""])[0] for line in data.get("lines", [])]
            lines = [line for line in lines if line not in seen]
            seen.update(lines)
            if not lines:
                return None
            data = {**data, "lines": lines}
        return printer(data, ignore_prefix)

    print_first_lines.first_lines = True
    ray_worker.print_to_stdstream = print_first_lines


# --- the task ----------------------------------------------------------------------------------

class ForwardedTables(SweepTables):
    """A task's tables: a row replaced after its cell finished (a bracket closed, repeats added)
    is sent to the driver too."""

    def __init__(self, run_dir: Path, send) -> None:
        super().__init__(run_dir)
        self.send = send

    def replace(self, row: dict, requests: list[dict], steps: list[dict]) -> None:
        super().replace(row, requests, steps)
        self.send(SweepEvent("replaced", row=dict(row), requests=list(requests), steps=list(steps)))


def measure_group(config: SweepConfig, cell_ids: list[str], group: int, queue, run_name: str,
                  needs: GroupNeeds, replay: Replay | None = None) -> dict:
    """A Ray task: the group's cells measured on this node by the local executor's code, into a
    scratch run directory here; every event goes to the driver through `queue` as it happens."""
    import ray

    # ray.cancel interrupts a running task by simulating SIGINT (_thread.interrupt_main), which does
    # nothing unless Python's own handler is installed: a worker started in the background (a
    # raylet, a CI job) inherits SIGINT ignored, and the task then ran to its end after a cancel.
    signal.signal(signal.SIGINT, signal.default_int_handler)
    timeline = {"started_at": time.time()}  # the group's start (engine, models) apart from its cells
    node_id, host = ray.get_runtime_context().get_node_id(), socket.gethostname()
    gpus = len(ray.get_gpu_ids())
    config = config_on_node(config, needs, gpus)
    if needs.spans_nodes:
        os.environ["RAY_ADDRESS"] = ray.get_runtime_context().gcs_address  # vLLM's workers join this cluster
    scratch = Path(tempfile.gettempdir()) / "specbench-ray" / f"{run_name}-group{group + 1}-{node_id[:8]}-{os.getpid()}"
    scratch.mkdir(parents=True, exist_ok=True)
    with claimed_cores(needs.cores) as cores, bound_to(cores):
        queue.put((group, (node_id, host, cores)))
        if needs.cores and not cores:  # every core's lock held: by other groups, or another job on this machine
            queue.put((group, SweepEvent("stage", message=f"no free core to bind this group to (every lock under "
                                                          f"{Path(tempfile.gettempdir()) / 'specbench-cores'} is "
                                                          f"held): it runs unbound, and its timings may include "
                                                          f"other groups' work")))
        planned = plan_cells(config, replay)
        by_id = {cell.id: cell for cell in planned}
        meta = {"versions": versions(), "hardware": hardware_info(), "engine": {"name": config.engine.name}}

        def send(event: SweepEvent) -> None:
            if event.kind == "start":
                timeline.setdefault("first_cell_at", time.time())
            queue.put((group, event))

        tables = ForwardedTables(scratch, send)
        work = SweepWork(config, planned, [by_id[i] for i in cell_ids], tables,
                         {name: load_workload(name) for name in config.grid.workloads}, send, meta, node_id=node_id,
                         replay=replay)
        try:
            measure_here(work)
        finally:
            tables.close()
        logs = {path.name: path.read_bytes() for path in sorted((scratch / "servers").glob("*.log"))}
        shutil.rmtree(scratch, ignore_errors=True)  # kept only when the group failed: its server logs are there
        return {"group": group + 1, "node_id": node_id, "host": host, "cores": cores, "scratch": str(scratch),
                "cells": len(cell_ids), **timeline, "finished_at": time.time(), "meta": meta, "logs": logs}


# --- the driver --------------------------------------------------------------------------------

@dataclass
class GroupTask:
    group: PairingGroup
    attempt: int = 0
    node_id: str = ""
    host: str = ""
    cores: list[int] = field(default_factory=list)
    finished: set[str] = field(default_factory=set)

    @property
    def where(self) -> str:
        return f"{self.host} node {self.node_id[:8]}" if self.node_id else "a node"


class RayExecutor(Executor):
    def __init__(self, address: str = "") -> None:
        self.address = address

    def preflight(self) -> None:
        """An address that does not accept a connection is refused in one line, in seconds (ray.init
        would retry for minutes, printing Ray's "Failed to connect to GCS" again and again)."""
        address, named = (self.address, "--ray-address") if self.address else \
            (os.environ.get("RAY_ADDRESS", ""), "RAY_ADDRESS")
        if not address or address in ("auto", "local"):
            return
        host, _, port = address.split("://", 1)[-1].rpartition(":")
        if not host or not port.isdigit():
            raise ValueError(f"{named} {address}: expected HOST:PORT of a Ray cluster's head (e.g. 10.0.0.1:6379)")
        try:
            socket.create_connection((host.strip("[]"), int(port)), timeout=REACH_TIMEOUT_S).close()
        except OSError as error:
            reason = error.strerror or type(error).__name__.replace("Error", " error").lower()
            raise ValueError(f"{named} {address}: no Ray cluster answers there ({reason}); start one with `ray start "
                             f"--head`, or leave out {named} for a local Ray instance") from None

    def connect(self, ray) -> str:
        """Join --ray-address, else RAY_ADDRESS, else start a local instance; returns which."""
        env = {name: value for name, value in os.environ.items() if name.startswith(FORWARDED_ENV)}
        address = self.address or os.environ.get("RAY_ADDRESS", "")
        ours = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
        ray.init(address=address or None, runtime_env={"env_vars": env}, include_dashboard=False,
                 log_to_driver=False, configure_logging=False)
        if ours is not None:  # Ray installs its own handler, which exits at once: ours stops the tasks first
            signal.signal(signal.SIGTERM, ours)
        first_lines_of_ray_errors()
        return f"Ray cluster at {address}" if address else "a local Ray instance"

    def run(self, work) -> None:
        ray = import_ray()
        joined = self.connect(ray)
        try:
            self._run(ray, work, joined)
        finally:
            ray.shutdown()

    def _run(self, ray, work, joined: str) -> None:
        from ray.util.queue import Queue
        from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

        nodes = [node for node in ray.nodes() if node.get("Alive")]
        needs = group_needs(work.config, nodes)
        slots = needs.cluster_slots(nodes, work.config.engine.vllm.tensor_parallel_size
                                    * work.config.engine.vllm.pipeline_parallel_size)
        if slots < 1:
            raise ValueError(f"no node of the cluster ({joined}) has what a pairing group asks for "
                             f"({needs.cpus:g} CPU, {needs.gpus:g} GPU)")
        groups = pairing_groups(work.todo, work.planned, slots, WorkEstimate.of(work.config, work.replay))
        config, pairing = self.decide_pairing(work.config, max(needs.slots(n["Resources"]) for n in nodes))
        here = NodeAffinitySchedulingStrategy(ray.get_runtime_context().get_node_id(), soft=False)
        self.queue = Queue(actor_options={"num_cpus": 0, "scheduling_strategy": here})  # dies with the driver only
        self.work, self.by_id = work, {c.id: c for c in work.planned}
        self.tasks: dict = {}
        remote = ray.remote(measure_group)
        run_name = work.tables.run_dir.name
        work.meta["executor"] = {"name": "ray", "cluster": joined, "nodes": len(nodes), "slots": slots,
                                 "pairing": pairing, "groups": []}
        work.save_meta()
        work.on_event(SweepEvent("loaded", message=f"{joined}: {len(nodes)} node(s), {slots} group(s) at once; "
                                                   f"{len(groups)} pairing group(s), each measured on one node"
                                                   + (f"; served repeats {pairing}" if pairing else ""),
                                 index=len(work.planned) - len(work.todo), total=len(work.planned)))

        def submit(state: GroupTask, avoid: str = "") -> None:
            options = {**needs.options(), "max_retries": 0}
            others = [n["NodeID"] for n in ray.nodes() if n.get("Alive") and n["NodeID"] != avoid]
            if avoid and others:
                options["scheduling_strategy"] = NodeAffinitySchedulingStrategy(others[0], soft=True)
            ref = remote.options(**options).remote(config, [c.id for c in state.group.cells],
                                                   state.group.index, self.queue, run_name, needs, work.replay)
            self.tasks[ref] = state
            work.on_event(SweepEvent("stage", message=f"{state.group.describe()}"
                                                      + (f": retried away from {avoid[:8]}" if avoid else "")))

        for group in groups:
            submit(GroupTask(group))
        try:
            while self.tasks:
                self.drain()
                ready, _ = ray.wait(list(self.tasks), num_returns=1, timeout=0.25)
                for ref in ready:
                    self.drain()  # what the task sent before it ended
                    state = self.tasks.pop(ref)
                    try:
                        summary = ray.get(ref)
                        group_meta = self.keep_logs(summary.pop("meta"), summary.pop("logs"), summary)
                        work.meta["executor"]["groups"].append({**summary, "attempt": state.attempt + 1,
                                                                "hardware": group_meta.get("hardware"),
                                                                "engine": group_meta.get("engine")})
                        self.merge_meta(group_meta)
                        work.save_meta()
                    except ray.exceptions.RayTaskError as error:  # the group's own error, as on one machine
                        self.stop(ray)
                        cause = error.as_instanceof_cause()
                        raise (cause.cause if getattr(cause, "cause", None) else cause) from None
                    except ray.exceptions.RayError as error:  # the task or its node was lost
                        self.lost(state, error, submit)
        except KeyboardInterrupt:
            self.stop(ray)
            raise

    @staticmethod
    def decide_pairing(config: SweepConfig, groups_per_node: int) -> tuple[SweepConfig, str]:
        """vLLM's auto pairing, decided once for every group before any starts: side by side where a
        node's free memory (this machine's, read now) holds two servers per group it runs at once.
        Decided in each group instead, the first group's servers would shrink what the next sees."""
        if config.engine.name != "vllm" or config.engine.vllm.pairing != "auto":
            return config, ""
        from specbench.served.vllm_engine import served_pairing

        pairing, why = served_pairing(config, share=1 / max(1, groups_per_node))
        return with_setting(config, "engine.vllm.pairing", pairing), f"{pairing} in every group ({why})"

    def drain(self) -> None:
        """Every event the tasks sent: finished cells written at once."""
        work = self.work
        size = self.queue.qsize()
        for group, item in self.queue.get_nowait_batch(size) if size else []:
            state = next((s for s in self.tasks.values() if s.group.index == group), None)
            if isinstance(item, tuple):  # where the task runs
                if state:
                    state.node_id, state.host, state.cores = item
                continue
            where = f"[{state.where}] " if state else ""
            cell = self.by_id.get(item.cell.id) if item.cell is not None else None
            if item.kind == "done" and cell is not None:
                if state:
                    state.finished.add(cell.id)
                if not cell.is_speculative and cell.id in work.tables.finished_ids():
                    work.tables.add_copy(item.row)
                    work.on_event(SweepEvent("stage", message=f"{where}baseline {cell.id} measured again here: "
                                                              f"{item.row.get('tokens_per_s', float('nan')):.1f} "
                                                              f"tok/s (this node's copy)"))
                    continue
                work.tables.add(item.row, item.requests or [], item.steps or [])
                work.on_event(SweepEvent("done", cell, item.row, work.position[cell.id], len(work.planned)))
            elif item.kind == "replaced":
                self.replace(item)
            elif item.kind == "start" and cell is not None:
                work.on_event(SweepEvent("start", cell, index=work.position[cell.id], total=len(work.planned)))
            elif item.kind in ("stage", "stage_failed", "loaded"):
                work.on_event(SweepEvent("stage" if item.kind == "loaded" else item.kind,
                                         message=where + item.message))

    def replace(self, event) -> None:
        """A row a task replaced after its cell finished: the cells table's, or that node's copy."""
        tables, row = self.work.tables, event.row
        current = tables.cells[tables.cells["cell_id"] == row["cell_id"]] if not tables.cells.empty else []
        if len(current) and current.iloc[0].get("node_id") == row.get("node_id"):
            tables.replace(row, event.requests or [], event.steps or [])
        elif len(current):
            tables.add_copy(row)

    def lost(self, state: GroupTask, error: Exception, submit) -> None:
        """A task lost with its worker or node: its unfinished cells once more elsewhere, then failed."""
        work = self.work
        done = work.tables.finished_ids()
        unfinished = [cell for cell in state.group.cells if cell.id not in done]
        if not unfinished:
            return
        needed = {cell.baseline_id for cell in unfinished if cell.is_speculative}  # paired on the same node
        left = [cell for cell in state.group.cells if cell.id not in done or cell.id in needed]
        reason = f"{type(error).__name__} on {state.where}: {(str(error).splitlines() or [''])[0]}"
        if state.attempt == 0:
            work.on_event(SweepEvent("stage_failed", message=f"{state.group.describe()} lost ({reason}); "
                                                             f"its {len(left)} unfinished cell(s) retried once"))
            submit(GroupTask(replace(state.group, cells=left), attempt=1), avoid=state.node_id)
            return
        for cell in unfinished:
            row = {**grid_columns(cell, "failed", f"lost twice: {reason}"), "node_id": state.node_id,
                   "host": state.host}
            work.tables.add(row, [], [])
            work.on_event(SweepEvent("done", cell, row, work.position[cell.id], len(work.planned)))

    def keep_logs(self, group_meta: dict, logs: dict[str, bytes], summary: dict) -> dict:
        """A group's server logs, written into the run directory (servers/groupN-NAME), and its
        run.json entries pointed at them."""
        directory = self.work.tables.run_dir / "servers"
        moved = {}
        for name, content in logs.items():
            directory.mkdir(exist_ok=True)
            path = directory / f"group{summary['group']}-{name}"
            path.write_bytes(content)
            moved[str(Path(summary["scratch"]) / "servers" / name)] = str(path)
        for server in (group_meta.get("engine") or {}).get("servers", []):
            server["log"] = moved.get(server.get("log"), server.get("log"))
        return group_meta

    def merge_meta(self, group_meta: dict) -> None:
        """What a group's engine wrote into its run.json, into the run's: the first group's
        measurements of its node (the performance model's bandwidth and FLOP/s) and engine entry,
        with every group's servers."""
        meta = self.work.meta
        for key, value in group_meta.items():
            if key not in meta:
                meta[key] = value
            elif key == "hardware":
                meta[key] = {**value, **meta[key]} if isinstance(value, dict) else meta[key]
        engine = group_meta.get("engine") or {}
        if meta.get("engine", {}).keys() <= {"name"}:
            meta["engine"] = dict(engine)
        elif engine.get("servers"):
            meta["engine"]["servers"] = meta["engine"].get("servers", []) + engine["servers"]

    def stop(self, ray) -> None:
        """Cancel every task (each stops its servers and sends the cells it finished), wait for
        them up to STOP_GRACE_S, keep what they sent; tasks that do not stop in time are killed
        (their servers die with them: server.ServerProcess) and waited for. A cell a task was
        measuring is left unmeasured, for --resume."""
        for ref in self.tasks:
            ray.cancel(ref)
        deadline = time.monotonic() + STOP_GRACE_S
        while self.tasks and time.monotonic() < deadline:
            self.settle(ray, deadline)
        for ref in self.tasks:
            ray.cancel(ref, force=True)
        deadline = time.monotonic() + STOP_GRACE_S
        while self.tasks and time.monotonic() < deadline:
            self.settle(ray, deadline)
        self.drain()

    def settle(self, ray, deadline: float) -> None:
        """Wait a moment for stopping tasks, keep what they sent, forget those that ended. A second
        signal while stopping does not interrupt the stop."""
        try:
            ready, _ = ray.wait(list(self.tasks), num_returns=len(self.tasks),
                                timeout=max(0.05, min(0.5, deadline - time.monotonic())))
            self.drain()
        except KeyboardInterrupt:
            return
        for ref in ready:
            self.tasks.pop(ref, None)
