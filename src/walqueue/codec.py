"""Canonical JSON and frames, on bytes only (no I/O, no clock).

A frame (SPEC §4)::

    offset 0      4-byte big-endian unsigned length N, 1 <= N <= MAX_FRAME_BYTES
    offset 4      N bytes of canonical JSON
    offset 4+N    32-byte SHA-256 digest of those N bytes

Canonical JSON is `json.dumps(value, sort_keys=True, separators=(",", ":"),
ensure_ascii=False, allow_nan=False)` encoded as UTF-8. Because every frame
must be the canonical encoding of the value it decodes to, there is exactly
one byte sequence for each record, which the tests compare byte for byte.

Reading a buffer of frames, the frame at an offset is valid if and only if:
  1. at least 4 bytes remain, and the length N is 1 <= N <= MAX_FRAME_BYTES;
  2. the whole frame (4 + N + 32 bytes) lies inside the buffer;
  3. the digest matches the N body bytes;
  4. the body is UTF-8 JSON, and re-encoding the decoded value canonically
     gives back exactly the body.
A failure of 1 (too few bytes) or 2 is an *incomplete* frame; a run of zero
bytes to the end of the buffer is a *zero tail*; the caller decides whether
either may be a torn tail. Everything else is corruption.
"""

from __future__ import annotations

import hashlib
import json
import struct
from dataclasses import dataclass
from typing import Any

from .errors import CorruptStore, InvalidRequest

MAX_FRAME_BYTES = 16 * 1024 * 1024
LENGTH_BYTES = 4
DIGEST_BYTES = 32
FRAME_OVERHEAD_BYTES = LENGTH_BYTES + DIGEST_BYTES

_LENGTH = struct.Struct(">I")
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"),
                            ensure_ascii=False, allow_nan=False)
_sha256 = hashlib.sha256


def canonical_json(value: Any) -> bytes:
    """The canonical encoding of a JSON value (raises ValueError/TypeError)."""
    return _ENCODER.encode(value).encode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in canonical JSON")


def _decode_json(body: bytes) -> Any:
    return json.loads(body.decode("utf-8"), parse_constant=_reject_constant)


def encode_frame(value: Any) -> bytes:
    """Encode one record as a frame.

    Raises InvalidRequest if the canonical JSON exceeds MAX_FRAME_BYTES.
    """
    body = canonical_json(value)
    if len(body) > MAX_FRAME_BYTES:
        raise InvalidRequest(
            f"transaction is {len(body)} bytes of JSON, above MAX_FRAME_BYTES={MAX_FRAME_BYTES}")
    return _LENGTH.pack(len(body)) + body + _sha256(body).digest()


@dataclass(frozen=True, slots=True)
class Frame:
    offset: int   # where the frame starts in the buffer
    end: int      # the offset just past its digest
    value: Any


@dataclass(frozen=True, slots=True)
class Tail:
    """What follows the last complete frame of a buffer."""

    offset: int   # the end of the last complete frame
    kind: str     # "clean" (nothing), "incomplete", or "zeros"


def scan_frames(data, name: str):
    """Yield every complete, valid Frame of `data`, then return its Tail.

    `name` identifies the buffer in error messages. Use as a generator and read
    the Tail from StopIteration.value, or call `read_frames`.
    Raises CorruptStore naming `name` and the offset of the bad frame.
    """
    size = len(data)
    offset = 0
    unpack = _LENGTH.unpack_from
    while offset < size:
        if size - offset < LENGTH_BYTES:
            return Tail(offset, "zeros" if _all_zero(data, offset) else "incomplete")
        (length,) = unpack(data, offset)
        if length == 0:
            if _all_zero(data, offset):
                return Tail(offset, "zeros")
            raise CorruptStore(f"{name}: frame at offset {offset} has length 0")
        if length > MAX_FRAME_BYTES:
            raise CorruptStore(
                f"{name}: frame at offset {offset} has length {length}, "
                f"above MAX_FRAME_BYTES={MAX_FRAME_BYTES}")
        body_start = offset + LENGTH_BYTES
        end = body_start + length + DIGEST_BYTES
        if end > size:
            return Tail(offset, "incomplete")
        body = bytes(data[body_start:body_start + length])
        if _sha256(body).digest() != data[end - DIGEST_BYTES:end]:
            raise CorruptStore(f"{name}: frame at offset {offset} fails its SHA-256 checksum")
        yield Frame(offset, end, decode_body(body, f"{name}: frame at offset {offset}"))
        offset = end
    return Tail(offset, "clean")


def decode_body(body: bytes, where: str) -> Any:
    """Decode a frame body, insisting on the canonical encoding."""
    try:
        value = _decode_json(body)
        canonical = canonical_json(value)
    except (UnicodeDecodeError, ValueError, TypeError, RecursionError) as error:
        raise CorruptStore(f"{where} is not valid JSON: {error}") from error
    if canonical != body:
        raise CorruptStore(f"{where} is not in canonical JSON form")
    return value


def read_frames(data, name: str) -> tuple[list[Frame], Tail]:
    """All frames of `data` and its Tail (see scan_frames)."""
    frames: list[Frame] = []
    scanner = scan_frames(data, name)
    while True:
        try:
            frames.append(next(scanner))
        except StopIteration as stop:
            return frames, stop.value


def _all_zero(data, offset: int) -> bool:
    tail = bytes(data[offset:])
    return tail.count(0) == len(tail)


def complete_frames(data, name: str):
    """Yield every frame of `data`, which must end exactly after its last frame.

    For files that are written whole and then published (snapshots, CURRENT):
    any incomplete or zero tail there is corruption, never a torn tail.
    """
    tail = yield from scan_frames(data, name)
    if tail.kind != "clean":
        what = "an incomplete frame" if tail.kind == "incomplete" else "zero bytes"
        raise CorruptStore(f"{name}: {what} at offset {tail.offset} (the file is torn)")
