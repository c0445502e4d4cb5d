"""Live traffic without vLLM: open-loop arrivals, SLO goodput and its gate, K schedules and the
--speculative-config they become, and --endpoint on a server specbench did not start (the stand-in
of tests/fake_vllm). The same on a real vLLM server is in test_vllm.py."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.fit import parse_slo, slo_capacity, slo_table
from specbench.gate import FAIL, PASS, UNANSWERABLE, evaluate_slo
from specbench.grid import (
    OPEN_ENDED, EngineOptions, GridOptions, LoadOptions, SweepConfig, format_schedule, parse_schedule, plan_cells,
    schedule_k,
)
from specbench.results import load_run
from specbench.served.client import arrival_times
from specbench.served.server import ServerProcess, free_port
from tests.conftest import assert_in_contract
from tests.test_served import SERVER_MARK, fake_vllm, target_dir  # noqa: F401 (fixtures)

runner = CliRunner()


# --- arrivals ------------------------------------------------------------------------------------

def test_poisson_arrivals_are_seeded_and_end_at_count_over_rate():
    first, again = arrival_times(200, 4.0, seed=[0, 0, 7]), arrival_times(200, 4.0, seed=[0, 0, 7])
    assert first == again and first != arrival_times(200, 4.0, seed=[1, 0, 7])
    assert first[-1] == pytest.approx(200 / 4.0) and all(b >= a for a, b in zip(first, first[1:]))
    gaps = np.diff([0.0] + first)
    assert np.std(gaps) / np.mean(gaps) == pytest.approx(1.0, abs=0.2)  # exponential gaps: CV 1
    bursty = np.diff([0.0] + arrival_times(200, 4.0, burstiness=0.25, seed=3))
    assert np.std(bursty) / np.mean(bursty) > 1.5  # gamma of shape 0.25: CV 2
    assert arrival_times(5, float("inf")) == [0.0] * 5


# --- K schedules and SLOs ------------------------------------------------------------------------

def test_k_schedules_read_as_check_prints_them():
    assert parse_schedule("{1-8: 4, 9-32: 2, 33+: off}") == [(1, 8, 4), (9, 32, 2), (33, OPEN_ENDED, 0)]
    assert parse_schedule("1=3;2+=1") == [(1, 1, 3), (2, OPEN_ENDED, 1)]
    schedule = parse_schedule("{1-4: 3, 5+: off}")
    assert format_schedule(schedule) == "{1-4: 3, 5+: off}"
    assert [schedule_k(schedule, b) for b in (1, 4, 5, 1000)] == [3, 3, 0, 0]
    for bad, message in (("{2-8: 4}", "from 1 up"), ("{1-4: 3, 4+: 1}", "from 1 up"), ("{1+: off}", "never drafts"),
                         ("{1-x: 3}", "cannot read")):
        with pytest.raises(ValueError, match=message):
            parse_schedule(bad)


def test_a_scheduled_draft_is_one_cell_per_group_at_its_k():
    config = SweepConfig(grid=GridOptions(drafts=["ngram", "ngram@schedule:{1: 3, 2+: 1}"], ks=[2], temperatures=[0.0],
                                          workloads=["chat"]),
                         load=LoadOptions(batch_sizes=[1, 4]), engine=EngineOptions(name="vllm"))
    cells = {c.id for c in plan_cells(config)}
    assert "chat|B1|T0|ngram@schedule:{1: 3, 2+: 1}|K3" in cells and "chat|B4|T0|ngram@schedule:{1: 3, 2+: 1}|K1" in cells
    assert len(cells) == 2 * 3
    rates = SweepConfig(grid=GridOptions(drafts=["ngram"], ks=[2], temperatures=[0.0], workloads=["chat"]),
                        load=LoadOptions(request_rates=[2.0, float("inf")]), engine=EngineOptions(name="vllm"))
    assert [c.id for c in plan_cells(rates)] == ["chat|R2|T0|autoregressive", "chat|R2|T0|ngram|K2",
                                                 "chat|Rinf|T0|autoregressive", "chat|Rinf|T0|ngram|K2"]


def test_slos_parse_with_a_percentile():
    slo = parse_slo("ttft=1.0,tpot=0.05,p90")
    assert dict(slo.bounds) == {"ttft": 1.0, "tpot": 0.05} and slo.percentile == 90
    assert parse_slo("ttft:2").percentile == 99
    assert slo.describe() == "p90 TTFT ≤ 1 s and TPOT ≤ 50 ms"
    for bad in ("ttft=abc", "latency=1", "p42,ttft=1", "tpot=-1", ""):
        with pytest.raises(ValueError):
            parse_slo(bad)


@pytest.mark.parametrize("args, message", [
    (["--request-rates", "2,4"], "needs a served engine"),
    (["--engine", "vllm", "--request-rates", "0"], "request rates must be > 0"),
    (["--engine", "vllm", "--request-rates", "2", "--batch-sizes", "1"], "one or the other"),
    (["--engine", "vllm", "--request-rates", "2", "--burstiness", "0"], "--burstiness must be > 0"),
    (["--engine", "vllm", "--slo", "ttft=fast"], "--slo"),
    (["--drafts", "ngram@schedule:{1: 3}"], "K schedule runs on a served engine"),
    (["--engine", "vllm", "--drafts", "ngram@schedule:{2+: 3}"], "from 1 up"),
    (["--endpoint", "localhost:8000"], "http(s) URLs"),
    (["--baseline-endpoint", "http://x", "--drafts", "ngram"], "alone measures the baseline only"),
    (["--endpoint", "http://127.0.0.1:9,http://127.0.0.1:9/v1"], "names a server twice"),
    (["--endpoint", "http://127.0.0.1:9,127.0.0.1:10"], "http(s) URLs"),
    (["--endpoint", "http://127.0.0.1:9,http://127.0.0.1:10", "--router", "random"], "--router must be one of"),
    (["--endpoint", "http://127.0.0.1:9", "--router", "round-robin"], "several servers"),
    (["--endpoint", "http://127.0.0.1:9", "--drafts", "a,b"], "one label"),
])
def test_bad_live_traffic_input_is_one_line(args, message, tmp_path):
    result = runner.invoke(app, ["sweep", "--output", str(tmp_path / "x"), *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and len(result.output.strip().splitlines()) == 1


def test_an_unreachable_endpoint_is_one_line(tmp_path):
    result = runner.invoke(app, ["sweep", "--endpoint", f"http://127.0.0.1:{free_port()}", "--batch-sizes", "1",
                                 "--workloads", "chat", "--temperatures", "0", "--output", str(tmp_path / "x")])
    assert result.exit_code == 2 and "cannot reach the endpoint" in result.output, result.output


# --- the SLO gate on hand-made tables -------------------------------------------------------------

def _cells_and_requests(ar_ttft: dict[float, float], sd_ttft: dict[float, float], count: int = 400):
    """Two rates, `count` requests each (enough to bound a p99: 368), every request of a cell with
    the same TTFT; 2 s per cell."""
    cells, requests = [], []
    for mode, draft, k, ttfts in (("autoregressive", "autoregressive", 0, ar_ttft), ("speculative", "d", 2, sd_ttft)):
        for rate, ttft in ttfts.items():
            cell_id = f"chat|R{rate:g}|T0|{draft}"
            cells.append({"cell_id": cell_id, "status": "ok", "mode": mode, "draft": draft, "k": k, "workload": "chat",
                          "temperature": 0.0, "batch_size": 0, "request_rate": rate, "wall_s": 2.0,
                          "tokens_per_s": 100.0 * rate})
            requests += [{"cell_id": cell_id, "ttft_s": ttft, "tpot_s": 0.01, "e2e_s": ttft + 1} for _ in range(count)]
    return pd.DataFrame(cells), pd.DataFrame(requests)


def test_the_slo_gate_passes_fails_and_cannot_answer():
    slo = parse_slo("ttft=1.0")
    cells, requests = _cells_and_requests({1.0: 0.5, 4.0: 0.8}, {1.0: 0.4, 4.0: 1.5})
    table = slo_table(cells, requests, slo)
    assert table.set_index("cell_id").loc["chat|R4|T0|d", "goodput_rps"] == 0.0
    assert table.set_index("cell_id").loc["chat|R4|T0|autoregressive", "goodput_rps"] == pytest.approx(400 / 2.0)
    capacity = slo_capacity(table).set_index("draft")["max_load"]
    assert capacity["autoregressive"] == 4.0 and capacity["d"] == 1.0
    assert evaluate_slo(cells, requests, slo, state=None).exit_code == FAIL  # speculation lowers the sustainable rate
    few = evaluate_slo(*_cells_and_requests({1.0: 0.5, 4.0: 0.8}, {1.0: 0.4, 4.0: 1.5}, count=4), slo, state=None)
    assert few.exit_code == 3 and "from 368 requests on" in few.advice  # 4 requests cannot bound a p99
    cells, requests = _cells_and_requests({1.0: 0.5, 4.0: 1.8}, {1.0: 0.4, 4.0: 0.9})
    assert evaluate_slo(cells, requests, slo, state=None).exit_code == PASS
    cells, requests = _cells_and_requests({1.0: 3.0, 4.0: 3.0}, {1.0: 3.0, 4.0: 3.0})
    result = evaluate_slo(cells, requests, slo, state=None)
    assert result.exit_code == UNANSWERABLE and "no measured load meets" in result.message


# --- on the stand-in server ----------------------------------------------------------------------

def test_an_open_loop_sweep_sends_at_the_seeded_arrivals_and_check_slo_judges_it(fake_vllm, target_dir, tmp_path):
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["sweep", "--engine", "vllm", "--target", target_dir, "--drafts", "ngram", "--k", "2",
                                 "--request-rates", "8,30", "--temperatures", "0", "--workloads", "chat",
                                 "--max-new-tokens", "8", "--num-prompts", "6", "--dtype", "fp32", "--output",
                                 str(run_dir), "--server-timeout", "60", "--slo", "ttft=2,tpot=0.5"])
    assert result.exit_code == 0, result.output
    run = load_run(run_dir)
    cells = run.cells.set_index("cell_id")
    assert set(cells.index) == {"chat|R8|T0|autoregressive", "chat|R8|T0|ngram|K2", "chat|R30|T0|autoregressive",
                                "chat|R30|T0|ngram|K2"}
    assert (cells["batch_size"] == 0).all() and (cells["lossless"].dropna() == "exact").all()
    for cell_id, rate in (("chat|R8|T0|ngram|K2", 8.0), ("chat|R30|T0|autoregressive", 30.0)):
        rows = run.requests[run.requests["cell_id"] == cell_id].sort_values("request_id")
        expected = arrival_times(6, rate, seed=[0, 0, 7])
        assert sorted(rows["arrival_s"]) == pytest.approx(expected)  # the same traffic for every cell of a rate
        assert (rows["start_offset_s"] >= rows["arrival_s"] - 1e-3).all()  # never sent early
        assert (rows["send_lag_s"] < 0.25).all()
    # goodput by hand: requests meeting both bounds over the cell's measured time
    cell_id = "chat|R8|T0|autoregressive"
    rows = run.requests[run.requests["cell_id"] == cell_id]
    good = ((rows["ttft_s"] <= 2) & (rows["tpot_s"] <= 0.5)).sum()
    table = slo_table(run.cells, run.requests, parse_slo("ttft=2,tpot=0.5")).set_index("cell_id")
    assert table.loc[cell_id, "goodput_rps"] == pytest.approx(good / cells.loc[cell_id, "wall_s"])
    assert cells.loc[cell_id, "achieved_request_rate"] == pytest.approx(6 / cells.loc[cell_id, "wall_s"])

    open_ = runner.invoke(app, ["check", str(run_dir)])  # the run's own --slo: a p99 of 6 requests is not bounded
    assert open_.exit_code == 3 and "from 368 requests on" in open_.output, open_.output
    passed = runner.invoke(app, ["check", str(run_dir), "--slo", "ttft=2,tpot=0.5,p50"])  # 6 requests bound a p50
    assert passed.exit_code == 0 and "highest request rate" in passed.output, passed.output
    nothing = runner.invoke(app, ["check", str(run_dir), "--slo", "ttft=0.000001"])
    assert nothing.exit_code == 2 and "no measured load meets" in nothing.output, nothing.output
    assert runner.invoke(app, ["check", str(run_dir), "--slo", "ttft=soon"]).exit_code == 2
    as_json = runner.invoke(app, ["check", str(run_dir), "--json"])
    assert json.loads(as_json.output)["load"] == "request_rate"
    reported = runner.invoke(app, ["report", str(run_dir)])
    assert reported.exit_code == 0, reported.output
    page = (run_dir / "report" / "report.html").read_text()
    assert "class=answer" in page and "Under p99 TTFT" in page
    summary = (run_dir / "report" / "summary.md").read_text()
    assert "| workload | request_rate | temperature |" in summary  # the load column, not batch_size 0
    assert {p.name for p in (run_dir / "report").glob("*.png")} >= {"throughput_vs_latency.png", "goodput.png"}


def test_check_hands_back_a_speculative_config_with_the_k_schedule(fake_vllm, target_dir, tmp_path):
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["sweep", "--engine", "vllm", "--target", target_dir, "--drafts",
                                 "ngram:4,ngram@schedule:{1: 3, 2+: 1}", "--k", "1,2", "--batch-sizes", "1,3",
                                 "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "8",
                                 "--num-prompts", "3", "--dtype", "fp32", "--output", str(run_dir),
                                 "--server-timeout", "60", "--repeats", "2"])  # an interval: a K shown to pay
    assert result.exit_code == 0, result.output
    cells = load_run(run_dir).cells.set_index("cell_id")
    assert cells.loc["chat|B3|T0|ngram@schedule:{1: 3, 2+: 1}|K1", "k_schedule"] == "{1: 3, 2+: 1}"
    checked = runner.invoke(app, ["check", str(run_dir), "--min-speedup", "0.01", "--json"])
    verdicts = {v["draft"]: v for v in json.loads(checked.output)["verdicts"]}
    config = verdicts["ngram:4"]["speculative_config"]
    assert config["method"] == "ngram" and config["prompt_lookup_max"] == 4
    best = verdicts["ngram:4"]["best_k"]
    assert config["num_speculative_tokens"] == max(best.values())
    assert config["num_speculative_tokens_per_batch_size"] == [[1, 1, best["1"]], [2, OPEN_ENDED, best["3"]]] \
        if best["1"] != best["3"] else [[1, OPEN_ENDED, best["1"]]]
    text = runner.invoke(app, ["check", str(run_dir), "--min-speedup", "0.01"]).output
    assert "--speculative-config '" in text
    pasted = text.split("vLLM, ngram:4: --speculative-config '")[1].split("'")[0]
    assert json.loads(pasted) == config
    # a draft that never meets the bar gets no config to paste
    never = json.loads(runner.invoke(app, ["check", str(run_dir), "--min-speedup", "1000", "--json"]).output)
    assert all(v["speculative_config"] is None for v in never["verdicts"])


def test_an_endpoint_is_measured_with_its_counters_and_the_api_key_is_never_written(fake_vllm, target_dir, tmp_path):
    fake_vllm.setenv("SPECBENCH_TEST_KEY", "sk-secret-123")
    fake_vllm.setenv("FAKE_VLLM_API_KEY", "sk-secret-123")  # the servers refuse requests without it
    servers = []
    for spec in (None, {"method": "ngram", "num_speculative_tokens": 3}):
        extra = ["--speculative-config", json.dumps(spec)] if spec else []
        server = ServerProcess.on_free_port(lambda port, extra=extra: [sys.executable, "-m", SERVER_MARK, "--port", str(port), *extra],
                                            tmp_path / f"server{len(servers)}.log")
        server.start()
        server.wait_until_healthy(60)
        servers.append(server)
    baseline, speculative = servers
    try:
        run_dir = tmp_path / "run"
        result = runner.invoke(app, ["sweep", "--endpoint", speculative.url + "/v1", "--baseline-endpoint",
                                     baseline.url, "--target", target_dir, "--batch-sizes", "1,2",
                                     "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "12",
                                     "--num-prompts", "2", "--api-key-env", "SPECBENCH_TEST_KEY",
                                     "--output", str(run_dir)])
        assert result.exit_code == 0, result.output
        assert speculative.alive() and baseline.alive()  # specbench does not stop what it did not start
    finally:
        for server in servers:
            server.stop()
    run = load_run(run_dir)
    cells = run.cells.set_index("cell_id")
    assert set(cells.index) == {"chat|B1|T0|autoregressive", "chat|B1|T0|endpoint|K0",
                                "chat|B2|T0|autoregressive", "chat|B2|T0|endpoint|K0"}
    sd = cells[cells["mode"] == "speculative"]
    # the stand-in streams chunks of K+1 = 4 and counts each later chunk as a draft of 3, all accepted
    assert (sd["alpha"] == 1.0).all() and (sd["tau"] == 4.0).all() and (sd["k_drafted_mean"] == 3.0).all()
    assert (sd["acceptance_source"] == "vllm:spec_decode counters").all() and (sd["lossless"] == "exact").all()
    assert sd["speedup"].notna().all()
    assert run.meta["engine"]["api_key_sent"] is True
    assert_in_contract(run)
    # report: the memory an endpoint's server uses is not visible here, so that chart is skipped, and said so
    report = runner.invoke(app, ["report", str(run_dir)])
    assert report.exit_code == 0, report.output
    page = (run_dir / "report" / "report.html").read_text()
    assert "charts not drawn" in page and "no memory was measured (an endpoint" in page
    assert not (run_dir / "report" / "memory.png").exists() and (run_dir / "report" / "speedup_vs_batch.png").exists()
    for path in run_dir.rglob("*"):
        if path.is_file():
            assert b"sk-secret-123" not in path.read_bytes(), path


def test_the_client_routes_as_the_fleet_simulator_does():
    """least-outstanding: the fewest in flight, ties to the server chosen longest ago; round-robin:
    in turn whatever their load (fleet.router simulates the same two)."""
    from specbench.served.client import Router

    router = Router(3)
    assert [router.choose() for _ in range(3)] == [0, 1, 2]
    router.finished(1)
    assert router.choose() == 1  # the only one with nothing in flight
    assert router.choose() == 0  # all at one in flight: 0 was chosen longest ago
    turns = Router(3, "round-robin")
    turns.finished(turns.choose())
    assert [turns.choose() for _ in range(4)] == [1, 2, 0, 1]
    with pytest.raises(ValueError, match="router must be one of"):
        Router(2, "random")


def test_the_client_routes_prefix_aware_as_the_fleet_simulator_does():
    """prefix-aware: the first turns of conversations A, B and C, then A's second, whose first half
    is A's first turn: it goes where A went (3 × 0.5 above the other server), as the simulator's
    router sends it (tests/test_fleet.py); a prompt shared nowhere goes to the shorter queue, then to
    the KV cache with more room, then as least-outstanding."""
    from specbench.served.client import Router, ServerState, prompt_block_keys

    turn = {name: [ord(name)] * 512 for name in "ABC"}
    router = Router(2, "prefix-aware")
    assert [router.choose(turn[name]) for name in "ABC"] == [0, 1, 0]
    assert router.choose(turn["A"] + [7] * 512) == 0
    assert len(prompt_block_keys(turn["A"] + [7] * 10)) == 32  # whole 16-token blocks only
    fresh = Router(3, "prefix-aware")
    fresh.states = [ServerState(waiting=4), ServerState(waiting=0), ServerState(waiting=0, kv_usage=0.5)]
    assert fresh.choose([1] * 64) == 1  # shortest queue, most room
    fresh.states = [ServerState(waiting=2)] * 3
    assert fresh.choose([2] * 64) == 0  # all equal: the one chosen longest ago with nothing in flight


def test_an_endpoint_list_spreads_each_load_over_its_servers(fake_vllm, target_dir, tmp_path):
    """--endpoint A,B: each request goes to one of them (round-robin here: in turn), the requests
    table says which, the spec-decode counters are both servers' summed, each server's KV cache is
    in run.json, and the fleet simulator reads the cell as two replicas behind that router."""
    from specbench.fleet.served import cell_loads

    servers = []
    try:
        for index in range(2):
            server = ServerProcess.on_free_port(
                lambda port: [sys.executable, "-m", SERVER_MARK, "--port", str(port), "--speculative-config",
                              json.dumps({"method": "ngram", "num_speculative_tokens": 3})],
                tmp_path / f"server{index}.log")
            server.start()
            servers.append(server)
        for server in servers:
            server.wait_until_healthy(60)
        run_dir = tmp_path / "run"
        urls = ",".join(server.url for server in servers)
        result = runner.invoke(app, ["sweep", "--endpoint", urls, "--router", "round-robin", "--target", target_dir,
                                     "--batch-sizes", "2", "--temperatures", "0", "--workloads", "chat",
                                     "--max-new-tokens", "12", "--num-prompts", "4", "--output", str(run_dir)])
        assert result.exit_code == 0, result.output
        assert "each load spread over its servers (round-robin)" in result.output
        # --baseline-endpoint alone: the servers measured as a plain fleet, baseline cells only
        plain = runner.invoke(app, ["sweep", "--baseline-endpoint", urls, "--target", target_dir, "--batch-sizes", "3",
                                    "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "8",
                                    "--num-prompts", "3", "--output", str(tmp_path / "plain")])
        assert plain.exit_code == 0, plain.output
        assert "the baseline alone" in plain.output
        # prefix-aware: the servers' queues read from their /metrics while the load runs
        aware = runner.invoke(app, ["sweep", "--baseline-endpoint", urls, "--router", "prefix-aware", "--target",
                                    target_dir, "--batch-sizes", "2", "--temperatures", "0", "--workloads", "chat",
                                    "--max-new-tokens", "4", "--num-prompts", "2", "--output", str(tmp_path / "aware")])
        assert aware.exit_code == 0, aware.output
        assert "each load spread over its servers (prefix-aware)" in aware.output
    finally:
        for server in servers:
            server.stop()
    run = load_run(run_dir)
    cell = run.cells.iloc[0]
    assert cell["endpoint"] == urls and run.meta["engine"]["router"] == "round-robin"
    requests = run.requests.sort_values("start_offset_s")
    assert list(requests["replica"]) == [0, 1, 0, 1]  # sent in turn
    # each server counted the drafts of its 2 requests (3 per 12-token request): 6 each, 12 summed
    assert cell["num_drafts"] == 4 * 3 and cell["alpha"] == 1.0 and cell["tau"] == 4.0
    assert [s["kv_cache"]["kv_cache_size_tokens"] for s in run.meta["engine"]["servers"]] == ["2048", "2048"]
    assert_in_contract(run)
    (load,) = cell_loads(run.cells, run.requests, meta=run.meta)
    assert (load.replicas, load.router, load.spec.kv_capacity_tokens) == (2, "round-robin", 2048)
    plain = load_run(tmp_path / "plain")
    assert list(plain.cells["draft"]) == ["autoregressive"] and plain.cells["endpoint"].iloc[0] == urls
    assert sorted(plain.requests["replica"]) == [0, 0, 1]  # least-outstanding: 3 at once over 2 servers
    assert_in_contract(plain)
    (base,) = cell_loads(plain.cells, plain.requests, meta=plain.meta)
    assert (base.draft, base.replicas, base.router) == ("autoregressive", 2, "least-outstanding")
    report = runner.invoke(app, ["report", str(tmp_path / "plain")])
    assert report.exit_code == 0, report.output
    page = (tmp_path / "plain" / "report" / "report.html").read_text()
    assert "no speculative cells (baselines only)" in page  # not an empty acceptance chart, nor "timing-only"
    assert not (tmp_path / "plain" / "report" / "acceptance.png").exists()


def test_a_fleets_batch_is_each_servers_and_its_timeline_their_sum():
    """Two servers at 20 + 20, then 33 + 0 running: no server ran at B >= 32 in the first sample
    (40 in all is not one batch of 40); one of four server-samples did; the timeline sums."""
    from specbench.served.measurement import batch_columns

    columns = batch_columns([[(0.0, 40.0, 1.0, (20.0, 20.0)), (0.25, 33.0, 0.0, (33.0, 0.0))]])
    assert columns["running_max"] == 33 and columns["running_mean"] == pytest.approx(73 / 4)
    assert columns["running_share_large"] == pytest.approx(0.25)
    assert columns["running_timeline"] == [40.0, 33.0] and columns["waiting_timeline"] == [1.0, 0.0]
    one = batch_columns([[(0.0, 40.0, 0.0, ())]])  # one server (no server label): its own count
    assert one["running_max"] == 40 and one["running_share_large"] == 1.0


def test_an_endpoint_run_without_a_baseline_reports_what_it_has(fake_vllm, target_dir, tmp_path):
    """--endpoint alone (a mode sweep accepts): no baseline, and a server without speculation counts
    no drafts. report reports it (no ZeroDivisionError in the acceptance chart), and a report that
    fails half way leaves no partial report/."""
    # a server that serves 2048 positions (as /v1/models says): the trace's 9000-token row is left
    # out, where it was sent and refused (HTTP 400)
    server = ServerProcess.on_free_port(
        lambda port: [sys.executable, "-m", SERVER_MARK, "--port", str(port), "--max-model-len", "2048"],
        tmp_path / "server.log")
    server.start()
    try:
        server.wait_until_healthy(60)
        run_dir = tmp_path / "run"
        result = runner.invoke(app, ["sweep", "--endpoint", server.url, "--target", target_dir, "--batch-sizes", "1",
                                     "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "8",
                                     "--num-prompts", "2", "--output", str(run_dir)])
        assert result.exit_code == 0, result.output
        trace = Path(__file__).parent / "fixtures" / "traces" / "azure.csv"
        traced = runner.invoke(app, ["sweep", "--endpoint", server.url, "--target", target_dir, "--trace", str(trace),
                                     "--trace-speedup", "2", "--temperatures", "0", "--workloads", "chat",
                                     "--output", str(tmp_path / "trace")])
        assert traced.exit_code == 0, traced.output
        # prompts past what the server serves: one line before anything is measured, not a failed cell
        too_long = runner.invoke(app, ["sweep", "--endpoint", server.url, "--target", target_dir, "--batch-sizes", "1",
                                       "--context-lengths", "4096", "--output", str(tmp_path / "long")])
    finally:
        server.stop()
    assert too_long.exit_code == 2 and len(too_long.output.strip().splitlines()) == 1, too_long.output
    assert "4096 + --max-new-tokens 48 needs 4152 positions; the endpoints serve a 2048-token context" in too_long.output
    assert not (tmp_path / "long" / "run.json").exists()  # nothing started: no run
    cells = load_run(run_dir).cells
    assert list(cells["mode"]) == ["speculative"] and cells["speedup"].isna().all()
    traced_run = load_run(tmp_path / "trace")
    skipped = "1 row(s) skipped: input + output beyond the endpoints' context (2040 tokens)"
    assert traced_run.meta["trace"]["skipped"] == {"input + output beyond the endpoints' context (2040 tokens)": 1}
    assert "4 requests over" in traced.output and skipped in traced.output  # the console says it, not run.json alone
    assert traced_run.meta["engine"]["context_limit"] == 2048  # what plan's fleet of these servers holds
    assert len(traced_run.requests) == 4 and (traced_run.cells["status"] == "ok").all()
    for reported_dir in (run_dir, tmp_path / "trace"):  # an endpoint --trace run was the same exit 4
        report = runner.invoke(app, ["report", str(reported_dir)])
        assert report.exit_code == 0, report.output
        assert (reported_dir / "report" / "report.html").exists()
        assert (reported_dir / "report" / "acceptance.png").exists()
        assert not [p for p in reported_dir.iterdir() if p.name.startswith(".report")]  # no staging left behind


def test_the_reports_answer_names_the_draft_check_judges():
    """Two drafts: `a` lowers the sustainable rate, `b` keeps it. check --slo judges the better
    one, b, and the report's one-sentence answer names the same draft."""
    from types import SimpleNamespace

    from specbench.report import answer

    slo = parse_slo("ttft=1.0")
    cells, requests = _cells_and_requests({1.0: 0.5, 4.0: 0.8}, {1.0: 0.4, 4.0: 1.5})
    more, more_requests = _cells_and_requests({1.0: 0.5, 4.0: 0.8}, {1.0: 0.4, 4.0: 0.9})
    b_cells = more[more["draft"] == "d"].assign(draft="b", cell_id=lambda f: f["cell_id"].str.replace("|d", "|b"))
    b_requests = more_requests[more_requests["cell_id"].str.endswith("|d")].assign(
        cell_id=lambda f: f["cell_id"].str.replace("|d", "|b"))
    cells = pd.concat([cells.replace({"draft": {"d": "a"}, "cell_id": {"chat|R1|T0|d": "chat|R1|T0|a",
                                                                       "chat|R4|T0|d": "chat|R4|T0|a"}}), b_cells])
    requests = pd.concat([requests.replace({"cell_id": {"chat|R1|T0|d": "chat|R1|T0|a",
                                                        "chat|R4|T0|d": "chat|R4|T0|a"}}), b_requests])
    result = evaluate_slo(cells, requests, slo, state=None)
    assert result.draft == "b" and result.exit_code == PASS
    capacity = slo_capacity(slo_table(cells, requests, slo)).assign(cost_per_1m=float("nan"))
    analysis = SimpleNamespace(capacity=capacity, slo=slo, load="request_rate", price=None, replayed=None)
    sentence = answer(analysis)
    assert "(b, K=2; chat, T=0)" in sentence and "(a," not in sentence, sentence


