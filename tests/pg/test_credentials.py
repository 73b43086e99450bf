"""No tool prints a DSN's password (SPEC §8b), against the suite's real PostgreSQL: the
cluster trusts local connections, so a DSN may carry any password and still connect.
walqueue-worker (threads and asyncio) serves and logs its target as
`postgresql://postgres:***@...`; walqueue-ctl answers, and its errors from the server
(an unknown database) name the DSN without the password; the clients' repr and
DatabaseUnavailable messages hold none of it. tests/process/test_credentials.py covers
unreachable and unparsable DSNs."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.postgres import unique_name
from tests.process.daemon import REPO, child_env
from walqueue.pg import AsyncClient, Client, DatabaseRefused

SECRET = "s3cretPW9"
EXIT_SECONDS = 60.0


def with_password(postgres, database="postgres") -> str:
    return f"postgresql://postgres:{SECRET}@/{database}?host={postgres.base}&port={postgres.port}"


def run(*command: str) -> tuple[int, str]:
    result = subprocess.run([sys.executable, "-m", *command], env=child_env(), cwd=REPO, stdin=subprocess.DEVNULL,
                            capture_output=True, text=True, timeout=EXIT_SECONDS)
    return result.returncode, result.stdout + result.stderr


@pytest.mark.parametrize("handler", ["tests.process.worker_handlers:record", "tests.process.worker_handlers:sleeping"])
def test_walqueue_worker_logs_its_target_without_the_password(postgres, handler):
    dsn = with_password(postgres)
    code, output = run("walqueue.worker.cli", dsn, handler, "--queue", unique_name("cred"), "--max-tasks", "0")
    assert SECRET not in output, output
    assert code == 0, output
    assert f"serving postgresql://postgres:***@/postgres?host={postgres.base}&port={postgres.port} with" in output


def test_walqueue_ctl_answers_and_its_errors_hold_no_password(postgres):
    queue = unique_name("cred")
    code, output = run("walqueue.ctl", "--dsn", with_password(postgres), "--queue", queue, "put", "t1", "{}")
    assert (code, SECRET in output) == (0, False), output
    key_value = f"host={postgres.base} port={postgres.port} user=postgres password='{SECRET} x' dbname=postgres"
    code, output = run("walqueue.ctl", "--dsn", key_value, "--queue", queue, "stats", "--json")
    assert (code, SECRET in output) == (0, False), output
    missing = with_password(postgres, "no_such_database")
    code, output = run("walqueue.ctl", "--timeout", "2", "--dsn", missing, "--queue", queue, "stats")
    assert SECRET not in output, output
    assert code == 3 and "postgresql://postgres:***@/no_such_database" in output


def test_the_clients_repr_and_errors_hold_no_password(postgres):
    dsn = with_password(postgres)
    with Client(dsn, queue=unique_name("cred")) as client:
        assert SECRET not in repr(client)
        assert "postgres:***@" in repr(client) and client.queue in repr(client)
    asynchronous = AsyncClient(dsn, queue="cred-async")
    assert SECRET not in repr(asynchronous) and "postgres:***@" in repr(asynchronous)
    with pytest.raises(DatabaseRefused) as raised:  # at once: no retry cures it (test_refusals.py)
        Client(with_password(postgres, "no_such_database"), connect_seconds=2)
    assert SECRET not in str(raised.value) and "postgres:***@" in str(raised.value)
