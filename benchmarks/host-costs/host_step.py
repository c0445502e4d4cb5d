"""What a vLLM engine step costs its host, outside the model's kernels (issue 40, part 2: the kernel
tables price a step's GPU time only; with synchronous scheduling the GPU waits while the host
schedules, prepares the next step's inputs and books the last one's tokens).

vLLM's engine core in this process (VLLM_ENABLE_V1_MULTIPROCESSING=0), vLLM for CPU (its CPU model
runner is vLLM's GPUModelRunner: the same scheduler, input preparation and output bookkeeping), on
a one-layer model of SmolLM2's vocabulary with hidden size 128 (random weights, fp32, --enforce-eager,
no prefix caching) so that the model's own compute is small. Every engine step is timed, and within
it the model's forward, its logits and the sampler (on a GPU, device work); the host's share is the
step less those three. Batches of 1-128 requests, 16- and 1,000-token prompts, 96 tokens each,
greedy, sent at once (the prefill steps admit them, then every row decodes); each batch run twice,
the second timed.

The fit, least squares over every timed step: host ms = a + b · running rows + c · new requests
+ d · prompt tokens. specbench/data/measured.json's `vllm_host_step` holds it (`fit.host_cost.VLLM_HOST_STEP`;
tests hold the two equal);
the simulator adds it to a synchronously scheduled step's kernel time and overlaps it with an
async-scheduled one's.

    python benchmarks/host-costs/host_step.py                          # ~1 minute on this 2-core VM
    python benchmarks/host-costs/host_step.py --speculative ngram      # ~3 minutes
    python benchmarks/host-costs/host_step.py --executor mp            # ~3 minutes

Writes host_step.csv (every timed step), host_step.json (the fit) and host_step.md next to this file.

With --speculative ngram: speculation's own host work (the n-gram proposer, the scheduler's and the
runner's handling of draft tokens). vLLM's ngram K=2 (prompt lookup 1-3) and the baseline are
measured in the same sitting, each engine in a fresh process, alternately (--sittings, the order
flipped each time). In both, the host's own phases of each step are timed: the scheduler's
schedule and update_from_output, the runner's _prepare_inputs, _bookkeeping_sync and
propose_draft_token_ids. Speculation's host time is the difference of the two engines' medians of
their sum over the decode steps at the same prompt and rows, sitting by sitting (a fit from another
day or machine would carry that machine's speed into it). The rest of a CPU step is not compared:
it holds tensor work (the verified positions' logits gathered and copied, the rejection sampler)
that a GPU does on the device, and that thrashes this VM's memory at 64-128 rows. The proposer's
lookup, which scans each row's whole context on one thread (vLLM 0.32 caps its numba threads at
one), is timed apart, directly on vLLM's `batch_propose_numba` at 8-128 rows and 1k-9k tokens of
context. The fit: speculation's host ms = a + b · rows + c · rows · context tokens, c the lookup's
and a, b least squares over every sitting's differences less the lookup.
specbench/data/measured.json's `ngram_host_step` holds it (tests hold the two equal). Writes
host_step-ngram.csv (every timed step of both engines), host_step-ngram.json and host_step-ngram.md.

With --executor mp: what vLLM's multiprocess executor adds to a step, as every server at TP > 1
runs its model runners in worker processes: the model runner in one worker process
(--distributed-executor-backend mp), each step's span in the engine core from its call of the
worker's execute_model to the return of its sample_tokens, less the worker's own time inside those
calls (timed in the worker process): serialising the step's inputs and outputs, sending them
through shared memory and receiving them. Fitted as the baseline's host time is (a + b · running
rows + c · new requests + d · prompt tokens, least squares over each step shape's median weighted
by its steps), over
--sittings fresh processes. specbench/data/measured.json's `multiproc_executor_step` holds it. Writes
host_step-executor.csv, .json and .md.
"""

from __future__ import annotations

import json
import os
import platform
import shutil
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")  # the engine core in this process, to time it
# a KV cache of a fixed size: vLLM for CPU otherwise reserves a share of the first NUMA node's memory and
# refuses to start where that node holds less than the share (seen on a 24 GiB VM whose node 0 had 9.5)
os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
HERE = Path(__file__).resolve().parent
BATCHES = (1, 8, 32, 64, 128)
PROMPTS = (16, 1000)
MAX_TOKENS = 96
TERMS = ("intercept", "per_running_row", "per_new_request", "per_prompt_token")


