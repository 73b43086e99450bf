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

import binascii
import hashlib
import re
import struct
from array import array
from itertools import chain, islice
from operator import le, lt

from . import bulk
from .codec import (
    DIGEST_BYTES,
    LENGTH_BYTES,
    MAX_FRAME_BYTES,
    Frame,
    Problems,
    complete_frames,
    encode_frame,
    report_or_raise,
    scan_frames,
)
from .errors import CorruptStore, WalQueueError
from .fs import Directory, OsFileSystem, release_pages
from .state import State
from .tombstones import BLOCK_TOMBSTONES, ENTRY

FORMAT = 1
CURRENT = "CURRENT"
CURRENT_TMP = "CURRENT.tmp"
_SNAPSHOT_NAME = re.compile(r"snapshot-(\d{20})\.snap")
_WRITE_CHUNK_BYTES = 1 << 20
_LENGTH = struct.Struct(">I")


def _framing_bytes_bound() -> int:
    """The header and end frames at their largest (19-digit seq and count)."""
    largest = 2**63
    return (len(encode_frame({"format": FORMAT, "kind": "walqueue.snapshot", "seq": largest,
                              "task_count": largest}))
            + len(encode_frame({"kind": "end", "task_count": largest})))


# What a snapshot takes besides its entries, at most (Engine.snapshot_bytes_bound).
FRAMING_BYTES_BOUND = _framing_bytes_bound()


def snapshot_name(seq: int) -> str:
    return f"snapshot-{seq:020d}.snap"


def is_snapshot_name(filename: str) -> bool:
    return _SNAPSHOT_NAME.fullmatch(filename) is not None


def write_snapshot(fs: OsFileSystem, directory: Directory, state: State, *,
                   sync_every_bytes: int = 0) -> str:
    """Write and fsync the snapshot of `state` through its last seq; return its name.

    A file of that name can only be an orphan (a compaction that stopped
    before publishing it): it is replaced by a new file (fs.create).

    With `sync_every_bytes` > 0 the data written so far is also fdatasynced
    each time that many bytes have been written since the last sync. Only
    the final fsync matters for the snapshot; the intermediate ones keep the
    file system's dirty data small for a writer that runs beside a WAL
    (walqueued's snapshot child): on ext4 (data=ordered) a WAL fsync waits
    for the journal commit, which first writes out every dirty block
    allocated before it, so one big final fsync of a 300 MB snapshot held a
    concurrent WAL fsync for ~0.5 s (docs/performance.md).
    """
    filename = snapshot_name(state.last_seq)
    count = state.task_count()
    fd = fs.create(directory, filename)
    try:
        chunk = [encode_frame({"format": FORMAT, "kind": "walqueue.snapshot",
                               "seq": state.last_seq, "task_count": count})]
        size = unsynced = 0
        for frame in bulk.entry_frames(state):   # one frame or a block of them
            chunk.append(frame)
            size += len(frame)
            if size >= _WRITE_CHUNK_BYTES:
                fs.write(fd, b"".join(chunk))
                chunk, unsynced, size = [], unsynced + size, 0
                if sync_every_bytes and unsynced >= sync_every_bytes:
                    fs.fdatasync(fd)
                    unsynced = 0
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
    """The State the snapshot `data` holds (see load_snapshot).

    One reader at two speeds: the general one (codec.complete_frames, then
    State.load_entry for each entry) reads every frame, except that before
    the end frame it stops at a tombstone entry tombstones.ENTRY matches;
    `_load_plain_tombstones` takes those a block at a time, and the general
    reader goes on after them. Keeping going or not, both report a bad
    entry with its file and offset.
    """
    state = State()
    already_found = 0 if problems is None else len(problems.found)

    def clean() -> bool:
        """Nothing found in this file so far: only then do counts and ends mean anything."""
        return problems is None or len(problems.found) == already_found

    def fail(message: str, offset: int | None, *, at_seq: int | None = None) -> None:
        report_or_raise(problems, CorruptStore(f"{filename}: {message}", file=filename,
                                               offset=offset, seq=at_seq))

    first = True   # no frame read yet: the next one at offset 0 is the header
    count = None
    loaded = 0
    end = None
    last_end = offset = released = 0
    while True:
        frames = complete_frames(data, filename, problems, progress, start=offset,
                                 stop=ENTRY if end is None else None)
        while True:
            try:
                frame = next(frames)
            except StopIteration as stop:
                tail = stop.value
                break
            released = release_pages(data, released, frame.offset)
            last_end = frame.end
            if first:
                first = False
                if frame.offset == 0:
                    count = _check_header(frame.value, seq, fail)
                    continue
                # Only when keeping going can a first frame come from past damage:
                # it is an entry, and the damage at offset 0 is already reported.
            if end is not None:
                fail(f"frame at offset {frame.offset} follows the end frame (at offset "
                     f"{end.offset})", frame.offset)
                continue
            entry = frame.value
            if entry.get("kind") == "end":
                end = frame
                if (entry.keys() != {"kind", "task_count"} or not _is_int(entry["task_count"])
                        or (clean() and (entry["task_count"] != count or loaded != count))):
                    fail(f"end frame at offset {frame.offset} is {entry!r:.200} after {loaded} "
                         f"entries; header says {count}", frame.offset)
                continue
            loaded += _load_entry(state, entry, filename, frame.offset, problems)
        if tail.kind != "stopped":
            break
        offset = tail.offset
        if first:
            first = False
            if offset == 0:
                # A tombstone entry where the header belongs: the general reader reads
                # it, and the header check says so.
                frame = _frame_at(data, 0, filename)
                count = _check_header(frame.value, seq, fail)
                offset = last_end = frame.end
                continue
        if end is not None:
            continue   # the general reader reports the frames after the end frame
        taken = BLOCK_TOMBSTONES
        while taken == BLOCK_TOMBSTONES:
            start = offset
            offset, taken, good = _load_tombstone_block(state, data, offset, filename, problems)
            loaded += good
            last_end = offset
            if progress is not None:
                progress(offset - start)
            released = release_pages(data, released, offset)
    if first and clean():
        fail("no complete header frame at offset 0", 0)
    if end is None and clean():
        fail(f"no end frame at offset {last_end}, after {loaded} entries (the file is torn or "
             f"truncated)", last_end)
    state.finish_loading(seq)
    return state


