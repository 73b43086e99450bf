"""SPEC §2, one rule a test: put and identity, put_many, reserve (reap and
lease), ack/release/touch and StaleLease, revive, payload copies,
tombstones, stats, explicit time, generations, and batch() (§6).

The conformance suite of issue 21: every test that takes ``q`` runs on every
face of tests/backends/faces.py — the library Queue, the memory backend, the
daemon's sync and asyncio clients, and PostgreSQL's — with the same body,
times given as ``now`` and set on each backend's clock. "Writes nothing" is
``q.written()`` unchanged. Where a backend legitimately differs, the test says
so: DIFFERENCES skips a face with its reason (each citing SPEC), or the test
asserts the backend's documented variant (a service reaps on its own; no WAL
on PostgreSQL). The tests that take ``library`` are about the library's own
disk, phases, batches, hooks, compaction and reopening, and run on it alone.
"""

import pytest

from tests.backends.faces import DAEMON_FACES, FACES, open_face
from walqueue import (
    CorruptStore,
    InjectedCrash,
    InvalidRequest,
    KeyConflict,
    Lease,
    PutRequest,
    Queue,
    QueueClosed,
    QueueLocked,
    QueueStats,
    StaleLease,
    TaskView,
    WalQueueError,
)

from .frames import read_dir, wal_bytes_on_disk, wal_records

NOW_NEVER_GOES_BACK = ("SPEC §8: the daemon's now never goes backwards (now = max(clock, "
                       "last_now)), so a test that moves now back cannot be run on it")
# Tests that do not run on some faces, by name: (faces, why). Every other test that takes
# `q` runs on all of FACES.
DIFFERENCES = {
    "test_now_may_go_backwards_and_the_rules_still_decide": (DAEMON_FACES, NOW_NEVER_GOES_BACK),
    "test_a_reaped_task_is_not_due_before_its_old_deadline_even_if_now_goes_back":
        (DAEMON_FACES, NOW_NEVER_GOES_BACK),
    "test_a_reap_uses_the_now_of_that_reserve": (DAEMON_FACES, NOW_NEVER_GOES_BACK),
    "test_a_lease_lost_to_expiry_and_re_lease_is_stale_even_before_its_old_deadline_by_clock":
        (DAEMON_FACES, NOW_NEVER_GOES_BACK),
}


@pytest.fixture
def directory(tmp_path):
    return tmp_path / "queue"


@pytest.fixture
def phases():
    return []


@pytest.fixture
def library(directory, phases):
    """The library's Queue, for the tests about its disk, phases and batches."""
    queue = Queue(directory, hook=phases.append)
    yield queue
    queue.close()


@pytest.fixture(params=FACES)
def q(request, tmp_path):
    """Each face in turn on a fresh queue: the library and every client (tests/backends/faces.py)."""
    faces, reason = DIFFERENCES.get(request.node.originalname, ((), ""))
    if request.param in faces:
        pytest.skip(reason)
    with open_face(request.param, request, tmp_path) as face:
        yield face


def reopen(q, directory, hook=None):
    q.close()
    return Queue(directory, hook=hook)


def ops(directory):
    return [record["op"] for record in wal_records(directory)]


def lease_one(q, worker="w", now=0, lease_seconds=10):
    (lease,) = q.reserve(worker, now=now, lease_seconds=lease_seconds, limit=1)
    return lease


# -- put ----------------------------------------------------------------------


def test_a_put_creates_a_ready_task_with_zero_attempts_and_generation_zero(q):
    assert q.put("t1", {"a": 1}, available_at=5, max_attempts=4) == "t1"
    assert q.get("t1") == TaskView(
        task_id="t1",
        key="t1",
        status="ready",
        attempts=0,
        max_attempts=4,
        generation=0,
        available_at=5,
        deadline=None,
        worker=None,
        payload={"a": 1},
    )


def test_the_key_defaults_to_the_task_id(q):
    q.put("t1", {})
    assert q.get("t1").key == "t1"
    with pytest.raises(KeyConflict):
        q.put("t2", {}, key="t1")


def test_an_explicit_key_equal_to_the_task_id_is_the_same_request_as_no_key(q):
    q.put("t1", {"a": 1})
    before = q.written()
    assert q.put("t1", {"a": 1}, key="t1") == "t1"
    assert q.written() == before


def test_get_of_an_unknown_task_returns_none(q):
    assert q.get("nope") is None


def test_an_identical_put_returns_the_id_and_writes_nothing(q):
    q.put("t1", {"a": [1, 2]}, key="k1", available_at=3, max_attempts=2)
    before = q.written()  # on the library: its files, and the phases its hook saw
    assert q.put("t1", {"a": [1, 2]}, key="k1", available_at=3, max_attempts=2) == "t1"
    assert q.written() == before


def test_an_identical_put_after_ack_returns_the_id_and_does_not_resurrect(q):
    q.put("t1", {"a": 1})
    q.ack(lease_one(q), now=1)
    before = q.written()
    assert q.put("t1", {"a": 1}) == "t1"
    assert q.get("t1").status == "completed"
    assert q.written() == before
    assert q.reserve("w", now=100, lease_seconds=10) == []


def test_an_identical_put_of_a_dead_task_returns_the_id_and_does_not_revive(q):
    q.put("t1", {"a": 1}, max_attempts=1)
    lease = lease_one(q)
    q.release(lease, now=1)
    assert q.get("t1").status == "dead"
    before = q.written()
    assert q.put("t1", {"a": 1}, max_attempts=1) == "t1"
    assert q.get("t1").status == "dead"
    assert q.written() == before


