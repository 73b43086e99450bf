"""One client connection of walqueued: framing, hello, admission, output buffers, deferral.

A `PeerConnection` turns received bytes into requests (through
``protocol.FrameReader``, whose length bound is checked before any body is
buffered), answers the hello itself, and holds what is owed to the client:
``out`` (encoded bytes, sent as the socket takes them) and ``backlog``
(answers not encoded yet, e.g. a long listing, moved into ``out`` only while
``out`` is below OUTPUT_HIGH_WATER_BYTES, so a listing is produced as fast
as its client reads it).

Bounds, and why:

* Before its hello a connection may make the daemon buffer at most
  ``protocol.MAX_HELLO_BYTES``; after it, one body of ``MAX_BODY_BYTES``.
* Large frames being received share one `InputBudget` of
  MAX_ADMITTED_INPUT_BYTES, which counts the bytes RECEIVED of each frame of
  at least LARGE_FRAME_BYTES in progress (declaring a length costs a peer
  nothing, so it reserves nothing). While the received bytes fill it, a
  frame reads on only with room reserved to complete in OVERDRAFT_BYTES
  (one largest frame), given to the waiting frames with the fewest bytes
  left first: so half-sent frames cannot add up to max-connections x 17 MiB,
  some frame always completes, and how many frames hog the budget that
  have far to go changes nothing for one that is nearly done.
* A frame in progress has one deadline (`FrameDeadlines`), from when its
  length prefix is in, never moved later: its body must arrive within
  FRAME_GRACE_SECONDS plus its length at MIN_FRAME_BYTES_PER_SECOND, waiting
  for the budget included, else the connection gets a fatal error saying
  so. A frame given reserved room must also complete within
  RESERVED_GRACE_SECONDS plus what it lacks at RESERVED_BYTES_PER_SECOND:
  room reserved for a frame that does not come is soon given to the next.
  (Once a frame's deadline stopped while it waited and started afresh when
  it could read: K frames each took their own 27 s in turn, and a bystander's
  1.5 MB put_many waited 67.7 s for K=3, 148.6 s for K=6.)
* Deferral: a connection whose unsent answers reach the high-water mark, or
  that had MAX_REQUESTS_PER_TURN_PER_CONNECTION requests applied in this
  turn, has its further requests kept in ``deferred``, in order, for a later
  turn, and is not read from meanwhile: one pipelining client can neither
  pin memory nor hold up the rest.

A protocol violation raises `ConnectionFault`; the loop answers it with one
fatal ``InvalidRequest`` after the answers already due, and closes.
"""

from __future__ import annotations

import heapq
import math
import select
import selectors
import socket
import struct
from collections import deque
from dataclasses import dataclass, field

import walqueue
from walqueue import protocol

from .log import log, one_line
from .service import ENCODING_ERRORS, ListingInterrupted, Refused, encode_answer, unsendable_answer

SERVER_NAME = "walqueued/1"
RECV_BYTES = 256 * 1024
MAX_RECV_BYTES = 4 * 1024 * 1024
OUTPUT_HIGH_WATER_BYTES = 8 * 1024 * 1024
MAX_REQUESTS_PER_TURN_PER_CONNECTION = 1024
LARGE_FRAME_BYTES = 1024 * 1024
MAX_ADMITTED_INPUT_BYTES = 256 * 1024 * 1024
FRAME_GRACE_SECONDS = 10.0
MIN_FRAME_BYTES_PER_SECOND = 1024 * 1024
# Room beyond a full input budget, reserved for frames to complete: one largest frame.
OVERDRAFT_BYTES = protocol.LENGTH_PREFIX_BYTES + protocol.MAX_BODY_BYTES
RESERVED_GRACE_SECONDS = 1.0
RESERVED_BYTES_PER_SECOND = 32 * 1024 * 1024
# Listings cost the loop real time (sorting every id, encoding views), so a
# turn starts at most this many and encodes at most this many listing bytes
# across all connections; the rest continue in the next turns, which come
# right away, so many open listings slow each other, not everyone.
MAX_LISTINGS_STARTED_PER_TURN = 1
LISTING_BYTES_PER_TURN = 2 * 1024 * 1024


