"""--executor ray on a real two-node Ray cluster on this machine (ray.cluster_utils.Cluster): the
pairing groups spread over both nodes, greedy tokens equal the local executor's, --resume after an
interruption, a killed worker node's cells retried elsewhere, SIGTERM leaves no task behind, and
the vLLM engine under Ray."""

from __future__ import annotations

import importlib.util
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.results import load_run
from tests.conftest import as_if_idle

pytestmark = pytest.mark.e2e  # a Ray cluster on this machine

pytest.importorskip("ray", reason="the ray extra is not installed (pip install 'specbench[ray]')")

runner = CliRunner()


def native_grid(dirs, output, *extra, ks: str = "2") -> list[str]:
    return ["sweep", "--target", dirs["target"], "--drafts", f"{dirs['draft']},ngram:2", "--k", ks,
            "--batch-sizes", "1,2", "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "12",
            "--num-prompts", "2", "--dtype", "fp64", "--output", str(output), *extra]


def start_cluster(workers: int = 2, sigint_ignored: bool = False):
    """`sigint_ignored`: as a cluster started in the background (a shell's `&`, a CI job) is, its
    processes inherit SIGINT ignored; a Ray task's cancel then interrupts nothing unless the task
    puts Python's handler back (the sweep's tasks ran to their end after a signal)."""
    from ray.cluster_utils import Cluster

    # Ray's memory monitor kills a worker once the machine passes 95 % of its memory, which two vLLM
    # servers and other work on a 24 GiB machine can reach; these tests check scheduling and
    # signals, not memory, and the kernel's own OOM killer still stands behind them.
    os.environ.setdefault("RAY_memory_monitor_refresh_ms", "0")
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN) if sigint_ignored else None
    try:
        cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})  # the driver's; cells go to workers
        nodes = [cluster.add_node(num_cpus=1) for _ in range(workers)]
        cluster.wait_for_nodes()
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    return cluster, nodes


@pytest.fixture(scope="module")
def cluster():
    cluster, nodes = start_cluster()
    yield cluster, nodes
    cluster.shutdown()


@pytest.fixture(scope="module")
def background_cluster():
    cluster, nodes = start_cluster(sigint_ignored=True)
    yield cluster, nodes
    cluster.shutdown()


@pytest.fixture
def on_cluster(cluster, monkeypatch):
    monkeypatch.setenv("RAY_ADDRESS", cluster[0].address)
    return cluster


def tokens_by_request(run_dir) -> dict:
    requests = load_run(run_dir).requests
    return {(r.cell_id, r.repeat, r.request_id): list(r.tokens) for r in requests.itertuples()}


def task_processes() -> list:
    import psutil

    found = []
    for process in psutil.process_iter(["cmdline", "name"]):
        try:
            text = " ".join(process.info["cmdline"] or []) + " " + (process.info["name"] or "")
        except psutil.Error:
            continue
        if "measure_group" in text:
            found.append(process)
    return found


def test_groups_spread_over_both_nodes_with_the_local_runs_tokens(tiny_model_dirs, tmp_path, on_cluster):
    _, nodes = on_cluster
    # two drafts at two K: balanced by estimated work, each group holds some of each pairing group
    # (at one K, whole pairing groups win: no baseline measured twice)
    local = runner.invoke(app, native_grid(tiny_model_dirs, tmp_path / "local", ks="2,3"))
    assert local.exit_code == 0, local.output
    spread = runner.invoke(app, native_grid(tiny_model_dirs, tmp_path / "ray", "--executor", "ray", ks="2,3"))
    assert spread.exit_code == 0, spread.output
    assert "2 pairing group(s)" in spread.output and "~50% of the estimated work" in spread.output
    assert spread.output.count("on chat · B=1,2 · T=0") == 2  # each group says the traffic it measures

    here, there = load_run(tmp_path / "local"), load_run(tmp_path / "ray")
    assert sorted(here.cells["cell_id"]) == sorted(there.cells["cell_id"])
    assert (there.cells["status"] == "ok").all() and (there.cells["lossless"].dropna() == "exact").all()
    assert tokens_by_request(tmp_path / "local") == tokens_by_request(tmp_path / "ray")
    workers = {node.node_id for node in nodes}
    assert set(there.cells["node_id"]) == workers  # both nodes measured cells
    # each node measured the baselines of its speculative cells; every speed-up pairs with its own node's
    copies = there.baseline_copies
    assert len(copies) == 2 and set(copies["cell_id"]) == {"chat|B1|T0|autoregressive", "chat|B2|T0|autoregressive"}
    first = there.cells.set_index("cell_id")["node_id"]
    assert all(row.node_id != first[row.cell_id] for row in copies.itertuples())
    for row in there.cells[there.cells["mode"] == "speculative"].itertuples():
        baseline = f"chat|B{row.batch_size}|T0|autoregressive"
        measured = pd.concat([there.cells[there.cells["cell_id"] == baseline], copies[copies["cell_id"] == baseline]])
        paired = measured[measured["node_id"] == row.node_id]
        assert len(paired) == 1 and row.baseline_tokens_per_s == pytest.approx(paired["tokens_per_s"].iloc[0])
    meta = json.loads((tmp_path / "ray" / "run.json").read_text())
    assert meta["status"] == "complete" and meta["executor"]["name"] == "ray"
    assert {group["node_id"] for group in meta["executor"]["groups"]} == workers
    for group in meta["executor"]["groups"]:  # each group's start-up apart from its measuring
        assert group["started_at"] < group["first_cell_at"] < group["finished_at"] and group["cells"] == 6


