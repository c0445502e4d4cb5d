"""The fleet simulator's replica on cases worked out by hand (issue 40): one request alone, a
chunked prompt, a queue at a known rate (M/D/1), a KV cache that fills, closed-loop clients."""

from __future__ import annotations

import numpy as np
import pytest

from specbench.fleet import ReplicaSpec, Speculation, simulate


def linear_cost(per_step=0.010, per_prefill_token=1e-5, per_row=1e-4, per_draft=0.002):
    """A step: a fixed part, plus per prompt token and per decode row, plus per draft token
    (hand-computable)."""
    return lambda prefill_tokens, decode_rows, k=0: (per_step + per_prefill_token * prefill_tokens
                                                     + per_row * decode_rows * (1 + k) + per_draft * k)


def test_one_request_alone():
    cost = linear_cost()
    out = simulate([100], [20], cost, ReplicaSpec(), arrivals_s=[0.5])
    ttft = cost(100, 0)  # one step computes the prompt and samples the first token
    assert out.ttft_s[0] == pytest.approx(ttft)
    assert out.tpot_s[0] == pytest.approx(cost(0, 1))  # then one token per decode step
    assert out.e2e_s[0] == pytest.approx(ttft + 19 * cost(0, 1))
    assert out.finish_s[0] == pytest.approx(0.5 + ttft + 19 * cost(0, 1))
    assert out.preemptions == 0 and out.steps == 20


def test_a_long_prompt_is_chunked_by_the_token_budget():
    cost = linear_cost()
    spec = ReplicaSpec(max_num_batched_tokens=1000)
    out = simulate([2500], [2], cost, spec, arrivals_s=[0.0])
    assert out.ttft_s[0] == pytest.approx(2 * cost(1000, 0) + cost(500, 0))
    assert out.e2e_s[0] == pytest.approx(out.ttft_s[0] + cost(0, 1))


def test_a_prefill_shares_the_step_with_running_decodes():
    """A request arriving while another decodes: its prompt rides in the same steps as the decode."""
    cost = linear_cost()
    out = simulate([10, 10], [50, 1], cost, ReplicaSpec(), arrivals_s=[0.0, 0.1])
    step = cost(0, 1)
    first_done = cost(10, 0)
    # the second request's prompt is computed in the first step that starts after it arrived
    decode_steps_before = int(np.ceil((0.1 - first_done) / step - 1e-9))
    start = first_done + decode_steps_before * step
    assert out.first_token_s[1] == pytest.approx(start + cost(10, 1))


def test_a_queue_at_a_known_rate_waits_as_m_d_1():
    """One request at a time (max_num_seqs 1), each a one-step job of S seconds, Poisson arrivals:
    the mean wait before service is rho S / (2 (1 - rho)) (M/D/1)."""
    service = 0.02
    rate = 0.7 / service
    rng = np.random.default_rng(3)
    arrivals = np.cumsum(rng.exponential(1 / rate, 20000))
    out = simulate(np.full(20000, 8), np.ones(20000, int), lambda p, d: service,
                   ReplicaSpec(max_num_seqs=1, max_num_batched_tokens=8), arrivals_s=arrivals)
    rho = rate * service
    expected_wait = rho * service / (2 * (1 - rho))
    # the simulator starts a step only at step boundaries: an arrival waits for the step under way,
    # which M/D/1 counts too; the first step after idle starts at the arrival
    assert np.mean(out.ttft_s - service) == pytest.approx(expected_wait, rel=0.06)


def test_a_full_kv_cache_preempts_the_newest_and_everyone_finishes():
    """Room for 64 tokens (4 blocks of 16): two 24-token prompts fit, but not their outputs too, so
    the one admitted last is preempted, recomputed later, and every output still has its length."""
    cost = linear_cost()
    spec = ReplicaSpec(kv_capacity_tokens=64, block_size=16)
    out = simulate([24, 24], [30, 30], cost, spec, arrivals_s=[0.0, 0.0])
    assert out.preemptions >= 1
    assert np.isfinite(out.finish_s).all() and (out.output_tokens == 30).all()
    # the first request is never preempted: it decodes alone once the second is out
    assert out.finish_s[0] < out.finish_s[1]
    with pytest.raises(ValueError, match="needs more KV cache"):
        simulate([100], [10], cost, spec, arrivals_s=[0.0])


