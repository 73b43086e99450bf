"""The PostgreSQL schema of walqueue.pg and its migrations (SPEC §9).

Tables (in one schema, `walqueue` by default; every index leads with `queue`
so one queue's rows never cost another queue a scan):

  task       one row per task ever put, insert-only: the permanent facts
             (task_id, key, identity, max_attempts). Its primary key and the
             unique (queue, key) make ids and keys permanent (SPEC §2).
  live       the hot rows: ready, leased and dead tasks with their counters,
             lease and payload. Partial indexes on the ready and the leased
             rows serve reserve and the reap. A task leaves `live` when it is
             acked, so the table holds only the work in flight, not history.
  completed  insert-only tombstones of acked tasks: their final counters.
  listener   UNLOGGED: processes with a reserve waiting on a queue (see
             walqueue.pg.wakeup); writers NOTIFY only when a row exists,
             because NOTIFY serializes committing transactions.
  schema_migrations  one row per applied migration (version, description).
  task_view  a view: every task with TaskView's fields (get, tasks, and psql).

Ids, keys and workers are bytea holding their UTF-8 (which may contain NUL,
which text cannot), so bytewise order is Python's str order. Payloads are
text holding §4's canonical JSON byte for byte (never jsonb, which reorders).
Times are bigint seconds from `clock()`, the server's transaction time in
whole seconds.

The operation functions (put, reserve, ack, ...) are plpgsql, one per call,
so every call is one statement: one transaction and one round trip. They
raise SQLSTATE WQ001 (KeyConflict), WQ002 (StaleLease, DETAIL is JSON with
status and generation) and WQ003 (InvalidRequest) with nothing changed;
walqueue.pg.calls turns those into the library's exceptions.

The SQL lives in sql/ (package data, read with importlib.resources): one
file per migration, plus the test clock. Each is a template for psycopg's
sql.SQL.format, filled by `compose`: the schema as an sql.Identifier, the
channel and lock key as sql.Literal, and function bodies in a dollar quote
whose tag the schema's name does not hold, so any name calls.schema_name
accepts is only ever a quoted name. A statement that also carries
%-parameters takes the name from `qualified`.

Invariants the functions keep: a task id is in `task` iff it was put; it is
in exactly one of `live` and `completed`; only leased rows have a worker and
a deadline; attempts <= max_attempts, and dead rows have attempts =
max_attempts.
"""

from __future__ import annotations

import hashlib
import itertools
from importlib import resources

from psycopg import Connection, sql

from walqueue.errors import WalQueueError

SCHEMA_VERSION = 1
DEFAULT_SCHEMA = "walqueue"
# The channel the functions NOTIFY on; one per schema, the queue in the payload.
CHANNEL_PREFIX = "walqueue:"


class SchemaError(WalQueueError):
    """The database's walqueue schema is missing, older or newer than this client knows."""


def channel(schema: str) -> str:
    return CHANNEL_PREFIX + schema


def lock_key(schema: str) -> int:
    """The advisory lock key under which a schema is created or migrated."""
    digest = hashlib.sha256(f"walqueue.pg.migrate:{schema}".encode()).digest()
    return int.from_bytes(digest[:8], "big", signed=True)


# The migrations and the test clock are SQL files of this package (sql/),
# templates for psycopg's sql.SQL.format (see `compose`).
SQL_PACKAGE = "walqueue.pg"
SQL_DIRECTORY = "sql"


def sql_text(name: str) -> str:
    """The text of sql/NAME, package data read through importlib.resources."""
    return resources.files(SQL_PACKAGE).joinpath(SQL_DIRECTORY, name).read_text(encoding="utf-8")


# (version, description, file). Append only: a released migration never changes.
MIGRATION_FILES: tuple[tuple[int, str, str], ...] = (
    (1, "tables task, live, completed, listener; the operation functions",
     "0001_tables_and_functions.sql"),
)
# (version, description, template text).
MIGRATIONS: tuple[tuple[int, str, str], ...] = tuple(
    (version, description, sql_text(name)) for version, description, name in MIGRATION_FILES)
assert MIGRATIONS[-1][0] == SCHEMA_VERSION

# A test-only clock (tests/pg): clock() honours the session setting
# walqueue.test_now when set. Installed by install_test_clock(), never by a
# migration, so in production no client can move the queue's clock.
TEST_CLOCK_FILE = "test_clock.sql"
TEST_NOW_SETTING = "walqueue.test_now"


def registration_lock_key(schema: str) -> int:
    """The advisory lock that orders a waiter's registration against writers' NOTIFY checks."""
    return lock_key(schema) ^ 1


