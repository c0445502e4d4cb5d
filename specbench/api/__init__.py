"""specbench from Python: typed arguments in, result objects out. The commands (specbench.cli)
parse their options, call these and print what they return.

    from specbench import api
    result = api.check("results/my-run", batch_sizes=[16, 32])
    result.exit_code, result.verdict.message
    api.price("llama3-70b", drafts=["1b", "8b"], alpha=0.7, tp=[4, 8]).table  # on the kernel tables

The planning questions: `predict` (a run's fit), `price` (the kernel tables' static batch),
`closed_loop` and `closed_loop_on_run` (one replica under closed-loop clients), `size_fleet` and
`size_fleet_on_run` (the fewest replicas that meet an SLO at a trace), `fleet_as_is` and
`fleet_as_is_on_run` (a given number of replicas at a trace), each on the tables or on a vLLM run's
servers.

Importing this package loads neither pandas nor any engine; each function loads what it needs.
"""

from specbench.api.closed_loop import ClosedLoop, closed_loop, closed_loop_on_run
from specbench.api.errors import UsageError
from specbench.api.fleet import FleetAsIs, FleetSizes, fleet_as_is, fleet_as_is_on_run, size_fleet, size_fleet_on_run
from specbench.api.prediction import Prediction, predict
from specbench.api.tables import TablePrice, price
from specbench.api.verdict import CheckResult, check

__all__ = ["CheckResult", "ClosedLoop", "FleetAsIs", "FleetSizes", "Prediction", "TablePrice", "UsageError", "check",
           "closed_loop", "closed_loop_on_run", "fleet_as_is", "fleet_as_is_on_run", "predict", "price", "size_fleet",
           "size_fleet_on_run"]
