"""The fleet simulator beside NVIDIA's own simulator on the same measured rows (issue 40, part 2).

Dynamo's DynoSim notes (ai-dynamo/dynamo, docs/blogs/digital-twin-simulation/HOPPER_README.md and
scripts/h100_qwen3_counterpart/) replay five of silicon_sample.csv's vLLM rows in Dynamo's Mocker, a
discrete-event simulator priced by aiconfigurator's vLLM 0.14 tables: Qwen3-32B bf16 on H100, TP2,
1024/1024 tokens, 8-128 clients. It states its replay: `block_size=64`, `max_num_batched_tokens=2048`,
`max_num_seqs=256`, `gpu_memory_utilization=0.9`, a synthetic closed loop of 10·C requests. It
publishes MAPE 13.8 % (TPOT) and 8.5 % (TTFT) against the measured rows; aiconfigurator's direct
estimate 14.6 % and 24.7 %.

This runs specbench's simulator on the same rows two ways, nothing fitted to them:
- as `silicon.py` runs every row (InferenceMAX's client, lengths 0.8-1x; vLLM's defaults: 8,192
  tokens a step, blocks of 16);
- as DynoSim states its replay (the flags above; every request at the row's lengths, the C clients
  started together, the means over all 10·C requests),
and the second on all 93 Qwen3-32B rows as well, to show whether that setup is better beyond the
five rows it was shown on.

    python benchmarks/silicon-rows/dynosim_rows.py      # seconds; writes dynosim_rows.md
"""

from __future__ import annotations

import sys
from pathlib import Path

import pandas as pd

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))
sys.path.insert(0, str(HERE.parent / "silicon-rows"))

import silicon  # noqa: E402  (the rows, their models and how silicon.py simulates them)
from specbench.fleet.plan import Clients  # noqa: E402
from specbench.fleet.tables import ServerFlags  # noqa: E402

MODEL = "Qwen/Qwen3-32B"
# DynoSim's stated replay of these rows (HOPPER_README.md, "Replay config" and "Replay workload"),
# on their server's vLLM 0.12 (synchronous scheduling)
DYNOSIM_SERVER = ServerFlags(block_size=64, max_num_batched_tokens=2048, max_num_seqs=256, async_scheduling=False)
DYNOSIM_CLIENTS = Clients("dynosim", together=True, requests_per_client=10, shortest_share=1.0, measure_all=True)


def as_dynosim(row: dict, forwards: dict) -> dict:
    """Mean TTFT and TPOT of `row` simulated under DynoSim's stated replay configuration."""
    cost, spec = silicon.priced_row(row, forwards, DYNOSIM_SERVER)
    found = silicon.mean_latencies(row, cost, spec, DYNOSIM_CLIENTS)
    return {"dynosim_setup_ttft_ms": found["ttft_ms"], "dynosim_setup_tpot_ms": found["tpot_ms"]}


