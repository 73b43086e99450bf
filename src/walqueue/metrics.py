"""walqueued's own figures: what the daemon counts, the report, and its Prometheus text.

Daemon layer, no I/O. The server feeds a `Recorder` from its event loop
(fsync durations, requests, failures, compactions) and asks it for a
`DaemonStats` when a client or the metrics endpoint wants one; that report
travels over the wire (`protocol.DaemonStatsOk`) and `render_prometheus`
turns it into the text exposition format (version 0.0.4) wherever it is
printed, so `walqueue-ctl metrics` and `GET /metrics` say the same thing.

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
from dataclasses import dataclass

from walqueue import QueueStats

FSYNC_WINDOW = 1024
FSYNC_WINDOW_SECONDS = 60.0
MAX_SEQ_SAMPLES = 4096
QUANTILES = (0.5, 0.99)


@dataclass(frozen=True)
class DaemonStats:
    """The daemon's full report: the queue's QueueStats and the daemon's own figures."""

    queue: QueueStats
    oldest_ready_age_seconds: int
    leases_past_half: int
    wal_segments: int
    compact_wal_bytes: int
    fsyncs_total: int
    fsync_seconds_total: float
    fsync_p50_seconds: float | None
    fsync_p99_seconds: float | None
    fsync_window: int
    requests_total: int
    requests_per_fsync: float | None
    write_failures_total: int
    compactions_total: int
    last_compaction_seconds: float | None
    connections: int
    parked_reserves: int
    paused: bool
    uptime_seconds: float
    start_time_seconds: float
    last_recovery_seconds: float
    directory: str


def quantile(sorted_values: list[float], q: float) -> float | None:
    """Nearest-rank quantile of an ascending list; None for an empty one."""
    if not sorted_values:
        return None
    rank = max(1, math.ceil(q * len(sorted_values)))
    return sorted_values[rank - 1]


class SeqClock:
    """Maps a WAL seq to a time no later than when it was written, from sparse samples.

    The server calls `note(next_seq, now)` at the start of every turn that
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
    """The counters and recent fsync window the server feeds from its loop (one thread)."""

    def __init__(self, *, next_seq: int, now: int, recovery_seconds: float,
                 clock: Callable[[], float] = time.monotonic,
                 wall_clock: Callable[[], float] = time.time) -> None:
        self._clock = clock
        self.started = clock()
        self.start_time_seconds = wall_clock()
        self.last_recovery_seconds = recovery_seconds
        self.seq_clock = SeqClock(next_seq, now)
        self.fsyncs_total = 0
        self.fsync_seconds_total = 0.0
        self.requests_total = 0
        self.write_failures_total = 0
        self.compactions_total = 0
        self.last_compaction_seconds: float | None = None
        # (monotonic end, seconds, requests in its batch) of recent fsyncs.
        self._window: deque[tuple[float, float, int]] = deque(maxlen=FSYNC_WINDOW)

    def batch_ended(self, seconds: float, requests: int, fsynced: bool) -> None:
        self.requests_total += requests
        if fsynced:
            self.fsyncs_total += 1
            self.fsync_seconds_total += seconds
            self._window.append((self._clock(), seconds, requests))

    def compacted(self, seconds: float) -> None:
        self.compactions_total += 1
        self.last_compaction_seconds = seconds

    def write_failed(self) -> None:
        self.write_failures_total += 1

    def turn_started(self, now: int, queue) -> None:
        """Sample the seq clock (at most once per second of `now`) before a turn's batch."""
        if now > self.seq_clock.last_time:
            self.seq_clock.note(queue.stats().last_seq + 1, now)

    def recovered(self, seconds: float) -> None:
        self.last_recovery_seconds = seconds

    def timed_batch(self, queue, requests: list) -> TimedBatch:
        """``queue.batch()`` whose end (the fsync) is timed; ``len(requests)`` is read at the end."""
        return TimedBatch(self, queue, requests)

    def report(self, queue, *, now: int, connections: int, parked_reserves: int, paused: bool,
               compact_wal_bytes: int, directory: str) -> DaemonStats:
        """The full report at `now` (the daemon's clock, whole seconds)."""
        clock = self._clock()
        window = self._window
        while window and window[0][0] < clock - FSYNC_WINDOW_SECONDS:
            window.popleft()
        durations = sorted(seconds for _, seconds, _ in window)
        due_since = queue.ready_due_since(now, self.seq_clock.time_of)
        return DaemonStats(
            queue=queue.stats(),
            oldest_ready_age_seconds=0 if due_since is None else max(0, now - due_since),
            leases_past_half=queue.leases_past_half(now),
            wal_segments=queue.segment_count(),
            compact_wal_bytes=compact_wal_bytes,
            fsyncs_total=self.fsyncs_total,
            fsync_seconds_total=self.fsync_seconds_total,
            fsync_p50_seconds=quantile(durations, 0.5),
            fsync_p99_seconds=quantile(durations, 0.99),
            fsync_window=len(durations),
            requests_total=self.requests_total,
            requests_per_fsync=(sum(requests for _, _, requests in window) / len(window)
                                if window else None),
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
        )


class TimedBatch:
    """A Queue batch whose exit, where the group commit's fsync happens, is timed."""

    def __init__(self, recorder: Recorder, queue, requests: list) -> None:
        self._recorder = recorder
        self._queue = queue
        self._batch = queue.batch()
        self._requests = requests

    def __enter__(self) -> None:
        self._batch.__enter__()

    def __exit__(self, *exc_info) -> None:
        fsyncing = self._queue.unsynced()
        started = time.perf_counter()
        synced = False
        try:
            self._batch.__exit__(*exc_info)
            synced = fsyncing
        finally:
            # A failed fsync is the server's write failure to count, not an fsync.
            self._recorder.batch_ended(time.perf_counter() - started, len(self._requests), synced)


