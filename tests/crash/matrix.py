"""The crash matrix: die at every hook call, reopen, and hold the library to SPEC §5/§6.

What it proves (through test_crash_matrix.py), for a queue built by
`queue_factory(directory, hook=None)`:

1. An uninterrupted run of SCRIPT with a counting hook returns what the model
   returns, calls only the nine phases of SPEC §6, each frame bracketed by
   `wal.before_write` / `wal.after_write`, one `wal.after_sync` per writing
   call (or per batch; exactly one for a cancel's frames, SPEC §8b), the compaction phases in their documented order, and
   ends with exactly one snapshot and one segment on disk. At every hook call
   the directory is read from outside and must match SPEC §6's "bytes on disk
   at that moment" (frames in the file at `wal.after_write` — not in a buffer —
   none of the next frame at `wal.before_write`, the snapshot complete at
   `snapshot.after_write`, CURRENT.tmp before the rename, the old files gone at
   `compact.after_delete`).
2. For every hook call k, a run that raises `InjectedCrash` at call k: the
   exception reaches the caller unchanged; the Queue is closed (`QueueClosed`)
   and its lock released at once (a new Queue opens while the crashed object
   is still referenced); the reopened queue holds exactly the model state
   after the frames that were complete at call k (none of the frame at
   `wal.before_write`, all of it from `wal.after_write` on — an exception
   loses no written bytes; a reserve may stop between its reap and lease
   frames), and the snapshot published so far; compaction phases never change
   the logical state. Resuming the script (re-running the interrupted call
   only if it did not take effect) ends in the uninterrupted final state.
3. A torn tail (a prefix of the next real frame) is truncated on open (and is
   gone from the file at `recover.after_truncate`); dying there releases the lock and a reopen recovers the
   model state, after which appends continue. A zero-filled tail is the same.

`run_crash_matrix` returns a `MatrixReport` whose `failures` list is empty for
a correct library, so a deliberately broken Queue can be shown to be caught.
"""

from __future__ import annotations

import errno
import shutil
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import walqueue
from tests.crash.script import BATCHES, SCRIPT, ScriptModel
from tests.model import disk
from tests.model.driver import call_model, call_real
from tests.model.reference import (
    ReferenceQueue,
    encode_frame,
    stats_tuple,
    view_tuple,
)

QueueFactory = Callable[..., Any]

# Below the size of the script's larger frames, so the allocation grows often
# and sometimes by more than one step.
MATRIX_PREALLOCATE_BYTES = 200


def preallocating_factory(directory: Path, hook: Any = None) -> Any:
    """A Queue whose active segment is preallocated (zeros after its frames while open)."""
    return walqueue.Queue(directory, hook=hook, preallocate_bytes=MATRIX_PREALLOCATE_BYTES)

PHASES = frozenset(
    {
        "wal.before_write",
        "wal.after_write",
        "wal.after_sync",
        "wal.after_rotate",
        "snapshot.after_write",
        "current.after_write",
        "current.after_publish",
        "compact.after_delete",
        "recover.after_truncate",
    }
)
COMPACTION_PHASES = (
    "wal.after_rotate",
    "snapshot.after_write",
    "current.after_write",
    "current.after_publish",
    "compact.after_delete",
)


@dataclass
class MatrixReport:
    hook_calls: int = 0
    phases_seen: set[str] = field(default_factory=set)
    crash_points: list[str] = field(default_factory=list)
    failures: list[str] = field(default_factory=list)


@dataclass(frozen=True)
class HookCall:
    phase: str
    op_index: int
    frames_complete: int  # frames of the whole script complete after this call
    publishes: int  # CURRENT publications so far, this call included


def injected_crash(description: str) -> BaseException:
    return walqueue.InjectedCrash(f"injected at {description}")


def disk_full(description: str) -> BaseException:
    """An ordinary exception, as a failing write or fsync would raise (SPEC §3)."""
    return OSError(errno.ENOSPC, f"simulated: no space left on device at {description}")


