"""The documentation cannot drift from the code: every `specbench …` command line in the README and
docs/ parses with the real CLI (its options exist, their values have the right types, the
arguments are the ones the command takes), and the README stays a page read in minutes."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest
import typer

from specbench.cli import app

ROOT = Path(__file__).resolve().parents[1]
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PLACEHOLDERS = {"...", "…", "--help"}  # "specbench sweep ... --executor ray": the rest of a command left out


def _commands_in_code_blocks(text: str) -> list[str]:
    """Command lines in fenced blocks: a line starting `specbench ` (or `$ specbench `), continued over
    indented lines of options and lines after a trailing backslash."""
    commands, current, in_block = [], None, False
    for line in text.splitlines():
        if line.startswith("```"):
            if current:
                commands.append(current)
            current, in_block = None, not in_block
            continue
        if not in_block:
            continue
        stripped = line.strip()
        if stripped.startswith("$ "):
            stripped = stripped[2:]
        continued = current is not None and (current.endswith("\\") or (line[:1].isspace() and stripped[:1] in "-["))
        if continued:
            current = current.rstrip("\\") + " " + stripped
        else:
            if current:
                commands.append(current)
            current = stripped if stripped.startswith("specbench ") else None
    return commands


def _commands_inline(text: str) -> list[str]:
    """`specbench …` in prose, where a line break may fall inside the backticks."""
    return [" ".join(span.split()) for span in re.findall(r"`(specbench [^`]+)`", text)]


def documented_commands() -> list[tuple[str, str]]:
    found = []
    for path in DOCUMENTS:
        text = path.read_text()
        for command in _commands_in_code_blocks(text) + _commands_inline(text):
            found.append((path.relative_to(ROOT).as_posix(), command))
    return found


def _arguments(command: str) -> list[str]:
    """The command's arguments as a shell would pass them; a synopsis' [optional] brackets dropped."""
    lexer = shlex.shlex(command.replace("\\", " "), posix=True, punctuation_chars=True)
    lexer.whitespace_split, lexer.commenters = True, "#"
    words = []
    for word in lexer:
        if word and set(word) <= set("|;&><()"):  # a pipe, redirection or next command: specbench's ends here
            break
        words.append(word)
    assert words[0] == "specbench", command
    arguments = []
    for word in words[1:]:
        if word.startswith("[") and not word.startswith("[["):
            word = word[1:]
        if word.endswith("]") and not word.endswith("]]") and "[" not in word:
            word = word[:-1]
        if word and word not in PLACEHOLDERS:
            arguments.append(word)
    return arguments


COMMANDS = documented_commands()


def test_the_docs_hold_commands_of_every_kind():
    named = {_arguments(command)[0] for _, command in COMMANDS if _arguments(command)}
    assert {"sweep", "report", "check", "plan", "models", "workloads"} <= named
    assert len(COMMANDS) >= 40


@pytest.mark.parametrize("where,command", COMMANDS, ids=[f"{where}:{i}" for i, (where, _) in enumerate(COMMANDS)])
def test_every_documented_command_parses(where, command):
    group = typer.main.get_command(app)
    arguments = _arguments(command)
    name, rest = arguments[0], arguments[1:]
    assert name in group.commands, f"{where}: `{command}`: no command {name!r}"
    try:
        group.commands[name].make_context(name, rest)
    except Exception as error:  # click's UsageError / BadParameter, whichever click typer brings
        pytest.fail(f"{where}: `{command}` does not parse: {type(error).__name__}: {error}")


def test_the_readme_is_short_and_keeps_its_two_commands():
    readme = (ROOT / "README.md").read_text()
    assert len(readme.encode()) <= 6 * 1024
    for marker in ("<!-- run-command -->", "<!-- test-command -->"):
        line = readme.split(marker, 1)[1].strip().splitlines()[0]
        assert line.startswith("`python3 -m venv .venv && . .venv/bin/activate && pip install torch==2.13.0")
    for page in re.findall(r"\]\((docs/[^)#]+)", readme):
        assert (ROOT / page).is_file(), page
    assert (ROOT / "CONTRIBUTING.md").is_file()
    assert "](CONTRIBUTING.md)" in readme


def test_a_broken_command_is_caught():
    """The parser test can fail: an option the CLI does not have, or a value of the wrong type."""
    group = typer.main.get_command(app)
    for bad in ("specbench check --no-such-option", "specbench sweep --max-new-tokens many",
                "specbench report RUN_A RUN_B"):
        arguments = _arguments(bad)
        with pytest.raises(Exception):
            group.commands[arguments[0]].make_context(arguments[0], arguments[1:])


def _names_in(text: str) -> set[str]:
    return set(re.findall(r"`([a-z][a-z0-9_]*\*?)`", text))


def _documented_columns() -> dict[str, set[str]]:
    """The column names docs/results.md gives per table: the first cell of each row of the cells
    table, and the names in the requests and steps paragraphs."""
    text = (ROOT / "docs" / "results.md").read_text()
    cells = text[text.index("**cells**"):text.index("**baseline_copies**")]
    first_cells = [line.split("|")[1] for line in cells.splitlines() if line.startswith("| `")]
    return {"cells": set().union(*map(_names_in, first_cells)),
            "requests": _names_in(text[text.index("**requests**"):text.index("**steps**")]),
            "steps": _names_in(text[text.index("**steps**"):text.index("Definitions:")])}


@pytest.mark.parametrize("table", ["cells", "requests", "steps"])
def test_the_results_page_documents_the_contract_and_nothing_else(table):
    """docs/results.md against specbench/schema.py, both ways: every column of the contract is on
    the page (by name, or by a prefix: `ttft_*`), and every name the page gives is a column."""
    from specbench.schema import TABLE_COLUMNS

    contract = {column.name for column in TABLE_COLUMNS[table]}
    documented = _documented_columns()[table]
    prefixes = [name[:-1] for name in documented if name.endswith("*")]
    assert not [name for name in contract if name not in documented and not name.startswith(tuple(prefixes))]
    assert not [name for name in documented if not name.endswith("*") and name not in contract]
    assert all(any(name.startswith(prefix) for name in contract) for prefix in prefixes)
