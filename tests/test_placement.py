"""Spreading a model over several devices. This machine has one device (the CPU), so the spread
runs over ["cpu", "cpu"] with accelerate's hooks forced on: the hook path and the device map are
real, the copies between devices are not."""

import pytest
import torch
from transformers import AutoConfig, AutoModelForCausalLM

from conftest import random_prompts, tiny_model
from specbench.native.drafters import ModelDrafter
from specbench.native.engine import GenerationConfig, generate_autoregressive, generate_speculative
from specbench.native.forward import CausalLM
from specbench.native.placement import dispatch, layer_device_map, parse_devices, placement_devices
from specbench.native.random_models import build_random_model
from specbench.synthetic import shipped_config


def test_layer_blocks_are_contiguous_and_sized_by_share():
    model = tiny_model("llama", layers=6)
    device_map = layer_device_map(model, ["cuda:0", "cuda:1", "cuda:2"], shares=[2, 1, 3])
    layers = [device_map[f"model.layers.{i}"] for i in range(6)]
    assert layers == ["cuda:0", "cuda:0", "cuda:1", "cuda:2", "cuda:2", "cuda:2"]
    assert device_map["model.embed_tokens"] == "cuda:0" and device_map["model.rotary_emb"] == "cuda:0"
    assert device_map["model.norm"] == "cuda:2" and device_map["lm_head"] == "cuda:2"
    covered = {name for name in device_map}
    for name, _ in model.named_parameters():
        assert any(name.startswith(prefix + ".") for prefix in covered), name


def test_a_tied_head_stays_with_the_embedding():
    _, raw = shipped_config("smollm2-135m")
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(AutoConfig.for_model(**{**raw, "num_hidden_layers": 4}))
    assert model.lm_head.weight is model.model.embed_tokens.weight
    device_map = layer_device_map(model, ["cuda:0", "cuda:1"])
    assert device_map["lm_head"] == "cuda:0" and device_map["model.norm"] == "cuda:1"


def test_greedy_speculation_is_lossless_through_a_spread_target(llama_target, llama_draft):
    reference = CausalLM.from_hf(llama_target)
    spread_model = tiny_model("llama", layers=4, seed=0)  # the same weights as llama_target
    dispatch(spread_model, layer_device_map(spread_model, ["cpu", "cpu"]), force_hooks=True)
    assert hasattr(spread_model.model.layers[0], "_hf_hook")
    spread = CausalLM.from_hf(spread_model)
    prompts = random_prompts([5, 17, 9])
    config = GenerationConfig(max_new_tokens=16)
    expected = generate_autoregressive(reference, prompts, config).tokens
    assert generate_autoregressive(spread, prompts, config).tokens == expected
    assert generate_speculative(spread, ModelDrafter(llama_draft), prompts, config, 3).tokens == expected


def test_random_weights_spread_equal_the_unspread_build():
    one = build_random_model("smollm2-135m", torch.float32, "cpu", num_layers=2, seed=3).model
    two = build_random_model("smollm2-135m", torch.float32, ["cpu", "cpu"], num_layers=2, seed=3).model
    assert hasattr(two.hf_model.model.layers[1], "_hf_hook")
    prompts = [list(range(10, 30))]
    config = GenerationConfig(max_new_tokens=6)
    assert generate_autoregressive(one, prompts, config).tokens == generate_autoregressive(two, prompts, config).tokens


@pytest.mark.parametrize("device, message", [("gpu", "must be cpu"), ("cpu,cuda:1", "CUDA devices only"),
                                             ("", "empty"), ("cuda:x", "must be cpu")])
def test_bad_device_names_are_rejected(device, message):
    with pytest.raises(ValueError, match=message):
        parse_devices(device)


def test_one_named_device_is_kept():
    assert placement_devices("cpu", 10**15) == ["cpu"]
    assert placement_devices("cuda:0,cuda:1", 1) == ["cuda:0", "cuda:1"]
