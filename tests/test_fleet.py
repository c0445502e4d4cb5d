"""The fleet simulator's replica on cases worked out by hand (issue 40): one request alone, a
chunked prompt, a queue at a known rate (M/D/1), a KV cache that fills, closed-loop clients."""

from __future__ import annotations

import dataclasses
import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import azure_csv
from specbench.fleet import ReplicaSpec, Speculation, simulate
from specbench.step_model import StepShape


def at(model, prefill_tokens: int, decode_rows: int, k: int = 0, **shape) -> float:
    """`model`'s seconds for a step of that shape (`StepShape`'s fields)."""
    return model.seconds(StepShape(prefill_tokens, decode_rows, k, **shape))


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


def test_the_api_servers_time_is_in_every_ttft_and_e2e_and_in_the_slo_watch():
    """`request_overhead_s` (a served fit's `overhead_s`: HTTP, tokenizing) lengthens each request's
    TTFT and E2E, alone or in a fleet, and the early stop of a fleet that cannot meet its SLO counts it;
    the engine's steps and TPOT are the same."""
    from specbench.fleet.router import SloWatch, simulate_fleet

    cost = linear_cost()
    plain = simulate([100, 100], [20, 20], cost, ReplicaSpec(), arrivals_s=[0.0, 5.0])
    slow = ReplicaSpec(request_overhead_s=0.25)
    alone = simulate([100, 100], [20, 20], cost, slow, arrivals_s=[0.0, 5.0])
    np.testing.assert_allclose(alone.ttft_s, plain.ttft_s + 0.25)
    np.testing.assert_allclose(alone.e2e_s, plain.e2e_s + 0.25)
    np.testing.assert_allclose(alone.tpot_s, plain.tpot_s)
    fleet = simulate_fleet([100, 100], [20, 20], [0.0, 5.0], cost, slow, 2).outcome
    np.testing.assert_allclose(fleet.ttft_s, plain.ttft_s + 0.25)
    bound = float(plain.ttft_s[0]) + 0.1  # met without the API server's time, missed with it
    watch = SloWatch({"ttft": bound}, 50.0, 2)
    simulate_fleet([100, 100], [20, 20], [0.0, 5.0], cost, slow, 1, watch=watch)
    assert watch.missed == 2
    with pytest.raises(ValueError, match="request_overhead_s"):
        ReplicaSpec(request_overhead_s=-1)


def test_a_long_prompt_is_chunked_by_the_token_budget():
    cost = linear_cost()
    spec = ReplicaSpec(max_num_batched_tokens=1000)
    out = simulate([2500], [2], cost, spec, arrivals_s=[0.0])
    assert out.ttft_s[0] == pytest.approx(2 * cost(1000, 0) + cost(500, 0))
    assert out.e2e_s[0] == pytest.approx(out.ttft_s[0] + cost(0, 1))


def test_a_chunk_that_attends_over_tokens_before_it_is_told_so():
    """A step model learns, for each prompt chunk of a step, the tokens before it: an earlier chunk
    of its prompt, or a prefix found cached (none for a fresh prompt)."""
    shapes = []

    class Recorded:
        reads_context = False

        def seconds(self, shape: StepShape) -> float:
            shapes.append(shape)
            return 0.01

    simulate([2500], [2], Recorded(), ReplicaSpec(max_num_batched_tokens=1000), arrivals_s=[0.0])
    assert [(s.prefill_tokens, s.decode_rows) for s in shapes[:3]] == [(1000, 0), (1000, 0), (500, 0)]
    assert [s.prefill_chunks for s in shapes[:3]] == [((1000, 0),), ((1000, 1000),), ((500, 2000),)]
    shapes.clear()
    system = tuple(range(64))  # 1,024 tokens in blocks of 16
    simulate([1224, 1224], [2, 2], Recorded(), ReplicaSpec(prefix_caching=True), arrivals_s=[0.0, 10.0],
             prefixes=[system, system])
    prefills = [(s.prefill_tokens, s.decode_rows, s.prefill_chunks) for s in shapes if s.prefill_tokens]
    assert prefills == [(1224, 0, ((1224, 0),)), (200, 0, ((200, 1024),))]


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


def test_async_scheduling_admits_an_arrival_one_step_later():
    """With async scheduling the step that starts first after an arrival was scheduled while the one
    before it ran, without it: the prompt rides in the step after (one decode step later). A request
    arriving at an idle replica starts at once either way."""
    cost = linear_cost()
    arrivals, prompts, outputs = [0.0, 0.1], [10, 10], [50, 1]
    synchronous = simulate(prompts, outputs, cost, ReplicaSpec(), arrivals_s=arrivals)
    overlapped = simulate(prompts, outputs, cost, ReplicaSpec(async_scheduling=True), arrivals_s=arrivals)
    step = cost(0, 1)
    start = cost(10, 0) + int(np.ceil((0.1 - cost(10, 0)) / step - 1e-9)) * step  # the first step after 0.1
    assert synchronous.first_token_s[1] == pytest.approx(start + cost(10, 1))
    assert overlapped.first_token_s[1] == pytest.approx(start + step + cost(10, 1))
    assert overlapped.first_token_s[0] == pytest.approx(synchronous.first_token_s[0]) == pytest.approx(cost(10, 0))


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


def test_clients_started_together_queue_their_prefills_behind_each_other():
    """Three clients at once, each prompt a whole step's token budget: no step computes more than
    one prompt, so the k-th first token comes after at least k prefill steps; every request is
    measured. Started apart (STEADY), the first requests and the drain are left out."""
    from specbench.fleet.plan import BURST_SPACING_S, STEADY, Clients, closed_loop

    cost = linear_cost()
    spec = ReplicaSpec(max_num_batched_tokens=100)
    together = Clients("burst", together=True, requests_per_client=2, shortest_share=1.0, measure_all=True)
    out, keep = closed_loop(cost, spec, 3, 100, 10, clients=together)
    assert keep.all() and len(out.ttft_s) == 6
    assert out.arrival_s[:3] == pytest.approx(np.arange(3) * BURST_SPACING_S)
    assert out.ttft_s[0] == pytest.approx(cost(100, 0))
    first_tokens = np.sort(out.arrival_s[:3] + out.ttft_s[:3])
    assert all(at >= (k + 1) * cost(100, 0) for k, at in enumerate(first_tokens))
    out, keep = closed_loop(cost, spec, 3, 100, 10, clients=STEADY)
    assert len(keep) == 3 * STEADY.requests_per_client and keep.sum() == len(keep) - 6
    assert len(set(out.arrival_s[:3])) == 3  # started apart


def test_a_burst_s_first_request_starts_the_idle_engine_alone():
    """Clients started together reach the engine one after another: the idle engine's first step
    computes the first prompt alone, and the others (short prompts, all fitting one step's budget)
    share the second step; at the next requests those cohorts persist, so the first client's
    request again waits for one step and the others' for two."""
    from specbench.fleet.plan import Clients, closed_loop

    cost = linear_cost()
    together = Clients("burst", together=True, requests_per_client=2, shortest_share=1.0, measure_all=True)
    out, _ = closed_loop(cost, ReplicaSpec(max_num_batched_tokens=100), 3, 30, 4, clients=together)
    first, second = cost(30, 0), cost(60, 1)
    assert out.ttft_s[0] == pytest.approx(first)
    assert out.arrival_s[1:3] + out.ttft_s[1:3] == pytest.approx([first + second] * 2)


def test_the_burst_spacing_is_the_api_server_s_measured_one():
    """BURST_SPACING_S against the API server's serial time a request under a burst (api_burst.json:
    the wait before vLLM stamps a request's arrival, fitted on bursts of 1-32), within a factor of
    two; and no shorter than specbench's client sent the served closed-loop check's first waves."""
    from specbench.fleet.plan import BURST_SPACING_S
    from specbench.results import load_run

    measured = Path(__file__).parents[1] / "benchmarks" / "host-costs"
    serial_s = json.loads((measured / "api_burst.json").read_text())["serial_ms_per_request"] / 1e3
    assert serial_s / 2 <= BURST_SPACING_S <= serial_s * 2
    for clients in (8, 16):
        requests = load_run(Path(__file__).parent / "fixtures" / "cpu" / f"vllm-closed-loop-{clients}").requests
        assert np.median(np.diff(np.sort(requests["start_offset_s"].to_numpy())[:clients])) < BURST_SPACING_S


def test_inferencemax_clients_draw_lengths_as_benchmark_serving_and_measure_every_request():
    from specbench.fleet.plan import BURST_SPACING_S, INFERENCEMAX, closed_loop

    prompts, outputs = INFERENCEMAX.lengths(4000, 1024, 8192)
    assert prompts.min() >= int(0.8 * 1024) and prompts.max() <= 1024
    assert outputs.min() >= int(0.8 * 8192) and outputs.max() <= 8192
    assert prompts.mean() == pytest.approx(0.9 * 1024, rel=0.01)
    out, keep = closed_loop(linear_cost(), ReplicaSpec(), 4, 1024, 64, clients=INFERENCEMAX)
    assert keep.all() and len(keep) == 40 and out.arrival_s[:4] == pytest.approx(np.arange(4) * BURST_SPACING_S)
    assert set(out.output_tokens) <= set(range(int(0.8 * 64), 65)) and len(set(out.output_tokens)) > 1


def test_bench_clients_send_as_a_sweep_cell_at_the_given_lengths():
    """`--clients bench`: all at once, 10 requests each at exactly the given lengths, every one measured
    (vllm bench serve --max-concurrency C on fixed-length prompts; a sweep cell at batch size C)."""
    from specbench.fleet.plan import BENCH, BURST_SPACING_S, CLIENTS, closed_loop

    assert CLIENTS["bench"] is BENCH
    out, keep = closed_loop(linear_cost(), ReplicaSpec(), 4, 512, 64, clients=BENCH)
    assert keep.all() and len(keep) == 40 and out.arrival_s[:4] == pytest.approx(np.arange(4) * BURST_SPACING_S)
    assert set(out.output_tokens) == {64} and set(out.prompt_tokens) == {512}


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


