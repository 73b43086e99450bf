"""The messages of the walqueued protocol: every request and answer as a msgspec Struct.

Each message is a msgpack map whose ``"type"`` field is its tag; ``Request``
and ``Response`` are the tagged unions the two sides decode. Both sides
reject unknown fields (``forbid_unknown_fields``), so a peer must never be
sent a field its version does not know.

Compatibility rule: a new field gets a default, goes at the end of its
Struct, and comes with a new protocol version; the daemon speaks every
version in ``DAEMON_PROTOCOL_VERSIONS`` and answers each connection in the
version its hello announced, leaving out the fields that version lacks
(``omit_defaults``, or ``msgspec.UNSET``), so a version-1 client gets exactly
version 1's bytes. The versions:

1. everything but what follows;
2. the daemon's walqueue version in ``HelloOk`` and ``DaemonStats``;
3. the clock's steps and offset in ``DaemonStats``;
4. the compaction figures of ``DaemonStats`` (``compact_wal_ratio`` to
   ``wal_bytes_written_total``);
5. the slow loop turns of ``DaemonStats`` (``slow_turns_total``,
   ``longest_turn_seconds``);
6. ``Error.code``, the stable code of what went wrong (``ERROR_CODES``);
7. the leases expired since start in ``DaemonStats`` (``expired_total``), and
   which path runs the hot loops (``speedups``: "compiled" or "pure", walqueue.speedups).

A new request type needs no new version: a daemon that does not know it
answers a fatal ``InvalidRequest`` (code ``unknown_request`` from version 6).
So SPEC §8b's calls came as new requests, not as new fields: ``Cancel``,
``Workers`` (answered ``WorkerList``) and ``TasksPage`` (``Tasks`` with a
cursor and a limit, answered ``TaskList``); ``Tasks`` is unchanged, and a
client lists through ``TasksPage`` only when given ``after`` or ``limit``.
``Connections`` (answered ``ConnectionList``) came the same way, beside
``Workers``, whose ``WorkerView`` SPEC fixes.

This module does no I/O and keeps no state: it only declares.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, get_type_hints

import msgspec

from walqueue import Lease, QueueStats, TaskView, WorkerView

__all__ = [
    "CLOCK_REPORTING_VERSION", "COMPACTION_REPORTING_VERSION", "DAEMON_PROTOCOL_VERSIONS",
    "ERROR_CODE_VERSION", "EXPIRY_REPORTING_VERSION", "PROTOCOL_VERSION", "TURN_REPORTING_VERSION", "VERSION_REPORTING_VERSION",
    "COMPACTION_FAILED", "ERROR_CODES", "LISTING_INTERRUPTED", "PROTOCOL_ERROR", "REQUEST_REFUSED",
    "UNKNOWN_REQUEST", "UNSENDABLE_ANSWER", "UNSUPPORTED_VERSION", "WRITE_FAILED",
    "Raw", "Payload", "PutItem", "BackupFile", "DaemonStats", "WireLease", "WireTask", "WireStats",
    "WireDaemonStats", "REQUEST_TAGS", "WRITING_REQUESTS", "Request", "Response",
    "Hello", "Put", "PutMany", "Reserve", "Ack", "AckAndReserve", "Release", "Touch", "Revive", "Get",
    "Tasks", "Stats", "Compact", "DaemonStatsReq", "Pause", "Resume", "BackupBegin", "BackupEnd",
    "ForceRelease", "Cancel", "Workers", "TasksPage", "WireWorker", "WorkerList",
    "Connections", "ConnectionView", "WireConnection", "ConnectionList",
    "HelloOk", "PutOk", "TaskIds", "Leases", "Done", "LeaseOk", "TaskOk", "TaskList", "StatsOk",
    "Compacted", "PauseState", "Manifest", "Error", "DaemonStatsOk",
]

PROTOCOL_VERSION = 1  # the first version: every daemon speaks it, and clients fall back to it last
DAEMON_PROTOCOL_VERSIONS = (1, 2, 3, 4, 5, 6, 7)  # what walqueued speaks
VERSION_REPORTING_VERSION = 2  # the first to carry walqueue versions
CLOCK_REPORTING_VERSION = 3  # the first to carry the daemon's clock steps and offset
COMPACTION_REPORTING_VERSION = 4  # the first to carry the compaction figures of DaemonStats
TURN_REPORTING_VERSION = 5  # the first to carry the slow loop turns of DaemonStats
ERROR_CODE_VERSION = 6  # the first to carry Error.code
EXPIRY_REPORTING_VERSION = 7  # the first to carry DaemonStats.expired_total and .speedups

# -- error codes --------------------------------------------------------------
#
# The values of ``Error.code``: what a program tests, never the message text
# (which may change with any release). Each library exception class has its
# own (its ``code`` attribute, e.g. "invalid_request", "stale_lease"); these
# say more about an error of the wire itself. walqueue.protocol.errors maps
# every code to the exception class a client raises.

PROTOCOL_ERROR = "protocol_error"  # fatal: bad framing, an undecodable or out-of-order message
UNSUPPORTED_VERSION = "unsupported_version"  # fatal: the hello's version is not spoken here
UNKNOWN_REQUEST = "unknown_request"  # fatal: a request type this daemon does not know (it is older)
REQUEST_REFUSED = "request_refused"  # a request bound, before decoding or validating (protocol.bounds)
UNSENDABLE_ANSWER = "unsendable_answer"  # the answer cannot be encoded (e.g. an item over a message)
WRITE_FAILED = "write_failed"  # QueueClosed: the turn's write failed; the outcome is unknown
LISTING_INTERRUPTED = "listing_interrupted"  # QueueClosed: the queue was reopened mid-listing
COMPACTION_FAILED = "compaction_failed"  # WalQueueError: the compaction failed or backs off
ERROR_CODES = (PROTOCOL_ERROR, UNSUPPORTED_VERSION, UNKNOWN_REQUEST, REQUEST_REFUSED, UNSENDABLE_ANSWER,
               WRITE_FAILED, LISTING_INTERRUPTED, COMPACTION_FAILED)

# An already encoded value placed inside a message (the items of a chunked list answer).
Raw = msgspec.Raw


class _Message(msgspec.Struct, tag_field="type", forbid_unknown_fields=True):
    """Base of every wire message; the tag is the message's ``type`` field."""


