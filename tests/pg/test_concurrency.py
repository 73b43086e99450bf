"""Many processes on one PostgreSQL queue: the checker finds no violation, and catches broken schemas.

What it proves: four worker processes putting, reserving (limits 1-50,
leases of 1 s left to expire and of 30 s), acking, ack_and_reserving,
releasing, touching and sending stale acks on one queue for a few seconds
leave a state in which no task was leased twice at once, no answered write
was lost, no completed task ran again and no refused ack changed anything
(tests/pg/checker.py). The same load against a schema whose reserve does
not lock what it picks, or whose ack ignores the generation, must produce
violations: the checker is shown able to fail. The seed is in the test id
and in every failure message.
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

import psycopg
import pytest

from tests.pg.broken import broken_schema
from tests.pg.load import Load, summary
from tests.postgres import session_server, unique_name
from walqueue.pg import schema

WORKERS = 4
SECONDS = 6.0


@pytest.fixture
def workdir():
    path = Path(tempfile.mkdtemp(prefix="wq-load-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def run_load(dsn: str, schema_name: str, workdir: Path, seed: int) -> tuple[list[str], dict]:
    load = Load(dsn, schema_name, workdir)
    try:
        load.start(WORKERS, SECONDS, seed)
        load.wait(SECONDS)
    finally:
        load.stop()
    problems, entries = load.check(dsn)
    return problems, summary(entries)


@pytest.mark.parametrize("seed", [1])
def test_concurrent_workers_never_lease_a_task_twice_or_lose_an_answered_write(request, workdir, seed):
    server = session_server(request)
    name = unique_name("load")
    with psycopg.connect(server.dsn, autocommit=True) as connection:
        schema.migrate_connection(connection, name)
    problems, counts = run_load(server.dsn, name, workdir, seed)
    assert problems == [], f"seed={seed} calls={counts}"
    # The load did what it is meant to: enough of every kind of call.
    for kind in ("put:ok", "reserve:ok", "ack:ok", "ack_and_reserve:ok", "release:ok", "touch:ok",
                 "ack:error"):
        assert counts.get(kind, 0) >= 5, f"seed={seed}: too few {kind}: {counts}"


@pytest.mark.parametrize(("variant", "symptom"), [
    ("reserve_without_locking", "leased twice at once"),
    ("ack_without_generation", "lost ack"),
])
def test_the_checker_catches_a_broken_schema(request, workdir, monkeypatch, variant, symptom):
    server = session_server(request)
    with broken_schema(server, variant, monkeypatch) as name:
        problems, counts = run_load(server.dsn, name, workdir, seed=7)
    assert any(symptom in problem for problem in problems), f"{variant}: {problems} {counts}"
