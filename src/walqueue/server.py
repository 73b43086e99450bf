"""walqueued: one process owning one Queue, serving local workers over a Unix socket.

The loop (``selectors``, single thread) and why it is shaped this way:

* One loop turn = one ``select()`` call. Every request whose bytes arrived
  for that turn is decoded, then ALL of them are applied inside ONE
  ``Queue.batch()``, so they share one fsync (group commit). Their answers are
  queued for sending only after the batch has exited without error: no answer
  ever reports success for a write that is not on disk yet. While one batch
  is fsyncing, the next requests accumulate in the kernel's socket buffers and
  become the next turn's batch, so the batch size adapts to the load.
* The Queue is synchronous and the fsync blocks the whole process anyway, so
  asyncio would add scheduling we cannot use and hide where a turn ends;
  ``selectors`` makes the turn boundary explicit (see docs/protocol.md).
* Time: ``now = max(int(time.time()), last_now)`` once per turn; clients
  cannot set it. A lease of L seconds therefore lasts between L-1 and L
  seconds of wall time.
* Blocking reserve: a ``reserve`` with ``wait > 0`` that leased nothing is
  parked in arrival order. Parked reserves are retried at the start of every
  turn and right after every request that can make a task due (put,
  put_many, release, revive); the select timeout is the queue's next due time
  (earliest ready ``available_at`` or lease ``deadline``), so a delay elapsing
  or a lease expiring wakes them without any polling loop.
* A failed write (the batch raising anything but the per-request errors
  InvalidRequest, KeyConflict and StaleLease) answers every request of the
  turn with ``QueueClosed``, drops the Queue and opens it again from disk;
  if that fails the daemon exits non-zero for its supervisor.

Bounds: ``--max-connections`` open connections, each of which must say
hello within ``--hello-timeout``; a request body of at most
``protocol.MAX_BODY_BYTES`` (checked from the length prefix before the body
is read); a connection whose unsent answers exceed OUTPUT_HIGH_WATER_BYTES is
not read from until they drain, and a long ``tasks`` listing is encoded only
as fast as its client reads it.
"""

from __future__ import annotations

import heapq
import importlib
import logging
import os
import resource
import selectors
import signal
import socket
import stat
import struct
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field

import click
import msgspec

from walqueue import (
    CorruptStore,
    InvalidRequest,
    KeyConflict,
    Lease,
    PutRequest,
    Queue,
    QueueLocked,
    StaleLease,
    validation,
)
from walqueue import protocol as p
from walqueue.client import unix_address
from walqueue.metrics import Recorder, render_prometheus
from walqueue.metrics_http import ListenError, MetricsEndpoint, parse_listen
from walqueue.wal import MAX_PREALLOCATE_BYTES

log = logging.getLogger("walqueued")

SERVER_NAME = "walqueued/1"
SOCKET_NAME = "walqueued.sock"
DEFAULT_SOCKET_MODE = 0o660
DEFAULT_COMPACT_WAL_BYTES = 64 * 1024 * 1024
# Off by default: with a preallocated segment, a frame torn by a power cut (or a
# write cut short at a page boundary by SIGKILL) is followed by zeros, which
# SPEC §5 makes CorruptStore — a daemon that will not start until an operator
# cuts the segment. Appending, the same tear is a torn tail, cut at open. The
# 13-25% it buys per sync is not worth a manual step after a crash by default.
DEFAULT_PREALLOCATE_WAL_BYTES = 0
DEFAULT_MAX_CONNECTIONS = 1024
RECV_BYTES = 256 * 1024
MAX_RECV_BYTES = 4 * 1024 * 1024
OUTPUT_HIGH_WATER_BYTES = 8 * 1024 * 1024
DRAIN_SECONDS = 5.0
ACCEPT_PAUSE_SECONDS = 0.5
DEFAULT_HELLO_TIMEOUT_SECONDS = 10.0
# A connection's share of one turn: beyond this many requests, or once its
# answers reach OUTPUT_HIGH_WATER_BYTES, its further requests wait for a later
# turn, so one pipelining client can neither pin memory nor hold up the rest.
MAX_REQUESTS_PER_TURN_PER_CONNECTION = 1024
MAX_PARKED_PER_CONNECTION = 64
# Listings cost the loop real time (sorting every id, encoding views), so a
# turn starts at most this many and encodes at most this many listing bytes
# across all connections; the rest continue in the next turns, which come
# right away, so many open listings slow each other, not everyone.
# Large request frames being received share one budget: a frame of at least
# LARGE_FRAME_BYTES is read only once its whole body fits in what is left of
# MAX_ADMITTED_INPUT_BYTES (or nothing else is admitted), so half-sent frames
# cannot add up to max-connections x 17 MiB; admitted frames always complete.
LARGE_FRAME_BYTES = 1024 * 1024
MAX_ADMITTED_INPUT_BYTES = 256 * 1024 * 1024
MAX_LISTINGS_STARTED_PER_TURN = 1
LISTING_BYTES_PER_TURN = 2 * 1024 * 1024
# While recovery runs, systemd hears from us this often, and each message
# extends its start timeout by RECOVERY_EXTEND_USEC from then.
RECOVERY_REPORT_SECONDS = 2.0
RECOVERY_EXTEND_USEC = 30_000_000
# Descriptors the daemon needs besides its connections (listener, selector,
# wakeup pair, WAL segment, lock, directory fsyncs, notify socket, logs).
RESERVED_DESCRIPTORS = 32
# A timer never sleeps longer than this, so a wall clock set backwards far
# cannot postpone due work indefinitely (the clock rule still decides).
MAX_TIMER_SECONDS = 60.0
SD_LISTEN_FDS_START = 3

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_LOCKED = 3
EXIT_CORRUPT = 4

# Errors a request can cause without the Queue writing anything; the batch
# goes on. Anything else raised inside a batch means the write path failed.
REQUEST_ERRORS = (InvalidRequest, KeyConflict, StaleLease)


def one_line(text: str) -> str:
    """``text`` with every non-printable character escaped, for a log line.

    Client bytes reach log messages (e.g. an unknown field's name in a
    decode error); a newline there must not start a forged log line.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)


class ListingInterrupted(Exception):
    """A lazily produced ``tasks`` answer outlived the Queue it was reading."""


class DaemonExit(Exception):
    """Stop serving and exit with ``code`` (after the usual cleanup)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code


# -- systemd integration (stdlib only) ----------------------------------------


class Notifier:
    """sd_notify over the datagram socket named by NOTIFY_SOCKET (no-op when unset)."""

    def __init__(self, environ: dict[str, str]) -> None:
        path = environ.get("NOTIFY_SOCKET", "")
        self._address = ("\0" + path[1:]) if path.startswith("@") else path
        self._socket: socket.socket | None = None
        if self._address:
            self._socket = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM | socket.SOCK_CLOEXEC)
        self.watchdog_seconds: float | None = None
        usec = environ.get("WATCHDOG_USEC", "")
        watchdog_pid = environ.get("WATCHDOG_PID", "")
        if usec.isdigit() and int(usec) > 0 and (not watchdog_pid or watchdog_pid == str(os.getpid())):
            # Ping at half the interval, as sd_watchdog_enabled(3) advises.
            self.watchdog_seconds = int(usec) / 2 / 1_000_000

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


