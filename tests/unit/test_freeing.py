"""walqueued deletes big files at a pace (walqueue.daemon.freeing): the name at once, the
blocks over later turns, so that a compaction's deletions never stall the WAL's fsyncs.

The claims: after `unlink` the name is gone (what SPEC §5's deletion and the
directory fsync are about) while the blocks are freed only by `free_step`,
one step at a time and no faster than the pace, which grows with the files
waiting; small files, missing files and links are unlinked as before; a
Queue compacting on it leaves exactly the files compact() leaves; and the
loop sleeps until the next step is due, and frees it then, unless a snapshot
child is writing (walqueue.daemon.compaction waits for the freeing likewise).
"""

from __future__ import annotations

import os

import pytest

from walqueue import Queue
from walqueue.daemon.freeing import FreeingInSteps
from walqueue.daemon.loop import Loop, bind_listener
from walqueue.daemon.systemd import Notifier
from walqueue.fs import open_directory

from .frames import read_dir

STEP = 64 << 10


def big_file(path, size: int) -> None:
    with open(path, "wb") as file:
        file.write(b"z" * size)


@pytest.fixture
def directory(tmp_path):
    handle = open_directory(str(tmp_path))
    yield handle
    os.close(handle.fd)


def test_a_big_file_loses_its_name_at_once_and_its_blocks_a_step_at_a_time(tmp_path, directory):
    fs = FreeingInSteps(step_bytes=STEP, bytes_per_second=STEP)  # a step a second
    big_file(tmp_path / "old.snap", 5 * STEP + 10)
    fs.unlink(directory, "old.snap")
    assert not (tmp_path / "old.snap").exists()
    held = [fs.pending_bytes()]
    now = 100.0
    while fs.freeing:
        assert fs.seconds_to_next_step(now) == 0.0
        fs.free_step(now)
        held.append(fs.pending_bytes())
        if fs.freeing:
            assert fs.seconds_to_next_step(now + 0.25) == 0.75
            fs.free_step(now + 0.5)   # too soon: nothing freed
            assert fs.pending_bytes() == held[-1]
        now += 1.0
    assert held == [5 * STEP + 10, 4 * STEP + 10, 3 * STEP + 10, 2 * STEP + 10, STEP + 10, 10, 0]
    assert fs.seconds_to_next_step(now) is None


def test_the_pace_grows_with_the_files_waiting(tmp_path, directory):
    fs = FreeingInSteps(step_bytes=STEP, bytes_per_second=STEP)
    for name in ("a", "b"):
        big_file(tmp_path / name, 2 * STEP)
        fs.unlink(directory, name)
    fs.free_step(10.0)
    assert fs.seconds_to_next_step(10.0) == 0.5   # two files waiting: twice the pace
    fs.free_step(10.5)                            # "a" is empty now
    assert fs.seconds_to_next_step(10.5) == 0.5
    fs.free_step(11.0)
    assert fs.seconds_to_next_step(11.0) == 1.0   # "b" alone
    assert fs.pending_bytes() == STEP


def test_small_missing_and_linked_files_are_unlinked_as_before(tmp_path, directory):
    fs = FreeingInSteps(step_bytes=STEP)
    big_file(tmp_path / "small", STEP)
    fs.unlink(directory, "small")
    assert not (tmp_path / "small").exists() and not fs.freeing
    with pytest.raises(FileNotFoundError):
        fs.unlink(directory, "missing")
    big_file(tmp_path / "target", 3 * STEP)
    os.symlink(tmp_path / "target", tmp_path / "link")
    fs.unlink(directory, "link")
    assert not (tmp_path / "link").exists() and os.path.getsize(tmp_path / "target") == 3 * STEP
    assert not fs.freeing


def test_close_all_frees_what_is_left(tmp_path, directory):
    fs = FreeingInSteps(step_bytes=STEP)
    for name in ("a", "b"):
        big_file(tmp_path / name, 3 * STEP)
        fs.unlink(directory, name)
    fs.free_step(0.0)
    assert fs.pending_bytes() == 5 * STEP
    fs.close_all()
    assert not fs.freeing and fs.pending_bytes() == 0


