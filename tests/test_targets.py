"""Any target a team names: an alias, a Hugging Face id whose config is shipped, a local config.
Dense decoders and the mixture-of-experts families the tables model are priced; a family they do
not model, a layer kind they lack or an architecture the planner does not know is refused in one
line naming what is missing, never priced as something else."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.models import REGISTRY, lookup_alias, routed_experts
from specbench.synthetic import shipped_config

runner = CliRunner()
tables = pytest.importorskip("aiconfigurator_core", reason="the gpu-tables extra")

MOE_ALIASES = sorted(alias for alias in REGISTRY if routed_experts(shipped_config(alias)[1]) is not None)


def one_line_exit_2(result) -> str:
    assert result.exit_code == 2, result.output
    lines = [line for line in result.output.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("error:"), result.output
    return lines[0]


def plan(*arguments: str):
    return runner.invoke(app, ["plan", "--alpha", "0.7", "--k", "2", "--batch-sizes", "1,32", *arguments])


def test_the_2026_mixtures_of_experts_are_all_aliases():
    assert set(MOE_ALIASES) == {"qwen3-30b-a3b", "qwen3-235b-a22b", "deepseek-v3", "deepseek-r1", "kimi-k2.5",
                                "gpt-oss-20b", "gpt-oss-120b", "llama4-scout", "llama4-maverick", "minimax-m2.5"}


# where each 2026 mixture of experts fits on an H200's tables, and how its experts are laid out there
PRICED_AT = {"qwen3-30b-a3b": ["--tp", "1"], "qwen3-235b-a22b": ["--tp", "8"], "deepseek-v3": ["--tp", "8"],
             "deepseek-r1": ["--tp", "1", "--dp", "8", "--ep"], "kimi-k2.5": ["--tp", "8"],
             "gpt-oss-20b": ["--tp", "1"], "gpt-oss-120b": ["--tp", "2", "--ep"],
             "minimax-m2.5": ["--tp", "4", "--ep"]}


@pytest.mark.parametrize("alias", sorted(PRICED_AT))
def test_every_moe_family_the_tables_model_is_priced_saying_how(alias):
    result = plan("--target", alias, "--drafts", "eagle3", "--device", "h200", *PRICED_AT[alias])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert f"{alias} is a mixture of experts" in said and "routed experts" in said
    assert ("whole experts on each GPU (EP)" in said) == ("--ep" in PRICED_AT[alias])
    assert "1 dense layer at" in said  # its EAGLE-3 head as the trained heads are, not an MoE layer


@pytest.mark.parametrize("alias", ["llama4-scout", "llama4-maverick"])
def test_a_moe_family_the_tables_do_not_model_is_refused_in_one_line(alias):
    line = one_line_exit_2(plan("--target", alias, "--drafts", "eagle3", "--tp", "8"))
    assert f"{alias} cannot be priced" in line and "chunked attention" in line and "B active a token" in line


def test_bad_layouts_are_one_line_each():
    line = one_line_exit_2(plan("--target", "llama3-70b", "--drafts", "8b", "--tp", "8", "--ep"))
    assert "llama3-70b is dense" in line
    line = one_line_exit_2(plan("--target", "qwen3-30b-a3b", "--drafts", "eagle3", "--device", "h200",
                                "--tp", "1", "--dp", "3", "--ep"))
    assert "does not divide qwen3-30b-a3b's 128 experts" in line
    line = one_line_exit_2(plan("--target", "minimax-m2.5", "--drafts", "eagle3", "--device", "h200", "--tp", "8"))
    assert "quantisation blocks" in line and "--ep" in line
    line = one_line_exit_2(plan("--target", "deepseek-r1", "--drafts", "eagle3", "--device", "h100", "--tp", "8"))
    assert "fits no batch on h100_sxm" in line and "GiB" in line
    line = one_line_exit_2(plan("--target", "gpt-oss-120b", "--drafts", "mtp", "--device", "h200", "--tp", "8"))
    assert "has no MTP layers" in line
    # MXFP4 experts on a GPU whose tables hold none of gpt-oss's kernels
    line = one_line_exit_2(plan("--target", "gpt-oss-120b", "--drafts", "eagle3", "--device", "a100", "--tp", "8"))
    assert "a100_sxm" in line and "cannot price gpt-oss-120b" in line
    line = one_line_exit_2(plan("--target", "qwen3-30b-a3b", "--drafts", "eagle3", "--device", "h200",
                                "--tp", "2", "--dtype", "fp4"))
    assert "no nvfp4 tensor cores" in line
    line = one_line_exit_2(runner.invoke(app, ["plan", "--target", "gpt-oss-120b", "--drafts", "eagle3", "--alpha",
                                               "0.7", "--device", "h200", "--dp", "2", "--ep", "--concurrency", "8"]))
    assert "--dp does not apply" in line


def test_a_moe_draft_model_is_priced_as_its_own_experts():
    result = plan("--target", "qwen3-32b", "--drafts", "30b-a3b", "--tp", "2")
    assert result.exit_code == 0, result.output
    assert "qwen3-32b with 30b-a3b (qwen3-30b-a3b)" in " ".join(result.output.split())


def test_a_dense_qwen3_target_is_priced_with_a_draft_named_by_its_size():
    result = plan("--target", "qwen3-32b", "--drafts", "0.6b", "--tp", "2")
    assert result.exit_code == 0, result.output
    assert "qwen3-32b with 0.6b (qwen3-0.6b)" in " ".join(result.output.split())


def test_a_hub_id_names_its_alias_or_its_shipped_config():
    assert lookup_alias("Qwen/Qwen3-32B").alias == "qwen3-32b"
    assert lookup_alias("openai/GPT-OSS-120B").alias == "gpt-oss-120b"
    result = plan("--target", "Qwen/Qwen3-8B", "--drafts", "0.6b", "--tp", "1")
    assert result.exit_code == 0, result.output
    # a hub id outside the registry whose config aiconfigurator-core ships: read, then judged
    line = one_line_exit_2(plan("--target", "zai-org/GLM-5", "--drafts", "eagle3", "--tp", "8"))
    assert "zai-org/GLM-5 cannot be priced" in line and "MLA" in line
    line = one_line_exit_2(plan("--target", "Qwen/Qwen3-VL-8B-Instruct", "--drafts", "eagle3"))
    assert "an architecture the planner does not know" in line and "Qwen3VLForConditionalGeneration" in line
    line = one_line_exit_2(plan("--target", "nobody/Nothing-7B", "--drafts", "eagle3"))
    assert "no config for model 'nobody/Nothing-7B' is available offline" in line


def test_a_local_config_of_an_unknown_architecture_is_refused_naming_it(tmp_path):
    _, qwen3 = shipped_config("qwen3-8b")
    (tmp_path / "gemma").mkdir()
    (tmp_path / "gemma" / "config.json").write_text(json.dumps(dict(qwen3, model_type="gemma3",
                                                                    architectures=["Gemma3ForCausalLM"])))
    line = one_line_exit_2(plan("--target", str(tmp_path / "gemma"), "--drafts", "eagle3"))
    assert "model_type gemma3" in line and "Gemma3ForCausalLM" in line
    (tmp_path / "windowed.json").write_text(json.dumps(dict(qwen3, use_sliding_window=True)))
    line = one_line_exit_2(plan("--target", str(tmp_path / "windowed.json"), "--drafts", "eagle3"))
    assert "sliding-window" in line


def test_a_size_the_family_lacks_lists_the_sizes_it_has():
    line = one_line_exit_2(plan("--target", "qwen3-32b", "--drafts", "4b", "--tp", "2"))
    assert "qwen3 has no 4b model" in line and "0.6b, 1.7b, 8b, 32b" in line
