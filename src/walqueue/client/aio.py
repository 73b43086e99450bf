"""The asyncio client of walqueued: SPEC §8's client as coroutines, over the shared core.

``walqueue.client.aio.Client`` has the methods of ``walqueue.client.Client``
(``await client.put(...)``, ``await client.reserve(...)``, ...) with the same
arguments, return values, exceptions, timeouts and retry rules, because they
are the same code: the methods are ``walqueue.client.api``'s, requests and
answers are built and read by ``walqueue.client.calls``, and retries are
decided by ``walqueue.retry``. This module only owns a socket. The
asyncio Worker that drives it is ``walqueue.worker.aio.Worker``, which this
module does not import (the worker uses a client, never the other way round);
``walqueue.aio`` names both for code written against 0.2.

One connection per ``Client``, shared by any number of coroutines: each call
numbers its request, writes it whole (writes are serialized, so frames never
interleave) and awaits a future that a reader task resolves when the answer
with that id is complete. Calls therefore pipeline, and a blocking ``reserve``
does not hold up the others (the daemon parks up to 64 per connection).

Failure rules, as in the sync client:

* connecting is lazy; a broken connection is replaced on the next call, and a
  connection the daemon closed while idle (a restart) is noticed before
  sending, so that call does not fail;
* ``put``/``put_many`` and the reads (``get``, ``tasks``, ``stats``) are
  retried across a reconnect (or a ``QueueClosed`` write failure) for up to
  ``retry_seconds``; ``reserve``, ``ack``, ``release`` and ``touch`` never
  are (``Worker`` retries ``ack``/``release``);
* every call is bounded by ``timeout`` (plus ``wait`` for a reserve); when it
  runs out the connection is dropped — its answers can no longer be trusted
  to arrive — so every call waiting on it gets ``DaemonUnavailable``.

Cancelling a call is safe for the connection: the answer, when it comes, is
dropped. But the request may still be applied; a cancelled ``reserve`` may
have leased a task, which is then due again only when that lease expires.

A ``Client`` belongs to the event loop that first uses it; it is not
thread-safe.
"""

from __future__ import annotations

import asyncio
import select
import socket
import time
from collections.abc import Callable
from typing import Any

from walqueue import QueueClosed, WalQueueError
from walqueue import protocol as p
from walqueue.client import calls
from walqueue.client.address import connect_error, unix_address
from walqueue.client.api import DEFAULT_TIMEOUT_SECONDS, PAGE_TASKS, ClientApi
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
from walqueue.dsn import redacted

__all__ = ["AsyncConnection", "Client", "DaemonUnavailable"]

MAX_READ_BYTES = 4 * 1024 * 1024
LAST_WORDS_SECONDS = 0.5


