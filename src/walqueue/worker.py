"""A worker loop over ``walqueue.client``: the code most users would write by hand.

``Worker(socket_or_directory, "name", handler).run()`` repeatedly:

1. reserves one task, blocking up to ``wait`` seconds in the daemon;
2. calls ``handler(lease)`` while a background thread touches the lease every
   ``lease_seconds / 3`` seconds so a long handler keeps it;
3. acks on return — with ``ack_and_reserve``, so the ack and the next
   reservation share one round trip and one fsync — or releases with
   ``backoff(attempts)`` seconds of delay when the handler raises (after
   ``max_attempts`` the queue marks the task dead).

An ``ack``/``release`` whose connection broke is retried (up to three tries);
a ``StaleLease`` answer showing the task no longer leased under this lease's
generation means the first attempt already took effect. The handler must be
idempotent: a task whose lease expired (or whose ack was lost with the
daemon) is delivered again.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import Any

from walqueue import Lease, QueueClosed, StaleLease
from walqueue.client import Client, DaemonUnavailable

log = logging.getLogger("walqueue.worker")

MAX_BACKOFF_SECONDS = 300
RECONNECT_PAUSE_SECONDS = 1.0
FINISH_ATTEMPTS = 3


def exponential_backoff(attempts: int) -> int:
    """Seconds before a failed task is due again: 1, 2, 4, ... capped at 300."""
    return min(MAX_BACKOFF_SECONDS, 2 ** max(0, attempts - 1))


class _Toucher(threading.Thread):
    """Extends the lease in hand in the background while a handler runs.

    One thread for the Worker's life (starting a thread per task would cost
    more than a short task); ``hold`` gives it a lease, ``drop`` takes it back
    and returns only once no touch is in flight, so no touch races the ack.
    """

    def __init__(self, client: Client, lease_seconds: int) -> None:
        super().__init__(name="walqueue-touch", daemon=True)
        self.client = client
        self.interval = max(1.0, lease_seconds / 3)
        self.lease_seconds = lease_seconds
        self._lease: Lease | None = None
        self._lock = threading.Lock()  # held while touching, and to swap the lease
        self._changed = threading.Condition(self._lock)
        self._closed = False

    def hold(self, lease: Lease) -> None:
        with self._changed:
            self._lease = lease
            self._changed.notify()

    def drop(self) -> None:
        with self._changed:
            self._lease = None
            self._changed.notify()

    def close(self) -> None:
        with self._changed:
            self._closed = True
            self._lease = None
            self._changed.notify()
        self.join()

    def run(self) -> None:
        with self._changed:
            while not self._closed:
                lease = self._lease
                if lease is None:
                    self._changed.wait()
                    continue
                # Sleep an interval unless the lease changes hands meanwhile.
                if self._changed.wait_for(lambda held=lease: self._lease is not held, self.interval):
                    continue
                try:
                    self._lease = self.client.touch(lease, lease_seconds=self.lease_seconds)
                except StaleLease as exc:
                    log.warning("lost the lease on %s: %s", lease.task_id, exc)
                    self._lease = None
                except (DaemonUnavailable, QueueClosed) as exc:
                    if self.client.closed:
                        return
                    log.warning("touch of %s failed, will retry: %s", lease.task_id, exc)


class Worker:
    """Runs ``handler(lease)`` for each reserved task. See the module docstring."""

    def __init__(
        self,
        client: Client | str,
        worker: str,
        handler: Callable[[Lease], Any],
        *,
        lease_seconds: int = 30,
        wait: float = 30,
        backoff: Callable[[int], int] = exponential_backoff,
        touch: bool = True,
    ) -> None:
        self.client = client if isinstance(client, Client) else Client(client, name=worker)
        self.worker = worker
        self.handler = handler
        self.lease_seconds = lease_seconds
        self.wait = wait
        self.backoff = backoff
        self.touch = touch
        self._stop_event = threading.Event()
        self.processed = 0
        self.failed = 0

    def stop(self) -> None:
        """Ask ``run()`` to return after the task in hand (or the current wait)."""
        self._stop_event.set()

    def run(self, *, max_tasks: int | None = None) -> int:
        """Process tasks until ``stop()`` or ``max_tasks``; returns how many were handled."""
        handled = 0
        leases: list[Lease] = []
        toucher = _Toucher(self.client, self.lease_seconds) if self.touch else None
        if toucher is not None:
            toucher.start()
        try:
            while not self._stop_event.is_set() and (max_tasks is None or handled < max_tasks):
                if not leases:
                    leases = self._reserve()
                    continue
                lease = leases.pop(0)
                handled += 1
                more = not self._stop_event.is_set() and (max_tasks is None or handled < max_tasks)
                leases += self._process(lease, toucher, reserve_next=more and not leases)
        finally:
            if toucher is not None:
                toucher.close()
        return handled

    def _reserve(self) -> list[Lease]:
        try:
            return self.client.reserve(self.worker, lease_seconds=self.lease_seconds, wait=self.wait)
        except (DaemonUnavailable, QueueClosed) as exc:
            if self.client.closed:
                raise
            # The daemon is restarting, or a write failed on its side.
            log.warning("reserve failed, retrying: %s", exc)
            self._stop_event.wait(RECONNECT_PAUSE_SECONDS)
            return []

    def _process(self, lease: Lease, toucher: _Toucher | None, *, reserve_next: bool) -> list[Lease]:
        """Run the handler on ``lease`` and finish it; returns the next leases if it reserved them."""
        if toucher is not None:
            toucher.hold(lease)
        failure: Exception | None = None
        try:
            self.handler(lease)
        except Exception as exc:
            failure = exc
        finally:
            # Stop touching before finishing, so no touch races the ack.
            if toucher is not None:
                toucher.drop()
        if failure is None:
            self.processed += 1
            if reserve_next:
                return self._ack_and_reserve(lease)
            self._finish(lease, lambda: self.client.ack(lease))
            return []
        self.failed += 1
        delay = self.backoff(lease.attempts)
        log.warning("task %s failed (attempt %d), due again in %d s: %r",
                    lease.task_id, lease.attempts, delay, failure)
        self._finish(lease, lambda: self.client.release(lease, delay=delay))
        return []

    def _ack_and_reserve(self, lease: Lease) -> list[Lease]:
        """Ack and reserve the next task in one round trip (and one fsync in the daemon)."""
        try:
            return self.client.ack_and_reserve(lease, lease_seconds=self.lease_seconds, wait=self.wait)
        except StaleLease as exc:
            log.warning("task %s: %s", lease.task_id, exc)
        except (DaemonUnavailable, QueueClosed):
            if self.client.closed:
                raise
            # The ack may or may not have been applied: retry it alone, as a
            # retry (a StaleLease for this very generation then means done).
            self._finish(lease, lambda: self.client.ack(lease), first_attempt=1)
        return []

    def _finish(self, lease: Lease, operation: Callable[[], None], *, first_attempt: int = 0) -> None:
        for attempt in range(first_attempt, FINISH_ATTEMPTS):
            try:
                operation()
                return
            except (DaemonUnavailable, QueueClosed) as exc:
                if attempt == FINISH_ATTEMPTS - 1 or self.client.closed:
                    log.error("could not finish %s, its lease will expire: %s", lease.task_id, exc)
                    return
                self._stop_event.wait(RECONNECT_PAUSE_SECONDS)
            except StaleLease as exc:
                # On a retry, "no longer leased, same generation" means an
                # earlier attempt was applied before its answer was lost.
                if attempt > 0 and exc.status != "leased" and exc.generation == lease.generation:
                    return
                log.warning("task %s: %s", lease.task_id, exc)
                return