def bind_listener(path: str, mode: int) -> socket.socket:
    """Create the listening socket at ``path`` with permissions ``mode``.

    A socket file nobody answers on (left by a dead owner) is replaced.
    Raises DaemonExit if the path is not a socket or a live server answers on it.
    """
    if os.path.lexists(path):
        if not stat.S_ISSOCK(os.lstat(path).st_mode):
            raise DaemonExit(EXIT_USAGE, f"{path} exists and is not a socket; refusing to replace it")
        probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            probe.settimeout(1.0)
            with unix_address(path) as address:
                probe.connect(address)
        except (ConnectionRefusedError, FileNotFoundError):
            log.info("replacing stale socket %s", path)
            os.unlink(path)
        except OSError as exc:
            raise DaemonExit(EXIT_FAILURE, f"cannot probe existing socket {path}: {exc}") from exc
        else:
            raise DaemonExit(EXIT_LOCKED, f"another server is listening on {path}")
        finally:
            probe.close()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
    # Bind with every permission bit masked so no one can connect before the
    # chmod below sets exactly the requested mode.
    old_umask = os.umask(0o777)
    try:
        with unix_address(path) as address:
            listener.bind(address)
    except OSError as exc:
        listener.close()
        raise DaemonExit(EXIT_FAILURE, f"cannot bind {path}: {exc}") from exc
    finally:
        os.umask(old_umask)
    os.chmod(path, mode)
    listener.listen(socket.SOMAXCONN)
    listener.setblocking(False)
    return listener


def peer_credentials(sock: socket.socket) -> tuple[int, int, int] | None:
    """(pid, uid, gid) of the connected peer via SO_PEERCRED, or None if unsupported."""
    try:
        raw = sock.getsockopt(socket.SOL_SOCKET, socket.SO_PEERCRED, struct.calcsize("3i"))
    except (OSError, AttributeError):
        return None
    return struct.unpack("3i", raw)


# -- connections and pending work --------------------------------------------


@dataclass(eq=False)
class Connection:
    sock: socket.socket
    name: str
    reader: p.FrameReader = field(default_factory=lambda: p.FrameReader(p.MAX_HELLO_BYTES))
    out: bytearray = field(default_factory=bytearray)
    greeted: bool = False
    eof: bool = False
    closing: bool = False  # a fatal error was queued: close once it is sent
    fatal: p.Error | None = None  # that error, sent after the answers to earlier requests
    # Answers not encoded yet, in order: (request id, iterator of messages).
    # Encoded into `out` only while `out` is below OUTPUT_HIGH_WATER_BYTES, so
    # a long listing is produced as fast as the client reads it.
    backlog: deque = field(default_factory=deque)
    # Requests decoded but not applied yet because this connection's unsent
    # answers reached the high-water mark (or its per-turn share): applied,
    # in order, in a later turn once the client has read. No new bytes are
    # read from it meanwhile.
    deferred: deque = field(default_factory=deque)
    turn: int = -1  # the turn the two counters below belong to
    turn_bytes: int = 0  # encoded answer bytes produced for it in that turn
    turn_requests: int = 0  # requests of it applied in that turn
    admitted: int = 0  # body bytes of its large frame in progress, counted in the input budget
    input_waiting: bool = False  # its large frame waits for room in the input budget
    closed: bool = False
    parked: int = 0
    events: int = 0


@dataclass(eq=False)
class Parked:
    conn: Connection
    request: p.Reserve
    deadline: float  # time.monotonic() at which the wait ends
    turn: int
    done: bool = False


class ParkedReserves:
    """Waiting reserves: arrival order for serving, a heap of deadlines for the timer.

    Entries leave by being marked done (served, expired, dropped); done
    entries are skipped lazily, so serving the head, finding the next deadline
    and expiring waits cost O(log n), not O(n), per loop turn.
    """

    def __init__(self) -> None:
        self._arrivals: deque[Parked] = deque()
        self._deadlines: list[tuple[float, int, Parked]] = []
        self._counter = 0
        self.live = 0

    def __bool__(self) -> bool:
        return self.live > 0

    def add(self, entry: Parked) -> None:
        self._arrivals.append(entry)
        self._counter += 1
        heapq.heappush(self._deadlines, (entry.deadline, self._counter, entry))
        entry.conn.parked += 1
        self.live += 1

    def _finish(self, entry: Parked) -> None:
        entry.done = True
        entry.conn.parked -= 1
        self.live -= 1
        if len(self._arrivals) > 2 * self.live + 64:
            self._arrivals = deque(e for e in self._arrivals if not e.done)
            self._deadlines = [item for item in self._deadlines if not item[2].done]
            heapq.heapify(self._deadlines)

    def head(self) -> Parked | None:
        """The longest-waiting live entry."""
        while self._arrivals and self._arrivals[0].done:
            self._arrivals.popleft()
        return self._arrivals[0] if self._arrivals else None

    def finish_head(self) -> Parked:
        entry = self._arrivals.popleft()
        self._finish(entry)
        return entry

    def next_deadline(self) -> float | None:
        while self._deadlines and self._deadlines[0][2].done:
            heapq.heappop(self._deadlines)
        return self._deadlines[0][0] if self._deadlines else None

    def expire(self, clock: float) -> list[Parked]:
        """Finish and return the live entries whose wait ended by ``clock``."""
        ended = []
        while (deadline := self.next_deadline()) is not None and deadline <= clock:
            entry = heapq.heappop(self._deadlines)[2]
            self._finish(entry)
            ended.append(entry)
        return ended

    def drop(self, predicate: Callable[[Parked], bool]) -> list[Parked]:
        """Finish and return the live entries matching ``predicate`` (O(n); rare events)."""
        dropped = [entry for entry in self._arrivals if not entry.done and predicate(entry)]
        for entry in dropped:
            self._finish(entry)
        return dropped


@dataclass(eq=False)
class Answer:
    conn: Connection
    request_id: int | None
    messages: object  # the encoded frames (bytes), or a lazy iterator of messages (a listing)


_LISTENER = object()
_WAKEUP = object()


