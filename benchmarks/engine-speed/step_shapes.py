"""Bare forward time by (batch rows, tokens per row): the surface the cost model's T_ar(B) and
T_verify(B, n) are read from, for one architecture with random weights (no download), eager or
from CUDA graphs, and optionally the top GPU kernels of chosen shapes (torch.profiler).

A step of more positions should never be cheaper than one of fewer at the same batch size; where
it is, a kernel choice (matmul or attention backend) is skewing every speed-up measured there.

    python benchmarks/engine-speed/step_shapes.py --model smollm2-135m --dtype fp32 --device cuda --cuda-graphs \
        [--batch-sizes 1,2,4,8,16,32] [--tokens 1,3,5] [--context 256] [--profile 8x1,8x3]
"""

from __future__ import annotations

import argparse
import sys

import torch

from specbench.native.measure import time_forward
from specbench.models import parse_dtype
from specbench.native.random_models import build_random_model


def profile_shape(model, batch: int, tokens: int, context: int, top: int = 8) -> str:
    """The kernels of one eager forward at that shape, by GPU time (operators by CPU time off CUDA)."""
    from torch.profiler import ProfilerActivity, profile

    cuda = model.device.type == "cuda"
    sync = torch.cuda.synchronize if cuda else (lambda: None)

    ids = torch.zeros((batch, tokens), dtype=torch.long, device=model.device)
    cache = model.new_cache(batch, context + tokens)
    cache.set_lengths([context] * batch)
    logits_at = "all" if tokens > 1 else "last"
    with torch.inference_mode():
        model.forward(cache, ids, logits_at=logits_at)  # warm-up
        cache.set_lengths([context] * batch)
        sync()
        with profile(activities=[ProfilerActivity.CUDA if cuda else ProfilerActivity.CPU]) as prof:
            model.forward(cache, ids, logits_at=logits_at)
            sync()
    return prof.key_averages().table(sort_by="cuda_time_total" if cuda else "self_cpu_time_total", row_limit=top,
                                     max_name_column_width=90)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--dtype", default="fp32")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--cuda-graphs", action="store_true")
    parser.add_argument("--batch-sizes", default="1,2,4,8,16,32")
    parser.add_argument("--tokens", default="1,3,5")
    parser.add_argument("--context", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=20)
    parser.add_argument("--profile", default="", help="shapes BxT to list kernels of, e.g. 8x1,8x3")
    args = parser.parse_args()
    batches = [int(b) for b in args.batch_sizes.split(",")]
    widths = [int(t) for t in args.tokens.split(",")]
    model = build_random_model(args.model, parse_dtype(args.dtype), args.device).model
    mode = "eager"
    if args.cuda_graphs:
        model.use_static_steps(capture=True)
        mode = "CUDA graphs"
    print(f"{args.model} ({model.dtype}, random weights) on {args.device}, {mode}, context {args.context}; "
          f"median of {args.repeats} bare forwards, ms")
    print("| B | " + " | ".join(f"T={t}" for t in widths) + " | per position at T=1 |")
    print("|---|" + "---|" * (len(widths) + 1))
    for batch in batches:
        times = [time_forward(model, batch, t, args.context, repeats=args.repeats, warmup=3) for t in widths]
        cells = " | ".join(f"{s * 1e3:.2f}" for s in times)
        print(f"| {batch} | {cells} | {times[0] * 1e3 / batch:.3f} |", flush=True)
    for shape in filter(None, args.profile.split(",")):
        batch, tokens = (int(x) for x in shape.lower().split("x"))
        eager = build_random_model(args.model, parse_dtype(args.dtype), args.device).model if args.cuda_graphs else model
        print(f"\nkernels of one eager forward, B={batch}, T={tokens}:")
        print(profile_shape(eager, batch, tokens, args.context))
    return 0


if __name__ == "__main__":
    sys.exit(main())
