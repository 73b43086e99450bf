"""Compaction off the loop, in-process with real forks: walqueue.daemon.compaction.

A `Driver` runs the daemon's turn as the loop does — the service's requests
inside one batch (the group commit), then `Compactor.settle`, then
`Compactor.maybe_start` — on a fake clock; the children are real forks of
this process, and a FIFO gate (`Gate`) holds one in "writing" while the
test goes on serving. The claims, each with what it must catch:

* the parent keeps applying and fsyncing while the child writes, and what
  the child publishes is the state through the seq it is named after — a
  fork taken a turn late, with the library's seq guard bypassed
  (tests/process/broken_hook.py's ``compaction_forks_after_the_next_turn``),
  is caught by reopening the directory;
* CURRENT is published only after the child exited 0: a crash at
  current.after_publish (a copy of the directory opened at that moment)
  recovers — caught against ``compaction_publishes_when_the_child_starts``;
* a ``compact`` request is answered only once a snapshot covering it is
  published, also when it arrives while an older one is in flight;
* a snapshot that cannot be written (ENOSPC in the child) is abandoned: no
  reopen, nothing lost, no partial file, the next attempt only after a
  growing back-off, requests meanwhile answered at once with the reason;
* the child closes the directory's LOCK and every socket it inherited, and
  stopping kills and reaps it;
* a child that never exits is killed at its deadline (a floor plus its
  snapshot's size at a minimum rate; the loop's timer points there), and
  that is a failed compaction like any other: logged, backed off, the
  waiting ``compact`` answered with an error, the next attempt fine;
* a compaction whose snapshot cannot fit the free space (bounded by
  ``Engine.snapshot_bytes_bound``, which counts what the WAL does not carry,
  such as a reserve's worker repeated per task) is refused before the
  fork: no child, no partial file, no reopen, and a bystander's put on a
  nearly full disk (a simulated one, through the file-system seam) succeeds.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import select
import shutil
import socket

import pytest

from tests.process import broken_hook
from walqueue import CorruptStore, Queue
from walqueue import protocol as p
from walqueue.daemon.commit import GroupCommit
from walqueue.daemon.compaction import (
    CHILD_MIN_BYTES_PER_SECOND,
    MAX_RETRY_SECONDS,
    Backoff,
    child_deadline_seconds,
    compaction_due,
)
from walqueue.daemon.exits import DaemonExit
from walqueue.daemon.loop import Loop, bind_listener
from walqueue.daemon.recorder import Recorder
from walqueue.daemon.service import QueueService
from walqueue.daemon.systemd import Notifier
from walqueue.engine import Engine
from walqueue.fs import OsFileSystem

from .test_loop import MAX_TURNS, Client, FakeClock, serving
from .test_service import FakePeer

CHILD_SECONDS = 30.0  # bound on any wait for a child


class Gate:
    """A FIFO that holds a snapshot child in its hook until the test releases it."""

    def __init__(self, directory) -> None:
        self.path = str(directory / "gate")
        os.mkfifo(self.path)
        self._fd: int | None = None

    def hook(self) -> None:  # runs in the child, after it closed what it inherited
        fd = os.open(self.path, os.O_RDONLY)
        try:
            os.read(fd, 1)
        finally:
            os.close(fd)

    def wait_entered(self) -> None:
        """Return once a child has opened the gate (it stands inside the hook)."""
        deadline = CHILD_SECONDS
        while deadline > 0:
            try:
                self._fd = os.open(self.path, os.O_WRONLY | os.O_NONBLOCK)
                return
            except OSError as exc:  # ENXIO: no reader yet
                if exc.errno != errno.ENXIO:
                    raise
            select.select([], [], [], 0.005)
            deadline -= 0.005
        raise AssertionError("no snapshot child reached the gate")

    def release(self) -> None:
        """Let the child go, and every later one (while the gate stays open: until `close`)."""
        os.write(self._fd, b"g" * 64)

    def release_one(self) -> None:
        """Let the child that entered go, and close: the next child waits at the gate again."""
        os.write(self._fd, b"g")
        self.close()

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


class Driver:
    """The loop's turn without sockets: one batch of requests, then settle, then maybe start."""

    def __init__(self, directory, *, floor_bytes=10**12, ratio=0.0, child_hook=None, hook=None,
                 filesystem=None, **compactor_options) -> None:
        self.directory = directory
        self.clock = FakeClock()
        self.queue_hook = hook
        self.filesystem = filesystem
        queue = Engine(directory, hook=hook, filesystem=filesystem)
        self.recorder = Recorder(next_seq=1, now=100, recovery_seconds=0.0, clock=self.clock.monotonic_seconds)
        self.service = QueueService(queue, compact=lambda peer, request_id: self.compactor.request(peer, request_id),
                               report=lambda now: None)
        self.reopens = 0
        self.commit = GroupCommit(self.service, directory=str(directory), open_queue=self._reopen,
                                  recorder=self.recorder, clock=self.clock, compact_wal_bytes=floor_bytes,
                                  compact_wal_ratio=ratio, child_hook=child_hook, **compactor_options)
        self.compactor = self.commit.compaction
        self.peer = FakePeer("client")
        self.request_id = 0
        self.answers: dict[int, object] = {}
        self.freeing = False  # as the loop's FreeingInSteps says: files of the last compaction wait

    def _reopen(self) -> Engine:
        self.reopens += 1
        return Engine(self.directory, hook=self.queue_hook, filesystem=self.filesystem)

    @property
    def engine(self) -> Engine:
        return self.service.queue

    @property
    def queue(self) -> Queue:
        """The library's face over the service's Engine: the tests' puts and reads."""
        return Queue.over(self.service.queue)

    def turn(self, *requests) -> list[int]:
        """Apply ``requests`` (built with id=0; numbered here) as one turn; their ids."""
        ids = []
        numbered = []
        for request in requests:
            self.request_id += 1
            request.id = self.request_id
            ids.append(self.request_id)
            numbered.append(request)
        self.service.begin_turn(100, self.clock.monotonic)

        def apply() -> None:
            for request in numbered:
                self.service.handle(self.peer, request)

        wrote = self.commit.turn(apply) and bool(numbered)
        self.compactor.settle()
        self.compactor.maybe_start(wrote, freeing=self.freeing)
        for answer in self.service.outbox:
            message = p.decode_response(answer.messages[4:])
            self.answers[message.id] = message
        self.service.outbox.clear()
        return ids

    def put(self, task_id: str) -> int:
        return self.turn(p.Put(id=0, task_id=task_id, payload={"n": task_id}))[0]

    def wait_child_exit(self) -> None:
        flight = self.compactor.in_flight
        assert flight is not None, "no compaction in flight"
        readable, _, _ = select.select([flight.child.fileno()], [], [], CHILD_SECONDS)
        assert readable, f"the snapshot child pid {flight.child.pid} did not exit in {CHILD_SECONDS} s"

    def finish(self) -> None:
        """Wait for the child in flight (if any) to exit, then run a turn that collects it."""
        if self.compactor.in_flight is not None:
            self.wait_child_exit()
        self.turn()

    def close(self) -> None:
        self.compactor.stop()
        if self.service.queue is not None:
            self.service.queue.close()


