"""The client contract every backend keeps, in code: SPEC §8's daemon client and §9's
PostgreSQL client are two implementations of one interface.

`Backend` is the synchronous contract and `AsyncBackend` the asyncio one
(the same methods, as coroutines). Both are `typing.Protocol`s, checked at
run time only for the names (`isinstance`), and by tests/backends for the
behaviour: every client runs the same semantic suite.

What a backend can do beyond the common calls is in its `capabilities`, a
frozenset of the names below, so tools ask instead of keeping lists: a
command whose capability a backend lacks is refused with the reason, never
an AttributeError.

`is_postgres_target(target)` is the one rule that tells a PostgreSQL DSN
from a socket or directory path (SPEC §9), used by `walqueue.connect`, the
worker, the scheduler and the dashboard.

Standard library only (the library layer): nothing here imports a client.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from typing import Any, Protocol, runtime_checkable

from .values import Lease, QueueStats, TaskView, WorkerView

# Capabilities: calls beyond the common contract, by the name of the call.
ACK_AND_RESERVE = "ack_and_reserve"   # ack, then reserve for the lease's worker, in one call
FORCE_RELEASE = "force_release"       # end leases by task id, as an operator
COMPACT = "compact"                   # write a snapshot (the daemon's WAL)
PAUSE = "pause"                       # stop and resume leasing (pause, resume)
BACKUP = "backup"                     # a consistent copy of the files (backup_begin, backup_end)
DAEMON_STATS = "daemon_stats"         # the daemon's own figures (fsyncs, turns, compactions)
CAPABILITIES = frozenset({ACK_AND_RESERVE, FORCE_RELEASE, COMPACT, PAUSE, BACKUP, DAEMON_STATS})

POSTGRES_SCHEMES = ("postgresql://", "postgres://")
# A libpq key=value DSN starts with `keyword=` (its keywords are words: host, dbname, ...).
_KEY_VALUE_DSN = re.compile(r"\s*[A-Za-z_][A-Za-z0-9_]*\s*=")


def is_postgres_target(target: str) -> bool:
    """True if `target` names a PostgreSQL database: a `postgresql://` or `postgres://` URL,
    or a libpq key=value DSN (its first token `name=value`, e.g. `host=/run/pg dbname=jobs`).

    Anything else is a socket or directory path (SPEC §9), also a path with an
    `=` in it past its first word, such as `/srv/a=b` or `./x=1`.
    """
    return target.startswith(POSTGRES_SCHEMES) or _KEY_VALUE_DSN.match(target) is not None


@runtime_checkable
class Backend(Protocol):
    """A synchronous client of one queue (SPEC §8 `walqueue.client.Client`, §9 `walqueue.pg.Client`).

    Every call returns the library's dataclasses and raises the library's
    exceptions, plus `walqueue.errors.Unavailable` when the service cannot
    be reached (the call's outcome is then unknown).
    """

    capabilities: frozenset[str]

    def put(self, task_id: str, payload: Mapping[str, Any], *, key: str | None = None,
            available_at: int = 0, delay: int | None = None, max_attempts: int = 3) -> str: ...

    def put_many(self, requests: Iterable[Any]) -> list[str]: ...

    def reserve(self, worker: str, *, lease_seconds: int = 30, limit: int = 1,
                wait: float = 0) -> list[Lease]: ...

    def ack(self, lease: Lease) -> None: ...

    def release(self, lease: Lease, *, delay: int = 0) -> None: ...

    def touch(self, lease: Lease, *, lease_seconds: int) -> Lease: ...

    def revive(self, task_ids: Iterable[str]) -> list[str]: ...

    def get(self, task_id: str) -> TaskView | None: ...

    def tasks(self, status: str | None = None, *, after: str | None = None,
              limit: int | None = None) -> list[TaskView]: ...

    def cancel(self, task_id: str) -> None: ...

    def workers(self) -> list[WorkerView]: ...

    def stats(self) -> QueueStats: ...

    def close(self) -> None: ...

    @property
    def closed(self) -> bool: ...

    def __enter__(self) -> Backend: ...

    def __exit__(self, *exc_info: object) -> None: ...


@runtime_checkable
class AsyncBackend(Protocol):
    """`Backend` for asyncio: the same calls as coroutines (`await client.put(...)`)."""

    capabilities: frozenset[str]

    async def put(self, task_id: str, payload: Mapping[str, Any], *, key: str | None = None,
                  available_at: int = 0, delay: int | None = None, max_attempts: int = 3) -> str: ...

    async def put_many(self, requests: Iterable[Any]) -> list[str]: ...

    async def reserve(self, worker: str, *, lease_seconds: int = 30, limit: int = 1,
                      wait: float = 0) -> list[Lease]: ...

    async def ack(self, lease: Lease) -> None: ...

    async def release(self, lease: Lease, *, delay: int = 0) -> None: ...

    async def touch(self, lease: Lease, *, lease_seconds: int) -> Lease: ...

    async def revive(self, task_ids: Iterable[str]) -> list[str]: ...

    async def get(self, task_id: str) -> TaskView | None: ...

    async def tasks(self, status: str | None = None, *, after: str | None = None,
                    limit: int | None = None) -> list[TaskView]: ...

    async def cancel(self, task_id: str) -> None: ...

    async def workers(self) -> list[WorkerView]: ...

    async def stats(self) -> QueueStats: ...

    async def close(self) -> None: ...

    @property
    def closed(self) -> bool: ...

    async def __aenter__(self) -> AsyncBackend: ...

    async def __aexit__(self, *exc_info: object) -> None: ...


def lacks(client: Backend | AsyncBackend, capability: str) -> bool:
    """True if `client` cannot do `capability` (a name of CAPABILITIES)."""
    if capability not in CAPABILITIES:
        raise ValueError(f"unknown capability {capability!r}; one of {sorted(CAPABILITIES)}")
    return capability not in getattr(client, "capabilities", frozenset())
