"""walqueue.pg counts expired leases (schema version 3, for walqueue-web's expiries per second):
every reap that expires a lease, a reserve's or the reaper's, adds to its queue's count in its
own transaction; `expired_total()` reads it, queue by queue, through a function a role with the
grants docs/postgres.md lists may call (tests/pg/test_client.py runs calls as such a role).
"""

from __future__ import annotations

import psycopg

from tests.pg.clock import ClockedClient, SettableClock, install_test_clock
from tests.postgres import unique_name
from walqueue.pg import schema


def test_reaps_count_the_leases_they_expire_per_queue(postgres):
    name = unique_name("expiries")
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        schema.migrate_connection(connection, name)
        install_test_clock(connection, name)
    clock = SettableClock(postgres.dsn, name)
    options = dict(clock=clock, schema=name, migrate=False, reaper=False)
    with ClockedClient(postgres.dsn, queue="one", **options) as one, \
            ClockedClient(postgres.dsn, queue="two", **options) as two:
        clock.set(1000)
        assert one.expired_total() == 0
        one.put("a", {})
        one.put("last", {}, max_attempts=1)
        two.put("b", {})
        one.reserve("w", lease_seconds=30, limit=2)
        two.reserve("w", lease_seconds=30)
        clock.set(1030)
        assert one.reserve("w", lease_seconds=30) != []   # its reap expires a and last (to dead)
        assert (one.expired_total(), two.expired_total()) == (2, 0)
        assert one.get("last").status == "dead"
        with psycopg.connect(postgres.dsn, autocommit=True) as connection:   # the reaper's statement
            connection.execute(f'SELECT "{name}".reap(%s, 1030)', ("two",))
        assert (one.expired_total(), two.expired_total()) == (2, 1)
    clock.close()


def test_a_role_granted_before_the_count_existed_still_expires_and_reads_it(postgres, monkeypatch):
    # Grants given at schema version 2 (docs/postgres.md's), then migration 3: the role's reserves
    # go on reaping, and reading the count needs nothing more (SECURITY DEFINER functions).
    role, name = unique_name("older").replace("-", "_"), unique_name("granted")
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        with monkeypatch.context() as patched:
            patched.setattr(schema, "MIGRATIONS", schema.MIGRATIONS[:2])
            schema.migrate_connection(connection, name)
        connection.execute(f'CREATE ROLE "{role}" LOGIN')
        connection.execute(f'GRANT USAGE ON SCHEMA "{name}" TO "{role}"')
        connection.execute(f'GRANT SELECT, INSERT, UPDATE, DELETE ON ALL TABLES IN SCHEMA "{name}" TO "{role}"')
        connection.execute(f'GRANT EXECUTE ON ALL FUNCTIONS IN SCHEMA "{name}" TO "{role}"')
        assert schema.migrate_connection(connection, name).version == schema.SCHEMA_VERSION
        install_test_clock(connection, name)
        connection.execute(f'GRANT SELECT ON "{name}".test_clock TO "{role}"')   # the test's, not ours
    clock = SettableClock(postgres.dsn, name)
    dsn = postgres.dsn.replace("user=postgres", f"user={role}")
    with ClockedClient(dsn, clock=clock, queue="q", schema=name, migrate=False, reaper=False) as client:
        clock.set(1000)
        client.put("t", {})
        client.reserve("w", lease_seconds=5)
        clock.set(1005)
        (again,) = client.reserve("w", lease_seconds=5)
        assert again.attempts == 2 and client.expired_total() == 1
    clock.close()


def test_the_async_client_reads_the_count_too(postgres):
    import asyncio

    from walqueue.pg import AsyncClient

    async def main() -> int:
        async with AsyncClient(postgres.dsn, queue=unique_name("aio")) as client:
            return await client.expired_total()

    assert asyncio.run(main()) == 0
