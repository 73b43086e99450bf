"""The daemon's clocks, injected so that tests can drive time by hand.

`SystemClock` reads the real ones. `DaemonNow` is the daemon's ``now`` (SPEC
§8: its own clock, whole seconds, never backwards), which decides leases and
due times; monotonic seconds decide waits, hello and frame deadlines and
timers.

Policy (docs/guarantees.md, "The daemon's clock"): within a run, ``now``
advances with the MONOTONIC clock from an anchor taken at start (the wall
clock then), never with the wall clock itself. So a wall clock stepped
forward or back while the daemon runs (a bad NTP server, an operator's
``date -s``) neither stretches nor cuts a lease: a lease of L seconds lasts
between L-1 and L seconds of real time, whatever the wall clock does. Where
SPEC writes ``now = max(int(time.time()), last_now)``, this keeps its
properties and differs only after a step: ``now`` stays on the time line
the daemon started with, and a step is logged and counted instead. At the
next start the anchor is the wall clock again (deadlines on disk are
absolute), so a wall clock that is wrong AT START is trusted; an operator
can end the leases granted meanwhile with ``force_release``.

A step is a change of more than STEP_THRESHOLD_SECONDS in the offset between
the wall clock and ``now``'s time line (NTP's slewing moves both alike and
is not a step). Each is logged and counted (`steps`); `offset_seconds` is
the current offset. Both are in the daemon's report (metrics).
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

log = logging.getLogger("walqueued")

STEP_THRESHOLD_SECONDS = 2.0


class Clock(Protocol):
    def wall_seconds(self) -> float: ...

    def monotonic_seconds(self) -> float: ...


class SystemClock:
    """The process's real clocks."""

    def wall_seconds(self) -> float:
        return time.time()

    def monotonic_seconds(self) -> float:
        return time.monotonic()


class DaemonNow:
    """Whole seconds on a time line anchored at the wall clock at start, advancing with the
    monotonic clock, never going backwards (see the module docstring)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._anchor_monotonic = clock.monotonic_seconds()
        self._anchor_wall = clock.wall_seconds()
        self.last_now = 0
        self.offset_seconds = 0.0  # wall clock minus the daemon's time line, at the last reading
        self.steps = 0  # wall-clock steps seen since start

    def seconds(self) -> float:
        """The daemon's time line now, in (fractional) seconds; also notices wall-clock steps."""
        elapsed = self._clock.monotonic_seconds() - self._anchor_monotonic
        daemon_seconds = self._anchor_wall + elapsed
        offset = self._clock.wall_seconds() - daemon_seconds
        if abs(offset - self.offset_seconds) > STEP_THRESHOLD_SECONDS:
            self.steps += 1
            log.warning("the wall clock stepped by %+.1f s (now %+.1f s from the daemon's clock, "
                        "which leases follow; %d step(s) since start)",
                        offset - self.offset_seconds, offset, self.steps)
        self.offset_seconds = offset
        return daemon_seconds

    def __call__(self) -> int:
        self.last_now = max(int(self.seconds()), self.last_now)
        return self.last_now
