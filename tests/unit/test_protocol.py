"""The wire protocol on bytes alone: framing bounds, round trips, errors, garbage."""

import dataclasses
import struct

import msgspec
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from walqueue import (
    MAX_FRAME_BYTES,
    CorruptStore,
    InvalidRequest,
    KeyConflict,
    Lease,
    QueueClosed,
    QueueLocked,
    QueueStats,
    StaleLease,
    TaskView,
    WalQueueError,
)
from walqueue import protocol as p
from walqueue.protocol import bounds, framing
from walqueue.values import BackupManifest


def test_the_body_bound_is_the_frame_bound_plus_one_mebibyte():
    assert p.MAX_BODY_BYTES == MAX_FRAME_BYTES + 1024 * 1024


def test_an_oversized_length_is_refused_before_any_body_arrives():
    reader = p.FrameReader()
    reader.feed(struct.pack(">I", p.MAX_BODY_BYTES + 1))
    with pytest.raises(p.ProtocolError, match=str(p.MAX_BODY_BYTES)):
        reader.next_body()


def test_a_zero_length_is_refused():
    reader = p.FrameReader()
    reader.feed(b"\0\0\0\0")
    with pytest.raises(p.ProtocolError):
        reader.next_body()


def test_frames_split_across_reads_are_reassembled_in_order():
    stream = p.encode(p.Stats(id=1)) + p.encode(p.Get(id=2, task_id="t"))
    reader = p.FrameReader()
    bodies = []
    for index in range(len(stream)):
        reader.feed(stream[index:index + 1])
        while (body := reader.next_body()) is not None:
            bodies.append(p.decode_request(body))
    assert bodies == [p.Stats(id=1), p.Get(id=2, task_id="t")]
    assert reader.buffered_bytes == 0


@pytest.mark.parametrize("request_message", [
    p.Hello(id=1, version=p.PROTOCOL_VERSION, client="x"),
    p.Put(id=2, task_id="t", payload={"a": [1, 2.5, None, True, "s", {"b": {}}]}, key="k",
          available_at=5, max_attempts=2),
    p.PutMany(id=3, requests=[p.PutItem(task_id="t", payload={})]),
    p.Reserve(id=4, worker="w", lease_seconds=10, limit=5, wait=2.5),
    p.Ack(id=5, task_id="t", worker="w", generation=3),
    p.Release(id=6, task_id="t", worker="w", generation=3, delay=7),
    p.Touch(id=7, task_id="t", worker="w", generation=3, lease_seconds=9),
    p.Revive(id=8, task_ids=["a", "b"]),
    p.Get(id=9, task_id="t"),
    p.Tasks(id=10, status="dead"),
    p.Stats(id=11),
    p.Compact(id=12),
    p.Pause(id=13),
    p.Resume(id=14),
    p.BackupBegin(id=15),
    p.BackupEnd(id=16),
])
def test_every_request_round_trips(request_message):
    reader = p.FrameReader()
    reader.feed(p.encode(request_message))
    assert p.decode_request(reader.next_body()) == request_message


def test_unknown_fields_and_wrong_types_are_protocol_errors_carrying_the_id():
    body = msgspec.msgpack.encode({"type": "get", "id": 7, "task_id": "t", "typo": 1})
    with pytest.raises(p.ProtocolError) as error:
        p.decode_request(body)
    assert error.value.args[1] == 7 and "typo" in error.value.args[0]
    body = msgspec.msgpack.encode({"type": "ack", "id": 8, "task_id": "t", "worker": "w", "generation": True})
    with pytest.raises(p.ProtocolError) as error:
        p.decode_request(body)
    assert error.value.args[1] == 8


def test_deeply_nested_input_is_a_protocol_error_not_a_crash():
    deep = b"\x91" * 100_000 + b"\xc0"
    body = (b"\x84" + msgspec.msgpack.encode("type") + msgspec.msgpack.encode("put")
            + msgspec.msgpack.encode("id") + b"\x05" + msgspec.msgpack.encode("task_id")
            + msgspec.msgpack.encode("t") + msgspec.msgpack.encode("payload") + b"\x81"
            + msgspec.msgpack.encode("a") + deep)
    with pytest.raises(p.ProtocolError):
        p.decode_request(body)
    with pytest.raises(p.ProtocolError):
        p.decode_response(deep)