class ConnectionFault(Exception):
    """The peer broke the protocol: answer ``message`` fatally (for ``request_id``, with
    ``code``) and close."""

    def __init__(self, request_id: int | None, message: str, code: str = protocol.PROTOCOL_ERROR) -> None:
        super().__init__(message)
        self.request_id = request_id
        self.message = message
        self.code = code


class ListingBudget:
    """The listing bytes all connections may still encode in this turn."""

    def __init__(self) -> None:
        self.remaining_bytes = LISTING_BYTES_PER_TURN

    def renew(self) -> None:
        self.remaining_bytes = LISTING_BYTES_PER_TURN


# In a mask from `Selector.select`, for a socket watched for reading: its peer had not
# shut down its end when the poll ran (PEER_OPEN), or had (PEER_SHUT).
PEER_OPEN = 4
PEER_SHUT = 8


if hasattr(selectors, "EpollSelector"):
    class Selector(selectors.EpollSelector):
        """The epoll selector, which also tells whether a peer had shut down its end.

        Every registration for reading also watches EPOLLRDHUP, and `select`
        adds PEER_OPEN or PEER_SHUT to the mask of a socket watched for
        reading: the connection then knows without a syscall whether a lease
        may be handed to it in this turn (`PeerConnection.gone`).
        """

        _EVENT_READ = select.EPOLLIN | select.EPOLLRDHUP

        def select(self, timeout: float | None = None) -> list:
            # EpollSelector.select, with PEER_OPEN.
            if timeout is None:
                timeout = -1
            elif timeout <= 0:
                timeout = 0
            else:
                timeout = math.ceil(timeout * 1e3) * 1e-3  # wait at least timeout
            try:
                fd_event_list = self._selector.poll(timeout, len(self._fd_to_key) or 1)
            except InterruptedError:
                return []
            ready = []
            fd_to_key = self._fd_to_key
            for fd, event in fd_event_list:
                key = fd_to_key.get(fd)
                if key:
                    events = ((event & _NOT_READ and selectors.EVENT_WRITE)
                              | (event & _NOT_WRITE and selectors.EVENT_READ)) & key.events
                    if key.events & selectors.EVENT_READ:
                        events |= PEER_SHUT if event & _SHUT else PEER_OPEN
                    ready.append((key, events))
            return ready

    _NOT_READ = ~(select.EPOLLIN | select.EPOLLRDHUP)
    _NOT_WRITE = ~select.EPOLLOUT
    _SHUT = select.EPOLLRDHUP | select.EPOLLHUP | select.EPOLLERR
else:  # no epoll: connections peek instead
    Selector = selectors.DefaultSelector


def peer_credentials(sock: socket.socket) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the connected peer via SO_PEERCRED, or None if unsupported."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", raw)


