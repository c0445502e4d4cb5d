"""Where a served n-gram verify step's time goes (issue 40, part 3: the rest of ngram K=2's dearer
steps that the attention kernel's table did not explain).

A vLLM CPU server as specbench's vLLM engine starts it (SmolLM2-135M fp32, --enforce-eager, niced,
vLLM binding its compute to one core), once without speculation and once with ngram K=2 (specbench's
`ngram` config: prompt_lookup 1-3). Eight streamed requests of the chat workload's 2k-token prompts
(`--context-lengths 2k`), 400 tokens each, greedy, sent at once. Once every row decodes:
- the worker is sampled with py-spy (wall clock, idle included, from another core) for WINDOW_S:
  the worker's time by where it is (the attention kernel, the linear layers' oneDNN GEMMs, the rest
  of the forward, the rest of execute_model, waiting for the next step);
- each process's CPU time over the same window (/proc);
- the steps are read off the streamed tokens (a step's tokens arrive together, as replay_steps.py
  reads them); the median of those in the window with every row decoding.

Needs py-spy (`pip install py-spy`; not a specbench dependency). On this 2-core VM, ~5 minutes at
8 rows, ~9 at 16:

    python benchmarks/host-costs/verify_profile.py [--rows 16]

Writes verify_profile.md (verify_profile-B16.md at 16 rows; the raw py-spy stacks under profiles/,
not committed) next to this file.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import shutil
import subprocess
import sys
import threading
import time
from pathlib import Path

import httpx
import numpy as np

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from specbench.served.server import ServerProcess, free_port  # noqa: E402
from specbench.grid import SweepConfig  # noqa: E402
from specbench.served.vllm_engine import draft_speculative_config, model_path  # noqa: E402
from specbench.workloads import encode_prompt, load_workload, long_context_records  # noqa: E402

HERE = Path(__file__).resolve().parent
CONTEXT, MAX_TOKENS = 2048, 400
WINDOW_S = 12.0
SAME_STEP_S = 0.003  # as replay_steps.py
SERVER_NICE = 10  # as the vLLM engine starts a CPU server
# where the worker's samples are, by the innermost of these frames on its stack (first match wins)
PLACES = (("attention kernel", "cpu_attention_with_kv_cache"), ("linear layers (oneDNN GEMM)", "onednn_mm"),
          ("rest of the forward", "_model_forward"), ("rest of execute_model", "execute_model"),
          ("waiting for the next step", "worker_busy_loop"))


def start(mode: str, model: Path, out: Path) -> ServerProcess:
    port = free_port()
    command = [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model),
               "--served-model-name", "specbench-target", "--host", "127.0.0.1", "--port", str(port),
               "--dtype", "float32", "--seed", "0", "--no-enable-prefix-caching", "--disable-uvicorn-access-log",
               "--enforce-eager"]
    if mode != "autoregressive":
        command += ["--speculative-config", json.dumps(draft_speculative_config(mode, 2))]
    env = {"VLLM_CPU_KVCACHE_SPACE": "2", "PYTHONUNBUFFERED": "1", "TOKENIZERS_PARALLELISM": "false",
           "HF_HUB_OFFLINE": "1"}
    server = ServerProcess(command, out / f"{mode}.log", port, env=env, nice=SERVER_NICE)
    server.start()
    server.wait_until_healthy(300, f"vLLM server ({mode})")
    return server


def cpu_seconds(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def places(stacks: Path) -> dict[str, float]:
    """Share of the worker's main-thread samples by PLACES."""
    counts: collections.Counter = collections.Counter()
    for line in stacks.read_text().splitlines():
        stack, _, n = line.rpartition(" ")
        if "worker_busy_loop" not in stack:  # its other threads (death-pipe monitor, tqdm) only wait
            continue
        frames = [frame.split(" (")[0] for frame in stack.split(";")]
        place = next((name for name, marker in PLACES if any(marker in f for f in frames)), "other")
        counts[place] += int(n)
    total = sum(counts.values())
    return {name: counts[name] / total for name, _ in PLACES}