@pytest.fixture
def drivers():
    made: list[Driver] = []

    def make(directory, **options) -> Driver:
        driver = Driver(directory, **options)
        made.append(driver)
        return driver

    yield make
    for driver in made:
        driver.close()


def tasks_of(directory) -> list:
    with Queue(directory) as queue:
        return [queue.stats().last_seq, *queue.tasks()]


# -- the arithmetic -----------------------------------------------------------------


def test_the_backoff_doubles_from_one_second_to_five_minutes_and_starts_over_after_a_success():
    backoff = Backoff()
    delays = [backoff.failed(now=0.0) for _ in range(12)]
    assert delays[:5] == [1.0, 2.0, 4.0, 8.0, 16.0] and delays[-1] == MAX_RETRY_SECONDS == 300.0
    assert not backoff.ready(299.0) and backoff.ready(300.0) and backoff.remaining(100.0) == 200.0
    backoff.succeeded()
    assert backoff.ready(0.0) and backoff.remaining(0.0) is None and backoff.failed(0.0) == 1.0


def test_the_trigger_needs_both_the_floor_and_the_ratio():
    assert not compaction_due(1000, 0, floor_bytes=1000, ratio=1.0)
    assert compaction_due(1001, 0, floor_bytes=1000, ratio=1.0)
    assert not compaction_due(5000, 6000, floor_bytes=1000, ratio=1.0)
    assert compaction_due(6001, 6000, floor_bytes=1000, ratio=1.0)
    assert compaction_due(3001, 6000, floor_bytes=1000, ratio=0.5)


