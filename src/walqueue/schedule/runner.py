"""`Scheduler`: puts each period's task of each entry, once, whoever else does too.

The task of entry NAME's period starting at S (seconds since the epoch) is
put with task id and key `NAME@<S as YYYY-MM-DDTHH:MM:SSZ>`, the entry's
payload and max_attempts, and available_at = S. Everything in that request
is a function of the schedule file and S, never of the clock or of the
process that puts it, so SPEC §2's identity is the same from every
scheduler: a second put of the same period returns the existing id and
writes nothing; keys are never reused, so a period done and acked is not
put again either. That, not a leader election, is what makes any number of
schedulers put each period once.

What a Scheduler does at each step, for each entry (walqueue.schedule.periods
says when periods start):

1. Its *window* is the last `catch_up` periods that have started (default 1:
   the current period only).
2. The periods of the window it has not handled are put, oldest first (a
   period older than the current one is a catch-up). Each is looked up
   first, so the log says whether it was there already (another scheduler,
   or this one before a restart) or is put now; the put is sent either way,
   and the store decides: an identical request writes nothing.
3. Periods older than the window that it never handled are skipped, and the
   log says which. At its first step it learns what happened before it ran
   by looking up (`get`) up to LOOKBACK_PERIODS periods before the window,
   newest first, until one is found.
4. A KeyConflict (the file changed — payload or max_attempts — after the
   period was put by someone) is logged with the period and left as it is;
   so is InvalidRequest. The scheduler goes on.
5. `walqueue.errors.Unavailable` (walqueued or PostgreSQL out of reach) ends
   the step; the next step, after a back-off of 0.5 s growing to 30 s,
   starts again from 1 with the clock's new time. A period is marked
   handled only after its put was answered, so nothing still in its window
   is skipped by an outage; a period that leaves the window during one is
   skipped and logged as in 3.

The log (logger "walqueue.scheduler") has one line per put, catch-up,
skip, conflict and outage.
"""

from __future__ import annotations

import collections
import dataclasses
import itertools
import logging
import threading
from collections.abc import Iterable
from typing import Any

from walqueue import display
from walqueue.errors import InvalidRequest, KeyConflict, Unavailable
from walqueue.schedule import periods
from walqueue.schedule.clock import SystemClock
from walqueue.schedule.entries import Entry

LOOKBACK_PERIODS = 100
BACKOFF_SECONDS = (0.5, 1.0, 2.0, 5.0, 10.0, 30.0)
# An idle scheduler looks at the clock at least this often, so a wall clock
# set forward (or a suspended machine) is noticed within it.
MAX_WAIT_SECONDS = 60.0
# How many period ids one skip line names at most (first and last are always named).
SKIP_NAMED_PERIODS = 3
# Skipped periods are counted up to this many (a minutely entry down for a week: "more than").
SKIP_COUNT_LIMIT = 100_000

log = logging.getLogger("walqueue.scheduler")


@dataclasses.dataclass
class _Progress:
    handled: int | None = None    # the latest period start whose put was answered (or refused)
    accounted: int | None = None  # periods up to here were put, handled or reported skipped
    next_due: int | None = None   # no period starts before this (None: not known yet)
    never_again: bool = False     # a cron expression with no period left within 50 years


