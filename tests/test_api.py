"""specbench.api: the commands' answers as result objects. `api.check` gives `specbench check`'s
verdict and exit code on the committed runs, and the gate cannot be asked without a run's
completeness and noise tables."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from typer.testing import CliRunner

from specbench import api
from specbench.cli import app
from specbench.gate import evaluate, evaluate_slo

ROOT = Path(__file__).resolve().parents[1]
GRAPHS = ROOT / "tests/fixtures/gpu/h100-2026-11-23/synthetic-llama3-8b-1b-graphs"
CONTEXT = ROOT / "tests/fixtures/gpu/h100-2026-11-23/synthetic-llama3-8b-1b-context"  # stopped before its last cells
PROFILED = ROOT / "tests/fixtures/cpu/default-grid-profiled"
VLLM_LOCAL = ROOT / "tests/fixtures/cpu/vllm-local"
VLLM_RAY = ROOT / "tests/fixtures/cpu/vllm-ray"
DEFAULT = ROOT / "tests/fixtures/cpu/default-grid"
REPLAY = ROOT / "tests/fixtures/cpu/vllm-replays/conv-600-0.1"  # open loop, swept without --slo
CACHED = ROOT / "tests/fixtures/cpu/vllm-prefix-cached"

# (run, the command's options, api.check's arguments, the exit code both give today)
CASES = [
    (GRAPHS, [], {}, 3),
    (CONTEXT, [], {}, 2),
    (PROFILED, [], {}, 1),
    (VLLM_LOCAL, [], {}, 3),
    (VLLM_RAY, [], {}, 3),
    (DEFAULT, [], {}, 1),
    (GRAPHS, ["--batch-sizes", "1", "--min-speedup", "1.2"], {"batch_sizes": [1], "min_speedup": 1.2}, 0),
    (GRAPHS, ["--batch-sizes", "64", "--min-speedup", "1.5"], {"batch_sizes": [64], "min_speedup": 1.5}, 1),
    (CONTEXT, ["--context-length", "4k", "--allow-incomplete"], {"context_length": 4096, "allow_incomplete": True}, 1),
    (PROFILED, ["--workloads", "code", "--temperatures", "0", "--batch-sizes", "1"],
     {"workloads": ["code"], "temperatures": [0.0], "batch_sizes": [1]}, 3),
    (DEFAULT, ["--draft", "ngram", "--min-speedup", "0.2"], {"draft": "ngram", "min_speedup": 0.2}, 0),
    (REPLAY, ["--slo", "ttft=100,tpot=10,p50"], {"slo": "ttft=100,tpot=10,p50"}, 0),
    (REPLAY, ["--slo", "ttft=2,tpot=0.1"], {"slo": "ttft=2,tpot=0.1"}, 2),
    (CACHED, ["--slo", "ttft=100,tpot=10,p50"], {"slo": "ttft=100,tpot=10,p50"}, 2),
]


def cli_check(run: Path, options: list[str]) -> tuple[int, dict]:
    done = CliRunner().invoke(app, ["check", str(run), *options, "--json"])
    return done.exit_code, json.loads(done.stdout)


@pytest.mark.parametrize("run, options, arguments, exit_code", CASES,
                         ids=[f"{run.name} {' '.join(options)}" for run, options, _, _ in CASES])
def test_check_gives_the_commands_verdict(run, options, arguments, exit_code):
    result = api.check(run, **arguments)
    code, printed = cli_check(run, options)
    assert result.exit_code == code
    assert code == exit_code
    assert json.loads(json.dumps(result.verdict.to_dict())) == printed
    assert result.judges_slo == ("slo" in arguments)


@pytest.mark.parametrize("run, options, arguments, words", [
    (REPLAY, [], {}, "a trace replay is judged against an SLO (its sweep was given none)"),
    (REPLAY, ["--slo", "ttft=1", "--batch-sizes", "4"], {"slo": "ttft=1", "batch_sizes": [4]},
     "--batch-sizes judges speed-ups at batch sizes"),
    (GRAPHS, ["--min-speedup", "-1"], {"min_speedup": -1.0}, "--min-speedup must be a positive number, got -1"),
    (GRAPHS, ["--batch-sizes", "0"], {"batch_sizes": [0]}, "--batch-sizes must be >= 1, got 0"),
    (GRAPHS, ["--context-length", "8k"], {"context_length": 8192}, "--context-length 8192: the run measured"),
])
def test_check_refuses_as_the_command_does(run, options, arguments, words):
    with pytest.raises(api.UsageError, match="^" + words.replace("(", r"\(").replace(")", r"\)")) as refused:
        api.check(run, **arguments)
    code, printed = cli_check(run, options)
    assert code == 2 and printed["message"] == str(refused.value)


def test_the_gate_needs_the_runs_completeness_and_noise():
    """Left out, `state` would judge a stopped run as complete and the noise band would lack the
    run's requests and steps, so api.check's verdict and a bare evaluate's would differ: they must be
    named."""
    run = api.check(CONTEXT).run
    with pytest.raises(TypeError):
        evaluate(run.cells, [16])
    with pytest.raises(TypeError):
        evaluate_slo(run.cells, run.requests, None)
    as_complete = evaluate(run.cells, [1, 4, 16, 64], state=None, requests=run.requests, steps=run.steps)
    assert api.check(CONTEXT).exit_code == 2 != as_complete.exit_code  # the stopped run is no verdict


def test_importing_the_api_loads_no_pandas():
    probe = "import sys, specbench.api; print(sorted(m for m in sys.modules if m in ('pandas', 'torch')))"
    done = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, timeout=60)
    assert done.stdout.strip() == "[]", done.stderr[-2000:]


@pytest.mark.parametrize("run, options, arguments", [
    (GRAPHS, [], {}),
    (GRAPHS, ["--alpha", "0.7", "--k", "1,2", "--batch-sizes", "1,8", "--device", "h200"],
     {"alpha": 0.7, "ks": [1, 2], "batch_sizes": [1, 8], "device": "h200"}),
    (PROFILED, ["--acceptance", str(DEFAULT)], {"acceptance": DEFAULT}),
])
def test_predict_gives_the_plan_commands_answer(run, options, arguments):
    prediction = api.predict(run, **arguments)
    done = CliRunner().invoke(app, ["plan", str(run), *options, "--json"])
    assert done.exit_code == 0, done.output
    assert json.loads(json.dumps(prediction.to_dict())) == json.loads(done.stdout)
    assert not prediction.table.empty and prediction.step_times_from == run
    assert set(prediction.table["batch_size"]) >= set(arguments.get("batch_sizes", [1, 64]))


def test_predict_refuses_as_the_command_does():
    with pytest.raises(api.UsageError, match=r"--alpha must be in \[0, 1\), got 2"):
        api.predict(GRAPHS, alpha=2.0)
    with pytest.raises(api.UsageError, match="--k, --batch-sizes, --context-lengths and --max-new-tokens must be >= 1"):
        api.predict(GRAPHS, ks=[0])


SHARED = ROOT / "tests/fixtures/traces/prefix-shared.jsonl"  # 16 prompts under one system prompt
PREFIX_CALIBRATION = ROOT / "tests/fixtures/cpu/vllm-prefix-calibration"  # its closed-loop calibration


def cli_plan(options: list[str]) -> dict:
    done = CliRunner().invoke(app, ["plan", *options, "--json"])
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def without_seconds(answer: dict) -> dict:
    return {key: value for key, value in json.loads(json.dumps(answer)).items() if key != "seconds"}


@pytest.mark.parametrize("call, options", [
    (lambda: api.price("llama3-70b", drafts=["mtp:3"], tp=[8, 4], batch_sizes=[48, 56], alpha="0.8105"),
     ["--target", "llama3-70b", "--drafts", "mtp:3", "--tp", "8,4", "--batch-sizes", "48,56", "--alpha", "0.8105"]),
    (lambda: api.price("llama3-70b", drafts=["1b", "ngram"], tp=[4], alpha=0.7, acceptance=DEFAULT, ks=[2],
                       batch_sizes=[1, 64], slo="tpot=0.03"),
     ["--target", "llama3-70b", "--drafts", "1b,ngram", "--tp", "4", "--alpha", "0.7", "--acceptance", str(DEFAULT),
      "--k", "2", "--batch-sizes", "1,64", "--slo", "tpot=0.03"]),
    (lambda: api.closed_loop("llama3-8b", drafts=["1b"], alpha=0.7, ks=[2], concurrency=[4], input_len=512,
                             output_len=64, slo="ttft=1,tpot=0.02"),
     ["--target", "llama3-8b", "--drafts", "1b", "--alpha", "0.7", "--k", "2", "--concurrency", "4", "--input-len",
      "512", "--output-len", "64", "--slo", "ttft=1,tpot=0.02"]),
    pytest.param(lambda: api.closed_loop_on_run(VLLM_LOCAL, concurrency=[1, 8], input_len=51, output_len=32),
                 [str(VLLM_LOCAL), "--concurrency", "1,8", "--input-len", "51", "--output-len", "32"],
                 marks=pytest.mark.integration),
    (lambda: api.size_fleet("llama3-8b", drafts=["1b"], alpha=0.7, ks=[2], trace=str(SHARED), slo="ttft=1,tpot=0.05,p90"),
     ["--target", "llama3-8b", "--drafts", "1b", "--alpha", "0.7", "--k", "2", "--trace", str(SHARED), "--slo",
      "ttft=1,tpot=0.05,p90"]),
    (lambda: api.size_fleet_on_run(PREFIX_CALIBRATION, trace=str(SHARED), slo="ttft=2,tpot=0.1,p90",
                                   prefix_caching=True),
     [str(PREFIX_CALIBRATION), "--trace", str(SHARED), "--slo", "ttft=2,tpot=0.1,p90", "--prefix-caching"]),
    (lambda: api.fleet_as_is("llama3-8b", drafts=["1b"], alpha=0.7, ks=[2], trace=str(SHARED), replicas=2,
                             scales=[1, 4], slo="ttft=1,tpot=0.05,p90"),
     ["--target", "llama3-8b", "--drafts", "1b", "--alpha", "0.7", "--k", "2", "--trace", str(SHARED), "--replicas",
      "2", "--trace-speedup", "1,4", "--slo", "ttft=1,tpot=0.05,p90"]),
    (lambda: api.fleet_as_is_on_run(PREFIX_CALIBRATION, trace=str(SHARED), replicas=2, prefix_caching=True),
     [str(PREFIX_CALIBRATION), "--trace", str(SHARED), "--replicas", "2", "--prefix-caching"]),
], ids=["price mtp", "price acceptance and slo", "closed loop", "closed loop on a run", "fleet", "fleet on a run",
        "given fleet", "given fleet on a run"])
def test_the_planning_functions_give_the_plan_commands_answer(call, options):
    answer = call()
    assert without_seconds(answer.to_dict()) == without_seconds(cli_plan(options))
    assert not answer.table.empty


@pytest.mark.parametrize("call, options, words", [
    (lambda: api.price("llama3-70b", drafts=["1b"], tp=[4]), ["--target", "llama3-70b", "--drafts", "1b", "--tp", "4"],
     "planning on the tables needs an acceptance"),
    (lambda: api.price("llama3-70b", drafts=["1b"], tp=[4], alpha=0.7, slo="ttft=1"),
     ["--target", "llama3-70b", "--drafts", "1b", "--tp", "4", "--alpha", "0.7", "--slo", "ttft=1"],
     "--slo on the tables takes a TPOT target only"),
    (lambda: api.price("llama3-70b", drafts=["1b"], tp=[4], draft_tp=2, alpha=0.7),
     ["--target", "llama3-70b", "--drafts", "1b", "--tp", "4", "--draft-tp", "2", "--alpha", "0.7"],
     "--draft-tp must be 1 or the target's TP"),
    (lambda: api.closed_loop("llama3-70b", drafts=["1b"], tp=[4], alpha=0.7, concurrency=[4], clients="foo"),
     ["--target", "llama3-70b", "--drafts", "1b", "--tp", "4", "--alpha", "0.7", "--concurrency", "4", "--clients",
      "foo"], "--clients must be one of"),
    (lambda: api.closed_loop_on_run(VLLM_LOCAL, concurrency=[4], input_len=9000, output_len=64),
     [str(VLLM_LOCAL), "--concurrency", "4", "--input-len", "9000", "--output-len", "64"],
     "--input-len 9000 + --output-len 64: 9064 tokens a request"),
    (lambda: api.size_fleet("llama3-70b", drafts=["1b"], tp=[4], alpha=0.7, trace="azure-conv", slo="ttft=1",
                            router="foo"),
     ["--target", "llama3-70b", "--drafts", "1b", "--tp", "4", "--alpha", "0.7", "--trace", "azure-conv", "--slo",
      "ttft=1", "--router", "foo"], "--router must be one of"),
    (lambda: api.size_fleet_on_run(DEFAULT, trace="azure-conv", slo="ttft=1"),
     [str(DEFAULT), "--trace", "azure-conv", "--slo", "ttft=1"], f"{DEFAULT}: a native run"),
], ids=["no acceptance", "a TTFT on the tables", "draft TP", "clients", "past the context", "router", "native run"])
def test_the_planning_functions_refuse_as_the_command_does(call, options, words):
    with pytest.raises(api.UsageError) as refused:
        call()
    done = CliRunner().invoke(app, ["plan", *options])
    assert done.exit_code == 2 and words in str(refused.value)
    assert " ".join(done.output.split()) == " ".join(f"error: {refused.value}".split())  # (the line wraps)
