import json

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.fit import (
    baseline_drift,
    crossover, expected_tau, fit_alpha, k_schedule, leviathan_speedup, tokens_per_step_moments,
    cost_per_million, default_gpu_price,
)
from specbench.gate import evaluate
from specbench.results import write_json, write_table

runner = CliRunner()


def simulate_steps(alpha, k, steps, seed):
    """Per-step accepted counts under the i.i.d. model: accept each position with prob alpha
    until the first rejection."""
    rng = np.random.default_rng(seed)
    accepted_each = rng.random((steps, k)) < alpha
    accepted = np.cumprod(accepted_each, axis=1).sum(axis=1)
    return np.full(steps, k), accepted


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.9])
@pytest.mark.parametrize("k", [1, 4])
def test_alpha_fit_recovers_known_alpha(alpha, k):
    drafted, accepted = simulate_steps(alpha, k, 3000, seed=int(alpha * 10) + k)
    fit = fit_alpha(drafted, accepted)
    assert fit.low <= alpha <= fit.high
    assert fit.high - fit.low < 0.06
    # the naive accepted/drafted is biased low for K > 1; the MLE is not
    if k > 1:
        assert accepted.sum() / drafted.sum() < fit.low


def test_alpha_interval_covers_at_the_nominal_rate():
    covered = 0
    for seed in range(200):
        drafted, accepted = simulate_steps(0.6, 3, 200, seed)
        fit = fit_alpha(drafted, accepted)
        covered += fit.low <= 0.6 <= fit.high
    assert 0.90 <= covered / 200 <= 0.99


def test_tau_formula():
    assert expected_tau(0.0, 4) == pytest.approx(1.0)
    assert expected_tau(1.0, 4) == pytest.approx(5.0)
    assert expected_tau(0.5, 2) == pytest.approx(1 + 0.5 + 0.25)
    drafted, accepted = simulate_steps(0.7, 5, 20000, seed=3)
    assert (1 + accepted).mean() == pytest.approx(expected_tau(0.7, 5), rel=0.02)
    mean, variance = tokens_per_step_moments(0.7, 5)
    assert mean == pytest.approx(expected_tau(0.7, 5))
    assert variance == pytest.approx((1 + accepted).var(), rel=0.05)
    assert leviathan_speedup(0.8, 4, 0.1) == pytest.approx(expected_tau(0.8, 4) / 1.4)


def test_crossover():
    assert crossover([1, 4, 16, 64], [1.8, 1.4, 1.0001, 0.7]).batch_size == pytest.approx(16, rel=0.01)
    found = crossover([1, 8, 32], [1.5, 1.2, 0.8])
    assert 8 < found.batch_size < 32 and "between 8 and 32" in found.text
    assert crossover([1, 8, 32], [1.5, 1.3, 1.1]).batch_size is None
    assert "no slowdown up to B = 32" in crossover([1, 8, 32], [1.5, 1.3, 1.1]).text
    assert "below 1× at every measured B" in crossover([1, 8], [0.9, 0.8]).text
    rising = crossover([1, 4], [0.9, 1.3])  # a compute-bound CPU: speculation pays at larger batches
    assert rising.batch_size is None and "≥ 1× from B ≈" in rising.text
    hump = crossover([1, 4, 16, 64], [0.9, 1.2, 1.1, 0.8])
    assert 16 < hump.batch_size < 64 and "from B ≈" in hump.text


def test_k_schedule():
    assert k_schedule([1, 8, 32, 64], [5, 5, 2, None]) == "{1-8: 5, 9-32: 2, 33+: off}"
    assert k_schedule([1, 4], [3, 3]) == "{1+: 3}"


def test_prices():
    assert default_gpu_price({"gpus": [{"name": "NVIDIA H100 80GB HBM3"}]})[1] == "H100"
    assert default_gpu_price({"gpus": [{"name": "NVIDIA H200"}]})[1] == "H200"
    assert default_gpu_price({"gpus": []})[0] is None
    assert cost_per_million(1000.0, 3.6) == pytest.approx(1.0)  # 1M tokens = 1000 s = 1/3.6 h


