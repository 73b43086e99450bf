"""The PostgreSQL schema of walqueue.pg, its migrations and its versions (SPEC §9).

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
  schema_migrations  one row per applied migration (version, description,
             compatibility_version).
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

Migrations are the numbered files sql/migrations/NNNN_*.sql (package data,
composed by walqueue.pg.queries), listed in MIGRATION_FILES. Append only: a
released migration never changes; a new one is a new file. Each has a
version (its number) and a compatibility version: the oldest schema version
whose clients can use a schema at this one. A migration that only adds (a
function, a column with a default, an index) keeps the compatibility
version of the one before it, so hosts whose walqueue is older go on
working; one that changes or removes what older clients call raises it to
its own version.

Which schema a client accepts (`check_version`), reading SPEC §9's "a client
refuses, with a message naming both versions, a schema newer than it knows"
as "newer, and incompatible": with this walqueue's SCHEMA_VERSION K and the
installed schema's version V and compatibility version C,

1. no schema: refused, naming `walqueue-ctl --dsn URL migrate`;
2. V < K: older; a client with migrate=True upgrades it first, else refused,
   naming the command that does;
3. V >= K and C <= K: accepted (V > K is a newer but compatible schema: an
   older host goes on while the newer ones use what was added);
4. C > K: refused, naming both versions (upgrade walqueue on this host).

Invariants the functions keep: a task id is in `task` iff it was put; it is
in exactly one of `live` and `completed`; only leased rows have a worker and
a deadline; attempts <= max_attempts, and dead rows have attempts =
max_attempts.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from psycopg import Connection

from walqueue.errors import WalQueueError
from walqueue.pg.queries import MIGRATIONS_DIRECTORY, Queries, compose, lock_key, sql_text

DEFAULT_SCHEMA = "walqueue"
# The bookkeeping queries, in sql/schema.sql.
BOOKKEEPING_FILE = "schema.sql"


class SchemaError(WalQueueError):
    """The database's walqueue schema is missing, older than this client needs, or newer and
    incompatible with it."""


@dataclass(frozen=True)
class Migration:
    """One numbered migration: its version, description, compatibility version and SQL template."""

    version: int
    description: str
    compatibility: int
    body: str


# (version, compatibility version, description, file in sql/migrations/). Append only.
MIGRATION_FILES: tuple[tuple[int, int, str, str], ...] = (
    (1, 1, "tables task, live, completed, listener; the operation functions",
     "0001_tables_and_functions.sql"),
    (2, 1, "index live_status_task: tasks of one live status in pages (SPEC §8b)",
     "0002_listing_index.sql"),
    (3, 1, "table expiry_count and reap counting the leases it expires (the dashboard's rate)",
     "0003_expiry_counts.sql"),
)
MIGRATIONS: tuple[Migration, ...] = tuple(
    Migration(version, description, compatibility, sql_text(MIGRATIONS_DIRECTORY, name))
    for version, compatibility, description, name in MIGRATION_FILES)
SCHEMA_VERSION = MIGRATIONS[-1].version
COMPATIBILITY_VERSION = MIGRATIONS[-1].compatibility


def check_migrations(files: tuple[tuple[int, int, str, str], ...]) -> None:
    """Raise AssertionError unless the migrations are numbered 1, 2, ... by their file names and
    each one's compatibility version is at least the one before's and at most its own version."""
    previous = 1
    for index, (version, compatibility, _, name) in enumerate(files, 1):
        number = re.match(r"(\d{4})_", name)
        assert number is not None and int(number[1]) == version == index, (
            f"migration {name} must be number {index}")
        assert previous <= compatibility <= version, (
            f"migration {name}: compatibility version {compatibility} is not in [{previous}, {version}]")
        previous = compatibility


check_migrations(MIGRATION_FILES)


@dataclass(frozen=True)
class Installed:
    """An installed schema's version and compatibility version (see the module docstring)."""

    version: int
    compatibility: int


def installed_of(rows: list[tuple]) -> Installed:
    """The rows of the `installed` query as an Installed. A row without a compatibility version
    (one written before there was one) counts as compatible with its own version only."""
    if not rows:
        return Installed(0, 0)
    version, compatibility = rows[0]
    return Installed(version, version if compatibility is None else compatibility)


def bookkeeping(schema: str) -> Queries:
    return Queries(BOOKKEEPING_FILE, schema)


def installed_version(connection: Connection, schema: str) -> Installed | None:
    """The schema's newest migration, or None if there is no walqueue schema."""
    queries = bookkeeping(schema)
    if not connection.execute(queries.exists, (schema,)).fetchone()[0]:
        return None
    return installed_of(connection.execute(queries.installed).fetchall())


def needs_migration(installed: Installed | None) -> bool:
    """True if migrating would change the schema: it is missing or older than this walqueue."""
    return installed is None or installed.version < SCHEMA_VERSION


def check_version(installed: Installed | None, schema: str) -> None:
    """Raise SchemaError unless this client can use the schema (rules 1-4 of the module docstring)."""
    if installed is None:
        raise SchemaError(f"the database has no walqueue schema {schema!r}: create it with "
                          f"`walqueue-ctl --dsn URL migrate` or a Client with migrate=True")
    if installed.compatibility > SCHEMA_VERSION:
        raise SchemaError(f"schema {schema!r} is at version {installed.version}, which clients "
                          f"before version {installed.compatibility} cannot use; this walqueue "
                          f"knows version {SCHEMA_VERSION}: upgrade walqueue on this host")
    if installed.version < SCHEMA_VERSION:
        raise SchemaError(f"schema {schema!r} is at version {installed.version}; this walqueue "
                          f"needs version {SCHEMA_VERSION}: run `walqueue-ctl --dsn URL migrate`")


def migrate_connection(connection: Connection, schema: str) -> Installed:
    """Create or upgrade `schema` to SCHEMA_VERSION under an advisory lock; returns what is installed.

    `connection` must be in autocommit mode. Each migration is one
    transaction. A newer schema this walqueue can use is left as it is.
    Raises SchemaError for a newer schema it cannot use, or a database
    whose encoding is not UTF8 (payloads are UTF-8 text).
    """
    queries = bookkeeping(schema)
    encoding = connection.execute(queries.encoding).fetchone()[0]
    if encoding.upper() not in ("UTF8", "UTF-8"):
        raise SchemaError(f"the database's encoding is {encoding}, not UTF8: walqueue stores "
                          f"payloads as UTF-8 text; create the database with ENCODING 'UTF8'")
    key = lock_key(schema)
    connection.execute(queries.lock, (key,))
    try:
        installed = installed_version(connection, schema)
        if installed is not None and installed.version >= SCHEMA_VERSION:
            check_version(installed, schema)
            return installed
        for migration in MIGRATIONS:
            if installed is not None and migration.version <= installed.version:
                continue
            with connection.transaction():
                if installed is None:
                    # In the first migration's transaction, so a failing one
                    # leaves no empty schema behind.
                    connection.execute(queries.create_schema)
                    connection.execute(queries.create_migrations_table)
                else:
                    connection.execute(queries.add_compatibility_column)
                connection.execute(compose(migration.body, schema), prepare=False)
                connection.execute(queries.record_migration,
                                   (migration.version, migration.description, migration.compatibility))
            installed = Installed(migration.version, migration.compatibility)
        return installed
    finally:
        connection.execute(queries.unlock, (key,))
