"""Deleting a big file without stalling the loop: its name goes at once, its blocks slowly.

A compaction ends by deleting the segments the new snapshot covers and the
previous snapshot (SPEC §5) — gigabytes once the history is long. Freeing
that many blocks stalls the WAL fsyncs beside it: on the development VM
(ext4 mounted with `discard`) a 300 MB unlink took 170-225 ms and a WAL
fsync in another thread waited as long; freeing 2 GB 8 MiB per loop turn
(as fast as the loop turns) still made a WAL fsync wait 100-230 ms about
every 2 s while it lasted in some runs, and 1 MiB every 25 ms (40 MiB/s)
up to 90 ms; at 16 MiB/s the worst was 48 ms (`scripts/probe_snapshot_io.py`; the 40 s
baseline without freeing: none over 20 ms). So walqueued's Engine runs on
`FreeingInSteps`, whose `unlink` opens the file, removes its name (under
1 ms: the directory entry only) and keeps the descriptor; the loop calls
`free_step(now)` each turn, which shrinks the oldest such file by
STEP_BYTES (ftruncate) if the pace allows, and closes it once it is empty.
The pace is BYTES_PER_SECOND for each file waiting, so a backlog (a
compaction deleting before the last one's files are freed) is freed faster
instead of growing.

At most MAX_FILES_BEING_FREED files wait at once: a further `unlink` frees
the oldest one's remaining blocks at once (closing it; a stall of the old
kind, logged) before it keeps the new one. So the descriptors and the hidden
space they hold stay bounded whatever deletes how often (once 120
back-to-back requested compactions, while the freeing waited for their
children, left 103 deleted files open, 1.1 GiB that `du` did not show, and
the next fork failed with EMFILE). The loop frees beside a snapshot child
too; the compactor keeps an automatic compaction from starting while files
wait.

Nothing on disk differs: the name is gone when `unlink` returns, so the
directory fsync and the compact.after_delete phase mean what SPEC §6 says.
What differs is when the space comes back: a 3 GB snapshot is freed over
about three minutes (docs/operations.md counts it). A file being freed has
no name; if the daemon dies, the kernel frees the rest when the process's
descriptors close, at once.
"""

from __future__ import annotations

import os

from ..errors import CorruptStore
from ..fs import Directory, OsFileSystem, open_at
from .log import log

STEP_BYTES = 1 << 20
BYTES_PER_SECOND = 16 << 20   # for each file waiting to be freed
# Deleted files held open at once (descriptors the daemon reserves for them:
# walqueue.daemon.cli.RESERVED_DESCRIPTORS). A compaction deletes its covered
# segments and the previous snapshot: usually two.
MAX_FILES_BEING_FREED = 8


class FreeingInSteps(OsFileSystem):
    """OsFileSystem whose unlink of a file above `step_bytes` frees its blocks in paced `free_step` calls."""

    def __init__(self, step_bytes: int = STEP_BYTES, bytes_per_second: float = BYTES_PER_SECOND,
                 max_files: int = MAX_FILES_BEING_FREED) -> None:
        self.step_bytes = step_bytes
        self.bytes_per_second = bytes_per_second
        self.max_files = max_files
        self.freed_at_once = 0  # files freed at once because max_files were waiting
        self._freeing: list[int] = []  # descriptors of unlinked files, oldest first
        self._next_step_at = 0.0       # monotonic seconds

    @property
    def freeing(self) -> bool:
        """True while some unlinked file still holds blocks."""
        return bool(self._freeing)

    def seconds_to_next_step(self, now: float) -> float | None:
        """How long the loop may sleep before free_step has work (None: no file waits)."""
        if not self._freeing:
            return None
        return max(0.0, self._next_step_at - now)

    @property
    def files(self) -> int:
        """How many deleted files are held open, waiting to be freed (at most max_files)."""
        return len(self._freeing)

    def pending_bytes(self) -> int:
        """The bytes deleted files still hold."""
        return sum(os.fstat(fd).st_size for fd in self._freeing)

    def unlink(self, directory: Directory, name: str) -> None:
        try:
            fd = open_at(directory, name, os.O_WRONLY)
        except (OSError, CorruptStore):  # not there, a link, another hard link: no stepping
            super().unlink(directory, name)  # raises what a plain unlink raises
            return
        try:
            big = os.fstat(fd).st_size > self.step_bytes
            super().unlink(directory, name)
        except BaseException:
            os.close(fd)
            raise
        if not big:
            os.close(fd)
            return
        if len(self._freeing) >= self.max_files:
            self._free_oldest_at_once()
        self._freeing.append(fd)

    def _free_oldest_at_once(self) -> None:
        oldest = self._freeing.pop(0)
        try:
            size = os.fstat(oldest).st_size
        finally:
            os.close(oldest)  # its last descriptor: the kernel frees the blocks now
        self.freed_at_once += 1
        log.warning("%d deleted files were waiting to be freed in steps, the most there may be: freed "
                    "the oldest one's %d bytes at once (%d so far)", self.max_files, size, self.freed_at_once)

    def free_step(self, now: float) -> None:
        """If the pace allows at `now` (monotonic seconds), shrink the oldest unlinked file by one step."""
        if not self._freeing or now < self._next_step_at:
            return
        self._next_step_at = now + self.step_bytes / (self.bytes_per_second * len(self._freeing))
        fd = self._freeing[0]
        try:
            size = max(0, os.fstat(fd).st_size - self.step_bytes)
            os.ftruncate(fd, size)
        except OSError as exc:  # the file has no name: closing frees what is left
            log.warning("freeing a deleted file in steps failed (%s); freeing the rest at once", exc)
            size = 0
        if size == 0:
            self._freeing.pop(0)
            os.close(fd)

    def close_all(self) -> None:
        """Free what is left at once (at shutdown)."""
        for fd in self._freeing:
            os.close(fd)
        self._freeing.clear()
