"""walqueued's own figures: what the daemon counts, and its report.

Daemon layer, no I/O. The loop and the group commit (walqueue.daemon.commit)
feed a `Recorder` — fsync durations, requests, failures, compactions — and
the service asks it for a `DaemonStats` when a client or the metrics
endpoint wants one. The recorder observes: it never opens a batch or
touches the Engine except to read figures for a report.

Definitions (docs/metrics.md has the operator's version):

* fsync latency: the time the end of a group-commit batch took (the WAL
  fsync and its hook), over a recent window: the last FSYNC_WINDOW fsyncs
  that happened within FSYNC_WINDOW_SECONDS. p50/p99 are nearest-rank
  quantiles of that window; None (NaN in Prometheus) when it is empty.
* requests per fsync: the mean number of requests applied in the batches
  that ended with the fsyncs of that window (group commit at work).
* oldest ready age: ``now - due_since`` where due_since is the earliest
  ``max(available_at, time it became ready)`` among ready tasks due at now
  (State.ready_due_since). "Time it became ready" comes from `SeqClock`:
  the seq of the record that made it ready, mapped to a time no later than
  when that seq was written. A task that was ready when the daemon started
  counts from the start (so the age is "at least" that old, never more).
  0 when no ready task is due.
* leases past half: leased tasks at or past the middle of their lease (from
  the reserve's or last touch's now to the deadline), expired-but-unreaped
  ones included; leases loaded from a snapshot have no known start and are
  left out until touched.
"""

from __future__ import annotations

import bisect
import math
import time
from collections import deque
from collections.abc import Callable

import walqueue
from walqueue import speedups
from walqueue.metrics import FSYNC_WINDOW, FSYNC_WINDOW_SECONDS
from walqueue.protocol import DaemonStats

MAX_SEQ_SAMPLES = 4096


