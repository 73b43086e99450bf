"""walqueued's per-connection parts without a loop: framing and hello, admission, deferral."""

import selectors
import socket
import struct

import pytest

import walqueue
from walqueue import protocol
from walqueue.daemon import connection as connection_module
from walqueue.daemon.connection import (
    LARGE_FRAME_BYTES,
    OUTPUT_HIGH_WATER_BYTES,
    PEER_OPEN,
    PEER_SHUT,
    ConnectionFault,
    InputBudget,
    ListingBudget,
    PeerConnection,
    Selector,
)


def a_connection(length=None):
    conn = PeerConnection(sock=None, name="test")
    if length is not None:
        conn.reader.max_body_bytes = protocol.MAX_BODY_BYTES
        conn.reader.feed(struct.pack(">I", length) + b"x" * 10)
    return conn


def test_the_input_budget_counts_received_bytes_not_declared_ones():
    # Declaring a length costs nothing: fifteen idle 17 MiB prefixes once held
    # the whole budget. Only what arrived counts.
    budget = InputBudget()
    idle = [a_connection(protocol.MAX_BODY_BYTES) for _ in range(15)]
    assert all(budget.admit(conn) for conn in idle)
    assert budget.admitted_total == 15 * 14  # prefix and ten bytes each
    assert budget.admit(a_connection(LARGE_FRAME_BYTES))


def test_a_full_budget_lets_the_frames_nearest_completion_read_on_as_far_as_the_overdraft_goes():
    budget = InputBudget(max_bytes=30, overdraft_bytes=LARGE_FRAME_BYTES * 5 // 2)
    first, second, third, far = (a_connection(LARGE_FRAME_BYTES), a_connection(LARGE_FRAME_BYTES),
                                 a_connection(LARGE_FRAME_BYTES), a_connection(protocol.MAX_BODY_BYTES))
    assert budget.admit(far) and budget.admit(first)  # 14 + 14 received: room left
    for conn, more in ((first, 10), (second, 20), (third, 0)):
        conn.reader.feed(b"y" * more)
        assert not budget.admit(conn) and conn.input_waiting, "the budget is full"
    far.reader.feed(b"y")
    assert not budget.admit(far)
    assert budget.admit(a_connection(100)), "small frames need no room"
    # The nearest completion first, while what they lack fits the overdraft (2.5 MiB):
    # two frames lacking about 1 MiB do, the third does not, and the 17 MiB one waits.
    ready = budget.grant(monotonic_seconds=100.0)
    assert ready == [second, first] and budget.waiting == {third, far}
    assert second.reserved == second.reader.wanted_bytes() == LARGE_FRAME_BYTES + 4 - 34
    assert second.reserved_deadline_seconds == pytest.approx(
        100.0 + connection_module.RESERVED_GRACE_SECONDS + second.reserved / connection_module.RESERVED_BYTES_PER_SECOND)
    second.reader.feed(b"z" * 1000)
    assert budget.admit(second), "room reserved: it reads on though the budget is full"
    assert budget.grant(monotonic_seconds=100.5) == [], "the overdraft is taken"
    second.reader.feed(b"z" * second.reader.wanted_bytes())  # its frame is in
    assert second.reader.next_body() is not None and second.reader.frames_done == 1
    assert budget.admit(second) and second.reserved == 0 and budget.reserved_total == first.reserved
    assert budget.grant(monotonic_seconds=101.0) == [third]
    for conn in (first, third, far):
        budget.release(conn)
    assert (budget.admitted_total, budget.reserved_total, budget.waiting) == (0, 0, set())


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


@pytest.mark.skipif(Selector is selectors.DefaultSelector, reason="needs epoll")
def test_the_selector_tells_a_peer_that_shut_its_end_from_one_that_did_not():
    open_ours, open_theirs = socket.socketpair()
    shut_ours, shut_theirs = socket.socketpair()
    writing_ours, writing_theirs = socket.socketpair()
    selector = Selector()
    try:
        open_theirs.sendall(b"x")
        shut_theirs.sendall(b"request")
        shut_theirs.shutdown(socket.SHUT_WR)  # the request and the end of stream arrive together
        writing_theirs.close()
        selector.register(open_ours, selectors.EVENT_READ, "open")
        selector.register(shut_ours, selectors.EVENT_READ | selectors.EVENT_WRITE, "shut")
        selector.register(writing_ours, selectors.EVENT_WRITE, "writing")  # not watched for reading
        masks = {key.data: mask for key, mask in selector.select(0)}
        assert masks["open"] == selectors.EVENT_READ | PEER_OPEN
        assert masks["shut"] == selectors.EVENT_READ | selectors.EVENT_WRITE | PEER_SHUT
        assert not masks["writing"] & (PEER_OPEN | PEER_SHUT)
    finally:
        selector.close()
        for sock in (open_ours, open_theirs, shut_ours, shut_theirs, writing_ours):
            sock.close()


def test_gone_trusts_what_this_turns_poll_saw_and_peeks_otherwise():
    ours, theirs = socket.socketpair()
    try:
        conn = PeerConnection(sock=ours, name="test")
        theirs.close()
        conn.peer_open_at_poll = True  # the poll saw it open: no syscall, whatever happened since
        assert not conn.gone()
        conn.peer_open_at_poll = False
        assert conn.gone()
        conn.peer_open_at_poll = None  # not seen this turn: it peeks
        assert conn.gone()
    finally:
        ours.close()


def test_gone_sees_a_closed_peer_without_consuming_its_bytes():
    ours, theirs = socket.socketpair()
    try:
        conn = PeerConnection(sock=ours, name="test")
        theirs.sendall(b"abc")
        assert not conn.gone()
        assert ours.recv(3) == b"abc"  # nothing was consumed
        theirs.close()
        assert conn.gone()
    finally:
        ours.close()


def decoded(frames: bytes) -> list:
    reader = protocol.FrameReader()
    reader.feed(frames)
    messages = []
    while (body := reader.next_body()) is not None:
        messages.append(protocol.decode_response(body))
    return messages


def test_an_answer_the_wire_cannot_carry_is_one_error_from_the_service_and_from_a_listing(tmp_path):
    from walqueue.daemon.service import QueueService
    from walqueue.engine import Engine

    unencodable = protocol.PutOk(id=5, task_id=object())  # msgspec cannot encode it
    peer = a_connection()
    peer.protocol_version = protocol.ERROR_CODE_VERSION
    service = QueueService(Engine(tmp_path / "q"), compact=lambda *_: None, report=lambda now: None)
    service.answer(peer, 5, [unencodable])
    (from_service,) = decoded(service.outbox[0].messages)
    # A listing: its first chunk goes, the one that cannot be encoded ends it, the rest never goes.
    peer.backlog.append((6, iter([protocol.TaskList(6, [], True), unencodable, protocol.TaskList(6, [])]), True))
    peer.fill(ListingBudget())
    first, from_listing = decoded(bytes(peer.out))
    assert first == protocol.TaskList(6, [], True) and not peer.backlog
    for error, request_id in ((from_service, 5), (from_listing, 6)):
        assert (error.id, error.error, error.code) == (request_id, "InvalidRequest", "unsendable_answer")
        assert error.message == from_service.message and error.message.startswith("the answer cannot be sent")
    service.queue.close()
