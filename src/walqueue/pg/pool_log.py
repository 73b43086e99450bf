"""psycopg_pool's warnings about walqueue's pools, one per outage instead of one per attempt.

While PostgreSQL restarts, psycopg_pool logs "error connecting in
'walqueue:QUEUE'" at every reconnection attempt (about one a second) and
"discarding closed connection" for each pooled connection it drops: with
the listener's and the worker's own lines, a restart of a few seconds wrote
20 warnings. The worker and the listener say once that the database went
away and once that it is back (walqueue.outage); of the pool's lines this
filter lets through the first of each kind per pool, and then only after
`QUIET_SECONDS` without one, so a new outage is logged again.

Installed on the "psycopg.pool" logger when walqueue.pg is imported; it
touches no record of a pool that is not walqueue's.
"""

from __future__ import annotations

import logging
import threading
import time

POOL_LOGGER = "psycopg.pool"
POOL_NAME_PREFIXES = ("walqueue:", "walqueue-async:")
QUIET_SECONDS = 60.0


class OnePerOutage(logging.Filter):
    """Drops a repeat of a walqueue pool's warning seen less than QUIET_SECONDS before."""

    def __init__(self, clock=time.monotonic) -> None:
        super().__init__()
        self._clock = clock
        self._last: dict[tuple[str, str], float] = {}
        self._lock = threading.Lock()

    def filter(self, record: logging.LogRecord) -> bool:
        key = self._key(record)
        if key is None:
            return True
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            self._last[key] = now
        return last is None or now - last > QUIET_SECONDS

    @staticmethod
    def _key(record: logging.LogRecord) -> tuple[str, str] | None:
        """(the message's template, whose) for a walqueue pool's warning, else None."""
        if record.levelno < logging.WARNING or not record.args:
            return None
        args = record.args if isinstance(record.args, tuple) else (record.args,)
        first = args[0]
        if isinstance(first, str) and first.startswith(POOL_NAME_PREFIXES):
            return str(record.msg), first  # "error connecting in %r: %s", ...
        if type(first).__module__.startswith("walqueue.pg"):
            return str(record.msg), type(first).__qualname__  # "discarding closed connection: %s"
        return None


_installed = False


def install() -> None:
    """Put the filter on psycopg_pool's logger, once per process."""
    global _installed
    if not _installed:
        logging.getLogger(POOL_LOGGER).addFilter(OnePerOutage())
        _installed = True


__all__ = ["QUIET_SECONDS", "OnePerOutage", "install"]
