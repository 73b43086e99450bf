"""The docs cite tests as evidence (`tests/...py::test_name`); every one cited must exist.

docs/guarantees.md links each claim to the test that shows it. A renamed or
deleted test would leave a claim pointing at nothing, so this checks every
such citation in README.md and docs/*.md against the test files.
"""

from __future__ import annotations

import re
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
CITATION = re.compile(r"(tests/[\w/]+\.py)::(test_\w+)")


def documents() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]


def missing_citations(text: str) -> list[str]:
    """Each `file::test` in text whose file does not define that test function."""
    missing = []
    for path, name in CITATION.findall(text):
        source = REPO / path
        defined = source.is_file() and re.search(rf"^\s*(async\s+)?def {name}\(", source.read_text(), re.MULTILINE)
        if not defined:
            missing.append(f"{path}::{name}")
    return missing


def test_every_test_a_document_cites_exists():
    problems = {doc.name: missing for doc in documents() if (missing := missing_citations(doc.read_text()))}
    assert not problems, f"documents cite tests that do not exist: {problems}"


def test_guarantees_cite_tests_at_all():
    cited = CITATION.findall((REPO / "docs" / "guarantees.md").read_text())
    assert len(cited) > 40


def test_the_check_catches_a_missing_test_and_a_missing_file():
    text = (
        "`tests/unit/test_semantics.py::test_the_dataclasses_are_frozen` (real), "
        "`tests/unit/test_semantics.py::test_no_such_claim` and `tests/unit/test_nowhere.py::test_x`"
    )
    assert missing_citations(text) == [
        "tests/unit/test_semantics.py::test_no_such_claim",
        "tests/unit/test_nowhere.py::test_x",
    ]