@settings(max_examples=300, deadline=None)  # a time limit an example fails when the machine is busy
@given(st.binary(max_size=64))
def test_garbage_can_only_raise_protocol_error(garbage):
    reader = p.FrameReader(max_body_bytes=64)
    reader.feed(garbage)
    try:
        while (body := reader.next_body()) is not None:
            p.decode_request(body)
    except p.ProtocolError:
        pass


# The wire layout of the values as it was written by hand before the wire
# twins were generated from the dataclasses: the bytes must not change.
class HandWrittenLease(msgspec.Struct):
    task_id: str
    worker: str
    generation: int
    deadline: int
    attempts: int
    payload: dict


class HandWrittenTask(msgspec.Struct):
    task_id: str
    key: str
    status: str
    attempts: int
    max_attempts: int
    generation: int
    available_at: int
    deadline: int | None
    worker: str | None
    payload: dict | None


class HandWrittenStats(msgspec.Struct):
    ready: int
    leased: int
    completed: int
    dead: int
    last_seq: int
    snapshot_seq: int
    wal_bytes: int


LEASE = Lease("t", "w", 2, 100, 1, {"a": 1})
TASK = TaskView("t", "k", "leased", 1, 3, 2, 0, 100, "w", {"a": 1})
STATS = QueueStats(1, 2, 3, 4, 5, 6, 7)


@pytest.mark.parametrize("value, hand_written", [
    (LEASE, HandWrittenLease), (TASK, HandWrittenTask), (STATS, HandWrittenStats),
], ids=["lease", "task", "stats"])
def test_a_library_value_is_sent_as_itself_in_the_bytes_of_the_old_layout(value, hand_written):
    old = hand_written(*[getattr(value, name) for name in hand_written.__struct_fields__])
    assert msgspec.msgpack.encode(value) == msgspec.msgpack.encode(old)


def test_library_values_come_back_from_the_wire_equal():
    assert p.lease_from_wire(p.decode_response(p.encode(p.LeaseOk(id=1, lease=LEASE))[4:]).lease) == LEASE
    assert p.task_from_wire(p.decode_response(p.encode(p.TaskOk(id=1, task=TASK))[4:]).task) == TASK
    assert p.stats_from_wire(p.decode_response(p.encode(p.StatsOk(id=1, stats=STATS))[4:]).stats) == STATS


def test_the_wire_twins_have_the_dataclass_fields_and_stay_strict():
    for value_type, twin in ((Lease, p.WireLease), (TaskView, p.WireTask), (QueueStats, p.WireStats)):
        assert twin.__struct_fields__ == tuple(value_type.__dataclass_fields__)
    body = msgspec.msgpack.encode({"type": "lease_ok", "id": 1, "lease": {**msgspec.structs.asdict(
        HandWrittenLease("t", "w", 1, 1, 1, {})), "extra": 1}})
    with pytest.raises(p.ProtocolError, match="extra"):
        p.decode_response(body)
    non_string_keys = msgspec.msgpack.encode({"type": "lease_ok", "id": 1, "lease": {
        **msgspec.structs.asdict(HandWrittenLease("t", "w", 1, 1, 1, {})), "payload": {1: 2}}})
    with pytest.raises(p.ProtocolError):
        p.decode_response(non_string_keys)


def test_version_2_answers_carry_the_daemon_version_and_version_1_gets_the_old_bytes():
    hello = {"type": "hello_ok", "id": 1, "version": 1, "server": "walqueued/1", "max_body_bytes": 5}
    answer = p.HelloOk(id=1, version=1, server="walqueued/1", max_body_bytes=5)
    assert p.encode(answer)[4:] == msgspec.msgpack.encode(hello)  # what version 1 always sent
    answer = p.HelloOk(id=1, version=2, server="walqueued/1", max_body_bytes=5, walqueue_version="9.9.9")
    assert p.decode_response(p.encode(answer)[4:]).walqueue_version == "9.9.9"
    stats = sample_daemon_stats()
    fields = p.WireDaemonStats.__struct_fields__
    old_layout = {name: getattr(stats, name) for name in fields[:fields.index("version")]}
    old_layout["queue"] = msgspec.structs.asdict(p.WireStats(*[getattr(stats.queue, name) for name in
                                                              p.WireStats.__struct_fields__]))
    assert msgspec.msgpack.encode(p.daemon_stats_to_wire(stats, 1)) == msgspec.msgpack.encode(old_layout)
    assert p.daemon_stats_to_wire(stats, 2).version == "9.9.9"
    version_2 = msgspec.msgpack.encode(p.daemon_stats_to_wire(stats, 2))
    assert b"clock_steps_total" not in version_2 and b"clock_offset_seconds" not in version_2


