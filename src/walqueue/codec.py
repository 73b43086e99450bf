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
  4. the body is UTF-8 text holding exactly one JSON object (every record,
     snapshot entry and pointer is an object), and re-encoding that object
     canonically gives back exactly the body.
A failure of 1 (too few bytes) or 2 is an *incomplete* frame -- unless a
complete frame with a good digest lies further on, which proves the length
damaged -- and a run of zero bytes to the end of the buffer is a *zero tail*;
the caller decides whether either may be a torn tail. Everything else is
corruption.
"""

from __future__ import annotations

import hashlib
import json
import re
import struct
from dataclasses import dataclass
from typing import Any, NamedTuple

from . import speedups
from .errors import CorruptStore, InvalidRequest

MAX_FRAME_BYTES = 16 * 1024 * 1024
# How messages name that limit for a person (the exact number is in the code and SPEC §4).
MAX_FRAME_TEXT = "16 MiB (MAX_FRAME_BYTES)"
# After a damaged frame a reader that keeps going hashes at most this many
# body bytes in all while searching for the next valid frame.
MAX_RESYNC_HASH_BYTES = 256 * 1024 * 1024
LENGTH_BYTES = 4
DIGEST_BYTES = 32
FRAME_OVERHEAD_BYTES = LENGTH_BYTES + DIGEST_BYTES

_LENGTH = struct.Struct(">I")
_ENCODER = json.JSONEncoder(sort_keys=True, separators=(",", ":"),
                            ensure_ascii=False, allow_nan=False)
_sha256 = hashlib.sha256

# JSONEncoder.encode builds a new C encoder on every call; building it once
# saves a third of the time of encoding a small record. Its arguments are the
# ones JSONEncoder.iterencode passes for _ENCODER's settings; no cycle check
# (markers=None): every value encoded here was built or validated as JSON,
# which cannot hold a cycle.
_c_encoder = None
if json.encoder.c_make_encoder is not None:
    _c_encoder = json.encoder.c_make_encoder(
        None, _ENCODER.default, json.encoder.encode_basestring, None, ":", ",", True, False, False)


def canonical_json(value: Any) -> bytes:
    """The canonical encoding of a JSON value (raises ValueError/TypeError)."""
    if _c_encoder is not None and type(value) is dict:
        return "".join(_c_encoder(value, 0)).encode("utf-8")
    return _ENCODER.encode(value).encode("utf-8")


def _reject_constant(name: str) -> Any:
    raise ValueError(f"{name} is not allowed in canonical JSON")


# The C scanner behind json.loads, called directly: it parses one value at an
# offset and reports where it ended, without the wrapper's whitespace handling.
_scan_once = json.JSONDecoder(parse_constant=_reject_constant).scan_once


def encode_frame(value: Any) -> bytes:
    """Encode one record as a frame.

    Raises InvalidRequest if the canonical JSON exceeds MAX_FRAME_BYTES.
    """
    return frame_of_body(canonical_json(value))


def mebibytes(size: int) -> str:
    """A byte count as a person reads it beside a limit: "20.0 MiB"."""
    return f"{size / (1024 * 1024):.1f} MiB"


def frame_of_body(body: bytes) -> bytes:
    """The frame holding `body`, which must be canonical JSON already.

    Raises InvalidRequest if it exceeds MAX_FRAME_BYTES.
    """
    if len(body) > MAX_FRAME_BYTES:
        raise InvalidRequest(
            f"transaction is {len(body)} bytes ({mebibytes(len(body))}) of JSON, above the limit "
            f"of {MAX_FRAME_TEXT} on one transaction")
    return _LENGTH.pack(len(body)) + body + _sha256(body).digest()


class Frame(NamedTuple):
    offset: int   # where the frame starts in the buffer
    end: int      # the offset just past its digest
    value: Any


@dataclass(frozen=True, slots=True)
class Tail:
    """What follows the last complete frame of a buffer."""

    offset: int   # the end of the last complete frame
    # "clean" (nothing), "incomplete", "zeros", "stopped" (scanning with a
    # `stop` pattern: `offset` is the frame it matched, see scan_frames), or
    # (only when scanning with Problems) "damaged": the buffer ends in bytes
    # that hold no valid frame, and `offset` is the buffer's length.
    kind: str


class Problems:
    """Where a reader that keeps going puts the corruption it finds (verify's mode).

    A reader handed a Problems reports each CorruptStore here instead of
    raising it, and goes on: after a damaged frame, `scan_frames` resumes at
    the next valid frame it can find. `found` lists what was reported, in
    the order found (recovery adds the files it cannot read); `resumed_at`
    is (buffer name, offset) of the frame the latest resumption found, so a
    reader can tell the seqs the damage swallowed from a real gap. Searching
    hashes at most `resync_budget_bytes` body bytes over a whole run, so a
    file of garbage is checked in bounded time.
    """

    def __init__(self, resync_budget_bytes: int = MAX_RESYNC_HASH_BYTES) -> None:
        self.found: list = []
        self.resumed_at: tuple[str, int] | None = None
        self.resync_budget_bytes = resync_budget_bytes

    def report(self, problem) -> None:
        self.found.append(problem)


def report_or_raise(problems: Problems | None, error: CorruptStore) -> None:
    """Raise `error`; when keeping going (`problems` given), report it and return."""
    if problems is None:
        raise error
    problems.report(error)


_CHUNK_FRAMES = 512  # frames whose canonical form is checked with one encoder call


def scan_frames(data, name: str, problems: Problems | None = None, progress=None, *,
                start: int = 0, stop: re.Pattern | None = None):
    """Yield every complete, valid Frame of `data` from offset `start`, then return its Tail.

    The compiled path (walqueue.speedups) walks the frames it can decide in
    C and hands each other one to the pure reader below (`_scan_pure`), so
    what is accepted and what is raised (class, message, offset) is the
    reference's. Keeping going (`problems`) always reads the pure way.
    """
    if (speedups.COMPILED and problems is None
            and (stop is None or stop is speedups.COMPILED_STOP)):
        return (yield from _scan_compiled(data, name, progress, start, stop))
    return (yield from _scan_pure(data, name, problems, progress, start=start, stop=stop))


_COMPILED_BATCH = 4096   # frames the extension returns per call


def _scan_compiled(data, name: str, progress, start: int, stop):
    """scan_frames by the extension, each frame it declines read by `_scan_pure`."""
    scan, size = speedups.speedups.scan, len(data)
    offset = read = start
    limit, end, entry = speedups.SCAN_LIMIT, speedups.SCAN_END, speedups.SCAN_ENTRY
    while True:
        frames, offset, code = scan(data, offset, stop is not None, _COMPILED_BATCH, Frame)
        yield from frames
        if code == limit:
            if progress is not None:
                progress(offset - read)
                read = offset
            continue
        if code == end or code == entry:
            if progress is not None:
                progress((offset if code == entry else size) - read)
            return Tail(offset, "clean" if code == end else "stopped")
        # Declined: the reference reads this one frame (and raises, or ends, as it does).
        if progress is not None:
            progress(offset - read)
            read = offset
        pure = _scan_pure(data, name, None, None, start=offset, stop=stop, chunk_frames=1)
        try:
            frame = next(pure)
        except StopIteration as stopped:
            tail = stopped.value
            if progress is not None:
                progress((tail.offset if tail.kind == "stopped" else size) - read)
            return tail
        yield frame
        offset = frame.end


def _scan_pure(data, name: str, problems: Problems | None = None, progress=None, *,
               start: int = 0, stop: re.Pattern | None = None, chunk_frames: int = 0):
    """scan_frames in pure Python: the reference (see scan_frames).

    `name` identifies the buffer in errors. Use as a generator and read the
    Tail from StopIteration.value. Raises CorruptStore naming `name` and the
    offset of the first bad frame; every frame before it is yielded first.
    With `problems`, reports each bad frame there instead and resumes at the
    next valid frame (see Problems). `progress(byte_count)` is told, every
    few hundred frames, how many more bytes of `data` have been read.
    With `stop`, a pattern of bytes, the scan ends before the first frame
    with a good digest whose body it fully matches, with Tail(its offset,
    "stopped"): the caller reads those frames its own faster way (the bytes
    from there on are not told to `progress`).
    """
    size = len(data)
    offset = start
    read = start  # the bytes already told to `progress`
    chunk_frames = chunk_frames or _CHUNK_FRAMES
    unpack = _LENGTH.unpack_from
    sha256 = _sha256
    while True:
        # Gather a chunk of frames whose digests and JSON syntax are good,
        # then check their canonical form together: one encoder call for the
        # chunk is much cheaper than one per frame.
        chunk: list[Frame] = []
        bodies: list[bytes] = []
        problem: CorruptStore | Tail | None = None
        damaged_end = None  # the end of a bad frame whose length is intact
        follower = None     # a complete frame after a damaged length
        while len(chunk) < chunk_frames:
            if offset >= size:
                problem = Tail(offset, "clean")
                break
            if size - offset < LENGTH_BYTES:
                problem = Tail(offset, "zeros" if _all_zero(data, offset) else "incomplete")
                break
            (length,) = unpack(data, offset)
            if length == 0:
                problem = (Tail(offset, "zeros") if _all_zero(data, offset) else CorruptStore(
                    f"{name}: frame at offset {offset} has length 0", file=name, offset=offset))
                break
            if length > MAX_FRAME_BYTES:
                problem = CorruptStore(f"{name}: frame at offset {offset} has length {length}, "
                                       f"above MAX_FRAME_BYTES={MAX_FRAME_BYTES}",
                                       file=name, offset=offset)
                break
            body_start = offset + LENGTH_BYTES
            end = body_start + length + DIGEST_BYTES
            if end > size:
                follower = _complete_frame_after(data, body_start)
                problem = Tail(offset, "incomplete") if follower is None else CorruptStore(
                    f"{name}: frame at offset {offset} has length {length}, running past the "
                    f"end of the file, yet a complete frame follows at offset {follower}: "
                    f"the length is damaged, this is not a torn tail", file=name, offset=offset)
                break
            body = data[body_start:body_start + length]
            if sha256(body).digest() != data[end - DIGEST_BYTES:end]:
                problem = CorruptStore(f"{name}: frame at offset {offset} fails its SHA-256 "
                                       f"checksum", file=name, offset=offset)
                damaged_end = end
                break
            if stop is not None and stop.fullmatch(body) is not None:
                problem = Tail(offset, "stopped")
                break
            try:
                value = _parse_object(body)
            except CorruptStore as error:
                problem = CorruptStore(f"{name}: frame at offset {offset} {error}",
                                       file=name, offset=offset)
                damaged_end = end
                break
            chunk.append(Frame(offset, end, value))
            bodies.append(body)
            offset = end
        if chunk:
            good = _canonical_prefix(chunk, bodies)
            yield from chunk[:good]
            if good < len(chunk):
                bad = chunk[good]
                problem = CorruptStore(f"{name}: frame at offset {bad.offset} is not in "
                                       f"canonical JSON form", file=name, offset=bad.offset)
                offset, damaged_end, follower = bad.offset, bad.end, None
        if isinstance(problem, Tail):
            if progress is not None:
                progress((problem.offset if problem.kind == "stopped" else size) - read)
            return problem
        if problem is not None:
            if problems is None:
                raise problem
            offset = _resume(data, problem, damaged_end, follower, problems)
            if offset is None:
                if progress is not None:
                    progress(size - read)
                return Tail(size, "damaged")
        if progress is not None:
            progress(offset - read)
            read = offset


def _resume(data, problem: CorruptStore, damaged_end: int | None, follower: int | None,
            problems: Problems) -> int | None:
    """Report `problem` and return the offset of the next valid frame after it (None if none).

    A damaged length resumes at the complete frame that proved it damaged.
    Most other damage is inside one frame whose length is intact, so the
    frame right after it is tried before searching byte by byte.
    """
    name, offset = problem.file, problem.offset
    message = str(problem)
    if follower is not None:
        resume = follower
    else:
        resume = damaged_end if damaged_end is not None and _valid_frame_at(data, damaged_end) \
            else _next_valid_frame(data, offset + 1, problems)
        if resume is None:
            message += f"; no valid frame follows in the {len(data) - offset} bytes from there to the end"
        elif resume != damaged_end:
            message += f"; the next valid frame starts at offset {resume}"
    problems.report(CorruptStore(message, file=name, offset=offset))
    if resume is not None:
        problems.resumed_at = (name, resume)
    return resume


def _valid_frame_at(data, offset: int) -> bool:
    """A complete frame that passes every rule of the module header starts at `offset`."""
    if len(data) - offset < FRAME_OVERHEAD_BYTES + 1:
        return False
    (length,) = _LENGTH.unpack_from(data, offset)
    end = offset + LENGTH_BYTES + length + DIGEST_BYTES
    if not 1 <= length <= MAX_FRAME_BYTES or end > len(data):
        return False
    body = data[offset + LENGTH_BYTES:end - DIGEST_BYTES]
    if _sha256(body).digest() != data[end - DIGEST_BYTES:end]:
        return False
    try:
        return canonical_json(_parse_object(body)) == body
    except (CorruptStore, ValueError, TypeError):
        return False


def _next_valid_frame(data, start: int, problems: Problems) -> int | None:
    """The first offset >= start where a valid frame begins, or None.

    A length prefix is at most MAX_FRAME_BYTES = 0x01000000, so its first
    byte is 0x00 (or the prefix is exactly 01 00 00 00): only offsets holding
    such a byte are tried, and canonical JSON never holds a raw zero byte, so
    inside bodies that leaves few candidates. Spends the problems' budget.
    """
    size = len(data)
    last = size - FRAME_OVERHEAD_BYTES - 1  # a frame of length 1 starting here ends at size
    largest = _LENGTH.pack(MAX_FRAME_BYTES)
    offset = start
    while offset <= last:
        candidates = [found for found in (data.find(b"\x00", offset, last + 1),
                                          data.find(largest, offset, last + LENGTH_BYTES))
                      if 0 <= found <= last]
        if not candidates:
            return None
        offset = min(candidates)
        (length,) = _LENGTH.unpack_from(data, offset)
        if length == 0:   # a run of zeros: only its last three bytes can start a length
            nonzero = _first_nonzero(data, offset)
            if nonzero is None:
                return None
            offset = max(offset + 1, nonzero - LENGTH_BYTES + 1)
            continue
        if 1 <= length <= MAX_FRAME_BYTES and offset + FRAME_OVERHEAD_BYTES + length <= size:
            if problems.resync_budget_bytes < length:
                return None
            problems.resync_budget_bytes -= length
            if _valid_frame_at(data, offset):
                return offset
        offset += 1
    return None


def torn_write_length(data, offset: int) -> int | None:
    """K when the frame at `offset` looks like a write torn inside zeros, else None.

    That is: its length is in bounds and the whole frame lies in the buffer,
    its digest fails, and after its first K bytes (0 < K < the frame's size)
    every byte to the end of the buffer is zero -- what a write cut short
    leaves in preallocated space (docs/failure-model.md).
    """
    if len(data) - offset < FRAME_OVERHEAD_BYTES:
        return None
    (length,) = _LENGTH.unpack_from(data, offset)
    end = LENGTH_BYTES + length + DIGEST_BYTES
    if not (1 <= length <= MAX_FRAME_BYTES and end <= len(data) - offset) or not _all_zero(data, offset + end):
        return None
    frame = bytes(data[offset:offset + end])   # at most one frame, never the whole tail
    written = len(frame.rstrip(b"\x00"))
    if not 0 < written < end:
        return None
    if _sha256(frame[LENGTH_BYTES:end - DIGEST_BYTES]).digest() == frame[end - DIGEST_BYTES:]:
        return None
    return written


def _complete_frame_after(data, start: int) -> int | None:
    """The offset of a complete frame with a good digest at or after `start`, if any.

    A torn write leaves one partial frame at the end of the file, and nothing
    valid can follow it. A complete frame after an "incomplete" one means its
    length field is damaged; treating that as a torn tail would silently
    truncate every frame after it. Every length up to MAX_FRAME_BYTES starts
    with a zero byte, and canonical JSON never holds one, so only the zero
    bytes of the tail need to be tried.
    """
    size = len(data)
    position = data.find(b"\x00", start)
    while 0 <= position <= size - FRAME_OVERHEAD_BYTES - 1:
        (length,) = _LENGTH.unpack_from(data, position)
        if length == 0:
            # Inside a run of zeros only its last three bytes can start a length.
            nonzero = _first_nonzero(data, position)
            if nonzero is None:
                return None
            position = max(position + 1, nonzero - LENGTH_BYTES + 1)
            continue
        end = position + LENGTH_BYTES + length + DIGEST_BYTES
        if end <= size:
            body = data[position + LENGTH_BYTES:end - DIGEST_BYTES]
            if _sha256(body).digest() == data[end - DIGEST_BYTES:end]:
                return position
        position = data.find(b"\x00", position + 1)
    return None


def _parse_object(body: bytes) -> dict:
    """The JSON object `body` holds, which must be exactly one object."""
    try:
        text = body.decode("utf-8")
        value, end = _scan_once(text, 0)
    except StopIteration:
        raise CorruptStore("is not valid JSON") from None
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise CorruptStore(f"is not valid JSON: {error}") from None
    if end != len(text):
        raise CorruptStore(f"is not valid JSON: extra data at byte {end}")
    if type(value) is not dict:
        raise CorruptStore(f"holds a JSON {type(value).__name__}, not an object")
    return value


def _canonical_prefix(chunk: list[Frame], bodies: list[bytes]) -> int:
    """How many frames at the start of `chunk` are in canonical form.

    Each body is known to be one complete JSON object, and no object's text
    is a proper prefix of another's, so the joined bodies equal the canonical
    encoding of the list of values if and only if every body is canonical.
    """
    values = [frame.value for frame in chunk]
    try:
        if canonical_json(values) == b"[" + b",".join(bodies) + b"]":
            return len(chunk)
    except (ValueError, TypeError):
        pass  # e.g. a lone surrogate from a \ud800 escape: find the frame below
    for index, (value, body) in enumerate(zip(values, bodies, strict=True)):
        try:
            if canonical_json(value) != body:
                return index
        except (ValueError, TypeError):
            return index
    raise AssertionError("a chunk failed the canonical check but none of its frames did")


_SCAN_CHUNK_BYTES = 1 << 20


def _first_nonzero(data, offset: int) -> int | None:
    """The offset of the first non-zero byte of `data` at or after `offset`, or None.

    Read in chunks, never copied whole, and only where the buffer says it
    holds data (fs.MappedFile.data_ranges: a hole reads as zeros), so a file
    extended sparsely to a terabyte is judged without reading its holes.
    """
    for start, end in getattr(data, "data_ranges", ((0, len(data)),)):
        position = max(start, offset)
        while position < end:
            stop = min(position + _SCAN_CHUNK_BYTES, end)
            rest = data[position:stop].lstrip(b"\x00")
            if rest:
                return stop - len(rest)
            position = stop
    return None


def _all_zero(data, offset: int) -> bool:
    return _first_nonzero(data, offset) is None


def complete_frames(data, name: str, problems: Problems | None = None, progress=None, *,
                    start: int = 0, stop: re.Pattern | None = None):
    """Yield every frame of `data`, which must end exactly after its last frame; return the Tail.

    For files that are written whole and then published (snapshots, CURRENT):
    any incomplete or zero tail there is corruption, never a torn tail.
    `problems`, `progress`, `start` and `stop` as for scan_frames.
    """
    tail = yield from scan_frames(data, name, problems, progress, start=start, stop=stop)
    if tail.kind in ("incomplete", "zeros"):
        what = "an incomplete frame" if tail.kind == "incomplete" else "zero bytes"
        report_or_raise(problems, CorruptStore(f"{name}: {what} at offset {tail.offset} "
                                               f"(the file is torn)", file=name, offset=tail.offset))
    return tail