def main() -> None:
    rows = [row for row in silicon.dense_vllm_rows() if row["model_path"] == MODEL]
    headline = pd.read_csv(HERE.parent / "silicon-rows" / "silicon.csv").set_index("id")
    forwards: dict = {}
    found = []
    for row in rows:
        try:
            simulated = as_dynosim(row, forwards)
        except ValueError as error:  # the weights do not fit: silicon.csv counts these rows too
            print(f"not simulated: {row['id']}: {error}")
            continue
        base = headline.loc[row["id"]]
        found.append({"id": row["id"], "tp": int(row["tp_size"]), "concurrency": int(row["batch_size"]),
                      "lengths": f"{row['isl']}/{row['osl']}", "measured_tpot_ms": float(row["silicon_tpot_ms"]),
                      "measured_ttft_ms": float(row["silicon_ttft_ms"]), "headline_tpot_ms": base["sim_tpot_ms"],
                      "headline_ttft_ms": base["sim_ttft_ms"], "aic_tpot_ms": base["aic_tpot_ms"],
                      "aic_ttft_ms": base["aic_ttft_ms"], **simulated})
    table = pd.DataFrame(found)
    for name in ("headline", "dynosim_setup", "aic"):
        for metric in ("tpot", "ttft"):
            table[f"{name}_{metric}_error"] = table[f"{name}_{metric}_ms"] / table[f"measured_{metric}_ms"] - 1
    shown = table[(table.tp == 2) & (table.lengths == "1024/1024")].sort_values("concurrency")

    def mape(frame: pd.DataFrame, name: str, metric: str) -> str:
        return f"{frame[f'{name}_{metric}_error'].abs().mean():.1%}"

    def median(frame: pd.DataFrame, name: str, metric: str) -> str:
        errors = frame[f"{name}_{metric}_error"]
        return f"{errors.abs().median():.1%} ({errors.median():+.1%})"

    lines = ["# specbench's simulator beside DynoSim on Qwen3-32B H100 rows (`dynosim_rows.py`)", "",
             "The five rows DynoSim replays (TP2, 1024/1024), mean TPOT and TTFT in ms, measured and simulated:", "",
             "| clients | measured TPOT | as silicon.py | as DynoSim's setup | measured TTFT | as silicon.py "
             "| as DynoSim's setup |", "|---|---|---|---|---|---|---|"]
    lines += [f"| {r.concurrency} | {r.measured_tpot_ms:.1f} | {r.headline_tpot_ms:.1f} | {r.dynosim_setup_tpot_ms:.1f} "
              f"| {r.measured_ttft_ms:.0f} | {r.headline_ttft_ms:.0f} | {r.dynosim_setup_ttft_ms:.0f} |"
              for r in shown.itertuples()]
    lines += ["", "MAPE on those five rows (DynoSim's own metric; its published figures beside):", "",
              "| | TPOT | TTFT |", "|---|---|---|",
              f"| specbench, as silicon.py (InferenceMAX's client, vLLM's defaults) | {mape(shown, 'headline', 'tpot')} "
              f"| {mape(shown, 'headline', 'ttft')} |",
              f"| specbench, as DynoSim states its replay | {mape(shown, 'dynosim_setup', 'tpot')} "
              f"| {mape(shown, 'dynosim_setup', 'ttft')} |",
              f"| aiconfigurator 0.12's estimate (silicon_aic.csv) | {mape(shown, 'aic', 'tpot')} | {mape(shown, 'aic', 'ttft')} |",
              "| DynoSim's Mocker replay, as published (vLLM 0.14 tables) | 13.8% | 8.5% |",
              "| aiconfigurator, as DynoSim published it (vLLM 0.14 tables) | 14.6% | 24.7% |", "",
              f"All {len(table)} Qwen3-32B rows simulated, median |error| (signed median):", "",
              "| | TPOT | TTFT |", "|---|---|---|",
              f"| as silicon.py | {median(table, 'headline', 'tpot')} | {median(table, 'headline', 'ttft')} |",
              f"| as DynoSim's setup | {median(table, 'dynosim_setup', 'tpot')} | {median(table, 'dynosim_setup', 'ttft')} |",
              f"| aiconfigurator 0.12 ({table['aic_tpot_error'].notna().sum()} rows) | {median(table, 'aic', 'tpot')} "
              f"| {median(table, 'aic', 'ttft')} |", ""]
    by_lengths = table.groupby("lengths").agg(
        rows=("id", "count"), headline=("headline_ttft_error", "median"), dynosim=("dynosim_setup_ttft_error", "median"))
    lines += ["Signed median TTFT error by length pair:", "", "| lengths | rows | as silicon.py | as DynoSim's setup |",
              "|---|---|---|---|"]
    lines += [f"| {key} | {int(g.rows)} | {g.headline:+.1%} | {g.dynosim:+.1%} |" for key, g in by_lengths.iterrows()]
    # every row aiconfigurator estimates, the Qwen3-32B ones run as DynoSim's setup, the others as silicon.py
    both = headline[headline["aic_tpot_error"].notna() & headline["not_simulated"].isna()].copy()
    as_setup = table.set_index("id")
    for metric in ("tpot", "ttft"):
        both.loc[both.index.intersection(as_setup.index), f"sim_{metric}_error"] = as_setup[f"dynosim_setup_{metric}_error"]
    lines += ["", f"On the {len(both)} rows aiconfigurator estimates, these rows as DynoSim's setup and the others as "
              f"silicon.py: median |TPOT error| {both['sim_tpot_error'].abs().median():.1%}, median |TTFT error| "
              f"{both['sim_ttft_error'].abs().median():.1%}."]
    (HERE / "dynosim_rows.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