def test_resume_after_an_interruption_keeps_what_finished(tiny_model_dirs, tmp_path, on_cluster):
    from specbench.grid import EngineOptions, ExecutorOptions, GridOptions, LoadOptions
    from specbench.sweep import SweepConfig, run_sweep

    output = tmp_path / "run"
    config = SweepConfig(grid=GridOptions(target=tiny_model_dirs["target"],
                                          drafts=[tiny_model_dirs["draft"], "ngram:2"], ks=[2], temperatures=[0.0],
                                          workloads=["chat"], max_new_tokens=12, num_prompts=2),
                         load=LoadOptions(batch_sizes=[1, 2]), engine=EngineOptions(dtype="fp64"),
                         executor=ExecutorOptions(name="ray"))

    def stop_after_first(event):
        if event.kind == "done":
            raise KeyboardInterrupt

    output.mkdir()
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config, resume_dir=output, on_event=stop_after_first)
    first = load_run(output).cells
    assert json.loads((output / "run.json").read_text())["status"] == "interrupted"
    assert 1 <= len(first) < 6
    resumed = runner.invoke(app, ["sweep", "--resume", "--output", str(output)])
    assert resumed.exit_code == 0, resumed.output
    cells = load_run(output).cells
    assert len(cells) == 6 and (cells["status"] == "ok").all()
    kept = cells.set_index("cell_id").loc[first["cell_id"], "tokens_per_s"]
    assert list(kept) == list(first["tokens_per_s"])  # measured once, not again


