"""SPEC §1 validation: every rejected call raises InvalidRequest naming the
field at fault, leaves the Queue open and unchanged, and writes nothing.

Also the Queue's lifecycle: close, QueueClosed, QueueLocked, discarding.
"""

import dataclasses
import functools
import gc
import math
import os
import subprocess
import sys
import types
from collections import OrderedDict
from decimal import Decimal
from pathlib import Path

import pytest

from walqueue import (
    MAX_FRAME_BYTES,
    InvalidRequest,
    Lease,
    PutRequest,
    Queue,
    QueueClosed,
    QueueLocked,
    WalQueueError,
    validation,
)
from walqueue.daemon.service import wire_put, wire_puts

from .frames import canonical, put_record, put_task, read_dir


def put_without_copy(q, request):
    """walqueued's put of ``request``: its service's validation (wire_put, no copy), then the Engine."""
    return q.engine.put([wire_put(request)])[0]


def put_many_without_copy(q, requests):
    """walqueued's put_many: wire_puts (no copy, one budget), then the Engine."""
    return q.engine.put(wire_puts(requests))

SRC = Path(__file__).resolve().parents[2] / "src"
TOO_BIG = 2**63


@pytest.fixture
def directory(tmp_path):
    return tmp_path / "queue"


@pytest.fixture
def q(directory):
    """A queue with a task in every status, so a call that wrongly went ahead
    would have something to change: a-dead (dead), b-done (completed),
    c-leased (leased by the `lease` fixture), d-ready and e-ready (ready)."""
    queue = Queue(directory)
    with queue.batch():  # one fsync: the setup is not what is tested here
        queue.put("a-dead", {"n": 1}, max_attempts=1)
        queue.put("b-done", {"n": 2})
        queue.put("c-leased", {"n": 3})
        queue.put("d-ready", {"n": 4})
        queue.put("e-ready", {"n": 5}, key="e-key")
        (doomed,) = queue.reserve("worker-0", now=0, lease_seconds=1, limit=1)
        assert doomed.task_id == "a-dead"
        (done,) = queue.reserve("worker-0", now=1, lease_seconds=1000, limit=1)
        assert done.task_id == "b-done"
        assert queue.get("a-dead").status == "dead"
        queue.ack(done, now=1)
    yield queue
    queue.close()


@pytest.fixture
def lease(q):
    """A live lease on c-leased (deadline 1000)."""
    (granted,) = q.reserve("worker-1", now=0, lease_seconds=1000, limit=1)
    assert granted.task_id == "c-leased"
    return granted


def assert_rejected(q, directory, field, call):
    """call() raises InvalidRequest (a ValueError) naming field; nothing on
    disk or in memory changed; the queue still serves."""
    before = read_dir(directory)
    stats_before = q.stats()
    tasks_before = list(q.tasks())
    with pytest.raises(InvalidRequest) as caught:
        call()
    assert isinstance(caught.value, ValueError)
    assert isinstance(caught.value, WalQueueError)
    if field is not None:
        assert field in str(caught.value), f"{field!r} not named in {caught.value}"
    assert read_dir(directory) == before
    assert q.stats() == stats_before
    assert list(q.tasks()) == tasks_before
    return caught.value


# -- strings: task_id, key, worker ------------------------------------------

BAD_STRINGS = [
    pytest.param("", id="empty"),
    pytest.param(5, id="int"),
    pytest.param(None, id="none"),
    pytest.param(b"abc", id="bytes"),
    pytest.param(["a"], id="list"),
    pytest.param("a" * 1025, id="1025-ascii-bytes"),
    pytest.param("é" * 513, id="1026-utf8-bytes-in-513-chars"),
    pytest.param("€" * 341 + "ab", id="1025-utf8-bytes-in-343-chars"),
    pytest.param("x\ud800y", id="lone-high-surrogate"),
    pytest.param("\udfff", id="lone-low-surrogate"),
]

GOOD_EDGE_STRINGS = [
    pytest.param("a" * 1024, id="1024-ascii-bytes"),
    pytest.param("é" * 512, id="1024-utf8-bytes"),
    pytest.param("€" * 341 + "a", id="1024-bytes-three-byte-chars"),
    pytest.param("\U0001f600" * 256, id="1024-bytes-four-byte-chars"),
    pytest.param("x", id="one-char"),
]


