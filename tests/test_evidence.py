"""No verdict without evidence: a speed-up acceptance cannot explain, a single comparison inside the
run's noise, served repeats that did not run side by side, and a busy-machine measure that leaves
out specbench's own processes. Each case is built from a real run: a sweep here, a committed one
under tests/fixtures/, or a served sweep against the stand-in server on a drifting machine."""

from __future__ import annotations

import json
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.fit.noise import cell_interval, run_noise, unpaired_interval
from specbench.fit.physics import speedup_bound, tokens_per_forward
from specbench.fit.trust import busy_machine, late_sends, trace_lengths
from specbench.fit.warnings import measurement_warnings
from specbench.results import load_run, write_table
from specbench.schema import BRACKETED, SEQUENTIAL, SIDE_BY_SIDE
from tests.test_served import fake_vllm, target_dir  # noqa: F401 (fixtures)

runner = CliRunner()
FIXTURES = Path(__file__).resolve().parent / "fixtures" / "cpu"


def check(*args) -> tuple[int, str]:
    result = runner.invoke(app, ["check", *map(str, args)])
    return result.exit_code, result.output


def check_json(*args) -> tuple[int, dict]:
    result = runner.invoke(app, ["check", *map(str, args), "--json"])
    return result.exit_code, json.loads(result.output)


def set_speedup(run_dir: Path, cell_id: str, speedup: float) -> None:
    """What drift does to one timed cell: its tokens/s (and so its speed-up) moved, its counters kept."""
    cells = pd.read_parquet(run_dir / "cells.parquet")
    at = cells.index[cells["cell_id"] == cell_id][0]
    baseline = float(cells.at[at, "baseline_tokens_per_s"])
    cells.at[at, "tokens_per_s"] = speedup * baseline
    cells.at[at, "tokens_per_s_runs"] = [speedup * baseline]
    cells.at[at, "speedup"] = speedup
    cells.at[at, "speedup_runs"] = [speedup]
    write_table(run_dir, "cells", cells)


# --- 1. a drafter that accepted nothing ---------------------------------------------------------

def test_a_drafter_that_accepted_nothing_never_passes(tiny_model_dirs, tmp_path):
    """The issue's case: a draft with α 0 whose cell read 1.056× (drift). A real sweep with a
    random two-layer draft that accepts none of its drafts; its timed speed-up set to 1.056×."""
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["sweep", "--target", tiny_model_dirs["target"], "--drafts", tiny_model_dirs["draft"],
                                 "--k", "2", "--batch-sizes", "1", "--temperatures", "0", "--workloads", "chat",
                                 "--max-new-tokens", "16", "--num-prompts", "2", "--dtype", "fp64", "--output",
                                 str(run_dir)])
    assert result.exit_code == 0, result.output
    cells = load_run(run_dir).cells.set_index("cell_id")
    cell_id = f"chat|B1|T0|{tiny_model_dirs['draft']}|K2"
    assert cells.at[cell_id, "accepted"] == 0 and cells.at[cell_id, "drafted"] > 0  # measured, not made up
    assert tokens_per_forward(cells.loc[cell_id].to_dict()) == 1.0 and (cells["own_cpu_cores"] > 0).all()
    set_speedup(run_dir, cell_id, 1.056)

    code, out = check(run_dir)
    assert code == 1 and "acceptance allows at most 1.000×" in out and "PASS" not in out, out
    assert "--speculative-config" not in out
    code, payload = check_json(run_dir)
    verdict = payload["verdicts"][0]
    assert code == 1 and verdict["decisions"] == {"1": "fail"} and verdict["schedule"] == "{1+: off}"
    assert verdict["speculative_config"] is None and verdict["repeats"] == {"1": 1}

    # 1.056× may lie within the run's noise of its bound (a busy machine widens it); 30× lies beyond
    # any noise this run measures (3× did not, on a machine whose two cores ran four other processes:
    # two prompts of 16 tokens measured a band that wide): flagged, and under a lower bar that
    # acceptance does not rule out, undecided rather than passed
    set_speedup(run_dir, cell_id, 30.0)
    code, payload = check_json(run_dir)
    assert payload["above_bound"][0]["cell_id"] == cell_id and payload["above_bound"][0]["bound"] < 1.0
    code, out = check(run_dir)
    assert code == 1 and "not explained by acceptance" in out, out
    code, out = check(run_dir, "--min-speedup", "0.9")
    assert code == 3 and "not explained by acceptance" in out, out
    report = runner.invoke(app, ["report", str(run_dir), "--output", str(tmp_path / "report")])
    assert report.exit_code == 0 and "above what acceptance allows" in report.output
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "speedup_bound" in summary and "above what acceptance allows" in summary


