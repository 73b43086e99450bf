"""The sans-IO service fed by hand: requests and times in, answers and waits out, no sockets.

Peers are plain objects, ``now`` and the monotonic reading are numbers the
test picks, and a turn is what the loop does with them (tests/unit/test_loop.py
drives the real loop): begin, one batch of work, end the waits that timed out.
"""

from __future__ import annotations

import types
from pathlib import Path

import pytest

from walqueue import Queue
from walqueue import protocol as p
from walqueue.daemon.service import (
    MAX_PARKED_PER_CONNECTION,
    ListingInterrupted,
    Parked,
    ParkedReserves,
    QueueService,
    Refused,
)
from walqueue.engine import Engine


class FakePeer:
    """A client as the service sees it."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.parked = 0
        self.closing = False
        self.answer_bytes = 0
        self.protocol_version = p.PROTOCOL_VERSION
        self.has_gone = False

    def gone(self) -> bool:
        return self.has_gone


class Harness:
    def __init__(self, directory: Path) -> None:
        self.compactions: list[str] = []
        self.service = QueueService(Engine(directory), compact=self._compact, report=lambda now: None)

    def _compact(self, peer, request_id: int) -> None:
        """Compact in the turn and answer, as the compactor would once its child publishes."""
        self.compactions.append("on request")
        seq = self.service.queue.compact()
        self.service.answer(peer, request_id, [p.Compacted(id=request_id, seq=seq)])

    @property
    def queue(self) -> Queue:
        """The library's face over the service's Engine: the tests' puts and reads."""
        return Queue.over(self.service.queue)

    def turn(self, now: int, monotonic_seconds: float, *requests) -> list[tuple[FakePeer, object]]:
        """One loop turn: (peer, request) pairs applied in one batch; the decoded answers."""
        service = self.service
        service.begin_turn(now, monotonic_seconds)
        with service.queue.batch():
            if service.reap_due(now):
                service.reap()
            if service.parked:
                service.serve_parked()
            for peer, request in requests:
                service.handle(peer, request)
        service.expire_waits(monotonic_seconds)
        return self.take_answers()

    def take_answers(self) -> list[tuple[FakePeer, object]]:
        answers = []
        for answer in self.service.outbox:
            messages = answer.messages
            if isinstance(messages, bytes):
                reader = p.FrameReader()
                reader.feed(messages)
                while (body := reader.next_body()) is not None:
                    answers.append((answer.peer, p.decode_response(body)))
            else:
                answers.extend((answer.peer, p.decode_response(p.encode(message)[4:])) for message in messages)
        self.service.outbox.clear()
        return answers


@pytest.fixture
def harness(tmp_path):
    harness = Harness(tmp_path / "queue")
    yield harness
    harness.queue.close()


def leased_ids(answer) -> list[str]:
    assert isinstance(answer, p.Leases), answer
    return [lease.task_id for lease in answer.leases]


def test_waiting_reserves_are_served_in_arrival_order_as_puts_make_tasks_due(harness):
    first, second, producer = FakePeer("first"), FakePeer("second"), FakePeer("producer")
    assert harness.turn(100, 0.0, (first, p.Reserve(id=1, worker="a", wait=30))) == []
    assert harness.turn(100, 0.1, (second, p.Reserve(id=2, worker="b", wait=30))) == []
    assert harness.service.parked.live == 2 and (first.parked, second.parked) == (1, 1)
    answers = harness.turn(100, 0.2, (producer, p.Put(id=3, task_id="one", payload={})))
    assert [(peer.name, type(answer).__name__) for peer, answer in answers] == \
        [("producer", "PutOk"), ("first", "Leases")]
    assert leased_ids(answers[1][1]) == ["one"]
    answers = harness.turn(100, 0.3, (producer, p.Put(id=4, task_id="two", payload={})))
    assert leased_ids(answers[1][1]) == ["two"] and answers[1][0] is second
    assert not harness.service.parked and (first.parked, second.parked) == (0, 0)


def test_a_wait_ends_with_no_leases_at_its_monotonic_deadline_and_not_before(harness):
    worker = FakePeer("w")
    harness.turn(100, 10.0, (worker, p.Reserve(id=1, worker="w", wait=5)))
    assert harness.service.next_wait_deadline() == 15.0
    assert harness.turn(104, 14.999) == []
    (answer,) = harness.turn(200, 15.0)  # the wall clock jumped: the wait still ends on time
    assert answer == (worker, p.Leases(id=1, leases=[])) and not harness.service.parked


