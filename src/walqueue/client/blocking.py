"""The sync client of walqueued: a blocking socket per thread under SPEC §8's API.

Two layers:

* ``Connection``: one socket, pipelining-capable: ``send()`` any number of
  requests (the connection numbers them), then ``receive(request_id)`` their
  answers in any order; answers to other ids are kept until asked for. Not
  thread-safe; meant for tests, benchmarks and tools that pipeline.
* ``Client``: SPEC §8's blocking API (``walqueue.client.api``), returning
  the library's dataclasses and raising the library's exceptions, plus
  ``DaemonUnavailable``. Requests and answers are built and read by
  ``walqueue.client.calls``; what is retried, for how long, is
  ``walqueue.retry``'s (the one policy of both backends); this module owns only the sockets.

The Client connects lazily and reconnects on the next call after a lost
connection (before sending, when it sees the daemon closed an idle
connection, e.g. after a restart, so that call does not fail at all).

Threads: each thread that calls a ``Client`` gets its own connection, made
on its first call, so threads never wait for each other and a
``reserve(wait=...)`` holds up only its own thread (a Worker's toucher keeps
touching while another thread waits for a task). A connection is closed
with the Client, or when the next thread connects after its thread ended.
Do not share a Client across ``fork()``.
"""

from __future__ import annotations

import select
import socket
import struct
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from walqueue import QueueClosed, WalQueueError
from walqueue import protocol as p
from walqueue.client.address import connect_error, unix_address
from walqueue.client.api import DEFAULT_TIMEOUT_SECONDS, ClientApi
from walqueue.client.calls import (
    CLIENT_PROTOCOL_VERSIONS,
    Call,
    DaemonUnavailable,
    complete,
    encode_request,
    hello_answer,
    hello_request,
    last_words,
    refused,
    result,
    version_refused,
)

_TIMEVAL = struct.Struct("@ll")  # struct timeval, for SO_RCVTIMEO/SO_SNDTIMEO
# A connection answered less than this long ago is not checked for a daemon
# restart before the next call (no restart is that quick).
IDLE_CHECK_SECONDS = 0.05