class Recorder:
    """A hook that records every call; optionally raises `make_error(...)` (by default an
    InjectedCrash) at call `crash_at`, and optionally inspects the directory at every
    call (`inspect(phase, op_index)`)."""

    def __init__(
        self,
        crash_at: int | None = None,
        inspect: Callable[[str, int], list[str]] | None = None,
        make_error: Callable[[str], BaseException] = injected_crash,
    ):
        self.crash_at = crash_at
        self.inspect = inspect
        self.make_error = make_error
        self.inspection_failures: list[str] = []
        self.calls: list[tuple[str, int]] = []
        self.op_index = -1
        self.raised: BaseException | None = None

    def __call__(self, phase: str) -> None:
        self.calls.append((phase, self.op_index))
        if self.inspect is not None:
            self.inspection_failures.extend(self.inspect(phase, self.op_index))
        if self.crash_at is not None and len(self.calls) - 1 == self.crash_at:
            self.raised = self.make_error(f"hook call {self.crash_at} ({phase})")
            raise self.raised


@contextmanager
def scratch_directory(prefix: str) -> Iterator[Path]:
    root = Path(tempfile.mkdtemp(prefix=prefix))
    try:
        yield root / "queue"
    finally:
        shutil.rmtree(root, ignore_errors=True)


def logical_state(queue: Any, *, with_wal_bytes: bool = False) -> tuple[Any, ...]:
    stats = stats_tuple(queue.stats())
    if not with_wal_bytes:
        stats = stats._replace(wal_bytes=None)
    return ([view_tuple(view) for view in queue.tasks()], stats)


def model_state(model: ReferenceQueue, *, with_wal_bytes: bool = False) -> tuple[Any, ...]:
    stats = model.stats()
    if not with_wal_bytes:
        stats = stats._replace(wal_bytes=None)
    return (model.tasks(), stats)


def _close_quietly(queue: Any) -> None:
    if queue is not None:
        try:
            queue.close()
        except Exception:  # noqa: BLE001 - a broken queue may fail to close; reported elsewhere
            pass


def _groups(batched: bool, start: int) -> list[tuple[int, ...]]:
    groups = BATCHES if batched else tuple((index,) for index in range(len(SCRIPT)))
    trimmed = [tuple(index for index in group if index >= start) for group in groups]
    return [group for group in trimmed if group]


class ScriptRunner:
    """Runs (part of) SCRIPT on a queue, comparing each result with the model."""

    def __init__(self, account: ScriptModel, failures: list[str], context: str):
        self.account = account
        self.failures = failures
        self.context = context

    def run(self, queue: Any, start: int, batched: bool, recorder: Recorder | None) -> None:
        """Runs operations start..end; InjectedCrash propagates."""
        for group in _groups(batched, start):
            if batched:
                with queue.batch():
                    for index in group:
                        self.one(queue, index, recorder)
            else:
                self.one(queue, group[0], recorder)

    def one(self, queue: Any, index: int, recorder: Recorder | None) -> None:
        if recorder is not None:
            recorder.op_index = index
        action = SCRIPT[index]
        try:
            result = call_real(queue, action)
        except walqueue.WalQueueError as error:
            if recorder is not None and recorder.raised is not None:
                raise  # the injected failure, wrapped: judged by the caller
            self.failures.append(
                f"{self.context}: op {index} {action!r} raised {type(error).__name__}: {error}"
            )
            return
        if result != self.account.results[index]:
            self.failures.append(
                f"{self.context}: op {index} {action!r} returned {result!r}, "
                f"model {self.account.results[index]!r}"
            )


# --- 1. the uninterrupted run -------------------------------------------------------


