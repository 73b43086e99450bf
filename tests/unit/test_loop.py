"""walqueued's loop in-process on a fake clock: turns driven one by one, real sockets, no sleeps.

The loop takes its time from an injected clock, so a test sets the wall and
monotonic seconds itself: a wait, a delay or a lease deadline "passes" when
the test moves the clock, and the loop's select timeout (its timer) can be
read before it does.
"""

from __future__ import annotations

import contextlib
import logging
import socket
import time

import msgspec
import pytest

from walqueue import protocol as p
from walqueue.daemon.clock import DaemonNow
from walqueue.daemon.loop import Loop, bind_listener
from walqueue.daemon.systemd import Notifier
from walqueue.daemon.turn_timer import TurnTimer
from walqueue.engine import Engine

MAX_TURNS = 200


class FakeClock:
    """The wall, monotonic and boot clocks; the boot clock is the monotonic one plus `suspended`."""

    def __init__(self, wall_seconds: float = 1_000_000.0) -> None:
        self.wall = wall_seconds
        self.monotonic = 0.0
        self.suspended = 0.0

    def wall_seconds(self) -> float:
        return self.wall

    def monotonic_seconds(self) -> float:
        return self.monotonic

    def boot_seconds(self) -> float:
        return self.monotonic + self.suspended

    def advance(self, seconds: float) -> None:
        self.wall += seconds
        self.monotonic += seconds

    def suspend(self, seconds: float) -> None:
        """The machine sleeps: the wall and boot clocks move on, the monotonic clock stands still."""
        self.wall += seconds
        self.suspended += seconds


class Client:
    """A raw client socket speaking the wire protocol to the loop under test."""

    def __init__(self, path: str, loop: Loop, version: int = p.PROTOCOL_VERSION) -> None:
        self.loop = loop
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.sock.setblocking(False)
        self.reader = p.FrameReader()
        self.answers: list = []
        self.send(p.Hello(id=0, version=version))
        assert isinstance(self.answer(0), p.HelloOk)

    def send(self, *messages) -> None:
        self.sock.sendall(b"".join(p.encode(message) for message in messages))

    def _read(self) -> None:
        try:
            while chunk := self.sock.recv(1 << 16):
                self.reader.feed(chunk)
        except BlockingIOError:
            pass
        while (body := self.reader.next_body()) is not None:
            self.answers.append(p.decode_response(body))

    def answer(self, request_id: int):
        """Run turns until the answer to ``request_id`` is in (bounded)."""
        for _ in range(MAX_TURNS):
            self._read()
            for answer in self.answers:
                if answer.id == request_id:
                    self.answers.remove(answer)
                    return answer
            self.loop.one_turn()
        raise AssertionError(f"no answer to request {request_id} in {MAX_TURNS} turns")

    def has_answer(self, request_id: int) -> bool:
        self._read()
        return any(answer.id == request_id for answer in self.answers)

    def close(self) -> None:
        self.sock.close()


@contextlib.contextmanager
def serving(tmp_path, clock: FakeClock, hook=None, **loop_options):
    """(loop, clock, connect): a Loop on `clock` whose turns never block; `hook` goes to its Queue,
    `loop_options` to the Loop."""
    queue = Engine(tmp_path / "queue", hook=hook, filesystem=loop_options.get("filesystem"))
    path = str(tmp_path / "s.sock")
    listener = bind_listener(path, 0o600)
    loop = Loop(str(tmp_path / "queue"), queue, listener, socket_path=path, compact_wal_bytes=10**12,
                max_connections=10, hook=None, notifier=Notifier({}), clock=clock, **loop_options)
    loop.register_listener()
    loop.timer_seconds = loop._timeout  # the real timer, for the tests to read
    loop._timeout = lambda: 0.0  # the test drives the turns
    clients: list[Client] = []

    def connect(version: int = p.PROTOCOL_VERSION) -> Client:
        client = Client(path, loop, version)
        clients.append(client)
        return client

    try:
        yield loop, clock, connect
    finally:
        for client in clients:
            client.close()
        loop.close_without_serving()  # first: it kills a snapshot child and abandons its compaction
        loop.queue.close()
        listener.close()


@pytest.fixture
def served(tmp_path):
    """(loop, clock, connect): a Loop on a fake clock whose turns never block."""
    with serving(tmp_path, FakeClock()) as served:
        yield served


def test_the_clock_is_whole_seconds_and_never_goes_backwards():
    clock = FakeClock(wall_seconds=100.9)
    now = DaemonNow(clock)
    readings = []
    for monotonic, wall in ((0.0, 100.9), (0.05, 99.2), (0.1, 101.0), (0.2, 50.0), (1.1, 102.0)):
        clock.monotonic, clock.wall = monotonic, wall
        readings.append(now())
    # It follows the boot clock from the wall clock at start, whatever the wall clock does after.
    assert readings == [100, 100, 101, 101, 102]