@dataclass(eq=False)
class PeerConnection:
    """One client's connection as the daemon holds it (the service's ``Peer``); see the module
    docstring. Not ``walqueue.client.Connection``, the client's end."""

    sock: socket.socket
    name: str
    reader: protocol.FrameReader = field(
        default_factory=lambda: protocol.FrameReader(protocol.MAX_HELLO_BYTES, request_bounds=True))
    out: bytearray = field(default_factory=bytearray)
    greeted: bool = False
    protocol_version: int = protocol.PROTOCOL_VERSION  # the one its hello announced (service.Peer)
    eof: bool = False
    closing: bool = False  # a fatal error was queued: close once it is sent
    fatal: protocol.Error | None = None  # that error, sent after the answers to earlier requests
    # Answers not encoded yet, in order: (request id, iterator of messages, lazy).
    backlog: deque = field(default_factory=deque)
    # Requests decoded but not applied yet (see the module docstring).
    deferred: deque = field(default_factory=deque)
    turn: int = -1  # the loop turn turn_requests belongs to
    turn_requests: int = 0  # requests of it applied in that turn
    answer_bytes: int = 0  # encoded answer bytes the service produced for it (service.Peer)
    delivered_bytes: int = 0  # of those, the ones moved into out or backlog
    admitted: int = 0  # bytes received of its large frame in progress, counted in the InputBudget
    input_waiting: bool = False  # its large frame waits for room in the input budget
    reserved: int = 0  # room reserved for its large frame in progress to complete (InputBudget)
    reserved_frame: int = -1  # the reader's frame that room is for
    reserved_deadline_seconds: float | None = None  # monotonic: when that frame must then be in
    frame_deadline_seconds: float | None = None  # monotonic: when its frame in progress must be in
    deadline_frame: int = -1  # the reader's frame frame_deadline_seconds is for
    closed: bool = False
    parked: int = 0  # its waiting reserves (service.Peer)
    events: int = 0  # the selector events it is registered for
    # What this turn's poll saw of the peer's end (Selector): True open, False shut,
    # None not seen (not polled for reading this turn). Reset by the loop every turn.
    peer_open_at_poll: bool | None = None

    # -- input ------------------------------------------------------------------

    def receive(self, buffer: bytearray, view: memoryview) -> bool:
        """Read what the socket has into the frame reader; False if it had nothing yet.

        Sets ``eof`` at the end of the stream. Raises OSError if the read failed.
        """
        size = max(RECV_BYTES, min(self.reader.wanted_bytes(), MAX_RECV_BYTES))
        try:
            # Into one reused buffer: a fresh 256 KiB bytes per recv would cost
            # an mmap/mremap/munmap per request.
            received = self.sock.recv_into(buffer, size)
        except (BlockingIOError, InterruptedError):
            return False
        if not received:
            self.eof = True
            return True
        self.reader.feed(view[:received])
        return True

    def decode(self, requests: list, budget: InputBudget) -> None:
        """Append ``(self, request)`` for every complete request received; answer the hello.

        Stops at a large frame that does not fit in ``budget`` (``input_waiting``).
        Raises ConnectionFault at the first protocol violation.
        """
        while not self.closing:
            try:
                body = self.reader.next_body()
                if body is None:
                    budget.admit(self)
                    return
                request = protocol.decode_request(body)
            except protocol.RequestRefused as exc:
                if exc.args[1] is None or not self.greeted:
                    raise ConnectionFault(exc.args[1], str(exc.args[0]), exc.code) from exc
                # Framing is intact: only this request is refused, in its turn.
                requests.append((self, Refused(exc.args[1], str(exc.args[0]))))
                continue
            except protocol.ProtocolError as exc:
                request_id = exc.args[1] if len(exc.args) > 1 else None
                raise ConnectionFault(request_id, str(exc.args[0]), exc.code) from exc
            if not self.greeted:
                self._greet(request)
                continue
            if isinstance(request, protocol.Hello):
                raise ConnectionFault(request.id, "hello sent twice on one connection")
            requests.append((self, request))

    def _greet(self, request: protocol.Request) -> None:
        if not isinstance(request, protocol.Hello):
            raise ConnectionFault(request.id, f"expected hello first, got {type(request).__name__.lower()}")
        if request.version not in protocol.DAEMON_PROTOCOL_VERSIONS:
            if request.version > protocol.DAEMON_PROTOCOL_VERSIONS[-1]:
                # A newer client reads all that this daemon sends: the refusal carries its code.
                self.protocol_version = protocol.DAEMON_PROTOCOL_VERSIONS[-1]
            spoken = ", ".join(map(str, protocol.DAEMON_PROTOCOL_VERSIONS))
            raise ConnectionFault(request.id, f"protocol version {request.version} is not supported; "
                                              f"this daemon speaks versions {spoken}",
                                  protocol.UNSUPPORTED_VERSION)
        self.greeted = True
        self.protocol_version = request.version
        self.reader.max_body_bytes = protocol.MAX_BODY_BYTES
        reports_versions = request.version >= protocol.VERSION_REPORTING_VERSION
        self.out += protocol.encode(protocol.HelloOk(
            id=request.id, version=request.version, server=SERVER_NAME,
            max_body_bytes=protocol.MAX_BODY_BYTES,
            walqueue_version=walqueue.__version__ if reports_versions else ""))
        if request.client:
            self.name += f" client={request.client[:64]!r}"

    def fail(self, request_id: int | None, message: str, code: str = protocol.PROTOCOL_ERROR) -> None:
        """Queue the fatal answer to a protocol violation; nothing more is read or applied."""
        log.warning("protocol error from %s: %s", self.name, one_line(message))
        self.fatal = protocol.Error(id=request_id, error="InvalidRequest", message=message, fatal=True,
                                    code=code)
        self.closing = True
        # Requests deferred behind unread answers are dropped with the connection.
        self.deferred.clear()

    def gone(self) -> bool:
        """True if the peer has closed (checked without consuming anything).

        Its reading side may be off (answers piling up), so end of stream is
        looked for here too before a lease is handed to it: from this turn's
        poll when it saw the connection (no syscall: a reserve's common case),
        else with a peek.
        """
        if self.eof or self.closed:
            return True
        if self.peer_open_at_poll is not None:
            return not self.peer_open_at_poll
        try:
            return self.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    # -- deferral -------------------------------------------------------------------

    def saturated(self, turn: int) -> bool:
        """True if this connection must not have more requests applied in ``turn``."""
        if self.turn != turn:
            self.turn, self.turn_requests = turn, 0
        return bool(
            self.backlog
            or len(self.out) + self.answer_bytes - self.delivered_bytes >= OUTPUT_HIGH_WATER_BYTES
            or self.turn_requests >= MAX_REQUESTS_PER_TURN_PER_CONNECTION
        )

    def can_resume(self) -> bool:
        """True once a connection with deferred requests has read enough of its answers."""
        return not self.backlog and len(self.out) < OUTPUT_HIGH_WATER_BYTES

    # -- output ------------------------------------------------------------------------

    def deliver(self, request_id: int | None, messages: bytes | object) -> None:
        """Take an answer from the service: encoded bytes, or a lazy listing."""
        if type(messages) is bytes:
            self.delivered_bytes += len(messages)
            if not self.backlog and len(self.out) < OUTPUT_HIGH_WATER_BYTES:
                self.out += messages  # the common case: straight out
            else:
                self.backlog.append((request_id, iter((messages,)), False))
        else:
            self.backlog.append((request_id, messages, True))

    def queue_fatal(self) -> None:
        """Put the fatal answer behind everything owed before it."""
        if self.fatal is not None:
            self.backlog.append((self.fatal.id, iter([self.fatal]), False))
            self.fatal = None

    def fill(self, budget: ListingBudget) -> None:
        """Move backlog answers into ``out`` until it reaches the high-water mark.

        Encoded answers move freely; a lazy listing is encoded only while the
        turn's listing budget lasts.
        """
        while self.backlog and len(self.out) < OUTPUT_HIGH_WATER_BYTES:
            request_id, messages, lazy = self.backlog[0]
            if lazy and budget.remaining_bytes <= 0:
                return
            try:
                message = next(messages, None)
                if message is None:
                    self.backlog.popleft()
                    continue
                if isinstance(message, bytes):
                    self.out += message
                else:
                    encoded = encode_answer(self, [message])
                    self.out += encoded
                    if lazy:
                        budget.remaining_bytes -= len(encoded)
            except ListingInterrupted as exc:
                self.backlog.popleft()
                self.out += encode_answer(self, [protocol.Error(
                    id=request_id, error="QueueClosed", message=str(exc), code=protocol.LISTING_INTERRUPTED)])
            except ENCODING_ERRORS as exc:
                self.backlog.popleft()  # the error ends this answer
                self.out += unsendable_answer(self, request_id, exc)

    def send(self, budget: ListingBudget) -> OSError | None:
        """Send what the socket takes; returns the error if sending failed (then close it)."""
        self.fill(budget)
        while self.out and not self.closed:
            try:
                sent = self.sock.send(self.out)
            except (BlockingIOError, InterruptedError):
                return None
            except OSError as exc:
                self.out.clear()
                self.backlog.clear()
                return exc
            del self.out[:sent]
            self.fill(budget)
        return None

    # -- what it needs from the loop --------------------------------------------------

    def close_reason(self) -> str | None:
        """Why it should close now (nothing left to send or wait for), or None."""
        if not self.out and not self.backlog and not self.parked:
            if self.closing:
                return "protocol error"
            if self.eof and not self.deferred:
                return "closed by peer"
        return None

    def wanted_events(self) -> int:
        """The selector events it needs now."""
        wanted = 0
        if (not self.eof and not self.closing and not self.backlog and not self.deferred
                and not self.input_waiting and len(self.out) < OUTPUT_HIGH_WATER_BYTES):
            wanted |= selectors.EVENT_READ
        if self.out or self.backlog:
            wanted |= selectors.EVENT_WRITE
        return wanted


