"""`Queue`: the durable queue over one directory (SPEC §1-§6).

The facade around the pure parts: it validates arguments, holds the
directory lock, turns each operation into a WAL record, writes it through
the state machine's `check` -> write -> `commit`, calls the fault-injection
hook at the named phases, groups fsyncs in `batch()`, recovers at open and
compacts on request.

Rules this module keeps:
  - nothing is written before the arguments and the state have been checked,
    so a rejected call leaves the Queue open and the files unchanged;
  - the in-memory state changes only after its frame is in the file, and an
    operation returns only after the fsync that makes its frame durable
    (the end of its batch);
  - when a hook raises or a write/fsync fails, the Queue closes itself at
    once, as a dead process would: files closed, lock released, no fsync.
"""

from __future__ import annotations

import fcntl
import gc
import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

from . import validation
from .codec import encode_frame
from .errors import CorruptStore, QueueClosed, QueueLocked, WalQueueError
from .fs import OsFileSystem
from .snapshot import (
    CURRENT,
    CURRENT_TMP,
    current_frame,
    is_snapshot_name,
    load_snapshot,
    read_current,
    snapshot_name,
    write_snapshot,
)
from .state import LEASED, MAX_EXPIRE_IDS, RECORD_FIELDS, State, Task
from .values import BackupManifest, Lease, PutRequest, QueueStats, TaskView, copy_json
from .wal import MAX_PREALLOCATE_BYTES, ActiveSegment, SegmentReader, list_segments

