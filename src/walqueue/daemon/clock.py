"""The daemon's clocks, injected so that tests can drive time by hand.

`SystemClock` reads the real ones. Wall seconds decide leases and due times
(the daemon's ``now``); monotonic seconds decide waits, hello deadlines and
timers, so setting the wall clock cannot stretch a wait. `DaemonNow` keeps
SPEC §8's rule: ``now = max(int(wall), last_now)``, whole seconds that never
go backwards, so a lease of L seconds lasts between L-1 and L seconds.
"""

from __future__ import annotations

import time
from typing import Protocol


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
    """Whole seconds of wall time, never going backwards."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.last_now = 0

    def __call__(self) -> int:
        self.last_now = max(int(self._clock.wall_seconds()), self.last_now)
        return self.last_now