@pytest.mark.parametrize("bad", BAD_STRINGS)
def test_put_rejects_a_bad_task_id(q, directory, bad):
    assert_rejected(q, directory, "task_id", lambda: q.put(bad, {}))


@pytest.mark.parametrize("bad", [param for param in BAD_STRINGS if param.values[0] is not None])
def test_put_rejects_a_bad_key(q, directory, bad):
    """(key=None is not in the list: it means the task id.)"""
    assert_rejected(q, directory, "key", lambda: q.put("fresh", {}, key=bad))


@pytest.mark.parametrize("bad", BAD_STRINGS)
def test_reserve_rejects_a_bad_worker(q, directory, bad):
    assert_rejected(q, directory, "worker", lambda: q.reserve(bad, now=0, lease_seconds=10))


@pytest.mark.parametrize("bad", BAD_STRINGS)
def test_put_many_rejects_a_bad_task_id_or_key(q, directory, bad):
    assert_rejected(
        q, directory, "task_id", lambda: q.put_many([PutRequest("fresh", {}), PutRequest(bad, {})])
    )
    if bad is not None:
        assert_rejected(
            q,
            directory,
            "key",
            lambda: q.put_many([{"task_id": "fresh", "payload": {}, "key": bad}]),
        )


@pytest.mark.parametrize("bad", BAD_STRINGS)
def test_revive_rejects_a_bad_task_id(q, directory, bad):
    assert_rejected(q, directory, "task_id", lambda: q.revive(["a-dead", bad], now=0))


@pytest.mark.parametrize("bad", BAD_STRINGS)
def test_get_rejects_a_bad_task_id(q, directory, bad):
    assert_rejected(q, directory, "task_id", lambda: q.get(bad))


@pytest.mark.parametrize("bad", BAD_STRINGS)
@pytest.mark.parametrize("method", ["ack", "release", "touch"])
def test_lease_calls_reject_a_lease_with_a_bad_task_id_or_worker(q, directory, lease, method, bad):
    call = lease_call(q, method)
    assert_rejected(q, directory, "task_id", lambda: call(dataclasses.replace(lease, task_id=bad)))
    assert_rejected(q, directory, "worker", lambda: call(dataclasses.replace(lease, worker=bad)))


@pytest.mark.parametrize("good", GOOD_EDGE_STRINGS)
def test_strings_up_to_exactly_1024_utf8_bytes_are_accepted_everywhere(q, good):
    assert q.put(good, {"v": good}, key="key-of-" + good[:8]) == good
    assert q.get(good).payload == {"v": good}
    assert q.put("holder", {}, key=good) == "holder"
    assert q.get("holder").key == good
    leases = q.reserve(good, now=0, lease_seconds=10, limit=1000)
    assert {lease.worker for lease in leases} == {good}
    assert good in {lease.task_id for lease in leases}
    (mine,) = [lease for lease in leases if lease.task_id == good]
    q.ack(mine, now=1)


# -- payloads -----------------------------------------------------------------


class Opaque:
    pass


BAD_PAYLOADS = [
    pytest.param([], id="list"),
    pytest.param(["a", 1], id="list-of-values"),
    pytest.param(("a", 1), id="tuple"),
    pytest.param("text", id="str"),
    pytest.param(None, id="none"),
    pytest.param(5, id="int"),
    pytest.param(b"{}", id="bytes"),
    pytest.param({1: "a"}, id="int-key"),
    pytest.param({None: "a"}, id="none-key"),
    pytest.param({True: "a"}, id="bool-key"),
    pytest.param({("a",): 1}, id="tuple-key"),
    pytest.param({"a": {2: "b"}}, id="int-key-at-depth-2"),
    pytest.param({"a": [{"b": {3.5: 1}}]}, id="float-key-inside-list"),
    pytest.param({"a": math.nan}, id="nan"),
    pytest.param({"a": math.inf}, id="infinity"),
    pytest.param({"a": -math.inf}, id="minus-infinity"),
    pytest.param({"a": [1, 2, [math.nan]]}, id="nan-at-depth"),
    pytest.param({"a": {"b": {"c": -math.inf}}}, id="minus-infinity-at-depth"),
    pytest.param({"a": {1, 2}}, id="set"),
    pytest.param({"a": frozenset()}, id="frozenset"),
    pytest.param({"a": b"bytes"}, id="bytes-value"),
    pytest.param({"a": bytearray(b"x")}, id="bytearray-value"),
    pytest.param({"a": Opaque()}, id="object"),
    pytest.param({"a": Decimal("1.5")}, id="decimal"),
    pytest.param({"a": 1j}, id="complex"),
    pytest.param({"a": [Opaque()]}, id="object-in-list"),
    pytest.param({"a\ud800": 1}, id="lone-surrogate-in-key"),
    pytest.param({"a": "b\udc00"}, id="lone-surrogate-in-value"),
    pytest.param({"a": [{"b": ["\ud83d"]}]}, id="lone-surrogate-at-depth"),
    pytest.param({"a": {"\udfff": None}}, id="lone-surrogate-in-nested-key"),
]


