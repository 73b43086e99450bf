"""The walqueued client: the library's API over the daemon's Unix socket.

Two layers:

* ``Connection`` — one socket, pipelining-capable: ``send()`` any number of
  requests (the connection numbers them), then ``receive(request_id)`` their
  answers in any order; answers to other ids are kept until asked for. Not
  thread-safe; meant for tests, benchmarks and tools that pipeline.
* ``Client`` — SPEC §8's blocking API returning the library's dataclasses and
  raising the library's exceptions, plus ``DaemonUnavailable`` when the daemon
  cannot be reached. It connects lazily, reconnects on the next call after a
  lost connection (before sending, when it sees the daemon closed an idle
  connection — e.g. after a restart — so that call does not fail at all), and retries ``put``/``put_many`` (idempotent by key) across a
  reconnect or a daemon-side write failure for up to ``retry_seconds``. It never
  retries ``reserve`` (a lost answer would leak a lease until it expires) nor
  ``ack``/``release``/``touch`` (a retried ``ack`` may answer ``StaleLease``
  with ``status="completed"`` and the lease's own generation: that means the
  first attempt succeeded; ``walqueue.worker`` handles it).

Between the two sits the wire code without I/O that ``walqueue.aio`` shares:
``*_call()`` functions turn the API's arguments into a ``Call`` (the request,
how to convert its answer, whether it may be retried), and ``hello_request``,
``encode_request``, ``complete`` and ``result`` frame requests and turn answers
into the library's values and exceptions. The asyncio client only adds its
own socket handling.

Thread safety: a ``Client`` serializes calls with a lock, so it may be shared
between threads, but a ``reserve(wait=...)`` holds the connection for the
whole wait. Give each thread that blocks in ``reserve`` its own ``Client``.
"""

from __future__ import annotations

import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from walqueue import (
    InvalidRequest,
    Lease,
    QueueClosed,
    QueueStats,
    TaskView,
    Unavailable,
    WalQueueError,
)
from walqueue import protocol as p
from walqueue.metrics import DaemonStats
from walqueue.unix_socket import MAX_SOCKET_PATH_BYTES, unix_address  # noqa: F401 (re-exported)
from walqueue.values import BackupManifest

SOCKET_NAME = "walqueued.sock"
DEFAULT_TIMEOUT_SECONDS = 60.0
DEFAULT_RETRY_SECONDS = 10.0
RETRY_BACKOFF_SECONDS = (0.05, 0.1, 0.2, 0.5, 1.0)
_TIMEVAL = struct.Struct("@ll")  # struct timeval, for SO_RCVTIMEO/SO_SNDTIMEO
# A connection answered less than this long ago is not checked for a daemon
# restart before the next call (no restart is that quick).
IDLE_CHECK_SECONDS = 0.05


class DaemonUnavailable(Unavailable):
    """The daemon could not be reached, or the connection broke before the answer.

    The request may or may not have been applied (except for a failed
    connect, where nothing was sent).
    """


def socket_path(socket_or_directory: str | os.PathLike) -> str:
    """A directory means its ``walqueued.sock``; anything else is the socket path."""
    path = os.fspath(socket_or_directory)
    if os.path.isdir(path):
        return os.path.join(path, SOCKET_NAME)
    return path


class Connection:
    """One connection to walqueued, with the hello exchange done.

    Raises DaemonUnavailable from the constructor if the daemon cannot be reached
    or refuses the connection.
    """

    def __init__(self, path: str, *, timeout: float | None = DEFAULT_TIMEOUT_SECONDS, name: str = "") -> None:
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
            raise DaemonUnavailable(f"cannot connect to walqueued at {path}: {exc}") from exc
        try:
            (hello_id,) = self.send(hello_request(name))
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
        if self._broken is not None:
            raise DaemonUnavailable(f"connection to {self.path} is broken: {self._broken}")
        ids = []
        frames = []
        for request in requests:
            request.id = self._next_id
            self._next_id += 1
            frames.append(encode_request(request))
            ids.append(request.id)
        try:
            self._sock.sendall(b"".join(frames))
        except OSError as exc:
            said = self._last_words()
            message = f"sending to walqueued at {self.path} failed: {exc}"
            if said:
                message += f"; it said: {said}"
            raise self._fail(message, exc) from exc
        return ids

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
        (request_id,) = self.send(request)
        messages = self.receive(request_id, timeout=timeout)
        return result(messages)


