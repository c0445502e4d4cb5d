"""Acceptance published by others, as labelled presets for a plan (`--acceptance published:NAME`).

Each preset states what its source measured: the mean acceptance length τ (tokens a verify emits,
the bonus token counted) or the share of drafted tokens accepted, at one K, with its engine,
workload, temperature and citation. A plan reads it as the i.i.d. α that gives that figure at the
source's K; at another K that α is carried over, which the answer says."""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import cache
from importlib import resources

PREFIX = "published:"  # (api.tables.PUBLISHED)


@dataclass(frozen=True)
class PublishedAcceptance:
    name: str
    target: str  # the alias of the target it was measured on
    drafter: str  # the drafter kind: mtp, eagle3, model
    what: str
    k: int
    temperature: float
    engine: str
    workload: str
    source: str
    url: str
    mean_acceptance_length: float | None = None
    accepted_share: float | None = None  # accepted / drafted tokens

    @property
    def alpha(self) -> float:
        """The i.i.d. α that gives the published figure at the source's K."""
        if self.mean_acceptance_length is not None:
            return alpha_for(lambda a: tau(a, self.k), self.mean_acceptance_length)
        return alpha_for(lambda a: (tau(a, self.k) - 1) / self.k, self.accepted_share)

    @property
    def figure(self) -> str:
        if self.mean_acceptance_length is not None:
            return f"τ {self.mean_acceptance_length:g} at K={self.k}"
        return f"{self.accepted_share:.1%} of drafted tokens accepted at K={self.k}"

    def describe(self) -> str:
        """What the answer says it rests on."""
        return (f"PUBLISHED acceptance {self.name}: {self.figure} ({self.what}; {self.engine}; {self.workload}; "
                f"T={self.temperature:g}), by {self.source}, not measured on your traffic; planned as i.i.d. "
                f"α {self.alpha:.3f}, carried over to other K")


def tau(alpha: float, k: int) -> float:
    """Tokens a verify of K i.i.d. drafts emits: (1 − α^(K+1)) / (1 − α)."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def alpha_for(figure, value: float) -> float:
    """The α in [0, 1) at which the increasing `figure(α)` equals `value` (bisection)."""
    low, high = 0.0, 1.0 - 1e-9
    for _ in range(60):
        middle = (low + high) / 2
        low, high = (middle, high) if figure(middle) < value else (low, middle)
    return (low + high) / 2


@cache
def presets() -> dict[str, PublishedAcceptance]:
    text = resources.files("specbench").joinpath("data/published_acceptance.json").read_text()
    return {name: PublishedAcceptance(name, **fields) for name, fields in json.loads(text).items()}


def preset(reference: str) -> PublishedAcceptance:
    """`published:NAME`'s preset; a ValueError naming the presets for an unknown one."""
    name = reference.removeprefix(PREFIX)
    found = presets().get(name)
    if found is None:
        raise ValueError(f"--acceptance {reference}: no such published preset; the presets are "
                         + ", ".join(f"{PREFIX}{n}" for n in presets()))
    return found
