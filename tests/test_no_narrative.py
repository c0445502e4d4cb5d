"""The documentation states what the tool does today, not the order the work was done in: no
"since the sixteenth session", "before the twenty-sixth …", "(before …)" tables of old figures,
"previously", "no longer" in README.md, CONTRIBUTING.md, docs/ or the comments and docstrings of
specbench/. History belongs in CHANGELOG.md, which is not read here."""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

_ORDINAL = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|"
            r"thirteenth|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|"
            r"thirtieth|fortieth|(?:twenty|thirty|forty)-(?:first|second|third|fourth|fifth|sixth|"
            r"seventh|eighth|ninth)|\d+(?:st|nd|rd|th))")
# "since the first request" or "before the last token" describe the tool; ordinals past the third
# after since/before/until, or any ordinal before "session", number the work.
_LATE_ORDINAL = _ORDINAL.replace("first|second|third|", "", 1)

NARRATIVE = [re.compile(pattern.replace(" ", r"\s+"), re.IGNORECASE) for pattern in (
    rf"\b{_ORDINAL}[ -](?:GPU )?sessions?\b",
    rf"\b(?:since|before|until|after|from|in) the {_LATE_ORDINAL}\b",
    r"\b(?:this|that|an earlier|earlier|a later|later|the next|the last|previous) (?:GPU )?sessions?\b",
    r"\bround \d+ of\b",
    # "(before the twenty-sixth session)", "(before the two changes above)", "(before it was priced)";
    # not "(before a cell starts)"
    r"\(before (?:the )?(?:[\w-]+ ){0,3}(?:sessions?|changes?|fix|refactor)\b",
    r"\(before [^)]{0,40}\b(?:was|were|had)\b",
    r"\bpreviously\b",
    r"\bformerly\b",
    r"\b(?:it|this|that|which|they|we|the tool|specbench|the simulator|the code) used to\b",
    r"\bused to be\b",
    r"\bno longer\b",
)]


def narrative_in(text: str) -> list[tuple[int, str]]:
    """(offset, phrase) of each narrative phrase in `text`; a phrase may break over two lines."""
    found = sorted((match.start(), match.end(), " ".join(match.group(0).split()))
                   for pattern in NARRATIVE for match in pattern.finditer(text))
    kept, end = [], -1
    for start, stop, phrase in found:  # one finding where two patterns overlap
        if start >= end:
            kept.append((start, phrase))
        end = max(end, stop)
    return kept


def _documents() -> list[Path]:
    pages = [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]
    return [page for page in pages if page.exists()]


def _comments_and_docstrings(path: Path) -> list[tuple[int, str]]:
    """(first line, text) of every comment and docstring in a Python file."""
    source = path.read_text(encoding="utf-8")
    found = [(token.start[0], token.string) for token in tokenize.generate_tokens(io.StringIO(source).readline)
             if token.type == tokenize.COMMENT]
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)
                    and isinstance(first.value.value, str)):
                found.append((first.lineno, first.value.value))
    return found


def _located(name: str, first_line: int, text: str) -> list[str]:
    return [f"{name}:{first_line + text.count(chr(10), 0, offset)}: {phrase!r}"
            for offset, phrase in narrative_in(text)]


def _findings() -> list[str]:
    findings = []
    for page in _documents():
        findings += _located(str(page.relative_to(ROOT)), 1, page.read_text(encoding="utf-8"))
    for path in sorted((ROOT / "specbench").rglob("*.py")):
        for line, text in _comments_and_docstrings(path):
            findings += _located(str(path.relative_to(ROOT)), line, text)
    return findings


def test_no_narrative_of_the_work():
    findings = _findings()
    assert not findings, ("the work's history belongs in CHANGELOG.md; state today's figure instead:\n"
                          + "\n".join(findings))


@pytest.mark.parametrize("sample", [
    "since the sixteenth session, the replica runs async scheduling",
    "(before the twenty-sixth session)",
    "before the twenty-sixth, the rows were priced dear",
    "measured in the thirty-fourth session",
    "as in the 12th round",
    "in an earlier session this was 7 %",
    "this session's AMD EPYC",
    "round 3 of the work",
    "the same without the API server (before it was priced)",
    "the fitter previously replayed",
    "formerly a flag",
    "it used to replay arrivals",
    "a step that preempted is no longer stretched",
])
def test_the_patterns_catch_narrative(sample):
    assert narrative_in(sample), sample


@pytest.mark.parametrize("sample", [
    "the token before the last one",
    "seconds since the first request arrived",
    "before the first cell the engine measures the machine",
    "until the first rejection",
    "the server runs in a session of its own",
    "the constant used to price a step",
    "in the second round of repeats",
    "the first sitting's 25 cells",
])
def test_the_patterns_pass_plain_description(sample):
    assert not narrative_in(sample), sample


def test_a_planted_phrase_is_named_with_its_line(tmp_path, monkeypatch):
    (tmp_path / "docs").mkdir()
    (tmp_path / "specbench").mkdir()
    (tmp_path / "README.md").write_text("# specbench\n\nThe replica runs async scheduling\n"
                                        "since the sixteenth session.\n")
    (tmp_path / "specbench" / "mod.py").write_text('"""A module."""\n\nX = 1  # previously 2\n')
    monkeypatch.setitem(globals(), "ROOT", tmp_path)
    assert _findings() == ["README.md:4: 'since the sixteenth'", "specbench/mod.py:3: 'previously'"]
