"""The few file-system calls the library makes, behind one seam.

Everything that touches the queue directory's files goes through a
`FileSystem`, so tests can substitute a simulated disk that forgets unsynced
writes on a "power loss" (tests/simdisk.py keeps to the same calls).
`OsFileSystem` is the real one. The directory lock is not part of the seam:
it is a property of the live process, not of the bytes on disk (`open_lock`
opens it the same careful way).

Files are named relative to a `Directory`, opened once (`open_directory`):
every file in it is opened through that descriptor (`os.open(name, ...,
dir_fd=...)`), so renaming a directory on the path mid-run cannot redirect
the library's writes, and with O_NOFOLLOW, so a symbolic link planted in the
directory is never followed: it raises CorruptStore naming the file, and
nothing is read or written through it. A file the library creates is
created with O_EXCL, so it is always a new file of its own: a new segment
must not exist yet, and CURRENT.tmp and snapshot files (which a crash may
leave behind) are unlinked first. A file opened for writing that has other
hard links is refused the same way.

A Queue reaches its directory once, as a descriptor, through
walqueue.directory_safety, which also judges who else could change it.
Files opened in it must belong to the directory's owner, and be regular
files: a FIFO or a directory under a name the queue uses is refused with
NotARegularFile instead of blocking or failing halfway.
"""

from __future__ import annotations

import errno
import mmap
import os
import stat

from .directory import PARENTS, Directory, OpenedDirectory, open_queue_directory
from .errors import CorruptStore

FILE_MODE = 0o640       # no world access; the group may read (backups, verify)
# posix_fallocate's answers for "this file system cannot preallocate".
_CANNOT_PREALLOCATE = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL})
_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NONBLOCK
# A reader of a mapped file hands the pages it has read back every this many
# bytes, so that reading a file does not add the whole file to the peak RSS.
RELEASE_BYTES = 4 << 20


# A file of more holes than this is told as one range of data from its last hole on.
MAX_DATA_RANGES = 1024


class MappedFile(mmap.mmap):
    """A file mapped read-only, and where its data is: `data_ranges`, (start, end) pairs in
    order; every byte outside them is in a hole and reads as zero.

    So the check that a tail is all zeros (codec) reads only the ranges that
    hold data: a segment extended sparsely to 1 TiB is judged without
    reading a terabyte of zero pages.
    """

    data_ranges: tuple[tuple[int, int], ...]


def read_descriptor(fd: int):
    """The whole file open on `fd`, memory-mapped (b"" when empty); closes `fd`."""
    try:
        size = os.fstat(fd).st_size
        if size == 0:
            return b""
        mapped = MappedFile(fd, size, access=mmap.ACCESS_READ)
        mapped.data_ranges = _data_ranges(fd, size)
        return mapped
    finally:
        os.close(fd)


def _data_ranges(fd: int, size: int) -> tuple[tuple[int, int], ...]:
    """Where the file on `fd` holds data (lseek SEEK_DATA/SEEK_HOLE); all of it if the file
    system cannot say."""
    ranges: list[tuple[int, int]] = []
    offset = 0
    try:
        while offset < size and len(ranges) < MAX_DATA_RANGES:
            try:
                start = os.lseek(fd, offset, os.SEEK_DATA)
            except OSError as error:
                if error.errno == errno.ENXIO:   # nothing but a hole from `offset` on
                    return tuple(ranges)
                raise
            offset = min(os.lseek(fd, start, os.SEEK_HOLE), size)
            ranges.append((start, offset))
    except OSError:
        return ((0, size),)
    if offset < size:
        ranges.append((offset, size))
    return tuple(ranges)


class NotARegularFile(OSError):
    """A name the queue uses is a directory, a FIFO, a socket or a device, not a file.

    An OSError (errno EISDIR for a directory, EINVAL otherwise): the
    directory is unusable until an operator removes the entry, whatever the
    bytes of the other files say.
    """


def open_directory(path: str) -> Directory:
    """Open a directory to name files relative to it, for reading only (verify, backup).

    A symbolic link as the directory's own path is followed: whoever chose
    the path chose where it leads. A Queue reaches its directory through
    walqueue.directory_safety instead. Raises FileNotFoundError or
    NotADirectoryError.
    """
    return Directory(path, os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))


def open_at(directory: Directory, name: str, flags: int, mode: int = FILE_MODE) -> int:
    """os.open of `name` in `directory`, never following a symbolic link, never blocking.

    Raises CorruptStore naming the file if it is a link, for writing a file
    with other hard links, or a file not owned by `directory.owner`;
    NotARegularFile if it is not a regular file (a FIFO is opened without
    waiting for a writer, then refused); OSError otherwise.
    """
    try:
        fd = os.open(name, flags | _FLAGS, mode, dir_fd=directory.fd)
    except OSError as error:
        # O_NOFOLLOW answers a link with ELOOP; O_CREAT | O_EXCL with EEXIST.
        if error.errno in (errno.ELOOP, errno.EEXIST, errno.EMLINK) and _is_link(directory, name):
            raise _link_error(directory, name) from None
        if error.errno == errno.EISDIR:
            raise _wrong_type(directory, name, stat.S_IFDIR) from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise _wrong_type(directory, name, stat.S_IFMT(info.st_mode))
        if directory.owner is not None and info.st_uid != directory.owner:
            raise CorruptStore(f"{name}: is owned by uid {info.st_uid}, not by uid "
                               f"{directory.owner} who owns the queue directory {directory.path}, "
                               f"so its owner may still read or change it; nothing was read or "
                               f"written through it: remove it (or chown it, if it is the "
                               f"queue's own)", file=name)
        if flags & (os.O_WRONLY | os.O_RDWR) and info.st_nlink > 1:
            raise CorruptStore(f"{name}: has {info.st_nlink} hard links, so writing it would "
                               f"change another file too; the library writes only files of its "
                               f"own in {directory.path}: remove the other links", file=name)
    except BaseException:
        os.close(fd)
        raise
    return fd