def tiny_model(folder: Path) -> Path:
    """One decoder layer of hidden size 128 with SmolLM2's tokenizer and vocabulary (random weights)."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    from specbench.grid import SweepConfig
    from specbench.served.vllm_engine import model_path

    source = Path(model_path("smollm2-135m", SweepConfig()))  # the shipped model, converted once
    raw = {k: v for k, v in json.loads((source / "config.json").read_text()).items() if not k.startswith("_")}
    raw.update(hidden_size=128, intermediate_size=256, num_hidden_layers=1, num_attention_heads=2,
               num_key_value_heads=1, head_dim=64)
    torch.manual_seed(0)
    LlamaForCausalLM(LlamaConfig(**raw)).save_pretrained(folder)
    for name in ("tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        shutil.copy(source / name, folder / name)
    return folder


class StepClock:
    """Times every engine-core step and, within it, the calls named in `parts`."""

    def __init__(self, core, runner) -> None:
        """`runner` None (the model runner in another process: vLLM's multiprocess executor): each
        step's time and shape alone."""
        self.parts: dict[str, float] = {}
        self.phases: dict[str, float] = {}
        self.steps: list[dict] = []
        self._depth = 0
        if runner is not None:
            self._wrap_runner(core, runner)
        self._wrap_step(core)

    def _wrap_runner(self, core, runner) -> None:
        self._wrap(runner.model, "forward", "forward")
        self._wrap(runner.model, "compute_logits", "logits")
        self._wrap(runner.sampler, "forward", "sampler")
        if getattr(runner, "rejection_sampler", None) is not None:  # speculating: on a GPU, device work
            self._wrap(runner.rejection_sampler, "forward", "sampler")
        # the host's own phases, timed apart: speculation's host work is their difference from the
        # baseline's (the rest of a CPU step also holds tensor work a GPU does on the device)
        self._phase(core.scheduler, "update_from_output", "update")
        self._phase(runner, "_prepare_inputs", "prepare")
        self._phase(runner, "_bookkeeping_sync", "bookkeeping")
        if hasattr(runner, "propose_draft_token_ids"):
            self._phase(runner, "propose_draft_token_ids", "propose")

    def _wrap_step(self, core) -> None:
        schedule = core.scheduler.schedule

        def scheduled(*args, **kwargs):
            started = time.perf_counter()
            out = schedule(*args, **kwargs)
            self.phases["schedule"] = self.phases.get("schedule", 0.0) + time.perf_counter() - started
            drafts = sum(len(ids) for ids in (out.scheduled_spec_decode_tokens or {}).values())
            self.shape = (out.total_num_scheduled_tokens, len(out.num_scheduled_tokens), len(out.scheduled_new_reqs),
                          drafts)
            return out

        core.scheduler.schedule = scheduled
        step = core.step

        def timed_step(*args, **kwargs):
            self.parts, self.phases, self.shape = {}, {}, None
            started = time.perf_counter()
            result = step(*args, **kwargs)
            total = time.perf_counter() - started
            if self.shape is not None:
                tokens, rows, new, drafts = self.shape
                device = sum(self.parts.values())
                self.steps.append({"tokens": tokens, "rows": rows, "new": new, "drafts": drafts, "step_ms": total * 1e3,
                                   **{f"{k}_ms": v * 1e3 for k, v in self.parts.items()},
                                   "host_ms": (total - device) * 1e3,
                                   **{f"{k}_phase_ms": v * 1e3 for k, v in self.phases.items()},
                                   "phases_ms": sum(self.phases.values()) * 1e3})
            return result

        core.step = core.step_fn = timed_step

    def _phase(self, owner, name: str, key: str) -> None:
        """Time `owner.name` into the step's host phase `key`."""
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.phases[key] = self.phases.get(key, 0.0) + time.perf_counter() - started

        setattr(owner, name, timed)

    def _wrap(self, owner, name: str, key: str) -> None:
        """Time `owner.name` into `key`, unless it runs inside another timed call (the rejection
        sampler calls the sampler): each moment counted once."""
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            if self._depth:
                return inner(*args, **kwargs)
            self._depth += 1
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self._depth -= 1
                self.parts[key] = self.parts.get(key, 0.0) + time.perf_counter() - started

        setattr(owner, name, timed)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def _design(steps: pd.DataFrame) -> np.ndarray:
    """The TERMS' columns: a decoding row schedules one token and its drafts, the rest are prompts'."""
    prompt_tokens = steps["tokens"] - (steps["rows"] - steps["new"]) - steps["drafts"]
    return np.c_[np.ones(len(steps)), steps["rows"], steps["new"], prompt_tokens.clip(lower=0)]


def fit(steps: pd.DataFrame, column: str = "host_ms", weights: np.ndarray | None = None) -> dict[str, float]:
    """`column` (ms) = the TERMS, least squares over every row of `steps` (each weighted by
    `weights`: its rows' counts, where a row is a median of several steps)."""
    design, measured = _design(steps), steps[column].to_numpy()
    scale = np.ones(len(steps)) if weights is None else np.sqrt(weights)
    coefficients, *_ = np.linalg.lstsq(design * scale[:, None], measured * scale, rcond=None)
    residual = measured - design @ coefficients
    return {**{f"{term}_ms": float(c) for term, c in zip(TERMS, coefficients)},
            "rms_residual_ms": float(np.sqrt(np.mean(residual ** 2)))}


NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def tiny_engine(folder: str, **options):
    """vLLM's offline engine on `tiny_model` (fp32, eager, no prefix caching), `options` its own."""
    from vllm import LLM

    return LLM(model=str(tiny_model(Path(folder))), enforce_eager=True, dtype="float32", max_num_seqs=256,
               max_num_batched_tokens=8192, max_model_len=4096, seed=0, enable_prefix_caching=False, **options)


def batches():
    """(prompt tokens, batch, its requests) for each of PROMPTS × BATCHES, greedy, MAX_TOKENS each."""
    from vllm import SamplingParams

    params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)
    for prompt in PROMPTS:
        for batch in BATCHES:
            rng = np.random.default_rng(batch * 7 + prompt)
            yield prompt, batch, [{"prompt_token_ids": rng.integers(100, 40000, prompt).tolist()}
                                  for _ in range(batch)], params


