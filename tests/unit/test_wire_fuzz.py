"""Hostile bytes on the wire: the decoders and the daemon's receive path, fuzzed.

Three claims, each checked with seeded (derandomized), bounded hypothesis runs:

1. The framing reader and the request/answer decoders, fed random bytes or
   valid messages with bytes flipped, cut, inserted or spliced, and split
   into arbitrary reads, only ever return a declared message or raise
   ``ProtocolError`` (whose id, when present, is a msgpack uint).
2. The daemon's own event loop (``Loop.one_turn`` on a real Queue and a
   real listening socket, in-process, turn by turn, no threads) answers such
   bytes only with decodable answers whose errors are the documented ones
   (``InvalidRequest``, ``KeyConflict``, ``StaleLease``); every request the
   protocol's rules accept is answered exactly once and nothing else is
   (no silent skip, no phantom answer); a broken frame ends with exactly one
   fatal ``InvalidRequest`` and nothing after it, and the connection closes;
   never a write failure, never a reopen, never a connection left behind.
3. Nothing hangs: every example runs under an alarm.
"""

from __future__ import annotations

import contextlib
import select
import signal
import socket
import struct
import typing
from collections import Counter
from pathlib import Path

import msgspec
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from walqueue import Queue
from walqueue import protocol as p
from walqueue.daemon.loop import Loop, bind_listener
from walqueue.daemon.systemd import Notifier

FUZZ = settings(max_examples=300, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
EXAMPLE_SECONDS = 20
DOCUMENTED_ERRORS = {"InvalidRequest", "KeyConflict", "StaleLease"}
REQUEST_TYPES = tuple(Request.__name__ for Request in p.Request.__args__)


@contextlib.contextmanager
def no_hang(seconds: int = EXAMPLE_SECONDS):
    """Fail the example (instead of hanging the run) if it takes longer than ``seconds``."""
    def expired(signum, frame):
        raise AssertionError(f"an example ran longer than {seconds} s: a hang")

    previous = signal.signal(signal.SIGALRM, expired)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


# -- strategies ----------------------------------------------------------------

texts = st.sampled_from(["", "a", "t1", "t2", "w", "é", "\x00", "x" * 1025]) | st.text(max_size=8)
# Mostly small valid numbers (so requests get past validation and change the
# queue), plus the edges of every integer range the protocol and library check.
integers = (st.integers(min_value=0, max_value=5)
            | st.sampled_from([-1, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)])
            | st.integers(min_value=-(2**63), max_value=2**64 - 1))
leaves = (st.none() | st.booleans() | integers | st.floats() | texts
          | st.binary(max_size=8))
values = st.recursive(leaves, lambda inner: st.lists(inner, max_size=3)
                      | st.dictionaries(texts, inner, max_size=3), max_leaves=8)
payloads = st.dictionaries(texts, values, max_size=3)


def put_items():
    return st.builds(p.PutItem, task_id=texts, payload=payloads, key=st.none() | texts,
                     available_at=integers, max_attempts=integers)


requests = st.one_of(
    st.builds(p.Hello, id=integers, version=st.sampled_from([p.PROTOCOL_VERSION, 0, 2, 3, 99]), client=texts),
    st.builds(p.Put, id=integers, task_id=texts, payload=payloads, key=st.none() | texts,
              available_at=integers, max_attempts=integers),
    st.builds(p.PutMany, id=integers, requests=st.lists(put_items(), max_size=3)),
    st.builds(p.Reserve, id=integers, worker=texts, lease_seconds=integers, limit=integers,
              wait=st.sampled_from([0.0, 0.001, -1.0, 301.0, float("nan"), float("inf")])),
    st.builds(p.Ack, id=integers, task_id=texts, worker=texts, generation=integers),
    st.builds(p.AckAndReserve, id=integers, task_id=texts, worker=texts, generation=integers,
              lease_seconds=integers, limit=integers,
              wait=st.sampled_from([0.0, 0.001, -1.0, 301.0, float("nan"), float("inf")])),
    st.builds(p.Release, id=integers, task_id=texts, worker=texts, generation=integers, delay=integers),
    st.builds(p.Touch, id=integers, task_id=texts, worker=texts, generation=integers,
              lease_seconds=integers),
    st.builds(p.Revive, id=integers, task_ids=st.lists(texts, max_size=3)),
    st.builds(p.Get, id=integers, task_id=texts),
    st.builds(p.Tasks, id=integers, status=st.sampled_from([None, "ready", "leased", "completed", "dead",
                                                            "bogus", ""])),
    st.builds(p.Stats, id=integers),
    st.builds(p.Compact, id=integers),
    st.builds(p.Pause, id=integers),
    st.builds(p.Resume, id=integers),
    st.builds(p.BackupBegin, id=integers),
    st.builds(p.BackupEnd, id=integers),
    st.builds(p.DaemonStatsReq, id=integers),
    st.builds(p.ForceRelease, id=integers, task_ids=st.lists(texts, max_size=3)),
    st.builds(p.Cancel, id=integers, task_id=texts),
    st.builds(p.Workers, id=integers),
    st.builds(p.Connections, id=integers),
    st.builds(p.TasksPage, id=integers, status=st.sampled_from([None, "ready", "completed", "bogus"]),
              after=st.none() | texts, limit=integers),
)

