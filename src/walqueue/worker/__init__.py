"""``walqueue.worker``: the worker loop most users would otherwise write by hand.

    policy.py  the Worker's decisions, once for both Workers, and what a backend must provide
    clock.py   the real clocks the Workers wait on (tests pass their own)
    aio.py     the asyncio Worker (also ``walqueue.aio.Worker``), over an asyncio client
    cli.py     ``walqueue-worker``: a Worker process for a handler named on the command line

``Worker`` here runs the policy on threads: ``concurrency`` slot threads
(each calls the handler for one task at a time), one toucher thread and a
supervisor thread; ``run()`` waits for the supervisor. Handlers run in the
slot threads; they must be idempotent, since delivery is at-least-once.
"""

from __future__ import annotations

import inspect
import os
import threading
from collections.abc import Callable
from typing import Any

from walqueue.errors import InvalidRequest
from walqueue.worker.clock import SystemClock
from walqueue.worker.policy import HANDLER_FAILURES, Policy, Steps, drive, exponential_backoff

# How often run() wakes to run signal handlers Python has pending (see run()).
SIGNAL_CHECK_SECONDS = 0.1

__all__ = ["Worker", "exponential_backoff"]


class Worker(Policy):
    """Runs ``handler(lease)`` for each reserved task, ``concurrency`` at a time, in threads.

    The arguments and options are ``walqueue.worker.policy.Policy``'s; a
    path as ``client`` means a ``walqueue.client.Client``. Raises
    InvalidRequest for a bad option, and for a coroutine function as the
    handler (run those on ``walqueue.aio.Worker``).

    A handler's ``SystemExit`` and ``KeyboardInterrupt`` fail its task like
    any exception (released with back-off, logged; the Worker goes on).
    Python raises a Ctrl-C only in the main thread and handlers run in slot
    threads, so a KeyboardInterrupt there is the handler's own; a Ctrl-C
    reaches ``run()`` instead.
    """

    handler_failures = (*HANDLER_FAILURES, KeyboardInterrupt)

    def _check_handler(self, handler: Callable) -> None:
        if inspect.iscoroutinefunction(handler):
            raise InvalidRequest(f"handler {getattr(handler, '__qualname__', handler)!r} is a coroutine "
                                 "function: run it on walqueue.aio.Worker")

    def _client_for_path(self, path: str | os.PathLike, worker: str) -> Any:
        from walqueue.client import Client

        return Client(path, name=worker)

    def _default_clock(self) -> SystemClock:
        return SystemClock()

    def run(self, *, max_tasks: int | None = None) -> int:
        """Process tasks until ``stop()`` or ``max_tasks``; returns how many were taken in hand.

        Re-raises what ended a slot (e.g. ``QueueClosed`` once the client was
        closed). A KeyboardInterrupt in the thread that called run() (a
        Ctrl-C) stops the Worker and is re-raised at once; the slot threads
        are daemon threads and finish their tasks meanwhile.
        """
        self._begin(max_tasks)
        errors: list[BaseException] = []
        toucher = self._start(self.touching(), "walqueue-touch", errors) if self.touch else None
        slots = [self._start(self.slot(), f"walqueue-slot-{number}", errors) for number in range(self.concurrency)]
        supervisor = self._start(self.supervise(), "walqueue-supervise", errors)
        try:
            # Timed, so that stop() may run in a signal handler meanwhile: Python runs handlers
            # in the main thread, and a signal the kernel gave another thread (one blocked in a
            # handler's system call, say) would wait for an untimed join to return, forever.
            while supervisor.is_alive():
                supervisor.join(SIGNAL_CHECK_SECONDS)
        except BaseException:
            self.stop()
            raise
        finally:
            self._end_touching()
        if toucher is not None:
            toucher.join()
        if self._running == 0:  # not after the stop deadline, where handlers are left running
            for thread in slots:
                thread.join()
        if errors:
            raise errors[0]
        return self._taken

    def _start(self, steps: Steps, name: str, errors: list[BaseException]) -> threading.Thread:
        def target() -> None:
            try:
                drive(steps)
            except BaseException as exc:
                errors.append(exc)
                self.stop()

        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        return thread