def measure(speculative: dict | None) -> pd.DataFrame:
    """Every timed step of BATCHES × PROMPTS, each batch's second run."""
    with tempfile.TemporaryDirectory() as folder:
        llm = tiny_engine(folder, speculative_config=speculative)
        core = llm.llm_engine.engine_core.engine_core
        clock = StepClock(core, core.model_executor.driver_worker.worker.model_runner)
        timed = []
        for prompt, batch, requests, params in batches():
            for _ in range(2):  # the first run warms up
                clock.steps.clear()
                llm.generate(requests, params, use_tqdm=False)
            timed += [{"prompt": prompt, "batch": batch, "index": index, **step}
                      for index, step in enumerate(clock.steps)]
    return pd.DataFrame(timed)


def measured_apart(function, *args) -> pd.DataFrame:
    """`function(*args)` (a measurement) in a fresh process: each engine starts as the first in its
    process would."""
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    with ProcessPoolExecutor(max_workers=1, mp_context=multiprocessing.get_context("spawn")) as pool:
        return pool.submit(function, *args).result()


def decode_steps(steps: pd.DataFrame) -> pd.DataFrame:
    """The steps in which every row of the batch decodes (no prompt, no finished row)."""
    return steps[(steps["new"] == 0) & (steps["tokens"] == steps["rows"] + steps["drafts"])
                 & (steps["rows"] == steps["batch"])]


LOOKUP_ROWS = (8, 32, 64, 128)
LOOKUP_CONTEXTS = (1000, 4000, 9000)


