"""Snapshot files and the CURRENT pointer that publishes one (SPEC §4, §5).

    snapshot-<S:020d>.snap   frames: a header, one entry per task in task_id
                             order, an end frame:
        {"format":1,"kind":"walqueue.snapshot","seq":S,"task_count":C}
        {"attempts":..,"available_at":..,...,"worker":..}     (C of them)
        {"kind":"end","task_count":C}
    CURRENT                  one frame: {"format":1,"seq":S,"snapshot":"snapshot-<S:020d>.snap"}

A snapshot holds the complete state through seq S. Only the snapshot that
CURRENT names is ever read; any other snapshot file is an orphan, whatever
its name. CURRENT is published by writing CURRENT.tmp, fsyncing it, renaming
it over CURRENT and fsyncing the directory, so a reader sees the old pointer
or the new one, never a mix.
"""

from __future__ import annotations

import hashlib
import os
import re
import struct

from .codec import (
    DIGEST_BYTES,
    LENGTH_BYTES,
    MAX_FRAME_BYTES,
    Frame,
    complete_frames,
    decode_body,
    encode_frame,
    frame_of_body,
)
from .errors import CorruptStore, WalQueueError
from .fs import OsFileSystem, release_pages
from .state import State
from .tombstones import BLOCK_TOMBSTONES, ENTRY

FORMAT = 1
CURRENT = "CURRENT"
CURRENT_TMP = "CURRENT.tmp"
_SNAPSHOT_NAME = re.compile(r"snapshot-(\d{20})\.snap")
_WRITE_CHUNK_BYTES = 1 << 20
_LENGTH = struct.Struct(">I")


def snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:020d}.snap"


def is_snapshot_name(filename: str) -> bool:
    return _SNAPSHOT_NAME.fullmatch(filename) is not None


def write_snapshot(fs: OsFileSystem, directory: str, state: State) -> str:
    """Write and fsync the snapshot of `state` through its last seq; return its name."""
    filename = snapshot_name(state.last_seq)
    count = state.task_count()
    fd = fs.create(os.path.join(directory, filename))
    try:
        chunk = [encode_frame({"format": FORMAT, "kind": "walqueue.snapshot",
                               "seq": state.last_seq, "task_count": count})]
        size = 0
        for body in state.entry_bodies():
            frame = frame_of_body(body)
            chunk.append(frame)
            size += len(frame)
            if size >= _WRITE_CHUNK_BYTES:
                fs.write(fd, b"".join(chunk))
                chunk, size = [], 0
        chunk.append(encode_frame({"kind": "end", "task_count": count}))
        fs.write(fd, b"".join(chunk))
        fs.fsync(fd)
    finally:
        fs.close(fd)
    return filename


def load_snapshot(fs: OsFileSystem, directory: str, filename: str, seq: int) -> State:
    """Read the snapshot CURRENT names into a new State. Raises CorruptStore."""
    path = os.path.join(directory, filename)
    try:
        data = fs.read(path)
    except FileNotFoundError:
        raise CorruptStore(f"{CURRENT} names {filename}, which does not exist") from None
    try:
        return _parse_snapshot(data, filename, seq)
    finally:
        if hasattr(data, "close"):
            data.close()


def _parse_snapshot(data, filename: str, seq: int) -> State:
    state = State()
    header = None
    count = loaded = 0
    end = None
    offset = released = 0
    while True:
        # The general reader, until the next completed entry that needs no JSON decoder.
        scanner = complete_frames(data, filename, offset, ENTRY)
        while True:
            try:
                frame = next(scanner)
            except StopIteration as stop:
                tail = stop.value
                break
            if header is None:
                header = frame
                count = _check_header(frame, filename, seq)
            elif end is not None:
                raise CorruptStore(f"{filename}: frame at offset {frame.offset} follows the end frame")
            elif _is_end(frame.value):
                _check_end(frame, filename, count, loaded)
                end = frame
            else:
                _load_entry(state, frame.value, filename, frame.offset)
                loaded += 1
            released = release_pages(data, released, frame.offset)
        if tail.kind != "stopped":
            break
        if header is None:
            _check_header(_frame_at(data, 0, filename), filename, seq)  # an entry: raises
        if end is not None:
            raise CorruptStore(f"{filename}: frame at offset {tail.offset} follows the end frame")
        offset, taken = tail.offset, BLOCK_TOMBSTONES
        while taken == BLOCK_TOMBSTONES:
            offset, taken = _load_plain_tombstones(state, data, offset, filename)
            loaded += taken
            released = release_pages(data, released, offset)
    if header is None:
        _check_header(None, filename, seq)
    if end is None:
        raise CorruptStore(f"{filename}: no end frame at offset {tail.offset}, after {loaded} "
                           f"entries (the file is torn or truncated)")
    state.finish_loading(seq)
    return state


