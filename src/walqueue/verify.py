"""Offline, read-only verification of a queue directory (`walqueue-ctl verify`).

`verify_directory(path)` reads the directory with recovery's own reader,
`recovery.plan_recovery` (the code `Queue(path)` opens it with), told to
keep going, and reports what it finds, without changing anything:

  - it takes no lock and creates no file (not even LOCK); every file is
    opened read-only (with O_NOATIME where the kernel allows it), and the
    file-system object it hands to recovery has no way to write;
  - its verdict is open's: a problem of severity "corrupt" exists if and
    only if opening raises CorruptStore, and the first one names the file
    and offset that CorruptStore names (recovery collects problems in the
    order its strict reading meets them);
  - unlike open it does not stop at the first problem: after a damaged
    frame recovery resumes at the next valid frame, so one report lists
    every damaged place it can find (file, offset, seq).

It adds only what a read-only checker needs: severities, notes on files
open ignores or deletes, who holds the lock, "this is not a queue",
progress, and the report as text or JSON.

Severities:
  "corrupt"     open would raise CorruptStore because of this;
  "torn-tail"   open would truncate this tail of the newest segment (a torn
                write or preallocated zeros): expected after a crash, not an
                error (an "incomplete" frame with a complete frame after it is
                a damaged length, which open and verify call corrupt);
  "note"        open would delete or ignore this (an orphan snapshot,
                CURRENT.tmp, WAL segments the snapshot covers, a stray file);
  "unreadable"  verify could not read a file (permissions, I/O error), so it
                cannot say whether the directory is healthy.

A directory holding none of a queue's files (LOCK, CURRENT, CURRENT.tmp,
segments, snapshots) is not a queue: open would create one there, so a
healthy verdict would mislead (for instance on the parent of the daemon's
queue directories); verify says so and names any subdirectory that is one.

Records are checked against the state only up to the first corrupt problem:
after it the state recovery would rebuild is unknown (the report says so in
a note), while frames, checksums and seq continuity are still checked.

Standard library only (this is the library layer).
"""

from __future__ import annotations

import argparse
import os
import stat
import sys
from dataclasses import asdict, dataclass, field

from . import display, paths
from .fs import Directory, ReadingFileSystem, open_at, read_descriptor
from .recovery import RecoveryPlan, UnreadableFile, plan_recovery
from .snapshot import CURRENT, CURRENT_TMP, is_snapshot_name
from .wal import is_segment_name

CORRUPT = "corrupt"
TORN_TAIL = "torn-tail"
NOTE = "note"
UNREADABLE = "unreadable"
SEVERITIES = (CORRUPT, TORN_TAIL, NOTE, UNREADABLE)

LOCK = "LOCK"
# Written first and removed last by walqueue.backup: a directory holding it is a copy that
# did not finish (interrupted, killed, or failed), not a damaged queue.
INCOMPLETE_BACKUP = "BACKUP-INCOMPLETE"
SOCKET_NAME = "walqueued.sock"  # the daemon's default socket lives in the directory

EXIT_HEALTHY, EXIT_USAGE, EXIT_CORRUPT, EXIT_UNREADABLE, EXIT_NO_QUEUE = 0, 2, 4, 8, 11
EXIT_INCOMPLETE_BACKUP = 10
EXIT_CODES_TEXT = ("Exit codes: 0 the directory opens (a torn tail is reported, not an error), "
                   "4 corrupt, 8 a file cannot be read, 10 an incomplete backup, 11 the directory "
                   "holds no queue, 2 usage.")


@dataclass(frozen=True)
class Problem:
    """One finding: where it is and what it is."""

    severity: str
    file: str | None
    what: str
    offset: int | None = None
    seq: int | None = None

    def location(self) -> str:
        parts = [self.file or "(directory)"]
        if self.offset is not None:
            parts.append(f"offset {self.offset}")
        if self.seq is not None:
            parts.append(f"seq {self.seq}")
        return ", ".join(parts)