def amplification(ratio: float, growth: float, floor_bytes: int, wal_bytes: int) -> float:
    """Snapshot bytes written per WAL byte for a history grown to ``wal_bytes`` of WAL, where
    each WAL byte adds ``growth`` bytes to the snapshot (tombstones are never dropped)."""
    snapshot = written = since = 0.0
    for _ in range(wal_bytes // floor_bytes):
        since += floor_bytes  # the WAL grows in steps of the floor
        if compaction_due(since, snapshot, floor_bytes=floor_bytes - 1, ratio=ratio):
            snapshot += growth * since
            written += snapshot
            since = 0.0
    return written / wal_bytes


@pytest.mark.parametrize("growth", [0.25, 0.5, 1.0])
def test_with_ratio_one_snapshot_bytes_stay_within_twice_the_wal_however_long_the_history(growth):
    for history in (10**6, 10**8, 10**10):
        assert amplification(1.0, growth, 10**6, history) <= 1.0 + growth + 0.01


def test_the_floor_alone_lets_write_amplification_grow_with_the_history():
    # What the ratio is for: a fixed threshold rewrites the whole history every time.
    assert amplification(0.0, 0.5, 10**6, 10**8) > 20


# -- a compaction in the background -------------------------------------------------------


def test_the_loop_serves_while_the_child_writes_and_the_snapshot_holds_the_state_at_its_seq(
        tmp_path, drivers):
    gate = Gate(tmp_path)
    driver = drivers(tmp_path / "queue", floor_bytes=1, child_hook=gate.hook)
    for n in range(20):
        driver.put(f"t{n:02}")
    flight = driver.compactor.in_flight
    assert flight is not None and flight.compaction.seq == 1  # began after the first turn that wrote
    gate.wait_entered()
    try:
        # While the child is held in "writing", requests are applied, fsynced and answered.
        put_id = driver.put("during")
        (lease_id,) = driver.turn(p.Reserve(id=0, worker="w", lease_seconds=30))
        assert isinstance(driver.answers[put_id], p.PutOk) and driver.answers[lease_id].leases
        assert driver.queue.stats().snapshot_seq == 0 and driver.compactor.in_flight is flight
        gate.release()
        driver.finish()
    finally:
        gate.close()
    assert driver.queue.stats().snapshot_seq == 1 and driver.recorder.compactions_total == 1
    live = [driver.queue.stats().last_seq, *driver.queue.tasks()]
    driver.queue.close()
    assert tasks_of(driver.directory) == live


def problems_with_the_seq_of_the_snapshot(directory) -> list[str]:
    """What is wrong after a background compaction while requests keep coming, read back from disk."""
    problems = []
    driver = Driver(directory, floor_bytes=1)
    try:
        for n in range(30):
            driver.put(f"t{n:02}")
            if driver.compactor.in_flight is not None and n % 3 == 0:
                driver.finish()
        while driver.compactor.in_flight is not None:
            driver.finish()
        if driver.recorder.compactions_total == 0:
            problems.append("nothing was compacted")
        live = [driver.queue.stats().last_seq, *driver.queue.tasks()]
    finally:
        driver.close()
    try:
        if tasks_of(directory) != live:
            problems.append("the reopened directory differs from the state that was served")
    except CorruptStore as exc:
        problems.append(f"the reopened directory is corrupt: {exc}")
    return problems


def test_what_a_compaction_publishes_recovers_to_the_state_that_was_served(tmp_path):
    assert problems_with_the_seq_of_the_snapshot(tmp_path / "queue") == []


def test_the_seq_check_catches_a_fork_taken_after_the_next_turn(tmp_path):
    with broken_hook.active("compaction_forks_after_the_next_turn"):
        assert problems_with_the_seq_of_the_snapshot(tmp_path / "queue") != []


def problems_with_a_crash_at_publish(tmp_path) -> list[str]:
    """Copy the directory as a crash at current.after_publish leaves it, and open the copy."""
    problems: list[str] = []
    copies = iter(range(100))

    def hook(phase: str) -> None:
        if phase == "current.after_publish":
            copy = tmp_path / f"crash-{next(copies)}"
            shutil.copytree(tmp_path / "queue", copy, ignore=shutil.ignore_patterns("LOCK"))
            try:
                Queue(copy).close()
            except CorruptStore as exc:
                problems.append(f"a crash right after publishing CURRENT leaves a corrupt directory: {exc}")

    gate = Gate(tmp_path)
    driver = Driver(tmp_path / "queue", floor_bytes=1, child_hook=gate.hook, hook=hook)
    try:
        for n in range(10):
            driver.put(f"t{n}")
        gate.wait_entered()
        for n in range(5):  # turns while the child is held: nothing may be published yet
            driver.put(f"more{n}")
        gate.release()
        while driver.compactor.in_flight is not None:
            driver.finish()
        if driver.recorder.compactions_total != 1:
            problems.append(f"{driver.recorder.compactions_total} compactions published, not 1")
    except DaemonExit as exc:
        problems.append(f"the daemon would exit: {exc}")
    finally:
        gate.close()
        driver.close()
    return problems


def test_current_is_published_only_after_the_child_exited(tmp_path):
    assert problems_with_a_crash_at_publish(tmp_path) == []


def test_the_publish_check_catches_publishing_when_the_child_has_only_started(tmp_path):
    with broken_hook.active("compaction_publishes_when_the_child_starts"):
        assert problems_with_a_crash_at_publish(tmp_path) != []


# -- compact requests -----------------------------------------------------------------------


def test_a_compact_request_is_answered_once_a_snapshot_covering_it_is_published(tmp_path, drivers):
    gate = Gate(tmp_path)
    driver = drivers(tmp_path / "queue", child_hook=gate.hook)
    driver.put("a")
    (first,) = driver.turn(p.Compact(id=0))
    gate.wait_entered()
    try:
        assert first not in driver.answers  # the child is still writing
        seq_at_second = driver.queue.stats().last_seq + 1
        driver.put("b")  # a write after the in-flight compaction's seq
        (second,) = driver.turn(p.Compact(id=0))
        gate.release()
        driver.finish()
        assert driver.answers[first] == p.Compacted(id=first, seq=1)
        assert second not in driver.answers  # seq 1 does not cover "b": the next one runs at once
        assert driver.compactor.in_flight is not None
        driver.finish()
    finally:
        gate.close()
    assert driver.answers[second] == p.Compacted(id=second, seq=seq_at_second)
    assert driver.queue.stats().snapshot_seq == seq_at_second
    (third,) = driver.turn(p.Compact(id=0))  # nothing new: answered at once, as Queue.compact()
    assert driver.answers[third] == p.Compacted(id=third, seq=seq_at_second)


def test_no_compaction_begins_while_a_backup_pins_the_files(tmp_path, drivers):
    driver = drivers(tmp_path / "queue", floor_bytes=1)
    driver.service.backup_holder = FakePeer("backup")
    driver.put("a")
    assert driver.compactor.in_flight is None
    driver.service.backup_holder = None
    driver.put("b")  # the first write after the pin ends
    assert driver.compactor.in_flight is not None


def test_an_automatic_compaction_waits_for_the_freeing_and_a_requested_one_does_not(tmp_path, drivers):
    driver = drivers(tmp_path / "queue", floor_bytes=1)
    driver.freeing = True
    driver.put("a")
    assert driver.compactor.in_flight is None
    driver.turn(p.Compact(id=0))
    assert driver.compactor.in_flight is not None
    driver.finish()
    driver.put("b")
    assert driver.compactor.in_flight is None
    driver.freeing = False
    driver.put("c")  # the first write after the freeing ends
    assert driver.compactor.in_flight is not None


def test_a_backup_pin_defers_the_publication_until_it_is_released(tmp_path, drivers):
    driver = drivers(tmp_path / "queue", floor_bytes=1)
    driver.put("a")
    assert driver.compactor.in_flight is not None
    driver.service.backup_holder = FakePeer("backup")
    driver.finish()
    assert driver.queue.stats().snapshot_seq == 0 and driver.compactor.status().in_progress
    driver.put("b")  # no second compaction begins meanwhile
    assert driver.compactor.in_flight.compaction.seq == 1
    driver.service.backup_holder = None
    driver.turn()
    assert driver.queue.stats().snapshot_seq == 1 and not driver.compactor.status().in_progress


# -- a full disk ----------------------------------------------------------------------------


class Disk:
    """A child hook standing for the disk: while full, a snapshot write fails with ENOSPC."""

    def __init__(self, full: bool = True) -> None:
        self.full = full

    def __call__(self) -> None:
        if self.full:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))  # as a full disk says it


