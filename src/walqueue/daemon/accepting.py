"""The listening socket's side of walqueued's loop: who gets a connection, and who must say hello.

`Acceptor.accept` takes every waiting connection: over ``max_connections``
it is refused with a fatal error (in version 1's bytes, which every client
reads); out of descriptors one is refused by spending the spare descriptor
(walqueue.daemon.descriptors), never a failed write; any other failure stops
watching the listener for ACCEPT_PAUSE_SECONDS instead of spinning on it. A
connection accepted must say hello within ``hello_timeout_seconds``:
`expired_hellos` names those that did not, in accept order (so the
deadlines are ascending). No clock of its own: the loop's is given.
"""

from __future__ import annotations

import selectors
import socket
from collections import deque
from collections.abc import Callable, Iterator

from walqueue import protocol

from .connection import PeerConnection, peer_credentials
from .descriptors import ACCEPT_PAUSE_SECONDS, OUT_OF_DESCRIPTORS, RateLimitedLog, SpareDescriptor
from .log import log


class Acceptor:
    def __init__(self, listener: socket.socket, selector: selectors.BaseSelector, token: object,
                 clock: Callable[[], float], hello_timeout_seconds: float) -> None:
        self.listener = listener
        self.hello_timeout_seconds = hello_timeout_seconds
        self.paused_until: float | None = None  # accepts paused after a failure, until then
        self._selector = selector
        self._token = token  # the listener's selector data, by which the loop knows its events
        self._clock = clock
        self._spare_descriptor = SpareDescriptor()  # spent to refuse a connection on EMFILE
        self._failures = RateLimitedLog(f"accept failed, pausing accepts for {ACCEPT_PAUSE_SECONDS:g} s")
        # (monotonic deadline, connection) in accept order, so deadlines are ascending.
        self._awaiting_hello: deque[tuple[float, PeerConnection]] = deque()

    def register(self) -> None:
        self._selector.register(self.listener, selectors.EVENT_READ, self._token)

    def resume_if_due(self, monotonic_seconds: float) -> None:
        """Watch the listener again once the pause after a failed accept is over."""
        if self.paused_until is not None and monotonic_seconds >= self.paused_until:
            self.paused_until = None
            self.register()

    def accept(self, connections: dict, max_connections: int) -> Iterator[PeerConnection]:
        """Each connection accepted, until none waits; the caller adds each to ``connections``
        (descriptor -> connection) before asking for the next, which counts them."""
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # No descriptor left: refuse the waiting connection and keep
                # serving (never a failed write). Otherwise the listener stays
                # readable, so stop watching it for a moment instead of spinning.
                monotonic_seconds = self._clock()
                if exc.errno in OUT_OF_DESCRIPTORS and self._spare_descriptor.refuse_one(
                        self.listener, monotonic_seconds, exc):
                    continue
                self._failures.event(monotonic_seconds, str(exc))
                self._selector.unregister(self.listener)
                self.paused_until = monotonic_seconds + ACCEPT_PAUSE_SECONDS
                return
            sock.setblocking(False)
            credentials = peer_credentials(sock)
            name = f"fd={sock.fileno()}"
            if credentials is not None:
                name += f" pid={credentials[0]} uid={credentials[1]}"
            if len(connections) >= max_connections:
                log.warning("refused connection %s: %d connections open", name, len(connections))
                # Before any hello: in version 1's bytes (no code), which every client reads.
                error = protocol.Error(
                    id=None,
                    error="WalQueueError",
                    message=f"too many connections ({max_connections}); try again later",
                    fatal=True,
                )
                try:
                    sock.send(protocol.encode(error))
                except OSError:
                    pass
                sock.close()
                continue
            conn = PeerConnection(sock=sock, name=name)
            self._awaiting_hello.append((self._clock() + self.hello_timeout_seconds, conn))
            # DEBUG: every walqueue-ctl call is a connection, and INFO is the operator's log.
            log.debug("connect %s", name)
            yield conn

    def expired_hellos(self, monotonic_seconds: float) -> list[PeerConnection]:
        """The connections, still open, that did not say hello by their deadline."""
        expired = []
        awaiting = self._awaiting_hello
        while awaiting:
            deadline, conn = awaiting[0]
            if conn.greeted or conn.closed:
                awaiting.popleft()
            elif deadline <= monotonic_seconds:
                awaiting.popleft()
                if not conn.closing:
                    expired.append(conn)
            else:
                break
        return expired

    def next_deadline(self) -> float | None:
        """The earliest monotonic time at which this has something to do, or None."""
        deadlines = [deadline for deadline in (self.paused_until,
                                               self._awaiting_hello[0][0] if self._awaiting_hello else None)
                     if deadline is not None]
        return min(deadlines, default=None)

    def close(self) -> None:
        self._spare_descriptor.close()
