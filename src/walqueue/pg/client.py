"""`walqueue.pg.Client`: SPEC §9's blocking client over PostgreSQL, the sync shell of walqueue.pg.api.

The methods, options and every decision are walqueue.pg.api's `ClientApi`;
this module owns the I/O: a pool of connections (psycopg_pool, autocommit,
statements prepared on first use) so threads can share one Client, opened
(and the schema checked or migrated) in the constructor; running one
statement; sleeping; waiting on a threading.Event for a wake-up.

Retries: serialization failures and deadlocks are retried inside the call.
After DatabaseUnavailable the reads and `put`/`put_many` are
sent again for up to `retry_seconds` (walqueue.retry, the rule both
backends share); `reserve`, `ack_and_reserve`, `ack`, `release`, `touch` and
`revive` are not: their outcome is unknown, and walqueue.worker tells a
completed ack from a lost lease by the StaleLease it gets when it retries.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from walqueue.pg.api import CONNECTION_KWARGS, ClientApi, Steps, drive
from walqueue.pg.calls import Call, DatabaseUnavailable
from walqueue.pg.refusals import refusal


class Connection(psycopg.Connection):
    """A pooled connection that keeps one binary cursor for the calls.

    A cursor made per call, and asking it for its `description`, cost the
    client more CPU than sending the call and reading its answer.
    """

    _call_cursor: psycopg.Cursor | None = None

    def call_cursor(self) -> psycopg.Cursor:
        if self._call_cursor is None:
            self._call_cursor = self.cursor(binary=True)
        return self._call_cursor


class Client(ClientApi):
    """SPEC §9's client for one queue: walqueue.pg.api's methods and options, blocking."""

    def _init_shell(self) -> None:
        self._pool = ConnectionPool(self.dsn, connection_class=Connection, min_size=1,
                                    max_size=self._pool_size, kwargs=CONNECTION_KWARGS, open=False,
                                    timeout=self.connect_seconds, name=f"walqueue:{self.queue}")
        try:
            self._refuse_incurable()
            self._pool.open(wait=True, timeout=self.connect_seconds)
            drive(self._setting_up(), self)
            self._ready = True
        except PoolTimeout as error:
            self._close_now()
            raise DatabaseUnavailable(f"cannot connect to PostgreSQL at {self.where} within "
                                      f"{self.connect_seconds} s") from error
        except BaseException:
            self._close_now()
            raise

    def _refuse_incurable(self) -> None:
        """One connection first: a refusal no retry cures is raised now, not after
        connect_seconds of the pool's attempts (walqueue.pg.refusals)."""
        try:
            psycopg.connect(self.dsn, autocommit=True,
                            connect_timeout=max(1, int(self.connect_seconds))).close()
        except psycopg.Error as error:
            refused = refusal(error, self.dsn, self.where)
            if refused is not None:
                raise refused from None  # the cause would print the DSN's words again
            # Anything else (a server not up yet): the pool waits for it, as before.

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close the pool; later calls raise QueueClosed. Idempotent."""
        if self._closing():
            self._pool.close()

    def _close_now(self) -> None:
        self._closing()
        self._pool.close()

    # -- the steps (walqueue.pg.api) ----------------------------------------------------

    def _run(self, make: Callable[..., Steps], /, *args: Any, **kwargs: Any) -> Any:
        return drive(make(*args, **kwargs), self)

    def _execute(self, call: Call) -> list[tuple]:
        with self._pool.connection(timeout=self.connect_seconds) as connection:
            return connection.call_cursor().execute(call.statement, call.params).fetchall()

    def _blocking(self, function: Callable[[], Any]) -> Any:
        return function()

    def _sleep(self, seconds: float) -> None:
        time.sleep(seconds)

    def _new_event(self) -> tuple[threading.Event, Callable[[], None]]:
        event = threading.Event()
        return event, event.set

    def _wait_for(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(seconds)
