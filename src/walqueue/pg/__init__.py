"""walqueue.pg: the same queue on PostgreSQL (SPEC §9).

Needs the extra walqueue[postgres] (psycopg 3 and psycopg-pool). Public names:

- `Client(dsn, *, queue="default", schema="walqueue", migrate=True)` and
  `AsyncClient` (the same methods as coroutines): the library's API, with
  the database server's clock;
- `DatabaseUnavailable` (a `walqueue.errors.Unavailable`), `SchemaError`,
  `DatabaseRefused` (a refusal no retry cures: raised at once);
- `migrate(dsn, schema=...)`: create or upgrade the schema (what
  `walqueue-ctl --dsn URL migrate` runs);
- `UNSUPPORTED_COMMANDS`: the walqueue-ctl commands that have no meaning on
  PostgreSQL, each with the message saying what to use instead (exit 2).

Modules: api (SPEC §9's methods and every decision of a call, written once),
client and aio (its sync and asyncio shells: the pools and the I/O), calls
(validation, statements and conversion without I/O), queries (the SQL files
of sql/, loaded once and composed for a schema), schema (migrations and the
version rule), wakeup (LISTEN, waiters, the reaper). Which calls are sent
again after a lost answer is walqueue.retry's, shared with walqueue.client.
"""

from __future__ import annotations

import psycopg

from walqueue.dsn import redacted
from walqueue.pg import pool_log
from walqueue.pg.aio import AsyncClient
from walqueue.pg.calls import DatabaseUnavailable, check_dsn, describe, schema_name
from walqueue.pg.client import Client
from walqueue.pg.refusals import DatabaseRefused, refusal
from walqueue.pg.schema import DEFAULT_SCHEMA, SCHEMA_VERSION, SchemaError, migrate_connection

pool_log.install()  # the pool's warnings about walqueue's pools: one per outage

__all__ = ["UNSUPPORTED_COMMANDS", "AsyncClient", "Client", "DatabaseRefused", "DatabaseUnavailable",
           "SCHEMA_VERSION", "SchemaError", "migrate"]

# walqueue-ctl --dsn: the daemon-only commands, and what to use on PostgreSQL.
UNSUPPORTED_COMMANDS = {
    "verify": "verify checks a walqueued directory; PostgreSQL checks its own data: "
              "use pg_amcheck (and data checksums)",
    "backup": "backup copies a walqueued directory; for PostgreSQL use pg_basebackup "
              "(or pg_dump --schema walqueue)",
    "compact": "there is no WAL of walqueue's to compact on PostgreSQL; VACUUM (autovacuum) "
               "reclaims dead rows",
    "pause": "pause is a walqueued feature; on PostgreSQL stop the workers, or REVOKE EXECUTE "
             "on the schema's reserve functions from the worker role",
    "resume": "resume is a walqueued feature; on PostgreSQL start the workers again, or GRANT "
              "EXECUTE back",
    "metrics": "metrics is walqueued's own report; on PostgreSQL use `stats` and the statistics "
               "views (pg_stat_user_tables, pg_stat_activity), e.g. through postgres_exporter",
}


def migrate(dsn: str, *, schema: str = DEFAULT_SCHEMA) -> int:
    """Create or upgrade the walqueue schema in the database at `dsn`; returns its version.

    Safe to run from several hosts at once (an advisory lock serializes
    them). A newer schema this walqueue can use is left as it is (its
    version is returned). Raises SchemaError if the schema is newer and
    incompatible (walqueue.pg.schema) or the database is not UTF8,
    DatabaseUnavailable if PostgreSQL cannot be reached, DatabaseRefused if
    it refuses the connection (no such database, a refused login),
    InvalidRequest if libpq cannot parse `dsn`.
    """
    schema = schema_name(schema)
    check_dsn(dsn)
    try:
        with psycopg.connect(dsn, autocommit=True, connect_timeout=10) as connection:
            return migrate_connection(connection, schema).version
    except psycopg.OperationalError as error:
        refused = refusal(error, dsn, describe(dsn))
        if refused is not None:
            raise refused from None
        raise DatabaseUnavailable(f"PostgreSQL at {describe(dsn)}: {redacted(str(error), dsn)}") from error