class Server:
    """The event loop. ``run()`` serves until SIGTERM/SIGINT and returns an exit code."""

    def __init__(
        self,
        directory: str,
        queue: Queue,
        listener: socket.socket,
        *,
        socket_path: str | None,
        compact_wal_bytes: int,
        max_connections: int,
        hook: Callable[[str], None] | None,
        notifier: Notifier,
        hello_timeout: float = DEFAULT_HELLO_TIMEOUT_SECONDS,
        preallocate_wal_bytes: int = DEFAULT_PREALLOCATE_WAL_BYTES,
        recovery_seconds: float = 0.0,
        metrics_endpoint: MetricsEndpoint | None = None,
    ) -> None:
        self.hello_timeout = hello_timeout
        self.preallocate_wal_bytes = preallocate_wal_bytes
        self.directory = directory
        self.queue = queue
        self.listener = listener
        self.socket_path = socket_path  # unlinked at exit; None when systemd owns it
        self.compact_wal_bytes = compact_wal_bytes
        self.max_connections = max_connections
        self.hook = hook
        self.notifier = notifier
        self.selector = selectors.DefaultSelector()
        self.connections: dict[int, Connection] = {}
        self.parked = ParkedReserves()
        self.paused = False  # walqueue-ctl pause: every reserve gets nothing (see _reserve)
        self.backup_holder: Connection | None = None  # the connection pinning a backup's files
        self.last_now = 0
        self.turn = 0
        self.stopping = False
        self._answers: list[Answer] = []
        self._turn_requests: list[tuple[Connection, int]] = []
        self._next_watchdog = time.monotonic()
        self._accept_paused_until: float | None = None
        self.queue_epoch = 0  # bumped whenever the Queue is dropped after a failure
        self._touched: set[Connection] = set()  # connections with news this turn
        self._deferring: set[Connection] = set()  # connections with deferred requests
        self._admitted_total = 0  # sum of Connection.admitted
        self._input_paused: set[Connection] = set()  # connections with input_waiting
        self._listing_budget = LISTING_BYTES_PER_TURN
        self._listings_started = 0
        self._receive_buffer = bytearray(MAX_RECV_BYTES)
        self._receive_view = memoryview(self._receive_buffer)
        # (deadline, connection) in accept order, so deadlines are ascending.
        self._awaiting_hello: deque[tuple[float, Connection]] = deque()
        self._wake_read, self._wake_write = socket.socketpair()
        self._wake_read.setblocking(False)
        self._wake_write.setblocking(False)
        self.metrics = Recorder(next_seq=queue.stats().last_seq + 1, now=self.now(),
                                recovery_seconds=recovery_seconds)
        self.metrics_endpoint = metrics_endpoint  # GET /metrics; rendered by this loop only

    # -- time -----------------------------------------------------------------

    def now(self) -> int:
        """Whole seconds of wall time, never going backwards."""
        self.last_now = max(int(time.time()), self.last_now)
        return self.last_now

    # -- main loop -------------------------------------------------------------

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        previous_wakeup = signal.set_wakeup_fd(self._wake_write.fileno(), warn_on_full_buffer=False)
        self.selector.register(self.listener, selectors.EVENT_READ, _LISTENER)
        self.selector.register(self._wake_read, selectors.EVENT_READ, _WAKEUP)
        code = EXIT_OK
        try:
            self.notifier.notify("READY=1\nSTATUS=serving " + self.directory)
            if self.metrics_endpoint is not None:
                self.metrics_endpoint.start(self._wake_loop)
            log.info("ready: serving %s", self.directory)
            while not self.stopping:
                self._one_turn()
        except DaemonExit as exc:
            log.critical("%s", exc)
            code = exc.code
        finally:
            self._shutdown()
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return code

    def _one_turn(self) -> None:
        if self._accept_paused_until is not None and time.monotonic() >= self._accept_paused_until:
            self._accept_paused_until = None
            self.selector.register(self.listener, selectors.EVENT_READ, _LISTENER)
        events = self.selector.select(self._timeout())
        self._listing_budget = LISTING_BYTES_PER_TURN
        self._listings_started = 0
        requests: list[tuple[Connection, p.Request]] = []
        for key, mask in events:
            if key.data is _LISTENER:
                self._accept()
            elif key.data is _WAKEUP:
                self._drain_wakeup()
            else:
                conn: Connection = key.data
                self._touched.add(conn)
                if mask & selectors.EVENT_WRITE:
                    self._send(conn)
                if mask & selectors.EVENT_READ and not conn.closed:
                    self._receive(conn, requests)
        self.turn += 1
        self._expire_hellos()
        wrote = self._apply(requests)
        self._expire_waits()
        self._queue_answers()
        # Only connections this turn touched can need sending or new
        # interests: idle connections cost nothing per turn.
        for conn in list(self._input_paused):
            if self._admit(conn):
                self._touched.add(conn)
        touched, self._touched = self._touched, set()
        for conn in touched:
            if conn.closed:
                continue
            if conn.out:
                self._send(conn)
            self._settle(conn)
        self._watchdog()
        if wrote:
            self._maybe_compact()
        if self.metrics_endpoint is not None and self.metrics_endpoint.wanted:
            self.metrics_endpoint.publish(render_prometheus(self._daemon_stats(self.now())))

    def _expire_hellos(self) -> None:
        """Close connections that did not say hello in time: they hold a slot for nothing."""
        clock = time.monotonic()
        while self._awaiting_hello:
            deadline, conn = self._awaiting_hello[0]
            if conn.greeted or conn.closed:
                self._awaiting_hello.popleft()
            elif deadline <= clock:
                self._awaiting_hello.popleft()
                if not conn.closing:
                    self._fatal(conn, None, f"no hello within {self.hello_timeout:g} s")
            else:
                return

    def _timeout(self) -> float | None:
        if any(self._can_resume(conn) for conn in self._deferring):
            return 0.0  # deferred requests can go now: no event will announce it
        deadlines: list[float] = []
        if self._awaiting_hello:
            deadlines.append(self._awaiting_hello[0][0] - time.monotonic())
        if self._accept_paused_until is not None:
            deadlines.append(self._accept_paused_until - time.monotonic())
        if self.notifier.watchdog_seconds is not None:
            deadlines.append(self._next_watchdog - time.monotonic())
        if self.parked:
            deadlines.append(self.parked.next_deadline() - time.monotonic())
            due = None if self.paused else self._next_due()  # paused: a due task wakes no one
            if due is not None:
                if due <= self.last_now:
                    # Should not happen (a due task would have been leased);
                    # never spin on it.
                    deadlines.append(1.0)
                else:
                    # +1 ms so int(time.time()) has reached `due` on waking.
                    deadlines.append(due - time.time() + 0.001)
        if not deadlines:
            return None
        return min(MAX_TIMER_SECONDS, max(0.0, min(deadlines)))

    def _next_due(self) -> int | None:
        """Earliest ready available_at or lease deadline: O(1) from the library's heaps."""
        return self.queue.next_due_time()

    def _watchdog(self, *, force: bool = False) -> None:
        if self.notifier.watchdog_seconds is None:
            return
        if force or time.monotonic() >= self._next_watchdog:
            self.notifier.notify("WATCHDOG=1")
            self._next_watchdog = time.monotonic() + self.notifier.watchdog_seconds

    def _wake_loop(self) -> None:
        """Called from another thread (the metrics endpoint): end the current select."""
        try:
            self._wake_write.send(b"\0")
        except OSError:
            pass  # buffer full (a wakeup is pending anyway) or shutting down

    def _daemon_stats(self, now: int):
        return self.metrics.report(
            self.queue, now=now, connections=len(self.connections), parked_reserves=self.parked.live,
            # The pause switch of issue 6 sets `self.paused` once merged.
            paused=self.paused,
            compact_wal_bytes=self.compact_wal_bytes, directory=self.directory)

    def _drain_wakeup(self) -> None:
        try:
            while self._wake_read.recv(4096):
                pass
        except BlockingIOError:
            pass

    # -- connections -------------------------------------------------------------

    def _accept(self) -> None:
        while True:
            try:
                sock, _ = self.listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                # EMFILE and friends: the listener stays readable, so stop
                # watching it for a moment instead of spinning on it.
                log.error("accept failed, pausing accepts for %.1f s: %s", ACCEPT_PAUSE_SECONDS, exc)
                self.selector.unregister(self.listener)
                self._accept_paused_until = time.monotonic() + ACCEPT_PAUSE_SECONDS
                return
            sock.setblocking(False)
            credentials = peer_credentials(sock)
            name = f"fd={sock.fileno()}"
            if credentials is not None:
                name += f" pid={credentials[0]} uid={credentials[1]}"
            if len(self.connections) >= self.max_connections:
                log.warning("refused connection %s: %d connections open", name, len(self.connections))
                error = p.Error(
                    id=None,
                    error="WalQueueError",
                    message=f"too many connections ({self.max_connections}); try again later",
                    fatal=True,
                )
                try:
                    sock.send(p.encode(error))
                except OSError:
                    pass
                sock.close()
                continue
            conn = Connection(sock=sock, name=name)
            self.connections[sock.fileno()] = conn
            self._awaiting_hello.append((time.monotonic() + self.hello_timeout, conn))
            self._settle(conn)
            log.info("connect %s", name)

    def _close(self, conn: Connection, reason: str) -> None:
        if conn.closed:
            return
        conn.closed = True
        conn.deferred.clear()
        self._deferring.discard(conn)
        self._admitted_total -= conn.admitted
        conn.admitted = 0
        self._input_paused.discard(conn)
        if conn.events:
            self.selector.unregister(conn.sock)
            conn.events = 0
        self.connections.pop(conn.sock.fileno(), None)
        conn.sock.close()
        if self.backup_holder is conn:
            self.backup_holder = None
            log.warning("backup pin released: %s closed before ending its backup", conn.name)
        if conn.parked:
            self.parked.drop(lambda entry: entry.conn is conn)
        log.info("disconnect %s (%s)", conn.name, reason)

    def _settle(self, conn: Connection) -> None:
        """Register exactly the events the connection needs now, or close it."""
        if conn.closed:
            return
        if not conn.out and not conn.backlog and not conn.parked:
            if conn.closing or (conn.eof and not conn.deferred):
                self._close(conn, "protocol error" if conn.closing else "closed by peer")
                return
        wanted = 0
        if (not conn.eof and not conn.closing and not conn.backlog and not conn.deferred
                and not conn.input_waiting and len(conn.out) < OUTPUT_HIGH_WATER_BYTES):
            wanted |= selectors.EVENT_READ
        if conn.out or conn.backlog:
            wanted |= selectors.EVENT_WRITE
        if wanted == conn.events:
            return
        if conn.events == 0:
            self.selector.register(conn.sock, wanted, conn)
        elif wanted == 0:
            self.selector.unregister(conn.sock)
        else:
            self.selector.modify(conn.sock, wanted, conn)
        conn.events = wanted

    def _send(self, conn: Connection) -> None:
        self._fill(conn)
        while conn.out and not conn.closed:
            try:
                sent = conn.sock.send(conn.out)
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                conn.out.clear()
                conn.backlog.clear()
                self._close(conn, f"send failed: {exc}")
                return
            del conn.out[:sent]
            self._fill(conn)

    def _receive(self, conn: Connection, requests: list) -> None:
        size = max(RECV_BYTES, min(conn.reader.wanted_bytes(), MAX_RECV_BYTES))
        try:
            # Into one reused buffer: a fresh 256 KiB bytes per recv would cost
            # an mmap/mremap/munmap per request.
            received = conn.sock.recv_into(self._receive_buffer, size)
        except (BlockingIOError, InterruptedError):
            return
        except OSError as exc:
            self._close(conn, f"receive failed: {exc}")
            return
        if not received:
            conn.eof = True
            # A peer that closed (a killed worker looks the same) must never be
            # handed a lease: its waits end now, with no leases.
            self._end_waits(conn)
            return
        conn.reader.feed(self._receive_view[:received])
        while not conn.closing:
            try:
                body = conn.reader.next_body()
                if body is None:
                    if not self._admit(conn):
                        conn.input_waiting = True
                        self._input_paused.add(conn)
                    return
                request = p.decode_request(body)
            except p.ProtocolError as exc:
                request_id = exc.args[1] if len(exc.args) > 1 else None
                self._fatal(conn, request_id, str(exc.args[0]))
                return
            if not conn.greeted:
                if not isinstance(request, p.Hello):
                    self._fatal(conn, request.id, f"expected hello first, got {type(request).__name__.lower()}")
                    return
                if request.version != p.PROTOCOL_VERSION:
                    self._fatal(
                        conn,
                        request.id,
                        f"protocol version {request.version} is not supported; "
                        f"this daemon speaks version {p.PROTOCOL_VERSION}",
                    )
                    return
                conn.greeted = True
                conn.reader.max_body_bytes = p.MAX_BODY_BYTES
                conn.out += p.encode(
                    p.HelloOk(
                        id=request.id,
                        version=p.PROTOCOL_VERSION,
                        server=SERVER_NAME,
                        max_body_bytes=p.MAX_BODY_BYTES,
                    )
                )
                if request.client:
                    conn.name += f" client={request.client[:64]!r}"
                continue
            if isinstance(request, p.Hello):
                self._fatal(conn, request.id, "hello sent twice on one connection")
                return
            requests.append((conn, request))

    def _admit(self, conn: Connection) -> bool:
        """Count the connection's large frame in progress in the input budget, if it fits.

        Returns False if it does not fit: read nothing more from it for now.
        """
        length = conn.reader.pending_length()
        wanted = length if length is not None and length >= LARGE_FRAME_BYTES else 0
        if wanted == conn.admitted:
            conn.input_waiting = False
            self._input_paused.discard(conn)
            return True
        # The frame counted before has completed (or none was counted).
        self._admitted_total -= conn.admitted
        conn.admitted = 0
        if wanted and self._admitted_total and self._admitted_total + wanted > MAX_ADMITTED_INPUT_BYTES:
            return False
        conn.admitted = wanted
        self._admitted_total += wanted
        conn.input_waiting = False
        self._input_paused.discard(conn)
        return True

    def _fatal(self, conn: Connection, request_id: int | None, message: str) -> None:
        """Answer a protocol violation (after the answers already due) and close."""
        log.warning("protocol error from %s: %s", conn.name, one_line(message))
        conn.fatal = p.Error(id=request_id, error="InvalidRequest", message=message, fatal=True)
        conn.closing = True
        self._touched.add(conn)
        # Requests deferred behind unread answers are dropped with the connection.
        conn.deferred.clear()
        self._deferring.discard(conn)
        if conn.parked:  # the connection is closing: its waits end with it
            self.parked.drop(lambda entry: entry.conn is conn)

    # -- applying a turn ---------------------------------------------------------------

    def _apply(self, requests: list[tuple[Connection, p.Request]]) -> bool:
        """Apply a turn's requests in one batch; True if the batch may have written.

        Requests of a connection that is saturated (see _saturated) are
        deferred, in order, to a later turn instead.
        """
        resumed: list[tuple[Connection, p.Request]] = []
        for conn in list(self._deferring):
            if conn.closed:
                self._deferring.discard(conn)
            elif self._can_resume(conn):
                resumed.extend((conn, request) for request in conn.deferred)
                conn.deferred.clear()
                self._deferring.discard(conn)
                self._touched.add(conn)
        requests = resumed + requests
        if not requests and not self.parked:
            return False
        now = self.now()
        self._turn_requests = []
        answered_before = len(self._answers)
        # Serving parked reserves may write too (expire and reserve frames).
        writing = bool(self.parked) or any(isinstance(request, p.WRITING_REQUESTS) for _, request in requests)
        self.metrics.turn_started(now, self.queue)
        try:
            with self.metrics.timed_batch(self.queue, self._turn_requests):
                if self.parked:
                    self._serve_parked(now)
                for conn, request in requests:
                    if conn.closed:
                        continue
                    if (conn.deferred or self._saturated(conn)
                            or (isinstance(request, p.Tasks)
                                and self._listings_started >= MAX_LISTINGS_STARTED_PER_TURN)):
                        if not conn.closing:  # a closing connection's are dropped
                            conn.deferred.append(request)
                            self._deferring.add(conn)
                        continue
                    conn.turn_requests += 1
                    self._turn_requests.append((conn, request.id))
                    self._handle(conn, request, now)
        except Exception as exc:
            self._write_failed(exc, answered_before)
            return False
        return writing

    def _write_failed(self, exc: Exception, answered_before: int) -> None:
        """Answer every request of the failed batch with an error, then reopen the queue."""
        message = (
            f"write failed ({type(exc).__name__}: {exc}); the daemon reopened the queue; "
            "the request may or may not have taken effect (a retried put is safe)"
        )
        affected = {(id(a.conn), a.request_id): a.conn for a in self._answers[answered_before:]}
        for conn, request_id in self._turn_requests:
            affected[(id(conn), request_id)] = conn
        # Parked in this turn: answered with the error too rather than kept.
        for entry in self.parked.drop(lambda entry: entry.turn == self.turn):
            affected[(id(entry.conn), entry.request.id)] = entry.conn
        del self._answers[answered_before:]
        for (_, request_id), conn in affected.items():
            error = p.Error(id=request_id, error="QueueClosed", message=message)
            self._answers.append(Answer(conn, request_id, p.encode(error)))
        log.error("write failed, answered %d request(s) with an error: %r", len(affected), exc)
        self.metrics.write_failed()
        self._reopen()

    def _reopen(self) -> None:
        # Listings in progress read the old state, which may hold the failed
        # batch's undurable changes: end them, whether or not the reopen works.
        self.queue_epoch += 1
        try:
            self.queue.close()
        except Exception as exc:  # the queue is being discarded either way
            log.warning("closing the failed queue raised %r", exc)
        started = time.monotonic()
        try:
            self.queue = Queue(self.directory, hook=self.hook,
                               preallocate_bytes=self.preallocate_wal_bytes)
            self.metrics.recovered(time.monotonic() - started)
        except CorruptStore as exc:
            raise DaemonExit(EXIT_CORRUPT, f"reopening {self.directory} failed: CorruptStore: {exc}") from exc
        except Exception as exc:
            raise DaemonExit(EXIT_FAILURE, f"reopening {self.directory} failed: {exc!r}") from exc
        log.info("reopened %s", self.directory)

    def _answer(self, conn: Connection, request_id: int, messages) -> None:
        """Queue an answer; a list of messages is encoded now, into one bytes value.

        A lazy iterator (a listing) is kept as is and encoded as the client reads.
        """
        if isinstance(messages, list):
            try:
                encoded = b"".join([p.encode(message) for message in messages])
            except (p.ProtocolError, TypeError, OverflowError) as exc:
                log.error("answer to request %s from %s not encodable: %s", request_id, conn.name, one_line(str(exc)))
                error = p.Error(id=request_id, error="InvalidRequest", message=f"the answer cannot be sent: {exc}")
                encoded = p.encode(error)
            self._count_turn(conn)
            conn.turn_bytes += len(encoded)
            messages = encoded
        self._answers.append(Answer(conn, request_id, messages))

    def _count_turn(self, conn: Connection) -> None:
        if conn.turn != self.turn:
            conn.turn, conn.turn_bytes, conn.turn_requests = self.turn, 0, 0

    @staticmethod
    def _can_resume(conn: Connection) -> bool:
        """True once a connection with deferred requests has read enough of its answers."""
        return not conn.backlog and len(conn.out) < OUTPUT_HIGH_WATER_BYTES

    def _saturated(self, conn: Connection) -> bool:
        """True if this connection must not have more requests applied this turn."""
        self._count_turn(conn)
        return bool(
            conn.backlog
            or len(conn.out) + conn.turn_bytes >= OUTPUT_HIGH_WATER_BYTES
            or conn.turn_requests >= MAX_REQUESTS_PER_TURN_PER_CONNECTION
        )

    def _serve_parked(self, now: int) -> None:
        """Lease due tasks to parked reserves, in arrival order."""
        while (entry := self.parked.head()) is not None:
            request = entry.request
            if self._peer_gone(entry.conn):
                self._end_waits(entry.conn)
                continue
            try:
                leases = self._lease_due(request.worker, now, request.lease_seconds, request.limit)
            except REQUEST_ERRORS as exc:
                leases = exc
            if not leases:
                return
            self.parked.finish_head()
            if isinstance(leases, Exception):
                self._answer(entry.conn, request.id, [p.error_to_wire(request.id, leases)])
            else:
                self._answer(entry.conn, request.id, self._lease_messages(request.id, leases))

    def _end_waits(self, conn: Connection) -> None:
        """Answer a connection's parked reserves with no leases."""
        if conn.parked:
            for entry in self.parked.drop(lambda entry: entry.conn is conn):
                self._answer(conn, entry.request.id, [p.Leases(id=entry.request.id, leases=[])])

    @staticmethod
    def _peer_gone(conn: Connection) -> bool:
        """True if the peer has closed (checked without consuming anything).

        Its reading side may be off (answers piling up), so end of stream is
        looked for here too before a lease is handed to it.
        """
        if conn.eof or conn.closed:
            return True
        try:
            return conn.sock.recv(1, socket.MSG_PEEK | socket.MSG_DONTWAIT) == b""
        except (BlockingIOError, InterruptedError):
            return False
        except OSError:
            return True

    def _expire_waits(self) -> None:
        for entry in self.parked.expire(time.monotonic()):
            self._answer(entry.conn, entry.request.id, [p.Leases(id=entry.request.id, leases=[])])

    def _handle(self, conn: Connection, request: p.Request, now: int) -> None:
        q = self.queue
        request_id = request.id
        try:
            match request:
                case p.Put():
                    task_id = q.put(
                        request.task_id,
                        request.payload,
                        key=request.key,
                        available_at=request.available_at,
                        max_attempts=request.max_attempts,
                    )
                    self._answer(conn, request_id, [p.PutOk(id=request_id, task_id=task_id)])
                    if self.parked:
                        self._serve_parked(now)
                case p.PutMany():
                    task_ids = q.put_many(
                        [
                            PutRequest(
                                item.task_id,
                                item.payload,
                                key=item.key,
                                available_at=item.available_at,
                                max_attempts=item.max_attempts,
                            )
                            for item in request.requests
                        ]
                    )
                    self._answer(conn, request_id, [p.TaskIds(id=request_id, task_ids=task_ids)])
                    if self.parked:
                        self._serve_parked(now)
                case p.Reserve():
                    p.check_wait(request.wait)
                    self._reserve(conn, request, now)
                case p.AckReserve():
                    # Everything that could reject the reserve half is checked
                    # before the ack is written: a rejected request writes nothing.
                    p.check_wait(request.wait)
                    validation.integer(request.lease_seconds, "lease_seconds", minimum=1)
                    validation.integer(request.limit, "limit", minimum=1, maximum=validation.MAX_RESERVE_LIMIT)
                    validation.time_plus(now, request.lease_seconds, "lease_seconds")
                    self._check_may_park(conn, request)
                    q.ack(self._lease(request), now=now)
                    self._reserve(conn, request, now)
                case p.Ack():
                    q.ack(self._lease(request), now=now)
                    self._answer(conn, request_id, [p.Done(id=request_id)])
                case p.Release():
                    q.release(self._lease(request), now=now, delay=request.delay)
                    self._answer(conn, request_id, [p.Done(id=request_id)])
                    if self.parked:
                        self._serve_parked(now)
                case p.Touch():
                    lease = q.touch(self._lease(request), now=now, lease_seconds=request.lease_seconds)
                    self._answer(conn, request_id, [p.LeaseOk(id=request_id, lease=p.lease_to_wire(lease))])
                case p.Revive():
                    task_ids = q.revive(request.task_ids, now=now)
                    self._answer(conn, request_id, [p.TaskIds(id=request_id, task_ids=task_ids)])
                    if self.parked:
                        self._serve_parked(now)
                case p.Get():
                    task = q.get(request.task_id)
                    wire = None if task is None else p.task_to_wire(task)
                    self._answer(conn, request_id, [p.TaskOk(id=request_id, task=wire)])
                case p.Tasks():
                    self._listings_started += 1
                    self._answer(conn, request_id, self._listing(request_id, request.status))
                case p.Stats():
                    stats = p.stats_to_wire(q.stats())
                    self._answer(conn, request_id, [p.StatsOk(id=request_id, stats=stats)])
                case p.Compact():
                    self._refuse_while_pinned()
                    started = time.monotonic()
                    seq = q.compact()
                    self.metrics.compacted(time.monotonic() - started)
                    log.info("compacted on request through seq %d in %.3f s", seq, time.monotonic() - started)
                    self._answer(conn, request_id, [p.Compacted(id=request_id, seq=seq)])
                case p.Pause() | p.Resume():
                    self._set_paused(conn, isinstance(request, p.Pause), now)
                    self._answer(conn, request_id, [p.PauseState(id=request_id, paused=self.paused)])
                case p.BackupBegin():
                    self._answer(conn, request_id, [self._backup_begin(conn, request_id)])
                case p.BackupEnd():
                    self._backup_end(conn)
                    self._answer(conn, request_id, [p.Done(id=request_id)])
                case p.DaemonStatsReq():
                    stats = p.daemon_stats_to_wire(self._daemon_stats(now))
                    self._answer(conn, request_id, [p.DaemonStatsOk(id=request_id, stats=stats)])
        except REQUEST_ERRORS as exc:
            log.debug("request %d from %s: %s: %s", request_id, conn.name, type(exc).__name__, one_line(str(exc)))
            self._answer(conn, request_id, [p.error_to_wire(request_id, exc)])

    def _reserve(self, conn: Connection, request: p.Reserve | p.AckReserve, now: int) -> None:
        """Lease due tasks to ``request``'s worker now, or park it if it may wait."""
        request_id = request.id
        if self._peer_gone(conn):
            # It sent this and closed (or died): a lease could only
            # sit unused until it expired.
            self._answer(conn, request_id, [p.Leases(id=request_id, leases=[])])
            return
        # Parked reserves were served at the start of the turn and
        # after every request that made a task due, so if any are
        # still parked this returns nothing: arrival order holds.
        leases = self._lease_due(request.worker, now, request.lease_seconds, request.limit)
        if leases or request.wait == 0 or conn.closing:
            self._answer(conn, request_id, self._lease_messages(request_id, leases))
        else:
            self._check_may_park(conn, request)
            deadline = time.monotonic() + request.wait
            self.parked.add(Parked(conn, request, deadline, self.turn))
            log.debug("parked reserve %d of %s for %.3f s", request_id, conn.name, request.wait)

    @staticmethod
    def _check_may_park(conn: Connection, request: p.Reserve | p.AckReserve) -> None:
        if request.wait > 0 and conn.parked >= MAX_PARKED_PER_CONNECTION:
            raise InvalidRequest(
                f"too many waiting reserves on this connection ({MAX_PARKED_PER_CONNECTION}); "
                "wait for one to be answered or use another connection"
            )

    @staticmethod
    def _lease(request: p.Ack | p.AckReserve | p.Release | p.Touch) -> Lease:
        # Only task_id, worker and generation identify a lease; the other
        # fields are informational and not consulted by ack/release/touch.
        return Lease(
            task_id=request.task_id,
            worker=request.worker,
            generation=request.generation,
            deadline=0,
            attempts=0,
            payload={},
        )

    def _lease_messages(self, request_id: int, leases: list[Lease]) -> list:
        wires = [p.lease_to_wire(lease) for lease in leases]
        if len(wires) <= 1:  # one lease always fits one message: no need to measure it
            return [p.Leases(request_id, wires)]
        return self._chunked(request_id, wires, p.Leases)

    @staticmethod
    def _chunked(request_id: int, items: list, message_type: type) -> list:
        """Split a list answer into messages of at most CHUNK_BUDGET_BYTES of items each."""
        if not items:
            return [message_type(request_id, [])]
        chunks: list[list[msgspec.Raw]] = [[]]
        size = 0
        for item in items:
            encoded = p.encode_value(item)
            if chunks[-1] and size + len(encoded) > p.CHUNK_BUDGET_BYTES:
                chunks.append([])
                size = 0
            chunks[-1].append(msgspec.Raw(encoded))
            size += len(encoded)
        last = len(chunks) - 1
        return [message_type(request_id, chunk, index < last) for index, chunk in enumerate(chunks)]

    def _listing(self, request_id: int, status: str | None):
        """The ``tasks`` answer, produced lazily as the client reads it.

        Views are taken outside any batch (see _fill), so each shows durable
        state; a task whose status changed since the listing began is left
        out of a filtered listing. A reopen in between ends it with an error.
        """
        epoch = self.queue_epoch
        views = self.queue.tasks(status)  # raises InvalidRequest now, inside the batch

        def chunks():
            batch: list[msgspec.Raw] = []
            size = 0
            while True:
                if self.queue_epoch != epoch:
                    raise ListingInterrupted("the queue was reopened after a write failure; list again")
                view = next(views, None)
                if view is None:
                    break
                if status is not None and view.status != status:
                    continue
                encoded = p.encode_value(p.task_to_wire(view))
                if batch and size + len(encoded) > p.CHUNK_BUDGET_BYTES:
                    yield p.TaskList(request_id, batch, True)
                    batch, size = [], 0
                batch.append(msgspec.Raw(encoded))
                size += len(encoded)
            yield p.TaskList(request_id, batch, False)

        return chunks()

    def _queue_answers(self) -> None:
        for answer in self._answers:
            conn = answer.conn
            if conn.closed:
                continue
            if type(answer.messages) is bytes:
                if not conn.backlog and len(conn.out) < OUTPUT_HIGH_WATER_BYTES:
                    conn.out += answer.messages  # the common case: straight out
                else:
                    conn.backlog.append((answer.request_id, iter((answer.messages,)), False))
            else:
                conn.backlog.append((answer.request_id, answer.messages, True))
            self._touched.add(conn)
        self._answers = []
        for conn in self._touched:
            if conn.fatal is not None:
                conn.backlog.append((conn.fatal.id, iter([conn.fatal]), False))
                conn.fatal = None
            if conn.backlog:
                self._fill(conn)

    def _fill(self, conn: Connection) -> None:
        """Move backlog answers into ``out`` until it reaches the high-water mark.

        Encoded answers move freely; a lazy listing is encoded only while this
        turn's LISTING_BYTES_PER_TURN lasts.
        """
        while conn.backlog and len(conn.out) < OUTPUT_HIGH_WATER_BYTES:
            request_id, messages, lazy = conn.backlog[0]
            if lazy and self._listing_budget <= 0:
                return
            try:
                message = next(messages, None)
                if message is None:
                    conn.backlog.popleft()
                    continue
                if isinstance(message, bytes):
                    conn.out += message
                else:
                    encoded = p.encode(message)
                    conn.out += encoded
                    if lazy:
                        self._listing_budget -= len(encoded)
            except ListingInterrupted as exc:
                conn.backlog.popleft()
                conn.out += p.encode(p.Error(id=request_id, error="QueueClosed", message=str(exc)))
            except (p.ProtocolError, TypeError, OverflowError) as exc:
                conn.backlog.popleft()
                error = p.Error(id=request_id, error="InvalidRequest", message=f"the answer cannot be sent: {exc}")
                conn.out += p.encode(error)
                log.error("answer to request %s from %s not encodable: %s", request_id, conn.name, one_line(str(exc)))

    # -- operator controls: pause and the backup pin -----------------------------------

    def _lease_due(self, worker: str, now: int, lease_seconds: int, limit: int) -> list[Lease]:
        """Lease up to ``limit`` due tasks, or nothing while paused.

        Every reserve (new, parked, or the reserve half of a combined request)
        goes through here, so pausing is this one check. Paused, nothing is
        written either: expired leases are reaped by the first reserve after
        resuming.
        """
        if self.paused:
            return []
        return self.queue.reserve(worker, now=now, lease_seconds=lease_seconds, limit=limit)

    def _set_paused(self, conn: Connection, paused: bool, now: int) -> None:
        """Pause or resume leasing (idempotent); resuming serves parked reserves in arrival order."""
        if paused != self.paused:
            self.paused = paused
            log.info("%s by %s (%d reserve(s) waiting)", "paused" if paused else "resumed",
                     conn.name, self.parked.live)
        if not paused:
            self._serve_parked(now)

    def _backup_begin(self, conn: Connection, request_id: int) -> p.Manifest:
        """Pin the files of a consistent copy for ``conn`` and describe them.

        Raises InvalidRequest while another backup holds the pin.
        """
        if self.backup_holder is not None:
            raise InvalidRequest(f"a backup is already in progress ({self.backup_holder.name}); "
                                 "wait for it to finish")
        manifest = self.queue.backup_manifest()  # may compact a queue never compacted
        self.backup_holder = conn
        log.info("backup pin taken by %s: seq %d, %d file(s)", conn.name, manifest.seq, len(manifest.files))
        return p.manifest_to_wire(request_id, manifest)

    def _backup_end(self, conn: Connection) -> None:
        if self.backup_holder is not conn:
            raise InvalidRequest("this connection holds no backup pin (it ends when the connection "
                                 "that began the backup closes)")
        self.backup_holder = None
        log.info("backup pin released by %s", conn.name)

    def _refuse_while_pinned(self) -> None:
        if self.backup_holder is not None:
            raise InvalidRequest(f"a backup is in progress ({self.backup_holder.name}); compaction "
                                 "would delete the files it copies: compact after it ends")

    # -- compaction and shutdown --------------------------------------------------------

    def _maybe_compact(self) -> None:
        if self.backup_holder is not None:
            return  # deferred: the first write after the backup ends compacts
        try:
            wal_bytes = self.queue.stats().wal_bytes
            if wal_bytes <= self.compact_wal_bytes:
                return
            # The loop stalls for the compaction: ping the watchdog first.
            self._watchdog(force=True)
            started = time.monotonic()
            seq = self.queue.compact()
        except Exception as exc:
            log.error("automatic compaction failed: %r", exc)
            self._reopen()
            return
        self.metrics.compacted(time.monotonic() - started)
        log.info(
            "compacted %d WAL bytes through seq %d in %.3f s",
            wal_bytes,
            seq,
            time.monotonic() - started,
        )

    def _shutdown(self) -> None:
        self.notifier.notify("STOPPING=1")
        log.info("stopping: %d connection(s), %d parked reserve(s)", len(self.connections), self.parked.live)
        try:
            self.selector.unregister(self.listener)
        except (KeyError, ValueError):
            pass
        self.listener.close()
        # Parked reserves end early with no leases; their clients retry later.
        for entry in self.parked.drop(lambda entry: True):
            self._answer(entry.conn, entry.request.id, [p.Leases(id=entry.request.id, leases=[])])
        self._queue_answers()
        deadline = time.monotonic() + DRAIN_SECONDS
        for conn in list(self.connections.values()):
            conn.eof = True  # read nothing more
            self._send(conn)
            self._settle(conn)
        while self.connections and time.monotonic() < deadline:
            self._listing_budget = LISTING_BYTES_PER_TURN
            pending = [c for c in self.connections.values() if c.out or c.backlog]
            if not pending:
                break
            for key, _ in self.selector.select(max(0.0, deadline - time.monotonic())):
                if key.data is _WAKEUP:
                    self._drain_wakeup()  # another signal: keep draining answers
                elif isinstance(key.data, Connection):
                    self._send(key.data)
                    self._settle(key.data)
        for conn in list(self.connections.values()):
            self._close(conn, "daemon stopping")
        try:
            self.queue.close()
        except Exception as exc:
            log.error("closing the queue failed: %r", exc)
        if self.socket_path is not None:
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        self.selector.close()
        self._wake_read.close()
        self._wake_write.close()
        log.info("stopped")


