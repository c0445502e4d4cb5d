"""`plan` never answers silently wrong: an MoE config is refused, not priced dense; an option
that does not apply to the question asked is refused, never dropped (the option walk); step
times the tables price below what an engine can run are marked; aiconfigurator's errors reach
the user as what is missing and what to try. And the small things: flags shown as flags, a
report readable by others, a summary that stays short."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.cli.common import option_flag
from specbench.cli.plan_options import APPLIES, MODES, check_options, plan_mode
from specbench.shapes import Architecture
from specbench.synthetic import config_parameters

runner = CliRunner()
tables = pytest.importorskip("aiconfigurator_core", reason="the gpu-tables extra")

MIXTRAL = {"architectures": ["MixtralForCausalLM"], "hidden_size": 4096, "intermediate_size": 14336,
           "max_position_embeddings": 32768, "model_type": "mixtral", "num_attention_heads": 32,
           "num_experts_per_tok": 2, "num_hidden_layers": 32, "num_key_value_heads": 8, "num_local_experts": 8,
           "vocab_size": 32000, "tie_word_embeddings": False}
QWEN3_30B_A3B = {"hidden_size": 2048, "num_attention_heads": 32, "num_key_value_heads": 4, "head_dim": 128,
                 "num_hidden_layers": 48, "vocab_size": 151936, "intermediate_size": 6144,
                 "moe_intermediate_size": 768, "num_experts": 128, "num_experts_per_tok": 8,
                 "decoder_sparse_step": 1, "mlp_only_layers": [], "model_type": "qwen3_moe"}


def one_line_exit_2(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    return lines[0]


# --- mixture-of-experts configs ----------------------------------------------------------------

def test_the_parameter_count_reads_every_expert():
    # Mixtral-8x7B: 46.7B parameters (87 GiB in bf16); Qwen3-30B-A3B: 30.5B (57 GiB)
    assert config_parameters(MIXTRAL) / 1e9 == pytest.approx(46.70, abs=0.05)
    assert config_parameters(QWEN3_30B_A3B) / 1e9 == pytest.approx(30.53, abs=0.05)
    dense = dict(MIXTRAL, num_local_experts=1)
    assert config_parameters(dense) / 1e9 == pytest.approx(7.24, abs=0.05)  # Mistral-7B's shape
    shape = Architecture.from_config(MIXTRAL, "bfloat16")  # a measured run's shape keeps the experts apart
    assert (shape.experts, shape.experts_per_token, shape.moe_layers) == (8, 2, 32)
    assert shape.weight_bytes / 2 + shape.vocab * shape.hidden == pytest.approx(config_parameters(MIXTRAL), rel=1e-4)


@pytest.mark.parametrize("extra", [[], ["--concurrency", "4"]])
def test_an_moe_target_is_refused_never_priced_as_dense(tmp_path, extra):
    (tmp_path / "mixtral").mkdir()
    (tmp_path / "mixtral" / "config.json").write_text(json.dumps(MIXTRAL))
    result = runner.invoke(app, ["plan", "--target", str(tmp_path / "mixtral"), "--drafts", "eagle", "--device",
                                 "h100", "--tp", "1", "--alpha", "0.7", *extra])
    line = one_line_exit_2(result)
    assert "mixture-of-experts" in line and "8 routed experts, 2 per token" in line and "46.7B" in line


def test_a_draft_config_of_a_moe_family_the_tables_do_not_model_is_refused(tmp_path):
    (tmp_path / "moe.json").write_text(json.dumps(dict(MIXTRAL, vocab_size=128256)))
    line = one_line_exit_2(runner.invoke(app, ["plan", "--target", "llama3-8b", "--drafts", str(tmp_path / "moe.json"),
                                               "--alpha", "0.7"]))
    assert "8 routed experts, 2 per token" in line and "a family the tables do not model" in line


# --- the option walk ---------------------------------------------------------------------------

VALUES = {"run_dir": "results/none", "timings": "results/none", "acceptance": "results/none", "alpha": "0.7",
          "k": "2", "batch_sizes": "1,8", "context_lengths": "2k", "max_new_tokens": "64", "device": "h100",
          "gpu_price": "2.5", "gpus": "2", "json_output": None, "target": "llama3-8b", "drafts": "1b", "tp": "2",
          "draft_tp": "1", "dp": "2", "ep": None, "backend": "vllm", "slo": "tpot=0.05", "concurrency": "4", "input_len": "8192",
          "output_len": "64", "clients": "bench", "prefix_len": "16", "dtype": "fp8", "draft_dtype": "fp8",
          "kv_cache_dtype": "fp8", "max_num_seqs": "64", "max_num_batched_tokens": "4096",
          "async_scheduling": None, "prefix_caching": None, "trace": "azure-conv", "trace_window": "0:60",
          "trace_speedup": "2", "headroom": "0.1", "replicas": "2", "router": "round-robin", "chart": "out.png",
          "calibrate": "results/none", "extrapolate": None}
ASKED = {"run": [], "tables": ["--target", "llama3-8b"],
         "tables-concurrency": ["--target", "llama3-8b", "--concurrency", "4"],
         "tables-trace": ["--target", "llama3-8b", "--trace", "azure-conv"],
         "run-concurrency": ["results/none", "--concurrency", "4"],
         "run-trace": ["results/none", "--trace", "azure-conv"]}
SHAPING = {"target", "concurrency", "trace"}  # they choose the question rather than apply to one


def given(mode: str) -> set[str]:
    shaping = {"target": mode.startswith("tables"), "concurrency": mode.endswith("concurrency"),
               "trace": mode.endswith("trace"), "run_dir": mode.startswith("run-")}
    return {name for name, chosen in shaping.items() if chosen}


def test_every_option_of_plan_is_applied_or_refused_in_every_mode(capsys):
    """Each (mode, option): applied (the check lets it through to the mode, which uses it), or
    refused by the CLI in one line naming the option, exit 2, before anything is computed."""
    from specbench.cli.plan import plan

    import inspect

    parameters = [name for name in inspect.signature(plan).parameters if name != "ctx"]
    assert set(parameters) == set(APPLIES), set(parameters) ^ set(APPLIES)
    tried = refused = applied = 0
    for mode in MODES:
        for parameter in parameters:
            if parameter in SHAPING:
                continue
            tried += 1
            asked = given(mode) | {parameter}
            if mode in APPLIES[parameter]:
                assert check_options(asked, "target" in asked) == mode
                applied += 1
                continue
            flag = option_flag(parameter)
            value = VALUES[parameter]
            args = ASKED[mode] + [flag] + ([value] if value is not None else []) if parameter != "run_dir" \
                else [value] + ASKED[mode]
            line = one_line_exit_2(runner.invoke(app, ["plan", *args]))
            assert f"{flag} does not apply to {MODES[mode]}" in line, line
            refused += 1
    with capsys.disabled():
        print(f"\nplan option walk: {tried} (mode, option) pairs, {refused} refused, {applied} applied")
    assert tried == refused + applied and refused > 50


def test_the_silently_ignored_options_are_refused_with_what_applies():
    line = one_line_exit_2(runner.invoke(app, ["plan", "--target", "llama3-70b", "--drafts", "8b", "--tp", "4",
                                               "--alpha", "0.7", "--input-len", "8192"]))
    assert "--context-lengths 8192" in line
    for flag in ("--input-len", "--output-len"):
        for value in ("0", "10000000"):
            one_line_exit_2(runner.invoke(app, ["plan", "--target", "llama3-70b", "--alpha", "0.7", flag, value]))
    line = one_line_exit_2(runner.invoke(app, ["plan", "--target", "llama3-70b", "--alpha", "0.7", "--trace",
                                               "azure-conv", "--concurrency", "4", "--slo", "tpot=0.05"]))
    assert "two loads" in line
    assert plan_mode({"run_dir"}, False) == "run" and plan_mode({"target", "trace"}, True) == "tables-trace"


# --- step times the tables price below what an engine can run ----------------------------------

def test_steps_that_fall_are_flagged_not_passed_on():
    from specbench.fit.table_plan import AR, flag_steps

    rows = [{"tp": 1, "context_length": 1024, "acceptance": "", "draft": AR, "k": 0, "batch_size": b, "fits": True,
             "step_ms": ms, "ar_step_ms": ms} for b, ms in ((1, 13.0), (4, 8.25), (16, 14.0))]
    rows += [{"tp": 1, "context_length": 1024, "acceptance": "α 0.7", "draft": "1b", "k": 1, "batch_size": b,
              "fits": True, "step_ms": sd, "ar_step_ms": ar} for b, sd, ar in ((1, 15.0, 13.0), (16, 13.9, 14.0))]
    flagged, notes = flag_steps(pd.DataFrame(rows))
    assert flagged["step_flag"].astype(bool).tolist() == [False, True, False, False, True]
    assert len(notes) == 2 and "B = 4 (up to 37% lower)" in notes[0] and "B = 16 (by up to 0.7%)" in notes[1]


def test_a_speculative_step_below_the_plain_one_is_marked_in_the_answer():
    args = ["plan", "--target", "llama3-8b", "--drafts", "1b", "--k", "1", "--alpha", "0.7", "--batch-sizes", "1,64"]
    result = runner.invoke(app, [*args, "--json"])
    assert result.exit_code == 0, result.output
    answer = json.loads(result.output)
    at_64 = [p for p in answer["predictions"] if p["draft"] == "1b" and p["batch_size"] == 64][0]
    assert at_64["step_ms"] < at_64["ar_step_ms"] and at_64["step_flag"]
    assert any("at or below the plain decode step at B = 64" in note for note in answer["step_notes"])
    shown = runner.invoke(app, args, env={"COLUMNS": "200"}).output
    assert " †" in shown and shown.index("notes:") < shown.index("  † marks a step")


def test_where_it_pays_words_each_drafter_over_its_cases():
    from specbench.fit.decisions import where_it_pays

    found = where_it_pays({"1b": [([1, 8, 64], [2.0, 1.5, 1.1])],
                           "8b": [([1, 8, 64], [1.5, 1.2, 0.8]), ([1, 8, 64], [1.6, 1.3, 1.1])],
                           "70b": [([1, 8], [0.9, 0.7])]})
    assert found == ("1b still pays at B = 64, the largest asked (up to 2.00× at B = 1); 8b stops paying at B ≈ 23 in 1 of 2 cases; "
                     "70b never pays (at best 0.90×)"), found
    assert where_it_pays({"1b": [([4, 16], [1.2, 0.8])]}, at="{} clients", near="≈ {} clients") == \
        "1b stops paying at ≈ 8.0 clients"


ANSWERED = {  # each planning question: its options, and a word its answer must hold
    "tables": (["--target", "llama3-70b", "--drafts", "1b,8b", "--tp", "4", "--alpha", "0.7"], "still pay at"),
    "tables with an SLO": (["--target", "llama3-70b", "--drafts", "1b", "--tp", "4,8", "--alpha", "0.7",
                            "--slo", "tpot=0.03"], "cheapest"),
    "one replica": (["--target", "llama3-8b", "--drafts", "1b", "--alpha", "0.7", "--concurrency", "4,64",
                     "--input-len", "256", "--output-len", "64", "--k", "2"], "clients"),
    "a fleet": (["--target", "llama3-8b", "--drafts", "1b", "--alpha", "0.7", "--trace", "azure-conv",
                 "--trace-window", "0:30", "--slo", "ttft=2,tpot=0.05", "--k", "2"], "traffic"),
    "a given fleet": (["--target", "llama3-8b", "--drafts", "1b", "--alpha", "0.7", "--trace", "azure-conv",
                       "--trace-window", "0:30", "--replicas", "1", "--k", "2"], "traffic"),
    "a run": ([str(Path(__file__).resolve().parents[1] / "tests/fixtures/cpu/default-grid"),
               "--batch-sizes", "1,4", "--k", "2"], "paying"),
}


@pytest.mark.parametrize("question", list(ANSWERED))
def test_every_plan_answers_in_its_first_line_and_notes_the_rest_below(question):
    """The first line is the answer, in one sentence of about 25 words, labelled as an estimate or a
    simulation; the tables follow, then `notes:` with what the answer rests on; --json carries it."""
    args, word = ANSWERED[question]
    shown = runner.invoke(app, ["plan", *args], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    first = shown.output.splitlines()[0]
    assert first.split(":")[0] in ("SIMULATED, 1 replica serving azure-conv 0–30 s, E2E p50","ESTIMATE on the h100_sxm kernel tables", "PREDICTED from the run's fit",
                                   "SIMULATED, one replica under closed-loop clients (h100_sxm)") \
        or first.startswith("SIMULATED fleet for "), first
    assert word in first and len(first.split()) <= 30 and first.endswith("."), first
    assert "\nnotes:\n" in shown.output and "not measurements" in shown.output.split("\nnotes:\n", 1)[1]
    as_json = runner.invoke(app, ["plan", *args, "--json"])
    assert json.loads(as_json.output)["answer"] == first


# --- the tables' errors ------------------------------------------------------------------------

def test_the_tables_errors_say_what_is_missing_and_what_to_try():
    from specbench.fit.kernel_tables import what_is_missing

    raw = ('perf database error: generation attention data missing for GenerationKey { kv_quant: "bfloat16", '
           'n_kv_lookup: 1, head_size: 64, window_size: 0 }')
    assert what_is_missing(raw) == "no decode-attention timings for 64-wide heads with the KV cache in bfloat16"
    assert "mismatch" not in what_is_missing("Parallelism width mismatch: tp_size(4) * attention_dp_size(1) ...")
    line = one_line_exit_2(runner.invoke(app, ["plan", "--target", "llama3-70b", "--drafts", "1b", "--alpha", "0.7",
                                               "--device", "a100", "--tp", "8"]))
    assert "64-wide heads" in line and "--device h100" in line and "Key {" not in line


# --- the small things --------------------------------------------------------------------------

def test_flags_are_shown_as_flags():
    for command in ("check", "plan", "sweep"):
        shown = runner.invoke(app, [command, "--help"], env={"COLUMNS": "200"}).output
        assert "<bool>" not in shown and "--json" in shown or command == "sweep"


@pytest.mark.integration
def test_a_report_is_readable_by_others_its_summary_short_and_its_answer_printed_once(tmp_path):
    run = tmp_path / "run"
    shutil.copytree(Path(__file__).parents[1] / "tests/fixtures/cpu/default-grid-profiled", run)
    (run / "report").exists() and shutil.rmtree(run / "report")
    previous = os.umask(0o022)
    try:
        result = runner.invoke(app, ["report", str(run)])
    finally:
        os.umask(previous)
    assert result.exit_code == 0, result.output
    assert (run / "report").stat().st_mode & 0o777 == 0o755
    answer = result.output.splitlines()[0]
    assert answer.startswith("With ") and result.output.count(answer) == 1
    words = len((run / "report" / "summary.md").read_text().split())
    assert words < 2500, words


def test_a_given_fleet_shows_where_speculation_stops_paying_as_traffic_rises(tmp_path):
    """--replicas N: the fleet as it is at each traffic scale, no sizing. The baseline's speed-ups are
    1 by definition, the speculative TPOT one falls as the single replica fills, the answer says where
    its E2E p50 crosses 1× when it does, and the chart is drawn; --headroom, which only sizing uses,
    is refused."""
    from specbench import api

    fleet = api.fleet_as_is("llama3-8b", trace="azure-conv", trace_window="0:60", replicas=1, drafts=["1b"],
                            alpha=0.7, ks=[4], scales=[1, 8, 32], chart=tmp_path / "fleet.png")
    table = fleet.table
    assert len(table) == 3 * 3 and set(table["replicas"]) == {1}  # the baseline, K=4 and 1b's K schedule
    base = table[table["draft"] == "autoregressive"]
    assert (base["tpot_speedup"] == 1.0).all() and (base["e2e_speedup"] == 1.0).all()
    assert base["tpot_p50_ms"].is_monotonic_increasing
    speculative = table[(table["draft"] == "1b") & (table["k_schedule"] == "")].sort_values("scale")
    assert speculative["tpot_speedup"].iloc[0] > 1.2 and speculative["tpot_speedup"].iloc[-1] < \
        speculative["tpot_speedup"].iloc[0]
    assert "1b" in fleet.answer and "traffic" in fleet.answer and (tmp_path / "fleet.png").stat().st_size > 10_000
    line = one_line_exit_2(runner.invoke(app, ["plan", "--target", "llama3-8b", "--alpha", "0.7", "--trace",
                                               "azure-conv", "--replicas", "2", "--headroom", "0.1"]))
    assert "--headroom does not apply to a given fleet" in line
    assert "--replicas must be a whole number >= 1" in one_line_exit_2(runner.invoke(
        app, ["plan", "--target", "llama3-8b", "--alpha", "0.7", "--trace", "azure-conv", "--replicas", "0"]))


def test_a_sweep_answers_first_with_where_each_draft_stops_paying():
    """The summary a sweep ends with opens with one sentence: per draft, where its measured best-K
    speed-up (the worst workload and temperature) stops paying."""
    from specbench.fit.decisions import measured_answer
    from specbench.results import load_run

    run = load_run(Path(__file__).resolve().parents[1] / "tests/fixtures/cpu/default-grid")
    answer = measured_answer(run.cells)
    assert answer.startswith(f"MEASURED, {len(run.cells)} of {len(run.cells)} cells: ") and len(answer.split()) <= 30
    assert "ngram stops paying at B ≈" in answer and "smollm2-135m@bf16 stops paying at B ≈" in answer, answer


def test_a_published_acceptance_is_planned_as_its_figure_and_labelled_in_every_answer():
    """--acceptance published:NAME: the i.i.d. α that gives the source's τ at its K; the first line
    says the acceptance is published, the notes cite the source; a preset of another target, of
    another drafter kind, an unknown one, or one on a run's plan is one line, exit 2."""
    from specbench.fit.published_acceptance import presets, tau

    for found in presets().values():
        assert found.source and found.url.startswith("https://") and found.k >= 1
        assert abs(tau(found.alpha, found.k) - found.mean_acceptance_length) < 1e-6
    args = ["plan", "--target", "llama3-8b", "--drafts", "eagle3,1b", "--acceptance", "published:llama3.1-8b-eagle3",
            "--batch-sizes", "1,16", "--k", "2,7"]
    shown = runner.invoke(app, args, env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    first, notes = shown.output.splitlines()[0], shown.output.split("\nnotes:\n", 1)[1]
    assert "acceptance PUBLISHED not measured" in first and "eagle3" in first and "1b" not in first, first
    assert "Samarin et al." in notes and "not measured on your traffic" in notes and "1b: --acceptance" in notes
    refused = {("--target", "llama3-70b", "--drafts", "eagle3"): "measured on llama3-8b, not llama3-70b",
               ("--target", "llama3-8b", "--drafts", "1b"): "is an EAGLE-3 drafter's; give --drafts eagle3",
               ("--target", "llama3-8b", "--drafts", "eagle3", "--acceptance", "published:nope"): "no such published"}
    for given, words in refused.items():
        extra = [] if "--acceptance" in given else ["--acceptance", "published:llama3.1-8b-eagle3"]
        assert words in one_line_exit_2(runner.invoke(app, ["plan", *given, *extra]))
    run = str(Path(__file__).resolve().parents[1] / "tests/fixtures/cpu/default-grid")
    assert "give --target" in one_line_exit_2(runner.invoke(app, ["plan", run, "--acceptance",
                                                                  "published:llama3.1-8b-eagle3"]))


@pytest.mark.parametrize("mode", list(MODES))
def test_help_after_a_questions_options_shows_only_that_questions_options(mode):
    from specbench.cli.plan import plan
    import inspect

    asked = ASKED[mode] if mode != "run" else ["results/none"]
    shown = runner.invoke(app, ["plan", *asked, "--help"], env={"COLUMNS": "200"})
    assert shown.exit_code == 0, shown.output
    assert f"The options of {MODES[mode]}" in " ".join(shown.output.split())
    for name in inspect.signature(plan).parameters:
        if name in ("ctx", "run_dir"):
            continue
        listed = f"│ {option_flag(name)} " in shown.output
        assert listed == (mode in APPLIES[name]), (mode, name)
