"""The reference model itself follows SPEC §2 on hand-worked examples.

What it proves: the oracle used by the stateful and crash suites is right on
the rules most easily got wrong — identity and idempotency, put_many as one
transaction, reap-then-lease order and frames, the current-lease rule, dead
tasks, tombstones, revive and generations — so a disagreement elsewhere
blames the library. These tests do not touch walqueue at all.
"""

from __future__ import annotations

import pytest

from tests.model.reference import (
    EXPIRE_IDS_PER_FRAME,
    ModelInvalidRequest,
    ModelKeyConflict,
    ModelLease,
    ModelStaleLease,
    ReferenceQueue,
    encode_frame,
    identity_of,
)


def test_an_identical_put_is_idempotent_whatever_the_status_and_writes_nothing() -> None:
    model = ReferenceQueue()
    assert model.put("a", {"x": (1, 2)}, key="k") == "a"
    [lease] = model.reserve("w", now=0, lease_seconds=5)
    model.ack(lease, now=1)
    assert model.last_seq == 3
    assert model.put("a", {"x": [1, 2]}, key="k") == "a"  # a tuple is its JSON list
    assert model.last_seq == 3
    assert model.get("a").status == "completed" and model.get("a").payload is None


def test_a_changed_request_under_a_known_key_or_a_reused_id_is_a_key_conflict() -> None:
    model = ReferenceQueue()
    model.put("a", {}, key="k", available_at=5)
    with pytest.raises(ModelKeyConflict):
        model.put("a", {}, key="k", available_at=6)
    with pytest.raises(ModelKeyConflict):
        model.put("a", {}, key="other", available_at=5)  # same identity, new key, used id
    with pytest.raises(ModelKeyConflict):
        model.put("b", {}, key="k")
    assert model.last_seq == 1


def test_identity_uses_the_original_available_at_even_after_the_task_moved() -> None:
    model = ReferenceQueue()
    model.put("a", {}, available_at=2)
    [lease] = model.reserve("w", now=3, lease_seconds=5)
    model.release(lease, now=4, delay=10)
    assert model.get("a").available_at == 14
    assert model.put("a", {}, available_at=2) == "a"
    assert model.tasks_by_id["a"].identity == identity_of("a", {}, 2, 3)


def test_put_many_is_one_frame_and_all_or_nothing() -> None:
    model = ReferenceQueue()
    model.put("a", {})
    ids = model.put_many(
        [
            {"task_id": "a", "payload": {}},  # identical retry, skipped
            {"task_id": "b", "payload": {}},
            {"task_id": "b", "payload": {}},  # identical duplicate, collapses
            {"task_id": "c", "payload": {}, "key": "kc"},
        ]
    )
    assert ids == ["a", "b", "b", "c"]
    assert model.last_seq == 2
    assert [t["task_id"] for t in model.records[1]["tasks"]] == ["b", "c"]
    assert model.records[1]["tasks"][1]["key"] == "kc"
    with pytest.raises(ModelKeyConflict):
        model.put_many([{"task_id": "d", "payload": {}}, {"task_id": "d", "payload": {"x": 1}}])
    with pytest.raises(ModelKeyConflict):
        model.put_many(
            [{"task_id": "e", "payload": {}}, {"task_id": "e", "payload": {}, "key": "z"}]
        )
    assert model.get("d") is None and model.get("e") is None and model.last_seq == 2
    assert model.put_many([]) == [] and model.put_many([{"task_id": "a", "payload": {}}]) == ["a"]
    assert model.last_seq == 2


def test_reserve_reaps_first_then_leases_in_available_at_then_id_order() -> None:
    model = ReferenceQueue()
    model.put_many([{"task_id": t, "payload": {}, "max_attempts": 1} for t in ("b", "a")])
    model.put("c", {}, available_at=1)
    model.reserve("w1", now=0, lease_seconds=4, limit=2)
    assert [view.status for view in model.tasks()] == ["leased", "leased", "ready"]
    leases = model.reserve("w2", now=4, lease_seconds=1, limit=5)
    # a and b expired at 4 with attempts 1 >= max 1: dead; only c is leased.
    assert model.records[-2] == {"now": 4, "op": "expire", "seq": 4, "task_ids": ["a", "b"]}
    assert leases == [ModelLease("c", "w2", 1, 5, 1, {})]
    assert model.get("a").status == "dead" and model.get("a").available_at == 4
    assert model.get("a").payload == {} and model.get("a").worker is None


