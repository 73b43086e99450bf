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

`check_directory_safety(path)` lists what lets another user change a queue
directory (ownership, group/other write bits, up the parent chain).
"""

from __future__ import annotations

import errno
import mmap
import os
import stat
from dataclasses import dataclass

from .errors import CorruptStore

FILE_MODE = 0o640       # no world access; the group may read (backups, verify)
DIRECTORY_MODE = 0o750
# posix_fallocate's answers for "this file system cannot preallocate".
_CANNOT_PREALLOCATE = frozenset({errno.EOPNOTSUPP, errno.ENOTSUP, errno.EINVAL})
_FLAGS = os.O_NOFOLLOW | os.O_CLOEXEC
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


@dataclass(frozen=True)
class Directory:
    """An open queue directory: its path (for messages) and the descriptor files are opened by."""

    path: str
    fd: int


def open_directory(path: str) -> Directory:
    """Open a directory to name files relative to it.

    A symbolic link as the directory's own path is followed: whoever chose
    the path chose where it leads. Raises FileNotFoundError or
    NotADirectoryError.
    """
    return Directory(path, os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC))


def open_at(directory: Directory, name: str, flags: int, mode: int = FILE_MODE) -> int:
    """os.open of `name` in `directory`, never following a symbolic link.

    Raises CorruptStore naming the file if it is a link (or, for writing, a
    file with other hard links); OSError otherwise.
    """
    try:
        fd = os.open(name, flags | _FLAGS, mode, dir_fd=directory.fd)
    except OSError as error:
        # O_NOFOLLOW answers a link with ELOOP; O_CREAT | O_EXCL with EEXIST.
        if error.errno in (errno.ELOOP, errno.EEXIST, errno.EMLINK) and _is_link(directory, name):
            raise _link_error(directory, name) from None
        raise
    if flags & (os.O_WRONLY | os.O_RDWR):
        try:
            links = os.fstat(fd).st_nlink
        except BaseException:
            os.close(fd)
            raise
        if links > 1:
            os.close(fd)
            raise CorruptStore(f"{name}: has {links} hard links, so writing it would change "
                               f"another file too; the library writes only files of its own in "
                               f"{directory.path}: remove the other links", file=name)
    return fd


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


def open_lock(path: str, name: str) -> int:
    """Open (creating if needed) the lock file `name` in the real directory `path`, never through a link."""
    directory = open_directory(path)
    try:
        return open_at(directory, name, os.O_RDWR | os.O_CREAT)
    finally:
        os.close(directory.fd)


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

    def makedirs(self, path: str) -> bool:
        """Create the directory (and parents) if missing; True if it was created."""
        if os.path.isdir(path):
            return False
        os.makedirs(path, mode=DIRECTORY_MODE, exist_ok=True)
        return True

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


def check_directory_safety(path: str | os.PathLike) -> list[str]:
    """What would let another user change the queue directory at `path`; [] if nothing.

    One sentence per finding, saying what to chown or chmod. The directory
    must be owned by the effective user and writable by no group or other
    user; so must its parents, up to and including the first one owned by
    root, except that a parent may be root's, and a root-owned parent
    writable by others is safe with the sticky bit (like /tmp: others
    cannot rename or remove what is not theirs). Write access for a group
    is harmless when that group is its owner's private group (umask 002
    systems: the owner's primary group, named like the owner, with no other
    members). A symbolic link in the path is resolved first: the
    directories checked are the real ones. Raises OSError if `path` cannot
    be examined.
    """
    user = os.geteuid()
    directory = os.path.realpath(os.fspath(path))
    info = os.stat(directory)
    findings = []
    if info.st_uid != user:
        findings.append(f"{directory} is owned by {_user_name(info.st_uid)}, not by "
                        f"{_user_name(user)} who opens it, so its owner can plant files and links "
                        f"in it: chown {_login(user)} {directory}")
    if _writable_by_others(info):
        findings.append(f"{directory} is writable by {_writers(info.st_mode)} (mode "
                        f"{stat.S_IMODE(info.st_mode):04o}), who can plant files and links in it: "
                        f"chmod go-w {directory}")
    parent = directory
    while parent != os.path.dirname(parent):
        parent = os.path.dirname(parent)
        info = os.stat(parent)
        if info.st_uid not in (0, user):
            findings.append(f"{parent}, a parent of {directory}, is owned by "
                            f"{_user_name(info.st_uid)}, who could move the queue directory "
                            f"away and put another in its place: use a directory whose parents "
                            f"belong to root or {_user_name(user)}")
        elif _writable_by_others(info) and not (info.st_uid == 0 and info.st_mode & stat.S_ISVTX):
            findings.append(f"{parent}, a parent of {directory}, is writable by "
                            f"{_writers(info.st_mode)} (mode {stat.S_IMODE(info.st_mode):04o}), "
                            f"who could move the queue directory away and put another in its "
                            f"place: chmod go-w {parent}")
        if info.st_uid == 0:
            break
    return findings


def _writable_by_others(info: os.stat_result) -> bool:
    """Writable by a user other than the owner: by others, or by a group that is not private."""
    if info.st_mode & stat.S_IWOTH:
        return True
    return bool(info.st_mode & stat.S_IWGRP) and not _private_group(info.st_uid, info.st_gid)


def _private_group(uid: int, gid: int) -> bool:
    """True if `gid` is the user private group of `uid` (its primary group, its name, no members)."""
    import grp  # Unix only, as below
    import pwd
    try:
        user, group = pwd.getpwuid(uid), grp.getgrgid(gid)
    except KeyError:
        return False
    return user.pw_gid == gid and group.gr_name == user.pw_name and not set(group.gr_mem) - {user.pw_name}


def _writers(mode: int) -> str:
    both = mode & stat.S_IWGRP and mode & stat.S_IWOTH
    return "its group and others" if both else "its group" if mode & stat.S_IWGRP else "others"


def _user_name(uid: int) -> str:
    login = _login(uid)
    return f"uid {uid}" if login == str(uid) else f"{login} (uid {uid})"


def _login(uid: int) -> str:
    """The user's login name, or the uid as text when it has none."""
    import pwd  # Unix only, like the rest of the library (fcntl, O_NOFOLLOW)
    try:
        return pwd.getpwuid(uid).pw_name
    except KeyError:
        return str(uid)
