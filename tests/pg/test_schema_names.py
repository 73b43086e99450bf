"""Schema names: any name walqueue.pg accepts works in full; any other is refused before anything is sent.

Once (issue 20 item 12) the migration filled its placeholders by one
`str.replace` after another, so a schema named `wq"@channel@` had its quoted
identifier rewritten by the next replacement (a syntax error), `@lock@x`
named another schema, `a$$b` ended a function body early, and `50%off` broke
every call (psycopg reads `%o` as a placeholder); each left an empty schema
behind.

What it proves:
- hostile names — quotes, placeholders of either style, dollar quotes, `%`,
  backslashes, spaces, a newline, unicode, exactly 54 bytes — migrate, and a
  put / reserve / ack / get / stats round trip, a waiting reserve woken by a
  put (the NOTIFY channel and the listener's registration), and the
  listener's reap and unregister statements all work in that schema, which
  holds exactly the migrated tables;
- names PostgreSQL or the NOTIFY channel cannot take (empty, over 54 bytes
  of UTF-8, NUL, the reserved `pg_` prefix, not a str) are refused by the
  Client and by migrate() with an InvalidRequest naming the name, and no
  schema is created;
- a migration that fails leaves no schema behind (the schema, its
  schema_migrations table and the first migration are one transaction).
"""

from __future__ import annotations

import dataclasses
import threading

import psycopg
import pytest

from tests.postgres import unique_name
from walqueue.errors import InvalidRequest
from walqueue.pg import Client, migrate, schema

WAIT_SECONDS = 20

HOSTILE = [
    'wq"@channel@',
    'a"b',
    '"',
    "@s@",
    "@lock@x",
    "{schema}",
    "{}",
    "a$$b",
    "$wq$",
    "$$",
    "50%off",
    "a%sb",
    "x'); DROP SCHEMA walqueue CASCADE; --",
    "back\\slash",
    "with space",
    " edges ",
    "new\nline",
    "UPPER",
    "schéma-日本-ü",
    "x" * 54,
    "é" * 27,  # 54 bytes of UTF-8
]

REFUSED = {
    "empty": "",
    "55 bytes": "x" * 55,
    "56 bytes of UTF-8": "é" * 28,
    "63 bytes": "x" * 63,
    "64 bytes": "x" * 64,
    "NUL": "a\x00b",
    "pg_ prefix": "pg_walqueue",
    "pg_catalog": "pg_catalog",
    "not a str": 7,
}

TABLES = ["completed", "expiry_count", "listener", "live", "schema_migrations", "task", "task_view"]


def namespaces(dsn: str) -> list[str]:
    with psycopg.connect(dsn) as connection:
        return sorted(row[0] for row in connection.execute("SELECT nspname FROM pg_namespace"))


@pytest.mark.parametrize("name", HOSTILE, ids=repr)
def test_a_hostile_schema_name_works_in_full(postgres, name):
    queue = unique_name("q")
    with Client(postgres.dsn, schema=name, queue=queue) as consumer, \
            Client(postgres.dsn, schema=name, queue=queue, reaper=False) as producer:
        with psycopg.connect(postgres.dsn) as connection:
            tables = connection.execute(
                "SELECT c.relname FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
                "WHERE n.nspname = %s AND c.relkind IN ('r', 'v') ORDER BY 1", (name,)).fetchall()
        assert [row[0] for row in tables] == TABLES
        assert producer.put("t1", {"n": 1}) == "t1"
        (lease,) = consumer.reserve("w")
        consumer.ack(lease)
        assert consumer.get("t1").status == "completed"
        leases = []
        reserver = threading.Thread(
            target=lambda: leases.extend(consumer.reserve("w", wait=WAIT_SECONDS)), daemon=True)
        reserver.start()
        service = consumer._service_for_waits()
        assert service.ready(10) and not service.polling
        producer.put("t2", {})
        reserver.join(WAIT_SECONDS + 5)
        assert [lease.task_id for lease in leases] == ["t2"]
        stats = consumer.stats()
        assert (stats.ready, stats.leased, stats.completed) == (0, 1, 1)
        assert producer.force_release(["t2"]) == ["t2"]  # its statement names the schema too
        assert consumer.get("t2").status == "ready"
        # The listener's other statements, which carry the schema beside parameters.
        with psycopg.connect(postgres.dsn, autocommit=True) as connection:
            assert connection.execute(service.statements.reap, (queue,)).fetchone() == (0,)
            connection.execute(service.statements.unregister, (queue, service.pid))
            connection.execute(service.statements.sweep)
    assert migrate(postgres.dsn, schema=name) == schema.SCHEMA_VERSION


@pytest.mark.parametrize("name", REFUSED.values(), ids=REFUSED.keys())
def test_a_name_postgresql_or_the_channel_cannot_take_is_refused_before_anything_is_sent(
        postgres, name):
    before = namespaces(postgres.dsn)
    for attempt in (lambda: Client(postgres.dsn, schema=name, reaper=False),
                    lambda: migrate(postgres.dsn, schema=name)):
        with pytest.raises(InvalidRequest) as refused:
            attempt()
        message = str(refused.value)
        assert "schema" in message
        if isinstance(name, str) and name:
            assert repr(name) in message
    assert namespaces(postgres.dsn) == before


def test_a_failing_migration_leaves_no_schema_behind(postgres, monkeypatch):
    name = unique_name("half")
    monkeypatch.setattr(schema, "MIGRATIONS", (dataclasses.replace(schema.MIGRATIONS[0], body="SELECT 1 / 0"),))
    with pytest.raises(psycopg.errors.DivisionByZero):
        migrate(postgres.dsn, schema=name)
    with pytest.raises(psycopg.errors.DivisionByZero):
        Client(postgres.dsn, schema=name, reaper=False)
    assert name not in namespaces(postgres.dsn)
