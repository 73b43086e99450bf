"""The schema's SQL is package data: importlib.resources reads it, and a wheel carries it.

What it proves: every migration file and the test clock are found through
importlib.resources and are what MIGRATIONS holds; no placeholder stands in
a `--` comment (a schema name holding a newline would end the comment and
turn the rest of the line into SQL); a wheel built from this tree (not an
editable install) carries each file byte for byte.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

from walqueue.pg import schema

REPO = Path(__file__).resolve().parents[2]
BUILD_SECONDS = 300


def sql_files() -> list[str]:
    return [name for _, _, name in schema.MIGRATION_FILES] + [schema.TEST_CLOCK_FILE]


def test_the_sql_files_are_found_through_importlib_resources_and_are_the_migrations():
    directory = resources.files(schema.SQL_PACKAGE).joinpath(schema.SQL_DIRECTORY)
    found = sorted(entry.name for entry in directory.iterdir() if entry.name.endswith(".sql"))
    assert found == sorted(sql_files())
    for (version, _, text), (file_version, _, name) in zip(
            schema.MIGRATIONS, schema.MIGRATION_FILES, strict=True):
        assert version == file_version
        assert text == directory.joinpath(name).read_text(encoding="utf-8")


def test_no_placeholder_stands_in_a_comment():
    for name in sql_files():
        for number, line in enumerate(schema.sql_text(name).splitlines(), 1):
            comment = line.partition("--")[2]
            assert "{" not in comment and "}" not in comment, f"{name}:{number}: {line}"


def test_a_wheel_built_from_the_tree_carries_the_sql_files(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, tree / name)
    shutil.copytree(REPO / "src", tree / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet",
                            "--wheel-dir", str(tmp_path / "out"), str(tree)],
                           capture_output=True, text=True, timeout=BUILD_SECONDS)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "out").glob("walqueue-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        for name in sql_files():
            member = f"walqueue/pg/{schema.SQL_DIRECTORY}/{name}"
            assert member in archive.namelist(), f"{member} is not in {wheel.name}"
            assert archive.read(member) == (REPO / "src" / "walqueue" / "pg" / schema.SQL_DIRECTORY
                                            / name).read_bytes()