def test_a_trace_replay_sends_each_request_at_its_time_with_its_lengths(fake_vllm, target_dir, tmp_path):
    """--trace on the stand-in: the trace's arrivals (scaled), its output lengths exactly, prompts
    within 2 % of its input lengths, the server's running batch sampled, and what was skipped
    said; then check --slo judges it and report answers it."""
    from pathlib import Path

    trace = Path(__file__).parent / "fixtures" / "traces" / "azure.csv"
    fake_vllm.setenv("FAKE_VLLM_STEP_S", "0.1")  # requests long enough to overlap and to be sampled running
    run_dir = tmp_path / "run"
    result = runner.invoke(app, ["sweep", "--engine", "vllm", "--target", target_dir, "--drafts", "ngram", "--k", "2",
                                 "--trace", str(trace), "--trace-speedup", "2", "--temperatures", "0",
                                 "--workloads", "chat", "--dtype", "fp32", "--output", str(run_dir),
                                 "--server-timeout", "60", "--slo", "ttft=2,tpot=0.5,p50"])
    assert result.exit_code == 0, result.output
    run = load_run(run_dir)
    meta = json.loads((run_dir / "run.json").read_text())
    assert meta["trace"]["requests"] == 4 and meta["trace"]["skipped"] == {
        "input + output beyond the target's context (1012 tokens)": 1}  # 9000 + 14 tokens on a 1024 context
    cells = run.cells.set_index("cell_id")
    assert len(cells) == 2 and (cells["lossless"].dropna() == "exact").all()
    assert_in_contract(run)
    requests = run.requests
    assert (requests["output_tokens"] == requests["trace_output_tokens"]).all()
    error = (requests["prompt_tokens"] - requests["trace_input_tokens"]).abs()
    assert (error <= np.maximum(8, 0.02 * requests["trace_input_tokens"])).all()
    for _, rows in requests.groupby("cell_id"):  # the trace's times at twice its speed, for every cell
        assert sorted(rows["arrival_s"]) == pytest.approx([0.0, 0.026, 0.55, 1.07], abs=1e-3)
    assert (cells["trace_output_mismatches"] == 0).all() and (cells["trace_prompt_misses"] == 0).all()
    assert (cells["send_lag_p99_s"] < 0.25).all()
    # the machine's own stalls were probed beside the client: per request, and counted per cell
    assert (requests["machine_stall_s"] >= 0).all() and (cells["machine_stall_max_s"] >= 0).all()
    assert (cells["late_sends_machine"] <= cells["late_sends"]).all()
    assert (cells["running_max"] >= 1).all() and all(len(t) > 2 for t in cells["running_timeline"])
    judged = runner.invoke(app, ["check", str(run_dir)])
    assert judged.exit_code in (0, 1, 3) and judged.output.startswith(("PASS", "FAIL", "INCONCLUSIVE")), judged.output
    reported = runner.invoke(app, ["report", str(run_dir)])
    assert reported.exit_code == 0, reported.output
    assert "azure 0–" in reported.output and "B ≥ 32" in reported.output
    assert "send lag p50" in (run_dir / "report" / "summary.md").read_text()
    page = (run_dir / "report" / "report.html").read_text()
    assert "trace replay: each request at its time in azure" in page and "Poisson" not in page
    assert {p.name for p in (run_dir / "report").glob("*.png")} >= {"trace_latency.png", "trace_batch.png"}
    narrow = runner.invoke(app, ["sweep", "--engine", "vllm", "--target", target_dir, "--trace", str(trace),
                                 "--trace-window", "100:5", "--output", str(tmp_path / "empty")])
    assert narrow.exit_code == 2 and "no request of azure arrives in 100–105 s" in narrow.output
    native = runner.invoke(app, ["sweep", "--target", target_dir, "--trace", str(trace), "--output",
                                 str(tmp_path / "native")])
    assert native.exit_code == 2 and "served engine" in native.output


