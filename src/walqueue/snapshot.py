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

import itertools
import re

from .codec import Problems, complete_frames, encode_frame, report_or_raise
from .errors import CorruptStore, WalQueueError
from .fs import Directory, OsFileSystem
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


def write_snapshot(fs: OsFileSystem, directory: Directory, state: State) -> str:
    """Write and fsync the snapshot of `state` through its last seq; return its name.

    A file of that name can only be an orphan (a compaction that stopped
    before publishing it): it is replaced by a new file (fs.create).
    """
    filename = snapshot_name(state.last_seq)
    count = len(state.tasks)
    fd = fs.create(directory, filename)
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


def load_snapshot(fs: OsFileSystem, directory: Directory, filename: str, seq: int,
                  problems: Problems | None = None, progress=None) -> State:
    """Read the snapshot CURRENT names into a new State. Raises CorruptStore.

    With `problems` (see codec.Problems) it reports every damaged frame and
    invalid entry there instead and goes on; the State it then returns is
    not to be trusted if anything was reported. `progress` as for
    codec.scan_frames.
    """
    try:
        data = fs.read(directory, filename)
    except FileNotFoundError:
        raise CorruptStore(f"{CURRENT} names {filename}, which does not exist",
                           file=filename) from None
    try:
        return _parse_snapshot(data, filename, seq, problems, progress)
    finally:
        if hasattr(data, "close"):
            data.close()


def _parse_snapshot(data, filename: str, seq: int, problems: Problems | None = None,
                    progress=None) -> State:
    state = State()
    already_found = 0 if problems is None else len(problems.found)

    def clean() -> bool:
        """Nothing found in this file so far: only then do counts and ends mean anything."""
        return problems is None or len(problems.found) == already_found

    def fail(message: str, offset: int | None, *, at_seq: int | None = None) -> None:
        report_or_raise(problems, CorruptStore(f"{filename}: {message}", file=filename,
                                               offset=offset, seq=at_seq))

    frames = complete_frames(data, filename, problems, progress)
    header = next(frames, None)
    count = None
    last_end = 0
    if header is None or header.offset != 0:
        # Only when keeping going can a first frame come from past damage:
        # it is an entry, and the damage at offset 0 is already reported.
        if header is not None:
            frames = itertools.chain([header], frames)
        elif clean():
            fail("no complete header frame at offset 0", 0)
    else:
        value = header.value
        last_end = header.end
        if (value.keys() != {"format", "kind", "seq", "task_count"}
                or not _is_int(value["format"]) or value["format"] != FORMAT
                or value["kind"] != "walqueue.snapshot" or not _is_int(value["seq"])
                or not _is_int(value["task_count"]) or value["task_count"] < 0):
            fail(f"header frame at offset 0 is not a format-{FORMAT} snapshot header: "
                 f"{value!r:.200}", 0)
        elif value["seq"] != seq:
            fail(f"header says seq {value['seq']!r}, CURRENT says {seq}", 0, at_seq=value["seq"])
        else:
            count = value["task_count"]
    loaded = 0
    end = None
    for frame in frames:
        last_end = frame.end
        if end is not None:
            fail(f"frame at offset {frame.offset} follows the end frame (at offset {end.offset})",
                 frame.offset)
            continue
        entry = frame.value
        if entry.get("kind") == "end":
            end = frame
            if (entry.keys() != {"kind", "task_count"} or not _is_int(entry["task_count"])
                    or (clean() and (entry["task_count"] != count or loaded != count))):
                fail(f"end frame at offset {frame.offset} is {entry!r:.200} after {loaded} "
                     f"entries; header says {count}", frame.offset)
            continue
        try:
            state.load_entry(entry)
        except WalQueueError as error:
            report_or_raise(problems, CorruptStore(f"{filename}: entry at offset {frame.offset}: "
                                                   f"{error}", file=filename, offset=frame.offset))
            continue
        loaded += 1
    if end is None and clean():
        fail(f"no end frame at offset {last_end}, after {loaded} entries (the file is torn or "
             f"truncated)", last_end)
    state.finish_loading(seq)
    return state


def read_current(fs: OsFileSystem, directory: Directory) -> tuple[int, str] | None:
    """(seq, snapshot file name) from CURRENT, or None if there is no CURRENT. Raises CorruptStore."""
    try:
        data = fs.read(directory, CURRENT)
    except FileNotFoundError:
        return None
    try:
        frames = list(complete_frames(data, CURRENT))
    finally:
        if hasattr(data, "close"):
            data.close()
    if not frames:
        raise CorruptStore(f"{CURRENT}: empty at offset 0; it must hold exactly one frame",
                           file=CURRENT, offset=0)
    if len(frames) > 1:
        raise CorruptStore(f"{CURRENT}: a second frame at offset {frames[1].offset}; "
                           f"it must hold exactly one frame", file=CURRENT, offset=frames[1].offset)
    value = frames[0].value
    if (value.keys() != {"format", "seq", "snapshot"}
            or not _is_int(value["format"]) or value["format"] != FORMAT
            or not _is_int(value["seq"])
            or not 0 < value["seq"] < 2**63 or value["snapshot"] != snapshot_name(value["seq"])):
        raise CorruptStore(f"{CURRENT}: frame at offset 0 is not a valid pointer: {value!r:.200}",
                           file=CURRENT, offset=0)
    return value["seq"], value["snapshot"]


def _is_int(value) -> bool:
    return type(value) is int


def current_frame(seq: int) -> bytes:
    return encode_frame({"format": FORMAT, "seq": seq, "snapshot": snapshot_name(seq)})