def test_a_snapshot_that_cannot_be_written_backs_off_without_reopening_or_losing_anything(tmp_path, drivers):
    disk = Disk()
    driver = drivers(tmp_path / "queue", floor_bytes=1, child_hook=disk)
    queue = driver.engine
    driver.put("a")
    driver.finish()
    status = driver.compactor.status()
    assert "No space left on device" in status.last_error and status.consecutive_failures == 1
    assert status.retry_in_seconds == 1.0 and driver.recorder.compaction_failures_total == 1
    assert driver.engine is queue and driver.reopens == 0  # nothing was lost: no reopen
    assert not any(name.startswith("snapshot-") for name in os.listdir(driver.directory))
    # Writes go on; none starts an attempt, and a compact request is answered with the reason.
    segments = queue.segment_count()
    for n in range(20):
        driver.put(f"b{n}")
    (request,) = driver.turn(p.Compact(id=0))
    answer = driver.answers[request]
    assert answer.error == "WalQueueError" and "No space left on device" in answer.message
    assert driver.compactor.in_flight is None and queue.segment_count() == segments
    driver.clock.advance(1.0)  # the back-off ends: the next write tries again, and fails again
    driver.put("c")
    driver.finish()
    assert driver.compactor.status().consecutive_failures == 2
    assert driver.compactor.status().retry_in_seconds == 2.0
    disk.full = False  # room again
    driver.clock.advance(2.0)
    driver.put("d")
    driver.finish()
    assert driver.queue.stats().snapshot_seq > 0 and driver.compactor.status().last_error == ""
    assert driver.compactor.status().consecutive_failures == 0 and driver.reopens == 0
    assert {task.task_id for task in driver.queue.tasks()} == {"a", "c", "d", *(f"b{n}" for n in range(20))}


