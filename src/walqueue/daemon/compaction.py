"""Compaction off walqueued's loop: the snapshot is written by a forked child (SPEC §8a).

The shape is Redis's BGSAVE, in SPEC §5's order and phases:

1. right after a turn's batch has exited (its fsync done), when a compaction
   is due or requested and none is in flight, the loop calls
   ``Engine.begin_compaction()`` (rotate: wal.after_rotate) and forks AT ONCE,
   before anything else is applied, so the child's copy-on-write image of
   the state is exactly the state through the compaction's seq S;
2. the child writes and fsyncs ``snapshot-S.snap`` from that image
   (``Engine.write_compaction_snapshot``, which refuses a state past S) and
   exits 0, reporting the snapshot's size through a pipe — or exits non-zero
   with the errno and message of what failed;
3. meanwhile the parent serves: appends go to the new segment, which the
   snapshot does not cover. It watches the child (a pidfd in its selector),
   reaps it, and only after it exited 0 calls ``finish_compaction``
   (snapshot.after_write, current.after_write, current.after_publish,
   compact.after_delete), deferred while a backup pins the files; after a
   failure it calls ``abandon_compaction`` (the WAL still holds everything,
   the Engine stays open: no reopen) and retries later, with a back-off.

Before it forks, the parent checks that the file system has room for the
new snapshot, bounded from above by ``Engine.snapshot_bytes_bound()`` (the
published snapshot plus what each record since can have added, kept
record by record in the state: O(1) here). The WAL alone is no bound: a
reserve names its worker once for up to 1,000 tasks and the snapshot
repeats it per task, and a put carries no identity (once 0.46 MiB of WAL
became ~60 MiB of snapshot). On a nearly full disk a child's partial
snapshot would take the space the WAL appends need, and turn a failed
compaction into failed writes of bystanders and reopens; refused before the
fork, it is a failed compaction like any other (logged, backed off), and
nothing else fails.

A child that does not exit by its deadline (stopped, stuck in the kernel,
or just far slower than any disk should be) is killed with SIGKILL, and its
compaction fails like any other: CHILD_DEADLINE_FLOOR_SECONDS after the fork
plus the bound above at CHILD_MIN_BYTES_PER_SECOND. Without it a SIGSTOPped
child was waited for forever: a compaction in progress for ever, ``compact``
unanswered, the WAL growing, nothing logged.

A killed daemon leaves at most an orphan snapshot (SPEC §5 ignores it, the
next open deletes it). The child dies with its parent (PR_SET_PDEATHSIG,
then a check that the parent is still the one that forked it), and closes
every inherited descriptor but its report pipe first — the directory's
LOCK among them, so a killed daemon's lock is never prolonged by its child,
and client sockets too. It disables the cyclic collector (its scans would
copy every page), restores the default signal handlers, never logs, never
runs atexit handlers (``os._exit``) and never returns into the daemon's code.

Fork safety. The child runs only this module's child function and the
library's snapshot writer: os calls, canonical JSON and SHA-256, no import
(everything is imported before the fork), no logging, no lock of the
daemon's. So a thread of the parent (walqueue.daemon.metrics_http's HTTP
server, if it runs in a thread) holding its own locks at the moment of the
fork cannot block the child: the child never asks for them. The C library's
prctl is looked up at import, not in the child (dlopen takes a lock).

When: `compaction_due` — the WAL since the snapshot is past the absolute
floor (``--compact-wal-bytes``) AND past ``ratio`` times the published
snapshot's size (``--compact-wal-ratio``). With ratio r, every compaction
follows at least r x P_prev WAL bytes and writes P = P_prev + growth bytes,
so snapshot bytes written / WAL bytes written <= 1/r + g, g being how many
snapshot bytes one WAL byte adds (about 0.5 for put+reserve+ack of 100-byte
payloads; docs/daemon.md has the arithmetic). r = 1 keeps it under 2 for
any history size.
"""

from __future__ import annotations

import ctypes
import gc
import json
import os
import signal
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import NoReturn

from walqueue import QueueClosed, protocol
from walqueue.engine import Compaction, Engine
from walqueue.snapshot import snapshot_name