def dollar_quote(schema: str) -> sql.SQL:
    """A dollar quote for the function bodies whose tag does not occur in `schema`.

    Identifier quoting does not protect a body: inside `$$ ... $$` a schema
    named `a$$b` would end the body. The tag cannot occur in the channel
    literal either (its prefix holds no `$`) nor span a quoted name's edge.
    """
    for number in itertools.count():
        tag = f"$wq{number or ''}$"
        if tag not in schema:
            return sql.SQL(tag)
    raise AssertionError("unreachable")


def compose(template: str, schema: str) -> sql.Composed:
    """`template` (a migration, or the test clock) with its placeholders filled for `schema`."""
    return sql.SQL(template).format(schema=sql.Identifier(schema),
                                    channel=sql.Literal(channel(schema)),
                                    lock=sql.Literal(registration_lock_key(schema)),
                                    dollar=dollar_quote(schema))


def qualified(schema: str, name: str) -> str:
    """`"schema"."name"` for statement text that also holds %-placeholders.

    psycopg parses the whole text of a statement with parameters for `%`
    placeholders, and does not escape a `%` inside an identifier
    (psycopg/psycopg2#825, the same in psycopg 3), so it is doubled here.
    Only for statements run with parameters: without them psycopg sends the
    text as it is.
    """
    return sql.Identifier(schema, name).as_string(None).replace("%", "%%")


def installed_version(connection: Connection, schema: str) -> int | None:
    """The schema's highest applied migration, or None if there is no walqueue schema."""
    row = connection.execute(
        "SELECT to_regclass(%s) IS NOT NULL",
        (sql.Identifier(schema, "schema_migrations").as_string(connection),)).fetchone()
    if not row[0]:
        return None
    query = sql.SQL("SELECT coalesce(max(version), 0) FROM {}").format(
        sql.Identifier(schema, "schema_migrations"))
    return connection.execute(query).fetchone()[0]


def check_version(version: int | None, schema: str) -> None:
    """Raise SchemaError unless `version` is the one this client speaks."""
    if version is None:
        raise SchemaError(f"the database has no walqueue schema {schema!r}: create it with "
                          f"`walqueue-ctl --dsn URL migrate` or a Client with migrate=True")
    if version > SCHEMA_VERSION:
        raise SchemaError(f"schema {schema!r} is at version {version}, newer than this walqueue "
                          f"knows (version {SCHEMA_VERSION}): upgrade walqueue on this host")
    if version < SCHEMA_VERSION:
        raise SchemaError(f"schema {schema!r} is at version {version}; this walqueue needs "
                          f"version {SCHEMA_VERSION}: run `walqueue-ctl --dsn URL migrate`")


def migrate_connection(connection: Connection, schema: str) -> int:
    """Create or upgrade `schema` to SCHEMA_VERSION under an advisory lock; returns the version.

    `connection` must be in autocommit mode. Each migration is one
    transaction. Raises SchemaError for a schema newer than this code knows
    or a database whose encoding is not UTF8 (payloads are UTF-8 text).
    """
    encoding = connection.execute("SHOW server_encoding").fetchone()[0]
    if encoding.upper() not in ("UTF8", "UTF-8"):
        raise SchemaError(f"the database's encoding is {encoding}, not UTF8: walqueue stores "
                          f"payloads as UTF-8 text; create the database with ENCODING 'UTF8'")
    key = lock_key(schema)
    connection.execute("SELECT pg_advisory_lock(%s)", (key,))
    try:
        version = installed_version(connection, schema)
        if version is not None and version > SCHEMA_VERSION:
            check_version(version, schema)
        for number, description, body in MIGRATIONS:
            if number <= (version or 0):
                continue
            with connection.transaction():
                if version is None:
                    # In the first migration's transaction, so a failing one
                    # leaves no empty schema behind.
                    connection.execute(sql.SQL("CREATE SCHEMA IF NOT EXISTS {}").format(
                        sql.Identifier(schema)))
                    connection.execute(sql.SQL(
                        "CREATE TABLE IF NOT EXISTS {} (version integer PRIMARY KEY, "
                        "description text NOT NULL, applied_at timestamptz NOT NULL DEFAULT now())"
                    ).format(sql.Identifier(schema, "schema_migrations")))
                connection.execute(compose(body, schema), prepare=False)
                connection.execute(
                    sql.SQL("INSERT INTO {} (version, description) VALUES ({}, {})").format(
                        sql.Identifier(schema, "schema_migrations"), sql.Literal(number),
                        sql.Literal(description)))
            version = number
        return version
    finally:
        connection.execute("SELECT pg_advisory_unlock(%s)", (key,))


def install_test_clock(connection: Connection, schema: str) -> None:
    """Test-only: make clock() honour the session setting walqueue.test_now.

    Needs the schema owner's rights (a worker role cannot do it). Production
    databases must never run this: with it any session can move its clock.
    """
    connection.execute(compose(sql_text(TEST_CLOCK_FILE), schema), prepare=False)
