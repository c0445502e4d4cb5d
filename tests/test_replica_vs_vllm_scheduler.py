"""The simulated replica against vLLM's own v1 scheduler (issue 40): the same requests, every step
priced by the same cost, so the two timelines can differ only by how steps are scheduled; with async
scheduling, against vLLM's `AsyncScheduler` driven as its engine core drives it."""

import dataclasses

import numpy as np
import pytest

pytest.importorskip("vllm")

from specbench.fleet.replica import ReplicaSpec, Speculation, simulate  # noqa: E402
from specbench.fleet.vllm_oracle import run_vllm_scheduler, vllm_scheduler  # noqa: E402

pytestmark = pytest.mark.integration  # vLLM's own scheduler, imported


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


def same_timelines(model_dir, spec: ReplicaSpec, arrivals, prompts, outputs, k: int = 0, accept_all: bool = False,
                   prefixes: list[tuple] | None = None):
    """Both schedulers on the same requests: every first and last token at the same time (1e-9 s);
    the replica's outcome and vLLM's preemptions. With `prefixes`, both cache prefixes: the
    replica's keys given to vLLM as token ids (`vllm_oracle.prompt_token_ids`) whose block hashes
    it computes."""
    if prefixes is not None:
        spec = dataclasses.replace(spec, prefix_caching=True)
    requests = list(zip(arrivals, prompts, outputs, prefixes)) if prefixes is not None else \
        list(zip(arrivals, prompts, outputs))
    timed = run_vllm_scheduler(vllm_scheduler(model_dir, spec, k=k), step_cost, requests, k=k, accept_all=accept_all)
    speculation = Speculation(k=k, acceptance=(float(accept_all),) * k) if k else None
    ours = simulate(np.asarray(prompts), np.asarray(outputs), step_cost, spec, arrivals_s=np.asarray(arrivals, float),
                    speculation=speculation, prefixes=prefixes)
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


