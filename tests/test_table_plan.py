"""`specbench plan --target`: speculative decoding priced on NVIDIA's kernel tables (the gpu-tables
extra, aiconfigurator-core 0.12). Plan cells recomputed by hand from the same EngineHandle calls,
the refusals (one line, exit 2), memory, acceptance from --alpha and from a run, and the speed."""

import json
import math
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.fit import kernel_tables
from specbench.fit.table_plan import Acceptance
from specbench.step_model import StaticTablesStep
from specbench.synthetic import shipped_config

runner = CliRunner()
CPU_RUN = "tests/fixtures/cpu/default-grid"  # smollm2-135m with ngram and its bf16 copy
GPU_RUN = "tests/fixtures/gpu/h100-2026-11-23/synthetic-llama3-8b-1b-graphs"  # llama3-8b, 1b at a simulated α 0.8


def step_ms(planner, drafter, k: int, rows: int, context: int, tp: int, draft_tp: int) -> float:
    """A speculative step on the static planner's step model (`StaticTablesStep`)."""
    return StaticTablesStep(planner, tp, drafter, draft_tp).step_ms(k, rows, context)


def decode_ms(planner, rows: int, context: int, tp: int) -> float:
    return StaticTablesStep(planner, tp).decode_ms(rows, context)


def prefill_ms(planner, drafter, rows: int, prompt: int, tp: int, draft_tp: int) -> float:
    return StaticTablesStep(planner, tp, drafter, draft_tp).prefill_ms(rows, prompt)


def plan_json(*args: str) -> dict:
    result = runner.invoke(app, ["plan", "--target", "llama3-70b", *args, "--json"])
    assert result.exit_code == 0, result.output
    return json.loads(result.output)


def engine(alias: str, tp: int, tmp_path: Path, nextn: int = 0):
    """aiconfigurator's own EngineHandle on the shipped config: the calls the plan must agree with."""
    from aiconfigurator_core.sdk.engine import EngineHandle

    folder = tmp_path / f"{alias}-{tp}-{nextn}"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(shipped_config(alias)[1]))
    return EngineHandle.compile(str(folder), "h100_sxm", "vllm", tp_size=tp, nextn=nextn)


def logits_ms(handle, tokens: int) -> float:
    return sum(op[1] for op in handle.decode_step_per_op(tokens, 1024, 2) if op[0] == "generation_logits_gemm")


def row(plan: dict, **where) -> dict:
    found = [r for r in plan["predictions"] if all(r[k] == v for k, v in where.items())]
    assert len(found) == 1, (where, len(found))
    return found[0]


def test_plan_cells_recomputed_by_hand_from_the_tables(tmp_path):
    """A draft-model cell: K draft decodes, what the first draft forward's K + 2 positions a row add
    (vLLM's draft model runs over the K + 1 verified tokens and one more slot), and a verify of K + 1
    positions over the context, and the batch's prefills, each from the tables; τ, tokens/s per GPU,
    speed-up and $ from them."""
    plan = plan_json("--drafts", "1b", "--tp", "4", "--alpha", "0.7", "--k", "3", "--batch-sizes", "32",
                     "--context-lengths", "2048", "--max-new-tokens", "200")
    target, draft = engine("llama3-70b", 4, tmp_path), engine("llama3.2-1b", 4, tmp_path)
    b, k, prompt, out, alpha = 32, 3, 2048, 200, 0.7
    at = prompt + out // 2  # the mean context over the decode
    ar_step = target.predict_decode_latency(b, at, 2)
    verify = target.predict_prefill_latency(b, at + k + 1, at) + logits_ms(target, b * (k + 1)) - logits_ms(target, b)
    catch_up = draft.predict_prefill_latency(b, at + k + 2, at) - draft.predict_prefill_latency(b, at + 1, at)
    sd_step = k * draft.predict_decode_latency(b, at, 2) + catch_up + verify
    ar_batch = target.predict_prefill_latency(b, prompt, 0) + (out - 1) * ar_step
    tau = (1 - alpha ** (k + 1)) / (1 - alpha)
    sd_batch = target.predict_prefill_latency(b, prompt, 0) + draft.predict_prefill_latency(b, prompt, 0) \
        + (out - 1) / tau * sd_step
    ar_per_gpu, sd_per_gpu = b * out / ar_batch * 1000 / 4, b * out / sd_batch * 1000 / 4

    ar, sd = row(plan, draft="autoregressive", batch_size=b), row(plan, draft="1b", k=k, batch_size=b)
    assert ar["step_ms"] == pytest.approx(ar_step, rel=1e-9) and sd["step_ms"] == pytest.approx(sd_step, rel=1e-9)
    assert sd["tau"] == pytest.approx(tau)
    assert ar["tokens_per_s_per_gpu"] == pytest.approx(ar_per_gpu, rel=1e-9)
    assert sd["tokens_per_s_per_gpu"] == pytest.approx(sd_per_gpu, rel=1e-9)
    assert sd["speedup"] == pytest.approx(sd_per_gpu / ar_per_gpu, rel=1e-9)
    assert sd["tpot_ms"] == pytest.approx(sd_batch / (out - 1), rel=1e-9)
    assert sd["cost_per_1m"] == pytest.approx(4.25 * 1e6 / (sd_per_gpu * 3600), rel=1e-9)  # H100's default price
    assert plan["tables"] == f"aiconfigurator-core {kernel_tables.version()} tables (h100_sxm, vLLM 0.24.0)"
    assert plan["estimate"].startswith("ESTIMATE from aiconfigurator-core")


def test_the_first_draft_forward_runs_over_the_verified_tokens_as_vllms_proposers_do():
    """vLLM's first draft forward of a step runs over the K + 1 tokens the target verified and, for a
    draft model, one slot more (K + 2 a row; an EAGLE head shifts its inputs: K + 1). The native
    engine feeds its draft only what it has not cached, so a plan a native run corrects prices none."""
    from specbench.cli.plan_tables import target_and_drafters
    from specbench.fit.table_plan import TablePlanner, first_draft_positions

    assert first_draft_positions("model", 3) == 5 and first_draft_positions("eagle", 3) == 4
    _, name, config, drafters = target_and_drafters("llama3-70b", "1b,eagle")
    bare = TablePlanner(config, name, "h100_sxm", "vllm", host=None, launch=None)
    same = {kind: (lambda b: 1.0) for kind in ("decode", "verify", "draft", "prefill", "draft prefill")}
    native = TablePlanner(config, name, "h100_sxm", "vllm", corrections=same, host=None, launch=None)
    for drafter in drafters:
        draft_tp = 4 if drafter.kind == "eagle" else 1
        forward = bare.forward(drafter.config, draft_tp, name=drafter.label)
        extra = forward.extra_positions_ms(64, 2048, first_draft_positions(drafter.kind, 3))
        assert extra > 0, drafter.name
        assert step_ms(bare, drafter, 3, 64, 2048, 4, 1) - step_ms(native, drafter, 3, 64, 2048, 4, 1) == \
            pytest.approx(extra, rel=1e-9), drafter.name


