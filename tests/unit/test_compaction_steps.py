"""Compaction in steps (Engine.begin_compaction / write_compaction_snapshot /
finish_compaction / abandon_compaction): what walqueued runs so that a
snapshot is written by a forked child while the parent goes on appending.

The claims: the steps leave exactly what compact() leaves, with the same
phases in the same order; frames appended between the steps are kept, and
are not in the snapshot; a crash at any phase recovers every answered write;
a snapshot that could not be written is abandoned without losing anything or
closing the queue; and a snapshot written from a fork's copy while the parent
appends holds the state as of the seq it is named after.
"""

from __future__ import annotations

import errno
import os

import pytest

from walqueue import InjectedCrash, InvalidRequest, Queue
from walqueue.fs import OsFileSystem
from walqueue.snapshot import snapshot_name

from .frames import read_dir


class Phases:
    def __init__(self, die_at: str | None = None) -> None:
        self.seen: list[str] = []
        self.die_at = die_at

    def __call__(self, phase: str) -> None:
        self.seen.append(phase)
        if phase == self.die_at:
            raise InjectedCrash(phase)


def fill(queue: Queue) -> None:
    queue.put("a", {"n": 1})
    queue.put("b", {"n": 2})
    (lease,) = queue.reserve("w", now=10, lease_seconds=30, limit=1)
    queue.ack(lease, now=11)


def state(directory) -> list:
    with Queue(directory) as queue:
        return [queue.stats(), *queue.tasks()]


def test_the_steps_leave_what_compact_leaves_with_the_same_phases(tmp_path):
    results = {}
    for way in ("compact", "steps"):
        hook = Phases()
        directory = tmp_path / way
        with Queue(directory, hook=hook) as queue:
            fill(queue)
            hook.seen.clear()
            if way == "compact":
                queue.compact()
            else:
                compaction = queue.engine.begin_compaction()
                queue.engine.write_compaction_snapshot(compaction)
                assert queue.engine.finish_compaction(compaction) == 4
        results[way] = (read_dir(directory), hook.seen)
    assert results["steps"] == results["compact"]
    assert results["steps"][1] == ["wal.after_rotate", "snapshot.after_write", "current.after_write",
                                   "current.after_publish", "compact.after_delete"]


def test_frames_appended_between_the_steps_are_kept_and_not_in_the_snapshot(tmp_path):
    with Queue(tmp_path) as queue:
        fill(queue)
        compaction = queue.engine.begin_compaction()
        queue.engine.write_compaction_snapshot(compaction)
        queue.put("c", {"n": 3})
        (lease,) = queue.reserve("w", now=20, lease_seconds=30, limit=1)
        queue.engine.finish_compaction(compaction)
        assert queue.stats().snapshot_seq == 4 and queue.stats().last_seq == 6
        expected = [queue.stats(), *queue.tasks()]
    assert sorted(os.listdir(tmp_path)) == ["CURRENT", "LOCK", snapshot_name(4),
                                            "wal-00000000000000000005.log"]
    assert state(tmp_path) == expected


def test_nothing_to_compact_begins_nothing(tmp_path):
    with Queue(tmp_path) as queue:
        assert queue.engine.begin_compaction() is None
        fill(queue)
        queue.compact()
        assert queue.engine.begin_compaction() is None


def test_one_compaction_at_a_time_and_compact_waits_for_it(tmp_path):
    with Queue(tmp_path) as queue:
        fill(queue)
        compaction = queue.engine.begin_compaction()
        with pytest.raises(InvalidRequest, match="in progress"):
            queue.engine.begin_compaction()
        with pytest.raises(InvalidRequest, match="in progress"):
            queue.compact()
        queue.engine.write_compaction_snapshot(compaction)
        queue.engine.finish_compaction(compaction)
        with pytest.raises(InvalidRequest, match="no compaction"):
            queue.engine.finish_compaction(compaction)


def test_a_snapshot_is_never_written_from_a_state_that_moved_on(tmp_path):
    with Queue(tmp_path) as queue:
        fill(queue)
        compaction = queue.engine.begin_compaction()
        queue.put("late", {})
        with pytest.raises(RuntimeError, match="seq 5, not 4"):
            queue.engine.write_compaction_snapshot(compaction)
        assert snapshot_name(4) not in os.listdir(tmp_path)


@pytest.mark.parametrize("phase", ["wal.after_rotate", "snapshot.after_write", "current.after_write",
                                   "current.after_publish", "compact.after_delete"])
def test_a_crash_at_any_phase_keeps_every_write(tmp_path, phase):
    hook = Phases()
    queue = Queue(tmp_path, hook=hook)
    fill(queue)
    hook.die_at = phase
    with pytest.raises(InjectedCrash):
        compaction = queue.engine.begin_compaction()
        queue.engine.write_compaction_snapshot(compaction)
        queue.put("c", {"n": 3})
        answered = [queue.stats().last_seq, *queue.tasks()]
        queue.engine.finish_compaction(compaction)
    with Queue(tmp_path) as again:
        if phase == "wal.after_rotate":
            assert again.stats().last_seq == 4 and again.get("c") is None
        else:
            assert [again.stats().last_seq, *again.tasks()] == answered


