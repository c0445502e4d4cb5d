"""SIGTERM (or SIGINT) a Ray sweep after its first cell finishes: how long until the driver exits,
how many of the 10 cells ran, and whether a task is left. A two-node local cluster
(ray.cluster_utils.Cluster) of the tests' tiny models; run from the repository root:

    python benchmarks/scaling-out/ray_signal.py TERM            # the cluster as started here
    (trap '' INT; python benchmarks/scaling-out/ray_signal.py TERM)   # started in the background:
                                                                        # its workers inherit SIGINT ignored
"""
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pandas as pd
import psutil
from ray.cluster_utils import Cluster

sys.path.insert(0, os.getcwd())
from tests.conftest import save_tiny_model, tiny_tokenizer  # noqa: E402

scratch = Path(tempfile.mkdtemp(prefix="ray-signal-"))
shared = tiny_tokenizer(320)
target = save_tiny_model(scratch / "target", shared, layers=4, seed=0)
draft = save_tiny_model(scratch / "draft", shared, layers=2, seed=1)
signum = {"TERM": signal.SIGTERM, "INT": signal.SIGINT}[sys.argv[1]]
cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
for _ in range(2):
    cluster.add_node(num_cpus=1)
cluster.wait_for_nodes()
out = scratch / "run"
command = [sys.executable, "-m", "specbench.cli", "sweep", "--target", str(target), "--drafts", f"{draft},ngram:2",
           "--k", "2,3", "--batch-sizes", "1,2", "--temperatures", "0", "--workloads", "chat",
           "--max-new-tokens", "400", "--num-prompts", "2", "--dtype", "fp64", "--output", str(out),
           "--executor", "ray"]
process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                           env={**os.environ, "RAY_ADDRESS": cluster.address})
while not (out / "cells.parquet").exists() and process.poll() is None:
    time.sleep(0.2)
signalled = time.monotonic()
process.send_signal(signum)
process.communicate(timeout=300)
took = time.monotonic() - signalled
cells = pd.read_parquet(out / "cells.parquet")
time.sleep(2)
left = [p.pid for p in psutil.process_iter(["cmdline"]) if "measure_group" in " ".join(p.info["cmdline"] or [])]
print(f"exit {process.returncode}, {took:.1f} s after the signal, {len(cells)} of 10 cells, status "
      f"{json.loads((out / 'run.json').read_text())['status']}, tasks left: {len(left)}")
cluster.shutdown()
