"""`walqueue.pg.Client`: SPEC §9's blocking client over PostgreSQL.

A pool of connections (psycopg_pool, autocommit, statements prepared on
first use) so threads can share one Client; every call runs one statement —
one of the schema's functions — which is one transaction and one round trip.
Calls go through walqueue.pg.calls (validation, SQL, conversion, errors);
blocking reserves and the reaper through walqueue.pg.wakeup.

Retries: serialization failures and deadlocks are retried inside the call.
After DatabaseUnavailable, `put`, `put_many` and the reads are retried for up
to `retry_seconds` (they are idempotent: `delay=` became an absolute
available_at before the first attempt). `reserve`, `ack_and_reserve`, `ack`,
`release`, `touch` and `revive` are not: their outcome is unknown, and
walqueue.worker tells a completed ack from a lost lease by the StaleLease it
gets when it retries.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Iterable, Mapping
from typing import Any

import psycopg
from psycopg_pool import ConnectionPool, PoolTimeout

from walqueue.dsn import redacted
from walqueue.errors import QueueClosed
from walqueue.pg import calls, schema, wakeup
from walqueue.pg.calls import Call, DatabaseUnavailable, Reserved, check_dsn, describe
from walqueue.values import Lease, QueueStats, TaskView

log = logging.getLogger("walqueue.pg")

DEFAULT_POOL_SIZE = 4
DEFAULT_CONNECT_SECONDS = 10.0
DEFAULT_RETRY_SECONDS = 10.0
RETRY_PAUSES_SECONDS = (0.05, 0.1, 0.2, 0.5, 1.0)
MAX_TRANSACTION_RETRIES = 5
# When a due task exists but a concurrent transaction held it, look again this soon.
BUSY_PAUSE_SECONDS = 0.05
# The connection parameters every client uses: answers are committed, and the
# server prepares each statement the first time it sees it.
CONNECTION_KWARGS = {"autocommit": True, "prepare_threshold": 0}
SETUP_QUERY = ("SELECT current_setting('fsync'), current_setting('synchronous_commit'), "
               "extract(epoch FROM clock_timestamp())::float8")


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


def setup_report(row: tuple, where: str) -> float:
    """Warn about non-durable settings (SPEC §9); return the server's clock offset in seconds."""
    fsync, synchronous_commit, server_time = row
    for name, value in (("fsync", fsync), ("synchronous_commit", synchronous_commit)):
        if value == "off":
            log.warning("PostgreSQL at %s has %s=off: an answered write can be lost in a crash",
                        where, name)
    return server_time - time.time()


def retry_pause(attempt: int, deadline: float) -> float:
    pause = RETRY_PAUSES_SECONDS[min(attempt, len(RETRY_PAUSES_SECONDS) - 1)]
    return min(pause, max(0.0, deadline - time.monotonic()))


def wait_pause(reserved: Reserved, is_head: bool, polling: bool, server_time: float) -> float:
    """How long a waiter sleeps before reserving again, unless woken first."""
    pause = wakeup.POLL_SECONDS if polling else wakeup.SAFETY_POLL_SECONDS
    if reserved.next_due is not None and is_head:
        until_due = reserved.next_due - server_time
        pause = min(pause, max(BUSY_PAUSE_SECONDS, until_due + 0.01))
    return pause


