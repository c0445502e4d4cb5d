"""The report's charts: one function per chart, each drawing an `Analysis` to a PNG (matplotlib,
no display). `drawers` names the charts a run supports."""

from __future__ import annotations

import math
import textwrap
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402
from matplotlib.transforms import Bbox  # noqa: E402

from specbench.fit import AR, drifted_keys, expected_tau, load_label  # noqa: E402
from specbench.fit.acceptance import acceptance_by_position  # noqa: E402
from specbench.fit.noise import cell_interval  # noqa: E402
from specbench.report.analysis import Analysis, _load_name, _load_points  # noqa: E402

CHARTS = {
    "speedup_vs_batch": "Speed-up against autoregressive vs batch size",
    "tau_vs_k": "Tokens per target forward (τ) vs K: measured and fitted",
    "acceptance": "Acceptance by workload and temperature, and by draft position",
    "throughput_latency": "Throughput and inter-token latency vs batch size",
    "cost": "Cost per 1M output tokens",
    "memory": "Memory with and without the draft",
    "predicted_vs_measured": "Performance model: predicted vs measured speed-up (in-sample and held-out batch sizes)",
    "throughput_vs_latency": "Total throughput vs what each user gets, with and without speculation",
    "goodput": "Goodput (requests/s meeting the SLO) vs load",
    "trace_latency": "Latency over the trace's time, with and without speculation",
    "trace_batch": "The batch the server ran at over the trace's time (vLLM's running requests)",
}
CHART_NOTES = {
    "speedup_vs_batch": "Each point: a speculative cell's tokens/s over its own baseline's, one line per K. Bars: the "
                        "95 % interval `check` decides with (repeats ≥ 2, paired as the run's pairing allows); a point "
                        "without a bar is one comparison, decided only outside the run's noise band. Dotted red: B*, "
                        "where the best-K speed-up (the wide grey line: at each batch size the fastest K) falls below "
                        "1×, which can lie right of where every single K's line crosses 1×.",
    "throughput_vs_latency": "x: what one user gets (1 / TPOT p50); y: what the server carries (total output "
                             "tokens/s). A point is one load (batch size or request rate) at a draft's best K there; "
                             "a line joins a series' Pareto front. Speculation helps where its points lie up and to "
                             "the right of the autoregressive ones.",
    "memory": "Bars: what the models need by their shapes (weights, and KV caches sized for the batch and its "
              "sequences). The mark: the measured peak of everything the cell ran, which is more: on the native engine "
              "one process holds every model the sweep loaded (the draft too, in autoregressive cells), and on a "
              "CPU its RSS also holds Python, torch and its libraries, the tokenizer, the CPU engine's packed "
              "weight copies (as much again as the weights), activations and the allocator's slack; on a GPU, "
              "NVML also counts the CUDA context and torch's cache. With a 135M model that fixed part dominates, "
              "so the peak is several times the bars. A draft's cost is the difference between two marks.",
    "trace_latency": "Each request of the replay at its time in the trace: its TPOT (top) and end-to-end latency "
                     "(bottom), the baseline in black and each speculative configuration in colour, with a rolling "
                     "median over 9 requests. Every configuration replayed the same requests at the same times.",
    "trace_batch": "vLLM's `vllm:num_requests_running` gauge, sampled every 0.25 s from /metrics during the first "
                   "repeat: the batch size the server really ran at. The dashed line is B = 32, where speculation "
                   "is most likely to stop paying.",
    "predicted_vs_measured": "The performance model's speed-up against the measured one: in-sample (fitted on every "
                             "cell) and held out (the largest batch sizes predicted from the smaller ones, which is "
                             "how far a prediction at an unmeasured size can be trusted).",
}
class NothingToDraw(Exception):
    """A chart's quantity was not measured in this run (why: the message)."""


def _natural(workload: str) -> tuple:
    """chat@512 before chat@4096: a workload label's context length sorts as a number."""
    name, _, context = str(workload).partition("@")
    return (name, int(context) if context.isdigit() else 0)


def _facets(cells: pd.DataFrame) -> list[tuple[str, float]]:
    return sorted({(w, t) for w, t in zip(cells["workload"], cells["temperature"])},
                  key=lambda item: (_natural(item[0]), item[1]))


def _drafts(cells: pd.DataFrame) -> list[str]:
    return sorted(d for d in cells["draft"].unique() if d != AR)


def _color(draft: str, drafts: list[str]) -> str:
    """The same colour for a draft in every chart; black for the autoregressive baseline."""
    return "black" if draft == AR else f"C{drafts.index(draft) % 10}" if draft in drafts else "grey"


def _integer_ticks(ax) -> None:
    from matplotlib.ticker import MaxNLocator

    ax.xaxis.set_major_locator(MaxNLocator(integer=True))