def fill(queue: Queue) -> None:
    queue.put_many([{"task_id": f"t{i:04d}", "payload": {"blob": "x" * 1000}} for i in range(400)])
    for lease in queue.reserve("w", now=1, lease_seconds=60, limit=400):
        queue.ack(lease, now=2)


def test_a_queue_on_it_leaves_the_files_compact_leaves(tmp_path):
    fs = FreeingInSteps(step_bytes=STEP)
    with Queue(tmp_path / "stepped", filesystem=fs) as queue:
        fill(queue)
        queue.compact()
        fill_more = [{"task_id": f"u{i:04d}", "payload": {"blob": "y" * 1000}} for i in range(400)]
        queue.put_many(fill_more)
        queue.compact()  # deletes the first snapshot and the WAL since it: both > STEP
        assert fs.freeing
    with Queue(tmp_path / "plain") as queue:
        fill(queue)
        queue.compact()
        queue.put_many(fill_more)
        queue.compact()
    assert read_dir(tmp_path / "stepped") == read_dir(tmp_path / "plain")
    fs.close_all()


class SteppingClock:
    """Monotonic seconds the test moves; wall time fixed."""

    def __init__(self) -> None:
        self.monotonic = 50.0

    def monotonic_seconds(self) -> float:
        return self.monotonic

    def wall_seconds(self) -> float:
        return 1_700_000_000.0


def test_the_loop_sleeps_until_the_next_step_and_frees_it_then_but_not_beside_a_snapshot_child(tmp_path, monkeypatch):
    fs = FreeingInSteps(step_bytes=STEP, bytes_per_second=STEP * 100)   # a step per 10 ms
    queue = Queue(tmp_path / "queue", filesystem=fs)
    path = str(tmp_path / "s.sock")
    listener = bind_listener(path, 0o600)
    clock = SteppingClock()
    loop = Loop(str(tmp_path / "queue"), queue, listener, socket_path=path, compact_wal_bytes=10**12,
                max_connections=10, hook=None, notifier=Notifier({}), filesystem=fs, clock=clock)
    loop.register_listener()
    try:
        assert loop._timeout() is None or loop._timeout() > 1
        big_file(tmp_path / "queue" / "orphan", 3 * STEP)
        directory = open_directory(str(tmp_path / "queue"))
        fs.unlink(directory, "orphan")
        os.close(directory.fd)
        held = []
        while fs.freeing:
            assert loop._timeout() == 0.0   # a step is due
            loop.one_turn()
            held.append(fs.pending_bytes())
            if not fs.freeing:
                break
            assert abs(loop._timeout() - 0.01) < 1e-9   # the next is not
            loop.one_turn()   # returns after the timeout; still too soon for a step
            assert fs.pending_bytes() == held[-1]
            clock.monotonic += 0.01
        assert held == [2 * STEP, STEP, 0]
        big_file(tmp_path / "queue" / "orphan", 2 * STEP)
        directory = open_directory(str(tmp_path / "queue"))
        fs.unlink(directory, "orphan")
        os.close(directory.fd)
        # A snapshot child writing (a stand-in the compactor's own turn work leaves alone): no freeing.
        loop.compaction.in_flight = object()
        monkeypatch.setattr(loop.compaction, "settle", lambda: None)
        monkeypatch.setattr(loop.compaction, "maybe_start", lambda wrote, freeing: None)
        monkeypatch.setattr(loop.compaction, "next_deadline", lambda: None)
        assert loop._timeout() is None or loop._timeout() > 1
        clock.monotonic += 1.0
        loop._wake_write.send(b"x")   # a turn, as a signal would make one
        loop.one_turn()
        assert fs.pending_bytes() == 2 * STEP
        loop.compaction.in_flight = None
        loop.one_turn()
        assert fs.pending_bytes() == STEP
    finally:
        loop.compaction.in_flight = None
        loop.queue.close()
        loop.close_without_serving()
        listener.close()