def test_an_identical_put_of_a_leased_task_changes_nothing(q):
    q.put("t1", {"a": 1})
    lease = lease_one(q)
    view = q.get("t1")
    before = q.written()
    assert q.put("t1", {"a": 1}) == "t1"
    assert q.get("t1") == view
    assert q.written() == before
    q.ack(lease, now=1)


def test_identity_uses_the_original_available_at_after_a_release_moved_it(q):
    q.put("t1", {"a": 1}, available_at=5)
    q.release(lease_one(q, now=5), now=6, delay=10)
    assert q.get("t1").available_at == 16
    before = q.written()
    assert q.put("t1", {"a": 1}, available_at=5) == "t1"
    assert q.written() == before
    with pytest.raises(KeyConflict):
        q.put("t1", {"a": 1}, available_at=16)
    assert q.written() == before


def test_identity_uses_the_original_available_at_after_an_expiry_moved_it(q):
    q.put("t1", {"a": 1}, available_at=2)
    lease_one(q, now=2, lease_seconds=5)
    q.reserve("other", now=100, lease_seconds=1, limit=1)  # reaps, then re-leases
    assert q.put("t1", {"a": 1}, available_at=2) == "t1"


def test_identity_uses_the_original_available_at_after_a_revive_moved_it(q):
    q.put("t1", {"a": 1}, available_at=2, max_attempts=1)
    q.release(lease_one(q, now=2), now=3)
    q.revive(["t1"], now=50)
    assert q.get("t1").available_at == 50
    assert q.put("t1", {"a": 1}, available_at=2, max_attempts=1) == "t1"


@pytest.mark.parametrize(
    "change",
    [
        pytest.param({"payload": {"a": 2}}, id="payload"),
        pytest.param({"payload": {"a": 1.0}}, id="payload-int-vs-float"),
        pytest.param({"payload": {"a": 1, "b": None}}, id="payload-extra-key"),
        pytest.param({"available_at": 1}, id="available_at"),
        pytest.param({"max_attempts": 4}, id="max_attempts"),
    ],
)
def test_a_known_key_with_a_different_identity_is_a_key_conflict(q, change):
    q.put("t1", {"a": 1}, key="k1")
    before = q.written()
    request = {"payload": {"a": 1}, "available_at": 0, "max_attempts": 3} | change
    with pytest.raises(KeyConflict) as caught:
        q.put(
            "t1",
            request["payload"],
            key="k1",
            available_at=request["available_at"],
            max_attempts=request["max_attempts"],
        )
    assert "k1" in str(caught.value)
    assert q.written() == before
    assert q.get("t1").payload == {"a": 1}


def test_a_known_key_with_another_task_id_is_a_key_conflict(q):
    q.put("t1", {"a": 1}, key="k1")
    before = q.written()
    with pytest.raises(KeyConflict) as caught:
        q.put("t2", {"a": 1}, key="k1")
    assert "k1" in str(caught.value)
    assert q.get("t2") is None
    assert q.written() == before


def test_a_new_key_for_a_used_task_id_is_a_key_conflict(q):
    q.put("t1", {"a": 1}, key="k1")
    before = q.written()
    with pytest.raises(KeyConflict) as caught:
        q.put("t1", {"a": 1}, key="k2")
    assert "t1" in str(caught.value)
    with pytest.raises(KeyConflict):
        q.put("t1", {"a": 1})  # the default key "t1" is new too
    assert q.written() == before


def test_a_task_id_equal_to_another_tasks_key_meets_that_key(q):
    q.put("t1", {}, key="shared")
    with pytest.raises(KeyConflict):
        q.put("shared", {})


def test_keys_and_ids_are_never_reused_even_after_completion_and_compaction(library, directory):
    q = library
    q.put("t1", {"a": 1}, key="k1")
    q.ack(lease_one(q), now=1)
    q.compact()
    q = reopen(q, directory)
    try:
        assert q.put("t1", {"a": 1}, key="k1") == "t1"
        assert q.get("t1").status == "completed"
        with pytest.raises(KeyConflict):
            q.put("t1", {"a": 2}, key="k1")
        with pytest.raises(KeyConflict):
            q.put("t1", {"a": 1}, key="k2")
        with pytest.raises(KeyConflict):
            q.put("t9", {"a": 1}, key="k1")
    finally:
        q.close()


def test_keys_and_ids_are_never_reused_after_completion_or_death(q):
    q.put("t1", {"a": 1}, key="k1")
    q.ack(lease_one(q), now=1)
    make_dead(q, "d1", now=1)
    before = q.written()
    for task_id, payload, key in (("t1", {"a": 2}, "k1"), ("t1", {"a": 1}, "k2"), ("t9", {"a": 1}, "k1"),
                                  ("d1", {"id": "d1"}, "k3"), ("d9", {"id": "d1"}, "d1")):
        with pytest.raises(KeyConflict):
            q.put(task_id, payload, key=key)
    assert q.written() == before
    assert [(view.task_id, view.status) for view in q.tasks()] == [("d1", "dead"), ("t1", "completed")]


def test_a_payload_given_with_tuples_is_the_same_identity_as_with_lists(q):
    q.put("t1", {"a": (1, (2, 3))})
    before = q.written()
    assert q.put("t1", {"a": [1, [2, 3]]}) == "t1"
    assert q.written() == before


def test_key_conflict_is_a_walqueue_error_and_leaves_the_queue_open(q):
    q.put("t1", {})
    with pytest.raises(WalQueueError):
        q.put("t1", {"x": 1})
    assert q.put("t2", {}) == "t2"


# -- put_many -----------------------------------------------------------------