def _title_and_layout(fig, title: str, fontsize: int = 12) -> None:
    width = int(fig.get_figwidth() * 72 / (0.6 * fontsize))  # characters that fit across the figure
    fig.suptitle("\n".join(textwrap.fill(line, width) for line in title.split("\n")), fontsize=fontsize)
    fig.tight_layout()


def _finish(fig, path: Path, title: str, fontsize: int = 12) -> None:
    _title_and_layout(fig, title, fontsize)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _facet(frame: pd.DataFrame, workload: str, temperature: float) -> pd.DataFrame:
    """Rows of one (workload, temperature) panel; empty when the frame is."""
    if frame.empty:
        return frame
    return frame[(frame["workload"] == workload) & (frame["temperature"] == temperature)]


def _select(frame: pd.DataFrame, draft: str, workload: str, temperature: float) -> pd.DataFrame:
    """Rows of one (draft, workload, temperature); empty when the frame is."""
    rows = _facet(frame, workload, temperature)
    return rows[rows["draft"] == draft] if not rows.empty else rows


def _grid(rows: int, cols: int, width: float = 4.2, height: float = 3.2, sharey: bool = False):
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False, sharey=sharey)
    return fig, axes


def _batch_axis(ax, sizes) -> None:
    ax.set_xscale("log", base=2)
    ax.set_xticks(sizes)
    ax.set_xticklabels([str(s) for s in sizes])
    ax.set_xlabel("batch size")


def chart_speedup(a: Analysis, path: Path) -> None:
    cells, facets, drafts = a.cells, _facets(a.cells), _drafts(a.cells)
    measured = cells.loc[cells["mode"] != AR, "speedup"] if "speedup" in cells else pd.Series(dtype=float)
    if not np.isfinite(measured.astype(float)).any():
        raise NothingToDraw("no speed-up was measured (no speculative cell has a finished baseline)")
    sizes = sorted(cells["batch_size"].unique())
    drifted = drifted_keys(a.run.cells)
    fig, axes = _grid(len(facets), max(1, len(drafts)), width=max(4.2, 6.4 / max(1, len(drafts))),
                      sharey=True)  # one scale: panels compare at a glance
    for i, (workload, temperature) in enumerate(facets):
        for j, draft in enumerate(drafts):
            ax = axes[i][j]
            sub = _select(cells, draft, workload, temperature)
            ks = sorted(sub["k"].unique())
            for k, group in sub.groupby("k"):
                group = group.sort_values("batch_size")
                # each K a little to the side (log scale), so that its interval bars do not hide another's
                group = group.assign(x=group["batch_size"] * 2 ** (0.05 * (ks.index(k) - (len(ks) - 1) / 2)))
                line = ax.plot(group["x"], group["speedup"], marker="o", label=f"K={k}")[0]
                marked = group[[(workload, int(b)) in drifted for b in group["batch_size"]]]
                if len(marked):  # the baselines of this group drifted: the speed-up is suspect
                    ax.scatter(marked["x"], marked["speedup"], s=140, facecolors="none", edgecolors="red",
                               linewidths=1.5, zorder=5, label="baseline drifted (see warnings)")
                shown = _interval_bars(group)
                if shown is not None:  # the 95 % interval check decides with, where repeats allow one
                    sizes_with, points, below, above = shown
                    ax.errorbar(sizes_with, points, yerr=[below, above], fmt="none", ecolor=line.get_color(),
                                elinewidth=1.2, capsize=3, alpha=0.8, label="95% interval (repeats ≥ 2)")
            if sub["k"].nunique() > 1:  # B* is where this best-K line crosses 1×, not any one K's line
                best = sub.groupby("batch_size")["speedup"].max().dropna().sort_index()
                ax.plot(best.index, best.to_numpy(), color="grey", linewidth=5, alpha=0.3, zorder=1,
                        label="best K (B* is read on it)")
            ax.axhline(1.0, color="black", linestyle="--", linewidth=1, label="1× (autoregressive)")
            if sub.empty:
                ax.text(0.5, 0.5, "no finished cells here\n(see 'cells that did not finish')", ha="center",
                        va="center", transform=ax.transAxes, fontsize=8)
            found = _select(a.crossovers, draft, workload, temperature)
            if len(found) and found["crossover_batch_size"].notna().iloc[0]:
                b_star = float(found["crossover_batch_size"].iloc[0])
                ax.axvline(b_star, color="red", linestyle=":", label=f"B* ≈ {b_star:.1f}")
            _batch_axis(ax, sizes)
            ax.set_ylabel("speed-up (×)")
            ax.set_title(f"{draft} · {workload} · T={temperature:g}", fontsize=10)
            ax.grid(alpha=0.3)
            ax.tick_params(labelleft=True)
            handles, labels = ax.get_legend_handles_labels()
            unique = dict(zip(labels, handles))
            order = sorted(unique, key=lambda label: not label.startswith("K="))  # the K lines first, then marks
            ax.legend([unique[label] for label in order], order, fontsize=7, framealpha=0.5)
    _finish(fig, path, CHARTS["speedup_vs_batch"] + "\n(bars: 95 % intervals, where a cell has ≥ 2 repeats)",
            fontsize=11)