def test_requests_waiting_for_a_compaction_that_fails_are_answered_with_its_error(tmp_path, drivers):
    driver = drivers(tmp_path / "queue", child_hook=Disk())
    driver.put("a")
    (request,) = driver.turn(p.Compact(id=0))
    driver.finish()
    assert driver.answers[request].error == "WalQueueError"
    assert "No space left on device" in driver.answers[request].message


# -- the child ----------------------------------------------------------------------------


def test_the_child_holds_neither_the_lock_nor_a_socket_and_stopping_kills_and_reaps_it(tmp_path, drivers):
    gate = Gate(tmp_path)
    driver = drivers(tmp_path / "queue", floor_bytes=1, child_hook=gate.hook)
    left, right = socket.socketpair()  # a client connection the daemon holds
    try:
        driver.put("a")
        pid = driver.compactor.in_flight.child.pid
        gate.wait_entered()
        targets = [os.readlink(f"/proc/{pid}/fd/{fd}") for fd in os.listdir(f"/proc/{pid}/fd")]
        lock = os.path.join(driver.directory, "LOCK")
        assert lock not in targets and not any(target.startswith("socket:") for target in targets)
        driver.compactor.stop()  # as at SIGTERM: kill, reap, abandon
        assert driver.compactor.in_flight is None and driver.engine.compaction_in_progress is None
        with pytest.raises(ChildProcessError):
            os.waitpid(pid, os.WNOHANG)  # already reaped
        assert not any(name.startswith("snapshot-") for name in os.listdir(driver.directory))
    finally:
        gate.close()
        with contextlib.suppress(OSError):
            left.close()
            right.close()