def test_a_killed_worker_node_has_its_cells_retried_on_the_other(tiny_model_dirs, tmp_path, monkeypatch, capfd):
    from specbench.grid import EngineOptions, ExecutorOptions, GridOptions, LoadOptions
    from specbench.sweep import SweepConfig, run_sweep

    cluster, nodes = start_cluster()
    try:
        monkeypatch.setenv("RAY_ADDRESS", cluster.address)
        by_id = {node.node_id: node for node in nodes}
        # two draft-model groups (K=2, K=3): an n-gram cell ends ~0.5 s after its baseline, a window the driver's
        # lag closed once in CI (the node was killed with nothing left on it); a draft-model cell ends ~2 s after
        config = SweepConfig(grid=GridOptions(target=tiny_model_dirs["target"], drafts=[tiny_model_dirs["draft"]],
                                              ks=[2, 3], temperatures=[0.0], workloads=["chat"], max_new_tokens=160,
                                              num_prompts=4),
                             load=LoadOptions(batch_sizes=[1]), engine=EngineOptions(dtype="fp64"),
                             executor=ExecutorOptions(name="ray"))
        killed, messages = [], []

        def kill_the_node_that_measured_the_baseline(event):
            # the baseline ends before its group's draft cell, which is still to come (~2 s on this
            # machine); any first finished cell raced the other group, whose node may have finished
            # all it had (a killed idle node loses nothing: CI saw that)
            messages.append(event.message)
            if event.kind == "done" and not event.cell.is_speculative and not killed:
                killed.append(event.row["node_id"])
                cluster.remove_node(by_id[event.row["node_id"]], allow_graceful=False)

        output = tmp_path / "run"
        output.mkdir()
        run_sweep(config, resume_dir=output, on_event=kill_the_node_that_measured_the_baseline)
        run = load_run(output)
        cells = run.cells.set_index("cell_id")
        assert any("lost" in m and "retried once" in m for m in messages), messages
        assert len(cells) == 3 and (cells["status"] == "ok").all(), cells[["status", "message"]]
        first = run.cells.iloc[0]
        assert first["node_id"] == killed[0]  # kept from the node that died
        survivor = next(n for n in by_id if n != killed[0])
        retried = cells[(cells["mode"] == "speculative") & (cells["node_id"] == survivor)]
        assert len(retried) == 2  # its own group's cell and the lost group's, paired with a copy of the baseline
        assert killed[0] not in set(run.baseline_copies["node_id"])
        time.sleep(2)  # Ray's error listener prints what the cluster sent about the lost node
        printed = capfd.readouterr()
        assert "[state-dump]" not in printed.out + printed.err  # ~25 lines of raylet state, twice, before
    finally:
        cluster.shutdown()


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_stops_the_cluster_sweep_within_seconds_and_resume_completes_it(tiny_model_dirs, tmp_path,
                                                                                  background_cluster, signum, code):
    """A pipeline cancels with SIGTERM (a terminal with Ctrl-C) and expects the job gone in seconds:
    the tasks are cancelled mid-grid (not left to measure every cell), none is left running, the
    run says interrupted, and --resume measures the rest (after SIGTERM only: the resume does not
    know which signal stopped the run, and measuring the rest twice cost CI 40 s)."""
    output = tmp_path / "run"
    command = [sys.executable, "-m", "specbench.cli", *native_grid(tiny_model_dirs, output, "--executor", "ray",
                                                                   ks="2,3")]
    command[command.index("12")] = "400"  # --max-new-tokens: long enough to be stopped mid-grid
    env = {**os.environ, "RAY_ADDRESS": background_cluster[0].address}
    # Ctrl-C reaches a foreground job: SIGINT as Python's default, even where this suite inherited it ignored
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline = time.monotonic() + 300
    while not (output / "cells.parquet").exists() and process.poll() is None and time.monotonic() < deadline:
        time.sleep(0.2)
    assert process.poll() is None, process.stdout.read()
    signalled = time.monotonic()
    process.send_signal(signum)
    printed, _ = process.communicate(timeout=200)
    took = time.monotonic() - signalled
    assert process.returncode == code, printed
    assert took < 20, f"{took:.1f} s after the signal\n{printed}"
    assert json.loads((output / "run.json").read_text())["status"] == "interrupted"
    kept = load_run(output).cells
    assert 1 <= len(kept) < 10, kept["cell_id"].tolist()  # cells were left unmeasured
    deadline = time.monotonic() + 30
    while task_processes() and time.monotonic() < deadline:
        time.sleep(0.5)
    assert not task_processes()
    if signum != signal.SIGTERM:
        return
    resumed = subprocess.run([sys.executable, "-m", "specbench.cli", "sweep", "--resume", "--output", str(output)],
                             capture_output=True, text=True, env=env, timeout=600)
    assert resumed.returncode == 0, resumed.stdout + resumed.stderr
    cells = load_run(output).cells.set_index("cell_id")
    assert len(cells) == 10 and (cells["status"] == "ok").all()
    assert json.loads((output / "run.json").read_text())["status"] == "complete"
    assert list(cells.loc[kept["cell_id"], "tokens_per_s"]) == list(kept["tokens_per_s"])  # measured once


