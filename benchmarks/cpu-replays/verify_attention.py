"""What a verify's extra query positions cost in vLLM's CPU attention (issue 40, part 3): one
layer's attention of SmolLM2-135M (9 heads, 3 KV heads of 64, fp32, blocks of 128 tokens), run by
the kernel a vLLM CPU server runs (`vllm._custom_ops.cpu_attention_with_kv_cache`, its scheduler
metadata as the server builds it), for R decoding rows of L tokens of context each, with 1 query
position a row (a decode) and with 3 (a verify at K = 2). And vLLM's n-gram proposer's own time a
step, the other part of an n-gram verify that reads every row's history.

Each call starts from cold caches, as in a forward where 29 other layers' KV and weights pass
between one layer's attention and the next step's: a 256 MB buffer is read and written before every timed
call. On one core (OMP_NUM_THREADS=1), as the servers ran. The fitted served price has every
re-read free up to a decoding context of `reread_cached_tokens` and at the first read's price
beyond it; this measures it directly.

    OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/cpu-replays/verify_attention.py

Writes verify_attention.md and verify_attention.csv next to this file (~10 s).
"""

from __future__ import annotations

import math
import os
import time
from pathlib import Path

import pandas as pd
import torch

HERE = Path(__file__).resolve().parent
HEADS, KV_HEADS, HEAD_DIM, BLOCK = 9, 3, 64, 128
ROWS, CONTEXTS, QUERIES = (1, 2, 4, 8, 16), (512, 2048, 4096), (1, 3)
REPEATS = 7
FLUSH = torch.zeros(64 * 1024 * 1024, dtype=torch.float32)  # 256 MB


def one_call(rows: int, context: int, queries: int, generator: torch.Generator) -> float:
    """Seconds of one attention call from cold caches (the median of REPEATS)."""
    from vllm import _custom_ops as ops

    blocks_per_row = math.ceil(context / BLOCK)
    cache = torch.randn(rows * blocks_per_row, KV_HEADS, BLOCK * 2, HEAD_DIM, generator=generator)
    key_cache, value_cache = cache.chunk(2, dim=2)
    block_table = torch.arange(rows * blocks_per_row, dtype=torch.int32).view(rows, blocks_per_row)
    query = torch.randn(rows * queries, HEADS, HEAD_DIM, generator=generator)
    output = torch.empty_like(query)
    query_start_loc = torch.arange(0, rows * queries + 1, queries, dtype=torch.int32)
    seq_lens = torch.full((rows,), context, dtype=torch.int32)
    metadata = ops.cpu_attn_get_scheduler_metadata(
        num_reqs=rows, num_heads=HEADS, num_kv_heads=KV_HEADS, head_dim=HEAD_DIM, seq_lens=seq_lens,
        dtype=torch.float32, query_start_loc=query_start_loc, causal=True, sliding_window_size=-1, isa="vec",
        enable_kv_split=True)  # vLLM's default (VLLM_CPU_ATTN_SPLIT_KV=1)
    times = []
    for _ in range(REPEATS + 1):
        FLUSH.add_(1.0)  # evict: the other layers' KV and weights between one step's call and the next
        started = time.perf_counter()
        ops.cpu_attention_with_kv_cache(
            query=query, key_cache=key_cache, value_cache=value_cache, output=output,
            query_start_loc=query_start_loc, seq_lens=seq_lens, scale=HEAD_DIM ** -0.5, causal=True,
            alibi_slopes=None, sliding_window=-1, block_table=block_table, softcap=0.0,
            scheduler_metadata=metadata, s_aux=None)
        times.append(time.perf_counter() - started)
    return float(pd.Series(times[1:]).median())  # the first call is the kernel's own warm-up


def ngram_lookup(rows: int, context: int, generator: torch.Generator) -> float:
    """Seconds of vLLM's n-gram proposer for one step (`batch_propose_numba`, K = 2, n-grams of 1-3
    tokens) over `rows` histories of `context` random tokens (no match: the whole history scanned)."""
    import numpy as np
    from vllm.v1.spec_decode.ngram_proposer import batch_propose_numba

    longest = 8192
    tokens = torch.randint(0, 49152, (1024, longest), generator=generator, dtype=torch.int32).numpy()
    lengths = np.full(1024, context, dtype=np.int32)
    drafts, counts = np.zeros((1024, 2), dtype=np.int32), np.zeros(1024, dtype=np.int32)
    requests = list(range(rows))
    batch_propose_numba(requests, lengths, tokens, 1, 3, longest, 2, drafts, counts)  # compiles
    started = time.perf_counter()
    for _ in range(REPEATS):
        batch_propose_numba(requests, lengths, tokens, 1, 3, longest, 2, drafts, counts)
    return (time.perf_counter() - started) / REPEATS


def main() -> None:
    torch.set_num_threads(int(os.environ.get("OMP_NUM_THREADS", "1")))
    generator = torch.Generator().manual_seed(0)
    rows = []
    for context in CONTEXTS:
        for batch in ROWS:
            for queries in QUERIES:
                seconds = one_call(batch, context, queries, generator)
                rows.append({"rows": batch, "context": context, "decoding_context": batch * context,
                             "queries": queries, "ms": seconds * 1e3})
    frame = pd.DataFrame(rows)
    frame.to_csv(HERE / "verify_attention.csv", index=False, float_format="%.5g")
    wide = frame.pivot_table(index=["context", "rows", "decoding_context"], columns="queries", values="ms").reset_index()
    lines = ["# A verify's extra query positions in vLLM's CPU attention (one layer, cold caches)", "",
             "`OMP_NUM_THREADS=1 taskset -c 1 python benchmarks/cpu-replays/verify_attention.py`: "
             "SmolLM2-135M's attention shape, fp32, one core. ms per call; the extra two positions' time "
             "as a share of the decode's own (0: free re-reads; 2: each position reads the KV cache again).", "",
             "| context a row | rows | decoding context | 1 position, ms | 3 positions, ms | extra / decode's | "
             "decode, ns a context token |", "|---|---|---|---|---|---|---|"]
    for row in wide.itertuples():
        one, three = row[4], row[5]
        lines.append(f"| {row.context} | {row.rows} | {row.decoding_context} | {one:.3f} | {three:.3f} | "
                     f"{(three - one) / one:.2f} | {one * 1e6 / row.decoding_context:.1f} |")
    lines += ["", "vLLM's n-gram proposer, one step (every row's whole history scanned, as when nothing matches):", "",
              "| rows | context a row | ms |", "|---|---|---|"]
    for batch, context in ((8, 2048), (16, 2048), (16, 4096)):
        lines.append(f"| {batch} | {context} | {ngram_lookup(batch, context, generator) * 1e3:.3f} |")
    (HERE / "verify_attention.md").write_text("\n".join(lines) + "\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