# -- Prometheus text exposition ------------------------------------------------------


def _escape_label(value: str) -> str:
    return value.replace("\\", "\\\\").replace("\n", "\\n").replace('"', '\\"')


def _escape_help(text: str) -> str:
    return text.replace("\\", "\\\\").replace("\n", "\\n")


def _number(value: float | int | bool | None) -> str:
    if value is None:
        return "NaN"
    if isinstance(value, bool):
        return "1" if value else "0"
    if isinstance(value, int):
        return str(value)
    if math.isnan(value):
        return "NaN"
    if math.isinf(value):
        return "+Inf" if value > 0 else "-Inf"
    return repr(float(value))


def _labels(labels: dict[str, str]) -> str:
    if not labels:
        return ""
    return "{" + ",".join(f'{name}="{_escape_label(value)}"' for name, value in labels.items()) + "}"


class _Exposition:
    def __init__(self) -> None:
        self.lines: list[str] = []

    def family(self, name: str, kind: str, help_text: str,
               samples: list[tuple[str, dict[str, str], float | int | bool | None]]) -> None:
        self.lines.append(f"# HELP {name} {_escape_help(help_text)}")
        self.lines.append(f"# TYPE {name} {kind}")
        for sample_name, labels, value in samples:
            self.lines.append(f"{sample_name}{_labels(labels)} {_number(value)}")

    def gauge(self, name: str, help_text: str, value, labels: dict[str, str] | None = None) -> None:
        self.family(name, "gauge", help_text, [(name, labels or {}, value)])

    def counter(self, name: str, help_text: str, value) -> None:
        assert name.endswith("_total")
        self.family(name, "counter", help_text, [(name, {}, value)])


PREFIX = "walqueue_"


def render_prometheus(stats: DaemonStats) -> str:
    """The report in the Prometheus text exposition format 0.0.4 (ends with a newline)."""
    out = _Exposition()
    q = stats.queue
    out.gauge(PREFIX + "info", "walqueued's queue directory (always 1).", 1,
              {"directory": stats.directory})
    out.family(PREFIX + "tasks", "gauge", "Tasks in the queue by status.",
               [(PREFIX + "tasks", {"status": status}, getattr(q, status))
                for status in ("ready", "leased", "completed", "dead")])
    out.gauge(PREFIX + "oldest_ready_age_seconds",
              "Seconds the longest-waiting due ready task has been due and unleased (0 if none).",
              stats.oldest_ready_age_seconds)
    out.gauge(PREFIX + "leases_past_half",
              "Leased tasks at or past half of their lease (expired but not yet reaped included).",
              stats.leases_past_half)
    out.gauge(PREFIX + "last_seq", "Seq of the last WAL record.", q.last_seq)
    out.gauge(PREFIX + "snapshot_seq", "Seq of the published snapshot (0 before the first compaction).",
              q.snapshot_seq)
    out.gauge(PREFIX + "wal_bytes", "Bytes of complete frames in the WAL segments since the snapshot.",
              q.wal_bytes)
    out.gauge(PREFIX + "compaction_threshold_bytes",
              "WAL size past which the daemon compacts on its own (--compact-wal-bytes).",
              stats.compact_wal_bytes)
    out.gauge(PREFIX + "wal_segments", "WAL segment files the queue holds.", stats.wal_segments)
    fsync_samples = [(PREFIX + "fsync_duration_seconds", {"quantile": str(q_)}, value)
                     for q_, value in zip(QUANTILES, (stats.fsync_p50_seconds, stats.fsync_p99_seconds),
                                          strict=True)]
    fsync_samples += [(PREFIX + "fsync_duration_seconds_sum", {}, stats.fsync_seconds_total),
                      (PREFIX + "fsync_duration_seconds_count", {}, stats.fsyncs_total)]
    out.family(PREFIX + "fsync_duration_seconds", "summary",
               f"Group-commit WAL fsync time; quantiles over the last {FSYNC_WINDOW} fsyncs within "
               f"{FSYNC_WINDOW_SECONDS:g} s (NaN if none), count and sum since start.",
               fsync_samples)
    out.counter(PREFIX + "requests_total", "Requests applied since start.", stats.requests_total)
    out.gauge(PREFIX + "requests_per_fsync",
              "Mean requests per group-commit batch over the fsync window (NaN if none).",
              stats.requests_per_fsync)
    out.counter(PREFIX + "write_failures_total",
                "Batches whose WAL write or fsync failed (the daemon reopened the queue).",
                stats.write_failures_total)
    out.counter(PREFIX + "compactions_total", "Compactions since start (automatic and requested).",
                stats.compactions_total)
    out.gauge(PREFIX + "last_compaction_duration_seconds",
              "Duration of the last compaction (NaN if none since start).", stats.last_compaction_seconds)
    out.gauge(PREFIX + "connections", "Open client connections.", stats.connections)
    out.gauge(PREFIX + "parked_reserves", "Reserves waiting for a task to become due.",
              stats.parked_reserves)
    out.gauge(PREFIX + "paused", "1 while reserves are paused, else 0.", stats.paused)
    out.gauge(PREFIX + "uptime_seconds", "Seconds since the daemon started serving.",
              stats.uptime_seconds)
    out.gauge(PREFIX + "start_time_seconds", "Unix time at which the daemon started.",
              stats.start_time_seconds)
    out.gauge(PREFIX + "last_recovery_duration_seconds",
              "Duration of the last recovery (opening the queue at start or after a write failure).",
              stats.last_recovery_seconds)
    return "\n".join(out.lines) + "\n"