lease_values = st.builds(p.WireLease, task_id=texts, worker=texts, generation=integers, deadline=integers,
                         attempts=integers, payload=payloads)
task_values = st.builds(p.WireTask, task_id=texts, key=texts, status=texts, attempts=integers,
                        max_attempts=integers, generation=integers, available_at=integers,
                        deadline=st.none() | integers, worker=st.none() | texts,
                        payload=st.none() | payloads)
floats = st.floats(allow_nan=False)
stats_values = st.builds(p.WireStats, **dict.fromkeys(p.WireStats.__struct_fields__, integers))
_DAEMON_STATS_TYPES = {int: integers, float: floats, float | None: st.none() | floats,
                       bool: st.booleans(), str: texts}
daemon_stats_values = st.builds(
    p.WireDaemonStats, queue=stats_values,
    **{name: _DAEMON_STATS_TYPES[kind] for name, kind in
       typing.get_type_hints(p.WireDaemonStats).items() if name != "queue"})
responses = st.one_of(
    st.builds(p.HelloOk, id=integers, version=integers, server=texts, max_body_bytes=integers),
    st.builds(p.PutOk, id=integers, task_id=texts),
    st.builds(p.TaskIds, id=integers, task_ids=st.lists(texts, max_size=3)),
    st.builds(p.Leases, id=integers, leases=st.lists(lease_values, max_size=2), more=st.booleans()),
    st.builds(p.Done, id=integers),
    st.builds(p.LeaseOk, id=integers, lease=lease_values),
    st.builds(p.TaskOk, id=integers, task=st.none() | task_values),
    st.builds(p.TaskList, id=integers, tasks=st.lists(task_values, max_size=2), more=st.booleans()),
    st.builds(p.Compacted, id=integers, seq=integers),
    st.builds(p.PauseState, id=integers, paused=st.booleans()),
    st.builds(p.Manifest, id=integers, directory=texts, seq=integers,
              files=st.lists(st.builds(p.BackupFile, name=texts, length=integers), max_size=3)),
    st.builds(p.DaemonStatsOk, id=integers, stats=daemon_stats_values),
    st.builds(p.Error, id=st.none() | integers, error=texts, message=texts, task_id=st.none() | texts,
              status=st.none() | texts, generation=st.none() | integers, fatal=st.booleans()),
)


def encodable(message) -> bytes | None:
    """The message's body, or None when msgpack cannot carry its values (e.g. NaN keys are fine, 2**64 is not)."""
    try:
        return p.encode_value(message)
    except (TypeError, OverflowError, ValueError):
        return None


@st.composite
def mutated(draw, body: bytes) -> bytes:
    """``body`` with a few random edits: flips, cuts, insertions, duplications."""
    data = bytearray(body)
    for _ in range(draw(st.integers(min_value=1, max_value=4))):
        kind = draw(st.sampled_from(["flip", "set", "cut", "insert", "truncate", "duplicate"]))
        at = draw(st.integers(min_value=0, max_value=max(0, len(data) - 1)))
        if kind == "flip" and data:
            data[at] ^= 1 << draw(st.integers(min_value=0, max_value=7))
        elif kind == "set" and data:
            data[at] = draw(st.sampled_from([0x00, 0x7F, 0x80, 0x90, 0xA0, 0xC0, 0xC1, 0xC2, 0xCF, 0xD3,
                                             0xDC, 0xDE, 0xDF, 0xFF]))
        elif kind == "cut" and data:
            del data[at:at + draw(st.integers(min_value=1, max_value=8))]
        elif kind == "insert":
            data[at:at] = draw(st.binary(min_size=1, max_size=8))
        elif kind == "truncate":
            del data[at:]
        elif kind == "duplicate" and data:
            data[at:at] = data[at:at + draw(st.integers(min_value=1, max_value=16))]
    return bytes(data)