# -- command line --------------------------------------------------------------------


def _load_hook(spec: str) -> Callable[[str], None]:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter("expected MODULE:CALLABLE", param_hint="--test-hook")
    return getattr(importlib.import_module(module_name), attribute)


def _parse_mode(value: str) -> int:
    try:
        mode = int(value, 8)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an octal mode such as 0660") from None
    if not 0 <= mode <= 0o777:
        raise click.BadParameter(f"{value!r} is outside 0000..0777")
    return mode


EXIT_CODES_HELP = """\b
Exit codes:
  0  stopped by SIGTERM/SIGINT: last batch fsynced and answered, socket removed
  1  failure: cannot open the directory, bind the socket or listen on the
     --metrics-listen address, or reopening the queue after a failed write failed
  2  usage error (a bad --metrics-listen, or a non-loopback one without
     --metrics-allow-remote, included); the socket path is not a socket;
     a descriptor passed by systemd is not a Unix stream socket
  3  another walqueued owns the directory (QueueLocked) or listens on the socket
  4  the directory is corrupt (CorruptStore), at start or at a reopen
"""


@click.group(
    help="walqueued: serve one WALQueue directory to local workers over a Unix socket.",
    epilog=EXIT_CODES_HELP,
)
def cli() -> None:
    pass


