"""A gate a rollout pipeline can trust: exit codes, bad input as one line, SIGTERM, incomplete runs,
resumes that would mix settings, and repeats added until the verdict is decided."""

import json
import os
import signal
import time
from pathlib import Path

import pandas as pd
import pytest

import specbench.native.runner as native_runner
from specbench.cli import main
from specbench.results import load_run, write_json, write_table


def run_cli(argv, capsys) -> tuple[int, str, str]:
    """The installed `specbench` entry point, in process: (exit code, stdout, stderr)."""
    with pytest.raises(SystemExit) as stopped:
        main([str(a) for a in argv])
    out, err = capsys.readouterr()
    return stopped.value.code, out, err


@pytest.fixture(autouse=True)
def default_sigterm():
    """main() installs a SIGTERM handler; leave the test process as it was."""
    yield
    signal.signal(signal.SIGTERM, signal.SIG_DFL)


@pytest.fixture
def crafted(tmp_path):
    """A finished two-batch-size run (speed-ups 1.5× and 0.8×, three paired repeats ±2 %) with a
    run.json config."""
    rows = []
    for b, speedup in ((1, 1.5), (4, 0.8)):
        rows.append({"cell_id": f"chat|B{b}|T0|autoregressive", "status": "ok", "mode": "autoregressive",
                     "workload": "chat", "draft": "autoregressive", "k": 0, "batch_size": b, "temperature": 0.0,
                     "tokens_per_s": 10.0 * b, "speedup": 1.0, "tokens_per_s_runs": [10.0 * b] * 3})
        rows.append({"cell_id": f"chat|B{b}|T0|ngram|K2", "status": "ok", "mode": "speculative", "workload": "chat",
                     "draft": "ngram", "k": 2, "batch_size": b, "temperature": 0.0, "tokens_per_s": 10.0 * b * speedup,
                     "speedup": speedup, "speedup_runs": [speedup * 0.98, speedup, speedup * 1.02]})
    run_dir = tmp_path / "run"
    run_dir.mkdir()
    write_table(run_dir, "cells", pd.DataFrame(rows))
    write_json(run_dir / "run.json", {"status": "complete", "plan": {"cells": 4}, "hardware": {"gpus": []},
                                      "config": {"target": "smollm2-135m", "max_new_tokens": 48, "seed": 0,
                                                 "drafts": ["ngram"], "ks": [2], "batch_sizes": [1, 4],
                                                 "temperatures": [0.0], "workloads": ["chat"]}})
    return run_dir


def big_prompt_file(tmp_path):
    path = tmp_path / "big.jsonl"
    path.write_text(json.dumps({"prompt": "word " * 2_000_000}) + "\n")  # one 10 MB line
    return path


# a committed vLLM CPU trace replay swept without --slo (issue 40's wide sitting)
REPLAY_WITHOUT_SLO = Path(__file__).resolve().parents[1] / "tests/fixtures/cpu/vllm-replays/conv-600-0.1"

