"""A connection PostgreSQL refuses for good fails at once, with one message (issue 23).

A mistyped database name took 30 s and five pool warnings to fail. Against the suite's real
PostgreSQL: a database that does not exist (SQLSTATE 3D000) and a role that does not exist
(28000) raise walqueue.pg.DatabaseRefused from the first connection, without the pool's
retries, in both clients and migrate(); walqueue-ctl and walqueue-worker exit 3 with one
message and no warning. The words libpq gives for a refused password (28P01), which this
trusting cluster never says, are checked on their own. Each test gives the clients a short
connect_seconds, so that before the fix it fails in seconds (as DatabaseUnavailable after the
pool's attempts) rather than in 30.
"""

from __future__ import annotations

import asyncio
import logging
import subprocess
import sys

import psycopg
import pytest

from tests.postgres import unique_name
from tests.process.daemon import REPO, child_env
from walqueue.pg import AsyncClient, Client, DatabaseRefused, migrate
from walqueue.pg.refusals import incurable_state

EXIT_SECONDS = 60.0
CONNECT_SECONDS = 3


def refused_dsns(postgres) -> dict[str, tuple[str, str]]:
    base = f"host={postgres.base} port={postgres.port}"
    return {"3D000": (f"{base} user=postgres dbname=no_such_database", "no_such_database"),
            "28000": (f"{base} user=no_such_role dbname=postgres", "no_such_role")}


@pytest.mark.parametrize("state", ["3D000", "28000"])
def test_a_refused_connection_raises_database_refused_without_the_pools_retries(postgres, caplog, state):
    dsn, named = refused_dsns(postgres)[state]
    caplog.set_level(logging.WARNING)
    with pytest.raises(DatabaseRefused) as refused:
        Client(dsn, queue=unique_name("refused"), connect_seconds=CONNECT_SECONDS)
    assert refused.value.sqlstate == state and named in str(refused.value)
    assert "Retrying cannot help" in str(refused.value)
    assert [record.getMessage() for record in caplog.records if record.name.startswith("psycopg")] == []
    with pytest.raises(DatabaseRefused):
        migrate(dsn)


def test_the_async_client_is_refused_at_once_too(postgres, caplog):
    dsn, _ = refused_dsns(postgres)["3D000"]
    caplog.set_level(logging.WARNING)

    async def open_it():
        async with AsyncClient(dsn, queue=unique_name("refused"), connect_seconds=CONNECT_SECONDS):
            pass

    with pytest.raises(DatabaseRefused) as refused:
        asyncio.run(open_it())
    assert refused.value.sqlstate == "3D000"
    assert not [record for record in caplog.records if record.name.startswith("psycopg")]


def run(*command: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", *command], env=child_env(), cwd=REPO,
                          stdin=subprocess.DEVNULL, capture_output=True, text=True,
                          timeout=EXIT_SECONDS)


def test_walqueue_ctl_with_a_mistyped_database_exits_3_with_one_message(postgres):
    dsn, _ = refused_dsns(postgres)["3D000"]
    result = run("walqueue.ctl", "--timeout", str(CONNECT_SECONDS), "--dsn", dsn, "stats")
    assert result.returncode == 3, result.stderr
    assert 'database "no_such_database" does not exist' in result.stderr
    assert "check the DSN's dbname" in result.stderr and "Fix --dsn" in result.stderr
    assert result.stderr.count("Error:") == 1 and "WARNING" not in result.stderr, result.stderr
    assert "Traceback" not in result.stderr


def test_walqueue_worker_with_a_mistyped_database_exits_3_with_one_message(postgres):
    dsn, _ = refused_dsns(postgres)["3D000"]
    result = run("walqueue.worker.cli", dsn, "tests.process.worker_handlers:record", "--max-tasks", "0")
    assert result.returncode == 3, result.stderr
    assert "refused the worker" in result.stderr and "SQLSTATE 3D000" in result.stderr
    assert "WARNING" not in result.stderr and "Traceback" not in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1, result.stderr


@pytest.mark.parametrize("words, state", [
    ('FATAL:  password authentication failed for user "app"', "28P01"),
    ("fe_sendauth: no password supplied", "28P01"),
    ('FATAL:  no pg_hba.conf entry for host "10.0.0.7", user "app", database "jobs"', "28000"),
    ('FATAL:  permission denied for database "jobs"', "42501"),
    ('FATAL:  database "jobz" does not exist', "3D000"),
    ("connection is bad: No such file or directory", None),   # not up yet: the pool waits
    ("FATAL:  the database system is starting up", None),
    ("FATAL:  sorry, too many clients already", None),
])
def test_which_connection_failures_are_incurable(words, state):
    assert incurable_state(psycopg.OperationalError(f"connection failed: {words}")) == state


def test_walqueue_scheduler_with_a_mistyped_database_exits_3_with_one_message(postgres, tmp_path):
    dsn, _ = refused_dsns(postgres)["3D000"]
    schedule = tmp_path / "schedule.toml"
    schedule.write_text('[[task]]\nname = "tick"\nevery = 60\n')
    result = run("walqueue.schedule.cli", dsn, str(schedule))
    assert result.returncode == 3, result.stderr
    assert "refused the scheduler" in result.stderr and "SQLSTATE 3D000" in result.stderr
    assert "Traceback" not in result.stderr and "WARNING" not in result.stderr, result.stderr
