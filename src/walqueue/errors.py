"""The exception tree of the library (SPEC §1).

Shaped by blame: `InvalidRequest`, `KeyConflict` and `StaleLease` mean the
caller asked for something the queue cannot do (nothing was written);
`CorruptStore` means the files on disk are not what this library writes;
`QueueLocked` and `QueueClosed` are about ownership of the directory.
`InjectedCrash` is a `BaseException` so that `except Exception` in code under
test cannot swallow a simulated death.

Every class has a ``code``: a stable name for programs to test (the message
text may change with any release). It is what crosses walqueued's wire in
``Error.code``; a client's exception carries the wire's code, which may say
more than its class's (e.g. ``write_failed`` on a ``QueueClosed``).
"""

from __future__ import annotations


class WalQueueError(Exception):
    """Base class of every error the library raises on purpose."""

    code = "walqueue_error"


class InvalidRequest(WalQueueError, ValueError):
    """An argument (or a record field) is malformed; nothing was written."""

    code = "invalid_request"


class KeyConflict(WalQueueError):
    """An idempotency key or task id is already taken by a different request."""

    code = "key_conflict"


class StaleLease(WalQueueError):
    """The lease presented is not the task's current lease.

    `status` and `generation` describe the task as it is now (both `None`
    for an unknown task), so a caller can tell "already completed by this
    very lease" (status "completed", same generation) from "lost it".
    """

    code = "stale_lease"

    def __init__(self, message: str, *, task_id: str, status: str | None,
                 generation: int | None) -> None:
        super().__init__(message)
        self.task_id = task_id
        self.status = status
        self.generation = generation

    def __reduce__(self):
        return (_rebuild_stale_lease, (str(self), self.task_id, self.status, self.generation))


def _rebuild_stale_lease(message, task_id, status, generation):
    return StaleLease(message, task_id=task_id, status=status, generation=generation)


class CorruptStore(WalQueueError):
    """A file in the queue directory is damaged or not in the expected format.

    The message names what is at fault; `file` (a name in the queue
    directory), `offset` (of the frame, in that file) and `seq` (of the
    record) say the same for a program, each None when it does not apply or
    is unknown, so nobody has to parse the message.
    """

    code = "corrupt_store"

    def __init__(self, message: str, *, file: str | None = None, offset: int | None = None,
                 seq: int | None = None) -> None:
        super().__init__(message)
        self.file = file
        self.offset = offset
        self.seq = seq

    def __reduce__(self):
        return (_rebuild_corrupt_store, (str(self), self.file, self.offset, self.seq))


def _rebuild_corrupt_store(message, file, offset, seq):
    return CorruptStore(message, file=file, offset=offset, seq=seq)


class QueueLocked(WalQueueError):
    """Another owner holds the directory's lock."""

    code = "queue_locked"


class QueueClosed(WalQueueError):
    """The Queue was closed (by `close()`, or by a failed write or hook)."""

    code = "queue_closed"


class Unavailable(WalQueueError, ConnectionError):
    """The service behind a client (walqueued, PostgreSQL) could not be reached.

    The base of `walqueue.client.DaemonUnavailable` and
    `walqueue.pg.DatabaseUnavailable` (SPEC §9), so a worker handles either
    through one class. A call that raises it may or may not have taken effect.
    """

    code = "unavailable"


class UnsafeDirectoryWarning(UserWarning):
    """Another user could change the queue directory (see walqueue.fs.check_directory_safety).

    A warning, not an error: SPEC lets any directory be a queue, so the
    library only says so; walqueued may refuse such a directory.
    """


class InjectedCrash(BaseException):  # noqa: N818 - the name is part of the contract
    """Raised by a test hook to model process death at a named phase."""