from .clock import Clock
from .log import log, one_line
from .recorder import Recorder
from .service import Peer, QueueService

DEFAULT_COMPACT_WAL_RATIO = 1.0
FIRST_RETRY_SECONDS = 1.0
MAX_RETRY_SECONDS = 300.0
# The child yields some CPU to the loop that serves: weighted about a third
# of a normal process (nice 10 starved it behind 16 busy clients on 2 CPUs).
CHILD_NICENESS = 5
# The child fdatasyncs its snapshot every this many bytes: a WAL fsync of the
# parent's then waits for at most this much of the child's dirty data
# (snapshot.write_snapshot says why; with 4 MiB, scripts/probe_snapshot_io.py saw 10-30 ms at worst).
CHILD_SYNC_EVERY_BYTES = 4 << 20
MAX_REPORT_BYTES = 4096
# A snapshot child gets this long, plus its snapshot's size (the bound) at the
# rate below, before it is killed: the floor covers the fork and a slow
# disk's fsyncs; the rate is about a thirtieth of what the child writes on
# the development VM beside 16 busy clients (~30 MB/s).
CHILD_DEADLINE_FLOOR_SECONDS = 60.0
CHILD_MIN_BYTES_PER_SECOND = 1 << 20
# What a failed write raises (as in walqueue.daemon.commit): the Engine then closed itself.
WRITE_FAILURES = (OSError, QueueClosed)

_PR_SET_PDEATHSIG = 1
try:
    _prctl = ctypes.CDLL(None, use_errno=True).prctl
    _prctl.argtypes = [ctypes.c_int, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong, ctypes.c_ulong]
    _prctl.restype = ctypes.c_int
except (OSError, AttributeError):  # not Linux: the child cannot ask to die with its parent
    _prctl = None


def freeze_heap() -> None:
    """Move every object alive now out of the cyclic collector's reach (gc.freeze).

    The queue's state is millions of long-lived objects without cycles. A
    full collection scans them all — a stall of about 1.6 s per million
    tasks, which the first one after a recovery (built with the collector
    off) would cause — and, after a fork, writes to every page that holds
    them, copying the pages the snapshot child shares. Called after the
    Engine is opened (at start, after a reopen) and before each fork; what is
    frozen is freed by reference counting as before, only cycles among it are
    never collected (the state has none).
    """
    gc.freeze()


def free_bytes(directory: str) -> int:
    """Bytes an unprivileged writer may still use on the file system of ``directory``."""
    stats = os.statvfs(directory)
    return stats.f_bavail * stats.f_frsize


def compaction_due(wal_bytes: int, snapshot_bytes: int, *, floor_bytes: int, ratio: float) -> bool:
    """True when the WAL since the snapshot is past the floor and past ratio x the snapshot's size."""
    return wal_bytes > floor_bytes and wal_bytes > ratio * snapshot_bytes


class Backoff:
    """Spacing of retries after failures: first_seconds, doubling up to max_seconds; pure.

    ``failed(now)`` returns the delay before the next attempt; ``ready(now)``
    says whether that delay has passed; ``succeeded()`` starts over. Times
    are monotonic seconds, given by the caller.
    """

    def __init__(self, first_seconds: float = FIRST_RETRY_SECONDS,
                 max_seconds: float = MAX_RETRY_SECONDS) -> None:
        self.first_seconds = first_seconds
        self.max_seconds = max_seconds
        self.failures = 0  # consecutive
        self.retry_at: float | None = None

    def failed(self, now: float) -> float:
        delay = min(self.max_seconds, self.first_seconds * 2.0 ** min(self.failures, 64))
        self.failures += 1
        self.retry_at = now + delay
        return delay

    def succeeded(self) -> None:
        self.failures = 0
        self.retry_at = None

    def ready(self, now: float) -> bool:
        return self.retry_at is None or now >= self.retry_at

    def remaining(self, now: float) -> float | None:
        """Seconds until the next attempt may run; None when not backing off."""
        return None if self.retry_at is None else max(0.0, self.retry_at - now)


