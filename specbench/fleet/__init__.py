"""How many GPUs a traffic needs: served replicas simulated step by step (issue 40).

`replica` runs requests through one continuous-batching replica (vLLM v1's scheduler: token
budget, chunked prefill, sequence limit, KV capacity, preemption, speculation with measured
acceptance); `router` spreads a traffic over several (least-outstanding, round-robin or
prefix-aware); `sizing` finds the fewest that meet an SLO with headroom; `tables` prices steps
from NVIDIA's kernel tables, `served` fits them on a vLLM run; `plan` builds the tables
`specbench plan` prints. It is part of the judge: it reads tables and runs, never an engine.
"""

from specbench.fleet.replica import Outcome, Replica, ReplicaSpec, Speculation, simulate  # noqa: F401
from specbench.fleet.router import ROUTERS, FleetOutcome, simulate_fleet  # noqa: F401
