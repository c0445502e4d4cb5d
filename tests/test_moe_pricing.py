"""Mixture-of-experts targets on the kernel tables, each piece against a hand computation: the
experts' weights spread over the GPUs at their own precision, MLA's latent KV cache, sliding
windows, data-parallel ranks splitting a batch, and the EAGLE-3 head such targets are served with."""

from __future__ import annotations

import pytest

from specbench.drafter_kinds import Eagle3, kv_bytes_per_row, kv_bytes_per_token
from specbench.models import routed_expert_parameters, routed_experts
from specbench.synthetic import config_parameters, shipped_config

tables = pytest.importorskip("aiconfigurator_core", reason="the gpu-tables extra")

from specbench.fit import kernel_tables  # noqa: E402
from specbench.fit import table_plan  # noqa: E402


def test_the_experts_spread_over_every_gpu_at_their_own_precision():
    _, gpt_oss = shipped_config("gpt-oss-120b")
    assert kernel_tables.model_quants(gpt_oss) == {"gemm": "bfloat16", "moe": "w4a16_mxfp4", "kv": "bfloat16"}
    routed = routed_expert_parameters(gpt_oss)
    moe = routed_experts(gpt_oss)
    assert routed == moe.moe_layers * moe.experts * (3 * 2880 * 2880 + 2 * 2880 + 2880)
    rest = config_parameters(gpt_oss) - routed
    assert table_plan.target_weight_bytes(gpt_oss, 8, 1, None) == pytest.approx(rest * 2 / 8 + routed * 4.25 / 8 / 8)
    # four data-parallel ranks of TP2: the experts over all 8 GPUs, the rest over TP alone
    assert table_plan.target_weight_bytes(gpt_oss, 2, 4, None) == pytest.approx(rest * 2 / 2 + routed * 4.25 / 8 / 8)
    # --dtype fp8 sets both parts' precision
    assert table_plan.target_weight_bytes(gpt_oss, 8, 1, "fp8") == pytest.approx((rest + routed) / 8)


def test_mla_holds_its_latent_cache_whole_on_every_gpu_and_windows_hold_their_window():
    _, deepseek = shipped_config("deepseek-v3")
    per_token = 61 * (512 + 64) * 2
    assert kv_bytes_per_token(deepseek, 1) == kv_bytes_per_token(deepseek, 8) == per_token
    assert kv_bytes_per_row(deepseek, 8, 1000) == per_token * 1000
    _, gpt_oss = shipped_config("gpt-oss-120b")
    layer = 2 * 8 * 64 * 2  # K and V, 8 KV heads of 64 at TP1, 16 bits
    windowed = sum(kind == "sliding_attention" for kind in gpt_oss["layer_types"])
    assert windowed == 18
    assert kv_bytes_per_row(gpt_oss, 1, 1000) == layer * (18 * 1000 + 18 * 128)
    # a dense model's row is every layer at every token, as before
    _, llama = shipped_config("llama3-70b")
    assert kv_bytes_per_row(llama, 4, 1000) == kv_bytes_per_token(llama, 4) * 1000


def test_data_parallel_ranks_split_the_batch_and_the_gpus():
    planner = table_plan.TablePlanner(shipped_config("qwen3-30b-a3b")[1], "qwen3-30b-a3b", "h200_sxm", "vllm",
                                      dp=2, expert_parallel=True)
    table, _ = table_plan.plan_on_tables(planner, [], [], [1], [64], [1024], [1], 128, None)
    row = table.iloc[0]
    from specbench.step_model import StaticTablesStep

    rank_step = StaticTablesStep(planner, 1).decode_ms(32, 1024 + 64)  # 32 rows a rank, at the mean context
    assert row["ar_step_ms"] == pytest.approx(rank_step)
    prefill = StaticTablesStep(planner, 1).prefill_ms(32, 1024)
    assert row["tokens_per_s_per_gpu"] == pytest.approx(64 * 128 / (prefill + 127 * rank_step) * 1000 / 2)
    memory = planner.memory(None, 1, 1, 1024 + 128)
    assert memory.need(64) == pytest.approx(memory.weights + memory.reserved + 32 * memory.kv_per_row)


def test_an_eagle3_head_for_a_moe_or_mla_target_is_a_dense_layer_at_its_width():
    head = Eagle3()
    _, gpt_oss = shipped_config("gpt-oss-120b")
    layer = head.draft_config(gpt_oss)
    assert routed_experts(layer) is None and layer["model_type"] == "llama"
    assert (layer["hidden_size"], layer["intermediate_size"], layer["vocab_size"]) == (2880, 6 * 2880, 32000)
    assert (layer["num_attention_heads"], layer["num_key_value_heads"], layer["head_dim"]) == (64, 8, 64)
    _, deepseek = shipped_config("deepseek-v3")
    assert {key: head.draft_config(deepseek)[key] for key in ("num_attention_heads", "num_key_value_heads",
                                                                 "head_dim")} == {"num_attention_heads": 56,
                                                                                  "num_key_value_heads": 8,
                                                                                  "head_dim": 128}
    _, llama = shipped_config("llama3-70b")
    assert head.draft_config(llama) == {**llama, "num_hidden_layers": 1}  # a dense target's own layer