def lookup_timings(repeats: int = 7) -> pd.DataFrame:
    """vLLM's n-gram lookup (`batch_propose_numba`, one thread as vLLM 0.32 runs it) over random
    ids of a 128k vocabulary (few matches: the scan runs to the start of each row), the median of
    `repeats` calls after one that compiles, per rows × context."""
    from numba import set_num_threads
    from vllm.v1.spec_decode.ngram_proposer import batch_propose_numba

    set_num_threads(1)
    k, timed = NGRAM["num_speculative_tokens"], []
    rng = np.random.default_rng(0)
    for rows in LOOKUP_ROWS:
        for context in LOOKUP_CONTEXTS:
            tokens = rng.integers(0, 128_000, (rows, context + k), dtype=np.int32)
            lengths = np.full(rows, context, dtype=np.int32)
            drafts, counts = np.zeros((rows, k), np.int32), np.zeros(rows, np.int32)
            args = (list(range(rows)), lengths, tokens, NGRAM["prompt_lookup_min"], NGRAM["prompt_lookup_max"],
                    context + k, k, drafts, counts)
            batch_propose_numba(*args)
            seconds = []
            for _ in range(repeats):
                started = time.perf_counter()
                batch_propose_numba(*args)
                seconds.append(time.perf_counter() - started)
            timed.append({"rows": rows, "context": context, "lookup_ms": float(np.median(seconds)) * 1e3})
    return pd.DataFrame(timed)


def speculation_differences(steps: pd.DataFrame) -> pd.DataFrame:
    """Per sitting, prompt and rows: the speculative engine's median decode-step host time less the
    baseline's, and the context its rows held (mean over its decode steps)."""
    medians = decode_steps(steps).groupby(["sitting", "prompt", "rows", "speculative"])["phases_ms"].median().unstack()
    medians = medians.rename(columns={False: "baseline_ms", True: "ngram_ms"}).reset_index()
    return medians.assign(difference_ms=medians["ngram_ms"] - medians["baseline_ms"],
                          context=medians["prompt"] + MAX_TOKENS / 2)


def fit_speculation(differences: pd.DataFrame, lookup: pd.DataFrame) -> dict[str, float]:
    """a + b · rows + c · rows · context: c the lookup's own (least squares over `lookup`, with a
    per-row term), a and b over the differences less c's share."""
    design = np.c_[lookup["rows"], lookup["rows"] * lookup["context"]]
    (lookup_row_ms, per_token_ms), *_ = np.linalg.lstsq(design, lookup["lookup_ms"].to_numpy(), rcond=None)
    rows = differences["rows"].to_numpy()
    rest = differences["difference_ms"].to_numpy() - per_token_ms * rows * differences["context"].to_numpy()
    (intercept_ms, per_row_ms), *_ = np.linalg.lstsq(np.c_[np.ones(len(rows)), rows], rest, rcond=None)
    residual = rest - (intercept_ms + per_row_ms * rows)
    return {"intercept_ms": float(intercept_ms), "per_row_ms": float(per_row_ms),
            "per_context_token_ms": float(per_token_ms), "lookup_per_row_ms": float(lookup_row_ms),
            "rms_residual_ms": float(np.sqrt(np.mean(residual ** 2))), "differences": int(len(rows))}


def speculation_sittings(sittings: int) -> pd.DataFrame:
    """Both engines `sittings` times, alternately, the order flipped each sitting."""
    timed = []
    for sitting in range(sittings):
        order = (None, NGRAM) if sitting % 2 == 0 else (NGRAM, None)
        for speculative in order:
            steps = measured_apart(measure, speculative)
            timed.append(steps.assign(sitting=sitting, speculative=speculative is not None))
    return pd.concat(timed, ignore_index=True)


