"""`walqueue.pg.AsyncClient`: walqueue.pg.Client's methods as coroutines.

The same calls (walqueue.pg.calls), retries and error mapping as the sync
Client, over psycopg_pool's AsyncConnectionPool, so concurrent coroutines
use several connections at once. The pool opens (and the schema is checked
or migrated) on the first call or on `async with`. A waiting reserve sleeps
on an asyncio.Event that the process's wakeup.Service thread sets through
the event loop. An AsyncClient belongs to one event loop.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from psycopg_pool import AsyncConnectionPool, PoolTimeout

from walqueue.dsn import redacted
from walqueue.errors import QueueClosed
from walqueue.pg import calls, schema, wakeup
from walqueue.pg.calls import Call, DatabaseUnavailable, check_dsn, describe
from walqueue.pg.client import (
    CONNECTION_KWARGS,
    DEFAULT_CONNECT_SECONDS,
    DEFAULT_POOL_SIZE,
    DEFAULT_RETRY_SECONDS,
    MAX_TRANSACTION_RETRIES,
    SETUP_QUERY,
    retry_pause,
    setup_report,
    wait_pause,
)
from walqueue.values import Lease, QueueStats, TaskView


class AsyncConnection(psycopg.AsyncConnection):
    """A pooled connection that keeps one binary cursor for the calls (as client.Connection)."""

    _call_cursor: psycopg.AsyncCursor | None = None

    def call_cursor(self) -> psycopg.AsyncCursor:
        if self._call_cursor is None:
            self._call_cursor = self.cursor(binary=True)
        return self._call_cursor


class AsyncClient:
    """SPEC §9's asyncio client for one queue; arguments as walqueue.pg.Client."""

    capabilities = calls.CAPABILITIES

    def __init__(self, dsn: str, *, queue: str = "default", schema: str = schema.DEFAULT_SCHEMA,
                 migrate: bool = True, pool_size: int = DEFAULT_POOL_SIZE,
                 connect_seconds: float = DEFAULT_CONNECT_SECONDS,
                 retry_seconds: float = DEFAULT_RETRY_SECONDS, reaper: bool = True,
                 listen: bool = True) -> None:
        self.queue = calls.queue_name(queue)
        self.schema = calls.schema_name(schema)
        check_dsn(dsn)
        self.dsn = dsn
        self.where = describe(dsn)
        self.connect_seconds = connect_seconds
        self.retry_seconds = retry_seconds
        self.test_now: int | None = None  # test-only, as Client.test_now
        self._migrate = migrate
        self._pool_size = pool_size
        self._statements = calls.Statements(self.schema)
        self._listen = listen
        self._reaper = reaper
        self._closed = False
        self._pool: AsyncConnectionPool | None = None
        self._opening = asyncio.Lock()
        self._clock_offset = 0.0
        self._service: wakeup.Service | None = None

    def __repr__(self) -> str:
        return f"<walqueue.pg.AsyncClient queue={self.queue!r} at {self.where}>"  # never the password

    async def __aenter__(self) -> AsyncClient:
        await self._opened()
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    async def close(self) -> None:
        """Close the pool; later calls raise QueueClosed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        if self._service is not None:
            if self._reaper:
                self._service.wanted_reaping(self.queue, False)
            wakeup.release(self._service)
            self._service = None
        if self._pool is not None:
            await self._pool.close()

    async def _opened(self) -> AsyncConnectionPool:
        if self._closed:
            raise QueueClosed(f"this walqueue.pg AsyncClient of queue {self.queue!r} is closed")
        if self._pool is not None:
            return self._pool
        async with self._opening:
            if self._pool is not None:
                return self._pool
            pool = AsyncConnectionPool(self.dsn, connection_class=AsyncConnection, min_size=1,
                                       max_size=self._pool_size,
                                       kwargs=CONNECTION_KWARGS, open=False,
                                       timeout=self.connect_seconds,
                                       name=f"walqueue-async:{self.queue}")
            try:
                await pool.open(wait=True, timeout=self.connect_seconds)
                async with pool.connection() as connection:
                    await self._setup(connection)
            except PoolTimeout as error:
                await pool.close()
                raise DatabaseUnavailable(f"cannot connect to PostgreSQL at {self.where} within "
                                          f"{self.connect_seconds} s") from error
            except BaseException:
                await pool.close()
                raise
            self._pool = pool
            self._service = wakeup.acquire(self.dsn, self.schema, listen=self._listen)
            if self._reaper:
                self._service.wanted_reaping(self.queue, True)
            return pool

    async def _setup(self, connection: psycopg.AsyncConnection) -> None:
        # The schema helpers are synchronous; run them on a short-lived sync
        # connection in a thread rather than duplicating them.
        def check() -> None:
            with psycopg.connect(self.dsn, autocommit=True,
                                 connect_timeout=int(self.connect_seconds)) as sync:
                version = schema.installed_version(sync, self.schema)
                if version != schema.SCHEMA_VERSION and self._migrate:
                    version = schema.migrate_connection(sync, self.schema)
                schema.check_version(version, self.schema)

        try:
            await asyncio.to_thread(check)
            cursor = await connection.execute(SETUP_QUERY)
            self._clock_offset = setup_report(await cursor.fetchone(), self.where)
        except psycopg.Error as error:
            mapped = calls.failure(None, error, self.dsn)
            if mapped is error:
                raise
            raise mapped from error

    def server_time(self) -> float:
        if self.test_now is not None:
            return float(self.test_now)
        return time.time() + self._clock_offset

    async def _execute(self, call: Call) -> list[tuple]:
        pool = await self._opened()
        try:
            async with pool.connection(timeout=self.connect_seconds) as connection:
                cursor = connection.call_cursor()
                for attempt in range(MAX_TRANSACTION_RETRIES):
                    try:
                        if self.test_now is not None:
                            await cursor.execute("SELECT set_config(%s, %s, false)",
                                                 (schema.TEST_NOW_SETTING, str(self.test_now)))
                        await cursor.execute(call.statement, call.params)
                        return await cursor.fetchall()
                    except psycopg.Error as error:
                        if not calls.retryable(error) or attempt == MAX_TRANSACTION_RETRIES - 1:
                            raise
        except PoolTimeout as error:
            raise DatabaseUnavailable(f"no connection to PostgreSQL at {self.where} within "
                                      f"{self.connect_seconds} s") from error
        except psycopg.Error as error:
            mapped = calls.failure(call, error, self.dsn)
            if mapped is error:
                raise
            raise mapped from error
        raise AssertionError("unreachable")

    async def _run(self, call: Call) -> Any:
        if call.statement is None:
            return call.convert([])
        deadline = time.monotonic() + self.retry_seconds
        attempt = 0
        while True:
            try:
                return call.convert(await self._execute(call))
            except DatabaseUnavailable:
                if not call.idempotent or self._closed or time.monotonic() >= deadline:
                    raise
                await asyncio.sleep(retry_pause(attempt, deadline))
                attempt += 1

    async def _wait(self, call: Call, limit: int) -> list[Lease]:
        deadline = time.monotonic() + call.wait
        await self._opened()
        service = self._service
        await asyncio.to_thread(service.ready, min(call.wait, wakeup.PROBE_SECONDS + self.connect_seconds))
        loop = asyncio.get_running_loop()
        event = asyncio.Event()
        waiter = service.add(self.queue, lambda: loop.call_soon_threadsafe(event.set))
        try:
            while True:
                if service.needs_registration(self.queue):
                    await self._register(service)
                reserved = await self._run(call)
                if reserved.leases:
                    if len(reserved.leases) == limit:
                        service.pass_on(self.queue, waiter)
                    return reserved.leases
                now = time.monotonic()
                waiter.reserved_nothing(now)
                remaining = deadline - now
                if remaining <= 0:
                    return []
                pause = wait_pause(reserved, service.is_head(self.queue, waiter), service.polling,
                                   self.server_time())
                timeout = min(remaining, pause)
                try:
                    await asyncio.wait_for(event.wait(), timeout)
                    signalled = True
                except TimeoutError:
                    signalled = False
                # A wake-up is only a hint anyone may send (wakeup.Waiter.hold).
                hold = waiter.hold(signalled, time.monotonic(), now + timeout)
                if hold > 0:
                    await asyncio.sleep(hold)
                event.clear()
                waiter.woken = False
        finally:
            service.remove(self.queue, waiter)

    async def _register(self, service: wakeup.Service) -> None:
        statement, params = service.registration(self.queue)
        pool = await self._opened()
        try:
            async with pool.connection(timeout=self.connect_seconds) as connection:
                await connection.execute(statement, params)
        except (psycopg.Error, PoolTimeout) as error:
            raise DatabaseUnavailable(f"PostgreSQL at {self.where}: {redacted(str(error), self.dsn)}") from error
        service.registered(self.queue, params[1])

    # -- the API (see walqueue.pg.Client for each method's contract) ------------

    async def put(self, task_id: str, payload: Mapping[str, Any], *, key: str | None = None,
                  available_at: int = 0, delay: int | None = None, max_attempts: int = 3) -> str:
        await self._opened()  # the server's clock offset, for delay=
        return await self._run(calls.put_call(
            self._statements, self.queue, task_id, payload, key=key, available_at=available_at,
            delay=delay, max_attempts=max_attempts, now=int(self.server_time())))

    async def put_many(self, requests: Iterable[Any]) -> list[str]:
        return await self._run(calls.put_many_call(self._statements, self.queue, requests))

    async def reserve(self, worker: str, *, lease_seconds: int = 30, limit: int = 1,
                      wait: float = 0) -> list[Lease]:
        call = calls.reserve_call(self._statements, self.queue, worker,
                                  lease_seconds=lease_seconds, limit=limit, wait=wait)
        reserved = await self._run(call)
        if reserved.leases or not call.wait:
            return reserved.leases
        return await self._wait(call, call.params[3])

    async def ack(self, lease: Lease) -> None:
        await self._run(calls.ack_call(self._statements, self.queue, lease))

    async def ack_and_reserve(self, lease: Lease, *, lease_seconds: int = 30, limit: int = 1,
                              wait: float = 0) -> list[Lease]:
        call = calls.ack_and_reserve_call(self._statements, self.queue, lease,
                                          lease_seconds=lease_seconds, limit=limit, wait=wait)
        reserved = await self._run(call)
        if reserved.leases or not call.wait:
            return reserved.leases
        return await self._wait(calls.reserve_call(self._statements, self.queue, lease.worker,
                                                   lease_seconds=lease_seconds, limit=limit,
                                                   wait=wait), limit)

    async def release(self, lease: Lease, *, delay: int = 0) -> None:
        await self._run(calls.release_call(self._statements, self.queue, lease, delay=delay))

    async def touch(self, lease: Lease, *, lease_seconds: int) -> Lease:
        return await self._run(calls.touch_call(self._statements, self.queue, lease,
                                                lease_seconds=lease_seconds))

    async def revive(self, task_ids: Iterable[str]) -> list[str]:
        return await self._run(calls.revive_call(self._statements, self.queue, task_ids))

    async def force_release(self, task_ids: Iterable[str]) -> list[str]:
        return await self._run(calls.force_release_call(self._statements, self.queue, task_ids))

    async def get(self, task_id: str) -> TaskView | None:
        return await self._run(calls.get_call(self._statements, self.queue, task_id))

    async def tasks(self, status: str | None = None) -> list[TaskView]:
        return await self._run(calls.tasks_call(self._statements, self.queue, status))

    async def stats(self) -> QueueStats:
        return await self._run(calls.stats_call(self._statements, self.queue))
