"""The daemon's report as everyone prints it: DaemonStats and its Prometheus text.

Daemon layer, shared and pure (no I/O, no clock). walqueued builds the
report (walqueue.daemon.recorder), it crosses the wire as
``protocol.DaemonStatsOk`` (``DaemonStats`` is defined there, once, and
re-exported here), and `render_prometheus` turns it into the text
exposition format (version 0.0.4) wherever it is printed, so `walqueue-ctl
metrics` and walqueued's ``GET /metrics`` say the same thing. docs/metrics.md
defines every figure.
"""

from __future__ import annotations

import math

from walqueue.protocol import DaemonStats

__all__ = ["DaemonStats", "FSYNC_WINDOW", "FSYNC_WINDOW_SECONDS", "QUANTILES", "render_prometheus"]

# The daemon's fsync window (walqueue.daemon.recorder keeps it); named here
# because the Prometheus help text states it.
FSYNC_WINDOW = 1024
FSYNC_WINDOW_SECONDS = 60.0
QUANTILES = (0.5, 0.99)


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
    queue = stats.queue
    out.gauge(PREFIX + "info", "walqueued's queue directory (always 1).", 1,
              {"directory": stats.directory})
    out.gauge(PREFIX + "build_info", "The daemon's walqueue version and which path runs its hot "
              "loops, compiled or pure (always 1).", 1,
              {"version": stats.version, "speedups": stats.speedups})
    out.family(PREFIX + "tasks", "gauge", "Tasks in the queue by status.",
               [(PREFIX + "tasks", {"status": status}, getattr(queue, status))
                for status in ("ready", "leased", "completed", "dead")])
    out.gauge(PREFIX + "oldest_ready_age_seconds",
              "Seconds the longest-waiting due ready task has been due and unleased (0 if none).",
              stats.oldest_ready_age_seconds)
    out.gauge(PREFIX + "leases_past_half",
              "Leased tasks at or past half of their lease (expired but not yet reaped included).",
              stats.leases_past_half)
    out.gauge(PREFIX + "last_seq", "Seq of the last WAL record.", queue.last_seq)
    out.gauge(PREFIX + "snapshot_seq", "Seq of the published snapshot (0 before the first compaction).",
              queue.snapshot_seq)
    out.gauge(PREFIX + "wal_bytes", "Bytes of complete frames in the WAL segments since the snapshot.",
              queue.wal_bytes)
    out.gauge(PREFIX + "compaction_threshold_bytes",
              "WAL size past which the daemon compacts on its own (--compact-wal-bytes).",
              stats.compact_wal_bytes)
    out.gauge(PREFIX + "wal_segments", "WAL segment files the queue holds.", stats.wal_segments)
    fsync_samples = [(PREFIX + "fsync_duration_seconds", {"quantile": str(quantile)}, value)
                     for quantile, value in zip(QUANTILES, (stats.fsync_p50_seconds, stats.fsync_p99_seconds),
                                          strict=True)]
    fsync_samples += [(PREFIX + "fsync_duration_seconds_sum", {}, stats.fsync_seconds_total),
                      (PREFIX + "fsync_duration_seconds_count", {}, stats.fsyncs_total)]
    out.family(PREFIX + "fsync_duration_seconds", "summary",
               f"Group-commit WAL fsync time; quantiles over the last {FSYNC_WINDOW} fsyncs within "
               f"{FSYNC_WINDOW_SECONDS:g} s (NaN if none), count and sum since start.",
               fsync_samples)
    out.counter(PREFIX + "requests_total", "Requests applied since start.", stats.requests_total)
    out.counter(PREFIX + "leases_expired_total",
                "Leases that expired (reaped past their deadline) since start.", stats.expired_total)
    out.gauge(PREFIX + "requests_per_fsync",
              "Mean requests per group-commit batch over the fsync window (NaN if none).",
              stats.requests_per_fsync)
    out.counter(PREFIX + "write_failures_total",
                "Batches whose WAL write or fsync failed (the daemon reopened the queue).",
                stats.write_failures_total)
    out.counter(PREFIX + "compactions_total", "Compactions since start (automatic and requested).",
                stats.compactions_total)
    out.gauge(PREFIX + "last_compaction_duration_seconds",
              "Duration of the last compaction, from rotation to publication; the daemon serves "
              "meanwhile (NaN if none since start).", stats.last_compaction_seconds)
    out.gauge(PREFIX + "last_compaction_pause_seconds",
              "How long the last compaction stopped the loop: rotation and fork (NaN if none).",
              stats.last_compaction_pause_seconds)
    out.gauge(PREFIX + "compact_wal_ratio",
              "The daemon compacts past this times the snapshot's size of WAL (--compact-wal-ratio), "
              "and past the threshold bytes.", stats.compact_wal_ratio)
    out.gauge(PREFIX + "compaction_in_progress", "1 while a snapshot child writes or its snapshot "
              "waits to be published, else 0.", stats.compaction_in_progress)
    out.counter(PREFIX + "compaction_failures_total",
                "Compactions that failed (the queue kept every record; retried with a back-off).",
                stats.compaction_failures_total)
    out.gauge(PREFIX + "compaction_consecutive_failures",
              "Compactions that failed in a row since the last one that succeeded (0 = healthy).",
              stats.compaction_consecutive_failures)
    out.gauge(PREFIX + "compaction_retry_in_seconds",
              "Seconds until the next compaction may be attempted after a failure (NaN if not "
              "backing off).", stats.compaction_retry_in_seconds)
    out.family(PREFIX + "last_compaction_error_info", "gauge",
               "Why the last compaction failed (always 1; absent after a success).",
               [(PREFIX + "last_compaction_error_info", {"error": stats.last_compaction_error}, 1)]
               if stats.last_compaction_error else [])
    out.gauge(PREFIX + "snapshot_bytes", "Size of the published snapshot file (0 if none).",
              stats.snapshot_bytes)
    out.counter(PREFIX + "snapshot_bytes_written_total",
                "Bytes of snapshots published since start (write amplification: compare with "
                "wal_bytes_written_total).", stats.snapshot_bytes_written_total)
    out.counter(PREFIX + "wal_bytes_written_total", "Bytes of WAL frames written since start.",
                stats.wal_bytes_written_total)
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
    out.counter(PREFIX + "clock_steps_total",
                "Wall-clock steps of more than 2 s seen since start (leases follow the daemon's own clock).",
                stats.clock_steps_total)
    out.gauge(PREFIX + "clock_offset_seconds",
              "The wall clock minus the daemon's clock, which advances with the monotonic clock.",
              stats.clock_offset_seconds)
    out.counter(PREFIX + "slow_turns_total",
                "Loop turns over 100 ms since start: the daemon answered no one meanwhile (each "
                "is logged with where its time went).", stats.slow_turns_total)
    out.gauge(PREFIX + "longest_turn_seconds",
              "The longest loop turn since start, during which the daemon answered no one.",
              stats.longest_turn_seconds)
    return "\n".join(out.lines) + "\n"
