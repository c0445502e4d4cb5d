"""The Qwen3-32B silicon rows' TTFT against the output length, and two client models (issue 40, part 2).

The csv does not say which client measured NVIDIA's 93 Qwen3-32B vLLM rows (H100, bf16, TP 2-8,
8-128 clients). Their measured mean TTFT at one TP and concurrency hardly moves with the output
length (128, 512, 1024 tokens), as under clients of fixed lengths whose first wave persists, and
unlike random lengths, which spread long outputs' finishes (and so the next arrivals) further than
short ones'. This prints, per row, the measured TTFT beside the simulator's under InferenceMAX's
client (0.8-1x random lengths: the headline's, `fleet.plan.INFERENCEMAX`) and under fixed-length
clients all started at once (`fleet.plan.BENCH`), each served as silicon.py serves the row.

    python benchmarks/silicon-rows/qwen_waves.py   # about 10 s; writes qwen_waves.md beside it
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "silicon-rows"))

import silicon  # noqa: E402
from specbench.fleet.plan import BENCH, INFERENCEMAX  # noqa: E402


def simulated(rows: list[dict]) -> pd.DataFrame:
    forwards: dict = {}
    found = []
    for row in rows:
        cost, spec = silicon.priced_row(row, forwards, silicon.served_as(row))
        record = {"tp": int(row["tp_size"]), "isl": int(row["isl"]), "osl": int(row["osl"]),
                  "clients": int(row["batch_size"]), "measured_ttft_ms": float(row["silicon_ttft_ms"])}
        for clients in (INFERENCEMAX, BENCH):
            record[f"{clients.name}_ttft_ms"] = silicon.mean_latencies(row, cost, spec, clients)["ttft_ms"]
        found.append(record)
    return pd.DataFrame(found)


def spread_by_output(frame: pd.DataFrame, column: str) -> pd.Series:
    """Per TP, prompt length and concurrency: (max - min) / mean of the TTFT over the output lengths."""
    grouped = frame.groupby(["tp", "isl", "clients"])[column]
    return (grouped.max() - grouped.min()) / grouped.mean()


def main() -> None:
    rows = [row for row in silicon.dense_vllm_rows()
            if row["model_path"] == "Qwen/Qwen3-32B" and row["isl"] in ("1024", "4096")
            and row["osl"] in ("128", "512", "1024")]
    frame = simulated(rows)
    lines = ["# Qwen3-32B rows: TTFT against the output length, and two client models (`qwen_waves.py`)", "",
             f"{len(frame)} rows (H100, bf16; 1024- and 4096-token prompts, 128/512/1024 out). Spread: (max - min) / "
             "mean TTFT over the three output lengths at one TP, prompt length and concurrency (median over "
             "those groups, and at 8 clients).", "",
             "| TTFT | spread, median | spread at 8 clients, median | median error against measured, 1024 in | 4096 in |",
             "|---|---|---|---|---|"]
    eight = frame["clients"] == 8
    for column, label in (("measured_ttft_ms", "measured"), ("inferencemax_ttft_ms", "InferenceMAX's client"),
                          ("bench_ttft_ms", "fixed lengths, all at once")):
        spread = spread_by_output(frame, column)
        spread8 = spread_by_output(frame[eight], column)
        errors = {isl: "" if column == "measured_ttft_ms" else
                  f"{(frame[frame.isl == isl][column] / frame[frame.isl == isl]['measured_ttft_ms'] - 1).median():+.0%}"
                  for isl in (1024, 4096)}
        lines.append(f"| {label} | {spread.median():.1%} | {spread8.median():.1%} | {errors[1024]} | {errors[4096]} |")
    lines += ["", "Neither client fits both prompt lengths: fixed lengths keep the rows' insensitivity to the output "
              "length, and the 4096-token rows' TTFT, but the simulator's second step takes the rest of a "
              "1024-token wave at once, far above those rows. Nothing records how the rows were taken; the "
              "headline keeps InferenceMAX's client (docs/fleet-validation.md).", "",
              "| TP | in | clients | out | measured ms | InferenceMAX's client | fixed lengths, all at once |",
              "|---|---|---|---|---|---|---|"]
    for row in frame.sort_values(["isl", "tp", "clients", "osl"]).itertuples():
        lines.append(f"| {row.tp} | {row.isl} | {row.clients} | {row.osl} | {row.measured_ttft_ms:.0f} | "
                     f"{row.inferencemax_ttft_ms:.0f} | {row.bench_ttft_ms:.0f} |")
    text = "\n".join(lines) + "\n"
    (Path(__file__).resolve().parent / "qwen_waves.md").write_text(text)
    print("\n".join(lines[:12]))


if __name__ == "__main__":
    main()
