"""The size limits hold (STYLE, issue 21): no module under src/ over 800 lines, no class over 500.

A class's size is counted with ast, from its first line (decorators aside) to
its last: ``end_lineno - lineno + 1``. The second test shows the check finds a
module and a class over the limits, planted in a scratch tree.
"""

from __future__ import annotations

import ast
from pathlib import Path

SRC = Path(__file__).resolve().parents[2] / "src"
MAX_MODULE_LINES = 800
MAX_CLASS_LINES = 500


def oversized(root: Path) -> list[str]:
    """Every module over MAX_MODULE_LINES and class over MAX_CLASS_LINES under ``root``."""
    found = []
    for path in sorted(root.rglob("*.py")):
        text = path.read_text(encoding="utf-8")
        name = path.relative_to(root).as_posix()
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            found.append(f"{name}: {lines} lines (module limit {MAX_MODULE_LINES})")
        for node in ast.walk(ast.parse(text, filename=str(path))):
            if isinstance(node, ast.ClassDef):
                size = node.end_lineno - node.lineno + 1
                if size > MAX_CLASS_LINES:
                    found.append(f"{name}: class {node.name} {size} lines (class limit {MAX_CLASS_LINES})")
    return found


def test_no_module_or_class_is_over_its_limit():
    assert oversized(SRC) == [], "split these by concept (one module per concept)"


def test_the_check_finds_a_module_and_a_class_over_the_limits(tmp_path):
    body = "\n".join(f"    x{n} = {n}" for n in range(MAX_CLASS_LINES))   # the class line makes 501
    (tmp_path / "big_class.py").write_text(f"class Big:\n{body}\n")
    (tmp_path / "long_module.py").write_text("x = 1\n" * (MAX_MODULE_LINES + 1))
    (tmp_path / "at_the_limits.py").write_text(
        "class Fits:\n" + "\n".join(f"    y{n} = {n}" for n in range(MAX_CLASS_LINES - 1)) + "\n"
        + "z = 1\n" * (MAX_MODULE_LINES - MAX_CLASS_LINES))
    assert oversized(tmp_path) == [
        f"big_class.py: class Big {MAX_CLASS_LINES + 1} lines (class limit {MAX_CLASS_LINES})",
        f"long_module.py: {MAX_MODULE_LINES + 1} lines (module limit {MAX_MODULE_LINES})",
    ]