def test_closed_loop_clients_send_when_their_last_request_finished():
    cost = linear_cost()
    out = simulate(np.full(12, 50), np.full(12, 10), cost, ReplicaSpec(), concurrency=3)
    assert (out.arrival_s[:3] == 0).all()
    finishes = np.sort(out.finish_s)
    assert np.allclose(np.sort(out.arrival_s[3:]), finishes[:9])  # each later request at a finish
    assert max(n for _, n in out.timeline) == 3


@pytest.mark.parametrize("kwargs, message", [
    ({"arrivals_s": None, "concurrency": None}, "give arrivals"),
    ({"arrivals_s": [0.0], "concurrency": 2}, "give arrivals"),
    ({"concurrency": 0}, "concurrency must be >= 1"),
])
def test_bad_load_is_one_line(kwargs, message):
    with pytest.raises(ValueError, match=message):
        simulate([10], [10], linear_cost(), ReplicaSpec(), **{"arrivals_s": None, **kwargs})


def test_bad_specs_and_requests_are_one_line():
    with pytest.raises(ValueError, match="max_num_seqs must be >= 1"):
        ReplicaSpec(max_num_seqs=0)
    with pytest.raises(ValueError, match="at least one token"):
        simulate([10, 0], [5, 5], linear_cost(), ReplicaSpec(), arrivals_s=[0.0, 0.0])


def test_speculation_that_accepts_everything_emits_k_plus_one_a_step():
    cost = linear_cost()
    out = simulate([10], [13], cost, ReplicaSpec(), arrivals_s=[0.0], speculation=Speculation(3, (1.0, 1.0, 1.0)))
    # the prefill's token, then 12 more in steps of 4: three speculative steps
    assert out.steps == 1 + 3
    assert out.e2e_s[0] == pytest.approx(cost(10, 0) + 3 * cost(0, 1, 3))


def test_speculation_that_accepts_nothing_emits_one_a_step_and_costs_more():
    cost = linear_cost()
    plain = simulate([10], [13], cost, ReplicaSpec(), arrivals_s=[0.0])
    rejected = simulate([10], [13], cost, ReplicaSpec(), arrivals_s=[0.0], speculation=Speculation(3, (0, 0, 0)))
    assert rejected.steps == plain.steps == 13
    assert rejected.e2e_s[0] == pytest.approx(cost(10, 0) + 12 * cost(0, 1, 3)) and rejected.e2e_s[0] > plain.e2e_s[0]


def test_measured_acceptance_gives_tau_tokens_a_step_on_average():
    """P(position i accepted) = 0.8, 0.6, 0.4: a step emits 1 + 0.8 + 0.6 + 0.4 = 2.8 tokens on average."""
    cost = linear_cost()
    out = simulate(np.full(200, 10), np.full(200, 281), cost, ReplicaSpec(), concurrency=1,
                   speculation=Speculation(3, (0.8, 0.6, 0.4), seed=1))
    decode_steps = out.steps - 200  # one prefill step a request
    assert 200 * 280 / decode_steps == pytest.approx(2.8, rel=0.02)


def test_a_k_schedule_turns_speculation_off_at_large_batches():
    """{1+: K=2, 4+: off}: four rows decode without drafting (one token a step each)."""
    cost = linear_cost()
    schedule = Speculation(2, (1.0, 1.0), schedule=((1, 2), (4, 0)))
    alone = simulate([10], [7], cost, ReplicaSpec(), arrivals_s=[0.0], speculation=schedule)
    assert alone.steps == 1 + 2  # 6 tokens after the prefill's, 3 a step
    crowd = simulate(np.full(4, 10), np.full(4, 7), cost, ReplicaSpec(), arrivals_s=np.zeros(4), speculation=schedule)
    assert crowd.steps == 1 + 6
    with pytest.raises(ValueError, match="acceptance needs 3 positions"):
        Speculation(3, (0.9, 0.8))
    with pytest.raises(ValueError, match="not increase"):
        Speculation(2, (0.5, 0.9))


# --- on the kernel tables (the gpu-tables extra, which CI installs) -----------------------------------