class DiskFull(OsFileSystem):
    """Refuses to write snapshot files (half of a write lands), as a full disk would."""

    def __init__(self) -> None:
        self.full = True
        self._snapshot_fds: set[int] = set()

    def create(self, directory, name: str) -> int:
        fd = super().create(directory, name)
        if name.startswith("snapshot-"):
            self._snapshot_fds.add(fd)
        return fd

    def write(self, fd: int, data: bytes) -> None:
        if self.full and fd in self._snapshot_fds:
            super().write(fd, data[: len(data) // 2])
            raise OSError(errno.ENOSPC, "No space left on device")
        super().write(fd, data)

    def close(self, fd: int) -> None:
        self._snapshot_fds.discard(fd)
        super().close(fd)


def test_a_snapshot_that_cannot_be_written_is_abandoned_and_nothing_is_lost(tmp_path):
    disk = DiskFull()
    with Queue(tmp_path, filesystem=disk) as queue:
        fill(queue)
        compaction = queue.engine.begin_compaction()
        with pytest.raises(OSError) as caught:
            queue.engine.write_compaction_snapshot(compaction)
        assert caught.value.errno == errno.ENOSPC
        assert snapshot_name(4) in os.listdir(tmp_path)  # the partial file
        queue.engine.abandon_compaction(compaction)
        assert snapshot_name(4) not in os.listdir(tmp_path)
        queue.put("c", {"n": 3})  # still open and serving
        assert queue.stats().snapshot_seq == 0
        disk.full = False
        retry = queue.engine.begin_compaction()
        queue.engine.write_compaction_snapshot(retry)
        assert queue.engine.finish_compaction(retry) == 5
        expected = [queue.stats(), *queue.tasks()]
    assert state(tmp_path) == expected


def test_a_forked_copy_writes_the_state_as_of_the_seq_while_the_parent_appends(tmp_path):
    with Queue(tmp_path) as queue:
        fill(queue)
        compaction = queue.engine.begin_compaction()
        snapshot_state = [*queue.tasks()]
        read_end, write_end = os.pipe()
        pid = os.fork()
        if pid == 0:  # the child: wait until the parent has moved on, then write
            try:
                os.close(write_end)
                os.read(read_end, 1)
                queue.engine.write_compaction_snapshot(compaction)
            except BaseException:
                os._exit(1)
            os._exit(0)
        os.close(read_end)
        for index in range(20):
            queue.put(f"after-{index}", {"n": index})
        os.write(write_end, b"x")
        os.close(write_end)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        queue.engine.finish_compaction(compaction)
        expected = [queue.stats(), *queue.tasks()]
    assert state(tmp_path) == expected
    # The snapshot itself holds the state at seq 4: load it alone (no WAL).
    for name in os.listdir(tmp_path):
        if name.startswith("wal-"):
            os.unlink(tmp_path / name)
    with Queue(tmp_path) as snapshot_only:
        assert [*snapshot_only.tasks()] == snapshot_state


def many_tasks() -> list[dict]:
    return [{"task_id": f"t{i:05d}", "payload": {"blob": "x" * 2000}} for i in range(3000)]


class SyncRecordingFileSystem(OsFileSystem):
    """The real file system, remembering the file size at each fdatasync."""

    def __init__(self) -> None:
        super().__init__()
        self.synced_sizes: list[int] = []

    def fdatasync(self, fd: int) -> None:
        self.synced_sizes.append(os.fstat(fd).st_size)
        super().fdatasync(fd)


@pytest.mark.parametrize("sync_every_bytes", [0, 1 << 20, 3 << 20])
def test_a_paced_snapshot_syncs_every_so_many_bytes_and_is_the_same_file(tmp_path, sync_every_bytes):
    """walqueued's child paces its snapshot with fdatasyncs (a WAL fsync beside one big
    final fsync waited ~0.5 s); the paced file must be the file compact() writes."""
    fs = SyncRecordingFileSystem()
    directory = tmp_path / str(sync_every_bytes)
    with Queue(directory, filesystem=fs) as queue:
        queue.put_many(many_tasks())
        compaction = queue.engine.begin_compaction()
        fs.synced_sizes.clear()  # the rotation's own syncs
        queue.engine.write_compaction_snapshot(compaction, sync_every_bytes=sync_every_bytes)
        queue.engine.finish_compaction(compaction)
    written = os.path.getsize(directory / snapshot_name(compaction.seq))
    assert written > 6 << 20
    if sync_every_bytes == 0:
        assert fs.synced_sizes == []
    else:
        steps = [b - a for a, b in zip([0, *fs.synced_sizes[:-1]], fs.synced_sizes, strict=True)]
        assert len(steps) >= written // sync_every_bytes - 1 and all(
            sync_every_bytes <= step < sync_every_bytes + (2 << 20) for step in steps), steps
    reference = tmp_path / "compact"
    with Queue(reference) as queue:
        queue.put_many(many_tasks())
        queue.compact()
    assert read_dir(directory) == read_dir(reference)


def test_sync_every_bytes_must_be_a_count_of_bytes(tmp_path):
    with Queue(tmp_path) as queue:
        fill(queue)
        compaction = queue.engine.begin_compaction()
        with pytest.raises(InvalidRequest, match="sync_every_bytes must be an int"):
            queue.engine.write_compaction_snapshot(compaction, sync_every_bytes=1.5)
        with pytest.raises(InvalidRequest, match=r"sync_every_bytes=-1 is out of range"):
            queue.engine.write_compaction_snapshot(compaction, sync_every_bytes=-1)
        queue.engine.abandon_compaction(compaction)
