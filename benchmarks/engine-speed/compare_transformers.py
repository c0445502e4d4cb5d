"""specbench's engine side by side with transformers, and against the speed-up bound.

One run, same machine, models, prompts, K and max_new_tokens:
- autoregressive, batch 1: specbench vs transformers `generate` (greedy);
- speculative, batch 1: specbench vs assisted generation (`assistant_model`, constant schedule of
  K tokens, confidence threshold off) and specbench's n-gram drafter vs `prompt_lookup_num_tokens`;
- efficiency: measured speed-up over tau * T_ar / (K T_draft + T_verify(K+1)), all three times
  measured here as bare forward passes; plus Leviathan's (1 - a^(K+1)) / ((1 - a)(K c + 1));
- speculative at batch 4 and 16 (transformers has no batched assisted generation) against
  specbench's own baseline;
- autoregressive decode tokens/s against the memory-bandwidth roofline (bytes a decode step must
  read / measured copy bandwidth), for the target and a larger random-weight architecture.
Medians over repeats, warm-up excluded; the two sides of each comparison take turns repeat by
repeat. Writes benchmarks/engine-speed/RESULTS.md. Not part of the tests:

    python benchmarks/engine-speed/compare_transformers.py [--repeats 3] [--max-new-tokens 64] [--k 4] [--device cpu]
        [--cuda-graphs]   # specbench's decode, draft and verify steps replayed from CUDA graphs
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from datetime import date
from pathlib import Path

os.environ.setdefault("HF_HUB_OFFLINE", "1")

import torch  # noqa: E402

from specbench.native.drafters import ModelDrafter, NGramDrafter  # noqa: E402
from specbench.native.engine import GenerationConfig, generate_autoregressive, generate_speculative  # noqa: E402
from specbench.fit import expected_tau, fit_alpha, leviathan_speedup  # noqa: E402
from specbench.native.measure import copy_bandwidth, decode_step_bytes, roofline_tokens_per_s, time_forward  # noqa: E402
from specbench.models import parse_dtype  # noqa: E402
from specbench.native.loading import load_model  # noqa: E402
from specbench.results import hardware_info, versions  # noqa: E402
from specbench.native.random_models import build_random_model  # noqa: E402
from specbench.workloads import encode_prompt, load_workload  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from results_file import prepend_section  # noqa: E402


def progress(message: str) -> None:
    """A line per phase on stderr, so that a run stopped at a time limit shows how far it got."""
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def median_times(runs, repeats: int, synchronize) -> list[float]:
    """Median seconds of each of `runs`, after a warm-up of each. The runs take turns repeat by
    repeat, so that a slow minute of a shared machine hits every side of a comparison alike."""
    for run in runs:
        run()  # warm-up
    samples: list[list[float]] = [[] for _ in runs]
    for _ in range(repeats):
        for run, times in zip(runs, samples):
            synchronize()
            started = time.perf_counter()
            run()
            synchronize()
            times.append(time.perf_counter() - started)
    return [statistics.median(times) for times in samples]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--target", default="smollm2-135m")
    parser.add_argument("--draft", default="smollm2-135m@bf16")
    parser.add_argument("--k", type=int, default=4)
    parser.add_argument("--max-new-tokens", type=int, default=64)
    parser.add_argument("--prompts", type=int, default=4, help="batch-1 prompts, timed one after another")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--device", default="cpu")
    parser.add_argument("--dtype", default=None)
    parser.add_argument("--roofline-model", default=None,
                        help="a larger architecture timed with random weights against the roofline "
                             "(default llama3.2-1b on CPU, llama3-8b on CUDA; '' for none)")
    parser.add_argument("--roofline-dtype", default=None)
    parser.add_argument("--cuda-graphs", action="store_true",
                        help="specbench's steps at fixed shapes, replayed from CUDA graphs (CUDA only)")
    parser.add_argument("--output", type=Path, default=Path(__file__).with_name("RESULTS.md"))
    args = parser.parse_args()
    if args.roofline_model is None:
        args.roofline_model = "llama3-8b" if args.device.startswith("cuda") else "llama3.2-1b"

    import transformers

    transformers.utils.logging.set_verbosity_error()
    dtype = parse_dtype(args.dtype) if args.dtype else None
    target = load_model(args.target, args.device, dtype)
    draft_ref, _, draft_dtype = args.draft.partition("@")
    draft = load_model(draft_ref, args.device, parse_dtype(draft_dtype) if draft_dtype else dtype)
    hf_target, hf_draft = target.model.hf_model, draft.model.hf_model  # for transformers' generate()
    if args.cuda_graphs:
        target.model.use_static_steps(capture=True)
        draft.model.use_static_steps(capture=True)
    sync = torch.cuda.synchronize if args.device.startswith("cuda") else (lambda: None)

    records = load_workload("chat").sample(max(args.prompts, 16), seed=0)
    prompts = [encode_prompt(r, target.tokenizer) for r in records]
    single = prompts[: args.prompts]
    n, k = args.max_new_tokens, args.k
    config = GenerationConfig(max_new_tokens=n)
    tokens_total = n * len(single)
    rows: list[tuple[str, float, float, str]] = []  # label, specbench tok/s, reference tok/s, note

    def per_prompt(fn):
        return lambda: [fn(p) for p in single]

    def hf_generate(**extra):
        def run(prompt):
            ids = torch.tensor([prompt], device=target.model.device)
            return target_generate(hf_target, ids, n, **extra)
        return run

    progress("autoregressive, B=1")
    # --- autoregressive, batch 1
    ours_ar, theirs_ar = median_times([per_prompt(lambda p: generate_autoregressive(target.model, [p], config)),
                                       per_prompt(hf_generate())], args.repeats, sync)
    same = all(generate_autoregressive(target.model, [p], config).tokens[0] == hf_generate()(p) for p in single)
    rows.append(("autoregressive, B=1", tokens_total / ours_ar, tokens_total / theirs_ar,
                 f"transformers generate; same tokens: {same}"))

    progress("speculative with the draft model, B=1")
    # --- speculative with the draft model, batch 1
    drafter = ModelDrafter(draft.model, name=args.draft)
    assisted = hf_generate(assistant_model=hf_draft, num_assistant_tokens=k,
                           num_assistant_tokens_schedule="constant", assistant_confidence_threshold=0.0)
    ours_sd, theirs_sd = median_times([per_prompt(lambda p: generate_speculative(target.model, drafter, [p], config, k)),
                                       per_prompt(assisted)], args.repeats, sync)
    same = all(generate_speculative(target.model, drafter, [p], config, k).tokens[0] == assisted(p) for p in single)
    rows.append((f"speculative {args.draft}, K={k}, B=1", tokens_total / ours_sd, tokens_total / theirs_sd,
                 f"transformers assisted generation (constant schedule); same tokens: {same}"))

    progress("n-gram prompt lookup, B=1")
    # --- n-gram prompt lookup, batch 1. transformers matches up to 2-grams by default and takes the
    # earliest match; the same policy here, so that both sides verify the same drafts.
    ngram = NGramDrafter(max_ngram=2, earliest=True)
    lookup = hf_generate(prompt_lookup_num_tokens=k)
    ours_ng, theirs_ng = median_times([per_prompt(lambda p: generate_speculative(target.model, ngram, [p], config, k)),
                                       per_prompt(lookup)], args.repeats, sync)
    same = all(generate_speculative(target.model, ngram, [p], config, k).tokens[0] == lookup(p) for p in single)
    rows.append((f"n-gram (max 2-gram, earliest match), K={k}, B=1", tokens_total / ours_ng, tokens_total / theirs_ng,
                 f"transformers prompt_lookup_num_tokens; same tokens: {same}"))

    progress("efficiency against the bound, B=1")
    # --- efficiency against the bound, batch 1. The loop and the bare forwards take turns round by
    # round, so that both sides of each round's ratio ran under the same machine speed.
    context = int(statistics.mean(len(p) for p in single)) + n // 2
    rounds = []
    for _ in range(args.repeats):
        results = [generate_speculative(target.model, drafter, [p], config, k) for p in single]
        ar_results = [generate_autoregressive(target.model, [p], config) for p in single]
        t_ar = time_forward(target.model, 1, 1, context, repeats=10, warmup=2)
        t_draft = time_forward(draft.model, 1, 1, context, repeats=10, warmup=2)
        t_verify = time_forward(target.model, 1, k + 1, context, repeats=10, warmup=2)
        accepted = [a for r in results for s in r.steps for a in s.accepted]
        tau = 1 + sum(accepted) / len(accepted)
        ar_decode = sum(s.verify_s + s.overhead_s for r in ar_results for s in r.steps) / \
            sum(len(r.steps) for r in ar_results)
        sd_decode_per_token = sum(s.draft_s + s.verify_s + s.overhead_s for r in results for s in r.steps) / \
            sum(sum(s.emitted) for r in results for s in r.steps)
        bound = tau * t_ar / (k * t_draft + t_verify)
        rounds.append({"tau": tau, "t_ar": t_ar, "t_draft": t_draft, "t_verify": t_verify, "bound": bound,
                       "measured": ar_decode / sd_decode_per_token,
                       "efficiency": ar_decode / sd_decode_per_token / bound})
    drafted = [d for r in results for s in r.steps for d in s.drafted]
    accepted = [a for r in results for s in r.steps for a in s.accepted]
    alpha = fit_alpha(drafted, accepted).alpha
    median = {key: statistics.median(r[key] for r in rounds) for key in rounds[0]}
    tau, t_ar, t_draft, t_verify, bound = (median[key] for key in ("tau", "t_ar", "t_draft", "t_verify", "bound"))
    measured_decode, efficiency = median["measured"], median["efficiency"]
    efficiency_range = (min(r["efficiency"] for r in rounds), max(r["efficiency"] for r in rounds))
    levi = leviathan_speedup(alpha, k, t_draft / t_ar)

    progress("roofline")
    # --- autoregressive decode against the memory-bandwidth roofline
    bandwidth = copy_bandwidth(args.device)
    roofline = [roofline_row(target.model, args.target, single, n, bandwidth)]
    if args.roofline_model:
        large_dtype = parse_dtype(args.roofline_dtype) if args.roofline_dtype else target.model.dtype
        large = build_random_model(args.roofline_model, large_dtype, args.device).model
        if args.cuda_graphs:
            large.use_static_steps(capture=True)
        large_prompts = [[i % large.vocab_size for i in p] for p in single[:1]]
        roofline.append(roofline_row(large, f"{args.roofline_model} (random weights)", large_prompts,
                                     min(n, 32), bandwidth))
        del large

    progress("batched speculation")
    # --- batched speculation against specbench's own baseline
    batched = []
    for batch in (4, 16):
        batch_prompts = prompts[:batch]
        ar, sd = median_times([lambda: generate_autoregressive(target.model, batch_prompts, config),
                               lambda: generate_speculative(target.model, drafter, batch_prompts, config, k)],
                              args.repeats, sync)
        batched.append((batch, batch * n / ar, batch * n / sd))

    hardware, version = hardware_info(), versions()
    gpu = ", ".join(g["name"] for g in hardware["gpus"]) or "no GPU"
    lines = [
        "## " + f"{date.today()} · {args.device} · {gpu} · {hardware['cpu']} ({hardware['cpu_count']} cores)",
        "",
        f"torch {version['torch']} · transformers {version['transformers']} · specbench {version['specbench_git']} · "
        f"target {args.target} ({target.model.dtype}), draft {args.draft}, K={k}, {n} new tokens, "
        f"{len(single)} chat prompts at B=1, median of {args.repeats} after a warm-up. "
        f"specbench steps: {'CUDA graphs (fixed shapes)' if args.cuda_graphs else 'eager'}.",
        "",
        "Command: `" + " ".join(["python benchmarks/engine-speed/compare_transformers.py", *sys.argv[1:]]) + "`",
        "",
        "| case | specbench tok/s | transformers tok/s | ratio | reference |",
        "|---|---|---|---|---|",
    ]
    for label, ours, theirs, note in rows:
        lines.append(f"| {label} | {ours:.1f} | {theirs:.1f} | {ours / theirs:.2f}× | {note} |")
    lines += [
        "",
        "| efficiency at B=1 | value |",
        "|---|---|",
        f"| α (i.i.d. fit), τ measured, τ(α, K) | {alpha:.3f}, {tau:.2f}, {float(expected_tau(alpha, k)):.2f} |",
        f"| bare forwards: T_ar, T_draft, T_verify(K+1) | {t_ar * 1e3:.1f} ms, {t_draft * 1e3:.1f} ms, {t_verify * 1e3:.1f} ms |",
        f"| bound τ·T_ar/(K·T_draft + T_verify) | {bound:.3f}× |",
        f"| measured decode speed-up (specbench SD vs specbench AR, per-token decode time) | {measured_decode:.3f}× |",
        f"| efficiency = measured / bound (1 − loop overhead share); range over rounds | {efficiency:.1%}; "
        f"{efficiency_range[0]:.1%}–{efficiency_range[1]:.1%} |",
        f"| Leviathan (1 − α^(K+1)) / ((1 − α)(K·c + 1)), c = T_draft/T_ar = {t_draft / t_ar:.2f} | {levi:.3f}× |",
        "",
        "| batched speculation | AR tok/s | SD tok/s | speed-up |",
        "|---|---|---|---|",
    ]
    for batch, ar, sd in batched:
        lines.append(f"| B={batch} | {ar:.1f} | {sd:.1f} | {sd / ar:.2f}× |")
    lines += [
        "",
        f"Autoregressive decode vs the memory-bandwidth roofline (measured copy bandwidth {bandwidth / 1e9:.1f} GB/s, "
        "read + write; a decode step reads every weight once plus each row's KV cache):",
        "",
        "| model | dtype | B | bytes read per step | roofline tok/s | measured decode tok/s | of roofline |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in roofline:
        lines.append(f"| {row['model']} | {row['dtype']} | {row['batch']} | {row['bytes'] / 1e9:.3f} GB | "
                     f"{row['roofline']:.1f} | {row['measured']:.1f} | {row['measured'] / row['roofline']:.0%} |")
    lines.append("")
    text = "\n".join(lines)
    print(text)
    prepend_section(args.output, text)
    return 0


def roofline_row(model, label: str, prompts: list[list[int]], new_tokens: int, bandwidth: float) -> dict:
    """Decode-only tokens/s of specbench's autoregressive loop at B=1 (median step time, prefill
    excluded, after a warm-up) next to the roofline at the mean context of those steps."""
    config = GenerationConfig(max_new_tokens=new_tokens)
    generate_autoregressive(model, prompts[:1], GenerationConfig(max_new_tokens=4))
    steps = [s.verify_s + s.overhead_s for p in prompts for s in generate_autoregressive(model, [p], config).steps]
    context = int(statistics.mean(len(p) for p in prompts)) + new_tokens // 2
    return {"model": label, "dtype": str(model.dtype).replace("torch.", ""), "batch": 1,
            "bytes": decode_step_bytes(model, 1, context),
            "roofline": roofline_tokens_per_s(model, 1, context, bandwidth), "measured": 1 / statistics.median(steps)}


def target_generate(model, ids, new_tokens, **extra):
    """Greedy, exactly `new_tokens` tokens, EOS ignored but not suppressed (min_new_tokens would
    forbid EOS and change the argmax; specbench's fixed-length generation keeps it as a token)."""
    import copy

    config = copy.deepcopy(model.generation_config)
    # An id one past the vocabulary can never be generated: nothing stops, nothing is suppressed.
    # (None falls back to the model's EOS, which stops early.)
    config.eos_token_id = [model.config.vocab_size]
    config.max_new_tokens, config.min_new_tokens, config.do_sample = new_tokens, None, False
    config.pad_token_id = model.config.pad_token_id if model.config.pad_token_id is not None else 0
    assistant = extra.pop("assistant_model", None)
    for key, value in extra.items():
        setattr(config, key, value)
    extra = {"assistant_model": assistant} if assistant is not None else {}
    out = model.generate(ids, attention_mask=torch.ones_like(ids), generation_config=config, **extra)
    tokens = out[0, ids.shape[1]:].tolist()
    assert len(tokens) == new_tokens, f"transformers generated {len(tokens)} tokens, not {new_tokens}"
    return tokens


if __name__ == "__main__":
    sys.exit(main())