def test_version_3_daemon_stats_carry_the_clock_steps_and_offset():
    stats = dataclasses.replace(sample_daemon_stats(), clock_steps_total=2, clock_offset_seconds=-3600.5)
    wire = p.daemon_stats_to_wire(stats, 3)
    assert p.daemon_stats_from_wire(msgspec.msgpack.decode(msgspec.msgpack.encode(wire),
                                                           type=p.WireDaemonStats)) == stats
    # Version 4 adds the compaction figures; version 3 gets them as defaults, which are omitted.
    failing = dataclasses.replace(stats, compaction_failures_total=4, last_compaction_error="ENOSPC")
    assert p.daemon_stats_to_wire(failing, 4).compaction_failures_total == 4
    assert msgspec.msgpack.encode(p.daemon_stats_to_wire(failing, 3)) == \
        msgspec.msgpack.encode(p.daemon_stats_to_wire(stats, 3))


def sample_daemon_stats() -> p.DaemonStats:
    return p.DaemonStats(STATS, 1, 2, 3, 4, 5, 1.5, None, 0.25, 3, 4, None, 5, 6, None, 7, 8, True, 1.0, 2.0,
                         3.0, "/d", "9.9.9")


@pytest.mark.parametrize("error", [
    InvalidRequest("bad"), KeyConflict("taken"), QueueClosed("closed"), CorruptStore("rot"),
    QueueLocked("locked"), WalQueueError("base"),
])
def test_errors_cross_the_wire_as_the_same_class(error):
    answer = p.error_to_wire(3, error)
    decoded = p.decode_response(p.encode(answer)[4:])
    rebuilt = p.error_from_wire(decoded)
    assert type(rebuilt) is type(error) and str(rebuilt) == str(error)


def test_stale_lease_keeps_its_status_and_generation_across_the_wire():
    error = StaleLease("gone", task_id="t", status="completed", generation=4)
    rebuilt = p.error_from_wire(p.decode_response(p.encode(p.error_to_wire(1, error))[4:]))
    assert isinstance(rebuilt, StaleLease)
    assert (rebuilt.task_id, rebuilt.status, rebuilt.generation) == ("t", "completed", 4)


def test_a_protocol_error_is_answered_as_a_fatal_invalid_request():
    answer = p.error_to_wire(None, p.ProtocolError("frame length 0"))
    assert answer.fatal and answer.error == "InvalidRequest" and answer.id is None


def test_put_many_items_come_from_put_requests_or_mappings():
    from walqueue import PutRequest
    assert p.put_item(PutRequest("t", {}, key="k")) == p.PutItem("t", {}, "k", 0, 3)
    assert p.put_item({"task_id": "t", "payload": {}}) == p.PutItem("t", {})
    with pytest.raises(InvalidRequest):
        p.put_item({"task_id": "t", "payload": {}, "delay": 3})
    with pytest.raises(InvalidRequest):
        p.put_item({"payload": {}})


def test_nested_mappings_of_any_kind_travel_as_maps():
    from types import MappingProxyType

    message = p.Put(id=1, task_id="t", payload={"inner": MappingProxyType({"a": 1})})
    reader = p.FrameReader()
    reader.feed(p.encode(message))
    assert p.decode_request(reader.next_body()).payload == {"inner": {"a": 1}}
    with pytest.raises(TypeError):
        p.encode(p.Put(id=1, task_id="t", payload={"x": object()}))


def test_the_wire_types_carry_exactly_the_fields_of_the_library_types():
    # protocol converts between them field by field, by name: a field added on
    # one side only would otherwise be dropped without a word.
    import dataclasses

    from walqueue import Lease, QueueStats, TaskView

    for library, wire in [(Lease, p.WireLease), (TaskView, p.WireTask), (QueueStats, p.WireStats)]:
        assert tuple(field.name for field in dataclasses.fields(library)) == wire.__struct_fields__


