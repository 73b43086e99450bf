"""Faults on PostgreSQL (fsync=on, synchronous_commit=on): crashes under load, a connection killed mid-COMMIT.

What it proves:
- `pg_ctl stop -m immediate` (SIGQUIT to the postmaster) while three worker
  processes run, then a restart: the workers see DatabaseUnavailable, go on
  after the restart, and the checker finds every answered put, ack and
  release in the recovered database, no task leased twice at once and no
  completed task run again;
- a backend terminated (pg_terminate_backend) while its COMMIT waits — held
  there by a synchronous standby that never answers — gives the caller
  DatabaseUnavailable although the transaction committed locally; retrying
  resolves it: the retried put returns the same id and writes nothing, the
  retried ack answers StaleLease "completed" at the lease's own generation.
"""

from __future__ import annotations

import shutil
import tempfile
import threading
import time
from pathlib import Path

import psycopg
import pytest

from tests.pg.load import Load, summary
from walqueue import StaleLease
from walqueue.pg import Client, DatabaseUnavailable, migrate

SCHEMA = "walqueue"


@pytest.fixture
def workdir():
    path = Path(tempfile.mkdtemp(prefix="wq-faults-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


def wait_for_calls(load: Load, count: int, timeout: float = 60.0) -> None:
    """Until the workers have logged `count` answered calls (bounded)."""
    deadline = time.monotonic() + timeout
    while sum(entry["outcome"] == "ok" for entry in load.entries()) < count:
        assert time.monotonic() < deadline, f"the load did not reach {count} answered calls"
        time.sleep(0.1)


def test_an_immediate_shutdown_under_load_loses_no_answered_write(durable_server, workdir):
    migrate(durable_server.dsn, schema=SCHEMA)
    load = Load(durable_server.dsn, SCHEMA, workdir)
    try:
        load.start(3, seconds=14, seed=11)
        wait_for_calls(load, 150)
        durable_server.kill()
        before_restart = len(load.entries())
        durable_server.start()
        load.wait(14)
    finally:
        load.stop()
    problems, entries = load.check(durable_server.dsn, faults=True)
    counts = summary(entries)
    assert problems == [], f"seed=11 calls={counts}"
    assert any(entry["outcome"] == "unknown" for entry in entries), counts
    after = [entry for entry in entries[before_restart:] if entry["outcome"] == "ok"]
    assert len(after) >= 20, f"the workers did not go on after the restart: {counts}"


def _set_standby_names(dsn: str, admin: psycopg.Connection, value: str | None, timeout: float = 20.0) -> None:
    """Set (or reset, for None) synchronous_standby_names and wait until every backend will see it.

    pg_reload_conf() only signals the postmaster, which re-reads the file and
    signals its children later; a call started at once could commit on the old
    setting. A new connection is forked only after the postmaster has done
    both, so once one shows the value, every existing backend has its SIGHUP
    pending and applies it before its next command.
    """
    if value is None:
        admin.execute("ALTER SYSTEM RESET synchronous_standby_names")
    else:
        admin.execute(f"ALTER SYSTEM SET synchronous_standby_names = '{value}'")
    admin.execute("SELECT pg_reload_conf()")
    deadline = time.monotonic() + timeout
    while True:
        with psycopg.connect(dsn, autocommit=True) as probe:
            (shown,) = probe.execute("SHOW synchronous_standby_names").fetchone()
        if shown == (value or ""):
            return
        assert time.monotonic() < deadline, f"synchronous_standby_names stayed {shown!r}"
        time.sleep(0.02)


def _backend_waiting_for_sync_rep(admin: psycopg.Connection, timeout: float = 20.0) -> int:
    deadline = time.monotonic() + timeout
    while True:
        row = admin.execute("SELECT pid FROM pg_stat_activity WHERE wait_event = 'SyncRep'").fetchone()
        if row is not None:
            return row[0]
        assert time.monotonic() < deadline, "no COMMIT waiting for the synchronous standby"
        time.sleep(0.02)


def _kill_mid_commit(dsn: str, call) -> BaseException | None:
    """Run `call` while COMMITs wait for a standby that never answers; terminate its backend."""
    outcome: list[BaseException | None] = []

    def run() -> None:
        try:
            call()
            outcome.append(None)
        except BaseException as error:  # noqa: BLE001 - handed to the test
            outcome.append(error)

    with psycopg.connect(dsn, autocommit=True) as admin:
        _set_standby_names(dsn, admin, "nobody")
        try:
            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            pid = _backend_waiting_for_sync_rep(admin)
            admin.execute("SELECT pg_terminate_backend(%s)", (pid,))
            thread.join(20)
            assert not thread.is_alive(), "the call did not return after its backend was terminated"
        finally:
            _set_standby_names(dsn, admin, None)
    return outcome[0]


def test_a_connection_killed_mid_commit_is_unavailable_and_a_retry_resolves_it(durable_server):
    with Client(durable_server.dsn, queue="mid-commit", retry_seconds=0, reaper=False) as client:
        error = _kill_mid_commit(durable_server.dsn, lambda: client.put("t", {"n": 1}))
        assert isinstance(error, DatabaseUnavailable), error
        assert client.put("t", {"n": 1}) == "t"          # committed after all; writes nothing
        assert [view.task_id for view in client.tasks()] == ["t"]
        (lease,) = client.reserve("w", lease_seconds=60)
        error = _kill_mid_commit(durable_server.dsn, lambda: client.ack(lease))
        assert isinstance(error, DatabaseUnavailable), error
        with pytest.raises(StaleLease) as retried:
            client.ack(lease)
        assert (retried.value.status, retried.value.generation) == ("completed", lease.generation)
