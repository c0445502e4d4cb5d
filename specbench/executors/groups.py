"""Pairing groups: the unit a cluster places on one node. A group is some speculative cells and
the autoregressive baselines they are compared with, so that each speed-up is measured on one
node.

Groups are balanced by estimated work, not by cell count: a draft-model cell costs several
n-gram cells, and on a served engine each configuration in a group costs a server start. Three
ways of cutting the grid compete, and the one whose longest group is shortest wins:
- whole configurations (a draft and its K: one vLLM server), each group adding the baselines it
  pairs with (a baseline measured on two nodes is one more copy);
- whole pairing groups (workload, load, temperature: a baseline and every speculative cell
  beside it), which copy no baseline but start every server in every group;
- configurations split by pairing group, the finest cut."""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Callable

from specbench.drafter_kinds import drafter_kind
from specbench.grid import SCHEDULE_MARK, Cell, ReplayShape, SweepConfig, requests_per_cell, split_schedule
from specbench.models import lookup_alias, parse_draft_spec, parse_dtype
from specbench.synthetic import shipped_config

# Only to place work, never reported: rough costs in target decode steps.
ASSUMED_ACCEPTANCE = {"ngram": 0.35, "model": 0.7}  # other kinds (self, eagle, mtp): 0.6
STEP_GROWTH_PER_SEQUENCE = 0.15  # a decode step at batch B costs 1 + 0.15 (B - 1) of batch 1's (CPU: 0.14-0.16)
VERIFY_GROWTH_PER_TOKEN = 0.1  # verifying K + 1 tokens costs 1 + 0.1 K of one decode step
SERVER_START_STEPS = 500.0  # a vLLM server's start (CPU: ~60 s of ~0.12 s steps; on a GPU it is relatively more)
UNKNOWN_DRAFT_RATIO = 0.1  # a draft forward's cost over the target's, where sizes are not known


@dataclass
class PairingGroup:
    index: int
    cells: list[Cell] = field(default_factory=list)
    share: float = float("nan")  # of the grid's estimated work

    @property
    def speculative(self) -> list[Cell]:
        return [cell for cell in self.cells if cell.is_speculative]

    def describe(self) -> str:
        ks: dict[tuple[str, str], list[int]] = {}
        for draft, k, alpha in sorted({configuration(cell) for cell in self.speculative}):
            ks.setdefault((draft, alpha), []).append(k)
        shown = "; ".join(draft + (f" K={','.join(map(str, k))}" if any(k) else "") + (f" α={alpha}" if alpha else "")
                          for (draft, alpha), k in ks.items()) or "baselines only"
        share = f", ~{self.share:.0%} of the estimated work" if math.isfinite(self.share) else ""
        return f"group {self.index + 1}: {shown} on {self.where()} ({len(self.cells)} cells{share})"

    def where(self) -> str:
        """The traffic its cells measure (workloads, loads, temperatures): what tells groups of the
        same drafts apart."""
        def listed(values) -> str:
            return ",".join(f"{v:g}" if isinstance(v, float) else str(v) for v in sorted(set(values)))

        loads = [f"B={listed(c.batch_size for c in self.cells if not c.request_rate)}"] \
            if any(not c.request_rate for c in self.cells) else []
        loads += [f"rate={listed(c.request_rate for c in self.cells if c.request_rate)}"] \
            if any(c.request_rate for c in self.cells) else []
        return " · ".join([listed(c.workload for c in self.cells), *loads,
                           f"T={listed(c.temperature for c in self.cells)}"])


def configuration(cell: Cell) -> tuple[str, int, str]:
    """The speculative configuration a cell runs under: one server on the vLLM engine."""
    return cell.draft, 0 if SCHEDULE_MARK in cell.draft else cell.k, cell.alpha


@dataclass
class WorkEstimate:
    """How long cells take, in target decode steps. Rough by design: it only balances groups."""

    config: SweepConfig
    server_start: float = 0.0  # per server a group starts (a configuration, the baseline's)
    draft_cost: Callable[[str], tuple[float, float]] = lambda draft: (0.6, 0.0)  # noqa: E731  (α, forward ratio)
    replay: ReplayShape | None = None  # a trace sweep's replay: its requests per cell
    _cells: dict[Cell, float] = field(default_factory=dict, repr=False)  # balancing prices each cell many times

    @classmethod
    def of(cls, config: SweepConfig, replay: ReplayShape | None = None) -> WorkEstimate:
        return cls(config, SERVER_START_STEPS if config.engine.name == "vllm" else 0.0, _draft_costs(config), replay)

    def cell(self, cell: Cell) -> float:
        if cell not in self._cells:
            batch = cell.batch_size or 4  # open loop: a few requests in flight
            requests = requests_per_cell(self.config, cell.batch_size, self.replay)
            steps = math.ceil(requests / batch) * self.config.grid.max_new_tokens
            steps *= (1 + STEP_GROWTH_PER_SEQUENCE * (batch - 1)) * (1 + cell.context_length / 8192)
            if cell.is_speculative:
                alpha, ratio = self.draft_cost(split_schedule(cell.draft)[0])
                k = max(cell.k, 1)
                tau = (1 - alpha ** (k + 1)) / (1 - alpha)
                steps = steps / tau * (1 + VERIFY_GROWTH_PER_TOKEN * k + k * ratio)
            self._cells[cell] = steps * self.config.grid.repeats
        return self._cells[cell]

    def group(self, cells: list[Cell]) -> float:
        servers = len({configuration(c) for c in cells if c.is_speculative}) + any(not c.is_speculative for c in cells)
        return sum(self.cell(c) for c in cells) + self.server_start * servers


