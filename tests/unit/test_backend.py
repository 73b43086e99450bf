"""The backend contract in code (walqueue.backend): one rule picks the backend, and every
client is a Backend or an AsyncBackend."""

from __future__ import annotations

import pytest

import walqueue
from walqueue import backend
from walqueue.backend import is_postgres_target


@pytest.mark.parametrize("target", [
    "postgresql://worker@db/jobs", "postgres://u:p@host:5432/db?sslmode=require",
    "host=/run/pg dbname=jobs", "dbname=jobs", " dbname = jobs", "service=queues",
])
def test_urls_and_key_value_dsns_are_postgresql(target):
    assert is_postgres_target(target)


@pytest.mark.parametrize("target", [
    "/run/walqueue/walqueued.sock", "var/walqueue", "./x=1", "/srv/a=b", "queue", "",
    "postgresql:/one-slash", "=value", "1host=db",
])
def test_anything_else_is_a_socket_or_directory_path(target):
    assert not is_postgres_target(target)


def test_connect_takes_a_key_value_dsn_to_postgresql(monkeypatch):
    """It once raised TypeError: only URLs were PostgreSQL, the rest a socket path."""
    import walqueue.pg as pg

    chosen = []
    monkeypatch.setattr(pg, "Client", lambda target, **options: chosen.append(("pg", target)))
    walqueue.connect("host=/nowhere dbname=jobs")
    assert chosen == [("pg", "host=/nowhere dbname=jobs")]


def test_an_unknown_capability_is_an_error_not_a_silent_no():
    class Client:
        capabilities = frozenset({backend.COMPACT})

    assert not backend.lacks(Client(), backend.COMPACT)
    assert backend.lacks(Client(), backend.PAUSE)
    with pytest.raises(ValueError, match="unknown capability 'compaction'"):
        backend.lacks(Client(), "compaction")
