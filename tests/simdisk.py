"""A simulated disk for power-loss tests, behind the library's FileSystem seam.

A process kill leaves everything the process wrote in the page cache, so it
cannot catch a missing fsync. This disk keeps two images:

  - the *volatile* one, what the running process sees (every write, rename
    and unlink at once), and
  - the *durable* one, what a power cut leaves: a file's bytes as of its last
    fsync, and a directory's entries as of its last fsync.

`power_loss(rng)` replaces the volatile image by the durable one plus a
seeded choice of each file's unsynced operations: none, a prefix of them, or
a prefix and then one write torn part-way (its first bytes, or zeros of its
length, as a file extended past its last synced write reads). That is the
model of POSIX durability the library relies on (file data needs fsync or
fdatasync of the file; a name created, renamed or removed needs fsync of its
directory).

Preallocation (`allocate`, posix_fallocate) is an operation like a write: a
power cut may keep it or not, and the file reads as zeros past whatever
survived. A write into an allocated region that was not synced is kept,
lost (its bytes read back as the zeros that were there), or torn: its first
bytes and then zeros -- the non-zero prefix followed by zeros that SPEC §5
cannot tell from damage (docs/failure-model.md). `tear="zeros"` limits
tears to zeros, as ext4's unwritten extents behave for a frame inside one
fresh extent; the default also tears into a prefix.

`skip` removes one fsync from the library without copying its code: an
fsync (or directory fsync) called from a function of that name does nothing.

A directory is named by its path (`open_directory` returns it). Like the
real seam, creating a file that exists (`new=True`, what O_EXCL refuses) or
opening a missing one for writing raises, and `create` unlinks the old name
first. Symbolic links are not simulated: tests/unit/test_links.py shows the
real seam refusing them.

The directory lock is not simulated: Queue takes it on the real directory.
"""

from __future__ import annotations

import errno
import os
import random
import sys
from dataclasses import dataclass, field

from walqueue.directory import OpenedDirectory


@dataclass
class Inode:
    content: bytearray = field(default_factory=bytearray)
    synced: bytes = b""
    # ("write", offset, bytes) | ("truncate", size) | ("allocate", end)
    pending: list = field(default_factory=list)


