"""What a new user meets first: bad input as one line and exit 2, a sweep that stops before its
first cell, progress in logs, tables that never cut, and the default `check`."""

import io
import json
import pathlib

import pytest
from rich.console import Console
from typer.testing import CliRunner

import specbench.native.runner as native_runner
from specbench.cli import app, cells_table, progress_line
from specbench.models import IncompatibleModels

runner = CliRunner()


def one_line_error(result, *fragments: str) -> None:
    assert result.exit_code == 2, result.output
    assert "Traceback" not in result.output and result.exception is None or isinstance(result.exception, SystemExit)
    lines = result.output.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), result.output
    for fragment in fragments:
        assert fragment in lines[0], lines[0]


@pytest.fixture
def no_model_loads(monkeypatch):
    monkeypatch.setattr(native_runner, "load_models", lambda *a: pytest.fail("loaded models"))


@pytest.mark.parametrize("content, fragment", [
    (b"", "is empty"),
    (b"\n\n", "holds no rows"),
    (b'{"messages": [}\nnot json\n', "cannot read workload file"),
    (bytes(range(256)) * 3, "cannot read workload file"),
    (b'{"prompt": 5}\n', "holds int, not text or chat messages"),
])
def test_a_bad_workload_file_is_one_line(content, fragment, tmp_path, no_model_loads):
    path = tmp_path / "prompts.jsonl"
    path.write_bytes(content)
    result = runner.invoke(app, ["sweep", "--workloads", str(path), "--output", str(tmp_path / "run")])
    one_line_error(result, fragment, "prompts")
    assert not (tmp_path / "run" / "run.json").exists()


def test_output_that_is_a_file_is_one_line(tmp_path, no_model_loads):
    target = tmp_path / "a-file"
    target.write_text("mine")
    one_line_error(runner.invoke(app, ["sweep", "--output", str(target)]), "is a file, not a directory")
    one_line_error(runner.invoke(app, ["sweep", "--output", str(target / "run")]), "Not a directory")
    assert target.read_text() == "mine"


def test_unwritable_output_is_one_line(tmp_path, monkeypatch, no_model_loads):
    locked = tmp_path / "locked"
    original = pathlib.Path.mkdir

    def mkdir(self, *args, **kwargs):  # as a non-root user meets a read-only directory
        if str(self).startswith(str(locked)):
            raise PermissionError(13, "Permission denied", str(self))
        return original(self, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "mkdir", mkdir)
    one_line_error(runner.invoke(app, ["sweep", "--output", str(locked / "run")]), "Permission denied")
    monkeypatch.chdir(tmp_path)
    (tmp_path / "results").write_text("not a directory")  # results/ itself unusable: the default root
    one_line_error(runner.invoke(app, ["sweep"]), "results")


@pytest.mark.parametrize("value", ["nan", "inf", "[bold]"])
def test_bad_values_keep_their_text_in_the_error(value, tmp_path, no_model_loads):
    result = runner.invoke(app, ["sweep", "--temperatures", value, "--output", str(tmp_path / "run")])
    one_line_error(result)
    assert value in result.output  # rich markup must not eat "[nan]"


def test_a_sweep_that_stops_before_its_first_cell(tiny_model_dirs, tmp_path, monkeypatch):
    """The run dir says what happened, bare report/check/plan skip it with one line, and the same
    --output takes a retry."""
    monkeypatch.chdir(tmp_path)
    args = ["sweep", "--target", tiny_model_dirs["target"], "--drafts", "ngram:2", "--k", "1", "--batch-sizes", "1",
            "--temperatures", "0", "--workloads", "chat", "--max-new-tokens", "6", "--num-prompts", "1",
            "--dtype", "fp64"]

    def mismatched(config):
        raise IncompatibleModels("draft and target tokenizers differ")

    monkeypatch.setattr(native_runner, "load_models", mismatched)
    one_line_error(runner.invoke(app, args), "tokenizers differ")
    (half_made,) = (tmp_path / "results").iterdir()
    meta = json.loads((half_made / "run.json").read_text())
    assert meta["status"] == "failed" and "tokenizers differ" in meta["error"]
    for command in (["report"], ["check"], ["plan"]):
        one_line_error(runner.invoke(app, command), "stopped before their first cell")
    for command in (["report", str(half_made)], ["check", str(half_made)], ["plan", str(half_made)]):
        one_line_error(runner.invoke(app, command), "has no finished cells", "tokenizers differ", "--output")

    monkeypatch.undo()
    monkeypatch.chdir(tmp_path)
    retried = runner.invoke(app, [*args, "--output", str(half_made)])
    assert retried.exit_code == 0, retried.output
    assert "stopped before its first cell: running it again there" in retried.output
    assert json.loads((half_made / "run.json").read_text())["status"] == "complete"
    report = runner.invoke(app, ["report"])  # the retried run is now the latest run
    assert report.exit_code == 0, report.output and (half_made / "report" / "report.html").exists()


def test_progress_lines_without_a_terminal():
    row = {"cell_id": "chat|B4|T0|smollm2-135m@bf16|K2", "draft": "smollm2-135m@bf16", "tokens_per_s": 58.93,
           "speedup": 0.8012, "alpha": 0.98, "lossless": "exact", "status": "ok"}
    line = progress_line(row, 9, 40, 153.2)
    assert line == "[9/40]  chat|B4|T0|smollm2-135m@bf16|K2  58.9 tok/s  0.80×  α 0.98  exact  ok  (2m33s)"
    failed = progress_line({**row, "status": "oom", "message": "CUDA out of memory"}, 10, 40, 1)
    assert failed.endswith("oom: CUDA out of memory  (0m01s)")


@pytest.mark.parametrize("width", [40, 80, 200])
def test_tables_fold_but_never_cut(width):
    row = {"workload": "chat", "batch_size": 32, "temperature": 0.7, "draft": "smollm2-135m@bf16", "k": 4,
           "tokens_per_s": 12345.6, "speedup": 1.234, "alpha": 0.97, "tau": 4.83, "tpot_p50_s": 0.01234,
           "lossless": "consistent", "status": "ok", "mode": "speculative"}
    out = io.StringIO()
    Console(file=out, width=width, color_system=None).print(cells_table([row]))
    text = out.getvalue()
    assert "…" not in text  # folded onto more lines when narrow, never cut
    if width == 200:
        for value in ("smollm2-135m@bf16", "12345.6", "1.23×", "12.3", "consistent"):
            assert value in text
