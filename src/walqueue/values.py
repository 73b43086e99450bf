"""The public value types (SPEC §1): frozen dataclasses handed to callers.

Every payload a caller receives is a fresh copy, so mutating it can never
change what is stored.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class PutRequest:
    task_id: str
    payload: dict
    key: str | None = None
    available_at: int = 0
    max_attempts: int = 3


@dataclass(frozen=True)
class Lease:
    task_id: str
    worker: str
    generation: int
    deadline: int
    attempts: int
    payload: dict


@dataclass(frozen=True)
class TaskView:
    task_id: str
    key: str
    status: str
    attempts: int
    max_attempts: int
    generation: int
    available_at: int
    deadline: int | None
    worker: str | None
    payload: dict | None


@dataclass(frozen=True)
class QueueStats:
    ready: int
    leased: int
    completed: int
    dead: int
    last_seq: int
    snapshot_seq: int
    wal_bytes: int


@dataclass(frozen=True)
class WorkerView:
    """One worker name as `workers()` sees it (SPEC §8b): the leases it holds now, and
    whether a connection open now used the name (always False where there are no
    connections to see: the library, PostgreSQL)."""

    worker: str
    leases: int
    connected: bool


@dataclass(frozen=True)
class BackupManifest:
    """The files of a consistent copy of a queue directory as of `seq`.

    `files` holds (name, length) pairs: the WAL segments that follow the
    snapshot, oldest first (the active one only up to its last complete
    frame at `seq`), then the snapshot CURRENT names and CURRENT itself,
    each whole. Copying exactly these bytes gives a directory that opens
    with the state as of `seq` (see walqueue.backup).
    """

    directory: str
    seq: int
    files: tuple[tuple[str, int], ...]


def copy_json(value: Any) -> Any:
    """A deep copy of a JSON tree (dicts, lists and immutable scalars)."""
    if isinstance(value, dict):
        return {key: copy_json(item) for key, item in value.items()}
    if isinstance(value, list):
        return [copy_json(item) for item in value]
    return value
