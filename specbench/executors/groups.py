"""Pairing groups: the unit a cluster places on one node. A group is some speculative cells and
the autoregressive baselines they are compared with, so that each speed-up is measured on one
node. A speculative configuration (one vLLM server: a draft, its K) is never split over nodes
unless there are fewer configurations than slots; then its cells are split by pairing group
(workload, load, temperature), which needs no extra baseline."""

from __future__ import annotations

from dataclasses import dataclass, field

from specbench.grid import SCHEDULE_MARK, Cell


@dataclass
class PairingGroup:
    index: int
    cells: list[Cell] = field(default_factory=list)

    @property
    def speculative(self) -> list[Cell]:
        return [cell for cell in self.cells if cell.is_speculative]

    def describe(self) -> str:
        configs = sorted({configuration(cell) for cell in self.speculative})
        shown = ", ".join(f"{draft}" + (f" K={k}" if k else "") + (f" α={alpha}" if alpha else "")
                          for draft, k, alpha in configs) or "baselines only"
        return f"group {self.index + 1}: {shown} ({len(self.cells)} cells)"


def configuration(cell: Cell) -> tuple[str, int, str]:
    """The speculative configuration a cell runs under: one server on the vLLM engine."""
    return cell.draft, 0 if SCHEDULE_MARK in cell.draft else cell.k, cell.alpha


def pairing_groups(todo: list[Cell], planned: list[Cell], slots: int) -> list[PairingGroup]:
    """`todo` split into at most `slots` groups (cells measured at once), each holding the
    baselines of its speculative cells, in plan order. Baselines whose speculative cells are all
    finished go to the smallest group."""
    order = {cell.id: index for index, cell in enumerate(planned)}
    by_id = {cell.id: cell for cell in planned}
    units: dict[tuple, list[Cell]] = {}
    for cell in todo:
        if cell.is_speculative:
            units.setdefault(configuration(cell), []).append(cell)
    chunks = list(units.values())
    if 0 < len(chunks) < slots:  # fewer configurations than slots: split them by pairing group
        finer = [[c for c in chunk if c.group == group] for chunk in chunks
                 for group in dict.fromkeys(c.group for c in chunk)]
        chunks = finer if len(finer) > len(chunks) else chunks
    count = max(1, min(slots, len(chunks)))
    groups = [PairingGroup(index) for index in range(count)]
    for chunk in sorted(chunks, key=len, reverse=True):  # largest first, each into the smallest group
        min(groups, key=lambda g: len(g.cells)).cells.extend(chunk)
    placed = set()
    for group in groups:
        baselines = {cell.baseline_id for cell in group.cells}
        group.cells += [by_id[cell_id] for cell_id in baselines if cell_id in by_id]
        placed |= {cell.id for cell in group.cells}
    for cell in todo:
        if cell.id not in placed:
            min(groups, key=lambda g: len(g.cells)).cells.append(cell)
    for group in groups:
        group.cells = sorted(dict.fromkeys(group.cells), key=lambda c: order.get(c.id, 0))
    return [group for group in groups if group.cells]