# --- crafted runs for the gate ----------------------------------------------------------------

def crafted_run(tmp_path, speedups: dict[tuple[str, int, int], float], name="run"):
    """cells with the given speed-ups per (draft, K, B), one workload at T=0, three paired repeats ±2 %."""
    rows = []
    for b in sorted({b for _, _, b in speedups}):
        rows.append({"cell_id": f"chat|B{b}|T0|autoregressive", "status": "ok", "mode": "autoregressive",
                     "workload": "chat", "draft": "autoregressive", "k": 0, "batch_size": b, "temperature": 0.0,
                     "tokens_per_s": 100.0 * b, "speedup": 1.0})
    for (draft, k, b), speedup in speedups.items():
        rows.append({"cell_id": f"chat|B{b}|T0|{draft}|K{k}", "status": "ok", "mode": "speculative",
                     "workload": "chat", "draft": draft, "k": k, "batch_size": b, "temperature": 0.0,
                     "tokens_per_s": 100.0 * b * speedup, "speedup": speedup,
                     "speedup_runs": [speedup * 0.98, speedup, speedup * 1.02]})
    run_dir = tmp_path / name
    run_dir.mkdir()
    write_table(run_dir, "cells", pd.DataFrame(rows))
    write_json(run_dir / "run.json", {"status": "complete", "hardware": {"gpus": []}})
    return run_dir


SPEEDUPS = {("1b", 2, 1): 1.6, ("1b", 4, 1): 1.9, ("1b", 2, 32): 1.1, ("1b", 4, 32): 0.9,
            ("1b", 2, 64): 0.8, ("1b", 4, 64): 0.6}


def test_check_exit_codes(tmp_path):
    run_dir = crafted_run(tmp_path, SPEEDUPS)
    assert runner.invoke(app, ["check", str(run_dir), "--batch-sizes", "1,32"]).exit_code == 0
    failing = runner.invoke(app, ["check", str(run_dir), "--batch-sizes", "32,64"])
    assert failing.exit_code == 1
    assert failing.output.startswith("FAIL (exit 1): speculation with 1b is below 1× at B=64 (0.800×)\n")
    assert "1.100× K=2 PASS" in failing.output and "0.800× K=2 FAIL" in failing.output
    assert "1b at B=32: , 95% interval" not in failing.output and "1b at B=32: 95% interval" in failing.output
    assert "from 3 repeats" in failing.output
    measured = runner.invoke(app, ["check", str(run_dir)])  # default: every batch size the run measured
    assert measured.exit_code == 1 and "batch size(s) 1, 32, 64? (every batch size the run measured" in measured.output
    assert "1.900× K=4 PASS" in measured.output and "best draft = " in measured.output and "B* = " in measured.output
    assert "below 1× at batch size(s) 64 (0.800×, 95% interval 0.7" in failing.output
    assert "{1: 4, 2-32: 2, 33+: off}" in failing.output and "B* ≈" in failing.output
    missing = runner.invoke(app, ["check", str(run_dir), "--batch-sizes", "128"])
    assert missing.exit_code == 2 and "measured: 1, 32, 64" in missing.output
    assert runner.invoke(app, ["check", str(run_dir), "--draft", "8b"]).exit_code == 2
    assert runner.invoke(app, ["check", str(tmp_path / "nowhere")]).exit_code == 2


def test_check_json_and_min_speedup(tmp_path):
    run_dir = crafted_run(tmp_path, SPEEDUPS)
    result = runner.invoke(app, ["check", str(run_dir), "--batch-sizes", "1", "--min-speedup", "2", "--json"])
    assert result.exit_code == 1
    payload = json.loads(result.output)
    assert payload["exit_code"] == 1 and payload["verdicts"][0]["speedups"] == {"1": 1.9}