def test_a_cut_replay_says_what_it_replayed_and_a_slowdown_is_not_called_faster():
    """--trace-max-requests 12 of a 603-request window replays 2.25 s of it: the text says so (it
    read "600–720 s … 12 requests"); and a TPOT speed-up of 0.78× reads as slower, not "faster"."""
    from specbench.fit.replay import replay_answer
    from specbench.traces import load_trace, replay

    cut = replay(load_trace("azure-conv"), "600:120", 0.05, 12)
    assert cut.describe() == ("azure-conv 600.198–602.445 s (the first 12 of the 603 requests in 600–720 s, "
                              "--trace-max-requests) at 0.05× speed")
    assert replay(load_trace("azure-conv"), "600:120", 0.05).describe() == "azure-conv 600–720 s at 0.05× speed"
    row = {"draft": "ngram", "k": 2, "workload": "chat", "temperature": 0.0, "requests": 12, "tpot_p50_ms": 64.0,
           "tpot_p50_ms_baseline": 50.0, "tpot_p99_ms": 80.0, "tpot_p99_ms_baseline": 60.0, "tpot_speedup": 0.78,
           "tpot_speedup_low": 0.7, "tpot_speedup_high": 0.86, "e2e_speedup": 0.8, "share_b32": 0.0,
           "share_b32_baseline": 0.0, "running_max": 4}
    sentence = replay_answer(pd.DataFrame([row]), cut.describe())
    assert "TPOT 0.78× (slower)" in sentence and "end to end 0.8× (slower)" in sentence and "faster" not in sentence
    assert "TPOT 1.3× faster" in replay_answer(pd.DataFrame([{**row, "tpot_speedup": 1.3}]), "x")
