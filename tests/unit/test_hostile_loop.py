"""Hostile inputs against walqueued's loop in-process, on a fake clock (issue 12).

The process-level hostile suite is tests/process/test_hostile.py; these are
the cases a real daemon cannot show cheaply or deterministically: a
descriptor table that is full, a clock that jumps, a thousand connections
closing at once.
"""

from __future__ import annotations

import errno
import selectors
import socket
import struct

import pytest

from walqueue import protocol as p
from walqueue.daemon import loop as loop_module
from walqueue.daemon.descriptors import LOG_INTERVAL_SECONDS, SpareDescriptor

from .test_loop import Client, served  # noqa: F401 (a fixture)


class FullTableListener:
    """A listener whose descriptor table is full ``failures`` times: accept fails with EMFILE,
    and the next one, after the spare descriptor was closed, succeeds."""

    def __init__(self, listener: socket.socket, failures: int) -> None:
        self.listener = listener
        self.failures = failures
        self.full = True

    def fileno(self) -> int:
        return self.listener.fileno()

    def accept(self):
        if self.failures and self.full:
            self.failures -= 1
            self.full = False
            raise OSError(errno.EMFILE, "Too many open files")
        self.full = True
        return self.listener.accept()

    def close(self) -> None:
        self.listener.close()


def test_emfile_on_accept_refuses_that_connection_and_keeps_serving(served, caplog):  # noqa: F811
    loop, clock, connect = served
    bystander = connect()
    real_listener = loop.listener
    loop.selector.unregister(real_listener)
    loop.listener = FullTableListener(real_listener, failures=2)
    loop.selector.register(loop.listener, selectors.EVENT_READ, loop_module._LISTENER)
    refused = []
    for _ in range(2):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(real_listener.getsockname())
        refused.append(sock)
    for _ in range(3):
        loop.one_turn()
    for sock in refused:  # accepted and closed at once: the peer sees the end of the stream
        sock.settimeout(5)
        assert sock.recv(10) == b""
        sock.close()
    # The listener was never paused, and the daemon serves on.
    assert loop._accept_paused_until is None
    bystander.send(p.Put(id=1, task_id="after", payload={}))
    assert isinstance(bystander.answer(1), p.PutOk)
    assert isinstance(connect(), Client)
    lines = [record for record in caplog.records if "no free descriptor" in record.getMessage()]
    assert len(lines) == 1, "refusals within LOG_INTERVAL_SECONDS share one log line"
    loop.listener = real_listener


def test_the_refusal_log_is_rate_limited_and_counts_what_it_left_out(caplog):
    spare = SpareDescriptor()
    try:
        listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        listener.bind(f"\0walqueue-test-spare-{id(spare)}")
        listener.listen(8)
        error = OSError(errno.EMFILE, "Too many open files")
        peers = []
        for moment in (0.0, 1.0, 2.0, LOG_INTERVAL_SECONDS + 0.5):
            peer = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            peer.connect(listener.getsockname())
            peers.append(peer)
            assert spare.refuse_one(listener, moment, error)
        messages = [record.getMessage() for record in caplog.records]
        assert len(messages) == 2 and "(3 since the last such line, 4 in all)" in messages[1], messages
        for peer in peers:
            peer.close()
        listener.close()
    finally:
        spare.close()


def test_a_frame_left_half_sent_is_cut_at_its_deadline_with_an_error_saying_why(served):  # noqa: F811
    from walqueue.daemon.connection import FRAME_GRACE_SECONDS, MIN_FRAME_BYTES_PER_SECOND

    loop, clock, connect = served
    slow, bystander = connect(), connect()
    length = 2 * MIN_FRAME_BYTES_PER_SECOND
    slow.sock.sendall(struct.pack(">I", length) + b"\x85")
    loop.one_turn()
    deadline = FRAME_GRACE_SECONDS + length / MIN_FRAME_BYTES_PER_SECOND
    assert loop.timer_seconds() == pytest.approx(deadline)
    clock.advance(deadline - 0.5)
    slow.sock.sendall(b"\x00" * 1000)  # more bytes do not move the deadline
    loop.one_turn()
    bystander.send(p.Stats(id=1))
    assert isinstance(bystander.answer(1), p.StatsOk)
    clock.advance(0.5)
    loop.one_turn()
    error = slow.answer(None)
    assert error.fatal and "not received in time" in error.message and "1005 bytes arrived" in error.message
    assert loop.frame_deadlines.next_deadline() is None