def test_the_bound_is_counted_tokens_per_forward_times_the_non_draft_share():
    row = {"mode": "speculative", "engine": "native", "output_tokens": 120, "accepted": 40, "step_draft_s": 0.01,
           "step_verify_s": 0.03, "step_overhead_s": 0.0}
    assert tokens_per_forward(row) == pytest.approx(1.5) and speedup_bound(row) == pytest.approx(1.5 * 0.75)
    gauges = {**row, "engine": "endpoint", "acceptance_source": "sglang gauges (the server's recent window)"}
    assert tokens_per_forward(gauges) is None  # an endpoint's gauges are not counts of this cell
    counted = {**gauges, "acceptance_source": "vllm:spec_decode counters"}
    assert tokens_per_forward(counted) == pytest.approx(1.5)


# --- 2. one repeat near the bar ----------------------------------------------------------------

def test_a_one_repeat_point_at_0_99_is_within_noise_and_a_large_effect_is_decided(tmp_path):
    """The committed default run (one repeat a cell): its B=16 cells at ~0.65× fail beyond its
    noise, its B=1 cells do not decide; chat T=0.7 ngram K=2 measured 0.994×, left the best K."""
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURES / "default-grid-profiled", run_dir)
    code, out = check(run_dir)
    assert code == 1 and "1 repeat: its noise band" in out and "lies below the bar" in out, out
    code, payload = check_json(run_dir)
    chosen = next(v for v in payload["verdicts"] if v["draft"] == payload["draft"])
    assert chosen["decisions"]["16"] == "fail" and chosen["decisions"]["1"] == "inconclusive"
    assert set(chosen["repeats"].values()) == {1} and payload["noise"]["drift"] > 0.01

    set_speedup(run_dir, "chat|B1|T0.7|ngram|K4", 0.98)  # so the real 0.994× K=2 is the best K there
    narrowed = [run_dir, "--draft", "ngram", "--workloads", "chat", "--temperatures", "0.7", "--batch-sizes", "1"]
    code, out = check(*narrowed)
    assert code == 3 and "0.994× K=2 NOISE" in out and "ngram at B=1: 1 repeat: within noise" in out and "FAIL" not in out, out
    code, payload = check_json(*narrowed)
    assert payload["verdicts"][0]["decisions"] == {"1": "inconclusive"} and payload["verdicts"][0]["repeats"] == {"1": 1}


def slow_baseline(run_dir: Path, baseline_id: str, factor: float) -> list[str]:
    """A negative control: the baseline's measured tokens/s divided by `factor` (as a machine slowed
    during it would have measured), every speed-up taken against it recomputed as the sweep does."""
    cells = pd.read_parquet(run_dir / "cells.parquet")
    at = cells.index[cells["cell_id"] == baseline_id][0]
    slowed = float(cells.at[at, "tokens_per_s"]) / factor
    cells.at[at, "tokens_per_s"], cells.at[at, "tokens_per_s_runs"] = slowed, [slowed]
    paired = cells.index[(cells["mode"] == "speculative") & (cells["baseline_tokens_per_s"].notna())
                         & cells["cell_id"].str.startswith(baseline_id.rsplit("|", 1)[0] + "|")]
    for i in paired:
        cells.at[i, "baseline_tokens_per_s"] = slowed
        cells.at[i, "speedup"] = float(cells.at[i, "tokens_per_s"]) / slowed
        cells.at[i, "speedup_runs"] = [float(cells.at[i, "speedup"])]
    write_table(run_dir, "cells", cells)
    return list(cells.loc[paired, "cell_id"])