@st.composite
def hostile_bodies(draw, messages) -> bytes:
    """A body that is random bytes, a valid message, or a mutated valid message."""
    choice = draw(st.sampled_from(["random", "valid", "valid", "valid", "mutated", "mutated"]))
    if choice == "random":
        return draw(st.binary(max_size=96))
    body = encodable(draw(messages))
    if body is None:
        return draw(st.binary(max_size=96))
    return body if choice == "valid" else draw(mutated(body))


@st.composite
def stream_splits(draw, stream: bytes) -> list[bytes]:
    """``stream`` cut into the reads a socket might deliver."""
    cuts = sorted(draw(st.lists(st.integers(min_value=0, max_value=len(stream)), max_size=6)))
    pieces, start = [], 0
    for cut in [*cuts, len(stream)]:
        pieces.append(stream[start:cut])
        start = cut
    return [piece for piece in pieces if piece]


def framed(body: bytes, length_edit: int) -> bytes:
    """``body`` with a length prefix, right or wrong by ``length_edit`` (clamped to a uint32)."""
    length = min(max(len(body) + length_edit, 0), 2**32 - 1)
    return struct.pack(">I", length) + body


# -- 1. decoders ------------------------------------------------------------------


def check_decoded(message, union) -> None:
    assert isinstance(message, union.__args__), message


def check_protocol_error(error: p.ProtocolError) -> None:
    assert isinstance(error.args[0], str) and error.args[0]
    if len(error.args) > 1 and error.args[1] is not None:
        assert type(error.args[1]) is int and 0 <= error.args[1] < 2**64


@FUZZ
@given(st.data())
def test_request_bytes_decode_to_a_request_or_raise_protocol_error(data):
    bodies = data.draw(st.lists(hostile_bodies(requests), min_size=1, max_size=4))
    stream = b"".join(framed(body, data.draw(st.sampled_from([0, 0, 0, -1, 1, -4, 2**31])))
                      for body in bodies)
    reader = p.FrameReader(max_body_bytes=data.draw(st.sampled_from([64, 4096, p.MAX_BODY_BYTES])))
    with no_hang():
        try:
            for piece in data.draw(stream_splits(stream)):
                reader.feed(piece)
                while (body := reader.next_body()) is not None:
                    assert 1 <= len(body)
                    try:
                        check_decoded(p.decode_request(body), p.Request)
                    except p.ProtocolError as error:
                        check_protocol_error(error)
        except p.ProtocolError as error:  # a length out of bounds: the connection ends
            check_protocol_error(error)
        assert reader.wanted_bytes() >= 1


@FUZZ
@given(hostile_bodies(responses))
def test_answer_bytes_decode_to_an_answer_or_raise_protocol_error(body):
    with no_hang():
        try:
            check_decoded(p.decode_response(body), p.Response)
        except p.ProtocolError as error:
            check_protocol_error(error)


@FUZZ
@given(st.binary(min_size=1, max_size=256))
def test_random_request_bodies_raise_only_protocol_error_with_a_valid_id(body):
    with no_hang():
        try:
            check_decoded(p.decode_request(body), p.Request)
        except p.ProtocolError as error:
            check_protocol_error(error)


def test_every_request_type_is_covered_by_the_strategy():
    drawn = set()

    @settings(max_examples=300, derandomize=True, deadline=None)
    @given(requests)
    def collect(message):
        drawn.add(type(message).__name__)

    collect()
    assert drawn == set(REQUEST_TYPES)


