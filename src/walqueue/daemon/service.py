"""The sans-IO service: walqueued's requests applied to its queue's Engine, with no I/O of its own.

The service owns the (injected) Engine (walqueue.engine). The loop hands it the decoded
requests of one turn, after `begin_turn(now, monotonic_seconds)`; it applies
them and leaves their answers, already encoded (or, for a listing, as a
lazy iterator of messages), in `outbox`, in the order they were produced.
It never reads a clock, a socket or a signal: `now` (the daemon's whole
wall seconds) and the monotonic reading that times waits are given, and a
client is an opaque `Peer` that only says its name and whether it has gone.
So it is tested by feeding it requests and times (tests/unit/test_service.py),
as h11 is tested without sockets.

What it decides:

* Dispatch: one handler per request type (`QueueService._handlers`, a table).
  InvalidRequest, KeyConflict and StaleLease — errors raised before the
  Engine writes anything — become that request's error answer; anything else
  propagates to the group commit (walqueue.daemon.commit), which tells a
  failed write from a bug.
* Parking: a ``reserve`` (or the reserve half of ``ack_and_reserve``) with
  ``wait > 0`` that leased nothing waits in arrival order. Waits are served
  at the start of every turn and right after every request that can make a
  task due (put, put_many, release, revive, resume); the loop's timer wakes
  the service at the next due time and at the end of the next wait, so no
  one polls. A peer that has gone is never handed a lease.
* Lease expiry on time (SPEC §8a): when the earliest lease deadline has
  passed (`reap_due`), `reap` writes exactly the expire frames a reserve
  would, nothing else. It runs while paused too: pausing stops leasing, not
  time, so ``get``/``stats``/``dead`` show expired leases as they happen.
* Pause: while paused every reserve leases nothing (a waiting one parks);
  resuming serves the parked ones in arrival order.
* Backup pin: one connection at a time pins the files of a consistent copy;
  while pinned, compaction is refused (on request) or postponed (automatic).
* Chunking: list answers are split so that no message carries more than
  ``protocol.CHUNK_BUDGET_BYTES`` of items; a ``tasks`` listing is produced
  lazily, as fast as the client reads it, and ends with QueueClosed if the
  Engine is replaced meanwhile (`queue_epoch`).

Invariant: an answer in `outbox` may be sent only after the batch of its
turn has exited without error; `fail_turn` replaces the answers of a turn
whose batch failed.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Protocol

from walqueue import (
    InvalidRequest,
    KeyConflict,
    StaleLease,
    protocol,
    validation,
)
from walqueue.engine import Engine, lease_of, view_of

from .log import log, one_line
from .steering import Activity, SteeringRequests, WorkerNames

# Errors a request can cause without the Engine writing anything; the batch
# goes on. Anything else raised inside a batch propagates to the commit.
REQUEST_ERRORS = (InvalidRequest, KeyConflict, StaleLease)
# SPEC §8b: the longest lease a reserve or touch may ask for (12 h, SQS's visibility limit),
# unless `walqueued serve --max-lease-seconds` says otherwise. The library keeps §1's bounds.
DEFAULT_MAX_LEASE_SECONDS = 43200
# What encoding an answer can raise for a value msgpack cannot carry.
ENCODING_ERRORS = (protocol.ProtocolError, TypeError, OverflowError)
_Error = protocol.Error  # looked for in every answer (encode_answer): one global lookup
MAX_PARKED_PER_CONNECTION = 64
MAX_FORCE_RELEASE_TASKS = 10_000  # one release frame each, all in one turn


class Peer(Protocol):
    """What the service knows of a client connection (walqueue.daemon.connection.PeerConnection)."""

    name: str  # for log lines
    parked: int  # its waiting reserves: kept by the service
    closing: bool  # it is being closed: its reserves never wait
    answer_bytes: int  # bytes of encoded answers produced for it: counted by the service
    protocol_version: int  # the wire version its hello announced: what its answers may carry

    def gone(self) -> bool:
        """True once the peer has closed its end (a lease handed to it would sit unused)."""
        ...


class ListingInterrupted(Exception):
    """A lazily produced ``tasks`` answer outlived the Engine it was reading."""


@dataclass(frozen=True, slots=True)
class Refused:
    """A request the protocol's request bounds refused (protocol.RequestRefused): answered
    InvalidRequest ``message`` in its turn, like any request's error."""

    id: int
    message: str


