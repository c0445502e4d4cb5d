"""How many GPUs a traffic needs: served replicas simulated step by step (issue 40).

`replica.simulate` runs requests through one continuous-batching replica (vLLM v1's scheduler:
token budget, chunked prefill, sequence limit, KV capacity, preemption); `tables.step_cost` prices
its steps from NVIDIA's kernel tables. It is part of the judge: it reads tables and runs, never an
engine.
"""

from specbench.fleet.replica import Outcome, ReplicaSpec, Speculation, StepCost, simulate  # noqa: F401
