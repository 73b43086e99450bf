"""The walqueued wire protocol: message types, framing and conversions, with no I/O.

Byte layout of one message, in either direction::

    +----------------------+------------------------------------+
    | N: uint32 big-endian | N bytes: a msgpack map (msgspec)   |
    +----------------------+------------------------------------+

A frame is valid if and only if:

1. its 4-byte length N satisfies ``1 <= N <= MAX_BODY_BYTES``
   (``walqueue.MAX_FRAME_BYTES + 1 MiB``) — checked as soon as the 4 bytes
   are in, BEFORE any of the body is buffered;
2. its body decodes as exactly one of the tagged ``Struct``s below (the tag is
   the ``"type"`` field), with no unknown fields and every field of the
   declared type.

The first request on a connection is ``Hello`` carrying ``PROTOCOL_VERSION``;
every request carries a client-chosen integer ``id`` that its answer (or
answers, see ``more``) echoes, so requests may be pipelined. List answers
that would not fit in one frame (``Leases``, ``TaskList``) are split into
several messages with the same id; all but the last have ``more=True``.

Errors cross the wire as ``Error(error=<library exception class name>,
message=...)``; a ``StaleLease`` also carries the task's current ``task_id``,
``status`` and ``generation``. ``fatal=True`` means the server closes the
connection after sending it (bad framing, undecodable or out-of-order message).

Compatibility rule: both sides reject unknown fields, so a peer must never be
sent a field its version does not know. A new field gets a default, goes at
the end of its Struct, and comes with a new protocol version; the daemon
speaks every version in ``DAEMON_PROTOCOL_VERSIONS`` and answers each
connection in the version its hello announced, omitting the fields that
version lacks (``omit_defaults``), so a version-1 client gets exactly
version 1's bytes. Version 2 adds the daemon's walqueue version to
``HelloOk`` and ``DaemonStats``; version 3 adds the compaction figures
(``compact_wal_ratio`` and after) to ``DaemonStats``.

This module does no I/O, reads no clock and keeps no global state beyond the
encoder and decoders built once at import.
"""

from __future__ import annotations

import dataclasses
import math
import struct
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, get_type_hints

import msgspec

from walqueue import (
    MAX_FRAME_BYTES,
    CorruptStore,
    InvalidRequest,
    KeyConflict,
    Lease,
    QueueClosed,
    QueueLocked,
    QueueStats,
    StaleLease,
    TaskView,
    WalQueueError,
)
from walqueue.values import BackupManifest

PROTOCOL_VERSION = 1  # what this package's clients announce
DAEMON_PROTOCOL_VERSIONS = (1, 2, 3)  # what walqueued speaks
VERSION_REPORTING_VERSION = 2  # the first to carry walqueue versions
COMPACTION_REPORTING_VERSION = 3  # the first to carry the compaction figures of DaemonStats
MAX_BODY_BYTES = MAX_FRAME_BYTES + 1024 * 1024
LENGTH_PREFIX_BYTES = 4
MAX_WAIT_SECONDS = 300
# The first message (a Hello) is tiny; a peer that has not said hello may not
# make the daemon buffer more than this.
MAX_HELLO_BYTES = 4096
# Answers carrying lists are split so that no single message body grows past
# this many bytes (well below MAX_BODY_BYTES, so a reader never buffers a
# huge body just to get the first tasks of a listing).
CHUNK_BUDGET_BYTES = 1024 * 1024

_LENGTH = struct.Struct(">I")
# An already encoded value placed inside a message (the items of a chunked list answer).
Raw = msgspec.Raw


class ProtocolError(Exception):
    """The peer broke the framing or message rules; the connection must be closed.

    Never crosses the wire under this name: the server answers it as a fatal
    ``InvalidRequest`` (the peer's code misused the protocol).
    """


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


class AckReserve(_Message, tag="ack_reserve"):
    """Ack a lease and, in the same batch and fsync, reserve for the same worker.

    Answered like a ``Reserve`` (``Leases``); if the ack fails, nothing is
    reserved and the answer is the ack's error.
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


Request = (
    Hello | Put | PutMany | Reserve | Ack | Release | Touch | Revive | Get | Tasks | Stats | Compact
    | AckReserve | Pause | Resume | BackupBegin | BackupEnd | DaemonStatsReq
)

# Requests that may append to the WAL; the others only read state. (Resume
# serves parked reserves; BackupBegin compacts a queue never compacted.)
WRITING_REQUESTS = (Put, PutMany, Reserve, Ack, Release, Touch, Revive, Compact, AckReserve, Resume,
                    BackupBegin)


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
    # Protocol version 3: compaction off the loop (docs/metrics.md defines each).
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
    """Answer to ``PutMany`` and ``Revive``."""

    id: int
    task_ids: list[str]


class Leases(_Message, tag="leases"):
    """Answer to ``Reserve``; ``more=True`` means another ``Leases`` with this id follows."""

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
    """A failed request. ``id`` is None when the error is not tied to a request."""

    id: int | None
    error: str
    message: str
    task_id: str | None = None
    status: str | None = None
    generation: int | None = None
    fatal: bool = False


class DaemonStatsOk(_Message, tag="daemon_stats_ok"):
    id: int
    stats: WireDaemonStats


Response = (
    HelloOk | PutOk | TaskIds | Leases | Done | LeaseOk | TaskOk | TaskList | StatsOk | Compacted | Error
    | PauseState | Manifest | DaemonStatsOk
)


def _encode_other(value: Any) -> Any:
    """Let any Mapping travel as a map, as the library accepts any Mapping in a payload."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"cannot encode {type(value).__name__} (not a JSON value)")


