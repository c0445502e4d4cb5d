"""The report's chart helpers: the Pareto front a throughput/latency line joins, and point labels
that never overlap each other, a marker, the legend or the panel's edge."""

from __future__ import annotations

import itertools

import matplotlib.pyplot as plt
import numpy as np

from specbench.report import pareto_front, place_labels


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