def _interval_bars(group: pd.DataFrame):
    """The rows' 95 % speed-up intervals as `check` computes them (paired or bracketed repeats) for
    error bars: x positions, speed-ups and the distances down and up; None when no row has one."""
    rows = [(row["x"], row["speedup"], cell_interval(row)) for row in group.to_dict("records")]
    rows = [(b, s, i) for b, s, i in rows if i is not None and np.isfinite(s)]
    if not rows:
        return None
    return ([b for b, _, _ in rows], [s for _, s, _ in rows], [max(0.0, s - i[0]) for _, s, i in rows],
            [max(0.0, i[1] - s) for _, s, i in rows])


def _needs_speculative_cells(cells: pd.DataFrame) -> None:
    """Acceptance is drawn from speculative cells; a run of baselines alone (plain servers) has none."""
    if (cells["mode"] == AR).all():
        raise NothingToDraw("the run has no speculative cells (baselines only), so no acceptance to draw")


def chart_tau(a: Analysis, path: Path) -> None:
    _needs_speculative_cells(a.cells)
    cells, drafts = a.cells, _drafts(a.cells)
    sd = cells[cells["mode"] != AR]
    fig, axes = _grid(1, max(1, len(drafts)))
    for j, draft in enumerate(drafts):
        ax = axes[0][j]
        ks = sorted(sd["k"].unique())
        grid = np.arange(1, max(ks) + 1) if ks else np.arange(1, 2)
        for n, ((workload, temperature), group) in enumerate(sd[sd["draft"] == draft].groupby(["workload", "temperature"])):
            color = f"C{n}"
            measured = group.groupby("k")["tau"].mean()
            ax.plot(measured.index, measured.values, "o", color=color, label=f"{workload} T={temperature:g} measured")
            fit = _select(a.alphas, draft, workload, temperature)
            if len(fit):
                alpha = float(fit["alpha_iid"].iloc[0])
                ax.plot(grid, expected_tau(alpha, grid), "-", color=color, alpha=0.7, label=f"fit α={alpha:.2f}")
        ax.plot(grid, grid + 1, color="grey", linestyle=":", label="K+1 (all accepted)")
        _integer_ticks(ax)
        ax.set_xlabel("K (draft tokens per step)")
        ax.set_ylabel("τ (tokens per target forward)")
        ax.set_title(draft, fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _finish(fig, path, CHARTS["tau_vs_k"])


def chart_acceptance(a: Analysis, path: Path) -> None:
    _needs_speculative_cells(a.cells)
    fig, axes = _grid(1, 2, width=5.5)
    ax = axes[0][0]
    alphas = a.alphas
    if not alphas.empty:
        labels = [f"{w}\nT={t:g}" for w, t in sorted({(w, t) for w, t in zip(alphas["workload"], alphas["temperature"])})]
        keys = sorted({(w, t) for w, t in zip(alphas["workload"], alphas["temperature"])})
        drafts = sorted(alphas["draft"].unique())
        width = 0.8 / max(1, len(drafts))
        for n, draft in enumerate(drafts):
            rows = [_select(alphas, draft, w, t) for w, t in keys]
            values = [float(r["alpha_iid"].iloc[0]) if len(r) else np.nan for r in rows]
            low = [v - float(r["alpha_low"].iloc[0]) if len(r) else 0 for v, r in zip(values, rows)]
            high = [float(r["alpha_high"].iloc[0]) - v if len(r) else 0 for v, r in zip(values, rows)]
            x = np.arange(len(keys)) + n * width
            ax.bar(x, values, width, yerr=[low, high], capsize=3, label=draft, color=_color(draft, drafts))
        ax.set_xticks(np.arange(len(keys)) + width * (len(drafts) - 1) / 2)
        ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylim(0, 1.05)
    ax.set_ylabel("α (fitted, i.i.d., 95% CI)")
    ax.set_title("acceptance probability per token", fontsize=10)
    if alphas.empty:
        ax.text(0.5, 0.5, "no real acceptance to fit\n(timing-only run: α is simulated)", ha="center",
                va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=7)
    ax.grid(alpha=0.3, axis="y")

    ax = axes[0][1]
    sd = a.cells[a.cells["mode"] != AR]
    all_drafts = _drafts(a.cells)
    for draft, group in sd.groupby("draft"):
        n = all_drafts.index(draft)
        rates = acceptance_by_position(group)  # a position no cell measured stays NaN, unplotted
        positions = np.arange(1, len(rates) + 1)
        ax.plot(positions, rates, "o-", color=f"C{n}", label=f"{draft} measured")
        fit = a.alphas[a.alphas["draft"] == draft] if not a.alphas.empty else []
        if len(fit):
            weights = (fit["accepted"] + fit["rejections"]).to_numpy(float)
            if not (np.isfinite(weights).all() and weights.sum() > 0):  # no counted draft (an endpoint's gauges)
                continue
            alpha = float(np.average(fit["alpha_iid"], weights=weights))
            ax.plot(positions, alpha ** positions, "--", color=f"C{n}", label=f"{draft} α^i, α={alpha:.2f}")
    _integer_ticks(ax)
    ax.set_xlabel("draft position i")
    ax.set_ylabel("accepted at i / drafted at i")
    ax.set_ylim(0, 1.05)
    ax.set_title("per-position acceptance vs the i.i.d. α^i", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    _finish(fig, path, CHARTS["acceptance"])


def _best_rows(cells: pd.DataFrame) -> pd.DataFrame:
    """Per (draft, workload, temperature, B): the measured best-K speculative cell; and AR cells."""
    sd = cells[cells["mode"] != AR]
    if sd.empty:
        return cells[cells["mode"] == AR]
    index = sd.groupby(["draft", "workload", "temperature", "batch_size"])["tokens_per_s"].idxmax()
    return pd.concat([cells[cells["mode"] == AR], sd.loc[index]])


def chart_throughput(a: Analysis, path: Path) -> None:
    rows = _best_rows(a.cells)
    facets = _facets(a.cells)
    sizes = sorted(a.cells["batch_size"].unique())
    fig, axes = _grid(len(facets), 2)
    for i, (workload, temperature) in enumerate(facets):
        sub = _facet(rows, workload, temperature)
        for draft, group in sub.groupby("draft"):
            group = group.sort_values("batch_size")
            label = "autoregressive" if draft == AR else f"{draft} (best K)"
            style = dict(color=_color(draft, _drafts(a.cells)))
            axes[i][0].plot(group["batch_size"], group["tokens_per_s"], "o-", label=label, **style)
            axes[i][1].plot(group["batch_size"], group["itl_p50_s"] * 1e3, "o-", label=f"{label} p50", **style)
            axes[i][1].plot(group["batch_size"], group["itl_p99_s"] * 1e3, "s--", label=f"{label} p99", **style)
        for ax, ylabel in ((axes[i][0], "output tokens/s"), (axes[i][1], "inter-token latency per token (ms)")):
            _batch_axis(ax, sizes)
            ax.set_ylabel(ylabel)
            ax.set_title(f"{workload} · T={temperature:g}", fontsize=10)
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
    _finish(fig, path, CHARTS["throughput_latency"] + "\n(ITL per token, as itl_*: speculative p50 is 0 when tokens "
                       "arrive in bursts; per chunk, as vllm bench serve counts it: itl_chunk_*)")


def chart_cost(a: Analysis, path: Path) -> None:
    costs = a.costs
    facets = _facets(a.cells)
    sizes = sorted(a.cells["batch_size"].unique())
    fig, axes = _grid(1, len(facets), width=max(4.2, 7.0 / len(facets)), height=3.6)
    best = _best_rows(a.cells)[["cell_id"]]
    costs = costs.merge(best, on="cell_id")
    for i, (workload, temperature) in enumerate(facets):
        ax = axes[0][i]
        sub = _facet(costs, workload, temperature)
        for draft, group in sub.groupby("draft"):
            group = group.sort_values("batch_size")
            style = dict(color=_color(draft, _drafts(a.cells)))
            ax.plot(group["batch_size"], group["cost_per_1m"], "o-", label="autoregressive" if draft == AR else f"{draft} (best K)", **style)
        _batch_axis(ax, sizes)
        ax.set_yscale("log")
        from matplotlib.ticker import LogLocator, ScalarFormatter

        ax.yaxis.set_major_formatter(ScalarFormatter())
        ax.yaxis.set_minor_formatter(ScalarFormatter())
        ax.yaxis.set_minor_locator(LogLocator(subs=(2, 5)))
        ax.set_ylabel(a.cost_unit)
        ax.set_title(f"{workload} · T={temperature:g}", fontsize=10)
        ax.grid(alpha=0.3, which="both")
        ax.legend(fontsize=7)
    _finish(fig, path, f"{CHARTS['cost']} (best K per batch size)\n{a.price_note}", fontsize=10)


MEMORY_LABEL_CHARS = 22  # a draft's name wraps to lines of at most this many characters under its bar


def chart_memory(a: Analysis, path: Path) -> None:
    cells = a.cells
    biggest = cells["batch_size"].max()
    at = cells[cells["batch_size"] == biggest]
    configs = [(AR, 0)] + sorted({(d, int(k)) for d, k in zip(at["draft"], at["k"]) if d != AR})
    gib = 1024 ** 3
    # each bar as wide as its label (wrapped to MEMORY_LABEL_CHARS; ~0.08 inch a character at 8 pt): none overlaps
    longest = max(min(len(draft), MEMORY_LABEL_CHARS) for draft, _ in configs)
    fig, ax = plt.subplots(figsize=(max(6, max(1.1, 0.08 * longest + 0.3) * len(configs) + 2) + 3, 4))
    labels, bottoms = [], np.zeros(len(configs))
    served = "engine" in cells and (cells["engine"] == "vllm").any()
    parts = [("target_param_bytes", "target weights"),
             ("target_kv_cache_bytes", "KV-cache pool (target and draft layers)" if served else "target KV cache"),
             ("draft_param_bytes", "draft weights"), ("draft_kv_cache_bytes", "draft KV cache")]
    rows = []
    for draft, k in configs:
        sub = at[(at["draft"] == draft) & ((at["k"] == k) | (draft == AR))]
        rows.append(sub.iloc[0] if len(sub) else None)
        labels.append("autoregressive" if draft == AR else
                      "\n".join(textwrap.wrap(draft, MEMORY_LABEL_CHARS, break_on_hyphens=True)) + f"\nK={k}")
    for n, (column, name) in enumerate(parts):
        values = np.array([float(r[column]) / gib if r is not None and pd.notna(r.get(column)) else 0 for r in rows])
        ax.bar(range(len(configs)), values, bottom=bottoms, label=name, color=f"C{n}")
        bottoms += values
    peaks = [float(r["peak_memory_bytes"]) / gib if r is not None and pd.notna(r.get("peak_memory_bytes")) else np.nan
             for r in rows]
    if np.isnan(peaks).all() and not bottoms.any():
        plt.close(fig)
        raise NothingToDraw("no memory was measured (an endpoint's server is on another machine)"
                            if (a.run.meta.get("engine") or {}).get("name") == "endpoint" else "no memory was measured")
    kind = at["memory_kind"].iloc[0] if len(at) else "rss"
    if served:
        label = "measured peak (the server's processes: " + ("RSS)" if kind == "rss" else "GPU memory)")
    else:
        label = ("measured peak (process RSS: every loaded model, packed\nweight copies, Python and torch; "
                 "see the note)" if kind == "rss" else
                 "measured peak (device: every loaded model,\nCUDA context, torch's cache)")
    ax.plot(range(len(configs)), peaks, "k_", markersize=30, mew=2, label=label)
    if served and "kv_cache_tokens" in at:
        for i, row in enumerate(rows):  # what the draft costs in concurrency: fewer tokens fit
            if row is not None and pd.notna(row.get("kv_cache_tokens")):
                ax.text(i, bottoms[i], f"KV cache: {float(row['kv_cache_tokens']):,.0f} tokens", ha="center",
                        va="bottom", fontsize=7)
    ax.set_xticks(range(len(configs)))
    ax.set_xticklabels(labels, fontsize=8)
    ax.set_ylabel("GiB")
    ax.set_title(f"{CHARTS['memory']} (batch size {biggest})", fontsize=10)
    ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1.0))
    ax.set_ylim(0, max(np.nanmax(peaks) if len(peaks) else 0, bottoms.max()) * 1.15)
    ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_predicted(a: Analysis, path: Path) -> None:
    """In-sample predictions (filled) and held-out ones (open: the batch size was not in the fit)."""
    fig, ax = plt.subplots(figsize=(5.5, 5))
    p = a.predicted
    held = a.held_out if a.held_out is not None else pd.DataFrame()
    drafts = sorted(set(p["draft"]) | set(held["draft"] if not held.empty else [])) if not p.empty else []
    if not p.empty:
        for draft, group in p.groupby("draft"):
            ax.scatter(group["speedup_measured"], group["speedup_predicted"], label=f"{draft} (in-sample)",
                       color=f"C{drafts.index(draft) % 10}")
        for draft, group in (held.groupby("draft") if not held.empty else []):
            ax.scatter(group["speedup_measured"], group["speedup_predicted"], facecolors="none", s=60,
                       edgecolors=f"C{drafts.index(draft) % 10}", label=f"{draft} (held-out B)")
        both = pd.concat([p, held]) if not held.empty else p
        both = both[np.isfinite(both["speedup_measured"].astype(float)) & np.isfinite(both["speedup_predicted"].astype(float))]
        if both.empty:
            plt.close(fig)
            raise NothingToDraw("no cell has both a measured and a predicted speed-up")
        low = min(both["speedup_measured"].min(), both["speedup_predicted"].min()) * 0.9
        high = max(both["speedup_measured"].max(), both["speedup_predicted"].max()) * 1.1
        ax.plot([low, high], [low, high], "k--", linewidth=1, label="predicted = measured")
        ax.axhline(1, color="grey", linewidth=0.6)
        ax.axvline(1, color="grey", linewidth=0.6)
        ax.set_xlim(low, high)
        ax.set_ylim(low, high)
        title = f"in-sample median |error| {p['speedup_error'].abs().median() * 100:.0f}% ({len(p)} cells)"
        if not held.empty:
            title += f"\nheld-out median |error| {held['speedup_error'].abs().median() * 100:.0f}% ({len(held)} cells)"
        ax.set_title(title, fontsize=10)
    ax.set_xlabel("measured speed-up (×)")
    ax.set_ylabel("predicted speed-up (×)")
    ax.grid(alpha=0.3)
    if p.empty:
        ax.text(0.5, 0.5, "no speculative cells to predict", ha="center", va="center", transform=ax.transAxes)
    else:
        ax.legend(fontsize=7)
    _finish(fig, path, CHARTS["predicted_vs_measured"], fontsize=11)


