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
   declared type;
3. (a request, as the daemon reads it) it passes the request bounds: at most
   MAX_CONTAINER_HEADERS possible map or array headers, a put_many of at
   most MAX_PUT_MANY_ITEMS items, no map with a key twice. A request that
   fails one is refused alone (``RequestRefused``); the stream goes on.

The first request on a connection is ``Hello`` carrying a protocol version;
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
``HelloOk`` and ``DaemonStats``; version 3 adds the clock's steps and offset
to ``DaemonStats``, version 4 the compaction figures (``compact_wal_ratio``
to ``wal_bytes_written_total``), version 5 the slow loop turns
(``slow_turns_total``, ``longest_turn_seconds``). A new request type needs no
new version: a daemon that does not know it answers a fatal
``InvalidRequest`` (undecodable request).

This module does no I/O, reads no clock and keeps no global state beyond the
encoder and decoders built once at import.
"""

from __future__ import annotations

import dataclasses
import math
import re
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
from walqueue.validation import Containers, count_containers
from walqueue.values import BackupManifest

PROTOCOL_VERSION = 1  # the first version: every daemon speaks it, and clients fall back to it last
DAEMON_PROTOCOL_VERSIONS = (1, 2, 3, 4, 5)  # what walqueued speaks
VERSION_REPORTING_VERSION = 2  # the first to carry walqueue versions
CLOCK_REPORTING_VERSION = 3  # the first to carry the daemon's clock steps and offset
COMPACTION_REPORTING_VERSION = 4  # the first to carry the compaction figures of DaemonStats
TURN_REPORTING_VERSION = 5  # the first to carry the slow loop turns of DaemonStats
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
# Cheap bounds checked BEFORE a body is decoded, so one request cannot make the
# daemon build millions of objects (or stall its loop doing so) only to be
# refused afterwards. Decoding builds one Python object per msgpack map or
# array (~60-150 bytes from 1 byte of body), and every map or array starts with
# one of the bytes below: their count in a body bounds the containers from
# above (bytes inside strings and numbers count too, e.g. UTF-8 continuation
# bytes, so dense non-ASCII text of about 1 MiB and more can reach it).
MAX_CONTAINER_HEADERS = 1024 * 1024
_CONTAINER_HEADER_BYTES = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_OTHER_BYTES = bytes(byte for byte in range(256) if byte not in _CONTAINER_HEADER_BYTES)
# A put_many writes all its new tasks in one WAL frame; the smallest task is
# 72 bytes of JSON and a comma, so more items than this can never fit (even
# identical duplicates, which collapse, count: the bound is on the request).
MIN_PUT_TASK_JSON_BYTES = 73
MAX_PUT_MANY_ITEMS = MAX_FRAME_BYTES // MIN_PUT_TASK_JSON_BYTES
# Bodies below this cannot hold more put_many items than allowed (an item is at
# least 20 bytes of msgpack) nor more container headers: the request bounds
# look only at larger ones, and at their first PEEK_PREFIX_BYTES for the fields.
PEEK_MIN_BODY_BYTES = 1024 * 1024
PEEK_PREFIX_BYTES = 4096
# The id of an undecodable body is looked for among at most this many leading
# fields of its top-level map, skipping only scalar values: O(1), whatever the body.
MAX_PEEK_FIELDS = 8

_LENGTH = struct.Struct(">I")
# An already encoded value placed inside a message (the items of a chunked list answer).
Raw = msgspec.Raw


class ProtocolError(Exception):
    """The peer broke the framing or message rules; the connection must be closed.

    Never crosses the wire under this name: the server answers it as a fatal
    ``InvalidRequest`` (the peer's code misused the protocol).
    """


class RequestRefused(ProtocolError):
    """A well-framed request refused by a request bound (a cheap one checked before decoding,
    or a map with a key twice): ``args`` = (message, id).

    With an id, only that request is answered ``InvalidRequest``; the
    connection stays. Without one it is fatal like any ProtocolError.
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


class ForceRelease(_Message, tag="force_release"):
    """End the current leases of ``task_ids`` now, whoever holds them (an operator's command).

    Each is written as an ordinary ``release`` record with the task's current
    worker and generation (delay 0); answered ``TaskIds`` (duplicates dropped).
    Every task must be leased, else ``InvalidRequest`` and nothing is written.
    """

    id: int
    task_ids: list[str]


Request = (
    Hello | Put | PutMany | Reserve | Ack | Release | Touch | Revive | Get | Tasks | Stats | Compact
    | AckReserve | Pause | Resume | BackupBegin | BackupEnd | DaemonStatsReq | ForceRelease
)

# Requests that may append to the WAL; the others only read state. (Resume
# serves parked reserves; BackupBegin compacts a queue never compacted.)
WRITING_REQUESTS = (Put, PutMany, Reserve, Ack, Release, Touch, Revive, Compact, AckReserve, Resume,
                    BackupBegin, ForceRelease)


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


def container_header_bound(data: bytes | bytearray) -> int:
    """How many bytes of ``data`` could start a msgpack map or array (an upper bound on containers)."""
    return len(data.translate(None, _OTHER_BYTES))


class FrameReader:
    """Splits a byte stream into message bodies, enforcing the length bound.

    ``feed()`` appends received bytes; ``next_body()`` returns the next
    complete body or None. A length of 0 or above ``max_body_bytes`` raises
    ProtocolError as soon as its 4 bytes have arrived, so at most one
    bounded body is ever buffered.

    With ``request_bounds`` (the daemon's side) a large body is also checked
    against the cheap request bounds WHILE it arrives (`early_refusal` once
    its leading bytes are in, the container headers counted as each byte
    arrives, once): past one, ``next_body`` raises RequestRefused at once,
    and the rest of that body is discarded as it arrives, never buffered.
    """

    def __init__(self, max_body_bytes: int = MAX_BODY_BYTES, *, request_bounds: bool = False) -> None:
        self._buffer = bytearray()
        self.max_body_bytes = max_body_bytes  # may be raised, e.g. after a hello
        self._request_bounds = request_bounds
        self._peeked = False  # the body in progress had its leading fields checked
        self._counted_bytes = 0  # of the body in progress, the bytes whose headers were counted
        self._counted_headers = 0  # the container headers among them
        self._skipping_bytes = 0  # what is left of a refused body, discarded as it arrives
        self.frames_done = 0  # frames read or refused: the frame in progress is number frames_done

    def pending_length(self) -> int | None:
        """The length of the frame being received, once its 4-byte prefix is in."""
        if self._skipping_bytes or len(self._buffer) < LENGTH_PREFIX_BYTES:
            return None
        return _LENGTH.unpack_from(self._buffer)[0]

    def feed(self, data: bytes) -> None:
        if self._skipping_bytes:
            skipped = min(len(data), self._skipping_bytes)
            self._skipping_bytes -= skipped
            data = data[skipped:]
        self._buffer += data

    @property
    def buffered_bytes(self) -> int:
        return len(self._buffer)

    def wanted_bytes(self) -> int:
        """How many more bytes complete the frame being read (at least 1)."""
        if self._skipping_bytes:
            return self._skipping_bytes
        if len(self._buffer) < LENGTH_PREFIX_BYTES:
            return LENGTH_PREFIX_BYTES - len(self._buffer)
        (length,) = _LENGTH.unpack_from(self._buffer)
        return max(1, LENGTH_PREFIX_BYTES + length - len(self._buffer))

    def next_body(self) -> bytes | None:
        """Return the next complete body, or None.

        Raises ProtocolError on a bad length, RequestRefused for a body past a
        cheap request bound (the stream goes on after it).
        """
        if self._skipping_bytes or len(self._buffer) < LENGTH_PREFIX_BYTES:
            return None
        (length,) = _LENGTH.unpack_from(self._buffer)
        if length == 0 or length > self.max_body_bytes:
            raise ProtocolError(
                f"frame length {length} is outside 1..{self.max_body_bytes} bytes"
            )
        end = LENGTH_PREFIX_BYTES + length
        if self._request_bounds and length >= PEEK_MIN_BODY_BYTES:
            self._check_request_bounds(length, min(len(self._buffer), end))
        if len(self._buffer) < end:
            return None
        body = bytes(self._buffer[LENGTH_PREFIX_BYTES:end])
        del self._buffer[:end]
        self._peeked, self._counted_bytes, self._counted_headers = False, 0, 0
        self.frames_done += 1
        return body

    def _check_request_bounds(self, length: int, available: int) -> None:
        """Check what arrived of a large body; refuse it (and skip the rest) past a bound."""
        received = available - LENGTH_PREFIX_BYTES
        refusal = None
        if not self._peeked and received >= min(length, PEEK_PREFIX_BYTES):
            self._peeked = True
            refusal = early_refusal(self._prefix(), length)
        if refusal is None and length > MAX_CONTAINER_HEADERS and received > self._counted_bytes:
            start = LENGTH_PREFIX_BYTES + self._counted_bytes
            self._counted_headers += container_header_bound(self._buffer[start:available])
            self._counted_bytes = received
            if self._counted_headers > MAX_CONTAINER_HEADERS:
                refusal = (f"request of {length} bytes refused before decoding: more than "
                           f"{MAX_CONTAINER_HEADERS} of its bytes may start a msgpack map or array "
                           f"(0x80-0x9f, 0xdc-0xdf; bytes of non-ASCII text count too): send fewer or "
                           f"smaller items")
        if refusal is None:
            return
        request_id = _peek_id(self._prefix())
        del self._buffer[:available]
        self._skipping_bytes = LENGTH_PREFIX_BYTES + length - available
        self._peeked, self._counted_bytes, self._counted_headers = False, 0, 0
        self.frames_done += 1
        raise RequestRefused(refusal, request_id)

    def _prefix(self) -> bytes:
        return bytes(self._buffer[LENGTH_PREFIX_BYTES:LENGTH_PREFIX_BYTES + PEEK_PREFIX_BYTES])


# msgpack's scalar formats by first byte: how many bytes follow the first
# byte before the value's own data, and for strings/bins/exts how many of
# those give the data's length (fixed-size values: (size, 0)).
_SCALAR_SIZES = {0xC0: (0, 0), 0xC2: (0, 0), 0xC3: (0, 0), 0xCA: (4, 0), 0xCB: (8, 0),
                 0xCC: (1, 0), 0xCD: (2, 0), 0xCE: (4, 0), 0xCF: (8, 0), 0xD0: (1, 0), 0xD1: (2, 0),
                 0xD2: (4, 0), 0xD3: (8, 0), 0xD4: (2, 0), 0xD5: (3, 0), 0xD6: (5, 0), 0xD7: (9, 0),
                 0xD8: (17, 0), 0xD9: (1, 1), 0xDA: (2, 2), 0xDB: (4, 4), 0xC4: (1, 1), 0xC5: (2, 2),
                 0xC6: (4, 4), 0xC7: (2, 1), 0xC8: (3, 2), 0xC9: (5, 4)}


def _scalar(body: bytes, offset: int) -> tuple[Any, int] | None:
    """The scalar at ``offset`` (str, int or None for any other scalar) and the offset after it;
    None if a map or array (or nothing) starts there."""
    if offset >= len(body):
        return None
    first = body[offset]
    if first <= 0x7F:
        return first, offset + 1
    if first >= 0xE0:
        return first - 0x100, offset + 1
    if 0xA0 <= first <= 0xBF:
        end = offset + 1 + (first & 0x1F)
        return body[offset + 1:end].decode("utf-8", "replace"), end
    if first not in _SCALAR_SIZES:
        return None
    size, length_bytes = _SCALAR_SIZES[first]
    start = offset + 1
    if length_bytes:
        data_length = int.from_bytes(body[start:start + length_bytes], "big")
        end = start + size + data_length
        if first in (0xD9, 0xDA, 0xDB):
            return body[start + length_bytes:end].decode("utf-8", "replace"), end
        return None, end
    if 0xCC <= first <= 0xD3:
        return int.from_bytes(body[start:start + size], "big", signed=first >= 0xD0), start + size
    return None, start + size


def _container_length(body: bytes, offset: int) -> int | None:
    """The element count of the msgpack array at ``offset``, or None if none starts there."""
    if offset >= len(body):
        return None
    first = body[offset]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    if first in (0xDC, 0xDD):
        size = 2 if first == 0xDC else 4
        return int.from_bytes(body[offset + 1:offset + 1 + size], "big")
    return None


def peek_fields(body: bytes) -> dict[str, Any]:
    """The scalar fields leading the body's top-level map, in O(1) whatever the body.

    Reads at most MAX_PEEK_FIELDS fields and stops at the first value that is
    not a scalar; an array value is recorded as its element count (so a
    put_many's ``requests`` count is known without decoding its items).
    Nothing else of the body is looked at, so a huge or hostile body costs
    what its first few fields cost. Best effort: returns what it could read.
    """
    fields: dict[str, Any] = {}
    if not body:
        return fields
    first = body[0]
    if 0x80 <= first <= 0x8F:
        count, offset = first & 0x0F, 1
    elif first in (0xDE, 0xDF):
        size = 2 if first == 0xDE else 4
        count, offset = int.from_bytes(body[1:1 + size], "big"), 1 + size
    else:
        return fields
    for _ in range(min(count, MAX_PEEK_FIELDS)):
        key = _scalar(body, offset)
        if key is None or not isinstance(key[0], str):
            break
        name, offset = key
        value = _scalar(body, offset)
        if value is None:
            elements = _container_length(body, offset)
            if elements is not None:
                fields[name] = elements
            break
        fields[name], offset = value
    return fields


def _peek_id(body: bytes) -> int | None:
    """Best effort: the integer ``id`` of an undecodable message, for its error answer."""
    candidate = peek_fields(body).get("id")
    if type(candidate) is int and 0 <= candidate < 2**64:
        return candidate
    return None


def early_refusal(prefix: bytes, length: int) -> str | None:
    """Why a request body of ``length`` bytes starting with ``prefix`` is refused unread, or None.

    Today: a put_many of more items than one WAL frame can hold.
    """
    fields = peek_fields(prefix)
    items = fields.get("requests")
    if fields.get("type") == "put_many" and type(items) is int and items > MAX_PUT_MANY_ITEMS:
        return (f"put_many of {items} items refused before decoding: one transaction is one WAL frame "
                f"of at most {MAX_FRAME_BYTES} bytes, which holds at most {MAX_PUT_MANY_ITEMS} tasks; "
                f"split it into several put_many calls")
    return None


def _header(body: bytes, offset: int) -> tuple[str, Any, int]:
    """("map" | "array", entry count, offset of the first entry) or ("scalar", value, end)."""
    first = body[offset]
    if 0x80 <= first <= 0x8F:
        return "map", first & 0x0F, offset + 1
    if 0x90 <= first <= 0x9F:
        return "array", first & 0x0F, offset + 1
    if first in (0xDC, 0xDD, 0xDE, 0xDF):
        size = 2 if first in (0xDC, 0xDE) else 4
        kind = "array" if first in (0xDC, 0xDD) else "map"
        return kind, int.from_bytes(body[offset + 1:offset + 1 + size], "big"), offset + 1 + size
    scalar = _scalar(body, offset)
    if scalar is None:
        raise ValueError(f"no msgpack value at offset {offset}")
    value, end = scalar
    if value is None:  # compare keys of other types by their bytes
        value = bytes(body[offset:end])
    return "scalar", value, end


# For the duplicate-key walk: the whole size of a msgpack value of fixed size by its first
# byte (0 for a map, an array, a string, bin or ext whose length follows, and the invalid 0xc1);
# the (length bytes, type bytes) that follow the first byte of a string, bin or ext; and a run of
# one-byte values (fixints, nil, booleans, the empty string), stepped over at once in an array.
_FIXED_SIZES = [0] * 256
for _byte in (*range(0x00, 0x80), *range(0xE0, 0x100), 0xC0, 0xC2, 0xC3):
    _FIXED_SIZES[_byte] = 1
for _byte in range(0xA0, 0xC0):
    _FIXED_SIZES[_byte] = 1 + (_byte & 0x1F)
for _byte, _size in ((0xCC, 2), (0xCD, 3), (0xCE, 5), (0xCF, 9), (0xD0, 2), (0xD1, 3), (0xD2, 5),
                     (0xD3, 9), (0xCA, 5), (0xCB, 9), (0xD4, 3), (0xD5, 4), (0xD6, 6), (0xD7, 10),
                     (0xD8, 18)):
    _FIXED_SIZES[_byte] = _size
_VARIABLE_SIZES = {0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0), 0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0),
                   0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1)}
