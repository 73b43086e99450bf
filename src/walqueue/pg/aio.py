"""`walqueue.pg.AsyncClient`: walqueue.pg.Client's methods as coroutines, the asyncio shell of walqueue.pg.api.

The same methods, options, calls, retries and error mapping as the sync
Client, because they are the same code (walqueue.pg.api's `ClientApi`);
this module owns the I/O: psycopg_pool's AsyncConnectionPool, so
concurrent coroutines use several connections at once, opened (and the
schema checked or migrated) on the first call or on `async with`; a
waiting reserve sleeps on an asyncio.Event that the process's
wakeup.Service thread sets through the event loop; synchronous work (a
migration, waiting for the listener) runs in a thread. An AsyncClient
belongs to one event loop.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from walqueue.errors import QueueClosed
from walqueue.pg.api import (
    CONNECTION_KWARGS,
    ClientApi,
    Steps,
    drive_async,
)
from walqueue.pg.calls import Call, DatabaseUnavailable
from walqueue.pg.refusals import refusal


class AsyncConnection(psycopg.AsyncConnection):
    """A pooled connection that keeps one binary cursor for the calls (as client.Connection)."""

    _call_cursor: psycopg.AsyncCursor | None = None

    def call_cursor(self) -> psycopg.AsyncCursor:
        if self._call_cursor is None:
            self._call_cursor = self.cursor(binary=True)
        return self._call_cursor


class AsyncClient(ClientApi):
    """SPEC §9's asyncio client for one queue: walqueue.pg.api's methods and options, as coroutines."""

    def _init_shell(self) -> None:
        self._pool: AsyncConnectionPool | None = None
        self._opening = asyncio.Lock()

    async def __aenter__(self) -> AsyncClient:
        await self._connected()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the pool; later calls raise QueueClosed. Idempotent."""
        if self._closing() and self._pool is not None:
            await self._pool.close()

    # -- the steps (walqueue.pg.api) ----------------------------------------------------

    async def _run(self, make: Callable[..., Steps], /, *args: Any, **kwargs: Any) -> Any:
        steps = make(*args, **kwargs)  # the arguments are validated before anything is sent
        if not self._ready:
            await self._connected()
        return await drive_async(steps, self)

    async def _connected(self) -> None:
        if self._closed:
            raise QueueClosed(f"this walqueue.pg AsyncClient of queue {self.queue!r} is closed")
        if self._ready:
            return
        # One coroutine opens the pool; the others wait for it.
        async with self._opening:
            if self._ready:
                return
            pool = AsyncConnectionPool(self.dsn, connection_class=AsyncConnection, min_size=1,
                                       max_size=self._pool_size, kwargs=CONNECTION_KWARGS, open=False,
                                       timeout=self.connect_seconds, name=f"walqueue-async:{self.queue}")
            try:
                await self._refuse_incurable()
                await pool.open(wait=True, timeout=self.connect_seconds)
                self._pool = pool  # for _execute, while the schema is checked
                await drive_async(self._setting_up(), self)
            except PoolTimeout as error:
                self._pool = None
                await pool.close()
                raise DatabaseUnavailable(f"cannot connect to PostgreSQL at {self.where} within "
                                          f"{self.connect_seconds} s") from error
            except BaseException:
                self._pool = None
                await pool.close()
                raise
            if self._closed:  # closed while opening
                await pool.close()
                raise QueueClosed(f"this walqueue.pg AsyncClient of queue {self.queue!r} is closed")
            self._ready = True

    async def _refuse_incurable(self) -> None:
        """As walqueue.pg.Client's: a refusal no retry cures is raised at once."""
        try:
            connection = await psycopg.AsyncConnection.connect(
                self.dsn, autocommit=True, connect_timeout=max(1, int(self.connect_seconds)))
        except psycopg.Error as error:
            refused = refusal(error, self.dsn, self.where)
            if refused is not None:
                raise refused from None
            return
        await connection.close()

    async def _execute(self, call: Call) -> list[tuple]:
        async with self._pool.connection(timeout=self.connect_seconds) as connection:
            cursor = connection.call_cursor()
            await cursor.execute(call.statement, call.params)
            return await cursor.fetchall()

    async def _blocking(self, function: Callable[[], Any]) -> Any:
        return await asyncio.to_thread(function)

    async def _sleep(self, seconds: float) -> None:
        await asyncio.sleep(seconds)

    def _new_event(self) -> tuple[asyncio.Event, Callable[[], None]]:
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        return event, lambda: loop.call_soon_threadsafe(event.set)

    async def _wait_for(self, event: asyncio.Event, seconds: float) -> bool:
        try:
            await asyncio.wait_for(event.wait(), seconds)
        except TimeoutError:
            return False
        return True
