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

from walqueue import Queue
from walqueue import protocol as p
from walqueue.daemon import loop as loop_module
from walqueue.daemon.descriptors import LOG_INTERVAL_SECONDS, SpareDescriptor
from walqueue.daemon.service import DEFAULT_MAX_LEASE_SECONDS
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
    real_listener = loop.acceptor.listener
    loop.selector.unregister(real_listener)
    loop.acceptor.listener = FullTableListener(real_listener, failures=2)
    loop.selector.register(loop.acceptor.listener, selectors.EVENT_READ, loop_module._LISTENER)
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
    assert loop.acceptor.paused_until is None
    bystander.send(p.Put(id=1, task_id="after", payload={}))
    assert isinstance(bystander.answer(1), p.PutOk)
    assert isinstance(connect(), Client)
    lines = [record for record in caplog.records if "no free descriptor" in record.getMessage()]
    assert len(lines) == 1, "refusals within LOG_INTERVAL_SECONDS share one log line"
    loop.acceptor.listener = real_listener


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
                  # The longest lease the daemon grants (SPEC §8b); a clock jump makes longer ones.
                  p.Reserve(id=4, worker="w1", lease_seconds=DEFAULT_MAX_LEASE_SECONDS, limit=2))
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
    # with 64 waits each stalled a bystander 1.8 s (64 million checks). The cost
    # is counted in looks at the entries, not in seconds, which a busy machine stretches.
    from walqueue.daemon.service import Parked, ParkedReserves

    from .test_service import FakePeer

    class CountedParked(Parked):
        looks = 0

        def __getattribute__(self, name):
            CountedParked.looks += 1
            return super().__getattribute__(name)

    parked = ParkedReserves()
    peers = [FakePeer(f"p{index}") for index in range(1000)]
    for number in range(64):
        for peer in peers:
            parked.add(CountedParked(peer, p.Reserve(id=number, worker="w", wait=30), 30.0 + number, 1))
    CountedParked.looks = 0
    for peer in peers:
        dropped = parked.drop_peer(peer)
        assert [entry.request.id for entry in dropped] == list(range(64)) and peer.parked == 0
    looks = CountedParked.looks
    assert not parked and parked.head() is None and parked.next_deadline() is None
    # O(its own) a close: a few looks per entry, the checks above and the lazy clean-ups of the
    # queues included (7 each, now); O(all parked) each would be 1,000 times 32,000 on average.
    assert looks < 20 * 64_000, f"dropping 64,000 waits looked at them {looks} times"


# -- work per turn bounded in time (issue 20 item 3) ------------------------------------------


class PingRecorder:
    """A Notifier that records the fake clock's reading at each watchdog ping."""

    def __init__(self, clock, watchdog_seconds: float) -> None:
        self.clock = clock
        self.watchdog_seconds = watchdog_seconds
        self.pings: list[float] = [clock.monotonic]

    def notify(self, text: str) -> None:
        if text == "WATCHDOG=1":
            self.pings.append(self.clock.monotonic)


def costly(clock, seconds: float, function):
    """``function``, taking ``seconds`` of the fake clock at each call."""
    def call(*args):
        clock.advance(seconds)
        return function(*args)
    return call