class InputBudget:
    """The bytes received of large frames in progress, across all connections (module docstring)."""

    def __init__(self, max_bytes: int = MAX_ADMITTED_INPUT_BYTES,
                 overdraft_bytes: int = OVERDRAFT_BYTES) -> None:
        self.max_bytes = max_bytes
        self.overdraft_bytes = overdraft_bytes
        self.admitted_total = 0  # sum of PeerConnection.admitted
        self.reserved_total = 0  # sum of PeerConnection.reserved
        self.waiting: set[PeerConnection] = set()  # connections with input_waiting

    def admit(self, connection: PeerConnection) -> bool:
        """Count what the connection received of its large frame in progress; may it read more?

        Returns False while the received bytes of all large frames fill the
        budget and this frame has no room reserved to complete: read nothing
        more from it for now (`waiting`, until `grant`).
        """
        reader = connection.reader
        length = reader.pending_length()
        large = length is not None and length >= LARGE_FRAME_BYTES
        if not large and not connection.admitted and not connection.input_waiting and not connection.reserved:
            return True  # the common case: no large frame, now or before
        if connection.reserved and connection.reserved_frame != reader.frames_done:
            self._unreserve(connection)  # the frame it was for is in
        received = reader.buffered_bytes if large else 0
        self.admitted_total += received - connection.admitted
        connection.admitted = received
        if large and not connection.reserved and self.admitted_total >= self.max_bytes:
            if not connection.input_waiting:
                connection.input_waiting = True
                self.waiting.add(connection)
            return False
        connection.input_waiting = False
        self.waiting.discard(connection)
        return True

    def grant(self, monotonic_seconds: float) -> list[PeerConnection]:
        """The waiting connections that may read on now: all of them once the budget has room,
        else those with the fewest bytes left, while what they lack fits the free overdraft
        (each then reserved its room, and RESERVED_GRACE_SECONDS plus what it lacks at
        RESERVED_BYTES_PER_SECOND to use it)."""
        if self.admitted_total < self.max_bytes:
            ready = list(self.waiting)
        else:
            ready = []
            for connection in sorted(self.waiting, key=lambda waiting: waiting.reader.wanted_bytes()):
                lacking = connection.reader.wanted_bytes()
                if self.reserved_total + lacking > self.overdraft_bytes:
                    break
                connection.reserved, connection.reserved_frame = lacking, connection.reader.frames_done
                connection.reserved_deadline_seconds = (monotonic_seconds + RESERVED_GRACE_SECONDS
                                                        + lacking / RESERVED_BYTES_PER_SECOND)
                self.reserved_total += lacking
                ready.append(connection)
        for connection in ready:
            connection.input_waiting = False
            self.waiting.discard(connection)
        return ready

    def _unreserve(self, connection: PeerConnection) -> None:
        self.reserved_total -= connection.reserved
        connection.reserved, connection.reserved_frame = 0, -1
        connection.reserved_deadline_seconds = None

    def release(self, connection: PeerConnection) -> None:
        """Forget a closed connection's frame in progress."""
        self.admitted_total -= connection.admitted
        connection.admitted = 0
        self._unreserve(connection)
        connection.input_waiting = False
        self.waiting.discard(connection)


