"""The one retry policy of both clients: which calls are sent again, for how long, how often.

A ``Retry`` is made for one API call before its first attempt; after each
failed attempt the client asks it ``pause_after(error, now=...)``: the
seconds to wait before the next attempt, or None to raise ``error``. It
reads no clock and never sleeps: the sync client passes ``time.monotonic()``
and sleeps, the asyncio client passes the same and awaits ``asyncio.sleep``.

The rules:

1. Only idempotent calls are retried (``Call.idempotent``: ``put`` and
   ``put_many``, idempotent by key with an absolute ``available_at``, and
   ``pause``/``resume``). ``reserve`` never is (a lost answer would strand
   a lease until it expires), nor ``ack``, ``ack_and_reserve``, ``release``
   and ``touch``: their outcome after a lost answer needs the lease's
   generation to judge, which the Worker does (``walqueue.worker.policy``).
2. Only failures a retry can cure: ``Unavailable`` (the connection broke or
   the connect failed) and ``QueueClosed`` answered by the daemon (a write
   failed there and it reopened its queue). Never ``NoSocket`` (a path that
   is missing on a client that never reached a daemon, or is not a socket),
   and never once the client itself was closed.
3. For ``retry_seconds`` from the first attempt, pausing 0.05, 0.1, 0.2,
   0.5, then 1 s between attempts, and never past that deadline.
"""

from __future__ import annotations

from walqueue import QueueClosed, Unavailable
from walqueue.client.calls import NoSocket

DEFAULT_RETRY_SECONDS = 10.0
RETRY_BACKOFF_SECONDS = (0.05, 0.1, 0.2, 0.5, 1.0)


class Retry:
    """The retries left to one call. See the module docstring."""

    def __init__(self, *, idempotent: bool, retry_seconds: float, now: float) -> None:
        self.idempotent = idempotent
        self.deadline = now + retry_seconds
        self.attempts = 1

    def pause_after(self, error: BaseException, *, now: float, client_closed: bool) -> float | None:
        """Seconds to wait before trying again after ``error``, or None: give up and raise it."""
        if not self.idempotent or client_closed or now >= self.deadline:
            return None
        if isinstance(error, NoSocket) or not isinstance(error, Unavailable | QueueClosed):
            return None
        pause = RETRY_BACKOFF_SECONDS[min(self.attempts, len(RETRY_BACKOFF_SECONDS)) - 1]
        self.attempts += 1
        return min(pause, self.deadline - now)