class AsyncConnection:
    """One connection to walqueued, with the hello exchange done; see the module docstring.

    Build it with ``await AsyncConnection.open(path)``, which raises
    DaemonUnavailable if the daemon cannot be reached or refuses it.
    """

    def __init__(self, path: str, sock: socket.socket) -> None:
        self.path = path
        self._sock = sock
        self._next_id = 1
        # request id -> (the caller's future, the answer messages so far)
        self._waiters: dict[int, tuple[asyncio.Future, list]] = {}
        self._broken: str | None = None
        self._send_lock = asyncio.Lock()
        self._reader_task: asyncio.Task | None = None
        self._said: str | None = None  # a fatal error not tied to a request
        self.server = ""
        self.max_body_bytes = p.MAX_BODY_BYTES

    @classmethod
    async def open(
        cls, path: str, *, timeout: float | None = DEFAULT_TIMEOUT_SECONDS, name: str = "",
        reached_before: bool = False, version: int = CLIENT_PROTOCOL_VERSIONS[0],
    ) -> AsyncConnection:
        loop = asyncio.get_running_loop()
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        sock.setblocking(False)
        try:
            with unix_address(path) as address:
                await asyncio.wait_for(loop.sock_connect(sock, address), timeout)
        except TimeoutError as exc:
            sock.close()
            raise DaemonUnavailable(f"cannot connect to walqueued at {redacted(path)}: "
                                    f"no answer in {timeout} s") from exc
        except OSError as exc:
            sock.close()
            raise connect_error(path, exc, reached_before=reached_before) from exc
        except BaseException:
            sock.close()
            raise
        connection = cls(path, sock)
        connection._reader_task = loop.create_task(connection._read_loop(), name=f"walqueue-read-{path}")
        try:
            answer = hello_answer(path, await connection.exchange(hello_request(name, version),
                                                                  timeout=timeout))
        except WalQueueError as exc:
            connection.close()
            raise refused(path, exc) from exc
        except BaseException:
            connection.close()
            raise
        connection.server = answer.server
        connection.max_body_bytes = answer.max_body_bytes
        return connection

    @property
    def broken(self) -> bool:
        return self._broken is not None

    def idle_and_closed_by_peer(self) -> bool:
        """True if nothing is outstanding and the daemon has closed this connection.

        Checked on the socket itself, not left to the reader task: the event
        loop may not have run since the daemon went away.
        """
        if self._broken is not None or self._waiters:
            return False
        try:
            poller = select.poll()
            poller.register(self._sock, select.POLLIN)
            if not poller.poll(0):
                return False
            closed = self._sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except BlockingIOError:
            return False
        except OSError:
            closed = True
        if closed:
            self._fail("closed by the daemon")
        return closed

    def close(self) -> None:
        """Close the connection; calls waiting on it get DaemonUnavailable. Idempotent."""
        self._fail("closed")

    async def wait_closed(self) -> None:
        """Return once the reader task has ended (after ``close()`` or a failure)."""
        if self._reader_task is not None:
            await asyncio.gather(self._reader_task, return_exceptions=True)

    def _fail(self, message: str, cause: BaseException | None = None) -> DaemonUnavailable:
        """Mark the connection broken, fail every waiting call, and close the socket.

        Returns the DaemonUnavailable for the caller that noticed.
        """
        if self._broken is None:
            self._broken = message
        error = DaemonUnavailable(message)
        error.__cause__ = cause
        self._fail_waiters(lambda: _copy(error))
        task = self._reader_task
        if task is None or task.done():
            self._sock.close()
        elif task is not asyncio.current_task():
            # Close only once the task's pending sock_recv is unregistered, so
            # the event loop never watches a descriptor number that was reused.
            task.add_done_callback(lambda _: self._sock.close())
            task.cancel()
        return error

    def _fail_waiters(self, make_error: Callable[[], BaseException]) -> None:
        waiters, self._waiters = self._waiters, {}
        for future, _ in waiters.values():
            if not future.done():
                future.set_exception(make_error())

    async def _read_loop(self) -> None:
        loop = asyncio.get_running_loop()
        reader = p.FrameReader()
        try:
            while self._broken is None:
                try:
                    body = reader.next_body()
                except p.ProtocolError as exc:
                    self._fail(f"bad frame from walqueued at {self.path}: {exc}", exc)
                    break
                if body is None:
                    try:
                        data = await loop.sock_recv(self._sock, max(65536, min(reader.wanted_bytes(), MAX_READ_BYTES)))
                    except OSError as exc:
                        self._fail(f"receiving from walqueued at {self.path} failed: {exc}", exc)
                        break
                    if not data:
                        self._fail(f"walqueued at {self.path} closed the connection")
                        break
                    reader.feed(data)
                    continue
                try:
                    message = p.decode_response(body)
                except p.ProtocolError as exc:
                    self._fail(str(exc), exc)
                    break
                self._deliver(message)
        finally:
            if self._broken is not None and asyncio.current_task() is self._reader_task:
                # Ended by itself (not cancelled from _fail): nobody else closes.
                self._sock.close()

    def _deliver(self, message: Any) -> None:
        fatal = isinstance(message, p.Error) and message.fatal
        if fatal and message.id is None:
            # Not tied to a request (e.g. "too many connections"): every
            # waiting call gets the error; the daemon closes the connection.
            self._said = self._broken = last_words(message)
            self._fail_waiters(lambda: p.error_from_wire(message))
            self._fail(self._broken)
            return
        waiter = self._waiters.get(message.id)
        if waiter is not None:
            future, messages = waiter
            messages.append(message)
            if complete(messages) or fatal:
                del self._waiters[message.id]
                if not future.done():
                    future.set_result(messages)
        # else: the answer to a call that was cancelled or timed out; dropped.
        if fatal:
            self._fail(f"{message.error}: {message.message}")

    async def exchange(self, request: p.Request, *, timeout: float | None) -> list:
        """Send one request and return all its answer messages.

        Raises InvalidRequest (nothing sent) if it cannot be encoded,
        DaemonUnavailable if the connection is or becomes broken or the time
        runs out (the connection is then dropped).
        """
        if self._broken is not None:
            raise DaemonUnavailable(f"connection to {self.path} is broken: {self._broken}")
        request.id = self._next_id
        self._next_id += 1
        frame = encode_request(request)
        loop = asyncio.get_running_loop()
        future = loop.create_future()
        self._waiters[request.id] = (future, [])
        try:
            async with self._send_lock:
                if self._broken is not None:
                    raise DaemonUnavailable(f"connection to {self.path} is broken: {self._broken}")
                try:
                    await loop.sock_sendall(self._sock, frame)
                except OSError as exc:
                    message = f"sending to walqueued at {self.path} failed: {exc}"
                    said = await self._last_words()
                    if said:
                        message += f"; it said: {said}"
                    raise self._fail(message, exc) from exc
                except asyncio.CancelledError:
                    # Part of the frame may be out: the stream cannot be resumed.
                    self._fail("a send was cancelled midway")
                    raise
            try:
                return await asyncio.wait_for(future, timeout)
            except TimeoutError as exc:
                raise self._fail(f"no answer from walqueued at {self.path} in time", exc) from exc
        finally:
            if future.done() and not future.cancelled():
                future.exception()  # retrieved, even when another error is raised instead
            waiter = self._waiters.get(request.id)
            if waiter is not None and waiter[0] is future:
                del self._waiters[request.id]

    async def _last_words(self) -> str | None:
        """The error the daemon sent before closing on us (e.g. too many connections), if any.

        After a failed send the reader task may not have read it yet: give it
        a moment to reach the end of the stream.
        """
        task = self._reader_task
        if task is not None and not task.done():
            await asyncio.wait({task}, timeout=LAST_WORDS_SECONDS)
        return self._said

    async def call(self, request: p.Request, *, timeout: float | None) -> Any:
        """Send one request and return its answer, raising the error it carries."""
        return result(await self.exchange(request, timeout=timeout))


