"""Deferred syncs: `batch(durable=False)`, `begin_sync()`, `PendingSync.run()`, `end_sync()`.

walqueued overlaps an fsync with its next batch of work through these; the
rules checked here are what lets it answer only after the fsync that covers
each answer.
"""

import threading

import pytest

from walqueue import InjectedCrash, Queue, QueueClosed
from walqueue.fs import OsFileSystem


class Recorder:
    def __init__(self):
        self.phases = []
        self.crash_at = None

    def __call__(self, phase):
        self.phases.append(phase)
        if phase == self.crash_at:
            raise InjectedCrash(phase)


class FailingSync(OsFileSystem):
    """An fsync that fails once asked to (a disk error on the WAL)."""

    def __init__(self):
        self.fail = False

    def fsync(self, fd):
        if self.fail:
            raise OSError(5, "injected EIO")
        super().fsync(fd)


@pytest.fixture
def hook():
    return Recorder()


@pytest.fixture
def q(tmp_path, hook):
    queue = Queue(tmp_path / "q", hook=hook)
    yield queue
    queue.close()


def test_a_non_durable_batch_writes_without_syncing_and_a_pending_sync_makes_it_durable(q, hook):
    assert q.begin_sync() is None  # nothing written yet
    with q.batch(durable=False):
        q.put("a", {})
        q.put("b", {})
    assert "wal.after_sync" not in hook.phases
    assert (q.synced_seq, q.stats().last_seq) == (0, 2)
    pending = q.begin_sync()
    assert pending is not None and pending.seq == 2
    assert q.begin_sync() is None  # one in flight at a time
    thread = threading.Thread(target=pending.run)
    thread.start()
    thread.join(10)
    q.end_sync(pending)
    assert hook.phases.count("wal.after_sync") == 1
    assert q.synced_seq == 2
    q.end_sync(pending)  # ending twice changes nothing
    assert hook.phases.count("wal.after_sync") == 1


def test_writes_after_begin_sync_wait_for_the_next_sync(q):
    with q.batch(durable=False):
        q.put("a", {})
    first = q.begin_sync()
    with q.batch(durable=False):
        q.put("b", {})  # written while the first sync is in flight
    first.run()
    q.end_sync(first)
    assert (q.synced_seq, q.stats().last_seq) == (1, 2)
    second = q.begin_sync()
    assert second.seq == 2
    second.run()
    q.end_sync(second)
    assert q.synced_seq == 2


def test_end_sync_before_run_is_a_programming_error(q):
    with q.batch(durable=False):
        q.put("a", {})
    pending = q.begin_sync()
    with pytest.raises(RuntimeError):
        q.end_sync(pending)
    pending.run()
    q.end_sync(pending)


def test_a_durable_operation_ends_the_sync_in_flight_first(q, hook):
    with q.batch(durable=False):
        q.put("a", {})
    pending = q.begin_sync()
    threading.Timer(0.2, pending.run).start()
    q.put("b", {})  # an ordinary durable put waits for the pending sync, then syncs itself
    assert pending.ended
    assert q.synced_seq == 2
    assert hook.phases.count("wal.after_sync") == 2
    q.end_sync(pending)  # the owner's later end_sync is a no-op
    assert hook.phases.count("wal.after_sync") == 2


def test_compact_with_a_sync_in_flight_waits_for_it(q, tmp_path):
    with q.batch(durable=False):
        q.put("a", {})
    pending = q.begin_sync()
    threading.Timer(0.2, pending.run).start()
    assert q.compact() == 1
    assert pending.ended and q.synced_seq == 1


def test_close_waits_for_the_sync_in_flight_and_syncs_the_rest(tmp_path):
    q = Queue(tmp_path / "q")
    with q.batch(durable=False):
        q.put("a", {})
    pending = q.begin_sync()
    with q.batch(durable=False):
        q.put("b", {})
    threading.Timer(0.2, pending.run).start()
    q.close()
    assert pending.done.is_set()
    with Queue(tmp_path / "q") as reopened:
        assert reopened.stats().ready == 2
        assert reopened.synced_seq == 2


def test_a_failed_pending_fsync_is_raised_by_end_sync_and_closes_the_queue(tmp_path):
    fs = FailingSync()
    q = Queue(tmp_path / "q", filesystem=fs)
    with q.batch(durable=False):
        q.put("a", {})
    pending = q.begin_sync()
    fs.fail = True
    pending.run()
    with pytest.raises(OSError, match="injected EIO"):
        q.end_sync(pending)
    assert q.synced_seq == 0
    with pytest.raises(QueueClosed):
        q.get("a")


def test_a_crash_at_wal_after_sync_in_end_sync_closes_the_queue(q, hook):
    with q.batch(durable=False):
        q.put("a", {})
    pending = q.begin_sync()
    pending.run()
    hook.crash_at = "wal.after_sync"
    with pytest.raises(InjectedCrash):
        q.end_sync(pending)
    with pytest.raises(QueueClosed):
        q.stats()


def test_a_queue_that_died_with_a_sync_in_flight_fails_that_sync(tmp_path, hook):
    q = Queue(tmp_path / "q", hook=hook)
    with q.batch(durable=False):
        q.put("a", {})
    pending = q.begin_sync()
    hook.crash_at = "wal.before_write"
    with pytest.raises(InjectedCrash), q.batch(durable=False):
        q.put("b", {})  # the Queue dies here, closing its files
    pending.run()  # on its own descriptor: still a valid fsync of the right file
    assert pending.error is None
    with pytest.raises(QueueClosed):
        q.end_sync(pending)
