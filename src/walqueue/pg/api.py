"""SPEC §9's client methods, written once for walqueue.pg's sync and asyncio clients.

``ClientApi`` holds every public method with its arguments, defaults and
docstring, the constructor and its options, and every decision a call
makes: which statement (walqueue.pg.calls builds it, validating the
arguments first), whether to send it again after a lost answer
(walqueue.retry, the policy both backends share), how a waiting reserve
waits (registration, the head waiter's timer, the hold after a false hint:
walqueue.pg.wakeup), and what the schema check and the server's settings
say at connect (walqueue.pg.schema). ``walqueue.pg.client.Client`` and
``walqueue.pg.aio.AsyncClient`` subclass it and own only the I/O: a pool of
connections, running one statement, sleeping, waiting for a wake-up.

How one class serves both: each call is a generator of *steps*, the I/O
it needs done (a ``Call``, whose statement the shell's ``_execute`` runs, or
a zero-argument callable: ``self._sleep``, ...), and receives each step's
result, or has its exception thrown in at the ``yield``. A shell's
``_run(make, *args)`` makes the steps (``make`` builds the call, validating
its arguments before anything is sent) and drives them: the sync one runs
each step (``drive``), the asyncio one awaits each (``drive_async``), after
opening its pool on first use, so there every method returns an awaitable
of the value documented here and a bad argument raises when it is awaited.
(walqueue.client.api and walqueue.worker.policy are written the same way.)

What else a shell provides: ``_execute(call) -> rows`` (one statement on a
pool connection; its errors are psycopg's or the pool's, which ``_calling``
decides on), ``_blocking(function)`` (synchronous code: the asyncio shell
runs it in a thread), ``_sleep(seconds)``, ``_wait_for(event, seconds) ->
bool``, and ``_new_event() -> (event, wake)`` (not a step: ``wake`` must be
callable from the wakeup thread); and it sets ``_ready`` once its pool is
open and ``_setting_up`` has checked the schema.

Adding a call is one method here (plus its builder in calls.py, its
statement in sql/calls.sql, its function in a migration, and its rule in
walqueue.retry).
"""

from __future__ import annotations

import functools
import logging
import threading
import time
from collections.abc import Callable, Generator, Iterable, Mapping
from typing import Any, NoReturn

import psycopg
from psycopg_pool import PoolTimeout

from walqueue import retry
from walqueue.errors import QueueClosed
from walqueue.pg import calls, schema, wakeup
from walqueue.pg.calls import Call, DatabaseUnavailable, check_dsn, describe
from walqueue.values import Lease, QueueStats, TaskView, WorkerView

log = logging.getLogger("walqueue.pg")

DEFAULT_POOL_SIZE = 4
DEFAULT_CONNECT_SECONDS = 10.0
DEFAULT_RETRY_SECONDS = retry.DEFAULT_RETRY_SECONDS
MAX_TRANSACTION_RETRIES = 5
# The connection parameters every pooled connection uses: answers are
# committed, and the server prepares each statement the first time it sees it.
CONNECTION_KWARGS = {"autocommit": True, "prepare_threshold": 0}

# A step is a Call, to run its statement (the shell's `_execute`), or any
# other zero-argument callable, to call (`_sleep`, `_wait_for`, ...).
Step = Call | Callable[[], Any]
Steps = Generator[Step, Any, Any]


def drive(steps: Steps, shell: ClientApi) -> Any:
    """Run a call's steps in this thread: run each (a Call by `shell._execute`), send back its
    result or throw in its error."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        value, error = None, None
        try:
            value = shell._execute(step) if step.__class__ is Call else step()
        except BaseException as exc:  # thrown into the call, which decides; it re-raises the rest
            error = exc


async def drive_async(steps: Steps, shell: ClientApi) -> Any:
    """``drive``'s twin for the asyncio shell, whose every step is awaited."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        value, error = None, None
        try:
            value = await (shell._execute(step) if step.__class__ is Call else step())
        except BaseException as exc:  # CancelledError too: the call unwinds (a waiter leaves) and re-raises it
            error = exc


def setup_report(row: tuple, where: str) -> float:
    """Warn about non-durable settings (SPEC §9); return the server's clock (seconds since the epoch)."""
    fsync, synchronous_commit, server_time = row
    for name, value in (("fsync", fsync), ("synchronous_commit", synchronous_commit)):
        if value == "off":
            log.warning("PostgreSQL at %s has %s=off: an answered write can be lost in a crash",
                        where, name)
    return server_time