@dataclass(frozen=True)
class VerifyReport:
    """What `verify_directory` found. `corrupt` is True iff `Queue(directory)` would raise CorruptStore.

    `counts` (tasks per status) is None when the state cannot be rebuilt
    (a corrupt directory). `last_seq` is the last seq recovery would reach,
    or on a corrupt directory the last seq applied before the first problem.
    `wal_bytes` is what `QueueStats.wal_bytes` would say right after open.
    `queue_found` is False for a directory holding none of a queue's files;
    `queue_subdirectories` then names its subdirectories that hold one.
    `incomplete_backup` is True when the directory holds walqueue.backup's
    marker: a copy that did not finish, whatever else is found in it.
    """

    directory: str
    problems: tuple[Problem, ...]
    counts: dict[str, int] | None
    last_seq: int | None
    snapshot_seq: int | None
    snapshot: str | None
    segments: int
    wal_bytes: int
    total_bytes: int
    lock_holder: int | None = field(default=None)
    queue_found: bool = True
    queue_subdirectories: tuple[str, ...] = ()
    incomplete_backup: bool = False

    @property
    def corrupt(self) -> bool:
        return any(problem.severity == CORRUPT for problem in self.problems)

    @property
    def unreadable(self) -> bool:
        return any(problem.severity == UNREADABLE for problem in self.problems)

    @property
    def healthy(self) -> bool:
        """A queue that opens (torn tails and notes are not errors), and no half backup."""
        return (self.queue_found and not self.corrupt and not self.unreadable
                and not self.incomplete_backup)

    def by_severity(self, severity: str) -> list[Problem]:
        return [problem for problem in self.problems if problem.severity == severity]

    def exit_code(self) -> int:
        """The exit code of `walqueue-ctl verify` and `python -m walqueue.verify` for this report."""
        if self.incomplete_backup:
            return EXIT_INCOMPLETE_BACKUP
        if self.corrupt:
            return EXIT_CORRUPT
        if self.unreadable:
            return EXIT_UNREADABLE
        return EXIT_HEALTHY if self.queue_found else EXIT_NO_QUEUE

    def render(self) -> str:
        """The human report `walqueue-ctl verify` prints (see docs/operations.md)."""
        if self.incomplete_backup:
            return self._render_incomplete_backup()
        if not self.queue_found:
            return self._render_no_queue()
        if self.corrupt:
            verdict = "CORRUPT: opening it would fail with CorruptStore"
        elif self.unreadable:
            verdict = "UNKNOWN: some files could not be read"
        else:
            verdict = "HEALTHY: it opens"
            if self.by_severity(TORN_TAIL):
                verdict += " (after truncating the torn tail listed below)"
        snapshot = "none" if self.snapshot is None else f"{self.snapshot} (seq {self.snapshot_seq})"
        last_seq = "unknown" if self.last_seq is None else str(self.last_seq)
        if not self.healthy:
            last_seq += " (the last one applied before the first problem)"
        lines = [f"{self.directory}: {verdict}",
                 f"  snapshot:  {snapshot}",
                 f"  last seq:  {last_seq}",
                 f"  WAL:       {self.segments} segment(s), {self.wal_bytes} bytes of frames; "
                 f"{self.total_bytes} bytes in the directory"]
        if self.counts is not None:
            lines.append("  tasks:     " + ", ".join(f"{name} {count}" for name, count in self.counts.items()))
        if self.lock_holder is not None:
            lines.append(f"  lock:      held by pid {self.lock_holder}: a live owner may be appending, so "
                         f"its newest segment can look torn; verify a stopped daemon's directory or a copy")
        if self.problems:
            lines.append(f"problems ({len(self.problems)}):")
            for problem in self.problems:
                what = problem.what
                if problem.file and what.startswith(f"{problem.file}: "):
                    what = what[len(problem.file) + 2:]  # the location already names the file
                label = problem.severity.upper()
                lines.append(f"  {label:<10} {problem.location()}: {what}")
        if self.corrupt:
            lines.append("next: keep a copy of the directory as evidence; the daemon will not start "
                         "on it. See docs/operations.md, 'Reading verify output'.")
        return _printable(lines)

    def _render_incomplete_backup(self) -> str:
        lines = [f"{self.directory}: INCOMPLETE BACKUP: walqueue-ctl backup did not finish this "
                 f"copy (it was interrupted, killed, or failed; it holds {INCOMPLETE_BACKUP})",
                 "  it is not a queue to restore: its files stop part way (a gap in seq, or no "
                 "CURRENT)",
                 "next: delete it and run walqueue-ctl backup again; the queue it was copied from "
                 "is not affected"]
        return _printable(lines)

    def _render_no_queue(self) -> str:
        lines = [f"{self.directory}: NO QUEUE: it holds none of a queue's files (LOCK, CURRENT, "
                 f"wal-*.log, snapshot-*.snap)"]
        for name in self.queue_subdirectories:
            lines.append(f"  {name}/ holds a queue: walqueue-ctl verify "
                         f"{os.path.join(self.directory, name)}")
        lines.append(f"next: give the queue directory itself, the DIRECTORY walqueued serves "
                     f"(e.g. {paths.PLAIN_QUEUE_DIRECTORY}, or {paths.template_queue_directory('NAME')} "
                     f"for walqueued@NAME)")
        return _printable(lines)

    def to_json(self) -> dict:
        """A JSON-ready dict of the whole report."""
        report = asdict(self)
        report["problems"] = [asdict(problem) for problem in self.problems]
        report["healthy"] = self.healthy
        report["corrupt"] = self.corrupt
        return report


