"""The daemon's clocks, injected so that tests can drive time by hand.

`SystemClock` reads the real ones. `DaemonNow` is the daemon's ``now`` (SPEC
§8: its own clock, whole seconds, never backwards), which decides leases and
due times; monotonic seconds decide waits, hello and frame deadlines and
timers.

Policy (docs/guarantees.md, "The daemon's clock"): within a run, ``now``
advances with the BOOT clock (CLOCK_BOOTTIME: the monotonic clock plus the
time the machine was suspended) from an anchor taken at start (the wall
clock then), never with the wall clock itself. So a wall clock stepped
forward or back while the daemon runs (a bad NTP server, an operator's
``date -s``) neither stretches nor cuts a lease: a lease of L seconds lasts
between L-1 and L seconds of real time, whatever the wall clock does. A
suspend counts as the real time it is (issue 20 item 13): CLOCK_MONOTONIC
stops while the machine sleeps, so on it a 120 s suspend made a task put
with a delay of 5 s due after 125 s, and every lease and due time of the run
120 s late for good. Where SPEC writes ``now = max(int(time.time()),
last_now)``, this keeps its properties and differs only after a step:
``now`` stays on the time line the daemon started with, and a step is
logged and counted instead. At the next start the anchor is the wall clock
again (deadlines on disk are absolute), so a wall clock that is wrong AT
START is trusted; an operator can end the leases granted meanwhile with
``force_release``.

Waits, the hello, frame and scrape deadlines and the timers stay on the
monotonic clock: they time what a peer does, and a peer on this machine was
suspended too (a frame half sent before a suspend is not late after it).
The select timeout the loop computes from ``now`` is a duration, correct on
either clock; a suspend in the middle of it wakes the loop that much later
in real time (the kernel's timeout does not count the suspend), so a lease
that ended during a suspend is reaped at the next request or when that
timeout ends, at most MAX_TIMER_SECONDS later; any request after the resume
already sees the real ``now``.

A step is a change of more than STEP_THRESHOLD_SECONDS in the offset between
the wall clock and ``now``'s time line (NTP's slewing moves both alike and
is not a step; nor is a suspend, which the wall clock and the boot clock
both count). Each is logged and counted (`steps`); `offset_seconds` is the
current offset. Both are in the daemon's report (metrics). Where there is no
CLOCK_BOOTTIME (it is Linux's), ``now`` follows the monotonic clock.
"""

from __future__ import annotations

import logging
import time
from typing import Protocol

log = logging.getLogger("walqueued")

STEP_THRESHOLD_SECONDS = 2.0


if hasattr(time, "CLOCK_BOOTTIME"):
    def _boot_seconds() -> float:
        return time.clock_gettime(time.CLOCK_BOOTTIME)
else:  # not Linux: no clock that counts a suspend and never steps
    _boot_seconds = time.monotonic


class Clock(Protocol):
    def wall_seconds(self) -> float: ...

    def monotonic_seconds(self) -> float: ...

    def boot_seconds(self) -> float:
        """Like monotonic_seconds, but counting the time the machine was suspended."""
        ...


class SystemClock:
    """The process's real clocks."""

    # The C functions themselves: a loop turn reads the monotonic clock a dozen
    # times, and a Python method around each reading cost more than the reading.
    wall_seconds = staticmethod(time.time)
    monotonic_seconds = staticmethod(time.monotonic)

    def boot_seconds(self) -> float:
        return _boot_seconds()


class DaemonNow:
    """Whole seconds on a time line anchored at the wall clock at start, advancing with the
    boot clock, never going backwards (see the module docstring)."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self._anchor_boot = clock.boot_seconds()
        self._anchor_wall = clock.wall_seconds()
        self.last_now = 0
        self.offset_seconds = 0.0  # wall clock minus the daemon's time line, at the last reading
        self.steps = 0  # wall-clock steps seen since start

    def seconds(self) -> float:
        """The daemon's time line now, in (fractional) seconds; also notices wall-clock steps."""
        elapsed = self._clock.boot_seconds() - self._anchor_boot
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
