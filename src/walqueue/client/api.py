"""SPEC §8's client methods, written once for the sync and the asyncio client.

``ClientApi`` holds every public method with its arguments, defaults and
docstring; each one hands its call builder (``walqueue.client.calls``) and
arguments to ``self._run``, which the shells define: the sync
``walqueue.client.Client._run`` sends the call and returns its value, the
asyncio ``walqueue.client.aio.Client._run`` is a coroutine function, so there every
method returns an awaitable of the value documented here
(``await client.put(...)``). The builder runs inside ``_run``, so a bad
argument raises when the call is made (sync) or awaited (asyncio), like
any other error of the call.

The return annotations are the sync client's; the asyncio client's methods
return awaitables of them. The constructor and its options are shared too;
a shell sets up its connection state in ``_init_connections``.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable, Mapping
from typing import Any

from walqueue import Lease, QueueStats, TaskView, WorkerView
from walqueue.backend import CAPABILITIES
from walqueue.client import calls
from walqueue.client.address import socket_path
from walqueue.client.calls import HelloRefused, NoSocket
from walqueue.metrics import DaemonStats
from walqueue.protocol import ConnectionView
from walqueue.retry import DEFAULT_RETRY_SECONDS, Retry, call_name, retry_for
from walqueue.values import BackupManifest

DEFAULT_TIMEOUT_SECONDS = 60.0
# The page size of a listing given `after` but no `limit`: one request per page of this many.
PAGE_TASKS = 1000


class ClientApi:
    """What both clients share; a subclass provides ``_init_connections`` and ``_run(build, *args, **kwargs)``.

    ``socket_or_directory``: the daemon's socket, or a queue directory meaning
    its ``walqueued.sock``. ``timeout`` bounds each call (plus ``wait`` for a
    reserve); ``retry_seconds`` bounds how long the calls ``walqueue.retry``
    retries (the reads and ``put``/``put_many``) keep retrying; ``name``
    labels the connections in the daemon's log.
    """

    capabilities = CAPABILITIES  # walqueued does every call beyond the common contract

    def __init__(
        self,
        socket_or_directory: str | os.PathLike,
        *,
        timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
        name: str = "",
    ) -> None:
        self.path = socket_path(socket_or_directory)
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.name = name
        self._closed = False
        self._reached = False  # a daemon answered at this path once: a missing socket is a restart
        self._version = calls.CLIENT_PROTOCOL_VERSIONS[0]  # the hello's protocol version
        self._init_connections()

    def _init_connections(self) -> None:
        raise NotImplementedError

    def _run(self, build: Callable[..., calls.Call], /, *args: Any, **kwargs: Any) -> Any:
        raise NotImplementedError

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def _call_timeout(self, call: calls.Call) -> float | None:
        return None if self.timeout is None else self.timeout + call.wait

    def _retry(self, build: Callable[..., calls.Call], started: float) -> Retry | None:
        """The retries of one call of ``build`` begun at ``started`` (time.monotonic()), or None
        if it is never retried (walqueue.retry, rule 1).

        Asked only once an attempt failed: most calls never need it.
        """
        return retry_for(call_name(build), retry_seconds=self.retry_seconds, now=started,
                         incurable=(NoSocket, HelloRefused))

    def put(
        self,
        task_id: str,
        payload: Mapping[str, Any],
        *,
        key: str | None = None,
        available_at: int = 0,
        delay: int | None = None,
        max_attempts: int = 3,
    ) -> str:
        """Put one task; ``delay`` (seconds from now) is turned into ``available_at`` once.

        Raises InvalidRequest, KeyConflict, DaemonUnavailable.
        """
        return self._run(calls.put_call, task_id, payload, key=key, available_at=available_at, delay=delay,
                         max_attempts=max_attempts, now=time.time())

    def put_many(self, requests: Iterable[Any]) -> list[str]:
        """Put several tasks in one transaction (PutRequest objects or mappings)."""
        return self._run(calls.put_many_call, requests)

    def reserve(self, worker: str, *, lease_seconds: int = 30, limit: int = 1, wait: float = 0) -> list[Lease]:
        """Lease up to ``limit`` due tasks, waiting up to ``wait`` seconds for one. Never retried."""
        return self._run(calls.reserve_call, worker, lease_seconds=lease_seconds, limit=limit, wait=wait)

    def ack(self, lease: Lease) -> None:
        """Complete the leased task. Raises StaleLease if the lease is not current."""
        return self._run(calls.ack_call, lease)

    def ack_and_reserve(self, lease: Lease, *, lease_seconds: int = 30, limit: int = 1,
                        wait: float = 0) -> list[Lease]:
        """Ack ``lease`` and reserve the same worker's next tasks in one round trip and one fsync.

        Raises StaleLease (and reserves nothing) if the ack fails. Never retried: on
        DaemonUnavailable the ack may or may not have happened (retry it with ``ack``).
        """
        return self._run(calls.ack_and_reserve_call, lease, lease_seconds=lease_seconds, limit=limit, wait=wait)

    def release(self, lease: Lease, *, delay: int = 0) -> None:
        """Give the task back, due again after ``delay`` seconds. Raises StaleLease."""
        return self._run(calls.release_call, lease, delay=delay)

    def touch(self, lease: Lease, *, lease_seconds: int) -> Lease:
        """Extend a live lease to ``lease_seconds`` from the daemon's now. Raises StaleLease."""
        return self._run(calls.touch_call, lease, lease_seconds=lease_seconds)

    def revive(self, task_ids: Iterable[str]) -> list[str]:
        """Make dead tasks ready again. Raises InvalidRequest if one is not dead."""
        return self._run(calls.revive_call, task_ids)

    def force_release(self, task_ids: Iterable[str]) -> list[str]:
        """End the current leases of ``task_ids`` now, whoever holds them (an operator's tool).

        Each becomes an ordinary release at the daemon's now (an attempt
        spent; dead at max_attempts), e.g. for leases granted while the
        wall clock was far ahead (docs/security.md). All or nothing: raises
        InvalidRequest, writing nothing, if a task is unknown or not leased.
        Never retried; a daemon older than 0.2 does not know it: InvalidRequest (nothing
        was written), and the daemon closes the connection.
        """
        return self._run(calls.force_release_call, task_ids)

    def get(self, task_id: str) -> TaskView | None:
        """The task, or None if no task has that id."""
        return self._run(calls.get_call, task_id)

    def tasks(self, status: str | None = None, *, after: str | None = None,
              limit: int | None = None) -> list[TaskView]:
        """All tasks (or those with ``status``) in task_id order; with ``after``, only those
        whose id is greater; with ``limit`` (1 to 10,000), at most that many.

        With ``limit`` it is one request that costs the daemon O(limit)
        (SPEC §8b): page on with ``after=`` the last id. With ``after`` alone
        the client asks for pages of PAGE_TASKS until the last, so the answer
        is not one moment's state (a task may move between pages). Without
        either it is one listing, as before. A daemon older than the paged listing knows no
        pages: InvalidRequest, and it closes the connection.
        """
        if after is None and limit is None:
            return self._run(calls.tasks_call, status)
        if limit is not None:
            return self._run(calls.tasks_page_call, status, after=after, limit=limit)
        return self._all_pages(status, after)

    def _all_pages(self, status: str | None, after: str) -> list[TaskView]:
        views: list[TaskView] = []
        while True:
            page = self._run(calls.tasks_page_call, status, after=after, limit=PAGE_TASKS)
            views += page
            if len(page) < PAGE_TASKS:
                return views
            after = page[-1].task_id

    def cancel(self, task_id: str) -> None:
        """Complete a dead task, or a ready one that is due, without running it (SPEC §8b).

        Written as a revive (if dead), a reserve and an ack by the worker
        ``walqueue:cancel``, in one batch and one fsync; the key stays taken.
        A completed task: nothing happens (so a lost answer is retried).
        Raises InvalidRequest, naming the case, for a task not yet due, leased
        or unknown.
        """
        return self._run(calls.cancel_call, task_id)

    def workers(self) -> list[WorkerView]:
        """Every worker name holding a lease or used by an open connection, by name (SPEC §8b)."""
        return self._run(calls.workers_call)

    def connections(self) -> list[ConnectionView]:
        """Each open connection that sent a request: its worker names, the leases they hold, its
        requests and its last request's age (walqueue.protocol.ConnectionView). Not SPEC's: the
        daemon's own view beside `workers()`; a daemon older than it closes the connection
        (UnknownRequest)."""
        return self._run(calls.connections_call)

    def stats(self) -> QueueStats:
        return self._run(calls.stats_call)

    def compact(self) -> int:
        """Compact now; returns the published snapshot's seq.

        Raises InvalidRequest while a backup holds its files (walqueue-ctl backup).
        """
        return self._run(calls.compact_call)

    def pause(self) -> bool:
        """Stop leasing: reserves get nothing (waiting ones wait) until resume(). Returns True.

        Puts, acks, releases, touches and revives go on. The pause lives in the
        daemon's memory: a daemon restart resumes.
        """
        return self._run(calls.pause_call)

    def resume(self) -> bool:
        """Lease again (waiting reserves first, in arrival order). Returns False."""
        return self._run(calls.resume_call)

    def backup_begin(self) -> BackupManifest:
        """Make everything durable and pin the files of a consistent copy; returns their manifest.

        The pin holds until backup_end() or until the connection that asked
        for it closes (the sync client has one connection per thread: call
        both from one thread); copy with ``walqueue.backup.copy_manifest``.
        Raises InvalidRequest if another backup is in progress.
        """
        return self._run(calls.backup_begin_call)

    def backup_end(self) -> None:
        """Release the pin. Raises InvalidRequest if this connection holds none
        (e.g. it was lost and replaced since backup_begin(): the pin ended with it)."""
        return self._run(calls.backup_end_call)

    def daemon_stats(self) -> DaemonStats:
        """The daemon's full report: ``stats()`` plus its own figures (walqueue.metrics)."""
        return self._run(calls.daemon_stats_call)