# -- the wire code both clients share (this one and walqueue.aio) --------------
# Everything here is free of I/O: building a request from the API's arguments,
# encoding it, and turning answers into the library's values and exceptions.


def hello_request(name: str) -> p.Hello:
    # The name only labels the connection in the daemon's log; a hello must
    # stay below protocol.MAX_HELLO_BYTES.
    return p.Hello(id=0, version=p.PROTOCOL_VERSION, client=name[:256])


def hello_answer(path: str, messages: list) -> p.HelloOk:
    """The daemon's ``HelloOk``. Raises the error it answered, or DaemonUnavailable."""
    answer = messages[0]
    if isinstance(answer, p.Error):
        raise p.error_from_wire(answer)
    if not isinstance(answer, p.HelloOk):
        raise DaemonUnavailable(f"walqueued at {path} answered hello with {type(answer).__name__}")
    return answer


def refused(path: str, exc: WalQueueError) -> DaemonUnavailable:
    """The DaemonUnavailable a failed hello raises (``exc`` itself if it already is one)."""
    if isinstance(exc, DaemonUnavailable):
        return exc
    return DaemonUnavailable(f"walqueued at {path} refused the connection: {exc}")


def encode_request(request: p.Request) -> bytes:
    """One numbered request as a frame. Raises InvalidRequest if it cannot be encoded or is too large."""
    try:
        return p.encode(request)
    except (TypeError, OverflowError, ValueError, RecursionError, p.ProtocolError) as exc:
        raise InvalidRequest(f"cannot send {type(request).__name__.lower()}: {exc}") from exc


def last_words(message: Any) -> str | None:
    """What an error the daemon sent before closing on us says (e.g. too many connections)."""
    if isinstance(message, p.Error):
        return f"{message.error}: {message.message}"
    return None


def complete(messages: list | None) -> bool:
    """True once the answer messages of one request are all in (the last has no ``more``)."""
    return bool(messages) and not getattr(messages[-1], "more", False)


def retry_pause(attempt: int, deadline: float) -> float:
    """Seconds to wait before retry number ``attempt`` (from 0), never past ``deadline`` (monotonic)."""
    pause = RETRY_BACKOFF_SECONDS[min(attempt, len(RETRY_BACKOFF_SECONDS) - 1)]
    return min(pause, max(0.0, deadline - time.monotonic()))


def result(messages: list) -> Any:
    """The answer of one request: the single message, or a merged list for chunked answers.

    Raises the library exception an ``Error`` answer carries.
    """
    first = messages[0]
    for message in messages:
        # An error may also end a chunked answer that had begun.
        if isinstance(message, p.Error):
            raise p.error_from_wire(message)
    if isinstance(first, p.Leases):
        return p.Leases(id=first.id, leases=[lease for m in messages for lease in m.leases])
    if isinstance(first, p.TaskList):
        return p.TaskList(id=first.id, tasks=[task for m in messages for task in m.tasks])
    return first


# -- argument checks: only types, so a bad argument raises InvalidRequest here
# instead of making the daemon close the connection over an undecodable
# message; ranges and lengths are the library's to judge. -----------------------


def _check_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a str, got {type(value).__name__}")
    return value


def _check_int(name: str, value: Any) -> int:
    if type(value) is bool or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an int, got {type(value).__name__}")
    if not -(2**63) <= value < 2**64:
        raise InvalidRequest(f"{name} {value} is out of range")
    return int(value)


def _check_payload(task_id: Any, payload: Any) -> dict:
    if not isinstance(payload, Mapping) or not all(isinstance(k, str) for k in payload):
        raise InvalidRequest(f"payload of task {task_id!r} must be a mapping with str keys")
    return dict(payload)


def _put_item(task_id: Any, payload: Any, key: Any, available_at: Any, max_attempts: Any) -> p.PutItem:
    _check_str("task_id", task_id)
    if key is not None:
        _check_str("key", key)
    return p.PutItem(
        task_id=task_id,
        payload=_check_payload(task_id, payload),
        key=key,
        available_at=_check_int("available_at", available_at),
        max_attempts=_check_int("max_attempts", max_attempts),
    )


