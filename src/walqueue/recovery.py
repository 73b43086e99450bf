"""Recovery's reading of a queue directory: the one reader of the on-disk format (SPEC §5).

`plan_recovery(fs, directory)` reads CURRENT, the snapshot it names and the
WAL segments after it, checks them by the rules of codec, wal and snapshot,
replays the records through `State.apply`, and returns a RecoveryPlan: the
recovered state and what open must then do to the files (truncate a torn
tail, delete leftovers). It writes nothing. `Queue` does those writes, in
the order SPEC §5 and §6 fix; `verify` reads the same plan, built with
`keep_going=True`, and only adds what a read-only checker needs.

Rules this module keeps:
  - it reads only what recovery needs: CURRENT, the snapshot CURRENT names,
    and the segments that snapshot does not wholly cover;
  - strictly (the default) the first problem raises CorruptStore, and a
    file that cannot be read raises its OSError;
  - keeping going, every problem is collected in `plan.problems`, in the
    order the strict reading meets them, so the first one is what open
    raises; after a damaged frame the scan resumes at the next valid one;
  - the state is trusted only while no problem has been found: after the
    first, frames and seqs are still checked but records are not applied,
    and `plan.state` is None.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass

from . import replay
from .codec import Problems, report_or_raise
from .errors import CorruptStore, WalQueueError
from .fs import Directory, OsFileSystem
from .snapshot import CURRENT, CURRENT_TMP, is_snapshot_name, load_snapshot, read_current
from .state import RECORD_FIELDS, State
from .wal import SegmentReader, list_segments


@dataclass(frozen=True)
class Segment:
    """A WAL segment recovery read."""

    first_seq: int
    filename: str
    size: int    # bytes of complete frames: where a torn tail starts (0 if unreadable)


@dataclass(frozen=True)
class TornTail:
    """The tail of the newest segment open truncates (SPEC §5)."""

    file: str
    offset: int      # the end of the last complete frame; the file is cut here
    kind: str        # "incomplete" (a torn write) or "zeros" (preallocated or zero-filled)
    file_size: int


@dataclass(frozen=True)
class UnreadableFile:
    """A file that could not be read (keeping going only; strictly its OSError propagates)."""

    file: str
    error: OSError

    def __str__(self) -> str:
        return f"{self.file}: cannot be read: {self.error.strerror or self.error}"


@dataclass(frozen=True)
class RecoveryPlan:
    """What recovery found, and what open must do about it.

    `state` is the recovered State (None when keeping going found a
    problem). `snapshot_seq` is CURRENT's seq, 0 without CURRENT, None when
    CURRENT is unusable. `segment_files` lists every segment name found;
    `covered` the ones the snapshot wholly covers (never read), `outdated`
    the ones read that end at or before the snapshot, `leftovers` CURRENT.tmp
    and orphan snapshots: open deletes all three (`deletions`). `sealed` and
    `active` are the segments open keeps, `active` None when open must
    create the next one. `last_applied` is the last seq the state reached
    while trusted (None if it never was).
    """

    state: State | None
    snapshot_seq: int | None
    snapshot_file: str | None
    segment_files: tuple[str, ...]
    covered: tuple[str, ...]
    sealed: tuple[Segment, ...]
    active: Segment | None
    torn_tail: TornTail | None
    outdated: tuple[str, ...]
    leftovers: tuple[str, ...]
    problems: tuple[CorruptStore | UnreadableFile, ...]
    last_applied: int | None

    @property
    def deletions(self) -> tuple[str, ...]:
        return self.covered + self.outdated + self.leftovers

    @property
    def wal_bytes(self) -> int:
        """The bytes of complete frames in the segments open keeps (QueueStats.wal_bytes)."""
        kept = self.sealed + ((self.active,) if self.active is not None else ())
        return sum(segment.size for segment in kept)

    @property
    def last_seq(self) -> int | None:
        return self.state.last_seq if self.state is not None else self.last_applied


def plan_recovery(fs: OsFileSystem, directory: Directory, *, keep_going: bool = False,
                  progress=None) -> RecoveryPlan:
    """Read and check the queue directory the way open recovers it; write nothing.

    Strictly, raises CorruptStore (with file, offset and seq where known)
    at the first problem, and OSError for a file it cannot read. With
    `keep_going`, collects every problem in the plan instead.
    `progress(bytes_read, bytes_total)` is called as the snapshot and the
    segments are read (bytes_total counts the files recovery reads).
    """
    # Recovery builds millions of long-lived objects and no cycles; the
    # cyclic collector would only rescan them (a third of the time at 1M).
    collecting = gc.isenabled()
    gc.disable()
    try:
        return _plan(fs, directory, Problems() if keep_going else None, progress)
    finally:
        if collecting:
            gc.enable()


def _plan(fs: OsFileSystem, directory: Directory, problems: Problems | None, progress) -> RecoveryPlan:
    names = sorted(fs.listdir(directory))
    snapshot_seq, snapshot_file = _read_current(fs, directory, problems)
    segments = list_segments(names, problems)
    if snapshot_seq is None:
        covered: list[str] = []   # unknown: every segment is read on its own
    else:
        # A segment is wholly covered by the snapshot when the next one starts
        # at or before the snapshot's next seq; it is garbage from a compaction
        # that stopped before deleting it, so it is neither read nor trusted.
        covered = [name for index, (_, name) in enumerate(segments[:-1])
                   if segments[index + 1][0] <= snapshot_seq + 1]
    live = segments[len(covered):]
    advance = None if progress is None else _Progress(fs, directory, snapshot_file, live, progress)

    state = _load_state(fs, directory, snapshot_seq, snapshot_file, problems, advance)
    # Keeping going reads the pure way throughout (as codec.scan_frames does).
    apply = None if state is None else state.apply if problems is not None else replay.applier(state)
    last_applied = None
    # Keeping going without CURRENT's seq, no record counts as covered.
    covered_through = -1 if snapshot_seq is None else snapshot_seq
    read: list[Segment] = []
    reader = None
    for index, (first_seq, filename) in enumerate(live):
        if snapshot_seq is not None and (reader is None or reader.tail is not None):
            expected = snapshot_seq + 1 if reader is None else reader.last_seq + 1
            if first_seq > expected or (reader is not None and first_seq != expected):
                kind = "a sequence gap" if first_seq > expected else "overlapping segments"
                report_or_raise(problems, CorruptStore(
                    f"{filename}: starts at seq {first_seq}, expected seq {expected} ({kind})",
                    file=filename, seq=first_seq))
        reader = SegmentReader(fs, directory, first_seq, filename, newest=index == len(live) - 1,
                               problems=problems, progress=advance)
        try:
            for offset, record, body_bytes in reader.records():
                seq = record["seq"]
                if seq <= covered_through:
                    # Covered by the snapshot: not applied, but still a record.
                    op = record.get("op")
                    if type(op) is not str or record.keys() != RECORD_FIELDS.get(op, ()):
                        report_or_raise(problems, CorruptStore(
                            f"{filename}: frame at offset {offset} (seq {seq}) is not a "
                            f"well-formed record", file=filename, offset=offset, seq=seq))
                    continue
                if problems is not None and (state is None or problems.found):
                    if state is not None:
                        last_applied, state = state.last_seq, None
                    continue
                try:
                    apply(record, body_bytes)
                except WalQueueError as error:
                    report_or_raise(problems, CorruptStore(
                        f"{filename}: frame at offset {offset} (seq {seq}): invalid "
                        f"{record.get('op')!r} record: {error}", file=filename, offset=offset,
                        seq=seq))
        except (OSError, CorruptStore) as error:
            # Keeping going, only reading the file raises here (it cannot be
            # read, or it is a link): what is in it is unknown.
            if problems is None:
                raise
            problems.report(error if isinstance(error, CorruptStore)
                            else UnreadableFile(filename, error))
            read.append(Segment(first_seq, filename, 0))
            continue
        read.append(Segment(first_seq, filename, reader.tail.offset))
    if problems is not None and problems.found and state is not None:
        last_applied, state = state.last_seq, None

    active = torn_tail = None
    sealed: list[Segment] = []
    outdated: list[str] = []
    newest_read = reader is not None and reader.tail is not None
    if newest_read and snapshot_seq is not None and reader.last_seq >= snapshot_seq:
        active, sealed = read[-1], read[:-1]
        if reader.tail.kind in ("incomplete", "zeros"):
            torn_tail = TornTail(active.filename, reader.tail.offset, reader.tail.kind,
                                 reader.file_size)
    elif newest_read and snapshot_seq is not None:
        # No segment reaches the snapshot's seq: open starts the next one.
        outdated = [segment.filename for segment in read]
    leftovers = [name for name in names
                 if name == CURRENT_TMP or (is_snapshot_name(name) and name != snapshot_file)]
    if advance is not None:
        advance.finish()
    return RecoveryPlan(
        state=state, snapshot_seq=snapshot_seq, snapshot_file=snapshot_file,
        segment_files=tuple(name for _, name in segments), covered=tuple(covered),
        sealed=tuple(sealed), active=active, torn_tail=torn_tail, outdated=tuple(outdated),
        leftovers=tuple(leftovers), problems=tuple(problems.found if problems else ()),
        last_applied=last_applied)


def _read_current(fs, directory: Directory, problems: Problems | None) -> tuple[int | None, str | None]:
    """(CURRENT's seq, its snapshot) or (0, None) without CURRENT; (None, None) if unusable."""
    try:
        current = read_current(fs, directory)
    except CorruptStore as error:
        report_or_raise(problems, error)
        return None, None
    except OSError as error:
        if problems is None:
            raise
        problems.report(UnreadableFile(CURRENT, error))
        return None, None
    return (0, None) if current is None else current


def _load_state(fs, directory: Directory, snapshot_seq: int | None, snapshot_file: str | None,
                problems: Problems | None, advance) -> State | None:
    """The state the snapshot holds (a new State without one); None if keeping going finds it unusable."""
    if snapshot_file is None:
        return State() if snapshot_seq == 0 else None
    found = len(problems.found) if problems is not None else 0
    try:
        state = load_snapshot(fs, directory, snapshot_file, snapshot_seq, problems, advance)
    except CorruptStore as error:  # a missing snapshot, even keeping going
        report_or_raise(problems, error)
        return None
    except OSError as error:
        if problems is None:
            raise
        problems.report(UnreadableFile(snapshot_file, error))
        return None
    if problems is not None and len(problems.found) > found:
        return None
    return state


class _Progress:
    """Adds up the bytes the readers report and tells `progress(read, total)`."""

    def __init__(self, fs, directory: Directory, snapshot_file: str | None, live, progress) -> None:
        names = ([snapshot_file] if snapshot_file is not None else []) + [name for _, name in live]
        self.total = 0
        for name in names:
            try:
                self.total += fs.size(directory, name)
            except OSError:
                pass  # reported when recovery reads it
        self.read = 0
        self.progress = progress

    def __call__(self, byte_count: int) -> None:
        self.read += byte_count
        self.progress(self.read, max(self.total, self.read))

    def finish(self) -> None:
        self.read = self.total = max(self.total, self.read)
        self.progress(self.read, self.total)