@dataclass(frozen=True)
class ChildReport:
    """How a snapshot child ended: ok (exit 0, report ok) with the snapshot's size, or why not."""

    ok: bool
    snapshot_bytes: int = 0
    error: str = ""
    errno: int | None = None


def _die_with_parent(parent_pid: int) -> None:
    if _prctl is None or _prctl(_PR_SET_PDEATHSIG, int(signal.SIGKILL), 0, 0, 0) != 0:
        raise OSError(ctypes.get_errno(), "prctl(PR_SET_PDEATHSIG) failed")
    if os.getppid() != parent_pid:
        os._exit(3)  # the parent died before the request took effect


def _close_inherited_descriptors(keep: set[int]) -> None:
    """Close every descriptor the fork copied but ``keep`` and stdio: the LOCK, sockets, segments."""
    start = 3
    for fd in sorted(keep):
        os.closerange(start, fd)
        start = fd + 1
    os.closerange(start, os.sysconf("SC_OPEN_MAX"))


def _child(queue: Engine, compaction: Compaction, path: str, report_fd: int, parent_pid: int,
           hook: Callable[[], None] | None) -> NoReturn:
    """The forked child: write and fsync the snapshot, report, exit. Never returns."""
    code, report = 2, {"ok": False, "error": "the child did not finish"}
    try:
        _die_with_parent(parent_pid)
        _close_inherited_descriptors({report_fd, *queue.snapshot_descriptors()})
        for signum in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGPIPE):
            signal.signal(signum, signal.SIG_DFL)
        try:
            signal.set_wakeup_fd(-1)
        except ValueError:  # forked from another thread than the main one: nothing was set
            pass
        gc.disable()
        os.nice(CHILD_NICENESS)
        if hook is not None:
            hook()
        queue.write_compaction_snapshot(compaction, sync_every_bytes=CHILD_SYNC_EVERY_BYTES)
        code, report = 0, {"ok": True, "snapshot_bytes": os.stat(path).st_size}
    except OSError as exc:
        code, report = 1, {"ok": False, "errno": exc.errno, "error": f"{type(exc).__name__}: {exc}"}
    except BaseException as exc:  # noqa: B036 - whatever it is, it must never unwind into the daemon's code
        code, report = 2, {"ok": False, "error": f"{type(exc).__name__}: {exc}"}
    finally:
        try:
            os.write(report_fd, json.dumps(report).encode()[:MAX_REPORT_BYTES])
        finally:
            os._exit(code)


class SnapshotChild:
    """One forked child writing one compaction's snapshot: fork, watch, reap, kill.

    ``fileno()`` is a pidfd, readable once the child has exited (for the
    loop's selector); `close` closes it once it is out of the selector.
    Raises OSError if the fork fails (nothing is left).
    """

    def __init__(self, queue: Engine, compaction: Compaction, directory: str,
                 hook: Callable[[], None] | None = None) -> None:
        path = os.path.join(directory, compaction.snapshot_file)
        read_fd, write_fd = os.pipe()
        parent_pid = os.getpid()
        freeze_heap()
        try:
            with warnings.catch_warnings():
                # Python warns about fork() beside threads; the child is safe (module docstring).
                warnings.simplefilter("ignore", DeprecationWarning)
                pid = os.fork()
        except BaseException:
            os.close(read_fd)
            os.close(write_fd)
            raise
        if pid == 0:
            _child(queue, compaction, path, write_fd, parent_pid, hook)
        os.close(write_fd)
        self.pid = pid
        self._report_fd = read_fd
        self._pidfd: int | None = None
        self.report: ChildReport | None = None
        try:
            self._pidfd = os.pidfd_open(pid)
        except BaseException:
            self.kill()
            raise
        os.set_blocking(read_fd, False)

    def fileno(self) -> int:
        return self._pidfd

    def poll(self) -> ChildReport | None:
        """The child's report once it has exited (it is reaped then); None while it runs."""
        if self.report is None:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid != 0:
                self._collect(status)
        return self.report

    def kill(self) -> ChildReport:
        """SIGKILL the child if it still runs, reap it; its report (a failure if it was killed)."""
        if self.report is None:
            self.send_kill()
            _, status = os.waitpid(self.pid, 0)
            self._collect(status)
        return self.report

    def send_kill(self) -> None:
        """SIGKILL the child without waiting for it to die: `poll` reaps it once it has.

        The loop must not block in waitpid: a child in uninterruptible sleep
        (a hung disk) dies only when its system call returns.
        """
        if self.report is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass

    def _collect(self, status: int) -> None:
        chunks = []
        try:
            while chunk := os.read(self._report_fd, MAX_REPORT_BYTES):
                chunks.append(chunk)
        except BlockingIOError:
            pass
        os.close(self._report_fd)
        self.report = judge(status, b"".join(chunks))

    def close(self) -> None:
        """Close the pidfd (after `poll` or `kill` reaped the child)."""
        pidfd, self._pidfd = self._pidfd, None
        if pidfd is not None:
            os.close(pidfd)


