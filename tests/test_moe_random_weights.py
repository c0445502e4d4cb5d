"""A mixture-of-experts target with random weights on the native engine: its shape (experts, top-k,
the weights a forward reads), the model transformers builds from its config, a timed cell with a
dense draft of its vocabulary, and what the run records. Tiny hand-made configs: seconds each."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import torch

from specbench.fit.roofline import fit_forward_time
from specbench.grid import EngineOptions, GridOptions, LoadOptions, SweepConfig, plan_cells
from specbench.shapes import Architecture
from specbench.synthetic import config_parameters, random_model_lines

TINY_MOE = dict(architectures=["Qwen3MoeForCausalLM"], model_type="qwen3_moe", hidden_size=64, intermediate_size=128,
                moe_intermediate_size=32, num_experts=8, num_experts_per_tok=2, num_hidden_layers=2,
                num_attention_heads=4, num_key_value_heads=2, head_dim=16, vocab_size=256, decoder_sparse_step=1,
                mlp_only_layers=[], norm_topk_prob=True, max_position_embeddings=512, tie_word_embeddings=False)
TINY_DENSE = dict(architectures=["Qwen3ForCausalLM"], model_type="qwen3", hidden_size=32, intermediate_size=64,
                  num_hidden_layers=2, num_attention_heads=2, num_key_value_heads=1, head_dim=16, vocab_size=256,
                  max_position_embeddings=512, tie_word_embeddings=True)
CONFIGS = {"tiny-moe": TINY_MOE, "tiny-dense": TINY_DENSE}


def test_the_shape_of_a_mixture_of_experts_counts_its_experts_and_what_a_forward_reads():
    shape = Architecture.from_config(TINY_MOE, "float32")
    assert (shape.experts, shape.experts_per_token, shape.expert_intermediate, shape.moe_layers) == (8, 2, 32, 2)
    assert shape.is_moe and shape.describe_experts() == "8 experts, top-2, in 2 of 2 layers"
    expert = 3 * 64 * 32
    # a position multiplies its top-2 experts (and the router): the active parameters
    assert shape.layer_parameters == Architecture.from_config({**TINY_MOE, "num_experts": 0}, "float32") \
        .layer_parameters - 3 * 64 * 128 + 2 * expert + 64 * 8
    assert shape.linear_parameters + 64 * 256 == pytest.approx(config_parameters(TINY_MOE, active=True), rel=0.01)
    # one token reads its 2 experts a layer; many tokens read all 8, as the whole model
    assert shape.weights_read(1) - shape.weights_read(0) == 2 * 2 * expert * 4
    assert shape.weights_read(10_000) == pytest.approx(shape.weight_bytes)
    assert shape.weight_bytes / 4 + 64 * 256 == pytest.approx(config_parameters(TINY_MOE), rel=0.01)
    assert np.all(np.diff(shape.weights_read(np.arange(1, 20))) > 0)
    # a dense shape reads the same whatever the tokens; one recorded before the experts' fields is dense
    dense = Architecture.from_config(TINY_DENSE, "float32")
    assert not dense.is_moe and float(dense.weights_read(1)) == float(dense.weights_read(64)) == dense.weight_bytes
    old = {key: value for key, value in dense.to_dict().items() if "expert" not in key and key != "moe_layers"}
    assert Architecture.from_dict(old) == dense
    assert Architecture.from_dict(shape.to_dict()) == shape
    # a self-draft of its first layer keeps one MoE layer
    assert shape.with_layers(1).moe_layers == 1


def test_a_shape_with_latent_attention_is_refused_not_priced_as_heads():
    with pytest.raises(ValueError, match="multi-head latent attention"):
        Architecture.from_config({**TINY_MOE, "kv_lora_rank": 16}, "float32")


def test_the_roofline_fits_a_mixture_of_experts_on_the_experts_its_forwards_read():
    """Memory-bound forwards of an MoE read more experts as rows grow: the fit recovers the bandwidth."""
    shape = Architecture.from_config({**TINY_MOE, "num_experts": 64, "num_hidden_layers": 8}, "float32")
    rows = np.array([1, 2, 4, 8, 16, 32, 1, 2, 4, 8, 16, 32], float)
    positions = np.array([1] * 6 + [3] * 6, float)
    seconds = 1e-4 + shape.weights_read(rows * positions) / 1e9 + shape.kv_bytes(rows, 100) / 1e9
    points = pd.DataFrame({"rows": rows, "positions": positions, "context": 100 - positions, "seconds": seconds})
    model = fit_forward_time(points, shape, bandwidth_prior=1e9, flops_prior=1e15)
    assert model.bandwidth == pytest.approx(1e9, rel=0.05)
    assert np.allclose(model.seconds(rows, positions, 100 - positions), seconds, rtol=0.05)


@pytest.fixture
def tiny_configs(monkeypatch):
    def shipped(reference: str, family: str | None = None) -> tuple[str, dict]:
        return reference, dict(CONFIGS[reference])

    import specbench.native.random_models as random_models
    import specbench.native.runner as runner

    monkeypatch.setattr(random_models, "shipped_config", shipped)
    monkeypatch.setattr(runner, "shipped_config", shipped)
    return runner


def test_a_random_weights_moe_target_is_transformers_own_model_and_times_a_cell(tiny_configs):
    from specbench.native.forward import check_forward_matches

    runner = tiny_configs
    config = SweepConfig(grid=GridOptions(weights="random", alphas=["0.8"], target="tiny-moe", drafts=["tiny-dense"],
                                          ks=[2], temperatures=[0.0], workloads=["chat"], max_new_tokens=6,
                                          num_prompts=2, target_layers=1),
                         load=LoadOptions(batch_sizes=[2]), engine=EngineOptions(warmup=False))
    runner.validate_native(config)
    models = runner.load_random_models(config)
    target = models.target.model
    assert type(target.hf_model).__name__ == "Qwen3MoeForCausalLM" and target.config.num_hidden_layers == 1
    check_forward_matches(target, target.hf_model)  # the engine's cached forward is transformers' own
    # the shapes recorded are the full depth's, with the experts
    recorded = models.architectures()
    assert recorded["target"]["layers"] == 2 and recorded["target"]["experts"] == 8
    assert recorded["target"]["moe_layers"] == 2 and recorded["drafts"]["tiny-dense"]["experts"] == 0
    record = models.random_records["target"]
    assert (record["layers_built"], record["layers_full"]) == (1, 2)
    assert record["mixture_of_experts"]["experts_per_token"] == 2
    assert record["parameters"] == config_parameters(TINY_MOE) > record["active_parameters"]
    lines = random_model_lines({"random_weights": models.random_records})
    assert lines[0] == (f"random weights, target tiny-moe: 1 of 2 layers built; mixture of experts: 8 experts, top-2, "
                        f"in 2 layers; {config_parameters(TINY_MOE) / 1e9:.3g}B parameters, "
                        f"{config_parameters(TINY_MOE, active=True) / 1e9:.3g}B active a token "
                        f"(step times scaled to full depth)")
    assert lines[1].startswith("random weights, draft tiny-dense: 2 of 2 layers built; dense")
    # one speculative cell, timed and scaled to the full depth
    cell = next(c for c in plan_cells(config) if c.is_speculative)
    prompts = [list(range(5, 17)), list(range(30, 40))]
    run = runner.CellRun(models, cell, prompts, ["p0", "p1"], config)
    with torch.inference_mode():
        run.measure(0)
    row = run.finish().row
    assert row["estimated"] and (row["target_layers_built"], row["target_layers_full"]) == (1, 2)
    assert row["tokens_per_s"] > 0 and row["drafted"] > 0


def test_random_weights_refuse_attention_the_native_cache_does_not_run(tiny_configs):
    runner = tiny_configs
    CONFIGS["tiny-mla"] = {**TINY_MOE, "kv_lora_rank": 16}
    CONFIGS["tiny-sliding"] = {**TINY_MOE, "layer_types": ["sliding_attention", "full_attention"], "sliding_window": 8}
    try:
        for name, why in (("tiny-mla", "multi-head latent attention"), ("tiny-sliding", "sliding_attention layers")):
            config = SweepConfig(grid=GridOptions(weights="random", alphas=["0.8"], target=name, drafts=["ngram"],
                                                  ks=[2]))
            with pytest.raises(ValueError, match=f"--weights random on the native engine: {name} has {why}.*"
                                                 f"--engine vllm runs it"):
                runner.validate_native(config)
    finally:
        del CONFIGS["tiny-mla"], CONFIGS["tiny-sliding"]