def test_gate_picks_the_best_draft_and_counts_the_worst_workload(tmp_path):
    cells = pd.read_parquet(crafted_run(tmp_path, {**SPEEDUPS, ("ngram", 3, 32): 1.3, ("ngram", 3, 64): 1.15,
                                                   ("ngram", 3, 1): 1.2}) / "cells.parquet")
    result = evaluate(cells, [32, 64], state=None, requests=None, steps=None)
    assert result.exit_code == 0 and result.draft == "ngram"
    code_row = cells[cells["draft"] == "ngram"].iloc[[0]].assign(workload="code", speedup=0.5,
                                                                 cell_id="code|B32|T0|ngram|K3", batch_size=32)
    code_row["speedup_runs"] = [[0.49, 0.5, 0.51]]
    worse = evaluate(pd.concat([cells, code_row]), [32, 64], state=None, requests=None, steps=None,
                     draft="ngram")
    assert worse.exit_code == 1


def test_a_speedup_never_prints_as_the_bar_it_missed():
    from specbench.gate import format_speedup

    assert format_speedup(0.9996, 1.0) == "0.9996×"
    assert format_speedup(1.0004, 1.0) == "1.0004×"
    assert format_speedup(0.8, 1.0) == "0.800×" and format_speedup(1.0, 1.0) == "1.000×"
    assert format_speedup(1.049999, 1.05) == "1.049999×"


def test_baseline_drift_flags_a_slower_twin_baseline():
    def baseline(workload, temperature, batch, step_s):
        return {"status": "ok", "mode": "autoregressive", "workload": workload, "temperature": temperature,
                "batch_size": batch, "step_verify_s": step_s, "step_overhead_s": 0.0, "estimated": False}

    cells = pd.DataFrame([baseline("code", 0.0, 4, 0.050), baseline("code", 0.7, 4, 0.080),
                          baseline("chat", 0.0, 4, 0.050), baseline("chat", 0.7, 4, 0.055),
                          baseline("chat", 0.0, 1, 0.030), baseline("code", 0.0, 1, 0.090)])
    messages = baseline_drift(cells)
    # Only code B=4 (1.6×); chat B=4 is within tolerance, and B=1's two cells are other workloads.
    assert len(messages) == 1 and messages[0].startswith("code B=4") and "1.60×" in messages[0]