def test_a_signal_after_the_last_cell_leaves_the_run_complete(tiny_model_dirs, tmp_path, on_cluster):
    """Every planned cell finished, then the signal: the run is complete (check judges it), not
    'interrupted' with 6 of 6 cells."""
    from specbench.grid import EngineOptions, ExecutorOptions, GridOptions, LoadOptions
    from specbench.sweep import SweepConfig, run_sweep

    output = tmp_path / "run"
    config = SweepConfig(grid=GridOptions(target=tiny_model_dirs["target"],
                                          drafts=[tiny_model_dirs["draft"], "ngram:2"], ks=[2], temperatures=[0.0],
                                          workloads=["chat"], max_new_tokens=12, num_prompts=2),
                         load=LoadOptions(batch_sizes=[1, 2]), engine=EngineOptions(dtype="fp64"),
                         executor=ExecutorOptions(name="ray"))
    finished = []

    def stop_after_the_last(event):
        if event.kind == "done":
            finished.append(event.cell.id)
            if len(finished) == 6:
                raise KeyboardInterrupt

    output.mkdir()
    with pytest.raises(KeyboardInterrupt):
        run_sweep(config, resume_dir=output, on_event=stop_after_the_last)
    assert json.loads((output / "run.json").read_text())["status"] == "complete"
    checked = runner.invoke(app, ["check", str(output), "--min-speedup", "0.01"])
    assert checked.exit_code in (0, 1, 3) and "interrupted" not in checked.output, checked.output


def test_an_unreachable_cluster_is_one_line_in_seconds_and_leaves_no_running_run(tiny_model_dirs, tmp_path):
    from specbench.served.server import free_port

    output = tmp_path / "run"
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "specbench.cli", *native_grid(tiny_model_dirs, output),
                             "--executor", "ray", "--ray-address", f"127.0.0.1:{free_port()}"],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2, result.stdout + result.stderr
    assert time.monotonic() - started < 30
    lines = [line for line in result.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "no Ray cluster answers there (Connection refused)" in lines[0], result.stderr
    assert not (output / "run.json").exists()  # no run left saying it is running


def test_a_bracket_closed_on_a_node_reaches_the_run(tiny_model_dirs, tmp_path, on_cluster, monkeypatch):
    """Served repeats bracketed on each node (the stand-in vLLM server, tests/fake_vllm): the
    baselines measured again after the speculative servers change rows that were already sent; the
    run gets them, the cells table's and the other node's copy alike."""
    fake = Path(__file__).parent / "fake_vllm"
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(fake), os.environ.get("PYTHONPATH", "")]))
    output = tmp_path / "run"
    result = runner.invoke(app, ["sweep", "--engine", "vllm", "--target", tiny_model_dirs["target"], "--drafts",
                                 "ngram,ngram:3", "--k", "2", "--batch-sizes", "1", "--temperatures", "0",
                                 "--workloads", "chat", "--max-new-tokens", "12", "--num-prompts", "2", "--repeats",
                                 "2", "--dtype", "fp32", "--server-timeout", "60", "--served-pairing", "bracketed",
                                 "--executor", "ray", "--output", str(output)])
    assert result.exit_code == 0, result.output
    run = load_run(output)
    cells = run.cells.set_index("cell_id")
    baseline = cells.loc["chat|B1|T0|autoregressive"]
    assert baseline["repeats"] == 4  # before and after
    copy = run.baseline_copies.iloc[0]
    assert copy["repeats"] == 4 and copy["node_id"] != baseline["node_id"]
    for row in run.cells[run.cells["mode"] == "speculative"].to_dict("records"):
        own = baseline if row["node_id"] == baseline["node_id"] else copy
        assert row["pairing"] == "bracketed" and list(row["baseline_tokens_per_s_runs"]) == \
            list(own["tokens_per_s_runs"])


# vLLM's own server argument parser and engine config: what `vllm serve ... --speculative-config X`
# does with each X before it loads a model, without the minute a server takes to start (and with
# one import of vLLM for all of them).
VLLM_CONFIG_CHECK = """
import sys
from vllm.engine.arg_utils import AsyncEngineArgs
from vllm.entrypoints.launchers.cli_args import make_arg_parser
from vllm.utils.argparse_utils import FlexibleArgumentParser
for config in sys.argv[2:]:
    try:
        args = make_arg_parser(FlexibleArgumentParser()).parse_args(
            ["--model", sys.argv[1], "--dtype", "float32", "--enforce-eager", "--speculative-config", config])
        speculative = AsyncEngineArgs.from_cli_args(args).create_engine_config().speculative_config
        print("built", speculative.method, speculative.num_speculative_tokens,
              speculative.num_speculative_tokens_per_batch_size)
    except Exception as error:
        print("rejected", type(error).__name__, " ".join(str(error).split()))
"""


