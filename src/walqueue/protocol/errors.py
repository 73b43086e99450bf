"""Errors on the wire: an exception raised while serving to an ``Error`` answer, and back.

The daemon answers a failed request with ``Error{error, message, ...}``:
``error`` is the library exception's class name (SPEC §8), and a client
raises that very class.
"""

from __future__ import annotations

from walqueue import (
    CorruptStore,
    InvalidRequest,
    KeyConflict,
    QueueClosed,
    QueueLocked,
    StaleLease,
    WalQueueError,
)
from walqueue.protocol.framing import ProtocolError
from walqueue.protocol.messages import Error

__all__ = ["ERROR_CLASSES", "error_from_wire", "error_to_wire", "make_stale_lease"]

ERROR_CLASSES: dict[str, type[WalQueueError]] = {
    cls.__name__: cls
    for cls in (WalQueueError, KeyConflict, StaleLease, CorruptStore, QueueLocked, QueueClosed, InvalidRequest)
}


def error_to_wire(request_id: int | None, exc: BaseException, *, fatal: bool = False) -> Error:
    """The wire form of an exception raised while serving a request."""
    if isinstance(exc, ProtocolError):
        return Error(id=request_id, error="InvalidRequest", message=str(exc.args[0]), fatal=True)
    name = type(exc).__name__
    if name not in ERROR_CLASSES:
        # Library subclasses we do not know travel as their nearest known base.
        name = next(
            (cls.__name__ for cls in type(exc).__mro__ if cls.__name__ in ERROR_CLASSES),
            "WalQueueError",
        )
    error = Error(id=request_id, error=name, message=str(exc), fatal=fatal)
    if isinstance(exc, StaleLease):
        error.task_id = getattr(exc, "task_id", None)
        error.status = getattr(exc, "status", None)
        error.generation = getattr(exc, "generation", None)
    return error


def make_stale_lease(message: str, task_id: str | None, status: str | None, generation: int | None) -> StaleLease:
    """Build the library's StaleLease with its §1 attributes, whatever its constructor."""
    try:
        exc = StaleLease(message, task_id=task_id, status=status, generation=generation)
    except TypeError:
        exc = StaleLease(message)
    exc.task_id = task_id
    exc.status = status
    exc.generation = generation
    return exc


def error_from_wire(error: Error) -> WalQueueError:
    """The library exception an ``Error`` answer stands for (WalQueueError if unknown)."""
    if error.error == "StaleLease":
        return make_stale_lease(error.message, error.task_id, error.status, error.generation)
    cls = ERROR_CLASSES.get(error.error, WalQueueError)
    try:
        return cls(error.message)
    except TypeError:
        return WalQueueError(f"{error.error}: {error.message}")
