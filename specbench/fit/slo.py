"""Service-level objectives: goodput per cell and the load a server carries within the SLO."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import pandas as pd

from specbench.fit.cells import closed_loop, label_cells, open_loop
from specbench.fit.evidence import percentile_interval

SLO_METRICS = {"ttft": "ttft_s", "tpot": "tpot_s", "e2e": "e2e_s", "e2el": "e2e_s"}
SLO_PERCENTILES = (50, 90, 95, 99)


@dataclass(frozen=True)
class Slo:
    """Bounds in seconds on per-request TTFT, TPOT and end-to-end latency, and the percentile of
    a cell's requests that must meet each for the cell to meet the SLO."""

    bounds: tuple[tuple[str, float], ...]  # (metric, seconds)
    percentile: int = 99

    @property
    def text(self) -> str:
        parts = [f"{metric}={bound:g}" for metric, bound in self.bounds]
        return ",".join(parts + [f"p{self.percentile}"])

    def describe(self) -> str:
        names = {"ttft": "TTFT", "tpot": "TPOT", "e2e": "e2e latency"}
        return f"p{self.percentile} " + " and ".join(
            f"{names[m]} ≤ {b * 1e3:g} ms" if b < 1 else f"{names[m]} ≤ {b:g} s" for m, b in self.bounds)


def parse_slo(text: str) -> Slo:
    """`ttft=1.0,tpot=0.05` (seconds), optionally `,p90` for the percentile (default p99);
    `ttft:1.0` as vLLM's --goodput writes it is read too (still seconds)."""
    bounds: dict[str, float] = {}
    percentile = 99
    for entry in [e.strip() for e in text.split(",") if e.strip()]:
        if entry.lower().lstrip("p").isdigit() and entry.lower().startswith("p"):
            percentile = int(entry[1:])
            if percentile not in SLO_PERCENTILES:
                raise ValueError(f"--slo: percentile {entry} must be one of "
                                 + ", ".join(f"p{p}" for p in SLO_PERCENTILES))
            continue
        name, sep, value = entry.replace(":", "=").partition("=")
        name = name.strip().lower()
        if not sep or name not in SLO_METRICS:
            raise ValueError(f"--slo: cannot read {entry!r} (write ttft=SECONDS,tpot=SECONDS,e2e=SECONDS[,p90])")
        try:
            bound = float(value)
        except ValueError:
            raise ValueError(f"--slo: {entry!r} needs a number of seconds") from None
        if not bound > 0 or not math.isfinite(bound):
            raise ValueError(f"--slo: {entry!r} must be a positive number of seconds")
        bounds["e2e" if name == "e2el" else name] = bound
    if not bounds:
        raise ValueError(f"--slo {text!r} names no bound (e.g. ttft=1.0,tpot=0.05)")
    return Slo(tuple(bounds.items()), percentile)


def load_column(cells: pd.DataFrame) -> str:
    """What a run varied: request_rate (open loop) or batch_size (closed loop)."""
    return "request_rate" if not open_loop(cells).empty else "batch_size"


def load_label(column: str) -> str:
    return "request rate (req/s)" if column == "request_rate" else "concurrency (B)"


def slo_table(cells: pd.DataFrame, requests: pd.DataFrame, slo: Slo) -> pd.DataFrame:
    """Per finished cell of the run's load kind: goodput (requests meeting every bound per second
    of the cell's measured time, as `vllm bench serve --goodput` counts it), the share of good
    requests, each bounded metric at the SLO's percentile, and whether the cell meets the SLO
    (every bounded metric's percentile within its bound)."""
    column = load_column(cells)
    ok = cells[cells["status"] == "ok"] if not cells.empty else cells
    ok = open_loop(ok) if column == "request_rate" else closed_loop(ok)
    if ok.empty or requests.empty:
        return pd.DataFrame()
    ok = label_cells(ok)
    by_cell = dict(tuple(requests.groupby("cell_id", sort=False)))
    rows = []
    for cell in ok.to_dict("records"):
        mine = by_cell.get(cell["cell_id"])
        if mine is None:
            continue
        good = np.ones(len(mine), dtype=bool)
        figures, sides = {}, []
        for metric, bound in slo.bounds:
            values = mine[SLO_METRICS[metric]].astype(float).fillna(0.0 if metric == "tpot" else np.inf).to_numpy()
            good &= values <= bound
            name = f"{metric}_p{slo.percentile}_s"
            figures[name] = float(np.percentile(values, slo.percentile))
            figures[name + "_low"], figures[name + "_high"] = percentile_interval(values, slo.percentile)
            sides.append("meets" if figures[name + "_high"] <= bound else "misses" if figures[name + "_low"] > bound
                         else "uncertain")
        meets = all(figures[f"{m}_p{slo.percentile}_s"] <= b for m, b in slo.bounds)
        # decided only when every bound's interval lies on one side of it (one decided miss is a miss)
        decided = "misses" if "misses" in sides else "meets" if all(x == "meets" for x in sides) else "uncertain"
        wall = float(cell.get("wall_s") or float("nan"))
        rows.append({"cell_id": cell["cell_id"], "mode": cell["mode"], "draft": cell["draft"], "k": cell["k"],
                     "workload": cell["workload"], "temperature": cell["temperature"], "load": float(cell[column]),
                     "requests": len(mine), "good_requests": int(good.sum()),
                     "good_fraction": float(good.mean()), "goodput_rps": float(good.sum()) / wall if wall else float("nan"),
                     "achieved_request_rate": len(mine) / wall if wall else float("nan"),
                     "tokens_per_s": float(cell["tokens_per_s"]), "meets_slo": meets, "slo_decided": decided,
                     **figures})
    return pd.DataFrame(rows)


