"""SPEC §2 through the client API, on walqueued, PostgreSQL and the in-memory backend.

What it proves: the same calls give the same answers on the daemon, on
PostgreSQL and on tests/unit/memory_client.py — permanent keys and
identities, put_many all or nothing, (available_at, task_id) order with ids
compared as Python str (NUL and astral characters included), attempts and
generations, StaleLease with the task's status and generation and no change,
max_attempts -> dead, revive, delays, ack_and_reserve, payload copies and
canonical key order, stats.
Times come from each backend's own clock, so assertions use only relative
times.
"""

from __future__ import annotations

import pytest

from walqueue import InvalidRequest, KeyConflict, PutRequest, StaleLease


def test_an_identical_put_returns_the_id_even_after_completion_and_writes_nothing(backend):
    client = backend.client()
    assert client.put("t1", {"n": 1}) == "t1"
    (lease,) = client.reserve("w", lease_seconds=60)
    client.ack(lease)
    before = client.get("t1")
    assert client.put("t1", {"n": 1}) == "t1"
    assert client.get("t1") == before
    assert before.status == "completed" and before.payload is None
    assert client.reserve("w") == []


def test_a_different_request_under_a_known_key_or_id_is_a_key_conflict(backend):
    client = backend.client()
    client.put("t1", {"n": 1}, key="k1")
    with pytest.raises(KeyConflict, match="k1"):
        client.put("t2", {"n": 1}, key="k1")
    with pytest.raises(KeyConflict, match="k1"):
        client.put("t1", {"n": 2}, key="k1")
    with pytest.raises(KeyConflict, match="t1"):
        client.put("t1", {"n": 1}, key="k2")  # a new key, but the id is taken
    with pytest.raises(KeyConflict):
        client.put("t1", {"n": 1}, key="k1", max_attempts=4)  # part of the identity
    assert [view.task_id for view in client.tasks()] == ["t1"]


def test_put_many_is_all_or_nothing_and_collapses_identical_duplicates(backend):
    client = backend.client()
    client.put("old", {"n": 0})
    ids = client.put_many([PutRequest("a", {"n": 1}), {"task_id": "old", "payload": {"n": 0}},
                           {"task_id": "a", "payload": {"n": 1}}, PutRequest("b", {}, key="kb")])
    assert ids == ["a", "old", "a", "b"]
    for conflicting in (
        [PutRequest("c", {}), PutRequest("old", {"n": 9})],           # with the store
        [PutRequest("c", {}), PutRequest("d", {}, key="c")],          # inside the list: key
        [PutRequest("c", {}), PutRequest("c", {}, key="kc")],         # inside the list: id
        [PutRequest("c", {}), PutRequest("c", {"n": 1})],             # inside the list: identity
    ):
        with pytest.raises(KeyConflict):
            client.put_many(conflicting)
        assert client.get("c") is None and client.get("d") is None
    assert client.put_many([]) == []
    assert client.stats().ready == 3


def test_reserve_leases_in_available_at_then_code_point_order(backend):
    client = backend.client()
    # UTF-16 would put U+FFFF after U+10000; Python's str (and UTF-8 bytes) put it before.
    ids = ["b", "a\x00z", "a", "\U00010000", "\uffff", "é"]
    client.put_many([PutRequest(task_id, {"i": index}, available_at=1)
                     for index, task_id in enumerate(ids)])
    client.put("early", {}, available_at=0)
    leases = client.reserve("w", lease_seconds=60, limit=10)
    assert [lease.task_id for lease in leases] == ["early", *sorted(ids)]
    assert [view.task_id for view in client.tasks()] == sorted([*ids, "early"])
    assert all((lease.attempts, lease.generation) == (1, 1) for lease in leases)


def test_every_lease_adds_an_attempt_and_a_generation_until_the_task_is_dead(backend):
    client = backend.client()
    client.put("t", {"x": 1}, max_attempts=2)
    (first,) = client.reserve("w", lease_seconds=60)
    client.release(first)
    (second,) = client.reserve("w", lease_seconds=60)
    assert (second.attempts, second.generation) == (2, 2)
    client.release(second)
    dead = client.get("t")
    assert (dead.status, dead.attempts, dead.generation, dead.payload) == ("dead", 2, 2, {"x": 1})
    assert client.reserve("w") == []
    assert client.revive(["t", "t"]) == ["t"]
    revived = client.get("t")
    assert (revived.status, revived.attempts, revived.generation) == ("ready", 0, 2)
    (third,) = client.reserve("w", lease_seconds=60)
    assert (third.attempts, third.generation) == (1, 3)