def _label_panel(ax, xlabel: str, ylabel: str, workload: str, temperature: float) -> None:
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(f"{workload} · T={temperature:g}", fontsize=10)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)


def _panel_grid(count: int, width: float, height: float, columns: int = 2):
    """A grid of at most `columns` panels across, the unused ones hidden: panels stay readable
    however many workloads and temperatures a run has."""
    cols = max(1, min(columns, count))
    rows = math.ceil(count / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(width * cols, height * rows), squeeze=False)
    flat = [ax for row in axes for ax in row]
    for ax in flat[count:]:
        ax.set_visible(False)
    return fig, flat[:count]


def pareto_front(per_user, total) -> list[int]:
    """Indices of the points no other point beats on both axes (more tokens/s per user and in
    total), ordered by per-user tokens/s: the trade-off a deployment can choose from."""
    points = list(zip(per_user, total))
    front = [i for i, (x, y) in enumerate(points)
             if not any(x2 >= x and y2 >= y and (x2, y2) != (x, y) for x2, y2 in points)]
    return sorted(front, key=lambda i: points[i][0])


def place_labels(ax, labels: list[tuple[float, float, str]], fontsize: float = 7) -> int:
    """Annotate points with texts that overlap neither each other, nor any marker, nor the legend,
    and stay clear of the axes' edge: each label tries offsets around its point in turn, first
    where it crosses no plotted line either, then anywhere else clear; one that fits nowhere is left
    out. Labels come in priority order. Returns how many were left out."""
    fig = ax.figure
    renderer = fig.canvas.get_renderer()
    marker = 4 * fig.dpi / 72  # half a marker, in pixels
    gap = 2 * fig.dpi / 72  # the clearance a label keeps from the edge and from what it must not touch
    taken = [Bbox.from_extents(x - marker, y - marker, x + marker, y + marker)
             for x, y in ax.transData.transform([(px, py) for px, py, _ in labels])] if labels else []
    if ax.get_legend() is not None:
        taken.append(ax.get_legend().get_window_extent(renderer))
    frame = ax.get_window_extent(renderer).padded(-gap)
    lines = _line_samples(ax, gap)
    offsets = [(4, 4), (4, -11), (-6, 4), (-6, -11), (4, 12), (-6, 12), (4, -19), (-6, -19), (10, -4), (-12, -4)]
    left_out = 0
    for x, y, text in labels:
        placed = False
        for avoid_lines in (True, False):
            for dx, dy in offsets:
                note = ax.annotate(text, (x, y), xytext=(dx, dy), textcoords="offset points", fontsize=fontsize,
                                   ha="left" if dx > 0 else "right", va="bottom",
                                   bbox={"boxstyle": "square,pad=0.1", "fc": "white", "ec": "none", "alpha": 0.7})
                box = note.get_window_extent(renderer)
                inside = frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1
                clear = not any(box.padded(gap).overlaps(other) for other in taken)
                if inside and clear and not (avoid_lines and _crosses(box, lines)):
                    taken.append(box)
                    placed = True
                    break
                note.remove()
            if placed:
                break
        left_out += not placed
    return left_out


