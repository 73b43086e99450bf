"""The queue as the dashboard reads and changes it: one backend client (a daemon's or
PostgreSQL's, SPEC §8 and §9) behind a small thread pool.

The clients are synchronous, so every call runs on one of THREADS threads,
never on the event loop: however many browsers are open, the daemon sees at
most THREADS connections from the dashboard (plus the sampler's turn on one
of them), and a slow answer delays pages, not the server. The overview's
figures are read at most once per FRESH_SECONDS whatever the number of
pages refreshing (a dashboard must not become the daemon's load).

Listings are read in pages (SPEC §8b `tasks(status, after=, limit=)`), never
whole: one page costs the backend O(limit) whatever the size of the queue.
"""

from __future__ import annotations

import asyncio
import functools
import inspect
import threading
import time
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any

from walqueue import InvalidRequest, QueueStats, TaskView
from walqueue.backend import DAEMON_STATS, FORCE_RELEASE
from walqueue.protocol.errors import UnknownRequest

from .samples import History, Sample

THREADS = 2
FRESH_SECONDS = 1.0
STATUSES = ("ready", "leased", "completed", "dead")
MAX_PAGE_SIZE = 200


class PagingUnsupported(RuntimeError):
    """The backend's client lists tasks only whole (before SPEC §8b); the dashboard refuses to."""


@dataclass(frozen=True)
class Overview:
    at: float
    stats: QueueStats
    daemon: Any | None  # walqueue.metrics.DaemonStats where the backend has it


@dataclass(frozen=True)
class Page:
    tasks: list[TaskView]
    next_after: str | None  # the cursor of the next page, None on the last one


@dataclass(frozen=True)
class Outcome:
    """What a write did: the ids it changed, and the refusals, one message per id or per call."""

    changed: list[str]
    refused: list[str]


class Source:
    """The dashboard's backend: reads, writes and the history sampler, off the event loop."""

    def __init__(self, client: Any, *, clock: Callable[[], float] = time.time,
                 threads: int = THREADS) -> None:
        self.client = client
        self.capabilities: frozenset[str] = frozenset(getattr(client, "capabilities", frozenset()))
        self.clock = clock
        self.history = History()
        self._executor = ThreadPoolExecutor(threads, thread_name_prefix="walqueue-web")
        self._overview: Overview | None = None
        self._overview_lock = threading.Lock()

    @property
    def has_daemon_stats(self) -> bool:
        return DAEMON_STATS in self.capabilities

    @property
    def can_force_release(self) -> bool:
        return FORCE_RELEASE in self.capabilities

    async def run(self, function: Callable[..., Any], /, *args: Any, **kwargs: Any) -> Any:
        """`function(*args, **kwargs)` on the pool; its exception is raised here."""
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(function, *args, **kwargs))

    def close(self) -> None:
        self._executor.shutdown(wait=True, cancel_futures=True)
        self.client.close()

    # -- reads -------------------------------------------------------------------------

    def overview(self) -> Overview:
        """The counts and the daemon's figures, at most FRESH_SECONDS old."""
        with self._overview_lock:
            now = self.clock()
            if self._overview is None or not 0 <= now - self._overview.at < FRESH_SECONDS:
                daemon = self.client.daemon_stats() if self.has_daemon_stats else None
                stats = daemon.queue if daemon is not None else self.client.stats()
                self._overview = Overview(now, stats, daemon)
            return self._overview

    def read_sample(self) -> Sample:
        """One sample for the history (the sampler reads one every SAMPLE_SECONDS, on the pool,
        and adds it on the event loop, the only thread that touches the history)."""
        overview = self.overview()
        stats, daemon = overview.stats, overview.daemon
        sample = Sample(
            at=overview.at,
            total=stats.ready + stats.leased + stats.completed + stats.dead,
            completed=stats.completed,
            expired=self._expired_total(daemon),
            started=getattr(daemon, "start_time_seconds", None),
            compactions=getattr(daemon, "compactions_total", None),
            last_compaction_seconds=getattr(daemon, "last_compaction_seconds", None),
            last_compaction_pause_seconds=getattr(daemon, "last_compaction_pause_seconds", None))
        return sample

    def _expired_total(self, daemon: Any | None) -> int | None:
        """Leases expired so far, where the backend counts them: walqueued's report (protocol
        version 7), PostgreSQL's `expired_total()` (schema version 3); None elsewhere."""
        if daemon is not None:
            return getattr(daemon, "expired_total", None)
        counted = getattr(self.client, "expired_total", None)
        return counted() if callable(counted) else None

    def page(self, status: str | None, prefix: str, after: str | None, size: int) -> Page:
        """At most `size` tasks (of `status`, their id starting with `prefix`) after `after`.

        Ids starting with a prefix P are P itself and then, in task_id order,
        the ids right after P; so a prefix costs one `get` and a listing from
        P, never a scan.
        """
        if status is not None and status not in STATUSES:
            raise InvalidRequest(f"status {status!r} is not one of {', '.join(STATUSES)}")
        if not 1 <= size <= MAX_PAGE_SIZE:
            raise InvalidRequest(f"a page holds 1 to {MAX_PAGE_SIZE} tasks, not {size}")
        rows: list[TaskView] = []
        if prefix and (after is None or after < prefix):
            exact = self.client.get(prefix)
            if exact is not None and (status is None or exact.status == status):
                rows.append(exact)
            after = prefix
        for task in self._listing(status, after, size + 1 - len(rows)):
            if prefix and not task.task_id.startswith(prefix):
                break
            rows.append(task)
        if len(rows) > size:
            return Page(rows[:size], rows[size - 1].task_id)
        return Page(rows, None)

    def _listing(self, status: str | None, after: str | None, limit: int) -> Iterable[TaskView]:
        if limit <= 0:
            return []
        if "after" not in inspect.signature(self.client.tasks).parameters:
            raise PagingUnsupported("this backend's client lists tasks only whole; walqueue-web "
                                    "needs paged listings (SPEC §8b: tasks(status, after=, limit=))")
        return list(self.client.tasks(status, after=after, limit=limit))

    def task(self, task_id: str) -> TaskView | None:
        return self.client.get(task_id)

    def workers(self) -> list[Any]:
        return list(self.client.workers())

    def connections(self) -> list[Any] | None:
        """walqueued's open connections (walqueue.protocol.ConnectionView): [] where the backend
        has none to show (PostgreSQL), None from a daemon too old to know the request."""
        if not self.has_daemon_stats or not callable(getattr(self.client, "connections", None)):
            return []
        try:
            return list(self.client.connections())
        except UnknownRequest:
            return None

    # -- writes (the app checks --allow-writes and the CSRF token first) ---------------

    def revive(self, task_ids: list[str]) -> Outcome:
        try:
            return Outcome(list(self.client.revive(task_ids)), [])
        except InvalidRequest as exc:
            return Outcome([], [str(exc)])

    def force_release(self, task_ids: list[str]) -> Outcome:
        try:
            return Outcome(list(self.client.force_release(task_ids)), [])
        except InvalidRequest as exc:
            return Outcome([], [str(exc)])

    def cancel(self, task_ids: list[str]) -> Outcome:
        """Cancel each task in turn: one refused (not due, leased, unknown) does not stop the rest."""
        changed, refused = [], []
        for task_id in task_ids:
            try:
                self.client.cancel(task_id)
            except InvalidRequest as exc:
                refused.append(str(exc))
            else:
                changed.append(task_id)
        return Outcome(changed, refused)