LOCK = "LOCK"
PHASES = (
    "wal.before_write", "wal.after_write", "wal.after_sync", "wal.after_rotate",
    "snapshot.after_write", "current.after_write", "current.after_publish",
    "compact.after_delete", "recover.after_truncate",
)
_PUT_FIELDS = ("task_id", "payload", "key", "available_at", "max_attempts")


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
                 filesystem: OsFileSystem | None = None, preallocate_bytes: int = 0) -> None:
        self._preallocate_bytes = validation.integer(preallocate_bytes, "preallocate_bytes",
                                                     maximum=MAX_PREALLOCATE_BYTES)
        self._directory = os.fspath(directory)
        self._hook = hook
        self._fs = filesystem or OsFileSystem()
        self._closed = True
        self._active: ActiveSegment | None = None
        self._lock_fd: int | None = None
        self._batch_depth = 0
        if self._fs.makedirs(self._directory):
            # A new directory's own name must survive a power cut too.
            self._fs.fsync_directory(os.path.dirname(os.path.abspath(self._directory)))
        self._lock_fd = _take_lock(self._directory)
        # Recovery builds millions of long-lived objects and no cycles; the
        # cyclic collector would only rescan them (a third of the time at 1M).
        collecting = gc.isenabled()
        gc.disable()
        try:
            self._recover()
        except BaseException:
            self._release()
            raise
        finally:
            if collecting:
                gc.enable()
        self._closed = False

    # -- recovery -------------------------------------------------------

    def _recover(self) -> None:
        fs, directory = self._fs, self._directory
        names = fs.listdir(directory)
        current = read_current(fs, directory)
        if current is None:
            state, snapshot_seq, snapshot_file = State(), 0, None
        else:
            snapshot_seq, snapshot_file = current
            state = load_snapshot(fs, directory, snapshot_file, snapshot_seq)

        segments = list_segments(names)
        # A segment is wholly covered by the snapshot when the next one starts
        # at or before the snapshot's next seq; it is garbage from a compaction
        # that stopped before deleting it, so it is neither read nor trusted.
        covered = [name for index, (_, name) in enumerate(segments[:-1])
                   if segments[index + 1][0] <= snapshot_seq + 1]
        live = segments[len(covered):]

        sizes: dict[str, int] = {}
        reader = None
        for index, (first_seq, filename) in enumerate(live):
            expected = snapshot_seq + 1 if reader is None else reader.last_seq + 1
            if first_seq > expected or (reader is not None and first_seq != expected):
                raise CorruptStore(f"{filename}: starts at seq {first_seq}, expected seq "
                                   f"{expected} (a sequence gap)")
            reader = SegmentReader(fs, directory, first_seq, filename,
                                   newest=index == len(live) - 1)
            for offset, record in reader.records():
                if record["seq"] <= snapshot_seq:
                    # Covered by the snapshot: not applied, but still a record.
                    op = record.get("op")
                    if type(op) is not str or record.keys() != RECORD_FIELDS.get(op, ()):
                        raise CorruptStore(f"{filename}: frame at offset {offset} (seq "
                                           f"{record['seq']}) is not a well-formed record")
                    continue
                try:
                    state.apply(record)
                except WalQueueError as error:
                    raise CorruptStore(
                        f"{filename}: frame at offset {offset} (seq {record['seq']}): "
                        f"invalid {record.get('op')!r} record: {error}") from error
            sizes[filename] = reader.tail.offset

        # Everything on disk has been checked; from here on, open may write.
        self._state = state
        self._snapshot_seq = snapshot_seq
        self._snapshot_file = snapshot_file
        self._previous_snapshot_file = snapshot_file
        garbage = list(covered)
        if reader is not None and reader.last_seq >= snapshot_seq:
            newest = live[-1][1]
            self._active = ActiveSegment(fs, directory, reader.first_seq, sizes[newest],
                                         self._preallocate_bytes)
            if reader.tail.kind != "clean":
                self._active.truncate(reader.tail.offset)
                self._call_hook("recover.after_truncate")
            self._sealed = [name for _, name in live[:-1]]
        else:
            # No segment reaches the snapshot's seq: start the next one.
            garbage += [name for _, name in live]
            self._sealed = []
        self._sealed_bytes = sum(sizes[name] for name in self._sealed)
        garbage += [name for name in names
                    if name == CURRENT_TMP or (is_snapshot_name(name) and name != snapshot_file)]
        for name in garbage:
            fs.unlink(os.path.join(directory, name))
        created = self._active is None
        if created:
            self._active = ActiveSegment(fs, directory, state.last_seq + 1, 0,
                                         self._preallocate_bytes)
        if garbage or created:
            fs.fsync_directory(directory)

    # -- public API: writes ---------------------------------------------

    def put(self, task_id: str, payload: Mapping, *, key: str | None = None,
            available_at: int = 0, max_attempts: int = 3) -> str:
        """Add a task, or return the id of the identical task already put.

        Raises InvalidRequest for a malformed argument, KeyConflict when the
        key or task id is taken by a different request.
        """
        self._check_open()
        request = _put_request(task_id, payload, key, available_at, max_attempts, "")
        return self._put([request])[0]

    def put_many(self, requests: Iterable[PutRequest | Mapping]) -> list[str]:
        """Put several tasks in one transaction: all new tasks, or nothing.

        Each request is a PutRequest or a mapping with its field names.
        Returns one id per request, in request order.
        """
        self._check_open()
        if isinstance(requests, (str, bytes, Mapping)) or not isinstance(requests, Iterable):
            raise validation.InvalidRequest("requests must be a list of PutRequest or mappings")
        return self._put([_put_request_of(item, index) for index, item in enumerate(requests)])

    def _put(self, requests: list[dict]) -> list[str]:
        if not requests:
            return []
        ids, new = self._state.plan_put(requests)
        if new:
            with self.batch():
                self._append({"op": "put", "seq": self._next_seq(), "tasks": new})
        return ids

    def reserve(self, worker: str, *, now: int, lease_seconds: int, limit: int = 1) -> list[Lease]:
        """Expire leases due at `now`, then lease up to `limit` due tasks.

        Returns the leases in (available_at, task_id) order.
        """
        self._check_open()
        validation.name(worker, "worker")
        validation.integer(now, "now")
        validation.integer(lease_seconds, "lease_seconds", minimum=1)
        validation.integer(limit, "limit", minimum=1, maximum=validation.MAX_RESERVE_LIMIT)
        validation.time_plus(now, lease_seconds, "lease_seconds")
        state = self._state
        with self.batch():
            while expired := state.expired(now, MAX_EXPIRE_IDS):
                self._append({"now": now, "op": "expire", "seq": self._next_seq(),
                              "task_ids": expired})
            task_ids = state.due_ready(now, limit)
            if task_ids:
                self._append({"lease_seconds": lease_seconds, "now": now, "op": "reserve",
                              "seq": self._next_seq(), "task_ids": task_ids, "worker": worker})
        return [_lease_of(state.tasks[task_id]) for task_id in task_ids]

    def ack(self, lease: Lease, *, now: int) -> None:
        """Complete the task held by `lease`. Raises StaleLease if it is not current."""
        self._lease_operation("ack", lease, now=now)

    def release(self, lease: Lease, *, now: int, delay: int = 0) -> None:
        """Give the task back, available again at now + delay (or dead at max_attempts)."""
        self._lease_operation("release", lease, now=now, delay=delay)

    def touch(self, lease: Lease, *, now: int, lease_seconds: int) -> Lease:
        """Extend a live lease to now + lease_seconds; returns the new Lease."""
        task = self._lease_operation("touch", lease, now=now, lease_seconds=lease_seconds)
        return _lease_of(task)

    def _lease_operation(self, op: str, lease: Lease, **numbers: int) -> Task | None:
        self._check_open()
        record = {"op": op}
        for field in ("task_id", "worker", "generation"):
            value = getattr(lease, field, None)
            if field == "generation":
                record[field] = validation.integer(value, "lease.generation")
            else:
                record[field] = validation.name(value, f"lease.{field}")
        for field, value in numbers.items():
            minimum = 1 if field == "lease_seconds" else 0
            record[field] = validation.integer(value, field, minimum=minimum)
        for field in ("delay", "lease_seconds"):
            if field in record:
                validation.time_plus(record["now"], record[field], field)
        with self.batch():
            record["seq"] = self._next_seq()
            self._append(record)
        return self._state.tasks.get(record["task_id"])   # None after an ack

    def revive(self, task_ids: Iterable[str], *, now: int) -> list[str]:
        """Make dead tasks ready again (attempts 0, available at `now`).

        Returns the ids, duplicates dropped, in order. Raises InvalidRequest,
        writing nothing, if any listed task is unknown or not dead.
        """
        self._check_open()
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

    # -- public API: reads ----------------------------------------------

    def get(self, task_id: str) -> TaskView | None:
        self._check_open()
        validation.name(task_id, "task_id")
        task = self._state.get(task_id)
        return None if task is None else _view_of(task)

    def tasks(self, status: str | None = None) -> Iterator[TaskView]:
        """The tasks (optionally of one status) in task_id order.

        The order is fixed when called; each view reflects the task when the
        iterator reaches it.
        """
        self._check_open()
        validation.status(status)
        return map(_view_of, self._state.in_order(status))

    def stats(self) -> QueueStats:
        self._check_open()
        counts = self._state.counts
        return QueueStats(ready=counts["ready"], leased=counts["leased"],
                          completed=counts["completed"], dead=counts["dead"],
                          last_seq=self._state.last_seq, snapshot_seq=self._snapshot_seq,
                          wal_bytes=self._sealed_bytes + self._active.size)

    def next_due_time(self) -> int | None:
        """The earliest time at which `reserve` could lease or expire something.

        Not part of SPEC's API: the daemon uses it to wake parked workers
        without polling. None when nothing is ready or leased.
        """
        self._check_open()
        return self._state.next_due_time()

    # -- monitoring (not part of SPEC's API; the daemon's metrics) -------

    def ready_due_since(self, now: int, seq_time: Callable[[int], int]) -> int | None:
        """The earliest time since which a ready task has been due (see State.ready_due_since)."""
        self._check_open()
        return self._state.ready_due_since(now, seq_time)

    def leases_past_half(self, now: int) -> int:
        """How many leases are at or past half their time at `now` (see State.leases_past_half)."""
        self._check_open()
        return self._state.leases_past_half(now)

    def segment_count(self) -> int:
        """WAL segment files this Queue holds: the sealed ones and the active one."""
        self._check_open()
        return len(self._sealed) + 1

    def unsynced(self) -> bool:
        """True while frames appended in the open batch still wait for its fsync."""
        return not self._closed and self._active.unsynced

    # -- group commit, compaction, closing ------------------------------

    def batch(self) -> _Batch:
        """Group commit: one fsync (and `wal.after_sync`) when the block exits.

        Nested batches join the outer one. The fsync also happens when the
        block exits by an exception, which then propagates. Report success for
        the operations inside only after the block has exited without error.
        """
        self._check_open()
        return _Batch(self)

    def compact(self) -> int:
        """Publish a snapshot of the whole state and drop the WAL it covers.

        Returns the published snapshot's seq (the previous one if nothing was
        appended since it).
        """
        self._check_open()
        self._sync()
        seq = self._state.last_seq
        if seq == self._snapshot_seq:
            return seq
        try:
            for step in self._compaction_steps():
                step(seq)
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
        self._check_open()
        if self._snapshot_file is None and self._state.last_seq > 0:
            self.compact()
        else:
            self._sync()
        fs, directory = self._fs, self._directory
        files = [(name, fs.size(os.path.join(directory, name))) for name in self._sealed]
        files.append((self._active.filename, self._active.size))
        if self._snapshot_file is not None:
            for name in (self._snapshot_file, CURRENT):
                files.append((name, fs.size(os.path.join(directory, name))))
        return BackupManifest(os.path.abspath(directory), self._state.last_seq, tuple(files))

    def _compaction_steps(self):
        """The steps of compact(), in the only safe order (SPEC §5).

        A crash between any two leaves a directory that recovers to the same
        state: CURRENT still names the old snapshot (whose WAL is all there)
        until the new snapshot is durable, and nothing is deleted until the
        new CURRENT is.
        """
        return (self._rotate, self._write_snapshot, self._publish, self._delete_covered)

    def _rotate(self, seq: int) -> None:
        """Seal the active segment (trimmed, fsynced) and start wal-<seq+1>."""
        if not self._active.empty:
            # Trimmed before the next segment exists: only the newest segment
            # may end in zeros (SPEC §5).
            self._active.seal()
            self._active.close()
            self._sealed.append(self._active.filename)
            self._sealed_bytes += self._active.size
            self._active = ActiveSegment(self._fs, self._directory, seq + 1, 0,
                                         self._preallocate_bytes)
            self._fs.fsync_directory(self._directory)
        self._call_hook("wal.after_rotate")

    def _write_snapshot(self, seq: int) -> None:
        """Write and fsync snapshot-<seq>.snap; CURRENT still names the old one."""
        assert self._state.last_seq == seq
        write_snapshot(self._fs, self._directory, self._state)
        self._call_hook("snapshot.after_write")

    def _publish(self, seq: int) -> None:
        """CURRENT.tmp, fsync, rename over CURRENT, fsync the directory."""
        fs, directory = self._fs, self._directory
        fd = fs.create(os.path.join(directory, CURRENT_TMP))
        try:
            fs.write(fd, current_frame(seq))
            fs.fsync(fd)
        finally:
            fs.close(fd)
        self._call_hook("current.after_write")
        fs.rename(os.path.join(directory, CURRENT_TMP), os.path.join(directory, CURRENT))
        fs.fsync_directory(directory)
        self._previous_snapshot_file = self._snapshot_file
        self._snapshot_file, self._snapshot_seq = snapshot_name(seq), seq
        self._call_hook("current.after_publish")

    def _delete_covered(self, seq: int) -> None:
        """Delete the sealed segments and the previous snapshot, fsync the directory."""
        fs, directory = self._fs, self._directory
        for name in self._sealed:
            fs.unlink(os.path.join(directory, name))
        self._sealed, self._sealed_bytes = [], 0
        previous = self._previous_snapshot_file
        if previous is not None and previous != snapshot_name(seq):
            fs.unlink(os.path.join(directory, previous))
        fs.fsync_directory(directory)
        self._call_hook("compact.after_delete")

    def close(self) -> None:
        """Make anything written durable and release the directory. Idempotent."""
        if self._closed:
            return
        try:
            if self._active.has_zero_tail:
                self._active.trim()  # a cleanly closed directory holds only frames
            elif self._active.unsynced:
                self._active.sync()  # only inside a batch; no hook at close
        finally:
            self._closed = True
            self._release()

    def __enter__(self) -> Queue:
        self._check_open()
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()

    def __del__(self) -> None:
        # Discarding a Queue releases the directory as a dead process would.
        if getattr(self, "_lock_fd", None) is not None:
            self._closed = True
            self._release()

    def __repr__(self) -> str:
        state = "closed" if self._closed else f"seq {self._state.last_seq}"
        return f"<Queue {self._directory!r} {state}>"

    # -- internals ------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise QueueClosed(f"the Queue on {self._directory} is closed; open a new one")

    def _next_seq(self) -> int:
        return self._state.last_seq + 1

    def _append(self, record: dict) -> None:
        """Check, write and apply one record. Must run inside a batch."""
        change = self._state.check(record)
        frame = encode_frame(record)
        try:
            self._call_hook("wal.before_write")
            self._active.append(frame)
            self._call_hook("wal.after_write")
        except BaseException:
            self._die()
            raise
        self._state.commit(change)

    def _sync(self) -> None:
        if not self._active.unsynced:
            return
        try:
            self._active.sync()
            self._call_hook("wal.after_sync")
        except BaseException:
            self._die()
            raise

    def _call_hook(self, phase: str) -> None:
        if self._hook is not None:
            self._hook(phase)

    def _die(self) -> None:
        self._closed = True
        self._release()

    def _release(self) -> None:
        """Close every file, then the lock: no fsync, as at process death."""
        active, self._active = self._active, None
        if active is not None:
            active.close()
        lock_fd, self._lock_fd = self._lock_fd, None
        if lock_fd is not None:
            os.close(lock_fd)