@cli.command(epilog=EXIT_CODES_HELP, short_help="Serve DIRECTORY in the foreground.")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False), default=None,
              help="Socket path [default: DIRECTORY/walqueued.sock]. Ignored when systemd passes "
                   "a listening socket (LISTEN_FDS).")
@click.option("--socket-mode", default="0660", show_default=True, metavar="MODE",
              help="Permissions of the socket file, in octal. Ignored under socket activation "
                   "(the .socket unit's SocketMode applies).")
@click.option("--compact-wal-bytes", type=click.IntRange(min=1), default=DEFAULT_COMPACT_WAL_BYTES,
              show_default=True, metavar="BYTES",
              help="Compact (write a snapshot, drop the WAL it covers) when the WAL since the last "
                   "snapshot grows past this many bytes. Service pauses while it runs.")
@click.option("--max-connections", type=click.IntRange(min=1), default=DEFAULT_MAX_CONNECTIONS,
              show_default=True,
              help="Connections beyond this are answered with an error and closed. Lowered to fit "
                   "the open-file limit (RLIMIT_NOFILE), with a log line saying so.")
@click.option("--hello-timeout", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULT_HELLO_TIMEOUT_SECONDS, show_default=True,
              help="Seconds a new connection has to send its hello before it is closed.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
              default="info", show_default=True,
              help="Least severe log line written. Logs go to stderr, one line per event.")
