"""Framing: messages to and from length-prefixed frames, with the bounds a reader enforces.

Byte layout of one message, in either direction::

    +----------------------+------------------------------------+
    | N: uint32 big-endian | N bytes: a msgpack map (msgspec)   |
    +----------------------+------------------------------------+

A frame is valid if and only if:

1. its 4-byte length N satisfies ``1 <= N <= MAX_BODY_BYTES``
   (``walqueue.MAX_FRAME_BYTES + 1 MiB``) — checked as soon as the 4 bytes
   are in, BEFORE any of the body is buffered;
2. its body decodes as exactly one of the tagged Structs of
   ``walqueue.protocol.messages`` (the tag is the ``"type"`` field), with no
   unknown fields and every field of the declared type;
3. (a request, as the daemon reads it) it passes the request bounds of
   ``walqueue.protocol.bounds``: at most MAX_CONTAINER_HEADERS possible map
   or array headers, a put_many of at most MAX_PUT_MANY_ITEMS items, no map
   with a key twice. A request that fails one is refused alone
   (``RequestRefused``); the stream goes on.

This module does no I/O, reads no clock and keeps no global state beyond the
encoder and decoders built once at import.
"""

from __future__ import annotations

import struct
from collections.abc import Mapping
from typing import Any

import msgspec

from walqueue import MAX_FRAME_BYTES
from walqueue.protocol import bounds
from walqueue.protocol.messages import (
    PROTOCOL_ERROR,
    REQUEST_REFUSED,
    REQUEST_TAGS,
    UNKNOWN_REQUEST,
    Request,
    Response,
)

__all__ = [
    "CHUNK_BUDGET_BYTES", "LENGTH_PREFIX_BYTES", "MAX_BODY_BYTES", "MAX_HELLO_BYTES",
    "FrameReader", "ProtocolError", "RequestRefused", "UnknownRequestType",
    "decode_request", "decode_response", "encode", "encode_value", "frame",
]

MAX_BODY_BYTES = MAX_FRAME_BYTES + 1024 * 1024
LENGTH_PREFIX_BYTES = 4
# The first message (a Hello) is tiny; a peer that has not said hello may not
# make the daemon buffer more than this.
MAX_HELLO_BYTES = 4096
# Answers carrying lists are split so that no single message body grows past
# this many bytes (well below MAX_BODY_BYTES, so a reader never buffers a
# huge body just to get the first tasks of a listing).
CHUNK_BUDGET_BYTES = 1024 * 1024

_LENGTH = struct.Struct(">I")


class ProtocolError(Exception):
    """The peer broke the framing or message rules; the connection must be closed.

    ``args`` = (message, id or None). Never crosses the wire under this name:
    the server answers it as a fatal ``InvalidRequest`` with this class's
    ``code`` (the peer's code misused the protocol).
    """

    code = PROTOCOL_ERROR


class UnknownRequestType(ProtocolError):
    """A request whose ``type`` this daemon does not know: a newer client's (still fatal)."""

    code = UNKNOWN_REQUEST


class RequestRefused(ProtocolError):
    """A well-framed request refused by a request bound (a cheap one checked before decoding,
    or a map with a key twice): ``args`` = (message, id).

    With an id, only that request is answered ``InvalidRequest``; the
    connection stays. Without one it is fatal like any ProtocolError.
    """

    code = REQUEST_REFUSED


def _encode_other(value: Any) -> Any:
    """Let any Mapping travel as a map, as the library accepts any Mapping in a payload."""
    if isinstance(value, Mapping):
        return dict(value)
    raise TypeError(f"cannot encode {type(value).__name__} (not a JSON value)")


_encoder = msgspec.msgpack.Encoder(enc_hook=_encode_other)
_request_decoder = msgspec.msgpack.Decoder(Request)
_response_decoder = msgspec.msgpack.Decoder(Response)


def frame(body: bytes) -> bytes:
    """Prefix ``body`` with its length. Raises ProtocolError if it is out of bounds."""
    if not 1 <= len(body) <= MAX_BODY_BYTES:
        raise ProtocolError(f"message body of {len(body)} bytes is outside 1..{MAX_BODY_BYTES}")
    return _LENGTH.pack(len(body)) + body


