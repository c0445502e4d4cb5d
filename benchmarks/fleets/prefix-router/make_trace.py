"""A Mooncake-format trace of documents each asked about several times, for the prefix-aware
router's check (`measure.py`, `predict.py`): 30 documents (each its own ~1,000-token excerpt of the
shipped prose document) asked 3 questions each, in 3 rounds (every document once a round, in a
seeded order), 1 s apart, 24 tokens out; before them 4 short prompts (a question after a
60-word excerpt of their own, ~100 tokens: over the 64 a replayed request needs, under one of the
CPU server's 128-token blocks beyond the chat template). The sweep's warm-up sends the first 4
prompts: these share nothing, so what the warm-up leaves cached is nothing the rest could find. A router that sends a document's later questions where its first went finds its
~1,000 tokens cached; one that spreads them by load finds them on the other server about half the
time. Each line carries its text (sent as it is) and Mooncake's `hash_ids` (one per 512 tokens of
the templated prompt, equal ids for equal blocks after equal prefixes).

    python benchmarks/fleets/prefix-router/make_trace.py     # writes documents.jsonl beside it
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[2]))

from transformers import AutoTokenizer  # noqa: E402

from specbench.models import converted_smollm2_dir  # noqa: E402
from specbench.workloads import PromptRecord, encode_prompt, load_workload, long_document  # noqa: E402

sys.path.insert(0, str(HERE.parent / "prefix-caching"))
from make_trace import mooncake_hash_ids  # noqa: E402  (the prefix-caching check's trace maker)

DOCUMENTS, ROUNDS, FILLERS = 30, 3, 4
APART_S, OUTPUT_TOKENS = 1.0, 24
DOCUMENT_WORDS = 700  # ~1,000 tokens of the prose document
FILLER_FROM, FILLER_WORDS = 30_000, 60  # the short prompts' excerpts: past every document's words
SEED = 0


def main() -> None:
    tokenizer = AutoTokenizer.from_pretrained(converted_smollm2_dir())
    questions = [r.messages[-1]["content"] for r in load_workload("chat").records
                 if 20 < len(r.messages[-1]["content"]) < 300]
    words = long_document("chat").split(" ")
    documents = [" ".join(words[d * DOCUMENT_WORDS:(d + 1) * DOCUMENT_WORDS]) for d in range(DOCUMENTS)]
    texts = [" ".join(words[FILLER_FROM + f * FILLER_WORDS:FILLER_FROM + (f + 1) * FILLER_WORDS]) + "\n\n"
             + questions[-1 - f] for f in range(FILLERS)]
    order = random.Random(SEED)
    for r in range(ROUNDS):
        asked = list(range(DOCUMENTS))
        order.shuffle(asked)
        texts += [f"{documents[d]}\n\n{questions[(d * ROUNDS + r) % (len(questions) - FILLERS)]}" for d in asked]
    lines = []
    for i, text in enumerate(texts):
        tokens = encode_prompt(PromptRecord(f"q{i}", "trace", [{"role": "user", "content": text}]), tokenizer)
        lines.append({"timestamp": int(i * APART_S * 1000), "input_length": len(tokens),
                      "output_length": OUTPUT_TOKENS, "hash_ids": mooncake_hash_ids(tokens), "text": text})
    (HERE / "documents.jsonl").write_text("\n".join(json.dumps(line) for line in lines) + "\n")
    lengths = [line["input_length"] for line in lines[FILLERS:]]
    print(f"{len(lines)} requests ({FILLERS} short first: {[line['input_length'] for line in lines[:FILLERS]]} "
          f"tokens), documents' prompts {min(lengths)}-{max(lengths)} tokens")


if __name__ == "__main__":
    main()
