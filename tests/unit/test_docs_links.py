"""The docs cite tests as evidence (`tests/...py::test_name`); every one cited must exist.
And every relative link between them (`operations.md#upgrades`) must reach a
file and a heading that exist.

docs/guarantees.md links each claim to the test that shows it. A renamed or
deleted test would leave a claim pointing at nothing, so this checks every
such citation in README.md and docs/*.md against the test files. A renamed
heading would leave a link pointing at the top of a long page.
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


LINK = re.compile(r"\]\(([^)#\s:]*)(?:#([^)\s]+))?\)")
FENCE = re.compile(r"```.*?```", re.DOTALL)


def heading_anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces as hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def broken_links(document: Path, text: str) -> list[str]:
    """Each relative link in text (outside code blocks) to a missing file or heading."""
    broken = []
    for target, anchor in LINK.findall(FENCE.sub("", text)):
        path = (document.parent / target) if target else document
        if not path.exists():
            broken.append(f"{target}#{anchor}" if anchor else target)
        elif anchor and path.suffix == ".md":
            headings = re.findall(r"^#{1,6}\s+(.*)$", FENCE.sub("", path.read_text()), re.MULTILINE)
            if anchor not in {heading_anchor(heading) for heading in headings}:
                broken.append(f"{target}#{anchor}")
    return broken


def test_every_relative_link_reaches_a_file_and_heading_that_exist():
    problems = {doc.name: broken for doc in documents() if (broken := broken_links(doc, doc.read_text()))}
    assert not problems, f"documents link to what does not exist: {problems}"


def test_the_link_check_catches_a_missing_file_and_a_missing_heading():
    text = ("[ok](docs/operations.md#upgrades) [ok](docs/operations.md#python-312-or-later) "
            "[gone](docs/nowhere.md) [moved](docs/operations.md#no-such-heading) "
            "[web](https://example.com/x#y)")
    assert broken_links(REPO / "README.md", text) == ["docs/nowhere.md",
                                                     "docs/operations.md#no-such-heading"]


def test_no_page_or_message_tells_to_install_walqueue_from_an_index():
    """Issue 23: `pip install 'walqueue[postgres]'` failed: the package is not on an index."""
    index_install = re.compile(r"pip install ['\"]?walqueue\b")
    sources = [*documents(), *sorted((REPO / "src" / "walqueue").rglob("*.py"))]
    found = [f"{path.relative_to(REPO)}:{number}" for path in sources
             for number, line in enumerate(path.read_text().splitlines(), 1)
             if index_install.search(line)]
    assert not found, f"say how to install from the clone instead: {found}"


def test_the_postgres_page_first_example_reserves_a_task_that_is_due():
    """Issue 23: postgres.md's first example waited 5 s for its only task, put with delay=60."""
    text = (REPO / "docs" / "postgres.md").read_text()
    example = text.split("```python", 1)[1].split("```", 1)[0]
    puts = [line for line in example.splitlines() if ".put(" in line]
    assert any("delay=" not in line and "available_at=" not in line for line in puts), puts
