"""Group commit in-process: what a failed write is, and what a bug is.

The claims, each with the deliberately broken commit it must catch:

* a bug inside a turn's batch (a TypeError in request handling) propagates
  out of the commit — nothing of the turn is answered, the queue is not
  reopened — caught against the old ``except Exception`` around the batch;
* a failing fsync still answers every request of the turn with QueueClosed
  and reopens the queue — caught against a commit that lets it propagate.
"""

from __future__ import annotations

import errno

from walqueue import Queue
from walqueue import protocol as p
from walqueue.daemon import commit as commit_module
from walqueue.daemon.clock import SystemClock
from walqueue.daemon.commit import GroupCommit
from walqueue.daemon.recorder import Recorder
from walqueue.daemon.service import QueueService
from walqueue.engine import Engine
from walqueue.fs import OsFileSystem

from .test_service import FakePeer


class FsyncFailsOnce(OsFileSystem):
    def __init__(self) -> None:
        super().__init__()
        self.failures_left = 1

    def fsync(self, fd: int) -> None:
        if self.failures_left:
            self.failures_left -= 1
            raise OSError(errno.EIO, "injected: the fsync failed")
        super().fsync(fd)


def build(directory, filesystem=None) -> tuple[QueueService, GroupCommit, Recorder]:
    queue = Engine(directory, filesystem=filesystem)
    recorder = Recorder(next_seq=1, now=100, recovery_seconds=0.0)
    service = QueueService(queue, compact=lambda peer, request_id: commit.compaction.request(peer, request_id),
                      report=lambda now: None)
    commit = GroupCommit(service, directory=str(directory), open_queue=lambda: Engine(directory),
                         recorder=recorder, clock=SystemClock(), compact_wal_bytes=10**12)
    return service, commit, recorder


def problems_with_a_bug_in_the_batch(directory) -> list[str]:
    """What goes wrong when request handling raises a TypeError inside the batch."""
    service, commit, _ = build(directory)
    original = service.queue
    peer = FakePeer("w")

    def apply() -> None:
        service.handle(peer, p.Put(id=1, task_id="a", payload={}))
        raise TypeError("a bug in request handling")

    service.begin_turn(100, 0.0)
    problems = []
    try:
        committed = commit.turn(apply)
    except TypeError:
        pass
    else:
        problems.append(f"the bug did not propagate (turn returned {committed})")
    if any(b"QueueClosed" in answer.messages for answer in service.outbox):
        problems.append("the bug was answered as a write failure")
    if service.queue is not original:
        problems.append("the queue was reopened for a bug")
    (service.queue or original).close()
    return problems


def problems_with_a_failed_fsync(directory) -> list[str]:
    """What goes wrong when the turn's fsync fails."""
    service, commit, recorder = build(directory, FsyncFailsOnce())
    original = service.queue
    original.expired_total = 3  # leases its reaps expired before the failure: a counter outlives it
    peer = FakePeer("w")

    def apply() -> None:
        service.handle(peer, p.Put(id=1, task_id="a", payload={}))

    service.begin_turn(100, 0.0)
    problems = []
    try:
        if commit.turn(apply):
            problems.append("the turn reported success")
    except OSError as exc:
        problems.append(f"the failed fsync propagated: {exc!r}")
    answers = [p.decode_response(answer.messages[4:]) for answer in service.outbox]
    if [(answer.id, getattr(answer, "error", None)) for answer in answers] != [(1, "QueueClosed")]:
        problems.append(f"answers were {answers}, not one QueueClosed")
    if service.queue is original or service.queue is None:
        problems.append("the queue was not reopened")
    else:
        Queue.over(service.queue).put("after", {})  # the reopened queue serves
        service.queue.close()
    if recorder.write_failures_total != 1:
        problems.append(f"{recorder.write_failures_total} write failures counted")
    if recorder.expired_before_reopens != 3:
        problems.append(f"the expiries before the reopen became {recorder.expired_before_reopens}, not 3")
    original.close()
    return problems


def test_a_bug_inside_the_batch_propagates_unanswered_and_nothing_is_reopened(tmp_path):
    assert problems_with_a_bug_in_the_batch(tmp_path / "queue") == []


def test_the_bug_check_catches_a_commit_that_treats_every_error_as_a_write_failure(tmp_path, monkeypatch):
    monkeypatch.setattr(commit_module, "WRITE_FAILURES", (Exception,))  # the old `except Exception`
    assert problems_with_a_bug_in_the_batch(tmp_path / "queue") != []


def test_a_failing_fsync_answers_queue_closed_and_reopens_the_queue(tmp_path):
    assert problems_with_a_failed_fsync(tmp_path / "queue") == []


def test_the_fsync_check_catches_a_commit_that_lets_a_failed_write_through(tmp_path, monkeypatch):
    monkeypatch.setattr(commit_module, "WRITE_FAILURES", ())
    assert problems_with_a_failed_fsync(tmp_path / "queue") != []
