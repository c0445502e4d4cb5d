"""`specbench plan RUN --trace/--concurrency` past what the run measured (refused, or held with
--extrapolate), and the progress and Ctrl-C of long fleet plans ."""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from specbench.step_model import StepShape, capped_pairs

from conftest import azure_csv

RUN = Path(__file__).resolve().parents[1] / "tests/fixtures/cpu/vllm-local"  # 41- to 64-token prompts


@pytest.mark.integration
def test_a_served_plan_far_past_the_runs_prompts_or_clients_is_one_line_naming_what_to_measure(tmp_path):
    from typer.testing import CliRunner

    from specbench.cli import app

    trace = azure_csv(tmp_path / "long.csv", 12, 30.0, (1000, 1200), (16, 17))
    result = CliRunner().invoke(app, ["plan", str(RUN), "--trace", trace, "--slo", "ttft=30,tpot=0.3,p90"])
    assert result.exit_code == 2, result.output
    line = result.output.strip()
    assert "\n" not in line and line.startswith("error: --trace"), line
    assert "(p90; the run's longest: 64)" in line and "--extrapolate" in line
    assert "`specbench sweep --engine vllm --target smollm2-135m --drafts ngram,smollm2-135m " \
           "--context-lengths 2048 --batch-sizes 1,4`" in line, line
    closed = CliRunner().invoke(app, ["plan", str(RUN), "--concurrency", "16", "--input-len", "51",
                                      "--output-len", "8"])
    assert closed.exit_code == 2 and "\n" not in closed.output.strip(), closed.output
    assert "16 requests at once (the run's most: 4)" in closed.output and "--batch-sizes 1,4,16" in closed.output
    # within 2x of what it measured: planned as before
    near = CliRunner().invoke(app, ["plan", str(RUN), "--concurrency", "8", "--input-len", "100",
                                    "--output-len", "8", "--json"])
    assert near.exit_code == 0, near.output
    assert json.loads(near.output)["held"] is None


def test_extrapolate_holds_the_served_price_linear_past_the_run():
    """On the 64-token run's fit: without the hold, a 1,100-token prompt's step costs the fitted
    quadratic (attention pairs priced at 64 tokens' rate, 7x its machine's roof); held, its tokens and
    its attention run on linearly from the run's longest prompt, at the compute roof where the run
    recorded its matmul rate. Within the run's prompts the two are the same price."""
    from dataclasses import replace

    from specbench.fleet.served import MeasuredReach, ServedPrice, held_price

    price = ServedPrice(floor_s=0.047, per_token_s=0.0027, per_context_token_s=2e-6, per_prefill_pair_s=2.9e-6,
                        reread_cached_tokens=500.0)
    reach = {"autoregressive": MeasuredReach(4, 64, 384)}
    held = held_price(price, reach, {})
    assert held.held.prompt_tokens == 64 and held.held.token_s is None
    assert held.reread_cached_tokens == math.inf  # an edge past every context the run read: none seen
    assert held_price(price, {"autoregressive": MeasuredReach(4, 64, 10_000)}, {}).reread_cached_tokens == 500.0

    fitted, bounded = price.cost(), held.cost()
    assert bounded.price.held.prompt_tokens == 64 and fitted.price.held is None  # its keys held past 64

    def prompt(n: int) -> StepShape:  # a fresh prompt of n tokens in one chunk: n × n / 2 pairs
        return StepShape(n, 0, prefill_chunks=((n, 0),))

    # within the run: the same step
    assert bounded.seconds(prompt(60)) == pytest.approx(fitted.seconds(prompt(60)))
    # past it: linear in the tokens (twice the prompt, twice the step's prompt price), not quadratic
    steps = {n: (fitted.seconds(prompt(n)), bounded.seconds(prompt(n))) for n in (1100, 2200)}
    assert steps[1100][0] - steps[1100][1] > 1.5  # the quadratic: 1.75 s of attention against 0.2
    assert steps[2200][1] - held.fixed_s == pytest.approx(2 * (steps[1100][1] - held.fixed_s), rel=0.02)
    assert steps[2200][0] / steps[1100][0] > 2.5  # (the fitted curve grows with the square)

    # the run's machine's matmul rate recorded: tokens past the run at its compute roof, never dearer
    meta = {"hardware": {"matmul_flops_per_s": 162e9}, "architectures": {"target": {
        "layers": 30, "hidden": 576, "heads": 9, "kv_heads": 3, "head_dim": 64, "intermediate": 1536,
        "vocab": 49152, "tied_embeddings": True, "bytes_per_parameter": 4}}}
    roofed = held_price(price, reach, meta)
    assert roofed.held.token_s == pytest.approx(2 * 30 * 3_540_096 / 162e9)  # 1.31 ms a token
    assert roofed.held.pair_s == pytest.approx(4 * 30 * 9 * 64 / 162e9)
    assert roofed.forward_s(1100) == pytest.approx(price.forward_s(64) + 1036 * roofed.held.token_s)
    slow = held_price(replace(price, per_token_s=0.001), reach, meta)
    assert slow.forward_s(1100) == pytest.approx(0.001 * 1100)  # the run's own price where it is cheaper


