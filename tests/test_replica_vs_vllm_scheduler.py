"""The simulated replica against vLLM's own v1 scheduler (issue 40): the same requests, every step
priced by the same cost, so the two timelines can differ only by how steps are scheduled; with async
scheduling, against vLLM's `AsyncScheduler` driven as its engine core drives it."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("vllm")

from specbench.fleet.replica import ReplicaSpec, Speculation, simulate  # noqa: E402
from specbench.fleet.vllm_oracle import run_vllm_scheduler, vllm_scheduler  # noqa: E402


@pytest.fixture(scope="module")
def model_config_dir(tmp_path_factory):
    """A model's config and nothing else: vLLM's scheduler reads no weights."""
    from transformers import LlamaConfig

    path = tmp_path_factory.mktemp("config")
    LlamaConfig(vocab_size=320, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, max_position_embeddings=16384).save_pretrained(path)
    return path


def step_cost(prefill_tokens: int, decode_rows: int, k: int = 0) -> float:
    return 0.005 + 2e-5 * prefill_tokens + 1e-4 * decode_rows * (1 + k)  # a verify of K + 1 positions a row


def same_timelines(model_dir, spec: ReplicaSpec, arrivals, prompts, outputs, k: int = 0, accept_all: bool = False):
    """Both schedulers on the same requests: every first and last token at the same time (1e-9 s);
    the replica's outcome and vLLM's preemptions."""
    timed = run_vllm_scheduler(vllm_scheduler(model_dir, spec, k=k), step_cost, list(zip(arrivals, prompts, outputs)),
                               k=k, accept_all=accept_all)
    speculation = Speculation(k=k, acceptance=(float(accept_all),) * k) if k else None
    ours = simulate(np.asarray(prompts), np.asarray(outputs), step_cost, spec, arrivals_s=np.asarray(arrivals, float),
                    speculation=speculation)
    np.testing.assert_allclose(ours.first_token_s, [t.first_token_s for t in timed], rtol=0, atol=1e-9)
    np.testing.assert_allclose(ours.finish_s, [t.finish_s for t in timed], rtol=0, atol=1e-9)
    return ours, sum(t.preemptions for t in timed)


def test_a_burst_chunked_under_the_budget_and_the_sequence_limit_is_scheduled_as_vllm_does(model_config_dir):
    rng = np.random.default_rng(0)
    n = 12
    spec = ReplicaSpec(max_num_seqs=4, max_num_batched_tokens=1024, kv_capacity_tokens=1 << 20)
    same_timelines(model_config_dir, spec, [0.0] * n, rng.integers(200, 3000, n), rng.integers(20, 200, n))


def test_poisson_arrivals_past_the_knee_are_scheduled_as_vllm_does(model_config_dir):
    rng = np.random.default_rng(1)
    n = 40
    spec = ReplicaSpec(max_num_seqs=16, max_num_batched_tokens=2048, kv_capacity_tokens=1 << 20)
    same_timelines(model_config_dir, spec, np.cumsum(rng.exponential(0.15, n)), rng.integers(50, 4000, n),
                   rng.integers(10, 400, n))


@pytest.mark.parametrize("reserve_full_input", [True, False])
def test_a_full_kv_cache_preempts_as_vllm_does(model_config_dir, reserve_full_input):
    """Recompute preemption of the newest request, no admission in a step that preempted, and
    admission only when the whole prompt fits (vLLM's `scheduler_reserve_full_isl`) or its chunk."""
    rng = np.random.default_rng(2)
    n = 10
    spec = ReplicaSpec(max_num_seqs=16, max_num_batched_tokens=2048, kv_capacity_tokens=6000,
                       reserve_full_input=reserve_full_input)
    ours, preemptions = same_timelines(model_config_dir, spec, 0.01 * np.arange(n), rng.integers(500, 1500, n),
                                       rng.integers(200, 600, n))
    assert preemptions > 0 and ours.preemptions == preemptions


@pytest.mark.parametrize("accept_all", [True, False])
def test_speculative_rows_take_k_plus_one_of_the_budget_as_in_vllm(model_config_dir, accept_all):
    """n-gram K=2 in vLLM's scheduler (drafts proposed by every row that sampled) against the
    replica's speculation, every draft kept or none (the two acceptances both draw alike)."""
    rng = np.random.default_rng(3)
    n = 16
    spec = ReplicaSpec(max_num_seqs=8, max_num_batched_tokens=1024, kv_capacity_tokens=1 << 20)
    same_timelines(model_config_dir, spec, np.cumsum(rng.exponential(0.1, n)), rng.integers(50, 3000, n),
                   rng.integers(10, 300, n), k=2, accept_all=accept_all)


def same_async_timelines(model_dir, spec: ReplicaSpec, arrivals, prompts, outputs):
    """As `same_timelines`, both with async scheduling: each step scheduled while the one before runs."""
    spec = dataclasses.replace(spec, async_scheduling=True)
    timed = run_vllm_scheduler(vllm_scheduler(model_dir, spec), step_cost, list(zip(arrivals, prompts, outputs)))
    ours = simulate(np.asarray(prompts), np.asarray(outputs), step_cost, spec, arrivals_s=np.asarray(arrivals, float))
    np.testing.assert_allclose(ours.first_token_s, [t.first_token_s for t in timed], rtol=0, atol=1e-9)
    np.testing.assert_allclose(ours.finish_s, [t.finish_s for t in timed], rtol=0, atol=1e-9)
    synchronous = simulate(np.asarray(prompts), np.asarray(outputs), step_cost,
                           dataclasses.replace(spec, async_scheduling=False), arrivals_s=np.asarray(arrivals, float))
    return ours, synchronous, sum(t.preemptions for t in timed)


@pytest.mark.parametrize("max_num_seqs", [1, 4])
def test_async_scheduling_of_a_burst_holds_finished_slots_a_step_as_vllm_does(model_config_dir, max_num_seqs):
    """A finished request's slot is free only for the step scheduled after vLLM learned it finished;
    with one slot the step scheduled in between is empty."""
    rng = np.random.default_rng(0)
    n = 12
    spec = ReplicaSpec(max_num_seqs=max_num_seqs, max_num_batched_tokens=1024, kv_capacity_tokens=1 << 20)
    ours, synchronous, _ = same_async_timelines(model_config_dir, spec, [0.0] * n, rng.integers(200, 3000, n),
                                                rng.integers(20, 200, n))
    if max_num_seqs > 1:
        assert ours.ttft_s.mean() > synchronous.ttft_s.mean()


def test_async_scheduling_of_poisson_arrivals_past_the_knee_is_as_vllms(model_config_dir):
    """An arrival waits for the step scheduled after the one under way started."""
    rng = np.random.default_rng(1)
    n = 40
    spec = ReplicaSpec(max_num_seqs=16, max_num_batched_tokens=2048, kv_capacity_tokens=1 << 20)
    ours, synchronous, _ = same_async_timelines(model_config_dir, spec, np.cumsum(rng.exponential(0.15, n)),
                                                rng.integers(50, 4000, n), rng.integers(10, 400, n))
    assert ours.ttft_s.mean() > synchronous.ttft_s.mean()


@pytest.mark.parametrize("reserve_full_input", [True, False])
def test_async_scheduling_with_a_full_kv_cache_preempts_as_vllm_does(model_config_dir, reserve_full_input):
    rng = np.random.default_rng(2)
    n = 10
    spec = ReplicaSpec(max_num_seqs=16, max_num_batched_tokens=2048, kv_capacity_tokens=6000,
                       reserve_full_input=reserve_full_input)
    ours, _, preemptions = same_async_timelines(model_config_dir, spec, 0.01 * np.arange(n),
                                                rng.integers(500, 1500, n), rng.integers(200, 600, n))
    assert preemptions > 0 and ours.preemptions == preemptions
