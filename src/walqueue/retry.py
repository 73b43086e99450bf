"""The one retry policy of every client: which calls are sent again after a lost answer, how long to pause.

Both backends' clients (walqueued's ``walqueue.client`` and PostgreSQL's
``walqueue.pg``, sync and asyncio alike) ask this module, by the API
method's name, whether a call whose answer was lost may be sent again, and
make one ``Retry`` per such call before its first attempt. After each failed
attempt they ask it ``pause_after(error, now=..., client_closed=...)``: the
seconds to wait before the next attempt, or None to raise ``error``. It
reads no clock and never sleeps: the sync shells pass ``time.monotonic()``
and sleep, the asyncio shells pass the same and await ``asyncio.sleep``.

The rules (docs/daemon.md, docs/postgres.md):

1. Which calls. A lost answer leaves the outcome unknown, so a call is sent
   again only if sending it twice is the same as sending it once:

   - the reads, ``get``, ``tasks`` (and its pages), ``workers``, ``stats``
     and the daemon's ``daemon_stats``: they change nothing;
   - ``put`` and ``put_many``: idempotent by key (an identical put writes
     nothing and answers the same id; ``delay=`` became an absolute
     ``available_at`` before the first attempt, so a retry carries the same
     identity), the daemon's ``pause``/``resume``, which set a state
     rather than change one, and ``cancel``: cancelling a completed task
     does nothing, so a second cancel after a first that took effect is
     harmless.

   Every other write is never sent again blindly. ``reserve`` (a lost answer
   would strand a lease until it expires, and a second one would lease
   another task), ``ack``, ``ack_and_reserve``, ``release`` and ``touch``:
   whether the lost attempt took effect needs the lease's generation to
   judge, which the Worker does (``walqueue.worker.policy``). ``revive`` and
   ``force_release``: a second one fails on the tasks the first changed.
   ``compact`` and ``backup_begin``/``backup_end``: an operator's actions,
   each with its own answer to read. A call this module has no rule for is
   a ``ValueError``: a new call must be decided here.
2. Which failures. Only those a retry can cure: ``Unavailable`` (the
   connection broke, or the connect failed) and ``QueueClosed`` answered by
   the service (the daemon failed a write and reopened its queue), never one
   of the client's ``incurable`` kinds (``walqueue.client.NoSocket``: no
   daemon can listen at that path), and never once the client itself was
   closed.
3. How long. For ``retry_seconds`` from the first attempt, pausing 0.05,
   0.1, 0.2, 0.5, then 1 s between attempts, and never past that deadline.
"""

from __future__ import annotations

from walqueue.errors import QueueClosed, Unavailable

DEFAULT_RETRY_SECONDS = 10.0
RETRY_BACKOFF_SECONDS = (0.05, 0.1, 0.2, 0.5, 1.0)

# Rule 1, by API method name.
READS = frozenset({"get", "tasks", "tasks_page", "workers", "stats", "daemon_stats", "expired_total",
                   "connections"})
# cancel: a second cancel of the task the first completed does nothing (SPEC §8b).
IDEMPOTENT_WRITES = frozenset({"put", "put_many", "pause", "resume", "cancel"})
NEVER_RETRIED = frozenset({"reserve", "ack", "ack_and_reserve", "release", "touch", "revive",
                           "force_release", "compact", "backup_begin", "backup_end"})
# Rule 2: what a lost answer looks like.
LOST_ANSWER = (Unavailable, QueueClosed)


def retried(call: str) -> bool:
    """True if the API call named `call` is sent again after a lost answer (rule 1).

    Raises ValueError for a name this policy has no rule for.
    """
    if call in READS or call in IDEMPOTENT_WRITES:
        return True
    if call in NEVER_RETRIED:
        return False
    raise ValueError(f"the retry policy (walqueue.retry) has no rule for the call {call!r}: "
                     f"add it to READS, IDEMPOTENT_WRITES or NEVER_RETRIED")


def call_name(builder: object) -> str:
    """The API method a call builder serves: both clients name theirs `<method>_call`."""
    return getattr(builder, "__name__", "").removesuffix("_call")


class Retry:
    """The retries left to one call. See the module docstring."""

    def __init__(self, *, retry_seconds: float, now: float,
                 incurable: tuple[type[BaseException], ...] = ()) -> None:
        self.deadline = now + retry_seconds
        self.incurable = incurable
        self.attempts = 1

    def pause_after(self, error: BaseException, *, now: float, client_closed: bool) -> float | None:
        """Seconds to wait before trying again after ``error``, or None: give up and raise it."""
        if client_closed or now >= self.deadline:
            return None
        if not isinstance(error, LOST_ANSWER) or isinstance(error, self.incurable):
            return None
        pause = RETRY_BACKOFF_SECONDS[min(self.attempts, len(RETRY_BACKOFF_SECONDS)) - 1]
        self.attempts += 1
        return min(pause, self.deadline - now)


def retry_for(call: str, *, retry_seconds: float, now: float,
              incurable: tuple[type[BaseException], ...] = ()) -> Retry | None:
    """A ``Retry`` for one attempt of the API call named `call`, or None if it is never retried.

    Raises ValueError for a name this policy has no rule for.
    """
    if not retried(call):
        return None
    return Retry(retry_seconds=retry_seconds, now=now, incurable=incurable)
