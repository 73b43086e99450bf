"""What walqueued does when accept() finds no free descriptor (EMFILE, ENFILE).

The daemon keeps its descriptors within budget (cli.descriptor_budget counts
the connections, the metrics endpoint's and its own), so running out means
something outside that count took them. A connection waiting in the
listener's backlog then makes the listener readable for ever; the fix is
the classic spare descriptor: close it, accept the waiting connection, close
that at once (the peer sees its connection refused), and take the spare
again. Serving goes on; nothing of this is a failed write. If even the spare
cannot be taken back, the listener is left alone for ACCEPT_PAUSE_SECONDS
instead of spinning on it.

Refusals are logged at most once per LOG_INTERVAL_SECONDS, with the count
since the last line, so a flood cannot flood the log.
"""

from __future__ import annotations

import errno
import os
import socket

from .log import log

# The errors of accept() that mean "no descriptor", not "this connection failed".
OUT_OF_DESCRIPTORS = frozenset({errno.EMFILE, errno.ENFILE})
LOG_INTERVAL_SECONDS = 10.0
ACCEPT_PAUSE_SECONDS = 0.5


class RateLimitedLog:
    """One warning per LOG_INTERVAL_SECONDS at most, counting the events in between."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.total = 0
        self._unlogged = 0
        self._next_line_seconds = float("-inf")

    def event(self, monotonic_seconds: float, detail: str) -> None:
        self.total += 1
        self._unlogged += 1
        if monotonic_seconds >= self._next_line_seconds:
            log.warning("%s (%d since the last such line, %d in all): %s", self.what, self._unlogged,
                        self.total, detail)
            self._unlogged = 0
            self._next_line_seconds = monotonic_seconds + LOG_INTERVAL_SECONDS


class SpareDescriptor:
    """One descriptor held in reserve, spent to refuse a connection when accept() gets EMFILE."""

    def __init__(self) -> None:
        self._fd: int | None = None
        self._take()
        self.refusals = RateLimitedLog("refused a connection: no free descriptor")

    def _take(self) -> None:
        try:
            self._fd = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
        except OSError:
            self._fd = None

    def refuse_one(self, listener: socket.socket, monotonic_seconds: float, error: OSError) -> bool:
        """Accept and close the connection ``error`` kept waiting; False if that was not possible.

        On False the caller stops watching the listener for ACCEPT_PAUSE_SECONDS.
        """
        if self._fd is None:
            self._take()
            if self._fd is None:
                return False
        os.close(self._fd)
        self._fd = None
        try:
            sock, _ = listener.accept()
        except OSError:
            self._take()
            return False
        sock.close()  # before taking the spare again: it reuses this descriptor
        self._take()
        self.refusals.event(monotonic_seconds, str(error))
        return True

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None
