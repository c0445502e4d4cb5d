"""A Mooncake-format trace whose prompts share a system prompt, for the prefix-caching check
(`measure.sh`, `predict.py`): 16 requests 8 s apart, each the same 1,000-odd-token excerpt of the
shipped prose document (the shared part: 1,024 tokens or a few more of the chat template and it,
exactly 64 of vLLM's 16-token blocks) then a question of the chat workload of its own; 24 tokens
out. Each line carries its text (sent as it is) and Mooncake's `hash_ids` (one per 512 tokens of
the templated prompt, equal ids for equal blocks after equal prefixes).

    python benchmarks/fleets/prefix-caching/make_trace.py     # writes tests/fixtures/traces/prefix-shared.jsonl
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from transformers import AutoTokenizer  # noqa: E402

from specbench.models import converted_smollm2_dir  # noqa: E402
from specbench.workloads import PromptRecord, encode_prompt, load_workload, long_document  # noqa: E402

REQUESTS, APART_S, OUTPUT_TOKENS, HASH_BLOCK = 16, 8.0, 24, 512
SHARED_TOKENS = 1024  # the shared part reaches at least this far, and at most a block further


def mooncake_hash_ids(tokens: list[int]) -> list[int]:
    """Mooncake's `hash_ids` for a prompt's token ids: one per HASH_BLOCK tokens (the last block
    partial), chained, so equal ids mean equal blocks after equal prefixes."""
    hashes, parent = [], 0
    for start in range(0, len(tokens), HASH_BLOCK):
        parent = hash((parent, tuple(tokens[start:start + HASH_BLOCK]))) & 0x7FFFFFFF
        hashes.append(parent)
    return hashes


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(converted_smollm2_dir())
    questions = [r.messages[-1]["content"] for r in load_workload("chat").records
                 if 20 < len(r.messages[-1]["content"]) < 400][:REQUESTS]
    words = long_document("chat").split(" ")

    def prompts(shared_words: int) -> list[list[int]]:
        system = " ".join(words[1000:1000 + shared_words])
        return [encode_prompt(PromptRecord(f"q{i}", "trace", [{"role": "user", "content": f"{system}\n\n{q}"}]),
                              tokenizer) for i, q in enumerate(questions)]

    def common(ids: list[list[int]]) -> int:
        n = 0
        while all(len(x) > n for x in ids) and len({x[n] for x in ids}) == 1:
            n += 1
        return n

    count = 600
    while common(prompts(count)) < SHARED_TOKENS:
        count += 5
    while common(prompts(count - 1)) >= SHARED_TOKENS:
        count -= 1
    ids = prompts(count)
    system = " ".join(words[1000:1000 + count])
    lines = []
    for i, (question, tokens) in enumerate(zip(questions, ids)):
        lines.append({"timestamp": int(i * APART_S * 1000), "input_length": len(tokens),
                      "output_length": OUTPUT_TOKENS, "hash_ids": mooncake_hash_ids(tokens),
                      "text": f"{system}\n\n{question}"})
    (HERE.parents[2] / "tests" / "fixtures" / "traces" / "prefix-shared.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    print(f"{len(lines)} requests, {min(len(t) for t in ids)}-{max(len(t) for t in ids)} tokens in, "
          f"shared {common(ids)}")


if __name__ == "__main__":
    main()