def learn_hook_calls(
    queue_factory: QueueFactory, account: ScriptModel, batched: bool, report: MatrixReport
) -> list[HookCall]:
    """Runs SCRIPT once with a counting hook; checks results, phases and the final layout."""
    context = f"uninterrupted ({'batched' if batched else 'plain'})"
    with scratch_directory("walqueue-crash-count-") as directory:
        recorder = Recorder(inspect=DiskInspector(directory, account, context))
        queue = queue_factory(directory, hook=recorder)
        try:
            ScriptRunner(account, report.failures, context).run(queue, 0, batched, recorder)
            final = logical_state(queue, with_wal_bytes=True)
            expected = model_state(account.final, with_wal_bytes=True)
            if final != expected:
                report.failures.append(f"{context}: final state {final!r}, model {expected!r}")
            snapshot_seq = account.compaction_seqs[-1]
            layout = sorted(path.name for path in directory.iterdir() if path.name not in ("LOCK",))
            expected_layout = sorted(
                [
                    "CURRENT",
                    f"snapshot-{snapshot_seq:020d}.snap",
                    f"wal-{snapshot_seq + 1:020d}.log",
                ]
            )
            if layout != expected_layout:
                report.failures.append(
                    f"{context}: directory holds {layout}, expected {expected_layout}"
                )
        except Exception as error:  # noqa: BLE001 - recorded; the calls seen so far still count
            report.failures.append(f"{context}: raised {type(error).__name__}: {error}")
        finally:
            _close_quietly(queue)
    report.failures.extend(recorder.inspection_failures)
    calls: list[HookCall] = []
    frames = publishes = 0
    for phase, op_index in recorder.calls:
        report.phases_seen.add(phase)
        if phase not in PHASES:
            report.failures.append(f"{context}: hook called with unknown phase {phase!r}")
        frames += phase == "wal.after_write"
        publishes += phase == "current.after_publish"
        calls.append(HookCall(phase, op_index, frames, publishes))
    if frames != len(account.records):
        report.failures.append(
            f"{context}: {frames} wal.after_write calls for {len(account.records)} frames"
        )
    report.failures.extend(check_phase_order(calls, account, batched, context))
    return calls


class DiskInspector:
    """Checks SPEC §6's "bytes on disk at that moment" column at every hook call.

    A crash by exception cannot tell a frame still in a user-space buffer from one
    in the file; reading the files from outside at each phase can.
    """

    def __init__(self, directory: Path, account: ScriptModel, context: str):
        self.directory = directory
        self.account = account
        self.context = context
        self.frames = 0  # wal.after_write calls so far
        self.compaction_ops = [i for i, action in enumerate(SCRIPT) if action.name == "compact"]

    def __call__(self, phase: str, op_index: int) -> list[str]:
        self.frames += phase == "wal.after_write"
        where = f"{self.context}: on disk at {phase} (op {op_index}, {self.frames} frames)"
        try:
            problems = self._inspect(phase, op_index)
        except Exception as error:  # noqa: BLE001 - a broken library yields a report, not a crash
            problems = [f"unreadable: {type(error).__name__}: {error}"]
        return [f"{where}: {problem}" for problem in problems]

    def _inspect(self, phase: str, op_index: int) -> list[str]:
        problems: list[str] = []
        directory, account = self.directory, self.account
        current = disk.read_current(directory)
        published = current["seq"] if current else 0
        records = [r for r in disk.wal_records(directory) if r["seq"] > published]
        expected = account.records[published : self.frames]
        if records != expected:
            problems.append(
                f"WAL after seq {published} holds seqs {[r['seq'] for r in records]},"
                f" expected {[r['seq'] for r in expected]}"
            )
        if SCRIPT[op_index].name != "compact" or phase not in COMPACTION_PHASES:
            return problems
        number = self.compaction_ops.index(op_index)
        target = account.compaction_seqs[number]
        previous = account.compaction_seqs[number - 1] if number else 0
        name = f"snapshot-{target:020d}.snap"
        pointer = {"format": 1, "seq": target, "snapshot": name}
        before_publish = COMPACTION_PHASES.index(phase) < COMPACTION_PHASES.index(
            "current.after_publish"
        )
        if published != (previous if before_publish else target):
            problems.append(f"CURRENT names seq {published}")
        if phase == "wal.after_rotate":
            segment = directory / f"wal-{target + 1:020d}.log"
            if not segment.exists() or disk.read_frames(segment):
                problems.append(f"{segment.name} is missing or not empty")
        if phase in ("snapshot.after_write", "current.after_write"):
            snapshot = disk.read_snapshot(directory / name)
            entries = account.after_frames(target, 0).snapshot_entries()
            if snapshot.entries != entries or snapshot.header["seq"] != target:
                problems.append(f"{name} does not hold the state through seq {target}")
        if phase == "current.after_write":
            frames = disk.read_frames(directory / "CURRENT.tmp")
            if [frame.value for frame in frames] != [pointer]:
                problems.append(f"CURRENT.tmp holds {[f.value for f in frames]}")
        if phase == "compact.after_delete":
            snapshots = sorted(path.name for path in directory.glob("snapshot-*.snap"))
            segments = [path.name for path in disk.segment_paths(directory)]
            if snapshots != [name]:
                problems.append(f"snapshots left: {snapshots}")
            if segments != [f"wal-{target + 1:020d}.log"]:
                problems.append(f"segments left: {segments}")
        return problems


