"""A signal's wakeup for walqueued's loop: the write end is signal.set_wakeup_fd's, so a
SIGTERM makes the selector return at once; the loop drains the read end and looks at
its stopping flag."""

from __future__ import annotations

import selectors
import socket


class SignalWakeup:
    def __init__(self) -> None:
        self._read, self._write = socket.socketpair()
        self._read.setblocking(False)
        self._write.setblocking(False)

    def write_fd(self) -> int:
        """The descriptor for signal.set_wakeup_fd."""
        return self._write.fileno()

    def register(self, selector: selectors.BaseSelector, token: object) -> None:
        selector.register(self._read, selectors.EVENT_READ, token)

    def wake(self) -> None:
        """What a signal does: end the selector's wait now (an in-process stop, in tests)."""
        self._write.send(b"\0")

    def drain(self) -> None:
        try:
            while self._read.recv(4096):
                pass
        except BlockingIOError:
            pass

    def close(self) -> None:
        self._read.close()
        self._write.close()
