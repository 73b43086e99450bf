"""`Store`: the files of one queue directory, as its Engine writes them (SPEC §3-§5).

The LOCK (held while open), the active WAL segment and the sealed ones, the
snapshots and CURRENT: what recovery found at open and the writes open then
makes, appends and fsyncs, and compaction's four steps in their files. It
knows no record and no operation (walqueue.engine decides those) and calls
the fault-injection hook at the phases of its writes. Anything it raises
leaves the Engine to close it at once (`release`), as a dead process would.
"""

from __future__ import annotations

import fcntl
import os
import warnings
from collections.abc import Callable
from typing import Any

from . import validation
from .errors import QueueLocked, UnsafeDirectoryWarning
from .fs import Directory, OsFileSystem, open_lock
from .recovery import plan_recovery
from .snapshot import (
    CURRENT,
    CURRENT_TMP,
    FRAMING_BYTES_BOUND,
    current_frame,
    snapshot_name,
    write_snapshot,
)
from .state import State
from .wal import MAX_PREALLOCATE_BYTES, ActiveSegment

LOCK = "LOCK"


class Store:
    """Open with `Store.open`, which recovers the directory and returns the state it holds."""

    def __init__(self, path: str, fs: OsFileSystem, hook: Callable[[str], Any] | None,
                 preallocate_bytes: int) -> None:
        self.path = path
        self.hook = hook
        self._fs = fs
        self._preallocate_bytes = preallocate_bytes
        self._active: ActiveSegment | None = None
        self._lock_fd: int | None = None
        self._dir: Directory | None = None

    @classmethod
    def open(cls, path: str, *, hook: Callable[[str], Any] | None = None,
             filesystem: OsFileSystem | None = None, preallocate_bytes: int = 0,
             opened: Directory | None = None, stacklevel: int = 2) -> tuple[Store, State]:
        """Reach the directory, take its LOCK, recover: the Store and the state it holds.

        `opened` is a directory the caller reached and judged itself; else the
        path is reached here and what walqueue.directory finds unsafe is
        warned about (UnsafeDirectoryWarning; `stacklevel` as warnings.warn's, 2 naming
        the caller of open).
        Raises InvalidRequest for a bad `preallocate_bytes` (before touching
        the directory), QueueLocked, CorruptStore.
        """
        preallocate_bytes = validation.integer(preallocate_bytes, "preallocate_bytes",
                                               maximum=MAX_PREALLOCATE_BYTES)
        store = cls(path, filesystem or OsFileSystem(), hook, preallocate_bytes)
        fs = store._fs
        # The directory is reached once, and every file (LOCK first) is opened relative to that
        # descriptor: what was judged is what is used (walqueue.directory).
        if opened is not None:
            store._dir = fs.duplicate_directory(opened)
        else:
            reached = fs.open_queue_directory(path)
            store._dir = reached.directory
            for finding in reached.findings:
                warnings.warn(finding, UnsafeDirectoryWarning, stacklevel=stacklevel)
        try:
            store._lock_fd = _take_lock(store._dir, path)
            state = store._recover()
        except BaseException:
            store.release()
            raise
        return store, state

    def _recover(self) -> State:
        """Read the directory (recovery.plan_recovery), then do the writes open may do.

        Everything on disk is checked before the first write: truncating the
        torn tail (then `recover.after_truncate`), deleting what the plan
        lists, creating the next segment if no segment is kept, and one
        directory fsync for those names.
        """
        fs, directory = self._fs, self._dir
        plan = plan_recovery(fs, directory)
        self.snapshot_seq = plan.snapshot_seq
        self.snapshot_file = plan.snapshot_file
        self._previous_snapshot_file = plan.snapshot_file
        # The published snapshot's size, and the state's snapshot_growth at its seq:
        # 0, as the replay since it started from the snapshot loaded (snapshot_bytes_bound).
        self._snapshot_bytes = 0 if plan.snapshot_file is None else fs.size(directory, plan.snapshot_file)
        self._snapshot_growth = 0
        if plan.active is not None:
            self._active = ActiveSegment(fs, directory, plan.active.first_seq, plan.active.size,
                                         self._preallocate_bytes)
            if plan.torn_tail is not None:
                self._active.truncate(plan.torn_tail.offset)
                self.call_hook("recover.after_truncate")
        self.sealed = [segment.filename for segment in plan.sealed]
        self.sealed_bytes = sum(segment.size for segment in plan.sealed)
        for name in plan.deletions:
            fs.unlink(directory, name)
        created = self._active is None
        if created:
            self._active = ActiveSegment(fs, directory, plan.state.last_seq + 1, 0,
                                         self._preallocate_bytes, new=True)
        if plan.deletions or created:
            fs.fsync_directory(directory)
        return plan.state

    # -- the WAL ------------------------------------------------------------

    def append(self, frame: bytes) -> None:
        """Append one frame to the active segment (hooks wal.before_write, wal.after_write)."""
        hook = self.hook
        if hook is not None:
            hook("wal.before_write")
        self._active.append(frame)
        if hook is not None:
            hook("wal.after_write")

    @property
    def unsynced(self) -> bool:
        """True while appended frames wait for their fsync."""
        return self._active.unsynced

    def sync(self) -> None:
        """Make the appended frames durable (then wal.after_sync); nothing if none waits."""
        if self._active.unsynced:
            self._active.sync()
            self.call_hook("wal.after_sync")

    @property
    def wal_bytes(self) -> int:
        return self.sealed_bytes + self._active.size

    def segment_count(self) -> int:
        """The WAL segment files: the sealed ones and the active one."""
        return len(self.sealed) + 1

    # -- compaction's steps, in the only safe order (SPEC §5) ----------------

    def rotate(self, seq: int) -> None:
        """Seal the active segment (trimmed, fsynced) and start wal-<seq+1>."""
        if not self._active.empty:
            # Trimmed before the next segment exists: only the newest segment
            # may end in zeros (SPEC §5).
            self._active.seal()
            self._active.close()
            self.sealed.append(self._active.filename)
            self.sealed_bytes += self._active.size
            self._active = ActiveSegment(self._fs, self._dir, seq + 1, 0,
                                         self._preallocate_bytes, new=True)
            self._fs.fsync_directory(self._dir)
        self.call_hook("wal.after_rotate")

    def write_snapshot(self, state: State, *, sync_every_bytes: int = 0) -> None:
        """Write and fsync snapshot-<seq>.snap of `state`; CURRENT still names the old one.
        No hook: compact() calls snapshot.after_write, a forked copy none."""
        write_snapshot(self._fs, self._dir, state, sync_every_bytes=sync_every_bytes)

    def publish(self, seq: int) -> None:
        """CURRENT.tmp, fsync, rename over CURRENT, fsync the directory."""
        fs, directory = self._fs, self._dir
        fd = fs.create(directory, CURRENT_TMP)  # a crash may have left one: a new file
        try:
            fs.write(fd, current_frame(seq))
            fs.fsync(fd)
        finally:
            fs.close(fd)
        self.call_hook("current.after_write")
        fs.rename(directory, CURRENT_TMP, CURRENT)
        fs.fsync_directory(directory)
        self._previous_snapshot_file = self.snapshot_file
        self.snapshot_file, self.snapshot_seq = snapshot_name(seq), seq
        self.call_hook("current.after_publish")

    def delete_covered(self, seq: int) -> None:
        """Delete the sealed segments and the previous snapshot, fsync the directory."""
        fs, directory = self._fs, self._dir
        for name in self.sealed:
            fs.unlink(directory, name)
        self.sealed, self.sealed_bytes = [], 0
        previous = self._previous_snapshot_file
        if previous is not None and previous != snapshot_name(seq):
            fs.unlink(directory, previous)
        fs.fsync_directory(directory)
        self.call_hook("compact.after_delete")

    def published(self, seq: int, snapshot_growth: int) -> None:
        """Remember the size of the snapshot just published and the state's growth at its seq."""
        self._snapshot_bytes = self._fs.size(self._dir, snapshot_name(seq))
        self._snapshot_growth = snapshot_growth

    def snapshot_bytes_bound(self, snapshot_growth: int) -> int:
        """A bound on a snapshot of a state whose State.snapshot_growth is this (Engine's)."""
        return self._snapshot_bytes + snapshot_growth - self._snapshot_growth + FRAMING_BYTES_BOUND

    def remove_partial_snapshot(self, name: str) -> None:
        """Remove an abandoned snapshot's file, if it got as far as existing."""
        try:
            self._fs.unlink(self._dir, name)
        except FileNotFoundError:
            pass

    def snapshot_descriptors(self) -> tuple[int, ...]:
        """The descriptors `write_snapshot` needs (a forked copy may close every other one)."""
        return (self._dir.fd,)

    def manifest_files(self) -> list[tuple[str, int]]:
        """(name, size) of every file a consistent copy needs, CURRENT last."""
        fs, directory = self._fs, self._dir
        files = [(name, fs.size(directory, name)) for name in self.sealed]
        files.append((self._active.filename, self._active.size))
        if self.snapshot_file is not None:
            for name in (self.snapshot_file, CURRENT):
                files.append((name, fs.size(directory, name)))
        return files

    # -- closing ---------------------------------------------------------------

    def call_hook(self, phase: str) -> None:
        if self.hook is not None:
            self.hook(phase)

    def close(self) -> None:
        """Trim or fsync the active segment (no hook at close), then release everything."""
        try:
            if self._active.has_zero_tail:
                self._active.trim()  # a cleanly closed directory holds only frames
            elif self._active.unsynced:
                self._active.sync()  # only inside a batch
        finally:
            self.release()

    def release(self) -> None:
        """Close every file, then the lock: no fsync, as at process death. Idempotent."""
        active, self._active = self._active, None
        if active is not None:
            active.close()
        directory, self._dir = self._dir, None
        if directory is not None:
            self._fs.close_directory(directory)
        lock_fd, self._lock_fd = self._lock_fd, None
        if lock_fd is not None:
            os.close(lock_fd)

    def __del__(self) -> None:
        # Discarding an open Store releases the directory as a dead process would.
        if getattr(self, "_lock_fd", None) is not None:
            self.release()


def _take_lock(directory: Directory, path: str) -> int:
    fd = open_lock(directory, LOCK)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise QueueLocked(f"{path} is in use by another Queue (its {LOCK} file is "
                          f"locked); close that one first") from None
    except BaseException:
        os.close(fd)
        raise
    return fd