# -- requests ---------------------------------------------------------------


class Hello(_Message, tag="hello"):
    id: int
    version: int
    client: str = ""


class PutItem(msgspec.Struct, forbid_unknown_fields=True):
    """One task of a ``PutMany`` (the fields of ``walqueue.PutRequest``)."""

    task_id: str
    payload: dict[str, Any]
    key: str | None = None
    available_at: int = 0
    max_attempts: int = 3


class Put(_Message, tag="put"):
    id: int
    task_id: str
    payload: dict[str, Any]
    key: str | None = None
    available_at: int = 0
    max_attempts: int = 3


class PutMany(_Message, tag="put_many"):
    id: int
    requests: list[PutItem]


class Reserve(_Message, tag="reserve"):
    id: int
    worker: str
    lease_seconds: int = 30
    limit: int = 1
    wait: float = 0.0


class Ack(_Message, tag="ack"):
    id: int
    task_id: str
    worker: str
    generation: int


class Release(_Message, tag="release"):
    id: int
    task_id: str
    worker: str
    generation: int
    delay: int = 0


class Touch(_Message, tag="touch"):
    id: int
    task_id: str
    worker: str
    generation: int
    lease_seconds: int


class AckAndReserve(_Message, tag="ack_reserve"):
    """``ack_and_reserve``: ack a lease and, in the same batch and fsync, reserve for the same worker.

    Answered like a ``Reserve`` (``Leases``); if the ack fails, nothing is
    reserved and the answer is the ack's error. The tag stays "ack_reserve",
    the one it had on the wire from the start: a tag is part of the
    protocol's compatibility (an older daemon knows only that one), a class
    name is not.
    """

    id: int
    task_id: str
    worker: str
    generation: int
    lease_seconds: int = 30
    limit: int = 1
    wait: float = 0.0


