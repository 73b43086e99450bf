"""walqueue.pg specifics: schema creation and versions, settings warnings, grants, queues, races, errors.

What it proves: the first clients of a fresh schema create it once under the
advisory lock, even when several start at once; a schema newer than the
client is refused naming both versions, a missing one (migrate=False) names
the command that creates it; fsync/synchronous_commit off is logged by
name; a worker role with only the grants docs/postgres.md lists (no DDL)
runs every call; queues in one database are independent; two clients
racing one key resolve like serial puts (an identical put returns the id, a
different one is a KeyConflict, never a database error); payloads keep
integers of any size; an unreachable server is DatabaseUnavailable (a
ConnectionError) and the daemon-only ctl commands name their PostgreSQL tool.
"""

from __future__ import annotations

import logging
import threading

import psycopg
import pytest

from tests.postgres import unique_name
from walqueue import KeyConflict, StaleLease
from walqueue.errors import Unavailable
from walqueue.pg import (
    SCHEMA_VERSION,
    UNSUPPORTED_COMMANDS,
    Client,
    DatabaseUnavailable,
    SchemaError,
    migrate,
)


def test_the_first_clients_create_the_schema_once_even_when_they_start_together(postgres):
    name = unique_name("fresh")
    clients, errors = [], []
    barrier = threading.Barrier(4)

    def start():
        barrier.wait(10)
        try:
            clients.append(Client(postgres.dsn, schema=name, reaper=False))
        except Exception as error:  # noqa: BLE001 - asserted below
            errors.append(error)

    threads = [threading.Thread(target=start) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    try:
        assert errors == [] and len(clients) == 4
        with psycopg.connect(postgres.dsn) as connection:
            rows = connection.execute(f'SELECT version FROM "{name}".schema_migrations').fetchall()
        assert sorted(rows) == [(version,) for version in range(1, SCHEMA_VERSION + 1)]
        assert migrate(postgres.dsn, schema=name) == SCHEMA_VERSION
    finally:
        for client in clients:
            client.close()


def test_a_newer_schema_is_refused_naming_both_versions(postgres):
    name = unique_name("newer")
    migrate(postgres.dsn, schema=name)
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        connection.execute(f"INSERT INTO \"{name}\".schema_migrations VALUES (99, 'from the future')")
    with pytest.raises(SchemaError, match=f"version 99.*version {SCHEMA_VERSION}"):
        Client(postgres.dsn, schema=name)
    with pytest.raises(SchemaError, match="99"):
        migrate(postgres.dsn, schema=name)


def test_without_migrate_a_missing_schema_names_the_command_that_creates_it(postgres):
    with pytest.raises(SchemaError, match="walqueue-ctl --dsn URL migrate"):
        Client(postgres.dsn, schema=unique_name("missing"), migrate=False)


def test_settings_that_lose_answered_writes_are_logged_by_name(make_client, caplog):
    with caplog.at_level(logging.WARNING, logger="walqueue.pg"):
        make_client()
    text = caplog.text
    assert "fsync=off" in text and "synchronous_commit=off" in text  # the session cluster's


def test_a_worker_role_with_the_documented_grants_runs_every_call(postgres):
    role, name = unique_name("worker").replace("-", "_"), unique_name("grants")
    migrate(postgres.dsn, schema=name)
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        connection.execute(f'CREATE ROLE "{role}" LOGIN')
        # Exactly the grants docs/postgres.md gives a worker role.
        connection.execute(f'GRANT USAGE ON SCHEMA "{name}" TO "{role}"')
        connection.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{name}" TO "{role}"')
        connection.execute(f'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA "{name}" TO "{role}"')
    dsn = postgres.dsn.replace("user=postgres", f"user={role}")
    with Client(dsn, schema=name, migrate=False) as client:
        client.put("t", {}, max_attempts=1)
        (lease,) = client.reserve("w", wait=1)
        client.touch(lease, lease_seconds=60)
        client.release(lease)
        client.revive(["t"])
        (lease,) = client.reserve("w")
        assert client.ack_and_reserve(lease) == []
        client.put("f", {})
        client.reserve("w")
        assert client.force_release(["f"]) == ["f"]
        assert client.stats().completed == 1 and client.get("t").status == "completed"
    with pytest.raises(psycopg.errors.InsufficientPrivilege):
        with psycopg.connect(dsn, autocommit=True) as connection:
            connection.execute(f'CREATE TABLE "{name}".nope (x int)')


def test_queues_in_one_database_are_independent(make_client):
    first = make_client()
    second = make_client()
    first.put("t", {"q": 1})
    second.put("t", {"q": 2})  # the same id in another queue: another task
    (lease,) = first.reserve("w")
    assert lease.payload == {"q": 1}
    first.ack(lease)
    assert second.get("t").status == "ready"
    assert second.stats().completed == 0


def _race(first, second, task_id: str, payloads: tuple[dict, dict]) -> list:
    """Two puts of `task_id` released at once by a barrier; their results or KeyConflicts."""
    results: dict[int, object] = {}
    barrier = threading.Barrier(2)

    def put(index: int, client) -> None:
        barrier.wait(10)
        try:
            results[index] = client.put(task_id, payloads[index])
        except KeyConflict as error:
            results[index] = error

    threads = [threading.Thread(target=put, args=(index, client))
               for index, client in enumerate((first, second))]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    return [results[0], results[1]]


def test_two_clients_racing_one_key_resolve_like_serial_puts(make_client):
    first = make_client()
    second = make_client(queue=first.queue)
    for round_number in range(20):
        same_request = round_number % 2 == 0
        payloads = ({"n": 1}, {"n": 1 if same_request else 2})
        results = _race(first, second, f"race{round_number}", payloads)
        outcomes = sorted(type(value).__name__ for value in results)
        assert outcomes == (["str", "str"] if same_request else ["KeyConflict", "str"]), results


def test_payload_integers_across_the_64_bit_range_come_back_and_larger_ones_are_refused(make_client):
    """The same rule as the library's (docs/guarantees.md): 64-bit integers, no larger."""
    from walqueue import InvalidRequest

    client = make_client()
    client.put("t", {"big": 2**64 - 1, "neg": -(2**63)})
    assert client.get("t").payload == {"big": 2**64 - 1, "neg": -(2**63)}
    with pytest.raises(InvalidRequest, match="2\\*\\*64"):
        client.put("u", {"big": 2**70})
    assert client.get("u") is None


def test_an_unreachable_server_is_database_unavailable(tmp_path):
    with pytest.raises(DatabaseUnavailable) as raised:
        Client(f"host={tmp_path} port=1 user=postgres", connect_seconds=1)
    assert isinstance(raised.value, Unavailable) and isinstance(raised.value, ConnectionError)


@pytest.mark.parametrize(("options", "field"), [({"schema": "s" * 55}, "schema"),
                                               ({"queue": "a\x00b"}, "queue"), ({"queue": ""}, "queue")])
def test_bad_queue_and_schema_names_are_refused_by_name(postgres, options, field):
    from walqueue import InvalidRequest

    with pytest.raises(InvalidRequest, match=field):
        Client(postgres.dsn, **options)


def test_a_closed_client_refuses_calls(make_client):
    from walqueue import QueueClosed

    client = make_client()
    client.close()
    client.close()
    with pytest.raises(QueueClosed):
        client.stats()


def test_a_stale_lease_from_another_queue_is_unknown_here(make_client):
    first, second = make_client(), make_client()
    first.put("t", {})
    (lease,) = first.reserve("w")
    with pytest.raises(StaleLease) as stale:
        second.ack(lease)
    assert (stale.value.status, stale.value.generation) == (None, None)


@pytest.mark.parametrize(("command", "tool"), [("verify", "pg_amcheck"), ("backup", "pg_basebackup"),
                                               ("compact", "VACUUM"), ("metrics", "pg_stat")])
def test_the_daemon_only_commands_name_the_postgres_tool(command, tool):
    assert tool in UNSUPPORTED_COMMANDS[command]
    assert set(UNSUPPORTED_COMMANDS) == {"verify", "backup", "compact", "pause", "resume", "metrics"}
