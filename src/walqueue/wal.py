"""The write-ahead log: a set of segment files holding frames (see codec).

    DIRECTORY/wal-<F:020d>.log    F = the seq of the segment's first frame

Each frame is one transaction record; seqs start at 1 and rise by exactly 1
across all segments. Only the newest segment is appended to; `compact()`
seals it and starts the next one, named after the next seq.

A segment read at open is valid if and only if:
  1. every frame in it is complete and valid (codec's rules) and is a
     record object with an integer seq;
  2. its first frame's seq equals F, and each later frame's seq is the one
     before plus 1;
  3. it is the newest segment, or it has at least one frame and no bytes
     after its last frame.
In the newest segment an incomplete final frame, or a run of zero bytes
after the last frame, is a torn tail: recovery truncates it (and fsyncs)
before appending anything.
"""

from __future__ import annotations

import os
import re

from .codec import Frame, Tail, scan_frames
from .errors import CorruptStore
from .fs import OsFileSystem

_SEGMENT_NAME = re.compile(r"wal-(\d{20})\.log")


def segment_name(first_seq: int) -> str:
    return f"wal-{first_seq:020d}.log"


def segment_first_seq(filename: str) -> int | None:
    """F for a file named like a segment, else None."""
    match = _SEGMENT_NAME.fullmatch(filename)
    if match is None:
        return None
    first_seq = int(match.group(1))
    if first_seq < 1:
        raise CorruptStore(f"{filename}: a segment cannot start at seq 0 (seqs start at 1)")
    return first_seq


def list_segments(names) -> list[tuple[int, str]]:
    """(first seq, file name) of every segment among `names`, oldest first."""
    found = []
    for filename in names:
        first_seq = segment_first_seq(filename)
        if first_seq is not None:
            found.append((first_seq, filename))
    return sorted(found)


class SegmentReader:
    """Streams the records of one segment, checking rules 1-3 above.

    Iterate `records()` for (offset, record) pairs; afterwards `tail` says
    what followed the last complete frame and `last_seq` is the seq of the
    last frame (first_seq - 1 for an empty segment). Raises CorruptStore.
    """

    def __init__(self, fs: OsFileSystem, directory: str, first_seq: int, filename: str,
                 newest: bool) -> None:
        self.path = os.path.join(directory, filename)
        self.fs = fs
        self.first_seq = first_seq
        self.filename = filename
        self.newest = newest
        self.last_seq = first_seq - 1
        self.tail: Tail | None = None

    def records(self):
        filename = self.filename
        data = self.fs.read(self.path)
        try:
            scanner = scan_frames(data, filename)
            while True:
                try:
                    frame = next(scanner)
                except StopIteration as stop:
                    self.tail = stop.value
                    break
                record = _record_of(frame, filename)
                if record["seq"] != self.last_seq + 1:
                    what = "first frame" if frame.offset == 0 else "frame"
                    raise CorruptStore(f"{filename}: {what} at offset {frame.offset} has seq "
                                       f"{record['seq']}, expected {self.last_seq + 1}")
                self.last_seq += 1
                yield frame.offset, record
        finally:
            if hasattr(data, "close"):
                data.close()
        if not self.newest:
            if self.tail.kind != "clean":
                raise CorruptStore(f"{filename}: sealed segment has {_describe(self.tail)} "
                                   f"at offset {self.tail.offset}")
            if self.last_seq < self.first_seq:
                raise CorruptStore(f"{filename}: sealed segment holds no frame")


def _describe(tail: Tail) -> str:
    return "an incomplete frame" if tail.kind == "incomplete" else "zero bytes after its last frame"


def _record_of(frame: Frame, filename: str) -> dict:
    record = frame.value
    if type(record) is not dict or type(record.get("seq")) is not int:
        raise CorruptStore(f"{filename}: frame at offset {frame.offset} is not a record with a seq")
    return record


class ActiveSegment:
    """The newest segment, open for appending."""

    def __init__(self, fs: OsFileSystem, directory: str, first_seq: int, size: int) -> None:
        self.fs = fs
        self.first_seq = first_seq
        self.filename = segment_name(first_seq)
        self.path = os.path.join(directory, self.filename)
        self.size = size            # bytes of complete frames
        self.fd = fs.open_append(self.path)
        self.unsynced = False

    @property
    def empty(self) -> bool:
        return self.size == 0

    def append(self, frame: bytes) -> None:
        self.unsynced = True
        self.fs.write(self.fd, frame)
        self.size += len(frame)

    def sync(self) -> None:
        self.fs.fsync(self.fd)
        self.unsynced = False

    def truncate(self, size: int) -> None:
        """Cut a torn tail off and make the cut durable."""
        self.fs.truncate(self.fd, size)
        self.fs.fsync(self.fd)
        self.size = size

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            self.fs.close(fd)