def check_phase_order(
    calls: Sequence[HookCall], account: ScriptModel, batched: bool, context: str
) -> list[str]:
    failures: list[str] = []
    for index, action in enumerate(SCRIPT):
        phases = [call.phase for call in calls if call.op_index == index]
        where = f"{context}: op {index} {action!r} phases {phases}"
        wal = [
            phase for phase in phases if phase.startswith("wal.") and phase != "wal.after_rotate"
        ]
        frames = len(account.frames_of(index))
        if action.name == "compact":
            steps = [phase for phase in phases if phase in COMPACTION_PHASES]
            if steps != list(COMPACTION_PHASES):
                failures.append(f"{where}: compaction phases out of order")
            if [phase for phase in wal if phase != "wal.after_sync"]:
                failures.append(f"{where}: a compaction wrote WAL frames")
            continue
        pairs = wal.count("wal.before_write"), wal.count("wal.after_write")
        if pairs != (frames, frames):
            failures.append(f"{where}: expected {frames} before_write/after_write pairs")
        written = [phase for phase in wal if phase != "wal.after_sync"]
        if written != ["wal.before_write", "wal.after_write"] * frames:
            failures.append(f"{where}: frames not bracketed by before_write/after_write")
        syncs = wal.count("wal.after_sync")
        if not batched and frames and not (1 <= syncs <= frames and wal[-1] == "wal.after_sync"):
            failures.append(f"{where}: expected one wal.after_sync at the end of the call")
        if not batched and action.name == "cancel" and syncs != 1:
            # SPEC §8b: a cancel's revive, reserve and ack are one batch: one fsync.
            failures.append(f"{where}: a cancel's {frames} frames took {syncs} fsyncs, not one batch")
        if batched and syncs and index != max(next(g for g in BATCHES if index in g)):
            failures.append(f"{where}: wal.after_sync inside a batch before its exit")
    if batched:
        for group in BATCHES:
            syncs = [c for c in calls if c.op_index in group and c.phase == "wal.after_sync"]
            has_compaction = any(SCRIPT[index].name == "compact" for index in group)
            if not has_compaction and len(syncs) != 1:
                failures.append(f"{context}: batch {group} had {len(syncs)} wal.after_sync calls")
    return failures


# --- 2. one crash point -------------------------------------------------------------


def crash_once(
    queue_factory: QueueFactory,
    account: ScriptModel,
    calls: Sequence[HookCall],
    crash_at: int,
    batched: bool,
    report: MatrixReport,
    make_error: Callable[[str], BaseException] = injected_crash,
) -> None:
    point = calls[crash_at]
    context = (
        f"crash at hook call {crash_at} ({point.phase}, op {point.op_index} "
        f"{SCRIPT[point.op_index]!r}, {'batched' if batched else 'plain'})"
    )
    report.crash_points.append(context)
    failures = report.failures
    recorder = Recorder(crash_at=crash_at, make_error=make_error)
    with scratch_directory("walqueue-crash-") as directory:
        crashed = reopened = None
        try:
            crashed = queue_factory(directory, hook=recorder)
            runner = ScriptRunner(account, failures, context)
            try:
                runner.run(crashed, 0, batched, recorder)
            except (walqueue.InjectedCrash, Exception) as error:  # noqa: BLE001 - judged here
                injected = recorder.raised
                if injected is None or injected not in (error, error.__cause__, error.__context__):
                    failures.append(
                        f"{context}: the failure surfaced as {type(error).__name__}: {error}"
                    )
                    return
            else:
                failures.append(f"{context}: the run finished without reaching the crash point")
                return
            seen = recorder.calls[crash_at][0] if len(recorder.calls) > crash_at else None
            if seen != point.phase:
                failures.append(f"{context}: hook call {crash_at} was {seen!r} this time")
                return
            failures.extend(f"{context}: {problem}" for problem in check_closed(crashed))
            try:
                reopened = queue_factory(directory)
            except walqueue.QueueLocked:
                failures.append(f"{context}: the lock was still held after the crash")
                return
            snapshot_seq = account.compaction_seqs[point.publishes - 1] if point.publishes else 0
            expected = account.after_frames(point.frames_complete, snapshot_seq)
            state = logical_state(reopened)
            if state != model_state(expected):
                failures.append(
                    f"{context}: reopened state {state!r}\n   expected "
                    f"(model after {point.frames_complete} frames) {model_state(expected)!r}"
                )
                return
            resume_at = point.op_index
            if took_effect(account, point, reopened):
                resume_at += 1
            runner.run(reopened, resume_at, batched, None)
            final = logical_state(reopened)
            if final != model_state(account.final):
                failures.append(
                    f"{context}: after resuming at op {resume_at}, final state {final!r}\n"
                    f"   expected {model_state(account.final)!r}"
                )
        except Exception as error:  # noqa: BLE001 - a broken queue must not stop the matrix
            failures.append(f"{context}: {type(error).__name__}: {error}")
        finally:
            _close_quietly(reopened)
            _close_quietly(crashed)