@click.option("--preallocate-wal-bytes", type=click.IntRange(min=0, max=MAX_PREALLOCATE_BYTES),
              default=DEFAULT_PREALLOCATE_WAL_BYTES, show_default=True,
              help="Preallocate the active WAL segment in steps of this many bytes (e.g. 4194304) and "
                   "sync it with fdatasync: faster syncs, but a frame torn by a crash inside the "
                   "preallocated space stops the next start until an operator cuts the segment "
                   "(docs/daemon.md). 0, the default, appends and fsyncs.")
@click.option("--metrics-listen", metavar="HOST:PORT", default=None,
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (off by default). HOST is "
                   "an IP address ([::1] for IPv6) or localhost and must be loopback unless "
                   "--metrics-allow-remote is given; PORT 0 picks a free port (logged).")
@click.option("--metrics-allow-remote", is_flag=True, default=False,
              help="Allow a non-loopback --metrics-listen address (anyone who can reach it reads "
                   "the queue's directory and load; put a firewall in front).")
@click.option("--test-hook", default=None, hidden=True,
              help="TEST ONLY: MODULE:CALLABLE passed to Queue(hook=...) for fault injection.")
def serve(directory: str, socket_path: str | None, socket_mode: str, compact_wal_bytes: int,
          max_connections: int, hello_timeout: float, log_level: str, metrics_listen: str | None,
          metrics_allow_remote: bool, test_hook: str | None, preallocate_wal_bytes: int) -> None:
    """Serve DIRECTORY in the foreground until SIGTERM or SIGINT.

    DIRECTORY is created (mode 0750) if missing; the daemon holds its lock, so
    a second walqueued on it exits 3. Start it under a supervisor (systemd/
    has units); it does not fork. Stopping with SIGTERM answers the requests
    in progress after their fsync, then removes the socket.
    """
    metrics_address = None
    if metrics_listen is not None:
        try:
            metrics_address = parse_listen(metrics_listen, allow_remote=metrics_allow_remote)
        except ListenError as exc:
            raise click.BadParameter(str(exc), param_hint="--metrics-listen") from None
    elif metrics_allow_remote:
        raise click.BadParameter("is only meaningful with --metrics-listen",
                                 param_hint="--metrics-allow-remote")
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, log_level.upper()),
        format="%(asctime)s walqueued[%(process)d] %(levelname)s %(message)s",
    )
    mode = _parse_mode(socket_mode)
    hook = None
    if test_hook is not None:
        hook = _load_hook(test_hook)
        log.warning("TEST ONLY fault-injection hook loaded: %s", test_hook)
    sys.exit(_serve(directory, socket_path, mode, compact_wal_bytes, max_connections, hook, hello_timeout,
                    preallocate_wal_bytes, metrics_address))


