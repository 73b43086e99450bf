"""Deleting a big file without stopping the loop: its name goes at once, its blocks a step per turn.

A compaction ends by deleting the segments the new snapshot covers and the
previous snapshot (SPEC §5) — hundreds of MB each once the history is long.
Unlinking such a file frees all its blocks in the call: on the development
VM (ext4 mounted with `discard`) a 300 MB unlink took 170-225 ms, and a WAL
fsync of another thread waited as long. So walqueued's Queue runs on
`FreeingInSteps`, whose `unlink` opens the file, removes its name (under
1 ms: the directory entry only) and keeps the descriptor; the loop then calls
`free_step()` once per turn, which shrinks one such file by STEP_BYTES
(ftruncate; ~10 ms for 8 MiB there) and closes it once it is empty.

Nothing on disk differs: the name is gone when `unlink` returns, so the
directory fsync and the compact.after_delete phase mean what SPEC §6 says. A
file being freed has no name; if the daemon dies, the kernel frees the rest
when the process's descriptors close.
"""

from __future__ import annotations

import os

from ..errors import CorruptStore
from ..fs import Directory, OsFileSystem, open_at
from .log import log

STEP_BYTES = 8 << 20


class FreeingInSteps(OsFileSystem):
    """OsFileSystem whose unlink of a file above `step_bytes` frees its blocks in `free_step` calls."""

    def __init__(self, step_bytes: int = STEP_BYTES) -> None:
        self.step_bytes = step_bytes
        self._freeing: list[int] = []  # descriptors of unlinked files, oldest first

    @property
    def freeing(self) -> bool:
        """True while some unlinked file still holds blocks: the loop should turn again soon."""
        return bool(self._freeing)

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
        if big:
            self._freeing.append(fd)
        else:
            os.close(fd)

    def free_step(self) -> None:
        """Shrink the oldest unlinked file by one step; close it once it is empty."""
        if not self._freeing:
            return
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