def took_effect(account: ScriptModel, point: HookCall, reopened: Any) -> bool:
    """Did the interrupted call take effect (so resuming must not repeat it)?"""
    index = point.op_index
    if SCRIPT[index].name == "compact":
        return (
            reopened.stats().snapshot_seq
            == account.compaction_seqs[
                [i for i, a in enumerate(SCRIPT) if a.name == "compact"].index(index)
            ]
        )
    return point.frames_complete >= account.frames_end[index]


def check_closed(queue: Any) -> list[str]:
    """Every call on a dead Queue raises QueueClosed; close() stays idempotent."""
    problems = []
    calls: dict[str, Callable[[], Any]] = {
        "stats": queue.stats,
        "get": lambda: queue.get("a"),
        "tasks": lambda: list(queue.tasks()),
        "put": lambda: queue.put("zz", {}),
        "put_many": lambda: queue.put_many([{"task_id": "zz", "payload": {}}]),
        "reserve": lambda: queue.reserve("w", now=0, lease_seconds=1),
        "revive": lambda: queue.revive(["a"], now=0),
        "compact": queue.compact,
        "batch": lambda: queue.batch().__enter__(),
    }
    for name, call in calls.items():
        try:
            call()
        except walqueue.QueueClosed:
            pass
        except Exception as error:  # noqa: BLE001 - recorded as a failure
            problems.append(f"{name}() after the crash raised {type(error).__name__}: {error}")
        else:
            problems.append(f"{name}() after the crash did not raise QueueClosed")
    for _ in range(2):
        try:
            queue.close()
        except Exception as error:  # noqa: BLE001 - recorded as a failure
            problems.append(f"close() after the crash raised {type(error).__name__}: {error}")
    return problems


# --- 3. torn tails and a crash during recovery --------------------------------------

TORN_PREFIX_LENGTHS = (1, 3, 4, 10, -1)  # -1: all but the last digest byte
# The tail is a prefix of the next operation's frame: after op 4 it lands in a
# segment with frames; after op 7 (a compaction) in the fresh, empty segment.
TORN_AFTER_OPS = (4, 7)


def run_torn_tail_checks(queue_factory: QueueFactory, report: MatrixReport) -> None:
    account = ScriptModel.build()
    for after_op in TORN_AFTER_OPS:
        before = ReferenceQueue()
        for action in SCRIPT[: after_op + 1]:
            call_model(before, action)
        after = before.clone()
        call_model(after, SCRIPT[after_op + 1])
        frame = encode_frame(after.records[-1])
        models = (before, after)
        for length in TORN_PREFIX_LENGTHS:
            tail = frame[:length]
            context = f"torn tail of {len(tail)} of {len(frame)} bytes after op {after_op}"
            torn_tail_case(queue_factory, account, models, after_op, tail, context, True, report)
        # A power cut may leave zeros past the last write; open truncates them too, but
        # a library that preallocates may keep them, so the hook is not required here.
        context = f"zero-filled tail of 64 bytes after op {after_op}"
        torn_tail_case(queue_factory, account, models, after_op, bytes(64), context, False, report)


