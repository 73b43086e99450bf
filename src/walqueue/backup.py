"""Consistent copies of a queue directory: `walqueue-ctl backup` and offline use.

A copy is made from a `BackupManifest` (`Queue.backup_manifest()`): the WAL
segments that follow the snapshot, the snapshot CURRENT names, and CURRENT,
each with the number of bytes to copy. walqueued answers a manifest and pins
those files (no compaction deletes them) while `walqueue-ctl` copies them;
with no daemon, `backup_directory()` opens the Queue itself and copies while
holding its lock.

`copy_manifest(manifest, dest)` copies in this order, each step named:

  1. check DEST: it must not exist, or be an empty directory (nothing is ever
     overwritten or merged), outside the queue directory;
  2. open every source file (an unreadable one fails here, before DEST is
     touched; an open file stays readable even if it is deleted meanwhile);
  3. create DEST (mode 0750) and fsync its parent, unless it existed; then
     create the marker BACKUP-INCOMPLETE in it, fsynced, so that whatever
     stops the copy (Ctrl-C, SIGKILL, a full disk) leaves a DEST that
     `verify` calls an incomplete backup rather than a corrupt queue;
  4. copy the WAL segments, oldest first, then the snapshot: each created
     with O_EXCL and mode 0640, exactly its manifest length copied (the
     active segment may have grown, or be preallocated with zeros, past it),
     then fsynced;
  5. CURRENT last: written to CURRENT.tmp, fsynced, renamed to CURRENT;
  6. remove the marker, then fsync DEST (a crash between 5 and 6 leaves a
     whole copy still marked: a false alarm, never a false all-clear).

Why this order: until step 5 DEST has no CURRENT while its first segment
starts after seq 1, so opening or verifying a copy that stopped half way
fails with a sequence gap (CorruptStore) instead of opening with fewer
records. (A queue that was never written has no CURRENT; its copy is one
empty segment, and a half copy of it is the same empty queue.) A failed copy
is not cleaned up: BackupIncomplete says so and DEST must be deleted. An
interrupted one (KeyboardInterrupt, i.e. Ctrl-C) removes what it wrote, and
DEST too if it created it, before the KeyboardInterrupt goes on; if that
cleanup is itself cut short, the marker stays.

Standard library only (this is the library layer).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass

from .directory import DIRECTORY_MODE
from .errors import WalQueueError
from .fs import FILE_MODE
from .queue import Queue
from .snapshot import CURRENT, CURRENT_TMP, is_snapshot_name
from .values import BackupManifest
from .verify import INCOMPLETE_BACKUP
from .wal import segment_first_seq

COPY_CHUNK_BYTES = 1024 * 1024


class BackupError(WalQueueError):
    """A backup could not be made; the message says what to do next."""


class DestinationNotEmpty(BackupError):
    """DEST exists and is not an empty directory; nothing was written."""


class SourceUnreadable(BackupError):
    """A file of the queue directory could not be opened; nothing was written."""


class BackupIncomplete(BackupError):
    """The copy stopped half way; DEST has no CURRENT and must be deleted."""


@dataclass(frozen=True)
class BackupResult:
    """What a finished copy holds: the queue's state as of `seq`."""

    directory: str
    seq: int
    files: int
    bytes: int

    def to_json(self) -> dict:
        return {"directory": self.directory, "seq": self.seq, "files": self.files,
                "bytes": self.bytes}


