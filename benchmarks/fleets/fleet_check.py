"""The replica count checked (issue 40, part 4): the fleet simulator's p50 TTFT, TPOT and E2E
for one replay served by one vLLM CPU server and by two behind the client's router, predicted
from a step price fitted on a closed-loop calibration that saw no trace, against what
measure.py measured.

1. Fit: specbench.fleet.served.fit_served on `one-core-calibration` and `-4k` (server A alone,
   closed loop, baseline cells; the KV cache it logged).
2. Predict: each replay cell's requests at their measured arrival times, prompt and output
   lengths, on as many replicas as its `--endpoint` list had, behind the run's router
   (simulate_fleet; one replica: simulate).
3. Compare with the measured p50s, and the second server's effect (two against one) measured and
   predicted. A load spread over several servers is also predicted with the routing it measured
   (each server's own requests through one replica): what the step price alone explains, apart
   from the simulated router sending requests elsewhere.

    python benchmarks/fleets/fleet_check.py
    python benchmarks/fleets/fleet_check.py --probed
    python benchmarks/fleets/fleet_check.py --runs benchmarks/fleets/instrumented

Writes fleet_check.csv and fleet_check.md next to this file. `--probed`: the runs of probed.py
(probed/), each replay predicted twice: as above, and with the price scaled by the machine's speed
then against during the calibration (the probes' median TPOT around the replay, on each server,
over theirs around the calibration: every part of the price scaled alike); writes
fleet_check_probed.csv/.md. `--runs DIR`: measure.py's runs in DIR (`measure.py --out DIR`); writes
fleet_check.csv/.md in DIR.
"""

from __future__ import annotations

import argparse
import sys
from dataclasses import replace
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from specbench.fleet.replica import simulate  # noqa: E402
from specbench.fleet.served import cell_loads, fit_served, served_replica, simulate_load  # noqa: E402
from specbench.results import load_run, pool_runs  # noqa: E402

HERE = Path(__file__).resolve().parent
CALIBRATION = [HERE / "one-core-calibration", HERE / "one-core-calibration-4k"]
# probed.py's calibration: the tests read it too
PROBED_CALIBRATION = [HERE.parents[1] / "tests" / "fixtures" / "cpu" / name
                      for name in ("vllm-probed-calibration", "vllm-probed-calibration-4k")]
REPLAYS = [HERE / "one-server", HERE / "two-servers"]
TARGETS = {"tpot": 0.10, "ttft": 0.20, "e2e": 0.10}  # issue 40: p50 within 10 %, 20 %, 10 %
METRICS = ("ttft", "tpot", "e2e")
SLO = {"ttft": 5.0, "tpot": 0.15}  # an SLO one server misses at this rate: how many servers meet it


def scaled(price, factor: float):
    """The price on a machine `factor` times slower: every part of a step, and the per-request overhead."""
    return replace(price, floor_s=price.floor_s * factor, per_token_s=price.per_token_s * factor,
                   overhead_s=price.overhead_s * factor, per_context_token_s=price.per_context_token_s * factor,
                   per_prefill_pair_s=price.per_prefill_pair_s * factor)