BAD_INPUTS = [  # (argv after `specbench`, words of the one-line message); every one exits 2
    (["sweep", "--drafts", "self:0"], "at least 1 layer"),
    (["sweep", "--drafts", "self:100"], "smollm2-135m has 30 layers; a self-draft uses fewer"),
    (["sweep", "--drafts", "ngram:abc"], "write ngram or ngram:N"),
    (["sweep", "--max-new-tokens", "100000"], "has a 8192-token context"),
    (["sweep", "--workloads", "{big}"], "10,000,000 characters, over the size limit"),
    (["sweep", "--until-decided", "--max-repeats", "1"], "--max-repeats must be at least 2"),
    (["sweep", "--max-repeats", "6"], "--max-repeats is --until-decided's budget: add --until-decided"),
    (["sweep", "--context-lengths", "1k,x"], "--context-lengths: 'x' is not a number of tokens (512, 4k, 1.5k, 1m)"),
    (["check", "{run}", "--context-length", "abc"], "--context-length: 'abc' is not a number of tokens"),
    (["plan", "{run}", "--context-lengths", "32k"], "--context-lengths 32768 + --max-new-tokens 48 needs"),
    (["check", "{run}", "--context-length", "0.3"], "--context-length: '0.3' is not a whole, positive number"),
    (["sweep", "--min-speedup", "0"], "--min-speedup must be a positive number"),
    (["check", "{run}", "--min-speedup", "nan"], "--min-speedup must be a positive number, got nan"),
    (["check", "{run}", "--min-speedup", "-1"], "--min-speedup must be a positive number"),
    (["check", "{run}", "--batch-sizes", "0"], "--batch-sizes must be >= 1"),
    (["check", "{run}", "--bogus"], "No such option: --bogus"),
    (["report", "{run}", "--gpu-price", "-1"], "--gpu-price must be a number of dollars >= 0"),
    (["plan", "{run}", "--gpu-price", "-1"], "--gpu-price must be a number of dollars >= 0"),
    (["report", "{run}", "--output", "{file}/report"], "Not a directory"),
    (["sweep", "--resume", "--output", "{run}", "--max-new-tokens", "64"],
     "--resume would mix cells measured under other settings: --max-new-tokens 64 (the run: 48)"),
    (["check", "{nowhere}"], "is not a specbench run"),
    (["sweep", "--executor", "spark"], "--executor must be one of local, ray, got 'spark'"),
    (["sweep", "--ray-address", "10.0.0.1:6379"], "--ray-address needs --executor ray"),
    (["sweep", "--executor", "ray", "--until-decided"], "--until-decided adds repeats on the local executor only"),
    (["sweep", "--engine", "vllm", "--pipeline-parallel-size", "2"],
     "speculative decoding with --pipeline-parallel-size > 1 has open vLLM bugs (#49355, #57755)"),
    # a dry run refuses what the run would, before printing any plan
    (["sweep", "--dry-run", "--target", "foo-7b"], "unknown model 'foo-7b'"),
    (["sweep", "--dry-run", "--output", "{file}"], "is a file, not a directory"),
    # valid JSON that is not a request object was a TypeError, exit 4
    (["sweep", "--engine", "vllm", "--trace", "{not-an-object}"], "line 2 is JSON but not an object (list)"),
    (["sweep", "--engine", "vllm", "--trace", "azure-conv", "--trace-window", "0:inf"],
     "DURATION a finite number > 0"),
    # never silently ignored on a run judged by its SLO
    (["check", "{run}", "--slo", "ttft=1", "--min-speedup", "1.0"], "--min-speedup judges speed-ups at batch sizes"),
    (["check", "{run}", "--slo", "ttft=1", "--batch-sizes", "4"], "--batch-sizes judges speed-ups at batch sizes"),
    # a trace replay swept without --slo: check names what it is and what it needs
    (["check", "{replay}"], "a trace replay is judged against an SLO (its sweep was given none): pass --slo"),
]