# -- 2. the daemon's own event loop, in-process ----------------------------------


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    """One Loop on a real Queue and a real listening socket; its loop runs turn by turn.

    ``Loop.run()`` would install signal handlers and loop forever, so the test
    registers the listener as ``run()`` does and calls ``one_turn()`` itself.
    """
    workdir = Path(tmp_path_factory.mktemp("wire-fuzz"))
    directory = workdir / "queue"
    queue = Queue(directory)
    queue.put("t1", {"n": 1})
    queue.put("t2", {"n": 2}, max_attempts=1)
    queue.reserve("w", now=1, lease_seconds=10**9)
    path = str(workdir / "s.sock")
    listener = bind_listener(path, 0o600)
    instance = Loop(str(directory), queue.engine, listener, socket_path=path, compact_wal_bytes=10**12,
                    max_connections=10, hook=None, notifier=Notifier({}), hello_timeout_seconds=3600.0)
    instance.register_listener()
    real_timeout = instance._timeout
    # Never block in select: the test drives the turns and reads the answers.
    instance._timeout = lambda: min(real_timeout() or 0.0, 0.005)
    instance.path = path
    yield instance
    instance.queue.close()
    instance.close_without_serving()
    listener.close()


def _read_available(sock: socket.socket, out: bytearray) -> bool:
    """Append whatever the daemon has sent; True at end of stream."""
    while True:
        try:
            chunk = sock.recv(1 << 20)
        except BlockingIOError:
            return False
        except ConnectionResetError:
            return True
        if not chunk:
            return True
        out += chunk


def _turns_until_quiet(instance: Loop, sock: socket.socket, out: bytearray, max_turns: int = 400) -> bool:
    """Run turns until the daemon has nothing left for this client; True if it closed the stream."""
    quiet = 0
    for _ in range(max_turns):
        flight = instance.compaction.in_flight
        if flight is not None and flight.child.report is None:
            # A compact is answered once its snapshot child exits: wait for that, bounded.
            select.select([flight.child.fileno()], [], [], 30.0)
        instance.one_turn()
        before = len(out)
        if _read_available(sock, out):
            return True
        busy = instance.compaction.in_flight is not None or any(
            conn.out or conn.backlog or conn.deferred or conn.parked for conn in instance.connections.values())
        quiet = 0 if busy or len(out) != before else quiet + 1
        if quiet >= 3:
            return False
    raise AssertionError(f"the daemon was still busy with one client after {max_turns} turns: a hang")


def run_through_server(instance: Loop, pieces: list[bytes]) -> tuple[list, int, bool]:
    """Deliver ``pieces`` as separate writes; return (answers, reopens, whether the daemon closed first)."""
    epoch = instance.service.queue_epoch
    connections_before = len(instance.connections)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    out = bytearray()
    closed_by_daemon = False
    try:
        sock.connect(instance.path)
        sock.setblocking(False)
        closed_by_daemon = _turns_until_quiet(instance, sock, out)  # the accept
        for piece in pieces:
            if closed_by_daemon:
                break
            try:
                sock.sendall(piece)
            except (BrokenPipeError, ConnectionResetError):
                closed_by_daemon = True
                break
            closed_by_daemon = _turns_until_quiet(instance, sock, out)
    finally:
        sock.close()
    # The daemon notices the end of the stream and forgets the connection.
    for _ in range(50):
        if len(instance.connections) <= connections_before:
            break
        instance.one_turn()
    assert len(instance.connections) <= connections_before, "a closed client left its connection behind"
    reader = p.FrameReader()
    reader.feed(bytes(out))
    answers = []
    while (body := reader.next_body()) is not None:
        answers.append(p.decode_response(body))
    assert reader.buffered_bytes == 0, "the daemon wrote a partial frame"
    return answers, instance.service.queue_epoch - epoch, closed_by_daemon


def expected_request_ids(stream: bytes) -> tuple[list[int], bool]:
    """The ids the daemon must answer, by the protocol's rules; and whether a fatal error is due."""
    reader = p.FrameReader()
    reader.feed(stream)
    greeted = False
    ids = []
    try:
        while (body := reader.next_body()) is not None:
            request = p.decode_request(body)
            if isinstance(request, p.Hello):
                if greeted or request.version not in p.DAEMON_PROTOCOL_VERSIONS:
                    return ids, True
                greeted = True
            elif not greeted:
                return ids, True
            else:
                ids.append(request.id)
    except p.ProtocolError:
        return ids, True
    return ids, False


