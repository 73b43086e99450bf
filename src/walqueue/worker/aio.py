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
from typing import Any

from walqueue.worker.clock import AsyncioClock
from walqueue.worker.policy import Policy, Steps, drive_async

__all__ = ["Worker"]


class Worker(Policy):
    """Runs ``await handler(lease)`` for each reserved task, ``concurrency`` at a time.

    The arguments and options are ``walqueue.worker.policy.Policy``'s;
    ``client`` is an asyncio client (``walqueue.client.aio.Client``,
    ``walqueue.pg.AsyncClient``, or anything with the policy's methods as
    coroutines), and a path means a ``walqueue.client.aio.Client``. Call ``stop()``
    from the event loop (e.g. ``loop.add_signal_handler(signal.SIGTERM,
    worker.stop)``). Cancelling ``run()`` cancels the handlers in hand and
    leaves their leases to expire.

    A handler's ``SystemExit`` (``sys.exit()``) fails its task like any
    exception. A ``KeyboardInterrupt`` does not: handlers run on the event
    loop's thread, normally the main one, where a Ctrl-C arrives as one (with
    no SIGINT handler, or asyncio.run's second Ctrl-C), so it ends ``run()``
    as before and the leases in hand expire.
    """

    def _client_for_path(self, path: str | os.PathLike, worker: str) -> Any:
        from walqueue.client.aio import Client  # only when given a path, as the thread Worker

        return Client(path, name=worker)

    def _default_clock(self) -> AsyncioClock:
        return AsyncioClock()

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