def write_speculation(sittings: int) -> None:
    import vllm

    steps = speculation_sittings(sittings)
    steps.round(4).to_csv(HERE / "host_step-ngram.csv", index=False)
    lookup = lookup_timings()
    differences = speculation_differences(steps)
    fitted = fit_speculation(differences, lookup)
    machine = f"{cpu_model()}, {os.cpu_count()} CPUs"
    record = {**fitted, "sittings": sittings, "vllm": vllm.__version__, "machine": machine,
              "model": "1 layer, hidden 128, SmolLM2's 49,152-token vocabulary", "speculative": NGRAM,
              "lookup": lookup.round(5).to_dict("records")}
    (HERE / "host_step-ngram.json").write_text(json.dumps(record, indent=1) + "\n")
    by_batch = differences.groupby(["prompt", "rows"]).agg(
        baseline=("baseline_ms", "median"), ngram=("ngram_ms", "median"), difference=("difference_ms", "median"),
        low=("difference_ms", "min"), high=("difference_ms", "max"), context=("context", "first"))
    lines = [f"# Speculation's own host time in a vLLM engine step (vLLM {vllm.__version__}, this VM's CPU, ngram K=2)",
             "", f"`python benchmarks/host-costs/host_step.py --speculative ngram` (host_step.py says how): the "
             f"baseline and ngram K=2 in {sittings} sittings, each engine in a fresh process. The host's own phases "
             "of a decode step (every row decoding: schedule, update_from_output, _prepare_inputs, _bookkeeping_sync, "
             "propose_draft_token_ids), summed, ms: each engine's median over the sittings' medians, and the "
             "difference (median, and its range over the sittings):", "",
             "| prompt | rows | baseline | ngram K=2 | difference | range over sittings | fit |",
             "|---|---|---|---|---|---|---|"]
    for (prompt, rows), g in by_batch.iterrows():
        fit_ms = fitted["intercept_ms"] + fitted["per_row_ms"] * rows + fitted["per_context_token_ms"] * rows * g.context
        lines.append(f"| {prompt} | {rows} | {g.baseline:.2f} | {g.ngram:.2f} | {g.difference:+.2f} | "
                     f"{g.low:+.2f} to {g.high:+.2f} | {fit_ms:+.2f} |")
    lookup_table = lookup.pivot(index="rows", columns="context", values="lookup_ms")
    lines += ["", "The proposer's lookup alone (`batch_propose_numba`, one thread, random ids), ms:", "",
              "| rows | " + " | ".join(f"{c:,} tokens" for c in lookup_table.columns) + " |",
              "|---|" + "---|" * len(lookup_table.columns)]
    lines += [f"| {rows} | " + " | ".join(f"{v:.3f}" for v in values) + " |"
              for rows, values in lookup_table.iterrows()]
    lines += ["", f"Fit: speculation's host ms = {fitted['intercept_ms']:.3f} + {fitted['per_row_ms']:.4f} · rows + "
              f"{fitted['per_context_token_ms'] * 1e6:.2f} ns · rows · context tokens (the lookup's; a and b over "
              f"{fitted['differences']} differences, rms residual {fitted['rms_residual_ms']:.2f} ms). "
              "`specbench.fit.host_cost.NGRAM_HOST_STEP` holds it; the simulator and `plan --target` add it to an "
              "n-gram step, which vLLM schedules synchronously (after the kernels). The rest of a CPU step is not "
              "compared: it holds tensor work a GPU does on the device (the verified positions' logits, the "
              f"rejection sampler), which at 64-128 rows thrashes this VM's memory. Machine: {machine}.", ""]
    (HERE / "host_step-ngram.md").write_text("\n".join(lines))
    print("\n".join(lines))


def _install_worker_clock(wrapper) -> None:
    """In the worker process: time each call of the worker's execute_model and sample_tokens."""
    import time as clock

    wrapper.rpc_seconds = []
    for name in ("execute_model", "sample_tokens"):
        def timed(*args, _inner=getattr(wrapper, name), **kwargs):
            started = clock.perf_counter()
            try:
                return _inner(*args, **kwargs)
            finally:
                wrapper.rpc_seconds.append(clock.perf_counter() - started)

        setattr(wrapper, name, timed)


def _collect_worker_clock(wrapper) -> list[float]:
    seconds, wrapper.rpc_seconds = wrapper.rpc_seconds, []
    return seconds