@FUZZ
@given(st.data())
def test_the_daemon_answers_hostile_bytes_only_with_documented_answers(harness, data):
    greet = data.draw(st.sampled_from(["hello"] * 6 + ["none", "wrong-version"]))
    prefix = b""
    if greet == "hello":
        prefix = p.encode(p.Hello(id=0, version=p.PROTOCOL_VERSION))
    elif greet == "wrong-version":
        prefix = p.encode(p.Hello(id=0, version=max(p.DAEMON_PROTOCOL_VERSIONS) + 1))
    if data.draw(st.booleans()):
        # Well-formed frames of well-typed requests (any values): the answers
        # must match the requests one for one.
        bodies = [body for body in map(encodable, data.draw(st.lists(requests, min_size=1, max_size=6)))
                  if body is not None]
        stream = prefix + b"".join(framed(body, 0) for body in bodies)
    else:
        bodies = data.draw(st.lists(hostile_bodies(requests), min_size=1, max_size=4))
        stream = prefix + b"".join(framed(body, data.draw(st.sampled_from([0] * 30 + [-1, 1, 2**31])))
                                   for body in bodies)
    with no_hang():
        answers, reopened, closed_by_daemon = run_through_server(harness, data.draw(stream_splits(stream)))
    assert reopened == 0, "a client's bytes made the daemon drop and reopen its queue"
    for index, answer in enumerate(answers):
        check_decoded(answer, p.Response)
        if isinstance(answer, p.Error):
            assert answer.error in DOCUMENTED_ERRORS, answer
            if answer.fatal:
                assert answer.error == "InvalidRequest", answer
                assert index == len(answers) - 1, f"answers after a fatal error: {answers[index:]}"
    # Nothing is served before a hello: the first answer is its HelloOk or the fatal error.
    if answers:
        assert isinstance(answers[0], p.HelloOk) or (isinstance(answers[0], p.Error) and answers[0].fatal)
    if greet == "wrong-version":
        assert len(answers) == 1 and answers[0].fatal and "version" in answers[0].message, answers
    # No silent skip and no phantom answer: every request the rules accept is
    # answered exactly once (a list answer ends with more=False), in full
    # unless a fatal error ends the connection; nothing else is answered.
    ids, fatal_due = expected_request_ids(stream)
    finals = Counter(a.id for a in answers[1:] if not getattr(a, "more", False)
                     and not (isinstance(a, p.Error) and a.fatal))
    if fatal_due:
        assert answers and isinstance(answers[-1], p.Error) and answers[-1].fatal, answers
        assert closed_by_daemon
        assert not finals - Counter(ids), f"answers to requests never sent: {finals - Counter(ids)}"
    else:
        assert finals == Counter(ids), f"sent {ids}, answered {finals}"


def test_the_harness_sees_a_fatal_error_for_a_garbage_frame(harness):
    stream = p.encode(p.Hello(id=0, version=p.PROTOCOL_VERSION)) + p.frame(b"\xc1") + p.encode(p.Stats(id=5))
    answers, reopened, closed = run_through_server(harness, [stream])
    assert [type(a) for a in answers] == [p.HelloOk, p.Error]
    assert answers[1].fatal and reopened == 0 and closed


def test_the_harness_sees_every_pipelined_answer(harness):
    stream = p.encode(p.Hello(id=0, version=p.PROTOCOL_VERSION)) + b"".join(
        p.encode(message) for message in (p.Tasks(id=1), p.Tasks(id=2), p.Stats(id=3),
                                          p.Reserve(id=4, worker="w", wait=0.001), p.Get(id=5, task_id="t1")))
    answers, reopened, closed = run_through_server(harness, [stream])
    # A reserve that waits (4) may be answered after the get, when its wait ends.
    assert sorted(a.id for a in answers) == [0, 1, 2, 3, 4, 5] and not closed, answers
    assert [a.id for a in answers][:4] == [0, 1, 2, 3], answers


def test_an_answer_the_daemon_sends_is_never_larger_than_the_body_bound():
    # The bound a client enforces (MAX_BODY_BYTES) must hold for the biggest
    # legal answer: a lease or task carrying a payload of MAX_FRAME_BYTES.
    payload = {"pad": "x" * (p.MAX_BODY_BYTES - 2 * 1024 * 1024)}
    lease = p.WireLease(task_id="t" * 1024, worker="w" * 1024, generation=2**63 - 1, deadline=2**63 - 1,
                        attempts=2**63 - 1, payload=payload)
    frame = p.encode(p.Leases(id=2**64 - 1, leases=[msgspec.Raw(p.encode_value(lease))], more=True))
    assert len(frame) - p.LENGTH_PREFIX_BYTES <= p.MAX_BODY_BYTES