def quantile(sorted_values: list[float], fraction: float) -> float | None:
    """Nearest-rank quantile of an ascending list; None for an empty one."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(fraction * len(sorted_values)))
    return sorted_values[rank - 1]


class SeqClock:
    """Maps a WAL seq to a time no later than when it was written, from sparse samples.

    The recorder calls `note(next_seq, now)` at the start of every turn that
    may write: every seq >= next_seq is written at `now` or later. One sample
    per second at most is kept (a later one in the same second, or with no
    seq written since, only moves the latest sample's time forward), so the
    map errs by under a second for recent seqs. Past MAX_SEQ_SAMPLES, every
    other old sample is dropped: old seqs then map to an earlier time (an
    age overestimated by the gap between kept samples, never underestimated).
    Seqs below the first sample (written before the daemon started) map to
    the first sample's time.
    """

    def __init__(self, next_seq: int, now: int) -> None:
        self._seqs = [next_seq]
        self._times = [now]

    def note(self, next_seq: int, now: int) -> None:
        if now <= self._times[-1]:
            return
        # After a failed write the daemon reopens the queue, whose last seq
        # may go back: samples above it named seqs that never became durable.
        while len(self._seqs) > 1 and self._seqs[-1] > next_seq:
            self._seqs.pop()
            self._times.pop()
        if next_seq <= self._seqs[-1]:
            self._times[-1] = now  # nothing written since: that seq is later still
            return
        self._seqs.append(next_seq)
        self._times.append(now)
        if len(self._seqs) > MAX_SEQ_SAMPLES:
            # Thin the older half, keeping the first sample (the daemon's start).
            half = len(self._seqs) // 2
            del self._seqs[1:half:2]
            del self._times[1:half:2]

    @property
    def last_time(self) -> int:
        return self._times[-1]

    def time_of(self, seq: int) -> int:
        index = bisect.bisect_right(self._seqs, seq) - 1
        return self._times[max(index, 0)]

    def __len__(self) -> int:
        return len(self._seqs)


class Recorder:
    """The counters and recent fsync window the daemon feeds from its loop (one thread)."""

    def __init__(self, *, next_seq: int, now: int, recovery_seconds: float,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time, wal_bytes: int = 0) -> None:
        self._clock = clock
        self.started = clock()
        self.start_time_seconds = wall_clock()
        self.last_recovery_seconds = recovery_seconds
        self.seq_clock = SeqClock(next_seq, now)
        self.fsyncs_total = 0
        self.fsync_seconds_total = 0.0
        self.requests_total = 0
        self.write_failures_total = 0
        self.expired_before_reopens = 0  # leases the Engines before a reopen expired (Loop adds the live one's)
        self.compactions_total = 0
        self.last_compaction_seconds: float | None = None
        self.compaction_failures_total = 0
        self.last_compaction_pause_seconds: float | None = None
        self.snapshot_bytes_written_total = 0
        # WAL bytes written since start = the WAL now - the WAL at start + what compactions dropped.
        self._wal_bytes_at_start = wal_bytes
        self._wal_bytes_compacted = 0
        # (monotonic end, seconds, requests in its batch) of recent fsyncs.
        self._window: deque[tuple[float, float, int]] = deque(maxlen=FSYNC_WINDOW)
        # The window's figures, computed once per change of the window, not per report:
        # a turn may answer a thousand reports (issue 20 item 3).
        self._window_changes = 0
        self._window_figures: tuple[int, tuple] | None = None

    def batch_ended(self, seconds: float, requests: int, fsynced: bool) -> None:
        self.requests_total += requests
        if fsynced:
            self.fsyncs_total += 1
            self.fsync_seconds_total += seconds
            self._window.append((self._clock(), seconds, requests))
            self._window_changes += 1

    def compaction_started(self, pause_seconds: float) -> None:
        """A compaction began; the loop stood still ``pause_seconds`` (rotation and fork)."""
        self.last_compaction_pause_seconds = pause_seconds

    def compacted(self, seconds: float, *, snapshot_bytes: int = 0, covered_bytes: int = 0) -> None:
        """A compaction published its snapshot ``seconds`` after it began."""
        self.compactions_total += 1
        self.last_compaction_seconds = seconds
        self.snapshot_bytes_written_total += snapshot_bytes
        self._wal_bytes_compacted += covered_bytes

    def compaction_failed(self) -> None:
        self.compaction_failures_total += 1

    def write_failed(self) -> None:
        self.write_failures_total += 1

    def turn_started(self, now: int, queue) -> None:
        """Sample the seq clock (at most once per second of `now`) before a turn's batch."""
        if now > self.seq_clock.last_time:
            self.seq_clock.note(queue.stats().last_seq + 1, now)

    def _fsync_figures(self, clock: float) -> tuple:
        """(p50, p99, fsyncs, requests per fsync) of the window at ``clock``, sorted only when
        the window changed since the last report."""
        window = self._window
        while window and window[0][0] < clock - FSYNC_WINDOW_SECONDS:
            window.popleft()
            self._window_changes += 1
        cached = self._window_figures
        if cached is not None and cached[0] == self._window_changes:
            return cached[1]
        durations = sorted(seconds for _, seconds, _ in window)
        figures = (quantile(durations, 0.5), quantile(durations, 0.99), len(durations),
                   sum(requests for _, _, requests in window) / len(window) if window else None)
        self._window_figures = (self._window_changes, figures)
        return figures

    def recovered(self, seconds: float) -> None:
        self.last_recovery_seconds = seconds

    def report(self, queue, *, now: int, connections: int, parked_reserves: int, paused: bool,
               compact_wal_bytes: int, directory: str, compaction=None) -> DaemonStats:
        """The full report at `now` (the daemon's clock, whole seconds).

        ``compaction`` is the compactor's `Status` (walqueue.daemon.compaction), if any.
        """
        clock = self._clock()
        p50, p99, fsyncs, requests_per_fsync = self._fsync_figures(clock)
        due_since = queue.ready_due_since(now, self.seq_clock.time_of)
        stats = queue.stats()
        compaction_fields = {}
        if compaction is not None:
            compaction_fields = dict(
                compact_wal_ratio=compaction.ratio,
                compaction_in_progress=compaction.in_progress,
                compaction_retry_in_seconds=compaction.retry_in_seconds,
                compaction_consecutive_failures=compaction.consecutive_failures,
                last_compaction_error=compaction.last_error,
                snapshot_bytes=compaction.snapshot_bytes,
            )
        return DaemonStats(
            queue=stats,
            oldest_ready_age_seconds=0 if due_since is None else max(0, now - due_since),
            leases_past_half=queue.leases_past_half(now),
            wal_segments=queue.segment_count(),
            compact_wal_bytes=compact_wal_bytes,
            fsyncs_total=self.fsyncs_total,
            fsync_seconds_total=self.fsync_seconds_total,
            fsync_p50_seconds=p50,
            fsync_p99_seconds=p99,
            fsync_window=fsyncs,
            requests_total=self.requests_total,
            requests_per_fsync=requests_per_fsync,
            write_failures_total=self.write_failures_total,
            compactions_total=self.compactions_total,
            last_compaction_seconds=self.last_compaction_seconds,
            connections=connections,
            parked_reserves=parked_reserves,
            paused=paused,
            uptime_seconds=clock - self.started,
            start_time_seconds=self.start_time_seconds,
            last_recovery_seconds=self.last_recovery_seconds,
            directory=directory,
            version=walqueue.__version__,
            speedups=speedups.PATH,
            compaction_failures_total=self.compaction_failures_total,
            last_compaction_pause_seconds=self.last_compaction_pause_seconds,
            snapshot_bytes_written_total=self.snapshot_bytes_written_total,
            wal_bytes_written_total=max(0, stats.wal_bytes - self._wal_bytes_at_start
                                        + self._wal_bytes_compacted),
            expired_total=self.expired_before_reopens + queue.expired_total,
            **compaction_fields,
        )
