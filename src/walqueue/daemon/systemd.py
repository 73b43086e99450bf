"""systemd integration, standard library only: sd_notify, the watchdog, socket activation.

`Notifier` sends READY=1, STOPPING=1, WATCHDOG=1, STATUS= and
EXTEND_TIMEOUT_USEC= to the datagram socket NOTIFY_SOCKET names, and does
nothing when it is unset. `activated_listener` takes the listening socket
systemd passed (LISTEN_FDS / LISTEN_PID). `open_reporting_progress` opens the
Engine while telling systemd that a long recovery is still starting, so READY=1
comes only after recovery and listening (SPEC §8).
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import time
from collections.abc import Callable

from walqueue.directory import Directory
from walqueue.engine import Engine
from walqueue.fs import OsFileSystem

from .exits import EXIT_USAGE, DaemonExit

log = logging.getLogger("walqueued")

SD_LISTEN_FDS_START = 3
# While recovery runs, systemd hears from us this often, and each message
# extends its start timeout by RECOVERY_EXTEND_USEC from then.
RECOVERY_REPORT_SECONDS = 2.0
RECOVERY_EXTEND_USEC = 30_000_000


class Notifier:
    """sd_notify over the datagram socket named by NOTIFY_SOCKET (no-op when unset)."""

    def __init__(self, environ: dict[str, str]) -> None:
        path = environ.get("NOTIFY_SOCKET", "")
        self._address = ("\0" + path[1:]) if path.startswith("@") else path
        self._socket: socket.socket | None = None
        if self._address:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.watchdog_seconds: float | None = None
        interval_usec = environ.get("WATCHDOG_USEC", "")
        watchdog_pid = environ.get("WATCHDOG_PID", "")
        if (interval_usec.isdigit() and int(interval_usec) > 0
                and (not watchdog_pid or watchdog_pid == str(os.getpid()))):
            # Ping at half the interval, as sd_watchdog_enabled(3) advises.
            self.watchdog_seconds = int(interval_usec) / 2 / 1_000_000

    def notify(self, text: str) -> None:
        if self._socket is None:
            return
        try:
            self._socket.sendto(text.encode(), self._address)
        except OSError as exc:
            log.warning("sd_notify %r to %s failed: %s", text, self._address, exc)

    def close(self) -> None:
        if self._socket is not None:
            self._socket.close()
            self._socket = None


def activated_listener(environ: dict[str, str]) -> socket.socket | None:
    """The listening socket systemd passed (LISTEN_FDS/LISTEN_PID), or None.

    Raises DaemonExit if the passed descriptor is not a Unix stream socket.
    """
    if environ.get("LISTEN_PID") != str(os.getpid()):
        return None
    count = environ.get("LISTEN_FDS", "0")
    for name in ("LISTEN_PID", "LISTEN_FDS", "LISTEN_FDNAMES"):
        os.environ.pop(name, None)
    if not count.isdigit() or int(count) < 1:
        return None
    if int(count) > 1:
        log.warning("LISTEN_FDS=%s: using only the first descriptor", count)
    listener = socket.socket(fileno=SD_LISTEN_FDS_START)
    if listener.family != socket.AF_UNIX or listener.type != socket.SOCK_STREAM:
        raise DaemonExit(EXIT_USAGE, "the socket passed by systemd is not a Unix stream socket")
    listener.setblocking(False)
    os.set_inheritable(listener.fileno(), False)
    return listener


def open_reporting_progress(directory: str, hook: Callable[[str], None] | None, notifier: Notifier,
                            preallocate_wal_bytes: int = 0, filesystem: OsFileSystem | None = None,
                            opened: Directory | None = None) -> Engine:
    """Open (recover) the Engine; while that takes long, tell systemd it is still starting.

    Recovery runs in a helper thread so the main thread can send STATUS= and
    EXTEND_TIMEOUT_USEC= every RECOVERY_REPORT_SECONDS; it raises what Engine() raises.
    """
    outcome: dict[str, object] = {}

    def recover() -> None:
        try:
            outcome["queue"] = Engine(directory, hook=hook, preallocate_bytes=preallocate_wal_bytes,
                                     filesystem=filesystem, opened=opened)
        except BaseException as exc:  # handed to the main thread below
            outcome["error"] = exc

    thread = threading.Thread(target=recover, name="recovery", daemon=True)
    started = time.monotonic()
    thread.start()
    while True:
        thread.join(RECOVERY_REPORT_SECONDS)
        if not thread.is_alive():
            break
        elapsed = time.monotonic() - started
        log.info("still recovering %s after %.0f s", directory, elapsed)
        notifier.notify(f"EXTEND_TIMEOUT_USEC={RECOVERY_EXTEND_USEC}\n"
                        f"STATUS=recovering {directory}: {elapsed:.0f} s so far")
    if "error" in outcome:
        raise outcome["error"]  # type: ignore[misc]
    return outcome["queue"]  # type: ignore[return-value]