_ONE_BYTE_VALUES = re.compile(rb"[\x00-\x7f\xa0\xc0\xc2\xc3\xe0-\xff]+")


def _after_variable(body: bytes, offset: int, first: int) -> int:
    """The offset after the string, bin or ext at ``offset`` (its first byte ``first``)."""
    length_bytes, type_bytes = _VARIABLE_SIZES[first]
    start = offset + 1 + length_bytes
    return start + type_bytes + int.from_bytes(body[offset + 1:start], "big")


def _container(body: bytes, offset: int, first: int) -> tuple[bool, int, int] | None:
    """(is a map, entries, offset of the first entry) if a map or an array starts at ``offset``."""
    if 0x80 <= first <= 0x9F:
        return first < 0x90, first & 0x0F, offset + 1
    if first in (0xDC, 0xDD, 0xDE, 0xDF):
        size = 2 if first in (0xDC, 0xDE) else 4
        return first >= 0xDE, int.from_bytes(body[offset + 1:offset + 1 + size], "big"), offset + 1 + size
    return None


def duplicate_key(body: bytes) -> tuple[str, Any] | None:
    """(where, key) for the first map in the msgpack ``body`` with a key twice, or None.

    ``where`` is "the request" for the top-level map, else its path, such as
    ``request['payload']['a']``.

    A walk over the body, in Python: the slow path, taken only when the cheap
    signal in `decode_request` says the body may hold one. Scalars are stepped
    over by a table of sizes, without a frame each, and a run of one-byte
    values in an array at once: 16.7M small integers cost one regular
    expression match, not 16.7M steps (issue 20 item 3: the walk once took
    15 s over such a body).
    """
    fixed, variable, one_byte_run = _FIXED_SIZES, _VARIABLE_SIZES, _ONE_BYTE_VALUES.match
    # One frame per open map or array: [entries left, keys seen (a map) or None, label in
    # parent, entries in all]; an entry of a map is a key and its value.
    stack: list[list] = []
    offset = 0
    label: Any = None  # of the value at offset, in its parent
    try:
        while True:
            first = body[offset]
            opened = _container(body, offset, first)
            if opened is None:
                raise ValueError("the request is not a map")  # only at the top: see below
            is_map, count, offset = opened
            stack.append([count, set() if is_map else None, label, count])
            # Walk the innermost open container until it opens another one (which the
            # outer loop pushes) or ends (and is popped, its parent walked on).
            while stack:
                frame = stack[-1]
                left, keys = frame[0], frame[1]
                opened_child = False
                while left:
                    if keys is not None:  # a key, then its value
                        first = body[offset]
                        if 0xA0 <= first <= 0xBF:
                            end = offset + 1 + (first & 0x1F)
                            key: Any = body[offset + 1:end].decode("utf-8", "replace")
                        else:
                            kind, key, end = _header(body, offset)
                            if kind != "scalar":
                                raise ValueError("a map or array as a key")
                        offset = end
                        if key in keys:
                            path = "".join(f"[{item[2]!r}]" for item in stack[1:])
                            return ("the request" if len(stack) == 1 else "request" + path), key
                        keys.add(key)
                    first = body[offset]
                    size = fixed[first]
                    if size == 1 and keys is None:
                        run = min(one_byte_run(body, offset).end() - offset, left)
                        offset += run
                        left -= run
                    elif size:
                        offset += size
                        left -= 1
                    elif first in variable:
                        offset = _after_variable(body, offset, first)
                        left -= 1
                    else:
                        label = key if keys is not None else frame[3] - left
                        left -= 1
                        opened_child = True
                        break
                frame[0] = left
                if opened_child:
                    break
                stack.pop()
            if not stack:
                return None
    except (ValueError, IndexError):
        return None  # not msgpack after all: msgspec decided otherwise, and is the judge


