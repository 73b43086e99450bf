"""SPEC §8b's cancel, workers and listing in pages, one rule a test, on every face.

The faces are test_semantics.py's (tests/backends/faces.py): the library Queue, the memory
backend, the daemon's sync and asyncio clients, PostgreSQL's sync and asyncio clients, each on
a fresh queue, times given as ``now`` and set on each backend's clock. "Writes nothing" is
``q.written()`` unchanged. Where the faces differ by design, the test says so: only the
daemon has connections, so only its workers are ``connected``; only the library and the daemon
write a WAL, where cancel's records can be read.
"""

import pytest

from tests.backends.faces import DAEMON_FACES, FACES, open_face
from walqueue import InvalidRequest, KeyConflict, TaskView, WorkerView
from walqueue.cancel import CANCEL_WORKER
from walqueue.listing import MAX_PAGE_TASKS


@pytest.fixture(params=FACES)
def q(request, tmp_path):
    with open_face(request.param, request, tmp_path) as face:
        yield face


def lease_one(q, worker="w", now=1, lease_seconds=100):
    (lease,) = q.reserve(worker, now=now, lease_seconds=lease_seconds, limit=1)
    return lease


def make_dead(q, task_id, now=1):
    q.put(task_id, {"dead": True}, max_attempts=1)
    lease = lease_one(q, now=now)
    assert lease.task_id == task_id
    q.release(lease, now=now + 1)
    assert q.get(task_id).status == "dead"


# -- cancel ---------------------------------------------------------------------------


def test_cancel_completes_a_due_ready_task_without_leasing_it_to_a_worker(q):
    q.put("t", {"a": 1}, available_at=3, max_attempts=2)
    assert q.cancel("t", now=5) is None
    assert q.get("t") == TaskView("t", "t", "completed", 1, 2, 1, 3, None, None, None)
    assert q.stats().completed == 1 and q.stats().ready == 0
    assert q.reserve("w", now=6, lease_seconds=10) == []
    assert all(view.leases == 0 and view.worker != CANCEL_WORKER for view in q.workers())


def test_a_cancelled_tasks_key_stays_taken(q):
    q.put("t", {"a": 1}, key="k")
    q.cancel("t", now=1)
    before = q.written()
    assert q.put("t", {"a": 1}, key="k") == "t"  # the identical put: its id, nothing written
    assert q.written() == before
    with pytest.raises(KeyConflict):
        q.put("other", {"a": 2}, key="k")
    with pytest.raises(KeyConflict):
        q.put("t", {"a": 2}, key="k2")


def test_cancel_completes_a_dead_task(q):
    make_dead(q, "d", now=1)
    q.cancel("d", now=7)
    # Revived (attempts 0, available now), reserved (attempts 1, generation 2) and acked.
    assert q.get("d") == TaskView("d", "d", "completed", 1, 1, 2, 7, None, None, None)
    assert q.stats().dead == 0


def test_cancelling_a_completed_task_does_nothing(q):
    q.put("t", {})
    q.cancel("t", now=1)
    before = q.written()
    q.cancel("t", now=2)
    assert q.written() == before
    lease = (q.put("u", {}), lease_one(q, now=3))[1]
    q.ack(lease, now=4)
    before = q.written()
    q.cancel("u", now=5)
    assert q.written() == before
    assert q.get("u").status == "completed"


def test_cancel_of_a_task_not_yet_due_is_refused_saying_when_it_becomes_cancellable(q):
    q.put("later", {}, available_at=100)
    before = q.written()
    with pytest.raises(InvalidRequest, match=r"'later' is ready but not due until 100 .*cancelled from then on"):
        q.cancel("later", now=5)
    assert q.written() == before
    q.cancel("later", now=100)
    assert q.get("later").status == "completed"


def test_cancel_of_a_leased_task_is_refused_naming_the_lease_that_holds_it(q):
    q.put("t", {})
    lease = lease_one(q, worker="busy", now=1, lease_seconds=50)
    before = q.written()
    with pytest.raises(InvalidRequest, match=r"'t' is leased by 'busy' \(generation 1, deadline 51\)"):
        q.cancel("t", now=2)
    assert q.written() == before
    q.ack(lease, now=3)  # the lease is untouched: its holder completes it


def test_cancel_of_an_unknown_task_is_refused(q):
    before = q.written()
    with pytest.raises(InvalidRequest, match=r"'nope' is unknown"):
        q.cancel("nope", now=1)
    assert q.written() == before


def test_cancel_checks_its_argument(q):
    with pytest.raises(InvalidRequest):
        q.cancel(7, now=1)