class ClientApi:
    """SPEC §9's client for one queue; a shell subclass provides the I/O (module docstring).

    `pool_size` bounds the connections (a blocking reserve holds one only
    while it runs a statement, not while it waits). `retry_seconds` bounds
    how long the calls walqueue.retry names (the reads, `put`, `put_many`)
    are sent again after DatabaseUnavailable. `reaper` makes this process
    reap the queue's expired leases every second or so; `listen` False makes
    waiting reserves poll instead of using LISTEN/NOTIFY.

    Raises DatabaseUnavailable if PostgreSQL cannot be reached, SchemaError
    if the schema is missing (with migrate=False), older, or newer and
    incompatible (walqueue.pg.schema), InvalidRequest for a bad queue or
    schema name or a DSN libpq cannot parse. No message, log line or repr
    shows the DSN's password (SPEC §8b).
    """

    capabilities = calls.CAPABILITIES  # beyond the common contract (walqueue.backend)

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
        self._migrate = migrate
        self._pool_size = pool_size
        self._listen = listen
        self._reaper = reaper
        self._reaping = False
        self._closed = False
        self._ready = False  # the pool is open and the schema checked (the shell sets it)
        self._clock_offset = 0.0
        self._statements = calls.statements(self.schema)
        self._service: wakeup.Service | None = None
        self._service_lock = threading.Lock()
        self._init_shell()

    def _init_shell(self) -> None:
        raise NotImplementedError

    def _run(self, make: Callable[..., Steps], /, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<walqueue.pg.{type(self).__name__} queue={self.queue!r} at {self.where}>"  # never the password

    @property
    def closed(self) -> bool:
        return self._closed

    def server_time(self) -> float:
        """This host's estimate of the server's clock (seconds since the epoch), measured at connect."""
        return time.time() + self._clock_offset

    # -- opening and closing (the shells call these) ------------------------------

    def _setting_up(self) -> Steps:
        """At connect: check the schema (migrating it if asked and needed), note the server's
        durability settings and its clock; then start reaping if asked."""
        bookkeeping = schema.bookkeeping(self.schema)
        installed = None
        if (yield from self._once(calls.schema_exists_call(bookkeeping, self.schema))):
            installed = yield from self._once(calls.installed_call(bookkeeping))
        if self._migrate and schema.needs_migration(installed):
            installed = yield functools.partial(self._blocking, self._migrate_schema)
        schema.check_version(installed, self.schema)
        server_time = setup_report((yield from self._once(calls.setup_call(self._statements))), self.where)
        self._clock_offset = server_time - time.time()
        if self._reaper:
            self._service_for_waits().wanted_reaping(self.queue, True)
            self._reaping = True

    def _migrate_schema(self) -> schema.Installed:
        """Create or upgrade the schema on a connection of its own (synchronous: run by `_blocking`)."""
        try:
            with psycopg.connect(self.dsn, autocommit=True,
                                 connect_timeout=max(1, int(self.connect_seconds))) as connection:
                return schema.migrate_connection(connection, self.schema)
        except psycopg.Error as error:
            mapped = calls.failure(None, error, self.dsn)
            if mapped is error:
                raise
            raise mapped from error

    def _closing(self) -> bool:
        """Mark the client closed and give back the wakeup service; False if it was closed already."""
        if self._closed:
            return False
        self._closed = True
        with self._service_lock:
            if self._service is not None:
                if self._reaping:
                    self._service.wanted_reaping(self.queue, False)
                wakeup.release(self._service)
                self._service = None
        return True

    def _service_for_waits(self) -> wakeup.Service:
        with self._service_lock:
            if self._service is None:
                self._service = wakeup.acquire(self.dsn, self.schema, listen=self._listen)
            return self._service

    # -- the steps of a call --------------------------------------------------------

    def _calling(self, call: Call, *, resend: bool | None = None) -> Steps:
        """Run `call` and convert its rows; raise the library's exception for a failure.

        A serialization failure or deadlock rolled the transaction back
        whole, so the statement runs again (up to MAX_TRANSACTION_RETRIES
        times); any other psycopg error is mapped by `calls.failure`. After a
        lost answer the call is sent again if `resend`, by default if
        walqueue.retry says so for its name.
        """
        if call.statement is None:
            return call.convert([])
        if resend is None:
            resend = retry.retried(call.name)  # a call without a rule raises here, on its first use
        started = time.monotonic()
        attempt: retry.Retry | None = None
        while True:
            try:
                for rolled_back in range(MAX_TRANSACTION_RETRIES):
                    if self._closed:
                        raise QueueClosed(f"this walqueue.pg {type(self).__name__} of queue "
                                          f"{self.queue!r} is closed")
                    try:
                        return call.convert((yield call))
                    except (psycopg.Error, PoolTimeout) as error:
                        if not calls.retryable(error) or rolled_back == MAX_TRANSACTION_RETRIES - 1:
                            self._raise_failure(call, error)
            except retry.LOST_ANSWER as error:
                if not resend:
                    raise
                if attempt is None:
                    attempt = retry.Retry(retry_seconds=self.retry_seconds, now=started)
                pause = attempt.pause_after(error, now=time.monotonic(), client_closed=self._closed)
                if pause is None:
                    raise
                yield functools.partial(self._sleep, pause)

    def _raise_failure(self, call: Call, error: BaseException) -> NoReturn:
        """Raise the library's exception for `error` (from `_execute`), or `error` itself if it is
        none of ours (a bug, not the world), keeping `error` as the cause."""
        if isinstance(error, PoolTimeout):
            raise DatabaseUnavailable(f"no connection to PostgreSQL at {self.where} within "
                                      f"{self.connect_seconds} s") from error
        mapped = calls.failure(call, error, self.dsn)
        if mapped is error:
            raise error
        raise mapped from error

    def _once(self, call: Call) -> Steps:
        """`_calling` for the client's own statements (the schema check, a registration): never resent."""
        return self._calling(call, resend=False)

    def _one(self, build: Callable[..., Call], /, *args: Any, **kwargs: Any) -> Steps:
        """The steps of one call of `build`, built (its arguments validated) now."""
        return self._calling(build(self._statements, self.queue, *args, **kwargs))

    def _putting(self, task_id: Any, payload: Any, key: Any, available_at: Any, delay: Any,
                 max_attempts: Any) -> Steps:
        # A generator, so the call is built once driven: after the asyncio shell has opened the
        # pool, where the server's clock (for delay=) is measured.
        return (yield from self._calling(calls.put_call(
            self._statements, self.queue, task_id, payload, key=key, available_at=available_at,
            delay=delay, max_attempts=max_attempts, now=int(self.server_time()))))

    def _reserving(self, build: Callable[..., Call], /, *args: Any, **kwargs: Any) -> Steps:
        """A reserve (or ack_and_reserve): without `wait` one call; with it, `_waiting` if it
        leased nothing."""
        call = build(self._statements, self.queue, *args, **kwargs)
        if not call.wait:
            return self._calling(call)  # its convert gives the leases
        return self._reserve_or_wait(call)

    def _reserve_or_wait(self, call: Call) -> Steps:
        reserved = yield from self._calling(call)
        if reserved.leases:
            return reserved.leases
        return (yield from self._waiting(call.again or call))

    def _waiting(self, call: Call) -> Steps:
        """Reserve with `call` until it leases something or its wait runs out (walqueue.pg.wakeup)."""
        deadline = time.monotonic() + call.wait
        service = self._service_for_waits()
        yield functools.partial(self._blocking, functools.partial(
            service.ready, min(call.wait, wakeup.PROBE_SECONDS + self.connect_seconds)))
        event, wake = self._new_event()
        waiter = service.add(self.queue, wake)
        try:
            while True:
                if service.needs_registration(self.queue):
                    statement, params = service.registration(self.queue)
                    yield from self._once(calls.registration_call(statement, params))
                    service.registered(self.queue, params[1])
                reserved = yield from self._calling(call)
                if reserved.leases:
                    if len(reserved.leases) == call.limit:
                        service.pass_on(self.queue, waiter)
                    return reserved.leases
                now = time.monotonic()
                waiter.reserved_nothing(now)
                remaining = deadline - now
                if remaining <= 0:
                    return []
                timeout = min(remaining, wakeup.wait_pause(
                    reserved.next_due, service.is_head(self.queue, waiter), service.polling,
                    self.server_time()))
                signalled = yield functools.partial(self._wait_for, event, timeout)
                # A wake-up is only a hint anyone may send (wakeup.Waiter.hold).
                hold = waiter.hold(signalled, time.monotonic(), now + timeout)
                if hold > 0:
                    yield functools.partial(self._sleep, hold)
                event.clear()
                waiter.woken = False
        finally:
            service.remove(self.queue, waiter)

    # -- the API ----------------------------------------------------------------------

    def put(self, task_id: str, payload: Mapping[str, Any], *, key: str | None = None,
            available_at: int = 0, delay: int | None = None, max_attempts: int = 3) -> str:
        """Put one task; ``delay`` (seconds from the server's now) becomes ``available_at`` once,
        so a retried put keeps its identity. Raises InvalidRequest, KeyConflict, DatabaseUnavailable."""
        return self._run(self._putting, task_id, payload, key, available_at, delay, max_attempts)

    def put_many(self, requests: Iterable[Any]) -> list[str]:
        """Put several tasks in one transaction, all or nothing (PutRequest objects or mappings)."""
        return self._run(self._one, calls.put_many_call, requests)

    def reserve(self, worker: str, *, lease_seconds: int = 30, limit: int = 1,
                wait: float = 0) -> list[Lease]:
        """Lease up to `limit` due tasks, waiting up to `wait` seconds (0-300) for one. Never retried."""
        return self._run(self._reserving, calls.reserve_call, worker, lease_seconds=lease_seconds,
                                         limit=limit, wait=wait)

    def ack(self, lease: Lease) -> None:
        """Complete the leased task. Raises StaleLease if the lease is not current."""
        return self._run(self._one, calls.ack_call, lease)

    def ack_and_reserve(self, lease: Lease, *, lease_seconds: int = 30, limit: int = 1,
                        wait: float = 0) -> list[Lease]:
        """Ack `lease`, then reserve for its worker, in one transaction (then wait like reserve).

        Raises StaleLease, leasing nothing, if the ack fails. Never retried:
        after DatabaseUnavailable the ack may or may not have happened.
        """
        return self._run(self._reserving, calls.ack_and_reserve_call, lease, lease_seconds=lease_seconds,
                                         limit=limit, wait=wait)

    def release(self, lease: Lease, *, delay: int = 0) -> None:
        """Give the task back, due again `delay` seconds from now (dead at max_attempts)."""
        return self._run(self._one, calls.release_call, lease, delay=delay)

    def touch(self, lease: Lease, *, lease_seconds: int) -> Lease:
        """Extend a live lease to `lease_seconds` from now; returns the new Lease."""
        return self._run(self._one, calls.touch_call, lease, lease_seconds=lease_seconds)

    def revive(self, task_ids: Iterable[str]) -> list[str]:
        """Make dead tasks ready again. Raises InvalidRequest, changing nothing, if one is not dead."""
        return self._run(self._one, calls.revive_call, task_ids)

    def force_release(self, task_ids: Iterable[str]) -> list[str]:
        """End the tasks' current leases now, whoever holds them; each counts as an attempt.

        Returns the ids, duplicates dropped. Raises InvalidRequest, changing
        nothing, if one is not leased. Never retried: a second one would find
        the tasks no longer leased.
        """
        return self._run(self._one, calls.force_release_call, task_ids)

    def get(self, task_id: str) -> TaskView | None:
        """The task, or None if no task has that id."""
        return self._run(self._one, calls.get_call, task_id)

    def tasks(self, status: str | None = None, *, after: str | None = None,
              limit: int | None = None) -> list[TaskView]:
        """All tasks (or those with `status`) in task_id order; with `after`, only those whose
        id is greater; with `limit` (1 to 10,000), at most that many: one statement on an
        index, O(limit) (SPEC §8b)."""
        if after is None and limit is None:
            return self._run(self._one, calls.tasks_call, status)
        return self._run(self._one, calls.tasks_page_call, status, after=after, limit=limit)

    def cancel(self, task_id: str) -> None:
        """Complete a dead task, or a ready one that is due, without running it (SPEC §8b):
        one statement, which deletes the live row only while it is in one of those states.
        A completed task: nothing happens. Raises InvalidRequest, naming the case, for a task
        not yet due, leased or unknown."""
        return self._run(self._one, calls.cancel_call, task_id)

    def workers(self) -> list[WorkerView]:
        """The workers seen in leases, by name, with how many each holds; `connected` is False
        (a database does not know its clients' worker names; docs/postgres.md)."""
        return self._run(self._one, calls.workers_call)

    def stats(self) -> QueueStats:
        """Counts by status; last_seq, snapshot_seq and wal_bytes are 0 (no WAL of ours)."""
        return self._run(self._one, calls.stats_call)

    def expired_total(self) -> int:
        """Leases of this queue that expired (reaped past their deadline, to ready or dead) since
        the schema began counting them (version 3): for monitoring rates, as walqueued's
        ``daemon_stats().expired_total`` (walqueue-web plots it)."""
        return self._run(self._one, calls.expired_total_call)