def speed_factors(probes: pd.DataFrame) -> dict[str, dict[str, float]]:
    """Per replay, per server: the probes' TPOT around the replay over server A's around the calibration."""
    around = lambda server, what: float(probes[(probes["server"] == server)  # noqa: E731
                                               & probes["when"].str.endswith(what)]["tpot_s"].mean())
    calibration = around("A", "calibration")
    return {"one-server": {"A": around("A", "one-server") / calibration},
            "two-servers": {s: around(s, "two-servers") / calibration for s in ("A", "B")}}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--probed", action="store_true", help="probed.py's runs, predicted at the probed speed too")
    parser.add_argument("--runs", type=Path, help="measure.py --out's directory: its runs, and the table written there")
    args = parser.parse_args()
    base = HERE / "probed" if args.probed else (args.runs.resolve() if args.runs else HERE)
    out = base if args.runs else HERE
    factors = speed_factors(pd.read_csv(base / "probes.csv")) if args.probed else {}
    calibration = PROBED_CALIBRATION if args.probed else [base / path.name for path in CALIBRATION]
    runs = [load_run(path) for path in calibration]
    cells, requests, _ = pool_runs(runs)
    price, _ = fit_served(cells, requests, runs[0].meta, ", ".join(path.name for path in CALIBRATION))
    rows = []
    for path in REPLAYS:
        run = load_run(base / path.name)
        for load in cell_loads(run.cells, run.requests, meta=run.meta):
            measured = {"ttft": np.median(load.ttft_s), "tpot": np.nanmedian(load.tpot_s), "e2e": np.median(load.e2e_s)}
            predicted = simulate_load(price, served_replica(run.meta), load)
            mine = run.requests[run.requests["cell_id"] == load.cell_id]
            row = {"replay": path.name, "servers": load.replicas, "router": load.router, "requests": len(load.prompts),
                   "rate": float(run.cells.set_index("cell_id").loc[load.cell_id, "request_rate"]),
                   "requests_per_server": "/".join(str(int(n)) for n in mine["replica"].value_counts().sort_index()),
                   "running_mean": float(run.cells.set_index("cell_id").loc[load.cell_id, "running_mean"])}
            routed = as_routed(price, served_replica(run.meta), load, mine)
            speed = factors.get(path.name, {})
            if speed:  # the router's replicas share one price: the servers' mean factor
                at_speed = simulate_load(scaled(price, float(np.mean(list(speed.values())))),
                                         served_replica(run.meta), load)
                row["speed_factors"] = " ".join(f"{s} {f:.3f}" for s, f in speed.items())
            for m in METRICS:
                row[f"{m}_p50_measured_s"] = measured[m]
                row[f"{m}_p50_predicted_s"] = predicted[f"{m}_p50_s"]
                row[f"{m}_error"] = predicted[f"{m}_p50_s"] / measured[m] - 1
                row[f"{m}_p50_as_routed_s"] = routed[m]
                if speed:
                    row[f"{m}_p50_at_speed_s"] = at_speed[f"{m}_p50_s"]
                    row[f"{m}_error_at_speed"] = at_speed[f"{m}_p50_s"] / measured[m] - 1
            rows.append(row)
    table = pd.DataFrame(rows)
    suffix = "_probed" if args.probed else ""
    table.to_csv(out / f"fleet_check{suffix}.csv", index=False, float_format="%.6g")
    write_summary(table, price, out / f"fleet_check{suffix}.md", base)


def as_routed(price, spec, load, requests: pd.DataFrame) -> dict[str, float]:
    """p50 TTFT, TPOT and E2E with each server's measured requests through one replica of its own."""
    mine = requests[requests["output_tokens"] >= 1].sort_values("arrival_s")
    replica = mine["replica"].to_numpy()
    start = mine["arrival_s"].min()
    ttft, tpot, e2e = (np.full(len(mine), np.nan) for _ in range(3))
    for server in np.unique(replica):
        chosen = replica == server
        out = simulate(mine["prompt_tokens"].to_numpy(int)[chosen], mine["output_tokens"].to_numpy(int)[chosen],
                       price.cost(None), load.spec or spec, arrivals_s=mine["arrival_s"].to_numpy(float)[chosen] - start)
        ttft[chosen], tpot[chosen], e2e[chosen] = out.ttft_s + price.overhead_s, out.tpot_s, out.e2e_s + price.overhead_s
    return {"ttft": float(np.median(ttft)), "tpot": float(np.nanmedian(tpot)), "e2e": float(np.median(e2e))}