def _printable(lines: list[str]) -> str:
    # File names come from the directory: a terminal must not act on what they hold.
    return "\n".join(display.text(line) for line in lines)


class _ReadOnlyFiles(ReadingFileSystem):
    """The file-system calls recovery makes while reading; there is deliberately no way to write.

    Passed to `plan_recovery` in place of `OsFileSystem`: if it ever tried
    to write, verify would fail loudly instead of changing the directory.
    Files are opened as the library opens them (relative to the directory,
    never through a link), and with O_NOATIME where allowed.
    """

    def read(self, directory: Directory, name: str):
        noatime = getattr(os, "O_NOATIME", 0)
        if noatime:
            try:
                return read_descriptor(open_at(directory, name, os.O_RDONLY | noatime))
            except PermissionError:
                pass  # O_NOATIME needs ownership of the file; read it anyway
        return read_descriptor(open_at(directory, name, os.O_RDONLY))


def verify_directory(path: str | os.PathLike, *, progress=None) -> VerifyReport:
    """Check a queue directory offline and report every problem found.

    Changes nothing: takes no lock, creates and writes no file.
    `progress(bytes_read, bytes_total)` is called as the snapshot and the
    WAL are read (see recovery.plan_recovery).
    Raises FileNotFoundError / NotADirectoryError if `path` is not an
    existing directory (open would create it; there is nothing to verify),
    and PermissionError if it cannot be listed.
    """
    directory = os.fspath(path)
    files = _ReadOnlyFiles()
    handle = files.open_directory(directory)
    try:
        return _verify(files, handle, directory, progress)
    finally:
        files.close_directory(handle)


def _verify(files: _ReadOnlyFiles, handle: Directory, directory: str, progress) -> VerifyReport:
    names = sorted(files.listdir(handle))
    total_bytes = 0
    subdirectories = []
    for name in names:
        try:
            info = os.stat(name, dir_fd=handle.fd, follow_symlinks=False)
        except OSError:
            continue
        total_bytes += info.st_size
        if stat.S_ISDIR(info.st_mode):
            subdirectories.append(name)
    incomplete = INCOMPLETE_BACKUP in names
    if not any(_is_queue_file(name) for name in names):
        return VerifyReport(
            incomplete_backup=incomplete,
            directory=directory, problems=(), counts=None, last_seq=None, snapshot_seq=None,
            snapshot=None, segments=0, wal_bytes=0, total_bytes=total_bytes, queue_found=False,
            queue_subdirectories=tuple(name for name in subdirectories
                                       if _holds_a_queue(os.path.join(directory, name))))
    plan = plan_recovery(files, handle, keep_going=True, progress=progress)
    problems = [_problem_of(problem) for problem in plan.problems] + _notes(plan, names)
    healthy = not any(problem.severity in (CORRUPT, UNREADABLE) for problem in problems)
    return VerifyReport(
        directory=directory,
        problems=tuple(problems),
        counts=dict(plan.state.counts) if plan.state is not None and healthy else None,
        last_seq=plan.last_seq,
        snapshot_seq=plan.snapshot_seq,
        snapshot=plan.snapshot_file,
        segments=len(plan.segment_files),
        wal_bytes=plan.wal_bytes,
        total_bytes=total_bytes,
        lock_holder=_lock_holder(directory),
        incomplete_backup=incomplete,
    )


def _problem_of(problem) -> Problem:
    if isinstance(problem, UnreadableFile):
        return Problem(UNREADABLE, problem.file, str(problem))
    return Problem(CORRUPT, problem.file, str(problem), problem.offset, problem.seq)