def measure_executor() -> pd.DataFrame:
    """Every step of BATCHES × PROMPTS (each batch's second run) served by vLLM's multiprocess
    executor with one worker process: from the engine core's call of the worker's execute_model to
    the return of its sample_tokens (the step's two calls), and the worker's own time inside them;
    the rest is the executor's: serialising, sending through shared memory, receiving."""
    with tempfile.TemporaryDirectory() as folder:
        llm = tiny_engine(folder, distributed_executor_backend="mp")
        llm.collective_rpc(_install_worker_clock)
        core = llm.llm_engine.engine_core.engine_core
        executor, spans = core.model_executor, []
        execute, sample = executor.execute_model, executor.sample_tokens

        def execute_model(*args, **kwargs):
            spans.append([time.perf_counter(), None])
            return execute(*args, **kwargs)

        def sample_tokens(*args, **kwargs):
            try:
                return sample(*args, **kwargs)
            finally:
                spans[-1][1] = time.perf_counter()

        executor.execute_model, executor.sample_tokens = execute_model, sample_tokens
        clock = StepClock(core, None)
        timed = []
        for prompt, batch, requests, params in batches():
            for _ in range(2):  # the first run warms up
                clock.steps.clear()
                spans.clear()
                llm.collective_rpc(_collect_worker_clock)
                llm.generate(requests, params, use_tqdm=False)
            worker = llm.collective_rpc(_collect_worker_clock)[0]
            if len(worker) != 2 * len(clock.steps) or len(spans) != len(clock.steps) or \
                    any(end is None for _, end in spans):
                raise RuntimeError(f"{prompt}-token prompts, batch {batch}: {len(clock.steps)} steps, "
                                   f"{len(spans)} executor spans, {len(worker)} worker calls")
            for index, (step, (started, ended)) in enumerate(zip(clock.steps, spans)):
                worker_ms = (worker[2 * index] + worker[2 * index + 1]) * 1e3
                timed.append({"prompt": prompt, "batch": batch, "index": index, **step,
                              "executor_span_ms": (ended - started) * 1e3, "worker_ms": worker_ms,
                              "ipc_ms": (ended - started) * 1e3 - worker_ms})
    return pd.DataFrame(timed)


def write_executor(sittings: int) -> None:
    import vllm

    steps = pd.concat([measured_apart(measure_executor).assign(sitting=s) for s in range(sittings)], ignore_index=True)
    steps.round(4).to_csv(HERE / "host_step-executor.csv", index=False)
    groups = steps.groupby(["sitting", "prompt", "batch", "tokens", "rows", "new", "drafts"], as_index=False).agg(
        ipc_ms=("ipc_ms", "median"), span_ms=("executor_span_ms", "median"), worker_ms=("worker_ms", "median"),
        steps=("ipc_ms", "size"))
    machine = f"{cpu_model()}, {os.cpu_count()} CPUs"
    # each shape's median weighted by its steps: least squares over the steps
    fitted = {**fit(groups, "ipc_ms", weights=groups["steps"].to_numpy()), "groups": int(len(groups)),
              "steps": int(groups["steps"].sum()), "sittings": sittings, "vllm": vllm.__version__,
              "machine": machine, "model": "1 layer, hidden 128, SmolLM2's 49,152-token vocabulary"}
    (HERE / "host_step-executor.json").write_text(json.dumps(fitted, indent=1) + "\n")
    decodes = groups[(groups["new"] == 0) & (groups["rows"] == groups["batch"])]
    by_batch = decodes.groupby(["prompt", "rows"]).agg(span=("span_ms", "median"), worker=("worker_ms", "median"),
                                                       ipc=("ipc_ms", "median"), low=("ipc_ms", "min"),
                                                       high=("ipc_ms", "max"))
    prefills = groups[groups["new"] > 0]
    lines = [f"# What vLLM's multiprocess executor adds to an engine step (vLLM {vllm.__version__}, this VM's CPU)", "",
             "`python benchmarks/host-costs/host_step.py --executor mp` (host_step.py says how): the model runner "
             f"in a worker process, as every TP > 1 server runs it, {sittings} sittings, each engine in a fresh "
             "process. Decode steps (every row decoding), ms: the engine core's span from its call of the worker's "
             "execute_model to the return of sample_tokens, the worker's own time in those two calls, and the rest "
             "(the executor's: serialising, sending through shared memory, receiving; median over the sittings and "
             "its range):", "",
             "| prompt | rows | executor span | worker | executor's own | range over sittings |", "|---|---|---|---|---|---|"]
    lines += [f"| {p} | {r} | {g.span:.2f} | {g.worker:.2f} | {g.ipc:.3f} | {g.low:.3f} to {g.high:.3f} |"
              for (p, r), g in by_batch.iterrows()]
    lines += ["", f"Steps that admit new requests (their prompts' token ids travel to the worker): {len(prefills)} "
              f"shapes, the executor's own time {prefills['ipc_ms'].median():.3f} ms (median; "
              f"{prefills['ipc_ms'].min():.3f}-{prefills['ipc_ms'].max():.3f}).", "",
              f"Fit over {fitted['groups']} step shapes ({fitted['steps']} steps; each shape's median, weighted by its "
              f"steps): executor ms = "
              f"{fitted['intercept_ms']:.3f} + {fitted['per_running_row_ms']:.5f} · running rows + "
              f"{fitted['per_new_request_ms']:.5f} · new requests + {fitted['per_prompt_token_ms']:.7f} · prompt tokens "
              f"(rms residual {fitted['rms_residual_ms']:.3f} ms). `specbench.fit.host_cost.MULTIPROC_EXECUTOR_STEP` "
              "holds it; the simulator and `plan --target` add it to the host's time of a step at TP > 1. It is what "
              "one worker costs; with several, each also prepares its own inputs and the step waits for the slowest, "
              f"which is not in it. Machine: {machine}.", ""]
    (HERE / "host_step-executor.md").write_text("\n".join(lines))
    print("\n".join(lines))


