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

    python benchmarks/fleet-2026-11-27/host_step.py   # ~3 minutes on this 2-core VM

Writes host_step.csv (every timed step), host_step.json (the fit) and host_step.md next to this file.
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
        self._wrap(runner.model, "forward", "forward")
        self._wrap(runner.model, "compute_logits", "logits")
        self._wrap(runner.sampler, "forward", "sampler")
        schedule = core.scheduler.schedule

        def scheduled(*args, **kwargs):
            out = schedule(*args, **kwargs)
            self.shape = (out.total_num_scheduled_tokens, len(out.num_scheduled_tokens), len(out.scheduled_new_reqs))
            return out

        core.scheduler.schedule = scheduled
        step = core.step

        def timed_step(*args, **kwargs):
            self.parts, self.shape = {}, None
            started = time.perf_counter()
            result = step(*args, **kwargs)
            total = time.perf_counter() - started
            if self.shape is not None:
                tokens, rows, new = self.shape
                device = sum(self.parts.values())
                self.steps.append({"tokens": tokens, "rows": rows, "new": new, "step_ms": total * 1e3,
                                   **{f"{k}_ms": v * 1e3 for k, v in self.parts.items()},
                                   "host_ms": (total - device) * 1e3})
            return result

        core.step = core.step_fn = timed_step

    def _wrap(self, owner, name: str, key: str) -> None:
        inner = getattr(owner, name)

        def timed(*args, **kwargs):
            started = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                self.parts[key] = self.parts.get(key, 0.0) + time.perf_counter() - started

        setattr(owner, name, timed)


def cpu_model() -> str:
    for line in Path("/proc/cpuinfo").read_text().splitlines() if Path("/proc/cpuinfo").exists() else []:
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.machine()


def fit(steps: pd.DataFrame) -> dict[str, float]:
    prompt_tokens = steps["tokens"] - (steps["rows"] - steps["new"])  # a decoding row schedules one token
    design = np.c_[np.ones(len(steps)), steps["rows"], steps["new"], prompt_tokens.clip(lower=0)]
    coefficients, *_ = np.linalg.lstsq(design, steps["host_ms"].to_numpy(), rcond=None)
    residual = steps["host_ms"].to_numpy() - design @ coefficients
    return {**{f"{term}_ms": float(c) for term, c in zip(TERMS, coefficients)},
            "rms_residual_ms": float(np.sqrt(np.mean(residual ** 2))), "steps": int(len(steps))}


def main() -> None:
    import vllm
    from vllm import LLM, SamplingParams

    with tempfile.TemporaryDirectory() as folder:
        model = tiny_model(Path(folder))
        llm = LLM(model=str(model), enforce_eager=True, dtype="float32", max_num_seqs=256,
                  max_num_batched_tokens=8192, max_model_len=4096, seed=0, enable_prefix_caching=False)
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
    steps = pd.DataFrame(timed)
    steps.round(4).to_csv(HERE / "host_step.csv", index=False)
    fitted = {**fit(steps), "vllm": vllm.__version__, "machine": f"{cpu_model()}, {os.cpu_count()} CPUs", "model": "1 layer, hidden 128, SmolLM2's 49,152-token vocabulary"}
    (HERE / "host_step.json").write_text(json.dumps(fitted, indent=1) + "\n")
    decodes = steps[(steps["new"] == 0) & (steps["tokens"] == steps["rows"]) & (steps["rows"] == steps["batch"])]
    table = decodes.groupby(["prompt", "rows"]).agg(steps=("step_ms", "size"), step=("step_ms", "median"),
                                                    model=("forward_ms", "median"), logits=("logits_ms", "median"),
                                                    sampler=("sampler_ms", "median"), host=("host_ms", "median"))
    lines = [f"# A vLLM engine step's host time outside the model's kernels (vLLM {vllm.__version__}, this VM's CPU)", "",
             "`python benchmarks/fleet-2026-11-27/host_step.py` (host_step.py says how). Medians of the decode steps "
             "(every row decoding), ms:", "",
             "| prompt | running rows | steps | step | model forward | logits | sampler | host (the rest) |",
             "|---|---|---|---|---|---|---|---|"]
    lines += [f"| {p} | {r} | {int(g.steps)} | {g.step:.2f} | {g.model:.2f} | {g.logits:.2f} | {g.sampler:.2f} "
              f"| {g.host:.2f} |" for (p, r), g in table.iterrows()]
    lines += ["", f"Fit over all {fitted['steps']} timed steps (prefills included): host ms = "
              f"{fitted['intercept_ms']:.3f} + {fitted['per_running_row_ms']:.4f} · running rows + "
              f"{fitted['per_new_request_ms']:.4f} · new requests + {fitted['per_prompt_token_ms']:.6f} · prompt "
              f"tokens (rms residual {fitted['rms_residual_ms']:.2f} ms). Machine: {fitted['machine']}.", ""]
    (HERE / "host_step.md").write_text("\n".join(lines))
    print("\n".join(lines))


if __name__ == "__main__":
    main()
