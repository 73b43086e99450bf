"""walqueued's event loop: the selector, timers, signals, accept, and the shutdown drain.

One loop turn = one ``select()`` call, on one thread:

1. accept new connections; send what sockets will take; read what arrived
   and decode it into requests (walqueue.daemon.connection); serve the
   metrics endpoint's sockets (walqueue.daemon.metrics_http);
2. close connections that did not say hello, or send the frame they began,
   in time;
3. apply the turn's requests through the service (walqueue.daemon.service)
   inside ONE batch (walqueue.daemon.commit), so they share one fsync — also
   the daemon's own work that is due: the expiry of leases whose deadline
   passed, and serving parked reserves. Requests of a saturated connection
   are deferred to a later turn instead, and so are the rest once the turn
   has applied for TURN_WORK_SECONDS (reading likewise stops after
   TURN_WORK_SECONDS; what it left is read first next turn);
4. collect a snapshot child that exited and publish its snapshot, or kill
   one past its deadline (walqueue.daemon.compaction); free a step of a
   deleted file's blocks if one is due (walqueue.daemon.freeing); end waits
   that timed out; hand the turn's
   answers to their connections only now, after the batch exited without
   error; send; set each touched connection's selector interest;
5. ping the watchdog; begin a compaction and fork its child if one is due
   or requested (right after the batch: nothing else has been applied
   since); close metrics scrapes past their deadline, and publish the
   metrics text if a scrape waits for it.

While one batch is fsyncing, the next requests accumulate in the kernel's
socket buffers and become the next turn's batch, so the batch size adapts
to the load. The Engine is synchronous and the fsync blocks the whole process
anyway, so asyncio would add scheduling we cannot use and hide where a turn
ends; ``selectors`` makes the turn boundary explicit (docs/protocol.md).

Timers, without polling: the select timeout is the earliest of the next
hello deadline, frame deadline, accept resumption, watchdog ping, end of a
wait, a metrics scrape's deadline, a deleted file's next freeing step, a
snapshot child's deadline, and the service's next due time (a lease
deadline, or a task due while reserves wait) — or the end of the reaper's
back-off after a reap that failed to write (disk full: retried after 1, 2,
4, ... s up to 5 minutes, not every second). A snapshot child's exit wakes
the loop through its pidfd. Time comes from an injected `Clock`: ``now``
(whole seconds on the boot clock, which counts a suspend, from a wall-clock
anchor at start, never backwards: walqueue.daemon.clock) for leases,
monotonic seconds for waits and timers.
Only connections a turn touched are looked at, so idle ones cost nothing.
A turn over 100 ms is logged with where its time went
(walqueue.daemon.turn_timer).

A bug (any exception but the ones the service and the commit handle) stops
the loop: its traceback is logged, the answers of the turn it broke are
dropped, and the daemon exits non-zero for its supervisor.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import selectors
import signal
import socket
import stat
from collections import deque
from collections.abc import Callable

from walqueue import protocol
from walqueue.directory import Directory
from walqueue.engine import Engine
from walqueue.metrics import render_prometheus
from walqueue.unix_socket import unix_address

from .accepting import Acceptor
from .clock import Clock, DaemonNow, SystemClock
from .commit import GroupCommit
from .compaction import (
    CHILD_DEADLINE_FLOOR_SECONDS,
    DEFAULT_COMPACT_WAL_RATIO,
    Backoff,
    freeze_heap,
)
from .connection import (
    MAX_LISTINGS_STARTED_PER_TURN,
    MAX_RECV_BYTES,
    PEER_OPEN,
    PEER_SHUT,
    ConnectionFault,
    FrameDeadlines,
    InputBudget,
    ListingBudget,
    PeerConnection,
    Selector,
    late_frame_message,
)
from .exits import EXIT_FAILURE, EXIT_LOCKED, EXIT_OK, EXIT_USAGE, DaemonExit
from .freeing import FreeingInSteps
from .log import log
from .metrics_http import MetricsEndpoint
from .recorder import Recorder
from .service import DEFAULT_MAX_LEASE_SECONDS, QueueService
from .systemd import Notifier
from .turn_timer import TurnTimer
from .wakeup import SignalWakeup

DEFAULT_MAX_CONNECTIONS = 1024
DEFAULT_HELLO_TIMEOUT_SECONDS = 10.0
DRAIN_SECONDS = 5.0
# Connection ends that are no news: logged at DEBUG (any other reason is INFO).
ORDINARY_CLOSES = ("closed by peer", "daemon stopping")
# Work per turn is bounded in time, not only in count: once a turn has spent
# this long reading (receiving and decoding) the connections it polled, the
# rest are read first in the next turn; once it has spent this long applying
# requests, the rest are deferred, in order, to the next turn, which follows
# at once. Each turn ends with the watchdog's ping when one is due, so a
# flood of requests cannot keep the loop from pinging (issue 20 item 3: one
# turn of 1,024 pipelined reports once took 39.8 s, past WatchdogSec=60 with
# the 30 s ping interval). One request still runs whole.
TURN_WORK_SECONDS = 0.25
# A timer never sleeps longer than this: a safety net, should a due time ever
# be computed wrongly, not something the loop relies on.
MAX_TIMER_SECONDS = 60.0

_LISTENER = object()
_WAKEUP = object()
_COMPACTION = object()  # a snapshot child's pidfd: readable once it exited


def _in_rounds(requests: list[tuple[PeerConnection, protocol.Request]]):
    """The turn's requests one connection at a time, in rounds, each connection's in its order.

    With the turn's work bounded in time (TURN_WORK_SECONDS), first-come order
    let one connection's backlog, resumed first every turn, fill every turn
    while another connection's single request waited behind all of it.
    """
    if len({conn for conn, _ in requests}) == len(requests):
        return requests  # one request per connection (closed-loop clients): already one round
    return _rounds(requests)


def _rounds(requests: list[tuple[PeerConnection, protocol.Request]]):
    queues: dict[PeerConnection, deque[protocol.Request]] = {}
    for conn, request in requests:
        queues.setdefault(conn, deque()).append(request)
    while queues:
        for conn in list(queues):
            pending = queues[conn]
            yield conn, pending.popleft()
            if not pending:
                del queues[conn]


def refuse_a_live_socket(path: str) -> bool:
    """True if nothing is at ``path``; False if a socket nobody answers on (a dead owner's) is.

    Raises DaemonExit if the path is not a socket or a live server answers on it.
    """
    if not os.path.lexists(path):
        return True
    if not stat.S_ISSOCK(os.lstat(path).st_mode):
        raise DaemonExit(EXIT_USAGE, f"{path} exists and is not a socket; refusing to replace it")
    probe = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        probe.settimeout(1.0)
        with unix_address(path) as address:
            probe.connect(address)
    except (ConnectionRefusedError, FileNotFoundError):
        return False
    except OSError as exc:
        raise DaemonExit(EXIT_FAILURE, f"cannot probe existing socket {path}: {exc}") from exc
    finally:
        probe.close()
    raise DaemonExit(EXIT_LOCKED, f"another server is listening on {path}")


def bind_listener(path: str, mode: int) -> socket.socket:
    """Create the listening socket at ``path`` with permissions ``mode``.

    A socket file nobody answers on (left by a dead owner) is replaced.
    Raises DaemonExit if the path is not a socket or a live server answers on it.
    """
    if not refuse_a_live_socket(path):
        log.info("replacing stale socket %s", path)
        os.unlink(path)
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


class Loop:
    """The event loop over one Engine. ``run()`` serves until SIGTERM/SIGINT and returns an exit code.

    ``queue`` is the opened Engine (walqueue.engine) (the service owns it from here on);
    ``listener`` the listening socket; ``socket_path`` is unlinked at exit
    (None when systemd owns the socket); ``hook`` and
    ``preallocate_wal_bytes`` are passed to the Engine reopened after a
    failed write; ``compact_wal_bytes`` and ``compact_wal_ratio`` say when
    to compact (walqueue.daemon.compaction), ``child_hook`` (tests only)
    runs in each snapshot child before it writes, and
    ``child_deadline_floor_seconds`` (shorter only in tests) is the floor of
    a snapshot child's deadline.
    """

    def __init__(
        self,
        directory: str,
        queue: Engine,
        listener: socket.socket,
        *,
        socket_path: str | None,
        compact_wal_bytes: int,
        max_connections: int,
        hook: Callable[[str], None] | None,
        notifier: Notifier,
        clock: Clock | None = None,
        hello_timeout_seconds: float = DEFAULT_HELLO_TIMEOUT_SECONDS,
        preallocate_wal_bytes: int = 0,
        recovery_seconds: float = 0.0,
        metrics_endpoint: MetricsEndpoint | None = None,
        compact_wal_ratio: float = DEFAULT_COMPACT_WAL_RATIO,
        child_hook: Callable[[], None] | None = None,
        filesystem: FreeingInSteps | None = None,
        opened: Directory | None = None,
        child_deadline_floor_seconds: float = CHILD_DEADLINE_FLOOR_SECONDS,
        max_lease_seconds: int = DEFAULT_MAX_LEASE_SECONDS,
    ) -> None:
        freeze_heap()  # the recovered state: out of the cyclic collector's reach
        self.directory = directory
        self.socket_path = socket_path
        self.max_connections = max_connections
        self.notifier = notifier
        self.clock = clock or SystemClock()
        self.now = DaemonNow(self.clock)
        self.hello_timeout_seconds = hello_timeout_seconds
        self.compact_wal_bytes = compact_wal_bytes
        self.metrics_endpoint = metrics_endpoint  # GET /metrics, served and rendered by this loop
        # The Engine's files (the one `queue` was opened on, for the deletions a turn frees in steps).
        self.filesystem = filesystem or FreeingInSteps()
        self.recorder = Recorder(next_seq=queue.stats().last_seq + 1, now=self.now(),
                                 recovery_seconds=recovery_seconds, clock=self.clock.monotonic_seconds,
                                 wall_clock=self.clock.wall_seconds, wal_bytes=queue.stats().wal_bytes)
        self.service = QueueService(queue, report=self.report, max_lease_seconds=max_lease_seconds,
                               compact=lambda peer, request_id: self.compaction.request(peer, request_id))
        self.selector = Selector()
        self.acceptor = Acceptor(listener, self.selector, _LISTENER, self.clock.monotonic_seconds,
                                 hello_timeout_seconds)
        self.commit = GroupCommit(
            self.service, directory=directory, recorder=self.recorder, clock=self.clock,
            compact_wal_bytes=compact_wal_bytes, compact_wal_ratio=compact_wal_ratio,
            # A reopen uses the descriptor the daemon reached at start, never the path again.
            open_queue=lambda: Engine(directory, hook=hook, preallocate_bytes=preallocate_wal_bytes,
                                     filesystem=self.filesystem, opened=opened),
            watch=lambda fd: self.selector.register(fd, selectors.EVENT_READ, _COMPACTION),
            unwatch=self.selector.unregister, child_hook=child_hook,
            child_deadline_floor_seconds=child_deadline_floor_seconds)
        self.compaction = self.commit.compaction
        # The daemon's own reaping after a failed write: spaced out, not every second.
        self.reap_backoff = Backoff()
        self.connections: dict[int, PeerConnection] = {}
        self.turn = 0
        self.turn_timer = TurnTimer(clock=self.clock.monotonic_seconds)  # the recorder's clock
        self.stopping = False
        self.input_budget = InputBudget()
        self.frame_deadlines = FrameDeadlines()
        self.listing_budget = ListingBudget()
        self._listings_started = 0
        self._next_watchdog = self.clock.monotonic_seconds()
        self._touched: set[PeerConnection] = set()  # connections with news this turn
        self._deferring: set[PeerConnection] = set()  # connections with deferred requests
        # Connections a turn polled readable but did not read (TURN_WORK_SECONDS): read first next turn.
        self._unread: dict[PeerConnection, None] = {}
        self._receive_buffer = bytearray(MAX_RECV_BYTES)  # one buffer all connections share
        self._receive_view = memoryview(self._receive_buffer)
        self._wakeup = SignalWakeup()

    @property
    def queue(self) -> Engine:
        return self.service.queue

    def report(self, now: int) -> protocol.DaemonStats:
        """The daemon's full report at ``now``."""
        report = self.recorder.report(
            self.service.queue, now=now, connections=len(self.connections),
            parked_reserves=self.service.parked.live, paused=self.service.paused,
            compact_wal_bytes=self.compact_wal_bytes, directory=self.directory,
            compaction=self.compaction.status())
        return dataclasses.replace(report, clock_steps_total=self.now.steps,
                                   clock_offset_seconds=self.now.offset_seconds,
                                   slow_turns_total=self.turn_timer.slow_turns,
                                   longest_turn_seconds=self.turn_timer.longest_seconds)

    # -- main loop -------------------------------------------------------------

    def _on_signal(self, signum: int, frame: object) -> None:
        self.stopping = True

    def run(self) -> int:
        previous = {sig: signal.signal(sig, self._on_signal) for sig in (signal.SIGTERM, signal.SIGINT)}
        previous_wakeup = signal.set_wakeup_fd(self._wakeup.write_fd(), warn_on_full_buffer=False)
        self.register_listener()
        code = EXIT_OK
        try:
            self.notifier.notify("READY=1\nSTATUS=serving " + self.directory)
            if self.metrics_endpoint is not None:
                self.metrics_endpoint.start(self.selector)
            log.info("ready: serving %s", self.directory)
            while not self.stopping:
                self.one_turn()
        except DaemonExit as exc:
            log.critical("%s", exc)
            code = exc.code
        except Exception:
            # A bug: the state it leaves cannot be trusted, so nothing more is
            # applied and nothing of the turn it broke is answered.
            log.critical("walqueued stops on an unexpected error (a bug; please report it):",
                         exc_info=True)
            self.service.outbox.clear()
            code = EXIT_FAILURE
        finally:
            self._shutdown()
            signal.set_wakeup_fd(previous_wakeup)
            for sig, handler in previous.items():
                signal.signal(sig, handler)
        return code

    def register_listener(self) -> None:
        """Watch the listening socket and the wakeup socket (``run`` does; so do turn-driving tests)."""
        self.acceptor.register()
        self._wakeup.register(self.selector, _WAKEUP)

    def one_turn(self) -> None:
        clock = self.clock
        self.acceptor.resume_if_due(clock.monotonic_seconds())
        timeout = self._timeout()
        events = self.selector.select(timeout)
        polled = clock.monotonic_seconds()  # for this turn's reads
        timer = self.turn_timer
        timer.polled(timeout)
        self.listing_budget.renew()
        self._listings_started = 0
        requests: list[tuple[PeerConnection, protocol.Request]] = []
        metrics = self.metrics_endpoint
        if self._unread:
            # Those left unread last turn go first (epoll reports them in the same order every turn).
            unread, self._unread = self._unread, {}
            events.sort(key=lambda event: event[0].data not in unread)
        read_until = polled + TURN_WORK_SECONDS
        for key, mask in events:
            if key.data is _LISTENER:
                for conn in self.acceptor.accept(self.connections, self.max_connections):
                    self.connections[conn.sock.fileno()] = conn
                    self._settle(conn)
            elif key.data is _WAKEUP:
                self._wakeup.drain()
            elif metrics is not None and metrics.owns(key.data):
                metrics.on_event(key.data, mask, polled)
            elif key.data is _COMPACTION:
                pass  # a snapshot child exited: collected right after the batch
            else:
                conn: PeerConnection = key.data
                self._touched.add(conn)
                if mask & (PEER_OPEN | PEER_SHUT):
                    conn.peer_open_at_poll = bool(mask & PEER_OPEN)
                if mask & selectors.EVENT_WRITE:
                    self._send(conn)
                if mask & selectors.EVENT_READ and not conn.closed:
                    if clock.monotonic_seconds() < read_until:
                        self._receive(conn, requests, polled)
                    else:
                        self._unread[conn] = None  # still readable: the next poll reports it again
        self.turn += 1
        for conn in self.acceptor.expired_hellos(clock.monotonic_seconds()):
            self._fatal(conn, None, f"no hello within {self.hello_timeout_seconds:g} s")
        self._expire_frames()
        timer.part("reading")
        fsynced_before = self.recorder.fsync_seconds_total
        wrote = self._apply(requests)
        timer.part("applying and fsync", of_which=("fsync", self.recorder.fsync_seconds_total - fsynced_before))
        self.compaction.settle()
        timer.part("collecting a snapshot")
        # Also beside a snapshot child: only one begun on request can be writing while
        # files wait (an automatic compaction waits for the freeing), and back-to-back
        # requests must not pile up deleted files (walqueue.daemon.freeing).
        self.filesystem.free_step(clock.monotonic_seconds())
        timer.part("freeing a deleted file")
        if self.service.parked.live:
            self.service.expire_waits(clock.monotonic_seconds())
        self._queue_answers()
        if self.input_budget.waiting:
            for conn in self.input_budget.grant(clock.monotonic_seconds()):
                self.frame_deadlines.track(conn, clock.monotonic_seconds())
                self._touched.add(conn)
        touched, self._touched = self._touched, set()
        for conn in touched:
            conn.peer_open_at_poll = None  # what the poll saw holds for its turn only
            if conn.closed:
                continue
            if conn.out:
                self._send(conn)
            self._settle(conn)
        timer.part("answering")
        if self.notifier.watchdog_seconds is not None:
            self._watchdog()
        self.compaction.maybe_start(wrote, freeing=self.filesystem.freeing)
        timer.part("starting a compaction")
        if metrics is not None:
            metrics.expire(clock.monotonic_seconds())
            if metrics.wanted:
                metrics.publish(render_prometheus(self.report(self.now())), clock.monotonic_seconds())
        timer.end()

    def _expire_frames(self) -> None:
        """Close connections whose frame in progress is past its deadline, saying why."""
        for conn in self.frame_deadlines.expired(self.clock.monotonic_seconds()):
            if not conn.closing:
                message = late_frame_message(conn)
                self.input_budget.release(conn)  # what it sent holds no room any more
                self._fatal(conn, None, message)

    def _timeout(self) -> float | None:
        if ((self._deferring and any(conn.can_resume() for conn in self._deferring))
                or self.service.outbox or self._unread):
            # Deferred requests can go now, or answers produced after the last delivery
            # (a failed compaction's) wait: no event will announce either.
            return 0.0
        monotonic_seconds = self.clock.monotonic_seconds()
        deadlines: list[float] = []
        if (freeing := self.filesystem.seconds_to_next_step(monotonic_seconds)) is not None:
            deadlines.append(freeing)  # a deleted file's next step of blocks to free
        if (child := self.compaction.next_deadline()) is not None:
            deadlines.append(child - monotonic_seconds)  # a snapshot child to kill if it still runs
        if (accepting := self.acceptor.next_deadline()) is not None:
            deadlines.append(accepting - monotonic_seconds)  # a hello due, or accepts to resume
        if self.metrics_endpoint is not None and (scrape := self.metrics_endpoint.next_deadline()) is not None:
            deadlines.append(scrape - monotonic_seconds)
        if (frame := self.frame_deadlines.next_deadline()) is not None:
            deadlines.append(frame - monotonic_seconds)
        if self.notifier.watchdog_seconds is not None:
            deadlines.append(self._next_watchdog - monotonic_seconds)
        wait_deadline = self.service.next_wait_deadline()
        if wait_deadline is not None:
            deadlines.append(wait_deadline - monotonic_seconds)
        due = self.service.next_due_time()
        if due is not None:
            if due <= self.now.last_now:
                # Due work is done in the turn it is due, unless the reaper is
                # backing off after a failed write: wake when that ends; never spin.
                retry = self.reap_backoff.remaining(monotonic_seconds)
                deadlines.append(1.0 if retry is None else max(retry, 0.001))
            else:
                # +1 ms so the daemon's whole seconds have reached `due` on waking.
                deadlines.append(due - self.now.seconds() + 0.001)
        if not deadlines:
            return None
        return min(MAX_TIMER_SECONDS, max(0.0, min(deadlines)))

    def _watchdog(self) -> None:
        if self.notifier.watchdog_seconds is None:
            return
        if self.clock.monotonic_seconds() >= self._next_watchdog:
            self.notifier.notify("WATCHDOG=1")
            self._next_watchdog = self.clock.monotonic_seconds() + self.notifier.watchdog_seconds

    # -- connections -------------------------------------------------------------

    def _close(self, conn: PeerConnection, reason: str) -> None:
        if conn.closed:
            return
        conn.closed = True
        conn.deferred.clear()
        self._deferring.discard(conn)
        self._unread.pop(conn, None)
        self.input_budget.release(conn)
        if conn.events:
            self.selector.unregister(conn.sock)
            conn.events = 0
        self.connections.pop(conn.sock.fileno(), None)
        conn.sock.close()
        self.service.forget(conn)
        # An ordinary close is DEBUG, as its connect was; a failed one says what went wrong.
        log.log(logging.DEBUG if reason in ORDINARY_CLOSES else logging.INFO,
                "disconnect %s (%s)", conn.name, reason)

    def _settle(self, conn: PeerConnection) -> None:
        """Register exactly the events the connection needs now, or close it."""
        if conn.closed:
            return
        reason = conn.close_reason()
        if reason is not None:
            self._close(conn, reason)
            return
        wanted = conn.wanted_events()
        if wanted == conn.events:
            return
        if conn.events == 0:
            self.selector.register(conn.sock, wanted, conn)
        elif wanted == 0:
            self.selector.unregister(conn.sock)
        else:
            self.selector.modify(conn.sock, wanted, conn)
        conn.events = wanted

    def _send(self, conn: PeerConnection) -> None:
        error = conn.send(self.listing_budget)
        if error is not None:
            self._close(conn, f"send failed: {error}")

    def _receive(self, conn: PeerConnection, requests: list, monotonic_seconds: float) -> None:
        try:
            if not conn.receive(self._receive_buffer, self._receive_view):
                return
        except OSError as exc:
            self._close(conn, f"receive failed: {exc}")
            return
        if conn.eof:
            # A peer that closed (a killed worker looks the same) must never be
            # handed a lease: its waits end now, with no leases.
            self.service.end_waits(conn)
            return
        try:
            conn.decode(requests, self.input_budget)
        except ConnectionFault as fault:
            self._fatal(conn, fault.request_id, fault.message, fault.code)
        self.frame_deadlines.track(conn, monotonic_seconds)

    def _fatal(self, conn: PeerConnection, request_id: int | None, message: str,
               code: str = protocol.PROTOCOL_ERROR) -> None:
        """Answer a protocol violation (after the answers already due) and close."""
        conn.fail(request_id, message, code)
        self._touched.add(conn)
        self._deferring.discard(conn)
        self.service.drop_waits(conn)  # the connection is closing: its waits end with it

    # -- applying a turn ---------------------------------------------------------------

    def _apply(self, requests: list[tuple[PeerConnection, protocol.Request]]) -> bool:
        """Apply a turn's requests and due work in one batch; True if the batch may have written.

        Requests of a saturated connection (PeerConnection.saturated) are
        deferred, in order, to a later turn instead.
        """
        if self._deferring:
            resumed: list[tuple[PeerConnection, protocol.Request]] = []
            for conn in list(self._deferring):
                if conn.closed:
                    self._deferring.discard(conn)
                elif conn.can_resume():
                    resumed.extend((conn, request) for request in conn.deferred)
                    conn.deferred.clear()
                    self._deferring.discard(conn)
                    self._touched.add(conn)
            requests = resumed + requests
        service = self.service
        now = self.now()
        reap = service.reap_due(now) and self.reap_backoff.ready(self.clock.monotonic_seconds())
        if not requests and not service.parked.live and not reap:
            return False
        service.begin_turn(now, self.clock.monotonic_seconds())
        # Expiry and serving parked reserves may write too (expire and reserve frames).
        writing = reap or service.parked.live > 0 or any(
            isinstance(request, protocol.WRITING_REQUESTS) for _, request in requests)
        self.recorder.turn_started(now, service.queue)
        turn = self.turn
        monotonic_seconds = self.clock.monotonic_seconds

        def apply() -> None:
            if reap:
                service.reap()
            if service.parked.live:
                service.serve_parked()
            apply_until = monotonic_seconds() + TURN_WORK_SECONDS
            applied = 0
            for conn, request in _in_rounds(requests):
                if conn.closed:
                    continue
                listing = type(request) is protocol.Tasks
                if (conn.deferred or conn.saturated(turn)
                        or (listing and self._listings_started >= MAX_LISTINGS_STARTED_PER_TURN)
                        or (applied and monotonic_seconds() >= apply_until)):
                    if not conn.closing:  # a closing connection's are dropped
                        conn.deferred.append(request)
                        self._deferring.add(conn)
                    continue
                if listing:
                    self._listings_started += 1
                conn.turn_requests += 1
                applied += 1
                service.handle(conn, request)

        committed = self.commit.turn(apply)
        if reap:
            self._reaped(committed)
        return committed and writing

    def _reaped(self, committed: bool) -> None:
        """Space out the daemon's own reaps after a failed one (the commit logged the failure)."""
        if committed:
            if self.reap_backoff.failures:
                log.info("expiring leases works again after %d failed attempt(s)", self.reap_backoff.failures)
            self.reap_backoff.succeeded()
            return
        delay = self.reap_backoff.failed(self.clock.monotonic_seconds())
        log.error("expiring due leases failed to write (%d in a row); next attempt in %.0f s (a reserve "
                  "still reaps first)", self.reap_backoff.failures, delay)

    def _queue_answers(self) -> None:
        outbox = self.service.outbox
        for answer in outbox:
            conn = answer.peer
            if conn.closed:
                continue
            conn.deliver(answer.request_id, answer.messages)
            self._touched.add(conn)
        outbox.clear()
        for conn in self._touched:
            if conn.fatal is not None:
                conn.queue_fatal()
            if conn.backlog:
                conn.fill(self.listing_budget)

    # -- shutdown ------------------------------------------------------------------------

    def _shutdown(self) -> None:
        self.notifier.notify("STOPPING=1")
        log.info("stopping: %d connection(s), %d parked reserve(s)", len(self.connections),
                 self.service.parked.live)
        self.compaction.stop()  # kill and reap a snapshot child first; its requests are answered
        try:
            self.selector.unregister(self.acceptor.listener)
        except (KeyError, ValueError):
            pass
        self.acceptor.listener.close()
        # Parked reserves end early with no leases; their clients retry later.
        self.service.end_all_waits()
        self._queue_answers()
        clock = self.clock
        deadline = clock.monotonic_seconds() + DRAIN_SECONDS
        for conn in list(self.connections.values()):
            conn.eof = True  # read nothing more
            self._send(conn)
            self._settle(conn)
        while self.connections and clock.monotonic_seconds() < deadline:
            self.listing_budget.renew()
            pending = [c for c in self.connections.values() if c.out or c.backlog]
            if not pending:
                break
            for key, _ in self.selector.select(max(0.0, deadline - clock.monotonic_seconds())):
                if key.data is _WAKEUP:
                    self._wakeup.drain()  # another signal: keep draining answers
                elif isinstance(key.data, PeerConnection):
                    self._send(key.data)
                    self._settle(key.data)
        for conn in list(self.connections.values()):
            self._close(conn, "daemon stopping")
        queue = self.service.queue
        if queue is not None:
            try:
                queue.close()
            except OSError as exc:
                log.error("closing the queue failed: %r", exc)
        self.filesystem.close_all()
        if self.socket_path is not None:
            try:
                os.unlink(self.socket_path)
            except FileNotFoundError:
                pass
        if self.metrics_endpoint is not None:
            self.metrics_endpoint.close()
        self.acceptor.close()
        self.selector.close()
        self._wakeup.close()
        log.info("stopped")

    def close_without_serving(self) -> None:
        """Release what __init__ made, for a Loop whose run() never ran (tests); the queue stays open."""
        self.acceptor.close()
        self.compaction.stop()
        self.filesystem.close_all()
        self.selector.close()
        self._wakeup.close()