class Client:
    """SPEC §9's client for one queue. See the module docstring for retries.

    `pool_size` bounds the connections (a blocking reserve holds one only
    while it runs a statement, not while it waits). `reaper` makes this
    process reap the queue's expired leases every second or so; `listen`
    False makes waiting reserves poll instead of using LISTEN/NOTIFY.

    Raises DatabaseUnavailable if PostgreSQL cannot be reached, SchemaError
    if the schema is missing (with migrate=False), older, or newer than this
    walqueue knows, InvalidRequest for a bad queue or schema name or a DSN libpq cannot
    parse. No message, log line or repr shows the DSN's password (SPEC §8b).
    """

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
        # Test-only (tests/pg): with schema.install_test_clock, the server's
        # clock reads this value on this client's calls.
        self.test_now: int | None = None
        self._statements = calls.Statements(self.schema)
        self._listen = listen
        self._reaper = reaper
        self._closed = False
        self._service: wakeup.Service | None = None
        self._service_lock = threading.Lock()
        self._pool = ConnectionPool(dsn, connection_class=Connection, min_size=1, max_size=pool_size,
                                    kwargs=CONNECTION_KWARGS, open=False, timeout=connect_seconds,
                                    name=f"walqueue:{self.queue}")
        try:
            self._pool.open(wait=True, timeout=connect_seconds)
            with self._pool.connection() as connection:
                self._clock_offset = self._setup(connection, migrate)
        except PoolTimeout as error:
            self._pool.close()
            raise DatabaseUnavailable(f"cannot connect to PostgreSQL at {self.where} within "
                                      f"{connect_seconds} s") from error
        except BaseException:
            self._pool.close()
            raise
        if reaper:
            self._service_for_waits().wanted_reaping(self.queue, True)

    def _setup(self, connection: psycopg.Connection, migrate: bool) -> float:
        try:
            version = schema.installed_version(connection, self.schema)
            if version != schema.SCHEMA_VERSION and migrate:
                version = schema.migrate_connection(connection, self.schema)
            schema.check_version(version, self.schema)
            return setup_report(connection.execute(SETUP_QUERY).fetchone(), self.where)
        except psycopg.Error as error:
            mapped = calls.failure(None, error, self.dsn)
            if mapped is error:
                raise
            raise mapped from error

    # -- plumbing ----------------------------------------------------------------

    def __repr__(self) -> str:
        return f"<walqueue.pg.Client queue={self.queue!r} at {self.where}>"  # never the password

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        return self._closed

    def close(self) -> None:
        """Close the pool; later calls raise QueueClosed. Idempotent."""
        if self._closed:
            return
        self._closed = True
        with self._service_lock:
            if self._service is not None:
                if self._reaper:
                    self._service.wanted_reaping(self.queue, False)
                wakeup.release(self._service)
                self._service = None
        self._pool.close()

    def _service_for_waits(self) -> wakeup.Service:
        with self._service_lock:
            if self._service is None:
                self._service = wakeup.acquire(self.dsn, self.schema, listen=self._listen)
            return self._service

    def server_time(self) -> float:
        """This host's estimate of the server's clock (seconds since the epoch)."""
        if self.test_now is not None:
            return float(self.test_now)
        return time.time() + self._clock_offset

    def _execute(self, call: Call) -> list[tuple]:
        if self._closed:
            raise QueueClosed(f"this walqueue.pg Client of queue {self.queue!r} is closed")
        try:
            with self._pool.connection(timeout=self.connect_seconds) as connection:
                cursor = connection.call_cursor()
                for attempt in range(MAX_TRANSACTION_RETRIES):
                    try:
                        if self.test_now is not None:
                            cursor.execute("SELECT set_config(%s, %s, false)",
                                           (schema.TEST_NOW_SETTING, str(self.test_now)))
                        return cursor.execute(call.statement, call.params).fetchall()
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

    def _run(self, call: Call) -> Any:
        if call.statement is None:
            return call.convert([])
        deadline = time.monotonic() + self.retry_seconds
        attempt = 0
        while True:
            try:
                return call.convert(self._execute(call))
            except DatabaseUnavailable:
                if not call.idempotent or self._closed or time.monotonic() >= deadline:
                    raise
                time.sleep(retry_pause(attempt, deadline))
                attempt += 1

    def _wait(self, call: Call, limit: int) -> list[Lease]:
        """Reserve with `call` until it leases something or its wait runs out."""
        deadline = time.monotonic() + call.wait
        service = self._service_for_waits()
        service.ready(min(call.wait, wakeup.PROBE_SECONDS + self.connect_seconds))
        event = threading.Event()
        waiter = service.add(self.queue, event.set)
        try:
            while True:
                if service.needs_registration(self.queue):
                    self._register(service)
                reserved = self._run(call)
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
                signalled = event.wait(timeout)
                # A wake-up is only a hint anyone may send (wakeup.Waiter.hold).
                hold = waiter.hold(signalled, time.monotonic(), now + timeout)
                if hold > 0:
                    time.sleep(hold)
                event.clear()
                waiter.woken = False
        finally:
            service.remove(self.queue, waiter)

    def _register(self, service: wakeup.Service) -> None:
        statement, params = service.registration(self.queue)
        try:
            with self._pool.connection(timeout=self.connect_seconds) as connection:
                connection.execute(statement, params)
        except (psycopg.Error, PoolTimeout) as error:
            raise DatabaseUnavailable(f"PostgreSQL at {self.where}: {redacted(str(error), self.dsn)}") from error
        service.registered(self.queue, params[1])

    # -- the API -------------------------------------------------------------------

    def put(self, task_id: str, payload: Mapping[str, Any], *, key: str | None = None,
            available_at: int = 0, delay: int | None = None, max_attempts: int = 3) -> str:
        """Put one task; `delay` (seconds from the server's now) becomes `available_at` once.

        Raises InvalidRequest, KeyConflict, DatabaseUnavailable.
        """
        return self._run(calls.put_call(self._statements, self.queue, task_id, payload, key=key,
                                        available_at=available_at, delay=delay,
                                        max_attempts=max_attempts, now=int(self.server_time())))

    def put_many(self, requests: Iterable[Any]) -> list[str]:
        """Put several tasks in one transaction, all or nothing (PutRequest objects or mappings)."""
        return self._run(calls.put_many_call(self._statements, self.queue, requests))

    def reserve(self, worker: str, *, lease_seconds: int = 30, limit: int = 1,
                wait: float = 0) -> list[Lease]:
        """Reap, then lease up to `limit` due tasks, waiting up to `wait` seconds for one."""
        call = calls.reserve_call(self._statements, self.queue, worker,
                                  lease_seconds=lease_seconds, limit=limit, wait=wait)
        reserved = self._run(call)
        if reserved.leases or not call.wait:
            return reserved.leases
        return self._wait(call, call.params[3])

    def ack(self, lease: Lease) -> None:
        """Complete the leased task. Raises StaleLease (nothing changed) if the lease is not current."""
        self._run(calls.ack_call(self._statements, self.queue, lease))

    def ack_and_reserve(self, lease: Lease, *, lease_seconds: int = 30, limit: int = 1,
                        wait: float = 0) -> list[Lease]:
        """Ack `lease`, then reserve for its worker, in one transaction.

        Raises StaleLease, leasing nothing, if the ack is refused. If nothing is
        due, waits up to `wait` seconds like `reserve` (the ack is already done).
        """
        call = calls.ack_and_reserve_call(self._statements, self.queue, lease,
                                          lease_seconds=lease_seconds, limit=limit, wait=wait)
        reserved = self._run(call)
        if reserved.leases or not call.wait:
            return reserved.leases
        return self._wait(calls.reserve_call(self._statements, self.queue, lease.worker,
                                             lease_seconds=lease_seconds, limit=limit, wait=wait),
                          limit)

    def release(self, lease: Lease, *, delay: int = 0) -> None:
        """Give the task back, due again `delay` seconds from now (dead at max_attempts)."""
        self._run(calls.release_call(self._statements, self.queue, lease, delay=delay))

    def touch(self, lease: Lease, *, lease_seconds: int) -> Lease:
        """Extend a live lease to `lease_seconds` from now; returns the new Lease."""
        return self._run(calls.touch_call(self._statements, self.queue, lease,
                                          lease_seconds=lease_seconds))

    def revive(self, task_ids: Iterable[str]) -> list[str]:
        """Make dead tasks ready again. Raises InvalidRequest, changing nothing, if one is not dead."""
        return self._run(calls.revive_call(self._statements, self.queue, task_ids))

    def force_release(self, task_ids: Iterable[str]) -> list[str]:
        """End the tasks' current leases now, whoever holds them; each counts as an attempt.

        Returns the ids, duplicates dropped. Raises InvalidRequest, changing
        nothing, if one is not leased.
        """
        return self._run(calls.force_release_call(self._statements, self.queue, task_ids))

    def get(self, task_id: str) -> TaskView | None:
        return self._run(calls.get_call(self._statements, self.queue, task_id))

    def tasks(self, status: str | None = None) -> list[TaskView]:
        """All tasks (or those with `status`) in task_id order."""
        return self._run(calls.tasks_call(self._statements, self.queue, status))

    def stats(self) -> QueueStats:
        """Counts by status; last_seq, snapshot_seq and wal_bytes are 0 (no WAL of ours)."""
        return self._run(calls.stats_call(self._statements, self.queue))