def test_a_delay_elapsing_wakes_a_waiting_reserve_at_the_due_time_it_reports(harness):
    worker, producer = FakePeer("w"), FakePeer("producer")
    harness.turn(100, 0.0, (producer, p.Put(id=1, task_id="later", payload={}, available_at=105)),
                 (worker, p.Reserve(id=2, worker="w", wait=60)))
    assert harness.service.next_due_time() == 105
    assert harness.turn(104, 4.0) == []
    (answer,) = harness.turn(105, 5.0)
    assert leased_ids(answer[1]) == ["later"]


def test_leases_end_on_time_with_the_same_expire_frames_a_reserve_would_write(tmp_path):
    # Two directories with the same history: in one the service reaps at the
    # deadline, in the other a reserve that leases nothing does.
    by_service, by_reserve = Harness(tmp_path / "service"), Queue(tmp_path / "reserve")
    try:
        for queue in (by_service.queue, by_reserve):
            queue.put("job", {}, max_attempts=1)
            queue.reserve("w", now=100, lease_seconds=10)
        assert by_service.service.next_due_time() == 110
        assert not by_service.service.reap_due(109)
        harness_answers = by_service.turn(109, 0.0)
        assert by_service.queue.get("job").status == "leased"
        assert by_service.service.reap_due(110)
        harness_answers += by_service.turn(110, 1.0)
        assert harness_answers == []  # nobody asked: nothing is answered
        assert by_service.queue.get("job").status == "dead"
        assert by_service.service.next_due_time() is None  # no timer left to run
        assert by_reserve.reserve("other", now=110, lease_seconds=10) == []
        assert by_service.queue.stats() == by_reserve.stats()
    finally:
        by_service.queue.close()
        by_reserve.close()
    segment = "wal-00000000000000000001.log"
    assert (tmp_path / "service" / segment).read_bytes() == (tmp_path / "reserve" / segment).read_bytes()


def test_paused_leasing_parks_reserves_but_leases_still_expire_on_time(harness):
    operator, worker = FakePeer("operator"), FakePeer("w")
    harness.queue.put("held", {})
    (lease,) = harness.queue.reserve("early", now=100, lease_seconds=5)
    answers = harness.turn(100, 0.0, (operator, p.Pause(id=1)), (worker, p.Reserve(id=2, worker="w", wait=60)))
    assert answers == [(operator, p.PauseState(id=1, paused=True))]
    assert harness.service.next_due_time() == lease.deadline  # the reap timer runs while paused
    assert harness.turn(105, 5.0) == []
    assert harness.queue.get("held").status == "ready"  # expired on time, leased to no one
    answers = harness.turn(105, 6.0, (operator, p.Resume(id=3)))
    assert [type(answer) for _, answer in answers] == [p.Leases, p.PauseState]
    assert leased_ids(answers[0][1]) == ["held"] and answers[0][0] is worker


def test_a_peer_that_has_gone_is_never_handed_a_lease(harness):
    leaver, producer = FakePeer("leaver"), FakePeer("producer")
    harness.turn(100, 0.0, (leaver, p.Reserve(id=1, worker="w", wait=60)))
    leaver.has_gone = True
    answers = harness.turn(100, 1.0, (producer, p.Put(id=2, task_id="job", payload={})))
    assert (leaver, p.Leases(id=1, leases=[])) in answers
    assert harness.queue.get("job").status == "ready"
    assert harness.turn(100, 2.0, (leaver, p.Reserve(id=3, worker="w"))) == [(leaver, p.Leases(id=3, leases=[]))]


def test_a_failed_turn_answers_every_request_with_queue_closed_and_forgets_its_waits(harness):
    writer, waiter, old_waiter = FakePeer("writer"), FakePeer("waiter"), FakePeer("old")
    harness.turn(100, 0.0, (old_waiter, p.Reserve(id=9, worker="o", wait=60)))
    service = harness.service
    service.begin_turn(100, 1.0)
    service.handle(writer, p.Put(id=1, task_id="a", payload={}))  # served old_waiter too
    service.handle(waiter, p.Reserve(id=2, worker="w", wait=60))
    assert service.fail_turn("write failed") == 3
    answers = harness.take_answers()
    assert {(peer.name, answer.id) for peer, answer in answers} == {("writer", 1), ("waiter", 2), ("old", 9)}
    assert all(isinstance(answer, p.Error) and answer.error == "QueueClosed" for _, answer in answers)
    assert not service.parked and waiter.parked == 0