class SimFileSystem:
    def __init__(self, skip: tuple[str, str] | None = None, *, can_allocate: bool = True,
                 allocate_error: int | None = None) -> None:
        self.can_allocate = can_allocate      # False: allocate answers "not supported"
        self.allocate_error = allocate_error  # an errno allocate raises (e.g. ENOSPC)
        self.allocations = 0
        self.volatile: dict[str, dict[str, Inode]] = {}   # directory -> name -> inode
        self.durable: dict[str, dict[str, Inode]] = {}
        self.fds: dict[int, tuple[Inode, bool]] = {}       # fd -> (inode, append)
        self.next_fd = 1000
        self.skip = skip          # (caller function name, "fsync" | "fdatasync" | "fsync_directory")
        self.skipped = 0          # how many fsyncs `skip` swallowed
        self.fsyncs = 0

    # -- the FileSystem seam ----------------------------------------------

    def makedirs(self, path: str) -> bool:
        os.makedirs(path, exist_ok=True)  # the real one holds the LOCK file
        created = path not in self.volatile
        self.volatile.setdefault(path, {})
        self.durable.setdefault(path, {})
        return created

    def open_queue_directory(self, path: str) -> OpenedDirectory:
        # The simulation names a directory by its path, and judges nothing.
        created = self.makedirs(path)
        return OpenedDirectory(path, (), created)

    def duplicate_directory(self, directory: str) -> str:
        return directory

    def open_directory(self, path: str) -> str:
        # A directory is named by its path; a parent outside the simulation
        # is already durable (fsync_directory ignores it).
        return path

    def close_directory(self, directory: str) -> None:
        pass

    def listdir(self, directory: str) -> list[str]:
        return list(self.volatile[directory])

    def size(self, directory: str, name: str) -> int:
        return len(self._inode(directory, name).content)

    def read(self, directory: str, name: str) -> bytes:
        return bytes(self._inode(directory, name).content)

    def open_append(self, directory: str, name: str, *, new: bool = False) -> int:
        return self._open(directory, name, append=True, new=new)

    def open_write(self, directory: str, name: str, *, new: bool = False) -> int:
        return self._open(directory, name, append=False, new=new)

    def create(self, directory: str, name: str) -> int:
        # As the real one: unlink the old name, then make a new file (O_EXCL).
        self.volatile[directory].pop(name, None)
        return self._open(directory, name, append=False, new=True)

    def write(self, fd: int, data: bytes) -> None:
        inode, _ = self.fds[fd]
        offset = len(inode.content)  # the library only appends, or writes a fresh file
        inode.content += data
        inode.pending.append(("write", offset, bytes(data)))

    def pwrite(self, fd: int, data: bytes, offset: int) -> None:
        inode, _ = self.fds[fd]
        _apply(inode.content, ("write", offset, bytes(data)))
        inode.pending.append(("write", offset, bytes(data)))

    def allocate(self, fd: int, offset: int, length: int) -> bool:
        if self.allocate_error is not None:
            raise OSError(self.allocate_error, os.strerror(self.allocate_error))
        if not self.can_allocate:
            return False
        self.allocations += 1
        inode, _ = self.fds[fd]
        end = offset + length
        if end > len(inode.content):
            _apply(inode.content, ("allocate", end))
            inode.pending.append(("allocate", end))
        return True

    def fsync(self, fd: int) -> None:
        if self._skipped("fsync"):
            return
        self._sync(fd)

    def fdatasync(self, fd: int) -> None:
        if self._skipped("fdatasync"):
            return
        self._sync(fd)

    def _sync(self, fd: int) -> None:
        # The simulated file has no metadata apart from its size, which
        # fdatasync makes durable too (the size is needed to read the data).
        self.fsyncs += 1
        inode, _ = self.fds[fd]
        inode.synced = bytes(inode.content)
        inode.pending.clear()

    def close(self, fd: int) -> None:
        # After power_loss() the dying process may still close what it held.
        self.fds.pop(fd, None)

    def truncate(self, fd: int, size: int) -> None:
        inode, _ = self.fds[fd]
        del inode.content[size:]
        inode.pending.append(("truncate", size))

    def rename(self, directory: str, source: str, target: str) -> None:
        entries = self.volatile[directory]
        entries[target] = entries.pop(source)

    def unlink(self, directory: str, name: str) -> None:
        if name not in self.volatile[directory]:
            raise FileNotFoundError(errno.ENOENT, "no such file", os.path.join(directory, name))
        del self.volatile[directory][name]

    def fsync_directory(self, directory: str) -> None:
        if self._skipped("fsync_directory"):
            return
        self.fsyncs += 1
        if directory in self.volatile:  # a parent outside the simulation is already durable
            self.durable[directory] = dict(self.volatile[directory])

    # -- power ----------------------------------------------------------

    def power_loss(self, rng: random.Random | None, *, tear: str = "prefix") -> None:
        """Lose everything not durable, keeping a seeded choice of unsynced writes.

        `rng` None keeps no unsynced operation at all. `tear` is "prefix"
        (a torn write keeps its first bytes or zeros) or "zeros" (only zeros).
        """
        self.fds.clear()
        survivors: dict[int, Inode] = {}
        for directory, entries in self.durable.items():
            self.volatile[directory] = {}
            for name, inode in entries.items():
                if id(inode) not in survivors:
                    survivors[id(inode)] = _after_power_loss(inode, rng, tear)
                self.volatile[directory][name] = survivors[id(inode)]
            self.durable[directory] = dict(self.volatile[directory])

    def durable_image(self, directory: str) -> dict[str, bytes]:
        """What a power cut now would certainly leave: synced bytes of durable names."""
        return {name: inode.synced for name, inode in self.durable[directory].items()}

    def volatile_image(self, directory: str) -> dict[str, bytes]:
        return {name: bytes(inode.content) for name, inode in self.volatile[directory].items()}

    # -- internals --------------------------------------------------------

    def _inode(self, directory: str, name: str) -> Inode:
        try:
            return self.volatile[directory][name]
        except KeyError:
            raise FileNotFoundError(errno.ENOENT, "no such file",
                                    os.path.join(directory, name)) from None

    def _open(self, directory: str, name: str, *, append: bool, new: bool) -> int:
        # The library never creates a file without O_EXCL, nor opens one it
        # did not find: keep those rules, so the simulation cannot hide a
        # breach of them.
        entries = self.volatile[directory]
        inode = entries.get(name)
        if new:
            if inode is not None:
                raise FileExistsError(errno.EEXIST, "file exists", os.path.join(directory, name))
            inode = entries[name] = Inode()
        elif inode is None:
            raise FileNotFoundError(errno.ENOENT, "no such file", os.path.join(directory, name))
        self.next_fd += 1
        self.fds[self.next_fd] = (inode, append)
        return self.next_fd

    def _skipped(self, kind: str) -> bool:
        if self.skip is None or self.skip[1] != kind:
            return False
        caller = sys._getframe(2).f_code.co_name
        if caller == self.skip[0]:
            self.skipped += 1
            return True
        return False


def _after_power_loss(inode: Inode, rng: random.Random | None, tear: str) -> Inode:
    content = bytearray(inode.synced)
    if rng is None:
        return Inode(content=content, synced=bytes(content))
    operations = inode.pending
    kept = rng.randint(0, len(operations))
    for operation in operations[:kept]:
        _apply(content, operation)
    if kept < len(operations) and operations[kept][0] == "write" and rng.random() < 0.5:
        _, offset, data = operations[kept]
        cut = rng.randint(1, len(data))
        torn = data[:cut] if tear == "prefix" and rng.random() < 0.5 else bytes(cut)
        _apply(content, ("write", offset, torn))
    return Inode(content=content, synced=bytes(content))


def _apply(content: bytearray, operation) -> None:
    if operation[0] == "truncate":
        del content[operation[1]:]
        return
    if operation[0] == "allocate":
        if len(content) < operation[1]:
            content += bytes(operation[1] - len(content))
        return
    _, offset, data = operation
    if len(content) < offset:
        content += bytes(offset - len(content))
    content[offset:offset + len(data)] = data