def _line_samples(ax, spacing: float) -> np.ndarray:
    """Points every `spacing` pixels along the axes' plotted lines (display coordinates)."""
    samples = []
    for line in ax.get_lines():
        points = ax.transData.transform(np.column_stack([line.get_xdata(), line.get_ydata()]).astype(float))
        for start, end in zip(points[:-1], points[1:]):
            count = max(2, int(np.hypot(*(end - start)) / spacing) + 1)
            samples.append(np.linspace(start, end, count))
    return np.concatenate(samples) if samples else np.empty((0, 2))


def _crosses(box, samples: np.ndarray) -> bool:
    if not len(samples):
        return False
    x, y = samples[:, 0], samples[:, 1]
    return bool(((x >= box.x0) & (x <= box.x1) & (y >= box.y0) & (y <= box.y1)).any())


def chart_tradeoff(a: Analysis, path: Path) -> None:
    """Total output tokens/s (what one server carries) against each user's tokens/s (1 / TPOT):
    per draft its best K at each load, and no speculation. Every measured load is a point; the line
    joins a series' Pareto front (no other of its points is better on both axes), so it never
    zigzags. Labels name load and K and never collide; the ends of a series are labelled first.
    Up and to the right is better."""
    points = _load_points(a)
    facets = _facets(a.cells)
    drafts = _drafts(a.cells)
    fig, axes = _panel_grid(len(facets), width=6.4, height=4.6)
    for ax, (workload, temperature) in zip(axes, facets):
        sub = _facet(points, workload, temperature)
        for draft, group in sub.groupby("draft"):
            color = _color(draft, drafts)
            name = "autoregressive" if draft == AR else f"{draft} (best K per load)"
            ax.scatter(group["per_user"], group["tokens_per_s"], color=color, s=22, zorder=3, label=name)
            front = group.iloc[pareto_front(group["per_user"].tolist(), group["tokens_per_s"].tolist())]
            ax.plot(front["per_user"], front["tokens_per_s"], "-", color=color, linewidth=1.4, alpha=0.8)
        _label_panel(ax, "tokens/s per user (1 / TPOT p50)", "total output tokens/s", workload, temperature)
        ax.margins(0.12)
    _title_and_layout(fig, CHARTS["throughput_vs_latency"] + f"\n(points: {load_label(a.load)} and K; lines: each "
                      "series' Pareto front; up and right is better)", fontsize=11)
    for ax, (workload, temperature) in zip(axes, facets):
        sub = _facet(points, workload, temperature)
        ends, middles = [], []
        for draft, group in sub.groupby("draft"):
            group = group.sort_values("load")
            for position, row in enumerate(group.itertuples()):
                note = _load_name(a, row.load) + ("" if draft == AR else f" K={int(row.k)}")
                (ends if position in (0, len(group) - 1) else middles).append((row.per_user, row.tokens_per_s, note))
        place_labels(ax, ends + middles)
    fig.savefig(path, dpi=110)
    plt.close(fig)


