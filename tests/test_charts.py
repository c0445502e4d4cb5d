"""The report's chart helpers: the Pareto front a throughput/latency line joins, and point labels
that never overlap each other, a marker, the legend or the panel's edge."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import numpy as np
import pytest

from specbench.report.charts import pareto_front, place_labels


def test_the_pareto_front_keeps_only_points_nothing_beats_on_both_axes():
    per_user = [10.0, 8.0, 9.0, 5.0, 4.0]
    total = [50.0, 100.0, 60.0, 150.0, 140.0]  # (9, 60) is beaten by nothing; (4, 140) by (5, 150)
    assert pareto_front(per_user, total) == [3, 1, 2, 0]  # ordered by per-user speed: a line that never zigzags
    assert pareto_front([1.0], [1.0]) == [0]


def test_labels_of_crowded_points_never_collide():
    rng = np.random.default_rng(0)
    fig, ax = plt.subplots(figsize=(6.4, 4.6))
    x, y = rng.uniform(0, 10, 40), rng.uniform(0, 10, 40)
    x[:6], y[:6] = 5.0 + 0.02 * np.arange(6), 5.0  # six points on top of each other
    ax.scatter(x, y, label="points")
    ax.legend(loc="upper right")
    fig.tight_layout()
    left_out = place_labels(ax, [(a, b, f"B={i} K=2") for i, (a, b) in enumerate(zip(x, y))])
    renderer = fig.canvas.get_renderer()
    boxes = [text.get_window_extent(renderer) for text in ax.texts]
    assert len(boxes) + left_out == 40 and len(boxes) >= 20
    assert not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
    legend = ax.get_legend().get_window_extent(renderer)
    frame = ax.get_window_extent(renderer)
    assert not any(box.overlaps(legend) for box in boxes)
    assert all(frame.x0 <= box.x0 and box.x1 <= frame.x1 and frame.y0 <= box.y0 and box.y1 <= frame.y1 for box in boxes)
    plt.close(fig)


def test_b_star_stands_where_the_drawn_best_k_line_crosses_1x(tmp_path, monkeypatch):
    """B* interpolates the best-K envelope, which can cross 1× right of every single K's line: the
    chart draws that envelope, so that the B* line never contradicts what is drawn."""
    from pathlib import Path

    import specbench.report.charts as report
    from specbench.report import analyse
    from specbench.results import load_run

    run = load_run(Path(__file__).resolve().parent / "fixtures" / "cpu" / "default-grid-profiled")
    figures = []
    monkeypatch.setattr(report, "_finish", lambda fig, path, title, fontsize=12: figures.append(fig))
    report.chart_speedup(analyse(run), tmp_path / "speedup.png")
    checked = 0
    for ax in figures[0].axes:
        envelope = [line for line in ax.get_lines() if line.get_label() == "best K (B* is read on it)"]
        b_star = [line for line in ax.get_lines() if line.get_label().startswith("B* ≈")]
        if not b_star:
            continue
        assert len(envelope) == 1
        x, y = (np.asarray(v, dtype=float) for v in envelope[0].get_data())
        at = float(b_star[0].get_xdata()[0])
        i = int(np.searchsorted(x, at))
        assert y[i - 1] >= 1.0 > y[i]  # the drawn best-K line crosses 1× between its neighbours ...
        crossing = 2 ** np.interp(1.0, [y[i], y[i - 1]], [np.log2(x[i]), np.log2(x[i - 1])])
        assert at == pytest.approx(crossing, rel=0.02)  # ... where B* stands (log2 interpolation)
        checked += 1
    assert checked >= 1
    plt.close("all")


def test_help_text_keeps_its_brackets():
    from typer.testing import CliRunner

    from specbench.cli import app

    text = CliRunner().invoke(app, ["sweep", "--help"], env={"COLUMNS": "300"}).output
    assert "pip install 'specbench[ray]'" in text  # rich markup ate [ray]


def test_memory_chart_labels_do_not_overlap(tmp_path, monkeypatch):
    from pathlib import Path

    import specbench.report.charts as report
    from specbench.report import analyse
    from specbench.results import load_run

    run = load_run(Path(__file__).resolve().parent / "fixtures" / "cpu" / "default-grid-profiled")
    analysis = analyse(run)
    longer = analysis.cells.copy()  # long draft names, as a user's own model paths are
    longer["draft"] = longer["draft"].replace({"smollm2-135m@bf16": "/models/SmolLM2-135M-Instruct-draft@bf16",
                                               "ngram": "ngram:4-prompt-lookup"})
    analysis.cells = longer
    kept = []
    monkeypatch.setattr(report.plt, "close", lambda fig=None: kept.append(fig))
    report.chart_memory(analysis, tmp_path / "memory.png")
    fig = kept[0]
    renderer = fig.canvas.get_renderer()
    boxes = [label.get_window_extent(renderer) for label in fig.axes[0].get_xticklabels() if label.get_text()]
    assert len(boxes) == 5 and not any(a.overlaps(b) for a, b in itertools.combinations(boxes, 2))
    plt.close(fig)