@pytest.mark.parametrize("bad", BAD_PAYLOADS)
def test_put_rejects_a_payload_that_is_not_a_json_object(q, directory, bad):
    assert_rejected(q, directory, "payload", lambda: q.put("fresh", bad))


@pytest.mark.parametrize("bad", BAD_PAYLOADS)
def test_put_many_rejects_a_payload_that_is_not_a_json_object(q, directory, bad):
    assert_rejected(
        q, directory, "payload", lambda: q.put_many([PutRequest("fresh", {}), PutRequest("x", bad)])
    )
    assert_rejected(
        q, directory, "payload", lambda: q.put_many([{"task_id": "fresh", "payload": bad}])
    )


def test_a_self_referencing_payload_is_rejected_not_a_recursion_error(q, directory):
    payload = {"a": []}
    payload["a"].append(payload)
    assert_rejected(q, directory, "payload", lambda: q.put("fresh", payload))


@pytest.mark.parametrize("value", [2**64, -(2**63) - 1, 10**5000, -(10**30)],
                         ids=["2**64", "-2**63-1", "10**5000", "-10**30"])
def test_a_payload_int_the_wire_cannot_carry_is_rejected(q, directory, value):
    """msgpack (the daemon's wire) carries int64 and uint64 only: a task stored
    with a larger integer could never be handed out by walqueued, and a
    reserve would burn its attempts (issue 12 item 3). Refused up front, at
    any depth, by put and put_many, naming where it is."""
    error = assert_rejected(q, directory, "payload", lambda: q.put("huge", {"x": [1, {"y": value}]}))
    assert "['x'][1]['y']" in str(error) and "2**64" in str(error)
    assert_rejected(q, directory, "payload",
                    lambda: q.put_many([{"task_id": "huge", "payload": {"x": value}}]))


@pytest.mark.parametrize("value", [2**64 - 1, -(2**63), 0, 2**63])
def test_a_payload_int_at_the_edges_of_the_wire_range_round_trips(q, directory, value):
    q.put("edge", {"x": value})
    q.close()
    with Queue(directory) as again:
        assert again.get("edge").payload == {"x": value}