def chart_goodput(a: Analysis, path: Path) -> None:
    """Goodput against load per draft (the best K per load) and without speculation; on a
    request-rate run the offered rate is the ceiling (dashed)."""
    table = a.goodput if a.goodput is not None else pd.DataFrame()
    facets = _facets(a.cells)
    drafts = _drafts(a.cells)
    fig, axes = _panel_grid(len(facets), width=6.0, height=4.2)
    for ax, (workload, temperature) in zip(axes, facets):
        sub = _facet(table, workload, temperature)
        finite = []
        for draft, group in sub.groupby("draft"):
            best = group.loc[group.groupby("load")["goodput_rps"].idxmax()].sort_values("load")
            loads = best["load"].replace(np.inf, np.nan)
            shown = best[loads.notna()] if a.load == "request_rate" else best
            finite += shown["load"].tolist()
            label = "autoregressive" if draft == AR else f"{draft} (best K)"
            ax.plot(shown["load"], shown["goodput_rps"], "o-", color=_color(draft, drafts), label=label)
        if a.load == "request_rate" and finite:
            top = max(finite)
            ax.plot([0, top], [0, top], "k:", linewidth=1, label="offered rate")
        _label_panel(ax, load_label(a.load), "goodput (requests/s meeting the SLO)", workload, temperature)
    slo = a.slo.describe() if a.slo else "no SLO"
    _finish(fig, path, f"{CHARTS['goodput']}\nSLO: {slo}" + (" (the rate inf is left out)" if a.load == "request_rate" else ""),
            fontsize=10)


