"""`Queue`: the library's durable queue over one directory (SPEC §1-§6).

The library face of `walqueue.engine.Engine`, which does every operation:
this validates a put's arguments (validation.put_request, copying the
payload), reads a lease's task_id, worker and generation, and hands back
the library's values (Lease, TaskView: copies, never the stored objects).
What walqueued needs beyond SPEC's API is the Engine's alone, reached as
`Queue.engine` or by opening an Engine.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from . import validation
from .engine import LOCK, PHASES, Engine, lease_of, view_of
from .fs import Directory, OsFileSystem
from .values import BackupManifest, Lease, PutRequest, QueueStats, TaskView, WorkerView

__all__ = ["LOCK", "PHASES", "Queue"]


class Queue:
    """A single-writer durable task queue stored in `directory`.

    `preallocate_bytes` N > 0 keeps the active WAL segment's next frame in a
    preallocated region, grown N bytes at a time, and syncs with fdatasync
    (see wal.ActiveSegment); 0, the default, appends and fsyncs. Either way
    the frames on disk are the same, and a closed directory holds only them.

    Raises InvalidRequest for a bad `preallocate_bytes` (before touching the
    directory), QueueLocked if another owner holds the directory,
    CorruptStore if its files are damaged (naming the file and offset or seq).
    """

    def __init__(self, directory: str | os.PathLike, *, hook: Callable[[str], Any] | None = None,
                 filesystem: OsFileSystem | None = None, preallocate_bytes: int = 0,
                 opened: Directory | None = None) -> None:
        self.engine = Engine(directory, hook=hook, filesystem=filesystem,
                             preallocate_bytes=preallocate_bytes, opened=opened, stacklevel=3)

    @classmethod
    def over(cls, engine: Engine) -> Queue:
        """The library face over an Engine already open (closing either closes both)."""
        queue = cls.__new__(cls)
        queue.engine = engine
        return queue

    # -- writes -----------------------------------------------------------

    def put(self, task_id: str, payload: Mapping, *, key: str | None = None,
            available_at: int = 0, max_attempts: int = 3) -> str:
        """Add a task, or return the id of the identical task already put.

        Raises InvalidRequest for a malformed argument, KeyConflict when the
        key or task id is taken by a different request.
        """
        self.engine.check_open()
        return self.engine.put([validation.put_request(task_id, payload, key, available_at,
                                                       max_attempts)])[0]

    def put_many(self, requests: Iterable[PutRequest | Mapping]) -> list[str]:
        """Put several tasks in one transaction: all new tasks, or nothing.

        Each request is a PutRequest or a mapping with its field names.
        Returns one id per request, in request order.
        """
        self.engine.check_open()
        return self.engine.put(validation.put_requests(requests))

    def reserve(self, worker: str, *, now: int, lease_seconds: int, limit: int = 1) -> list[Lease]:
        """Expire leases due at `now`, then lease up to `limit` due tasks.

        Returns the leases in (available_at, task_id) order.
        """
        return [lease_of(task) for task in
                self.engine.reserve(worker, now=now, lease_seconds=lease_seconds, limit=limit)]

    # A lease operation reads only the lease's task_id, worker and generation.

    def ack(self, lease: Lease, *, now: int) -> None:
        """Complete the task held by `lease`. Raises StaleLease if it is not current."""
        self.engine.ack(*_identity_of(lease), now=now)

    def release(self, lease: Lease, *, now: int, delay: int = 0) -> None:
        """Give the task back, available again at now + delay (or dead at max_attempts)."""
        self.engine.release(*_identity_of(lease), now=now, delay=delay)

    def touch(self, lease: Lease, *, now: int, lease_seconds: int) -> Lease:
        """Extend a live lease to now + lease_seconds; returns the new Lease."""
        return lease_of(self.engine.touch(*_identity_of(lease), now=now, lease_seconds=lease_seconds))

    def revive(self, task_ids: Iterable[str], *, now: int) -> list[str]:
        """Make dead tasks ready again (attempts 0, available at `now`).

        Returns the ids, duplicates dropped, in order. Raises InvalidRequest,
        writing nothing, if any listed task is unknown or not dead.
        """
        return self.engine.revive(task_ids, now=now)

    def cancel(self, task_id: str, *, now: int) -> None:
        """Complete a dead task, or a ready one due at `now`, without leasing it to anyone
        (SPEC §8b; walqueue.cancel): its revive (if dead), reserve and ack by the worker
        `walqueue:cancel`, in one batch. A completed task: nothing happens.

        Raises InvalidRequest, writing nothing, for a task not yet due, leased or unknown.
        """
        self.engine.cancel(task_id, now=now)

    # -- reads ------------------------------------------------------------

    def get(self, task_id: str) -> TaskView | None:
        task = self.engine.get(task_id)
        return None if task is None else view_of(task)

    def tasks(self, status: str | None = None, *, after: str | None = None,
              limit: int | None = None) -> Iterator[TaskView]:
        """The tasks (optionally of one status) in task_id order; with `after`, only those
        whose id is greater; with `limit`, at most that many (walqueue.listing: O(limit)).

        The order is fixed when called; each view reflects the task when the
        iterator reaches it (a page's views: the tasks when called).
        """
        if after is None and limit is None:
            return map(view_of, self.engine.tasks(status))
        return iter(list(map(view_of, self.engine.page(status, after=after, limit=limit))))

    def workers(self) -> list[WorkerView]:
        """Every worker that holds a lease, with how many, by name (SPEC §8b; `connected` is
        False: a library has no connections)."""
        return [WorkerView(worker, leases, False) for worker, leases in self.engine.lease_holders()]

    def stats(self) -> QueueStats:
        return self.engine.stats()

    # -- group commit, compaction, backup, closing ------------------------

    def batch(self):
        """Group commit: one fsync (and `wal.after_sync`) when the block exits.

        Nested batches join the outer one. The fsync also happens when the
        block exits by an exception, which then propagates. Report success for
        the operations inside only after the block has exited without error.
        """
        return self.engine.batch()

    def compact(self) -> int:
        """Publish a snapshot of the whole state and drop the WAL it covers.

        Returns the published snapshot's seq (the previous one if nothing was
        appended since it).
        """
        return self.engine.compact()

    def backup_manifest(self) -> BackupManifest:
        """The files a consistent copy needs, as of the last seq, made durable first
        (walqueue.backup.copy_manifest copies them; see Engine.backup_manifest)."""
        return self.engine.backup_manifest()

    def close(self) -> None:
        """Make anything written durable and release the directory. Idempotent."""
        self.engine.close()

    def __enter__(self) -> Queue:
        self.engine.check_open()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        engine = self.engine
        state = "closed" if engine.closed else f"seq {engine.stats().last_seq}"
        return f"<Queue {engine.directory!r} {state}>"


def _identity_of(lease: Any) -> tuple[Any, Any, Any]:
    """What names a lease (any object with these attributes; the Engine checks them)."""
    return (getattr(lease, "task_id", None), getattr(lease, "worker", None),
            getattr(lease, "generation", None))