def test_a_stale_ack_release_or_touch_changes_nothing_and_reports_the_task(backend):
    client = backend.client()
    client.put("t", {})
    (old,) = client.reserve("w", lease_seconds=60)
    client.release(old)
    (current,) = client.reserve("w", lease_seconds=60)
    before = client.get("t")
    for call in (lambda: client.ack(old), lambda: client.release(old, delay=5),
                 lambda: client.touch(old, lease_seconds=99),
                 lambda: client.ack(type(current)("t", "other", 2, 0, 1, {}))):
        with pytest.raises(StaleLease) as stale:
            call()
        assert (stale.value.task_id, stale.value.status, stale.value.generation) == ("t", "leased", 2)
        assert client.get("t") == before
    client.ack(current)
    with pytest.raises(StaleLease) as stale:
        client.ack(current)  # a retried ack: completed at its own generation
    assert (stale.value.status, stale.value.generation) == ("completed", 2)
    with pytest.raises(StaleLease) as unknown:
        client.ack(type(current)("nobody", "w", 1, 0, 1, {}))
    assert (unknown.value.task_id, unknown.value.status, unknown.value.generation) == ("nobody", None, None)


def test_touch_extends_the_lease_and_keeps_its_generation(backend):
    client = backend.client()
    client.put("t", {"p": [1]})
    (lease,) = client.reserve("w", lease_seconds=5)
    touched = client.touch(lease, lease_seconds=500)
    assert (touched.generation, touched.attempts, touched.payload) == (1, 1, {"p": [1]})
    assert touched.deadline > lease.deadline
    assert client.get("t").deadline == touched.deadline


def test_a_delayed_task_is_not_due_until_its_time(backend):
    client = backend.client()
    client.put("later", {}, delay=3600)
    client.put("now", {})
    view = client.get("later")
    assert view.available_at >= client.get("now").available_at
    (lease,) = client.reserve("w", limit=5)
    assert lease.task_id == "now"
    client.release(lease, delay=3600)
    assert client.reserve("w") == []
    with pytest.raises(InvalidRequest):
        client.put("x", {}, delay=5, available_at=7)


def test_ack_and_reserve_acks_then_leases_the_next_task_to_the_same_worker(backend):
    client = backend.client()
    client.put_many([PutRequest("a", {}), PutRequest("b", {"n": 2})])
    (first,) = client.reserve("w", lease_seconds=60)
    (second,) = client.ack_and_reserve(first, lease_seconds=90)
    assert (second.task_id, second.worker, second.payload) == ("b", "w", {"n": 2})
    assert client.get("a").status == "completed"
    with pytest.raises(StaleLease):
        client.ack_and_reserve(first)
    assert client.get("b").generation == 1
    with pytest.raises(InvalidRequest):
        client.ack_and_reserve(second, lease_seconds=2**63 - 1)
    assert client.get("b").status == "leased"  # a refused reserve half: the ack did not happen
    assert client.ack_and_reserve(second) == []
    assert client.get("b").status == "completed"


def test_payloads_come_back_as_their_json_round_trip_and_are_copies(backend):
    client = backend.client()
    payload = {"z": (1, 2), "a": {"y": None, "b": [True, 2.5, "ü\x00"]}, "big": 2**53 + 1}
    client.put("t", payload)
    payload["z"] = "changed"
    (lease,) = client.reserve("w")
    assert lease.payload == {"a": {"b": [True, 2.5, "ü\x00"], "y": None}, "big": 2**53 + 1, "z": [1, 2]}
    if backend.name == "postgres":
        assert list(lease.payload) == ["a", "big", "z"]  # parsed from canonical JSON (SPEC §9)
    lease.payload["a"]["y"] = "scribbled"
    assert client.get("t").payload["a"]["y"] is None


