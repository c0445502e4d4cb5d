"""What a served run's engine steps cost, read off its streamed tokens (issue 40, part 3: why
ngram K=2 decodes slower than the baseline past the knee).

A served run records no step times, but every request's token arrival times: a decode step ends
where the tokens of every row it decoded arrive together. The replay's token times, pooled over
its requests and told apart where they are more than 3 ms apart, are its steps' ends; each gap
between two is a step's time, shown against the running rows and their context (prompt plus the
tokens so far) at its middle. Gaps over 2 s (a prefill's chunks stalling the decodes) are left
out. Per cell, the median step by the decoding context's range.

    python benchmarks/cpu-replays/replay_steps.py [REPLAY_DIR ...]

Writes replay_steps.md next to this file.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pandas as pd

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
sys.path.insert(0, str(ROOT))

from specbench.results import load_run  # noqa: E402

# the wide sitting's closed-loop calibration at B 8 and 16 first: a fixed batch, no arrivals but each
# client's next prompt, so its steps are the cleanest; then replays, whose sparser context ranges hold
# steps that shared a short prefill chunk too
REPLAYS = [HERE / "wide-sitting/calibration-wide", HERE / "wide-sitting/replays/conv-1800-0.05",
           ROOT / "tests/fixtures/cpu/vllm-replays/conv-600-0.1", HERE / "one-sitting/replays/conv-1800-0.05"]
CONTEXT_BINS = [0, 5_000, 10_000, 20_000, 30_000, 45_000, 80_000]
SAME_STEP_S = 0.003  # tokens of one step arrive within this of each other
PREFILL_STALL_S = 2.0


def steps(requests: pd.DataFrame) -> pd.DataFrame:
    """Each step's time, running rows and decoding context, from one cell's requests."""
    tokens, spans = [], []
    for row in requests.itertuples():
        first = row.start_offset_s + row.ttft_s
        times = first + np.concatenate([[0.0], np.cumsum(np.asarray(row.itl_s, float))])
        tokens.append(times)
        spans.append((first, times, row.prompt_tokens))
    pooled = np.sort(np.concatenate(tokens))
    ends = pooled[np.concatenate([[True], np.diff(pooled) > SAME_STEP_S])]
    found = []
    for start, end in zip(ends[:-1], ends[1:]):
        middle, rows, context = (start + end) / 2, 0, 0
        for first, times, prompt in spans:
            if first < middle < times[-1]:
                rows += 1
                context += prompt + int(np.searchsorted(times, middle))
        found.append((end - start, rows, context))
    return pd.DataFrame(found, columns=["step_s", "rows", "context"])


def main() -> None:
    paths = [Path(p) for p in sys.argv[1:]] or REPLAYS
    lines = ["# A served run's engine steps, read off its streamed tokens", "",
             "Median step (ms) and median running rows, by the decoding context (tokens, every running "
             "row's prompt and output so far) at the step; the number of steps in brackets. "
             "`python benchmarks/cpu-replays/replay_steps.py`", ""]
    labels = [f"{lo // 1000}–{hi // 1000}k" for lo, hi in zip(CONTEXT_BINS, CONTEXT_BINS[1:])]
    for path in paths:
        run = load_run(path)
        lines += [f"## {path.resolve().relative_to(ROOT)}", "", "| cell | " + " | ".join(labels) + " |",
                  "|---|" + "---|" * len(labels)]
        for cell_id, requests in run.requests.groupby("cell_id", sort=False):
            found = steps(requests)
            found = found[found["step_s"] < PREFILL_STALL_S]
            binned = found.groupby(pd.cut(found["context"], CONTEXT_BINS, labels=labels), observed=False)
            cells = [f"{1e3 * g['step_s'].median():.0f} ms, {g['rows'].median():.0f} rows ({len(g)})" if len(g) else ""
                     for _, g in binned]
            lines.append(f"| {cell_id.split('|', 1)[-1].replace('|', ' ')} | " + " | ".join(cells) + " |")
        lines.append("")
    (HERE / "replay_steps.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