@dataclass(eq=False, slots=True)
class Answer:
    peer: Peer
    request_id: int | None
    messages: bytes | Iterator  # the encoded frames, or a lazy iterator of messages (a listing)


@dataclass(eq=False)
class Parked:
    peer: Peer
    request: protocol.Reserve | protocol.AckAndReserve
    deadline_seconds: float  # the monotonic reading at which the wait ends
    turn: int  # the service turn that parked it
    done: bool = False


class ParkedReserves:
    """Waiting reserves: arrival order for serving, a heap of deadlines for the timer,
    and each peer's own entries.

    Entries leave by being marked done (served, expired, dropped); done
    entries are skipped lazily, so serving the head, finding the next deadline
    and expiring waits cost O(log n), not O(n), per loop turn, and dropping a
    closed peer's waits costs O(its own), not O(all parked).
    """

    def __init__(self) -> None:
        self._arrivals: deque[Parked] = deque()
        self._deadlines: list[tuple[float, int, Parked]] = []
        # id(peer) -> its live entries in arrival order (by id: a peer need not be hashable).
        self._by_peer: dict[int, dict[Parked, None]] = {}
        self._counter = 0
        self.live = 0

    def __bool__(self) -> bool:
        return self.live > 0

    def add(self, entry: Parked) -> None:
        self._arrivals.append(entry)
        self._counter += 1
        heapq.heappush(self._deadlines, (entry.deadline_seconds, self._counter, entry))
        self._by_peer.setdefault(id(entry.peer), {})[entry] = None
        entry.peer.parked += 1
        self.live += 1

    def _finish(self, entry: Parked) -> None:
        entry.done = True
        entry.peer.parked -= 1
        self.live -= 1
        own = self._by_peer[id(entry.peer)]
        del own[entry]
        if not own:
            del self._by_peer[id(entry.peer)]
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

    def expire(self, monotonic_seconds: float) -> list[Parked]:
        """Finish and return the live entries whose wait ended by ``monotonic_seconds``."""
        ended = []
        while (deadline := self.next_deadline()) is not None and deadline <= monotonic_seconds:
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

    def drop_peer(self, peer: Peer) -> list[Parked]:
        """Finish and return ``peer``'s live entries, in arrival order: O(its own)."""
        dropped = list(self._by_peer.get(id(peer), ()))
        for entry in dropped:
            self._finish(entry)
        return dropped


def wire_put(request: protocol.Put) -> dict:
    """A put's validated request (validation.put_request). Its payload was just decoded and
    is used for nothing else, so it is stored without a copy when it is plain JSON already."""
    return validation.put_request(request.task_id, request.payload, request.key, request.available_at,
                                  request.max_attempts, copy=False)


def wire_puts(requests: list[protocol.PutItem]) -> list[dict]:
    """wire_put of a put_many's items, their payloads counted against one budget."""
    containers = validation.Containers()
    return [validation.put_request(item.task_id, item.payload, item.key, item.available_at,
                                   item.max_attempts, where=f"requests[{index}].", copy=False,
                                   containers=containers)
            for index, item in enumerate(requests)]


def chunked(request_id: int, items: list[protocol.Raw], message_type: type) -> list:
    """Split a list answer (its items already encoded) into messages of at most
    CHUNK_BUDGET_BYTES of items each."""
    if sum(map(len, items)) <= protocol.CHUNK_BUDGET_BYTES:  # one message: the common case
        return [message_type(request_id, items)]
    chunks: list[list[protocol.Raw]] = [[]]
    size = 0
    for item in items:
        if chunks[-1] and size + len(item) > protocol.CHUNK_BUDGET_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(item)
        size += len(item)
    last = len(chunks) - 1
    return [message_type(request_id, chunk, index < last) for index, chunk in enumerate(chunks)]


def encode_answer(peer: Peer, messages: list) -> bytes:
    """The frames of the answer ``messages``, as ``peer``'s protocol version may read them.

    Every answer is encoded here (the service's answers, a connection's
    listings and fatal errors), so an ``Error`` always loses the fields the
    peer's version lacks. Raises ENCODING_ERRORS for what the wire cannot
    carry: the caller answers `unsendable_answer` instead.
    """
    if len(messages) == 1:  # the common case
        message = messages[0]
        if type(message) is _Error:
            message = protocol.error_for_version(message, peer.protocol_version)
        return protocol.encode(message)
    return b"".join([protocol.encode(protocol.error_for_version(message, peer.protocol_version)
                                     if type(message) is _Error else message) for message in messages])