def test_the_json_lines_front_end_refuses_a_payload_int_the_wire_cannot_carry(tmp_path):
    line = '{"id": 1, "op": "put", "task_id": "t", "payload": {"n": 18446744073709551616}}\n'
    result = subprocess.run([sys.executable, "-m", "walqueue.cli", str(tmp_path / "q")],
                            input=line, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    answer = result.stdout.strip()
    assert '"ok": false' in answer and "InvalidRequest" in answer and "2**64" in answer


def test_tuples_in_a_payload_are_stored_as_lists(q):
    q.put("tuples", {"a": (1, 2), "b": {"c": ((3,), [4, (5,)])}})
    assert q.get("tuples").payload == {"a": [1, 2], "b": {"c": [[3], [4, [5]]]}}
    assert type(q.get("tuples").payload["a"]) is list
    assert type(q.get("tuples").payload["b"]["c"][0]) is list


def test_any_mapping_is_accepted_as_a_payload_and_stored_as_a_dict(q):
    q.put("ordered", OrderedDict([("b", 1), ("a", types.MappingProxyType({"c": 2}))]))
    assert q.get("ordered").payload == {"a": {"c": 2}, "b": 1}
    assert type(q.get("ordered").payload) is dict
    assert type(q.get("ordered").payload["a"]) is dict


def test_json_values_of_every_kind_are_accepted_at_depth(q):
    payload = {
        "none": None,
        "bools": [True, False],
        "int": -(2**63),  # the most negative the daemon's wire carries
        "float": -1.5e300,
        "str": "é \u2603 \U0001f600",
        "nested": {"list": [{"": [[]]}], "empty": {}},
    }
    q.put("every-kind", payload)
    assert q.get("every-kind").payload == payload


@pytest.mark.parametrize("bad", BAD_PAYLOADS)
def test_walqueueds_put_entries_refuse_a_bad_payload_exactly_as_put_does(q, directory, bad):
    """walqueued's puts (wire_put / wire_puts, no copy) skip the copy, not a check."""
    with pytest.raises(InvalidRequest) as by_put:
        q.put("fresh", bad)
    error = assert_rejected(q, directory, "payload", lambda: put_without_copy(q, PutRequest("fresh", bad)))
    assert str(error) == str(by_put.value)
    with pytest.raises(InvalidRequest) as by_put_many:
        q.put_many([PutRequest("fresh", {}), PutRequest("x", bad)])
    error = assert_rejected(q, directory, "payload", lambda: put_many_without_copy(q,
        [PutRequest("fresh", {}), PutRequest("x", bad)]))
    assert str(error) == str(by_put_many.value)


PLAIN_PAYLOADS = [
    {},
    {"data": "x" * 100, "n": 2**64 - 1, "m": -(2**63), "f": -0.0, "none": None, "flags": [True, False]},
    {"é \u2603": ["\U0001f600", {"": [[]]}, 1.5e300]},
    {"deep": [[[[{"a": [{"b": [[[[{}]]]]}]}]]]]},
]


@pytest.mark.parametrize("payload", PLAIN_PAYLOADS)
def test_a_plain_json_payload_is_one_the_full_check_returns_unchanged(payload):
    assert validation.plain_json(payload)
    assert validation.payload(payload) == payload


@pytest.mark.parametrize("payload", [
    pytest.param({"a": (1, 2)}, id="tuple"),
    pytest.param(OrderedDict(a=1), id="dict-subclass"),
    pytest.param({"a": types.MappingProxyType({})}, id="mapping"),
    pytest.param({"a": 2**64}, id="int-beyond-the-wire"),
    pytest.param({"a": [math.nan]}, id="nan-in-a-list"),
    pytest.param({"a\ud800": 1}, id="lone-surrogate-key"),
    pytest.param({"a": [{"b": "\udfff"}]}, id="lone-surrogate-at-depth"),
    pytest.param({"a": {1: 2}}, id="int-key-at-depth"),
    pytest.param({"a": True, 3: 4}, id="int-key"),
    pytest.param(functools.reduce(lambda inner, _: [inner], range(100), {}), id="deeper-than-the-fast-walk"),
])
def test_a_payload_that_needs_the_full_check_is_not_plain_json(payload):
    assert not validation.plain_json({"p": payload} if not isinstance(payload, dict) else payload)


def test_walqueueds_put_entries_store_what_put_stores(q):
    payloads = [*PLAIN_PAYLOADS, {"t": (1, (2,))}, OrderedDict(b=1, a={"c": 2})]
    for index, payload in enumerate(payloads):
        q.put(f"by-put-{index}", payload)
        put_without_copy(q, PutRequest(f"by-entry-{index}", payload))
    put_many_without_copy(q, [PutRequest(f"by-many-{index}", payload) for index, payload in enumerate(payloads)])
    for index in range(len(payloads)):
        stored = q.get(f"by-put-{index}").payload
        assert q.get(f"by-entry-{index}").payload == stored == q.get(f"by-many-{index}").payload


# -- integer parameters -------------------------------------------------------

BAD_INTEGERS = [
    pytest.param(True, id="true"),
    pytest.param(False, id="false"),
    pytest.param(-1, id="negative"),
    pytest.param(TOO_BIG, id="2**63"),
    pytest.param(2**64, id="2**64"),
    pytest.param(1.0, id="float-1.0"),
    pytest.param(0.5, id="float-0.5"),
    pytest.param("1", id="str"),
    pytest.param(None, id="none"),
    pytest.param(Decimal(1), id="decimal"),
]


@pytest.mark.parametrize("bad", BAD_INTEGERS)
def test_put_rejects_a_bad_available_at(q, directory, bad):
    assert_rejected(q, directory, "available_at", lambda: q.put("fresh", {}, available_at=bad))
    assert_rejected(
        q,
        directory,
        "available_at",
        lambda: q.put_many([{"task_id": "fresh", "payload": {}, "available_at": bad}]),
    )


@pytest.mark.parametrize("bad", [*BAD_INTEGERS, pytest.param(0, id="zero")])
def test_put_rejects_a_bad_max_attempts(q, directory, bad):
    assert_rejected(q, directory, "max_attempts", lambda: q.put("fresh", {}, max_attempts=bad))
    assert_rejected(
        q,
        directory,
        "max_attempts",
        lambda: q.put_many([PutRequest("fresh", {}, max_attempts=bad)]),
    )


@pytest.mark.parametrize("bad", BAD_INTEGERS)
def test_reserve_rejects_a_bad_now(q, directory, bad):
    assert_rejected(q, directory, "now", lambda: q.reserve("w", now=bad, lease_seconds=10))


@pytest.mark.parametrize("bad", [*BAD_INTEGERS, pytest.param(0, id="zero")])
def test_reserve_rejects_a_bad_lease_seconds(q, directory, bad):
    assert_rejected(q, directory, "lease_seconds", lambda: q.reserve("w", now=0, lease_seconds=bad))


@pytest.mark.parametrize(
    "bad",
    [*BAD_INTEGERS, pytest.param(0, id="zero"), pytest.param(1001, id="1001")],
)
def test_reserve_rejects_a_bad_limit(q, directory, bad):
    assert_rejected(
        q, directory, "limit", lambda: q.reserve("w", now=0, lease_seconds=10, limit=bad)
    )


def test_reserve_accepts_a_limit_of_1_and_1000(q):
    assert len(q.reserve("w", now=0, lease_seconds=10, limit=1)) == 1
    assert len(q.reserve("w", now=0, lease_seconds=10, limit=1000)) == 2


def test_reserve_rejects_now_plus_lease_seconds_reaching_2_to_the_63(q, directory):
    assert_rejected(
        q, directory, "lease_seconds", lambda: q.reserve("w", now=TOO_BIG - 10, lease_seconds=10)
    )
    assert_rejected(
        q, directory, "lease_seconds", lambda: q.reserve("w", now=TOO_BIG - 1, lease_seconds=1)
    )


def test_reserve_accepts_now_plus_lease_seconds_just_below_2_to_the_63(q):
    leases = q.reserve("w", now=TOO_BIG - 10, lease_seconds=9, limit=1000)
    assert {lease.deadline for lease in leases} == {TOO_BIG - 1}


@pytest.mark.parametrize("bad", BAD_INTEGERS)
def test_revive_rejects_a_bad_now(q, directory, bad):
    assert_rejected(q, directory, "now", lambda: q.revive(["a-dead"], now=bad))


def lease_call(q, method, **overrides):
    """A one-argument function presenting a lease to ack/release/touch with
    otherwise valid arguments."""
    if method == "ack":
        return lambda lease: q.ack(lease, **({"now": 1} | overrides))
    if method == "release":
        return lambda lease: q.release(lease, **({"now": 1, "delay": 0} | overrides))
    return lambda lease: q.touch(lease, **({"now": 1, "lease_seconds": 10} | overrides))


@pytest.mark.parametrize("bad", BAD_INTEGERS)
@pytest.mark.parametrize("method", ["ack", "release", "touch"])
def test_lease_calls_reject_a_bad_now(q, directory, lease, method, bad):
    assert_rejected(q, directory, "now", lambda: lease_call(q, method, now=bad)(lease))


@pytest.mark.parametrize("bad", BAD_INTEGERS)
@pytest.mark.parametrize("method", ["ack", "release", "touch"])
def test_lease_calls_reject_a_lease_with_a_bad_generation(q, directory, lease, method, bad):
    assert_rejected(
        q,
        directory,
        "generation",
        lambda: lease_call(q, method)(dataclasses.replace(lease, generation=bad)),
    )


@pytest.mark.parametrize("bad", BAD_INTEGERS)
def test_release_rejects_a_bad_delay(q, directory, lease, bad):
    assert_rejected(q, directory, "delay", lambda: q.release(lease, now=1, delay=bad))


def test_release_rejects_now_plus_delay_reaching_2_to_the_63(q, directory, lease):
    assert_rejected(q, directory, "delay", lambda: q.release(lease, now=1, delay=TOO_BIG - 1))
    assert_rejected(q, directory, "delay", lambda: q.release(lease, now=10, delay=TOO_BIG - 10))


def test_release_accepts_now_plus_delay_just_below_2_to_the_63(q, lease):
    q.release(lease, now=1, delay=TOO_BIG - 2)
    assert q.get(lease.task_id).available_at == TOO_BIG - 1


@pytest.mark.parametrize("bad", [*BAD_INTEGERS, pytest.param(0, id="zero")])
def test_touch_rejects_a_bad_lease_seconds(q, directory, lease, bad):
    assert_rejected(q, directory, "lease_seconds", lambda: q.touch(lease, now=1, lease_seconds=bad))


def test_touch_rejects_now_plus_lease_seconds_reaching_2_to_the_63(q, directory, lease):
    assert_rejected(
        q, directory, "lease_seconds", lambda: q.touch(lease, now=1, lease_seconds=TOO_BIG - 1)
    )


def test_arguments_are_validated_before_the_state_is_consulted(q, directory):
    """An unknown task with a bad `now` is InvalidRequest, not StaleLease."""
    ghost = Lease("no-such-task", "w", 1, 10, 1, {})
    for method in ("ack", "release", "touch"):
        assert_rejected(q, directory, "now", lambda m=method: lease_call(q, m, now=-1)(ghost))
    # A known key with a different identity AND a bad field: the field wins.
    assert_rejected(
        q, directory, "max_attempts", lambda: q.put("d-ready", {"n": 9}, max_attempts=0)
    )


@pytest.mark.parametrize("method", ["ack", "release", "touch"])
@pytest.mark.parametrize(
    "not_a_lease",
    [pytest.param(None, id="none"), pytest.param("d-ready", id="str"), pytest.param(7, id="int")],
)
def test_lease_calls_reject_something_that_is_not_a_lease(q, directory, lease, method, not_a_lease):
    assert_rejected(q, directory, None, lambda: lease_call(q, method)(not_a_lease))


# -- other arguments ----------------------------------------------------------


@pytest.mark.parametrize("bogus", ["bogus", "READY", "", 1, b"ready"])
def test_tasks_rejects_an_unknown_status(q, directory, bogus):
    assert_rejected(q, directory, "status", lambda: list(q.tasks(status=bogus)))


@pytest.mark.parametrize("status", ["ready", "leased", "completed", "dead", None])
def test_tasks_accepts_every_status(q, status):
    assert all(status in (None, view.status) for view in q.tasks(status=status))


@pytest.mark.parametrize(
    "bad_request",
    [
        pytest.param("fresh", id="str"),
        pytest.param(None, id="none"),
        pytest.param(("fresh", {}), id="tuple"),
        pytest.param({"payload": {}}, id="mapping-without-task_id"),
        pytest.param({"task_id": "fresh"}, id="mapping-without-payload"),
        pytest.param({"task_id": "fresh", "payload": {}, "priority": 1}, id="unknown-field"),
    ],
)
def test_put_many_rejects_a_request_that_is_not_a_put_request(q, directory, bad_request):
    assert_rejected(q, directory, None, lambda: q.put_many([PutRequest("ok", {}), bad_request]))


def test_put_many_rejects_a_request_list_that_is_not_a_list(q, directory):
    assert_rejected(q, directory, None, lambda: q.put_many(None))
    assert_rejected(q, directory, None, lambda: q.put_many(5))


def test_revive_rejects_a_task_id_list_that_is_not_a_list(q, directory):
    assert_rejected(q, directory, None, lambda: q.revive(None, now=0))
    assert_rejected(q, directory, None, lambda: q.revive(5, now=0))


def test_put_many_and_revive_of_nothing_return_empty_lists_and_write_nothing(q, directory):
    before = read_dir(directory)
    assert q.put_many([]) == []
    assert q.revive([], now=0) == []
    assert read_dir(directory) == before


# -- transaction size -------------------------------------------------------


def put_record_size(task_id, blob_length, seq):
    return len(canonical(put_record(seq, put_task(task_id, {"b": "x" * blob_length}))))


def test_a_put_whose_frame_would_exceed_max_frame_bytes_is_rejected(directory):
    with Queue(directory) as q:
        base = put_record_size("big", 0, 1)
        # Exactly one byte over the bound.
        assert_rejected(
            q,
            directory,
            None,
            lambda: q.put("big", {"b": "x" * (MAX_FRAME_BYTES - base + 1)}),
        )
        assert q.stats().last_seq == 0


def test_a_put_many_whose_frame_would_exceed_max_frame_bytes_is_rejected(q, directory):
    third = "x" * (MAX_FRAME_BYTES // 3)
    assert_rejected(
        q,
        directory,
        None,
        lambda: q.put_many([PutRequest(f"big-{n}", {"b": third}) for n in range(3)]),
    )


def test_a_put_whose_frame_is_exactly_max_frame_bytes_is_accepted(directory):
    with Queue(directory) as q:
        base = put_record_size("big", 0, 1)
        q.put("big", {"b": "x" * (MAX_FRAME_BYTES - base)})
        assert q.stats().wal_bytes == 4 + MAX_FRAME_BYTES + 32


def test_max_frame_bytes_is_16_mib():
    assert MAX_FRAME_BYTES == 16 * 1024 * 1024


# -- lifecycle ----------------------------------------------------------------


def every_call(q, lease):
    """One valid call of every public method."""
    return {
        "put": lambda: q.put("after-close", {}),
        "put_many": lambda: q.put_many([PutRequest("after-close", {})]),
        "reserve": lambda: q.reserve("w", now=0, lease_seconds=10),
        "ack": lambda: q.ack(lease, now=1),
        "release": lambda: q.release(lease, now=1),
        "touch": lambda: q.touch(lease, now=1, lease_seconds=10),
        "revive": lambda: q.revive(["a-dead"], now=1),
        "get": lambda: q.get("d-ready"),
        "tasks": lambda: list(q.tasks()),
        "tasks-by-status": lambda: list(q.tasks(status="ready")),
        "stats": lambda: q.stats(),
        "compact": lambda: q.compact(),
        "batch": lambda: q.batch().__enter__(),
    }


def test_every_call_after_close_raises_queue_closed(q, directory, lease):
    calls = every_call(q, lease)
    q.close()
    before = read_dir(directory)
    for name, call in calls.items():
        with pytest.raises(QueueClosed):
            call()
            pytest.fail(f"{name} did not raise QueueClosed")
    assert read_dir(directory) == before


def test_close_is_idempotent(q):
    q.close()
    q.close()
    with pytest.raises(QueueClosed):
        q.stats()


def test_close_releases_the_lock(q, directory):
    q.close()
    with Queue(directory) as again:
        assert again.get("d-ready").payload == {"n": 4}


def test_a_context_manager_closes_the_queue(directory):
    with Queue(directory) as q:
        q.put("a", {})
    with pytest.raises(QueueClosed):
        q.get("a")
    with Queue(directory) as q:
        assert q.get("a") is not None


def test_a_queue_creates_a_missing_directory(tmp_path):
    directory = tmp_path / "deep" / "er" / "queue"
    with Queue(directory) as q:
        q.put("a", {})
    assert directory.is_dir()


def test_a_second_queue_on_the_same_directory_in_this_process_is_locked_out(q, directory):
    before = read_dir(directory)
    with pytest.raises(QueueLocked) as caught:
        Queue(directory)
    assert isinstance(caught.value, WalQueueError)
    assert str(directory) in str(caught.value)
    # The failed attempt disturbed neither the files nor the owner.
    assert read_dir(directory) == before
    assert q.put("still-mine", {}) == "still-mine"


def test_a_second_queue_given_a_relative_path_is_locked_out_too(q, directory, monkeypatch):
    monkeypatch.chdir(directory.parent)
    with pytest.raises(QueueLocked):
        Queue(Path(directory.name))
    with pytest.raises(QueueLocked):
        Queue(str(directory))


def test_a_second_queue_in_another_process_is_locked_out(q, directory):
    script = (
        "import sys\n"
        "from walqueue import Queue, QueueLocked\n"
        "try:\n"
        "    Queue(sys.argv[1])\n"
        "except QueueLocked as error:\n"
        "    print('QueueLocked', error)\n"
        "    sys.exit(0)\n"
        "sys.exit(1)\n"
    )
    env = dict(os.environ, PYTHONPATH=str(SRC))
    result = subprocess.run(
        [sys.executable, "-c", script, str(directory)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("QueueLocked")
    assert str(directory) in result.stdout


def test_discarding_a_queue_releases_its_lock(directory):
    q = Queue(directory)
    q.put("a", {})
    del q
    gc.collect()
    with Queue(directory) as again:
        assert again.get("a") is not None


def test_invalid_request_is_a_value_error_and_a_walqueue_error():
    assert issubclass(InvalidRequest, ValueError)
    assert issubclass(InvalidRequest, WalQueueError)


# -- objects and arrays per payload and per request (issue 20 item 6) ---------------------------


@pytest.fixture
def small_container_bounds(monkeypatch):
    """The rules at a size a test can afford many times (the real ones: tests/backends)."""
    monkeypatch.setattr(validation, "MAX_PAYLOAD_CONTAINERS", 1000)
    monkeypatch.setattr(validation, "MAX_REQUEST_CONTAINERS", 4500)


def test_a_payload_holds_at_most_so_many_objects_and_arrays_on_every_library_entry(
        q, directory, small_container_bounds):
    """Once 20 puts of a million empty lists each (19.8 MiB sent) held 1,462 MiB of the
    daemon's memory, again after a restart. The payload itself counts; lists, tuples,
    dicts and any Mapping alike; refused before anything is written, naming the payload."""
    limit = validation.MAX_PAYLOAD_CONTAINERS
    at_the_bound = {"l": [[]] * (limit - 3), "m": {}}
    q.put("at-the-bound", at_the_bound)
    put_without_copy(q, PutRequest("at-the-bound-too", at_the_bound))
    for over in ({"l": [[]] * (limit - 2), "m": {}}, {"t": ((),) * (limit - 1)},
                 {"m": types.MappingProxyType({"x": [{}] * (limit - 2)})}):
        error = assert_rejected(q, directory, "payload", lambda over=over: q.put("over", over))
        assert f"more than {limit} objects and arrays" in str(error)
        assert_rejected(q, directory, "payload", lambda over=over: put_without_copy(q, PutRequest("over", over)))
        assert_rejected(q, directory, "requests[1].payload",
                        lambda over=over: q.put_many([PutRequest("fresh", {}), PutRequest("over", over)]))
    assert validation.plain_json(at_the_bound) == limit
    assert validation.plain_json({"l": [[]] * (limit - 2), "m": {}}) == 0  # the full check says why


def test_the_payloads_of_one_put_many_hold_at_most_so_many_objects_and_arrays_in_all(
        q, directory, small_container_bounds):
    limit, total = validation.MAX_PAYLOAD_CONTAINERS, validation.MAX_REQUEST_CONTAINERS
    items = total // limit  # payloads at the bound, all together still within the total
    fitting = [PutRequest(f"p{index}", {"l": [[]] * (limit - 2)}) for index in range(items)]
    rest = total - items * limit
    fitting.append(PutRequest("rest", {"l": [[]] * (rest - 2)}))
    assert len(q.put_many(fitting)) == items + 1
    for put_many in (q.put_many, functools.partial(put_many_without_copy, q)):
        over = [PutRequest(f"o{index}", {"l": [[]] * (limit - 2)}) for index in range(items)]
        over.append(PutRequest("one-too-many", {"l": [[]] * (rest - 1)}))
        error = assert_rejected(q, directory, f"requests[{items}].payload", lambda put_many=put_many, over=over:
                                put_many(over))
        assert f"more than {total} objects and arrays in all" in str(error)


def test_the_json_lines_front_end_refuses_a_payload_with_too_many_objects_and_arrays(tmp_path):
    lists = ",".join(["[]"] * validation.MAX_PAYLOAD_CONTAINERS)
    line = '{"id": 1, "op": "put", "task_id": "t", "payload": {"l": [' + lists + ']}}\n'
    result = subprocess.run([sys.executable, "-m", "walqueue.cli", str(tmp_path / "q")],
                            input=line, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    answer = result.stdout.strip()
    assert '"ok": false' in answer and "InvalidRequest" in answer and "objects and arrays" in answer


@pytest.mark.parametrize(("payload", "named"), [
    ({"a": [0, {" key": {1}}]}, "payload['a'][1][' key'] is a set"),
    ({"a": [{"b": "\ud800"}]}, "payload['a'][0]['b'] '\\ud800' is not encodable"),
    ({"a": {"\ud800": 1}}, "payload['a'] key '\\ud800' is not encodable"),
    ({"a": [{2: 1}]}, "payload['a'][0] has a key 2 that is not a str"),
])
def test_an_error_names_the_path_to_the_bad_value(payload, named):
    """The walk spells its path out only for an error (formatting it for every item of a large
    payload cost more than the walk): the name is the one a reader would write, a key named
    ' key' included."""
    from walqueue.validation import payload as checked

    with pytest.raises(InvalidRequest) as error:
        checked(payload)
    assert named in str(error.value)