class HangsWhile:
    """A child hook: while the file ``path`` exists, the child blocks for ever (as a stopped or
    stuck one would) — until it is killed."""

    def __init__(self, path) -> None:
        self.path = str(path)
        with open(self.path, "w"):
            pass

    def __call__(self) -> None:
        if os.path.exists(self.path):
            while True:
                select.select([], [], [])

    def stop(self) -> None:
        os.unlink(self.path)


def turn_until(loop, condition, what: str) -> None:
    for _ in range(MAX_TURNS):
        if condition():
            return
        loop.one_turn()
    raise AssertionError(f"no {what} in {MAX_TURNS} turns")


def test_a_child_that_never_exits_is_killed_at_its_deadline_and_the_compaction_backs_off(tmp_path, caplog):
    hang = HangsWhile(tmp_path / "hang")
    clock = FakeClock()
    with serving(tmp_path, clock, child_hook=hang, child_deadline_floor_seconds=10.0) as (loop, _, connect):
        client = connect()
        client.send(p.Put(id=1, task_id="a", payload={"n": 1}))
        client.answer(1)
        client.send(p.Compact(id=2))
        turn_until(loop, lambda: loop.compaction.in_flight is not None, "compaction in flight")
        flight = loop.compaction.in_flight
        # The deadline: the floor plus the snapshot's bound at the minimum rate; the loop's timer points there.
        bound = loop.queue.snapshot_bytes_bound()
        assert flight.deadline - flight.started == child_deadline_seconds(bound, 10.0)
        assert child_deadline_seconds(bound, 10.0) == 10.0 + bound / CHILD_MIN_BYTES_PER_SECOND
        assert loop.timer_seconds() == pytest.approx(flight.deadline - clock.monotonic)
        clock.advance(flight.deadline - clock.monotonic - 0.5)
        loop.one_turn()
        assert loop.compaction.in_flight is flight and not client.has_answer(2)  # not before its deadline
        clock.advance(0.5)
        with caplog.at_level(logging.ERROR, logger="walqueued"):
            loop.one_turn()
        answer = client.answer(2)
        assert answer.error == "WalQueueError" and "did not exit within 10 s, so it was killed" in answer.message
        if loop.compaction.in_flight is not None:
            # Not reaped yet in the turn that killed it (the loop never blocks in waitpid): the
            # past deadline is no timer any more, the pidfd wakes the loop once the child is gone.
            assert loop.timer_seconds() != 0.0
            assert select.select([flight.child.fileno()], [], [], CHILD_SECONDS)[0], "the killed child lives on"
            loop.one_turn()
        assert loop.compaction.in_flight is None
        with pytest.raises(ChildProcessError):
            os.waitpid(flight.child.pid, os.WNOHANG)  # killed and reaped
        status = loop.compaction.status()
        assert status.consecutive_failures == 1 and status.retry_in_seconds == 1.0
        assert loop.recorder.compaction_failures_total == 1 and loop.recorder.write_failures_total == 0
        assert any("compaction failed (1 in a row)" in record.getMessage() and "killed" in record.getMessage()
                   for record in caplog.records), [record.getMessage() for record in caplog.records]
        assert not any(name.startswith("snapshot-") for name in os.listdir(tmp_path / "queue"))
        # After the back-off, a child that does exit compacts as usual.
        hang.stop()
        clock.advance(1.0)
        client.send(p.Put(id=3, task_id="b", payload={}), p.Compact(id=4))
        turn_until(loop, lambda: loop.compaction.in_flight is not None, "a second compaction")
        readable, _, _ = select.select([loop.compaction.in_flight.child.fileno()], [], [], CHILD_SECONDS)
        assert readable, "the second snapshot child did not exit"
        assert client.answer(4) == p.Compacted(id=4, seq=2)
        assert loop.compaction.status().consecutive_failures == 0