def _check_header(value: dict, seq: int, fail) -> int | None:
    """The task count of a valid header (the value of the frame at offset 0); else `fail`s."""
    if (value.keys() != {"format", "kind", "seq", "task_count"}
            or not _is_int(value["format"]) or value["format"] != FORMAT
            or value["kind"] != "walqueue.snapshot" or not _is_int(value["seq"])
            or not _is_int(value["task_count"]) or value["task_count"] < 0):
        fail(f"header frame at offset 0 is not a format-{FORMAT} snapshot header: "
             f"{value!r:.200}", 0)
    elif value["seq"] != seq:
        fail(f"header says seq {value['seq']!r}, CURRENT says {seq}", 0, at_seq=value["seq"])
    else:
        return value["task_count"]
    return None


def _load_entry(state: State, entry: dict, filename: str, offset: int,
                problems: Problems | None) -> int:
    """Load one entry through State.load_entry: 1, or 0 for a bad one reported (else raised)."""
    try:
        state.load_entry(entry)
    except WalQueueError as error:
        report_or_raise(problems, CorruptStore(f"{filename}: entry at offset {offset}: {error}",
                                               file=filename, offset=offset))
        return 0
    return 1


def _load_tombstone_block(state: State, data, offset: int, filename: str,
                          problems: Problems | None) -> tuple[int, int, int]:
    """`_load_plain_tombstones`, by the extension while it can take the frames (bulk.py).

    What the extension takes counts as a full block, so the caller comes back
    for more; once it takes none the reference reads the next block.
    """
    if problems is None:
        taken = bulk.load_packed_tombstones(state, data, offset)
        if taken is not None:
            return taken[0], BLOCK_TOMBSTONES, taken[1]
    return _load_plain_tombstones(state, data, offset, filename, problems)