def test_put_many_returns_one_id_per_request_in_request_order(q):
    ids = q.put_many([PutRequest("b", {}), {"task_id": "a", "payload": {}}, PutRequest("c", {})])
    assert ids == ["b", "a", "c"]
    if q.has_wal:  # and its frame holds them in that order (no WAL on PostgreSQL: SPEC §9)
        assert [task["task_id"] for task in q.wal_records()[-1]["tasks"]] == ["b", "a", "c"]


def test_put_many_writes_all_new_tasks_in_one_frame(library, directory, phases):
    q = library
    q.put_many([PutRequest(f"t{n}", {"n": n}) for n in range(5)])
    assert ops(directory) == ["put"]
    assert len(wal_records(directory)[0]["tasks"]) == 5
    assert phases.count("wal.after_sync") == 1


def test_put_many_accepts_mappings_with_the_put_request_field_names(q):
    q.put_many(
        [{"task_id": "t1", "payload": {"a": 1}, "key": "k", "available_at": 4, "max_attempts": 2}]
    )
    view = q.get("t1")
    assert (view.key, view.available_at, view.max_attempts) == ("k", 4, 2)


def test_put_many_is_all_or_nothing_when_one_request_conflicts_with_the_store(q):
    q.put("old", {"a": 1})
    before = q.written()
    with pytest.raises(KeyConflict) as caught:
        q.put_many([PutRequest("new-1", {}), PutRequest("old", {"a": 2}), PutRequest("new-2", {})])
    assert "old" in str(caught.value)
    assert q.get("new-1") is None and q.get("new-2") is None
    assert q.written() == before


@pytest.mark.parametrize(
    "requests",
    [
        pytest.param(
            [PutRequest("t1", {"a": 1}), PutRequest("t1", {"a": 2})], id="same-id-payload"
        ),
        pytest.param(
            [PutRequest("t1", {}, key="k"), PutRequest("t2", {}, key="k")], id="same-key-other-id"
        ),
        pytest.param(
            [PutRequest("t1", {}, key="k1"), PutRequest("t1", {}, key="k2")], id="same-id-other-key"
        ),
        pytest.param([PutRequest("t1", {}, key="t2"), PutRequest("t2", {})], id="id-meets-key"),
        pytest.param(
            [PutRequest("t1", {}), PutRequest("t1", {}, max_attempts=2)], id="max-attempts"
        ),
    ],
)
def test_put_many_rejects_a_conflict_within_the_list_and_writes_nothing(q, requests):
    before = q.written()
    with pytest.raises(KeyConflict):
        q.put_many([PutRequest("innocent", {}), *requests])
    assert q.get("innocent") is None
    assert q.written() == before


def test_put_many_collapses_identical_duplicates_into_one_task(q):
    ids = q.put_many(
        [
            PutRequest("t1", {"a": (1,)}),
            PutRequest("t2", {}),
            {"task_id": "t1", "payload": {"a": [1]}},
        ]
    )
    assert ids == ["t1", "t2", "t1"]
    if q.has_wal:
        assert [task["task_id"] for task in q.wal_records()[0]["tasks"]] == ["t1", "t2"]
    assert q.stats().ready == 2


def test_put_many_skips_identical_retries_and_writes_only_the_new_tasks(q):
    q.put("old", {"a": 1}, key="k-old")
    ids = q.put_many([PutRequest("new", {}), PutRequest("old", {"a": 1}, key="k-old")])
    assert ids == ["new", "old"]
    assert q.get("old").status == "ready" and q.stats().ready == 2
    if q.has_wal:
        assert [record["op"] for record in q.wal_records()] == ["put", "put"]
        assert [task["task_id"] for task in q.wal_records()[1]["tasks"]] == ["new"]


def test_put_many_writes_no_frame_when_nothing_is_new(q):
    q.put_many([PutRequest("t1", {}), PutRequest("t2", {})])
    before = q.written()
    assert q.put_many([PutRequest("t2", {}), PutRequest("t1", {}), PutRequest("t2", {})]) == [
        "t2",
        "t1",
        "t2",
    ]
    assert q.written() == before


# -- reserve ------------------------------------------------------------------


def test_reserve_leases_in_available_at_then_task_id_order_comparing_ids_as_str(q):
    for task_id in ["b", "a", "B", "10", "9", "é", "z"]:
        q.put(task_id, {})
    q.put("early", {}, available_at=0)
    q.put("0-late", {}, available_at=1)
    leases = q.reserve("w", now=1, lease_seconds=10, limit=1000)
    assert [lease.task_id for lease in leases] == [
        "10",
        "9",
        "B",
        "a",
        "b",
        "early",
        "z",
        "é",
        "0-late",
    ]


def test_reserve_leases_only_tasks_that_are_due(q):
    q.put("now", {}, available_at=10)
    q.put("later", {}, available_at=11)
    assert q.reserve("w", now=9, lease_seconds=10) == []
    assert [lease.task_id for lease in q.reserve("w", now=10, lease_seconds=10, limit=5)] == ["now"]


def test_reserve_respects_its_limit(q):
    for n in range(5):
        q.put(f"t{n}", {})
    assert [lease.task_id for lease in q.reserve("w", now=0, lease_seconds=1, limit=2)] == [
        "t0",
        "t1",
    ]
    assert [lease.task_id for lease in q.reserve("w", now=0, lease_seconds=1, limit=2)] == [
        "t2",
        "t3",
    ]


def test_a_reserve_sets_leased_attempts_generation_worker_and_deadline(q):
    q.put("t1", {"a": 1}, available_at=3, max_attempts=5)
    (lease,) = q.reserve("w1", now=7, lease_seconds=30)
    assert lease == Lease(
        task_id="t1", worker="w1", generation=1, deadline=37, attempts=1, payload={"a": 1}
    )
    view = q.get("t1")
    assert (view.status, view.attempts, view.generation, view.worker, view.deadline) == (
        "leased",
        1,
        1,
        "w1",
        37,
    )
    assert view.available_at == 3


