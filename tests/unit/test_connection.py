"""walqueued's per-connection parts without a loop: framing and hello, admission, deferral."""

import socket
import struct

import pytest

import walqueue
from walqueue import protocol
from walqueue.daemon import connection as connection_module
from walqueue.daemon.connection import (
    MAX_ADMITTED_INPUT_BYTES,
    OUTPUT_HIGH_WATER_BYTES,
    Connection,
    ConnectionFault,
    InputBudget,
    ListingBudget,
)


def a_connection(length=None):
    conn = Connection(sock=None, name="test")
    if length is not None:
        conn.reader.max_body_bytes = protocol.MAX_BODY_BYTES
        conn.reader.feed(struct.pack(">I", length) + b"x" * 10)
    return conn


def test_large_frames_are_admitted_only_while_they_fit_in_the_input_budget():
    budget = InputBudget()
    size = MAX_ADMITTED_INPUT_BYTES // 2 + 1  # two do not fit together
    first, second, small = a_connection(size), a_connection(size), a_connection(100)
    assert budget.admit(first) and first.admitted == size
    assert not budget.admit(second) and second.admitted == 0
    assert budget.admit(small) and small.admitted == 0  # small frames need no room
    first.reader = protocol.FrameReader()  # its frame completed
    assert budget.admit(first) and budget.admitted_total == 0
    assert budget.admit(second) and budget.admitted_total == size
    budget.release(second)
    assert budget.admitted_total == 0


@pytest.mark.parametrize("version, reported", [(1, ""), (2, walqueue.__version__)])
def test_the_hello_is_answered_in_its_version_and_raises_the_body_bound(version, reported):
    conn = a_connection()
    conn.reader.feed(protocol.encode(protocol.Hello(id=7, version=version, client="me"))
                     + protocol.encode(protocol.Stats(id=8)))
    requests = []
    conn.decode(requests, InputBudget())
    assert requests == [(conn, protocol.Stats(id=8))]
    answer = protocol.decode_response(bytes(conn.out[4:]))
    assert (answer.id, answer.version, answer.walqueue_version) == (7, version, reported)
    assert conn.protocol_version == version
    assert conn.greeted and conn.reader.max_body_bytes == protocol.MAX_BODY_BYTES
    assert "client='me'" in conn.name


@pytest.mark.parametrize("stream, complaint", [
    (protocol.encode(protocol.Stats(id=1)), "expected hello first"),
    (protocol.encode(protocol.Hello(id=1, version=max(protocol.DAEMON_PROTOCOL_VERSIONS) + 1)), "version"),
    (protocol.encode(protocol.Hello(id=1, version=protocol.PROTOCOL_VERSION)) * 2, "hello sent twice"),
    (protocol.frame(b"\xc1"), "undecodable"),
])
def test_a_protocol_violation_is_a_fault_naming_it(stream, complaint):
    conn = a_connection()
    conn.reader.feed(stream)
    with pytest.raises(ConnectionFault, match=complaint):
        conn.decode([], InputBudget())


def test_a_connection_is_saturated_by_unsent_answers_or_its_share_of_a_turn(monkeypatch):
    conn = a_connection()
    assert not conn.saturated(turn=1)
    conn.answer_bytes = OUTPUT_HIGH_WATER_BYTES  # produced this turn, not delivered yet
    assert conn.saturated(turn=1)
    conn.delivered_bytes = OUTPUT_HIGH_WATER_BYTES
    assert not conn.saturated(turn=1)
    conn.turn_requests = connection_module.MAX_REQUESTS_PER_TURN_PER_CONNECTION
    assert conn.saturated(turn=1)
    assert not conn.saturated(turn=2)  # a new turn, a new share


def test_answers_beyond_the_high_water_mark_wait_in_the_backlog_in_order():
    conn = a_connection()
    big = b"x" * OUTPUT_HIGH_WATER_BYTES
    conn.deliver(1, big)
    conn.deliver(2, b"second")
    assert bytes(conn.out) == big and len(conn.backlog) == 1
    assert not conn.can_resume()
    del conn.out[:]
    conn.fill(ListingBudget())
    assert bytes(conn.out) == b"second" and conn.can_resume()


def test_gone_sees_a_closed_peer_without_consuming_its_bytes():
    ours, theirs = socket.socketpair()
    try:
        conn = Connection(sock=ours, name="test")
        theirs.sendall(b"abc")
        assert not conn.gone()
        assert ours.recv(3) == b"abc"  # nothing was consumed
        theirs.close()
        assert conn.gone()
    finally:
        ours.close()