def test_a_manifest_round_trips_to_the_library_value():
    manifest = BackupManifest("/var/lib/walqueue", 42, (("wal-00000000000000000041.log", 300),
                                                        ("snapshot-00000000000000000040.snap", 900),
                                                        ("CURRENT", 104)))
    wire = p.manifest_to_wire(7, manifest)
    answer = p.decode_response(p.encode(wire)[4:])
    assert answer == wire and p.manifest_from_wire(answer) == manifest
    state = p.decode_response(p.encode(p.PauseState(id=8, paused=True))[4:])
    assert state == p.PauseState(id=8, paused=True)


# -- cheap bounds before decoding (issue 12 item 4) ---------------------------------------


def read_requests(stream: bytes, read_bytes: int) -> list:
    """Feed ``stream`` to the daemon's reader in reads of ``read_bytes``: the requests and refusals."""
    reader = p.FrameReader(request_bounds=True)
    found = []
    for start in range(0, len(stream), read_bytes):
        reader.feed(stream[start:start + read_bytes])
        while True:
            try:
                body = reader.next_body()
            except p.RequestRefused as refused:
                found.append(refused)
                continue
            if body is None:
                break
            found.append(p.decode_request(body))
    assert reader.buffered_bytes == 0
    return found


def test_container_headers_are_an_upper_bound_counted_cheaply():
    assert p.container_header_bound(msgspec.msgpack.encode({"a": [[], {}], "я": "я"})) == 4 + 2  # four containers, two bytes 0x8f of "я"


def test_a_body_of_millions_of_empty_lists_is_refused_while_it_arrives_and_the_stream_goes_on():
    # Once such a put took 2.6 GiB and 25.7 s to be refused for its size.
    payload = {"lists": [[] for _ in range(p.MAX_CONTAINER_HEADERS + 1)]}
    stream = p.encode(p.Put(id=9, task_id="t", payload=payload)) + p.encode(p.Stats(id=10))
    refused, stats = read_requests(stream, 256 * 1024)
    assert isinstance(refused, p.RequestRefused) and refused.args[1] == 9
    assert "refused before decoding" in refused.args[0] and str(p.MAX_CONTAINER_HEADERS) in refused.args[0]
    assert stats == p.Stats(id=10)


def test_a_body_just_within_the_container_bound_is_decoded():
    payload = {"lists": [[] for _ in range(p.MAX_CONTAINER_HEADERS - 3)]}
    (put,) = read_requests(p.encode(p.Put(id=9, task_id="t", payload=payload)), 1 << 20)
    assert len(put.payload["lists"]) == p.MAX_CONTAINER_HEADERS - 3


def test_a_put_many_that_cannot_fit_one_wal_frame_is_refused_by_its_item_count():
    items = [p.PutItem(task_id="t", payload={})] * (p.MAX_PUT_MANY_ITEMS + 1)
    stream = p.encode(p.PutMany(id=11, requests=items))
    (refused,) = read_requests(stream, 64 * 1024)
    assert isinstance(refused, p.RequestRefused) and refused.args[1] == 11
    assert f"put_many of {p.MAX_PUT_MANY_ITEMS + 1} items" in refused.args[0]
    (fitting,) = read_requests(p.encode(p.PutMany(id=12, requests=items[:p.MAX_PUT_MANY_ITEMS])), 1 << 20)
    assert len(fitting.requests) == p.MAX_PUT_MANY_ITEMS


def test_the_client_s_reader_applies_no_request_bounds():
    payload = {"lists": [[] for _ in range(p.MAX_CONTAINER_HEADERS + 1)]}
    reader = p.FrameReader()
    reader.feed(p.encode(p.Put(id=9, task_id="t", payload=payload)))
    assert reader.next_body() is not None