# -- the space a snapshot needs ----------------------------------------------------------------


class SmallDisk(OsFileSystem):
    """The file-system seam as a disk of ``capacity`` bytes for the files of one directory.

    What is used is the size of the directory's files, read from the directory
    itself, so a snapshot child (a fork holding a copy of this object) and its
    parent see the same disk. A write that does not fit writes what fits, then
    fails with ENOSPC, as a real full disk does.
    """

    def __init__(self, directory, capacity: int) -> None:
        self.path = str(directory)
        self.capacity = capacity

    def used(self) -> int:
        with os.scandir(self.path) as entries:
            return sum(entry.stat(follow_symlinks=False).st_size for entry in entries if entry.is_file())

    def free_bytes(self, directory: str) -> int:  # for the Compactor, in place of statvfs
        return max(0, self.capacity - self.used())

    def write(self, fd: int, data: bytes) -> None:
        room = self.free_bytes(self.path)
        if len(data) > room:
            if room:
                super().write(fd, data[:room])
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        super().write(fd, data)

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        raise AssertionError("no preallocation in these tests")


def fill_with_long_worker_leases(driver: Driver, tasks: int = 200) -> None:
    """Tasks leased by one reserve of a worker with a long name: the snapshot repeats the name
    per task, the WAL holds it once (a reserve leases up to 1,000 tasks)."""
    driver.turn(p.PutMany(id=0, requests=[p.PutItem(task_id=f"t{n:03}", payload={}) for n in range(tasks)]))
    (reserve,) = driver.turn(p.Reserve(id=0, worker="w" * 1000, lease_seconds=3600, limit=tasks))
    assert len(driver.answers[reserve].leases) == tasks