def test_a_flood_of_costly_requests_is_spread_over_turns_so_the_watchdog_is_pinged_between(served):  # noqa: F811
    # Once a turn applied every request it had (up to 1,024 per connection):
    # 1,024 pipelined reports over 100k leases took one 39.8 s turn, and the
    # watchdog went unpinged for 64 s. Here each request costs 0.1 s.
    loop, clock, connect = served
    loop.notifier = PingRecorder(clock, watchdog_seconds=2.0)
    loop._next_watchdog = clock.monotonic + 2.0
    loop.service._handlers[p.Stats] = costly(clock, 0.1, loop.service._handlers[p.Stats])
    flooder, bystander = connect(), connect()
    flooder.send(*(p.Stats(id=number) for number in range(1, 201)))
    bystander.send(p.Get(id=7, task_id="nothing"))
    answered: list[int] = []
    turns = 0
    while len(answered) < 200 and turns < 1000:
        loop.one_turn()
        turns += 1
        flooder._read()
        answered += [answer.id for answer in flooder.answers]
        flooder.answers.clear()
        if turns == 2:
            assert bystander.has_answer(7), "the bystander is answered in the first turns, not after the flood"
    assert answered == list(range(1, 201)), "every request answered once, in order"
    per_turn = (loop_module.TURN_WORK_SECONDS // 0.1) + 1
    assert turns >= 200 / per_turn, turns
    pings = loop.notifier.pings
    gaps = [pings[index + 1] - pings[index] for index in range(len(pings) - 1)]
    # A ping is due every 2 s; a turn may overrun it by its work bound plus one request.
    assert len(gaps) >= 9 and max(gaps) <= 2.0 + loop_module.TURN_WORK_SECONDS + 0.1 + 1e-9, gaps


def test_a_backlog_deferred_by_the_time_bound_does_not_go_before_a_later_bystander(served):  # noqa: F811
    # A flooder that reads its answers has a backlog deferred turn after turn. Applied
    # first-come, that backlog filled every turn's TURN_WORK_SECONDS and a bystander who
    # arrived later waited for all of it (a stats call took over 5 s beside 2,000 costly gets).
    # Requests are applied one connection at a time, in rounds: the bystander goes in the first.
    loop, clock, connect = served
    loop.service._handlers[p.Stats] = costly(clock, 0.1, loop.service._handlers[p.Stats])
    flooder, bystander = connect(), connect()
    flooder.send(*(p.Stats(id=number) for number in range(1, 201)))
    loop.one_turn()   # reads the flood, applies what fits, defers the rest
    flooder._read()
    assert 0 < len(flooder.answers) < 200
    bystander.send(p.Stats(id=7))
    loop.one_turn()
    assert bystander.has_answer(7), "the bystander waited behind the flooder's backlog"


def test_reading_is_bounded_per_turn_and_what_was_left_unread_goes_first_next_turn(served):  # noqa: F811
    loop, clock, connect = served
    clients = [connect() for _ in range(8)]
    read: list[list] = []
    receive = loop._receive

    def timed_receive(conn, requests, monotonic_seconds):
        read[-1].append(conn)
        clock.advance(0.1)
        receive(conn, requests, monotonic_seconds)

    loop._receive = timed_receive
    for number, client in enumerate(clients):
        client.send(p.Stats(id=100 + number))
    answered = set()
    for _ in range(10):
        read.append([])
        loop.one_turn()
        answered |= {number for number, client in enumerate(clients) if client.has_answer(100 + number)}
    assert answered == set(range(8))
    busy = [turn for turn in read if turn]
    assert all(len(turn) <= 3 for turn in busy), [len(turn) for turn in busy]  # 0.25 s of 0.1 s reads
    first_turn = set(busy[0])
    assert set(busy[1][:8 - len(first_turn)]).isdisjoint(first_turn), "the unread go first"


# -- chained frame deadlines (issue 20 item 4) ------------------------------------------------


def fed(loop, sock: socket.socket, data: bytes | memoryview, max_turns: int = 400,
        *, whole: bool = True) -> memoryview:
    """Send ``data`` on a non-blocking socket, running turns while the kernel's buffer is full;
    what was not taken in ``max_turns`` (an error if ``whole``)."""
    view = memoryview(data)
    for _ in range(max_turns):
        try:
            view = view[sock.send(view):]
        except BlockingIOError:
            pass
        if not view:
            break
        loop.one_turn()
    assert not (whole and view), f"{len(view)} bytes not taken in {max_turns} turns"
    return view


@pytest.mark.parametrize("chained", [3, 6, 12])
def test_frames_far_from_done_cannot_chain_their_deadlines_to_starve_one_nearly_done(served, chained):  # noqa: F811
    # Once a waiting frame's deadline stopped, and started afresh when it could
    # read: K near-empty 17 MiB frames, filler to the budget, one more byte on
    # each but the first, and a bystander's 1.5 MB put_many waited K x ~25 s.
    from walqueue.daemon.connection import (
        FRAME_GRACE_SECONDS,
        LARGE_FRAME_BYTES,
        MIN_FRAME_BYTES_PER_SECOND,
        OVERDRAFT_BYTES,
        RESERVED_BYTES_PER_SECOND,
        RESERVED_GRACE_SECONDS,
        InputBudget,
    )

    loop, clock, connect = served
    loop.max_connections = 64
    loop.input_budget = InputBudget(max_bytes=3 * LARGE_FRAME_BYTES)
    chain = [connect() for _ in range(chained)]
    for conn in chain:
        conn.sock.sendall(struct.pack(">I", p.MAX_BODY_BYTES) + b"\x85")
    loop.one_turn()
    fillers = [connect() for _ in range(3)]
    for conn in fillers:  # all but their last byte: the budget is full
        fed(loop, conn.sock, struct.pack(">I", LARGE_FRAME_BYTES) + bytes(LARGE_FRAME_BYTES - 1))
    for _ in range(5):
        loop.one_turn()
    assert loop.input_budget.admitted_total >= loop.input_budget.max_bytes
    for conn in chain[1:]:
        conn.sock.sendall(b"\x00")
    loop.one_turn()
    bystander = connect()
    items = [p.PutItem(task_id=f"big-{index:05d}", payload={"pad": "x" * 60}) for index in range(15_000)]
    request = p.encode(p.PutMany(id=9, requests=items))
    assert len(request) > LARGE_FRAME_BYTES
    rest = fed(loop, bystander.sock, request, max_turns=20, whole=False)
    assert rest, "the bystander waits for room"
    # A frame of the chain that waited first was given room to complete, the whole
    # overdraft; unused, it is taken back, and the bystander lacks less than any
    # frame of the chain: whatever their number, it waits that long once.
    clock.advance(RESERVED_GRACE_SECONDS + OVERDRAFT_BYTES / RESERVED_BYTES_PER_SECOND)
    fed(loop, bystander.sock, rest)
    answer = bystander.answer(9)
    assert isinstance(answer, p.TaskIds) and len(answer.task_ids) == 15_000, answer
    (holder,) = [index for index, conn in enumerate(chain) if conn.has_answer(None)]
    cut = chain[holder].answer(None)
    assert cut.fatal and "given room to complete while others waited" in cut.message, cut
    # One deadline each from its length prefix, waiting included: all the rest of
    # the chain is cut at the same moment, not one after another.
    clock.advance(FRAME_GRACE_SECONDS + p.MAX_BODY_BYTES / MIN_FRAME_BYTES_PER_SECOND)
    loop.one_turn()
    for conn in chain[:holder] + chain[holder + 1:]:
        error = conn.answer(None)
        assert error.fatal and "not received in time" in error.message, error
    assert loop.input_budget.admitted_total == 0 and not loop.input_budget.waiting


# -- unread listings (issue 12 item 4; the process tests' bystanders, turn by turn) ------------


def test_unread_listings_cost_each_turn_a_bounded_share_and_a_bystander_is_answered_in_its_turn(
        served):  # noqa: F811
    # Once each listing sorted every id and encoded up to 8 MiB in the same turn, and a bystander
    # behind forty of them waited seconds. Counted here in what each turn did, not in seconds.
    from walqueue.daemon.connection import LISTING_BYTES_PER_TURN, MAX_LISTINGS_STARTED_PER_TURN

    loop, _, connect = served
    Queue.over(loop.queue).put_many([{"task_id": f"t{index:05d}", "payload": {"pad": "x" * 1000}}
                         for index in range(10_000)])  # ~10 MB a listing
    bystander = connect()
    listers = [connect() for _ in range(8)]  # with the bystander, within the fixture's 10 connections
    for lister in listers:
        lister.send(p.Tasks(id=2))  # never read
    listed = 0
    for number in range(20):
        bystander.send(p.Stats(id=100 + number))
        loop.one_turn()
        # Its stats is answered in the turn that read it, whatever the listings wait for.
        assert bystander.has_answer(100 + number), f"turn {number}"
        # At most one listing started, and one listing chunk past the turn's listing bytes.
        assert loop._listings_started <= MAX_LISTINGS_STARTED_PER_TURN, f"turn {number}"
        encoded = LISTING_BYTES_PER_TURN - loop.listing_budget.remaining_bytes
        assert encoded <= LISTING_BYTES_PER_TURN + p.CHUNK_BUDGET_BYTES + 4096, f"turn {number}: {encoded}"
        listed += encoded
    # Not vacuous: the listings went on meanwhile, a turn's share at a time.
    assert listed > 10 * LISTING_BYTES_PER_TURN


@pytest.mark.parametrize("requests, expected", [
    ([("a", 1), ("b", 1), ("c", 1)], [("a", 1), ("b", 1), ("c", 1)]),   # one each: as they came
    ([("a", 1), ("a", 2), ("a", 3), ("b", 1), ("c", 1), ("b", 2)],
     [("a", 1), ("b", 1), ("c", 1), ("a", 2), ("b", 2), ("a", 3)]),   # a backlog: in rounds
    ([], []),
])
def test_a_turns_requests_are_applied_one_connection_at_a_time_in_rounds(requests, expected):
    assert list(loop_module._in_rounds(requests)) == expected