def test_mtp_is_priced_as_aiconfigurator_prices_it(tmp_path):
    plan = plan_json("--drafts", "mtp:2", "--tp", "8", "--alpha", "0.8", "--batch-sizes", "16",
                     "--max-new-tokens", "64")
    mtp = row(plan, draft="mtp:2", batch_size=16)
    assert mtp["k"] == 2
    assert mtp["step_ms"] == pytest.approx(engine("llama3-70b", 8, tmp_path, nextn=2).predict_decode_latency(
        16, 1024 + 32, 2), rel=1e-9)


def test_an_eagle_head_costs_less_than_a_draft_model_and_ngram_needs_a_run():
    plan = plan_json("--drafts", "eagle,8b,ngram", "--tp", "4", "--alpha", "0.7", "--k", "3", "--batch-sizes", "8")
    eagle, eight = row(plan, draft="eagle", batch_size=8), row(plan, draft="8b", batch_size=8)
    ar = row(plan, draft="autoregressive", batch_size=8)
    assert ar["step_ms"] < eagle["step_ms"] < eight["step_ms"]
    assert not [r for r in plan["predictions"] if r["draft"] == "ngram"]
    assert any(line.startswith("ngram: n-gram acceptance depends on the text") for line in plan["drafts_left_out"])


def test_70b_on_one_h100_does_not_fit_and_is_never_priced():
    result = runner.invoke(app, ["plan", "--target", "llama3-70b", "--drafts", "1b", "--tp", "1,4", "--alpha", "0.7",
                                 "--k", "2", "--batch-sizes", "1,256", "--context-lengths", "8k", "--json"])
    plan = json.loads(result.output)
    tp1 = [r for r in plan["predictions"] if r["tp"] == 1]
    assert tp1 and all(not r["fits"] and r["largest_batch"] == 0 for r in tp1)
    assert all(r["speedup"] is None and r["tokens_per_s_per_gpu"] is None for r in tp1)
    big = row(plan, tp=4, draft="autoregressive", batch_size=256)  # 256 rows of 8k tokens of KV at TP4
    assert not big["fits"] and 1 < big["largest_batch"] < 256 and big["tokens_per_s_per_gpu"] is None
    result = runner.invoke(app, ["plan", "--target", "llama3-70b", "--drafts", "1b", "--tp", "1", "--alpha", "0.7",
                                 "--batch-sizes", "1"])
    assert result.exit_code == 2 and result.output.startswith("error: llama3-70b fits no batch on h100_sxm: at TP1 "
                                                              "its weights alone take 131 GiB"), result.output


@pytest.mark.parametrize("args, message", [
    (["--tp", "3"], "TP3 does not divide llama3-70b's 64 attention heads and 8 KV heads"),
    (["--device", "tpu-v5"], "tables hold no vLLM measurements for 'tpu-v5'; they have: a100_sxm"),
    (["--backend", "tgi"], "--backend must be one of vllm, sglang, trtllm"),
    (["--drafts", "foo-7b"], "no config for model 'foo-7b' is available offline"),
    (["--drafts", "smollm2-135m"], "has a vocabulary of 49152 tokens, the target 128256"),
    (["--draft-tp", "2", "--tp", "4"], "--draft-tp must be 1 or the target's TP"),
    (["--slo", "ttft=1"], "--slo on the tables takes a TPOT target only"),
    (["--alpha", "1.0"], "--alpha needs values in [0, 1)"),
    (["--gpus", "4"], "--gpus does not apply to a static-batch plan on the kernel tables (--target): with --target, a replica's GPUs are its --tp"),
    (["--context-lengths", "128k"], "--context-lengths 131072 + --max-new-tokens 128: 131200 tokens a request, past "
                                    "llama3-70b's 131072-token context"),
    # A100's vLLM tables time no attention of 64-wide heads (llama3.2-1b's): the baseline alone was printed,
    # no table, exit 0
    (["--device", "a100", "--tp", "8", "--drafts", "1b"], "no draft could be priced, so there is nothing to set "
                                                          "beside the baseline: 1b at TP8: the a100_sxm vLLM"),
])
def test_bad_table_plan_input_is_one_line(args, message):
    base = {"--alpha": "0.7", "--tp": "4"}
    for flag, value in zip(args[::2], args[1::2]):
        base[flag] = value
    result = runner.invoke(app, ["plan", "--target", "llama3-70b", *[x for kv in base.items() for x in kv]])
    assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1, \
        result.output


