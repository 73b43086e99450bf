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
from .fs import OsFileSystem, release_pages

# The largest preallocation step Queue accepts: far beyond any useful step
# (a few MiB amortize the allocation), small enough not to fill a disk by a typo.
MAX_PREALLOCATE_BYTES = 1024 * 1024 * 1024

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
        released = 0
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
                released = release_pages(data, released, frame.offset)
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
    """The newest segment, open for appending.

    With `preallocate_bytes` N > 0 the file keeps the next frame inside an
    allocated region (os.posix_fallocate, grown N bytes at a time, or more
    for a frame that needs more): each frame is written at its offset into
    zeros already on disk, and `sync` is an fdatasync, which then has no
    file size to commit and is cheaper than appending plus fsync. On ext4
    such a region is an unwritten extent, so a write the power cut caught
    before its sync reads back as zeros, the torn tail SPEC §5 allows.
    `trim` cuts the zeros after the last frame (sealing and closing do);
    open truncates whatever a crash left. If the file system cannot
    preallocate, the segment falls back to plain appends (with fsync).

    `size` is always the bytes of complete frames, never the allocation.
    """

    def __init__(self, fs: OsFileSystem, directory: str, first_seq: int, size: int,
                 preallocate_bytes: int = 0) -> None:
        self.fs = fs
        self.first_seq = first_seq
        self.filename = segment_name(first_seq)
        self.path = os.path.join(directory, self.filename)
        self.size = size            # bytes of complete frames
        self.preallocate_bytes = preallocate_bytes
        # The file's length as this segment left it: the frames, plus zeros
        # while preallocated (open truncates a longer file to `size` at once).
        self.allocated = size
        # A preallocating segment writes each frame at its offset (pwrite):
        # with O_APPEND it would land after the zeros.
        self.positioned = preallocate_bytes > 0
        if self.positioned:
            self.fd = fs.open_write(self.path)
        else:
            self.fd = fs.open_append(self.path)
        self.unsynced = False

    @property
    def empty(self) -> bool:
        return self.size == 0

    def append(self, frame: bytes) -> None:
        self.unsynced = True
        if not self.positioned:
            self.fs.write(self.fd, frame)
        else:
            end = self.size + len(frame)
            if end > self.allocated and self.preallocate_bytes:
                self._allocate(end)
            self.fs.pwrite(self.fd, frame, self.size)
            self.allocated = max(self.allocated, end)  # grows here only after a fallback
        self.size += len(frame)

    def _allocate(self, end: int) -> None:
        """Grow the allocation, in steps of preallocate_bytes, to cover `end`."""
        step = self.preallocate_bytes
        length = -(-(end - self.allocated) // step) * step
        if self.fs.allocate(self.fd, self.allocated, length):
            self.allocated += length
        else:
            # This file system cannot preallocate: append to this segment as
            # the default does (a pwrite at the end of the file, and fsync).
            self.preallocate_bytes = 0

    def sync(self) -> None:
        if self.preallocate_bytes:
            self.fs.fdatasync(self.fd)
        else:
            self.fs.fsync(self.fd)
        self.unsynced = False

    @property
    def has_zero_tail(self) -> bool:
        """Preallocated zeros follow the last complete frame."""
        return self.allocated > self.size

    def trim(self) -> None:
        """Cut the preallocated zeros after the last frame and make the file durable (fsync)."""
        self.fs.truncate(self.fd, self.size)
        self.fs.fsync(self.fd)
        self.allocated = self.size
        self.unsynced = False

    def seal(self) -> None:
        """Make the segment final on disk: its frames and nothing after them, synced."""
        if self.has_zero_tail:
            self.trim()
        else:
            self.sync()

    def truncate(self, size: int) -> None:
        """Cut a torn tail off and make the cut durable."""
        self.fs.truncate(self.fd, size)
        self.fs.fsync(self.fd)
        self.size = size
        self.allocated = size

    def close(self) -> None:
        if self.fd is not None:
            fd, self.fd = self.fd, None
            self.fs.close(fd)