class Revive(_Message, tag="revive"):
    id: int
    task_ids: list[str]


class Get(_Message, tag="get"):
    id: int
    task_id: str


class Tasks(_Message, tag="tasks"):
    id: int
    status: str | None = None


class Stats(_Message, tag="stats"):
    id: int


class Compact(_Message, tag="compact"):
    id: int


class DaemonStatsReq(_Message, tag="daemon_stats"):
    """The daemon's full report (``DaemonStatsOk``); ``Stats`` stays the queue's alone."""

    id: int


class Pause(_Message, tag="pause"):
    """Stop leasing: every reserve gets nothing (a waiting one parks) until ``Resume``."""

    id: int


class Resume(_Message, tag="resume"):
    """Lease again; parked reserves are served first, in arrival order."""

    id: int


class BackupBegin(_Message, tag="backup_begin"):
    """Make everything durable, answer a ``Manifest`` and pin its files.

    No compaction deletes pinned files until ``BackupEnd`` on the same
    connection, or until that connection closes. One backup at a time.
    """

    id: int


class BackupEnd(_Message, tag="backup_end"):
    id: int


class ForceRelease(_Message, tag="force_release"):
    """End the current leases of ``task_ids`` now, whoever holds them (an operator's command).

    Each is written as an ordinary ``release`` record with the task's current
    worker and generation (delay 0); answered ``TaskIds`` (duplicates dropped).
    Every task must be leased, else ``InvalidRequest`` and nothing is written.
    """

    id: int
    task_ids: list[str]


class Cancel(_Message, tag="cancel"):
    """SPEC §8b: complete a due ready or a dead task without running it; answered ``Done``.

    Written as revive (if dead), reserve and ack by ``walqueue:cancel`` in the
    turn's batch (walqueue.cancel); a completed task: ``Done``, nothing written.
    """

    id: int
    task_id: str


class Workers(_Message, tag="workers"):
    """SPEC §8b: every worker name holding a lease or used by an open connection (``WorkerList``)."""

    id: int


class Connections(_Message, tag="connections"):
    """Each open connection that sent a request: its worker names, leases, requests and the age
    of its last request (``ConnectionList``). Not SPEC's; walqueue-web and walqueue-ctl show it."""

    id: int


class TasksPage(_Message, tag="tasks_page"):
    """``Tasks`` in pages (SPEC §8b): the tasks after the id ``after``, at most ``limit``
    (at most walqueue.listing.MAX_PAGE_TASKS), in task_id order; answered ``TaskList``.
    The daemon's cost is O(limit), whatever the number of tasks."""

    id: int
    status: str | None = None
    after: str | None = None
    limit: int = 1000


Request = (
    Hello | Put | PutMany | Reserve | Ack | Release | Touch | Revive | Get | Tasks | Stats | Compact
    | AckAndReserve | Pause | Resume | BackupBegin | BackupEnd | DaemonStatsReq | ForceRelease
    | Cancel | Workers | TasksPage | Connections
)
# The tags a daemon of this version knows: a body of another "type" is a newer client's request.
REQUEST_TAGS = frozenset(kind.__struct_config__.tag for kind in Request.__args__)

# Requests that may append to the WAL; the others only read state. (Resume
# serves parked reserves; BackupBegin compacts a queue never compacted.)
WRITING_REQUESTS = (Put, PutMany, Reserve, Ack, Release, Touch, Revive, Compact, AckAndReserve, Resume,
                    BackupBegin, ForceRelease, Cancel)


# -- values carried by answers ------------------------------------------------


