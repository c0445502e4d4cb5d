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
+ d · prompt tokens. `specbench.fit.host_cost.VLLM_HOST_STEP` holds it (tests hold the two equal);
the simulator adds it to a synchronously scheduled step's kernel time and overlaps it with an
async-scheduled one's.

    python benchmarks/fleet-2026-11-27/host_step.py [--speculative ngram]   # ~1 minute on this 2-core VM

Writes host_step.csv (every timed step), host_step.json (the fit) and host_step.md next to this file;
with --speculative ngram, vLLM's ngram K=2 (prompt lookup 1-3) measured the same way, into
host_step-ngram.* (each batch's host time beyond the baseline's fit: speculation's own, not priced).
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
        self.parts: dict[str, float] = {}
        self.steps: list[dict] = []
        self._depth = 0
        self._wrap(runner.model, "forward", "forward")
        self._wrap(runner.model, "compute_logits", "logits")
        self._wrap(runner.sampler, "forward", "sampler")
        if getattr(runner, "rejection_sampler", None) is not None:  # speculating: on a GPU, device work
            self._wrap(runner.rejection_sampler, "forward", "sampler")
        schedule = core.scheduler.schedule

        def scheduled(*args, **kwargs):
            out = schedule(*args, **kwargs)
            drafts = sum(len(ids) for ids in (out.scheduled_spec_decode_tokens or {}).values())
            self.shape = (out.total_num_scheduled_tokens, len(out.num_scheduled_tokens), len(out.scheduled_new_reqs),
                          drafts)
            return out

        core.scheduler.schedule = scheduled
        step = core.step

        def timed_step(*args, **kwargs):
            self.parts, self.shape = {}, None
            started = time.perf_counter()
            result = step(*args, **kwargs)
            total = time.perf_counter() - started
            if self.shape is not None:
                tokens, rows, new, drafts = self.shape
                device = sum(self.parts.values())
                self.steps.append({"tokens": tokens, "rows": rows, "new": new, "drafts": drafts, "step_ms": total * 1e3,
                                   **{f"{k}_ms": v * 1e3 for k, v in self.parts.items()},
                                   "host_ms": (total - device) * 1e3})
            return result

        core.step = core.step_fn = timed_step

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


def fit(steps: pd.DataFrame) -> dict[str, float]:
    """host ms = the TERMS, least squares over every step."""
    design = _design(steps)
    coefficients, *_ = np.linalg.lstsq(design, steps["host_ms"].to_numpy(), rcond=None)
    residual = steps["host_ms"].to_numpy() - design @ coefficients
    return {**{f"{term}_ms": float(c) for term, c in zip(TERMS, coefficients)},
            "rms_residual_ms": float(np.sqrt(np.mean(residual ** 2))), "steps": int(len(steps))}


def excess_over(steps: pd.DataFrame, baseline: dict) -> pd.Series:
    """Each step's host time beyond what the baseline's fit (host_step.json) gives its rows."""
    return steps["host_ms"] - _design(steps) @ np.array([baseline[f"{term}_ms"] for term in TERMS])


NGRAM = {"method": "ngram", "num_speculative_tokens": 2, "prompt_lookup_min": 1, "prompt_lookup_max": 3}


def measure(speculative: dict | None) -> pd.DataFrame:
    """Every timed step of BATCHES × PROMPTS, each batch's second run."""
    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as folder:
        model = tiny_model(Path(folder))
        llm = LLM(model=str(model), enforce_eager=True, dtype="float32", max_num_seqs=256,
                  max_num_batched_tokens=8192, max_model_len=4096, seed=0, enable_prefix_caching=False,
                  speculative_config=speculative)
        core = llm.llm_engine.engine_core.engine_core
        clock = StepClock(core, core.model_executor.driver_worker.worker.model_runner)
        params = SamplingParams(max_tokens=MAX_TOKENS, ignore_eos=True, temperature=0.0)
        timed = []
        for prompt in PROMPTS:
            for batch in BATCHES:
                rng = np.random.default_rng(batch * 7 + prompt)
                prompts = [{"prompt_token_ids": rng.integers(100, 40000, prompt).tolist()} for _ in range(batch)]
                for _ in range(2):  # the first run warms up
                    clock.steps.clear()
                    llm.generate(prompts, params, use_tqdm=False)
                timed += [{"prompt": prompt, "batch": batch, **step} for step in clock.steps]
    return pd.DataFrame(timed)


def main() -> None:
    import argparse

    import vllm

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--speculative", choices=["ngram"], help="vLLM's ngram K=2 (host_step-ngram.*): its host "
                        "time beside the baseline's (not what the simulator prices)")
    args = parser.parse_args()
    speculative = NGRAM if args.speculative == "ngram" else None
    name = "host_step" + (f"-{args.speculative}" if speculative else "")
    steps = measure(speculative)
    steps.round(4).to_csv(HERE / f"{name}.csv", index=False)
    decodes = steps[(steps["new"] == 0) & (steps["tokens"] == steps["rows"] + steps["drafts"])
                    & (steps["rows"] == steps["batch"])]
    if speculative is None:
        fitted = fit(steps)
    else:  # speculation's own host work: beyond the baseline's fit, per batch (not priced: see the md)
        decodes = decodes.assign(excess=excess_over(decodes, json.loads((HERE / "host_step.json").read_text())))
        fitted = {"excess_ms_by_prompt_and_rows": {f"{p}/{r}": round(float(v), 3) for (p, r), v in
                                                   decodes.groupby(["prompt", "rows"])["excess"].median().items()}}
    fitted |= {"vllm": vllm.__version__, "machine": f"{cpu_model()}, {os.cpu_count()} CPUs",
               "model": "1 layer, hidden 128, SmolLM2's 49,152-token vocabulary", "speculative": speculative}
    (HERE / f"{name}.json").write_text(json.dumps(fitted, indent=1) + "\n")
    columns = ["excess"] if speculative else []
    table = decodes.groupby(["prompt", "rows"]).agg(steps=("step_ms", "size"), drafts=("drafts", "mean"),
                                                    step=("step_ms", "median"), model=("forward_ms", "median"),
                                                    logits=("logits_ms", "median"), sampler=("sampler_ms", "median"),
                                                    host=("host_ms", "median"),
                                                    **{c: (c, "median") for c in columns})
    what = f"vLLM {vllm.__version__}, this VM's CPU" + (", ngram K=2" if speculative else "")
    lines = [f"# A vLLM engine step's host time outside the model's kernels ({what})", "",
             f"`python benchmarks/fleet-2026-11-27/host_step.py{' --speculative ' + args.speculative if speculative else ''}`"
             " (host_step.py says how). Medians of the decode steps (every row decoding), ms:", "",
             "| prompt | running rows | steps | draft tokens a step (mean) | step | model forward | logits "
             "| sampler | host (the rest) |" + (" beyond the baseline's fit |" if speculative else ""),
             "|---|---|---|---|---|---|---|---|---|" + ("---|" if speculative else "")]
    lines += [f"| {p} | {r} | {int(g.steps)} | {g.drafts:.1f} | {g.step:.2f} | {g.model:.2f} | {g.logits:.2f} "
              f"| {g.sampler:.2f} | {g.host:.2f} |" + (f" {g.excess:+.2f} |" if speculative else "")
              for (p, r), g in table.iterrows()]
    if speculative is None:
        lines += ["", f"Fit over all {fitted['steps']} timed steps (prefills included): host ms = "
                  f"{fitted['intercept_ms']:.3f} + {fitted['per_running_row_ms']:.4f} · running rows + "
                  f"{fitted['per_new_request_ms']:.4f} · new requests + {fitted['per_prompt_token_ms']:.6f} · prompt "
                  f"tokens (rms residual {fitted['rms_residual_ms']:.2f} ms). Machine: {fitted['machine']}.", ""]
    else:
        lines += ["", "The last column is the host time beyond what host_step.json's fit gives the same rows: "
                  "speculation's own (the n-gram proposer, the rejection sampler's bookkeeping). Not priced by "
                  "the simulator: it moved by a factor of two between runs of this script (at 128 rows the CPU's "
                  f"logits and sampler over every verified position also thrash its memory). Machine: "
                  f"{fitted['machine']}.", ""]
    (HERE / f"{name}.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