class _CrashAfterTruncate:
    def __init__(self, report: MatrixReport, segment: Path, context: str):
        self.report = report
        self.segment = segment
        self.context = context
        self.phases: list[str] = []
        self.raised: BaseException | None = None

    def __call__(self, phase: str) -> None:
        self.phases.append(phase)
        self.report.phases_seen.add(phase)
        if phase == "recover.after_truncate":
            # SPEC §6: at this moment the torn tail is already gone from the file.
            data = self.segment.read_bytes()
            frames = disk.read_frames(self.segment)
            end = disk.frame_size(frames[-1].value) + frames[-1].offset if frames else 0
            if any(data[end:]):
                self.report.failures.append(
                    f"{self.context}: at recover.after_truncate {self.segment.name} still has"
                    f" {len(data) - end} bytes of torn tail"
                )
            self.raised = walqueue.InjectedCrash("injected at recover.after_truncate")
            raise self.raised


def torn_tail_case(
    queue_factory: QueueFactory,
    account: ScriptModel,
    models: tuple[ReferenceQueue, ReferenceQueue],
    after_op: int,
    tail: bytes,
    context: str,
    expect_hook: bool,
    report: MatrixReport,
) -> None:
    before, after = models
    failures = report.failures
    runner = ScriptRunner(account, failures, context)
    with scratch_directory("walqueue-torn-") as directory:
        queue = crashed_open = reopened = None
        try:
            queue = queue_factory(directory)
            for index in range(after_op + 1):
                runner.one(queue, index, None)
            queue.close()
            newest = sorted(directory.glob("wal-*.log"))[-1]
            with open(newest, "ab") as segment:
                segment.write(tail)
            hook = _CrashAfterTruncate(report, newest, context)
            try:
                crashed_open = queue_factory(directory, hook=hook)
            except walqueue.InjectedCrash as error:
                if error is not hook.raised:
                    failures.append(f"{context}: a different InjectedCrash reached the caller")
                # The exception and its traceback are still alive: the lock must be free anyway.
                try:
                    reopened = queue_factory(directory)
                except walqueue.QueueLocked:
                    failures.append(f"{context}: a crash during recovery kept the lock")
                    return
            else:
                if expect_hook:
                    failures.append(
                        f"{context}: open did not call recover.after_truncate ({hook.phases})"
                    )
                _close_quietly(crashed_open)
                reopened = queue_factory(directory)
            state = logical_state(reopened, with_wal_bytes=True)
            if state != model_state(before, with_wal_bytes=True):
                failures.append(
                    f"{context}: recovered {state!r}\n   expected "
                    f"{model_state(before, with_wal_bytes=True)!r}"
                )
                return
            runner.one(reopened, after_op + 1, None)
            reopened.close()
            reopened = queue_factory(directory)
            state = logical_state(reopened, with_wal_bytes=True)
            if state != model_state(after, with_wal_bytes=True):
                failures.append(f"{context}: after an append and a reopen: {state!r}")
        except Exception as error:  # noqa: BLE001 - a broken queue must not stop the matrix
            failures.append(f"{context}: {type(error).__name__}: {error}")
        finally:
            _close_quietly(reopened)
            _close_quietly(queue)


# --- the whole matrix ---------------------------------------------------------------


def run_crash_matrix(
    queue_factory: QueueFactory,
    *,
    batched: bool = False,
    make_error: Callable[[str], BaseException] = injected_crash,
) -> MatrixReport:
    """Every crash point of SCRIPT (plain or in batches), plus the torn-tail cases.

    `make_error` builds what the hook raises: an InjectedCrash (process death) by
    default, or e.g. `disk_full` (an ordinary OSError, as from a failed write).
    """
    report = MatrixReport()
    account = ScriptModel.build()
    # A broken library must yield a report, never crash the harness: every stage
    # records an unexpected exception as a failure and the matrix goes on.
    try:
        calls = learn_hook_calls(queue_factory, account, batched, report)
    except Exception as error:  # noqa: BLE001 - recorded as a failure
        report.failures.append(f"uninterrupted run raised {type(error).__name__}: {error}")
        calls = []
    report.hook_calls = len(calls)
    for crash_at in range(len(calls)):
        try:
            crash_once(queue_factory, account, calls, crash_at, batched, report, make_error)
        except Exception as error:  # noqa: BLE001 - recorded as a failure
            report.failures.append(f"crash point {crash_at}: {type(error).__name__}: {error}")
    try:
        run_torn_tail_checks(queue_factory, report)
    except Exception as error:  # noqa: BLE001 - recorded as a failure
        report.failures.append(f"torn-tail checks raised {type(error).__name__}: {error}")
    return report