def _trace_time(a: Analysis, arrival_s) -> np.ndarray:
    """Replay seconds back on the trace's own clock (the window's start plus the scaled time)."""
    trace = a.run.meta.get("trace") or {}
    return (trace.get("window") or [0.0])[0] + np.asarray(arrival_s, dtype=float) * trace.get("speedup", 1.0)


def chart_trace_latency(a: Analysis, path: Path) -> None:
    requests = a.run.requests
    cells = a.cells[a.cells["status"] == "ok"] if "status" in a.cells else a.cells
    if requests is None or requests.empty or "arrival_s" not in requests:
        raise NothingToDraw("the run recorded no request times")
    facets, drafts = _facets(cells), _drafts(cells)
    fig, axes = plt.subplots(2, len(facets), figsize=(7.0 * len(facets), 7.0), squeeze=False)
    for j, (workload, temperature) in enumerate(facets):
        for row in _facet(cells, workload, temperature).sort_values("mode").to_dict("records"):
            mine = requests[(requests["cell_id"] == row["cell_id"]) & (requests["repeat"] == requests["repeat"].min())]
            mine = mine.sort_values("arrival_s")
            color = _color(row["draft"], drafts)
            name = "autoregressive" if row["draft"] == AR else f"{row['draft']} K={int(row['k'])}"
            when = _trace_time(a, mine["arrival_s"])
            for i, (column, scale) in enumerate((("tpot_s", 1e3), ("e2e_s", 1.0))):
                values = mine[column].to_numpy(dtype=float) * scale
                axes[i][j].scatter(when, values, s=8, color=color, alpha=0.45)
                rolling = pd.Series(values).rolling(9, center=True, min_periods=1).median()
                axes[i][j].plot(when, rolling, color=color, linewidth=1.5, label=name)
        axes[0][j].set_ylabel("TPOT (ms)")
        axes[1][j].set_ylabel("end-to-end latency (s)")
        for ax in axes[:, j]:
            ax.set_xlabel("trace time (s)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=7)
        axes[0][j].set_title(f"{workload} · T={temperature:g}", fontsize=10)
    describe = (a.run.meta.get("trace") or {}).get("describe", "")
    _finish(fig, path, CHARTS["trace_latency"] + (f"\n({describe})" if describe else ""), fontsize=11)


def chart_trace_batch(a: Analysis, path: Path) -> None:
    cells = a.cells[a.cells["status"] == "ok"] if "status" in a.cells else a.cells
    if "running_timeline" not in cells or not any(isinstance(t, (list, np.ndarray)) and len(t)
                                                  for t in cells["running_timeline"]):
        raise NothingToDraw("the server's running requests were not sampled (a server without vLLM's "
                            "vllm:num_requests_running gauge)")
    facets, drafts = _facets(cells), _drafts(cells)
    fig, axes = plt.subplots(1, len(facets), figsize=(7.0 * len(facets), 3.8), squeeze=False)
    for j, (workload, temperature) in enumerate(facets):
        ax = axes[0][j]
        top = 0.0
        for row in _facet(cells, workload, temperature).sort_values("mode").to_dict("records"):
            times, running = row.get("running_timeline_s"), row.get("running_timeline")
            if not isinstance(running, (list, np.ndarray)) or not len(running):
                continue
            name = "autoregressive" if row["draft"] == AR else f"{row['draft']} K={int(row['k'])}"
            when = _trace_time(a, times)
            ax.step(when, running, where="post", color=_color(row["draft"], drafts), linewidth=1.2, label=name)
            top = max(top, float(np.max(running)))
        ax.axhline(32, color="grey", linestyle="--", linewidth=1, label="B = 32")
        ax.set_ylim(0, max(top, 32) * 1.1)
        ax.set_xlabel("trace time (s)")
        ax.set_ylabel("requests running")
        ax.set_title(f"{workload} · T={temperature:g}", fontsize=10)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    _finish(fig, path, CHARTS["trace_batch"], fontsize=11)


def drawers(a: Analysis) -> dict:
    """The charts a run supports: a request-rate run has no batch-size axis."""
    if a.load == "request_rate":
        chosen = {"throughput_vs_latency": chart_tradeoff, "acceptance": chart_acceptance}
    else:
        chosen = dict(DRAWERS) | {"throughput_vs_latency": chart_tradeoff}
    if a.goodput is not None and not a.goodput.empty:
        chosen["goodput"] = chart_goodput
    if a.run.meta.get("trace"):
        chosen |= {"trace_latency": chart_trace_latency, "trace_batch": chart_trace_batch}
    return chosen


DRAWERS = {"speedup_vs_batch": chart_speedup, "tau_vs_k": chart_tau, "acceptance": chart_acceptance,
           "throughput_latency": chart_throughput, "cost": chart_cost, "memory": chart_memory,
           "predicted_vs_measured": chart_predicted}


