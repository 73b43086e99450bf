"""Where a slow loop turn spent its time, said in the log (docs/daemon.md, "Compaction under load").

walqueued answers nobody while a turn runs, so a turn over SLOW_TURN_SECONDS
is a stall its clients see. The loop marks the end of each part of a turn;
a slow one is logged with its parts, and so is a poll that returned long
after its timeout (the process was not running: CPU starvation, a stopped
VM), which no part of a turn would show. The count of slow turns and the
longest turn go into the daemon's report (walqueue_slow_turns_total,
walqueue_longest_turn_seconds).

The loop hands it its own monotonic clock, the one the recorder times the
WAL fsync with: a part and its fsync share must be read off one clock, or a
share can exceed its part, or a real part too short to print hide a share
from the other clock. It decides nothing.
"""

from __future__ import annotations

import time

from .log import log

SLOW_TURN_SECONDS = 0.1


class TurnTimer:
    """Marks of the parts of one turn; `end` logs the turn if it was slow."""

    def __init__(self, slow_seconds: float = SLOW_TURN_SECONDS, clock=time.monotonic) -> None:
        self.slow_seconds = slow_seconds
        self.slow_turns = 0
        self.longest_seconds = 0.0
        self._clock = clock
        self._parts: list[tuple[str, float, tuple[str, float] | None]] = []
        self._started = self._mark = clock()

    def polled(self, timeout: float | None) -> None:
        """The poll returned; a turn begins. A poll far past its timeout is logged."""
        now = self._clock()
        waited = now - self._mark
        if timeout is not None and waited - timeout > self.slow_seconds:
            log.warning("the loop's poll returned %.0f ms after its %.0f ms timeout: the process was "
                        "not running (CPU starvation, a paused machine?)",
                        (waited - timeout) * 1e3, timeout * 1e3)
        self._parts.clear()
        self._started = self._mark = now

    def part(self, name: str, *, of_which: tuple[str, float] | None = None) -> None:
        """The part of the turn called `name` ended now.

        `of_which` is a share of it measured elsewhere, (name, seconds): the
        WAL fsync inside "applying and fsync", so that a slow turn's line
        says whether the disk or the loop's own work took the time.
        """
        now = self._clock()
        self._parts.append((name, now - self._mark, of_which))
        self._mark = now

    def end(self) -> None:
        """The turn ended: log it if it took longer than slow_seconds."""
        now = self._clock()
        seconds = now - self._started
        self._mark = now
        self.longest_seconds = max(self.longest_seconds, seconds)
        if seconds > self.slow_seconds:
            self.slow_turns += 1
            log.warning("a loop turn took %.0f ms, answering no one: %s", seconds * 1e3,
                        ", ".join(_said(*part) for part in self._parts if part[1] >= 0.0005)
                        or "no part stood out")


def _said(name: str, seconds: float, of_which: tuple[str, float] | None) -> str:
    """``applying and fsync 289 ms`` or, with a share, ``... 289 ms (fsync 288 ms)``."""
    if of_which is None or of_which[1] < 0.0005:
        return f"{name} {seconds * 1e3:.0f} ms"
    return f"{name} {seconds * 1e3:.0f} ms ({of_which[0]} {of_which[1] * 1e3:.0f} ms)"
