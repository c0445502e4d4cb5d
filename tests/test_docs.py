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
DOCUMENTS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "docs" / "guides").glob("*.md")),
             ROOT / "docs" / "reference" / "equations.md"]
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


def _percent(x: float, signed: bool = False) -> str:
    """A validation.json fraction as docs/validation.md writes it: 0.041 -> "4.1 %", signed "−2.9 %"."""
    text = f"{abs(x) * 100:.1f} %"
    return ("+" if x >= 0 else "−") + text if signed else text


def _section(text: str, number: int) -> str:
    start = text.index(f"\n## {number}. ")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def test_the_validation_page_shows_the_figures_the_code_reads():
    """docs/validation.md's first three tables are specbench/data/validation.json, the file a plan
    prints its checks from: every figure there is on the page, in its section."""
    from specbench.measured import validation

    page = (ROOT / "docs" / "validation.md").read_text()
    silicon = _section(page, 1)
    for system, figures in validation("silicon")["by_system"].items():
        row = (f"| {system} | {figures['rows']} | {_percent(figures['tpot_median_abs'])} | "
               f"{_percent(figures['ttft_median_abs'])} | {_percent(figures['tpot_median'], True)} | "
               f"{_percent(figures['ttft_median'], True)} |")
        assert row in silicon, row
    replay = validation("replay")
    row = (f"| {replay['cells']} | {_percent(replay['ttft_median_abs'])} | {_percent(replay['tpot_median_abs'])} | "
           f"{_percent(replay['e2e_median_abs'])} | {replay['signs_right']} of {replay['signs']} |")
    assert row in _section(page, 2), row
    direction, lower = _section(page, 3), None
    for band in validation("direction_by_effect")["bands"]:
        below = band["below"]
        label = (f"under {below * 100:g} %" if lower is None else f"{lower * 100:g} % or more" if below is None
                 else f"{lower * 100:g}–{below * 100:g} %")
        row = f"| {label} | {band['right']} of {band['predictions']} |"
        assert row in direction, row
        lower = below


def test_every_link_between_pages_resolves():
    """A relative link in README.md, CONTRIBUTING.md or docs/ names a file that exists, and an anchor
    names a heading of that page."""
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    broken = []
    for page in pages:
        for target in re.findall(r"\]\(([^)\s]+)\)", page.read_text()):
            if re.match(r"[a-z]+:", target):
                continue
            path, _, anchor = target.partition("#")
            linked = (page.parent / path).resolve() if path else page
            if not linked.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target}")
            elif anchor and linked.suffix == ".md":
                headings = {re.sub(r"[^\w\- ]", "", line.lstrip("#").strip().lower()).replace(" ", "-")
                            for line in linked.read_text().splitlines() if line.startswith("#")}
                if anchor not in headings:
                    broken.append(f"{page.relative_to(ROOT)}: {target}")
    assert not broken, broken


def test_the_docs_are_read_in_minutes():
    """docs/ stays under 100 KB of files in all: guides, references, validation."""
    size = sum(path.stat().st_size for path in (ROOT / "docs").rglob("*") if path.is_file())
    assert size < 100_000, f"docs/ holds {size:,} bytes"