def test_a_size_the_targets_family_lacks_names_the_sizes_it_has():
    """The default --drafts (1b,8b) are llama3's sizes: another family's target says which it has."""
    result = runner.invoke(app, ["plan", "--target", "qwen2.5-32b", "--tp", "2", "--alpha", "0.7"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    assert "draft '1b': qwen2.5 has no 1b model (its sizes: 0.5b, 1.5b, 3b, 7b, 14b, 32b, 72b)" in result.output


def test_without_the_extra_one_line_says_how_to_install(monkeypatch):
    import sys

    cached = [kernel_tables._core, kernel_tables.backend_version, kernel_tables.systems, kernel_tables.device]
    for function in cached:  # as in a fresh process: nothing learnt from the tables earlier
        function.cache_clear()
    for name in [m for m in sys.modules if m.startswith("aiconfigurator_core")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "aiconfigurator_core", None)
    try:
        result = runner.invoke(app, ["plan", "--target", "llama3-70b", "--alpha", "0.7"])
        calibrated = runner.invoke(app, ["plan", "--target", "llama3-70b", "--alpha", "0.7", "--calibrate", GPU_RUN])
    finally:
        for function in cached:
            function.cache_clear()
    for result in (result, calibrated):
        assert result.exit_code == 2 and "pip install 'specbench[gpu-tables]'" in result.output \
            and len(result.output.strip().splitlines()) == 1, result.output


def test_per_position_acceptance_sets_tokens_per_step():
    iid = Acceptance("1b", "α 0.7", 0.7)
    assert iid.tokens_per_step(4) == pytest.approx((1 - 0.7 ** 5) / 0.3)
    measured = Acceptance("1b", "chat", 0.7, reach=(0.9, 0.6))  # two positions measured, then α per position
    assert measured.tokens_per_step(2) == pytest.approx(1 + 0.9 + 0.6)
    assert measured.tokens_per_step(4) == pytest.approx(1 + 0.9 + 0.6 + 0.6 * 0.7 + 0.6 * 0.49)


def test_acceptance_from_another_targets_run_is_labelled_transferred():
    plan = plan_json("--drafts", "ngram,1b", "--tp", "4", "--acceptance", CPU_RUN, "--k", "3", "--batch-sizes", "8")
    assert "measured with target smollm2-135m" in plan["acceptance_transferred"]
    assert any(line.startswith("1b: no α for it in") for line in plan["drafts_left_out"])
    ngram = [r for r in plan["predictions"] if r["draft"] == "ngram"]
    assert {r["acceptance"] for r in ngram} >= {"chat T=0", "code T=0"}
    text = runner.invoke(app, ["plan", "--target", "llama3-70b", "--drafts", "ngram", "--tp", "4", "--acceptance",
                               CPU_RUN, "--k", "3", "--batch-sizes", "8"]).output
    assert "TRANSFERRED ACCEPTANCE: the α was measured with target smollm2-135m" in text


def test_a_timing_only_runs_acceptance_is_the_alpha_it_simulated():
    plan = plan_json("--drafts", "1b", "--tp", "4", "--acceptance", GPU_RUN, "--k", "2", "--batch-sizes", "8")
    alphas = {r["alpha"] for r in plan["predictions"] if r["draft"] == "1b"}
    assert len(alphas) == 1 and alphas.pop() == pytest.approx(0.8)
    assert "simulated α 0.80" in plan["predictions"][-1]["acceptance"]


def test_slo_picks_per_tp_the_batch_that_meets_tpot_and_the_cheaper():
    plan = plan_json("--drafts", "1b", "--tp", "4,8", "--alpha", "0.8", "--k", "2,4",
                     "--batch-sizes", "1,8,32,64,128,256", "--slo", "tpot=0.03")
    slo = plan["slo"]
    assert {s["tp"] for s in slo} == {4, 8}
    for choice in slo:
        ar = row(plan, tp=choice["tp"], draft="autoregressive", batch_size=choice["ar_batch"])
        assert ar["tpot_ms"] <= 30 and ar["cost_per_1m"] == pytest.approx(choice["ar_cost_per_1m"])
        larger = [r for r in plan["predictions"] if r["tp"] == choice["tp"] and r["draft"] == "autoregressive"
                  and r["batch_size"] > choice["ar_batch"] and r["fits"]]
        assert all(r["tpot_ms"] > 30 or r["tokens_per_s_per_gpu"] <= ar["tokens_per_s_per_gpu"] for r in larger)
        cheaper = min(choice["ar_cost_per_1m"], choice["sd_cost_per_1m"])
        assert choice["cheapest"] == ("speculative" if choice["sd_cost_per_1m"] == cheaper else "autoregressive")


def test_the_issue_grid_prices_in_seconds():
    """2 drafts x 6 K x 8 batch sizes x 3 contexts x 2 TP sizes, tables loaded once."""
    plan = plan_json("--drafts", "1b,8b", "--tp", "4,8", "--alpha", "0.7", "--k", "1,2,3,4,6,8",
                     "--batch-sizes", "1,2,4,8,16,32,64,128", "--context-lengths", "1k,4k,16k")
    assert len([r for r in plan["predictions"] if r["draft"] != "autoregressive"]) == 2 * 6 * 8 * 3 * 2
    assert plan["seconds"] < 10
    assert all(math.isfinite(d["best_speedup"]) for d in plan["decisions"])


def test_plan_help_names_the_extra_and_run_mode_keeps_one_alpha():
    assert "specbench[gpu-tables]" in runner.invoke(app, ["plan", "--help"], env={"COLUMNS": "200"}).output
    result = runner.invoke(app, ["plan", GPU_RUN, "--alpha", "0.6,0.8"])
    assert result.exit_code == 2 and "with a run, one number in [0, 1)" in result.output, result.output
    result = runner.invoke(app, ["plan", GPU_RUN, "--tp", "4"])
    assert result.exit_code == 2 and "--tp does not apply to a plan on a run's fit (RUN_DIR); it applies with --target" in result.output
    result = runner.invoke(app, ["plan", GPU_RUN, "--target", "llama3-70b", "--alpha", "0.7"])
    assert result.exit_code == 2 and "RUN_DIR does not apply to a static-batch plan on the kernel tables" in result.output


def test_a_kernel_the_tables_lack_leaves_that_drafter_out_in_one_line():
    """The A100 tables (vLLM 0.14) hold no decode attention for head size 64 (llama3.2-1b): the 1b
    is left out with the reason, the 8b still planned; never an internal error."""
    plan = plan_json("--drafts", "1b,8b", "--device", "a100", "--tp", "8", "--alpha", "0.7", "--k", "2",
                     "--batch-sizes", "1,8")
    assert any(line.startswith("1b at TP8: the a100_sxm vLLM 0.14.0 tables cannot price llama3.2-1b")
               and "64-wide heads" in line for line in plan["drafts_left_out"]), plan["drafts_left_out"]
    assert {r["draft"] for r in plan["predictions"]} == {"autoregressive", "8b"}


def test_a_draft_of_the_targets_family_drafts_whatever_its_embedding_padding():
    result = runner.invoke(app, ["plan", "--target", "qwen2.5-72b", "--drafts", "0.5b", "--tp", "4", "--draft-tp", "1",
                                 "--alpha", "0.7", "--k", "2", "--batch-sizes", "8", "--json"])
    assert result.exit_code == 0 and json.loads(result.output)["drafters"] == {"0.5b": "qwen2.5-0.5b"}, result.output
    result = runner.invoke(app, ["plan", "--target", "qwen2.5-72b", "--drafts", "0.5b", "--tp", "4", "--alpha", "0.7"])
    assert result.exit_code == 2 and "give --draft-tp a TP that does" in result.output


def test_a_run_on_the_same_gpu_corrects_the_tables_kind_by_kind(tmp_path):
    """--calibrate: each kind of forward scaled by measured / tables, fitted on the run's batch sizes."""
    from specbench.fit.calibration import calibrate
    from specbench.results import load_run

    args = ["--drafts", "1b", "--tp", "4", "--alpha", "0.7", "--k", "2", "--batch-sizes", "32"]
    bare, corrected = plan_json(*args), plan_json(*args, "--calibrate", GPU_RUN)
    run = load_run(GPU_RUN)
    kinds = calibrate(run.cells, run.steps, run.requests, run.meta, "h100_sxm").by_kind()
    assert set(kinds) == {"decode", "verify", "prefill", "draft", "draft prefill"}
    assert 1.2 < float(kinds["decode"](32)) < 1.6  # the native engine runs 1.30-1.41x vLLM's kernels
    ar_bare, ar = row(bare, draft="autoregressive", batch_size=32), row(corrected, draft="autoregressive", batch_size=32)
    assert ar["step_ms"] == pytest.approx(ar_bare["step_ms"] * float(kinds["decode"](32)), rel=1e-9)
    assert corrected["corrected_by"][0].startswith(f"the tables scaled by what {GPU_RUN} measured")
    assert not bare["corrected_by"]
    # each draft takes the corrections of the measured model nearest its size: an 8b draft those
    # of the run's llama3-8b target (1.4x), not of its launch-bound 1b draft (1.5-1.8x, prefill 5-7x)
    both = plan_json("--drafts", "1b,8b", "--tp", "4", "--alpha", "0.7", "--k", "2", "--batch-sizes", "32",
                     "--calibrate", GPU_RUN)
    assert "  8b's forwards: the corrections of llama3-8b (8.0B parameters), the measured model nearest its size" \
        in both["corrected_by"] and "  1b's forwards: the corrections of 1b" in "\n".join(both["corrected_by"])
    from specbench.fit.table_plan import Drafter, TablePlanner

    found = calibrate(run.cells, run.steps, run.requests, run.meta, "h100_sxm")
    planner = TablePlanner(shipped_config("llama3-70b")[1], "llama3-70b", "h100_sxm", "vllm", kinds,
                           found.measured_models())
    for alias, kind in (("llama3-8b", "decode"), ("llama3.2-1b", "draft")):
        drafter = Drafter(alias, "model", shipped_config(alias)[1], alias)
        assert planner.draft_scale(drafter, "draft", 32) == pytest.approx(float(kinds[kind](32)))
    assert planner.draft_scale(Drafter("8b", "model", shipped_config("llama3-8b")[1]), "draft prefill", 32) \
        == pytest.approx(float(kinds["prefill"](32)))
    cpu = runner.invoke(app, ["plan", "--target", "llama3-70b", "--alpha", "0.7", "--tp", "4", "--calibrate", CPU_RUN])
    assert cpu.exit_code == 2 and "needs a run measured on a GPU" in cpu.output
    unknown = tmp_path / "on-an-l4"
    shutil.copytree(GPU_RUN, unknown)
    meta = json.loads((unknown / "run.json").read_text())
    meta["hardware"]["gpus"][0]["name"] = "NVIDIA L4"
    (unknown / "run.json").write_text(json.dumps(meta))
    refused = runner.invoke(app, ["plan", "--target", "llama3-70b", "--alpha", "0.7", "--calibrate", str(unknown)])
    assert refused.exit_code == 2 and "ran on NVIDIA L4, which the vllm tables do not hold" in refused.output
    assert len(refused.output.strip().splitlines()) == 1
    # an H100 run corrects an H200 plan: measured / tables on the H100's tables, carried to the H200's
    other = plan_json("--target", "llama3-70b", "--alpha", "0.7", "--tp", "4", "--device", "h200", "--calibrate",
                      GPU_RUN)
    assert "on h100_sxm's tables, carried to h200_sxm's" in other["corrected_by"][0]
    assert f"decode: {kinds['decode'].describe()}" in other["corrected_by"][1]


def test_corrections_measured_on_one_gpu_carry_to_another():
    """An H100 run's corrections on the H200's tables predict the same engine's H200 runs (the
    2026-11-25 and 2026-11-28 runs: three targets, 40 speculative cells, B 1-128) about as well as
    the H200 runs' own: the corrections are the engine's overhead over vLLM's kernels, not the GPU's.
    Measured: 5.2 % median |speed-up error|, 38/40 on the measured side of 1x (own: 4.1 %; bare
    tables: 27.9 %, 23/40)."""
    from specbench.fit.calibration import calibrate, carried, predicted_with
    from specbench.results import load_run

    frames = {"carried": [], "bare": []}
    for name in ("synthetic-llama3-8b", "synthetic-llama3.2-3b", "synthetic-qwen2.5-7b"):
        h100, h200 = (load_run(f"tests/fixtures/gpu/{day}/{name}") for day in ("h100-2026-11-25", "h200-2026-11-28"))
        assert h200.meta["hardware"]["gpus"][0]["name"] == "NVIDIA H200"
        found = calibrate(h100.cells, h100.steps, h100.requests, h100.meta, "h100_sxm")
        own = (h200.cells, h200.steps, h200.requests, h200.meta)
        frames["carried"].append(predicted_with(carried(found, *own, "h200_sxm"), *own))
        frames["bare"].append(predicted_with(calibrate(*own, "h200_sxm", correct=False).times, *own))
    carried_frame, bare = pd.concat(frames["carried"]), pd.concat(frames["bare"])
    assert len(carried_frame) == 40
    assert carried_frame["speedup_error"].abs().median() < 0.07 and carried_frame["same_side"].mean() >= 0.9
    assert bare["speedup_error"].abs().median() > 0.2


def test_corrected_tables_predict_a_held_out_batch_size():
    """The largest B (128) of the 2026-11-25 H100 runs hidden (three targets, two families, five
    drafts): the tables corrected on B = 1-64 predict its speculative cells within 6 % (median) and
    on the measured side of 1x; the bare tables miss by ~20 %. Before the drafts' prefill had its own
    correction (it ran 4.6-8.8x the tables, unscaled) the corrected tables missed by 15.6 %."""
    from specbench.fit.calibration import held_out_on_tables
    from specbench.results import load_run

    corrected, bare = [], []
    for name in ("synthetic-llama3-8b", "synthetic-llama3.2-3b", "synthetic-qwen2.5-7b"):
        run = load_run(f"tests/fixtures/gpu/h100-2026-11-25/{name}")
        corrected.append(held_out_on_tables(run.cells, run.steps, run.requests, run.meta, "h100_sxm"))
        bare.append(held_out_on_tables(run.cells, run.steps, run.requests, run.meta, "h100_sxm", correct=False))
    corrected, bare = pd.concat(corrected), pd.concat(bare)
    assert set(corrected["held_out_batch_size"]) == {128} and len(corrected) == 10
    assert corrected["speedup_error"].abs().median() < 0.06 and corrected["same_side"].all()
    assert bare["speedup_error"].abs().median() > 0.15


def test_corrected_tables_meet_the_held_out_bounds_on_every_committed_h100_run():
    """Issue 39's bound, on every committed H100 run the tables can price (15 cells): median |error|
    <= 6 % and the measured side of 1x in >= 90 % of cells. The one miss is the 2026-11-22 K = 4
    cell (measured 1.17x), on that day's engine whose step cost grew with the batch."""
    from specbench.fit.calibration import held_out_on_tables
    from specbench.results import load_run

    runs = ["h100-2026-11-23/synthetic-llama3-8b-1b-graphs", "h100-2026-11-23/synthetic-llama3-8b-1b-context",
            "h100-2026-11-22/synthetic-llama3-8b-1b-graphs", "h100-2026-11-25/synthetic-llama3-8b",
            "h100-2026-11-25/synthetic-llama3.2-3b", "h100-2026-11-25/synthetic-qwen2.5-7b"]
    frames = []
    for name in runs:
        run = load_run(f"tests/fixtures/gpu/{name}")
        frames.append(held_out_on_tables(run.cells, run.steps, run.requests, run.meta, "h100_sxm"))
    pooled = pd.concat(frames)
    assert len(pooled) == 15
    assert pooled["speedup_error"].abs().median() <= 0.06 and pooled["same_side"].mean() >= 0.9


def test_a_cpu_run_planned_on_a_gpu_is_priced_on_its_tables_with_its_acceptance(tmp_path):
    """plan CPU_RUN --device h100: a CPU's fitted efficiencies say nothing of an H100's, so the run's
    target and drafts are priced on the H100 tables with the α it measured: the same plan as
    --target/--drafts/--acceptance, said on a NOTE line."""
    import shutil

    run = tmp_path / "cpu-llama"
    shutil.copytree(GPU_RUN, run)  # llama3-8b with the 1b (simulated α 0.8), as if it ran on a CPU
    meta = json.loads((run / "run.json").read_text())
    meta["hardware"]["gpus"] = []
    (run / "run.json").write_text(json.dumps(meta))
    args = ["--k", "2", "--batch-sizes", "1,64", "--max-new-tokens", "128"]
    routed = runner.invoke(app, ["plan", str(run), "--device", "h100", *args, "--json"])
    assert routed.exit_code == 0, routed.output
    routed = json.loads(routed.output)
    direct = runner.invoke(app, ["plan", "--target", "llama3-8b", "--drafts", "llama3.2-1b", "--device", "h100",
                                 "--acceptance", str(run), *args, "--json"])
    direct = json.loads(direct.output)
    assert routed["tables"] == direct["tables"] and routed["drafters"] == {"llama3.2-1b": "llama3.2-1b"}
    assert routed["predictions"] == direct["predictions"] and routed["notes"][0].startswith(f"NOTE: {run} ran on a CPU")
    shown = runner.invoke(app, ["plan", str(run), "--device", "h100", *args])
    assert shown.exit_code == 0 and "its models are priced on the h100 kernel tables with its measured α" in \
        " ".join(shown.output.split())
    bad = runner.invoke(app, ["plan", str(run), "--device", "h100x", *args])
    assert bad.exit_code == 2 and len(bad.output.strip().splitlines()) == 1 and "hold no vLLM measurements" in bad.output


def test_a_correction_passes_through_each_measured_size_and_holds_beyond():
    """measured / tables by batch size: the median of each size, joined in log2 B, held flat past the
    smallest and largest sizes measured (no trend extrapolated); one size: a constant."""
    from specbench.fit.calibration import Correction

    correction = Correction.fit(np.array([1, 1, 1, 8, 32]), np.array([1.2, 1.4, 9.0, 1.6, 1.9]))
    assert [float(correction(b)) for b in (1, 8, 32)] == pytest.approx([1.4, 1.6, 1.9])
    assert float(correction(4)) == pytest.approx(1.4 + (1.6 - 1.4) * 2 / 3)  # log2 4 between log2 1 and log2 8
    assert float(correction(128)) == pytest.approx(1.9) and float(correction(0.5)) == pytest.approx(1.4)
    assert float(Correction.fit(np.array([8, 8]), np.array([2.0, 3.0]))(64)) == pytest.approx(2.5)
    line = Correction.fit(np.array([1, 2, 4]), np.array([1.0, 2.0, 2.0]), "loglinear")
    assert float(line(1)) != pytest.approx(1.0)  # a least-squares line misses a size it was fitted on
    with pytest.raises(ValueError, match="correction shape must be"):
        Correction.fit(np.array([1, 2]), np.array([1.0, 2.0]), "cubic")


def test_a_batch_prefill_is_corrected_at_the_batch_size_it_was_fitted_at():
    """A batch of varied prompts runs several prefill forwards of a few rows each; its correction was
    fitted per batch (measured batch / the tables' forwards summed), so a prediction scales the sum by
    the correction at the batch's size, not each forward by the correction at its own rows."""
    from specbench.fit.calibration import Correction, TableForward
    from specbench.fit.prefill_times import prefill_forwards
    from specbench.fit.step_times import StepTimes
    from specbench.fit.kernel_tables import Forward

    forward = Forward(shipped_config("llama3-8b")[1], "h100_sxm", "vllm", 1, name="llama3-8b")
    correction = Correction.fit(np.array([1, 64]), np.array([4.0, 2.0]))
    prefill = TableForward(forward, prefill=True).corrected(correction)
    lengths = [8, 9, 20, 22, 50, 54] * 8 + [100] * 16  # 64 rows, several forwards
    groups = prefill_forwards(lengths)
    assert len(groups) > 2 and max(rows for rows, _ in groups) < 64
    table_s = sum(forward.prefill_ms(rows, positions) for rows, positions in groups) / 1000
    times = StepTimes(TableForward(forward), {}, prefill, {})
    assert times.prefill_s(lengths) == pytest.approx(table_s * 2.0)


@pytest.fixture()
def vllm_run_on_an_h100(tmp_path):
    """The committed vLLM CPU run (closed loop, B = 1 and 4, ngram and a draft model) renamed as if
    it ran llama3-8b with the 1b on an H100: no GPU vLLM run is committed, and the arithmetic of a
    served calibration is the same whatever the numbers."""
    import shutil

    import pandas as pd

    run = tmp_path / "vllm-h100"
    shutil.copytree("tests/fixtures/cpu/vllm-ray", run)
    meta = json.loads((run / "run.json").read_text())
    meta["config"].update(target="llama3-8b", drafts=["ngram", "1b"])
    meta["hardware"] = {**meta.get("hardware", {}), "gpus": [{"name": "NVIDIA H100 80GB HBM3"}]}
    (run / "run.json").write_text(json.dumps(meta))
    cells = pd.read_parquet(run / "cells.parquet")
    cells["draft"] = cells["draft"].replace({"smollm2-135m": "1b"})
    cells.to_parquet(run / "cells.parquet")
    return run


def test_a_vllm_run_corrects_the_tables_per_step(vllm_run_on_an_h100):
    """From a served run: decode from the baseline's TPOT, the whole speculative step from TPOT x τ
    against K draft decodes plus the verify on the tables, the prefill from TTFT."""
    from specbench.fit.calibration import calibrate_served
    from specbench.results import load_run

    run = load_run(vllm_run_on_an_h100)
    kinds = calibrate_served(run.cells, run.meta, "h100_sxm").by_kind()
    assert set(kinds) == {"decode", "step", "prefill"}
    target = kernel_tables.Forward(shipped_config("llama3-8b")[1], "h100_sxm", "vllm", 1)
    ok = run.cells[(run.cells["status"] == "ok") & (run.cells["mode"] == "autoregressive") & (run.cells["batch_size"] == 4)]
    by_hand = [c.tpot_mean_s * 1000 / target.decode_ms(4, int(c.prompt_tokens_mean + c.max_new_tokens / 2))
               for c in ok.itertuples()]
    assert float(kinds["decode"](4)) == pytest.approx(float(np.median(by_hand)), rel=1e-6)  # two sizes: the line
    args = ["--drafts", "1b", "--tp", "2", "--alpha", "0.7", "--k", "2", "--batch-sizes", "4"]
    bare, corrected = plan_json(*args), plan_json(*args, "--calibrate", str(vllm_run_on_an_h100))
    sd_bare, sd = row(bare, draft="1b", batch_size=4), row(corrected, draft="1b", batch_size=4)
    assert sd["step_ms"] == pytest.approx(sd_bare["step_ms"] * float(kinds["step"](4)), rel=1e-9)
    assert "vLLM at TP1, per step from TPOT × τ" in corrected["corrected_by"][0]
    # on another GPU's plan: the ratios measured against the H100's tables scale the H200's
    elsewhere, elsewhere_bare = (plan_json(*args, "--device", "h200", *more)
                                 for more in (["--calibrate", str(vllm_run_on_an_h100)], []))
    sd_there, sd_there_bare = row(elsewhere, draft="1b", batch_size=4), row(elsewhere_bare, draft="1b", batch_size=4)
    assert sd_there["step_ms"] == pytest.approx(sd_there_bare["step_ms"] * float(kinds["step"](4)), rel=1e-9)
    assert "on h100_sxm's tables, carried to h200_sxm's" in elsewhere["corrected_by"][0]


def test_k_within_one_percent_of_the_best_is_a_tie_the_smaller_k_wins():
    import pandas as pd

    from specbench.fit.table_plan import best_k, decisions

    rows = [(8, 2, 1.200), (8, 4, 1.205), (64, 1, 0.995), (64, 2, 1.003)]
    table = pd.DataFrame([{"tp": 4, "context_length": 1024, "acceptance": "α 0.7", "draft": "1b", "batch_size": b,
                           "k": k, "speedup": s, "fits": True, "cost_per_1m": 1.0} for b, k, s in rows])
    chosen = best_k(table).set_index("batch_size")
    assert chosen.loc[8, "k"] == 2 and chosen.loc[8, "highest_speedup"] == pytest.approx(1.205)
    assert chosen.loc[64, "k"] == 2  # 0.995x is within 1 % of 1.003x but on the other side of 1x
    assert decisions(table)["k_schedule"].iloc[0] == "{1+: 2}"


def test_the_k_schedule_never_drafts_deeper_at_a_larger_batch_unless_the_tables_say_so_by_over_3_percent():
    """Per batch the best K zigzags (4, 6, 4) where the tables jitter: the schedule that never rises
    with B and costs no batch anything beyond the 1 % tie is taken ({1-2: 6, 3+: 4}); where keeping K
    from rising costs a batch more than 3 % (K = 6 at B = 1 is 5 % below K = 4), each batch keeps its own."""
    import pandas as pd

    from specbench.fit.table_plan import best_k, decisions

    def table(rows):
        return pd.DataFrame([{"tp": 4, "context_length": 1024, "acceptance": "α 0.7", "draft": "1b", "batch_size": b,
                              "k": k, "speedup": s, "fits": True, "cost_per_1m": 1.0} for b, k, s in rows])

    jitter = table([(1, 4, 2.00), (1, 6, 2.00), (2, 4, 1.95), (2, 6, 2.00), (4, 4, 1.90), (4, 6, 1.85)])
    assert best_k(jitter)["k"].tolist() == [6, 6, 4]
    assert decisions(jitter)["k_schedule"].iloc[0] == "{1-2: 6, 3+: 4}"
    rising = table([(1, 4, 2.00), (1, 6, 1.90), (2, 4, 1.80), (2, 6, 2.00), (4, 4, 1.90), (4, 6, 1.85)])
    assert best_k(rising)["k"].tolist() == [4, 6, 4]
    assert decisions(rising)["k_schedule"].iloc[0] == "{1: 4, 2: 6, 3+: 4}"


def test_a_runs_per_position_acceptance_sets_tau_not_its_iid_alpha():
    """The run's acceptance_by_position (stored as arrays) at its deepest K sets τ at smaller K:
    1 + the reach of positions 1 and 2 at K = 2, not the i.i.d. (1 - α³) / (1 - α). The reach is
    per decoding row-step: a row n-gram drafting found no match for emits one token, so τ is
    below what the per-draft rates alone would give."""
    from specbench.fit.acceptance import acceptance_by_position
    from specbench.results import load_run

    run = load_run(CPU_RUN)
    cells = run.cells[(run.cells["status"] == "ok") & (run.cells["draft"] == "ngram")
                      & (run.cells["workload"] == "chat") & (run.cells["temperature"] == 0)]
    reach = acceptance_by_position(cells, run.requests)
    per_draft = acceptance_by_position(cells)
    assert len(reach) == 4 and reach[0] > reach[1] > 0
    assert (reach < per_draft).all()  # n-gram misses: some row-steps drafted nothing
    plan = plan_json("--drafts", "ngram", "--tp", "4", "--acceptance", CPU_RUN, "--k", "2", "--batch-sizes", "8")
    chat = row(plan, draft="ngram", acceptance="chat T=0", batch_size=8)
    assert chat["tau"] == pytest.approx(1 + reach[0] + reach[1])
    assert chat["tau"] != pytest.approx((1 - chat["alpha"] ** 3) / (1 - chat["alpha"]), rel=1e-3)


def test_the_tensor_peaks_are_the_system_files_and_a_measured_row_can_exceed_them():
    """The dense tensor-core peaks as aiconfigurator's system files state them, and the audit the
    silicon benchmark runs with them: NVIDIA's Llama-3.1-8B FP8 row at 2,000 in and 100 out, 64
    clients on one H200 (TTFT 121.73 ms, TPOT 9.74 ms measured) served 58.9 requests a second,
    whose prompts' GEMMs alone are 83 % of the H200's 1,978 TFLOP/s."""
    import sys

    assert kernel_tables.tensor_flops("h100_sxm") == 989e12
    assert kernel_tables.tensor_flops("h100_sxm", "fp8") == 1978e12
    assert kernel_tables.tensor_flops("b200_sxm", "fp4") == 9000e12
    sys.path.insert(0, str(Path("benchmarks/silicon-rows").resolve()))
    from silicon import prefill_peak_share

    row = {"model_path": "nvidia/Llama-3.1-8B-Instruct-FP8", "system": "h200_sxm", "precision": "fp8", "isl": 2000,
           "osl": 100, "batch_size": 64, "tp_size": 1, "silicon_ttft_ms": 121.73, "silicon_tpot_ms": 9.74}
    rate = 64 / ((121.73 + 99 * 9.74) / 1e3)
    layer_weights = 32 * (4096 * 4096 * 2 + 4096 * 1024 * 2 + 3 * 4096 * 14336)  # q, o; k, v; the MLP
    assert prefill_peak_share(row) == pytest.approx(rate * 2000 * 2 * layer_weights / 1978e12, rel=1e-3)
    assert prefill_peak_share(row) == pytest.approx(0.83, abs=0.01)


def test_the_hosts_step_time_slows_synchronously_scheduled_ngram_and_hides_beside_async_steps():
    """vLLM schedules n-gram drafting synchronously: its host's time per step (fit/host_cost.py),
    and speculation's own (the lookup over each row's context, the handling of drafts), follow the
    verify's kernels; the baseline's and a draft model's run beside them (async). A run's
    corrections already hold their host's time: a corrected planner adds none."""
    from specbench.fit.host_cost import MULTIPROC_EXECUTOR_STEP, NGRAM_HOST_STEP, VLLM_HOST_STEP, HostCost
    from specbench.fit.table_plan import Drafter, TablePlanner, model_config

    name, config = model_config("llama3-70b")
    ngram = Drafter("ngram", "ngram", label="n-gram lookup")
    draft = Drafter("1b", "model", model_config("llama3.2-1b")[1], "llama3.2-1b")
    served, kernels = (TablePlanner(config, name, "h100_sxm", "vllm", host=host) for host in (VLLM_HOST_STEP, None))
    for b in (1, 64, 256):
        host_ms = VLLM_HOST_STEP.ms(b) + MULTIPROC_EXECUTOR_STEP.ms(b)  # TP4: worker processes
        assert step_ms(served, ngram, 2, b, 1536, 4, 4) == pytest.approx(
            step_ms(kernels, ngram, 2, b, 1536, 4, 4) + host_ms + NGRAM_HOST_STEP.ms(b, 1536), rel=1e-9)
        assert step_ms(served, draft, 2, b, 1536, 4, 4) == pytest.approx(step_ms(kernels, draft, 2, b, 1536, 4, 4))
        assert decode_ms(served, b, 1536, 4) == pytest.approx(max(decode_ms(kernels, b, 1536, 4), host_ms))
    slow = TablePlanner(config, name, "h100_sxm", "vllm", host=HostCost(500.0, 0, 0, 0), executor=None)
    assert decode_ms(slow, 8, 1536, 4) == pytest.approx(500.0)
    corrected = TablePlanner(config, name, "h100_sxm", "vllm", corrections={"decode": lambda b: 1.0})
    assert step_ms(corrected, ngram, 2, 64, 1536, 4, 4) == pytest.approx(step_ms(kernels, ngram, 2, 64, 1536, 4, 4))
    plan = plan_json("--drafts", "1b", "--device", "h100", "--tp", "4", "--alpha", "0.7", "--k", "2", "--batch-sizes", "8")
    assert plan["host_step"]["intercept_ms"] == VLLM_HOST_STEP.intercept_ms
    assert "host_step.md" in plan["host_step"]["measured"]
    assert "host_step-ngram.md" in plan["ngram_host_step"]["measured"]
    assert "host_step-executor.md" in plan["executor_step"]["measured"]


def test_a_static_step_outside_cuda_graphs_lasts_at_least_its_kernel_launches():
    """A verify of B · (K + 1) positions over 512 (vLLM's largest captured step) runs without a CUDA
    graph: at least the host's launch of the target's 80 layers, whatever the kernels; up to 512
    positions the kernels alone. A run's corrections hold their own launches."""
    from specbench.fit.host_cost import COMPILED_LAUNCH
    from specbench.fit.table_plan import Drafter, TablePlanner, model_config

    name, config = model_config("llama3-70b")
    ngram = Drafter("ngram", "ngram", label="n-gram lookup")
    floored, bare = (TablePlanner(config, name, "h100_sxm", "vllm", host=None, launch=launch)
                     for launch in (COMPILED_LAUNCH, None))
    floor_ms = COMPILED_LAUNCH.ms(80, 4)
    assert floor_ms == pytest.approx(80 * COMPILED_LAUNCH.per_layer_tp_ms)
    assert step_ms(floored, ngram, 3, 128, 1536, 4, 4) == step_ms(bare, ngram, 3, 128, 1536, 4, 4)  # 512 positions
    assert decode_ms(floored, 256, 1536, 4) == decode_ms(bare, 256, 1536, 4)
    over = step_ms(bare, ngram, 3, 256, 1536, 4, 4)  # 1,024 positions
    assert step_ms(floored, ngram, 3, 256, 1536, 4, 4) == pytest.approx(max(over, floor_ms))
    # where the kernels are quicker than the launches it binds: K = 8 at B = 64 on TP8, 576 positions
    assert step_ms(bare, ngram, 8, 64, 1536, 8, 8) < floor_ms
    assert step_ms(floored, ngram, 8, 64, 1536, 8, 8) == pytest.approx(COMPILED_LAUNCH.ms(80, 8))
    corrected = TablePlanner(config, name, "h100_sxm", "vllm", corrections={"decode": lambda b: 1.0})
    assert step_ms(corrected, ngram, 3, 256, 1536, 4, 4) == pytest.approx(over)
    plan = plan_json("--drafts", "1b", "--device", "h100", "--tp", "4", "--alpha", "0.7", "--k", "2", "--batch-sizes", "8")
    assert plan["launch_without_graph"]["per_layer_tp_ms"] == COMPILED_LAUNCH.per_layer_tp_ms
    assert "h100-2026-11-27" in plan["launch_without_graph"]["measured"]


def test_a_static_prefill_of_up_to_512_tokens_replays_graph_pieces_as_the_fleets_steps_do():
    """Under vLLM's default FULL_AND_PIECEWISE a step that carries a prefill of up to 512 tokens
    replays CUDA-graph pieces, each layer's attention between them (PIECEWISE_LAYER_MS a layer of
    each forward, the target's and a draft model's); a longer one runs outside graphs (at least the
    launches), and decode and verify steps replay full graphs. The static plan prices its steps
    through the same rule as the fleet's (`graph_bound_ms`)."""
    from specbench.fit.host_cost import PIECEWISE_LAYER_MS
    from specbench.fit.table_plan import Drafter, TablePlanner, model_config

    name, config = model_config("llama3-70b")
    draft = Drafter("1b", "model", model_config("llama3.2-1b")[1], "llama3.2-1b")
    bare = TablePlanner(config, name, "h100_sxm", "vllm", host=None, launch=None)
    target, small = bare.forward(config, 4), bare.forward(draft.config, 4, name=draft.label)
    assert prefill_ms(bare, None, 1, 256, 4, 4) == pytest.approx(target.prefill_ms(1, 256) + 80 * PIECEWISE_LAYER_MS)
    assert prefill_ms(bare, draft, 2, 256, 4, 4) == pytest.approx(
        target.prefill_ms(2, 256) + small.prefill_ms(2, 256) + (80 + 16) * PIECEWISE_LAYER_MS)
    assert prefill_ms(bare, None, 1, 1024, 4, 4) == pytest.approx(target.prefill_ms(1, 1024))
    assert decode_ms(bare, 64, 1536, 4) == pytest.approx(target.decode_ms(64, 1536))


def test_an_isolated_spike_in_a_gemm_table_takes_its_dearer_neighbours_time():
    """One timing per shape: a time over 1.5x both neighbours' along m is a slow-mode timing and takes
    the dearer neighbour's time. A step that stays up (a kernel changing), a table's first m and an m
    where over a tenth of the shapes rise (a dispatch choice at that m) stay as measured."""
    shapes = [(n, 1024) for n in range(64, 64 * 21, 64)]  # 20 shapes: one spiking at an m is 5 %
    times = {1: 30.0, 2: 10.0, 3: 10.0, 4: 10.0, 5: 10.0, 6: 20.0, 7: 20.0, 8: 20.0}

    def table(special):  # special[(m, n)] overrides the time of one shape
        return pd.DataFrame([{"gemm_dtype": "fp8", "m": m, "n": n, "k": k, "latency": special.get((m, n), t)}
                             for m, t in times.items() for n, k in shapes])

    def at(frame, m, n):
        return float(frame[(frame.m == m) & (frame.n == n)].latency.iloc[0])

    cleaned = kernel_tables.despiked_gemm(table({(4, 64): 25.0, (3, 128): 14.0}))
    assert at(cleaned, 4, 64) == 10.0  # 2.5x both neighbours: a spike, the dearer neighbour's 10
    assert at(cleaned, 3, 128) == 14.0  # 1.4x: within the timing's noise
    assert at(cleaned, 1, 64) == 30.0 and at(cleaned, 6, 64) == 20.0  # the first m, a step up that stays
    assert len(cleaned) == len(shapes) * len(times) and list(cleaned.columns) == list(table({}).columns)
    systematic = {(4, n): 25.0 for n, _ in shapes[:3]}  # 3 of 20 shapes at m = 4: 15 %
    assert all(at(kernel_tables.despiked_gemm(table(systematic)), 4, n) == 25.0 for n, _ in shapes[:3])


def test_the_b200_fp8_tables_spikes_no_longer_price_4_rows_above_8():
    """vLLM's fp8 GEMMs on B200 as the tables time them: Llama-3.1-70B's TP4 decode step of 4 rows was
    11.7 ms against 8.5 ms for 8 rows (its qkv GEMM timed at 32 us at 4 rows, 13 us at 3 and 5).
    Forward prices on the despiked tables; the package's own files are untouched."""
    import glob

    config = kernel_tables.shipped_model_config("meta-llama/Meta-Llama-3.1-70B")
    forward = kernel_tables.Forward(config, "b200_sxm", "vllm", 4, gemm_quant="fp8", kv_quant="fp8")
    assert forward.decode_ms(4, 1536) < forward.decode_ms(8, 1536)
    package = glob.glob(str(kernel_tables._systems_dir() / "data/b200_sxm/gemm/vllm/*/gemm_perf.parquet"))[0]
    raw = pd.read_parquet(package)
    qkv = raw[(raw.gemm_dtype == "fp8") & (raw.n == 2560) & (raw.k == 8192) & raw.m.between(3, 5)].sort_values("m")
    assert qkv.latency.iloc[1] > 2 * max(qkv.latency.iloc[0], qkv.latency.iloc[2])  # as shipped
    despiked = pd.read_parquet(Path(kernel_tables.despiked_systems("b200_sxm", "vllm")) / Path(package).relative_to(
        kernel_tables._systems_dir()))
    assert (despiked.latency <= raw.latency).all() and 0 < (despiked.latency < raw.latency).mean() < 0.02


def test_an_fp8_target_is_planned_on_the_fp8_tables_with_its_weights_and_cache_in_fp8(tmp_path):
    """--dtype fp8 --kv-cache-dtype fp8: the target's forwards on the tables' fp8 GEMMs and fp8 KV
    attention, its weights at a byte a parameter and every KV cache at a byte a value; a draft model's
    weights stay 16-bit. A 16-bit draft costs relatively more beside an fp8 target, so B* falls."""
    from specbench.drafter_kinds import kv_bytes_per_token
    from specbench.fit.table_plan import config_parameters

    args = ("--drafts", "8b", "--tp", "4", "--alpha", "0.7", "--k", "2", "--batch-sizes", "1,32",
            "--context-lengths", "1024", "--max-new-tokens", "128")
    bf16, fp8 = plan_json(*args), plan_json(*args, "--dtype", "fp8", "--kv-cache-dtype", "fp8")
    assert (fp8["dtype"], fp8["kv_cache_dtype"], bf16["dtype"], bf16["kv_cache_dtype"]) == ("fp8", "fp8", "bf16", "auto")
    target = kernel_tables.Forward(shipped_config("llama3-70b")[1], "h100_sxm", "vllm", 4, gemm_quant="fp8",
                                   kv_quant="fp8")
    ar = row(fp8, draft="autoregressive", batch_size=32)
    assert ar["step_ms"] == pytest.approx(target.decode_ms(32, 1024 + 64), rel=1e-9)
    assert ar["step_ms"] < row(bf16, draft="autoregressive", batch_size=32)["step_ms"]
    config = shipped_config("llama3-70b")[1]
    weights_saved = config_parameters(config) / 4  # a byte a parameter less, over 4 GPUs
    cache_saved = kv_bytes_per_token(config, 4) * (1024 + 128) / 2  # one row's cache at half the bytes
    saved = row(bf16, draft="autoregressive", batch_size=1)["memory_gib"] - \
        row(fp8, draft="autoregressive", batch_size=1)["memory_gib"]
    assert saved * 2 ** 30 == pytest.approx(weights_saved + cache_saved, rel=1e-9)
    assert row(fp8, draft="8b", batch_size=32)["speedup"] < row(bf16, draft="8b", batch_size=32)["speedup"]
    text = runner.invoke(app, ["plan", "--target", "llama3-70b", *args, "--dtype", "fp8"]).output
    assert "llama3-70b (fp8) with 8b" in text


@pytest.mark.parametrize("args, message", [
    (["--dtype", "int3"], "--dtype on the tables must be one of bf16, fp16, fp8, fp4"),
    (["--kv-cache-dtype", "fp4"], "--kv-cache-dtype must be auto or fp8"),
    (["--dtype", "fp8", "--calibrate", CPU_RUN], "--calibrate corrects the tables' 16-bit forwards"),
    # the tables' own words were 'missing system flops: quant mode ... or the system YAML is missing the entry'
    (["--dtype", "fp8", "--device", "a100"], "a100_sxm has no fp8 tensor cores (its system file gives no "
                                             "fp8_tc_flops; vLLM runs such weights there as weight-only Marlin"),
])
def test_bad_precision_on_the_tables_is_one_line(args, message):
    result = runner.invoke(app, ["plan", "--target", "llama3-70b", "--tp", "4", "--alpha", "0.7", *args])
    assert result.exit_code == 2 and message in result.output and len(result.output.strip().splitlines()) == 1, \
        result.output


def test_a_draft_models_checkpoint_can_be_fp8_as_its_target():
    """--draft-dtype fp8: a draft model's forwards on the fp8 GEMMs, its weights at a byte a parameter;
    an EAGLE head stays 16-bit. The fleet's replica holds the KV cache the lighter draft leaves."""
    from specbench.fit.table_plan import config_parameters
    from specbench.fleet.tables import replica_spec

    args = ("--drafts", "8b,eagle", "--tp", "4", "--alpha", "0.7", "--k", "2", "--batch-sizes", "1,32",
            "--context-lengths", "1024", "--max-new-tokens", "128", "--dtype", "fp8")
    bf16, fp8 = plan_json(*args), plan_json(*args, "--draft-dtype", "fp8")
    assert (bf16["draft_dtype"], fp8["draft_dtype"]) == ("bf16", "fp8")
    assert fp8["drafters"]["8b"] == "llama3-8b, fp8" and "fp8" not in fp8["drafters"]["eagle"]
    eight = shipped_config("llama3-8b")[1]
    saved = row(bf16, draft="8b", batch_size=1)["memory_gib"] - row(fp8, draft="8b", batch_size=1)["memory_gib"]
    assert saved * 2 ** 30 == pytest.approx(config_parameters(eight) / 4, rel=1e-9)  # a byte a parameter, TP4
    assert row(fp8, draft="8b", batch_size=32)["step_ms"] < row(bf16, draft="8b", batch_size=32)["step_ms"]
    assert row(fp8, draft="eagle", batch_size=32)["step_ms"] == row(bf16, draft="eagle", batch_size=32)["step_ms"]
    target = shipped_config("llama3-70b")[1]
    lighter, heavier = (replica_spec(target, "h100_sxm", 4, "fp8", eight, 4, draft_gemm_quant=q).kv_capacity_tokens
                        for q in ("fp8", None))
    assert lighter > heavier
    result = runner.invoke(app, ["plan", "--target", "llama3-70b", "--tp", "4", "--alpha", "0.7", "--draft-dtype", "int3"])
    assert result.exit_code == 2 and "--draft-dtype on the tables must be one of" in result.output
