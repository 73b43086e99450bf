"""The overview's history: a ring of the queue's counts, sampled by the web process.

Neither backend keeps its history, so the dashboard does: every
SAMPLE_SECONDS it takes a `Sample` (the counts, and the daemon's compaction
figures where it has them), keeps the last hour of them (RING_SAMPLES), and
derives the rates from neighbours: tasks are never deleted, so the growth of
the total counts puts, and the growth of `completed` counts acks (a cancel
completes a task too). Expiries are the growth of the backend's own count
of expired leases (walqueued's `expired_total`, PostgreSQL's
`expired_total()`); a backend without one has no such line. A history starts when the dashboard starts, and a daemon restart
(its start time changes) leaves a gap rather than a spike.

Pure: no clock, no I/O. The caller passes the time of each sample.
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass

SAMPLE_SECONDS = 10.0
HISTORY_SECONDS = 3600.0
RING_SAMPLES = int(HISTORY_SECONDS / SAMPLE_SECONDS) + 1
MAX_COMPACTIONS_SHOWN = 5


@dataclass(frozen=True)
class Sample:
    at: float                      # wall-clock seconds of the web process
    total: int                     # tasks of every status
    completed: int
    expired: int | None = None     # leases expired since start, if the backend counts them
    started: float | None = None   # the daemon's start time (a restart resets its counters)
    compactions: int | None = None
    last_compaction_seconds: float | None = None
    last_compaction_pause_seconds: float | None = None


@dataclass(frozen=True)
class Rate:
    at: float
    puts: float
    acks: float
    expiries: float | None


@dataclass(frozen=True)
class Compaction:
    seen_at: float                 # when the sampler saw it (within SAMPLE_SECONDS of its end)
    seconds: float | None
    pause_seconds: float | None


class History:
    """The last hour of samples, and the compactions seen meanwhile (newest last)."""

    def __init__(self, capacity: int = RING_SAMPLES) -> None:
        self.samples: deque[Sample] = deque(maxlen=capacity)
        self.compactions: deque[Compaction] = deque(maxlen=MAX_COMPACTIONS_SHOWN)

    def add(self, sample: Sample) -> None:
        previous = self.samples[-1] if self.samples else None
        if (previous is not None and previous.started == sample.started
                and sample.compactions is not None and previous.compactions is not None
                and sample.compactions > previous.compactions):
            self.compactions.append(Compaction(sample.at, sample.last_compaction_seconds,
                                               sample.last_compaction_pause_seconds))
        self.samples.append(sample)

    def rates(self) -> list[Rate]:
        """Per-second rates between neighbouring samples, none across a restart or a gap in time."""
        rates = []
        for before, after in zip(self.samples, list(self.samples)[1:], strict=False):
            elapsed = after.at - before.at
            if elapsed <= 0 or before.started != after.started:
                continue
            expiries = None
            if after.expired is not None and before.expired is not None:
                expiries = max(0, after.expired - before.expired) / elapsed
            rates.append(Rate(after.at, max(0, after.total - before.total) / elapsed,
                              max(0, after.completed - before.completed) / elapsed, expiries))
        return rates