def test_a_served_replica_on_the_tables_prices_each_step_from_them():
    """The baseline at one client: its TPOT is the tables' one-row decode step, its TTFT the prompt's
    prefill step (the replica is idle when the request arrives); speculation with a 1b draft at
    α 0.7 and K 3 runs steps of the draft's three decodes plus the verify, emitting 1 + 0.7 + 0.49
    + 0.343 tokens a step on average."""
    import json

    from typer.testing import CliRunner

    from specbench.cli import app
    from specbench.fit import kernel_tables
    from specbench.fit.table_plan import TablePlanner, model_config
    from specbench.fleet.tables import step_cost

    result = CliRunner().invoke(app, ["plan", "--target", "llama3-8b", "--drafts", "1b", "--tp", "1", "--concurrency",
                                      "1", "--input-len", "512", "--output-len", "256", "--k", "3", "--alpha", "0.7",
                                      "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["estimate"].startswith("SIMULATED on aiconfigurator-core")
    assert plan["device"] == "h100_sxm" and kernel_tables.version() in plan["estimate"]
    base, speculative = plan["rows"]
    name, config = model_config("llama3-8b")
    planner = TablePlanner(config, name, "h100_sxm", "vllm")
    target = planner.forward(config, 1)
    assert base["tpot_p50_ms"] == pytest.approx(target.mixed_ms(0, 1, 512, 256), rel=1e-6)
    assert base["ttft_p50_ms"] == pytest.approx(target.mixed_ms(512, 0, 512, 256), rel=1e-6)
    draft = planner.forward(model_config("llama3.2-1b")[1], 1)
    step_ms = step_cost(target, 512, 256, draft)(0, 1, 3) * 1e3
    tau = 1 + 0.7 + 0.7 ** 2 + 0.7 ** 3
    assert speculative["draft"] == "1b" and speculative["k"] == 3
    # 255 tokens after the first, about tau a step (the last step cut at the output's length)
    assert speculative["e2e_p50_ms"] - speculative["ttft_p50_ms"] == pytest.approx(255 / tau * step_ms, rel=0.1)


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "4"], "--concurrency and --dtype simulate a served replica on the kernel tables"),
    (["--target", "llama3-8b", "--concurrency", "0", "--alpha", "0.7"], "must be >= 1"),
    (["--target", "llama3-8b", "--concurrency", "4", "--alpha", "0.7", "--dtype", "int3"], "--dtype on the tables"),
    (["--target", "llama3-8b", "--concurrency", "4", "--alpha", "0.7", "--slo", "tpot=0.05"], "not simulated yet"),
])
def test_bad_fleet_input_is_one_line(args, message):
    from typer.testing import CliRunner

    from specbench.cli import app

    result = CliRunner().invoke(app, ["plan", *args])
    assert result.exit_code == 2 and message in result.output, result.output
    assert len(result.output.strip().splitlines()) == 1


def test_without_an_acceptance_the_baseline_alone_is_simulated():
    """The issue's own example names no drafter's acceptance: the baseline is simulated, the drafts
    are named as left out, never simulated at an α nobody gave."""
    import json

    from typer.testing import CliRunner

    from specbench.cli import app

    result = CliRunner().invoke(app, ["plan", "--target", "llama3-8b", "--tp", "1", "--dtype", "fp8", "--concurrency",
                                      "4", "--input-len", "1024", "--output-len", "64", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert [row["draft"] for row in plan["rows"]] == ["autoregressive"] and plan["dtype"] == "fp8"
    assert "no acceptance to simulate speculation with" in plan["drafts_left_out"][0]
    bf16 = CliRunner().invoke(app, ["plan", "--target", "llama3-8b", "--tp", "1", "--concurrency", "4", "--input-len",
                                    "1024", "--output-len", "64", "--json"])
    assert json.loads(bf16.output)["rows"][0]["tpot_p50_ms"] > plan["rows"][0]["tpot_p50_ms"]  # FP8 GEMMs are faster


def test_the_fleet_plan_keeps_vllms_draft_tp_rule():
    """--draft-tp is 1 or the target's TP, as the table plan checks it (one check serves both)."""
    from typer.testing import CliRunner

    from specbench.cli import app

    result = CliRunner().invoke(app, ["plan", "--target", "llama3-70b", "--tp", "4", "--draft-tp", "2", "--concurrency",
                                      "4", "--alpha", "0.7"])
    assert result.exit_code == 2 and "--draft-tp must be 1 or the target's TP" in result.output, result.output
