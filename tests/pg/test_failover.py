"""Failover: kill the primary under load, promote its synchronous standby, every answered write is there.

What it proves: with synchronous_commit=on and the standby named in
synchronous_standby_names, a call answered by the primary was already on
the standby. Three worker processes run against the primary; it is shut
down immediately; the standby is promoted and the workers are pointed at
it; they go on; then the checker, reading the promoted standby, finds every
put, ack and release that either server answered, no task leased twice at
once and no completed task run again.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import psycopg
import pytest

from tests.pg.load import Load, summary
from tests.pg.test_faults import wait_for_calls
from tests.postgres import PostgresServer
from walqueue.pg import migrate

SCHEMA = "walqueue"


def _wait_for(dsn: str, query: str, expected, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    with psycopg.connect(dsn, autocommit=True) as connection:
        while connection.execute(query).fetchone() != expected:
            assert time.monotonic() < deadline, f"{query} never gave {expected}"
            time.sleep(0.05)


@pytest.fixture
def primary_and_standby():
    primary = PostgresServer(fsync=True)
    standby = None
    try:
        primary.start()
        migrate(primary.dsn, schema=SCHEMA)
        standby = primary.standby("standby")
        standby.start()
        _wait_for(primary.dsn, "SELECT state FROM pg_stat_replication", ("streaming",))
        with psycopg.connect(primary.dsn, autocommit=True) as connection:
            connection.execute("ALTER SYSTEM SET synchronous_standby_names = 'standby'")
            connection.execute("SELECT pg_reload_conf()")
        _wait_for(primary.dsn, "SELECT sync_state FROM pg_stat_replication", ("sync",))
        yield primary, standby
    finally:
        for server in (primary, standby):
            if server is not None:
                print(f"--- {server.base} ---\n{server.log()}")
                server.cleanup()


def test_every_answered_write_survives_the_promotion_of_the_synchronous_standby(primary_and_standby):
    primary, standby = primary_and_standby
    workdir = Path(tempfile.mkdtemp(prefix="wq-failover-", dir="/tmp"))
    load = Load(primary.dsn, SCHEMA, workdir)
    try:
        load.start(3, seconds=14, seed=21)
        wait_for_calls(load, 150)
        primary.kill()
        before = len(load.entries())
        standby.promote()
        load.point_at(standby.dsn)
        load.wait(14)
        load.stop()
        problems, entries = load.check(standby.dsn, faults=True)
        counts = summary(entries)
        assert problems == [], f"seed=21 calls={counts}"
        assert sum(entry["outcome"] == "ok" for entry in entries[before:]) >= 20, counts
    finally:
        load.stop()
        shutil.rmtree(workdir, ignore_errors=True)
