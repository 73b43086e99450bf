"""WALQueue: a single-writer durable task queue on the Python standard library.

See SPEC §1 for the API. Everything here is standard library only;
`connect()` imports the client it returns only when called.
"""

from __future__ import annotations

import os

from .backend import is_postgres_target
from .codec import MAX_FRAME_BYTES
from .errors import (
    CorruptStore,
    InjectedCrash,
    InvalidRequest,
    KeyConflict,
    QueueClosed,
    QueueLocked,
    StaleLease,
    Unavailable,
    WalQueueError,
)
from .queue import PHASES, Queue
from .values import Lease, PutRequest, QueueStats, TaskView, WorkerView

__version__ = "0.2.0"

__all__ = [
    "MAX_FRAME_BYTES", "Unavailable", "__version__", "connect", "PHASES", "CorruptStore", "InjectedCrash", "InvalidRequest", "KeyConflict",
    "Lease", "PutRequest", "Queue", "QueueClosed", "QueueLocked", "QueueStats", "StaleLease",
    "TaskView", "WalQueueError", "WorkerView",
]


def connect(target: str | os.PathLike, **options):
    """A client for `target` (SPEC §9), by the one rule of `walqueue.backend.is_postgres_target`.

    A "postgresql://..." or "postgres://..." URL, or a libpq key=value DSN
    ("host=/run/pg dbname=jobs"), gives `walqueue.pg.Client(target,
    **options)` (needs the extra walqueue[postgres]); anything else is a
    socket or directory path and gives `walqueue.client.Client(target,
    **options)` (needs the daemon layer's msgspec). Neither is imported
    until called, so `import walqueue` stays standard-library only.
    """
    text = os.fspath(target)
    if isinstance(text, bytes):
        text = os.fsdecode(text)
    if is_postgres_target(text):
        from .pg import Client as PostgresClient

        return PostgresClient(text, **options)
    from .client import Client as DaemonClient

    return DaemonClient(text, **options)