def descriptor_budget(max_connections: int) -> int:
    """Raise the soft RLIMIT_NOFILE as far as needed and allowed; return the usable connection bound."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + RESERVED_DESCRIPTORS
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit to %d: %s", target, exc)
    if soft != resource.RLIM_INFINITY and soft - RESERVED_DESCRIPTORS < max_connections:
        usable = max(1, soft - RESERVED_DESCRIPTORS)
        log.warning("--max-connections %d lowered to %d by the open-file limit %d",
                    max_connections, usable, soft)
        return usable
    return max_connections


def open_reporting_progress(directory: str, hook: Callable[[str], None] | None, notifier: Notifier,
                            preallocate_wal_bytes: int = DEFAULT_PREALLOCATE_WAL_BYTES) -> Queue:
    """Open (recover) the Queue; while that takes long, tell systemd it is still starting.

    Recovery runs in a helper thread so the main thread can send STATUS= and
    EXTEND_TIMEOUT_USEC= every RECOVERY_REPORT_SECONDS; it raises what Queue() raises.
    """
    outcome: dict[str, object] = {}

    def recover() -> None:
        try:
            outcome["queue"] = Queue(directory, hook=hook, preallocate_bytes=preallocate_wal_bytes)
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


def _serve(directory: str, socket_path: str | None, mode: int, compact_wal_bytes: int,
           max_connections: int, hook: Callable[[str], None] | None,
           hello_timeout: float = DEFAULT_HELLO_TIMEOUT_SECONDS,
           preallocate_wal_bytes: int = DEFAULT_PREALLOCATE_WAL_BYTES,
           metrics_address: tuple[str, int] | None = None) -> int:
    directory = os.path.abspath(directory)
    max_connections = descriptor_budget(max_connections)
    notifier = Notifier(dict(os.environ))
    notifier.notify("STATUS=recovering " + directory)
    log.info("opening %s", directory)
    started = time.monotonic()
    try:
        queue = open_reporting_progress(directory, hook, notifier, preallocate_wal_bytes)
    except QueueLocked as exc:
        log.error("another walqueued owns %s: %s", directory, exc)
        print(f"walqueued: another process owns {directory}: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except CorruptStore as exc:
        log.error("cannot open %s: %s", directory, exc)
        return EXIT_CORRUPT
    except OSError as exc:
        log.error("cannot open %s: %s", directory, exc)
        return EXIT_FAILURE
    recovery_seconds = time.monotonic() - started
    log.info("recovered %s in %.3f s: %s", directory, recovery_seconds, queue.stats())
    try:
        listener = activated_listener(dict(os.environ))
        owned_path = None
        if listener is not None:
            log.info("listening on the socket passed by systemd (fd %d)", SD_LISTEN_FDS_START)
        else:
            path = socket_path or os.path.join(directory, SOCKET_NAME)
            listener = bind_listener(path, mode)
            owned_path = path
            log.info("listening on %s (mode %04o)", path, mode)
    except DaemonExit as exc:
        log.error("%s", exc)
        queue.close()
        return exc.code
    metrics_endpoint = None
    if metrics_address is not None:
        try:
            metrics_endpoint = MetricsEndpoint(*metrics_address)
        except OSError as exc:
            log.error("--metrics-listen %s:%d: cannot listen: %s", *metrics_address, exc)
            queue.close()
            if owned_path is not None:
                os.unlink(owned_path)
            listener.close()
            return EXIT_FAILURE
        log.info("serving metrics at %s", metrics_endpoint.url)
    server = Server(
        directory,
        queue,
        listener,
        socket_path=owned_path,
        compact_wal_bytes=compact_wal_bytes,
        max_connections=max_connections,
        hook=hook,
        notifier=notifier,
        hello_timeout=hello_timeout,
        preallocate_wal_bytes=preallocate_wal_bytes,
        recovery_seconds=recovery_seconds,
        metrics_endpoint=metrics_endpoint,
    )
    try:
        return server.run()
    finally:
        notifier.close()


def main() -> None:
    """Console-script entry point (``walqueued``)."""
    cli()


if __name__ == "__main__":
    main()
