"""The schema's SQL is package data: importlib.resources reads it, and a wheel carries it.

What it proves: the migration files (numbered, in sql/migrations/) and the
named-query files are found through importlib.resources and are what
MIGRATIONS and walqueue.pg.queries hold; every statement the code runs is a
named query there (the calls, the listener's, the bookkeeping's); no
placeholder stands in a `--` comment (a schema name holding a newline would
end the comment and turn the rest of the line into SQL); the package holds
no test clock (tests/pg/clock.sql is the suite's own); a wheel built from
this tree (not an editable install) carries each file byte for byte.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import zipfile
from importlib import resources
from pathlib import Path

from walqueue.pg import calls, queries, schema, wakeup

REPO = Path(__file__).resolve().parents[2]
BUILD_SECONDS = 300
QUERY_FILES = (calls.CALLS_FILE, wakeup.WAKEUP_FILE, schema.BOOKKEEPING_FILE)


def sql_files() -> list[str]:
    """Every SQL file of the package, as paths under sql/."""
    return [f"{queries.MIGRATIONS_DIRECTORY}/{name}" for *_, name in schema.MIGRATION_FILES] + list(QUERY_FILES)


def test_the_sql_files_are_found_through_importlib_resources_and_are_the_migrations():
    directory = resources.files(queries.SQL_PACKAGE).joinpath(queries.SQL_DIRECTORY)
    found = sorted(entry.name for entry in directory.iterdir() if entry.name.endswith(".sql"))
    assert found == sorted(QUERY_FILES)  # the test clock is not among them
    migrations = directory.joinpath(queries.MIGRATIONS_DIRECTORY)
    assert sorted(entry.name for entry in migrations.iterdir()) == [name for *_, name in schema.MIGRATION_FILES]
    for migration, (version, compatibility, description, name) in zip(
            schema.MIGRATIONS, schema.MIGRATION_FILES, strict=True):
        assert (migration.version, migration.compatibility, migration.description) == (
            version, compatibility, description)
        assert migration.body == migrations.joinpath(name).read_text(encoding="utf-8")


def test_every_statement_the_code_runs_is_a_named_query():
    assert calls.statements("s").names == {
        "put", "put_one", "reserve", "ack", "ack_and_reserve", "release", "touch", "revive", "get",
        "tasks", "stats", "force_release", "setup", "cancel", "workers", "page_all", "page_completed",
        "page_live", "expired_total"}
    assert queries.Queries(wakeup.WAKEUP_FILE, "s").names == {
        "listen", "backend_pid", "probe", "register", "unregister", "sweep", "reap"}
    assert schema.bookkeeping("s").names == {
        "encoding", "lock", "unlock", "exists", "installed", "create_schema", "create_migrations_table",
        "add_compatibility_column", "record_migration"}
    # No SQL left in Python strings of the modules that run statements.
    for module in (calls, wakeup, schema):
        source = Path(module.__file__).read_text()
        for keyword in ("SELECT ", "DELETE FROM", "INSERT INTO", "LISTEN {", "CREATE TABLE"):
            assert f'"{keyword}' not in source and f"'{keyword}" not in source, (module.__name__, keyword)


def test_no_placeholder_stands_in_a_comment():
    for name in sql_files():
        for number, line in enumerate(queries.sql_text(name).splitlines(), 1):
            comment = line.partition("--")[2]
            assert "{" not in comment and "}" not in comment, f"{name}:{number}: {line}"


def test_a_wheel_built_from_the_tree_carries_the_sql_files(tmp_path):
    tree = tmp_path / "tree"
    tree.mkdir()
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, tree / name)
    shutil.copytree(REPO / "src", tree / "src",
                    ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--quiet", "--no-build-isolation",
                            "--wheel-dir", str(tmp_path / "out"), str(tree)],
                           capture_output=True, text=True, timeout=BUILD_SECONDS)
    assert built.returncode == 0, built.stderr
    (wheel,) = (tmp_path / "out").glob("walqueue-*.whl")
    with zipfile.ZipFile(wheel) as archive:
        # Exactly these: no test clock among them.
        assert sorted(member for member in archive.namelist() if member.endswith(".sql")) == sorted(
            f"walqueue/pg/{queries.SQL_DIRECTORY}/{name}" for name in sql_files())
        for name in sql_files():
            member = f"walqueue/pg/{queries.SQL_DIRECTORY}/{name}"
            assert member in archive.namelist(), f"{member} is not in {wheel.name}"
            assert archive.read(member) == (REPO / "src" / "walqueue" / "pg" / queries.SQL_DIRECTORY
                                            / name).read_bytes()
