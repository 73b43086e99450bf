"""Every "SPEC §N" the code and the docs cite names a section of docs/spec.md, the contract
that ships with the project (it once lived outside the repository, and 76 citations pointed
nowhere a user could follow)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "docs" / "spec.md"
CITATION = re.compile(r"SPEC(?:\.md)?'?s? ?((?:§\d+[a-z]?(?:\s*(?:[–,-]|and)\s*)?)+)")
SECTION = re.compile(r"§(\d+[a-z]?)")


def cited_sections() -> dict[str, list[str]]:
    """section -> the files that cite it."""
    cited: dict[str, list[str]] = {}
    places = [ROOT / "README.md", *(ROOT / "docs").glob("*.md"), *(ROOT / "src").rglob("*.py"),
              *(ROOT / "scripts").iterdir(), *(ROOT / "systemd").iterdir(), *(ROOT / "tests").rglob("*.py")]
    for path in places:
        if not path.is_file() or path == SPEC:
            continue
        text = path.read_text(encoding="utf-8", errors="replace")
        for citation in CITATION.finditer(text):
            sections = SECTION.findall(citation.group(1))
            if "–" in citation.group(1) or "-" in citation.group(1):   # a range: §1–§6
                first, last = int(re.match(r"\d+", sections[0])[0]), int(re.match(r"\d+", sections[-1])[0])
                sections += [str(number) for number in range(first, last + 1)]
            for section in sections:
                cited.setdefault(section, []).append(str(path.relative_to(ROOT)))
    return cited


def spec_sections() -> set[str]:
    return set(re.findall(r"^#{2,3} §(\d+[a-z]?)\.", SPEC.read_text(encoding="utf-8"), flags=re.M))


def test_the_contract_ships_with_the_project_and_has_every_section_cited():
    cited = cited_sections()
    assert len(cited) >= 10, cited   # the test reads citations at all
    missing = {section: sorted(set(files))[:3] for section, files in cited.items()
               if section not in spec_sections()}
    assert not missing, f"cited but not in docs/spec.md: {missing}"


def test_no_doc_says_the_contract_lives_elsewhere():
    for path in [ROOT / "README.md", *(path for path in (ROOT / "docs").glob("*.md") if path != SPEC)]:
        text = path.read_text(encoding="utf-8")
        assert "outside this repository" not in text, path
        assert "`SPEC.md`" not in text, f"{path.name}: point at docs/spec.md instead"
