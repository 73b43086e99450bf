"""WALQueue: a single-writer durable task queue on the Python standard library.

See SPEC §1 for the API. Everything here is standard library only.
"""

from .codec import MAX_FRAME_BYTES
from .errors import (
    CorruptStore,
    InjectedCrash,
    InvalidRequest,
    KeyConflict,
    QueueClosed,
    QueueLocked,
    StaleLease,
    WalQueueError,
)
from .queue import PHASES, Queue
from .values import Lease, PutRequest, QueueStats, TaskView

__all__ = [
    "MAX_FRAME_BYTES", "PHASES", "CorruptStore", "InjectedCrash", "InvalidRequest", "KeyConflict",
    "Lease", "PutRequest", "Queue", "QueueClosed", "QueueLocked", "QueueStats", "StaleLease",
    "TaskView", "WalQueueError",
]