@pytest.mark.parametrize("argv, message", BAD_INPUTS, ids=[" ".join(a[:3]) for a, _ in BAD_INPUTS])
def test_bad_input_is_one_line_and_exit_2(argv, message, crafted, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(native_runner, "load_models", lambda *a: pytest.fail("loaded models"))
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a-file").write_text("")
    (tmp_path / "trace.jsonl").write_text('{"timestamp": 0, "input_length": 100, "output_length": 5}\n[1, 2, 3]\n')
    names = {"{run}": str(crafted), "{file}": str(tmp_path / "a-file"), "{nowhere}": str(tmp_path / "nowhere"),
             "{big}": str(big_prompt_file(tmp_path)), "{not-an-object}": str(tmp_path / "trace.jsonl"),
             "{replay}": str(REPLAY_WITHOUT_SLO)}
    argv = [next((arg.replace(k, v) for k, v in names.items() if k in arg), arg) for arg in argv]
    code, out, err = run_cli(argv, capsys)
    lines = [line for line in (out + err).splitlines() if line.strip()]
    assert code == 2, out + err
    assert message in out + err, out + err
    if "--bogus" not in argv:  # typer's own usage message has its usage lines
        assert len(lines) == 1, lines
    assert json.loads((crafted / "run.json").read_text())["config"]["max_new_tokens"] == 48  # nothing rewritten


def test_an_internal_error_is_exit_4_never_0_or_1(crafted, capsys, monkeypatch):
    import specbench.gate

    def broken(*args, **kwargs):
        raise IndexError("list index out of range")

    monkeypatch.setattr(specbench.gate, "evaluate", broken)
    code, out, err = run_cli(["check", crafted], capsys)
    assert code == 4 and "internal error" in err and "IndexError: list index out of range" in err
    traceback_file = err.split("traceback in ")[1].split()[0]
    assert "IndexError" in open(traceback_file).read() and len(err.strip().splitlines()) == 1


DAMAGED = [  # (how the run is damaged, words of the one-line message); exit 2 on every command, never 4
    ("dropped column", "lacks column(s) mode"),
    ("empty table", "has no rows"),
    ("text speed-ups", "column speedup holds str values ('fast'), not numbers"),
    ("deleted cells", "cells.parquet is missing, although the sweep wrote cells"),
    ("invalid run.json", "run.json is not valid JSON (Expecting value, line 1)"),
    ("a list for run.json", "is not a specbench run.json"),
    ("empty run.json object", "is not a specbench run.json (a JSON object with the sweep's status and config)"),
]


@pytest.mark.parametrize("damage, message", DAMAGED, ids=[d for d, _ in DAMAGED])
@pytest.mark.parametrize("command", ["check", "report", "plan"])
def test_a_damaged_run_is_bad_input_naming_the_file(damage, message, command, crafted, capsys):
    cells = pd.read_parquet(crafted / "cells.parquet")
    if damage == "dropped column":
        write_table(crafted, "cells", cells.drop(columns=["mode"]))
    elif damage == "empty table":
        write_table(crafted, "cells", cells.iloc[0:0])
    elif damage == "text speed-ups":
        write_table(crafted, "cells", cells.assign(speedup="fast"))
    elif damage == "deleted cells":
        (crafted / "cells.parquet").unlink()
    elif damage == "invalid run.json":
        (crafted / "run.json").write_text("")
    elif damage == "a list for run.json":
        (crafted / "run.json").write_text("[]")
    else:
        (crafted / "run.json").write_text("{}")
    code, out, err = run_cli([command, str(crafted)], capsys)
    assert code == 2 and message in out + err and len((out + err).strip().splitlines()) == 1, out + err
    if command == "check":  # a pipeline's verdict.json is never empty
        code, out, _ = run_cli([command, str(crafted), "--json"], capsys)
        assert code == 2 and json.loads(out)["verdict"] == "CANNOT ANSWER"


def test_check_json_is_written_even_on_an_internal_error(crafted, capsys, monkeypatch):
    import specbench.gate

    monkeypatch.setattr(specbench.gate, "evaluate", lambda *a, **k: [][0])
    code, out, err = run_cli(["check", crafted, "--json"], capsys)
    payload = json.loads(out)
    assert code == 4 and payload["exit_code"] == 4 and "IndexError" in payload["message"] and "internal error" in err


def test_check_codes_pass_fail_and_json(crafted, capsys):
    assert run_cli(["check", crafted, "--batch-sizes", "1"], capsys)[0] == 0
    code, out, _ = run_cli(["check", crafted], capsys)
    answer, header, row = out.splitlines()[:3]
    assert code == 1 and answer == "FAIL (exit 1): speculation with ngram is below 1× at B=4 (0.800×)", out
    assert header.split()[:4] == ["draft", "verdict", "B=1", "B=4"] and row.split()[:2] == ["ngram", "FAIL"], out
    assert "ngram: one K measured, so no K comparison" in out
    code, out, _ = run_cli(["check", crafted, "--json"], capsys)
    payload = json.loads(out)
    assert code == 1 and payload["verdict"] == "FAIL" and payload["warnings"] == [] and payload["incomplete"] == ""


def two_turn_sweep(target: str, output) -> list:
    """A native sweep of two turns: B=1's two cells, then B=3's."""
    return ["sweep", "--target", target, "--drafts", "ngram:2", "--k", "1", "--batch-sizes", "1,3",
            "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "6", "--num-prompts", "3",
            "--dtype", "fp64", "--output", output]


def test_sigterm_ends_a_sweep_like_ctrl_c_and_check_says_incomplete(tiny_model_dirs, tmp_path, capsys, monkeypatch):
    original = native_runner.CellRun.measure

    def terminated(run, repeat):
        if run.cell.id == "chat|B3|T0|autoregressive":  # a real SIGTERM, to this process, mid-sweep
            os.kill(os.getpid(), signal.SIGTERM)
        return original(run, repeat)

    monkeypatch.setattr(native_runner.CellRun, "measure", terminated)
    output = tmp_path / "run"
    args = two_turn_sweep(tiny_model_dirs["target"], output)
    code, _, err = run_cli(args, capsys)
    assert code == 143 and "interrupted" in err
    run = load_run(output)
    assert run.meta["status"] == "interrupted" and len(run.cells) == 2  # B=1's cells kept
    code, out, _ = run_cli(["check", output], capsys)
    assert code == 2 and "incomplete evidence: the sweep is interrupted: 2 of 4 planned cells finished" in out
    monkeypatch.undo()
    code, out, _ = run_cli(["sweep", "--resume", "--output", output], capsys)  # the run's own settings
    assert code == 0 and load_run(output).meta["status"] == "complete", out


@pytest.mark.parametrize("signum, code", [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_a_stop_signal_lost_on_its_way_still_stops_the_sweep_before_the_next_cell(
        signum, code, tiny_model_dirs, tmp_path, capsys, monkeypatch):
    """A signal's exception raised inside a finaliser is only printed by Python, and a library may
    catch it (CI once saw a Ctrl-C end a sweep with 1, and here one finished the whole grid)."""
    original = native_runner.CellRun.measure

    def swallowed(run, repeat):
        if run.cell.id == "chat|B1|T0|autoregressive":
            try:  # the signal arrives where its exception is swallowed
                signal.raise_signal(signum)
                time.sleep(0.01)
            except KeyboardInterrupt:
                pass
        return original(run, repeat)

    monkeypatch.setattr(native_runner.CellRun, "measure", swallowed)
    output = tmp_path / "run"
    args = two_turn_sweep(tiny_model_dirs["target"], output)
    # Ctrl-C reaches a foreground job: Python's own handler, even where this suite inherited SIGINT
    # ignored (a job CI starts in the background), which main() then leaves ignored
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        assert run_cli(args, capsys)[0] == code
    finally:
        signal.signal(signal.SIGINT, previous)
    run = load_run(output)  # the cells measuring when it came finished (B=1's turn); B=3's never started
    assert run.meta["status"] == "interrupted" and set(run.cells["batch_size"]) == {1}


def test_resume_takes_the_runs_settings_and_extends_its_grid(tiny_model_dirs, tmp_path, capsys):
    output = tmp_path / "run"
    base = ["sweep", "--target", tiny_model_dirs["target"], "--drafts", "ngram:2", "--k", "1", "--temperatures", "0",
            "--workloads", "chat", "--max-new-tokens", "6", "--num-prompts", "2", "--dtype", "fp64", "--output", output]
    assert run_cli(base + ["--batch-sizes", "1"], capsys)[0] == 0
    code, out, _ = run_cli(["sweep", "--resume", "--output", output, "--batch-sizes", "1,2"], capsys)
    assert code == 0 and "--batch-sizes 1,2 replaces the run's 1: its cells already measured are kept" in out
    run = load_run(output)
    assert len(run.cells) == 4 and run.meta["config"]["grid"]["max_new_tokens"] == 6 \
        and run.meta["config"]["load"]["batch_sizes"] == [1, 2]
    code, _, err = run_cli(["sweep", "--resume", "--output", output, "--seed", "3", "--dtype", "fp32"], capsys)
    assert code == 2 and "--seed 3 (the run: 0)" in err and "--dtype fp32 (the run: fp64)" in err


@pytest.mark.parametrize("ratios, said, repeats", [
    ([1.1, 1.2, 1.15, 1.25], "decided: PASS", 4),  # two repeats leave it open, four decide it
    ([0.9, 1.15, 0.95, 1.2], "budget spent: 8 repeats (--max-repeats) and still INCONCLUSIVE", 8),
])
def test_until_decided_adds_repeats_until_decided_or_its_budget(ratios, said, repeats, tiny_model_dirs, tmp_path,
                                                                capsys, monkeypatch):
    """Speed-ups that straddle 1× (a fake clock sets every repeat's tokens/s): --until-decided
    doubles the repeats of the cells that leave the verdict open, and says which way it ended."""
    import itertools

    spread = itertools.cycle(ratios)
    finish = native_runner.CellRun.finish

    def fake_clock(run):
        outcome = finish(run)
        runs = [100.0 * (next(spread) if run.cell.is_speculative else 1.0) for _ in outcome.row["tokens_per_s_runs"]]
        outcome.row.update(tokens_per_s_runs=runs, tokens_per_s=float(pd.Series(runs).median()))
        if run.cell.is_speculative:  # acceptance that allows the faked speed-ups (up to 2x), whatever was timed
            outcome.row.update(accepted=outcome.row["output_tokens"] // 2, step_draft_s=0.0)
        return outcome

    monkeypatch.setattr(native_runner.CellRun, "finish", fake_clock)
    output = tmp_path / "run"
    args = ["sweep", "--target", tiny_model_dirs["target"], "--drafts", "ngram:2", "--k", "1", "--batch-sizes", "1",
            "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "6", "--num-prompts", "2",
            "--dtype", "fp64", "--repeats", "2", "--until-decided", "--max-repeats", "8", "--output", output]
    code, out, _ = run_cli(args, capsys)
    assert code == 0, out
    run = load_run(output)
    assert run.meta["until_decided"].startswith(said) and f"--until-decided: {said}" in out
    cells = run.cells.set_index("cell_id")
    speculative, baseline = cells.loc["chat|B1|T0|ngram:2|K1"], cells.loc["chat|B1|T0|autoregressive"]
    assert speculative["repeats"] == baseline["repeats"] == repeats  # both, taking turns
    assert list(speculative["speedup_runs"]) == pytest.approx(list(itertools.islice(itertools.cycle(ratios), repeats)))
    assert sorted(set(run.requests["repeat"])) == list(range(repeats)) and speculative["lossless"] == "exact"
    code, out, _ = run_cli(["check", output], capsys)
    assert code == (0 if said.startswith("decided") else 3), out
    if code == 3:  # its budget spent: the advice is a bigger budget, not the same command again
        assert "--until-decided already spent its budget here (8 repeats)" in out and "--max-repeats 16" in out
    code, out, _ = run_cli([*args[:-2], "--output", tmp_path / "dry", "--dry-run"], capsys)
    assert code == 0 and "--until-decided: at most 32 requests, 192 output tokens" in out, out  # the worst case


def test_a_planned_cell_without_a_row_blocks_only_the_verdicts_it_touches(crafted, capsys):
    meta = json.loads((crafted / "run.json").read_text())
    meta["config"]["batch_sizes"] = [1, 4, 16]  # B=16 planned, never measured, in a run that says complete
    write_json(crafted / "run.json", meta)
    code, out, _ = run_cli(["check", crafted, "--batch-sizes", "1"], capsys)
    assert code == 0, out  # B=16 is not judged
    code, out, _ = run_cli(["check", crafted, "--batch-sizes", "1,16"], capsys)
    assert code == 2 and "no measurement at batch size(s) 16" in out
    meta["config"]["temperatures"] = [0.0, 0.7]  # T=0.7 planned too: the worst case could be there
    write_json(crafted / "run.json", meta)
    code, out, _ = run_cli(["check", crafted, "--batch-sizes", "1"], capsys)
    assert code == 2 and "2 cell(s) it judges were planned but have no row (chat|B1|T0.7|autoregressive" in out
    assert run_cli(["check", crafted, "--batch-sizes", "1", "--temperatures", "0"], capsys)[0] == 0


def test_the_intervals_cover_at_their_nominal_rate():
    """Speed-up intervals (t on log ratios) and percentile intervals (order statistics) cover the
    true value in at least ~95 % of simulated runs; a p99 of a dozen requests is never bounded."""
    import math

    import numpy as np

    from specbench.fit import percentile_interval, requests_to_bound, speedup_interval

    rng = np.random.default_rng(0)
    trials = 400
    speedups = [speedup_interval(np.exp(rng.normal(math.log(1.1), 0.05, size=3))) for _ in range(trials)]
    assert 0.92 <= np.mean([low <= 1.1 <= high for low, high in speedups]) <= 0.99
    p90 = -math.log(0.1)  # of an exponential with mean 1
    percentiles = [percentile_interval(rng.exponential(size=60), 90) for _ in range(trials)]
    assert np.mean([low <= p90 <= high for low, high in percentiles]) >= 0.93
    assert percentile_interval(np.arange(12.0), 99)[1] == math.inf  # 12 requests cannot bound a p99 from above
    assert [requests_to_bound(p) for p in (99, 95, 90, 50)] == [368, 72, 36, 6]
    assert percentile_interval(rng.random(368), 99)[1] <= 1.0


def test_a_closed_output_pipe_and_sigterm_outside_a_sweep_are_not_verdicts(crafted, capsys, monkeypatch):
    import specbench.cli as cli

    def closed(*args, **kwargs):
        raise BrokenPipeError(32, "Broken pipe")  # as when `specbench check | head -1` stops reading

    monkeypatch.setattr(cli.console, "print", closed)
    assert run_cli(["check", crafted], capsys)[0] == 141
    monkeypatch.undo()
    import specbench.gate

    def terminated(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(specbench.gate, "evaluate", terminated)
    assert run_cli(["check", crafted], capsys)[0] == 143


def test_a_cluster_runs_nodes_are_compared_and_no_speedup_crosses_two_gpu_models(crafted, capsys):
    run = load_run(crafted)
    cells = run.cells.assign(node_id=["n1", "n1", "n2", "n2"], host=["a", "a", "b", "b"],
                             gpu_model=["NVIDIA H100", "NVIDIA H100", "NVIDIA A100", "NVIDIA A100"])
    write_table(crafted, "cells", cells)
    code, _, err = run_cli(["check", crafted], capsys)
    assert code == 2 and "2 kinds of hardware (NVIDIA A100; NVIDIA H100)" in err and "--hardware" in err
    code, out, _ = run_cli(["check", crafted, "--hardware", "h100", "--batch-sizes", "1"], capsys)
    assert code == 0, out  # the H100 node's B=1 cells alone
    assert run_cli(["check", crafted, "--hardware", "B200"], capsys)[0] == 2

    # one node's copy of a baseline: within noise it is a calibration, beyond it a warning naming both nodes
    write_table(crafted, "cells", cells.assign(gpu_model="NVIDIA H100"))
    baseline = cells.iloc[0].to_dict()
    for speed, warned in ((10.1, False), (14.0, True)):
        copy = {**baseline, "node_id": "n2", "host": "b", "tokens_per_s": speed, "tokens_per_s_runs": [speed] * 3}
        copy["tokens_per_s_runs"] = [speed * 0.99, speed, speed * 1.01]
        write_table(crafted, "baseline_copies", pd.DataFrame([copy]))
        code, out, _ = run_cli(["check", crafted, "--batch-sizes", "1", "--json"], capsys)
        said = [w for w in json.loads(out)["warnings"] if "faster on" in w]
        assert code == 0 and bool(said) == warned, said
    assert "1.40× faster on b (n2) than on a (n1)" in said[0] and "interval" in said[0]


@pytest.mark.integration
def test_a_report_stopped_half_way_leaves_the_earlier_report_and_no_partial_one(tmp_path, capsys, monkeypatch):
    import shutil
    from pathlib import Path

    import specbench.report.charts as report

    run_dir = tmp_path / "run"
    shutil.copytree(Path(__file__).resolve().parent / "fixtures" / "cpu" / "default-grid-profiled",
                    run_dir)
    shutil.rmtree(run_dir / "report", ignore_errors=True)
    meta = json.loads((run_dir / "run.json").read_text())
    meta["hardware"]["cpu_flags"] = ["avx2"]  # what a run records since the CPU's extensions were (the title says them)
    (run_dir / "run.json").write_text(json.dumps(meta))
    code, out, err = run_cli(["report", run_dir], capsys)
    assert code == 0 and (run_dir / "report" / "report.html").exists(), err
    assert "AMD EPYC (avx2; CPU only)" in (run_dir / "report" / "report.html").read_text()
    before = {p.name: p.read_bytes() for p in (run_dir / "report").iterdir()}

    def pressed_ctrl_c(*args):
        raise KeyboardInterrupt

    monkeypatch.setitem(report.DRAWERS, "memory", pressed_ctrl_c)
    code, out, err = run_cli(["report", run_dir], capsys)
    assert code == 130 and "interrupted: no report written" in err, err
    assert {p.name: p.read_bytes() for p in (run_dir / "report").iterdir()} == before  # untouched, not half new
    assert sorted(p.name for p in run_dir.iterdir() if p.name.startswith(".report")) == []  # no staging left
    shutil.rmtree(run_dir / "report")
    code, out, err = run_cli(["report", run_dir], capsys)
    assert code == 130 and not (run_dir / "report").exists()  # none at all rather than a partial one
