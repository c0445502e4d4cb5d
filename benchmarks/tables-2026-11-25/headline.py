"""The headline on the kernel tables: llama3-70b with the 1b and 8b drafts, H100 at TP4 and TP8 and
H200 at TP4 and TP8, B = 1..256, α 0.6 / 0.7 / 0.8, 1k and 4k-token prompts, 128 output tokens.
Writes headline.md (B*, the K schedule, the speed-up at B = 1, 32 and 256, and $ per 1M tokens
at the cheapest batch with and without speculation) and headline_decisions.json beside this file.

    python benchmarks/tables-2026-11-25/headline.py
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).parent
SIZES = "1,2,4,8,16,32,64,128,256"


def plan(device: str) -> dict:
    command = ["specbench", "plan", "--target", "llama3-70b", "--drafts", "1b,8b", "--device", device, "--tp", "4,8",
               "--alpha", "0.6,0.7,0.8", "--k", "1,2,3,4,6,8", "--batch-sizes", SIZES, "--context-lengths", "1k,4k",
               "--max-new-tokens", "128", "--json"]
    print("+ " + " ".join(command), file=sys.stderr)
    return json.loads(subprocess.run(command, check=True, capture_output=True, text=True).stdout)


def speedup_at(plan: dict, tp: int, context: int, acceptance: str, draft: str, b: int) -> str:
    cells = [r for r in plan["predictions"] if (r["tp"], r["context_length"], r["acceptance"], r["draft"],
                                                 r["batch_size"]) == (tp, context, acceptance, draft, b)]
    fits = [r for r in cells if r["fits"] and r["speedup"] is not None]
    if not fits:
        return "does not fit"
    best = max(fits, key=lambda r: r["speedup"])
    return f"{best['speedup']:.2f}× (K={best['k']})"


def main() -> None:
    lines = []
    decisions = {}
    for device in ("h100", "h200"):
        result = plan(device)
        decisions[device] = {"tables": result["tables"], "decisions": result["decisions"]}
        lines += [f"### {result['tables']}", "",
                  "| TP | prompt | α | draft | B=1 | B=32 | B=256 | B* | K schedule | cheapest $/1M: AR → SD |",
                  "|---|---|---|---|---|---|---|---|---|---|"]
        for d in result["decisions"]:
            b_star = d["crossover"]
            lines.append(f"| {d['tp']} | {d['context_length']} | {d['acceptance']} | {d['draft']} | "
                         + " | ".join(speedup_at(result, d["tp"], d["context_length"], d["acceptance"], d["draft"], b)
                                      for b in (1, 32, 256))
                         + f" | {b_star} | `{d['k_schedule']}` | ${d['ar_cheapest_per_1m']:.2f} → "
                         f"${d['sd_cheapest_per_1m']:.2f} |")
        lines.append("")
    (HERE / "headline.md").write_text("\n".join(lines))
    (HERE / "headline_decisions.json").write_text(json.dumps(decisions, indent=1))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
