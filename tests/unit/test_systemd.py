"""walqueued's systemd parts in-process: sd_notify, the watchdog interval, socket activation checks."""

import os
import socket

from walqueue.daemon.systemd import Notifier, activated_listener


def test_notify_reaches_an_abstract_socket_and_the_watchdog_is_half_the_interval():
    name = f"walqueue-test-{os.getpid()}"
    receiver = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    receiver.bind("\0" + name)
    receiver.settimeout(5)
    notifier = Notifier({"NOTIFY_SOCKET": "@" + name, "WATCHDOG_USEC": "4000000"})
    notifier.notify("READY=1")
    assert receiver.recv(100) == b"READY=1"
    assert notifier.watchdog_seconds == 2.0
    notifier.close()
    receiver.close()


def test_no_notify_socket_means_silence_and_a_foreign_watchdog_pid_is_ignored():
    notifier = Notifier({"WATCHDOG_USEC": "1000000", "WATCHDOG_PID": str(os.getpid() + 1)})
    notifier.notify("READY=1")  # nowhere to send: no error
    assert notifier.watchdog_seconds is None


def test_socket_activation_is_ignored_unless_listen_pid_is_ours():
    assert activated_listener({"LISTEN_PID": str(os.getpid() + 1), "LISTEN_FDS": "1"}) is None
    assert activated_listener({}) is None