def test_a_reserve_that_leases_nothing_writes_nothing(q):
    q.put("t1", {}, available_at=100)
    before = q.written()
    assert q.reserve("w", now=0, lease_seconds=10) == []
    assert q.written() == before


def test_reaping_a_lease_sets_available_at_to_its_old_deadline(q):
    q.put("t1", {})
    lease_one(q, now=0, lease_seconds=10)
    q.put("blocker", {}, available_at=0)
    (other,) = q.reserve("w2", now=12, lease_seconds=5, limit=1)
    assert other.task_id == "blocker"
    view = q.get("t1")
    assert (view.status, view.available_at, view.worker, view.deadline) == ("ready", 10, None, None)
    assert view.attempts == 1 and view.generation == 1


def test_a_lease_expires_when_now_equals_its_deadline(q):
    q.put("t1", {})
    lease_one(q, now=0, lease_seconds=10)
    assert q.reserve("w2", now=9, lease_seconds=10) == []
    (again,) = q.reserve("w2", now=10, lease_seconds=10)
    assert (again.task_id, again.generation, again.attempts, again.worker) == ("t1", 2, 2, "w2")


def test_a_reap_at_max_attempts_makes_the_task_dead_and_keeps_its_payload(q):
    q.put("t1", {"keep": "me"}, max_attempts=2)
    lease_one(q, now=0, lease_seconds=1)
    lease_one(q, now=1, lease_seconds=1)
    assert q.reserve("w", now=2, lease_seconds=1) == []
    view = q.get("t1")
    assert (view.status, view.attempts, view.generation) == ("dead", 2, 2)
    assert (view.worker, view.deadline, view.available_at) == (None, None, 2)
    assert view.payload == {"keep": "me"}


def test_reap_frames_are_written_before_the_reserve_frame(library, directory):
    q = library
    q.put("t1", {})
    q.put("t2", {})
    lease_one(q, now=0, lease_seconds=5)
    q.reserve("w2", now=5, lease_seconds=5, limit=2)
    assert ops(directory) == ["put", "put", "reserve", "expire", "reserve"]
    expire, reserve = wal_records(directory)[-2:]
    assert expire["task_ids"] == ["t1"]
    assert reserve["task_ids"] == ["t2", "t1"]


def test_a_reap_is_written_even_when_nothing_is_then_leased(library, directory):
    q = library
    q.put("t1", {}, max_attempts=1)
    lease_one(q, now=0, lease_seconds=5)
    assert q.reserve("w2", now=5, lease_seconds=5) == []
    assert ops(directory) == ["put", "reserve", "expire"]


def test_no_expire_frame_is_written_when_nothing_expired(library, directory):
    q = library
    q.put("t1", {})
    q.put("t2", {})
    lease_one(q, now=0, lease_seconds=50)
    lease_one(q, now=1, lease_seconds=50)
    assert ops(directory) == ["put", "put", "reserve", "reserve"]


def test_expired_leases_are_reaped_in_old_deadline_then_task_id_order(library, directory):
    q = library
    for task_id in ["a", "b", "c", "d"]:
        q.put(task_id, {})
    q.reserve("w", now=0, lease_seconds=9, limit=1)  # a: deadline 9
    q.reserve("w", now=0, lease_seconds=3, limit=1)  # b: deadline 3
    q.reserve("w", now=0, lease_seconds=9, limit=1)  # c: deadline 9
    q.reserve("w", now=1, lease_seconds=2, limit=1)  # d: deadline 3
    q.reserve("w", now=20, lease_seconds=1, limit=1)
    assert wal_records(directory)[-2]["task_ids"] == ["b", "d", "a", "c"]


def test_only_reserve_reaps_expired_leases(library, directory):
    q = library
    q.put("t1", {})
    q.put("t2", {})
    lease_one(q, now=0, lease_seconds=5)
    assert q.get("t1").status == "leased"
    q.put("t3", {})
    assert q.stats().leased == 1
    assert q.get("t1").status == "leased"
    assert "expire" not in ops(directory)


# -- ack / release / touch ----------------------------------------------------

LEASE_CALLS = {
    "ack": lambda q, lease, now: q.ack(lease, now=now),
    "release": lambda q, lease, now: q.release(lease, now=now),
    "touch": lambda q, lease, now: q.touch(lease, now=now, lease_seconds=5),
}


@pytest.fixture
def leased(q):
    """t1 leased to w1 at generation 1 with deadline 10."""
    q.put("t1", {"a": 1})
    return lease_one(q, worker="w1", now=0, lease_seconds=10)


def assert_stale(q, call, *, task_id, status, generation):
    before = q.written()
    view = q.get(task_id)
    with pytest.raises(StaleLease) as caught:
        call()
    error = caught.value
    assert isinstance(error, WalQueueError)
    assert (error.task_id, error.status, error.generation) == (task_id, status, generation)
    assert task_id in str(error)
    assert q.written() == before
    assert q.get(task_id) == view
    return error


@pytest.mark.parametrize("method", LEASE_CALLS)
def test_a_lease_presented_by_another_worker_is_stale(q, leased, method):
    forged = Lease("t1", "w2", leased.generation, leased.deadline, leased.attempts, {})
    assert_stale(
        q,
        lambda: LEASE_CALLS[method](q, forged, 1),
        task_id="t1",
        status="leased",
        generation=1,
    )