# The library's JSON (canonical: sorted keys, no spaces) and msgspec's JSON of one value
# differ only in key order, which costs no byte, and in how a float is written: each
# takes 3 to 24 characters either way. So msgspec's length, less this much per float,
# is a lower bound of the library's, found at C speed.
MAX_FLOAT_JSON_CHARS = 24
_NOT_FLOAT_HEADERS = bytes(byte for byte in range(256) if byte not in (0xCA, 0xCB))
# JSON takes at most six bytes for one byte of msgpack (0xc2 is "false,", a control
# character in a string "\u0001"): a shorter body cannot carry payloads too big for one frame.
MIN_OVERSIZED_BODY_BYTES = MAX_FRAME_BYTES // 6
_json_encoder = msgspec.json.Encoder()


def _payloads(request: Put | PutMany) -> list[dict[str, Any]]:
    """The payloads a put or put_many could write, one per task id (identical duplicates collapse)."""
    if type(request) is Put:
        return [request.payload]
    return list({item.task_id: item.payload for item in reversed(request.requests)}.values())


def costly_put_refusal(request: Request, body: bytes, *, walked: bool, sized: bool = False) -> str | None:
    """Why a put or put_many the library would refuse is refused now, before anything costs
    a step per value, or None.

    Its payloads' JSON cannot fit one WAL frame (msgspec's JSON, at C speed:
    once six 17 MB puts of 16.7M one-byte integers took 12 s to refuse), or,
    when the body is about to be ``walked`` for duplicate keys, its payloads
    hold more objects and arrays than validation allows (counted as the
    library counts them; the library applies the same rule to every request).
    ``sized``: its size was checked already.
    """
    kind = type(request)
    if kind is not Put and kind is not PutMany:
        return None
    if not sized and len(body) > MIN_OVERSIZED_BODY_BYTES:
        payloads = _payloads(request)
        try:
            encoded = len(_json_encoder.encode(payloads)) - len(payloads) - 1  # "[", "]" and commas
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError):
            encoded = 0  # not JSON: the library says what is wrong
        floats = len(body.translate(None, _NOT_FLOAT_HEADERS))
        at_least = encoded - MAX_FLOAT_JSON_CHARS * floats
        if at_least > MAX_FRAME_BYTES:
            return (f"{kind.__struct_config__.tag} of {len(body)} bytes refused "
                    f"before validating: its payloads take at least {at_least} bytes of JSON, and one "
                    f"transaction is one WAL frame of at most {MAX_FRAME_BYTES} bytes")
    if walked:
        containers = Containers()
        for index, payload in enumerate(_payloads(request) if kind is Put else
                                        [item.payload for item in request.requests]):
            limit = containers.limit()
            count = count_containers(payload, limit)
            if count > limit:
                field = "payload" if kind is Put else f"requests[{index}].payload"
                return f"{containers.refusal(field)} (refused before validating)"
            containers.spend(count)
    return None


