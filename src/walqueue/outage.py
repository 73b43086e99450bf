"""One log line when something starts failing and one when it works again, not one per retry.

A worker that retries its reserve every second through a PostgreSQL or
walqueued restart logged a warning a second (20 in 8 s); the operator
needs to know the outage began, that it is still going (the service's own
health says that), and when it ended. `Outage` is that bookkeeping, for
whoever retries (walqueue.worker, walqueue.pg's listener): `failed(now)`
says whether this failure is the first of an outage (log it at WARNING;
later ones at DEBUG), `healed(now)` after a success says whether an outage
just ended, and how long it lasted (log it at INFO).

No I/O, no clock: `now` is the caller's. Not thread-safe: a caller shared
by threads holds its own lock around it. Standard library only (this is
the library layer).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Healed:
    """An outage that ended: how many failures it saw, over how many seconds."""

    failures: int
    seconds: float


class Outage:
    """The failures of one thing since it last worked."""

    def __init__(self) -> None:
        self.failures = 0
        self.since: float | None = None

    def failed(self, now: float) -> bool:
        """Count a failure; True if it is the first since the thing last worked."""
        self.failures += 1
        if self.since is None:
            self.since = now
            return True
        return False

    def healed(self, now: float) -> Healed | None:
        """After a success: the outage it ends, or None if there was none."""
        if self.since is None:
            return None
        ended = Healed(self.failures, max(0.0, now - self.since))
        self.failures, self.since = 0, None
        return ended


__all__ = ["Healed", "Outage"]