def measure(mode: str, model: Path, prompts: list[list[int]], out: Path) -> dict:
    """One server, every prompt streamed at once: its steps with every row decoding, its
    processes' CPU shares and its worker's time by PLACES."""
    server = start(mode, model, out)
    try:
        arrivals: dict[int, list[float]] = {i: [] for i in range(len(prompts))}

        def stream(i: int) -> None:
            with httpx.stream("POST", f"{server.url}/v1/completions", timeout=900, json={
                    "model": "specbench-target", "prompt": prompts[i], "max_tokens": MAX_TOKENS, "temperature": 0,
                    "ignore_eos": True, "stream": True}) as response:
                for line in response.iter_lines():
                    if line.startswith("data: ") and "[DONE]" not in line:
                        arrivals[i].append(time.monotonic())

        threads = [threading.Thread(target=stream, args=(i,)) for i in range(len(prompts))]
        for thread in threads:
            thread.start()
        while min(len(a) for a in arrivals.values()) < 5:  # every row decodes
            time.sleep(0.2)
        processes = {p.name(): p.pid for p in server.process_tree() if p.name().startswith("VLLM::")}
        worker = next(name for name in processes if "Worker" in name)
        # py-spy off the worker's compute core, or its sampling is counted in the steps it samples
        elsewhere = (set(range(os.cpu_count() or 1)) - os.sched_getaffinity(processes[worker])) or None
        spy = subprocess.Popen([shutil.which("py-spy") or "py-spy", "record", "-p", str(processes[worker]),
                                "-d", str(int(WINDOW_S)), "-r", "100", "-f", "raw", "--idle", "--nonblocking",
                                "-o", str(out / f"{mode}.worker.txt")],
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                               preexec_fn=(lambda: os.sched_setaffinity(0, elsewhere)) if elsewhere else None)
        before, started = {n: cpu_seconds(p) for n, p in processes.items()}, time.monotonic()
        spy.wait()
        after, ended = {n: cpu_seconds(p) for n, p in processes.items()}, time.monotonic()
        for thread in threads:
            thread.join()
    finally:
        server.stop()
    times = np.sort(np.concatenate([np.array(a) for a in arrivals.values()]))
    ends = times[np.concatenate([[True], np.diff(times) > SAME_STEP_S])]
    firsts, lasts = [a[0] for a in arrivals.values()], [a[-1] for a in arrivals.values()]
    full = [e - s for s, e in zip(ends[:-1], ends[1:])
            if started <= e <= ended and all(f < s and e <= last + 1e-4 for f, last in zip(firsts, lasts))]
    return {"mode": mode, "step_ms": float(np.median(full)) * 1e3, "steps": len(full),
            "cpu": {n: (after[n] - before[n]) / (ended - started) for n in processes},
            "places": places(out / f"{mode}.worker.txt")}


def main() -> None:
    from transformers import AutoTokenizer

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=8, help="requests decoding together (8)")
    rows = parser.parse_args().rows
    model = Path(model_path("smollm2-135m", SweepConfig()))  # the directory the vLLM engine serves
    tokenizer = AutoTokenizer.from_pretrained(model)
    records = long_context_records(load_workload("chat").records[:rows], "chat", CONTEXT,
                                   lambda r: encode_prompt(r, tokenizer), seed=0)
    prompts = [encode_prompt(record, tokenizer) for record in records]
    out = HERE / "profiles"
    out.mkdir(exist_ok=True)
    results = [measure(mode, model, prompts, out) for mode in ("autoregressive", "ngram")]
    base = results[0]
    lines = [f"# Where a served n-gram verify step's time goes (vLLM CPU, {rows} rows of 2k-token prompts)", "",
             f"`python benchmarks/host-costs/verify_profile.py`: SmolLM2-135M fp32, --enforce-eager, one "
             f"compute core; {rows} streamed requests of {CONTEXT}-token prompts, {MAX_TOKENS} tokens each; "
             f"{WINDOW_S:.0f} s of py-spy (wall clock, 100 Hz, on another core) on the worker once every row decodes. A step's time is "
             f"the median of the window's steps with all {rows} rows decoding (read off the streamed tokens).", "",
             "| server | step ms (steps) | " + " | ".join(f"{name}, ms" for name, _ in PLACES)
             + " | CPU share: engine core / worker |", "|---|---|" + "---|" * len(PLACES) + "---|"]
    for result in results:
        step = result["step_ms"]
        cpu = result["cpu"]
        lines.append(f"| {result['mode']} | {step:.0f} ({result['steps']}) | "
                     + " | ".join(f"{result['places'][name] * step:.0f}" for name, _ in PLACES)
                     + f" | {next(v for k, v in cpu.items() if 'Engine' in k):.2f} / "
                       f"{next(v for k, v in cpu.items() if 'Worker' in k):.2f} |")
    ngram = results[1]
    lines += ["", "ngram over the baseline, ms a step: " + ", ".join(
        f"{name} {ngram['places'][name] * ngram['step_ms'] - base['places'][name] * base['step_ms']:+.0f}"
        for name, _ in PLACES) + f"; in all {ngram['step_ms'] - base['step_ms']:+.0f}."]
    (HERE / ("verify_profile.md" if rows == 8 else f"verify_profile-B{rows}.md")).write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