def decode_request(body: bytes) -> Request:
    """Decode one request body. Raises ProtocolError with the message's id in ``args[1]``.

    msgspec lets the last of two equal keys win; a request or payload with a
    key twice is refused instead (RequestRefused). The cheap signal: this
    package's clients send exactly what msgspec encodes for the decoded
    request, so only a body that differs from its re-encoding is walked.
    Before that walk, a put the library would refuse for its size or its
    objects and arrays is refused cheaply (`costly_put_refusal`).
    """
    try:
        request = _request_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        # msgspec raises RecursionError for deeply nested input: still the
        # peer's fault, never the daemon's end.
        raise ProtocolError(f"undecodable request: {exc}", _peek_id(body)) from exc
    if (refusal := costly_put_refusal(request, body, walked=False)) is not None:
        raise RequestRefused(refusal, request.id)
    walked = _encoder.encode(request) != body
    if walked and (refusal := costly_put_refusal(request, body, walked=True, sized=True)) is not None:
        raise RequestRefused(refusal, request.id)
    if walked and (duplicate := duplicate_key(body)) is not None:
        where, key = duplicate
        raise RequestRefused(f"key {key!r} appears twice in {where}: a map must not repeat a key "
                             f"(the last one would silently win)", request.id)
    return request


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
    # Spelled out: the hot conversion of every reserve's answer.
    return Lease(wire.task_id, wire.worker, wire.generation, wire.deadline, wire.attempts, wire.payload)


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
    if names.index(name) >= names.index("slow_turns_total"):
        return TURN_REPORTING_VERSION
    if names.index(name) >= names.index("compact_wal_ratio"):
        return COMPACTION_REPORTING_VERSION
    if names.index(name) >= names.index("clock_steps_total"):
        return CLOCK_REPORTING_VERSION
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