def test_now_follows_the_boot_clock_through_a_suspend_and_a_suspend_is_no_step():
    # On the monotonic clock, which stops while the machine sleeps, a 120 s
    # suspend left now 120 s behind for the rest of the run, and was counted
    # as a wall-clock step.
    clock = FakeClock(wall_seconds=1000.0)
    now = DaemonNow(clock)
    assert now() == 1000
    clock.suspend(120)
    assert now() == 1120 and now.steps == 0 and now.offset_seconds == 0
    clock.advance(5)
    assert now() == 1125


def test_the_system_clock_counts_a_suspend_where_the_kernel_can(monkeypatch):
    from walqueue.daemon import clock as daemon_clock

    if not hasattr(time, "CLOCK_BOOTTIME"):
        assert daemon_clock._boot_seconds is time.monotonic
        return
    readings = {time.CLOCK_BOOTTIME: 5000.0, time.CLOCK_MONOTONIC: 3000.0}
    monkeypatch.setattr(daemon_clock.time, "clock_gettime", readings.__getitem__)
    assert daemon_clock.SystemClock().boot_seconds() == 5000.0


def test_the_report_counts_the_slow_turns_and_the_longest_one(served):
    loop, _, connect = served
    client = connect(p.TURN_REPORTING_VERSION)
    client.send(p.DaemonStatsReq(id=1))
    assert client.answer(1).stats.slow_turns_total == 0
    # Every turn from here on is over this timer's bound, as a turn over 100 ms is over the real one's.
    loop.turn_timer = TurnTimer(slow_seconds=-1.0, clock=time.perf_counter)   # a real turn takes > 0 s
    client.send(p.Put(id=2, task_id="job", payload={}))
    client.answer(2)   # its turn has ended, and counted
    client.send(p.DaemonStatsReq(id=3))
    stats = client.answer(3).stats
    assert stats.slow_turns_total >= 1 and stats.longest_turn_seconds > 0
    older = connect(p.COMPACTION_REPORTING_VERSION)
    older.send(p.DaemonStatsReq(id=4))
    assert older.answer(4).stats.slow_turns_total == 0   # version 4 does not carry them


def test_a_slow_turn_says_how_much_of_it_was_the_wal_fsync(tmp_path, caplog):
    # The fsync "takes" 250 ms of the loop's clock (a hook at wal.after_sync moves it); the
    # turn's line names that share, so a slow disk is told apart from a slow loop.
    clock = FakeClock()

    def slow_sync(phase: str) -> None:
        if phase == "wal.after_sync":
            clock.advance(0.25)

    with serving(tmp_path, clock, hook=slow_sync) as (loop, _, connect):
        # Every turn is logged. The loop's own timer reads the loop's clock, which moves only in
        # the hook here, so the line reads the same however fast the real turn and fsync were.
        loop.turn_timer.slow_seconds = -1.0
        client = connect()
        with caplog.at_level(logging.WARNING, logger="walqueued"):
            client.send(p.Put(id=1, task_id="job", payload={}))
            client.answer(1)
    assert any("applying and fsync" in record.getMessage() and "(fsync 250 ms)" in record.getMessage()
               for record in caplog.records), [record.getMessage() for record in caplog.records]


def test_a_waiting_reserve_is_woken_by_a_put_from_another_connection(served):
    loop, clock, connect = served
    waiter, producer = connect(), connect()
    # Requests of one connection are applied in order: once the stats answer
    # is in, the reserve before it has been handled, and it is waiting.
    waiter.send(p.Reserve(id=1, worker="w", wait=30), p.Stats(id=2))
    waiter.answer(2)
    assert not waiter.has_answer(1) and loop.service.parked.live == 1
    producer.send(p.Put(id=3, task_id="job", payload={}))
    assert isinstance(producer.answer(3), p.PutOk)
    answer = waiter.answer(1)
    assert [lease.task_id for lease in answer.leases] == ["job"]


def test_waiting_reserves_are_served_in_arrival_order_across_connections(served):
    loop, clock, connect = served
    first, second, producer = connect(), connect(), connect()
    for client, request_id in ((first, 1), (second, 2)):
        client.send(p.Reserve(id=request_id, worker=f"w{request_id}", wait=30), p.Stats(id=100 + request_id))
        client.answer(100 + request_id)
    producer.send(p.Put(id=3, task_id="one", payload={}))
    assert [lease.task_id for lease in first.answer(1).leases] == ["one"]
    assert not second.has_answer(2)
    producer.send(p.Put(id=4, task_id="two", payload={}))
    assert [lease.task_id for lease in second.answer(2).leases] == ["two"]


def test_a_wait_ends_when_the_clock_says_so_and_the_timer_points_there(served):
    loop, clock, connect = served
    waiter = connect()
    waiter.send(p.Reserve(id=1, worker="w", wait=5), p.Stats(id=2))
    waiter.answer(2)
    assert loop.timer_seconds() == pytest.approx(5.0)
    clock.advance(4.9)
    loop.one_turn()
    assert not waiter.has_answer(1)
    clock.advance(0.1)
    assert waiter.answer(1) == p.Leases(id=1, leases=[])