@pytest.mark.parametrize("method", LEASE_CALLS)
@pytest.mark.parametrize("generation", [0, 2, 99])
def test_a_lease_of_another_generation_is_stale(q, leased, method, generation):
    forged = Lease("t1", "w1", generation, leased.deadline, leased.attempts, {})
    assert_stale(
        q,
        lambda: LEASE_CALLS[method](q, forged, 1),
        task_id="t1",
        status="leased",
        generation=1,
    )


@pytest.mark.parametrize("method", LEASE_CALLS)
@pytest.mark.parametrize("now", [10, 11, 2**62])
def test_a_lease_is_stale_from_its_deadline_on(q, leased, method, now):
    q.advance_to(now)
    # A service ends the lease on its own once its deadline passed (SPEC §8a), so there the
    # task is ready again (at the same generation) when the lease comes; the library (and
    # PostgreSQL, whose reaper these faces leave off) reaps only in reserve (SPEC §2).
    assert_stale(
        q,
        lambda: LEASE_CALLS[method](q, leased, now),
        task_id="t1",
        status="ready" if q.reaps_on_its_own else "leased",
        generation=1,
    )


# What each call leaves at now=9 with the lease of `leased` (deadline 10).
CURRENT_AT_9 = {
    "ack": ("completed", None, None),
    "release": ("ready", None, None),
    "touch": ("leased", "w1", 14),
}


@pytest.mark.parametrize("method", LEASE_CALLS)
def test_a_lease_is_current_one_second_before_its_deadline(q, leased, method):
    last_seq = q.stats().last_seq
    LEASE_CALLS[method](q, leased, 9)
    view = q.get("t1")
    assert (view.status, view.worker, view.deadline) == CURRENT_AT_9[method]
    assert view.generation == leased.generation
    # One record; without a WAL of ours (PostgreSQL, the memory backend) last_seq is 0 (SPEC §9).
    assert q.stats().last_seq == (last_seq + 1 if q.has_wal else 0)


@pytest.mark.parametrize("method", LEASE_CALLS)
def test_a_lease_on_an_unknown_task_is_stale_with_status_and_generation_none(q, method):
    ghost = Lease("ghost", "w1", 1, 10, 1, {})
    assert_stale(
        q,
        lambda: LEASE_CALLS[method](q, ghost, 1),
        task_id="ghost",
        status=None,
        generation=None,
    )


@pytest.mark.parametrize("method", LEASE_CALLS)
def test_a_lease_on_a_task_completed_by_it_is_stale_and_says_completed(q, leased, method):
    q.ack(leased, now=1)
    assert_stale(
        q,
        lambda: LEASE_CALLS[method](q, leased, 2),
        task_id="t1",
        status="completed",
        generation=1,
    )


@pytest.mark.parametrize("method", LEASE_CALLS)
def test_a_lease_on_a_released_task_is_stale_and_says_ready(q, leased, method):
    q.release(leased, now=1, delay=100)
    assert_stale(
        q,
        lambda: LEASE_CALLS[method](q, leased, 2),
        task_id="t1",
        status="ready",
        generation=1,
    )


@pytest.mark.parametrize("method", LEASE_CALLS)
def test_a_lease_lost_to_expiry_and_re_lease_is_stale_even_before_its_old_deadline_by_clock(
    q, leased, method
):
    q.reserve("w2", now=10, lease_seconds=10)
    # `now` went backwards to before the old deadline: the generation decides.
    assert_stale(
        q,
        lambda: LEASE_CALLS[method](q, leased, 5),
        task_id="t1",
        status="leased",
        generation=2,
    )


def test_the_same_worker_reserving_again_gets_a_new_generation_and_the_old_lease_is_stale(
    q, leased
):
    again = lease_one(q, worker="w1", now=10, lease_seconds=10)
    assert again.generation == 2 and again.worker == "w1"
    assert_stale(
        q,
        lambda: q.ack(leased, now=11),
        task_id="t1",
        status="leased",
        generation=2,
    )
    q.ack(again, now=11)


def test_ack_completes_the_task_and_drops_its_payload(q, leased):
    q.ack(leased, now=3)
    view = q.get("t1")
    assert view == TaskView(
        task_id="t1",
        key="t1",
        status="completed",
        attempts=1,
        max_attempts=3,
        generation=1,
        available_at=0,
        deadline=None,
        worker=None,
        payload=None,
    )
    if q.has_wal:
        assert q.wal_records()[-1] == {
            "generation": 1,
            "now": 3,
            "op": "ack",
            "seq": 3,
            "task_id": "t1",
            "worker": "w1",
        }


def test_ack_leaves_available_at_unchanged(q):
    q.put("t1", {}, available_at=4)
    q.ack(lease_one(q, now=6), now=7)
    assert q.get("t1").available_at == 4


def test_the_lease_payload_is_informational(q, leased):
    forged = Lease("t1", "w1", 1, 10, 1, {"a": "forged"})
    q.release(forged, now=1)
    assert q.get("t1").payload == {"a": 1}


def test_release_makes_the_task_ready_at_now_plus_delay(q, leased):
    q.release(leased, now=4, delay=6)
    view = q.get("t1")
    assert (view.status, view.available_at, view.worker, view.deadline) == ("ready", 10, None, None)
    assert (view.attempts, view.generation) == (1, 1)
    assert q.reserve("w", now=9, lease_seconds=1) == []
    assert lease_one(q, now=10).generation == 2


def test_release_without_delay_makes_the_task_due_at_now(q, leased):
    q.release(leased, now=4)
    assert q.get("t1").available_at == 4
    assert lease_one(q, now=4).task_id == "t1"


