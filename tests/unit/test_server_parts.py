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