def test_inter_token_latency_is_each_decode_step_and_zeros_within_a_speculative_step():
    """Pooled over requests as vllm bench serve pools ITL. Plain: 12 gaps of one decode step each.
    Everything accepted at K = 3: 12 tokens in 3 steps, each step one gap of its time and 3 tokens
    that came with it (gaps of 0): 9 of 12 gaps are 0."""
    cost = linear_cost()
    plain = simulate([10], [13], cost, ReplicaSpec(), arrivals_s=[0.0])
    assert plain.itl_counts.sum() == 12
    for p in (1, 50, 99):
        assert plain.itl_percentile(p) == pytest.approx(cost(0, 1))
    fast = simulate([10], [13], cost, ReplicaSpec(), arrivals_s=[0.0], speculation=Speculation(3, (1.0, 1.0, 1.0)))
    assert fast.itl_counts.sum() == 12
    assert fast.itl_percentile(50) == fast.itl_percentile(75) == 0.0
    assert fast.itl_percentile(76) == pytest.approx(cost(0, 1, 3))
    # per streamed chunk (vllm bench serve's ITL): the 3 steps, each one gap; plain decoding, the same 12 gaps
    for p in (1, 50, 99):
        assert fast.itl_chunk_percentile(p) == pytest.approx(cost(0, 1, 3))
        assert plain.itl_chunk_percentile(p) == pytest.approx(cost(0, 1))
    # two requests decoding together: each of the shared steps is a gap of both
    pair = simulate([10, 10], [5, 5], cost, ReplicaSpec(), arrivals_s=[0.0, 0.0])
    assert pair.itl_counts.sum() == 8 and pair.itl_percentile(50) == pytest.approx(cost(0, 2))


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
    """The baseline at one client: its TPOT is the tables' one-row decode step (one CUDA graph), its
    TTFT the prompt's prefill step (the replica is idle when the request arrives; a step that carries
    a prefill replays graph pieces, a layer's attention between them) and the API server's time; speculation with a 1b draft at
    α 0.7 and K 3 runs steps of the draft's three decodes plus the verify, emitting 1 + 0.7 + 0.49
    + 0.343 tokens a step on average."""
    import json

    from typer.testing import CliRunner

    from specbench.cli import app
    from specbench.fit import kernel_tables
    from specbench.fit.host_cost import PIECEWISE_LAYER_MS, VLLM_API_SERVER_REQUEST
    from specbench.fit.table_plan import TablePlanner, model_config
    from specbench.fleet.tables import step_cost

    result = CliRunner().invoke(app, ["plan", "--target", "llama3-8b", "--drafts", "1b", "--tp", "1", "--concurrency",
                                      "1", "--input-len", "512", "--output-len", "256", "--k", "3", "--alpha", "0.7",
                                      "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["estimate"].startswith("SIMULATED on aiconfigurator-core")
    assert plan["device"] == "h100_sxm" and kernel_tables.version() in plan["estimate"]
    base, speculative = plan["rows"][:2]  # then the 1b K schedule, where it is not K=3 at every batch
    assert not speculative["k_schedule"] and all(r["k_schedule"] for r in plan["rows"][2:])
    name, config = model_config("llama3-8b")
    planner = TablePlanner(config, name, "h100_sxm", "vllm")
    target = planner.forward(config, 1)
    assert base["tpot_p50_ms"] == pytest.approx(target.mixed_ms(0, 1, 512, 256), rel=1e-6)
    assert base["ttft_p50_ms"] == pytest.approx(target.mixed_ms(512, 0, 512, 256) + 32 * PIECEWISE_LAYER_MS
                                                + VLLM_API_SERVER_REQUEST.ms(512), rel=1e-6)
    draft = planner.forward(model_config("llama3.2-1b")[1], 1)
    step_ms = at(step_cost(target, 512, 256, draft, async_scheduling=True), 0, 1, 3) * 1e3
    tau = 1 + 0.7 + 0.7 ** 2 + 0.7 ** 3
    assert speculative["draft"] == "1b" and speculative["k"] == 3
    # 255 tokens after the first, about tau a step (the last step cut at the output's length)
    assert speculative["e2e_p50_ms"] - speculative["ttft_p50_ms"] == pytest.approx(255 / tau * step_ms, rel=0.1)


@pytest.mark.integration
def test_an_80_column_terminal_gets_the_closed_loop_table_in_column_blocks_none_folded():
    """16 columns folded to two characters a line were unreadable at 80 columns: split into blocks
    that fit, each opening with the configuration's draft, K and acceptance (a K schedule's text
    folded in its K column, which keeps the blocks at two columns or more)."""
    import os
    import subprocess
    import sys

    command = [sys.executable, "-m", "specbench.cli", "plan", "--target", "llama3-8b", "--drafts", "1b", "--tp", "1",
               "--concurrency", "2", "--input-len", "512", "--output-len", "64", "--k", "3", "--alpha", "0.7"]
    shown = subprocess.run(command, capture_output=True, text=True, timeout=300,
                           env={**os.environ, "COLUMNS": "80"})
    assert shown.returncode == 0, shown.stderr
    table_lines = [line for line in shown.stdout.splitlines() if line[:1] in "┏┃┡│└"]
    assert table_lines and max(len(line) for line in table_lines) <= 80, shown.stdout
    titles = [line.strip() for line in shown.stdout.splitlines() if line.startswith("TP1, 2 clients (")]
    assert len(titles) >= 2 and titles[-1].endswith(f"({len(titles)}/{len(titles)})"), shown.stdout
    headers = [line for line in table_lines if line.startswith("┃")]
    assert len(headers) == len(titles)  # one header line a block: nothing folded
    assert all([cell.strip() for cell in line.split("┃")[1:4]] == ["draft", "K", "acceptance"] for line in headers)
    named = " ".join(headers)
    for column in ("TTFT p50 ms", "TPOT p99 ms", "chunk ITL p99 ms", "E2E p50 s", "$/1M tok", "TPOT speed-up",
                   "time at B≥32"):
        assert named.count(column) == 1, column
    assert sum("autoregressive" in line for line in table_lines) == len(titles)
    wide = subprocess.run(command, capture_output=True, text=True, timeout=300, env={**os.environ, "COLUMNS": "300"})
    assert sum(line.startswith("┃") for line in wide.stdout.splitlines()) == 1  # where it fits, one table


@pytest.mark.parametrize("args, message", [
    (["--concurrency", "4"], "--concurrency simulates served replicas: give --target MODEL (on the kernel tables) "
                             "or RUN_DIR"),
    (["--trace", "azure-conv"], "give --slo"),
    (["--target", "llama3-8b", "--concurrency", "0", "--alpha", "0.7"], "must be >= 1"),
    (["--target", "llama3-8b", "--concurrency", "4", "--alpha", "0.7", "--dtype", "int3"], "--dtype on the tables"),
    # a request past the model's context: vLLM would refuse every one, so nothing is simulated
    (["--target", "llama3-8b", "--concurrency", "4", "--input-len", "131000", "--output-len", "100"],
     "--input-len 131000 + --output-len 100: 131100 tokens a request, past llama3-8b's 131072-token context"),
    (["--target", "llama3-8b", "--concurrency", "4", "--alpha", "0.7", "--trace-speedup", "2"],
     "--trace-speedup does not apply to a simulated replica on the kernel tables"),
    (["--target", "llama3-8b", "--concurrency", "4", "--alpha", "0.7", "--chart", "x.svg"], "write a .png file"),
    (["--target", "llama3-8b", "--concurrency", "4", "--alpha", "0.7", "--slo", "tpot=abc"], "needs a number of seconds"),
    (["--target", "llama3-8b", "--concurrency", "4", "--calibrate", "x"], "--calibrate corrects a static plan's steps"),
    (["--target", "llama3-8b", "--concurrency", "4", "--trace", "azure-conv"], "two loads: give one"),
    (["--target", "llama3-8b", "--trace", "azure-conv"], "give --slo"),
    (["--target", "llama3-8b", "--trace", "no-such.csv", "--slo", "ttft=1"], "no such file"),
    (["--target", "llama3-8b", "--trace", "azure-conv", "--slo", "ttft=fast"], "needs a number of seconds"),
    (["--target", "llama3-8b", "--trace", "azure-conv", "--slo", "tpot=0.05", "--trace-speedup", "0"],
     "--trace-speedup must be positive"),
    (["--target", "llama3-8b", "--trace", "azure-conv", "--slo", "tpot=0.05", "--trace-window", "9999999:10"],
     "no request of azure-conv arrives in 9999999–10000009 s (the trace spans 0–3501.722 s)"),  # no "1e+07"
    # ":100:" is rich's emoji code for a picture: the window prints as typed
    (["--target", "llama3-8b", "--trace", "azure-conv", "--slo", "tpot=0.05", "--trace-window", "9999999:100"],
     "--trace-window 9999999:100: no request of azure-conv arrives"),
    (["--target", "llama3-8b", "--trace", "azure-conv", "--slo", "tpot=0.05", "--headroom", "-1"],
     "--headroom must be"),
    (["--target", "llama3-8b", "--trace", "azure-conv", "--slo", "tpot=0.05", "--router", "random"],
     "--router must be one of"),
    (["--target", "llama3-8b", "--trace", "azure-conv", "--slo", "tpot=0.05", "--chart", "x.svg"], "write a .png"),
    (["--target", "llama3-8b", "--trace", "azure-conv", "--slo", "tpot=0.05", "--gpu-price", "-2"], "--gpu-price"),
    (["--trace-speedup", "2"], "--trace-speedup does not apply to a plan on a run's fit (RUN_DIR); it applies with --trace"),
    (["--target", "llama3-8b", "--concurrency", "4", "--clients", "all"], "--clients must be one of"),
    (["--clients", "inferencemax"], "--clients does not apply to a plan on a run's fit (RUN_DIR); it applies with --concurrency"),
    (["--kv-cache-dtype", "fp8"], "--kv-cache-dtype does not apply to a plan on a run's fit (RUN_DIR); it applies with --target"),
    (["--draft-dtype", "fp8"], "--draft-dtype does not apply to a plan on a run's fit (RUN_DIR); it applies with --target"),
    (["--dtype", "fp8"], "--dtype does not apply to a plan on a run's fit (RUN_DIR); it applies with --target"),
    (["--target", "llama3-8b", "--concurrency", "4", "--kv-cache-dtype", "int4"], "--kv-cache-dtype must be auto or fp8"),
    (["--max-num-seqs", "8", "--no-async-scheduling"],
     "--max-num-seqs does not apply to a plan on a run's fit (RUN_DIR); it applies with --target and --concurrency or --trace"),
    # what does not fit, by how much, and what would
    (["--target", "llama3-70b", "--tp", "1", "--concurrency", "4"],
     "the weights do not fit h100_sxm at TP1: 131.4 GiB a GPU and the runtime's 3.5 GiB leave no KV cache in the "
     "72.0 GiB vLLM uses of each GPU (a larger --tp, or --dtype fp8)"),
    (["--target", "llama3-8b", "--concurrency", "4", "--max-num-batched-tokens", "0"],
     "--max-num-batched-tokens must be >= 1"),
    # vLLM's SchedulerConfig refuses fewer tokens a step than sequences
    (["--target", "llama3-8b", "--concurrency", "4", "--max-num-batched-tokens", "512"],
     "--max-num-batched-tokens 512 is below vLLM's default --max-num-seqs on this GPU (1024): vLLM refuses"),
    (["--target", "llama3-8b", "--concurrency", "4", "--max-num-batched-tokens", "512", "--max-num-seqs", "600"],
     "--max-num-batched-tokens 512 is below --max-num-seqs (600)"),
    (["--target", "llama3-8b", "--trace", "azure-conv", "--slo", "tpot=0.05", "--clients", "inferencemax"],
     "--clients does not apply to a fleet sized on the kernel tables (--target with --trace): a trace's requests arrive as it recorded them"),
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


def test_an_fp8_kv_cache_admits_more_and_decodes_faster_where_the_16_bit_one_preempts():
    """`--kv-cache-dtype fp8`: 64 clients of Llama-3.1-70B at TP2 on H100 with 1k in and 8k out need
    ~590k tokens of KV cache. 16-bit holds ~230k and preempts; fp8 holds twice that, preempts less,
    and its decode attention reads half the bytes: TPOT and TTFT both lower."""
    import json

    from typer.testing import CliRunner

    from specbench.cli import app

    def simulated(*extra: str) -> dict:
        result = CliRunner().invoke(app, ["plan", "--target", "llama3-70b", "--device", "h100", "--tp", "2", "--dtype",
                                          "fp8", "--concurrency", "64", "--input-len", "1024", "--output-len", "8192",
                                          "--json", *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    auto, fp8 = simulated(), simulated("--kv-cache-dtype", "fp8")
    assert auto["kv_cache_dtype"] == "auto" and fp8["kv_cache_dtype"] == "fp8"
    assert auto["rows"][0]["preemptions"] > fp8["rows"][0]["preemptions"]
    assert fp8["rows"][0]["tpot_p50_ms"] < auto["rows"][0]["tpot_p50_ms"]
    assert fp8["rows"][0]["ttft_p50_ms"] < auto["rows"][0]["ttft_p50_ms"]


def test_the_replicas_vllm_flags_are_the_ones_given():
    """--max-num-seqs below the clients queues the rest; --max-num-batched-tokens chunks a prompt the
    default budget takes whole; --no-async-scheduling admits a step sooner. The header and --json say
    which flags the replicas ran with."""
    import json

    from typer.testing import CliRunner

    from specbench.cli import app

    def simulated(*extra: str, clients: str = "8") -> dict:
        result = CliRunner().invoke(app, ["plan", "--target", "llama3-8b", "--tp", "1", "--concurrency", clients,
                                          "--input-len", "4096", "--output-len", "64", "--json", *extra])
        assert result.exit_code == 0, result.output
        return json.loads(result.output)

    default = simulated()
    assert default["server_flags"] == "" and default["async_scheduling"] is None
    fewer = simulated("--max-num-seqs", "2")
    assert fewer["max_num_seqs"] == 2 and fewer["rows"][0]["ttft_p50_ms"] > 2 * default["rows"][0]["ttft_p50_ms"]
    # one request alone: its 4,096-token prompt in four steps of 1,024 instead of one
    whole, chunked = simulated(clients="1"), simulated("--max-num-batched-tokens", "1024", clients="1")
    assert chunked["rows"][0]["ttft_p50_ms"] > whole["rows"][0]["ttft_p50_ms"]
    synchronous = simulated("--no-async-scheduling")
    assert synchronous["server_flags"] == "synchronous scheduling"
    assert synchronous["rows"][0]["ttft_mean_ms"] < default["rows"][0]["ttft_mean_ms"]
    shown = CliRunner().invoke(app, ["plan", "--target", "llama3-8b", "--tp", "1", "--concurrency", "8",
                                     "--max-num-seqs", "2", "--max-num-batched-tokens", "1024"])
    assert "1024 tokens a step, 2 sequences" in " ".join(shown.output.split()), shown.output


def test_what_a_plan_on_a_run_says_of_its_check_on_cpu_replays_is_the_committed_check():
    """A plan on a vLLM run's fitted steps says how far the same simulation was from the CPU replays
    it never saw: the committed full sitting's medians and signs, to the tenth of a per cent; a GPU
    server's run, or an endpoint's, is said to be unchecked."""
    from pathlib import Path

    from specbench.fleet.served import REPLAY_CHECK, replay_check

    table = pd.read_csv(Path(__file__).parents[1] / "benchmarks/cpu-replays/full-sitting/cpu_replays.csv")
    assert REPLAY_CHECK.cells == len(table)
    for metric in ("ttft", "tpot", "e2e"):
        assert getattr(REPLAY_CHECK, f"{metric}_median_abs") == pytest.approx(
            table[f"{metric}_error_calibration"].abs().median(), abs=5e-4)
    signs = table[[f"{m}_sign_right_calibration" for m in ("ttft", "tpot", "e2e")]]
    assert (REPLAY_CHECK.signs_right, REPLAY_CHECK.signs) == (int(signs.sum().sum()), int(signs.notna().sum().sum()))
    # what every sitting's predictions say of a direction, by the predicted effect's size (decided_signs.md)
    from specbench.fleet.served import DIRECTION_BY_EFFECT, direction_note

    text = (Path(__file__).parents[1] / "benchmarks/cpu-replays/decided_signs.md").read_text()
    bands = [tuple(int(n) for n in found) for found in
             re.findall(r"^\| (?:under 10%|10% to 20%|20% or more) \| (\d+) \| (\d+) \|", text, re.M)]
    assert [(band.predictions, band.right) for band in DIRECTION_BY_EFFECT] == bands
    assert direction_note(-0.04).startswith("an effect under 10% had the measured direction in 27 of the CPU "
                                            "replays' 52 predictions")
    assert direction_note(0.15).startswith("an effect 10% to 20% had the measured direction in 8 of")
    assert direction_note(0.4) == ""
    cpu = {"engine": {"name": "vllm"}, "hardware": {"gpus": []}}
    assert replay_check(cpu).startswith("checked on 12 vLLM CPU replays it never saw")
    assert "where the predicted effect was under 10% in 27 of 52, where 20% or more in 86 of 87" in replay_check(cpu)
    assert replay_check({"engine": {"name": "vllm"}, "hardware": {"gpus": ["H100"]}}).startswith(
        "UNCHECKED on a GPU's vLLM servers")
    assert replay_check({"engine": {"name": "endpoint"}}).startswith("UNCHECKED on an endpoint's servers")


def test_what_a_plan_says_of_its_check_on_nvidias_rows_is_the_committed_checks():
    """The line a plan on the tables prints (how far it was from NVIDIA's measured rows on that GPU)
    holds the medians of the committed benchmarks/silicon-rows/silicon.csv, to the tenth of a
    per cent; a GPU or backend with no rows is said to be unchecked."""
    from pathlib import Path

    from specbench.fleet.tables import SILICON_CHECKS, SILICON_CHECKS_BY_TP, silicon_check

    table = pd.read_csv(Path(__file__).parents[1] / "benchmarks" / "silicon-rows" / "silicon.csv")
    done = table[table["not_simulated"].isna() | (table["not_simulated"] == "")]
    assert set(SILICON_CHECKS) == set(done["system"])
    for system, rows in done.groupby("system"):
        check = SILICON_CHECKS[system]
        assert check.rows == len(rows)
        for metric in ("tpot", "ttft"):
            errors = rows[f"sim_{metric}_error"]
            assert getattr(check, f"{metric}_median_abs") == pytest.approx(errors.abs().median(), abs=5e-4)
            assert getattr(check, f"{metric}_median") == pytest.approx(errors.median(), abs=5e-4)
    assert set(SILICON_CHECKS_BY_TP) == set(done.groupby(["system", "tp"]).groups)
    for (system, tp), rows in done.groupby(["system", "tp"]):
        check = SILICON_CHECKS_BY_TP[(system, tp)]
        assert check.rows == len(rows)
        for metric in ("tpot", "ttft"):
            errors = rows[f"sim_{metric}_error"]
            assert getattr(check, f"{metric}_median_abs") == pytest.approx(errors.abs().median(), abs=5e-4)
            assert getattr(check, f"{metric}_median") == pytest.approx(errors.median(), abs=5e-4)
    assert silicon_check("h200_sxm").startswith("checked on 81 of NVIDIA's measured vLLM rows on h200_sxm")
    assert silicon_check("b200_sxm", tps=(4, 8, 16)).endswith(
        "; at TP4: TPOT 5.9% (-2.0%), TTFT 22.1% (-22.1%) (30 rows), TP8: TPOT 9.3% (+2.9%), TTFT 27.2% (-27.2%) "
        "(30 rows), TP16: unchecked (0 rows)")
    assert silicon_check("h100_sxm", tps=(1,)).endswith("; at TP1: unchecked (1 row)")
    assert silicon_check("a100_sxm").startswith("UNCHECKED on a100_sxm's vllm tables")
    assert silicon_check("h100_sxm", "trtllm").startswith("UNCHECKED")


def test_nvidias_measured_h100_rows_are_simulated_as_their_benchmark_ran_them():
    """NVIDIA's 15 measured vLLM rows of Llama-3.1-70B fp8 at TP4 on H100 (1k/1k, 1k/8k, 8k/1k at
    4-64 clients), nothing fitted to them: with the clients as InferenceMAX's benchmark runs them, on
    the server as its launch script configured it (an fp8 KV cache, 8192 tokens a step, as many
    sequences as clients, async scheduling, vLLM 0.10's admission), the simulated mean TTFT and TPOT
    are within 15 % and 12 % (median; 6.0 % and 9.7 % when written, 8 % and 9.6 % before async
    scheduling was modelled); with the clients started apart (a steady state) TTFT is well below what
    the benchmark measured (-22 % median)."""
    import csv
    import dataclasses

    from specbench.fit import kernel_tables
    from specbench.fleet.plan import INFERENCEMAX, STEADY, closed_loop
    from specbench.fleet.tables import replica_spec, step_cost

    with open(kernel_tables.silicon_rows_path()) as handle:
        rows = [row for row in csv.DictReader(handle) if row["backend"] == "vllm" and row["mode"] == "agg"
                and row["model_path"] == "meta-llama/Llama-3.1-70B" and row["system"] == "h100_sxm"
                and row["tp_size"] == "4"]
    assert len(rows) == 15
    config = kernel_tables.shipped_model_config("meta-llama/Meta-Llama-3.1-70B")
    forward = kernel_tables.Forward(config, "h100_sxm", "vllm", 4, name="llama-3.1-70b", gemm_quant="fp8",
                                    kv_quant="fp8")
    errors = {"ttft": [], "tpot": [], "steady_ttft": []}
    for row in rows:
        isl, osl, clients = int(row["isl"]), int(row["osl"]), int(row["batch_size"])
        spec = dataclasses.replace(replica_spec(config, "h100_sxm", 4, "fp8", kv_cache_dtype="fp8"),
                                   max_num_batched_tokens=8192, max_num_seqs=clients, reserve_full_input=False)
        cost = step_cost(forward, isl, osl, async_scheduling=spec.async_scheduling)
        out, keep = closed_loop(cost, spec, clients, isl, osl, clients=INFERENCEMAX)
        errors["ttft"].append(np.mean(out.ttft_s[keep]) * 1e3 / float(row["silicon_ttft_ms"]) - 1)
        errors["tpot"].append(np.nanmean(out.tpot_s[keep]) * 1e3 / float(row["silicon_tpot_ms"]) - 1)
        out, keep = closed_loop(cost, spec, clients, isl, osl, clients=STEADY)
        errors["steady_ttft"].append(np.mean(out.ttft_s[keep]) * 1e3 / float(row["silicon_ttft_ms"]) - 1)
    assert np.median(np.abs(errors["ttft"])) < 0.15, errors["ttft"]
    assert np.median(np.abs(errors["tpot"])) < 0.12, errors["tpot"]
    assert np.median(errors["steady_ttft"]) < -0.15, errors["steady_ttft"]


def test_the_hosts_step_time_is_added_when_scheduling_synchronously_and_overlapped_when_async():
    """The kernel tables hold GPU time; vLLM's host schedules, prepares and books each step beside it
    (async scheduling) or before it (synchronous): the longer of the two, or their sum."""
    from specbench.fit import kernel_tables
    from specbench.fit.host_cost import VLLM_HOST_STEP, HostCost
    from specbench.fleet.tables import step_cost

    config = kernel_tables.shipped_model_config("meta-llama/Meta-Llama-3.1-8B")
    forward = kernel_tables.Forward(config, "h200_sxm", "vllm", 1, name="llama-3.1-8b")
    kernels = step_cost(forward, 1024, 128, async_scheduling=False, host=None, launch=None)
    synchronous = step_cost(forward, 1024, 128, async_scheduling=False, launch=None)
    overlapped = step_cost(forward, 1024, 128, async_scheduling=True, launch=None)
    for prefill, rows in ((0, 1), (0, 64), (2048, 30), (1500, 0)):
        prompts = -(-prefill // 1024)
        host_s = VLLM_HOST_STEP.ms(rows + prompts, prompts, prefill) / 1e3
        assert at(synchronous, prefill, rows) == pytest.approx(at(kernels, prefill, rows) + host_s, rel=1e-9)
        assert at(overlapped, prefill, rows) == pytest.approx(max(at(kernels, prefill, rows), host_s), rel=1e-9)
    slow_host = HostCost(intercept_ms=50.0, per_running_row_ms=0, per_new_request_ms=0, per_prompt_token_ms=0)
    assert at(step_cost(forward, 1024, 128, async_scheduling=True, host=slow_host), 0, 8) == pytest.approx(0.05)


def test_a_chunk_after_cached_tokens_pays_the_tables_attention_over_them():
    """On the kernel tables a prompt chunk is a share of a fresh prompt's prefill; one that attends
    over tokens before it (an earlier chunk, a prefix found cached) adds what the tables' prefill
    after that many cached tokens costs beyond the same chunk fresh, more the longer the context."""
    from specbench.fit import kernel_tables
    from specbench.fleet.tables import step_cost

    config = kernel_tables.shipped_model_config("meta-llama/Meta-Llama-3.1-8B")
    forward = kernel_tables.Forward(config, "h200_sxm", "vllm", 1, name="llama-3.1-8b")
    engine = forward._engine
    over = forward.over_context_ms(2048, 6144)
    assert over == pytest.approx(engine.predict_prefill_latency(1, 8192, 6144) - engine.predict_prefill_latency(1, 2048, 0))
    assert 0 < forward.over_context_ms(2048, 2048) < over < forward.over_context_ms(2048, 14336)
    assert forward.over_context_ms(2048, 0) == 0
    cost = step_cost(forward, 8192, 256, async_scheduling=False, host=None, launch=None, piecewise_layer_ms=0)
    assert at(cost, 2048, 16, prefill_chunks=((2048, 6144),)) == pytest.approx(at(cost, 2048, 16) + over / 1e3)
    two = at(cost, 2048 + 1024, 16, prefill_chunks=((2048, 6144), (1024, 512)))
    assert two == pytest.approx(at(cost, 3072, 16) + (over + forward.over_context_ms(1024, 512)) / 1e3)


def test_a_step_outside_cuda_graphs_takes_at_least_the_hosts_kernel_launches():
    """vLLM replays CUDA graphs for steps of up to 512 tokens (and, under FULL_DECODE_ONLY, for
    decode-only steps alone); any other step launches its compiled kernels from the host, layer by
    layer, and takes at least that long however fast the GPU. TP does not shorten it."""
    from specbench.fit import kernel_tables
    from specbench.fit.host_cost import COMPILED_LAUNCH
    from specbench.fleet.tables import ServerFlags, step_cost

    config = kernel_tables.shipped_model_config("meta-llama/Meta-Llama-3.1-8B")
    forward = kernel_tables.Forward(config, "h200_sxm", "vllm", 1, name="llama-3.1-8b")
    kernels = step_cost(forward, 1024, 128, async_scheduling=True, host=None, launch=None)
    graphed = step_cost(forward, 1024, 128, async_scheduling=True, host=None)
    decode_only = step_cost(forward, 1024, 128, async_scheduling=True, host=None, cudagraph_mode="FULL_DECODE_ONLY")
    floor_s = COMPILED_LAUNCH.ms(32, 1) / 1e3
    for step in ((0, 1), (0, 64), (256, 8), (0, 512), (0, 100, 3)):  # up to 512 tokens: the kernels alone
        assert at(graphed, *step) == at(kernels, *step), step
    for step in ((600, 0), (2048, 30), (0, 200, 3)):  # over 512 (a verify: rows · (K + 1)): the floor
        assert at(graphed, *step) == pytest.approx(max(at(kernels, *step), floor_s), rel=1e-9), step
    assert at(graphed, 600, 0) > at(kernels, 600, 0)  # the floor binds somewhere: an 8B's 600-token prefill on an H200
    assert at(decode_only, 100, 8) == pytest.approx(max(at(kernels, 100, 8), floor_s))  # a small prefill: no graph there
    assert at(decode_only, 100, 8) > at(graphed, 100, 8) == at(kernels, 100, 8)
    assert at(decode_only, 0, 64) == at(kernels, 0, 64)
    assert COMPILED_LAUNCH.ms(80, 8) == COMPILED_LAUNCH.ms(80, 2) > COMPILED_LAUNCH.ms(80, 1)
    with pytest.raises(ValueError, match="cudagraph_mode"):
        step_cost(forward, 1024, 128, async_scheduling=True, cudagraph_mode="sometimes")
    with pytest.raises(ValueError, match="cudagraph_mode"):
        ServerFlags(cudagraph_mode="sometimes")


def test_a_draft_model_prefills_every_prompt_chunk_and_its_launches_add_to_the_targets():
    """vLLM runs a draft model over every prompt chunk a step carries (its own KV cache, and its
    proposals from the prompt's last token): the chunk costs the target's and the draft's prefill.
    A decode row's first draft forward runs over the K + 1 tokens the target verified and one slot
    more (vLLM's DraftModelProposer), its other forwards over one.
    Outside CUDA graphs the host launches both models' layers; decode steps are unchanged."""
    from specbench.fit import kernel_tables
    from specbench.fit.host_cost import COMPILED_LAUNCH
    from specbench.fit.table_plan import model_config
    from specbench.fleet.tables import step_cost

    target = kernel_tables.Forward(kernel_tables.shipped_model_config("meta-llama/Meta-Llama-3.1-8B"), "h200_sxm",
                                   "vllm", 1, name="llama-3.1-8b")
    draft = kernel_tables.Forward(model_config("llama3.2-1b")[1], "h200_sxm", "vllm", 1, name="llama-3.2-1b")
    alone = step_cost(target, 1024, 128, async_scheduling=True, host=None, launch=None, piecewise_layer_ms=0)
    with_draft = step_cost(target, 1024, 128, draft, async_scheduling=True, host=None, launch=None,
                           piecewise_layer_ms=0)
    chunk_s = draft.mixed_ms(300, 0, 1024, 128) / 1e3
    assert at(with_draft, 300, 0) == pytest.approx(at(alone, 300, 0) + chunk_s, rel=1e-9)
    context = 1024 + 128 // 2
    # K decodes, and what the first forward's K + 2 positions a row add (the verified tokens and a slot)
    drafting_s = {(rows, k): (k * draft.mixed_ms(0, rows, 1024, 128) + draft.extra_positions_ms(rows, context, k + 2)) / 1e3
                  for rows, k in ((4, 2), (8, 3))}
    assert draft.extra_positions_ms(8, context, 5) > 0
    assert at(with_draft, 300, 4, 2) == pytest.approx(at(alone, 300, 4, 2) + chunk_s + drafting_s[4, 2], rel=1e-9)
    assert at(with_draft, 0, 8, 3) - at(alone, 0, 8, 3) == pytest.approx(drafting_s[8, 3], rel=1e-9)
    floored = step_cost(target, 1024, 128, draft, async_scheduling=True, host=None, cudagraph_mode="FULL_DECODE_ONLY",
                        piecewise_layer_ms=0)
    both_s = (COMPILED_LAUNCH.ms(target.layers, 1) + COMPILED_LAUNCH.ms(draft.layers, 1)) / 1e3
    assert draft.layers == 16 and target.layers == 32
    assert at(floored, 100, 0) == pytest.approx(max(at(with_draft, 100, 0), both_s), rel=1e-9)


def test_a_step_replayed_as_graph_pieces_costs_a_little_more_a_layer():
    """Under PIECEWISE (vLLM's default until 0.11) every graphed step calls each layer's attention
    between two graph pieces; under FULL_AND_PIECEWISE only a step that carries a prefill does (a
    decode-only step, a verify too, replays one graph). Each layer of each forward such a step runs
    adds PIECEWISE_LAYER_MS; a step outside graphs (over 512 tokens) pays the launch floor instead."""
    from specbench.fit import kernel_tables
    from specbench.fit.host_cost import PIECEWISE_LAYER_MS
    from specbench.fit.table_plan import model_config
    from specbench.fleet.tables import step_cost

    target = kernel_tables.Forward(kernel_tables.shipped_model_config("meta-llama/Meta-Llama-3.1-8B"), "h200_sxm",
                                   "vllm", 1, name="llama-3.1-8b")
    draft = kernel_tables.Forward(model_config("llama3.2-1b")[1], "h200_sxm", "vllm", 1, name="llama-3.2-1b")

    def priced(mode: str, pieces_ms: float = PIECEWISE_LAYER_MS, with_draft=None):
        return step_cost(target, 1024, 128, with_draft, async_scheduling=True, host=None, launch=None,
                         cudagraph_mode=mode, piecewise_layer_ms=pieces_ms)

    graphs = priced("FULL", 0.0)
    layers_s = 32 * PIECEWISE_LAYER_MS / 1e3
    for step in ((0, 1), (0, 64), (0, 100, 3), (256, 8), (300, 0)):
        assert at(priced("PIECEWISE"), *step) == pytest.approx(at(graphs, *step) + layers_s, rel=1e-9), step
        assert at(priced("FULL"), *step) == at(graphs, *step), step
    assert at(priced("FULL_AND_PIECEWISE"), 0, 64) == at(graphs, 0, 64)  # decode-only: one full graph
    assert at(priced("FULL_AND_PIECEWISE"), 0, 100, 3) == at(graphs, 0, 100, 3)  # a verify too
    assert at(priced("FULL_AND_PIECEWISE"), 256, 8) == pytest.approx(at(graphs, 256, 8) + layers_s, rel=1e-9)
    assert at(priced("FULL_DECODE_ONLY"), 256, 8) == at(graphs, 256, 8)  # outside graphs: the launch floor's case
    for step in ((600, 0), (0, 200, 3)):  # over 512 tokens: no graph, no pieces
        assert at(priced("PIECEWISE"), *step) == at(graphs, *step), step
    # a draft model's forwards in a piecewise step: its prefill of the chunk and its K decodes
    draft_graphs = priced("FULL", 0.0, draft)
    assert at(priced("PIECEWISE", with_draft=draft), 0, 8, 3) == pytest.approx(
        at(draft_graphs, 0, 8, 3) + (32 + 3 * 16) * PIECEWISE_LAYER_MS / 1e3, rel=1e-9)
    assert at(priced("PIECEWISE", with_draft=draft), 100, 8, 3) == pytest.approx(
        at(draft_graphs, 100, 8, 3) + (32 + 4 * 16) * PIECEWISE_LAYER_MS / 1e3, rel=1e-9)


def test_the_piecewise_cost_is_the_one_its_benchmark_measured():
    """`PIECEWISE_LAYER_MS` is not typed in: the median, per decoder layer, of piecewise_decode.py's
    piecewise step less its one-graph step on two H100s and an H200, over every real-width cell."""
    from specbench.fit.host_cost import PIECEWISE_LAYER_MS

    gpu = Path(__file__).parents[1] / "benchmarks" / "gpu"
    cells = [json.loads(line) for day in ("h100-2026-11-27", "h200-2026-11-28")
             for path in sorted((gpu / day / "piecewise").glob("piecewise_decode*.jsonl"))
             for line in path.read_text().splitlines()]
    extra = [(c["piecewise_ms"] - c["full_ms"]) / c["layers"] for c in cells
             if c.get("width") == "real" and "error" not in c]
    assert len(extra) == 67
    assert PIECEWISE_LAYER_MS == pytest.approx(np.median(extra), rel=0.005)


def test_the_launch_cost_is_the_one_its_benchmark_measured():
    """`COMPILED_LAUNCH` is not typed in: the medians of launch_host.py's compiled forwards on an H100
    server, per layer, over token counts up to 1,024 (TP1: Llama-3-8B; TP > 1: Llama-3-70B at TP8
    and Qwen3-32B at TP2 together)."""
    from specbench.fit.host_cost import COMPILED_LAUNCH

    path = Path(__file__).parents[1] / "benchmarks" / "gpu" / "h100-2026-11-27" / "launch_host.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    per_layer = [(r["tp"], r["host_ms"] / r["layers"]) for r in rows
                 if r.get("mode") == "compiled" and "error" not in r and r["tokens"] <= 1024]
    assert COMPILED_LAUNCH.per_layer_ms == pytest.approx(np.median([ms for tp, ms in per_layer if tp == 1]), rel=0.005)
    assert COMPILED_LAUNCH.per_layer_tp_ms == pytest.approx(np.median([ms for tp, ms in per_layer if tp > 1]), rel=0.005)


def test_the_host_step_cost_is_the_one_its_benchmark_measured():
    """`VLLM_HOST_STEP` is not typed in: it is host_step.py's fit, committed as host_step.json."""
    from specbench.fit.host_cost import VLLM_HOST_STEP

    measured = json.loads((Path(__file__).parents[1] / "benchmarks" / "host-costs" / "host_step.json").read_text())
    for field in ("intercept_ms", "per_running_row_ms", "per_new_request_ms", "per_prompt_token_ms"):
        assert getattr(VLLM_HOST_STEP, field) == pytest.approx(measured[field], rel=0.005), field


def test_the_api_servers_cost_is_the_one_its_benchmark_measured_and_every_table_replica_has_it():
    """`VLLM_API_SERVER_REQUEST` is api_server.py's fit (api_server.json): a client's TTFT less the
    engine core's own time. A replica on the kernel tables adds it to each request's TTFT and E2E
    (its prompt's share too), and its engine's steps do not move."""
    from specbench.fit import kernel_tables
    from specbench.fit.host_cost import VLLM_API_SERVER_REQUEST
    from specbench.fleet.tables import replica_spec, step_cost

    measured = json.loads((Path(__file__).parents[1] / "benchmarks" / "host-costs" / "api_server.json").read_text())
    for field in ("intercept_ms", "per_prompt_token_ms"):
        assert getattr(VLLM_API_SERVER_REQUEST, field) == pytest.approx(measured[field], rel=0.005), field
    assert measured["requests"] >= 30 and measured["rms_residual_ms"] < 2
    config = kernel_tables.shipped_model_config("meta-llama/Meta-Llama-3.1-8B")
    forward = kernel_tables.Forward(config, "h200_sxm", "vllm", 1, name="llama-3.1-8b")
    cost = step_cost(forward, 1024, 64, async_scheduling=True)
    served, bare = replica_spec(config, "h200_sxm", 1), replica_spec(config, "h200_sxm", 1, api_server=None)
    prompts, outputs, arrivals = [100, 4000], [64, 64], [0.0, 30.0]
    with_api = simulate(prompts, outputs, cost, served, arrivals_s=arrivals)
    without = simulate(prompts, outputs, cost, bare, arrivals_s=arrivals)
    np.testing.assert_allclose(with_api.first_token_s, without.first_token_s)
    np.testing.assert_allclose(with_api.ttft_s - without.ttft_s,
                               [VLLM_API_SERVER_REQUEST.ms(100) / 1e3, VLLM_API_SERVER_REQUEST.ms(4000) / 1e3])


def test_the_ngram_host_cost_is_the_one_its_benchmark_measured():
    """`NGRAM_HOST_STEP` is not typed in: it is host_step.py --speculative ngram's fit, committed as
    host_step-ngram.json, from at least two sittings whose differences agree."""
    from specbench.fit.host_cost import NGRAM_HOST_STEP

    measured = json.loads((Path(__file__).parents[1] / "benchmarks" / "host-costs"
                           / "host_step-ngram.json").read_text())
    for field in ("intercept_ms", "per_row_ms", "per_context_token_ms"):
        assert getattr(NGRAM_HOST_STEP, field) == pytest.approx(measured[field], rel=0.005), field
    assert measured["sittings"] >= 2 and measured["rms_residual_ms"] < 0.3


def test_the_executor_cost_is_the_one_its_benchmark_measured_and_comes_with_tp():
    """`MULTIPROC_EXECUTOR_STEP` is host_step.py --executor mp's fit (host_step-executor.json). A
    step at TP > 1 (vLLM's model runners in worker processes) takes it with the host's time; at TP1
    (the runner in the engine core's process) it does not."""
    from specbench.fit import kernel_tables
    from specbench.fit.host_cost import MULTIPROC_EXECUTOR_STEP
    from specbench.fleet.tables import step_cost

    measured = json.loads((Path(__file__).parents[1] / "benchmarks" / "host-costs"
                           / "host_step-executor.json").read_text())
    for field in ("intercept_ms", "per_running_row_ms", "per_new_request_ms", "per_prompt_token_ms"):
        assert getattr(MULTIPROC_EXECUTOR_STEP, field) == pytest.approx(measured[field], rel=0.005), field
    assert measured["sittings"] >= 2
    config = kernel_tables.shipped_model_config("meta-llama/Meta-Llama-3.1-70B")
    for tp, added in ((4, True), (1, False)):
        forward = kernel_tables.Forward(config, "h200_sxm", "vllm", tp)
        with_it = step_cost(forward, 1024, 256, async_scheduling=False, launch=None)
        without = step_cost(forward, 1024, 256, async_scheduling=False, launch=None, executor=None)
        for prefill, rows in ((0, 16), (1024, 8)):
            prompts = 1 if prefill else 0
            expected = MULTIPROC_EXECUTOR_STEP.ms(rows + prompts, prompts, prefill) if added else 0.0
            assert (at(with_it, prefill, rows) - at(without, prefill, rows)) * 1e3 == pytest.approx(expected)


def test_an_ngram_step_adds_its_measured_host_time_after_the_kernels():
    """n-gram drafting schedules synchronously: a speculative step of R decoding rows takes the
    baseline's host time and speculation's own (NGRAM_HOST_STEP at the rows' mean context) after
    its kernels; a draft model's step (async) and the baseline's do not take speculation's."""
    from specbench.fit import kernel_tables
    from specbench.fit.host_cost import MULTIPROC_EXECUTOR_STEP, NGRAM_HOST_STEP, VLLM_HOST_STEP
    from specbench.fleet.tables import step_cost

    config = kernel_tables.shipped_model_config("meta-llama/Meta-Llama-3.1-70B")
    forward = kernel_tables.Forward(config, "h100_sxm", "vllm", 4)
    isl, osl, rows, k = 1024, 256, 32, 2
    with_host = step_cost(forward, isl, osl, async_scheduling=False, draft_kind="ngram", launch=None)
    without = step_cost(forward, isl, osl, async_scheduling=False, draft_kind="ngram", launch=None,
                        speculation_host=None)
    kernels_only = step_cost(forward, isl, osl, async_scheduling=False, draft_kind="ngram", launch=None, host=None)
    context = isl + osl // 2
    assert (at(with_host, 0, rows, k) - at(without, 0, rows, k)) * 1e3 == pytest.approx(NGRAM_HOST_STEP.ms(rows, context))
    assert (at(without, 0, rows, k) - at(kernels_only, 0, rows, k)) * 1e3 == pytest.approx(
        VLLM_HOST_STEP.ms(rows) + MULTIPROC_EXECUTOR_STEP.ms(rows))  # TP4: worker processes
    assert at(with_host, 0, rows, 0) == at(without, 0, rows, 0)  # no drafts, no speculation's host work
    model = step_cost(forward, isl, osl, forward, async_scheduling=True, launch=None)
    model_without = step_cost(forward, isl, osl, forward, async_scheduling=True, launch=None, speculation_host=None)
    assert at(model, 0, rows, k) == at(model_without, 0, rows, k)


def test_an_fp8_kv_cache_holds_twice_the_tokens_and_is_priced_as_the_tables_read_it():
    """vLLM's --kv-cache-dtype fp8 halves every token's K and V: the same memory holds twice the
    tokens, and the tables' decode attention reads half the bytes (cheaper at long contexts)."""
    from specbench.fit import kernel_tables
    from specbench.fleet.tables import replica_spec

    config = kernel_tables.shipped_model_config("meta-llama/Meta-Llama-3.1-70B")
    half, full = (replica_spec(config, "h100_sxm", 4, "fp8", kv_cache_dtype=d).kv_capacity_tokens
                  for d in ("auto", "fp8"))
    assert abs(full - 2 * half) <= 2, (half, full)
    with pytest.raises(ValueError, match="kv_cache_dtype 'fp4'"):
        replica_spec(config, "h100_sxm", 4, "fp8", kv_cache_dtype="fp4")
    bf16, fp8 = (kernel_tables.Forward(config, "h100_sxm", "vllm", 4, gemm_quant="fp8", kv_quant=q)
                 for q in (None, "fp8"))
    assert fp8.decode_ms(64, 8192) < bf16.decode_ms(64, 8192)


def test_the_fleet_plan_keeps_vllms_draft_tp_rule():
    """--draft-tp is 1 or the target's TP, as the table plan checks it (one check serves both)."""
    from typer.testing import CliRunner

    from specbench.cli import app

    result = CliRunner().invoke(app, ["plan", "--target", "llama3-70b", "--tp", "4", "--draft-tp", "2", "--concurrency",
                                      "4", "--alpha", "0.7"])
    assert result.exit_code == 2 and "--draft-tp must be 1 or the target's TP" in result.output, result.output


# --- several replicas behind a router, and the fewest that meet an SLO ---------------------------

def one_second_steps(prefill_tokens: int, decode_rows: int, k: int = 0) -> float:
    return 1.0


ONE_AT_A_TIME = ReplicaSpec(max_num_seqs=1, max_num_batched_tokens=64, kv_capacity_tokens=4096)


def test_round_robin_gives_each_replica_every_nth_request_as_one_replica_would_serve_them():
    from specbench.fleet.router import simulate_fleet

    rng = np.random.default_rng(3)
    arrivals = np.sort(rng.uniform(0, 100, 60))
    prompts, outputs = rng.integers(1, 40, 60), rng.integers(1, 30, 60)
    cost, spec = linear_cost(), ReplicaSpec(max_num_seqs=4, max_num_batched_tokens=32)
    fleet = simulate_fleet(prompts, outputs, arrivals, cost, spec, 3, "round-robin")
    assert (fleet.replica_of == np.arange(60) % 3).all()
    for n in range(3):
        alone = simulate(prompts[n::3], outputs[n::3], cost, spec, arrivals_s=arrivals[n::3])
        assert np.allclose(fleet.outcome.finish_s[n::3], alone.finish_s)
        assert np.allclose(fleet.outcome.first_token_s[n::3], alone.first_token_s)


def test_least_outstanding_sends_to_the_idle_replica_where_round_robin_queues():
    """Request 0 holds replica 0 for 10 s; requests 1 and 2 are short. Least-outstanding sends
    both to replica 1 (request 1 has finished by the time 2 arrives); round-robin queues request 2
    behind request 0."""
    from specbench.fleet.router import simulate_fleet

    arrivals, prompts, outputs = np.array([0.0, 1.0, 3.0]), np.array([1, 1, 1]), np.array([10, 1, 1])
    least = simulate_fleet(prompts, outputs, arrivals, one_second_steps, ONE_AT_A_TIME, 2)
    assert least.replica_of.tolist() == [0, 1, 1]
    assert least.outcome.ttft_s.tolist() == [1.0, 1.0, 1.0]
    turns = simulate_fleet(prompts, outputs, arrivals, one_second_steps, ONE_AT_A_TIME, 2, "round-robin")
    assert turns.replica_of.tolist() == [0, 1, 0]
    assert turns.outcome.ttft_s[2] == 10.0 - 3.0 + 1.0  # waits for request 0's tenth step to end


def test_a_hopeless_fleet_is_stopped_early_and_misses():
    from specbench.fleet.sizing import Objective, Traffic, fleet_at, judged

    count = 2000
    traffic = Traffic("steady", np.arange(count) * 0.5, np.ones(count, int), np.ones(count, int))
    objective = Objective((("ttft", 1.5),), 99)
    watched = fleet_at(traffic, 1.0, one_second_steps, ONE_AT_A_TIME, 1, None, "least-outstanding", objective)
    assert watched.stopped and not judged(watched, objective)["meets_slo"]
    assert np.isnan(watched.outcome.finish_s).sum() > count / 2  # most never simulated
    everything = fleet_at(traffic, 1.0, one_second_steps, ONE_AT_A_TIME, 1, None, "least-outstanding")
    assert not everything.stopped and everything.outcome.ttft_s.max() > 400  # the queue grows all hour


@pytest.mark.parametrize("router", ["least-outstanding", "round-robin"])
def test_the_fewest_replicas_meet_the_slo_with_the_headroom_asked(router):
    """One request at a time, 1 s each, arriving every 0.5 s: 2 replicas keep up exactly (TTFT 1 s
    each); with 20 % headroom the SLO must hold at 2.4 requests/s, which 2 cannot serve: 3."""
    from specbench.fleet.sizing import Objective, Traffic, fewest_replicas, fleet_at, judged

    count = 400
    traffic = Traffic("steady", np.arange(count) * 0.5, np.ones(count, int), np.ones(count, int))
    objective = Objective((("ttft", 1.5),), 99)
    assert fewest_replicas(traffic, 1.0, one_second_steps, ONE_AT_A_TIME, None, objective, router, 0.0) == 2
    assert fewest_replicas(traffic, 1.0, one_second_steps, ONE_AT_A_TIME, None, objective, router, 0.2) == 3
    assert fewest_replicas(traffic, 2.0, one_second_steps, ONE_AT_A_TIME, None, objective, router, 0.0) == 4
    two = judged(fleet_at(traffic, 1.0, one_second_steps, ONE_AT_A_TIME, 2, None, router), objective)
    assert two["meets_slo"] and two["ttft_p99_ms"] == pytest.approx(1000) and two["good_share"] == 1.0
    assert fewest_replicas(traffic, 1.0, one_second_steps, ONE_AT_A_TIME, None, objective, router, 0.0, most=1) \
        is None


def test_a_traffic_scaled_into_a_burst_is_sized_but_called_a_burst():
    """400 requests 0.5 s apart, 1 s each, one at a time: at 1× they span 199.5 s, a rate 2 replicas
    keep up with (3 with 20 % headroom). At 100× they span 2 s: 200 requests a second that a handful
    of replicas absorb in their queues within a 15 s TTFT bound and then sit idle, which says nothing
    of serving 200 a second. The row is sized, and the answer calls it a burst."""
    from specbench.fleet.plan import answer
    from specbench.fleet.sizing import Configuration, Objective, Traffic, size_fleets

    count = 400
    traffic = Traffic("steady", np.arange(count) * 0.5, np.ones(count, int), np.ones(count, int))
    found = [Configuration(1, "autoregressive", 0, "", one_second_steps, ONE_AT_A_TIME, None)]
    objective = Objective((("ttft", 15.0),), 99)
    table = size_fleets(found, traffic, [1.0, 100.0], objective, 0.2, "least-outstanding", workers=1)
    steady, burst = table.iloc[0], table.iloc[1]
    assert steady["span_s"] == pytest.approx(199.5) and not steady["burst"] and steady["replicas"] == 3
    # a rate of 200 a second needs 240 one-second servers with the headroom; the burst is met by far fewer
    assert burst["span_s"] == pytest.approx(1.995) and burst["burst"] and burst["replicas"] < 100
    said = [answer(table[table["scale"] == scale], "steady", "m", "CPU", "p99 TTFT ≤ 15 s", 0.2)
            for scale in (1.0, 100.0)]
    assert "BURST" not in said[0]
    assert "a BURST, not a rate: at 100× the traffic lasts 2 s, under 10 times" in said[1]


def test_speculation_through_a_fleet_keeps_tau_tokens_a_step():
    from specbench.fleet.router import simulate_fleet

    count = 40
    arrivals = np.arange(count) * 50.0  # each request alone on its replica
    speculation = Speculation(3, (0.7, 0.49, 0.343))
    fleet = simulate_fleet(np.full(count, 4), np.full(count, 301), arrivals, one_second_steps, ReplicaSpec(), 2,
                           speculation=speculation)
    tau = 1 + 0.7 + 0.49 + 0.343
    steps_per_request = (fleet.outcome.finish_s - fleet.outcome.first_token_s).mean()
    assert steps_per_request == pytest.approx(300 / tau, rel=0.05)



def test_one_draw_a_row_step_accepts_a_prefix_of_the_drafts():
    """P(position i accepted) = 0.8, 0.6, 0.4 and 2 tokens left after the prefill's: the first decode
    step finishes the request when it accepts one draft at least, P = 0.8 (drafts accepted as a
    prefix), so 1.2 decode steps a request on average; position by position independently it would
    be 1 - 0.2 × 0.4 × 0.6 = 0.952 and 1.048 steps."""
    out = simulate(np.full(3000, 10), np.full(3000, 3), linear_cost(), ReplicaSpec(), concurrency=1,
                   speculation=Speculation(3, (0.8, 0.6, 0.4), seed=2))
    assert (out.steps - 3000) / 3000 == pytest.approx(1.2, abs=0.03)


@pytest.mark.parametrize("rows,steps", [(3, 5), (40, 30)])
def test_a_stretch_counts_the_same_tokens_in_python_and_in_numpy(rows, steps):
    """Few row-steps are added up in plain Python, many with numpy: the same uniforms, the same stretch."""
    from specbench.fleet.acceptance_draws import AcceptanceDraws

    rng = np.random.default_rng(rows)
    for k in (1, 3):
        python, vectorised = AcceptanceDraws((0.7, 0.5, 0.3), 5), AcceptanceDraws((0.7, 0.5, 0.3), 5)
        python.PYTHON_MOST, vectorised.PYTHON_MOST = 10 ** 9, 0
        for _ in range(20):
            left = rng.integers(1, 60, rows).tolist()
            asked = min(steps, *left)  # (the replica asks no more steps than a row has tokens left)
            ran, totals, first = python.stretch(k, left, asked)
            assert (ran, totals, first) == vectorised.stretch(k, left, asked)
            assert 1 <= ran <= asked and all(1 <= t <= 1 + k for t in first)
            assert ran == asked or any(t >= n for t, n in zip(totals, left))


def test_configurations_sized_on_two_processes_give_the_one_process_table():
    """`size_fleets` forks a worker a core (the step prices are closures pickle cannot carry); each
    simulation draws from its own seeds, so the table is the same on one process and on two."""
    from specbench.fleet.sizing import Configuration, Objective, Traffic, size_fleets

    rng = np.random.default_rng(4)
    count = 300
    traffic = Traffic("poisson", np.cumsum(rng.exponential(0.02, count)), rng.integers(50, 400, count),
                      rng.integers(20, 200, count))
    cost = linear_cost(per_step=0.004)
    found = [Configuration(1, "none", 0, "", cost, ReplicaSpec(max_num_seqs=16), None),
             *(Configuration(1, "draft", k, "α 0.7", cost, ReplicaSpec(max_num_seqs=16),
                             Speculation(k, (0.7, 0.49, 0.34)[:k], seed=k)) for k in (1, 3))]
    objective = Objective((("ttft", 0.5), ("tpot", 0.02)), 90)
    alone = size_fleets(found, traffic, [1.0, 2.0], objective, 0.1, "least-outstanding", workers=1)
    side_by_side = size_fleets(found, traffic, [1.0, 2.0], objective, 0.1, "least-outstanding", workers=2)
    pd.testing.assert_frame_equal(alone, side_by_side)
    assert list(alone["scale"]) == [1.0] * 3 + [2.0] * 3 and (alone["replicas"] >= 1).all()



def _fails_on_three(n: int) -> int:
    if n == 3:
        raise ValueError("request 3 needs more KV cache than the replica has")
    return n * n


def test_a_worker_s_error_reaches_the_caller():
    from specbench.fleet.workers import in_processes

    assert in_processes(_fails_on_three, [0, 1, 2], workers=2) == [0, 1, 4]
    with pytest.raises(ValueError, match="request 3 needs more KV cache"):
        in_processes(_fails_on_three, [1, 2, 3, 4], workers=2)


def test_a_stop_signal_a_worker_gets_before_its_initializer_is_not_caught_by_the_parents_handler(
        tmp_path, monkeypatch):
    """A fork copies the parent's Python handlers: a SIGTERM that Pool.terminate sends a worker that
    has not yet run its initializer was caught by the copy and lost, and the worker then waited on
    a lock the terminating parent held, for ever (a CI run hung so). The stop signals are held from
    the fork to the initializer, so such a SIGTERM ends the worker as the initializer sets it: here a
    worker sends itself one before its initializer, the parent's handler never runs in it, the
    worker ends, and the pool, replacing it, still returns every result."""
    import os
    import signal

    from specbench.fleet import workers

    parent = os.getpid()

    def parents_handler(signum, frame):  # what the CLI's on_stop_signal is to a forked worker
        if os.getpid() != parent:
            (tmp_path / f"caught-in-{os.getpid()}").write_text("")

    initializer = workers._worker_signals

    def signalled_first():
        try:  # the first worker alone: the one the pool starts in its place runs as usual
            os.close(os.open(tmp_path / "signalled", os.O_CREAT | os.O_EXCL))
            os.kill(os.getpid(), signal.SIGTERM)
        except FileExistsError:
            pass
        initializer()

    previous = signal.signal(signal.SIGTERM, parents_handler)
    monkeypatch.setattr(workers, "_worker_signals", signalled_first)
    try:
        assert workers.in_processes(_fails_on_three, [0, 1, 2], workers=2) == [0, 1, 4]
        assert signal.SIGTERM not in signal.pthread_sigmask(signal.SIG_BLOCK, set())  # the parent's mask restored
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert (tmp_path / "signalled").exists() and not list(tmp_path.glob("caught-in-*"))


def test_a_worker_outlives_the_thread_that_forked_it_while_its_parent_process_runs(monkeypatch):
    """The pool forks the workers that replace dead ones from its worker-handler thread, which ends
    as the pool terminates. Linux's PR_SET_PDEATHSIG, which ended the workers before, fires when
    the forking *thread* ends: such a worker was killed waiting on the task queue, holding its lock,
    and the terminating pool waited for that lock for ever (the test above hung so). A worker ends
    with its parent process (the test below), not with a thread of it."""
    import multiprocessing
    import os
    import threading
    import time

    from specbench.fleet import workers

    monkeypatch.setattr(workers, "_parent", os.getpid())
    context = multiprocessing.get_context("fork")
    ready = context.Event()
    forked = []

    def child():
        workers._worker_signals()
        ready.set()  # its end-with-the-parent set up while the thread that forked it still runs
        time.sleep(1.0)

    def fork_and_end():
        forked.append(context.Process(target=child))
        forked[0].start()
        assert ready.wait(60)

    thread = threading.Thread(target=fork_and_end)
    thread.start()
    thread.join()
    forked[0].join(timeout=60)
    assert forked[0].exitcode == 0  # -15 (SIGTERM) when it ended with the thread


@pytest.mark.parametrize("stop", ["SIGKILL", "SIGTERM", "SIGINT"])
def test_workers_end_with_their_parent_and_quietly(tmp_path, stop):
    """A worker whose parent is killed (SIGKILL: no clean-up runs) ends too; a parent stopped as
    the CLI stops (SIGTERM or Ctrl-C raise in it: `cli.common.on_stop_signal`, which the fork copies
    into the workers) stops its workers without a traceback from any of them, and exits as stopped."""
    import os
    import signal
    import subprocess
    import sys
    import time

    script = tmp_path / "parent.py"
    script.write_text(
        "import os, signal, sys, time\n"
        "from specbench.cli.common import on_stop_signal\n"
        "from specbench.fleet.workers import in_processes\n"
        "signal.signal(signal.SIGTERM, on_stop_signal)\n"
        "signal.signal(signal.SIGINT, on_stop_signal)\n"
        "def work(n):\n"
        f"    open(os.path.join({str(tmp_path)!r}, f'worker-{{os.getpid()}}'), 'w').close()\n"
        "    time.sleep(120)\n"
        "try:\n"
        "    in_processes(work, [0, 1], workers=2)\n"
        "except KeyboardInterrupt:\n"
        "    sys.exit(130)\n")
    # its own process group, as a shell runs a command: Ctrl-C reaches every process in it
    parent = subprocess.Popen([sys.executable, str(script)], stderr=subprocess.PIPE, text=True,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while len(list(tmp_path.glob("worker-*"))) < 2 and time.monotonic() < deadline:
            time.sleep(0.1)
        workers = [int(p.name.split("-")[1]) for p in tmp_path.glob("worker-*")]
        assert len(workers) == 2
    finally:
        if stop == "SIGINT":
            os.killpg(parent.pid, signal.SIGINT)
        else:
            parent.send_signal(getattr(signal, stop))
        _, stderr = parent.communicate(timeout=30)

    def alive(pid: int) -> bool:  # (a zombie no one reaped yet has ended)
        try:
            return " Z" not in Path(f"/proc/{pid}/stat").read_text().split(")")[1][:3]
        except OSError:
            return False

    deadline = time.monotonic() + 10
    while any(alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.1)
    left = [pid for pid in workers if alive(pid)]
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    assert not left, f"workers {left} outlived their parent"
    if stop != "SIGKILL":
        assert parent.returncode == 130 and "Traceback" not in stderr, stderr


def test_the_trace_plan_sizes_a_fleet_with_and_without_speculation_and_says_it_in_one_sentence(tmp_path):
    import json

    from typer.testing import CliRunner

    from specbench.cli import app

    trace = azure_csv(tmp_path / "azure.csv")
    chart = tmp_path / "replicas.png"
    result = CliRunner().invoke(app, ["plan", "--target", "llama3-70b", "--device", "h100", "--tp", "4",
                                      "--drafts", "1b", "--alpha", "0.7", "--k", "3", "--trace", trace,
                                      "--trace-speedup", "1,8", "--slo", "ttft=2,tpot=0.02,p90", "--gpu-price", "2",
                                      "--chart", str(chart), "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    rows = [r for r in plan["rows"] if not r["k_schedule"]]  # the 1b K schedule too, where it is not K=3
    assert plan["estimate"].startswith("SIMULATED") and len(rows) == 4 and chart.stat().st_size > 10_000
    for row in rows:
        assert row["replicas"] >= 1 and row["gpus"] == row["replicas"] * 4
        assert row["dollars_per_month"] == pytest.approx(row["gpus"] * 2 * 730)
        assert row["tpot_p90_ms"] <= 20 and row["ttft_p90_ms"] <= 2000  # met at the traffic itself
    by = {(r["scale"], r["draft"]): r for r in rows}
    assert by[(8.0, "autoregressive")]["replicas"] >= by[(1.0, "autoregressive")]["replicas"]
    assert by[(1.0, "1b")]["tpot_p50_ms"] < by[(1.0, "autoregressive")]["tpot_p50_ms"]
    assert len(plan["answers"]) == 2
    first = plan["answers"][0]
    assert first.startswith("azure at 1× (2.51 req/s) needs ") and "llama3-70b TP4 on H100 without speculation" in first
    assert "SIMULATED; p90 TTFT ≤ 2 s and TPOT ≤ 20 ms, met at 1.2× the traffic" in first
    # the sentence names the speculative configuration with the fewest replicas, then dollars, then TPOT
    base = by[(1.0, "autoregressive")]
    best = min((r for r in plan["rows"] if r["scale"] == 1.0 and r["draft"] == "1b"),
               key=lambda r: (r["replicas"], r["dollars_per_month"], r["tpot_p50_ms"]))
    if best["replicas"] < base["replicas"]:
        saved = base["dollars_per_month"] - best["dollars_per_month"]
        name = f"1b K schedule {best['k_schedule']}" if best["k_schedule"] else "1b K=3"
        assert f"with {name} (α 0.7): ${saved:,.0f} a month less" in first


def test_the_tables_replica_schedules_asynchronously_as_current_vllm_does_but_not_for_n_gram_drafting():
    from specbench.cli.plan_tables import target_and_drafters
    from specbench.fit import kernel_tables
    from specbench.fit.table_plan import Acceptance, TablePlanner
    from specbench.fleet.plan import configurations
    from specbench.schema import AR

    family, name, config, drafters = target_and_drafters("llama3-70b", "1b,ngram")
    planner = TablePlanner(config, name, kernel_tables.check_device("h100", "vllm"), "vllm")
    found = configurations(planner, drafters, [Acceptance("1b", "α 0.7", 0.7), Acceptance("ngram", "α 0.5", 0.5)],
                           4, None, [2], 1024, 256)
    assert {c.draft: c.spec.async_scheduling for c in found} == {AR: True, "1b": True, "ngram": False}


def test_the_k_schedule_the_tables_pick_is_one_more_configuration():
    from specbench.cli.plan_tables import target_and_drafters
    from specbench.fit import kernel_tables
    from specbench.fit.table_plan import Acceptance, TablePlanner
    from specbench.fit.decisions import format_schedule, schedule_ranges
    from specbench.fit.table_plan import best_k, plan_on_tables
    from specbench.fleet.plan import SCHEDULE_BATCHES, configurations
    from specbench.fleet.router import simulate_fleet
    from specbench.fleet.sizing import COMMON_SEED
    from specbench.fleet.tables import ServerFlags

    family, name, config, drafters = target_and_drafters("llama3-70b", "1b")
    planner = TablePlanner(config, name, kernel_tables.check_device("h100", "vllm"), "vllm")
    found = configurations(planner, drafters, [Acceptance("1b", "α 0.7", 0.7)], 4, None, [1, 2, 3, 4], 1024, 256,
                           schedules=True)
    assert [c.label for c in found[:5]] == ["without speculation"] + [f"1b K={k} (α 0.7)" for k in (1, 2, 3, 4)]
    scheduled = found[5]
    assert scheduled.label.startswith("1b K schedule {1") and scheduled.schedule in scheduled.label
    ks = {scheduled.speculation.k_at(rows) for rows in (1, 8, 64, 256)}
    assert len(ks) > 1 and ks <= {0, 1, 2, 3, 4}  # K follows the running batch
    # every configuration draws from the same uniforms: a K schedule that stays at one K is that K's fleet
    assert {c.speculation.seed for c in found[1:]} == {COMMON_SEED}
    stays = dataclasses.replace(scheduled.speculation, schedule=((1, 3),))
    arrivals = np.sort(np.random.default_rng(2).uniform(0, 60, 200))
    three, staying = (simulate_fleet(np.full(200, 900), np.full(200, 200), arrivals, found[3].cost, found[3].spec, 2,
                                     speculation=speculation).outcome for speculation in (found[3].speculation, stays))
    assert np.array_equal(three.finish_s, staying.finish_s) and three.steps == staying.steps
    single = configurations(planner, drafters, [Acceptance("1b", "α 0.7", 0.7)], 4, None, [3], 1024, 256,
                            schedules=True)
    assert all(not c.schedule or len({c.speculation.k_at(r) for r in (1, 512)}) > 1 for c in single)

    # an fp8 target with an fp8 KV cache: its steps, and the K schedule picked on the same fp8 tables
    fp8 = configurations(planner, drafters, [Acceptance("1b", "α 0.7", 0.7)], 4, None, [1, 2, 3, 4], 1024, 256,
                         gemm_quant="fp8", schedules=True, server=ServerFlags(kv_cache_dtype="fp8"))
    static = TablePlanner(config, name, "h100_sxm", "vllm", gemm_quant="fp8", kv_cache_dtype="fp8")
    table, _ = plan_on_tables(static, drafters, [Acceptance("1b", "α 0.7", 0.7)], [1, 2, 3, 4], SCHEDULE_BATCHES,
                              [1024], [4], 256, None, None)
    assert fp8[-1].schedule == format_schedule(schedule_ranges(
        *zip(*[(b, int(k) if s >= 1 else None) for b, k, s in best_k(table[table["fits"]])[
            ["batch_size", "k", "highest_speedup"]].itertuples(index=False)])))
    assert at(fp8[0].cost, 0, 8) < at(found[0].cost, 0, 8)  # the baseline's decode step of 8 rows


# --- a served engine's step price fitted on what a run measured -----------------------------------

def synthetic_served_run(price, spec, rng):
    """A vLLM-like run's tables as the simulator at `price` would measure them: closed-loop-like
    cells at B 1 and 4, prompts of 60-2,000 tokens, a baseline, an n-gram and a self draft."""
    import pandas as pd

    from specbench.fleet.served import CellLoad

    cells, requests = [], []
    acceptance = {"ngram": [0.5, 0.35], "self": [1.0, 1.0]}
    for draft, k in (("autoregressive", 0), ("ngram", 2), ("self", 2)):
        for batch in (1, 4):
            for context in (64, 512, 2048):
                cell_id = f"chat|B{batch}|C{context}|{draft}"
                prompts = rng.integers(int(context * 0.8), int(context * 1.2), 8)
                outputs = np.full(8, 32)
                arrivals = np.repeat(np.arange(2) * 30.0, 4) if batch == 4 else np.arange(8) * 30.0
                load = CellLoad(cell_id, draft, k, tuple(acceptance.get(draft, ())), arrivals, prompts, outputs,
                                np.zeros(8), np.zeros(8), np.zeros(8))
                from specbench.fleet.replica import Speculation, simulate

                out = simulate(prompts, outputs, price.cost(draft if k else None), spec, arrivals_s=arrivals,
                               speculation=Speculation(k, load.acceptance, seed=1) if k else None)
                cells.append({"cell_id": cell_id, "status": "ok", "draft": draft, "k": k,
                              "acceptance_by_position": list(load.acceptance) or None})
                for i in range(8):
                    requests.append({"cell_id": cell_id, "repeat": 0, "arrival_s": arrivals[i],
                                     "prompt_tokens": prompts[i], "output_tokens": outputs[i],
                                     "ttft_s": out.ttft_s[i] + price.overhead_s, "tpot_s": out.tpot_s[i],
                                     "e2e_s": out.e2e_s[i] + price.overhead_s})
    meta = {"engine": {"servers": [{"kv_cache": {"kv_cache_size_tokens": str(spec.kv_capacity_tokens),
                                                  "block_size": str(spec.block_size)}}]}}
    return pd.DataFrame(cells), pd.DataFrame(requests), meta


@pytest.mark.integration
def test_a_served_step_price_is_recovered_from_what_its_cells_measured():
    """Cells simulated at a known price (a CPU-like step: a 45 ms floor, 1.5 ms per token beyond
    it, KV and prefill-attention terms; an n-gram and a self draft): the fit reproduces every cell's median TTFT and TPOT within
    3 %, and predicts a long trace-like load it never saw within 5 %."""
    from specbench.fleet.served import CellLoad, DraftPrice, ServedPrice, fit_served, simulate_load

    truth = ServedPrice(0.045, 0.0015, 0.05, 2e-6, 2e-7, drafts={"ngram": DraftPrice(0.008, 0.004, 0.0),
                                                               "self": DraftPrice(0.002, 0.001, 1.0)})
    spec = ReplicaSpec(max_num_seqs=128, max_num_batched_tokens=2048, kv_capacity_tokens=46592, block_size=128)
    cells, requests, meta = synthetic_served_run(truth, spec, np.random.default_rng(0))
    price, fitted_spec = fit_served(cells, requests, meta, "synthetic", self_drafts=("self",))
    assert fitted_spec == spec
    assert price.drafts["self"].model_share == 1.0 and price.drafts["ngram"].model_share == 0.0
    from specbench.fleet.served import cell_loads

    for load in cell_loads(cells, requests):
        predicted = simulate_load(price, spec, load)
        assert predicted["ttft_p50_s"] == pytest.approx(np.median(load.ttft_s), rel=0.03), load.cell_id
        assert predicted["tpot_p50_s"] == pytest.approx(np.nanmedian(load.tpot_s), rel=0.03), load.cell_id
    rng = np.random.default_rng(5)
    arrivals = np.sort(rng.uniform(0, 60, 24))
    unseen = CellLoad("trace", "ngram", 2, (0.5, 0.35), arrivals, rng.integers(300, 1500, 24),
                      rng.integers(30, 300, 24), np.zeros(24), np.zeros(24), np.zeros(24))
    assert simulate_load(price, spec, unseen)["e2e_p50_s"] == pytest.approx(
        simulate_load(truth, spec, unseen)["e2e_p50_s"], rel=0.05)


def test_a_verifys_re_reads_beyond_the_cache_are_found_in_the_speculative_cells():
    """vLLM's CPU attention reads a row's KV cache again for each of a verify's extra query
    positions, free while the step's decoding context fits a cache. Cells simulated with re-reads
    free up to 3,000 tokens (B 4 at 2k-token prompts pays them, B 1 does not): the fit finds the
    threshold on the grid's neighbours of 3,000, and n-gram's cells within 3 %; priced as if every
    re-read were free, its B 4 2k cell would be predicted over 10 % fast."""
    from dataclasses import replace

    from specbench.fleet.served import DraftPrice, ServedPrice, cell_loads, fit_served, simulate_load

    truth = ServedPrice(0.045, 0.0015, 0.05, 7e-6, 7e-7, drafts={"ngram": DraftPrice(0.008, 0.004, 0.0)},
                        reread_cached_tokens=3000.0)  # the KV's price of the CPU calibrations
    spec = ReplicaSpec(max_num_seqs=128, max_num_batched_tokens=2048, kv_capacity_tokens=46592, block_size=128)
    cells, requests, meta = synthetic_served_run(truth, spec, np.random.default_rng(0))
    keep = ~cells["draft"].eq("self")
    cells, requests = cells[keep], requests[requests["cell_id"].isin(cells["cell_id"])]
    price, _ = fit_served(cells, requests, meta, "synthetic")
    assert 2000 <= price.reread_cached_tokens <= 4500
    for load in cell_loads(cells, requests):
        if load.draft == "ngram":
            assert simulate_load(price, spec, load)["tpot_p50_s"] == pytest.approx(np.nanmedian(load.tpot_s),
                                                                                   rel=0.03), load.cell_id
    (long,) = [load for load in cell_loads(cells, requests) if load.cell_id == "chat|B4|C2048|ngram"]
    free = replace(truth, reread_cached_tokens=float("inf"))
    assert simulate_load(free, spec, long)["tpot_p50_s"] < 0.9 * np.nanmedian(long.tpot_s)


def test_a_closed_loop_cell_is_simulated_as_a_closed_loop():
    """One client sending 8 requests back to back (the sweep's closed loop at B 1), measured at a
    price: the next prompt reaches the server 1 ms after the last request ended. At a price 5 %
    dearer the simulated TPOT is 5 % higher, as a closed loop's would be. Replayed at the measured
    arrival times instead, each request would still be decoding when the next prompt arrived and
    share its steps with that prefill: a TPOT over 30 % off from the same 5 %."""
    import pandas as pd

    from specbench.fleet.replica import simulate
    from specbench.fleet.served import ServedPrice, cell_loads, simulate_load

    truth = ServedPrice(0.045, 0.0015, 0.0, 2e-6, 2e-7)
    spec = ReplicaSpec(max_num_seqs=128, max_num_batched_tokens=2048, kv_capacity_tokens=46592, block_size=128)
    prompts, outputs = np.full(8, 2000), np.full(8, 64)
    out = simulate(prompts, outputs, truth.cost(None), spec, concurrency=1, client_turnaround_s=0.001)
    cell_id = "chat|C2048|B1|T0|autoregressive"
    cells = pd.DataFrame([{"cell_id": cell_id, "status": "ok", "draft": "autoregressive", "k": 0,
                           "batch_size": 1, "request_rate": 0.0, "acceptance_by_position": None}])
    requests = pd.DataFrame({"cell_id": cell_id, "repeat": 0, "arrival_s": out.arrival_s, "prompt_tokens": prompts,
                             "output_tokens": outputs, "ttft_s": out.ttft_s, "tpot_s": out.tpot_s, "e2e_s": out.e2e_s})
    (load,) = cell_loads(cells, requests)
    assert load.concurrency == 1 and load.turnaround_s == pytest.approx(0.001, abs=1e-6)
    dearer = ServedPrice(0.045 * 1.05, 0.0015 * 1.05, 0.0, 2e-6 * 1.05, 2e-7 * 1.05)
    measured = float(np.median(out.tpot_s))
    assert simulate_load(dearer, spec, load)["tpot_p50_s"] == pytest.approx(measured * 1.05, rel=0.01)
    from dataclasses import replace

    replayed = simulate_load(dearer, spec, replace(load, concurrency=None))["tpot_p50_s"]
    assert replayed > measured * 1.3  # the open-loop replay of a closed loop, which the fitter does not do


def test_a_served_fit_on_a_measured_calibration_reproduces_its_cells():
    """The committed probed calibration (a one-core vLLM CPU server, B 1/4/8 at 512 and 2k tokens, B
    1/2 at 4k): the fitted price reproduces its cells' median TTFT and TPOT at rms log error < 0.1.
    A descent by finite differences alone stopped there at 0.33 (B 1's TPOT 110 against 65 ms)."""
    from pathlib import Path

    import pandas as pd

    from specbench.fleet.served import _residuals, cell_loads, fit_served
    from specbench.results import load_run

    base = Path(__file__).resolve().parent / "fixtures" / "cpu"
    runs = [load_run(base / "vllm-probed-calibration"), load_run(base / "vllm-probed-calibration-4k")]
    cells = pd.concat([run.cells for run in runs], ignore_index=True)
    requests = pd.concat([run.requests for run in runs], ignore_index=True)
    price, spec = fit_served(cells, requests, runs[0].meta, "probed")
    residuals = _residuals(price, spec, cell_loads(cells, requests, meta=runs[0].meta))
    assert len(residuals) == 16 and float(np.sqrt(np.mean(residuals ** 2))) < 0.1


def test_an_slo_a_request_alone_misses_is_met_by_no_number_of_replicas():
    from specbench.fleet.plan import answer
    from specbench.fleet.sizing import Configuration, Objective, Traffic, size_fleets

    count = 50
    traffic = Traffic("steady", np.arange(count) * 0.5, np.full(count, 10), np.full(count, 3))
    found = [Configuration(1, "autoregressive", 0, "", one_second_steps, ONE_AT_A_TIME, None)]
    table = size_fleets(found, traffic, [1.0], Objective((("ttft", 0.5),), 90), 0.2, "least-outstanding")
    row = table.iloc[0]
    assert not row["reachable"] and np.isnan(row["replicas"])  # each first token takes a 1 s step
    assert row["alone_misses"] == "p90 TTFT 1 s against 500 ms"
    assert "steady at 1× (2.04 req/s): no number of replicas of t TP1 on h100 meets the SLO without speculation " \
           "(a request served alone misses it: p90 TTFT 1 s against 500 ms)" \
           in answer(table, "steady", "t", "h100", "p90 TTFT ≤ 500 ms", 0.2)
    both = pd.concat([table, table.assign(draft="d", configuration="d K=2", k=2)], ignore_index=True)
    assert "no number of replicas of t TP1 on h100 meets the SLO with speculation or without (a request served " \
           "alone misses it: p90 TTFT 1 s against 500 ms)" in answer(both, "steady", "t", "h100", "p90 TTFT ≤ 500 ms", 0.2)
    met = size_fleets(found, traffic, [1.0], Objective((("ttft", 1.5),), 90), 0.0, "least-outstanding")
    assert met.iloc[0]["reachable"] and met.iloc[0]["replicas"] == 6  # 3 s a request, 2 arriving a second


@pytest.mark.integration
def test_the_trace_plan_on_a_vllm_run_fits_its_steps_and_sizes_its_servers(tmp_path):
    """A committed vLLM CPU run (closed loop, n-gram and self draft at K 2 and 4): the fleet is
    sized on the steps fitted on it, each draft with the acceptance it measured."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from specbench.cli import app

    run = Path(__file__).resolve().parents[1] / "tests/fixtures/cpu/vllm-local"
    trace = azure_csv(tmp_path / "azure.csv", count=40, gap_s=20.0)
    result = CliRunner().invoke(app, ["plan", str(run), "--trace", trace, "--slo", "ttft=30,tpot=0.3,p90", "--json",
                                      "--extrapolate"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["estimate"].startswith("SIMULATED on steps fitted on") and plan["step_fitted"]["fixed_s"] > 0
    configurations = [row["configuration"] for row in plan["rows"]]
    assert configurations == ["without speculation", "ngram K=2 (measured α)", "ngram K=4 (measured α)",
                              "smollm2-135m K=2 (measured α)", "smollm2-135m K=4 (measured α)"]
    assert all(row["replicas"] >= 1 for row in plan["rows"])
    assert "smollm2-135m servers as measured in" in plan["answers"][0]
    assert "(SIMULATED, EXTRAPOLATED past the batches or prompts its run measured;" in plan["answers"][0]
    # the run measured 64-token prompts; the trace's run to 1.7k: the plan says it extrapolates
    assert plan["beyond_measured"] == ["azure's prompts run to 1,724 tokens (p90); the run's longest was 64: "
                                       "prefill and attention past it are extrapolated"]


@pytest.mark.integration
def test_a_traffic_no_number_of_replicas_serves_is_its_sentence_not_a_blank_table(tmp_path):
    """An SLO a request served alone misses sizes nothing: the traffic's answer says so, and no table of
    configurations whose every column is blank is printed before it; a scale that sizes keeps its table."""
    from pathlib import Path

    from typer.testing import CliRunner

    from specbench.cli import app

    run = Path(__file__).resolve().parents[1] / "tests/fixtures/cpu/vllm-local"
    trace = azure_csv(tmp_path / "azure.csv", count=40, gap_s=20.0)
    result = CliRunner().invoke(app, ["plan", str(run), "--trace", trace, "--slo", "ttft=0.001,p90", "--extrapolate"])
    assert result.exit_code == 0, result.output
    assert "no number of replicas" in result.output and "a request served alone misses it" in result.output
    assert "alone misses)" not in result.output and "┃ configuration" not in result.output, result.output
    sized = CliRunner().invoke(app, ["plan", str(run), "--trace", trace, "--slo", "ttft=30,tpot=0.3,p90",
                                     "--extrapolate"])
    assert sized.exit_code == 0 and "┃ configuration" in sized.output, sized.output


@pytest.mark.integration
def test_a_plan_on_a_vllm_run_keeps_to_its_servers_context(tmp_path):
    """vLLM refuses a request past --max-model-len (by default the model's context, 8192 tokens for
    smollm2-135m): a closed loop of such requests is one line, and a trace's rows past it are left
    out and counted, though the servers' KV cache (46k tokens) would hold them."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from specbench.cli import app
    from specbench.fleet.served import served_context

    run = Path(__file__).resolve().parents[1] / "tests/fixtures/cpu/vllm-local"
    assert served_context(json.loads((run / "run.json").read_text())) == 8192
    served = {"grid": {"target": "smollm2-135m"}, "engine": {"vllm": {"max_model_len": 4096}}}
    assert served_context({"config": served}) == 4096
    local = {"grid": {"target": "/a/local/model"}}
    assert served_context({"config": local}) == 0  # not known: the KV cache alone bounds
    # an endpoint run's servers said what they serve (/v1/models max_model_len), whatever the target's own context
    assert served_context({"config": local, "engine": {"name": "endpoint", "context_limit": 2048}}) == 2048
    result = CliRunner().invoke(app, ["plan", str(run), "--concurrency", "4", "--input-len", "9000",
                                      "--output-len", "64"])
    assert result.exit_code == 2 and result.output.strip() == (
        "error: --input-len 9000 + --output-len 64: 9064 tokens a request, past smollm2-135m's 8192-token "
        "context (vLLM refuses such requests)"), result.output
    trace = azure_csv(tmp_path / "azure.csv", count=40, gap_s=20.0)
    rows = (tmp_path / "azure.csv").read_text().splitlines()
    rows[5] = ",".join(rows[5].split(",")[:-2] + ["9000", "10"])  # one request past the context
    (tmp_path / "azure.csv").write_text("\n".join(rows) + "\n")
    result = CliRunner().invoke(app, ["plan", str(run), "--trace", trace, "--slo", "ttft=30,tpot=0.3,p90", "--json",
                                      "--extrapolate"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["requests"] == 39 and any("beyond the target's context (8192 tokens)" in note
                                          for note in plan["skipped"]), plan["skipped"]


@pytest.mark.integration
def test_the_closed_loop_on_a_vllm_run_is_its_servers_at_other_clients_and_lengths(tmp_path):
    """`plan RUN --concurrency C --input-len N --output-len M`: closed-loop clients on the steps fitted
    on a committed vLLM CPU run, its baseline and each draft × K with the acceptance it measured. At
    one client and the run's own lengths it is the run's one-client cells again (TPOT and tokens/s
    within 15 %, the fit's own residuals: ngram K=4's TPOT 41 against 37 ms); past the batches it
    measured it says so; bad input is one line."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from specbench.cli import app
    from specbench.results import load_run

    run = Path(__file__).resolve().parents[1] / "tests/fixtures/cpu/vllm-local"
    result = CliRunner().invoke(app, ["plan", str(run), "--concurrency", "1,8", "--input-len", "51", "--output-len",
                                      "32", "--slo", "ttft=1,tpot=0.2,p90", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["estimate"].startswith("SIMULATED on steps fitted on")
    rows = {(row["concurrency"], row["draft"], row["k"]): row for row in plan["rows"]}
    cells = load_run(run).cells
    for cell in cells[cells["batch_size"] == 1].itertuples():
        row = rows[(1, cell.draft, cell.k)]
        assert row["tpot_p50_ms"] == pytest.approx(cell.tpot_p50_s * 1e3, rel=0.15), cell.draft
        assert row["tokens_per_s_per_gpu"] == pytest.approx(cell.tokens_per_s, rel=0.15), cell.draft
    assert "1 client: speculation serves the most with ngram" in plan["answers"][0]
    assert "tokens/s per server" in plan["answers"][0]
    assert "Fewer requests run at once" not in plan["answers"][0]  # a lone client leaves no one waiting
    assert any("The most clients one server serves at p90 TTFT ≤ 1 s" in text for text in plan["answers"])
    assert any("the closed loops run more requests at once than the run measured (4 at most)" in note
               for note in plan["beyond_measured"])
    text = CliRunner().invoke(app, ["plan", str(run), "--concurrency", "2", "--input-len", "51", "--output-len", "8",
                                    "--chart", str(tmp_path / "clients.png")]).output
    assert "one server as measured in" in text and "tok/s/server" in text and (tmp_path / "clients.png").exists()
    for args, message in ((["--concurrency", "0"], "must be >= 1"),
                          (["--concurrency", "2", "--trace", "azure-conv"], "two loads: give one"),
                          (["--concurrency", "2", "--max-num-seqs", "4"], "--max-num-seqs does not apply to a run's servers under closed-loop clients")):
        result = CliRunner().invoke(app, ["plan", str(run), *args])
        assert result.exit_code == 2 and message in result.output, result.output


def test_the_closed_loop_answer_says_when_speculation_runs_a_smaller_batch():
    """Llama-3.1-70B at TP4 on H100, 64 clients of 8k in and 1k out: the 16-bit KV cache holds about
    50 such requests, and an 8B draft's weights and cache leave room for fewer. Its TPOT is lower
    than the baseline's partly because fewer requests run; the answer says so, and which
    configuration serves the most tokens/s per GPU."""
    import json

    from typer.testing import CliRunner

    from specbench.cli import app

    result = CliRunner().invoke(app, ["plan", "--target", "llama3-70b", "--drafts", "8b", "--device", "h100", "--tp",
                                      "4", "--concurrency", "64", "--input-len", "8192", "--output-len", "1024",
                                      "--k", "3", "--alpha", "0.7", "--gpu-price", "2", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    base, draft = plan["rows"]
    assert plan["price_per_gpu_hour"] == 2 and plan["price"] == "given"
    for row in (base, draft):  # a GPU-hour at 2 $ serves tokens/s/GPU × 3600 tokens
        assert row["dollars_per_million_tokens"] == pytest.approx(2e6 / (row["tokens_per_s_per_gpu"] * 3600))
    assert draft["kv_cache_requests"] < base["kv_cache_requests"] < 64
    assert draft["mean_running_batch"] < 0.9 * base["mean_running_batch"] <= base["kv_cache_requests"]
    assert draft["tpot_p50_ms"] < base["tpot_p50_ms"] and draft["ttft_p50_ms"] > base["ttft_p50_ms"]
    [answer] = plan["answers"]
    assert answer.startswith("TP4, 64 clients: ") and answer.endswith("(SIMULATED)")
    assert (f"{draft['tokens_per_s_per_gpu']:.0f} against {base['tokens_per_s_per_gpu']:.0f} tokens/s per GPU "
            f"({draft['throughput_speedup']:.2f}×; ${draft['dollars_per_million_tokens']:.2f} against "
            f"${base['dollars_per_million_tokens']:.2f} per 1M tokens)") in answer
    assert (f"on average 8b {draft['mean_running_batch']:.0f}, its KV cache holding {draft['kv_cache_requests']}; "
            f"autoregressive {base['mean_running_batch']:.0f}") in answer


def test_a_closed_loop_at_an_slo_says_which_configurations_meet_it_and_how_many_clients_they_hold():
    """--slo with --concurrency: each configuration's share of requests meeting it and whether its
    percentile holds, as the trace sizing judges a fleet. Llama-3.1-70B TP4 on H100, 8k in and 1k
    out: the baseline's TPOT (about 17 ms at 4 clients, 28 at 16) misses a 20 ms bound at 16
    clients, where a 1B draft at K = 3 (about 17 ms) still meets it."""
    import json

    from typer.testing import CliRunner

    from specbench.cli import app

    result = CliRunner().invoke(app, ["plan", "--target", "llama3-70b", "--drafts", "1b", "--device", "h100", "--tp",
                                      "4", "--concurrency", "4,16", "--input-len", "8192", "--output-len", "1024",
                                      "--k", "3", "--alpha", "0.7", "--slo", "ttft=2,tpot=0.02,p90", "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert plan["slo"] == "ttft=2,tpot=0.02,p90"
    rows = {(row["concurrency"], row["draft"]): row for row in plan["rows"]}
    for row in rows.values():  # the verdict is the p90s' (no one-token outputs here)
        assert row["meets_slo"] == (row["ttft_p90_ms"] <= 2000 and row["tpot_p90_ms"] <= 20)
        assert 0 <= row["good_share"] <= 1 and row["goodput_rps"] >= 0
    assert rows[4, "autoregressive"]["meets_slo"] and not rows[16, "autoregressive"]["meets_slo"]
    assert rows[16, "1b"]["meets_slo"]
    assert rows[16, "autoregressive"]["good_share"] < 0.1 < 0.9 < rows[16, "1b"]["good_share"]
    assert ("TP4, 16 clients: speculation serves the most with 1b K=3" in plan["answers"][1]
            and "At p90 TTFT ≤ 2 s and TPOT ≤ 20 ms: met by 1b K=3 (SIMULATED)" in plan["answers"][1])
    assert plan["answers"][-1] == ("TP4, the most clients one replica serves at p90 TTFT ≤ 2 s and TPOT ≤ 20 ms, "
                                   "of 4, 16: autoregressive 4; 1b 16 (K=3) (SIMULATED)")


def test_the_closed_loop_simulates_the_k_schedule_too(tmp_path):
    """The K schedule `plan --target` picks (8b on 70B TP4, 1k in: K = 3 up to 32 rows, K = 1
    beyond) is one more configuration of the closed loop: at 8 clients it runs as K = 3 does, at
    128 as K = 1 does. --chart draws them all against the clients."""
    import json

    from typer.testing import CliRunner

    from specbench.cli import app

    result = CliRunner().invoke(app, ["plan", "--target", "llama3-70b", "--drafts", "8b", "--device", "h100", "--tp",
                                      "4", "--concurrency", "8,128", "--input-len", "1024", "--output-len", "1024",
                                      "--k", "1,3", "--alpha", "0.7", "--slo", "tpot=0.028,p90", "--chart",
                                      str(tmp_path / "clients.png"), "--json"])
    assert result.exit_code == 0, result.output
    rows = json.loads(result.output)["rows"]
    scheduled = [row for row in rows if row["k_schedule"]]
    assert [row["k_schedule"] for row in scheduled] == ["{1-32: 3, 33+: 1}"] * 2
    for row in scheduled:
        like = 3 if row["concurrency"] == 8 else 1
        fixed = next(r for r in rows if r["concurrency"] == row["concurrency"] and r["draft"] == "8b"
                     and r["k"] == like and not r["k_schedule"])
        assert row["tpot_p50_ms"] == pytest.approx(fixed["tpot_p50_ms"], rel=0.03)
    assert (tmp_path / "clients.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    answers = json.loads(result.output)["answers"]  # at 128 clients K = 3's TPOT (~29 ms) misses the bound
    assert "At p90 TPOT ≤ 28 ms: met by 8b K=1 and K schedule {1-32: 3, 33+: 1};" in answers[1]


def test_a_k_schedule_off_at_every_batch_is_not_simulated_as_speculation():
    """At α 0 no K pays anywhere: the schedule would be {1+: off}, the baseline with a draft loaded.
    It is not one more speculative configuration (it was, and the answer read 'speculation serves as
    much as autoregressive, at best 1b K schedule {1+: off}')."""
    import json

    from typer.testing import CliRunner

    from specbench.cli import app

    result = CliRunner().invoke(app, ["plan", "--target", "llama3-70b", "--drafts", "1b", "--tp", "4", "--alpha", "0",
                                      "--k", "2,3", "--concurrency", "1", "--input-len", "1024", "--output-len", "128",
                                      "--json"])
    assert result.exit_code == 0, result.output
    plan = json.loads(result.output)
    assert [row["k_schedule"] for row in plan["rows"]] == ["", "", ""]  # the baseline, K=2, K=3
    assert "no speculation serves more than autoregressive" in plan["answers"][0]


def test_the_closed_loop_answer_says_when_no_speculation_serves_more():
    import pandas as pd

    from specbench.fleet.plan import closed_loop_answer

    row = {"tp": 1, "concurrency": 8, "k": 0, "acceptance": "", "tokens_per_s_per_gpu": 100.0, "tpot_p50_ms": 10.0,
           "ttft_p50_ms": 50.0, "mean_running_batch": 8.0, "kv_cache_requests": 100, "throughput_speedup": 1.0}
    rows = pd.DataFrame([{**row, "draft": "autoregressive"},
                         {**row, "draft": "1b", "k": 2, "acceptance": "α 0.3", "tokens_per_s_per_gpu": 90.0,
                          "throughput_speedup": 0.9, "tpot_p50_ms": 11.0}])
    assert closed_loop_answer(rows) == (
        "TP1, 8 clients: no speculation serves more than autoregressive; the closest, 1b K=2: 90.0 against 100 "
        "tokens/s per GPU (0.90×), TPOT p50 11.0 against 10.0 ms, TTFT p50 0.05 against 0.05 s (SIMULATED)")
    # 0.5 % more is a tie, not "serves the most" (a prefill-bound CPU server's 1.00 against 1.00 tokens/s)
    level = rows.assign(tokens_per_s_per_gpu=[100.0, 100.5], throughput_speedup=[1.0, 1.005])
    assert closed_loop_answer(level).startswith(
        "TP1, 8 clients: speculation serves as much as autoregressive (within 1%), at best 1b K=2: 100 against 100 ")
    assert closed_loop_answer(rows.iloc[:1]) == ""
    # a served run's plan adds what its check says of an effect that size
    told = closed_loop_answer(rows, device="server", evidence=lambda change: f"change {change:+.2f}")
    assert "per server (0.90×), TPOT p50 11.0 against 10.0 ms, TTFT p50 0.05 against 0.05 s (change -0.10)" in told
    alone = rows.iloc[:1].assign(meets_slo=True)
    assert closed_loop_answer(alone, "p90 TPOT ≤ 10 ms") == \
        "TP1, 8 clients: at p90 TPOT ≤ 10 ms: met by autoregressive (SIMULATED)"


def test_the_running_batch_percentile_is_weighted_by_time():
    from specbench.fleet.replica import mean_running, running_percentile

    timeline = [(0.0, 1), (1.0, 4), (10.0, 2), (11.0, 2)]  # 1 s at one row, 9 s at four, 1 s at two
    assert running_percentile(timeline, 90) == 4
    assert running_percentile(timeline, 10) == 2
    assert running_percentile(timeline, 5) == 1
    assert running_percentile([], 90) == 0
    assert mean_running(timeline) == pytest.approx((1 * 1 + 9 * 4 + 1 * 2) / 11)


def test_a_plan_past_the_batches_and_prompts_its_run_measured_says_so():
    """A price fitted on a run is an extrapolation where the sized fleets run more requests at once
    than the run's cells of that configuration did, or longer prompts than it measured."""
    import pandas as pd

    from specbench.fleet.served import MeasuredReach, beyond_measured, measured_reach
    from specbench.schema import AR

    cells = pd.DataFrame({"cell_id": ["a1", "a4", "n4", "replay", "failed"],
                          "draft": [AR, AR, "ngram", AR, "ngram"], "status": ["ok", "ok", "ok", "ok", "error"],
                          "batch_size": [1, 4, 4, 0, 32], "request_rate": [0.0, 0.0, 0.0, 0.5, 0.0],
                          "running_max": [1.0, 4.0, float("nan"), 6.0, 32.0]})
    requests = pd.DataFrame({"cell_id": ["a1", "a4", "n4", "replay", "failed"],
                             "prompt_tokens": [512, 2048, 2048, 900, 8000]})
    reach = measured_reach(cells, requests)
    # the replay's sampled 6 running requests count; the failed cell's 32 and 8k prompt do not
    # (the decoding context its rows can have read: the rows times the longest request, here no outputs)
    assert reach == {AR: MeasuredReach(6, 2048, 6 * 2048), "ngram": MeasuredReach(4, 2048, 4 * 2048)}

    table = pd.DataFrame({"configuration": ["without speculation", "ngram K=2", "without speculation", "ngram K=2"],
                          "draft": [AR, "ngram", AR, "ngram"], "scale": [1, 1, 2, 2],
                          "running_p90": [3.0, 5.0, 6.0, 9.0]})
    notes = beyond_measured(table, reach, np.array([100] * 9 + [1000]), "conv")
    assert notes == ["the sized fleets run more requests at once than the run measured (4 at most): ngram K=2 9 "
                     "(p90 of the busiest replica's time); their step prices there are extrapolated: measure "
                     "cells at those batch sizes"]
    long_prompts = beyond_measured(table.iloc[:1], reach, np.full(10, 4096), "code")
    assert long_prompts == ["code's prompts run to 4,096 tokens (p90); the run's longest was 2,048: prefill and "
                            "attention past it are extrapolated"]


def test_acceptance_per_row_step_counts_the_rows_a_drafter_proposed_nothing_for():
    """vLLM's per-position acceptance is per draft; n-gram drafting proposes nothing for some
    row-steps, which emit one token. Two requests of 11 tokens decode 20 after their first; 6 were
    accepted drafts, so the rows took 14 steps, 7 of which drafted: every position's rate halves."""
    import pandas as pd

    from specbench.fit.acceptance import acceptance_by_position, row_step_acceptance

    requests = pd.DataFrame({"cell_id": ["c", "c", "other"], "output_tokens": [11, 11, 500]})
    cell = {"cell_id": "c", "acceptance_by_position": [0.6, 0.3], "num_drafts": 7.0, "accepted": 6.0}
    assert row_step_acceptance(cell, requests) == pytest.approx((0.3, 0.15))
    assert row_step_acceptance({**cell, "num_drafts": 14.0}, requests) == pytest.approx((0.6, 0.3))
    assert row_step_acceptance({**cell, "num_drafts": float("nan")}, requests) == (0.6, 0.3)  # no counters
    assert row_step_acceptance({**cell, "acceptance_by_position": None}, requests) == ()
    assert row_step_acceptance(cell, None) == (0.6, 0.3)  # no requests at hand: per draft
    # the table planner's acceptance (plan --target --acceptance RUN) reads the same per row-step
    cells = pd.DataFrame([{**cell, "k": 2}])
    assert acceptance_by_position(cells, requests) == pytest.approx([0.3, 0.15])
    assert acceptance_by_position(cells) == pytest.approx([0.6, 0.3])


def test_the_trace_plan_on_a_run_that_is_not_served_is_one_line(tmp_path):
    from typer.testing import CliRunner

    from specbench.cli import app

    result = CliRunner().invoke(app, ["plan", str(tmp_path / "nothing"), "--trace", "azure-conv", "--slo", "ttft=1"])
    assert result.exit_code == 2 and len(result.output.strip().splitlines()) == 1, result.output
    result = CliRunner().invoke(app, ["plan", str(tmp_path), "--trace", "azure-conv"])
    assert result.exit_code == 2 and "give --slo" in result.output, result.output


def test_a_load_spread_over_two_servers_is_simulated_on_two_replicas_behind_its_router():
    """A served cell whose load went to two endpoints (its `endpoint` column lists both) is
    predicted on two replicas behind the run's router: round-robin, each replica serves every
    other request alone, worked out here with one replica each; at a rate one replica cannot hold,
    two wait far less."""
    import pandas as pd

    from specbench.fleet.replica import simulate
    from specbench.fleet.served import ServedPrice, cell_loads, simulate_load

    price = ServedPrice(0.045, 0.0015, 0.05, 2e-6, 2e-7)
    spec = ReplicaSpec(max_num_seqs=128, max_num_batched_tokens=2048, kv_capacity_tokens=46592, block_size=128)
    rng = np.random.default_rng(3)
    count = 16
    arrivals = np.sort(rng.uniform(0, 20, count))
    prompts, outputs = rng.integers(800, 1200, count), rng.integers(30, 60, count)
    cells = pd.DataFrame([{"cell_id": name, "status": "ok", "draft": "endpoint", "k": 0,
                           "acceptance_by_position": None, "endpoint": endpoint}
                          for name, endpoint in (("one", "http://a:8000"), ("two", "http://a:8000,http://b:8000"))])
    requests = pd.DataFrame([{"cell_id": name, "repeat": 0, "arrival_s": arrivals[i], "prompt_tokens": prompts[i],
                              "output_tokens": outputs[i], "ttft_s": 0.0, "tpot_s": 0.0, "e2e_s": 0.0}
                             for name in ("one", "two") for i in range(count)])
    meta = {"config": {"engine": {"endpoint": {"router": "round-robin"}}},
            "engine": {"servers": [{"label": "endpoint", "kv_cache": {"kv_cache_size_tokens": "46592",
                                                                      "block_size": "128"}}]}}
    one, two = cell_loads(cells, requests, meta=meta)
    assert (one.replicas, two.replicas, two.router, two.spec) == (1, 2, "round-robin", spec)
    halves = [simulate(prompts[n::2], outputs[n::2], price.cost(None), spec, arrivals_s=arrivals[n::2] - arrivals[0])
              for n in (0, 1)]
    expected = np.median(np.concatenate([half.ttft_s for half in halves])) + price.overhead_s
    predicted_two, predicted_one = simulate_load(price, spec, two), simulate_load(price, spec, one)
    assert predicted_two["ttft_p50_s"] == pytest.approx(expected, rel=1e-9)
    assert predicted_two["tpot_p50_s"] == pytest.approx(
        np.nanmedian(np.concatenate([half.tpot_s for half in halves])), rel=1e-9)
    assert predicted_one["ttft_p50_s"] > 3 * predicted_two["ttft_p50_s"]  # one replica's queue grows


def test_pooled_runs_keep_each_cells_requests_apart():
    """Two runs of the same grid hold the same cell ids: pooled, each cell keeps its own requests
    (a served fit on two calibrations would otherwise read every request twice, under both cells)."""
    from pathlib import Path

    import pandas as pd

    from specbench.results import Run, pool_runs

    def run(ttft: float, other: str) -> Run:
        cells = pd.DataFrame({"cell_id": ["chat|B1", other]})
        requests = pd.DataFrame({"cell_id": ["chat|B1", other], "ttft_s": [ttft, 9.0]})
        return Run(Path("."), {}, cells, requests, pd.DataFrame())

    cells, requests, steps = pool_runs([run(1.0, "only-first"), run(2.0, "only-second")])
    assert sorted(cells["cell_id"]) == ["0:chat|B1", "1:chat|B1", "only-first", "only-second"]
    assert requests.set_index("cell_id")["ttft_s"].to_dict() == {"0:chat|B1": 1.0, "only-first": 9.0,
                                                                 "1:chat|B1": 2.0, "only-second": 9.0}
    assert steps.empty


def test_a_prompt_whose_prefix_is_cached_computes_only_the_rest():
    """Prefix caching (vLLM's default): the second request sharing a 1,024-token system prompt
    computes only its own 200 tokens; with the cache off it computes all 1,224."""
    cost = linear_cost()
    system = tuple(range(64))  # the keys of 64 blocks of 16 tokens
    spec = ReplicaSpec(prefix_caching=True)
    out = simulate([1224, 1224], [10, 10], cost, spec, arrivals_s=[0.0, 10.0], prefixes=[system, system])
    assert out.ttft_s[0] == pytest.approx(cost(1224, 0))
    assert out.ttft_s[1] == pytest.approx(cost(200, 0))
    np.testing.assert_array_equal(out.cached_tokens, [0, 1024])
    assert out.prefix_hit_share() == pytest.approx(1024 / 2448)
    off = simulate([1224, 1224], [10, 10], cost, ReplicaSpec(), arrivals_s=[0.0, 10.0], prefixes=[system, system])
    assert off.ttft_s[1] == pytest.approx(cost(1224, 0)) and off.prefix_hit_share() == 0


def test_a_prefix_is_found_only_up_to_where_the_keys_part():
    """Keys name a unit and everything before it: a prompt that agrees with a cached one on its
    first 10 blocks and differs at the 11th finds 10 (later equal keys do not count)."""
    cost = linear_cost()
    first = tuple(range(40))
    second = tuple(range(10)) + (999,) + tuple(range(11, 40))
    out = simulate([640, 640], [5, 5], cost, ReplicaSpec(prefix_caching=True), arrivals_s=[0.0, 10.0],
                   prefixes=[first, second])
    assert out.cached_tokens[1] == 160 and out.ttft_s[1] == pytest.approx(cost(480, 0))


def test_a_full_cache_evicts_the_least_recently_freed_prefix_first():
    """100 blocks, prompts of 40 (+ a block for the output), one at a time: C takes A's last 21
    blocks (A was freed first, its tail first); B again finds 39 blocks (all but its last token's),
    its last block taking A's 19th; A again finds the 18 before it."""
    cost = linear_cost()
    spec = ReplicaSpec(prefix_caching=True, kv_capacity_tokens=16 * 100)
    prompts = [640, 640, 640, 640, 640]
    keys = {name: tuple((name, b) for b in range(40)) for name in "ABC"}
    order = ["A", "B", "C", "B", "A"]
    out = simulate(prompts, [8] * 5, cost, spec, arrivals_s=10.0 * np.arange(5), prefixes=[keys[n] for n in order])
    np.testing.assert_array_equal(out.cached_tokens, [0, 0, 0, 39 * 16, 18 * 16])


def test_a_preempted_request_takes_back_its_own_cached_blocks():
    """A KV cache too small for two long requests: the one preempted finds its own prompt and output
    still cached when it is admitted again, so its recompute costs fewer tokens than without the cache."""
    cost = linear_cost()
    spec = ReplicaSpec(kv_capacity_tokens=16 * 120, max_num_batched_tokens=4096, reserve_full_input=False)
    prompts, outputs = [1000, 900], [600, 600]
    cached = simulate(prompts, outputs, cost, dataclasses.replace(spec, prefix_caching=True), arrivals_s=[0, 0.001])
    plain = simulate(prompts, outputs, cost, spec, arrivals_s=[0, 0.001])
    assert cached.preemptions > 0 and plain.preemptions > 0
    assert cached.finish_s.max() < plain.finish_s.max()


def test_a_mooncake_traces_hash_ids_size_a_fleet_that_caches_prefixes(tmp_path):
    """`plan --trace` on a Mooncake trace: its hash ids (512 tokens each) say what the prompts share
    (turns of conversations under one system prompt); with vLLM's prefix caching the prompts' share
    found cached is shown and TTFT falls; --no-prefix-caching turns it off."""
    import json

    from typer.testing import CliRunner

    from specbench.cli import app

    rng = np.random.default_rng(0)
    lines, next_id = [], 100
    for conversation in range(40):
        ids, length, start = [1, 2], 1024, rng.uniform(0, 300)
        for turn in range(4):
            length += int(rng.integers(100, 600))
            while len(ids) < -(-length // 512):
                ids.append(next_id)
                next_id += 1
            output = int(rng.integers(50, 300))
            lines.append({"timestamp": int((start + 20 * turn) * 1000), "input_length": length,
                          "output_length": output, "hash_ids": ids[:-(-length // 512)]})
            length += output
    trace = tmp_path / "conversations.jsonl"
    trace.write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    found = {}
    for flag in ("--prefix-caching", "--no-prefix-caching"):
        result = CliRunner().invoke(app, ["plan", "--target", "llama3-8b", "--device", "h100", "--tp", "1",
                                          "--trace", str(trace), "--slo", "ttft=1,tpot=0.05,p90", flag, "--json"])
        assert result.exit_code == 0, result.output
        found[flag] = json.loads(result.output)["rows"][0]
    assert found["--prefix-caching"]["prefix_hit_share"] > 0.5
    assert found["--no-prefix-caching"]["prefix_hit_share"] == 0
    assert found["--prefix-caching"]["ttft_p50_ms"] < found["--no-prefix-caching"]["ttft_p50_ms"]
    text = CliRunner().invoke(app, ["plan", "--target", "llama3-8b", "--device", "h100", "--tp", "1", "--trace",
                                    str(trace), "--slo", "ttft=1,tpot=0.05,p90"]).output
    assert "prompt found cached" in text and "tail likely worse" not in text
    # behind the prefix-aware router the answer says its tail was measured worse than simulated
    aware = CliRunner().invoke(app, ["plan", "--target", "llama3-8b", "--device", "h100", "--tp", "1", "--trace",
                                     str(trace), "--slo", "ttft=1,tpot=0.05,p90", "--router", "prefix-aware"])
    assert aware.exit_code == 0, aware.output
    assert "(SIMULATED, the prefix-aware router's tail likely worse;" in " ".join(aware.output.split())
    assert "no prefixes in it" not in aware.output
    # a trace without hash ids (Azure's) gives the router nothing but load to route by: the head says so
    blind = CliRunner().invoke(app, ["plan", "--target", "llama3-8b", "--device", "h100", "--tp", "1", "--trace",
                                     azure_csv(tmp_path / "azure.csv", count=40, gap_s=2.0), "--slo", "ttft=1",
                                     "--router", "prefix-aware"])
    assert blind.exit_code == 0 and "no prefixes in it, so the router weighs the servers' queues and free KV " \
                                   "cache alone" in " ".join(blind.output.split()), blind.output


def test_a_served_runs_servers_are_planned_with_prefix_caching_when_asked():
    """`plan RUN --trace T --prefix-caching`: the servers a run measured (specbench's cache nothing),
    asked what caching prefixes would do. The committed check (benchmarks/fleets/prefix-caching, its runs in tests/fixtures):
    16 prompts under one 1,024-token system prompt, fitted on a calibration of fresh prompts, against
    the same trace replayed on a vLLM CPU server with prefix caching and on one without: p50 E2E
    within 10 % both ways, and the cache's effect on TTFT (measured 0.05×) under a tenth."""
    import json
    from pathlib import Path

    from typer.testing import CliRunner

    from specbench.cli import app
    from specbench.results import load_run

    fixtures = Path(__file__).resolve().parent / "fixtures"
    found = {}
    for flag in ("--prefix-caching", "--no-prefix-caching", None):
        result = CliRunner().invoke(app, ["plan", str(fixtures / "cpu" / "vllm-prefix-calibration"),
                                          "--trace", str(fixtures / "traces" / "prefix-shared.jsonl"),
                                          "--slo", "ttft=2,tpot=0.1,p90", "--json", *([flag] if flag else [])])
        assert result.exit_code == 0, result.output
        found[flag] = json.loads(result.output)
    cached, uncached = found["--prefix-caching"]["rows"][0], found["--no-prefix-caching"]["rows"][0]
    assert found[None]["rows"] == found["--no-prefix-caching"]["rows"]  # as measured: the servers cached nothing
    assert found["--prefix-caching"]["server_flags"] == "prefix caching" and found[None]["server_flags"] == ""
    assert "(prefix caching on)" in found["--prefix-caching"]["answers"][0]
    assert 0.85 < cached["prefix_hit_share"] < 0.95 and uncached["prefix_hit_share"] == 0
    assert found[None]["step_fitted"]["overhead_s"] > 0  # in every TTFT and E2E below
    assert cached["ttft_p50_ms"] < 0.1 * uncached["ttft_p50_ms"]
    for row, replay in ((cached, "cached"), (uncached, "uncached")):
        measured_ms = float(load_run(fixtures / "cpu" / f"vllm-prefix-{replay}").requests["e2e_s"].median()) * 1e3
        assert row["e2e_p50_ms"] == pytest.approx(measured_ms, rel=0.1), replay
    result = CliRunner().invoke(app, ["plan", str(fixtures / "cpu" / "vllm-prefix-calibration"), "--prefix-caching"])
    assert result.exit_code == 2 and "--prefix-caching does not apply to a plan on a run's fit (RUN_DIR); it applies with --concurrency or --trace" in result.output


def test_the_prefix_aware_router_sends_a_request_where_its_prefix_is_cached():
    """Two idle replicas caching prefixes; the first turns of conversations A, B and C, then A's
    second. Round-robin and least-outstanding (both idle: the one chosen longest ago) alternate and
    send A's second turn to replica 1, which never saw A; the prefix-aware router scores replica 0
    3 × 0.5 higher (half its prompt found there) and sends it there, computing 512 tokens fewer."""
    from specbench.fleet.router import simulate_fleet

    cost = linear_cost()
    spec = ReplicaSpec(prefix_caching=True, kv_capacity_tokens=1 << 16)
    conversation = {name: tuple((name, b) for b in range(64)) for name in "ABC"}
    prompts, outputs = np.array([512, 512, 512, 1024]), np.array([4, 4, 4, 4])
    prefixes = [conversation[name] for name in "ABCA"]
    arrivals = np.array([0.0, 1.0, 2.0, 3.0])
    for router, sent, found in (("round-robin", [0, 1, 0, 1], 0), ("least-outstanding", [0, 1, 0, 1], 0),
                                ("prefix-aware", [0, 1, 0, 0], 512)):
        fleet = simulate_fleet(prompts, outputs, arrivals, cost, spec, 2, router, prefixes=prefixes)
        assert fleet.replica_of.tolist() == sent, router
        assert fleet.outcome.cached_tokens[3] == found, router
    aware = simulate_fleet(prompts, outputs, arrivals, cost, spec, 2, "prefix-aware", prefixes=prefixes)
    blind = simulate_fleet(prompts, outputs, arrivals, cost, spec, 2, "least-outstanding", prefixes=prefixes)
    assert aware.outcome.ttft_s[3] == pytest.approx(cost(512, 0))
    assert blind.outcome.ttft_s[3] == pytest.approx(cost(1024, 0))


def test_a_closed_loop_with_a_shared_system_prompt_computes_it_once():
    """`plan --concurrency --prefix-len`: one client, three requests of 1,000 tokens whose first 512
    are the same: the first computes all 1,000, the next two the 488 after the cached prompt."""
    from specbench.fleet.plan import Clients, closed_loop

    cost = linear_cost()
    one_by_one = Clients("test", together=True, requests_per_client=3, shortest_share=1.0, measure_all=True)
    out, keep = closed_loop(cost, ReplicaSpec(prefix_caching=True), 1, 1000, 10, clients=one_by_one, prefix_len=512)
    assert keep.all()
    np.testing.assert_allclose(out.ttft_s, [cost(1000, 0), cost(488, 0), cost(488, 0)])
    np.testing.assert_array_equal(out.cached_tokens, [0, 512, 512])
    plain, _ = closed_loop(cost, ReplicaSpec(prefix_caching=True), 1, 1000, 10, clients=one_by_one)
    np.testing.assert_allclose(plain.ttft_s, [cost(1000, 0)] * 3)


def test_the_prefix_len_is_checked_and_shown(tmp_path):
    import json

    from typer.testing import CliRunner

    from specbench.cli import app

    base = ["plan", "--target", "llama3-70b", "--device", "h100", "--tp", "4", "--concurrency", "8",
            "--input-len", "4096", "--output-len", "64"]
    shared = CliRunner().invoke(app, base + ["--prefix-len", "2048", "--json"])
    fresh = CliRunner().invoke(app, base + ["--json"])
    assert shared.exit_code == 0 and fresh.exit_code == 0, shared.output + fresh.output
    with_prefix, without = json.loads(shared.output), json.loads(fresh.output)
    assert with_prefix["prefix_len"] == 2048 and with_prefix["rows"][0]["prefix_hit_share"] > 0.4
    assert with_prefix["rows"][0]["ttft_p50_ms"] < without["rows"][0]["ttft_p50_ms"]
    for extra, message in ((["--prefix-len", "4096"], "from 0 to less than --input-len (4096)"),
                           (["--prefix-len", "-1"], "from 0 to less than")):
        result = CliRunner().invoke(app, base + extra)
        assert result.exit_code == 2 and message in result.output


def test_the_prefix_aware_router_reads_the_servers_reports_so_a_burst_at_one_instant_goes_to_one():
    """Behind llm-d's default profile the router knows the queues and KV caches only as the servers
    last reported them (each step's end, read every 50 ms): requests arriving together all see the
    same reports and go where the KV cache was freest; spread over a second, the reports between
    them send them apart. Least-outstanding counts its own requests and spreads the burst."""
    from specbench.fleet.router import simulate_fleet

    def cost(prefill_tokens, decode_rows, k=0):
        return 0.005 + 1e-5 * prefill_tokens + 1e-4 * decode_rows

    spec = ReplicaSpec(max_num_seqs=64, max_num_batched_tokens=2048, kv_capacity_tokens=100_000)
    # one long request on a replica (its KV cache fuller), then 6 new prompts at one instant
    prompts, outputs = np.array([4000] + [3000] * 6), np.array([2000] + [500] * 6)
    together = np.array([0.0] + [1.0] * 6)
    aware = simulate_fleet(prompts, outputs, together, cost, spec, 2, "prefix-aware").replica_of
    assert aware[0] == 0 and (aware[1:] == 1).all()
    blind = simulate_fleet(prompts, outputs, together, cost, spec, 2, "least-outstanding").replica_of
    assert set(blind[1:]) == {0, 1}
    apart = np.array([0.0] + list(1.0 + 0.2 * np.arange(6)))
    assert set(simulate_fleet(prompts, outputs, apart, cost, spec, 2, "prefix-aware").replica_of[1:]) == {0, 1}


def test_a_fleet_the_prefix_aware_router_leaves_idle_is_not_grown_and_says_so():
    """Every prompt opens with the same system prompt (half of it): cached on the replica that took
    the first request, it outscores the others' free KV caches for every later request, so that one
    replica misses the SLO and more replicas would sit idle too: no number of them, and the answer
    says how many of how many were used (the fleet doubled and its router used none of the replicas
    added); least-outstanding spreads the same traffic and meets it."""
    import pandas as pd

    from specbench.fleet.plan import answer
    from specbench.fleet.sizing import Objective, Traffic, fewest_replicas

    def cost(prefill_tokens, decode_rows, k=0):
        return 0.01 + 1e-4 * prefill_tokens + 1e-3 * decode_rows

    count = 200
    traffic = Traffic("system prompt", np.arange(count) * 0.05, np.full(count, 1024), np.full(count, 64),
                      [("system", ("own", i)) for i in range(count)], 512)
    spec = ReplicaSpec(max_num_seqs=64, max_num_batched_tokens=2048, kv_capacity_tokens=200_000, prefix_caching=True)
    objective = Objective((("ttft", 0.5),), 90)
    idle: list = []
    assert fewest_replicas(traffic, 1.0, cost, spec, None, objective, "prefix-aware", 0.0, idle=idle) is None
    assert idle == [(2, 1)]  # (one replica missed; at 2 the router used only that one)
    assert fewest_replicas(traffic, 1.0, cost, spec, None, objective, "least-outstanding", 0.0) is not None
    row = {"draft": "autoregressive", "tp": 1, "scale": 1.0, "request_rate": 20.0, "replicas": np.nan,
           "reachable": True, "idle_at": 2, "used_at": 1}
    text = answer(pd.DataFrame([row]), "system prompt", "llama3-8b", "H100", "p90 TTFT ≤ 0.5 s", 0.0)
    assert "needs no number of replicas of llama3-8b TP1 on H100 behind this router (of 2 it used 1" in text


def test_a_replica_count_speculation_changes_carries_what_the_checks_say_of_that_change():
    """On a run's fitted steps, 9 replicas without speculation and 10 with it: the sentence adds what
    the CPU replays said of an effect that size (11 %); the same counts on the tables add nothing."""
    import pandas as pd

    from specbench.fleet.plan import answer
    from specbench.fleet.served import direction_note

    base = {"tp": 1, "scale": 1.0, "request_rate": 1.0, "reachable": True, "dollars_per_month": np.nan,
            "tpot_p50_ms": 100.0}
    rows = pd.DataFrame([{**base, "draft": "autoregressive", "replicas": 9, "configuration": "without speculation"},
                         {**base, "draft": "ngram", "replicas": 10, "configuration": "ngram K=2 (measured α)"}])
    on_run = answer(rows, "azure-conv", "t", "", "p90 TTFT ≤ 30 s", 0.2, "servers", evidence=direction_note)
    assert "every speculation needs more: 10 replicas with ngram K=2 (measured α) (an effect 10% to 20% had the " \
           "measured direction in 8 of the CPU replays' 11 predictions: measure it)" in on_run
    assert "CPU replays" not in answer(rows, "azure-conv", "t", "H100", "p90 TTFT ≤ 30 s", 0.2)


def test_the_replicas_chart_marks_a_scale_no_number_of_replicas_meets(tmp_path, monkeypatch):
    """A scale a configuration gets no number for is not left out of the chart: a triangle at the
    top, in its line's colour, and a legend line saying what the triangle means."""
    import matplotlib.figure
    import pandas as pd

    from specbench.fleet.plan import replicas_chart

    drawn = []
    saved = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(matplotlib.figure.Figure, "savefig", lambda fig, *a, **k: (drawn.append(fig), saved(fig, *a, **k)))
    table = pd.DataFrame([
        {"tp": 4, "configuration": "autoregressive", "draft": "autoregressive", "scale": 1.0, "replicas": 3.0},
        {"tp": 4, "configuration": "autoregressive", "draft": "autoregressive", "scale": 2.0, "replicas": 6.0},
        {"tp": 4, "configuration": "1b K=3", "draft": "1b", "scale": 1.0, "replicas": 2.0},
        {"tp": 4, "configuration": "1b K=3", "draft": "1b", "scale": 2.0, "replicas": np.nan}])
    replicas_chart(table, tmp_path / "replicas.png", "SIMULATED: a title")
    ax = drawn[0].axes[0]
    triangles = [line for line in ax.get_lines() if line.get_marker() == "^"]
    assert len(triangles) == 1 and list(triangles[0].get_xdata()) == [2.0]
    assert triangles[0].get_ydata()[0] > 6.0 and ax.get_ylim()[1] > triangles[0].get_ydata()[0]
    assert any("no number of replicas" in text.get_text() for text in ax.texts)
    replicas_chart(table.assign(replicas=np.nan), tmp_path / "none.png", "SIMULATED: none met")
    assert (tmp_path / "none.png").stat().st_size > 5_000 and drawn[1].axes[0].get_ylim() == (0.0, 2.0)