_encoder = msgspec.msgpack.Encoder(enc_hook=_encode_other)
_request_decoder = msgspec.msgpack.Decoder(Request)
_response_decoder = msgspec.msgpack.Decoder(Response)


# -- framing ------------------------------------------------------------------


def frame(body: bytes) -> bytes:
    """Prefix ``body`` with its length. Raises ProtocolError if it is out of bounds."""
    if not 1 <= len(body) <= MAX_BODY_BYTES:
        raise ProtocolError(f"message body of {len(body)} bytes is outside 1..{MAX_BODY_BYTES}")
    return _LENGTH.pack(len(body)) + body


def encode(message: _Message) -> bytes:
    """Encode one message as a complete frame (length prefix and body).

    Raises ProtocolError if the body would exceed MAX_BODY_BYTES, and
    TypeError/OverflowError if a value cannot be encoded as msgpack.
    """
    return frame(_encoder.encode(message))


def encode_value(value: Any) -> bytes:
    """Encode one value (e.g. a WireLease) as msgpack, for size-based chunking."""
    return _encoder.encode(value)


class FrameReader:
    """Splits a byte stream into message bodies, enforcing the length bound.

    ``feed()`` appends received bytes; ``next_body()`` returns the next
    complete body or None. A length of 0 or above ``max_body_bytes`` raises
    ProtocolError as soon as its 4 bytes have arrived, so at most one
    bounded body is ever buffered.
    """

    def __init__(self, max_body_bytes: int = MAX_BODY_BYTES) -> None:
        self._buffer = bytearray()
        self.max_body_bytes = max_body_bytes  # may be raised, e.g. after a hello

    def pending_length(self) -> int | None:
        """The length of the frame being received, once its 4-byte prefix is in."""
        if len(self._buffer) < LENGTH_PREFIX_BYTES:
            return None
        return _LENGTH.unpack_from(self._buffer)[0]

    def feed(self, data: bytes) -> None:
        self._buffer += data

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def wanted_bytes(self) -> int:
        """How many more bytes complete the frame being read (at least 1)."""
        if len(self._buffer) < LENGTH_PREFIX_BYTES:
            return LENGTH_PREFIX_BYTES - len(self._buffer)
        (length,) = _LENGTH.unpack_from(self._buffer)
        return max(1, LENGTH_PREFIX_BYTES + length - len(self._buffer))

    def next_body(self) -> bytes | None:
        """Return the next complete body, or None. Raises ProtocolError on a bad length."""
        if len(self._buffer) < LENGTH_PREFIX_BYTES:
            return None
        (length,) = _LENGTH.unpack_from(self._buffer)
        if length == 0 or length > self.max_body_bytes:
            raise ProtocolError(
                f"frame length {length} is outside 1..{self.max_body_bytes} bytes"
            )
        end = LENGTH_PREFIX_BYTES + length
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[LENGTH_PREFIX_BYTES:end])
        del self._buffer[:end]
        return body


def _peek_id(body: bytes) -> int | None:
    """Best effort: the integer ``id`` of an undecodable message, for its error answer."""
    try:
        value = msgspec.msgpack.decode(body)
    except (msgspec.DecodeError, RecursionError):
        return None
    if isinstance(value, dict):
        candidate = value.get("id")
        if type(candidate) is int and 0 <= candidate < 2**64:
            return candidate
    return None


def decode_request(body: bytes) -> Request:
    """Decode one request body. Raises ProtocolError with the message's id in ``args[1]``."""
    try:
        return _request_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        # msgspec raises RecursionError for deeply nested input: still the
        # peer's fault, never the daemon's end.
        raise ProtocolError(f"undecodable request: {exc}", _peek_id(body)) from exc


def decode_response(body: bytes) -> Response:
    """Decode one answer body. Raises ProtocolError."""
    try:
        return _response_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        raise ProtocolError(f"undecodable answer from the daemon: {exc}") from exc


def check_wait(wait: float) -> None:
    """Raise InvalidRequest unless ``0 <= wait <= MAX_WAIT_SECONDS``."""
    if not (math.isfinite(wait) and 0 <= wait <= MAX_WAIT_SECONDS):
        raise InvalidRequest(f"wait must be between 0 and {MAX_WAIT_SECONDS} seconds, got {wait!r}")


# -- conversions to and from the library's dataclasses ------------------------