@pytest.mark.parametrize("worker", [CANCEL_WORKER, "walqueue:", "walqueue:anything"])
def test_a_reserve_by_a_reserved_worker_name_is_refused_and_writes_nothing(q, worker):
    q.put("t", {})
    before = q.written()
    with pytest.raises(InvalidRequest, match="reserved"):
        q.reserve(worker, now=1, lease_seconds=10)
    assert q.written() == before
    assert q.get("t").status == "ready"
    assert [lease.task_id for lease in q.reserve("walqueue", now=1, lease_seconds=10)] == ["t"]


def test_cancel_is_written_as_revive_reserve_and_ack_by_the_reserved_worker(q):
    if not q.has_wal:
        pytest.skip("SPEC §9: no WAL on PostgreSQL, nor in the memory backend")
    make_dead(q, "d", now=1)
    q.put("r", {})
    count = len(q.wal_records())
    q.cancel("d", now=5)
    q.cancel("r", now=5)
    records = q.wal_records()[count:]
    assert [(record["op"], record.get("worker")) for record in records] == [
        ("revive", None), ("reserve", CANCEL_WORKER), ("ack", CANCEL_WORKER),
        ("reserve", CANCEL_WORKER), ("ack", CANCEL_WORKER)]
    assert [record.get("task_ids", [record.get("task_id")]) for record in records] == [
        ["d"], ["d"], ["d"], ["r"], ["r"]]


# -- workers ---------------------------------------------------------------------------


def test_workers_lists_every_lease_holder_by_name_with_its_leases(q):
    q.put_many([{"task_id": f"t{i}", "payload": {}} for i in range(4)])
    q.reserve("zed", now=1, lease_seconds=100, limit=2)
    (lease,) = q.reserve("amy", now=1, lease_seconds=100, limit=1)
    connected = q.name in DAEMON_FACES  # only the daemon sees connections (SPEC §8b)
    assert q.workers() == [WorkerView("amy", 1, connected), WorkerView("zed", 2, connected)]
    q.ack(lease, now=2)
    expected = [WorkerView("zed", 2, connected)]
    if connected:  # amy's connection is still open: it is listed, holding nothing
        expected.insert(0, WorkerView("amy", 0, True))
    assert q.workers() == expected


def test_a_worker_whose_lease_ended_holds_it_no_more(q):
    q.put("t", {})
    lease_one(q, worker="w", now=1, lease_seconds=5)
    q.advance_to(10)
    q.reserve("other", now=10, lease_seconds=100)  # reaps first (SPEC §2), and leases t again
    holders = {view.worker: view.leases for view in q.workers()}
    assert holders.get("w", 0) == 0 and holders["other"] == 1


# -- listing in pages ----------------------------------------------------------------------


def fill(q):
    """Tasks in every status, put out of id order: ready, leased, dead, completed."""
    ids = [f"t{i:02d}" for i in (7, 3, 11, 0, 5, 9, 1, 10, 2, 8, 4, 6)]
    q.put_many([{"task_id": task_id, "payload": {"n": task_id}, "max_attempts": 1} for task_id in ids])
    leases = q.reserve("w", now=1, lease_seconds=100, limit=6)  # t00..t05
    for lease in leases[:2]:
        q.ack(lease, now=2)        # t00, t01 completed
    for lease in leases[2:4]:
        q.release(lease, now=2)    # t02, t03 dead; t04, t05 stay leased
    q.cancel("t09", now=3)         # completed among the ready ones
    return sorted(ids)


@pytest.mark.parametrize("status", [None, "ready", "leased", "dead", "completed"])
def test_pages_are_the_listing_in_task_id_order_cut_at_the_cursor(q, status):
    fill(q)
    everything = list(q.tasks(status))
    for after in (None, "", "t00", "t035", "t05", "t09", "t11", "u"):
        expected = [view for view in everything if after is None or view.task_id > after]
        assert list(q.tasks(status, after=after)) == expected
        for limit in (1, 2, 5, MAX_PAGE_TASKS):
            assert list(q.tasks(status, after=after, limit=limit)) == expected[:limit]


def test_paging_on_with_the_last_id_visits_every_task_once(q):
    ids = fill(q)
    seen, after = [], None
    while page := list(q.tasks(after=after, limit=5)):
        seen += [view.task_id for view in page]
        after = page[-1].task_id
    assert seen == ids


def test_a_page_shows_each_task_as_get_does(q):
    fill(q)
    for view in q.tasks(after="t03", limit=4):
        assert view == q.get(view.task_id)


@pytest.mark.parametrize("page", [{"limit": 0}, {"limit": MAX_PAGE_TASKS + 1}, {"limit": True},
                                  {"limit": "5"}, {"after": 5}])
def test_a_bad_page_is_invalid_request(q, page):
    with pytest.raises(InvalidRequest):
        list(q.tasks(None, **page))