def test_the_bound_warning_flags_only_what_lies_above_beyond_noise_and_names_a_slow_baseline(tmp_path):
    """The committed default run has B=1 points a little over their bounds, within its measured noise:
    no warning (it fired on every healthy run). Its code T=0.7 B=1 baseline slowed 2× on purpose
    lifts every comparison against it above its bound beyond the noise: warned, that baseline named,
    and the gate leaves exactly the warned cells undecided for it."""
    run_dir = tmp_path / "run"
    shutil.copytree(FIXTURES / "default-grid-profiled", run_dir)
    run = load_run(run_dir)
    noise = run_noise(run.cells, run.requests, run.steps)
    from specbench.fit.physics import above_bound, bound_warning, with_bounds

    points = with_bounds(run.cells[run.cells["mode"] == "speculative"], noise)
    over = points[points["speedup"] > points["speedup_bound"]]
    assert len(over) >= 1  # points over their bound, as on every run ...
    assert bound_warning(run.cells, noise) is None  # ... but none beyond the run's noise
    assert not any("acceptance allows" in w for w in measurement_warnings(run.cells, noise=noise))

    slowed = slow_baseline(run_dir, "code|B1|T0.7|autoregressive", 2.0)
    run = load_run(run_dir)
    noise = run_noise(run.cells, run.requests, run.steps)
    warning = bound_warning(run.cells, noise)
    flagged = set(above_bound(run.cells, noise)["cell_id"])
    assert flagged == set(slowed) and len(slowed) == 4, (flagged, slowed)
    assert warning.startswith("4 speed-up(s) above what acceptance allows beyond the run's noise")
    assert "all 4 comparisons against the baseline code|B1|T0.7|autoregressive lie above their bounds" in warning
    assert "--repeats 3" in warning
    code, payload = check_json(run_dir, "--batch-sizes", "1")
    assert {c["cell_id"] for c in payload["above_bound"]} <= flagged  # the judged draft's, by the same rule
    chosen = next(v for v in payload["verdicts"] if v["draft"] == payload["draft"])
    assert chosen["decisions"]["1"] != "pass" or chosen["cells"]["1"] not in flagged
    for verdict in payload["verdicts"]:
        for cell_id in verdict["above_bound"]:
            assert cell_id in flagged


def test_the_gate_and_the_warning_share_one_rule():
    from specbench.fit.evidence import judge
    from specbench.fit.evidence import lies_above

    for point in (0.9, 1.05, 1.1, 1.2, 1.5):
        for half in (0.02, 0.1, 0.3):
            band = (point * np.exp(-half), point * np.exp(half))
            decided = judge(point, None, 1.0, bound=1.1, tokens_per_forward=1.5, band=band)
            said = "lies above what acceptance allows" in decided.reason
            assert said == (lies_above(1.1, band=band) and band[1] >= 1.0), (point, half, decided)
            interval = band
            decided = judge(point, interval, 1.0, bound=1.1, tokens_per_forward=1.5)
            assert ("above what acceptance allows" in decided.reason) == lies_above(1.1, interval), (point, half)
    assert not lies_above(1.1) and not lies_above(None, (2.0, 3.0))  # no evidence, or no bound: never


def test_a_single_comparison_without_a_measured_drift_decides_nothing():
    cells = pd.DataFrame([
        {"cell_id": "chat|B1|T0|autoregressive", "status": "ok", "mode": "autoregressive", "workload": "chat",
         "draft": "autoregressive", "k": 0, "batch_size": 1, "temperature": 0.0, "tokens_per_s": 10.0,
         "tokens_per_s_runs": [10.0], "speedup": 1.0, "engine": "native"},
        {"cell_id": "chat|B1|T0|ngram|K2", "status": "ok", "mode": "speculative", "workload": "chat", "draft": "ngram",
         "k": 2, "batch_size": 1, "temperature": 0.0, "tokens_per_s": 5.0, "tokens_per_s_runs": [5.0],
         "speedup": 0.5, "speedup_runs": [0.5], "engine": "native"}])
    assert run_noise(cells).drift is None
    from specbench.gate import INCONCLUSIVE, evaluate

    result = evaluate(cells, [1], state=None, requests=None, steps=None)
    assert result.exit_code == INCONCLUSIVE and "no measure of the drift" in result.message