_TYPE_NAMES = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO", stat.S_IFSOCK: "a socket",
               stat.S_IFCHR: "a character device", stat.S_IFBLK: "a block device"}


def _wrong_type(directory: Directory, name: str, kind: int) -> NotARegularFile:
    number = errno.EISDIR if kind == stat.S_IFDIR else errno.EINVAL
    return NotARegularFile(number, f"{name} is {_TYPE_NAMES.get(kind, 'not a regular file')}, "
                                   f"not a file; the queue directory {directory.path} holds only "
                                   f"files under the names it uses: remove it", name)


def _is_link(directory: Directory, name: str) -> bool:
    try:
        return stat.S_ISLNK(os.stat(name, dir_fd=directory.fd, follow_symlinks=False).st_mode)
    except OSError:
        return False


def _link_error(directory: Directory, name: str) -> CorruptStore:
    try:
        target = repr(os.readlink(name, dir_fd=directory.fd))
    except OSError:
        target = "somewhere"
    return CorruptStore(f"{name}: is a symbolic link (to {target}); the library never follows a "
                        f"link in the queue directory {directory.path}, so nothing was read or "
                        f"written through it: remove the link and find out who made it", file=name)


def open_lock(directory: Directory | str, name: str) -> int:
    """Open (creating if needed) the lock file `name` in `directory`, never through a link.

    `directory` is an open Directory, or the path of a real one (the
    simulated disk of the tests names directories by path).
    """
    if isinstance(directory, Directory):
        return open_at(directory, name, os.O_RDWR | os.O_CREAT)
    opened = open_directory(directory)
    try:
        return open_at(opened, name, os.O_RDWR | os.O_CREAT)
    finally:
        os.close(opened.fd)


def release_pages(data, released: int, offset: int) -> int:
    """Drop the pages of `data` (what a `read` returned) from `released` to before `offset`
    from this process's memory, once they are RELEASE_BYTES; returns where the kept pages start.

    They are clean pages of a read-only mapping: the page cache keeps them,
    and touching them again reads them back. Other buffers are left alone.
    """
    if offset - released < RELEASE_BYTES or not isinstance(data, mmap.mmap):
        return released
    stop = offset - offset % mmap.PAGESIZE
    data.madvise(mmap.MADV_DONTNEED, released, stop - released)
    return stop


class ReadingFileSystem:
    """The calls that only read, on the real file system: all that recovery's reading needs."""

    def open_directory(self, path: str) -> Directory:
        return open_directory(path)

    def close_directory(self, directory: Directory) -> None:
        os.close(directory.fd)

    def listdir(self, directory: Directory) -> list[str]:
        return os.listdir(directory.fd)

    def size(self, directory: Directory, name: str) -> int:
        """The file's length in bytes (of a link: the link's own, never its target's)."""
        return os.stat(name, dir_fd=directory.fd, follow_symlinks=False).st_size

    def read(self, directory: Directory, name: str):
        """The whole file as a bytes-like object (memory-mapped when non-empty)."""
        return read_descriptor(open_at(directory, name, os.O_RDONLY))


class OsFileSystem(ReadingFileSystem):
    """File operations on the real file system, with short writes handled."""

    def open_queue_directory(self, path: str) -> OpenedDirectory:
        """Reach the queue directory once, creating it and its parents if missing (SPEC §1)."""
        return open_queue_directory(path, create=PARENTS)

    def duplicate_directory(self, directory: Directory) -> Directory:
        """The same directory on a descriptor of its own, for a Queue reopened on it."""
        return Directory(directory.path, os.dup(directory.fd), directory.owner)

    def open_append(self, directory: Directory, name: str, *, new: bool = False) -> int:
        """Open a file for appending (`new`: create it, and it must not exist); returns a descriptor."""
        return open_at(directory, name, os.O_WRONLY | os.O_APPEND | _creating(new))

    def open_write(self, directory: Directory, name: str, *, new: bool = False) -> int:
        """Open a file for writing at chosen offsets (`new` as for open_append); returns a descriptor."""
        return open_at(directory, name, os.O_WRONLY | _creating(new))

    def create(self, directory: Directory, name: str) -> int:
        """A new empty file `name`, for writing, in place of whatever had that name; returns a descriptor.

        For files a crash may leave behind (CURRENT.tmp, an orphan snapshot):
        the old name is unlinked, never followed, and the new file made with
        O_EXCL, so it is the library's own.
        """
        try:
            os.unlink(name, dir_fd=directory.fd)
        except FileNotFoundError:
            pass
        return open_at(directory, name, os.O_WRONLY | _creating(True))

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

    def rename(self, directory: Directory, source: str, target: str) -> None:
        """Rename within the directory, replacing `target` (a link is replaced, never followed)."""
        os.replace(source, target, src_dir_fd=directory.fd, dst_dir_fd=directory.fd)

    def unlink(self, directory: Directory, name: str) -> None:
        os.unlink(name, dir_fd=directory.fd)

    def fsync_directory(self, directory: Directory) -> None:
        os.fsync(directory.fd)


def _creating(new: bool) -> int:
    # Never O_CREAT without O_EXCL: a file the library creates is a new one.
    return os.O_CREAT | os.O_EXCL if new else 0