def test_an_interval_across_the_bar_is_inconclusive(tmp_path):
    from specbench.fit import speedup_interval
    from specbench.gate import INCONCLUSIVE

    cells = pd.read_parquet(crafted_run(tmp_path, SPEEDUPS) / "cells.parquet")
    cells["speedup_runs"] = [[s * 0.97, s, s * 1.03] for s in cells["speedup"]]  # ±3 % repeat to repeat
    clear = evaluate(cells, [1, 32], state=None, requests=None, steps=None)  # 1.9 and 1.1: the intervals clear 1
    low, high = speedup_interval([1.1 * 0.97, 1.1, 1.1 * 1.03])
    assert clear.exit_code == 0 and clear.verdict == "PASS" and 1.0 < low < 1.1 < high
    assert clear.verdicts[0].intervals[32] == pytest.approx((low, high))
    best_at_32 = cells.index[(cells["draft"] == "1b") & (cells["batch_size"] == 32) & (cells["k"] == 2)][0]
    cells.at[best_at_32, "speedup_runs"] = [0.98, 1.01, 1.05]  # median above 1, the interval across it
    noisy = evaluate(cells, [1, 32], state=None, requests=None, steps=None)
    assert noisy.exit_code == INCONCLUSIVE == 3 and noisy.verdict == "INCONCLUSIVE"
    assert "B=32: 1.100×, 95% interval 0.9" in noisy.message and "repeats in all would decide it" in noisy.message
    needed = noisy.verdicts[0].repeats_to_decide[32]
    assert needed > 3 and speedup_interval([0.98, 1.01, 1.05] * (needed // 3 + 1))[0] > 1.0  # that many do decide
    assert "{1: 4, 2-32: off, 33+: 2}" not in noisy.verdicts[0].schedule and noisy.verdicts[0].schedule.startswith("{1: 4")
    assert "off" in noisy.verdicts[0].schedule  # not shown to pay at 32: off there
    run_dir = tmp_path / "noisy"
    run_dir.mkdir()
    write_table(run_dir, "cells", cells)
    write_json(run_dir / "run.json", {"status": "complete", "hardware": {"gpus": []}})
    printed = runner.invoke(app, ["check", str(run_dir), "--batch-sizes", "1,32"])
    assert printed.exit_code == 3 and "95% interval 0.9" in printed.output and "INCONCLUSIVE" in printed.output
    payload = json.loads(runner.invoke(app, ["check", str(run_dir), "--batch-sizes", "1,32", "--json"]).output)
    assert payload["exit_code"] == 3 and payload["verdicts"][0]["decisions"] == {"1": "pass", "32": "inconclusive"}
    # a clearly failing point decides FAIL even when another is inconclusive
    assert evaluate(cells, [32, 64], state=None, requests=None, steps=None).exit_code == 1


def test_one_repeat_on_a_drifted_group_is_inconclusive_and_stays_off_the_schedule(tmp_path):
    """The issue's drifted run: K=4 at 1.12× (one repeat) where its group's baselines drifted apart."""
    rows = []
    for t, step in ((0.0, 0.050), (0.7, 0.080)):  # the same AR step at both temperatures: 1.6× apart
        rows.append({"cell_id": f"chat|B1|T{t:g}|autoregressive", "status": "ok", "mode": "autoregressive",
                     "workload": "chat", "draft": "autoregressive", "k": 0, "batch_size": 1, "temperature": t,
                     "tokens_per_s": 20.0, "speedup": 1.0, "step_verify_s": step, "step_overhead_s": 0.0})
        for k, speedup in ((1, 0.84), (2, 0.76), (4, 1.12)):
            rows.append({"cell_id": f"chat|B1|T{t:g}|ngram|K{k}", "status": "ok", "mode": "speculative",
                         "workload": "chat", "draft": "ngram", "k": k, "batch_size": 1, "temperature": t,
                         "tokens_per_s": 20.0 * speedup, "speedup": speedup + (0.1 if t else 0.0)})
    result = evaluate(pd.DataFrame(rows), [1], state=None, requests=None, steps=None)
    assert result.exit_code == 3 and "1 repeat" in result.message and "drifted" in result.message
    assert result.verdicts[0].schedule == "{1+: off}" and any("drifted" in w for w in result.warnings)
    assert "within noise at B=1" in result.headline


def test_an_incomplete_run_cannot_pass(tmp_path):
    run_dir = crafted_run(tmp_path, SPEEDUPS)
    write_json(run_dir / "run.json", {"status": "interrupted", "plan": {"cells": 42}, "hardware": {"gpus": []}})
    result = runner.invoke(app, ["check", str(run_dir), "--batch-sizes", "1"])
    assert result.exit_code == 2 and "incomplete evidence: the sweep is interrupted: 9 of 42 planned cells" in \
        result.output and "would be PASS" in result.output, result.output
    allowed = runner.invoke(app, ["check", str(run_dir), "--batch-sizes", "1", "--allow-incomplete"])
    assert allowed.exit_code == 0 and "incomplete run" in allowed.output
    payload = json.loads(runner.invoke(app, ["check", str(run_dir), "--json"]).output)
    assert payload["exit_code"] == 2 and payload["incomplete"].startswith("the sweep is interrupted")
    write_json(run_dir / "run.json", {"status": "running", "plan": {"cells": 9}, "hardware": {"gpus": []}})
    assert "killed before it could record" in runner.invoke(app, ["check", str(run_dir)]).output


def test_speedup_chart_bars_are_the_intervals_check_decides_with():
    from specbench.fit.noise import cell_interval
    from specbench.report.charts import _interval_bars

    paired = {"x": 4.0, "speedup": 1.0, "speedup_runs": [0.9, 1.1, 1.0], "pairing": "turns"}
    one = {"x": 8.0, "speedup": 1.2, "speedup_runs": [1.2], "pairing": "turns"}
    sizes, points, below, above = _interval_bars(pd.DataFrame([paired, one]))
    low, high = cell_interval(paired)
    assert sizes == [4.0] and points == [1.0]  # one repeat: no bar
    assert below[0] == pytest.approx(1.0 - low) and above[0] == pytest.approx(high - 1.0) and low < 0.9 < 1.1 < high
    assert _interval_bars(pd.DataFrame([one])) is None


def test_measurement_warnings_gather_busy_machine_and_drift():
    from specbench.fit import DRIFT_ADVICE, drifted_keys, measurement_warnings

    def baseline(temperature, step_s, load):
        return {"status": "ok", "mode": "autoregressive", "workload": "code", "temperature": temperature,
                "batch_size": 4, "step_verify_s": step_s, "step_overhead_s": 0.0, "estimated": False,
                "device": "cpu", "load_average": load}

    quiet = pd.DataFrame([baseline(0.0, 0.050, 0.5), baseline(0.7, 0.052, 0.5)])
    assert measurement_warnings(quiet) == [] and drifted_keys(quiet) == set()
    noisy = pd.DataFrame([baseline(0.0, 0.050, 0.5), baseline(0.7, 0.080, 99.0)])
    warnings = measurement_warnings(noisy)
    assert len(warnings) == 3 and "busy" in warnings[0] and "during 1 cell(s)" in warnings[0]
    assert warnings[1].startswith("code B=4") and warnings[2] == DRIFT_ADVICE
    assert drifted_keys(noisy) == {("code", 4)}


def test_baseline_speed_against_a_reference_engine():
    from specbench.fit import baseline_note, baseline_speed, slow_baseline_warning

    def cells(rows):
        return pd.DataFrame([{"cell_id": f"{w}|B{b}|T{t}|autoregressive", "status": "ok", "mode": "autoregressive",
                              "workload": w, "batch_size": b, "temperature": t, "tokens_per_s": tps,
                              "request_rate": 0.0} for w, b, t, tps in rows])

    ours = cells([("chat", 1, 0.0, 30.0), ("chat", 8, 0.0, 100.0), ("code", 8, 0.0, 90.0)])
    ours["roofline_fraction"] = [0.6, 0.3, 0.25]
    theirs = cells([("chat", 1, 0.0, 25.0), ("chat", 8, 0.0, 143.0)])
    table = baseline_speed(ours, theirs)
    assert table["of_reference"].round(2).iloc[:2].tolist() == [1.2, 0.7]
    assert pd.isna(table["of_reference"].iloc[2])  # code: no reference cell
    note = baseline_note(table, "vLLM 0.32.0")
    assert "25–60% of the memory-bandwidth roofline" in note and "0.70–1.20× vLLM 0.32.0's" in note
    warning = slow_baseline_warning(table, "vLLM 0.32.0")
    assert "chat B=8 T=0: 0.70×" in warning and "B=1" not in warning
    assert slow_baseline_warning(baseline_speed(ours, cells([("chat", 1, 0.0, 30.0)])), "vLLM") is None
    assert "has no autoregressive cell" in baseline_note(baseline_speed(ours, cells([("chat", 4, 0.0, 1.0)])), "vLLM")
    assert baseline_speed(ours).columns.tolist() == ["workload", "batch_size", "temperature", "tokens_per_s",
                                                      "roofline_fraction"]