# --- 3. served repeats: side by side, bracketed, or one comparison -------------------------------

def served_args(target: str, output: Path, pairing: str) -> list[str]:
    return ["sweep", "--engine", "vllm", "--target", target, "--drafts", "ngram", "--k", "2", "--batch-sizes", "1",
            "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "24", "--num-prompts", "3",
            "--repeats", "3", "--dtype", "fp32", "--output", str(output), "--server-timeout", "60",
            "--served-pairing", pairing]


DRIFT_PER_STEP = 0.003  # 2.6× slower by the end of each sweep's 542 steps
STEADY_SPEEDUP = 3 / 1.2  # K + 1 = 3 tokens a step, at the stand-in's verify cost of 1.2 steps


def test_a_served_run_on_a_drifting_machine_pairs_its_repeats(fake_vllm, target_dir, tmp_path):  # noqa: F811
    """Every server slows as the machine works (the stand-in's FAKE_VLLM_DRIFT); the speculative
    server streams K+1 = 3 tokens a step at 1.2 steps' cost, so on a steady machine it is 2.5× the
    baseline. Repeats run side by side pair with a baseline measured moments apart; a bracket's
    unpaired interval is widened by the drift; the old sequential pairing (every baseline repeat
    first) would have been fooled."""
    side, bracket = tmp_path / "side", tmp_path / "bracket"
    for output, pairing in ((side, SIDE_BY_SIDE), (bracket, BRACKETED)):
        # each sweep on a machine that starts steady and drifts with every step its servers take
        fake_vllm.setenv("FAKE_VLLM_DRIFT", f"{tmp_path / pairing}.steps:{DRIFT_PER_STEP}")
        result = runner.invoke(app, served_args(target_dir, output, pairing))
        assert result.exit_code == 0, result.output
    paired = load_run(side)
    assert paired.meta["engine"]["pairing"] == SIDE_BY_SIDE
    row = paired.cells.set_index("cell_id").loc["chat|B1|T0|ngram|K2"].to_dict()
    assert row["pairing"] == SIDE_BY_SIDE and len(row["baseline_tokens_per_s_runs"]) == 3
    low, high = cell_interval(row)
    side_by_side = np.asarray(row["speedup_runs"], dtype=float)
    assert low <= STEADY_SPEEDUP <= high

    bracketed = load_run(bracket)
    cells = bracketed.cells.set_index("cell_id")
    row = cells.loc["chat|B1|T0|ngram|K2"].to_dict()
    baseline = cells.loc["chat|B1|T0|autoregressive"]
    assert row["pairing"] == BRACKETED and baseline["repeats"] == 6  # measured before and after
    assert len(row["baseline_tokens_per_s_runs"]) == 6
    b_low, b_high = cell_interval(row)
    # the drift between brackets widens the interval
    assert b_low <= STEADY_SPEEDUP <= b_high and b_high / b_low > high / low
    # The same speculative repeats paired, as before this change, with the first bracket alone
    # (every baseline repeat ran before them): the machine's drift reads as a lower speed-up.
    runs = np.asarray(row["tokens_per_s_runs"], dtype=float)
    before = runs / np.asarray(baseline["tokens_per_s_runs"][:3], dtype=float)
    assert np.median(before) < 0.9 * STEADY_SPEEDUP  # fooled: the machine's drift read as a lower speed-up
    steady = np.log(STEADY_SPEEDUP)
    assert abs(np.log(side_by_side).mean() - steady) < abs(np.log(np.median(before)) - steady)

    sequential = {**row, "pairing": SEQUENTIAL}
    assert cell_interval(sequential) is None  # one comparison: judged against the run's noise band
    code, out = check(bracket)
    # judged on the 3 repeats' interval, widened by the drift between brackets (1.6×-3.5× here):
    # a pass. The drift counts steps, so a slow machine drifts no further (in wall time it
    # compounded: 0.16×-8.9× once in CI). Inconclusive only where the run saw other work on the
    # machine (a repeat slowed by it, 0.8×-3.4× beside two busy loops on two cores)
    busy = busy_machine(bracketed.cells)
    assert "from 3 repeats" in out and (code == 0 or (code == 3 and busy is not None)), (out, busy)