def judge(status: int, report: bytes) -> ChildReport:
    """A child's ending from its wait status and its report: ok only for exit 0 and an ok report."""
    try:
        fields = json.loads(report) if report else {}
    except ValueError:
        fields = {}
    if os.WIFSIGNALED(status):
        return ChildReport(False, error=f"the snapshot child was killed by signal "
                                        f"{signal.Signals(os.WTERMSIG(status)).name}")
    code = os.WEXITSTATUS(status)
    if code == 0 and fields.get("ok") is True and isinstance(fields.get("snapshot_bytes"), int):
        return ChildReport(True, snapshot_bytes=fields["snapshot_bytes"])
    error = fields.get("error") or f"the snapshot child exited with code {code} and no report"
    return ChildReport(False, error=str(error), errno=fields.get("errno"))


@dataclass(eq=False)
class Waiter:
    """A ``compact`` request: answered once a snapshot covering ``seq`` is published."""

    peer: Peer
    request_id: int
    seq: int  # the last seq when the request was applied


def child_deadline_seconds(snapshot_bytes: int, floor_seconds: float = CHILD_DEADLINE_FLOOR_SECONDS) -> float:
    """How long a child writing a snapshot of about ``snapshot_bytes`` may take before it is killed."""
    return floor_seconds + snapshot_bytes / CHILD_MIN_BYTES_PER_SECOND


@dataclass(eq=False)
class InFlight:
    compaction: Compaction
    child: SnapshotChild
    started: float  # monotonic, before the rotation
    reason: str
    deadline: float  # monotonic: the child is killed if it has not exited by then
    pause_seconds: float = 0.0  # how long the loop stood still for the rotation and the fork
    written: float | None = None  # monotonic, when the child was found exited 0
    watched: bool = True  # its pidfd is in the loop's selector
    killed: bool = False  # at its deadline: failed already, abandoned once it is reaped


@dataclass
class Status:
    """What the report shows of compaction now (the counters are the recorder's)."""

    in_progress: bool
    retry_in_seconds: float | None
    consecutive_failures: int
    last_error: str
    snapshot_bytes: int
    ratio: float