def _check_header(frame, filename: str, seq: int) -> int:
    """The task count of a valid header frame. Raises CorruptStore."""
    expected_header = {"format", "kind", "seq", "task_count"}
    if frame is None:
        raise CorruptStore(f"{filename}: no complete header frame at offset 0")
    value = frame.value
    if (type(value) is not dict or value.keys() != expected_header
            or not _is_int(value["format"]) or value["format"] != FORMAT
            or value["kind"] != "walqueue.snapshot" or not _is_int(value["seq"])
            or not _is_int(value["task_count"]) or value["task_count"] < 0):
        raise CorruptStore(f"{filename}: header frame at offset 0 is not a format-{FORMAT} "
                           f"snapshot header: {value!r:.200}")
    if value["seq"] != seq:
        raise CorruptStore(f"{filename}: header says seq {value['seq']!r}, CURRENT says {seq}")
    return value["task_count"]


def _is_end(value) -> bool:
    return type(value) is dict and value.get("kind") == "end"


def _check_end(frame, filename: str, count: int, loaded: int) -> None:
    entry = frame.value
    if (entry.keys() != {"kind", "task_count"} or not _is_int(entry["task_count"])
            or entry["task_count"] != count or loaded != count):
        raise CorruptStore(f"{filename}: end frame at offset {frame.offset} is "
                           f"{entry!r:.200} after {loaded} entries; header says {count}")


def _load_entry(state: State, entry, filename: str, offset: int) -> None:
    try:
        state.load_entry(entry)
    except WalQueueError as error:
        raise CorruptStore(f"{filename}: entry at offset {offset}: {error}") from error


def _load_plain_tombstones(state: State, data, offset: int, filename: str) -> tuple[int, int]:
    """Load up to BLOCK_TOMBSTONES frames at `offset` holding tombstones.ENTRY entries.

    The fast path of snapshot loading: for each frame the length, bounds
    and digest are checked as codec does and the body must match ENTRY
    (which matches only canonical JSON); the rules of State.load_entry are
    then checked in bulk. It stops at the first frame it cannot take, which
    the general reader then reads (and reports if it is bad). Returns the
    offset after the frames taken and how many.
    """
    size = len(data)
    unpack, sha256, match = _LENGTH.unpack_from, hashlib.sha256, ENTRY.fullmatch
    rows, offsets = [], []
    while len(rows) < BLOCK_TOMBSTONES and offset + LENGTH_BYTES <= size:
        (length,) = unpack(data, offset)
        body_end = offset + LENGTH_BYTES + length
        if not 0 < length <= MAX_FRAME_BYTES or body_end + DIGEST_BYTES > size:
            break
        body = data[offset + LENGTH_BYTES:body_end]
        if sha256(body).digest() != data[body_end:body_end + DIGEST_BYTES]:
            break
        row = match(body)
        if row is None:
            break
        rows.append(row.groups())
        offsets.append(offset)
        offset = body_end + DIGEST_BYTES
    if rows and not state.load_plain_tombstones(rows):
        # Some entry breaks a rule: load them one at a time to say which.
        for frame_offset in offsets:
            _load_entry(state, _frame_at(data, frame_offset, filename).value, filename,
                        frame_offset)
    return offset, len(rows)


def _frame_at(data, offset: int, filename: str) -> Frame:
    """The frame at `offset`, known to be complete with a good digest, decoded as JSON."""
    (length,) = _LENGTH.unpack_from(data, offset)
    body_end = offset + LENGTH_BYTES + length
    value = decode_body(data[offset + LENGTH_BYTES:body_end], f"{filename}: frame at offset {offset}")
    return Frame(offset, body_end + DIGEST_BYTES, value)


def read_current(fs: OsFileSystem, directory: str) -> tuple[int, str] | None:
    """(seq, snapshot file name) from CURRENT, or None if there is no CURRENT."""
    try:
        data = fs.read(os.path.join(directory, CURRENT))
    except FileNotFoundError:
        return None
    try:
        frames = list(complete_frames(data, CURRENT))
    finally:
        if hasattr(data, "close"):
            data.close()
    if not frames:
        raise CorruptStore(f"{CURRENT}: empty at offset 0; it must hold exactly one frame")
    if len(frames) > 1:
        raise CorruptStore(f"{CURRENT}: a second frame at offset {frames[1].offset}; "
                           f"it must hold exactly one frame")
    value = frames[0].value
    if (type(value) is not dict or value.keys() != {"format", "seq", "snapshot"}
            or not _is_int(value["format"]) or value["format"] != FORMAT
            or not _is_int(value["seq"])
            or not 0 < value["seq"] < 2**63 or value["snapshot"] != snapshot_name(value["seq"])):
        raise CorruptStore(f"{CURRENT}: frame at offset 0 is not a valid pointer: {value!r:.200}")
    return value["seq"], value["snapshot"]


def _is_int(value) -> bool:
    return type(value) is int


def current_frame(seq: int) -> bytes:
    return encode_frame({"format": FORMAT, "seq": seq, "snapshot": snapshot_name(seq)})