def test_an_unpaired_interval_widens_with_the_drift_between_brackets():
    steady = unpaired_interval([30.0, 30.3, 29.7], [10.0, 10.1, 9.9, 10.0, 10.1, 9.9])
    drifted = unpaired_interval([30.0, 30.3, 29.7], [10.0, 10.1, 9.9, 8.0, 8.1, 7.9])
    assert steady[0] < 3.0 < steady[1] and drifted[0] < 3.0 < drifted[1]
    assert np.log(drifted[1] / drifted[0]) > 5 * np.log(steady[1] / steady[0])
    assert unpaired_interval([30.0], [10.0]) is None and unpaired_interval([30.0], [10.0, 9.0]) is not None


# --- 4. a busy machine is other work -----------------------------------------------------------

def test_the_busy_machine_measure_leaves_out_specbenchs_own_processes():
    served = pd.DataFrame([{"cell_id": "c", "device": "cpu", "engine": "vllm", "load_average": 3.6,
                            "own_cpu_cores": 1.9}])
    assert busy_machine(served, cores=2) is None  # the server under test is not "other work"
    assert "busy" in busy_machine(served.assign(own_cpu_cores=0.2), cores=2)
    assert "busy" in busy_machine(served.drop(columns="own_cpu_cores"), cores=2)  # older runs: the whole load
    endpoint = busy_machine(served.assign(engine="endpoint", own_cpu_cores=0.1), cores=2)
    assert "sees only its own processes (the client), not the endpoint's" in endpoint
    # measured: the CPU other processes used. A vLLM CPU server's spinning threads push the load
    # average to 5-7 on 2 cores at ~1.9 cores of CPU; that is no other work
    spinning = served.assign(load_average=6.8, other_cpu_cores=0.05)
    assert busy_machine(spinning, cores=2) is None
    other = busy_machine(spinning.assign(other_cpu_cores=0.9), cores=2)
    assert "other processes kept 0.9 of its 2 cores busy" in other and "during 1 cell(s)" in other
    assert busy_machine(spinning.assign(other_cpu_cores=float("nan")), cores=2)  # not measured: the load average


def test_a_trace_replay_sent_late_is_a_warning():
    cells = pd.DataFrame([{"cell_id": "a", "status": "ok", "send_lag_p99_s": 0.002},
                          {"cell_id": "b", "status": "ok", "send_lag_p99_s": 0.004}])
    assert late_sends(cells) is None and late_sends(cells.drop(columns="send_lag_p99_s")) is None
    late = cells.assign(send_lag_p99_s=[0.002, 0.031])
    message = late_sends(late)
    assert "in 1 of 2 trace cell(s)" in message and "up to 31.0 ms (goal 5 ms)" in message
    assert message in measurement_warnings(late) and "short of CPU" in message
    # each late request fell in a stall of the machine itself: the machine's delay, not the client's
    probed = late.assign(late_sends=[0, 2], late_sends_machine=[0, 2], machine_stall_max_s=[0.0, 0.0312])
    assert "the machine itself stalled each time" in late_sends(probed) and "31.2 ms late" in late_sends(probed)
    partly = late_sends(probed.assign(late_sends_machine=[0, 1]))
    assert "short of CPU (1 of 2 late request(s) coincided with a stall of the machine itself)" in partly