def test_the_smallest_put_task_is_what_the_put_many_bound_assumes():
    import json

    smallest = {"available_at": 0, "key": "k", "max_attempts": 1, "payload": {}, "task_id": "t"}
    encoded = json.dumps(smallest, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    assert len(encoded) + len(",") == p.MIN_PUT_TASK_JSON_BYTES


@pytest.mark.parametrize("body, expected", [
    (msgspec.msgpack.encode({"type": "get", "id": 7, "task_id": 5}), {"type": "get", "id": 7, "task_id": 5}),
    (msgspec.msgpack.encode({"id": 2**40, "type": "x", "flag": True, "f": 1.5, "n": None, "b": b"\0"}),
     {"id": 2**40, "type": "x", "flag": None, "f": None, "n": None, "b": None}),
    (msgspec.msgpack.encode({"type": "put_many", "id": 3, "requests": [1, 2, 3], "after": 1}),
     {"type": "put_many", "id": 3, "requests": 3}),
    (msgspec.msgpack.encode({"type": "put", "payload": {"id": 1}, "id": 4}), {"type": "put"}),
    (msgspec.msgpack.encode([1, 2]), {}),
    (b"\x82\xa4type", {}),  # cut short: what could be read
    (b"", {}),
])
def test_peeking_reads_only_the_leading_scalar_fields(body, expected):
    assert p.peek_fields(body) == expected


def test_the_id_of_an_undecodable_body_is_found_without_decoding_the_body(monkeypatch):
    # Once the id peek decoded the whole body: 17M empty arrays cost 1.3 GiB.
    body = b"\x82" + msgspec.msgpack.encode("id") + b"\x05" + msgspec.msgpack.encode("junk") \
        + b"\xdd" + struct.pack(">I", 17_000_000) + b"\x90" * 17_000_000
    decode = msgspec.msgpack.decode
    monkeypatch.setattr(msgspec.msgpack, "decode", None)  # the peek must not decode anything
    assert p.peek_id(body) == 5
    monkeypatch.setattr(msgspec.msgpack, "decode", decode)
    (refused,) = read_requests(p.frame(body), 4 << 20)
    assert isinstance(refused, p.RequestRefused) and refused.args[1] == 5


# -- duplicate keys (issue 12 item 8) -------------------------------------------------------------


def raw_map(*pairs) -> bytes:
    """A msgpack map with exactly these (key, encoded value) pairs, duplicates included."""
    assert len(pairs) < 16
    return bytes([0x80 | len(pairs)]) + b"".join(msgspec.msgpack.encode(key) + value for key, value in pairs)


def enc(value) -> bytes:
    return msgspec.msgpack.encode(value)


TWICE_K = raw_map(("k", enc(1)), ("k", enc(2)))
TWICE_X = raw_map(("x", enc(1)), ("y", enc(2)), ("x", enc(3)))
TWICE_Z = raw_map(("z", enc({})), ("z", enc([])))
ITEM = raw_map(("task_id", enc("t")), ("payload", TWICE_Z))


@pytest.mark.parametrize("body, where, key", [
    (raw_map(("type", enc("get")), ("id", enc(1)), ("task_id", enc("a")), ("task_id", enc("b"))),
     "the request", "task_id"),
    (raw_map(("type", enc("put")), ("id", enc(1)), ("task_id", enc("a")), ("payload", TWICE_K)),
     "request['payload']", "k"),
    (raw_map(("type", enc("put")), ("id", enc(1)), ("task_id", enc("a")),
             ("payload", raw_map(("a", b"\x92" + enc(1) + TWICE_X)))),
     "request['payload']['a'][1]", "x"),
    (raw_map(("type", enc("put_many")), ("id", enc(1)), ("requests", b"\x91" + ITEM)),
     "request['requests'][0]['payload']", "z"),
])
def test_a_key_twice_in_a_request_or_a_payload_is_refused_naming_where(body, where, key):
    # msgspec lets the last of two equal keys win: a put once stored {"k": 2} from {"k": 1, "k": 2}.
    with pytest.raises(p.RequestRefused) as refused:
        p.decode_request(body)
    message, request_id = refused.value.args
    assert f"key {key!r} appears twice in {where}" in message and request_id == 1, message


def test_bodies_this_package_encodes_skip_the_walk_and_others_are_walked(monkeypatch):
    walked = []
    real = bounds.duplicate_key
    monkeypatch.setattr(bounds, "duplicate_key", lambda body: walked.append(body) or real(body))
    put = p.Put(id=5, task_id="t", payload={"a": [1, {"b": 2.5}], "c": None})
    assert p.decode_request(p.encode(put)[4:]) == put and walked == []
    reordered = enc({"payload": {"a": 1}, "id": 6, "task_id": "t", "type": "put"})  # other encoders
    assert p.decode_request(reordered).payload == {"a": 1} and walked == [reordered]


# -- refusals that cost what the bytes cost, not a step per value (issue 20 items 3 and 6) ------


def ints_put(count: int, *, canonical: bool) -> bytes:
    """A put body whose payload is {"x": [1] * count}, as msgspec encodes it or left without
    the default fields (as another encoder may send it, so the body is walked)."""
    if canonical:
        marker = 0x7FFFFFFF
        body = enc(p.Put(id=5, task_id="ints", payload={"x": [marker]}))
        at = body.index(b"\x91\xce" + struct.pack(">I", marker))
        return body[:at] + b"\xdd" + struct.pack(">I", count) + b"\x01" * count + body[at + 6:]
    head = raw_map(("type", enc("put")), ("id", enc(5)), ("task_id", enc("ints")), ("payload", b""))
    return head + b"\x81" + enc("x") + b"\xdd" + struct.pack(">I", count) + b"\x01" * count


@pytest.mark.parametrize("canonical", [True, False], ids=["as-msgspec-encodes", "walked"])
def test_a_put_of_millions_of_small_ints_is_refused_for_its_json_without_a_step_per_int(
        canonical, monkeypatch):
    # Once six 17 MB puts of 16.7M one-byte integers took ~12 s to refuse, and
    # the duplicate-key walk alone took 15 s over one such body.
    from walqueue import validation

    body = ints_put(16_700_000, canonical=canonical)
    assert len(body) < p.MAX_BODY_BYTES and (framing._encoder.encode(framing._request_decoder.decode(body)) == body) == canonical
    monkeypatch.setattr(bounds, "duplicate_key", None)  # nothing walks it
    monkeypatch.setattr(validation, "plain_json", None)  # nothing validates it a value at a time
    with pytest.raises(p.RequestRefused) as refused:
        p.decode_request(body)
    message, request_id = refused.value.args
    assert request_id == 5 and "put of" in message and "refused before validating" in message, message
    assert "at least 33400007 bytes of JSON" in message and "16 MiB" in message


def test_payloads_that_may_fit_one_frame_are_left_to_the_library():
    fits = (MAX_FRAME_BYTES - len('{"x":[]}')) // 2  # "1," each, the last without its comma
    for count, refused in ((fits, False), (fits + 2, True)):
        request = p.Put(id=1, task_id="t", payload={"x": [1] * count})
        assert (p.costly_put_refusal(request, p.encode_value(request), walked=False) is not None) == refused
    # Floats are written differently by msgspec and by the library: the bound gives them room.
    floats = p.Put(id=1, task_id="t", payload={"x": [1e-05] * 2_000_000})  # 7 characters in msgspec, 5 in the library
    assert p.costly_put_refusal(floats, p.encode_value(floats), walked=False) is None
    many = p.PutMany(id=2, requests=[p.PutItem(task_id="same", payload={"x": [1] * (fits // 2 + 1)})] * 2)
    assert p.costly_put_refusal(many, p.encode_value(many), walked=False) is None, "identical duplicates collapse"


def test_msgspec_writes_json_values_as_long_as_the_library_does_but_for_floats():
    from walqueue.codec import canonical_json

    values = st.recursive(
        st.none() | st.booleans() | st.integers(-(2**63), 2**64 - 1) | st.text(),
        lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
        max_leaves=20)

    @settings(max_examples=300, derandomize=True, deadline=None)
    @given(st.dictionaries(st.text(max_size=5), values, max_size=4), st.floats(allow_nan=False, allow_infinity=False))
    def check(payload, number):
        assert len(bounds._json_encoder.encode(payload)) == len(canonical_json(payload))
        difference = len(bounds._json_encoder.encode(number)) - len(canonical_json({"f": number})) + len('{"f":}')
        assert abs(difference) <= p.MAX_FLOAT_JSON_CHARS - 3

    check()


def test_a_walked_body_with_too_many_objects_and_arrays_is_refused_before_the_walk(monkeypatch):
    from walqueue import validation

    lists = validation.MAX_PAYLOAD_CONTAINERS  # with the payload itself, one too many
    body = raw_map(("type", enc("put")), ("id", enc(8)), ("task_id", enc("t")),
                   ("payload", b"\x81" + enc("l") + b"\xdd" + struct.pack(">I", lists) + b"\x90" * lists))
    monkeypatch.setattr(bounds, "duplicate_key", None)
    with pytest.raises(p.RequestRefused) as refused:
        p.decode_request(body)
    assert f"payload holds more than {lists} objects and arrays" in refused.value.args[0]
    items = [p.PutItem(task_id=f"i{index}", payload={"l": [[]] * (lists - 2)}) for index in range(11)]
    walked = enc({"requests": items, "id": 9, "type": "put_many"})  # another encoder's order
    with pytest.raises(p.RequestRefused) as refused:
        p.decode_request(walked)
    assert "requests[10].payload: the payloads of this request hold more than" in refused.value.args[0]


# A second, naive msgpack writer for the walk's test: maps as lists of pairs (so a key may
# come twice), integers at any width the format allows.
def naive_pack(value, widths) -> bytes:
    if isinstance(value, tuple):  # ("map", [(key, value), ...])
        pairs = value[1]
        head = bytes([0x80 | len(pairs)]) if len(pairs) < 16 else b"\xde" + struct.pack(">H", len(pairs))
        return head + b"".join(naive_pack(key, widths) + naive_pack(item, widths) for key, item in pairs)
    if isinstance(value, list):
        head = bytes([0x90 | len(value)]) if len(value) < 16 and widths.draw_bool() else \
            b"\xdd" + struct.pack(">I", len(value))
        return head + b"".join(naive_pack(item, widths) for item in value)
    if isinstance(value, bool) or value is None:
        return enc(value)
    if isinstance(value, int):
        if 0 <= value < 256 and widths.draw_bool():
            return b"\xcc" + bytes([value]) if widths.draw_bool() else b"\xcf" + struct.pack(">Q", value)
        return enc(value)
    if isinstance(value, str):
        data = value.encode()
        return (b"\xd9" + bytes([len(data)]) + data) if len(data) < 256 and widths.draw_bool() else enc(value)
    return enc(value)


def naive_first_duplicate(value, path="request"):
    """(where, key) of the first map, in document order, with a key twice."""
    if isinstance(value, tuple):
        seen = set()
        for key, item in value[1]:
            if key in seen:
                return ("the request" if path == "request" else path), key
            seen.add(key)
            found = naive_first_duplicate(item, f"{path}[{key!r}]")
            if found:
                return found
    elif isinstance(value, list):
        for index, item in enumerate(value):
            found = naive_first_duplicate(item, f"{path}[{index}]")
            if found:
                return found
    return None


class Widths:
    def __init__(self, data):
        self.data = data

    def draw_bool(self) -> bool:
        return self.data.draw(st.booleans())


@settings(max_examples=150, derandomize=True, deadline=None)
@given(st.data())
def test_the_walk_finds_the_first_key_twice_whatever_the_encoding(data):
    keys = st.sampled_from(["a", "b", "", "é", 1, 200])
    scalars = st.none() | st.booleans() | st.integers(0, 300) | st.integers(-40, -1) | st.sampled_from(["x", "y" * 40])
    tree = st.recursive(
        scalars,
        lambda inner: st.lists(inner, max_size=20)
        | st.lists(st.tuples(keys, inner), max_size=4).map(lambda pairs: ("map", pairs)),
        max_leaves=40)
    payload = data.draw(st.lists(st.tuples(keys, tree), max_size=4).map(lambda pairs: ("map", pairs)))
    request = ("map", [("type", "put"), ("id", 1), ("task_id", "t"), ("payload", payload)])
    body = naive_pack(request, Widths(data))
    assert p.duplicate_key(body) == naive_first_duplicate(request)


# -- error codes (protocol version 6) ---------------------------------------------------------


class Version5Error(msgspec.Struct, tag="error", tag_field="type", forbid_unknown_fields=True):
    """The Error answer exactly as clients up to protocol version 5 decode it."""

    id: int | None
    error: str
    message: str
    task_id: str | None = None
    status: str | None = None
    generation: int | None = None
    fatal: bool = False


def test_an_error_carries_its_code_and_a_peer_before_version_6_gets_its_old_bytes():
    error = p.error_to_wire(3, StaleLease("gone", task_id="t", status="completed", generation=4))
    assert error.code == "stale_lease"
    assert p.decode_response(p.encode(p.error_for_version(error, p.ERROR_CODE_VERSION))[4:]) == error
    old = p.encode(p.error_for_version(error, p.TURN_REPORTING_VERSION))[4:]
    assert old == msgspec.msgpack.encode(Version5Error(3, "StaleLease", "gone", "t", "completed", 4))
    assert msgspec.msgpack.decode(old, type=Version5Error).status == "completed"  # what a 0.2 client reads


@pytest.mark.parametrize("error, code", [
    (InvalidRequest("bad"), "invalid_request"), (KeyConflict("taken"), "key_conflict"),
    (QueueClosed("closed"), "queue_closed"), (CorruptStore("rot"), "corrupt_store"),
    (QueueLocked("locked"), "queue_locked"), (WalQueueError("base"), "walqueue_error"),
    (p.ProtocolError("frame length 0", None), "protocol_error"),
    (p.RequestRefused("too big", 4), "request_refused"),
])
def test_each_error_crosses_the_wire_with_its_class_s_code(error, code):
    rebuilt = p.error_from_wire(p.decode_response(p.encode(p.error_to_wire(3, error))[4:]))
    assert rebuilt.code == code and isinstance(rebuilt, WalQueueError)


@pytest.mark.parametrize("name, code, raised", [
    ("InvalidRequest", "unsupported_version", p.UnsupportedVersion),
    ("InvalidRequest", "unknown_request", p.UnknownRequest),
    ("InvalidRequest", "unsendable_answer", InvalidRequest),
    ("QueueClosed", "write_failed", QueueClosed),
    ("QueueClosed", "listing_interrupted", QueueClosed),
    ("WalQueueError", "compaction_failed", WalQueueError),
    ("InvalidRequest", "a code from a newer daemon", InvalidRequest),   # the class its name says
    ("KeyConflict", "unsupported_version", KeyConflict),   # a code the name contradicts: SPEC's name wins
    ("SomethingNewer", "invalid_request", InvalidRequest),   # a name this client lacks: the code says
])
def test_the_client_chooses_the_exception_by_code_and_never_reads_the_message(name, code, raised):
    for message in ("protocol version 9 is not supported", "", "ceci n'est pas un message"):
        exc = p.error_from_wire(p.Error(id=1, error=name, message=message, code=code))
        assert type(exc) is raised and exc.code == code and str(exc) == message


def test_an_error_without_a_code_is_its_named_class_with_that_class_s_code():
    exc = p.error_from_wire(p.Error(id=1, error="QueueClosed", message="write failed"))   # a 0.2 daemon's
    assert type(exc) is QueueClosed and exc.code == "queue_closed"


def test_every_wire_code_maps_to_a_class_the_codes_of_the_library_classes_included():
    assert set(p.ERROR_CODES) <= set(p.CODE_CLASSES)
    for cls in p.ERROR_CLASSES.values():
        assert p.CODE_CLASSES[cls.code] is cls


def test_a_request_of_a_type_the_daemon_does_not_know_is_told_from_a_malformed_one():
    unknown = msgspec.msgpack.encode({"type": "frobnicate", "id": 7, "task_id": "t"})   # a newer client's
    with pytest.raises(p.UnknownRequestType) as error:
        p.decode_request(unknown)
    assert error.value.args[1] == 7 and p.error_to_wire(7, error.value).code == "unknown_request"
    malformed = msgspec.msgpack.encode({"type": "get", "id": 8, "task_id": 5})
    with pytest.raises(p.ProtocolError) as error:
        p.decode_request(malformed)
    assert type(error.value) is p.ProtocolError and p.error_to_wire(8, error.value).code == "protocol_error"


def test_every_request_and_its_answers_are_in_the_protocol_document():
    from pathlib import Path

    document = (Path(__file__).resolve().parents[2] / "docs" / "protocol.md").read_text()
    for kind in p.Request.__args__:
        assert f"| `{kind.__struct_config__.tag}`" in document, kind.__name__
    for kind in p.Response.__args__:
        assert f"{kind.__struct_config__.tag}{{" in document or kind is p.Error, kind.__name__