class Connection:
    """One connection to walqueued, with the hello exchange done.

    Raises DaemonUnavailable from the constructor if the daemon cannot be reached
    or refuses the connection: NoSocket if the path is not a socket, or is
    missing and ``reached_before`` is false (see ``walqueue.client.address``).
    """

    def __init__(self, path: str, *, timeout: float | None = DEFAULT_TIMEOUT_SECONDS, name: str = "",
                 reached_before: bool = False, version: int = CLIENT_PROTOCOL_VERSIONS[0]) -> None:
        self.path = path
        self.timeout = timeout
        self._next_id = 1
        self._reader = p.FrameReader()
        self._pending: dict[int, list] = {}
        self._broken: str | None = None
        self._sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        self._sock_timeout: float | None = None  # the kernel's SO_RCVTIMEO/SO_SNDTIMEO, see _settimeout
        self._last_answer = 0.0  # time.monotonic() of the last bytes received
        # poll, not select: select() cannot take descriptors >= 1024.
        self._poller = select.poll()
        self._poller.register(self._sock, select.POLLIN)
        try:
            self._sock.settimeout(timeout)
            with unix_address(path) as address:
                self._sock.connect(address)
            self._sock.settimeout(None)  # blocking from here on: see _settimeout
            self._settimeout(timeout)
        except OSError as exc:
            self._sock.close()
            raise connect_error(path, exc, reached_before=reached_before) from exc
        try:
            (hello_id,) = self.send(hello_request(name, version))
            answer = hello_answer(path, self.receive(hello_id))
        except WalQueueError as exc:
            self.close()
            raise refused(path, exc) from exc
        self.server = answer.server
        self.max_body_bytes = answer.max_body_bytes

    @property
    def broken(self) -> bool:
        return self._broken is not None

    def idle_and_closed_by_peer(self) -> bool:
        """True if nothing is outstanding and the daemon has closed this connection.

        Lets a caller reconnect before sending, when that is certainly safe:
        nothing was sent that the closed connection could have lost.
        """
        if self._broken is not None or self._pending:
            return False
        if time.monotonic() - self._last_answer < IDLE_CHECK_SECONDS:
            return False  # answered a moment ago: not worth a syscall per call
        try:
            if not self._poller.poll(0):
                return False
            closed = self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            closed = True
        if closed:
            self._broken = "closed by the daemon"
            self._sock.close()
        return closed

    def close(self) -> None:
        if self._broken is None:
            self._broken = "closed"
        self._sock.close()

    def _fail(self, message: str, cause: BaseException | None = None) -> DaemonUnavailable:
        self._broken = message
        self._sock.close()
        error = DaemonUnavailable(message)
        error.__cause__ = cause
        return error

    def send(self, *requests: p.Request) -> list[int]:
        """Number the requests, send them in one write, and return their ids.

        The daemon stops reading a connection whose unread answers pass 8 MiB,
        so a very long pipeline must interleave ``receive`` calls or the write
        blocks until the timeout.

        Raises InvalidRequest (nothing sent) if a request cannot be encoded or
        is too large, DaemonUnavailable if the connection is broken.
        """
        ids = []
        frames = []
        for request in requests:
            ids.append(self._number(request))
            frames.append(encode_request(request))
        self._send_bytes(b"".join(frames))
        return ids

    def _number(self, request: p.Request) -> int:
        if self._broken is not None:
            raise DaemonUnavailable(f"connection to {self.path} is broken: {self._broken}")
        request.id = request_id = self._next_id
        self._next_id += 1
        return request_id

    def _send_bytes(self, data: bytes) -> None:
        try:
            self._sock.sendall(data)
        except OSError as exc:
            said = self._last_words()
            message = f"sending to walqueued at {self.path} failed: {exc}"
            if said:
                message += f"; it said: {said}"
            raise self._fail(message, exc) from exc

    def _settimeout(self, seconds: float | None) -> None:
        """Bound every later send and recv by ``seconds`` (None: no bound).

        The kernel keeps the bound (SO_RCVTIMEO/SO_SNDTIMEO on a blocking
        socket): Python's own socket timeout would poll() before every send
        and recv, doubling the syscalls of a call. A recv past the bound
        raises BlockingIOError. Set only when it changes.
        """
        if seconds == self._sock_timeout:
            return
        if seconds is None:
            value = _TIMEVAL.pack(0, 0)  # zero: no timeout
        else:
            micros = max(1, round(seconds * 1e6))
            value = _TIMEVAL.pack(micros // 1_000_000, micros % 1_000_000)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVTIMEO, value)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDTIMEO, value)
        self._sock_timeout = seconds

    def _last_words(self) -> str | None:
        """The error the daemon sent before closing on us (e.g. too many connections), if any."""
        try:
            self._settimeout(0.5)
            while (body := self._reader.next_body()) is None:
                data = self._sock.recv(65536)
                if not data:
                    return None
                self._reader.feed(data)
            message = p.decode_response(body)
        except (OSError, p.ProtocolError):
            return None
        return last_words(message)

    def receive(self, request_id: int, *, timeout: float | None = None) -> list:
        """All answer messages for ``request_id`` (several when a list was chunked).

        ``timeout`` defaults to the connection's. Raises DaemonUnavailable if the
        connection breaks or the time runs out (the connection is then unusable),
        or the library exception of a fatal protocol error.
        """
        deadline = None
        wait = self.timeout if timeout is None else timeout
        if wait is not None:
            deadline = time.monotonic() + wait
        while True:
            if complete(self._pending.get(request_id)):
                return self._pending.pop(request_id)
            if self._broken is not None:
                raise DaemonUnavailable(f"connection to {self.path} is broken: {self._broken}")
            self._read_one(deadline)

    def _read_one(self, deadline: float | None) -> None:
        while True:
            try:
                body = self._reader.next_body()
            except p.ProtocolError as exc:
                raise self._fail(f"bad frame from walqueued at {self.path}: {exc}", exc) from exc
            if body is not None:
                break
            if deadline is not None:
                remaining = deadline - time.monotonic()
                if remaining <= 0:
                    raise self._fail(f"no answer from walqueued at {self.path} in time")
                # settimeout is a syscall, so the socket's timeout is changed only
                # when it would overshoot the deadline by more than a moment or
                # wake far too early; a wake before the deadline just waits again.
                current = self._sock_timeout
                if current is None or current > remaining + 0.05 or current < remaining / 2:
                    self._settimeout(remaining)
            else:
                self._settimeout(None)
            try:
                data = self._sock.recv(max(65536, min(self._reader.wanted_bytes(), 4 * 1024 * 1024)))
            except (BlockingIOError, TimeoutError) as exc:  # SO_RCVTIMEO ran out
                if deadline is not None and time.monotonic() < deadline:
                    continue
                raise self._fail(f"no answer from walqueued at {self.path} in time", exc) from exc
            except OSError as exc:
                raise self._fail(f"receiving from walqueued at {self.path} failed: {exc}", exc) from exc
            if not data:
                raise self._fail(f"walqueued at {self.path} closed the connection")
            self._last_answer = time.monotonic()
            self._reader.feed(data)
        try:
            message = p.decode_response(body)
        except p.ProtocolError as exc:
            raise self._fail(str(exc), exc) from exc
        if isinstance(message, p.Error) and message.fatal:
            # The daemon closes the connection after a fatal error.
            self._broken = f"{message.error}: {message.message}"
            self._sock.close()
            if message.id is None:
                raise p.error_from_wire(message)
        self._pending.setdefault(message.id, []).append(message)

    def call(self, request: p.Request, *, timeout: float | None = None) -> Any:
        """Send one request and return its answer, raising the error it carries."""
        request_id = self._number(request)  # send() without its lists: one request is the common call
        self._send_bytes(encode_request(request))
        return result(self.receive(request_id, timeout=timeout))


@dataclass
class _Line:
    """One thread's connection; ``lock`` is held by its calls, and by close()."""

    thread: threading.Thread
    lock: threading.RLock = field(default_factory=threading.RLock)
    connection: Connection | None = None


class Client(ClientApi):
    """SPEC §8's client: ``walqueue.client.api``'s methods and options, over blocking sockets.

    See the module docstring for threads and reconnects.
    """

    def _init_connections(self) -> None:
        self._lines_lock = threading.Lock()
        self._lines: dict[threading.Thread, _Line] = {}

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def close(self) -> None:
        """Close every thread's connection (after its call in progress); later calls raise QueueClosed.

        Idempotent.
        """
        with self._lines_lock:
            self._closed = True
            lines, self._lines = list(self._lines.values()), {}
        for line in lines:
            with line.lock:
                _close(line)

    @property
    def _connection(self) -> Connection | None:
        """The calling thread's connection, if it has one (for tests)."""
        line = self._lines.get(threading.current_thread())
        return None if line is None else line.connection

    def _line(self) -> _Line:
        thread = threading.current_thread()
        line = self._lines.get(thread)
        if line is not None:
            return line
        with self._lines_lock:
            if self._closed:
                raise QueueClosed(f"this Client of {self.path} is closed")
            ended = [old for old in self._lines.values() if not old.thread.is_alive()]
            for old in ended:
                del self._lines[old.thread]
            line = self._lines[thread] = _Line(thread)
        for old in ended:
            _close(old)
        return line

    def _connected(self, line: _Line) -> Connection:
        if self._closed:
            raise QueueClosed(f"this Client of {self.path} is closed")
        connection = line.connection
        if connection is None or connection.broken or connection.idle_and_closed_by_peer():
            for version in CLIENT_PROTOCOL_VERSIONS[CLIENT_PROTOCOL_VERSIONS.index(self._version):]:
                try:
                    connection = Connection(self.path, timeout=self.timeout, name=self.name,
                                            reached_before=self._reached, version=version)
                except DaemonUnavailable as exc:
                    if version == CLIENT_PROTOCOL_VERSIONS[-1] or not version_refused(exc):
                        raise
                    continue
                self._version = version  # an older daemon: announce what it speaks from now on
                break
            line.connection = connection
            self._reached = True
        return connection

    def _run(self, build: Callable[..., Call], /, *args: Any, **kwargs: Any) -> Any:
        call = build(*args, **kwargs)
        if call.request is None:
            return call.convert(None)
        timeout = self._call_timeout(call)
        line = self._line()
        with line.lock:
            started, retry = time.monotonic(), None
            while True:
                try:
                    return call.convert(self._connected(line).call(call.request, timeout=timeout))
                except (DaemonUnavailable, QueueClosed) as exc:
                    if (retry := retry or self._retry(build, started)) is None:
                        raise
                    pause = retry.pause_after(exc, now=time.monotonic(), client_closed=self._closed)
                    if pause is None:
                        raise
                    time.sleep(pause)


def _close(line: _Line) -> None:
    if line.connection is not None:
        line.connection.close()
        line.connection = None
