"""Errors on the wire: an exception to an ``Error`` answer and back, by stable codes.

The daemon answers a failed request with ``Error{error, message, code, ...}``:
``error`` is the library exception's class name (SPEC §8), ``code`` (protocol
version 6) the stable code of what went wrong — the class's own ``code``
(``walqueue.errors``) or one of the wire's (``messages.ERROR_CODES``). A peer
of an earlier version is sent no code (`error_for_version`).

A client raises the class the code maps to (`CODE_CLASSES`), provided it is
the class ``error`` names or a subclass of it (so SPEC's "the client raises
that very class" holds); from a daemon before version 6, or for a code newer
than this client, the class ``error`` names. The exception's ``code``
attribute is the wire's code whenever there was one. Programs test the class
or ``exc.code``, never the message text, which may change with any release.
"""

from __future__ import annotations

import msgspec

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
from walqueue.protocol.messages import (
    COMPACTION_FAILED,
    ERROR_CODE_VERSION,
    LISTING_INTERRUPTED,
    PROTOCOL_ERROR,
    REQUEST_REFUSED,
    UNKNOWN_REQUEST,
    UNSENDABLE_ANSWER,
    UNSUPPORTED_VERSION,
    WRITE_FAILED,
    Error,
)

__all__ = [
    "CODE_CLASSES", "ERROR_CLASSES", "UnknownRequest", "UnsupportedVersion", "error_for_version",
    "error_from_wire", "error_to_wire", "make_stale_lease",
]


class UnsupportedVersion(InvalidRequest):
    """The daemon does not speak the protocol version the hello announced: it is older.

    The client connects again announcing an older version
    (``walqueue.client.calls.CLIENT_PROTOCOL_VERSIONS``).
    """

    code = UNSUPPORTED_VERSION


class UnknownRequest(InvalidRequest):
    """The daemon does not know this request type: it is older than this client.

    Nothing was applied, and the daemon closed the connection (the next call reconnects).
    """

    code = UNKNOWN_REQUEST


_LIBRARY_CLASSES = (WalQueueError, KeyConflict, StaleLease, CorruptStore, QueueLocked, QueueClosed,
                    InvalidRequest)
# By the ``error`` field: the library's class names (SPEC §8).
ERROR_CLASSES: dict[str, type[WalQueueError]] = {cls.__name__: cls for cls in _LIBRARY_CLASSES}
# By the ``code`` field: every code this version knows.
CODE_CLASSES: dict[str, type[WalQueueError]] = {
    **{cls.code: cls for cls in _LIBRARY_CLASSES},
    PROTOCOL_ERROR: InvalidRequest,
    UNSUPPORTED_VERSION: UnsupportedVersion,
    UNKNOWN_REQUEST: UnknownRequest,
    REQUEST_REFUSED: InvalidRequest,
    UNSENDABLE_ANSWER: InvalidRequest,
    WRITE_FAILED: QueueClosed,
    LISTING_INTERRUPTED: QueueClosed,
    COMPACTION_FAILED: WalQueueError,
}


def error_to_wire(request_id: int | None, exc: BaseException, *, fatal: bool = False) -> Error:
    """The wire form of an exception raised while serving a request (with its code).

    A ProtocolError is a fatal ``InvalidRequest``; a library subclass the wire
    does not name travels as its nearest named base, with its own code.
    """
    if isinstance(exc, ProtocolError):
        return Error(id=request_id, error="InvalidRequest", message=str(exc.args[0]), fatal=True,
                     code=exc.code)
    cls = next((cls for cls in type(exc).__mro__ if ERROR_CLASSES.get(cls.__name__) is cls), WalQueueError)
    code = getattr(exc, "code", None)
    error = Error(id=request_id, error=cls.__name__, message=str(exc), fatal=fatal,
                  code=code if isinstance(code, str) else cls.code)
    if isinstance(exc, StaleLease):
        error.task_id = getattr(exc, "task_id", None)
        error.status = getattr(exc, "status", None)
        error.generation = getattr(exc, "generation", None)
    return error


def error_for_version(error: Error, protocol_version: int) -> Error:
    """``error`` as a peer speaking ``protocol_version`` may read it: without its code before
    version 6 (that peer would refuse the unknown field)."""
    if protocol_version >= ERROR_CODE_VERSION or error.code is msgspec.UNSET:
        return error
    return msgspec.structs.replace(error, code=msgspec.UNSET)


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
    """The library exception an ``Error`` answer stands for (WalQueueError if unknown); see the
    module docstring for how its class is chosen."""
    named = ERROR_CLASSES.get(error.error, WalQueueError)
    code = error.code
    cls = named if code is msgspec.UNSET else CODE_CLASSES.get(code, named)
    if not issubclass(cls, named):
        cls = named  # a code that contradicts the class name: the name is SPEC's
    if issubclass(cls, StaleLease):
        exc: WalQueueError = make_stale_lease(error.message, error.task_id, error.status, error.generation)
    else:
        try:
            exc = cls(error.message)
        except TypeError:
            exc = WalQueueError(f"{error.error}: {error.message}")
    if code is not msgspec.UNSET:
        exc.code = code
    return exc