def test_request_errors_are_answered_and_the_turn_goes_on(harness):
    peer = FakePeer("w")
    answers = harness.turn(100, 0.0, (peer, p.Reserve(id=1, worker="")),
                           (peer, p.Ack(id=2, task_id="ghost", worker="w", generation=1)),
                           (peer, p.Reserve(id=3, worker="w", wait=301)),
                           (peer, p.Put(id=4, task_id="a", payload={})))
    assert [(answer.id, getattr(answer, "error", None)) for _, answer in answers] == \
        [(1, "InvalidRequest"), (2, "StaleLease"), (3, "InvalidRequest"), (4, None)]
    assert answers[1][1].status is None and answers[1][1].task_id == "ghost"


def test_a_bug_in_a_handler_propagates_instead_of_being_answered(harness, monkeypatch):
    monkeypatch.setattr(harness.service.queue, "stats", lambda: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        harness.turn(100, 0.0, (FakePeer("w"), p.Stats(id=1)))


def test_a_connection_may_have_only_so_many_waits(harness):
    peer = FakePeer("w")
    for request_id in range(MAX_PARKED_PER_CONNECTION):
        harness.turn(100, 0.0, (peer, p.Reserve(id=request_id, worker="w", wait=60)))
    ((_, answer),) = harness.turn(100, 0.0, (peer, p.Reserve(id=999, worker="w", wait=60)))
    assert answer.error == "InvalidRequest" and "too many waiting reserves" in answer.message
    ((_, answer),) = harness.turn(100, 0.0, (peer, p.AckAndReserve(id=1000, task_id="t", worker="w",
                                                                 generation=1, wait=60)))
    assert answer.error == "InvalidRequest"  # refused before the ack could be written


def test_long_list_answers_are_chunked_and_all_but_the_last_say_more(harness):
    big = "x" * (p.CHUNK_BUDGET_BYTES // 2)
    harness.queue.put_many([{"task_id": f"t{n}", "payload": {"pad": big}} for n in range(3)])
    peer = FakePeer("w")
    answers = [answer for _, answer in harness.turn(100, 0.0, (peer, p.Reserve(id=1, worker="w", limit=3)))]
    assert len(answers) >= 2 and [a.more for a in answers] == [True] * (len(answers) - 1) + [False]
    assert [lease.task_id for answer in answers for lease in answer.leases] == ["t0", "t1", "t2"]
    listing = [answer for _, answer in harness.turn(100, 0.0, (peer, p.Tasks(id=2)))]
    assert [task.task_id for answer in listing for task in answer.tasks] == ["t0", "t1", "t2"]
    assert listing[-1].more is False and all(answer.more for answer in listing[:-1])


def test_a_listing_ends_with_an_error_when_the_queue_is_replaced_under_it(harness, tmp_path):
    harness.queue.put("a", {})
    harness.service.begin_turn(100, 0.0)
    harness.service.handle(FakePeer("w"), p.Tasks(id=1))
    (answer,) = harness.service.outbox
    old = harness.service.replace_queue(Engine(tmp_path / "other"))
    old.close()
    with pytest.raises(ListingInterrupted):
        next(answer.messages)


def test_a_backup_pin_refuses_compaction_until_it_ends_or_its_peer_is_forgotten(harness):
    backup, other = FakePeer("backup"), FakePeer("other")
    harness.queue.put("a", {})
    ((_, manifest),) = harness.turn(100, 0.0, (backup, p.BackupBegin(id=1)))
    assert isinstance(manifest, p.Manifest) and harness.service.backup_holder is backup
    ((_, refused),) = harness.turn(100, 0.0, (other, p.Compact(id=2)))
    assert refused.error == "InvalidRequest" and "backup is in progress" in refused.message
    ((_, refused),) = harness.turn(100, 0.0, (other, p.BackupEnd(id=3)))
    assert refused.error == "InvalidRequest"
    harness.service.forget(backup)  # its connection closed
    ((_, compacted),) = harness.turn(100, 0.0, (other, p.Compact(id=4)))
    assert isinstance(compacted, p.Compacted) and harness.compactions == ["on request"]


def test_parked_reserves_keep_arrival_order_and_expire_by_deadline():
    peer_a, peer_b = types.SimpleNamespace(parked=0), types.SimpleNamespace(parked=0)
    parked = ParkedReserves()
    entries = [Parked(peer_a if n % 2 else peer_b, None, deadline, 0)
               for n, deadline in enumerate([30.0, 10.0, 20.0, 40.0])]
    for entry in entries:
        parked.add(entry)
    assert parked.live == 4 and (peer_a.parked, peer_b.parked) == (2, 2)
    assert parked.next_deadline() == 10.0
    assert parked.expire(25.0) == [entries[1], entries[2]]  # in deadline order
    assert parked.head() is entries[0]  # arrival order among the rest
    assert parked.finish_head() is entries[0]
    assert parked.head() is entries[3] and parked.next_deadline() == 40.0
    assert parked.drop(lambda entry: entry.peer is peer_a) == [entries[3]]
    assert not parked and parked.head() is None and parked.next_deadline() is None
    assert (peer_a.parked, peer_b.parked) == (0, 0)


def test_many_finished_waits_do_not_pile_up():
    peer = types.SimpleNamespace(parked=0)
    parked = ParkedReserves()
    keeper = Parked(peer, None, 1e9, 0)
    parked.add(keeper)
    for n in range(1000):
        parked.add(Parked(peer, None, float(n), 0))
    parked.expire(1e6)
    assert parked.head() is keeper and parked.live == 1
    assert len(parked._arrivals) < 100 and len(parked._deadlines) < 100


def test_every_request_type_but_the_hello_has_a_handler(harness):
    # A request the union decodes but no handler takes would stop the daemon (a KeyError is a
    # bug, not the request's fault): adding a request type means adding its handler.
    handled = set(harness.service._handlers) - {Refused}
    assert handled == set(p.Request.__args__) - {p.Hello}
    assert set(p.WRITING_REQUESTS) <= handled


def test_a_lease_longer_than_the_daemons_bound_is_refused_naming_it_and_writes_nothing(harness):
    """Issue 23: `--lease-seconds 99999999999` leased a task for 3,000 years (SPEC §8b)."""
    from walqueue.daemon.service import DEFAULT_MAX_LEASE_SECONDS

    assert DEFAULT_MAX_LEASE_SECONDS == 12 * 3600 == harness.service.max_lease_seconds
    peer = FakePeer("w")
    harness.turn(100, 0.0, (peer, p.Put(id=1, task_id="t", payload={})))
    ((_, at_bound),) = harness.turn(100, 0.0, (peer, p.Reserve(id=2, worker="w", lease_seconds=43200)))
    (lease,) = at_bound.leases
    seq = harness.queue.stats().last_seq
    over = [p.Reserve(id=3, worker="w", lease_seconds=43201),
            p.Reserve(id=4, worker="w", lease_seconds=99999999999, wait=5),
            p.Touch(id=5, task_id="t", worker="w", generation=lease.generation, lease_seconds=43201),
            p.AckAndReserve(id=6, task_id="t", worker="w", generation=lease.generation,
                            lease_seconds=43201)]
    for request in over:
        ((_, answer),) = harness.turn(101, 0.0, (peer, request))
        assert answer.error == "InvalidRequest", (request, answer)
        assert "43200 s" in answer.message and "--max-lease-seconds" in answer.message, answer.message
    assert harness.queue.stats().last_seq == seq and not harness.service.parked
    assert harness.queue.get("t").status == "leased"  # the refused ack_and_reserve acked nothing


def test_the_lease_bound_is_the_daemons_option_and_the_library_keeps_its_own(tmp_path):
    queue = Queue(tmp_path / "q")
    service = QueueService(queue.engine, compact=lambda *_: None, report=lambda now: None,
                           max_lease_seconds=60)
    peer = FakePeer("w")
    service.begin_turn(100, 0.0)
    with queue.batch():
        service.handle(peer, p.Put(id=1, task_id="t", payload={}))
        service.handle(peer, p.Reserve(id=2, worker="w", lease_seconds=61))
    assert queue.get("t").status == "ready"
    assert queue.reserve("w", now=100, lease_seconds=99999999999)  # §1's bounds only
    queue.close()