def unsendable_answer(peer: Peer, request_id: int | None, exc: Exception) -> bytes:
    """The answer that replaces one the wire cannot carry (a value msgpack cannot encode,
    an item larger than a message): ``InvalidRequest`` with code ``unsendable_answer``, logged."""
    log.error("answer to request %s from %s not encodable: %s", request_id, peer.name, one_line(str(exc)))
    error = protocol.Error(id=request_id, error="InvalidRequest", message=f"the answer cannot be sent: {exc}",
                           code=protocol.UNSENDABLE_ANSWER)
    return encode_answer(peer, [error])


class QueueService(SteeringRequests):
    """One Engine served to many peers; see the module docstring (and walqueue.daemon.steering
    for cancel, workers and listing in pages).

    ``compact(peer, request_id)`` takes a ``compact`` request, which the
    compactor (walqueue.daemon.compaction) answers through `answer` once a
    snapshot covering it is published; ``report(now)`` builds the daemon's
    full report (DaemonStats) for ``daemon_stats``.
    """

    def __init__(self, queue: Engine, *, compact: Callable[[Peer, int], None],
                 report: Callable[[int], protocol.DaemonStats],
                 max_lease_seconds: int = DEFAULT_MAX_LEASE_SECONDS) -> None:
        self.queue = queue
        self.max_lease_seconds = max_lease_seconds
        self.queue_epoch = 0  # bumped whenever the Engine is replaced after a failure
        self.parked = ParkedReserves()
        self.paused = False  # walqueue-ctl pause: every reserve leases nothing
        self.backup_holder: Peer | None = None  # the peer pinning a backup's files
        self.outbox: list[Answer] = []
        self.turn = 0
        self.now = 0
        self.monotonic_seconds = 0.0
        self._compact = compact
        self._report = report
        self._turn_requests: list[tuple[Peer, int]] = []
        self._turn_outbox_start = 0
        self.worker_names = WorkerNames()  # the worker names open connections used (SPEC §8b)
        self.activity = Activity()  # each open connection's requests (the Connections view)
        self._handlers: dict[type, Callable] = {
            **self._steering_handlers(),
            protocol.Put: self._put,
            protocol.PutMany: self._put_many,
            protocol.Reserve: self._reserve,
            protocol.AckAndReserve: self._ack_and_reserve,
            protocol.Ack: self._ack,
            protocol.Release: self._release,
            protocol.Touch: self._touch,
            protocol.Revive: self._revive,
            protocol.Get: self._get,
            protocol.Tasks: self._tasks,
            protocol.Stats: self._stats,
            protocol.Compact: self._compact_on_request,
            protocol.Pause: self._pause_or_resume,
            protocol.Resume: self._pause_or_resume,
            protocol.BackupBegin: self._backup_begin,
            protocol.BackupEnd: self._backup_end,
            protocol.DaemonStatsReq: self._daemon_stats,
            protocol.ForceRelease: self._force_release,
            Refused: self._refused,
        }

    # -- a turn --------------------------------------------------------------------

    def begin_turn(self, now: int, monotonic_seconds: float) -> None:
        """Start a turn at ``now`` (whole wall seconds); waits are timed by ``monotonic_seconds``."""
        self.turn += 1
        self.now = now
        self.monotonic_seconds = monotonic_seconds
        self._turn_requests = []
        self._turn_outbox_start = len(self.outbox)

    def handle(self, peer: Peer, request: protocol.Request) -> None:
        """Apply one request (inside the turn's batch) and queue its answer.

        Raises only what is not the request's own fault: a failed write, or a bug.
        """
        self._turn_requests.append((peer, request.id))
        self.activity.note(peer, self.monotonic_seconds)
        try:
            self._handlers[type(request)](peer, request)
        except REQUEST_ERRORS as exc:
            log.debug("request %d from %s: %s: %s", request.id, peer.name, type(exc).__name__,
                      one_line(str(exc)))
            self._answer(peer, request.id, [protocol.error_to_wire(request.id, exc)])
        else:
            worker = getattr(request, "worker", None)
            if worker is not None:
                self.worker_names.note(peer, worker)

    def fail_turn(self, message: str) -> int:
        """Answer every request of this turn's failed batch with QueueClosed ``message``.

        The answers the turn produced are dropped (none may report success),
        and so are the waits it parked. Returns how many requests were answered.
        """
        start = self._turn_outbox_start
        affected = {(id(answer.peer), answer.request_id): answer.peer for answer in self.outbox[start:]}
        for peer, request_id in self._turn_requests:
            affected[(id(peer), request_id)] = peer
        for entry in self.parked.drop(lambda entry: entry.turn == self.turn):
            affected[(id(entry.peer), entry.request.id)] = entry.peer
        del self.outbox[start:]
        for (_, request_id), peer in affected.items():
            self._answer(peer, request_id, [protocol.Error(id=request_id, error="QueueClosed", message=message,
                                                           code=protocol.WRITE_FAILED)])
        self._turn_requests = []
        return len(affected)

    @property
    def requests_this_turn(self) -> int:
        """How many requests `handle` took since `begin_turn`."""
        return len(self._turn_requests)

    def replace_queue(self, queue: Engine | None) -> Engine:
        """Swap in the Engine reopened after a failure (None while there is none); returns the old one.

        Listings in progress read the old state, which may hold the failed
        batch's undurable changes: they end, whether or not a new Engine comes.
        """
        old, self.queue = self.queue, queue
        self.queue_epoch += 1
        return old

    # -- timers ----------------------------------------------------------------------

    def reap_due(self, now: int) -> bool:
        """True if a lease's deadline has passed by ``now`` (then `reap` belongs in this turn)."""
        deadline = self.queue.next_lease_deadline()
        return deadline is not None and deadline <= now

    def reap(self) -> None:
        """Expire the leases due at this turn's ``now`` (SPEC §8a), inside the turn's batch."""
        expired = self.queue.expire_due(now=self.now)
        if expired:
            log.debug("expired %d lease(s) at %d", expired, self.now)

    def next_due_time(self) -> int | None:
        """The wall second at which the service has work: a lease to expire, or a
        task due while reserves wait (and leasing is not paused)."""
        if self.parked.live and not self.paused:
            return self.queue.next_due_time()  # ready due times and lease deadlines
        return self.queue.next_lease_deadline()

    def next_wait_deadline(self) -> float | None:
        """The monotonic second at which the earliest wait ends."""
        return self.parked.next_deadline() if self.parked.live else None

    def expire_waits(self, monotonic_seconds: float) -> None:
        """Answer the waits that ended by ``monotonic_seconds`` with no leases."""
        for entry in self.parked.expire(monotonic_seconds):
            self._answer(entry.peer, entry.request.id, [protocol.Leases(id=entry.request.id, leases=[])])

    # -- parking -----------------------------------------------------------------------

    def serve_parked(self) -> None:
        """Lease due tasks to parked reserves, in arrival order."""
        while (entry := self.parked.head()) is not None:
            request = entry.request
            if entry.peer.gone():
                self.end_waits(entry.peer)
                continue
            try:
                leases = self._lease_due(request.worker, request.lease_seconds, request.limit)
            except REQUEST_ERRORS as exc:
                leases = exc
            if not leases:
                return
            self.parked.finish_head()
            if isinstance(leases, Exception):
                self._answer(entry.peer, request.id, [protocol.error_to_wire(request.id, leases)])
            else:
                self._answer_leases(entry.peer, request.id, leases)

    def end_waits(self, peer: Peer) -> None:
        """Answer a peer's parked reserves with no leases (it closed, or the daemon stops)."""
        for entry in self.parked.drop_peer(peer):
            self._answer(peer, entry.request.id, [protocol.Leases(id=entry.request.id, leases=[])])

    def end_all_waits(self) -> None:
        """Answer every parked reserve with no leases: the daemon is stopping."""
        for entry in self.parked.drop(lambda entry: True):
            self._answer(entry.peer, entry.request.id, [protocol.Leases(id=entry.request.id, leases=[])])

    def drop_waits(self, peer: Peer) -> None:
        """Drop a peer's parked reserves unanswered: it is being closed."""
        self.parked.drop_peer(peer)

    def forget(self, peer: Peer) -> None:
        """Drop everything the service holds for a closed peer: its waits, its backup pin."""
        self.drop_waits(peer)
        self.worker_names.forget(peer)
        self.activity.forget(peer)
        if self.backup_holder is peer:
            self.backup_holder = None
            log.warning("backup pin released: %s closed before ending its backup", peer.name)

    def _reserve_or_park(self, peer: Peer, request: protocol.Reserve | protocol.AckAndReserve) -> None:
        """Lease due tasks to ``request``'s worker now, or park it if it may wait."""
        if peer.gone():
            # It sent this and closed (or died): a lease could only sit
            # unused until it expired.
            self._answer(peer, request.id, [protocol.Leases(id=request.id, leases=[])])
            return
        # Parked reserves were served at the start of the turn and after
        # every request that made a task due, so if any are still parked
        # this returns nothing: arrival order holds.
        leases = self._lease_due(request.worker, request.lease_seconds, request.limit)
        if leases or request.wait == 0 or peer.closing:
            self._answer_leases(peer, request.id, leases)
        else:
            self._check_may_park(peer, request)
            self.parked.add(Parked(peer, request, self.monotonic_seconds + request.wait, self.turn))
            log.debug("parked reserve %d of %s for %.3f s", request.id, peer.name, request.wait)

    @staticmethod
    def _check_may_park(peer: Peer, request: protocol.Reserve | protocol.AckAndReserve) -> None:
        if request.wait > 0 and peer.parked >= MAX_PARKED_PER_CONNECTION:
            raise InvalidRequest(
                f"too many waiting reserves on this connection ({MAX_PARKED_PER_CONNECTION}); "
                "wait for one to be answered or use another connection"
            )

    def _lease_due(self, worker: str, lease_seconds: int, limit: int) -> list[protocol.Raw]:
        """Lease up to ``limit`` due tasks, or nothing while paused; the leases encoded for the wire.

        Every reserve (new, parked, or the reserve half of a combined request)
        goes through here, so pausing is this one check. Paused, a reserve
        writes nothing either; expired leases are still reaped on time (`reap`).

        A lease the wire cannot carry (a payload integer beyond 64 bits, only
        in data written before the library refused them) is left out of the
        answer and logged, and another due task is leased in its place: one
        such task never costs the others their lease. Its own lease, written
        like any other, ends on time as if its worker had died, so it uses an
        attempt per lease and ends dead (docs/guarantees.md).
        """
        if self.paused:
            return []
        encoded: list[protocol.Raw] = []
        while len(encoded) < limit:
            # Each lease is encoded at once from its fields (the stored payload, not a copy).
            leased = self.queue.reserve(worker, now=self.now, lease_seconds=lease_seconds,
                                        limit=limit - len(encoded))
            carried = 0
            for task in leased:
                try:
                    encoded.append(protocol.Raw(protocol.encode_value(protocol.WireLease(
                        task.task_id, task.worker, task.generation, task.deadline, task.attempts,
                        task.payload))))
                    carried += 1
                except ENCODING_ERRORS as exc:
                    log.error("task %s leased to %s but not handed out: the wire cannot carry its "
                              "payload (%s); its lease ends at %d", one_line(repr(task.task_id)),
                              one_line(repr(worker)), exc, task.deadline)
            if carried == len(leased):  # all carried, or nothing was due
                break
        return encoded

    # -- answers -------------------------------------------------------------------------

    def answer(self, peer: Peer, request_id: int, messages: list) -> None:
        """Queue an answer produced outside a request's handler (a compaction's, once published)."""
        self._answer(peer, request_id, messages)

    def _answer(self, peer: Peer, request_id: int | None, messages: list) -> None:
        """Queue an answer, encoded now into one bytes value."""
        try:
            encoded = encode_answer(peer, messages)
        except ENCODING_ERRORS as exc:
            encoded = unsendable_answer(peer, request_id, exc)
        peer.answer_bytes += len(encoded)
        self.outbox.append(Answer(peer, request_id, encoded))

    _chunked = staticmethod(chunked)

    def _answer_leases(self, peer: Peer, request_id: int, leases: list[protocol.Raw]) -> None:
        self._answer(peer, request_id, chunked(request_id, leases, protocol.Leases))

    # -- the requests --------------------------------------------------------------------

    def _put(self, peer: Peer, request: protocol.Put) -> None:
        task_id, = self.queue.put([wire_put(request)])
        self._answer(peer, request.id, [protocol.PutOk(id=request.id, task_id=task_id)])
        if self.parked.live:
            self.serve_parked()

    def _put_many(self, peer: Peer, request: protocol.PutMany) -> None:
        task_ids = self.queue.put(wire_puts(request.requests))
        self._answer(peer, request.id, [protocol.TaskIds(id=request.id, task_ids=task_ids)])
        if self.parked.live:
            self.serve_parked()

    def _check_lease_bound(self, lease_seconds: object) -> None:
        """InvalidRequest (nothing written) for a lease longer than this daemon allows (SPEC §8b)."""
        if type(lease_seconds) is int and lease_seconds > self.max_lease_seconds:
            raise InvalidRequest(
                f"lease_seconds={lease_seconds} is above this daemon's bound of "
                f"{self.max_lease_seconds} s (walqueued serve --max-lease-seconds): ask for a "
                f"shorter lease and touch it while the work goes on")

    def _reserve(self, peer: Peer, request: protocol.Reserve) -> None:
        protocol.check_wait(request.wait)
        self._check_lease_bound(request.lease_seconds)
        self._reserve_or_park(peer, request)

    def _ack_and_reserve(self, peer: Peer, request: protocol.AckAndReserve) -> None:
        # Everything that could reject the reserve half is checked before the
        # ack is written: a rejected request writes nothing.
        protocol.check_wait(request.wait)
        validation.integer(request.lease_seconds, "lease_seconds", minimum=1)
        validation.integer(request.limit, "limit", minimum=1, maximum=validation.MAX_RESERVE_LIMIT)
        validation.time_plus(self.now, request.lease_seconds, "lease_seconds")
        self._check_lease_bound(request.lease_seconds)
        self._check_may_park(peer, request)
        self.queue.ack(request.task_id, request.worker, request.generation, now=self.now)
        self._reserve_or_park(peer, request)

    def _ack(self, peer: Peer, request: protocol.Ack) -> None:
        self.queue.ack(request.task_id, request.worker, request.generation, now=self.now)
        self._answer(peer, request.id, [protocol.Done(id=request.id)])

    def _release(self, peer: Peer, request: protocol.Release) -> None:
        self.queue.release(request.task_id, request.worker, request.generation, now=self.now,
                           delay=request.delay)
        self._answer(peer, request.id, [protocol.Done(id=request.id)])
        if self.parked.live:
            self.serve_parked()

    def _touch(self, peer: Peer, request: protocol.Touch) -> None:
        self._check_lease_bound(request.lease_seconds)
        task = self.queue.touch(request.task_id, request.worker, request.generation, now=self.now,
                                lease_seconds=request.lease_seconds)
        self._answer(peer, request.id, [protocol.LeaseOk(id=request.id, lease=lease_of(task))])

    def _revive(self, peer: Peer, request: protocol.Revive) -> None:
        task_ids = self.queue.revive(request.task_ids, now=self.now)
        self._answer(peer, request.id, [protocol.TaskIds(id=request.id, task_ids=task_ids)])
        if self.parked.live:
            self.serve_parked()

    def _get(self, peer: Peer, request: protocol.Get) -> None:
        task = self.queue.get(request.task_id)
        self._answer(peer, request.id, [protocol.TaskOk(id=request.id, task=None if task is None else view_of(task))])

    def _tasks(self, peer: Peer, request: protocol.Tasks) -> None:
        self.outbox.append(Answer(peer, request.id, self._listing(request.id, request.status)))

    def _stats(self, peer: Peer, request: protocol.Stats) -> None:
        self._answer(peer, request.id, [protocol.StatsOk(id=request.id, stats=self.queue.stats())])

    def _compact_on_request(self, peer: Peer, request: protocol.Compact) -> None:
        if self.backup_holder is not None:
            raise InvalidRequest(f"a backup is in progress ({self.backup_holder.name}); compaction "
                                 "would delete the files it copies: compact after it ends")
        self._compact(peer, request.id)  # answered once CURRENT names a snapshot covering it

    def _pause_or_resume(self, peer: Peer, request: protocol.Pause | protocol.Resume) -> None:
        """Pause or resume leasing (idempotent); resuming serves parked reserves in arrival order."""
        paused = type(request) is protocol.Pause
        if paused != self.paused:
            self.paused = paused
            log.info("%s by %s (%d reserve(s) waiting)", "paused" if paused else "resumed",
                     peer.name, self.parked.live)
        if not paused:
            self.serve_parked()
        self._answer(peer, request.id, [protocol.PauseState(id=request.id, paused=self.paused)])

    def _backup_begin(self, peer: Peer, request: protocol.BackupBegin) -> None:
        """Pin the files of a consistent copy for ``peer`` and describe them.

        Raises InvalidRequest while another backup holds the pin.
        """
        if self.backup_holder is not None:
            raise InvalidRequest(f"a backup is already in progress ({self.backup_holder.name}); "
                                 "wait for it to finish")
        manifest = self.queue.backup_manifest()  # may compact a queue never compacted
        self.backup_holder = peer
        log.info("backup pin taken by %s: seq %d, %d file(s)", peer.name, manifest.seq, len(manifest.files))
        self._answer(peer, request.id, [protocol.manifest_to_wire(request.id, manifest)])

    def _backup_end(self, peer: Peer, request: protocol.BackupEnd) -> None:
        if self.backup_holder is not peer:
            raise InvalidRequest("this connection holds no backup pin (it ends when the connection "
                                 "that began the backup closes)")
        self.backup_holder = None
        log.info("backup pin released by %s", peer.name)
        self._answer(peer, request.id, [protocol.Done(id=request.id)])

    def _daemon_stats(self, peer: Peer, request: protocol.DaemonStatsReq) -> None:
        stats = protocol.daemon_stats_to_wire(self._report(self.now), peer.protocol_version)
        self._answer(peer, request.id, [protocol.DaemonStatsOk(id=request.id, stats=stats)])

    def _force_release(self, peer: Peer, request: protocol.ForceRelease) -> None:
        """End the listed tasks' current leases now, as their workers' releases would (delay 0).

        For the operator after a wall-clock jump at start, or a worker that
        will never come back. Every task is checked before anything is
        written: InvalidRequest (nothing written) if one is not leased.
        """
        if len(request.task_ids) > MAX_FORCE_RELEASE_TASKS:
            raise InvalidRequest(f"force_release of {len(request.task_ids)} task ids: at most "
                                 f"{MAX_FORCE_RELEASE_TASKS} a request")
        task_ids = list(dict.fromkeys(validation.name(task_id, f"task_ids[{index}]")
                                      for index, task_id in enumerate(request.task_ids)))
        leases = []  # (task_id, worker, generation, deadline) of each
        for task_id in task_ids:
            task = self.queue.get(task_id)
            if task is None or task.status != "leased" or task.deadline <= self.now:
                status = "unknown" if task is None else "expired" if task.status == "leased" else task.status
                raise InvalidRequest(f"task {task_id!r} is {status}, not leased: there is no lease to release")
            leases.append((task_id, task.worker, task.generation, task.deadline))
        for task_id, worker, generation, deadline in leases:
            self.queue.release(task_id, worker, generation, now=self.now)
            log.warning("lease of task %s (worker %s, generation %d, deadline %d) released by force by %s",
                        one_line(repr(task_id)), one_line(repr(worker)), generation, deadline, peer.name)
        self._answer(peer, request.id, [protocol.TaskIds(id=request.id, task_ids=task_ids)])
        if self.parked.live:
            self.serve_parked()

    def _refused(self, peer: Peer, request: Refused) -> None:
        log.debug("request %d from %s refused: %s", request.id, peer.name, one_line(request.message))
        self._answer(peer, request.id, [protocol.Error(id=request.id, error="InvalidRequest", message=request.message,
                                                       code=protocol.REQUEST_REFUSED)])

    def _listing(self, request_id: int, status: str | None) -> Iterator:
        """The ``tasks`` answer, produced lazily as the client reads it.

        Views are taken outside any batch (as the connection encodes them),
        so each shows durable state; a task whose status changed since the
        listing began is left out of a filtered listing. A reopen in between
        ends it with an error (ListingInterrupted).
        """
        epoch = self.queue_epoch
        views = map(view_of, self.queue.tasks(status))  # raises InvalidRequest now, inside the batch

        def chunks():
            batch: list[protocol.Raw] = []
            size = 0
            while True:
                if self.queue_epoch != epoch:
                    raise ListingInterrupted("the queue was reopened after a write failure; list again")
                view = next(views, None)
                if view is None:
                    break
                if status is not None and view.status != status:
                    continue
                encoded = protocol.encode_value(view)
                if batch and size + len(encoded) > protocol.CHUNK_BUDGET_BYTES:
                    yield protocol.TaskList(request_id, batch, True)
                    batch, size = [], 0
                batch.append(protocol.Raw(encoded))
                size += len(encoded)
            yield protocol.TaskList(request_id, batch, False)

        return chunks()