def test_release_at_max_attempts_makes_the_task_dead(q):
    q.put("t1", {"a": 1}, max_attempts=1)
    q.release(lease_one(q, now=0), now=2, delay=3)
    view = q.get("t1")
    assert (view.status, view.available_at, view.attempts, view.payload) == ("dead", 5, 1, {"a": 1})
    assert (view.worker, view.deadline) == (None, None)


def test_touch_moves_the_deadline_and_keeps_the_generation(q, leased):
    touched = q.touch(leased, now=8, lease_seconds=20)
    assert touched == Lease("t1", "w1", 1, 28, 1, {"a": 1})
    assert q.get("t1").deadline == 28
    assert q.reserve("w2", now=27, lease_seconds=1) == []
    q.ack(leased, now=27)  # the old Lease object still names the current lease


def test_touch_may_shorten_a_lease(q, leased):
    touched = q.touch(leased, now=2, lease_seconds=1)
    assert touched.deadline == 3
    with pytest.raises(StaleLease):
        q.ack(touched, now=3)


def test_a_stale_call_appends_nothing_to_the_wal(q, leased):
    before = q.written()
    for call in LEASE_CALLS.values():
        with pytest.raises(StaleLease):
            call(q, Lease("t1", "w1", 7, 10, 1, {}), 1)
    assert q.written() == before


# -- revive -------------------------------------------------------------------


def make_dead(q, task_id, now=0):
    q.put(task_id, {"id": task_id}, max_attempts=1)
    (lease,) = [
        lease
        for lease in q.reserve("w", now=now, lease_seconds=1, limit=1000)
        if lease.task_id == task_id
    ]
    q.release(lease, now=now)
    assert q.get(task_id).status == "dead"


def test_revive_makes_dead_tasks_ready_with_zero_attempts_at_now(q):
    make_dead(q, "d1")
    assert q.revive(["d1"], now=42) == ["d1"]
    view = q.get("d1")
    assert (view.status, view.attempts, view.available_at, view.generation) == ("ready", 0, 42, 1)
    assert view.payload == {"id": "d1"}
    if q.has_wal:
        assert q.wal_records()[-1] == {"now": 42, "op": "revive", "seq": 4, "task_ids": ["d1"]}


def test_revive_never_resets_the_generation(q):
    make_dead(q, "d1")
    q.revive(["d1"], now=5)
    lease = lease_one(q, now=5)
    assert (lease.generation, lease.attempts) == (2, 1)


def test_revive_drops_duplicate_ids_and_keeps_first_seen_order(q):
    make_dead(q, "d2")
    make_dead(q, "d1")
    assert q.revive(["d1", "d2", "d1", "d2"], now=9) == ["d1", "d2"]
    assert [view.status for view in q.tasks()] == ["ready", "ready"]
    if q.has_wal:
        assert q.wal_records()[-1]["task_ids"] == ["d1", "d2"]


@pytest.mark.parametrize("other", ["ready", "leased", "completed", "unknown"])
def test_revive_of_a_task_that_is_not_dead_is_rejected_and_writes_nothing(q, other):
    make_dead(q, "dead")
    q.put("ready", {})
    q.put("leased", {}, available_at=0)
    q.put("completed", {})
    leases = {lease.task_id: lease for lease in q.reserve("w", now=0, lease_seconds=9, limit=1000)}
    q.release(leases["ready"], now=0)
    q.ack(leases["completed"], now=0)
    before = q.written()
    with pytest.raises(InvalidRequest) as caught:
        q.revive(["dead", other], now=1)
    assert other in str(caught.value)
    assert q.written() == before
    assert q.get("dead").status == "dead"


# -- payload copies -----------------------------------------------------------


def test_mutating_the_payload_given_to_put_does_not_change_the_task(q):
    payload = {"list": [1, {"x": 1}], "d": {"k": "v"}}
    q.put("t1", payload)
    payload["list"][1]["x"] = 2
    payload["d"]["k"] = "changed"
    payload["new"] = True
    assert q.get("t1").payload == {"list": [1, {"x": 1}], "d": {"k": "v"}}


def test_mutating_a_payload_given_to_put_many_does_not_change_the_task(q):
    payload = {"list": [1]}
    q.put_many([PutRequest("t1", payload), {"task_id": "t2", "payload": payload}])
    payload["list"].append(2)
    assert q.get("t1").payload == {"list": [1]}
    assert q.get("t2").payload == {"list": [1]}


def test_mutating_a_lease_payload_does_not_change_the_task(q):
    q.put("t1", {"list": [1], "d": {}})
    lease = lease_one(q)
    lease.payload["list"].append(2)
    lease.payload["d"]["x"] = 1
    assert q.get("t1").payload == {"list": [1], "d": {}}
    q.release(lease, now=1)
    assert lease_one(q, now=1).payload == {"list": [1], "d": {}}


def test_mutating_a_touched_lease_payload_does_not_change_the_task(q):
    q.put("t1", {"list": [1]})
    touched = q.touch(lease_one(q), now=1, lease_seconds=5)
    touched.payload["list"].append(2)
    assert q.get("t1").payload == {"list": [1]}


def test_mutating_a_task_view_payload_does_not_change_the_task(q):
    q.put("t1", {"list": [1]})
    q.get("t1").payload["list"].append(2)
    next(iter(q.tasks())).payload["list"].append(3)
    assert q.get("t1").payload == {"list": [1]}


def test_the_dataclasses_are_frozen(q):
    q.put("t1", {})
    view = q.get("t1")
    lease = lease_one(q)
    for value, field in [
        (view, "status"),
        (lease, "generation"),
        (q.stats(), "ready"),
        (PutRequest("x", {}), "task_id"),
    ]:
        with pytest.raises(AttributeError):
            setattr(value, field, None)