def test_capped_pairs_match_the_replicas_count_within_the_cap_and_are_linear_past_it():
    assert capped_pairs(10, 20, 64) == 20 * (10 + 20 / 2)
    assert capped_pairs(100, 50, 64) == 50 * 64
    # a chunk across the cap: the two parts
    assert capped_pairs(40, 60, 64) == pytest.approx(capped_pairs(40, 24, 64) + capped_pairs(64, 36, 64))


@pytest.mark.integration
def test_extrapolate_plans_the_trace_held_and_says_so(tmp_path):
    from typer.testing import CliRunner

    from specbench.cli import app

    trace = azure_csv(tmp_path / "long.csv", 12, 30.0, (1000, 1200), (16, 17))
    result = CliRunner().invoke(app, ["plan", str(RUN), "--trace", trace, "--slo", "ttft=30,tpot=0.3,p90",
                                      "--json", "--extrapolate"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["held"].startswith("past the run's longest prompt (64 tokens) a step's tokens are priced linearly")
    assert plan["beyond_measured"] and all(row["replicas"] >= 1 for row in plan["rows"])


def test_a_fleet_plan_tells_its_progress_and_ctrl_c_prints_what_finished(monkeypatch):
    """The library tells on_progress of each configuration as it finishes (0 done first); a Ctrl-C
    mid-plan prints the configurations already sized and exits 130."""
    from typer.testing import CliRunner

    from specbench.cli import app
    from specbench.fleet import sizing

    told = []
    real = sizing.size_fleets

    def recorded(*args, on_progress=None, **kwargs):
        def mine(done, total, label):
            told.append((done, total, label))
            if on_progress is not None:
                on_progress(done, total, label)
        return real(*args, on_progress=mine, **kwargs)

    monkeypatch.setattr(sizing, "size_fleets", recorded)
    monkeypatch.setattr("specbench.fleet.plan.size_fleets", recorded)
    args = ["plan", "--target", "llama3-8b", "--drafts", "1b", "--device", "h100", "--tp", "1", "--alpha", "0.7",
            "--k", "2,3", "--trace", "azure-conv", "--trace-window", "0:30", "--slo", "ttft=2,tpot=0.05,p90", "--json"]
    result = CliRunner().invoke(app, args)
    assert result.exit_code == 0, result.output
    json.loads(result.stdout)  # progress never on stdout
    total = told[0][1]
    assert told[0] == (0, total, "") and [done for done, _, _ in told] == list(range(total + 1))
    assert all(label.endswith("at 1×") for _, _, label in told[1:]), told

    def interrupted(done, total, label):
        if done == 2:
            raise KeyboardInterrupt

    def stopping(*args, on_progress=None, **kwargs):
        def mine(done, total, label):
            on_progress(done, total, label)
            interrupted(done, total, label)
        return real(*args, on_progress=mine, workers=1, **kwargs)

    monkeypatch.setattr("specbench.fleet.plan.size_fleets", stopping)
    stopped = CliRunner().invoke(app, args[:-1])
    assert stopped.exit_code == 130, stopped.output
    assert "stopped after 2 configurations (SIMULATED):" in stopped.output
    assert "without speculation: " in stopped.output and "1 at 1×" in stopped.output, stopped.output
