"""Clocks for Worker tests: time moves only when the test says (or, with ``jump=True``,
straight to the end of any timed wait), so intervals and deadlines pass without sleeping.
A jumping clock makes every interval pass at once: give such Workers ``touch=False``
when their handlers take long, or the toucher touches without pause.

They keep ``walqueue.worker.policy``'s clock contract. Every real-time wait
here is bounded (REAL_SECONDS) and fails loudly instead of hanging.
"""

import asyncio
import threading
import time

REAL_SECONDS = 20.0


class _Event:
    """A threading event that wakes the ManualClock's waiters when set."""

    def __init__(self, clock):
        self._clock = clock
        self._flag = False

    def set(self):
        with self._clock.changed:
            self._flag = True
            self._clock.changed.notify_all()

    def clear(self):
        with self._clock.changed:
            self._flag = False

    def is_set(self):
        return self._flag


class ManualClock:
    """For the thread Worker. ``jump=True``: a timed wait returns at once, time moved to its end."""

    def __init__(self, *, jump=False, start=1000.0):
        self.changed = threading.Condition()
        self.jump = jump
        self._now = start
        self._deadlines = []  # of the timed waits in progress
        self.waiting = 0  # threads in wait(), timed or not

    def now(self):
        with self.changed:
            return self._now

    def event(self):
        return _Event(self)

    def wait(self, event, seconds):
        with self.changed:
            deadline = None if seconds is None else self._now + max(0.0, seconds)
            if deadline is not None and self.jump and not event.is_set():
                self._now = max(self._now, deadline)
                self.changed.notify_all()
                return False
            if deadline is not None:
                self._deadlines.append(deadline)
            self.waiting += 1
            self.changed.notify_all()
            try:
                limit = time.monotonic() + REAL_SECONDS
                while not event.is_set():
                    if deadline is not None and self._now >= deadline:
                        return False
                    if not self.changed.wait(limit - time.monotonic()):
                        raise AssertionError(f"waited {REAL_SECONDS} real seconds on a manual clock")
                return True
            finally:
                self.waiting -= 1
                if deadline is not None:
                    self._deadlines.remove(deadline)

    def wait_for_waiting(self, count):
        """Until ``count`` threads are in wait() (real time, bounded)."""
        with self.changed:
            if not self.changed.wait_for(lambda: self.waiting >= count, REAL_SECONDS):
                raise AssertionError(f"{self.waiting} threads wait on the clock, not {count}")

    def advance(self, seconds):
        with self.changed:
            self._now += seconds
            self.changed.notify_all()

    def next_deadline(self, *, after=None):
        """The earliest deadline a thread waits for (past ``after``), once one does."""
        with self.changed:
            if not self.changed.wait_for(lambda: any(d > (after or -1) for d in self._deadlines), REAL_SECONDS):
                raise AssertionError(f"no timed wait on the clock within {REAL_SECONDS} real seconds")
            return min(d for d in self._deadlines if d > (after or -1))

    def advance_to_next_deadline(self):
        deadline = self.next_deadline(after=self.now())
        self.advance(deadline - self.now())
        return deadline


class AsyncManualClock:
    """For the asyncio Worker; use it from one event loop."""

    def __init__(self, *, jump=False, start=1000.0):
        self.jump = jump
        self._now = start
        self._timers = []  # (deadline, future) of the timed waits in progress
        self._waiting = asyncio.Event()

    def now(self):
        return self._now

    def event(self):
        return asyncio.Event()

    async def wait(self, event, seconds):
        if event.is_set():
            return True
        if seconds is None:
            await asyncio.wait_for(event.wait(), REAL_SECONDS)
            return True
        deadline = self._now + max(0.0, seconds)
        if self.jump:
            self._now = max(self._now, deadline)
            await asyncio.sleep(0)  # a waiter must let the others run, or a loop of waits would starve them
            return event.is_set()
        timer = asyncio.get_running_loop().create_future()
        entry = (deadline, timer)
        self._timers.append(entry)
        self._waiting.set()
        setter = asyncio.ensure_future(event.wait())
        try:
            done, _ = await asyncio.wait({timer, setter}, timeout=REAL_SECONDS, return_when=asyncio.FIRST_COMPLETED)
            if not done:
                raise AssertionError(f"waited {REAL_SECONDS} real seconds on a manual clock")
        finally:
            setter.cancel()
            self._timers.remove(entry)
        return event.is_set()

    def advance(self, seconds):
        self._now += seconds
        for deadline, timer in self._timers:
            if deadline <= self._now and not timer.done():
                timer.set_result(None)

    async def advance_to_next_deadline(self):
        """Wait (real time, bounded) for a timed wait past now, then move time to its deadline."""
        async def some_timer():
            while not any(deadline > self._now for deadline, _ in self._timers):
                self._waiting.clear()
                await self._waiting.wait()

        await asyncio.wait_for(some_timer(), REAL_SECONDS)
        deadline = min(deadline for deadline, _ in self._timers if deadline > self._now)
        self.advance(deadline - self._now)
        return deadline