class Compactor:
    """When to compact, the one compaction in flight, the requests waiting for it, the back-off.

    Driven by the loop, on its thread: `request` inside a turn's batch (a
    ``compact`` request), `settle` right after the batch (collect an exited
    child, publish, answer), `maybe_start` at the end of the turn (begin and
    fork). ``watch(fd)``/``unwatch(fd)`` put a child's pidfd in and out of the
    loop's selector; ``reopen()`` reopens the queue after a publish that
    failed (the Engine closed itself, as after any failed write).

    ``compact`` over the wire answers after CURRENT is published, with the
    published seq, which covers every write applied before the request: a
    request that comes while a compaction through an older seq is in flight
    waits for it and then for the next one, started at once. During a
    back-off a request is answered at once with the last failure (no
    attempt per request); so is every waiting request when an attempt fails.
    """

    def __init__(self, service: QueueService, recorder: Recorder, clock: Clock, *, directory: str,
                 floor_bytes: int, ratio: float, reopen: Callable[[], None],
                 watch: Callable[[int], None] = lambda fd: None,
                 unwatch: Callable[[int], None] = lambda fd: None,
                 child_hook: Callable[[], None] | None = None,
                 free_bytes: Callable[[str], int] = free_bytes,
                 child_deadline_floor_seconds: float = CHILD_DEADLINE_FLOOR_SECONDS) -> None:
        self.service = service
        self.directory = directory
        self.floor_bytes = floor_bytes
        self.ratio = ratio
        self.backoff = Backoff()
        self.last_error = ""
        self.snapshot_bytes = self.published_snapshot_bytes()
        self.in_flight: InFlight | None = None
        self._recorder = recorder
        self._clock = clock
        self._reopen = reopen
        self._watch = watch
        self._unwatch = unwatch
        self._child_hook = child_hook
        self._free_bytes = free_bytes
        self._child_deadline_floor_seconds = child_deadline_floor_seconds
        self._requested: list[Waiter] = []  # this turn's, until its batch is durable
        self._waiting: list[Waiter] = []

    def published_snapshot_bytes(self) -> int:
        """The size of the snapshot CURRENT names (0 before the first compaction)."""
        seq = self.service.queue.stats().snapshot_seq
        if seq == 0:
            return 0
        try:
            return os.stat(os.path.join(self.directory, snapshot_name(seq))).st_size
        except FileNotFoundError:
            return 0

    def next_deadline(self) -> float | None:
        """When the child in flight is to be killed if it has not exited (monotonic), for the loop's timer."""
        flight = self.in_flight
        if flight is None or flight.killed or flight.child.report is not None:
            return None
        return flight.deadline

    def status(self) -> Status:
        return Status(in_progress=self.in_flight is not None,
                      retry_in_seconds=self.backoff.remaining(self._clock.monotonic_seconds()),
                      consecutive_failures=self.backoff.failures, last_error=self.last_error,
                      snapshot_bytes=self.snapshot_bytes, ratio=self.ratio)

    # -- the loop's calls ---------------------------------------------------------------

    def request(self, peer: Peer, request_id: int) -> None:
        """A ``compact`` request, inside the turn's batch: answered by `settle` or later."""
        self._requested.append(Waiter(peer, request_id, self.service.queue.stats().last_seq))

    def settle(self) -> None:
        """After the turn's batch exited without error: take its requests, collect a child that
        exited, publish (unless a backup pins the files) or abandon, answer who waited."""
        queue = self.service.queue
        requested, self._requested = self._requested, []
        if queue is None:
            return
        now = self._clock.monotonic_seconds()
        # A child killed at its deadline is no attempt that could answer a request any more.
        no_live_attempt = self.in_flight is None or self.in_flight.killed
        for waiter in requested:
            if self.in_flight is None and waiter.seq <= queue.stats().snapshot_seq:
                self._answer(waiter, queue.stats().snapshot_seq)  # nothing appended since the snapshot
            elif no_live_attempt and not self.backoff.ready(now):
                self._answer_error(waiter, self._failing_message(now))
            else:
                self._waiting.append(waiter)
        flight = self.in_flight
        if flight is None:
            return
        report = flight.child.poll()
        if report is None and not flight.killed and now >= flight.deadline:
            self._kill_late(flight)
            report = flight.child.poll()  # reaped at once if it is already gone
        if report is None:
            return
        self._unwatch_child(flight)
        if flight.killed:  # whatever it reports now: its failure was counted and answered
            self.in_flight = None
            self._abandon_files(flight)
            return
        if not report.ok:
            self._abandon(flight, report.error)
            return
        if flight.written is None:
            flight.written = now
        if self.service.backup_holder is None:
            self._finish(flight)

    def maybe_start(self, wrote: bool, *, freeing: bool = False) -> None:
        """At the end of a turn: begin a compaction and fork its child, if one is wanted and may run.

        `freeing`: the files of the last compaction are still being freed
        (walqueue.daemon.freeing). An automatic compaction waits for them, so
        its snapshot's writes and the freeing never run together (together
        they made a WAL fsync wait 110-126 ms at 10M tombstones, where each
        alone stayed under 50 ms); one on request does not wait, and the
        freeing goes on beside its child at its pace: had the freeing waited
        for the child instead, back-to-back requests would never free
        anything (once 120 of them left 103 deleted files open).
        """
        queue = self.service.queue
        if queue is None or self.in_flight is not None or self.service.backup_holder is not None:
            return
        if not wrote and not self._waiting:
            return  # the common case of a turn that wrote nothing: no compaction is due
        now = self._clock.monotonic_seconds()
        if not self.backoff.ready(now):
            return
        if self._waiting and max(waiter.seq for waiter in self._waiting) > queue.stats().snapshot_seq:
            reason = "on request"
        elif wrote and not freeing and compaction_due(queue.wal_bytes, self.snapshot_bytes,
                                                      floor_bytes=self.floor_bytes, ratio=self.ratio):
            reason = "automatically"
        else:
            return
        self._start(queue, reason, now)

    def reset(self, why: str) -> None:
        """The Engine is being replaced (a failed write): kill the child, answer who waited.

        This turn's requests are not answered here: the failed batch's answers replace them.
        """
        self._requested = []
        flight, self.in_flight = self.in_flight, None
        if flight is not None:
            flight.child.kill()
            self._unwatch_child(flight)
            log.warning("compaction through seq %d abandoned: %s", flight.compaction.seq, why)
        self._answer_all_waiting(f"the compaction was abandoned: {why}; compact again")

    def stop(self) -> None:
        """The daemon is stopping: kill the child, wait for it, abandon its compaction, answer."""
        flight, self.in_flight = self.in_flight, None
        if flight is not None:
            flight.child.kill()
            self._unwatch_child(flight)
            self._abandon_files(flight)
            log.info("compaction through seq %d abandoned: the daemon is stopping", flight.compaction.seq)
        self._answer_all_waiting("the daemon is stopping; the compaction was abandoned")

    # -- steps ----------------------------------------------------------------------------

    def _start(self, queue: Engine, reason: str, now: float) -> None:
        needed = queue.snapshot_bytes_bound()  # what the new snapshot may take, at most
        try:
            free = self._free_bytes(self.directory)
        except OSError as exc:
            self._failed(f"cannot read the free space of {self.directory}: {exc}")
            return
        if free < needed:
            self._failed(f"not enough free space for the snapshot: {free} bytes free on the file system "
                         f"of {self.directory}, up to {needed} needed; nothing was written")
            return
        try:
            compaction = queue.begin_compaction()
        except WRITE_FAILURES as exc:  # the rotation failed: the Engine closed itself
            self._failed(f"rotating the WAL failed: {type(exc).__name__}: {exc}", reopening=True)
            self._reopen()
            return
        if compaction is None:  # nothing appended since the snapshot
            self._answer_covered(queue.stats().snapshot_seq)
            return
        try:
            child = SnapshotChild(queue, compaction, self.directory, self._child_hook)
        except OSError as exc:  # fork refused (EAGAIN, ENOMEM): the queue is fine
            queue.abandon_compaction(compaction)
            self._failed(f"fork failed: {type(exc).__name__}: {exc}")
            return
        pause_seconds = self._clock.monotonic_seconds() - now
        deadline = now + child_deadline_seconds(needed, self._child_deadline_floor_seconds)
        self.in_flight = InFlight(compaction, child, now, reason, deadline, pause_seconds)
        self._watch(child.fileno())
        self._recorder.compaction_started(pause_seconds)
        log.debug("compaction through seq %d started %s: child pid %d, the loop paused %.3f s",
                  compaction.seq, reason, child.pid, pause_seconds)

    def _finish(self, flight: InFlight) -> None:
        self.in_flight = None
        compaction = flight.compaction
        try:
            self.service.queue.finish_compaction(compaction)
        except WRITE_FAILURES as exc:  # publishing or deleting failed: the Engine closed itself
            self._failed(f"publishing the snapshot failed: {type(exc).__name__}: {exc}", reopening=True)
            self._reopen()
            return
        seconds = self._clock.monotonic_seconds() - flight.started
        self.backoff.succeeded()
        self.last_error = ""
        self.snapshot_bytes = flight.child.report.snapshot_bytes
        self._recorder.compacted(seconds, snapshot_bytes=self.snapshot_bytes,
                                 covered_bytes=compaction.covered_bytes)
        log.info("compacted %d WAL bytes %s through seq %d in %.3f s (loop paused %.4f s; snapshot %d "
                 "bytes written by pid %d in %.3f s)", compaction.covered_bytes, flight.reason, compaction.seq,
                 seconds, flight.pause_seconds, self.snapshot_bytes, flight.child.pid,
                 (flight.written or flight.started) - flight.started)
        self._answer_covered(compaction.seq)

    def _kill_late(self, flight: InFlight) -> None:
        """The child is past its deadline: SIGKILL it, and fail the attempt now (the loop reaps it
        when its pidfd says it is gone, and only then removes its partial snapshot)."""
        flight.child.send_kill()
        flight.killed = True
        self._failed(f"writing the snapshot failed: the snapshot child pid {flight.child.pid} did not "
                     f"exit within {flight.deadline - flight.started:.0f} s, so it was killed")

    def _abandon(self, flight: InFlight, error: str) -> None:
        self.in_flight = None
        self._abandon_files(flight)
        self._failed(f"writing the snapshot failed: {error}")

    def _abandon_files(self, flight: InFlight) -> None:
        queue = self.service.queue
        if queue is None or queue.compaction_in_progress is not flight.compaction:
            return  # the Engine it began on is gone (closed or replaced)
        try:
            queue.abandon_compaction(flight.compaction)
        except OSError as exc:  # the partial snapshot stays: an orphan the next open deletes
            log.warning("could not remove %s: %r", flight.compaction.snapshot_file, exc)

    def _failed(self, error: str, *, reopening: bool = False) -> None:
        """Count a failed attempt, back off, say why, answer who waited."""
        now = self._clock.monotonic_seconds()
        delay = self.backoff.failed(now)
        self.last_error = one_line(error)
        self._recorder.compaction_failed()
        # One line per attempt; attempts are spaced by the back-off, so the log is rate-limited too.
        log.error("compaction failed (%d in a row): %s; %s; next attempt in %.0f s", self.backoff.failures,
                  self.last_error, "the daemon reopens the queue" if reopening else
                  "the queue stays open and its WAL holds every record", delay)
        self._answer_all_waiting(self._failing_message(now))

    def _failing_message(self, now: float) -> str:
        remaining = self.backoff.remaining(now) or 0.0
        return (f"compaction is failing ({self.backoff.failures} attempt(s) in a row): {self.last_error}; "
                f"nothing was lost; the next attempt is in {remaining:.0f} s")

    def _unwatch_child(self, flight: InFlight) -> None:
        """Take the child's pidfd out of the loop's selector, then close it (after it was reaped)."""
        if flight.watched:
            flight.watched = False
            self._unwatch(flight.child.fileno())
        if flight.child.report is not None:
            flight.child.close()

    # -- answers ----------------------------------------------------------------------------

    def _answer_covered(self, seq: int) -> None:
        """Answer the waiting requests that ``seq`` covers; the others wait for the next one."""
        covered = [waiter for waiter in self._waiting if waiter.seq <= seq]
        self._waiting = [waiter for waiter in self._waiting if waiter.seq > seq]
        for waiter in covered:
            self._answer(waiter, seq)

    def _answer(self, waiter: Waiter, seq: int) -> None:
        self.service.answer(waiter.peer, waiter.request_id,
                            [protocol.Compacted(id=waiter.request_id, seq=seq)])

    def _answer_error(self, waiter: Waiter, message: str) -> None:
        self.service.answer(waiter.peer, waiter.request_id,
                            [protocol.Error(id=waiter.request_id, error="WalQueueError", message=message,
                                            code=protocol.COMPACTION_FAILED)])

    def _answer_all_waiting(self, message: str) -> None:
        waiting, self._waiting = self._waiting, []
        for waiter in waiting:
            self._answer_error(waiter, message)
