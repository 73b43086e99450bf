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

import os
import re

from .codec import complete_frames, encode_frame
from .errors import CorruptStore, WalQueueError
from .fs import OsFileSystem
from .state import State

FORMAT = 1
CURRENT = "CURRENT"
CURRENT_TMP = "CURRENT.tmp"
_SNAPSHOT_NAME = re.compile(r"snapshot-(\d{20})\.snap")
_WRITE_CHUNK_BYTES = 1 << 20


def snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:020d}.snap"


def is_snapshot_name(filename: str) -> bool:
    return _SNAPSHOT_NAME.fullmatch(filename) is not None


def write_snapshot(fs: OsFileSystem, directory: str, state: State) -> str:
    """Write and fsync the snapshot of `state` through its last seq; return its name."""
    filename = snapshot_name(state.last_seq)
    count = len(state.tasks)
    fd = fs.create(os.path.join(directory, filename))
    try:
        chunk = [encode_frame({"format": FORMAT, "kind": "walqueue.snapshot",
                               "seq": state.last_seq, "task_count": count})]
        size = 0
        for entry in state.entries():
            frame = encode_frame(entry)
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
    frames = complete_frames(data, filename)
    header = next(frames, None)
    expected_header = {"format", "kind", "seq", "task_count"}
    if header is None:
        raise CorruptStore(f"{filename}: no complete header frame at offset 0")
    value = header.value
    if (type(value) is not dict or value.keys() != expected_header
            or not _is_int(value["format"]) or value["format"] != FORMAT
            or value["kind"] != "walqueue.snapshot" or not _is_int(value["seq"])
            or not _is_int(value["task_count"]) or value["task_count"] < 0):
        raise CorruptStore(f"{filename}: header frame at offset 0 is not a format-{FORMAT} "
                           f"snapshot header: {value!r:.200}")
    if value["seq"] != seq:
        raise CorruptStore(f"{filename}: header says seq {value['seq']!r}, CURRENT says {seq}")
    count = value["task_count"]
    loaded = 0
    end = None
    last_end = header.end
    for frame in frames:
        last_end = frame.end
        if end is not None:
            raise CorruptStore(f"{filename}: frame at offset {frame.offset} follows the end frame")
        entry = frame.value
        if type(entry) is dict and entry.get("kind") == "end":
            if (entry.keys() != {"kind", "task_count"} or not _is_int(entry["task_count"])
                    or entry["task_count"] != count or loaded != count):
                raise CorruptStore(f"{filename}: end frame at offset {frame.offset} is "
                                   f"{entry!r:.200} after {loaded} entries; header says {count}")
            end = frame
            continue
        try:
            state.load_entry(entry)
        except WalQueueError as error:
            raise CorruptStore(f"{filename}: entry at offset {frame.offset}: {error}") from error
        loaded += 1
    if end is None:
        raise CorruptStore(f"{filename}: no end frame at offset {last_end}, after {loaded} "
                           f"entries (the file is torn or truncated)")
    state.finish_loading(seq)
    return state


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