@pytest.mark.parametrize("call", [
    lambda c: c.put("", {}),
    lambda c: c.put("x" * 1025, {}),
    lambda c: c.put("t", {"x": float("nan")}),
    lambda c: c.put("t", {1: "non-str key"}),
    lambda c: c.put("t", {}, max_attempts=0),
    lambda c: c.put("t", {}, available_at=True),
    lambda c: c.reserve("w", limit=1001),
    lambda c: c.reserve("w", lease_seconds=0),
    lambda c: c.reserve("", lease_seconds=1),
    lambda c: c.reserve("w", wait=301),
    lambda c: c.revive(["t", ""]),
    lambda c: c.tasks("finished"),
])
def test_bad_arguments_are_refused_before_anything_is_written(backend, call):
    client = backend.client()
    with pytest.raises(InvalidRequest):
        call(client)
    assert client.stats().ready == 0


def test_revive_needs_every_task_dead_and_changes_nothing_otherwise(backend):
    client = backend.client()
    client.put("dead", {}, max_attempts=1)
    client.put("ready", {})
    (lease,) = client.reserve("w")
    client.release(lease)
    with pytest.raises(InvalidRequest, match="ready"):
        client.revive(["dead", "ready"])
    with pytest.raises(InvalidRequest, match="missing"):
        client.revive(["dead", "missing"])
    assert client.get("dead").status == "dead"
    assert client.revive([]) == []


def test_an_expired_lease_goes_to_the_next_worker_and_fences_the_first(backend):
    if backend.name == "memory":
        pytest.skip("the memory backend answers a reserve at once: waiting (SPEC §8, §9) is the services'")
    client = backend.client()
    client.put("t", {})
    (first,) = client.reserve("w1", lease_seconds=1)
    # A waiting reserve is woken when the lease expires (no sleep here).
    (second,) = client.reserve("w2", lease_seconds=60, wait=10)
    assert (second.task_id, second.generation, second.attempts) == ("t", 2, 2)
    with pytest.raises(StaleLease):
        client.ack(first)
    client.ack(second)


def test_stats_count_every_status(backend):
    client = backend.client()
    client.put_many([PutRequest(f"t{n}", {}, max_attempts=1) for n in range(4)])
    leases = client.reserve("w", limit=3, lease_seconds=60)
    client.ack(leases[0])
    client.release(leases[1])
    stats = client.stats()
    assert (stats.ready, stats.leased, stats.completed, stats.dead) == (1, 1, 1, 1)
    if backend.name == "postgres":
        assert (stats.last_seq, stats.snapshot_seq, stats.wal_bytes) == (0, 0, 0)


def test_two_clients_of_one_queue_see_one_queue(backend):
    first, second = backend.client(), backend.client()
    first.put("t", {})
    (lease,) = second.reserve("w")
    assert first.reserve("w") == []
    first.ack(lease)
    assert second.get("t").status == "completed"


def test_a_payload_or_a_request_with_too_many_objects_and_arrays_is_refused_alike(backend):
    """Issue 20 item 6: what a payload costs in memory is bounded, not only its bytes; the
    library's rule (docs/guarantees.md), on the daemon and on PostgreSQL alike."""
    from walqueue.validation import MAX_PAYLOAD_CONTAINERS, MAX_REQUEST_CONTAINERS

    client = backend.client()
    # The payload itself counts: this one holds exactly the bound.
    assert client.put("at-the-bound", {"l": [[]] * (MAX_PAYLOAD_CONTAINERS - 2)}) == "at-the-bound"
    with pytest.raises(InvalidRequest, match=f"more than {MAX_PAYLOAD_CONTAINERS} objects and arrays"):
        client.put("one-more", {"l": [[]] * (MAX_PAYLOAD_CONTAINERS - 1)})
    per_item = MAX_PAYLOAD_CONTAINERS - 2
    items = [PutRequest(f"many-{index}", {"l": [[]] * per_item}) for index in range(11)]
    assert 11 * (per_item + 2) > MAX_REQUEST_CONTAINERS >= 10 * (per_item + 2)
    with pytest.raises(InvalidRequest, match=f"more than {MAX_REQUEST_CONTAINERS}"):
        client.put_many(items)
    assert client.get("one-more") is None and client.get("many-0") is None
    assert client.stats().ready == 1