def test_a_verify_routes_its_positions_through_the_experts():
    """The verify of K + 1 positions a row runs the MoE layers on B·(K + 1) tokens: at one row it
    costs more than a decode, and over the plain decode it adds less per row at many rows."""
    forward = kernel_tables.Forward(shipped_config("qwen3-30b-a3b")[1], "h200_sxm", "vllm", 1)
    one = forward.verify_ms(1, 1024, 4) / forward.decode_ms(1, 1024)
    many = forward.verify_ms(128, 1024, 4) / forward.decode_ms(128, 1024)
    assert one > 1.3 and many < one


def test_mtp_is_simulated_as_the_target_compiled_with_its_layers():
    """A replica with MTP runs the target compiled with K next-token layers every step (the tables'
    nextn), verifying K + 1 positions a row: its decode step is that forward's, with nothing added."""
    from specbench.fleet.plan import configurations
    from specbench.step_model import StepShape

    planner = table_plan.TablePlanner(shipped_config("deepseek-v3")[1], "deepseek-v3", "h200_sxm", "vllm")
    drafter = table_plan.Drafter("mtp:2", "mtp", label="MTP", layers=2)
    acceptance = table_plan.Acceptance("mtp:2", "α 0.7", 0.7, (0.7,))
    found = configurations(planner, [drafter], [acceptance], 8, None, [1, 2, 4], 1024, 256)
    mtp = [c for c in found if c.draft == "mtp:2"]
    assert [c.k for c in mtp] == [2]  # MTP's K is its layers
    plain, with_mtp = found[0].cost, mtp[0].cost
    nextn = planner.forward(planner.target, 8, 2)
    assert with_mtp.forward is nextn and with_mtp.draft is None
    shape = StepShape(decode_rows=16, k=2)
    assert with_mtp.seconds(shape) > plain.seconds(StepShape(decode_rows=16))
    kernels = nextn.mixed_ms(0, 16, 1024, 256)
    assert with_mtp._step_parts(0, 16, 2)[0] == pytest.approx(kernels)
    # its replica holds the MTP layers' weights beside the target's: fewer tokens of KV cache
    assert mtp[0].spec.kv_capacity_tokens < found[0].spec.kv_capacity_tokens


def test_a_moe_replica_says_how_its_gpu_and_model_were_checked():
    from specbench.fleet.tables import moe_silicon_check

    line = moe_silicon_check("h200_sxm", "gpt-oss-120b")
    assert "vLLM MoE rows on h200_sxm" in line and "gpt-oss-120b's own" in line and "≤ 8 % TPOT" in line
    assert moe_silicon_check("a100_sxm", "gpt-oss-120b").startswith("UNCHECKED")


def test_a_plan_says_where_steps_sit_at_the_launch_floor_and_lays_out_its_titles():
    from typer.testing import CliRunner

    from specbench.cli import app

    result = CliRunner().invoke(app, ["plan", "--target", "gpt-oss-120b", "--drafts", "eagle3", "--alpha", "0.7",
                                      "--device", "h200", "--tp", "8", "--ep", "--k", "4,8",
                                      "--batch-sizes", "128,256"])
    assert result.exit_code == 0, result.output
    said = " ".join(result.output.split())
    assert "TP8 with EP, 1024-token prompts" in said
    assert "speculative steps are priced at the launch floor" in said and "passes 512" in said
    assert "checked on" in said and "vLLM MoE rows on h200_sxm" in said
    data_parallel = CliRunner().invoke(app, ["plan", "--target", "gpt-oss-120b", "--drafts", "eagle3", "--alpha",
                                             "0.7", "--device", "h200", "--tp", "1", "--dp", "2", "--ep",
                                             "--batch-sizes", "8"])
    assert data_parallel.exit_code == 0 and "TP1 × DP2 with EP, 1024-token prompts" in data_parallel.output


def test_batches_too_large_to_fit_are_an_answer_not_an_error():
    from typer.testing import CliRunner

    from specbench.cli import app

    result = CliRunner().invoke(app, ["plan", "--target", "llama3-70b", "--drafts", "1b", "--tp", "4", "--alpha",
                                      "0.7", "--batch-sizes", "512,1024"])
    assert result.exit_code == 0, result.output
    assert result.output.startswith("ESTIMATE on the h100_sxm kernel tables: no batch size asked fits (the largest "
                                    "that does: B = 401, without speculation).")
    assert "the largest batch that fits is 356 to 358, by K" in result.output
