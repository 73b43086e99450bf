"""The asyncio Worker: ``walqueue.worker.policy`` run on asyncio tasks (also ``walqueue.aio.Worker``).

``concurrency`` slot tasks each call ``await handler(lease)`` for one task at
a time, one toucher task extends their leases, and ``run()`` supervises
them. All of it shares the client's one connection, so N slots pipeline
their calls. A plain (non-async) handler is called as is and blocks the
event loop, and the touches, while it runs: put blocking work in
``asyncio.to_thread``.
"""

from __future__ import annotations

import asyncio
import os
from collections.abc import Awaitable, Callable
from typing import Any

from walqueue.values import Lease
from walqueue.worker.clock import AsyncioClock
from walqueue.worker.policy import Policy, Steps, drive_async, exponential_backoff

__all__ = ["Worker"]


class Worker(Policy):
    """Runs ``await handler(lease)`` for each reserved task, ``concurrency`` at a time.

    The options are those of ``walqueue.worker.Worker`` (see
    ``walqueue.worker.policy``); ``client`` is an asyncio client
    (``walqueue.aio.Client``, ``walqueue.pg.AsyncClient``, or anything with
    the policy's methods as coroutines) or a socket/directory path, for which
    a ``walqueue.aio.Client`` is made. Call ``stop()`` from the event loop
    (e.g. ``loop.add_signal_handler(signal.SIGTERM, worker.stop)``).
    Cancelling ``run()`` cancels the handlers in hand and leaves their leases
    to expire.
    """

    def __init__(
        self,
        client: Any,
        worker: str,
        handler: Callable[[Lease], Awaitable[Any] | Any],
        *,
        lease_seconds: int = 30,
        wait: float = 30,
        backoff: Callable[[int], int] = exponential_backoff,
        touch: bool = True,
        concurrency: int = 1,
        stop_timeout_seconds: float | None = None,
        clock: Any = None,
    ) -> None:
        if isinstance(client, str | os.PathLike):
            from walqueue.aio import Client

            client = Client(client, name=worker)
        super().__init__(client, worker, handler, lease_seconds=lease_seconds, wait=wait, backoff=backoff,
                         touch=touch, concurrency=concurrency, stop_timeout_seconds=stop_timeout_seconds,
                         clock=clock or AsyncioClock())

    async def run(self, *, max_tasks: int | None = None) -> int:
        """Process tasks until ``stop()`` or ``max_tasks``; returns how many were taken in hand.

        Re-raises what ended a slot (e.g. ``QueueClosed`` once the client was closed).
        """
        self._begin(max_tasks)
        loop = asyncio.get_running_loop()
        slots = [loop.create_task(self._drive(self.slot()), name=f"walqueue-slot-{number}")
                 for number in range(self.concurrency)]
        toucher = loop.create_task(self._drive(self.touching()), name="walqueue-touch") if self.touch else None
        others = [] if toucher is None else [toucher]
        try:
            await self._drive(self.supervise())
        except BaseException:
            for task in others:
                task.cancel()
            raise
        finally:
            for task in slots:
                task.cancel()  # only handlers still running after the stop deadline, or when run() was cancelled
            self._end_touching()
            outcomes = await asyncio.gather(*slots, *others, return_exceptions=True)
        errors = [outcome for outcome in outcomes
                  if isinstance(outcome, BaseException) and not isinstance(outcome, asyncio.CancelledError)]
        if errors:
            raise errors[0]
        return self._taken

    async def _drive(self, steps: Steps) -> Any:
        try:
            return await drive_async(steps)
        except BaseException:
            self.stop()
            raise
