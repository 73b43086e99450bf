"""Schema versions: a client runs on a newer schema it is compatible with, and refuses one it is not.

SPEC §9's "a client refuses, with a message naming both versions, a schema
newer than it knows" is read as "newer and incompatible" (walqueue.pg.schema):
each migration records a compatibility version, the oldest schema version
whose clients can use it, so a migration that only adds (a function, say)
does not force every host to upgrade walqueue at once.

What it proves: a schema one additive migration ahead of this walqueue (as
the next release would leave it: version 2, compatibility version 1, one
function more) is used in full by this walqueue's Client and AsyncClient,
with or without migrate, and `migrate()` leaves it as it is; a schema whose
compatibility version is newer than this walqueue is refused by both
clients and by `migrate()`, naming both versions; the migrations of a newer
walqueue (MIGRATIONS patched to hold one more) upgrade an older schema,
including one made before schema_migrations had its compatibility_version
column, and record the compatibility version they declare.
"""

from __future__ import annotations

import asyncio
import dataclasses

import psycopg
import pytest

from tests.postgres import unique_name
from walqueue.pg import SCHEMA_VERSION, AsyncClient, Client, SchemaError, migrate, schema

LATER = SCHEMA_VERSION + 1
LATER_FUNCTION = "CREATE FUNCTION {schema}.later() RETURNS integer LANGUAGE sql AS {dollar} SELECT 2 {dollar}"


def ahead(dsn: str, name: str, compatibility: int) -> None:
    """Make schema `name` look migrated by the next walqueue: one migration more, with `compatibility`.

    Plain SQL, as that release's migration would run it (it may add the
    compatibility_version column to a table an older walqueue made).
    """
    with psycopg.connect(dsn, autocommit=True) as connection, connection.transaction():
        connection.execute(f'ALTER TABLE "{name}".schema_migrations '
                           f'ADD COLUMN IF NOT EXISTS compatibility_version integer')
        connection.execute(f'CREATE FUNCTION "{name}".later() RETURNS integer LANGUAGE sql AS $$ SELECT 2 $$')
        connection.execute(f'INSERT INTO "{name}".schema_migrations (version, description, '
                           f'compatibility_version) VALUES (%s, %s, %s)',
                           (LATER, "a function more", compatibility))


def round_trip(client: Client) -> None:
    client.put("t", {"n": 1})
    (lease,) = client.reserve("w")
    client.ack(lease)
    assert client.get("t").status == "completed"


def test_an_older_client_runs_on_a_newer_compatible_schema(postgres):
    name = unique_name("ahead")
    migrate(postgres.dsn, schema=name)
    ahead(postgres.dsn, name, compatibility=SCHEMA_VERSION)
    for options in ({"migrate": False}, {"migrate": True}):
        with Client(postgres.dsn, schema=name, queue=unique_name("q"), reaper=False, **options) as client:
            round_trip(client)
    assert migrate(postgres.dsn, schema=name) == LATER  # nothing to do: it is left as it is

    async def main():
        async with AsyncClient(postgres.dsn, schema=name, queue=unique_name("q"), migrate=False) as client:
            assert await client.put("a", {}) == "a"
            assert (await client.stats()).ready == 1

    asyncio.run(main())
    with psycopg.connect(postgres.dsn) as connection:
        versions = connection.execute(f'SELECT version FROM "{name}".schema_migrations ORDER BY 1').fetchall()
    assert versions == [(version,) for version in range(1, SCHEMA_VERSION + 1)] + [(LATER,)]


def test_a_newer_incompatible_schema_is_refused_naming_both_versions(postgres):
    name = unique_name("breaking")
    migrate(postgres.dsn, schema=name)
    ahead(postgres.dsn, name, compatibility=LATER)
    expected = f"version {LATER}.*this walqueue knows version {SCHEMA_VERSION}"
    for options in ({"migrate": False}, {"migrate": True}):
        with pytest.raises(SchemaError, match=expected):
            Client(postgres.dsn, schema=name, reaper=False, **options)
    with pytest.raises(SchemaError, match=expected):
        migrate(postgres.dsn, schema=name)

    async def main():
        with pytest.raises(SchemaError, match=expected):
            async with AsyncClient(postgres.dsn, schema=name):
                pass

    asyncio.run(main())


@pytest.mark.parametrize("made_by", ["this walqueue", "a walqueue before compatibility versions"])
def test_a_newer_walqueue_migrates_an_older_schema_and_records_its_compatibility(
        postgres, monkeypatch, made_by):
    name = unique_name("older")
    migrate(postgres.dsn, schema=name)
    if made_by != "this walqueue":
        with psycopg.connect(postgres.dsn, autocommit=True) as connection:
            connection.execute(f'ALTER TABLE "{name}".schema_migrations DROP COLUMN compatibility_version')
        with Client(postgres.dsn, schema=name, reaper=False, migrate=False) as client:
            round_trip(client)  # read as version 1, compatible with version 1
    with monkeypatch.context() as patch:
        patch.setattr(schema, "MIGRATIONS",
                      (*schema.MIGRATIONS, schema.Migration(LATER, "a function more", SCHEMA_VERSION,
                                                            LATER_FUNCTION)))
        patch.setattr(schema, "SCHEMA_VERSION", LATER)
        with pytest.raises(SchemaError, match=f"version {SCHEMA_VERSION}; this walqueue needs version {LATER}"):
            Client(postgres.dsn, schema=name, reaper=False, migrate=False)
        with Client(postgres.dsn, schema=name, queue=unique_name("q"), reaper=False) as client:  # migrates
            round_trip(client)
    with psycopg.connect(postgres.dsn) as connection:
        rows = connection.execute(f'SELECT version, compatibility_version FROM "{name}".schema_migrations '
                                  f'ORDER BY 1').fetchall()
        assert connection.execute(f'SELECT "{name}".later()').fetchone() == (2,)
    assert rows[-1] == (LATER, SCHEMA_VERSION)
    # And this walqueue, older again, goes on using it.
    with Client(postgres.dsn, schema=name, queue=unique_name("q"), reaper=False, migrate=False) as client:
        round_trip(client)


def test_the_migrations_are_numbered_and_their_compatibility_never_goes_back():
    schema.check_migrations(schema.MIGRATION_FILES)
    good = schema.MIGRATION_FILES[0]
    for files, problem in (
            (((2, 1, "x", "0002_x.sql"),), "must be number 1"),
            (((1, 1, "x", "0001_x.sql"), (2, 3, "y", "0002_y.sql")), r"not in \[1, 2\]"),
            ((good, (2, 2, "y", "0002_y.sql"), (3, 1, "z", "0003_z.sql")), r"not in \[2, 3\]"),
            ((good, (2, 1, "y", "y.sql")), "must be number 2")):
        with pytest.raises(AssertionError, match=problem):
            schema.check_migrations(files)
    assert dataclasses.astuple(schema.MIGRATIONS[0])[:3] == (1, good[2], 1)