def _lease_fields(lease: Any) -> tuple[str, str, int]:
    try:
        task_id, worker, generation = lease.task_id, lease.worker, lease.generation
    except AttributeError as exc:
        raise InvalidRequest(f"expected a Lease, got {type(lease).__name__}") from exc
    return _check_str("task_id", task_id), _check_str("worker", worker), _check_int("generation", generation)



@dataclass(frozen=True)
class Call:
    """One API call without I/O: what to send and what the answer means.

    ``request`` is None when the call needs no round trip (an empty batch);
    ``convert`` turns the merged answer (``result()``) into the API's return
    value; ``idempotent`` calls may be retried across a reconnect; ``wait``
    is how long the daemon may hold the answer back (a blocking reserve).
    """

    request: p.Request | None
    convert: Callable[[Any], Any]
    idempotent: bool = False
    wait: float = 0.0


def _nothing(answer: Any) -> None:
    return None


def _no_ids(answer: Any) -> list[str]:
    return []


def _task_id(answer: Any) -> str:
    return answer.task_id


def _leases(answer: Any) -> list[Lease]:
    return [p.lease_from_wire(lease) for lease in answer.leases]


def put_call(
    task_id: Any, payload: Any, *, key: Any, available_at: Any, delay: Any, max_attempts: Any, now: float
) -> Call:
    """``put``; ``delay`` is turned into ``available_at`` from ``now`` (wall clock) once, here."""
    if delay is not None:
        _check_int("delay", delay)
        if delay < 0:
            raise InvalidRequest(f"delay of task {task_id!r} must be >= 0, got {delay}")
        if available_at != 0:
            raise InvalidRequest(f"task {task_id!r}: give delay or available_at, not both")
        # Computed once, so a retried put carries the same identity.
        available_at = int(now) + delay
    _check_str("task_id", task_id)
    if key is not None:
        _check_str("key", key)
    request = p.Put(0, task_id, _check_payload(task_id, payload), key, _check_int("available_at", available_at),
                    _check_int("max_attempts", max_attempts))
    return Call(request, _task_id, idempotent=True)


def put_many_call(requests: Iterable[Any]) -> Call:
    items = []
    for request in requests:
        item = p.put_item(request)
        items.append(_put_item(item.task_id, item.payload, item.key, item.available_at, item.max_attempts))
    if not items:
        return Call(None, _no_ids)
    return Call(p.PutMany(id=0, requests=items), lambda answer: answer.task_ids, idempotent=True)


def reserve_call(worker: Any, *, lease_seconds: Any, limit: Any, wait: Any) -> Call:
    _check_str("worker", worker)
    if type(wait) is bool or not isinstance(wait, int | float):
        raise InvalidRequest(f"wait must be a number of seconds, got {type(wait).__name__}")
    p.check_wait(wait)
    request = p.Reserve(
        id=0,
        worker=worker,
        lease_seconds=_check_int("lease_seconds", lease_seconds),
        limit=_check_int("limit", limit),
        wait=float(wait),
    )
    return Call(request, _leases, wait=float(wait))


