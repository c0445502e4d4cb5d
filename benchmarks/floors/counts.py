"""The floors' counts on a checkout (issue 38): imports inside functions, imports that cross a wall
upwards, and the largest circle of modules that import each other.

    python benchmarks/floors/counts.py [CHECKOUT]      # default: this checkout

The walls are the ones pyproject.toml's contracts draw, applied to any checkout by package name
(plan, measuring and judge), so a checkout from before the contracts is counted by the same rule.
The import graph is grimp's, the one import-linter checks: it counts imports inside functions.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

# Floors by top-level module of specbench, lowest first; the judge beside measuring, above the plan.
PLAN = ("schema", "results", "models", "workloads", "synthetic", "shapes", "traces", "grid")
MEASURING = ("where", "measure", "lossless", "engines", "native", "served", "measuring", "executors")
JUDGE = ("fit", "gate", "report")
TOP = ("cli", "sweep")  # above every floor: the sweep plans, measures, and judges when to stop (--until-decided)

PROBE = r"""
import json, sys
import grimp
graph = grimp.build_graph("specbench")
edges = sorted({(a, b) for a in graph.modules for b in graph.find_modules_directly_imported_by(a)})
print(json.dumps(edges))
"""


def floor(module: str) -> tuple[str, int]:
    """(floor, rank within the floor's order) of a specbench module."""
    part = module.split(".")[1] if "." in module else ""
    for name, order in (("plan", PLAN), ("measuring", MEASURING), ("judge", JUDGE), ("cli", TOP)):
        if part in order:
            return name, order.index(part)
    return "root", -1


def upward(importer: str, imported: str) -> bool:
    """An import the floors forbid: the plan reaching measuring, the judge or the cli; measuring
    reaching the judge or the cli; the judge reaching measuring or the cli; or, inside the plan and
    measuring, a module importing one of a higher rank."""
    (a, rank_a), (b, rank_b) = floor(importer), floor(imported)
    if "root" in (a, b) or a == "cli":  # the cli and the sweep stand above every floor
        return False
    if a != b:
        return b == "cli" or a == "plan" or (a, b) in (("measuring", "judge"), ("judge", "measuring"))
    return a in ("plan", "measuring") and rank_b > rank_a


def largest_circle(edges: list[tuple[str, str]]) -> list[str]:
    """The largest strongly connected component of the module graph (Tarjan, iterative)."""
    graph: dict[str, list[str]] = {}
    for a, b in edges:
        graph.setdefault(a, []).append(b)
        graph.setdefault(b, [])
    index, low, on_stack, stack, components, counter = {}, {}, set(), [], [], [0]
    for root in graph:
        if root in index:
            continue
        work = [(root, iter(graph[root]))]
        index[root] = low[root] = counter[0]
        counter[0] += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            advanced = False
            for child in children:
                if child not in index:
                    index[child] = low[child] = counter[0]
                    counter[0] += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(graph[child])))
                    advanced = True
                    break
                if child in on_stack:
                    low[node] = min(low[node], index[child])
            if advanced:
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                components.append(component)
    return sorted(max(components, key=len))


def counts(checkout: Path) -> dict:
    package = checkout / "specbench"
    local = sum(1 for path in package.rglob("*.py") for line in path.read_text().splitlines()
                if re.match(r"^\s{4,}(from specbench|import specbench)", line))
    done = subprocess.run([sys.executable, "-c", PROBE], capture_output=True, text=True, cwd=checkout,
                          env={"PYTHONPATH": str(checkout), "PATH": "/usr/bin:/bin"}, check=True)
    edges = [tuple(edge) for edge in json.loads(done.stdout)]
    crossing = sorted((a, b) for a, b in edges if upward(a, b))
    circle = largest_circle(edges)
    return {"imports_inside_functions": local, "import_edges": len(edges), "upward_imports": len(crossing),
            "upward_examples": [f"{a} -> {b}" for a, b in crossing[:12]], "largest_circle_files": len(circle),
            "largest_circle": circle}


if __name__ == "__main__":
    where = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).resolve().parents[2]
    print(json.dumps(counts(where), indent=2))