def copy_order(manifest: BackupManifest) -> list[tuple[str, int]]:
    """The manifest's files in the order they are copied: segments, snapshot, CURRENT.

    Raises BackupError for a manifest that cannot describe a queue directory
    (a name that is not a queue file, a negative length, a duplicate, WAL
    records without a snapshot), so a bad manifest writes nothing.
    """
    segments, snapshots, current = [], [], []
    seen = set()
    for entry in manifest.files:
        if (not isinstance(entry, tuple | list) or len(entry) != 2
                or not isinstance(entry[0], str) or type(entry[1]) is not int or entry[1] < 0):
            raise BackupError(f"manifest entry {entry!r:.100} is not a (file name, length >= 0) pair")
        name, length = entry
        if name in seen:
            raise BackupError(f"manifest lists {name!r} twice")
        seen.add(name)
        if name == CURRENT:
            current.append((name, length))
        elif is_snapshot_name(name):
            snapshots.append((name, length))
        elif _is_segment_name(name):
            segments.append((name, length))
        else:
            # Also keeps a copy from ever reading or writing outside the two directories.
            raise BackupError(f"manifest names {name!r:.100}, which is not a queue file")
    if len(snapshots) != len(current) or len(current) > 1:
        raise BackupError("a manifest lists CURRENT and the one snapshot it names, or neither")
    if not segments:
        raise BackupError("a manifest lists at least the active WAL segment")
    if not current and any(length for _, length in segments):
        raise BackupError("a manifest with WAL records needs a snapshot and CURRENT "
                          "(Queue.backup_manifest() compacts first when there is none)")
    return sorted(segments) + snapshots + current


def _is_segment_name(name: str) -> bool:
    try:
        return segment_first_seq(name) is not None
    except WalQueueError:
        return False


def check_destination(dest: str | os.PathLike) -> bool:
    """True if DEST must be created, False if it is an empty directory.

    Raises DestinationNotEmpty if it is anything else.
    """
    path = os.fspath(dest)
    try:
        entries = os.listdir(path)
    except FileNotFoundError:
        if os.path.lexists(path):  # a dangling symbolic link
            raise DestinationNotEmpty(f"{path} is a broken symbolic link; give a new or empty "
                                      f"directory") from None
        return True
    except NotADirectoryError:
        raise DestinationNotEmpty(f"{path} exists and is not a directory; give a new or "
                                  f"empty directory (a backup never overwrites)") from None
    if entries:
        shown = ", ".join(sorted(entries)[:3]) + (", ..." if len(entries) > 3 else "")
        raise DestinationNotEmpty(f"{path} is not empty ({shown}); give a new or empty "
                                  f"directory (a backup never overwrites or merges)")
    return False


def copy_manifest(manifest: BackupManifest, dest: str | os.PathLike) -> BackupResult:
    """Copy the manifest's files from manifest.directory into DEST (steps 1-6 above).

    Raises BackupError for a bad manifest or a DEST inside the queue
    directory, DestinationNotEmpty, or SourceUnreadable (nothing written in
    those cases), and BackupIncomplete (with the OSError as its cause) when
    the copy fails half way.
    """
    files = copy_order(manifest)
    dest = os.path.abspath(os.fspath(dest))
    source = os.path.realpath(manifest.directory)
    if os.path.commonpath([os.path.realpath(dest), source]) in (os.path.realpath(dest), source):
        # Inside the queue directory, a restore (which replaces that
        # directory) would delete the backup with it.
        raise BackupError(f"{dest} and the queue directory {source} contain one another; "
                          f"back up to a directory outside it")
    create = check_destination(dest)
    sources: dict[str, int] = {}
    try:
        for name, _ in files:
            path = os.path.join(manifest.directory, name)
            try:
                sources[name] = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
            except OSError as exc:
                raise SourceUnreadable(f"cannot read {path}: {exc.strerror or exc}") from exc
        created: list[str] = []
        try:
            copied = _copy_files(manifest.directory, files, sources, dest, create, created)
        except KeyboardInterrupt:
            _remove_partial(dest, created, create)
            raise
        except OSError as exc:
            raise BackupIncomplete(
                f"copying into {dest} failed: {exc}. {dest} is incomplete (it has no "
                f"{CURRENT}, so it will not open as a queue): delete it and back up again"
            ) from exc
    finally:
        for fd in sources.values():
            os.close(fd)
    return BackupResult(dest, manifest.seq, len(files), copied)


