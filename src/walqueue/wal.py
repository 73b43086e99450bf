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

import re

from .codec import (
    FRAME_OVERHEAD_BYTES,
    Problems,
    Tail,
    report_or_raise,
    scan_frames,
    torn_write_length,
)
from .errors import CorruptStore
from .fs import RELEASE_BYTES, Directory, OsFileSystem, release_pages

# The largest preallocation step Queue accepts: far beyond any useful step
# (a few MiB amortize the allocation), small enough not to fill a disk by a typo.
MAX_PREALLOCATE_BYTES = 1024 * 1024 * 1024

_SEGMENT_NAME = re.compile(r"wal-(\d{20})\.log")


def segment_name(first_seq: int) -> str:
    return f"wal-{first_seq:020d}.log"


def is_segment_name(filename: str) -> bool:
    """Named like a segment (wal-<F:020d>.log), whatever F."""
    return _SEGMENT_NAME.fullmatch(filename) is not None


def segment_first_seq(filename: str) -> int | None:
    """F for a file named like a segment, else None. Raises CorruptStore for F = 0."""
    match = _SEGMENT_NAME.fullmatch(filename)
    if match is None:
        return None
    first_seq = int(match.group(1))
    if first_seq < 1:
        raise CorruptStore(f"{filename}: a segment cannot start at seq 0 (seqs start at 1)",
                           file=filename, seq=first_seq)
    return first_seq


def list_segments(names, problems: Problems | None = None) -> list[tuple[int, str]]:
    """(first seq, file name) of every segment among `names`, oldest first.

    Raises CorruptStore for a name recovery rejects; with `problems`,
    reports it there and leaves the file out.
    """
    found = []
    for filename in names:
        try:
            first_seq = segment_first_seq(filename)
        except CorruptStore as error:
            report_or_raise(problems, error)
            continue
        if first_seq is not None:
            found.append((first_seq, filename))
    return sorted(found)


class SegmentReader:
    """Streams the records of one segment, checking rules 1-3 above.

    Iterate `records()` for (offset, record, length of the frame's body)
    triples; afterwards `tail` says what followed the last complete frame,
    `last_seq` is the seq of the last frame (first_seq - 1 for an empty segment) and `file_size` the
    file's length. Raises CorruptStore.
    With `problems` (see codec.Problems) it reports instead and goes on: a
    frame that is not a record is skipped, and a record whose seq breaks the
    sequence is still yielded. `progress` is passed to codec.scan_frames.
    """

    def __init__(self, fs: OsFileSystem, directory: Directory, first_seq: int, filename: str,
                 newest: bool, *, problems: Problems | None = None, progress=None) -> None:
        self.fs = fs
        self.directory = directory
        self.first_seq = first_seq
        self.filename = filename
        self.newest = newest
        self.problems = problems
        self.progress = progress
        self.last_seq = first_seq - 1
        self.tail: Tail | None = None   # set once the whole file was read
        self.file_size = 0

    def records(self):
        filename, problems = self.filename, self.problems
        data = self.fs.read(self.directory, filename)
        self.file_size = len(data)
        released = 0
        try:
            scanner = scan_frames(data, filename, problems, self.progress)
            while True:
                try:
                    frame = next(scanner)
                except StopIteration as stop:
                    self.tail = stop.value
                    break
                offset, record = frame.offset, frame.value  # codec guarantees a JSON object
                if offset - released >= RELEASE_BYTES:  # the test inline: a call per frame costs
                    # The pages already read go back (see fs.release_pages).
                    released = release_pages(data, released, offset)
                seq = record.get("seq")
                if type(seq) is not int:
                    report_or_raise(problems, CorruptStore(
                        f"{filename}: frame at offset {offset} is not a record with a seq",
                        file=filename, offset=offset))
                    self.last_seq += 1
                    continue
                if seq != self.last_seq + 1:
                    # Keeping going, a seq beyond the expected one right after
                    # damage is the damage already reported, not a gap.
                    if not (seq > self.last_seq + 1 and problems is not None
                            and problems.resumed_at == (filename, offset)):
                        what = "first frame" if offset == 0 else "frame"
                        report_or_raise(problems, CorruptStore(
                            f"{filename}: {what} at offset {offset} has seq {seq}, "
                            f"expected {self.last_seq + 1}", file=filename, offset=offset,
                            seq=seq))
                    self.last_seq = seq - 1
                self.last_seq = seq
                yield offset, record, frame.end - offset - FRAME_OVERHEAD_BYTES
            tail = self.tail
            if tail.kind == "damaged":
                if self.newest:
                    _explain_a_write_torn_in_preallocation(data, filename, problems)
            elif not self.newest:
                if tail.kind != "clean":
                    report_or_raise(problems, CorruptStore(
                        f"{filename}: sealed segment has {_describe(tail)} at offset {tail.offset}",
                        file=filename, offset=tail.offset))
                elif tail.offset == 0:
                    report_or_raise(problems, CorruptStore(
                        f"{filename}: sealed segment holds no frame", file=filename))
        finally:
            if hasattr(data, "close"):
                data.close()


def _describe(tail: Tail) -> str:
    return "an incomplete frame" if tail.kind == "incomplete" else "zero bytes after its last frame"


def _explain_a_write_torn_in_preallocation(data, filename: str, problems: Problems) -> None:
    """Say so when the newest segment's last problem looks like a write torn inside preallocated space.

    Still corrupt (open raises CorruptStore for it, SPEC §5): a frame whose
    digest fails, holding some non-zero bytes and then only zeros to the end
    of the file, is what a power cut leaves when it tears a write into a
    preallocated segment (docs/failure-model.md). This only adds the
    reading; whether to cut the segment there is the operator's decision.
    """
    problem = problems.found[-1]
    if not isinstance(problem, CorruptStore) or problem.file != filename or problem.offset is None:
        return
    written = torn_write_length(data, problem.offset)
    if written is None:
        return
    problems.found[-1] = CorruptStore(
        f"{problem}; only its first {written} bytes are non-zero and every byte after them is "
        f"zero: this looks like a write torn inside a preallocated segment (a frame whose sync "
        f"never returned), see docs/failure-model.md, 'A write torn inside preallocated space'",
        file=filename, offset=problem.offset)


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

    def __init__(self, fs: OsFileSystem, directory: Directory, first_seq: int, size: int,
                 preallocate_bytes: int = 0, *, new: bool = False) -> None:
        self.fs = fs
        self.first_seq = first_seq
        self.filename = segment_name(first_seq)
        self.size = size            # bytes of complete frames
        self.preallocate_bytes = preallocate_bytes
        # The file's length as this segment left it: the frames, plus zeros
        # while preallocated (open truncates a longer file to `size` at once).
        self.allocated = size
        # A preallocating segment writes each frame at its offset (pwrite):
        # with O_APPEND it would land after the zeros.
        self.positioned = preallocate_bytes > 0
        # A new segment is created (it must not exist yet); the newest one
        # found at open must exist.
        if self.positioned:
            self.fd = fs.open_write(directory, self.filename, new=new)
        else:
            self.fd = fs.open_append(directory, self.filename, new=new)
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