def _draft_costs(config: SweepConfig) -> Callable[[str], tuple[float, float]]:
    """A draft's assumed α, and its forward's cost over the target's: their weights' bytes (a
    decode step reads every weight once) where the registry knows both models' sizes."""
    target = lookup_alias(config.grid.target)
    try:
        layers = int(shipped_config(config.grid.target)[1]["num_hidden_layers"])
    except Exception:  # not a registry model: its depth is not known without loading it
        layers = 0

    def ratio(spec) -> float:
        kind = drafter_kind(spec.kind)
        if kind.host_drafting:
            return 0.0
        if kind.target_prefix_layers:
            return min(1.0, spec.layers / layers) if layers else 0.5
        if not kind.separate_model:
            return UNKNOWN_DRAFT_RATIO  # a head (EAGLE, MTP) or a config passed through
        width = parse_dtype(spec.dtype).itemsize / config.engine.torch_dtype.itemsize if spec.dtype else 1.0
        if spec.model == config.grid.target:
            return width
        draft_model = lookup_alias(spec.model, target.family if target else None)
        if target and draft_model:
            return width * draft_model.params_b / target.params_b
        return UNKNOWN_DRAFT_RATIO

    def cost(draft: str) -> tuple[float, float]:
        try:
            spec = parse_draft_spec(draft, allow_served=True)
        except ValueError:
            return ASSUMED_ACCEPTANCE["model"], UNKNOWN_DRAFT_RATIO
        return ASSUMED_ACCEPTANCE.get(spec.kind, 0.6), ratio(spec)

    return cost


def pairing_groups(todo: list[Cell], planned: list[Cell], slots: int,
                   estimate: WorkEstimate) -> list[PairingGroup]:
    """`todo` split into at most `slots` groups (measured at once), each holding the baselines of
    its speculative cells, in plan order: of the three cuts, the one whose longest group is
    estimated shortest (then the least work in all). Baselines whose speculative cells are all
    finished go to the least loaded group."""
    order = {cell.id: index for index, cell in enumerate(planned)}
    by_id = {cell.id: cell for cell in planned}
    speculative = [cell for cell in todo if cell.is_speculative]
    cuts = [_chunks(speculative, configuration), _chunks(speculative, lambda c: c.group),
            _chunks(speculative, lambda c: (configuration(c), c.group))]
    best: list[list[Cell]] | None = None
    best_score = (math.inf, math.inf)
    for chunks in cuts:
        groups = _balanced(chunks, slots, estimate, by_id)
        score = (max(map(estimate.group, groups), default=0.0), sum(map(estimate.group, groups)))
        if best is None or score < best_score:
            best, best_score = groups, score
    groups = best or [[]]
    placed = {c.id for group in groups for c in group}
    for cell in todo:  # baselines no unfinished speculative cell pairs with
        if cell.id not in placed:
            min(groups, key=estimate.group).append(cell)
    total = sum(map(estimate.group, groups)) or 1.0
    return [PairingGroup(i, sorted(dict.fromkeys(cells), key=lambda c: order.get(c.id, 0)),
                         estimate.group(cells) / total)
            for i, cells in enumerate(group for group in groups if group)]


def _chunks(cells: list[Cell], key: Callable[[Cell], object]) -> list[list[Cell]]:
    chunks: dict[object, list[Cell]] = {}
    for cell in cells:
        chunks.setdefault(key(cell), []).append(cell)
    return list(chunks.values())


def _balanced(chunks: list[list[Cell]], slots: int, estimate: WorkEstimate,
              by_id: dict[str, Cell]) -> list[list[Cell]]:
    """Largest chunk first, each into the group it lengthens least (its baselines counted once
    per group): the longest-processing-time rule."""
    def with_baselines(cells: list[Cell]) -> list[Cell]:
        return list(dict.fromkeys([*cells, *(by_id[c.baseline_id] for c in cells if c.baseline_id in by_id)]))

    groups: list[list[Cell]] = [[] for _ in range(max(1, min(slots, len(chunks))))]
    for chunk in sorted(chunks, key=lambda chunk: estimate.group(with_baselines(chunk)), reverse=True):
        target = min(groups, key=lambda group: (estimate.group(with_baselines(group + chunk)), len(group)))
        target.extend(chunk)
    return [with_baselines(group) for group in groups]