def test_an_expired_lease_is_reaped_at_its_deadline_without_any_reserve(served):
    loop, clock, connect = served
    client = connect()
    client.send(p.Put(id=1, task_id="job", payload={}, max_attempts=1),
                p.Reserve(id=2, worker="w", lease_seconds=5))
    client.answer(1)
    (lease,) = client.answer(2).leases
    last_seq = loop.queue.stats().last_seq
    # The timer is the lease deadline (and 1 ms, so that whole seconds have reached it).
    assert loop.timer_seconds() == pytest.approx(lease.deadline - clock.wall + 0.001)
    clock.advance(lease.deadline - clock.wall - 0.5)
    loop.one_turn()
    assert loop.queue.get("job").status == "leased"
    clock.advance(0.5)
    loop.one_turn()
    view = loop.queue.get("job")
    assert (view.status, view.worker, view.deadline) == ("dead", None, None)
    assert loop.queue.stats().last_seq == last_seq + 1  # one expire frame, nothing else
    client.send(p.Tasks(id=3, status="dead"))
    assert [task.task_id for task in client.answer(3).tasks] == ["job"]
    assert loop.timer_seconds() is None  # nothing is due: the loop sleeps until an event


def test_a_reserve_read_with_the_end_of_its_stream_leases_nothing_and_one_read_beside_it_leases(served):
    loop, clock, connect = served
    producer, leaver, stayer = connect(), connect(), connect()
    producer.send(p.Put(id=1, task_id="a", payload={}), p.Put(id=2, task_id="b", payload={}))
    producer.answer(2)
    # One turn reads both: the poll sees one peer's end shut, the other's open.
    leaver.send(p.Reserve(id=3, worker="leaver"))
    leaver.sock.shutdown(socket.SHUT_WR)
    stayer.send(p.Reserve(id=4, worker="stayer"))
    assert leaver.answer(3) == p.Leases(id=3, leases=[])
    assert [lease.task_id for lease in stayer.answer(4).leases] == ["a"]
    assert loop.queue.get("b").status == "ready"


def msgspec_map(*pairs) -> bytes:
    """A msgpack map with exactly these (key, value) pairs, a key twice included."""
    return bytes([0x80 | len(pairs)]) + b"".join(msgspec.msgpack.encode(key) + msgspec.msgpack.encode(value)
                                                 for key, value in pairs)


def raw_answers(loop: Loop, sock: socket.socket, count: int) -> list[bytes]:
    """The next ``count`` answer bodies on ``sock``, running turns until they are in (bounded)."""
    reader, bodies = p.FrameReader(), []
    sock.setblocking(False)
    for _ in range(MAX_TURNS):
        loop.one_turn()
        with contextlib.suppress(BlockingIOError):
            while chunk := sock.recv(1 << 16):
                reader.feed(chunk)
        while (body := reader.next_body()) is not None:
            bodies.append(body)
        if len(bodies) >= count:
            return bodies
    raise AssertionError(f"{len(bodies)} of {count} answers in {MAX_TURNS} turns")


def test_errors_carry_their_code_only_to_clients_that_announced_version_6(served, tmp_path):
    loop, _, _ = served
    stale = p.Ack(id=1, task_id="nobody", worker="w", generation=1)
    twice = msgspec_map(("type", "get"), ("id", 2), ("task_id", "a"), ("task_id", "b"))
    unknown = p.encode_value({"type": "frobnicate", "id": 3, "task_id": "t"})   # a newer client's request
    for version in (p.TURN_REPORTING_VERSION, p.ERROR_CODE_VERSION):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(tmp_path / "s.sock"))
        sock.sendall(p.encode(p.Hello(id=0, version=version)) + p.encode(stale) + p.frame(twice)
                     + p.frame(unknown))
        bodies = raw_answers(loop, sock, 4)[1:]
        sock.close()
        answers = [p.decode_response(body) for body in bodies]
        assert [(a.id, a.error, a.fatal) for a in answers] == [
            (1, "StaleLease", False), (2, "InvalidRequest", False), (3, "InvalidRequest", True)]
        if version < p.ERROR_CODE_VERSION:
            assert all(b"code" not in body for body in bodies)   # a version-5 decoder refuses unknown fields
            assert {answer.code for answer in answers} == {msgspec.UNSET}
        else:
            assert [answer.code for answer in answers] == ["stale_lease", "request_refused", "unknown_request"]


def test_a_hello_of_a_newer_version_is_refused_with_its_code_and_an_older_one_without(served, tmp_path):
    loop, _, _ = served
    for version, code in ((max(p.DAEMON_PROTOCOL_VERSIONS) + 1, "unsupported_version"), (0, msgspec.UNSET)):
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(str(tmp_path / "s.sock"))
        sock.sendall(p.encode(p.Hello(id=0, version=version)))
        (body,) = raw_answers(loop, sock, 1)
        sock.close()
        refusal = p.decode_response(body)
        assert refusal.fatal and refusal.error == "InvalidRequest" and refusal.code == code
