"""A server's Prometheus /metrics, read with prometheus_client's own parser, and the deltas of its
counters and histograms around a measurement (the counters are cumulative over the server's life,
warm-up included, so a cell's share is what changed while it ran)."""

from __future__ import annotations

import urllib.request
from dataclasses import dataclass

from prometheus_client.parser import text_string_to_metric_families


@dataclass(frozen=True)
class Sample:
    name: str
    labels: tuple[tuple[str, str], ...]
    value: float

    def label(self, key: str, default: str = "") -> str:
        return dict(self.labels).get(key, default)


class Snapshot:
    """Every sample of one scrape."""

    def __init__(self, samples: list[Sample]) -> None:
        self.samples = samples

    @classmethod
    def parse(cls, text: str, only: tuple[str, ...] = ()) -> "Snapshot":
        """Every sample of `text`; with `only`, just the metrics whose names start with one of
        these prefixes (lines of others are dropped before parsing: a whole vLLM scrape takes
        milliseconds of the GIL that a sampler running beside the load generator must not take)."""
        if only:
            text = "\n".join(line for line in text.splitlines() if _metric_name(line).startswith(only)) + "\n"
        samples = []
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                samples.append(Sample(sample.name, tuple(sorted(sample.labels.items())), float(sample.value)))
        return cls(samples)

    @classmethod
    def scrape(cls, base_url: str, timeout_s: float = 10.0, only: tuple[str, ...] = ()) -> "Snapshot":
        with urllib.request.urlopen(base_url.rstrip("/") + "/metrics", timeout=timeout_s) as response:
            return cls.parse(response.read().decode(), only)

    @classmethod
    def merged(cls, snapshots: list["Snapshot"], label: str = "server") -> "Snapshot":
        """Several servers' scrapes as one, each sample labelled with its server's number: totals
        and deltas are the fleet's, a counter's series stay apart (each server's own)."""
        if len(snapshots) == 1:
            return snapshots[0]
        return cls([Sample(s.name, tuple(sorted((*s.labels, (label, str(n))))), s.value)
                    for n, snapshot in enumerate(snapshots) for s in snapshot.samples])

    def find(self, name: str, **labels: str) -> list[Sample]:
        return [s for s in self.samples if s.name == name and all(s.label(k) == v for k, v in labels.items())]

    def total(self, name: str, **labels: str) -> float:
        """The sum over every series of `name` matching `labels` (over engines, say); 0 if none."""
        return sum(s.value for s in self.find(name, **labels))

    def has(self, name: str) -> bool:
        return any(s.name == name for s in self.samples)

    def by_label(self, name: str, key: str) -> dict[str, float]:
        """`name`'s values summed per value of label `key` (per draft position, say)."""
        out: dict[str, float] = {}
        for s in self.find(name):
            out[s.label(key)] = out.get(s.label(key), 0.0) + s.value
        return out

    def info_labels(self, name: str) -> dict[str, str]:
        """The labels of an info-style gauge (vLLM's cache_config_info carries its values as labels)."""
        found = self.find(name)
        return dict(found[0].labels) if found else {}


def _metric_name(line: str) -> str:
    """The metric a line of the text format is about (its HELP or TYPE comment included)."""
    if line.startswith(("# HELP ", "# TYPE ")):
        return line.split(" ", 3)[2] if line.count(" ") >= 2 else ""
    return "" if line.startswith("#") else line.split("{", 1)[0].split(" ", 1)[0]


def delta(before: Snapshot, after: Snapshot, name: str, **labels: str) -> float:
    return after.total(name, **labels) - before.total(name, **labels)


def histogram_mean_delta(before: Snapshot, after: Snapshot, name: str) -> float:
    """Mean of the observations a histogram `name` received between two scrapes (NaN if none)."""
    count = delta(before, after, name + "_count")
    return delta(before, after, name + "_sum") / count if count else float("nan")