# -- tombstones, tasks(), stats ---------------------------------------------


def test_tasks_lists_every_task_in_task_id_order_and_filters_by_status(q):
    for task_id in ["c", "a", "B", "b"]:
        q.put(task_id, {})
    q.ack(lease_one(q), now=1)  # "B"
    assert [view.task_id for view in q.tasks()] == ["B", "a", "b", "c"]
    assert [view.task_id for view in q.tasks(status="ready")] == ["a", "b", "c"]
    assert [view.task_id for view in q.tasks(status="completed")] == ["B"]
    assert list(q.tasks(status="dead")) == []


def fill_every_status(q):
    """One dead, one completed, one leased and two ready tasks, in six writes."""
    make_dead(q, "dead")
    q.put_many([PutRequest(f"t{n}", {}) for n in range(4)])
    leases = q.reserve("w", now=0, lease_seconds=9, limit=2)
    q.ack(leases[0], now=1)


def test_stats_count_tasks_by_status_and_report_seq_and_wal_bytes(q):
    assert q.stats() == QueueStats(
        ready=0, leased=0, completed=0, dead=0, last_seq=0, snapshot_seq=0, wal_bytes=0
    )
    fill_every_status(q)
    assert q.stats() == QueueStats(
        ready=2,
        leased=1,
        completed=1,
        dead=1,
        # No WAL of ours on PostgreSQL (SPEC §9), nor in the memory backend: these are 0 there.
        last_seq=6 if q.has_wal else 0,
        snapshot_seq=0,
        wal_bytes=wal_bytes_on_disk(q.wal_directory) if q.has_wal else 0,
    )


def test_compaction_publishes_the_last_seq_and_the_wal_starts_again(library, directory):
    q = library
    fill_every_status(q)
    assert q.compact() == 6
    assert q.stats() == QueueStats(
        ready=2, leased=1, completed=1, dead=1, last_seq=6, snapshot_seq=6, wal_bytes=0
    )
    q.put("more", {})
    assert q.stats().last_seq == 7
    assert q.stats().wal_bytes == wal_bytes_on_disk(directory) > 0


# -- explicit time ------------------------------------------------------------


def test_now_may_go_backwards_and_the_rules_still_decide(q):
    q.put("t1", {})
    lease = lease_one(q, now=100, lease_seconds=10)  # deadline 110
    q.ack(lease, now=50)  # before the deadline, however odd
    assert q.get("t1").status == "completed"


def test_a_reaped_task_is_not_due_before_its_old_deadline_even_if_now_goes_back(q):
    q.put("t1", {})
    q.put("t2", {})
    lease_one(q, now=100, lease_seconds=10)  # t1, deadline 110
    (other,) = q.reserve("w", now=200, lease_seconds=10, limit=1)  # reaps t1
    assert other.task_id == "t2"
    assert q.get("t1").available_at == 110
    assert q.reserve("w", now=109, lease_seconds=10) == []
    assert lease_one(q, now=110).task_id == "t1"


def test_a_reap_uses_the_now_of_that_reserve(q):
    q.put("t1", {})
    lease_one(q, now=100, lease_seconds=10)
    assert q.reserve("w", now=5, lease_seconds=10) == []
    assert q.get("t1").status == "leased"


# -- generations across compaction and restart -------------------------------


def test_generations_survive_compaction_and_reopen(library, directory):
    q = library
    q.put("t1", {})
    q.release(lease_one(q, now=0), now=0)
    q.compact()
    q = reopen(q, directory)
    try:
        lease = lease_one(q, now=0)
        assert (lease.generation, lease.attempts) == (2, 2)
        q.release(lease, now=0)
    finally:
        q.close()
    with Queue(directory) as q:
        lease = lease_one(q, now=0)
        assert (lease.generation, lease.attempts) == (3, 3)


def test_a_lease_survives_a_restart_and_can_be_acked_after_it(library, directory):
    q = library
    q.put("t1", {"a": 1})
    leased = lease_one(q, worker="w1", now=0, lease_seconds=10)
    q.compact()
    q = reopen(q, directory)
    try:
        q.ack(leased, now=1)
        assert q.get("t1").status == "completed"
    finally:
        q.close()


def test_dead_and_completed_tombstones_survive_compaction_and_reopen(library, directory):
    q = library
    make_dead(q, "dead")
    q.put("done", {"a": 1})
    q.ack(lease_one(q), now=0)
    dead_view, done_view = q.get("dead"), q.get("done")
    q.compact()
    q = reopen(q, directory)
    try:
        assert q.get("dead") == dead_view
        assert q.get("done") == done_view
        assert q.revive(["dead"], now=3) == ["dead"]
        assert lease_one(q, now=3).generation == 2
    finally:
        q.close()


def test_compact_with_nothing_new_does_nothing_and_returns_the_last_snapshot_seq(library, directory):
    q = library
    assert q.compact() == 0
    q.put("t1", {})
    assert q.compact() == 1
    before = read_dir(directory)
    assert q.compact() == 1
    assert read_dir(directory) == before


# -- batch (group commit) -----------------------------------------------------


def test_each_writing_call_outside_a_batch_syncs_once_in_phase_order(library, phases):
    q = library
    q.put("t1", {})
    assert phases == ["wal.before_write", "wal.after_write", "wal.after_sync"]
    phases.clear()
    q.ack(lease_one(q), now=1)
    assert phases.count("wal.after_sync") == 2