@dataclass(frozen=True)
class DaemonStats:
    """The daemon's full report: the queue's QueueStats and the daemon's own figures.

    The one definition: walqueued builds it (walqueue.daemon.recorder), it
    crosses the wire as ``WireDaemonStats`` and walqueue.metrics prints it.
    """

    queue: QueueStats
    oldest_ready_age_seconds: int
    leases_past_half: int
    wal_segments: int
    compact_wal_bytes: int
    fsyncs_total: int
    fsync_seconds_total: float
    fsync_p50_seconds: float | None
    fsync_p99_seconds: float | None
    fsync_window: int
    requests_total: int
    requests_per_fsync: float | None
    write_failures_total: int
    compactions_total: int
    last_compaction_seconds: float | None
    connections: int
    parked_reserves: int
    paused: bool
    uptime_seconds: float
    start_time_seconds: float
    last_recovery_seconds: float
    directory: str
    version: str = ""  # the daemon's walqueue.__version__ (protocol version 2; "" for version 1)
    # Protocol version 3 (0 for earlier ones): wall-clock steps seen since start, and the wall
    # clock minus the daemon's own clock, which leases follow (walqueue.daemon.clock).
    clock_steps_total: int = 0
    clock_offset_seconds: float = 0.0
    # Protocol version 4: compaction off the loop (docs/metrics.md defines each).
    compact_wal_ratio: float = 0.0
    compaction_in_progress: bool = False
    compaction_failures_total: int = 0
    compaction_consecutive_failures: int = 0
    last_compaction_error: str = ""
    compaction_retry_in_seconds: float | None = None
    last_compaction_pause_seconds: float | None = None
    snapshot_bytes: int = 0
    snapshot_bytes_written_total: int = 0
    wal_bytes_written_total: int = 0
    # Protocol version 5: loop turns that answered no one for over 100 ms (walqueue.daemon.turn_timer).
    slow_turns_total: int = 0
    longest_turn_seconds: float = 0.0
    # Protocol version 7: leases expired (reaped) since start, by reserve's reap or the timer's.
    expired_total: int = 0
    # Protocol version 7 too: "compiled" or "pure" (walqueue.speedups.PATH; "" for earlier versions).
    speedups: str = ""


@dataclass(frozen=True)
class ConnectionView:
    """One open connection as walqueued sees it (the answer to ``Connections``).

    ``connection`` is the daemon's label of it (as in its log: peer process and the hello's
    client name); ``workers`` the worker names it used in requests that succeeded (its most
    recent, at most walqueue.daemon.steering.MAX_WORKER_NAMES_PER_CONNECTION), by name;
    ``leases`` the leases those names hold now (a name two connections use counts for both);
    ``requests`` how many requests it sent; ``last_request_age_seconds`` how long ago its
    last one arrived (by the daemon's monotonic clock).
    """

    connection: str
    workers: tuple[str, ...]
    leases: int
    requests: int
    last_request_age_seconds: float


def _wire_twin(value_type: type, *, omit_defaults: bool = False, **types: Any) -> type[msgspec.Struct]:
    """The wire Struct of a frozen dataclass: the same fields, in the same order.

    A dataclass encodes as the map of its fields in order, exactly as this
    Struct does, so the daemon sends the library's values as they are and
    only the reader needs the Struct (which forbids unknown fields and checks
    every type). ``types`` overrides a field's type where the wire is stricter
    than the dataclass annotation (payloads are maps with string keys).
    """
    hints = get_type_hints(value_type)
    fields = []
    for field in dataclasses.fields(value_type):
        kind = types.get(field.name, hints[field.name])
        if field.default is dataclasses.MISSING:
            fields.append((field.name, kind))
        else:
            fields.append((field.name, kind, field.default))
    return msgspec.defstruct(f"Wire{value_type.__name__}", fields, forbid_unknown_fields=True,
                             omit_defaults=omit_defaults, module=__name__)