class Scheduler:
    """Puts the periods of `entries` (walqueue.schedule.load) through `client`.

    `client` is any backend with SPEC's `put` and `get`: walqueue.connect()'s
    clients, or a `walqueue.Queue`. `clock` has `now()` (wall time, seconds
    since the epoch) and `wait(event, seconds)`; the default reads
    time.time(). `run()` works until `stop()` (from a signal handler or
    another thread); `step()` does one pass and returns when the next period
    of any entry starts. `counts` tallies what was done ("put", "caught_up",
    "already_put", "skipped", "conflicts", "refused", "unavailable").
    """

    def __init__(self, client: Any, entries: Iterable[Entry], *, clock: Any = None,
                 logger: logging.Logger | None = None, lookback_periods: int = LOOKBACK_PERIODS) -> None:
        self.client = client
        self.entries = list(entries)
        names = [entry.name for entry in self.entries]
        if len(set(names)) != len(names):
            raise ValueError("two entries have the same name: their task ids would collide")
        self.clock = clock if clock is not None else SystemClock()
        self.log = logger or log
        self.lookback_periods = lookback_periods
        self.counts: collections.Counter[str] = collections.Counter()
        self._progress = {entry.name: _Progress() for entry in self.entries}
        self._stop = threading.Event()

    def stop(self) -> None:
        """Make run() return after the call in flight (safe from a signal handler)."""
        self._stop.set()

    @property
    def stopped(self) -> bool:
        return self._stop.is_set()

    def run(self) -> None:
        """Step and wait until stop(). Raises what a step raises but Unavailable, which it retries."""
        failures = 0
        while not self._stop.is_set():
            try:
                due = self.step()
            except Unavailable as error:
                pause = BACKOFF_SECONDS[min(failures, len(BACKOFF_SECONDS) - 1)]
                failures += 1
                self.counts["unavailable"] += 1
                self.log.warning("the queue is unavailable (%s: %s); trying again in %g s (attempt %d); "
                                 "no period in its window is skipped meanwhile", type(error).__name__,
                                 display.text(str(error)), pause, failures + 1)
                self.clock.wait(self._stop, pause)
                continue
            if failures:
                self.log.info("the queue answers again after %d failed attempt(s)", failures)
                failures = 0
            wait = MAX_WAIT_SECONDS if due is None else min(due - self.clock.now(), MAX_WAIT_SECONDS)
            self.clock.wait(self._stop, wait)

    def step(self) -> int | None:
        """Put every period that is due and not yet handled; the start of the next period of any
        entry (None if none will start). Raises Unavailable, leaving the rest for the next step."""
        now = int(self.clock.now())
        for entry in self.entries:
            if self._stop.is_set():
                break
            self._step_entry(entry, now)
        upcoming = [progress.next_due for progress in self._progress.values()
                    if progress.next_due is not None and not progress.never_again]
        return min(upcoming, default=None)

    # -- one entry ----------------------------------------------------------------

    def _step_entry(self, entry: Entry, now: int) -> None:
        progress = self._progress[entry.name]
        if progress.next_due is not None and (now < progress.next_due or progress.never_again):
            return  # nothing started since the last step (cron arithmetic is not free)
        window = periods.window(entry.timing, now, entry.catch_up)
        if not window or (progress.handled is not None and progress.handled >= window[-1]):
            self._plan(progress, entry, now)
            return
        if progress.accounted is None:
            self._report_history(entry, window[0])
            progress.accounted = window[0] - 1
        elif progress.accounted < window[0] - 1:
            skipped = list(itertools.islice(periods.starts_after(entry.timing, progress.accounted,
                                                                 window[0] - 1), SKIP_COUNT_LIMIT + 1))
            self._report_skipped(entry, skipped, progress.handled, window[0])
            progress.accounted = window[0] - 1
        for start in window:
            if progress.handled is not None and start <= progress.handled:
                continue
            if self._stop.is_set():
                return
            self._put(entry, start, now, periods_back=len(window) - 1 - window.index(start))
            progress.handled = progress.accounted = start
        self._plan(progress, entry, now)

    @staticmethod
    def _plan(progress: _Progress, entry: Entry, now: int) -> None:
        try:
            progress.next_due = periods.next_start(entry.timing, now)
        except periods.NeverFires:
            progress.next_due, progress.never_again = now, True

    def _put(self, entry: Entry, start: int, now: int, *, periods_back: int) -> None:
        task_id = periods.task_id(entry.name, start)
        shown = display.name(task_id)
        # Looked up first only so the log can say who put it; the put alone decides.
        existing = self.client.get(task_id)
        try:
            self.client.put(task_id, entry.payload, key=task_id, available_at=start,
                            max_attempts=entry.max_attempts)
        except KeyConflict as error:
            self.counts["conflicts"] += 1
            self.log.error("conflict: %s was put before with another identity (payload, max_attempts or "
                           "available_at; did the schedule file change?): left as it is, going on (%s)",
                           shown, display.text(str(error)))
            return
        except InvalidRequest as error:
            self.counts["refused"] += 1
            self.log.error("refused: %s: %s; going on", shown, display.text(str(error)))
            return
        if existing is not None:
            self.counts["already_put"] += 1
            self.log.info("already put: %s (%s), as this file says", shown, existing.status)
        elif periods_back:
            self.counts["caught_up"] += 1
            self.log.info("caught up: %s, %d period(s) back, started %d s ago", shown, periods_back,
                          now - start)
        else:
            self.counts["put"] += 1
            self.log.info("put: %s (started %d s ago)", shown, now - start)

    def _report_history(self, entry: Entry, window_start: int) -> None:
        """At the first step: which periods before the window were never put (by anyone)."""
        missing: list[int] = []
        for start in periods.previous_starts(entry.timing, window_start, self.lookback_periods):
            found = self.client.get(periods.task_id(entry.name, start))
            if found is not None:
                missing.reverse()
                self._report_skipped(entry, missing, start, window_start)
                return
            missing.append(start)
        if missing:
            self.log.info("%s: none of the %d periods before its window (catch_up = %d) was put: a new "
                          "entry, or none was put for longer; starting at %s",
                          display.name(entry.name), len(missing), entry.catch_up,
                          display.name(periods.task_id(entry.name, window_start)))

    def _report_skipped(self, entry: Entry, skipped: list[int], last_put: int | None,
                        window_start: int) -> None:
        """One log line for the periods `skipped` (oldest first; past SKIP_COUNT_LIMIT, the
        first of many), all older than the window starting at `window_start`."""
        if not skipped:
            return
        count = f"{len(skipped)}"
        if len(skipped) > SKIP_COUNT_LIMIT:
            skipped = [skipped[0], periods.latest_start(entry.timing, window_start - 1)]
            count = f"more than {SKIP_COUNT_LIMIT}"
        self.counts["skipped"] += len(skipped) if count.isdigit() else SKIP_COUNT_LIMIT + 1
        ids = [display.name(periods.task_id(entry.name, start)) for start in skipped]
        named = ", ".join(ids) if len(ids) <= SKIP_NAMED_PERIODS and count.isdigit() else f"{ids[0]} … {ids[-1]}"
        since = ("" if last_put is None
                 else f" (the last one put before them: {display.name(periods.task_id(entry.name, last_put))})")
        self.log.warning("skipped: %s period(s) of %s older than its window (catch_up = %d), never put: "
                         "%s%s", count, display.name(entry.name), entry.catch_up, named, since)