def _notes(plan: RecoveryPlan, names: list[str]) -> list[Problem]:
    """What open would truncate, delete or ignore, and what verify could not check."""
    notes = []
    if plan.snapshot_seq is None:
        notes.append(Problem(NOTE, None, "CURRENT is unusable, so which WAL segments the snapshot "
                             "covers is unknown: every segment is checked on its own"))
    for name in plan.covered:
        notes.append(Problem(NOTE, name, f"{name}: wholly covered by the published snapshot "
                             f"(seq {plan.snapshot_seq}); open deletes it without reading it"))
    tail = plan.torn_tail
    if tail is not None:
        cut = tail.file_size - tail.offset
        if tail.kind == "zeros":
            what = (f"{tail.file}: {cut} zero bytes after the last frame at offset {tail.offset} "
                    f"(a preallocated or torn tail); open truncates them")
        else:
            what = (f"{tail.file}: an incomplete final frame at offset {tail.offset} ({cut} bytes, "
                    f"a torn write); open truncates it")
        notes.append(Problem(TORN_TAIL, tail.file, what, tail.offset))
    for name in plan.outdated:
        notes.append(Problem(NOTE, name, f"{name}: ends at or before the published snapshot "
                             f"(seq {plan.snapshot_seq}); open deletes it"))
    at_fault = {problem.file for problem in plan.problems}
    for name in names:
        if name == CURRENT_TMP:
            notes.append(Problem(NOTE, name, f"{name}: left by an interrupted compaction; never "
                                 f"authoritative, open deletes it"))
        elif is_snapshot_name(name) and name != plan.snapshot_file:
            notes.append(Problem(NOTE, name, f"{name}: an orphan snapshot (CURRENT does not name "
                                 f"it); never authoritative, open deletes it"))
        elif (not _is_queue_file(name) and name not in (SOCKET_NAME, INCOMPLETE_BACKUP)
              and name not in at_fault):
            notes.append(Problem(NOTE, name, f"{name}: not a queue file; open ignores it"))
    if plan.state is None and plan.last_applied is not None:
        first = plan.problems[0]
        where = first.file if getattr(first, "offset", None) is None else \
            f"{first.file} offset {first.offset}"
        notes.append(Problem(NOTE, None, f"records after the first problem ({where}) were not "
                             f"checked against the state, which is unknown from there on"))
    return notes


def _is_queue_file(name: str) -> bool:
    return (name in (LOCK, CURRENT, CURRENT_TMP) or is_snapshot_name(name)
            or is_segment_name(name))


def _holds_a_queue(path: str) -> bool:
    try:
        return any(_is_queue_file(name) for name in os.listdir(path))
    except OSError:
        return False


def _lock_holder(directory: str) -> int | None:
    """The pid holding LOCK (a running Queue or daemon), read from /proc/locks; None if none or unknown.

    Taking or testing the lock would be a change (and could block an owner
    starting up), so this only reads the kernel's table of flock locks.
    """
    try:
        info = os.stat(os.path.join(directory, LOCK))
        with open("/proc/locks", encoding="ascii", errors="replace") as locks:
            table = locks.read()
    except OSError:
        return None
    wanted = f"{os.major(info.st_dev):02x}:{os.minor(info.st_dev):02x}:{info.st_ino}"
    for line in table.splitlines():
        fields = line.split()
        # "1: FLOCK  ADVISORY  WRITE 1234 08:01:5678 0 EOF"
        if len(fields) >= 6 and fields[1] == "FLOCK" and fields[5] == wanted:
            try:
                return int(fields[4])
            except ValueError:
                return None
    return None


def main(argv: list[str] | None = None) -> int:
    """`python -m walqueue.verify DIRECTORY [--json]`: walqueue-ctl verify on the standard library alone.

    For a machine without the daemon layer's packages; same report, same
    exit codes (0 opens, 4 corrupt, 8 unreadable, 10 incomplete backup, 11 no queue, 2 usage).
    """
    parser = argparse.ArgumentParser(
        prog="python -m walqueue.verify",
        description="Check a WALQueue directory offline; changes nothing. Run it on a stopped "
                    "daemon's directory or on a copy. How to read the report: docs/operations.md.",
        epilog=EXIT_CODES_TEXT)
    parser.add_argument("directory", help="the queue directory to check")
    parser.add_argument("--json", action="store_true", help="print the report as one JSON object")
    arguments = parser.parse_args(argv)
    try:
        report = verify_directory(arguments.directory)
    except OSError as error:
        print(f"python -m walqueue.verify: cannot read {arguments.directory}: "
              f"{error.strerror or error}", file=sys.stderr)
        return EXIT_UNREADABLE
    if arguments.json:
        print(display.json_line(report.to_json()))
    else:
        print(report.render())
    return report.exit_code()


if __name__ == "__main__":
    raise SystemExit(main())


__all__ = ["CORRUPT", "EXIT_NO_QUEUE", "NOTE", "SEVERITIES", "TORN_TAIL", "UNREADABLE", "Problem",
           "VerifyReport", "main", "verify_directory"]
