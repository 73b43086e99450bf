"""walqueued deletes big files at a pace (walqueue.daemon.freeing): the name at once, the
blocks over later turns, so that a compaction's deletions never stall the WAL's fsyncs.

The claims: after `unlink` the name is gone (what SPEC §5's deletion and the
directory fsync are about) while the blocks are freed only by `free_step`,
one step at a time and no faster than the pace, which grows with the files
waiting; at most MAX_FILES_BEING_FREED files wait, a further one freeing the
oldest at once; small files, missing files and links are unlinked as
before; a Queue compacting on it leaves exactly the files compact() leaves;
the loop sleeps until the next step is due, and frees it then; and it goes
on freeing beside a requested compaction's child, so back-to-back `compact`
requests free what each deletes instead of piling deleted files up
(walqueue.daemon.compaction keeps an automatic compaction from starting
while files wait).
"""

from __future__ import annotations

import os
import select

import pytest

from walqueue import Queue
from walqueue import protocol as p
from walqueue.daemon.cli import RESERVED_DESCRIPTORS
from walqueue.daemon.freeing import MAX_FILES_BEING_FREED, FreeingInSteps
from walqueue.daemon.loop import Loop, bind_listener
from walqueue.daemon.systemd import Notifier
from walqueue.engine import Engine
from walqueue.fs import open_directory

from .frames import read_dir
from .test_compaction import CHILD_SECONDS, Gate, turn_until
from .test_loop import FakeClock, serving

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


def test_at_most_max_files_wait_and_one_more_frees_the_oldest_at_once(tmp_path, directory):
    fs = FreeingInSteps(step_bytes=STEP)
    held = []
    for n in range(MAX_FILES_BEING_FREED + 3):
        big_file(tmp_path / f"f{n}", (n + 2) * STEP)
        fs.unlink(directory, f"f{n}")
        held.append(fs.files)
    assert held == [*range(1, MAX_FILES_BEING_FREED + 1), *[MAX_FILES_BEING_FREED] * 3]
    assert fs.freed_at_once == 3
    # The oldest went: what is held is the newest files, whole.
    assert fs.pending_bytes() == sum((n + 2) * STEP for n in range(3, MAX_FILES_BEING_FREED + 3))
    # The descriptors they hold are within what the daemon reserves besides its connections.
    assert MAX_FILES_BEING_FREED <= RESERVED_DESCRIPTORS // 2
    fs.close_all()


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

    def boot_seconds(self) -> float:
        return self.monotonic

    def wall_seconds(self) -> float:
        return 1_700_000_000.0


def test_the_loop_sleeps_until_the_next_step_and_frees_it_then(tmp_path):
    fs = FreeingInSteps(step_bytes=STEP, bytes_per_second=STEP * 100)   # a step per 10 ms
    queue = Engine(tmp_path / "queue", filesystem=fs)
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
    finally:
        loop.close_without_serving()
        loop.queue.close()
        listener.close()


TURNS_BESIDE_A_CHILD = 16


def test_back_to_back_requested_compactions_free_the_deleted_files_as_they_go(tmp_path):
    """Each compact request is answered and the next one sent at once, as a client compacting in
    a loop does; the freeing goes on (a step a second) while each child writes."""
    fs = FreeingInSteps(step_bytes=STEP, bytes_per_second=STEP)
    gate = Gate(tmp_path)
    clock = FakeClock()
    with serving(tmp_path, clock, filesystem=fs, child_hook=gate.hook) as (loop, _, connect):
        Queue.over(loop.queue).put_many([{"task_id": f"t{n:04}", "payload": {"blob": "x" * 1000}} for n in range(600)])
        client = connect()
        held, freed_beside_children = [], 0
        try:
            for round_number in range(12):
                request_id = 10 + 2 * round_number
                client.send(p.Put(id=request_id, task_id=f"r{round_number}", payload={}),
                            p.Compact(id=request_id + 1))
                turn_until(loop, lambda: loop.compaction.in_flight is not None, "a compaction in flight")
                gate.wait_entered()
                before = fs.pending_bytes()
                for _ in range(TURNS_BESIDE_A_CHILD):
                    clock.advance(1.0)
                    loop.one_turn()
                freed_beside_children += before - fs.pending_bytes()
                gate.release_one()
                child = loop.compaction.in_flight.child
                assert select.select([child.fileno()], [], [], CHILD_SECONDS)[0], "the child did not exit"
                assert isinstance(client.answer(request_id + 1), p.Compacted)
                held.append(fs.files)
        finally:
            gate.close()
        # Each compaction deletes the previous snapshot (about 12 steps); the next child's turns free it.
        assert max(held) <= 2 and fs.freed_at_once == 0, held
        assert freed_beside_children > 0