def _copy_files(source_dir: str, files: list[tuple[str, int]], sources: dict[str, int],
                dest: str, create: bool, created: list[str]) -> int:
    """Steps 3-6; `created` gets the name of each file in DEST as it is created."""
    if create:
        os.mkdir(dest, DIRECTORY_MODE)
        os.chmod(dest, DIRECTORY_MODE)  # whatever the umask
        _fsync_directory(os.path.dirname(dest))
    created.append(INCOMPLETE_BACKUP)
    os.close(os.open(os.path.join(dest, INCOMPLETE_BACKUP),
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE))
    _fsync_directory(dest)  # the marker is on disk before any file it warns about
    total = 0
    for name, length in files:
        target = CURRENT_TMP if name == CURRENT else name
        created.append(target)
        _copy_file(sources[name], os.path.join(dest, target), length, os.path.join(source_dir, name))
        total += length
    if files[-1][0] == CURRENT:
        os.rename(os.path.join(dest, CURRENT_TMP), os.path.join(dest, CURRENT))
        created.append(CURRENT)
        _fsync_directory(dest)  # CURRENT is published before the marker goes
    os.unlink(os.path.join(dest, INCOMPLETE_BACKUP))
    created.remove(INCOMPLETE_BACKUP)
    _fsync_directory(dest)
    return total


def _remove_partial(dest: str, created: list[str], remove_dest: bool) -> None:
    """Undo an interrupted copy: the files it created, the marker last, and DEST if it made
    it. Best effort: whatever cannot be removed stays, and with it the marker."""
    marker = INCOMPLETE_BACKUP in created
    try:
        for name in created:
            if name != INCOMPLETE_BACKUP:
                try:
                    os.unlink(os.path.join(dest, name))
                except FileNotFoundError:
                    pass  # interrupted before it was created (or after CURRENT.tmp's rename)
        if marker:
            os.unlink(os.path.join(dest, INCOMPLETE_BACKUP))
        if remove_dest:
            os.rmdir(dest)  # only if empty: nothing but our own files was ever in it
    except OSError:
        pass


def _copy_file(source: int, target: str, length: int, source_path: str) -> None:
    """Copy the first `length` bytes of `source` into a new file `target`, fsynced.

    Raises BackupIncomplete if the source holds fewer bytes than that.
    """
    fd = os.open(target, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # whatever the umask
        offset = 0
        while offset < length:
            chunk = os.pread(source, min(COPY_CHUNK_BYTES, length - offset), offset)
            if not chunk:
                raise BackupIncomplete(
                    f"{source_path} holds {offset} bytes, the manifest says {length}: it "
                    f"changed during the copy. {os.path.dirname(target)} is incomplete: "
                    f"delete it and back up again")
            view = memoryview(chunk)
            while view:
                view = view[os.write(fd, view):]
            offset += len(chunk)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_directory(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def backup_directory(source: str | os.PathLike, dest: str | os.PathLike) -> BackupResult:
    """Copy a queue directory no daemon serves into DEST, holding its lock meanwhile.

    Opening the source recovers it as `Queue()` does (a torn tail is
    truncated), and a queue never compacted is compacted first. Raises
    QueueLocked if a daemon or another Queue owns it (use `walqueue-ctl
    backup` then), CorruptStore, and what copy_manifest raises.
    """
    dest = os.fspath(dest)
    check_destination(dest)  # before the source is opened, let alone compacted
    with Queue(source) as queue:
        return copy_manifest(queue.backup_manifest(), dest)


def main(argv: list[str] | None = None) -> int:
    """`python -m walqueue.backup SOURCE DEST`: an offline backup (no daemon running)."""
    parser = argparse.ArgumentParser(
        prog="python -m walqueue.backup",
        description="Copy a queue directory that no daemon serves into DEST (new or empty). "
                    "With walqueued running, use `walqueue-ctl backup DEST` instead.")
    parser.add_argument("source")
    parser.add_argument("dest")
    args = parser.parse_args(argv)
    try:
        result = backup_directory(args.source, args.dest)
    except (WalQueueError, OSError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    print(json.dumps(result.to_json(), sort_keys=True))
    return 0


if __name__ == "__main__":
    sys.exit(main())