def test_a_batch_syncs_once_when_it_exits(library, phases):
    q = library
    with q.batch():
        q.put("t1", {})
        q.put("t2", {})
        lease = lease_one(q)
        q.ack(lease, now=1)
        assert "wal.after_sync" not in phases
        assert phases.count("wal.after_write") == 4
    assert phases.count("wal.after_sync") == 1
    assert phases[-1] == "wal.after_sync"


def test_operations_in_a_batch_update_memory_immediately(library):
    q = library
    with q.batch():
        q.put("t1", {})
        assert q.get("t1").status == "ready"
        assert lease_one(q).task_id == "t1"


def test_a_nested_batch_joins_the_outer_one(library, phases):
    q = library
    with q.batch():
        q.put("t1", {})
        with q.batch():
            q.put("t2", {})
        assert "wal.after_sync" not in phases
        q.put("t3", {})
    assert phases.count("wal.after_sync") == 1


def test_an_exception_inside_a_batch_still_syncs_and_propagates(library, directory, phases):
    q = library
    class Boom(Exception):
        pass

    with pytest.raises(Boom):
        with q.batch():
            q.put("t1", {})
            raise Boom
    assert phases.count("wal.after_sync") == 1
    assert q.put("t2", {}) == "t2"
    q = reopen(q, directory)
    try:
        assert q.get("t1") is not None
    finally:
        q.close()


def test_a_rejected_call_inside_a_batch_does_not_spoil_the_batch(library, phases):
    q = library
    with q.batch():
        q.put("t1", {"a": 1})
        with pytest.raises(KeyConflict):
            q.put("t1", {"a": 2})
        q.put("t2", {})
    assert phases.count("wal.after_sync") == 1
    assert q.stats().ready == 2


def test_compact_inside_a_batch_first_syncs_the_batch(library, phases):
    q = library
    with q.batch():
        q.put("t1", {})
        q.compact()
        assert "wal.after_sync" in phases
        assert phases.index("wal.after_sync") < phases.index("wal.after_rotate")
    assert q.stats().snapshot_seq == 1


def test_compact_calls_its_phases_in_order(library, phases):
    q = library
    q.put("t1", {})
    phases.clear()
    assert q.compact() == 1
    assert phases == [
        "wal.after_rotate",
        "snapshot.after_write",
        "current.after_write",
        "current.after_publish",
        "compact.after_delete",
    ]


# -- hooks, self-closing, the error tree (SPEC §1, §3, §6) ---------------------

SPEC_PHASES = {
    "wal.before_write",
    "wal.after_write",
    "wal.after_sync",
    "wal.after_rotate",
    "snapshot.after_write",
    "current.after_write",
    "current.after_publish",
    "compact.after_delete",
    "recover.after_truncate",
}


def test_the_hook_is_called_with_the_spec_phase_names_and_no_others(library, directory, phases):
    q = library
    q.put("t1", {})
    q.put_many([PutRequest("t2", {}), PutRequest("t3", {}, max_attempts=1)])
    with q.batch():
        leases = q.reserve("w", now=0, lease_seconds=5, limit=3)
        q.touch(leases[0], now=1, lease_seconds=5)
    q.ack(leases[0], now=2)
    q.release(leases[1], now=2)
    q.reserve("w", now=10, lease_seconds=5)
    q.revive(["t3"], now=11)
    q.compact()
    q.put("t4", {})
    q.close()
    with (directory / sorted(directory.glob("wal-*.log"))[-1].name).open("ab") as segment:
        segment.write(b"\x00\x00\x01")
    with Queue(directory, hook=phases.append):
        pass
    assert set(phases) == SPEC_PHASES


class Crash(BaseException):
    pass


def crash_at(phase):
    def hook(seen):
        if seen == phase:
            raise Crash(seen)

    return hook


@pytest.mark.parametrize("phase", ["wal.before_write", "wal.after_write", "wal.after_sync"])
def test_a_hook_that_raises_closes_the_queue_and_releases_the_lock(directory, phase):
    q = Queue(directory, hook=crash_at(phase))
    with pytest.raises(Crash):
        q.put("t1", {})
    with pytest.raises(QueueClosed):
        q.stats()
    with pytest.raises(QueueClosed):
        q.put("t2", {})
    q.close()  # still idempotent
    with Queue(directory) as again:
        # The frame was complete on disk from wal.after_write on: recovered.
        assert (again.get("t1") is not None) == (phase != "wal.before_write")


def test_the_error_tree_is_the_specs():
    for error in (KeyConflict, StaleLease, CorruptStore, QueueLocked, QueueClosed, InvalidRequest):
        assert issubclass(error, WalQueueError)
    assert issubclass(WalQueueError, Exception)
    assert issubclass(InvalidRequest, ValueError)
    assert issubclass(InjectedCrash, BaseException)
    assert not issubclass(InjectedCrash, Exception)


def test_close_calls_no_hook_phase(library, phases):
    q = library
    q.put("t1", {})
    phases.clear()
    q.close()
    assert phases == []


def test_a_clean_reopen_calls_no_hook_phase(library, directory, phases):
    q = library
    q.put("t1", {})
    q.compact()
    q.put("t2", {})
    q.close()
    phases.clear()
    with Queue(directory, hook=phases.append):
        pass
    assert phases == []


def test_identity_survives_a_snapshot_load_followed_by_ack_and_another_compaction(library, directory):
    q = library
    q.put("t1", {"a": 1}, available_at=3)
    q.compact()
    q = reopen(q, directory)
    try:
        q.ack(lease_one(q, now=3), now=4)
        q.compact()
    finally:
        q.close()
    with Queue(directory) as again:
        assert again.put("t1", {"a": 1}, available_at=3) == "t1"
        with pytest.raises(KeyConflict):
            again.put("t1", {"a": 1}, available_at=4)