def shared_prefixes(rng, n: int, groups: int, prompts, block_size: int = 16) -> list[tuple]:
    """Per request, the keys of its prompt's shared blocks: one of `groups` system prompts (each a
    few hundred tokens, a block a key), some requests a turn further into their group's
    conversation (a longer prefix), the rest of each prompt the request's own."""
    lengths = rng.integers(10, 40, groups)  # blocks of each group's system prompt
    found = []
    for i in range(n):
        group = int(rng.integers(groups))
        blocks = int(lengths[group]) + (int(rng.integers(0, 20)) if rng.random() < 0.5 else 0)
        blocks = min(blocks, int(prompts[i]) // block_size)
        found.append(tuple((group, b if b < lengths[group] else ("turn", b)) for b in range(blocks)))
    return found


def test_shared_system_prompts_are_found_in_the_prefix_cache_as_vllm_finds_them(model_config_dir):
    """Poisson arrivals whose prompts start with one of three system prompts: the second request
    of a group computes only what follows it, as vLLM's block hashes find it, and sooner."""
    rng = np.random.default_rng(4)
    n = 40
    prompts, outputs = rng.integers(200, 1500, n), rng.integers(10, 200, n)
    prefixes = shared_prefixes(rng, n, 3, prompts)
    spec = ReplicaSpec(max_num_seqs=16, max_num_batched_tokens=1024, kv_capacity_tokens=1 << 20)
    arrivals = np.cumsum(rng.exponential(0.15, n))
    ours, _ = same_timelines(model_config_dir, spec, arrivals, prompts, outputs, prefixes=prefixes)
    assert ours.prefix_hit_share() > 0.2
    uncached = simulate(prompts, outputs, step_cost, spec, arrivals_s=arrivals)
    assert ours.ttft_s.mean() < uncached.ttft_s.mean()


def test_a_prompt_found_whole_computes_its_last_block_again_as_vllm_does(model_config_dir):
    """The same prompt sent again is found but for its last token, which vLLM computes again for its
    logits: a block-aligned prompt recomputes its whole last block."""
    prompts, outputs = np.array([512, 512, 520, 500]), np.array([20, 20, 20, 20])
    prefixes = [tuple(range(32)), tuple(range(32)), tuple(range(32)), tuple(range(31))]
    spec = ReplicaSpec(max_num_seqs=4, max_num_batched_tokens=1024, kv_capacity_tokens=1 << 20)
    ours, _ = same_timelines(model_config_dir, spec, [0.0, 1.0, 2.0, 3.0], prompts, outputs, prefixes=prefixes)
    np.testing.assert_array_equal(ours.cached_tokens, [0, 496, 512, 496])


@pytest.mark.parametrize("reserve_full_input", [True, False])
def test_a_full_kv_cache_evicts_the_least_recently_freed_prefixes_and_preempts_as_vllm_does(model_config_dir,
                                                                                          reserve_full_input):
    """A KV cache too small for the load: admission counts the free blocks a cached prefix sits in,
    new blocks evict the least recently freed prefixes first (a request's tail before its head), and
    a preempted request takes back what of its own is still cached."""
    rng = np.random.default_rng(5)
    n = 30
    prompts, outputs = rng.integers(300, 1500, n), rng.integers(100, 500, n)
    prefixes = shared_prefixes(rng, n, 4, prompts)
    spec = ReplicaSpec(max_num_seqs=16, max_num_batched_tokens=2048, kv_capacity_tokens=8000,
                       reserve_full_input=reserve_full_input)
    ours, preemptions = same_timelines(model_config_dir, spec, 0.05 * np.arange(n), prompts, outputs,
                                       prefixes=prefixes)
    assert preemptions > 0 and ours.preemptions == preemptions
    assert ours.prefix_hit_share() > 0.05


def test_async_scheduling_with_prefix_caching_is_as_vllms(model_config_dir):
    rng = np.random.default_rng(6)
    n = 30
    prompts, outputs = rng.integers(200, 2000, n), rng.integers(10, 300, n)
    prefixes = shared_prefixes(rng, n, 3, prompts)
    spec = ReplicaSpec(max_num_seqs=8, max_num_batched_tokens=1024, kv_capacity_tokens=10000, async_scheduling=True)
    same_timelines(model_config_dir, spec, np.cumsum(rng.exponential(0.1, n)), prompts, outputs, prefixes=prefixes)


def test_which_prefixes_stay_cached_under_pressure_is_as_vllms(model_config_dir):
    """One request at a time, each opening one of eight 480-token conversations, the KV cache room
    for about four: whether a returning conversation is found depends on which prefixes the blocks
    of those in between evicted, least recently freed first, each one's tail before its head."""
    rng = np.random.default_rng(7)
    n = 40
    groups = rng.integers(0, 8, n)
    prompts, outputs = 480 + rng.integers(0, 200, n), rng.integers(20, 100, n)
    prefixes = [tuple((int(g), b) for b in range(30)) for g in groups]
    spec = ReplicaSpec(max_num_seqs=4, max_num_batched_tokens=2048, kv_capacity_tokens=2400)
    ours, _ = same_timelines(model_config_dir, spec, 10.0 * np.arange(n), prompts, outputs, prefixes=prefixes)
    returning = [i for i in range(n) if groups[i] in groups[:i]]
    found = ours.cached_tokens[returning]
    assert (found == 480).any() and (found < 480).any()  # some found whole, some (partly) evicted


@pytest.mark.parametrize("prefix_caching", [False, True])
def test_random_servers_and_loads_are_scheduled_as_vllm_schedules_them(model_config_dir, prefix_caching):
    """Thirty random servers (sequence limit, token budget, KV cache, admission, async scheduling)
    under random loads (arrival rates, lengths, shared prefixes), not chosen to pass: every first
    and last token as vLLM's scheduler has it. One known residual: with async scheduling a
    preemption can leave a request's next steps a step apart from vLLM's (2 of 200 such loads
    without prefix caching, none with it); there the means agree within 2 %."""
    residual = 0
    for seed in range(30):
        rng = np.random.default_rng(seed)
        n = int(rng.integers(10, 50))
        prompts, outputs = rng.integers(20, 2000, n), rng.integers(1, 300, n)
        prefixes = shared_prefixes(rng, n, int(rng.integers(1, 6)), prompts)
        spec = ReplicaSpec(max_num_seqs=int(rng.integers(1, 16)),
                           max_num_batched_tokens=int(rng.choice([256, 512, 1024, 2048])),
                           kv_capacity_tokens=int(rng.choice([3000, 5000, 8000, 1 << 20])),
                           reserve_full_input=bool(rng.random() < 0.5), async_scheduling=bool(rng.random() < 0.5),
                           prefix_caching=prefix_caching)
        arrivals = np.cumsum(rng.exponential(float(rng.choice([0.01, 0.1, 0.5])), n))
        timed = run_vllm_scheduler(vllm_scheduler(model_config_dir, spec), step_cost,
                                   list(zip(arrivals, prompts, outputs, prefixes)))
        ours = simulate(prompts, outputs, step_cost, spec, arrivals_s=arrivals, prefixes=prefixes)
        first, finish = np.array([t.first_token_s for t in timed]), np.array([t.finish_s for t in timed])
        exact = np.allclose(ours.first_token_s, first, rtol=0, atol=1e-9) and np.allclose(ours.finish_s, finish,
                                                                                          rtol=0, atol=1e-9)
        if not exact:
            assert spec.async_scheduling and ours.preemptions, f"seed {seed}: {spec}"
            assert ours.ttft_s.mean() == pytest.approx((first - arrivals).mean(), rel=0.02)
            assert ours.e2e_s.mean() == pytest.approx((finish - arrivals).mean(), rel=0.02)
            residual += 1
    assert residual <= 1


@pytest.mark.parametrize("async_scheduling", [False, True])
@pytest.mark.parametrize("prefix_caching", [False, True])
def test_what_the_replica_reports_each_step_is_what_vllms_scheduler_stats_say(model_config_dir, async_scheduling,
                                                                              prefix_caching):
    """The queue and KV cache a prefix-aware router reads (`Replica.published_at`): at every step end
    the replica reports, the requests waiting and KV blocks in use that vLLM's `make_stats` gives with
    that step's outputs (arrivals during a step not yet waiting; with async scheduling, after the next
    step was scheduled), with a queue (and, scheduled synchronously, preemptions); and read at each of vLLM's step ends, the same."""
    from specbench.fleet.replica import Replica

    rng = np.random.default_rng(5)
    n = 30
    spec = ReplicaSpec(max_num_seqs=8, max_num_batched_tokens=1024, kv_capacity_tokens=5000,
                       async_scheduling=async_scheduling, prefix_caching=prefix_caching, reserve_full_input=False)
    arrivals, prompts, outputs = np.cumsum(rng.exponential(0.08, n)), rng.integers(100, 2000, n), rng.integers(20, 300, n)
    prefixes = shared_prefixes(rng, n, 3, prompts) if prefix_caching else [()] * n
    requests = [(a, p, o, s) if prefix_caching else (a, p, o) for a, p, o, s in zip(arrivals, prompts, outputs, prefixes)]
    theirs: list = []
    timed = run_vllm_scheduler(vllm_scheduler(model_config_dir, spec), step_cost, requests, published=theirs)
    assert max(w for _, w, _ in theirs) > 0
    assert async_scheduling or sum(t.preemptions for t in timed) > 0
    reported = {round(t, 9): (waiting, used) for t, waiting, used in theirs}

    replica = Replica(step_cost, spec, publishes=True)
    for i in range(n):
        replica.add(i, arrivals[i], prompts[i], outputs[i], prefixes[i])
    ours = []
    while replica.pending or replica.waiting or replica.running:  # every report, before a read drops it
        replica.advance(max(replica.now, replica.pending[0][0] if replica.pending else 0.0) + 1e-3)
        ours.extend(entry for entry in replica.published if entry not in ours)
    assert len(ours) > 20
    for t, waiting, used in ours[1:]:  # (the first: the idle replica before any step)
        assert reported[round(t, 9)] == (waiting, used), t

    replica = Replica(step_cost, spec, publishes=True)  # read as a router reads it, at vLLM's step ends
    for i in range(n):
        replica.add(i, arrivals[i], prompts[i], outputs[i], prefixes[i])
    for t, waiting, used in theirs:
        replica.advance(t + 1e-12)
        assert replica.published_at(t + 1e-12) == (waiting, 1 - used / spec.kv_blocks), t
