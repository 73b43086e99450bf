"""Offline, read-only verification of a queue directory (`walqueue-ctl verify`).

`verify_directory(path)` reads the directory the way `Queue(path)` recovers
it (SPEC §5) and reports what it finds, without changing anything:

  - it takes no lock and creates no file (not even LOCK); every file is
    opened read-only (with O_NOATIME where the kernel allows it), so no byte
    and no modification time changes;
  - its verdict agrees with `Queue`: a directory has a problem of severity
    "corrupt" if and only if opening it raises CorruptStore. It uses the
    library's own pieces for that — `snapshot.read_current` and
    `load_snapshot`, the frame rules of `codec`, the segment naming of `wal`,
    and `State.apply` for every record recovery would apply — and, as a
    cross-check, runs Queue's recovery itself over a read-only view of the
    directory (see _library_verdict); if the two ever disagree, the
    library's verdict wins and the report asks for a bug report;
  - unlike recovery it does not stop at the first problem: after a damaged
    frame it searches for the next valid frame and goes on, so one report
    lists every damaged place it can find (file, offset, seq).

Severities:
  "corrupt"     open would raise CorruptStore because of this;
  "torn-tail"   open would truncate this tail of the newest segment (a torn
                write or preallocated zeros): expected after a crash, not an
                error (an "incomplete" frame with a complete frame after it is
                a damaged length, which open and verify call corrupt);
  "note"        open would delete or ignore this (an orphan snapshot,
                CURRENT.tmp, WAL segments the snapshot covers, a stray file);
  "unreadable"  verify could not read a file (permissions, I/O error), so it
                cannot say whether the directory is healthy.

Records are checked against the state only up to the first corrupt problem:
after it the state recovery would rebuild is unknown (the report says so in
a note), while frames, checksums and seq continuity are still checked.

Standard library only (this is the library layer).
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import hashlib
import json
import os
import re
import struct
import sys
from dataclasses import asdict, dataclass, field

from .codec import DIGEST_BYTES, LENGTH_BYTES, MAX_FRAME_BYTES, _complete_frame_after, decode_body
from .errors import CorruptStore, WalQueueError
from .fs import read_descriptor
from .queue import Queue
from .snapshot import CURRENT, CURRENT_TMP, is_snapshot_name, load_snapshot, read_current
from .state import RECORD_FIELDS, State
from .wal import list_segments

CORRUPT = "corrupt"
TORN_TAIL = "torn-tail"
NOTE = "note"
UNREADABLE = "unreadable"
SEVERITIES = (CORRUPT, TORN_TAIL, NOTE, UNREADABLE)

LOCK = "LOCK"
SOCKET_NAME = "walqueued.sock"  # the daemon's default socket lives in the directory
# After a damaged frame, at most this many body bytes are hashed while
# searching for the next valid frame, so verifying a file of garbage stays
# bounded (the rest of such a file is then reported as unreadable bytes).
MAX_RESYNC_HASH_BYTES = 256 * 1024 * 1024

_LENGTH = struct.Struct(">I")
_OFFSET = re.compile(r"\boffset (\d+)\b")
_SEQ = re.compile(r"\bseq (\d+)\b")


@dataclass(frozen=True)
class Problem:
    """One finding: where it is and what it is."""

    severity: str
    file: str | None
    what: str
    offset: int | None = None
    seq: int | None = None

    def location(self) -> str:
        parts = [self.file or "(directory)"]
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        if self.seq is not None:
            parts.append(f"seq {self.seq}")
        return ", ".join(parts)


@dataclass(frozen=True)
class VerifyReport:
    """What `verify_directory` found. `corrupt` is True iff `Queue(directory)` would raise CorruptStore.

    `counts` (tasks per status) is None when the state cannot be rebuilt
    (a corrupt directory). `last_seq` is the last seq recovery would reach,
    or on a corrupt directory the last seq applied before the first problem.
    `wal_bytes` is what `QueueStats.wal_bytes` would say right after open.
    """

    directory: str
    problems: tuple[Problem, ...]
    counts: dict[str, int] | None
    last_seq: int | None
    snapshot_seq: int | None
    snapshot: str | None
    segments: int
    wal_bytes: int
    total_bytes: int
    lock_holder: int | None = field(default=None)

    @property
    def corrupt(self) -> bool:
        return any(problem.severity == CORRUPT for problem in self.problems)

    @property
    def unreadable(self) -> bool:
        return any(problem.severity == UNREADABLE for problem in self.problems)

    @property
    def healthy(self) -> bool:
        """Open would succeed (torn tails and notes are not errors)."""
        return not self.corrupt and not self.unreadable

    def by_severity(self, severity: str) -> list[Problem]:
        return [problem for problem in self.problems if problem.severity == severity]

    def render(self) -> str:
        """The human report `walqueue-ctl verify` prints (see docs/operations.md)."""
        if self.corrupt:
            verdict = "CORRUPT: opening it would fail with CorruptStore"
        elif self.unreadable:
            verdict = "UNKNOWN: some files could not be read"
        else:
            verdict = "HEALTHY: it opens"
            if self.by_severity(TORN_TAIL):
                verdict += " (after truncating the torn tail listed below)"
        snapshot = "none" if self.snapshot is None else f"{self.snapshot} (seq {self.snapshot_seq})"
        last_seq = "unknown" if self.last_seq is None else str(self.last_seq)
        if not self.healthy:
            last_seq += " (the last one applied before the first problem)"
        lines = [f"{self.directory}: {verdict}",
                 f"  snapshot:  {snapshot}",
                 f"  last seq:  {last_seq}",
                 f"  WAL:       {self.segments} segment(s), {self.wal_bytes} bytes of frames; "
                 f"{self.total_bytes} bytes in the directory"]
        if self.counts is not None:
            lines.append("  tasks:     " + ", ".join(f"{name} {count}" for name, count in self.counts.items()))
        if self.lock_holder is not None:
            lines.append(f"  lock:      held by pid {self.lock_holder}: a live owner may be appending, so "
                         f"its newest segment can look torn; verify a stopped daemon's directory or a copy")
        if self.problems:
            lines.append(f"problems ({len(self.problems)}):")
            for problem in self.problems:
                what = problem.what
                if problem.file and what.startswith(f"{problem.file}: "):
                    what = what[len(problem.file) + 2:]  # the location already names the file
                label = problem.severity.upper()
                lines.append(f"  {label:<10} {problem.location()}: {what}")
        if self.corrupt:
            lines.append("next: keep a copy of the directory as evidence; the daemon will not start "
                         "on it. See docs/operations.md, 'Reading verify output'.")
        return "\n".join(lines)

    def to_json(self) -> dict:
        """A JSON-ready dict of the whole report."""
        report = asdict(self)
        report["problems"] = [asdict(problem) for problem in self.problems]
        report["healthy"] = self.healthy
        report["corrupt"] = self.corrupt
        return report


class _ReadOnlyFiles:
    """The two file-system calls verify needs; there is deliberately no way to write.

    Passed to the library's `read_current` and `load_snapshot` in place of
    `OsFileSystem`: if they ever tried to write, verify would fail loudly
    instead of changing the directory.
    """

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def read(self, path: str):
        return read_descriptor(_open_read_only(path))


def _open_read_only(path: str) -> int:
    flags = os.O_RDONLY | os.O_CLOEXEC
    noatime = getattr(os, "O_NOATIME", 0)
    if noatime:
        try:
            return os.open(path, flags | noatime)
        except PermissionError:
            pass  # O_NOATIME needs ownership of the file; read it anyway
    return os.open(path, flags)


def _close(data) -> None:
    if hasattr(data, "close"):
        data.close()


def _numbers_in(message: str, directory: str, pattern: re.Pattern) -> int | None:
    match = pattern.search(message.replace(directory, ""))
    return int(match.group(1)) if match else None


class _Verifier:
    def __init__(self, directory: str) -> None:
        self.directory = directory
        self.files = _ReadOnlyFiles()
        self.problems: list[Problem] = []
        # The state recovery would have at this point; None once it is unknown
        # (the snapshot is unusable, or a corrupt problem came before).
        self.state: State | None = None
        self.state_stopped_at: str | None = None
        self.resync_budget = MAX_RESYNC_HASH_BYTES
        self.last_applied: int | None = None  # the last seq applied to a trusted state

    def add(self, severity: str, file: str | None, what: str, *, offset: int | None = None,
            seq: int | None = None) -> None:
        self.problems.append(Problem(severity, file, what, offset, seq))
        if severity in (CORRUPT, UNREADABLE) and self.state is not None:
            self.state = None
            where = file if offset is None else f"{file} offset {offset}"
            self.state_stopped_at = where

    def add_library_error(self, file: str, error: CorruptStore) -> None:
        message = str(error)
        self.add(CORRUPT, file, message,
                 offset=_numbers_in(message, self.directory, _OFFSET),
                 seq=_numbers_in(message, self.directory, _SEQ))

    # -- frames ---------------------------------------------------------

    def frames(self, data, name: str):
        """Yield (offset, value, after_damage) of every valid frame; return (tail offset, tail kind).

        Like codec.scan_frames, but a damaged frame is reported (as corrupt)
        and the scan resumes at the next valid frame it can find. The tail
        kind is "clean", "incomplete" or "zeros" as in codec.Tail, or
        "damaged" when the file ends in bytes that hold no valid frame.
        `after_damage` is True for the first frame found after a damaged one.
        """
        size = len(data)
        offset = 0
        after_damage = False
        while True:
            if offset >= size:
                return offset, "clean"
            if size - offset < LENGTH_BYTES:
                return offset, ("zeros" if _all_zero(data, offset) else "incomplete")
            (length,) = _LENGTH.unpack_from(data, offset)
            if length == 0 and _all_zero(data, offset):
                return offset, "zeros"
            end = offset + LENGTH_BYTES + length + DIGEST_BYTES
            if 1 <= length <= MAX_FRAME_BYTES and end > size:
                follower = _complete_frame_after(data, offset + LENGTH_BYTES)
                if follower is None:
                    return offset, "incomplete"
                # codec's rule: a torn write leaves nothing complete after it,
                # so this length is damaged, and open calls it corruption.
                self.add(CORRUPT, name, f"{name}: frame at offset {offset} has length {length}, "
                         f"running past the end of the file, yet a complete frame follows at "
                         f"offset {follower}: the length is damaged, this is not a torn tail",
                         offset=offset)
                offset = follower
                after_damage = True
                continue
            problem, value = self._check_frame(data, offset, length, end)
            if problem is None:
                yield offset, value, after_damage
                after_damage = False
                offset = end
                continue
            resume = None
            if 1 <= length <= MAX_FRAME_BYTES and end + LENGTH_BYTES + DIGEST_BYTES < size:
                # Most damage is inside one frame whose length is intact: try
                # the frame right after it before searching byte by byte.
                (next_length,) = _LENGTH.unpack_from(data, end)
                next_end = end + LENGTH_BYTES + next_length + DIGEST_BYTES
                if 1 <= next_length <= MAX_FRAME_BYTES and next_end <= size and \
                        self._check_frame(data, end, next_length, next_end)[0] is None:
                    resume = end
            if resume is None:
                resume = self._next_valid_frame(data, offset + 1)
            if resume is None:
                extent = f"; no valid frame follows in the {size - offset} bytes from there to the end"
            elif 1 <= length <= MAX_FRAME_BYTES and resume == end:
                extent = ""
            else:
                extent = f"; the next valid frame starts at offset {resume}"
            self.add(CORRUPT, name, f"{name}: frame at offset {offset} {problem}{extent}",
                     offset=offset)
            if resume is None:
                return size, "damaged"
            offset = resume
            after_damage = True

    def _check_frame(self, data, offset: int, length: int, end: int) -> tuple[str | None, object]:
        """(None, value) for a valid frame at `offset` (codec's rules), else (why not, None)."""
        if length == 0:
            return "has length 0", None
        if length > MAX_FRAME_BYTES:
            return f"has length {length}, above MAX_FRAME_BYTES={MAX_FRAME_BYTES}", None
        body = data[offset + LENGTH_BYTES:offset + LENGTH_BYTES + length]
        if hashlib.sha256(body).digest() != data[end - DIGEST_BYTES:end]:
            return "fails its SHA-256 checksum", None
        try:
            return None, decode_body(body, "")
        except CorruptStore as error:
            return str(error).strip(), None

    def _next_valid_frame(self, data, start: int) -> int | None:
        """The first offset >= start where a complete valid frame begins, or None.

        A length prefix is at most MAX_FRAME_BYTES = 0x01000000, so its first
        byte is 0x00 (or the prefix is exactly 01 00 00 00): only offsets
        holding such a byte are tried, and canonical JSON never contains a raw
        zero byte, so inside bodies that leaves few candidates. Hashes at most
        `resync_budget` body bytes over the whole run.
        """
        size = len(data)
        last = size - LENGTH_BYTES - DIGEST_BYTES - 1  # a frame of length 1 starting here ends at size
        unpack = _LENGTH.unpack_from
        offset = start
        while offset <= last:
            zero = data.find(b"\x00", offset, last + 1)
            largest = data.find(_LENGTH.pack(MAX_FRAME_BYTES), offset, last + LENGTH_BYTES)
            candidates = [found for found in (zero, largest) if 0 <= found <= last]
            if not candidates:
                return None
            offset = min(candidates)
            (length,) = unpack(data, offset)
            end = offset + LENGTH_BYTES + length + DIGEST_BYTES
            if 1 <= length <= MAX_FRAME_BYTES and end <= size:
                if self.resync_budget < length:
                    return None
                self.resync_budget -= length
                if self._check_frame(data, offset, length, end)[0] is None:
                    return offset
            offset += 1
        return None

    # -- files ----------------------------------------------------------

    def read(self, name: str):
        """The bytes of a file in the directory, or None (reported) if it cannot be read."""
        try:
            return self.files.read(os.path.join(self.directory, name))
        except OSError as error:
            self.add(UNREADABLE, name, f"{name}: cannot be read: {error.strerror or error}")
            return None


def verify_directory(path: str | os.PathLike, *, cross_check: bool = True) -> VerifyReport:
    """Check a queue directory offline and report every problem found.

    Changes nothing: takes no lock, creates and writes no file.
    With `cross_check` (the default) the verdict is also asked of the
    library's own recovery code, run on a read-only view of the directory
    (see _library_verdict), and any disagreement is resolved in the
    library's favour and reported; tests turn it off to test verify's own
    checks against Queue.
    Raises FileNotFoundError / NotADirectoryError if `path` is not an
    existing directory (open would create it; there is nothing to verify),
    and PermissionError if it cannot be listed.
    """
    # Like recovery: millions of long-lived objects and no cycles, which the
    # cyclic collector would only rescan.
    collecting = gc.isenabled()
    gc.disable()
    try:
        report = _verify(os.fspath(path))
        if not cross_check or report.unreadable:
            return report
        return _reconcile(report, _library_verdict(report.directory))
    finally:
        if collecting:
            gc.enable()


def _verify(directory: str) -> VerifyReport:
    verifier = _Verifier(directory)
    names = sorted(verifier.files.listdir(directory))
    total_bytes = 0
    for name in names:
        try:
            total_bytes += os.lstat(os.path.join(directory, name)).st_size
        except OSError:
            pass

    # -- CURRENT and the snapshot it names ----------------------------------
    snapshot_seq: int | None = 0
    snapshot_file: str | None = None
    try:
        current = read_current(verifier.files, directory)
    except CorruptStore as error:
        verifier.add_library_error(CURRENT, error)
        current, snapshot_seq = None, None
    except OSError as error:
        verifier.add(UNREADABLE, CURRENT, f"{CURRENT}: cannot be read: {error.strerror or error}")
        current, snapshot_seq = None, None
    if current is None:
        if snapshot_seq == 0:
            verifier.state = State()
            verifier.last_applied = 0
    else:
        snapshot_seq, snapshot_file = current
        try:
            verifier.state = load_snapshot(verifier.files, directory, snapshot_file, snapshot_seq)
            verifier.last_applied = snapshot_seq  # even if the very next frame is damaged
        except CorruptStore as error:
            verifier.add_library_error(snapshot_file, error)
            _survey_snapshot(verifier, snapshot_file)
        except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as error:
            # SPEC §4: anything malformed on disk is CorruptStore; a library
            # that raises something else here has a bug, which is named.
            verifier.add(CORRUPT, snapshot_file, f"{snapshot_file}: malformed (the library raised "
                         f"{type(error).__name__}: {error} instead of CorruptStore, a library bug)")
            _survey_snapshot(verifier, snapshot_file)
        except OSError as error:
            verifier.add(UNREADABLE, snapshot_file,
                         f"{snapshot_file}: cannot be read: {error.strerror or error}")
    if snapshot_seq is None:
        verifier.add(NOTE, None, "CURRENT is unusable, so which WAL segments the snapshot covers "
                     "is unknown: every segment is checked on its own")

    # -- the WAL segments, exactly as recovery walks them -------------------
    segments = _segments(verifier, names)
    if snapshot_seq is None:
        covered: list[str] = []
    else:
        covered = [name for index, (_, name) in enumerate(segments[:-1])
                   if segments[index + 1][0] <= snapshot_seq + 1]
    for name in covered:
        verifier.add(NOTE, name, f"{name}: wholly covered by the published snapshot "
                     f"(seq {snapshot_seq}); open deletes it without reading it")
    live = segments[len(covered):]
    sizes: dict[str, int] = {}
    tails: dict[str, tuple[int, str, str]] = {}
    previous_last: int | None = None   # the last seq of the previous live segment
    previous_unreadable = False
    newest_last: int | None = None
    for index, (first_seq, filename) in enumerate(live):
        newest = index == len(live) - 1
        if snapshot_seq is not None and not previous_unreadable:
            expected = snapshot_seq + 1 if previous_last is None else previous_last + 1
            if first_seq > expected or (previous_last is not None and first_seq != expected):
                kind = "a sequence gap" if first_seq > expected else "overlapping segments"
                verifier.add(CORRUPT, filename, f"{filename}: starts at seq {first_seq}, expected "
                             f"seq {expected} ({kind})", seq=first_seq)
        last = _verify_segment(verifier, filename, first_seq, newest, snapshot_seq, sizes, tails)
        previous_unreadable = last is None
        previous_last = last
        newest_last = last

    # -- what open would do with the tail and the leftovers ------------------
    wal_bytes = 0
    if live and snapshot_seq is not None and newest_last is not None and newest_last >= snapshot_seq:
        wal_bytes = sum(sizes.get(name, 0) for _, name in live)
        newest_name = live[-1][1]
        if newest_name in tails:
            offset, kind, what = tails[newest_name]
            verifier.add(TORN_TAIL, newest_name, what, offset=offset)
    elif live and snapshot_seq is not None:
        for _, name in live:
            verifier.add(NOTE, name, f"{name}: ends at or before the published snapshot "
                         f"(seq {snapshot_seq}); open deletes it")
    for name in names:
        if name == CURRENT_TMP:
            verifier.add(NOTE, name, f"{name}: left by an interrupted compaction; never "
                         f"authoritative, open deletes it")
        elif is_snapshot_name(name) and name != snapshot_file:
            verifier.add(NOTE, name, f"{name}: an orphan snapshot (CURRENT does not name it); "
                         f"never authoritative, open deletes it")
        elif (name not in (CURRENT, LOCK, SOCKET_NAME) and not is_snapshot_name(name)
              and not any(name == segment for _, segment in segments)
              and not any(problem.file == name for problem in verifier.problems)):
            verifier.add(NOTE, name, f"{name}: not a queue file; open ignores it")
    if verifier.state is None and verifier.state_stopped_at is not None:
        verifier.add(NOTE, None, f"records after the first problem ({verifier.state_stopped_at}) "
                     f"were not checked against the state, which is unknown from there on")

    state = verifier.state
    healthy = not any(p.severity in (CORRUPT, UNREADABLE) for p in verifier.problems)
    counts = dict(state.counts) if state is not None and healthy else None
    return VerifyReport(
        directory=directory,
        problems=tuple(verifier.problems),
        counts=counts,
        last_seq=state.last_seq if state is not None else verifier.last_applied,
        snapshot_seq=snapshot_seq,
        snapshot=snapshot_file,
        segments=len(segments),
        wal_bytes=wal_bytes,
        total_bytes=total_bytes,
        lock_holder=_lock_holder(directory),
    )


def _verify_segment(verifier: _Verifier, filename: str, first_seq: int, newest: bool,
                    snapshot_seq: int | None, sizes: dict, tails: dict) -> int | None:
    """Check one segment like wal.SegmentReader plus recovery's apply loop.

    Returns the seq of its last frame (first_seq - 1 when it has none),
    or None when it cannot be read.
    """
    data = verifier.read(filename)
    if data is None:
        return None
    last_seq = first_seq - 1
    frame_count = 0
    try:
        scanner = verifier.frames(data, filename)
        while True:
            try:
                offset, record, after_damage = next(scanner)
            except StopIteration as stop:
                tail_offset, tail_kind = stop.value
                break
            frame_count += 1
            if type(record) is not dict or type(record.get("seq")) is not int:
                verifier.add(CORRUPT, filename, f"{filename}: frame at offset {offset} is not a "
                             f"record with a seq", offset=offset)
                last_seq += 1
                continue
            seq = record["seq"]
            if after_damage and seq > last_seq + 1:
                pass  # the frames in between are the damage already reported
            elif seq != last_seq + 1:
                what = "first frame" if offset == 0 else "frame"
                verifier.add(CORRUPT, filename, f"{filename}: {what} at offset {offset} has seq "
                             f"{seq}, expected {last_seq + 1}", offset=offset, seq=seq)
            last_seq = seq
            if snapshot_seq is not None and seq <= snapshot_seq:
                # Covered by the snapshot: not applied, but it must still be
                # a well-formed record, as recovery insists.
                op = record.get("op")
                if record.keys() != (RECORD_FIELDS.get(op, ()) if isinstance(op, str) else ()):
                    verifier.add(CORRUPT, filename, f"{filename}: frame at offset {offset} (seq "
                                 f"{seq}) is not a well-formed record", offset=offset, seq=seq)
                continue
            state = verifier.state
            if state is None:
                continue
            try:
                state.apply(record)
            except WalQueueError as error:
                verifier.add(CORRUPT, filename, f"{filename}: frame at offset {offset} (seq {seq}): "
                             f"invalid {record.get('op')!r} record: {error}", offset=offset, seq=seq)
            except (TypeError, ValueError, KeyError, AttributeError, RecursionError) as error:
                verifier.add(CORRUPT, filename, f"{filename}: frame at offset {offset} (seq {seq}): "
                             f"malformed {record.get('op')!r} record (the library raised "
                             f"{type(error).__name__}: {error} instead of CorruptStore, a library "
                             f"bug)", offset=offset, seq=seq)
            else:
                verifier.last_applied = seq
        if tail_kind == "damaged":
            if newest:
                _explain_a_write_torn_in_preallocation(verifier, filename, data)
            sizes[filename] = len(data)
            return last_seq
        sizes[filename] = tail_offset
        if not newest:
            if tail_kind != "clean":
                what = "an incomplete frame" if tail_kind == "incomplete" else \
                    "zero bytes after its last frame"
                verifier.add(CORRUPT, filename, f"{filename}: sealed segment has {what} at offset "
                             f"{tail_offset}", offset=tail_offset)
            elif frame_count == 0:
                verifier.add(CORRUPT, filename, f"{filename}: sealed segment holds no frame")
        elif tail_kind != "clean":
            tails[filename] = (tail_offset, tail_kind,
                               _describe_tail(filename, len(data), tail_offset, tail_kind))
        return last_seq
    finally:
        _close(data)


def _explain_a_write_torn_in_preallocation(verifier: _Verifier, filename: str, data) -> None:
    """Say so when the newest segment's last problem looks like a write torn inside preallocated space.

    Still corrupt (open raises CorruptStore for it, SPEC §5): a frame whose
    digest fails, holding some non-zero bytes and then only zeros to the end
    of the file, is what a power cut leaves when it tears a write into a
    preallocated segment (docs/failure-model.md). Verify only adds the
    reading; whether to cut the segment there is the operator's decision.
    """
    problem = verifier.problems[-1]
    if problem.file != filename or problem.offset is None or \
            "fails its SHA-256 checksum" not in problem.what:
        return
    rest = bytes(data[problem.offset:])
    written = len(rest.rstrip(b"\x00"))
    (length,) = _LENGTH.unpack_from(rest, 0)
    if not 0 < written < LENGTH_BYTES + length + DIGEST_BYTES <= len(rest):
        return
    verifier.problems[-1] = dataclasses.replace(problem, what=(
        f"{problem.what}; only its first {written} bytes are non-zero and every byte after them "
        f"is zero: this looks like a write torn inside a preallocated segment (a frame whose sync "
        f"never returned), see docs/failure-model.md, 'A write torn inside preallocated space'"))


def _describe_tail(filename: str, size: int, offset: int, kind: str) -> str:
    cut = size - offset
    if kind == "zeros":
        return (f"{filename}: {cut} zero bytes after the last frame at offset {offset} "
                f"(a preallocated or torn tail); open truncates them")
    return (f"{filename}: an incomplete final frame at offset {offset} ({cut} bytes, a torn "
            f"write); open truncates it")


def _survey_snapshot(verifier: _Verifier, filename: str) -> None:
    """After load_snapshot failed: report the snapshot's other damaged frames and invalid entries.

    Every frame between the header and the end frame is loaded into a
    scratch State on its own terms (State.load_entry changes nothing when it
    rejects an entry), so one bad entry does not hide the next.
    """
    first = verifier.problems[-1]
    data = verifier.read(filename)
    if data is None:
        return
    try:
        before = len(verifier.problems)
        scratch = State()
        end_offset = None
        scanner = verifier.frames(data, filename)
        while True:
            try:
                offset, entry, _ = next(scanner)
            except StopIteration as stop:
                tail_offset, tail_kind = stop.value
                break
            if offset == 0:
                continue  # the header: load_snapshot judged it
            if end_offset is not None:
                verifier.add(CORRUPT, filename, f"{filename}: frame at offset {offset} follows "
                             f"the end frame (at offset {end_offset})", offset=offset)
            elif type(entry) is dict and entry.get("kind") == "end":
                end_offset = offset
            else:
                try:
                    scratch.load_entry(entry)
                except (WalQueueError, TypeError, ValueError, KeyError, AttributeError) as error:
                    verifier.add(CORRUPT, filename, f"{filename}: entry at offset {offset}: {error}",
                                 offset=offset)
        if tail_kind in ("incomplete", "zeros"):
            what = "an incomplete frame" if tail_kind == "incomplete" else "zero bytes"
            verifier.add(CORRUPT, filename, f"{filename}: {what} at offset {tail_offset} "
                         f"(the file is torn)", offset=tail_offset)
        # The first problem is already reported, in load_snapshot's words.
        verifier.problems[before:] = [problem for problem in verifier.problems[before:]
                                      if problem.offset != first.offset]
    finally:
        _close(data)


class _WouldWrite(Exception):
    """Recovery reached its first write: it has read and accepted everything on disk."""


class _RecoveryProbeFiles(_ReadOnlyFiles):
    """listdir and read as usual; any other file-system call stops the probe before it acts."""

    def __getattr__(self, name: str):
        def refuse(*args, **kwargs):
            raise _WouldWrite(name)
        return refuse


_OPENS = "opens"


def _library_verdict(directory: str) -> str:
    """"opens", "corrupt: <CorruptStore message>" or "unavailable: <why>".

    Runs Queue's own recovery (`Queue._recover`, a private method: the one
    place that knows every rule) on an object that holds no lock, over files
    it can only read. Recovery reads and checks everything before it writes
    anything, and its first write (truncating a torn tail, deleting
    leftovers, opening the active segment) raises _WouldWrite here, which
    means the directory opens. If Queue's internals change shape the probe
    reports "unavailable" instead of guessing.
    """
    probe = Queue.__new__(Queue)
    try:
        probe._directory = directory
        probe._fs = _RecoveryProbeFiles()
        probe._hook = None
        probe._preallocate_bytes = 0
        probe._closed = True
        probe._active = None
        probe._lock_fd = None
        probe._batch_depth = 0
        probe._recover()
    except _WouldWrite:
        return _OPENS
    except CorruptStore as error:
        return f"corrupt: {error}"
    except Exception as error:  # noqa: BLE001 - advisory only; verify's own checks still stand
        return f"unavailable: {type(error).__name__}: {error}"
    finally:
        probe.__dict__.clear()  # nothing for Queue.__del__ to release
    return _OPENS  # recovery that writes nothing at all: it opens


def _reconcile(report: VerifyReport, verdict: str) -> VerifyReport:
    """The report with the library's verdict; verify's own checks and the library should never differ."""
    problems = list(report.problems)
    if verdict.startswith("corrupt: ") and not report.corrupt:
        message = verdict[len("corrupt: "):]
        file = message.split(":", 1)[0] if ":" in message else None
        problems.append(Problem(CORRUPT, file, f"{message} (found by the library's recovery; "
                                f"verify's own checks missed it: please report this)",
                                _numbers_in(message, report.directory, _OFFSET),
                                _numbers_in(message, report.directory, _SEQ)))
    elif verdict == _OPENS and report.corrupt:
        problems = [Problem(NOTE, problem.file, f"{problem.what} (verify's own checks flag this, but "
                            f"the library's recovery accepts the directory: please report this)",
                            problem.offset, problem.seq)
                    if problem.severity == CORRUPT else problem for problem in problems]
    elif verdict.startswith("unavailable: "):
        problems.append(Problem(NOTE, None, f"the cross-check with the library's recovery could not "
                                f"run ({verdict[len('unavailable: '):]}); the verdict is verify's own"))
    else:
        return report
    return dataclasses.replace(report, problems=tuple(problems))


def _segments(verifier: _Verifier, names) -> list[tuple[int, str]]:
    """wal.list_segments, reporting (instead of raising) a name recovery rejects."""
    segments = []
    for name in names:
        try:
            found = list_segments([name])
        except CorruptStore as error:
            verifier.add_library_error(name, error)
            continue
        segments.extend(found)
    return sorted(segments)


def _all_zero(data, offset: int) -> bool:
    tail = bytes(data[offset:])
    return tail.count(0) == len(tail)


def _lock_holder(directory: str) -> int | None:
    """The pid holding LOCK (a running Queue or daemon), read from /proc/locks; None if none or unknown.

    Taking or testing the lock would be a change (and could block an owner
    starting up), so this only reads the kernel's table of flock locks.
    """
    try:
        info = os.stat(os.path.join(directory, LOCK))
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            table = locks.read()
    except OSError:
        return None
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted:
            try:
                return int(fields[4])
            except ValueError:
                return None
    return None


EXIT_HEALTHY, EXIT_USAGE, EXIT_CORRUPT, EXIT_UNREADABLE = 0, 2, 4, 8  # as walqueue-ctl verify


def main(argv: list[str] | None = None) -> int:
    """`python -m walqueue.verify DIRECTORY [--json]`: walqueue-ctl verify on the standard library alone.

    For a machine without the daemon layer's packages; same report, same
    exit codes (0 opens, 4 corrupt, 8 unreadable, 2 usage).
    """
    parser = argparse.ArgumentParser(
        prog="python -m walqueue.verify",
        description="Check a WALQueue directory offline; changes nothing. Run it on a stopped "
                    "daemon's directory or on a copy. How to read the report: docs/operations.md.",
        epilog="Exit codes: 0 the directory opens (a torn tail is reported, not an error), "
               "4 corrupt, 8 a file cannot be read, 2 usage.")
    parser.add_argument("directory", help="the queue directory to check")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    arguments = parser.parse_args(argv)
    try:
        report = verify_directory(arguments.directory)
    except OSError as error:
        print(f"python -m walqueue.verify: cannot read {arguments.directory}: "
              f"{error.strerror or error}", file=sys.stderr)
        return EXIT_UNREADABLE
    if arguments.json:
        print(json.dumps(report.to_json(), ensure_ascii=False, sort_keys=True, separators=(",", ":")))
    else:
        print(report.render())
    if report.corrupt:
        return EXIT_CORRUPT
    return EXIT_UNREADABLE if report.unreadable else EXIT_HEALTHY


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["CORRUPT", "NOTE", "SEVERITIES", "TORN_TAIL", "UNREADABLE", "Problem", "VerifyReport",
           "main", "verify_directory"]
