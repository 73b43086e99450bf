"""walqueued's small parts in-process: the clock rule, sd_notify, socket activation checks."""

import os
import socket
import types

from walqueue import server


def test_the_clock_is_whole_seconds_and_never_goes_backwards(monkeypatch):
    clock = types.SimpleNamespace(last_now=0)
    readings = iter([100.9, 99.2, 101.0, 50.0])
    monkeypatch.setattr(server.time, "time", lambda: next(readings))
    assert [server.Server.now(clock) for _ in range(4)] == [100, 100, 101, 101]


def test_notify_reaches_an_abstract_socket_and_the_watchdog_is_half_the_interval():
    name = f"walqueue-test-{os.getpid()}"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind("\0" + name)
    receiver.settimeout(5)
    notifier = server.Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "4000000"})
    notifier.notify("READY=1")
    assert receiver.recv(100) == b"READY=1"
    assert notifier.watchdog_seconds == 2.0
    notifier.close()
    receiver.close()


def test_no_notify_socket_means_silence_and_a_foreign_watchdog_pid_is_ignored():
    notifier = server.Notifier({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid() + 1)})
    notifier.notify("READY=1")  # nowhere to send: no error
    assert notifier.watchdog_seconds is None


def test_socket_activation_is_ignored_unless_listen_pid_is_ours():
    assert server.activated_listener({"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}) is None
    assert server.activated_listener({}) is None


def test_parked_reserves_keep_arrival_order_and_expire_by_deadline():
    conn_a, conn_b = types.SimpleNamespace(parked=0), types.SimpleNamespace(parked=0)
    parked = server.ParkedReserves()
    entries = [server.Parked(conn_a if n % 2 else conn_b, None, deadline, 0)
               for n, deadline in enumerate([30.0, 10.0, 20.0, 40.0])]
    for entry in entries:
        parked.add(entry)
    assert parked.live == 4 and (conn_a.parked, conn_b.parked) == (2, 2)
    assert parked.next_deadline() == 10.0
    assert parked.expire(25.0) == [entries[1], entries[2]]  # in deadline order
    assert parked.head() is entries[0]  # arrival order among the rest
    assert parked.finish_head() is entries[0]
    assert parked.head() is entries[3] and parked.next_deadline() == 40.0
    assert parked.drop(lambda entry: entry.conn is conn_a) == [entries[3]]
    assert not parked and parked.head() is None and parked.next_deadline() is None
    assert (conn_a.parked, conn_b.parked) == (0, 0)


def test_many_finished_waits_do_not_pile_up():
    conn = types.SimpleNamespace(parked=0)
    parked = server.ParkedReserves()
    keeper = server.Parked(conn, None, 1e9, 0)
    parked.add(keeper)
    for n in range(1000):
        parked.add(server.Parked(conn, None, float(n), 0))
    parked.expire(1e6)
    assert parked.head() is keeper and parked.live == 1
    assert len(parked._arrivals) < 100 and len(parked._deadlines) < 100


def test_large_frames_are_admitted_only_while_they_fit_in_the_input_budget():
    import struct as struct_module

    from walqueue import protocol as p

    state = types.SimpleNamespace(_admitted_total=0, _input_paused=set())
    size = server.MAX_ADMITTED_INPUT_BYTES // 2 + 1  # two do not fit together

    def connection(length):
        conn = server.Connection(sock=None, name="test")
        conn.reader.max_body_bytes = p.MAX_BODY_BYTES
        conn.reader.feed(struct_module.pack(">I", length) + b"x" * 10)
        return conn

    first, second, small = connection(size), connection(size), connection(100)
    assert server.Server._admit(state, first) and first.admitted == size
    assert not server.Server._admit(state, second) and second.admitted == 0
    assert server.Server._admit(state, small) and small.admitted == 0  # small frames need no room
    first.reader = p.FrameReader()  # its frame completed
    assert server.Server._admit(state, first) and state._admitted_total == 0
    assert server.Server._admit(state, second) and state._admitted_total == size