def main() -> None:
    import argparse

    import vllm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speculative", choices=["ngram"], help="speculation's own host time: vLLM's ngram K=2 and "
                        "the baseline in the same sitting (host_step-ngram.*)")
    parser.add_argument("--executor", choices=["mp"], help="what vLLM's multiprocess executor (every TP > 1 server's) "
                        "adds to a step: the same requests with the model runner in the engine core's process and in "
                        "a worker process, in the same sittings (host_step-executor.*)")
    parser.add_argument("--sittings", type=int, default=3, help="--speculative, --executor: alternations of the "
                        "two engines")
    args = parser.parse_args()
    if args.speculative or args.executor:
        if args.sittings < 1:
            parser.error("--sittings must be >= 1")
        if args.speculative and args.executor:
            parser.error("--speculative and --executor are two measurements: one at a time")
        write_speculation(args.sittings) if args.speculative else write_executor(args.sittings)
        return
    steps = measure(None)
    steps.round(4).to_csv(HERE / "host_step.csv", index=False)
    decodes = decode_steps(steps)
    fitted = fit(steps) | {"steps": int(len(steps)), "vllm": vllm.__version__, "machine": f"{cpu_model()}, {os.cpu_count()} CPUs",
                           "model": "1 layer, hidden 128, SmolLM2's 49,152-token vocabulary"}
    (HERE / "host_step.json").write_text(json.dumps(fitted, indent=1) + "\n")
    table = decodes.groupby(["prompt", "rows"]).agg(steps=("step_ms", "size"), drafts=("drafts", "mean"),
                                                    step=("step_ms", "median"), model=("forward_ms", "median"),
                                                    logits=("logits_ms", "median"), sampler=("sampler_ms", "median"),
                                                    host=("host_ms", "median"))
    lines = [f"# A vLLM engine step's host time outside the model's kernels (vLLM {vllm.__version__}, this VM's CPU)",
             "", "`python benchmarks/host-costs/host_step.py` (host_step.py says how). Medians of the decode "
             "steps (every row decoding), ms:", "",
             "| prompt | running rows | steps | draft tokens a step (mean) | step | model forward | logits "
             "| sampler | host (the rest) |", "|---|---|---|---|---|---|---|---|---|"]
    lines += [f"| {p} | {r} | {int(g.steps)} | {g.drafts:.1f} | {g.step:.2f} | {g.model:.2f} | {g.logits:.2f} "
              f"| {g.sampler:.2f} | {g.host:.2f} |" for (p, r), g in table.iterrows()]
    lines += ["", f"Fit over all {fitted['steps']} timed steps (prefills included): host ms = "
              f"{fitted['intercept_ms']:.3f} + {fitted['per_running_row_ms']:.4f} · running rows + "
              f"{fitted['per_new_request_ms']:.4f} · new requests + {fitted['per_prompt_token_ms']:.6f} · prompt "
              f"tokens (rms residual {fitted['rms_residual_ms']:.2f} ms). Machine: {fitted['machine']}.", ""]
    (HERE / "host_step.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