def write_summary(table: pd.DataFrame, price, out: Path, base: Path) -> None:
    lines = ["# One replay on one vLLM CPU server and on two: the fleet simulator against the measurement", "",
             f"Runs: {base.relative_to(HERE.parents[1])}.", "",
             f"Fitted on {', '.join(path.name for path in CALIBRATION)} (closed loop, no trace). Step (seconds): "
             + ", ".join(f"{name} {getattr(price, name):.4g}" for name in
                         ("floor_s", "fixed_s", "per_token_s", "per_context_token_s", "per_prefill_pair_s",
                          "overhead_s")), "",
             "| replay | servers | requests/s | requests per server | running mean | p50 TTFT s (predicted / measured) "
             "| p50 TPOT ms | p50 E2E s |", "|---|---|---|---|---|---|---|---|"]
    for row in table.itertuples():
        def pair(m: str, scale: float, digits: int, row=row) -> str:
            predicted, measured = getattr(row, f"{m}_p50_predicted_s"), getattr(row, f"{m}_p50_measured_s")
            return f"{predicted * scale:.{digits}f} / {measured * scale:.{digits}f} ({predicted / measured - 1:+.0%})"
        lines.append(f"| {row.replay} | {row.servers} ({row.router}) | {row.rate:.3f} | {row.requests_per_server} | "
                     f"{row.running_mean:.1f} | {pair('ttft', 1, 2)} | {pair('tpot', 1e3, 0)} | {pair('e2e', 1, 1)} |")
    lines += ["", "(running mean: vLLM's running requests per server, sampled every 0.25 s; the two-servers runs "
              "beside fleet_check.py and in probed/ were measured before a fleet's samples were kept per server, so "
              "their figure is both servers' sum.)"]
    if len(table) == 2:
        one, two = table.iloc[0], table.iloc[1]
        lines += ["", "The second server's effect (two servers / one):", "", "| metric | measured | predicted |",
                  "|---|---|---|"]
        for m in METRICS:
            lines.append(f"| p50 {m.upper()} | {two[f'{m}_p50_measured_s'] / one[f'{m}_p50_measured_s']:.2f}× | "
                         f"{two[f'{m}_p50_predicted_s'] / one[f'{m}_p50_predicted_s']:.2f}× |")
    several = table[table["servers"] > 1]
    if len(several):
        lines += ["", "With the routing measured (each server's own requests through one replica; p50, predicted / "
                  "measured):", ""]
        for row in several.itertuples():
            lines.append(f"- {row.replay}: " + ", ".join(
                f"{m.upper()} {getattr(row, f'{m}_p50_as_routed_s') * scale:.{digits}f} / "
                f"{getattr(row, f'{m}_p50_measured_s') * scale:.{digits}f} {unit} "
                f"({getattr(row, f'{m}_p50_as_routed_s') / getattr(row, f'{m}_p50_measured_s') - 1:+.0%})"
                for m, scale, digits, unit in (("ttft", 1, 2, "s"), ("tpot", 1e3, 0, "ms"), ("e2e", 1, 1, "s"))))
    if table["servers"].nunique() > 1:
        def fewest(kind: str) -> str:
            met = table[(table[f"ttft_p50_{kind}_s"] <= SLO["ttft"]) & (table[f"tpot_p50_{kind}_s"] <= SLO["tpot"])]
            return str(int(met["servers"].min())) if len(met) else f"more than {int(table['servers'].max())}"
        lines += ["", f"The fewest servers (of those measured) meeting p50 TTFT ≤ {SLO['ttft']:g} s and p50 TPOT ≤ "
                  f"{SLO['tpot'] * 1e3:g} ms: measured {fewest('measured')}, predicted {fewest('predicted')}."]
    errors = {m: table[f"{m}_error"].abs() for m in METRICS}
    lines += ["", "Within the issue's targets: " + ", ".join(
        f"p50 {m.upper()} {int((errors[m] <= TARGETS[m]).sum())} of {len(table)} (≤ {TARGETS[m]:.0%})" for m in METRICS)]
    if "speed_factors" in table:
        lines += ["", "At the machine's probed speed (the price scaled by the probes' TPOT around each replay over "
                  "theirs around the calibration; the router's replicas at the servers' mean factor):", "",
                  "| replay | speed factors | p50 TTFT s (predicted / measured) | p50 TPOT ms | p50 E2E s |",
                  "|---|---|---|---|---|"]
        for row in table.itertuples():
            cells = []
            for m, scale, digits in (("ttft", 1, 2), ("tpot", 1e3, 0), ("e2e", 1, 1)):
                predicted, measured = getattr(row, f"{m}_p50_at_speed_s"), getattr(row, f"{m}_p50_measured_s")
                cells.append(f"{predicted * scale:.{digits}f} / {measured * scale:.{digits}f} "
                             f"({predicted / measured - 1:+.0%})")
            lines.append(f"| {row.replay} | {row.speed_factors} | " + " | ".join(cells) + " |")
        at_speed = {m: table[f"{m}_error_at_speed"].abs() for m in METRICS}
        lines += ["", "Within the issue's targets at the probed speed: " + ", ".join(
            f"p50 {m.upper()} {int((at_speed[m] <= TARGETS[m]).sum())} of {len(table)}" for m in METRICS)]
    out.write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