Payload = dict[str, Any]
WireLease = _wire_twin(Lease, payload=Payload)
WireTask = _wire_twin(TaskView, payload=Payload | None)
WireStats = _wire_twin(QueueStats)
WireWorker = _wire_twin(WorkerView)
WireConnection = _wire_twin(ConnectionView)
# Unlike the other values, DaemonStats is sent through its twin: only a Struct
# can leave out a field (``version``) that a version-1 peer does not know.
WireDaemonStats = _wire_twin(DaemonStats, omit_defaults=True, queue=WireStats)


# -- answers ------------------------------------------------------------------


class HelloOk(_Message, tag="hello_ok", omit_defaults=True):
    id: int
    version: int
    server: str
    max_body_bytes: int
    walqueue_version: str = ""  # version 2: the daemon's walqueue.__version__ (omitted for version 1)


class PutOk(_Message, tag="put_ok"):
    id: int
    task_id: str


class TaskIds(_Message, tag="task_ids"):
    """Answer to ``PutMany``, ``Revive`` and ``ForceRelease``."""

    id: int
    task_ids: list[str]


class Leases(_Message, tag="leases"):
    """Answer to ``Reserve`` and ``AckAndReserve``; ``more=True`` means another ``Leases``
    with this id follows."""

    id: int
    leases: list[WireLease]
    more: bool = False


class Done(_Message, tag="done"):
    """Answer to ``Ack``, ``Release`` and ``BackupEnd``."""

    id: int


class LeaseOk(_Message, tag="lease_ok"):
    """Answer to ``Touch``."""

    id: int
    lease: WireLease


class TaskOk(_Message, tag="task_ok"):
    """Answer to ``Get``; ``task`` is None for an unknown task id."""

    id: int
    task: WireTask | None


class TaskList(_Message, tag="task_list"):
    """Answer to ``Tasks``; ``more=True`` means another ``TaskList`` with this id follows."""

    id: int
    tasks: list[WireTask]
    more: bool = False


class StatsOk(_Message, tag="stats_ok"):
    id: int
    stats: WireStats


class Compacted(_Message, tag="compacted"):
    id: int
    seq: int


class PauseState(_Message, tag="pause_state"):
    """Answer to ``Pause`` and ``Resume``: whether leasing is paused now."""

    id: int
    paused: bool


class BackupFile(msgspec.Struct, forbid_unknown_fields=True):
    """One file of a backup: copy its first ``length`` bytes."""

    name: str
    length: int


class Manifest(_Message, tag="manifest"):
    """Answer to ``BackupBegin``: what to copy from ``directory`` for the state as of ``seq``."""

    id: int
    directory: str
    seq: int
    files: list[BackupFile]


class Error(_Message, tag="error"):
    """A failed request. ``id`` is None when the error is not tied to a request.

    ``error`` is the library exception's class name (SPEC §8); ``code``
    (protocol version 6) the stable code of what went wrong: a library class's
    own code or one of ``ERROR_CODES``. It is UNSET, and so not sent at all,
    for a peer of an earlier version, which would refuse the unknown field
    (walqueue.protocol.errors.error_for_version).
    """

    id: int | None
    error: str
    message: str
    task_id: str | None = None
    status: str | None = None
    generation: int | None = None
    fatal: bool = False
    code: str | msgspec.UnsetType = msgspec.UNSET


class DaemonStatsOk(_Message, tag="daemon_stats_ok"):
    id: int
    stats: WireDaemonStats


class WorkerList(_Message, tag="worker_list"):
    """Answer to ``Workers``: in worker order."""

    id: int
    workers: list[WireWorker]


class ConnectionList(_Message, tag="connection_list"):
    """Answer to ``Connections``: in the order the connections sent their first request."""

    id: int
    connections: list[WireConnection]


Response = (
    HelloOk | PutOk | TaskIds | Leases | Done | LeaseOk | TaskOk | TaskList | StatsOk | Compacted | Error
    | PauseState | Manifest | DaemonStatsOk | WorkerList | ConnectionList
)