def test_a_snapshot_that_cannot_fit_is_refused_before_the_fork_and_a_bystander_s_put_succeeds(tmp_path, drivers):
    directory = tmp_path / "queue"
    directory.mkdir()
    disk = SmallDisk(directory, capacity=10**9)
    driver = drivers(directory, filesystem=disk, free_bytes=disk.free_bytes)
    fill_with_long_worker_leases(driver)
    bound = driver.engine.snapshot_bytes_bound()
    # Room for the WAL to grow, not for the snapshot (which takes about the bound).
    disk.capacity = disk.used() + bound // 2
    queue = driver.engine
    (compact,) = driver.turn(p.Compact(id=0))
    if driver.compactor.in_flight is not None:  # a child let fork fills the disk, then fails
        driver.wait_child_exit()
    # Bystanders write as before: nothing failed, nothing was reopened.
    bystander = driver.put("bystander")
    assert isinstance(driver.answers[bystander], p.PutOk), driver.answers[bystander]
    assert driver.engine is queue and driver.reopens == 0 and driver.recorder.write_failures_total == 0
    # The compaction was refused before the fork, and said why.
    answer = driver.answers[compact]
    assert answer.error == "WalQueueError" and "not enough free space" in answer.message
    assert driver.compactor.in_flight is None and driver.recorder.compaction_failures_total == 1
    assert not any(name.startswith("snapshot-") for name in os.listdir(directory))
    status = driver.compactor.status()
    assert status.consecutive_failures == 1 and status.retry_in_seconds == 1.0
    # With room again, the next attempt after the back-off compacts.
    disk.capacity = 10**9
    driver.clock.advance(1.0)
    (compact,) = driver.turn(p.Compact(id=0))
    driver.finish()
    assert driver.answers[compact] == p.Compacted(id=compact, seq=driver.queue.stats().last_seq)


# -- the daemon's own lease reaping on a full disk -------------------------------------------


class FullDiskHook:
    """A Queue hook: while ``full``, every frame write fails with ENOSPC (counted)."""

    def __init__(self) -> None:
        self.full = False
        self.refused = 0

    def __call__(self, phase: str) -> None:
        if self.full and phase == "wal.before_write":
            self.refused += 1
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def reap_attempts_on_a_full_disk(tmp_path, *, backing_off: bool = True) -> tuple[int, list[str]]:
    """(writes refused, problems) over a minute of half-second turns after a lease's deadline
    while the disk is full; then the disk has room again."""
    clock = FakeClock()
    hook = FullDiskHook()
    path = str(tmp_path / "s.sock")
    listener = bind_listener(path, 0o600)
    loop = Loop(str(tmp_path / "queue"), Engine(tmp_path / "queue", hook=hook), listener, socket_path=path,
                compact_wal_bytes=10**12, max_connections=10, hook=hook, notifier=Notifier({}), clock=clock)
    if not backing_off:  # the daemon before the back-off: a reap whenever a lease is due
        loop.reap_backoff.ready = lambda now: True
    loop.register_listener()
    timer_seconds, loop._timeout = loop._timeout, lambda: 0.0  # the test drives the turns
    client = Client(path, loop)
    problems = []
    try:
        client.send(p.Put(id=1, task_id="job", payload={}), p.Reserve(id=2, worker="w", lease_seconds=1))
        client.answer(1)
        (lease,) = client.answer(2).leases
        hook.full = True
        clock.advance(lease.deadline - clock.wall)
        for _ in range(120):
            loop.one_turn()
            clock.advance(0.5)
        if loop.recorder.write_failures_total != hook.refused:
            problems.append(f"{loop.recorder.write_failures_total} write failures for {hook.refused} refusals")
        if backing_off and not 0 < timer_seconds() <= 32.0:
            problems.append(f"the timer says {timer_seconds()}, not the end of the back-off")
        hook.full = False
        clock.advance(32.0)
        loop.one_turn()
        if loop.queue.get("job").status != "ready" or loop.reap_backoff.failures != 0:
            problems.append("the lease was not reaped once the disk had room")
    finally:
        client.close()
        loop.queue.close()
        loop.close_without_serving()
        listener.close()
    return hook.refused, problems


def test_lease_reaping_on_a_full_disk_is_retried_with_a_backoff_not_every_second(tmp_path):
    refused, problems = reap_attempts_on_a_full_disk(tmp_path)
    # Attempts at about 0, 1, 3, 7, 15, 31 s: six, where one per second would be 60.
    assert 5 <= refused <= 7 and problems == [], (refused, problems)


def test_the_reaping_check_catches_a_daemon_that_retries_every_second(tmp_path):
    refused, _ = reap_attempts_on_a_full_disk(tmp_path, backing_off=False)
    assert refused > 30