def _copy(error: DaemonUnavailable) -> DaemonUnavailable:
    """A fresh exception per waiting call (one exception object must not be raised in many tasks)."""
    copy = DaemonUnavailable(*error.args)
    copy.__cause__ = error.__cause__
    return copy


class Client(ClientApi):
    """SPEC §8's client as coroutines: ``walqueue.client.api``'s methods and options, awaited."""

    def _init_connections(self) -> None:
        self._connection: AsyncConnection | None = None
        self._connect_lock = asyncio.Lock()

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc_info: object) -> None:
        await self.close()

    async def close(self) -> None:
        """Close the connection; later calls raise QueueClosed. Idempotent."""
        self._closed = True
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()
            await connection.wait_closed()

    async def _connected(self) -> AsyncConnection:
        # One coroutine connects; the others wait for its connection.
        async with self._connect_lock:
            if self._closed:
                raise QueueClosed(f"this Client of {self.path} is closed")
            connection = self._connection
            if connection is None or connection.broken or connection.idle_and_closed_by_peer():
                for version in CLIENT_PROTOCOL_VERSIONS[CLIENT_PROTOCOL_VERSIONS.index(self._version):]:
                    try:
                        self._connection = await AsyncConnection.open(
                            self.path, timeout=self.timeout, name=self.name,
                            reached_before=self._reached, version=version)
                    except DaemonUnavailable as exc:
                        if version == CLIENT_PROTOCOL_VERSIONS[-1] or not version_refused(exc):
                            raise
                        continue
                    self._version = version  # an older daemon: announce what it speaks from now on
                    break
                self._reached = True
                if self._closed:  # closed while connecting
                    self._connection.close()
                    raise QueueClosed(f"this Client of {self.path} is closed")
            return self._connection

    async def _all_pages(self, status: str | None, after: str) -> list:
        """ClientApi.tasks with ``after`` and no ``limit``: page after page, awaited."""
        views: list = []
        while True:
            page = await self._run(calls.tasks_page_call, status, after=after, limit=PAGE_TASKS)
            views += page
            if len(page) < PAGE_TASKS:
                return views
            after = page[-1].task_id

    async def _run(self, build: Callable[..., Call], /, *args: Any, **kwargs: Any) -> Any:
        call = build(*args, **kwargs)
        if call.request is None:
            return call.convert(None)
        timeout = self._call_timeout(call)
        started, retry = time.monotonic(), None
        while True:
            try:
                connection = await self._connected()
                return call.convert(await connection.call(call.request, timeout=timeout))
            except (DaemonUnavailable, QueueClosed) as exc:
                # A DaemonUnavailable has already dropped the broken connection
                # (it is never closed here: other coroutines may be using it).
                if (retry := retry or self._retry(build, started)) is None:
                    raise
                pause = retry.pause_after(exc, now=time.monotonic(), client_closed=self._closed)
                if pause is None:
                    raise
                await asyncio.sleep(pause)