def _from_wire(wire: msgspec.Struct, value_type: type) -> Any:
    """The library value a wire twin stands for (the daemon sends the values themselves)."""
    return value_type(*[getattr(wire, name) for name in wire.__struct_fields__])


def lease_from_wire(wire: WireLease) -> Lease:
    return _from_wire(wire, Lease)


def task_from_wire(wire: WireTask) -> TaskView:
    return _from_wire(wire, TaskView)


def stats_from_wire(wire: WireStats) -> QueueStats:
    return _from_wire(wire, QueueStats)


def manifest_to_wire(request_id: int, manifest: BackupManifest) -> Manifest:
    files = [BackupFile(name, length) for name, length in manifest.files]
    return Manifest(id=request_id, directory=manifest.directory, seq=manifest.seq, files=files)


def manifest_from_wire(wire: Manifest) -> BackupManifest:
    files = tuple((item.name, item.length) for item in wire.files)
    return BackupManifest(directory=wire.directory, seq=wire.seq, files=files)


def _since_version(name: str) -> int:
    """The protocol version that added DaemonStats field ``name`` (1 for the original ones)."""
    names = [field.name for field in dataclasses.fields(DaemonStats)]
    if names.index(name) >= names.index("compact_wal_ratio"):
        return COMPACTION_REPORTING_VERSION
    return VERSION_REPORTING_VERSION if name == "version" else 1


_DAEMON_STATS_DEFAULTS = {field.name: (field.default, _since_version(field.name))
                          for field in dataclasses.fields(DaemonStats)
                          if field.default is not dataclasses.MISSING}


def daemon_stats_to_wire(stats: DaemonStats, protocol_version: int) -> WireDaemonStats:
    """The report as a peer speaking ``protocol_version`` may read it: the fields a later
    version added are set to their defaults, which the wire omits."""
    fields = {name: getattr(stats, name) for name in WireDaemonStats.__struct_fields__}
    for name, (default, since) in _DAEMON_STATS_DEFAULTS.items():
        if protocol_version < since:
            fields[name] = default
    return WireDaemonStats(**fields)


def daemon_stats_from_wire(wire: WireDaemonStats) -> DaemonStats:
    return dataclasses.replace(_from_wire(wire, DaemonStats), queue=stats_from_wire(wire.queue))


def put_item(request: Any) -> PutItem:
    """Convert a ``PutRequest`` or a mapping with its field names. Raises InvalidRequest."""
    if isinstance(request, Mapping):
        unknown = set(request) - set(PutItem.__struct_fields__)
        if unknown:
            raise InvalidRequest(f"unknown put_many field(s) {sorted(map(str, unknown))}")
        if "task_id" not in request or "payload" not in request:
            raise InvalidRequest("a put_many request needs task_id and payload")
        fields = dict(request)
    else:
        try:
            fields = {name: getattr(request, name) for name in PutItem.__struct_fields__}
        except AttributeError as exc:
            raise InvalidRequest(
                f"put_many takes PutRequest objects or mappings, got {type(request).__name__}"
            ) from exc
    return PutItem(**fields)


# -- errors -------------------------------------------------------------------

ERROR_CLASSES: dict[str, type[WalQueueError]] = {
    cls.__name__: cls
    for cls in (WalQueueError, KeyConflict, StaleLease, CorruptStore, QueueLocked, QueueClosed, InvalidRequest)
}


def error_to_wire(request_id: int | None, exc: BaseException, *, fatal: bool = False) -> Error:
    """The wire form of an exception raised while serving a request."""
    if isinstance(exc, ProtocolError):
        return Error(id=request_id, error="InvalidRequest", message=str(exc.args[0]), fatal=True)
    name = type(exc).__name__
    if name not in ERROR_CLASSES:
        # Library subclasses we do not know travel as their nearest known base.
        name = next(
            (cls.__name__ for cls in type(exc).__mro__ if cls.__name__ in ERROR_CLASSES),
            "WalQueueError",
        )
    error = Error(id=request_id, error=name, message=str(exc), fatal=fatal)
    if isinstance(exc, StaleLease):
        error.task_id = getattr(exc, "task_id", None)
        error.status = getattr(exc, "status", None)
        error.generation = getattr(exc, "generation", None)
    return error


def make_stale_lease(message: str, task_id: str | None, status: str | None, generation: int | None) -> StaleLease:
    """Build the library's StaleLease with its §1 attributes, whatever its constructor."""
    try:
        exc = StaleLease(message, task_id=task_id, status=status, generation=generation)
    except TypeError:
        exc = StaleLease(message)
    exc.task_id = task_id
    exc.status = status
    exc.generation = generation
    return exc


def error_from_wire(error: Error) -> WalQueueError:
    """The library exception an ``Error`` answer stands for (WalQueueError if unknown)."""
    if error.error == "StaleLease":
        return make_stale_lease(error.message, error.task_id, error.status, error.generation)
    cls = ERROR_CLASSES.get(error.error, WalQueueError)
    try:
        return cls(error.message)
    except TypeError:
        return WalQueueError(f"{error.error}: {error.message}")
