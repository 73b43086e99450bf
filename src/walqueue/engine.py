"""`Engine`: the durable queue over one directory, every operation's one code path (SPEC §1-§6).

It holds the directory lock, recovers at open, turns each operation into a
WAL record, writes it through the state machine's `check` -> write ->
`commit`, calls the fault-injection hook at the named phases, groups fsyncs
in `batch()` and compacts, whole or in steps. Two faces use it: the
library's `Queue` (walqueue.queue: SPEC's API, library values, copies
of payloads) and walqueued (walqueue.daemon), which also needs what SPEC's
API leaves out: puts without a copy of their payload, the reap alone, the
next due time, compaction in steps, figures for monitoring. It takes
scalars and validated put requests (validation.put_request) and answers
with the state's own `Task` objects (never keep or change one: `lease_of`
and `view_of` make the library's values of them).

Rules this module keeps:
  - nothing is written before the arguments and the state have been checked,
    so a rejected call leaves the Engine open and the files unchanged;
  - the in-memory state changes only after its frame is in the file, and an
    operation returns only after the fsync that makes its frame durable
    (the end of its batch);
  - when a hook raises or a write/fsync fails, the Engine closes itself at
    once, as a dead process would: files closed, lock released, no fsync.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from . import cancel as cancelling
from . import listing, replay, validation
from .codec import FRAME_OVERHEAD_BYTES, encode_frame
from .errors import QueueClosed
from .fs import Directory, OsFileSystem
from .snapshot import snapshot_name
from .state import LEASED, MAX_EXPIRE_IDS, Task
from .store import LOCK, Store
from .values import BackupManifest, Lease, QueueStats, TaskView, copy_json

__all__ = ["LOCK", "PHASES", "Compaction", "Engine", "lease_of", "view_of"]
PHASES = (
    "wal.before_write", "wal.after_write", "wal.after_sync", "wal.after_rotate",
    "snapshot.after_write", "current.after_write", "current.after_publish",
    "compact.after_delete", "recover.after_truncate",
)


class Engine:
    """The single writer of the queue stored in `directory`.

    `preallocate_bytes` N > 0 keeps the active WAL segment's next frame in a
    preallocated region, grown N bytes at a time, and syncs with fdatasync
    (see wal.ActiveSegment); 0, the default, appends and fsyncs. Either way
    the frames on disk are the same, and a closed directory holds only them.
    `opened` is a directory the caller reached and judged itself (walqueued,
    which refuses what this only warns about); `stacklevel` is the warnings'
    (UnsafeDirectoryWarning), for a face that opens an Engine in its own name.

    Raises InvalidRequest for a bad `preallocate_bytes` (before touching the
    directory), QueueLocked if another owner holds the directory,
    CorruptStore if its files are damaged (naming the file and offset or seq).
    """

    def __init__(self, directory: str | os.PathLike, *, hook: Callable[[str], Any] | None = None,
                 filesystem: OsFileSystem | None = None, preallocate_bytes: int = 0,
                 opened: Directory | None = None, stacklevel: int = 2) -> None:
        self.directory = os.fspath(directory)
        self._closed = True
        self._batch_depth = 0
        self._compaction: Compaction | None = None
        self.expired_total = 0  # leases this Engine expired (reserve's reap and expire_due): a metric
        # The directory's files (walqueue.store), recovered: the state they hold.
        self._store, self._state = Store.open(self.directory, hook=hook, filesystem=filesystem,
                                              preallocate_bytes=preallocate_bytes, opened=opened,
                                              stacklevel=stacklevel + 1)
        # State.check and State.commit, or their compiled twin (walqueue.replay).
        self._check, self._commit = replay.writer_steps(self._state)
        self._closed = False

    # -- writes -----------------------------------------------------------

    def put(self, requests: list[dict]) -> list[str]:
        """Put validated requests (validation.put_request) in one transaction: all new, or nothing.

        Returns one id per request, in request order (an identical retry's is
        the task already put). Raises KeyConflict when a key or task id is
        taken by a different request. A payload is stored as it is: the
        caller hands it over (validation.put_request copies unless told not to).
        """
        self.check_open()
        if not requests:
            return []
        ids, new = self._state.plan_put(requests)
        if new:
            with self.batch():
                self._append({"op": "put", "seq": self._next_seq(), "tasks": new})
        return ids

    def reserve(self, worker: str, *, now: int, lease_seconds: int, limit: int = 1) -> list[Task]:
        """Expire leases due at `now`, then lease up to `limit` due tasks.

        Returns the leased tasks in (available_at, task_id) order: the state's
        own objects, with the STORED payload (lease_of copies it).
        """
        self.check_open()
        cancelling.check_worker(validation.name(worker, "worker"))
        validation.integer(now, "now")
        validation.integer(lease_seconds, "lease_seconds", minimum=1)
        validation.integer(limit, "limit", minimum=1, maximum=validation.MAX_RESERVE_LIMIT)
        validation.time_plus(now, lease_seconds, "lease_seconds")
        state = self._state
        with self.batch():
            self._reap(now)
            task_ids = state.due_ready(now, limit)
            if not task_ids:
                return []
            self._append({"lease_seconds": lease_seconds, "now": now, "op": "reserve",
                          "seq": self._next_seq(), "task_ids": task_ids, "worker": worker})
        tasks = state.tasks
        return [tasks[task_id] for task_id in task_ids]

    def expire_due(self, *, now: int) -> int:
        """Reap alone: expire every lease with deadline <= `now`, as reserve does first.

        Writes the same `expire` frames reserve's reap would (none if no lease
        is due) and leases nothing. Returns how many leases expired. Not part
        of SPEC §1: walqueued calls it when a lease's deadline passes (§8a).
        """
        self.check_open()
        validation.integer(now, "now")
        with self.batch():
            return self._reap(now)

    def _reap(self, now: int) -> int:
        """Expire the leases due at `now`, at most MAX_EXPIRE_IDS a frame. Inside a batch."""
        state, count = self._state, 0
        while expired := state.expired(now, MAX_EXPIRE_IDS):
            self._append({"now": now, "op": "expire", "seq": self._next_seq(),
                          "task_ids": expired})
            count += len(expired)
        self.expired_total += count
        return count

    # A lease is named by its task_id, worker and generation (errors call them lease.*).

    def ack(self, task_id: str, worker: str, generation: int, *, now: int) -> None:
        """Complete the task held by the lease. Raises StaleLease if it is not current."""
        self._lease_operation(self._lease_record("ack", task_id, worker, generation, now))

    def release(self, task_id: str, worker: str, generation: int, *, now: int, delay: int = 0) -> None:
        """Give the task back, available again at now + delay (or dead at max_attempts)."""
        record = self._lease_record("release", task_id, worker, generation, now)
        record["delay"] = validation.integer(delay, "delay")
        validation.time_plus(now, delay, "delay")
        self._lease_operation(record)

    def touch(self, task_id: str, worker: str, generation: int, *, now: int, lease_seconds: int) -> Task:
        """Extend a live lease to now + lease_seconds; returns the task, leased anew."""
        record = self._lease_record("touch", task_id, worker, generation, now)
        record["lease_seconds"] = validation.integer(lease_seconds, "lease_seconds", minimum=1)
        validation.time_plus(now, lease_seconds, "lease_seconds")
        return self._lease_operation(record)

    def _lease_record(self, op: str, task_id: Any, worker: Any, generation: Any, now: Any) -> dict:
        """The checked fields of a lease operation's record, in the order they are checked."""
        self.check_open()
        return {"op": op,
                "task_id": validation.name(task_id, "lease.task_id"),
                "worker": validation.name(worker, "lease.worker"),
                "generation": validation.integer(generation, "lease.generation"),
                "now": validation.integer(now, "now")}

    def _lease_operation(self, record: dict) -> Task | None:
        with self.batch():
            record["seq"] = self._next_seq()
            self._append(record)
        return self._state.tasks.get(record["task_id"])   # None after an ack

    def revive(self, task_ids: Iterable[str], *, now: int) -> list[str]:
        """Make dead tasks ready again (attempts 0, available at `now`).

        Returns the ids, duplicates dropped, in order. Raises InvalidRequest,
        writing nothing, if any listed task is unknown or not dead.
        """
        self.check_open()
        if isinstance(task_ids, (str, bytes)) or not isinstance(task_ids, Iterable):
            raise validation.InvalidRequest("task_ids must be a list of task ids")
        unique = list(dict.fromkeys(validation.name(task_id, f"task_ids[{index}]")
                                    for index, task_id in enumerate(task_ids)))
        validation.integer(now, "now")
        if not unique:
            return []
        with self.batch():
            self._append({"now": now, "op": "revive", "seq": self._next_seq(), "task_ids": unique})
        return unique

    def cancel(self, task_id: str, *, now: int) -> None:
        """SPEC §8b: complete a dead task, or a ready one due at `now`, unleased, as the records
        walqueue.cancel plans (revive if dead, reserve and ack by `walqueue:cancel`) in one
        batch; finish a cancel a crash interrupted; nothing for a completed task.

        Raises InvalidRequest, writing nothing, for a task not yet due, leased or unknown.
        """
        self.check_open()
        validation.name(task_id, "task_id")
        validation.time_plus(validation.integer(now, "now"), cancelling.CANCEL_LEASE_SECONDS,
                             f"the cancel's lease (now + {cancelling.CANCEL_LEASE_SECONDS})")
        task = self._state.get(task_id)
        view = None if task is None else view_of(task)
        if cancelling.check(task_id, view, now):
            with self.batch():
                for record in cancelling.records(view, now):
                    record["seq"] = self._next_seq()
                    self._append(record)

    # -- reads ------------------------------------------------------------

    def page(self, status: str | None, *, after: str | None, limit: int | None) -> list[Task]:
        """A page of `tasks(status)`: those whose id is greater than `after`, at most `limit`
        (walqueue.listing: O(log n + limit)), as they are now. Raises InvalidRequest."""
        self.check_open()
        validation.status(status)
        after, limit = listing.check_page(after, limit)
        state = self._state
        return [state.tasks[item] if type(item) is str else state.get(item.task_id)
                for item in listing.page(state.live_index, state.tombstones, status, after, limit)]

    def lease_holders(self) -> list[tuple[str, int]]:
        """(worker, leases held) for every worker holding a lease, by name: O(leases)."""
        self.check_open()
        return listing.lease_holders(self._state.live_index, self._state.tasks)

    def get(self, task_id: str) -> Task | None:
        """The task (the state's own object; a completed one a fresh copy), or None."""
        self.check_open()
        validation.name(task_id, "task_id")
        return self._state.get(task_id)

    def tasks(self, status: str | None = None) -> Iterator[Task]:
        """The tasks (optionally of one status) in task_id order.

        The order is fixed when called; each task is as it is when the
        iterator reaches it.
        """
        self.check_open()
        validation.status(status)
        return self._state.in_order(status)

    def stats(self) -> QueueStats:
        self.check_open()
        counts = self._state.counts
        return QueueStats(ready=counts["ready"], leased=counts["leased"],
                          completed=counts["completed"], dead=counts["dead"],
                          last_seq=self._state.last_seq, snapshot_seq=self._store.snapshot_seq,
                          wal_bytes=self._store.wal_bytes)

    @property
    def wal_bytes(self) -> int:
        """``stats().wal_bytes`` without building the stats: walqueued asks after every write."""
        return self._store.wal_bytes

    def next_due_time(self) -> int | None:
        """The earliest time at which `reserve` could lease or expire something.

        walqueued wakes parked workers by it, without polling. None when
        nothing is ready or leased.
        """
        self.check_open()
        return self._state.next_due_time()

    def next_lease_deadline(self) -> int | None:
        """The earliest deadline of a lease, or None: walqueued's timer for `expire_due`."""
        self.check_open()
        return self._state.next_lease_deadline()

    # -- monitoring (walqueued's metrics) --------------------------------

    def ready_due_since(self, now: int, seq_time: Callable[[int], int]) -> int | None:
        """The earliest time since which a ready task has been due (see State.ready_due_since)."""
        self.check_open()
        return self._state.ready_due_since(now, seq_time)

    def leases_past_half(self, now: int) -> int:
        """How many leases are at or past half their time at `now` (see State.leases_past_half)."""
        self.check_open()
        return self._state.leases_past_half(now)

    def segment_count(self) -> int:
        """WAL segment files this Engine holds: the sealed ones and the active one."""
        self.check_open()
        return self._store.segment_count()

    def unsynced(self) -> bool:
        """True while frames appended in the open batch still wait for its fsync."""
        return not self._closed and self._store.unsynced

    # -- group commit, compaction, closing ------------------------------

    def batch(self) -> _Batch:
        """Group commit: one fsync (and `wal.after_sync`) when the block exits.

        Nested batches join the outer one. The fsync also happens when the
        block exits by an exception, which then propagates. Report success for
        the operations inside only after the block has exited without error.
        """
        self.check_open()
        # A new one each time: one kept on the Engine would be a reference cycle, and a
        # discarded, unclosed Engine would keep its lock until the garbage collector ran.
        return _Batch(self)

    def compact(self) -> int:
        """Publish a snapshot of the whole state and drop the WAL it covers.

        Returns the published snapshot's seq (the previous one if nothing was
        appended since it).
        """
        self.check_open()
        self._refuse_during_compaction()
        self._sync()
        seq = self._state.last_seq
        if seq == self._store.snapshot_seq:
            return seq
        try:
            for step in self._compaction_steps():
                step(seq)
            self._store.published(seq, self._state.snapshot_growth)
        except BaseException:
            self._die()
            raise
        return seq

    def backup_manifest(self) -> BackupManifest:
        """The files a consistent copy needs, as of the last seq, made durable first.

        Not part of SPEC's API: `walqueue.backup` copies what it lists, and
        walqueued hands it to `walqueue-ctl backup`. Sealed segments and
        snapshots never change and the active segment only grows past the
        listed length, so the listed bytes stay valid until a compaction
        deletes them: the caller keeps compaction away until the copy is
        done (walqueued pins them). A queue that holds records but was never
        compacted is compacted first, so that every copy with data has a
        CURRENT, which the copy writes last: until then a half copy starts
        after seq 1 and fails to open instead of opening with fewer records.
        """
        self.check_open()
        if self._store.snapshot_file is None and self._state.last_seq > 0:
            self.compact()  # refused while a compaction in steps is in progress
        else:
            self._sync()
        return BackupManifest(os.path.abspath(self.directory), self._state.last_seq,
                              tuple(self._store.manifest_files()))

    # -- compaction in steps (not part of SPEC's API) ---------------------
    # walqueued writes the snapshot from a forked child while it goes on
    # serving (SPEC §8a). The steps and their order are compact()'s; only the
    # snapshot's writing is moved out of this process.

    def begin_compaction(self) -> Compaction | None:
        """Rotate the WAL and fix what the next snapshot holds: the state as of now.

        Returns None when nothing was appended since the last snapshot. The
        caller then writes the snapshot with `write_compaction_snapshot` from
        a copy of this process taken before anything else is appended (the
        daemon forks at once), and calls `finish_compaction` once that copy
        has written and fsynced it, or `abandon_compaction` if it failed.
        Appends may go on meanwhile: they go to the new segment, which the
        snapshot does not cover. One compaction at a time; `compact()` is
        refused while one is in progress. Runs the hook at wal.after_rotate;
        a failing rotation closes the Queue, as any failed write does.
        """
        self.check_open()
        self._refuse_during_compaction()
        self._sync()
        seq, store = self._state.last_seq, self._store
        if seq == store.snapshot_seq:
            return None
        try:
            store.rotate(seq)
        except BaseException:
            self._die()
            raise
        self._compaction = Compaction(seq, tuple(store.sealed), store.sealed_bytes,
                                      snapshot_name(seq), self._state.snapshot_growth)
        return self._compaction

    def write_compaction_snapshot(self, compaction: Compaction, *, sync_every_bytes: int = 0) -> None:
        """Write and fsync the snapshot of `compaction`: meant for the forked copy.

        The state must still be at the compaction's seq: a snapshot named S
        holding a later state would make recovery apply frames twice. Changes
        nothing in memory and calls no hook (the parent reports
        snapshot.after_write when it finishes). Raises OSError as the file
        system does (ENOSPC, EIO) and RuntimeError if the state moved on.
        `sync_every_bytes` paces the writing with fdatasyncs (see
        snapshot.write_snapshot), for a copy writing beside a serving parent.
        """
        if self._state.last_seq != compaction.seq:
            raise RuntimeError(f"the state is at seq {self._state.last_seq}, not {compaction.seq}: "
                               f"the snapshot must be written from a copy taken at begin_compaction")
        self._store.write_snapshot(self._state, sync_every_bytes=validation.integer(
            sync_every_bytes, "sync_every_bytes"))

    def snapshot_descriptors(self) -> tuple[int, ...]:
        """The descriptors `write_compaction_snapshot` needs: a forked copy keeps these
        and may close every other one it inherited (the LOCK's above all)."""
        self.check_open()
        return self._store.snapshot_descriptors()

    def finish_compaction(self, compaction: Compaction) -> int:
        """Publish the written snapshot and delete what it covers; returns its seq.

        Call only after `write_compaction_snapshot` returned in the copy (its
        fsync is done). Runs the hook at snapshot.after_write,
        current.after_write, current.after_publish and compact.after_delete,
        as compact() does. A failure closes the Queue (a crash anywhere here
        recovers to the same state). Deletes the segments sealed at
        begin_compaction and the previous snapshot: keep it from running
        while a backup copies them.
        """
        self.check_open()
        self._check_in_progress(compaction)
        self._compaction = None
        store = self._store
        assert tuple(store.sealed) == compaction.covered_segments
        try:
            store.call_hook("snapshot.after_write")
            store.publish(compaction.seq)
            store.delete_covered(compaction.seq)
            store.published(compaction.seq, compaction.snapshot_growth)
        except BaseException:
            self._die()
            raise
        return compaction.seq

    def abandon_compaction(self, compaction: Compaction) -> None:
        """Give up on a compaction whose snapshot could not be written (disk full, EIO).

        Removes the partial snapshot file if there is one (an orphan, which
        recovery would ignore anyway) and keeps everything else: the WAL
        still covers every record, so nothing is lost and the Queue stays
        open. The next `begin_compaction` covers the sealed segments too.
        """
        self.check_open()
        self._check_in_progress(compaction)
        self._compaction = None
        self._store.remove_partial_snapshot(compaction.snapshot_file)

    def snapshot_bytes_bound(self) -> int:
        """An upper bound on the bytes a snapshot of the state as it is now would take. O(1).

        The published snapshot's size plus what the records applied since can
        have added to it (State.snapshot_growth), so it counts what the WAL does
        not carry: each task's identity and counters, a reserve's worker once per
        task it leased. Not part of SPEC's API: walqueued checks the free space
        against it before it compacts.
        """
        self.check_open()
        return self._store.snapshot_bytes_bound(self._state.snapshot_growth)

    @property
    def compaction_in_progress(self) -> Compaction | None:
        return self._compaction

    def _refuse_during_compaction(self) -> None:
        if self._compaction is not None:
            raise validation.InvalidRequest(
                f"a compaction through seq {self._compaction.seq} is in progress; wait for it")

    def _check_in_progress(self, compaction: Compaction) -> None:
        if compaction is not self._compaction:
            raise validation.InvalidRequest(f"no compaction through seq {compaction.seq} is "
                                            f"in progress on this Queue")

    def _compaction_steps(self):
        """The steps of compact(), in the only safe order (SPEC §5).

        A crash between any two leaves a directory that recovers to the same
        state: CURRENT still names the old snapshot (whose WAL is all there)
        until the new snapshot is durable, and nothing is deleted until the
        new CURRENT is.
        """
        store = self._store
        return (store.rotate, self._write_snapshot, store.publish, store.delete_covered)

    def _write_snapshot(self, seq: int) -> None:
        """Write and fsync snapshot-<seq>.snap of the state, then the hook's snapshot.after_write."""
        assert self._state.last_seq == seq
        self._store.write_snapshot(self._state)
        self._store.call_hook("snapshot.after_write")

    def close(self) -> None:
        """Make anything written durable and release the directory. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._store.close()

    def __enter__(self) -> Engine:
        self.check_open()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"seq {self._state.last_seq}"
        return f"<Engine {self.directory!r} {state}>"

    # -- internals ------------------------------------------------------

    @property
    def closed(self) -> bool:
        return self._closed

    def check_open(self) -> None:
        if self._closed:
            raise QueueClosed(f"the Queue on {self.directory} is closed; open a new one")

    def _next_seq(self) -> int:
        return self._state.last_seq + 1

    def _append(self, record: dict) -> None:
        """Check, write and apply one record. Must run inside a batch."""
        change = self._check(record)
        frame = encode_frame(record)
        try:
            self._store.append(frame)
        except BaseException:
            self._die()
            raise
        self._commit(change, len(frame) - FRAME_OVERHEAD_BYTES)

    def _sync(self) -> None:
        try:
            self._store.sync()
        except BaseException:
            self._die()
            raise

    def _die(self) -> None:
        """After a failed write: closed at once, files released without an fsync."""
        self._closed = True
        self._store.release()


@dataclass(frozen=True)
class Compaction:
    """A compaction begun by `Engine.begin_compaction`: a snapshot through `seq`."""

    seq: int
    covered_segments: tuple[str, ...]   # sealed segments the snapshot makes redundant
    covered_bytes: int                  # their size: the WAL bytes this compaction drops
    snapshot_file: str
    snapshot_growth: int = 0            # State.snapshot_growth at seq (Engine.snapshot_bytes_bound)


class _Batch:
    def __init__(self, engine: Engine) -> None:
        self._engine = engine

    def __enter__(self) -> None:
        self._engine._batch_depth += 1

    def __exit__(self, *exc_info) -> None:
        engine = self._engine
        engine._batch_depth -= 1
        if engine._batch_depth == 0 and not engine._closed:
            engine._sync()


def lease_of(task: Task) -> Lease:
    """A leased task as the library's Lease, its payload a copy."""
    assert task.status == LEASED
    return Lease(task.task_id, task.worker, task.generation, task.deadline, task.attempts,
                 copy_json(task.payload))


def view_of(task: Task) -> TaskView:
    """A task as the library's TaskView, its payload a copy."""
    return TaskView(task.task_id, task.key, task.status, task.attempts, task.max_attempts,
                    task.generation, task.available_at, task.deadline, task.worker,
                    copy_json(task.payload))
