"""walqueue-ctl asks the backend what it can do: a command whose capability
(walqueue.backend) the backend's client class lacks exits 2, before anything
connects, with the reason and, on PostgreSQL, the tool to use instead.

No daemon or database is needed: the refusal comes first, and the client
factory here fails the test if it is ever called.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from walqueue import backend
from walqueue.client import Client
from walqueue.ctl import backends, cli
from walqueue.ctl.errors import EXIT_USAGE

NOWHERE = "postgresql:///nowhere?host=/nonexistent&port=1"


@pytest.fixture
def run(monkeypatch):
    def never(*args, **options):
        raise AssertionError("a refused command must not connect")

    monkeypatch.setattr(backends, "CLIENT_FACTORY", never)
    monkeypatch.delenv("WALQUEUE_SOCKET", raising=False)
    monkeypatch.delenv("WALQUEUE_DSN", raising=False)

    def invoke(*args):
        return CliRunner().invoke(cli, list(args), catch_exceptions=False)

    return invoke


def test_a_daemon_client_without_a_capability_refuses_its_commands(run, monkeypatch):
    monkeypatch.setattr(Client, "capabilities", backend.CAPABILITIES - {backend.COMPACT})
    result = run("compact")
    assert result.exit_code == EXIT_USAGE
    assert "compact is not available with walqueued" in result.stderr
    assert "'compact'" in result.stderr
    error = json.loads(run("--socket", "/x.sock", "compact", "--json").stderr)
    assert (error["code"], error["error"]) == (EXIT_USAGE, "Unsupported")


def test_postgresql_refuses_what_its_client_lacks_naming_the_capability(run, monkeypatch):
    import walqueue.pg

    monkeypatch.setattr(walqueue.pg.Client, "capabilities", frozenset())
    result = run("--dsn", NOWHERE, "force-release", "a", "--yes")
    assert result.exit_code == EXIT_USAGE
    assert ("force-release is not available with --dsn: the PostgreSQL backend lacks the "
            "capability 'force_release'") in result.stderr


@pytest.mark.parametrize(("command", "says"), [
    (["compact"], "VACUUM"), (["pause"], "REVOKE EXECUTE"), (["resume"], "GRANT"),
    (["backup", "/tmp/x"], "pg_basebackup"), (["metrics"], "pg_stat"),
    (["top"], "pg_stat_activity"), (["verify", "/tmp"], "pg_amcheck"),
])
def test_walqueued_s_own_commands_exit_2_on_postgresql_before_connecting(run, command, says):
    result = run("--dsn", NOWHERE, *command)
    assert result.exit_code == EXIT_USAGE, result.output
    assert f"{command[0]} is not available with --dsn: " in result.stderr and says in result.stderr


# The methods each capability stands for.
METHODS = {
    backend.ACK_AND_RESERVE: ("ack_and_reserve",),
    backend.FORCE_RELEASE: ("force_release",),
    backend.COMPACT: ("compact",),
    backend.PAUSE: ("pause", "resume"),
    backend.BACKUP: ("backup_begin", "backup_end"),
    backend.DAEMON_STATS: ("daemon_stats",),
}


def client_classes():
    import walqueue.aio
    import walqueue.pg

    return [Client, walqueue.aio.Client, walqueue.pg.Client, walqueue.pg.AsyncClient]


def test_every_client_claims_exactly_the_capabilities_it_has_the_methods_for():
    assert set(METHODS) == backend.CAPABILITIES
    for client_class in client_classes():
        for capability, methods in METHODS.items():
            has = all(callable(getattr(client_class, method, None)) for method in methods)
            claims = capability in client_class.capabilities
            assert has == claims, (client_class, capability)