class _Batch:
    def __init__(self, queue: Queue) -> None:
        self._queue = queue

    def __enter__(self) -> None:
        self._queue._batch_depth += 1

    def __exit__(self, *exc_info) -> None:
        queue = self._queue
        queue._batch_depth -= 1
        if queue._batch_depth == 0 and not queue._closed:
            queue._sync()


def _take_lock(directory: str) -> int:
    fd = os.open(os.path.join(directory, LOCK), os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o640)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise QueueLocked(f"{directory} is in use by another Queue (its {LOCK} file is "
                          f"locked); close that one first") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _put_request(task_id, payload, key, available_at, max_attempts, where: str) -> dict:
    """A validated put request, shaped like a task of a put record."""
    task_id = validation.name(task_id, f"{where}task_id")
    return {
        "available_at": validation.integer(available_at, f"{where}available_at"),
        "key": task_id if key is None else validation.name(key, f"{where}key"),
        "max_attempts": validation.integer(max_attempts, f"{where}max_attempts", minimum=1),
        "payload": validation.payload(payload, f"{where}payload"),
        "task_id": task_id,
    }


def _put_request_of(item: Any, index: int) -> dict:
    where = f"requests[{index}]."
    if isinstance(item, PutRequest):
        fields = {name: getattr(item, name) for name in _PUT_FIELDS}
    elif isinstance(item, Mapping):
        unknown = set(item) - set(_PUT_FIELDS)
        if unknown:
            raise validation.InvalidRequest(f"{where[:-1]} has unknown fields {sorted(map(str, unknown))}")
        missing = {"task_id", "payload"} - set(item)
        if missing:
            raise validation.InvalidRequest(f"{where[:-1]} is missing {sorted(missing)}")
        fields = {"key": None, "available_at": 0, "max_attempts": 3, **item}
    else:
        raise validation.InvalidRequest(
            f"{where[:-1]} must be a PutRequest or a mapping, not {type(item).__name__}")
    return _put_request(fields["task_id"], fields["payload"], fields["key"],
                        fields["available_at"], fields["max_attempts"], where)


def _lease_of(task: Task) -> Lease:
    assert task.status == LEASED
    return Lease(task.task_id, task.worker, task.generation, task.deadline, task.attempts,
                 copy_json(task.payload))


def _view_of(task: Task) -> TaskView:
    return TaskView(task.task_id, task.key, task.status, task.attempts, task.max_attempts,
                    task.generation, task.available_at, task.deadline, task.worker,
                    copy_json(task.payload))