def test_an_expired_lease_can_be_leased_again_in_the_same_reserve() -> None:
    model = ReferenceQueue()
    model.put("a", {})
    model.reserve("w1", now=0, lease_seconds=3)
    [lease] = model.reserve("w1", now=3, lease_seconds=3)
    assert lease == ModelLease("a", "w1", 2, 6, 2, {})
    assert [record["op"] for record in model.records] == ["put", "reserve", "expire", "reserve"]


def test_a_reap_of_more_than_ten_thousand_leases_spans_several_frames() -> None:
    model = ReferenceQueue()
    count = EXPIRE_IDS_PER_FRAME + 1
    model.put_many([{"task_id": f"t{i:05d}", "payload": {}} for i in range(count)])
    model.reserve("w", now=0, lease_seconds=1, limit=1000)
    for _ in range(count // 1000):
        model.reserve("w", now=0, lease_seconds=1, limit=1000)
    assert model.counts()["leased"] == count
    seq_before = model.last_seq
    assert model.reserve("w", now=1, lease_seconds=1, limit=1)
    assert [len(r["task_ids"]) for r in model.records[seq_before:]] == [10_000, 1, 1]


def test_ack_release_and_touch_need_the_current_lease_strictly_before_its_deadline() -> None:
    model = ReferenceQueue()
    model.put("a", {}, max_attempts=2)
    [first] = model.reserve("w", now=0, lease_seconds=5)
    touched = model.touch(first, now=4, lease_seconds=10)
    assert touched == first._replace(deadline=14)
    for bad in (first._replace(worker="x"), first._replace(generation=2)):
        with pytest.raises(ModelStaleLease):
            model.ack(bad, now=5)
    with pytest.raises(ModelStaleLease) as stale:
        model.ack(first, now=14)
    assert (stale.value.status, stale.value.generation) == ("leased", 1)
    model.release(first, now=13, delay=2)
    assert model.get("a").available_at == 15 and model.get("a").status == "ready"
    [second] = model.reserve("w", now=15, lease_seconds=5)
    assert second.generation == 2 and second.attempts == 2
    model.release(second, now=15)
    assert model.get("a").status == "dead"  # attempts 2 >= max 2
    with pytest.raises(ModelStaleLease) as stale:
        model.ack(second, now=16)
    assert (stale.value.status, stale.value.generation) == ("dead", 2)
    with pytest.raises(ModelStaleLease) as unknown:
        model.ack(second._replace(task_id="zz"), now=0)
    assert (unknown.value.status, unknown.value.generation) == (None, None)


def test_revive_resets_attempts_keeps_generation_and_drops_duplicates() -> None:
    model = ReferenceQueue()
    model.put("a", {"p": 1}, max_attempts=1)
    [lease] = model.reserve("w", now=0, lease_seconds=5)
    model.release(lease, now=1)
    with pytest.raises(ModelInvalidRequest):
        model.revive(["a", "nope"], now=2)
    assert model.revive(["a", "a"], now=7) == ["a"]
    assert model.records[-1] == {"now": 7, "op": "revive", "seq": 4, "task_ids": ["a"]}
    view = model.get("a")
    assert (view.status, view.attempts, view.generation, view.available_at) == ("ready", 0, 1, 7)
    with pytest.raises(ModelInvalidRequest):
        model.revive(["a"], now=8)
    assert model.revive([], now=8) == [] and model.last_seq == 4


def test_invalid_arguments_are_rejected_before_the_state_is_consulted() -> None:
    model = ReferenceQueue()
    model.put("a", {})
    for call in (
        lambda: model.put("a", {"x": float("nan")}),
        lambda: model.put("b", {1: 2}),
        lambda: model.put("", {}),
        lambda: model.put("a", {}, max_attempts=0),
        lambda: model.put("a", {}, available_at=True),
        lambda: model.reserve("w", now=2**63 - 1, lease_seconds=1),
        lambda: model.reserve("w", now=0, lease_seconds=1, limit=1001),
        lambda: model.ack(ModelLease("zz", "w", -1, 0, 0, None), now=0),
    ):
        with pytest.raises(ModelInvalidRequest):
            call()
    assert model.last_seq == 1


def test_wal_bytes_count_the_frames_since_the_snapshot() -> None:
    model = ReferenceQueue()
    model.put("a", {})
    assert model.wal_bytes == len(encode_frame(model.records[0]))
    assert model.compact() == 1 and model.wal_bytes == 0 and model.compact() == 1
    model.put("b", {})
    assert model.stats().wal_bytes == len(encode_frame(model.records[1]))
