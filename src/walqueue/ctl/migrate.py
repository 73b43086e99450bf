"""walqueue-ctl --dsn URL migrate: create or upgrade the walqueue schema on PostgreSQL.

The only command that changes a schema: the others connect with
migrate=False (walqueue.ctl.backends), so a mistyped DSN or a worker role
never creates one.
"""

from __future__ import annotations

from walqueue import WalQueueError
from walqueue.ctl.backends import Ctl, postgres_backend
from walqueue.ctl.errors import (
    EXIT_FAILURE,
    EXIT_OK,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CtlError,
    error_for,
)
from walqueue.ctl.group import JSON_ALREADY, command, json_option, pass_ctl
from walqueue.ctl.output import emit


@command(EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_UNAVAILABLE,
         short_help="Create or upgrade the walqueue schema on PostgreSQL (--dsn).")
@json_option(JSON_ALREADY)
@pass_ctl
def migrate(ctl: Ctl, as_json: bool) -> None:
    """Create or upgrade the walqueue schema in the --dsn database. Prints {"schema_version": N}.

    Run it as a role that may create the schema (a worker role needs no
    DDL: docs/postgres.md lists its grants). Safe to run from several hosts
    at once, and again: an up-to-date schema is left as it is. A schema newer
    than this walqueue knows is refused, naming both versions.
    """
    if ctl.dsn is None:
        raise CtlError("migrate is for a queue on PostgreSQL: give --dsn URL (or WALQUEUE_DSN); "
                       "walqueued's directory needs no migration", EXIT_USAGE, "UsageError")
    backend = postgres_backend()
    try:
        version = backend.migrate(ctl.dsn)
    except (WalQueueError, OSError) as exc:
        raise error_for(exc, ctl.socket_path, ctl.dsn) from exc
    emit({"schema_version": version})
