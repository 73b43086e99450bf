"""The few file-system calls the library makes, behind one seam.

Everything that touches the queue directory's files goes through a
`FileSystem`, so tests can substitute a simulated disk that forgets unsynced
writes on a "power loss". `OsFileSystem` is the real one. The directory lock
is not part of the seam: it is a property of the live process, not of the
bytes on disk.
"""

from __future__ import annotations

import errno
import mmap
import os

FILE_MODE = 0o640       # no world access; the group may read (backups, verify)
DIRECTORY_MODE = 0o750
# posix_fallocate's answers for "this file system cannot preallocate".
_CANNOT_PREALLOCATE = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL})
# A reader of a mapped file hands the pages it has read back every this many
# bytes, so that reading a file does not add the whole file to the peak RSS.
RELEASE_BYTES = 4 << 20


def read_descriptor(fd: int):
    """The whole file open on `fd`, memory-mapped (b"" when empty); closes `fd`."""
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return b""
        return mmap.mmap(fd, size, access=mmap.ACCESS_READ)
    finally:
        os.close(fd)


def release_pages(data, released: int, offset: int) -> int:
    """Drop the pages of `data` (a read()) from `released` to before `offset` from this
    process's memory, once they are RELEASE_BYTES; returns where the kept pages start.

    They are clean pages of a read-only mapping: the page cache keeps them,
    and touching them again reads them back. Other buffers are left alone.
    """
    if offset - released < RELEASE_BYTES or not isinstance(data, mmap.mmap):
        return released
    stop = offset - offset % mmap.PAGESIZE
    data.madvise(mmap.MADV_DONTNEED, released, stop - released)
    return stop


class OsFileSystem:
    """File operations on the real file system, with short writes handled."""

    def makedirs(self, path: str) -> bool:
        """Create the directory (and parents) if missing; True if it was created."""
        if os.path.isdir(path):
            return False
        os.makedirs(path, mode=DIRECTORY_MODE, exist_ok=True)
        return True

    def listdir(self, path: str) -> list[str]:
        return os.listdir(path)

    def size(self, path: str) -> int:
        """The file's length in bytes."""
        return os.stat(path).st_size

    def read(self, path: str):
        """The whole file as a bytes-like object (memory-mapped when non-empty)."""
        return read_descriptor(os.open(path, os.O_RDONLY | os.O_CLOEXEC))

    def open_append(self, path: str) -> int:
        """Open (creating if needed) a file for appending; returns a descriptor."""
        return os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)

    def open_write(self, path: str) -> int:
        """Open (creating if needed) a file for writing at chosen offsets; returns a descriptor."""
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC, FILE_MODE)

    def create(self, path: str) -> int:
        """Create or truncate a file for writing; returns a descriptor."""
        return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)

    def write(self, fd: int, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(fd, view)
            view = view[written:]

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        view = memoryview(data)
        while view:
            written = os.pwrite(fd, view, offset)
            view = view[written:]
            offset += written

    def allocate(self, fd: int, offset: int, length: int) -> bool:
        """Reserve disk blocks for [offset, offset + length), extending the file with zeros.

        Returns False, changing nothing, when the file system cannot
        preallocate; raises OSError for anything else (ENOSPC above all).
        """
        try:
            os.posix_fallocate(fd, offset, length)
        except OSError as error:
            if error.errno in _CANNOT_PREALLOCATE:
                return False
            raise
        return True

    def fsync(self, fd: int) -> None:
        os.fsync(fd)

    def fdatasync(self, fd: int) -> None:
        """Make the file's data durable, with the metadata needed to read it back (its size)."""
        os.fdatasync(fd)

    def close(self, fd: int) -> None:
        os.close(fd)

    def truncate(self, fd: int, size: int) -> None:
        os.ftruncate(fd, size)

    def rename(self, source: str, target: str) -> None:
        os.replace(source, target)

    def unlink(self, path: str) -> None:
        os.unlink(path)

    def fsync_directory(self, path: str) -> None:
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
