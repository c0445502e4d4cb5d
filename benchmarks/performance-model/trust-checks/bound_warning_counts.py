"""Cells the acceptance-bound warning flags in a run: the old rule (the bare point above its bound)
and the new one (fit.physics.lies_above: the interval or noise band above it)."""
import sys
from specbench.results import load_run
from specbench.fit.noise import run_noise
from specbench.fit.physics import above_bound, bound_warning, with_bounds
from specbench.fit.cells import ok_closed_loop, label_cells
for path in sys.argv[1:]:
    run = load_run(path)
    noise = run_noise(run.cells, run.requests, run.steps)
    sd = with_bounds(ok_closed_loop(label_cells(run.cells)).query("mode != 'autoregressive'"), noise)
    old = sd[sd["speedup"] > sd["speedup_bound"]]
    new = above_bound(run.cells, noise)
    print(f"{path}: old rule {len(old)} flagged, new rule {len(new)}; noise ±{noise.drift*100:.1f}%")
    for row in old.itertuples():
        band = noise.interval(row.cell_id, row.speedup)
        print(f"   {row.cell_id} {row.speedup:.3f} > {row.speedup_bound:.3f}  band {band[0]:.3f}-{band[1]:.3f}"
              + ("  FLAGGED" if row.cell_id in set(new["cell_id"]) else ""))
    print("   warning:", bound_warning(run.cells, noise))
