"""The test clock of tests/pg: a schema whose clock() a test sets, and a Client that follows it.

Production walqueue.pg has no way to move a queue's clock (SPEC §9: clients
cannot set `now`): the SQL that does (tests/pg/clock.sql) lives here and is
installed only by `install_test_clock`, in a schema of the test's own. A
`SettableClock` sets it from its own connection (committed, so every call
after it reads that time); a `ClockedClient` (`ClockedAsyncClient`) is a
walqueue.pg.Client (AsyncClient) whose estimate of the server's clock is that
time, for `put(delay=)` and waits.
"""

from __future__ import annotations

from pathlib import Path

import psycopg
from psycopg import sql

from walqueue.pg import AsyncClient, Client
from walqueue.pg.queries import compose

CLOCK_SQL = Path(__file__).with_name("clock.sql")


def install_test_clock(connection: psycopg.Connection, schema: str) -> None:
    """Make `schema`'s clock() read the test clock (needs the schema owner's rights)."""
    connection.execute(compose(CLOCK_SQL.read_text(encoding="utf-8"), schema), prepare=False)


class SettableClock:
    """Sets the test clock of one schema; `now` is the time set (None: the server's own)."""

    def __init__(self, dsn: str, schema: str) -> None:
        self.connection = psycopg.connect(dsn, autocommit=True)
        self.update = sql.SQL("UPDATE {} SET now = %s").format(sql.Identifier(schema, "test_clock"))
        self.now: int | None = None

    def set(self, now: int | None) -> None:
        self.connection.execute(self.update, (now,))
        self.now = now

    def close(self) -> None:
        self.connection.close()


class _Clocked:
    """server_time() is `clock`'s time while one is set (put(delay=) and waits read it)."""

    clock: SettableClock

    def server_time(self) -> float:
        if self.clock.now is not None:
            return float(self.clock.now)
        return super().server_time()


class ClockedClient(_Clocked, Client):
    """A walqueue.pg.Client that follows `clock`."""

    def __init__(self, dsn: str, *, clock: SettableClock, **options) -> None:
        self.clock = clock
        super().__init__(dsn, **options)


class ClockedAsyncClient(_Clocked, AsyncClient):
    """A walqueue.pg.AsyncClient that follows `clock`."""

    def __init__(self, dsn: str, *, clock: SettableClock, **options) -> None:
        self.clock = clock
        super().__init__(dsn, **options)
