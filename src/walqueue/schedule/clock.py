"""The clocks a Scheduler reads time from and waits on.

A Scheduler reads time and waits only through its clock: `now()` is wall
time in seconds since the epoch (periods are wall-clock times, so it must be
`time.time()`, not a monotonic clock) and `wait(event, seconds)` returns True
once the event is set, False after `seconds` of that clock.

`SystemClock` is the real one. `JumpingClock` is for tests only: its time
moves from `start` straight to the end of every wait, so a scheduler puts a
hundred periods in the time it takes to put them, and no period can pass
while the scheduler is busy (no test then depends on how fast a process
runs). At `end` it stops, and a wait past it lasts until the event is set.
`walqueue-scheduler` uses it only when the test-only environment variable
WALQUEUE_SCHEDULER_TEST_CLOCK=START:END is set (it logs a warning saying so);
START == END is a clock frozen at START.
"""

from __future__ import annotations

import threading
import time

TEST_CLOCK_VARIABLE = "WALQUEUE_SCHEDULER_TEST_CLOCK"


class SystemClock:
    """time.time(), and threading events."""

    def now(self) -> float:
        return time.time()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.wait(max(0.0, seconds))


class JumpingClock:
    """Test-only: time jumps to the end of each wait, up to `end`, then stands still."""

    def __init__(self, start: float, end: float) -> None:
        if end < start:
            raise ValueError(f"the clock's end {end} is before its start {start}")
        self._now = float(start)
        self.end = float(end)

    def now(self) -> float:
        return self._now

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if event.is_set():
            return True
        target = self._now + max(0.0, seconds)
        if target <= self.end:
            self._now = target
            return event.is_set()
        self._now = self.end
        event.wait()
        return True


def clock_from_variable(value: str) -> JumpingClock:
    """The JumpingClock of WALQUEUE_SCHEDULER_TEST_CLOCK=START:END (seconds since the epoch).
    Raises ValueError saying what is wrong."""
    start, separator, end = value.partition(":")
    try:
        return JumpingClock(int(start), int(end if separator else start))
    except ValueError as error:
        raise ValueError(f"{TEST_CLOCK_VARIABLE}={value!r} is not START:END in whole seconds "
                         f"since the epoch ({error})") from None
