"""Group commit: one ``queue.batch()`` per loop turn, its fsync, and the reopen after a failed write.

The durability boundary of walqueued is here and only here. `GroupCommit.turn`
runs the turn's work (the service applying its requests) inside ONE
``Engine.batch()``, so every write of the turn shares one fsync (SPEC §6), and
reports whether the batch exited without error: only then may the turn's
answers be sent, so no answer ever reports success for a write that is not
on disk yet.

A failed write is what the file system raises (OSError: ENOSPC, EIO, ...,
also from a fault-injection hook) or what the Engine raises once it has
closed itself after one (QueueClosed). Then every request of the turn is
answered QueueClosed (it may or may not have taken effect), the Engine is
dropped and opened again from disk; if that fails the daemon exits non-zero
for its supervisor (DaemonExit). Nothing else is caught: a bug in request
handling (a TypeError, say) propagates out of the loop, which logs its
traceback and exits non-zero, instead of being answered as a "write
failure" and reopening a queue that may be fine while the bug remains.

Compaction is driven from here too: the group commit owns the `Compactor`
(walqueue.daemon.compaction), which writes snapshots from a forked child
while the loop serves, and whose child a reopen kills first (its Engine is
gone). The recorder only observes: it is told how long each batch's end
(the fsync) took, how many requests it held, and what failed.
"""

from __future__ import annotations

from collections.abc import Callable

from walqueue import CorruptStore, WalQueueError
from walqueue.engine import Engine

from .clock import Clock
from .compaction import (
    CHILD_DEADLINE_FLOOR_SECONDS,
    DEFAULT_COMPACT_WAL_RATIO,
    WRITE_FAILURES,
    Compactor,
    free_bytes,
    freeze_heap,
)
from .exits import EXIT_CORRUPT, EXIT_FAILURE, DaemonExit
from .log import log
from .recorder import Recorder
from .service import QueueService

# WRITE_FAILURES (from .compaction): what a failed write raises; anything else is a bug.
__all__ = ["WRITE_FAILURES", "GroupCommit"]


class GroupCommit:
    """The batch around each turn, its failure handling, and compaction (``compaction``).

    ``open_queue()`` opens the directory's Engine again after a failure
    (raising what ``Engine()`` raises). ``watch``/``unwatch``, ``child_hook``,
    ``free_bytes`` and ``child_deadline_floor_seconds`` go to the `Compactor`.
    """

    def __init__(self, service: QueueService, *, directory: str, open_queue: Callable[[], Engine],
                 recorder: Recorder, clock: Clock, compact_wal_bytes: int,
                 compact_wal_ratio: float = DEFAULT_COMPACT_WAL_RATIO,
                 watch: Callable[[int], None] = lambda fd: None,
                 unwatch: Callable[[int], None] = lambda fd: None,
                 child_hook: Callable[[], None] | None = None,
                 free_bytes: Callable[[str], int] = free_bytes,
                 child_deadline_floor_seconds: float = CHILD_DEADLINE_FLOOR_SECONDS) -> None:
        self.service = service
        self.directory = directory
        self._open_queue = open_queue
        self._recorder = recorder
        self._clock = clock
        self.compaction = Compactor(service, recorder, clock, directory=directory,
                                    floor_bytes=compact_wal_bytes, ratio=compact_wal_ratio,
                                    reopen=self.reopen, watch=watch, unwatch=unwatch,
                                    child_hook=child_hook,
                                    free_bytes=free_bytes,
                                    child_deadline_floor_seconds=child_deadline_floor_seconds)

    def turn(self, apply: Callable[[], None]) -> bool:
        """Run ``apply()`` (the service's work for this turn) inside one batch.

        Returns True if the batch exited without error: the turn's answers may
        be sent. On a failed write the turn's requests are answered with an
        error and the Engine is reopened (False). Raises DaemonExit if the
        reopen fails, and whatever else ``apply`` raises.
        """
        queue = self.service.queue
        fsyncing = False
        try:
            with queue.batch():
                try:
                    apply()
                finally:
                    fsyncing = queue.unsynced()
                    requests = self.service.requests_this_turn
                    started = self._clock.monotonic_seconds()
        except WRITE_FAILURES as exc:
            # A failed fsync is a write failure to count, not an fsync.
            self._recorder.batch_ended(self._clock.monotonic_seconds() - started, requests, False)
            self._write_failed(exc)
            return False
        self._recorder.batch_ended(self._clock.monotonic_seconds() - started, requests, fsyncing)
        return True

    def _write_failed(self, exc: BaseException) -> None:
        """Answer every request of the failed batch with an error, then reopen the queue."""
        message = (
            f"write failed ({type(exc).__name__}: {exc}); the daemon reopened the queue; "
            "the request may or may not have taken effect (a retried put is safe)"
        )
        answered = self.service.fail_turn(message)
        log.error("write failed, answered %d request(s) with an error: %r", answered, exc)
        self._recorder.write_failed()
        self.reopen()

    def reopen(self) -> None:
        """Drop the Engine and open it again from disk. Raises DaemonExit if that fails."""
        self.compaction.reset("the queue was reopened after a failed write")
        old = self.service.replace_queue(None)
        self._recorder.expired_before_reopens += old.expired_total  # the counter outlives its Engine
        try:
            old.close()
        except WRITE_FAILURES as exc:  # the queue is being discarded either way
            log.warning("closing the failed queue raised %r", exc)
        started = self._clock.monotonic_seconds()
        try:
            queue = self._open_queue()
        except CorruptStore as exc:
            raise DaemonExit(EXIT_CORRUPT, f"reopening {self.directory} failed: CorruptStore: {exc}") from exc
        except (OSError, WalQueueError) as exc:
            raise DaemonExit(EXIT_FAILURE, f"reopening {self.directory} failed: {exc!r}") from exc
        self.service.queue = queue
        freeze_heap()  # the reopened state: out of the cyclic collector's reach
        self.compaction.snapshot_bytes = self.compaction.published_snapshot_bytes()
        self._recorder.recovered(self._clock.monotonic_seconds() - started)
        log.info("reopened %s", self.directory)
