"""The reference pages cannot drift from the code: docs/reference/*.md are exactly what
docs/generate_reference.py writes today from the CLI (every command's options), specbench/schema.py
(every column of the run tables) and the exit codes (specbench/gate.py, specbench/cli/common.py)."""

from __future__ import annotations

import difflib
import importlib.util
from pathlib import Path

import pytest
import typer

from specbench.cli import app
from tests.test_docs import _arguments, _commands_in_code_blocks, _commands_inline

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("generate_reference", ROOT / "docs" / "generate_reference.py")
generator = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(generator)
PAGES = ("docs/reference/cli.md", "docs/reference/tables.md", "docs/reference/exit-codes.md")
HAND_WRITTEN = {"docs/reference/equations.md"}  # equations, stated once by hand; tests/test_docs.py reads it


@pytest.fixture(scope="module")
def generated() -> dict[str, str]:
    return generator.pages()


def test_every_reference_page_is_generated(generated):
    """No page the generator does not write (but the hand-written equations), and none it writes left
    out of the check below."""
    committed = {path.relative_to(ROOT).as_posix() for path in (ROOT / "docs" / "reference").glob("*.md")}
    committed -= HAND_WRITTEN
    assert committed == set(generated) == set(PAGES)


@pytest.mark.parametrize("page", PAGES)
def test_the_reference_page_is_current(page, generated):
    path = ROOT / page
    committed = path.read_text() if path.is_file() else ""
    if committed != generated[page]:
        diff = difflib.unified_diff(committed.splitlines(), generated[page].splitlines(), "committed", "generated",
                                    lineterm="", n=0)
        shown = "\n".join(list(diff)[:12])
        pytest.fail(f"{page} differs from what the code generates: run `{generator.COMMAND}`\n{shown}")


def test_a_changed_column_or_exit_code_changes_its_page(generated, monkeypatch):
    """The check can fail: a column dropped from the contract, an exit code reworded."""
    from specbench.cli.common import COMMAND_EXIT_CODES
    from specbench.schema import TABLE_COLUMNS

    monkeypatch.setitem(TABLE_COLUMNS, "steps", TABLE_COLUMNS["steps"][:-1])
    monkeypatch.setitem(COMMAND_EXIT_CODES, 1, "reworded")
    assert generator.tables_page() != generated["docs/reference/tables.md"]
    assert generator.exit_codes_page() != generated["docs/reference/exit-codes.md"]


def test_the_cli_page_has_every_command_and_option(generated):
    page = generated["docs/reference/cli.md"]
    for name, command in typer.main.get_command(app).commands.items():
        assert f"\n## {name}\n" in page
        for param in command.params:
            assert all(f"`{flag}`" in page for flag in param.opts if flag.startswith("-")), (name, param.name)


@pytest.mark.parametrize("page", PAGES)
def test_the_commands_on_a_reference_page_parse(page, generated):
    """The reference pages sit outside tests/test_docs.py's docs/*.md; the `specbench ...` lines they
    hold parse as that test would parse them."""
    group = typer.main.get_command(app)
    text = generated[page]
    for command in _commands_in_code_blocks(text) + _commands_inline(text):
        name, *rest = _arguments(command)
        group.commands[name].make_context(name, rest)