def _load_plain_tombstones(state: State, data, offset: int, filename: str,
                           problems: Problems | None) -> tuple[int, int, int]:
    """Load up to BLOCK_TOMBSTONES frames at `offset` holding tombstones.ENTRY entries.

    The fast path of snapshot loading: for each frame the length, bounds
    and digest are checked as codec does and the body must match ENTRY
    (which matches only canonical JSON); the rules of State.load_entry are
    then checked in bulk. It stops at the first frame it cannot take, which
    the general reader then reads (and reports if it is bad). If an entry
    breaks a rule, the general reader loads the frames taken one at a time,
    to name it (and, keeping going, every other). Returns the offset after
    the frames taken, how many, and how many entries were loaded.
    """
    start, size = offset, len(data)
    unpack, sha256, match = _LENGTH.unpack_from, hashlib.sha256, ENTRY.fullmatch
    rows = []
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
        offset = body_end + DIGEST_BYTES
    if not rows or load_plain_tombstones(state, rows):
        return offset, len(rows), len(rows)
    # Some entry breaks a rule (and nothing was added): one at a time, to say which.
    loaded = sum(_load_entry(state, frame.value, filename, frame.offset, problems)
                 for frame in islice(scan_frames(data, filename, start=start), len(rows)))
    return offset, len(rows), loaded


def load_plain_tombstones(state: State, rows: list[tuple[bytes, ...]]) -> bool:
    """Add consecutive snapshot entries matched by tombstones.ENTRY to `state`, in bulk.

    Each row is the match's groups, in ENTRY's order (attempts, available_at,
    generation, identity, key, max_attempts, task_id). Returns False, having
    added nothing, if any entry breaks a rule State.load_entry checks
    (task_id order, a key used twice, counters out of range or impossible):
    the caller then loads them one by one through load_entry, which says
    which and why.
    """
    attempts, available_at, generation, identities, keys, max_attempts, task_ids = zip(*rows, strict=True)
    try:
        numbers = array("q", chain.from_iterable(zip(
            map(int, attempts), map(int, max_attempts), map(int, generation),
            map(int, available_at), strict=True)))
    except OverflowError:
        return False   # a number of 2**63 or more
    if not _plain_tombstones_in_order_and_possible(state, task_ids, numbers):
        return False
    if keys != task_ids:
        return _load_tombstones_one_by_one(state, rows, numbers)
    if state.keys_besides_ids() and any(state.key_taken(task_id.decode()) for task_id in task_ids):
        return False
    state.load_tombstones(list(task_ids), binascii.unhexlify(b"".join(identities)), numbers)
    return True


def _plain_tombstones_in_order_and_possible(state: State, task_ids, numbers) -> bool:
    """Ids ascending after the last one loaded; 1 <= attempts <= max_attempts, generation."""
    attempts = numbers[0::4]
    return (min(attempts) >= 1 and all(map(le, attempts, numbers[1::4]))
            and all(map(le, attempts, numbers[2::4]))
            and task_ids[0].decode() > state.last_loaded
            and all(map(lt, task_ids, task_ids[1:])))


def _load_tombstones_one_by_one(state: State, rows, numbers) -> bool:
    """load_plain_tombstones for rows of which some have a key that is not their id."""
    keys = [row[4].decode() for row in rows]
    if len(set(keys)) != len(keys) or any(map(state.key_taken, keys)):
        return False
    for index, row in enumerate(rows):
        attempts, max_attempts, generation, available_at = numbers[4 * index:4 * index + 4]
        state.load_tombstone(row[6].decode(), keys[index], binascii.unhexlify(row[3]),
                             attempts, max_attempts, generation, available_at)
    return True


def _frame_at(data, offset: int, filename: str) -> Frame:
    """The frame at `offset`, known to be complete and valid, as the general reader reads it."""
    return next(scan_frames(data, filename, start=offset))


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