def encode(message: msgspec.Struct) -> bytes:
    """Encode one message as a complete frame (length prefix and body).

    Raises ProtocolError if the body would exceed MAX_BODY_BYTES, and
    TypeError/OverflowError if a value cannot be encoded as msgpack.
    """
    return frame(_encoder.encode(message))


def encode_value(value: Any) -> bytes:
    """Encode one value (e.g. a WireLease) as msgpack, for size-based chunking."""
    return _encoder.encode(value)


def decode_request(body: bytes) -> Request:
    """Decode one request body. Raises ProtocolError with the message's id in ``args[1]``.

    UnknownRequestType if its ``type`` is none this daemon knows;
    RequestRefused past a request bound: msgspec lets the last of two equal
    keys win, so a request or payload with a key twice is refused instead.
    The cheap signal: this package's clients send exactly what msgspec
    encodes for the decoded request, so only a body that differs from its
    re-encoding is walked. Before that walk, a put the library would refuse
    for its size or its objects and arrays is refused cheaply
    (`bounds.costly_put_refusal`).
    """
    try:
        request = _request_decoder.decode(body)
    except (msgspec.DecodeError, RecursionError) as exc:
        # msgspec raises RecursionError for deeply nested input: still the
        # peer's fault, never the daemon's end.
        fields = bounds.peek_fields(body)
        kind = fields.get("type")
        fault = UnknownRequestType if type(kind) is str and kind not in REQUEST_TAGS else ProtocolError
        raise fault(f"undecodable request: {exc}", bounds.peek_id(body)) from exc
    if (refusal := bounds.costly_put_refusal(request, body, walked=False)) is not None:
        raise RequestRefused(refusal, request.id)
    walked = _encoder.encode(request) != body
    if walked and (refusal := bounds.costly_put_refusal(request, body, walked=True, sized=True)) is not None:
        raise RequestRefused(refusal, request.id)
    if walked and (duplicate := bounds.duplicate_key(body)) is not None:
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


class FrameReader:
    """Splits a byte stream into message bodies, enforcing the length bound.

    ``feed()`` appends received bytes; ``next_body()`` returns the next
    complete body or None. A length of 0 or above ``max_body_bytes`` raises
    ProtocolError as soon as its 4 bytes have arrived, so at most one
    bounded body is ever buffered.

    With ``request_bounds`` (the daemon's side) a large body is also checked
    against the cheap request bounds WHILE it arrives (`bounds.early_refusal`
    once its leading bytes are in, the container headers counted as each byte
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
        if self._request_bounds and length >= bounds.PEEK_MIN_BODY_BYTES:
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
        if not self._peeked and received >= min(length, bounds.PEEK_PREFIX_BYTES):
            self._peeked = True
            refusal = bounds.early_refusal(self._prefix(), length)
        if refusal is None and length > bounds.MAX_CONTAINER_HEADERS and received > self._counted_bytes:
            start = LENGTH_PREFIX_BYTES + self._counted_bytes
            self._counted_headers += bounds.container_header_bound(self._buffer[start:available])
            self._counted_bytes = received
            if self._counted_headers > bounds.MAX_CONTAINER_HEADERS:
                refusal = (f"request of {length} bytes refused before decoding: more than "
                           f"{bounds.MAX_CONTAINER_HEADERS} of its bytes may start a msgpack map or "
                           f"array (0x80-0x9f, 0xdc-0xdf; bytes of non-ASCII text count too): send "
                           f"fewer or smaller items")
        if refusal is None:
            return
        request_id = bounds.peek_id(self._prefix())
        del self._buffer[:available]
        self._skipping_bytes = LENGTH_PREFIX_BYTES + length - available
        self._peeked, self._counted_bytes, self._counted_headers = False, 0, 0
        self.frames_done += 1
        raise RequestRefused(refusal, request_id)

    def _prefix(self) -> bytes:
        return bytes(self._buffer[LENGTH_PREFIX_BYTES:LENGTH_PREFIX_BYTES + bounds.PEEK_PREFIX_BYTES])