def slo_capacity(table: pd.DataFrame) -> pd.DataFrame:
    """Per (workload, temperature) and per draft (the best K at each load, the one that meets the
    SLO with most goodput) next to the autoregressive baseline: the highest measured load up to
    which every measured load meets the SLO, the tokens/s there, and the K used there; and the
    same within the requests' noise: `max_load_low` where every load up to it meets the SLO beyond
    doubt (the interval of each bounded percentile within its bound), `max_load_high`
    where no load up to it misses it beyond doubt."""
    if table.empty:
        return pd.DataFrame()
    rows = []
    for (workload, temperature), group in table.groupby(["workload", "temperature"]):
        for draft, mine in group.groupby("draft"):
            per_load = []
            for load, at in mine.groupby("load"):
                best = at.sort_values(["meets_slo", "goodput_rps", "tokens_per_s"], ascending=False).iloc[0]
                per_load.append((float(load), best))
            per_load.sort(key=lambda item: item[0])
            capacity, chosen = None, None
            for load, best in per_load:
                if not best["meets_slo"]:
                    break
                capacity, chosen = load, best
            low, high = _capacity_bounds(mine)
            rows.append({"workload": workload, "temperature": temperature, "draft": draft,
                         "mode": per_load[0][1]["mode"], "max_load": capacity, "max_load_low": low,
                         "max_load_high": high,
                         "max_measured_load": per_load[-1][0], "min_measured_load": per_load[0][0],
                         "k": int(chosen["k"]) if chosen is not None else None,
                         "tokens_per_s": float(chosen["tokens_per_s"]) if chosen is not None else float("nan"),
                         "goodput_rps": float(chosen["goodput_rps"]) if chosen is not None else float("nan")})
    return pd.DataFrame(rows)


def _capacity_bounds(mine: pd.DataFrame) -> tuple[float | None, float | None]:
    """(highest load up to which every load meets the SLO beyond doubt, highest load up to which
    none misses it beyond doubt); at a load, one K meeting it beyond doubt is enough, and it is
    missed only when every K misses it."""
    states = []
    for load, at in mine.groupby("load"):  # ascending
        decided = set(at["slo_decided"])
        states.append((float(load), "meets" if "meets" in decided else "misses" if decided == {"misses"} else "?"))
    low = high = None
    for load, state in states:
        if state == "misses":
            break
        high = load
    for load, state in states:
        if state != "meets":
            break
        low = load
    return low, high


def capacity_ratio(ours, theirs) -> float:
    """Speculation's capacity over the baseline's (None or NaN: meets the SLO at no load)."""
    ours = 0.0 if ours is None or pd.isna(ours) else float(ours)
    theirs = 0.0 if theirs is None or pd.isna(theirs) else float(theirs)
    if ours == theirs:
        return 1.0
    return ours / theirs if theirs else math.inf


def capacity_text(value, measured_max: float, column: str) -> str:
    unit = " req/s" if column == "request_rate" else ""
    name = "R" if column == "request_rate" else "B"
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "meets it at no measured load"
    if not math.isfinite(value):
        return "rate inf (every request at once)"
    text = f"{name} = {value:g}{unit}"
    return text + (" (every measured load; the ceiling is higher)" if value >= measured_max else "")