def test_the_wake_probe_sees_a_stall_the_whole_machine_has():
    """A probe process notes its late wakes; a stall it shares with the client (here: every core
    kept busy by processes at a higher priority than the probe's) is found by `during`."""
    import os
    import subprocess
    import sys

    from specbench.measure import WakeProbe

    with WakeProbe() as probe:
        assert probe._process.poll() is None  # running before the block starts
        time.sleep(0.3)
    assert probe._process.poll() is not None  # stopped with the block
    if not sys.platform.startswith("linux"):
        return
    # Stall it for real: the probe at the lowest priority, while every core spins at ours.
    with WakeProbe() as probe:
        os.setpriority(os.PRIO_PROCESS, probe._process.pid, 19)
        spinners = [subprocess.Popen([sys.executable, "-c", "import time\nend = time.time() + 1.5\nwhile time.time() < end: pass"])
                    for _ in range(2 * (os.cpu_count() or 1))]
        start = time.perf_counter()
        for spinner in spinners:
            spinner.wait()
        end = time.perf_counter()
    assert probe.stalls and probe.longest_s > 0.0005
    due, late = max(probe.stalls, key=lambda stall: stall[1])
    assert probe.during(due, due + late) == probe.longest_s
    assert probe.during(start, end) > 0 and probe.during(end + 10, end + 11) == 0.0


def test_a_trace_replay_off_the_traces_lengths_is_a_warning():
    kept = pd.DataFrame([{"cell_id": "a", "status": "ok", "trace_output_mismatches": 0, "trace_prompt_misses": 0}])
    assert trace_lengths(kept) is None and trace_lengths(kept.drop(columns="trace_output_mismatches")) is None
    outputs = trace_lengths(kept.assign(trace_output_mismatches=3))
    assert "3 request(s) ended at another output length" in outputs and "min_tokens" in outputs
    prompts = trace_lengths(kept.assign(trace_prompt_misses=1))
    assert "1 prompt(s) further from the trace's input length than 2 % or 8 tokens" in prompts
    assert trace_lengths(kept.assign(trace_prompt_misses=1, status="failed")) is None


@pytest.mark.integration
def test_own_cpu_tells_other_work_from_ours():
    """A child's CPU (a server's) is ours, a stranger's is other work, each checked against the
    spinner's own CPU time: what it got, not a share of cores, which other work beside the test
    (CI's other tests) would change."""
    import subprocess
    import sys

    import psutil

    from specbench.measure import OwnCpu

    spin = "import time; t = time.monotonic(); all(iter(lambda: time.monotonic() - t < 2.5, False))"

    def spinner_cpu_s(process: psutil.Process) -> float:
        times = process.cpu_times()
        return times.user + times.system

    child = subprocess.Popen([sys.executable, "-c", spin])  # a child, as a server is: ours
    spinner = psutil.Process(child.pid)
    time.sleep(0.2)
    ours, got = OwnCpu(), -spinner_cpu_s(spinner)
    with ours:
        time.sleep(1.0)
    got += spinner_cpu_s(spinner)
    child.wait()
    assert got > 0.1, got  # the spinner ran, at least a little, however busy the machine
    assert ours.cpu_s == pytest.approx(got, abs=0.1), (ours.cpu_s, got)

    # not ours: a process whose parent exited at once, so that it is no child of this one
    started = subprocess.run(["sh", "-c", f"'{sys.executable}' -c '{spin}' >/dev/null 2>&1 & echo $!"], check=True,
                             capture_output=True, text=True)
    stranger = psutil.Process(int(started.stdout.split()[-1]))
    time.sleep(0.2)
    theirs, got = OwnCpu(), -spinner_cpu_s(stranger)
    with theirs:
        time.sleep(1.0)
    got += spinner_cpu_s(stranger)
    stranger.wait(timeout=5)
    assert got > 0.1, got
    assert theirs.cpu_s < 0.1, theirs.cpu_s  # this test's own process sleeps: ours is next to nothing
    # the machine's CPU less ours holds at least the stranger's (and whatever else ran beside it)
    assert (theirs.other_cores * theirs.wall_s) > got - 0.1, (theirs.other_cores * theirs.wall_s, got)
