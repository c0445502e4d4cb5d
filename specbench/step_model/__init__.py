"""What one engine step costs: a step's shape goes in, seconds come out (`StepModel.seconds`).

- `shape`: `StepShape`, the step's prompt chunks, decoding rows and K.
- `model`: the `StepModel` contract the replica simulator and the planners price through, and
  `StepFunction`, a plain function of (prefill tokens, decode rows, K) as one.
- `overheads`: `Overheads`, the one place a step's host, launch, graph and executor time is
  composed with its kernels'.
- backends: `static_tables`, the kernel tables' static-batch step (`plan --target`'s, on the
  forwards and corrections fit.table_plan.TablePlanner holds); `mixed_tables`, the kernel tables' mixed prefill + decode step (the
  replica's, on a GPU a run did not measure); `served_fit`, a served run's fitted step
  (`ServedPrice`, fitted by `fleet.served.fit_served`); `native_fit`, a native run's fitted step
  (`NativeFitStep` on `fit.step_times.StepTimes`: a roofline over the run's forwards, or the tables
  corrected by them, `fit.calibration.TableForward`), which `plan RUN` prices through.

The package is priced by `fit` and `fleet` and imports nothing of measuring."""

from specbench.step_model.model import StepFunction, StepModel, as_step_model  # noqa: F401
from specbench.step_model.overheads import NO_OVERHEADS, Overheads  # noqa: F401
from specbench.step_model.shape import StepShape, capped_pairs  # noqa: F401
from specbench.step_model.mixed_tables import MixedTablesStep  # noqa: F401
from specbench.step_model.native_fit import NativeFitStep  # noqa: F401
from specbench.step_model.served_fit import ServedPrice, ServedStep  # noqa: F401
from specbench.step_model.static_tables import StaticTablesStep  # noqa: F401
