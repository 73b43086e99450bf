"""walqueued's side of SPEC §8b, sans I/O (walqueue.daemon.steering): the worker names each
connection used, cancel in the turn's batch, and a page answered in its turn.

On test_service.py's harness: a QueueService fed requests and times, no sockets.
"""

from walqueue import WorkerView
from walqueue import protocol as p
from walqueue.cancel import CANCEL_WORKER
from walqueue.daemon.steering import MAX_WORKER_NAMES_PER_CONNECTION, WorkerNames

from . import test_service
from .frames import wal_records
from .test_service import FakePeer

harness = test_service.harness  # the fixture: a QueueService on a fresh Engine


def workers(harness, peer, request_id=90):
    ((_, answer),) = harness.turn(200, 1.0, (peer, p.Workers(id=request_id)))
    return [WorkerView(w.worker, w.leases, w.connected) for w in answer.workers]


def test_a_connection_that_used_a_name_is_listed_connected_until_it_closes(harness):
    one, two, admin = FakePeer("one"), FakePeer("two"), FakePeer("admin")
    harness.queue.put("t", {})
    harness.turn(100, 0.0, (one, p.Reserve(id=1, worker="alpha", lease_seconds=1000)),
                 (two, p.Reserve(id=2, worker="beta")))
    assert workers(harness, admin) == [WorkerView("alpha", 1, True), WorkerView("beta", 0, True)]
    harness.service.forget(two)  # the loop forgets a closed connection
    assert workers(harness, admin) == [WorkerView("alpha", 1, True)]
    harness.service.forget(one)  # its lease outlives it
    assert workers(harness, admin) == [WorkerView("alpha", 1, False)]


def test_a_refused_request_does_not_count_as_using_a_name(harness):
    peer = FakePeer("p")
    harness.turn(100, 0.0, (peer, p.Reserve(id=1, worker="w", lease_seconds=0)))  # InvalidRequest
    harness.turn(100, 0.0, (peer, p.Reserve(id=2, worker="walqueue:me")))  # a reserved name
    assert workers(harness, peer) == []


def test_a_connection_counts_only_its_most_recent_names():
    names, peer = WorkerNames(), FakePeer("p")
    for number in range(MAX_WORKER_NAMES_PER_CONNECTION + 10):
        names.note(peer, f"w{number}")
    names.note(peer, "w10")  # used again: the most recent
    names.note(peer, "new")
    assert len(names.connected()) == MAX_WORKER_NAMES_PER_CONNECTION
    assert {"w10", "new"} <= names.connected() and "w11" not in names.connected()
    names.forget(peer)
    assert names.connected() == set()


def test_a_cancel_is_answered_done_and_written_in_the_turns_batch(harness, tmp_path):
    peer = FakePeer("p")
    harness.queue.put("d", {}, max_attempts=1)
    harness.turn(100, 0.0, (peer, p.Reserve(id=1, worker="w", lease_seconds=10)))
    harness.turn(101, 0.0, (peer, p.Release(id=2, task_id="d", worker="w", generation=1)))
    answers = harness.turn(102, 0.0, (peer, p.Cancel(id=3, task_id="d")), (peer, p.Cancel(id=4, task_id="d")),
                           (peer, p.Cancel(id=5, task_id="nope")))
    assert [type(answer).__name__ for _, answer in answers] == ["Done", "Done", "Error"]
    assert answers[2][1].error == "InvalidRequest" and "unknown" in answers[2][1].message
    ops = [(record["op"], record.get("worker")) for record in wal_records(tmp_path / "queue")]
    assert ops[-3:] == [("revive", None), ("reserve", CANCEL_WORKER), ("ack", CANCEL_WORKER)]
    assert harness.queue.get("d").status == "completed"


def test_a_page_is_answered_in_its_turn_with_at_most_its_limit(harness):
    peer = FakePeer("p")
    harness.queue.put_many([{"task_id": f"t{i:03d}", "payload": {}} for i in range(30)])
    ((_, answer),) = harness.turn(100, 0.0, (peer, p.TasksPage(id=1, status="ready", after="t009", limit=5)))
    assert isinstance(answer, p.TaskList) and not answer.more
    assert [task.task_id for task in answer.tasks] == ["t010", "t011", "t012", "t013", "t014"]
    ((_, refused),) = harness.turn(100, 0.0, (peer, p.TasksPage(id=2, limit=10_001)))
    assert refused.error == "InvalidRequest" and "limit" in refused.message


def test_each_connection_is_shown_with_its_names_leases_requests_and_last_requests_age(harness):
    one, two, admin = FakePeer("one"), FakePeer("two"), FakePeer("admin")
    harness.queue.put("a", {})
    harness.queue.put("b", {})
    harness.turn(100, 10.0, (one, p.Reserve(id=1, worker="alpha", lease_seconds=1000, limit=2)),
                 (one, p.Touch(id=2, task_id="zz", worker="beta", generation=1, lease_seconds=5)),
                 (two, p.Get(id=3, task_id="a")))
    harness.turn(101, 12.0, (one, p.Get(id=4, task_id="a")))
    ((_, answer),) = harness.turn(104, 15.5, (admin, p.Connections(id=5)))
    shown = {view.connection: view for view in answer.connections}
    assert [view.connection for view in answer.connections] == ["one", "two", "admin"]   # first request's order
    # A touch that failed (unknown task) did not make "beta" one's name; alpha's two leases count.
    assert shown["one"] == p.WireConnection("one", ("alpha",), 2, 3, 3.5)
    assert shown["two"] == p.WireConnection("two", (), 0, 1, 5.5)
    assert shown["admin"].requests == 1 and shown["admin"].last_request_age_seconds == 0.0
    harness.service.forget(two)
    ((_, answer),) = harness.turn(105, 16.0, (admin, p.Connections(id=6)))
    assert [view.connection for view in answer.connections] == ["one", "admin"]