@pytest.mark.skipif(importlib.util.find_spec("vllm") is None and os.environ.get("SPECBENCH_REQUIRE_VLLM") != "1",
                    reason="vLLM is not installed")
def test_the_vllm_engine_under_ray_runs_a_k_schedule_as_the_counters_say_and_check_pastes_a_config_vllm_accepts(
        tmp_path, on_cluster):
    """Real vLLM servers on a Ray node: the target drafting for itself under a K schedule (one sweep
    for both, as two cost four server starts, three minutes of CI)."""
    import psutil

    from specbench.grid import SweepConfig
    from specbench.served.vllm_engine import model_path

    output = tmp_path / "run"
    draft = "smollm2-135m@schedule:{1: 3, 2+: 1}"
    result = runner.invoke(app, ["sweep", "--engine", "vllm", "--drafts", draft, "--batch-sizes", "1,4",
                                 "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "16",
                                 "--num-prompts", "4", "--dtype", "fp32", "--enforce-eager", "--executor", "ray",
                                 "--output", str(output)])
    assert result.exit_code == 0, result.output
    run = load_run(output)
    assert (run.cells["status"] == "ok").all()
    cells = run.cells.set_index("cell_id")
    one, four = cells.loc[f"chat|B1|T0|{draft}|K3"], cells.loc[f"chat|B4|T0|{draft}|K1"]
    assert one["lossless"] == "exact" and four["lossless"] == "exact"
    # drafted tokens per draft: 3 with one request in flight; 1 with four (but for the last steps of
    # requests that finish apart, which run with fewer in flight and draft 3)
    assert one["k_drafted_mean"] == pytest.approx(3.0)
    assert 1.0 <= four["k_drafted_mean"] < 1.5, four["k_drafted_mean"]
    assert one["alpha"] >= 0.99 and four["alpha"] >= 0.99  # the target drafting for itself
    # the draft's weights and KV cache come out of the server's pool: fewer tokens fit
    assert one["kv_cache_tokens"] < cells.loc["chat|B1|T0|autoregressive"]["kv_cache_tokens"]
    assert run.cells["engine_version"].str.startswith("0.").all()
    meta = json.loads((output / "run.json").read_text())
    assert meta["engine"]["servers"] and meta["executor"]["groups"][0]["cores"]
    assert not [p for p in psutil.process_iter(["cmdline"])
                if "vllm.entrypoints.openai.api_server" in " ".join(p.info["cmdline"] or [])]
    # one repeat on a busy machine is undecidable (exit 3) and pastes no config: judged as if idle, the
    # path from a passed K schedule to a server that starts is what this part is about
    as_if_idle(output)
    checked = runner.invoke(app, ["check", str(output), "--min-speedup", "0.01"])
    assert checked.exit_code == 0 or (checked.exit_code == 3 and "above what acceptance allows" in checked.output), \
        checked.output
    pasted = checked.output.split("--speculative-config '")[1].split("'")[0]
    config = json.loads(pasted)
    schedule = config["num_speculative_tokens_per_batch_size"]
    assert config["method"] == "draft_model" and schedule[0][:2] == [1, 1]
    # the ranges tile the batch sizes from 1 up, each K at most the config's (vLLM checks neither)
    assert all(later[0] == earlier[1] + 1 for earlier, later in zip(schedule, schedule[1:]))
    assert all(1 <= k <= config["num_speculative_tokens"] for _, _, k in schedule)
    # vLLM's server parses the pasted JSON and builds its speculative config from it (the sweep above
    # already served the same draft under a schedule; a server start here cost a minute of CI)
    broken = pasted.replace("per_batch_size", "per_batch_sizes")  # the check can fail
    checked = subprocess.run([sys.executable, "-c", VLLM_CONFIG_CHECK, model_path("smollm2-135m", SweepConfig()),
                              pasted, broken], capture_output=True, text=True, timeout=300,
                             env={**os.environ, "VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"})
    assert checked.returncode == 0, checked.stderr[-3000:]
    verdicts = [line for line in checked.stdout.splitlines() if line.startswith(("built ", "rejected "))]
    assert len(verdicts) == 2, checked.stdout[-3000:]
    assert verdicts[0].startswith(f"built draft_model {config['num_speculative_tokens']}"), verdicts
    assert verdicts[1].startswith("rejected") and "unexpected_keyword_argument" in verdicts[1], verdicts
