"""Judge two runs of the same rate sweep under a range of TPOT bounds: the point verdict (each
load's percentile as measured) against check's verdict with the percentiles' intervals.

    python benchmarks/rollout-gate/slo_verdict_scan.py RUN_A RUN_B ",p90" 0.030 0.070

counts the bounds (2 ms apart, TTFT bound 2 s) where the two runs' verdicts disagree."""
import sys

import numpy as np

from specbench.fit import parse_slo
from specbench.gate import evaluate_slo
from specbench.results import load_run

runs = [load_run(p) for p in sys.argv[1:3]]
bounds = np.round(np.arange(float(sys.argv[4]), float(sys.argv[5]) + 1e-9, 0.002), 3)
counts = {"point flips": 0, "PASS vs FAIL with intervals": 0, "interval flips": 0, "both agree": 0, "both inconclusive": 0, "one inconclusive": 0}
for bound in bounds:
    slo = parse_slo(f"ttft=2,tpot={bound}" + sys.argv[3] + "")
    results = [evaluate_slo(r.cells, r.requests, slo, state=None) for r in runs]
    point = ["N/A" if all(v.passes is None for v in res.verdicts) else
             "PASS" if all(v.passes for v in res.verdicts if v.passes is not None) else "FAIL" for res in results]
    full = [res.verdict for res in results]
    counts["point flips"] += sorted(point) == ["FAIL", "PASS"]
    counts["PASS vs FAIL with intervals"] += sorted(full) == ["FAIL", "PASS"]
    if "INCONCLUSIVE" in full:
        counts["both inconclusive" if full[0] == full[1] else "one inconclusive"] += 1
    elif full[0] == full[1]:
        counts["both agree"] += 1
    else:
        counts["interval flips"] += 1
    print(f"tpot<={bound*1e3:.0f}ms  point {point[0]:4}/{point[1]:4}  with intervals {full[0]:12}/{full[1]:12}")
print(len(bounds), "bounds:", counts)