def ack_call(lease: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    return Call(p.Ack(id=0, task_id=task_id, worker=worker, generation=generation), _nothing)


def ack_and_reserve_call(lease: Any, *, lease_seconds: Any, limit: Any, wait: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    reserve = reserve_call(worker, lease_seconds=lease_seconds, limit=limit, wait=wait).request
    request = p.AckReserve(id=0, task_id=task_id, worker=worker, generation=generation,
                           lease_seconds=reserve.lease_seconds, limit=reserve.limit, wait=reserve.wait)
    return Call(request, _leases, wait=reserve.wait)


def release_call(lease: Any, *, delay: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    request = p.Release(id=0, task_id=task_id, worker=worker, generation=generation, delay=_check_int("delay", delay))
    return Call(request, _nothing)


def touch_call(lease: Any, *, lease_seconds: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    request = p.Touch(
        id=0,
        task_id=task_id,
        worker=worker,
        generation=generation,
        lease_seconds=_check_int("lease_seconds", lease_seconds),
    )
    return Call(request, lambda answer: p.lease_from_wire(answer.lease))


def revive_call(task_ids: Iterable[Any]) -> Call:
    ids = [_check_str("task_id", task_id) for task_id in task_ids]
    if not ids:
        return Call(None, _no_ids)
    return Call(p.Revive(id=0, task_ids=ids), lambda answer: answer.task_ids)


def get_call(task_id: Any) -> Call:
    request = p.Get(id=0, task_id=_check_str("task_id", task_id))
    return Call(request, lambda answer: None if answer.task is None else p.task_from_wire(answer.task))


def tasks_call(status: Any) -> Call:
    if status is not None:
        _check_str("status", status)
    return Call(p.Tasks(id=0, status=status), lambda answer: [p.task_from_wire(task) for task in answer.tasks])


def stats_call() -> Call:
    return Call(p.Stats(id=0), lambda answer: p.stats_from_wire(answer.stats))


def compact_call() -> Call:
    return Call(p.Compact(id=0), lambda answer: answer.seq)


def pause_call() -> Call:
    # Idempotent: pausing twice is paused; so retrying is safe.
    return Call(p.Pause(id=0), lambda answer: answer.paused, idempotent=True)


def resume_call() -> Call:
    return Call(p.Resume(id=0), lambda answer: answer.paused, idempotent=True)


def backup_begin_call() -> Call:
    # Not retried: the pin belongs to the connection that asked for it.
    return Call(p.BackupBegin(id=0), p.manifest_from_wire)


def backup_end_call() -> Call:
    return Call(p.BackupEnd(id=0), _nothing)


def daemon_stats_call() -> Call:
    return Call(p.DaemonStatsReq(id=0), lambda answer: p.daemon_stats_from_wire(answer.stats))


class Client:
    """SPEC §8's client. See the module docstring for retries and thread safety.

    ``timeout`` bounds each call (plus ``wait`` for a reserve); ``retry_seconds``
    bounds how long ``put``/``put_many`` keep retrying across reconnects.
    """

    def __init__(
        self,
        socket_or_directory: str | os.PathLike,
        *,
        timeout: float | None = DEFAULT_TIMEOUT_SECONDS,
        retry_seconds: float = DEFAULT_RETRY_SECONDS,
        name: str = "",
    ) -> None:
        self.path = socket_path(socket_or_directory)
        self.timeout = timeout
        self.retry_seconds = retry_seconds
        self.name = name
        self._lock = threading.RLock()
        self._connection: Connection | None = None
        self._closed = False

    # -- plumbing ---------------------------------------------------------------

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    @property
    def closed(self) -> bool:
        """True once ``close()`` was called."""
        return self._closed

    def close(self) -> None:
        """Close the connection; later calls raise QueueClosed. Idempotent."""
        with self._lock:
            self._closed = True
            if self._connection is not None:
                self._connection.close()
                self._connection = None

    def _connected(self) -> Connection:
        if self._closed:
            raise QueueClosed(f"this Client of {self.path} is closed")
        if (
            self._connection is None
            or self._connection.broken
            or self._connection.idle_and_closed_by_peer()  # e.g. the daemon restarted
        ):
            self._connection = Connection(self.path, timeout=self.timeout, name=self.name)
        return self._connection

    def _call(self, request: p.Request, *, wait: float = 0.0, idempotent: bool = False) -> Any:
        timeout = None if self.timeout is None else self.timeout + wait
        with self._lock:
            deadline = time.monotonic() + self.retry_seconds
            attempt = 0
            while True:
                try:
                    return self._connected().call(request, timeout=timeout)
                except (DaemonUnavailable, QueueClosed) as exc:
                    if self._closed or not idempotent or time.monotonic() >= deadline:
                        raise
                    if isinstance(exc, DaemonUnavailable) and self._connection is not None:
                        self._connection.close()
                    time.sleep(retry_pause(attempt, deadline))
                    attempt += 1

    # -- the API ------------------------------------------------------------------

    def _run(self, call: Call) -> Any:
        if call.request is None:
            return call.convert(None)
        return call.convert(self._call(call.request, wait=call.wait, idempotent=call.idempotent))

    def put(
        self,
        task_id: str,
        payload: Mapping[str, Any],
        *,
        key: str | None = None,
        available_at: int = 0,
        delay: int | None = None,
        max_attempts: int = 3,
    ) -> str:
        """Put one task; ``delay`` (seconds from now) is turned into ``available_at`` once.

        Raises InvalidRequest, KeyConflict, DaemonUnavailable.
        """
        return self._run(put_call(task_id, payload, key=key, available_at=available_at, delay=delay,
                                  max_attempts=max_attempts, now=time.time()))

    def put_many(self, requests: Iterable[Any]) -> list[str]:
        """Put several tasks in one transaction (PutRequest objects or mappings)."""
        return self._run(put_many_call(requests))

    def reserve(self, worker: str, *, lease_seconds: int = 30, limit: int = 1, wait: float = 0) -> list[Lease]:
        """Lease up to ``limit`` due tasks, waiting up to ``wait`` seconds for one. Never retried."""
        return self._run(reserve_call(worker, lease_seconds=lease_seconds, limit=limit, wait=wait))

    def ack(self, lease: Lease) -> None:
        """Complete the leased task. Raises StaleLease if the lease is not current."""
        self._run(ack_call(lease))

    def ack_and_reserve(self, lease: Lease, *, lease_seconds: int = 30, limit: int = 1,
                        wait: float = 0) -> list[Lease]:
        """Ack ``lease`` and reserve the same worker's next tasks in one round trip and one fsync.

        Raises StaleLease (and reserves nothing) if the ack fails. Never retried: on
        DaemonUnavailable the ack may or may not have happened (retry it with ``ack``).
        """
        return self._run(ack_and_reserve_call(lease, lease_seconds=lease_seconds, limit=limit, wait=wait))

    def release(self, lease: Lease, *, delay: int = 0) -> None:
        """Give the task back, due again after ``delay`` seconds. Raises StaleLease."""
        self._run(release_call(lease, delay=delay))

    def touch(self, lease: Lease, *, lease_seconds: int) -> Lease:
        """Extend a live lease to ``lease_seconds`` from the daemon's now. Raises StaleLease."""
        return self._run(touch_call(lease, lease_seconds=lease_seconds))

    def revive(self, task_ids: Iterable[str]) -> list[str]:
        """Make dead tasks ready again. Raises InvalidRequest if one is not dead."""
        return self._run(revive_call(task_ids))

    def get(self, task_id: str) -> TaskView | None:
        return self._run(get_call(task_id))

    def tasks(self, status: str | None = None) -> list[TaskView]:
        """All tasks (or those with ``status``) in task_id order."""
        return self._run(tasks_call(status))

    def stats(self) -> QueueStats:
        return self._run(stats_call())

    def compact(self) -> int:
        """Compact now; returns the published snapshot's seq.

        Raises InvalidRequest while a backup holds its files (walqueue-ctl backup).
        """
        return self._run(compact_call())

    def pause(self) -> bool:
        """Stop leasing: reserves get nothing (waiting ones wait) until resume(). Returns True.

        Puts, acks, releases, touches and revives go on. The pause lives in the
        daemon's memory: a daemon restart resumes.
        """
        return self._run(pause_call())

    def resume(self) -> bool:
        """Lease again (waiting reserves first, in arrival order). Returns False."""
        return self._run(resume_call())

    def backup_begin(self) -> BackupManifest:
        """Make everything durable and pin the files of a consistent copy; returns their manifest.

        The pin holds until backup_end() or until this client's connection
        closes; copy with ``walqueue.backup.copy_manifest``. Raises
        InvalidRequest if another backup is in progress.
        """
        return self._run(backup_begin_call())

    def backup_end(self) -> None:
        """Release the pin. Raises InvalidRequest if this connection holds none
        (e.g. it was lost and replaced since backup_begin(): the pin ended with it)."""
        self._run(backup_end_call())

    def daemon_stats(self) -> DaemonStats:
        """The daemon's full report: ``stats()`` plus its own figures (walqueue.metrics)."""
        return self._run(daemon_stats_call())
