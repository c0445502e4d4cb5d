"""Does one one-core vLLM CPU server slow the other? Server A's TPOT and TTFT for a request alone
(512-token prompt, 64 tokens out, 6 in a row), with server B idle and with B kept busy by a
closed loop of 4 requests (2k-token prompts): what the two-server replay of fleet_check.md could
owe to the machine rather than to the step price. Both servers as measure.py starts them.

    python benchmarks/fleets/interference.py    # writes interference.md
"""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from measure import start_server  # noqa: E402

from specbench.served.client import run_closed_loop  # noqa: E402

HERE = Path(__file__).resolve().parent


def payloads(count: int, length: int, tokens: int, seed: int) -> list[dict]:
    rng = np.random.default_rng(seed)
    return [{"model": "specbench-target", "prompt": rng.integers(100, 40000, length).tolist(), "max_tokens": tokens,
             "min_tokens": tokens, "ignore_eos": True, "stream": True, "temperature": 0.0} for _ in range(count)]


def probe(url: str) -> tuple[float, float]:
    """Median TTFT and TPOT of 6 requests sent one at a time to `url`."""
    run = run_closed_loop(url + "/v1/completions", payloads(6, 512, 64, 1), 1, [512] * 6)
    assert not run.errors, run.errors[:1]
    ttft = [r.ttft_s for r in run.requests]
    tpot = [(r.e2e_s - r.ttft_s) / (len(r.arrivals_s) - 1) for r in run.requests]
    return float(np.median(ttft)), float(np.median(tpot))


def main() -> None:
    servers = []
    try:
        servers = [start_server(0, "interference-A-core0"), start_server(1, "interference-B-core1")]
        a, b = servers
        run_closed_loop(a.url + "/v1/completions", payloads(2, 512, 16, 2), 1, [512] * 2)  # warm-up
        run_closed_loop(b.url + "/v1/completions", payloads(2, 512, 16, 2), 1, [512] * 2)
        idle = probe(a.url)
        stop = threading.Event()

        def keep_busy() -> None:
            while not stop.is_set():
                run_closed_loop(b.url + "/v1/completions", payloads(4, 2048, 64, 3), 4, [2048] * 4)

        busy_thread = threading.Thread(target=keep_busy, daemon=True)
        busy_thread.start()
        busy = probe(a.url)
        stop.set()
        busy_thread.join()
        idle_again = probe(a.url)
    finally:
        for server in servers:
            server.stop()
    lines = ["# Server A alone, with server B idle and busy (one-core vLLM CPU servers, SmolLM2-135M fp32)", "",
             "| server B | A's p50 TTFT ms | A's p50 TPOT ms |", "|---|---|---|"]
    for label, (ttft, tpot) in (("idle", idle), ("busy (4 x 2k-token prompts, closed loop)", busy),
                                ("idle again", idle_again)):
        lines.append(f"| {label} | {ttft * 1e3:.0f} | {tpot * 1e3:.1f} |")
    (HERE / "interference.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