class FrameDeadlines:
    """When each connection's frame in progress must have arrived (module docstring).

    A heap of (deadline, number, connection); an entry whose connection has
    completed that frame, closed, or got an earlier deadline is skipped lazily.
    """

    def __init__(self) -> None:
        self._heap: list[tuple[float, int, PeerConnection]] = []
        self._count = 0

    def track(self, connection: PeerConnection, monotonic_seconds: float) -> None:
        """Start, keep or end the deadline of the connection's frame in progress.

        A frame gets its deadline once, when its length prefix is first seen;
        bytes arriving, or waiting for the budget, never move it later. Room
        reserved for it in the budget may bring it earlier.
        """
        reader = connection.reader
        length = reader.pending_length()
        if length is None or connection.closing:
            connection.frame_deadline_seconds = None
            return
        deadline = connection.frame_deadline_seconds
        if connection.deadline_frame != reader.frames_done or deadline is None:
            connection.deadline_frame = reader.frames_done
            deadline = monotonic_seconds + FRAME_GRACE_SECONDS + length / MIN_FRAME_BYTES_PER_SECOND
            self._push(connection, deadline)
        reserved = connection.reserved_deadline_seconds
        if reserved is not None and connection.reserved_frame == reader.frames_done and reserved < deadline:
            self._push(connection, reserved)

    def _push(self, connection: PeerConnection, deadline: float) -> None:
        connection.frame_deadline_seconds = deadline
        self._count += 1
        heapq.heappush(self._heap, (deadline, self._count, connection))

    def _live_head(self) -> tuple[float, int, PeerConnection] | None:
        while self._heap:
            deadline, _, connection = self._heap[0]
            if connection.closed or connection.frame_deadline_seconds != deadline:
                heapq.heappop(self._heap)
                continue
            return self._heap[0]
        return None

    def next_deadline(self) -> float | None:
        head = self._live_head()
        return None if head is None else head[0]

    def expired(self, monotonic_seconds: float) -> list[PeerConnection]:
        """The connections whose frame in progress is past its deadline (their deadlines end)."""
        late = []
        while (head := self._live_head()) is not None and head[0] <= monotonic_seconds:
            heapq.heappop(self._heap)
            head[2].frame_deadline_seconds = None
            late.append(head[2])
        return late


def late_frame_message(connection: PeerConnection) -> str:
    """The fatal error for a frame not received in time: what the daemon needs, in numbers."""
    length = connection.reader.pending_length() or 0
    message = (f"frame of {length} bytes not received in time: {connection.reader.buffered_bytes} bytes "
               f"arrived; once its length prefix is in, a frame must arrive within "
               f"{FRAME_GRACE_SECONDS:g} s plus {MIN_FRAME_BYTES_PER_SECOND} bytes per second of its length")
    if connection.reserved:
        message += (f", and one given room to complete while others waited for the input budget within "
                    f"{RESERVED_GRACE_SECONDS:g} s plus {RESERVED_BYTES_PER_SECOND} bytes per second of what "
                    f"it lacked ({connection.reserved} bytes)")
    return message
