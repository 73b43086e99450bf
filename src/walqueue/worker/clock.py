"""The clocks the Workers wait on: real time for threads and for asyncio.

A Worker reads time and waits only through its clock (the contract is in
``walqueue.worker.policy``), so a test can hand it a clock that moves only
when the test says, and a touch interval or a stop deadline passes without
anyone sleeping. ``SystemClock`` is the thread Worker's default,
``AsyncioClock`` the asyncio Worker's; both read ``time.monotonic()``.
"""

from __future__ import annotations

import asyncio
import threading
import time


class SystemClock:
    """Monotonic seconds; threading events."""

    def now(self) -> float:
        return time.monotonic()

    def event(self) -> threading.Event:
        return threading.Event()

    def wait(self, event: threading.Event, seconds: float | None) -> bool:
        """True once ``event`` is set, False after ``seconds`` (None: no limit)."""
        return event.wait(None if seconds is None else max(0.0, seconds))


class AsyncioClock:
    """Monotonic seconds; asyncio events (use them from one event loop)."""

    def now(self) -> float:
        return time.monotonic()

    def event(self) -> asyncio.Event:
        return asyncio.Event()

    async def wait(self, event: asyncio.Event, seconds: float | None) -> bool:
        """True once ``event`` is set, False after ``seconds`` (None: no limit)."""
        if seconds is None:
            await event.wait()
            return True
        try:
            async with asyncio.timeout(max(0.0, seconds)):
                await event.wait()
        except TimeoutError:
            return event.is_set()
        return True
