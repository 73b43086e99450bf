"""Deliberately broken variants of the PostgreSQL schema, which the tests must catch.

Each variant is the real migration template (sql/migrations/0001_tables_and_functions.sql,
as schema.MIGRATIONS holds it) with one text replacement, installed in a
schema of its own (`broken_schema`), so the clients run unchanged against it:

- wrong_order: reserve leases in (available_at, task_id) DESCENDING order;
- ack_without_generation: a lease is current whatever its generation
  (a late ack from an earlier lease of the same worker completes the task);
- reserve_without_locking: reserve neither locks the rows it picks (no
  FOR UPDATE SKIP LOCKED) nor re-checks their status when it updates them,
  so two concurrent reserves can lease one task.
"""

from __future__ import annotations

import contextlib
import dataclasses

import psycopg

from tests.postgres import unique_name
from walqueue.pg import schema

VARIANTS = {
    "wrong_order": [("ORDER BY l.available_at, l.task_id", "ORDER BY l.available_at DESC, l.task_id DESC"),
                    ("ORDER BY leased.available_at, leased.task_id",
                     "ORDER BY leased.available_at DESC, leased.task_id DESC")],
    "ack_without_generation": [("OR v_row.generation <> p_generation", "")],
    "reserve_without_locking": [("        LIMIT p_limit\n        FOR UPDATE SKIP LOCKED",
                                 "        LIMIT p_limit"),
                                (" AND l.task_id = picked.task_id AND l.status = 'ready'",
                                 " AND l.task_id = picked.task_id")],
}


def broken_body(variant: str) -> str:
    body = schema.MIGRATIONS[0].body
    for old, new in VARIANTS[variant]:
        assert old in body, f"variant {variant}: {old!r} is not in the migration any more"
        body = body.replace(old, new)
    return body


@contextlib.contextmanager
def broken_schema(server, variant: str, monkeypatch):
    """A fresh schema holding `variant`; yields its name."""
    name = unique_name(f"broken-{variant}")
    with monkeypatch.context() as patch:
        # The variant replaces migration 1; the later ones (they only add) follow it.
        patch.setattr(schema, "MIGRATIONS",
                      (dataclasses.replace(schema.MIGRATIONS[0], body=broken_body(variant)),
                       *schema.MIGRATIONS[1:]))
        with psycopg.connect(server.dsn, autocommit=True) as connection:
            schema.migrate_connection(connection, name)
    yield name
