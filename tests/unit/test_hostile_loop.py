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
from walqueue.metrics import render_prometheus

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


# -- the clock (issue 12 item 6) --------------------------------------------------------------

YEAR_SECONDS = 365 * 24 * 3600


def test_a_wall_clock_step_neither_stretches_nor_cuts_a_lease(served):  # noqa: F811
    # Once now = max(int(wall), last_now): a clock set a year ahead ended every
    # lease at once, then gave new leases a year's length until real time caught up.
    loop, clock, connect = served
    client = connect()
    client.send(p.Put(id=1, task_id="before", payload={}), p.Put(id=2, task_id="during", payload={}),
                p.Reserve(id=3, worker="w", lease_seconds=30))
    client.answer(1), client.answer(2)
    (before,) = client.answer(3).leases
    clock.wall += YEAR_SECONDS  # the wall clock jumps a year ahead...
    clock.monotonic += 10
    client.send(p.Reserve(id=4, worker="w", lease_seconds=30))
    (during,) = client.answer(4).leases
    assert during.deadline == before.deadline + 10, "a lease taken during the jump lasts 30 s, not a year"
    assert loop.queue.get("before").status == "leased", "the jump did not end the earlier lease"
    clock.wall -= YEAR_SECONDS + 3600  # ...and is set back, past the true time
    clock.advance(19.5)
    loop.one_turn()
    assert loop.queue.get("before").status == "leased"
    clock.advance(0.5)  # 30 s of real time after the first lease was granted
    loop.one_turn()
    assert loop.queue.get("before").status == "ready" and loop.queue.get("during").status == "leased"
    clock.advance(10)
    loop.one_turn()
    assert loop.queue.get("during").status == "ready"
    report = loop.report(loop.now())
    assert report.clock_steps_total == 2
    assert report.clock_offset_seconds == pytest.approx(-3600 - 10)  # the wall clock stood still 10 s
    assert "walqueue_clock_steps_total 2" in render_prometheus(report)


def test_a_suspend_neither_delays_due_work_nor_stretches_a_lease(served):  # noqa: F811
    # Issue 20 item 13: now followed CLOCK_MONOTONIC, which stops while the
    # machine is suspended, so after a 120 s suspend a task put with a delay of
    # 5 s (the client's wall clock + 5) became due after 125 s, and every lease
    # of the run lasted 120 s too long.
    loop, clock, connect = served
    client = connect()
    client.send(p.Put(id=1, task_id="leased", payload={}), p.Reserve(id=2, worker="w", lease_seconds=30))
    client.answer(1)
    (lease,) = client.answer(2).leases
    clock.advance(10)
    clock.suspend(120)  # wall and boot clocks move on, the monotonic clock does not
    loop.one_turn()
    assert loop.queue.get("leased").status == "ready", "the lease ended during the suspend"
    client.send(p.Touch(id=3, task_id="leased", worker="w", generation=lease.generation, lease_seconds=30))
    assert client.answer(3).error == "StaleLease"
    client.send(p.Put(id=4, task_id="delayed", payload={}, available_at=int(clock.wall) + 5))
    client.answer(4)
    clock.advance(5)
    client.send(p.Reserve(id=5, worker="w", limit=2))
    assert sorted(lease.task_id for lease in client.answer(5).leases) == ["delayed", "leased"]
    report = loop.report(loop.now())
    assert report.clock_steps_total == 0  # the wall clock did not step: it counted the suspend too


def test_force_release_ends_current_leases_by_task_id_with_ordinary_release_records(served):  # noqa: F811
    from tests.unit.frames import wal_records

    loop, clock, connect = served
    operator = connect()
    operator.send(p.Put(id=1, task_id="a", payload={}), p.Put(id=2, task_id="b", payload={}, max_attempts=1),
                  p.Put(id=3, task_id="idle", payload={}),
                  p.Reserve(id=4, worker="w1", lease_seconds=YEAR_SECONDS, limit=2))
    for request_id in (1, 2, 3):
        operator.answer(request_id)
    leases = {lease.task_id: lease for lease in operator.answer(4).leases}
    last_seq = loop.queue.stats().last_seq
    # Not leased (or unknown): refused, nothing written.
    operator.send(p.ForceRelease(id=5, task_ids=["a", "idle"]), p.ForceRelease(id=6, task_ids=["nope"]))
    for request_id, status in ((5, "ready"), (6, "unknown")):
        error = operator.answer(request_id)
        assert error.error == "InvalidRequest" and f"is {status}, not leased" in error.message, error
    assert loop.queue.stats().last_seq == last_seq
    operator.send(p.ForceRelease(id=7, task_ids=["a", "b", "a"]))
    assert operator.answer(7) == p.TaskIds(id=7, task_ids=["a", "b"])
    assert (loop.queue.get("a").status, loop.queue.get("b").status) == ("ready", "dead")
    releases = wal_records(loop.directory)[-2:]
    assert [(r["op"], r["task_id"], r["worker"], r["generation"], r["delay"]) for r in releases] == [
        ("release", task_id, "w1", leases[task_id].generation, 0) for task_id in ("a", "b")]
    # The worker that held it has lost it, as after any release.
    operator.send(p.Ack(id=8, task_id="a", worker="w1", generation=leases["a"].generation))
    assert operator.answer(8).error == "StaleLease"


# -- many connections closing with parked reserves (issue 12 item 8) ------------------------


def test_closing_a_thousand_connections_with_64_waits_each_costs_each_its_own_waits():
    # Once every close scanned every parked reserve: 1,000 closing connections
    # with 64 waits each stalled a bystander 1.8 s (64 million checks).
    import time

    from walqueue.daemon.service import Parked, ParkedReserves

    from .test_service import FakePeer

    parked = ParkedReserves()
    peers = [FakePeer(f"p{index}") for index in range(1000)]
    for number in range(64):
        for peer in peers:
            parked.add(Parked(peer, p.Reserve(id=number, worker="w", wait=30), 30.0 + number, 1))
    started = time.perf_counter()
    for peer in peers:
        dropped = parked.drop_peer(peer)
        assert [entry.request.id for entry in dropped] == list(range(64)) and peer.parked == 0
    elapsed = time.perf_counter() - started
    assert not parked and parked.head() is None and parked.next_deadline() is None
    assert elapsed < 1.0, f"dropping 64,000 waits took {elapsed:.2f} s"  # O(all) each: ~10 s here
