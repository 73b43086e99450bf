"""The client core without I/O: API arguments to requests, answers to the library's values.

Both clients (``walqueue.client.Client`` over a blocking socket,
``walqueue.client.aio.Client`` over asyncio) send exactly what this module builds
and return exactly what it makes of the answers; they only own sockets.

* ``*_call()`` functions check an API call's arguments (types only: ranges
  and lengths are the daemon's to judge, so a bad argument raises
  ``InvalidRequest`` here instead of making the daemon close the connection
  over an undecodable message) and return a ``Call``: the request, how to
  convert its answer, and how long the daemon may hold the answer back
  (whether it may be sent again is ``walqueue.retry``'s to say, by name).
* ``hello_request``/``hello_answer`` are the first exchange;
  ``encode_request`` frames a numbered request; ``complete`` says when a
  request's answer messages are all in; ``result`` merges them and raises
  the library exception an ``Error`` answer carries.
* ``DaemonUnavailable`` is what a call raises when the daemon cannot be
  reached (SPEC §8); ``NoSocket`` is the kind that retrying cannot cure.
* The exception an ``Error`` answer stands for is chosen by its code
  (``walqueue.protocol.errors``), never by its message text.

Nothing here opens a socket, reads a clock or sleeps: ``put_call`` is given
``now`` to turn a ``delay`` into an absolute ``available_at`` once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any, NamedTuple

import msgspec

from walqueue import InvalidRequest, Lease, Unavailable, WalQueueError, WorkerView
from walqueue import protocol as p
from walqueue.codec import MAX_FRAME_TEXT, mebibytes
from walqueue.listing import check_page

# What walqueue.client exports of this module: a new call builder is added here alone.
__all__ = [
    "Call", "DaemonUnavailable", "HelloRefused", "NoSocket", "ack_and_reserve_call", "ack_call", "backup_begin_call",
    "backup_end_call", "cancel_call", "compact_call", "complete", "daemon_stats_call", "encode_request",
    "force_release_call", "get_call", "hello_answer", "hello_request", "pause_call", "put_call",
    "put_many_call", "release_call", "reserve_call", "result", "resume_call", "revive_call", "stats_call",
    "tasks_call", "tasks_page_call", "touch_call", "workers_call",
]


class DaemonUnavailable(Unavailable):
    """The daemon could not be reached, or the connection broke before the answer.

    The request may or may not have been applied (except for a failed
    connect, where nothing was sent).
    """

    code = "daemon_unavailable"


class NoSocket(DaemonUnavailable):
    """Nothing can listen at the socket path: it does not exist or is not a socket.

    Raised at once, without retrying, by a client that has never reached a
    daemon at that path (a mistyped path, or the wrong file); nothing was sent.
    """

    code = "no_socket"


class HelloRefused(DaemonUnavailable):
    """The daemon answered the hello with an error: it does not speak with this client.

    Not retried: the same client would only be refused again (its cause, an
    InvalidRequest or UnsupportedVersion, says why).
    """

    code = "hello_refused"


# The protocol versions these clients announce, newest first. A daemon older
# than the first refuses that hello (UnsupportedVersion) and closes the
# connection; the client then connects again announcing the next one
# (walqueued 0.1 speaks only version 1; the daemons before the slow-turn
# figures, up to 4; those before error codes, up to 5; those before the
# expiry count, up to 6). The newest brings the daemon's walqueue version, its
# clock, its compaction figures, its slow loop turns, the errors' codes, the
# leases expired and which path runs its hot loops (walqueue.protocol.messages).
CLIENT_PROTOCOL_VERSIONS = (p.EXPIRY_REPORTING_VERSION, p.ERROR_CODE_VERSION, p.TURN_REPORTING_VERSION,
                            p.COMPACTION_REPORTING_VERSION, p.PROTOCOL_VERSION)


def hello_request(name: str, version: int = CLIENT_PROTOCOL_VERSIONS[0]) -> p.Hello:
    # The name only labels the connection in the daemon's log; a hello must
    # stay below protocol.MAX_HELLO_BYTES.
    return p.Hello(id=0, version=version, client=name[:256])


def version_refused(exc: BaseException) -> bool:
    """True if a failed connect was the daemon refusing the hello's protocol version."""
    cause = exc.__cause__ if isinstance(exc, DaemonUnavailable) else exc
    return isinstance(cause, p.UnsupportedVersion)


def hello_answer(path: str, messages: list) -> p.HelloOk:
    """The daemon's ``HelloOk``. Raises the error it answered (UnsupportedVersion for a
    version it does not speak), or DaemonUnavailable."""
    answer = messages[0]
    if isinstance(answer, p.Error):
        if answer.code is msgspec.UNSET and answer.fatal and answer.error == "InvalidRequest":
            # A daemon before error codes (version 6) sends none; the one hello of this
            # package's clients it refuses as InvalidRequest is one of a version it does
            # not speak (the hello is otherwise well-formed and first).
            answer = msgspec.structs.replace(answer, code=p.UNSUPPORTED_VERSION)
        raise p.error_from_wire(answer)
    if not isinstance(answer, p.HelloOk):
        raise DaemonUnavailable(f"walqueued at {path} answered hello with {type(answer).__name__}")
    return answer


def refused(path: str, exc: WalQueueError) -> DaemonUnavailable:
    """The DaemonUnavailable a failed hello raises (``exc`` itself if it already is one)."""
    if isinstance(exc, DaemonUnavailable):
        return exc
    return HelloRefused(f"walqueued at {path} refused the connection: {exc}")


def encode_request(request: p.Request) -> bytes:
    """One numbered request as a frame. Raises InvalidRequest if it cannot be encoded or is too large."""
    try:
        body = p.encode_value(request)
    except (TypeError, OverflowError, ValueError, RecursionError) as exc:
        raise InvalidRequest(f"cannot send {type(request).__name__.lower()}: {exc}") from exc
    if len(body) > p.MAX_BODY_BYTES:
        # The wire's own bound is the frame limit plus room for the message around it; the
        # limit a caller must keep to is the frame's, so the message names that one.
        raise InvalidRequest(f"cannot send {type(request).__name__.lower()}: it is "
                             f"{mebibytes(len(body))} encoded, and one transaction is at most "
                             f"{MAX_FRAME_TEXT} of JSON; split it or make the payload smaller")
    return p.frame(body)


def last_words(message: Any) -> str | None:
    """What an error the daemon sent before closing on us says (e.g. too many connections)."""
    if isinstance(message, p.Error):
        return f"{message.error}: {message.message}"
    return None


def complete(messages: list | None) -> bool:
    """True once the answer messages of one request are all in (the last has no ``more``)."""
    return bool(messages) and not getattr(messages[-1], "more", False)


def result(messages: list) -> Any:
    """The answer of one request: the single message, or a merged list for chunked answers.

    Raises the library exception an ``Error`` answer carries.
    """
    if len(messages) == 1:  # the common case: nothing to merge
        if isinstance(messages[0], p.Error):
            raise p.error_from_wire(messages[0])
        return messages[0]
    first = messages[0]
    for message in messages:
        # An error may also end a chunked answer that had begun.
        if isinstance(message, p.Error):
            raise p.error_from_wire(message)
    if isinstance(first, p.Leases):
        return p.Leases(id=first.id, leases=[lease for m in messages for lease in m.leases])
    if isinstance(first, p.TaskList):
        return p.TaskList(id=first.id, tasks=[task for m in messages for task in m.tasks])
    return first


# -- argument checks: types only (see the module docstring) ---------------------


def _check_str(name: str, value: Any) -> str:
    if not isinstance(value, str):
        raise InvalidRequest(f"{name} must be a str, got {type(value).__name__}")
    return value


def _check_int(name: str, value: Any) -> int:
    if type(value) is bool or not isinstance(value, int):
        raise InvalidRequest(f"{name} must be an int, got {type(value).__name__}")
    if not -(2**63) <= value < 2**64:
        raise InvalidRequest(f"{name} {value} is out of range")
    return int(value)


def _check_payload(task_id: Any, payload: Any) -> dict:
    if not isinstance(payload, Mapping) or not all(isinstance(k, str) for k in payload):
        raise InvalidRequest(f"payload of task {task_id!r} must be a mapping with str keys")
    return dict(payload)


def _put_item(task_id: Any, payload: Any, key: Any, available_at: Any, max_attempts: Any) -> p.PutItem:
    _check_str("task_id", task_id)
    if key is not None:
        _check_str("key", key)
    return p.PutItem(
        task_id=task_id,
        payload=_check_payload(task_id, payload),
        key=key,
        available_at=_check_int("available_at", available_at),
        max_attempts=_check_int("max_attempts", max_attempts),
    )


def _lease_fields(lease: Any) -> tuple[str, str, int]:
    try:
        task_id, worker, generation = lease.task_id, lease.worker, lease.generation
    except AttributeError as exc:
        raise InvalidRequest(f"expected a Lease, got {type(lease).__name__}") from exc
    return _check_str("task_id", task_id), _check_str("worker", worker), _check_int("generation", generation)


# -- the calls -------------------------------------------------------------------


class Call(NamedTuple):
    """One API call without I/O: what to send and what the answer means.

    ``request`` is None when the call needs no round trip (an empty batch);
    ``convert`` turns the merged answer (``result()``) into the API's return
    value; ``wait`` is how long the daemon may hold the answer back (a blocking reserve).
    A tuple: one is built per call, and a frozen dataclass costs a setattr per field.
    """

    request: p.Request | None
    convert: Callable[[Any], Any]
    wait: float = 0.0


def _nothing(answer: Any) -> None:
    return None


def _no_ids(answer: Any) -> list[str]:
    return []


def _task_id(answer: Any) -> str:
    return answer.task_id


def _leases(answer: Any) -> list[Lease]:
    return [p.lease_from_wire(lease) for lease in answer.leases]


def put_call(
    task_id: Any, payload: Any, *, key: Any, available_at: Any, delay: Any, max_attempts: Any, now: float
) -> Call:
    """``put``; ``delay`` is turned into ``available_at`` from ``now`` (wall clock) once, here."""
    if delay is not None:
        _check_int("delay", delay)
        if delay < 0:
            raise InvalidRequest(f"delay of task {task_id!r} must be >= 0, got {delay}")
        if available_at != 0:
            raise InvalidRequest(f"task {task_id!r}: give delay or available_at, not both")
        # Computed once, so a retried put carries the same identity.
        available_at = int(now) + delay
    _check_str("task_id", task_id)
    if key is not None:
        _check_str("key", key)
    request = p.Put(0, task_id, _check_payload(task_id, payload), key, _check_int("available_at", available_at),
                    _check_int("max_attempts", max_attempts))
    return Call(request, _task_id)


def put_many_call(requests: Iterable[Any]) -> Call:
    items = []
    for request in requests:
        item = p.put_item(request)
        items.append(_put_item(item.task_id, item.payload, item.key, item.available_at, item.max_attempts))
    if not items:
        return Call(None, _no_ids)
    return Call(p.PutMany(id=0, requests=items), lambda answer: answer.task_ids)


def reserve_call(worker: Any, *, lease_seconds: Any, limit: Any, wait: Any) -> Call:
    _check_str("worker", worker)
    if type(wait) is bool or not isinstance(wait, int | float):
        raise InvalidRequest(f"wait must be a number of seconds, got {type(wait).__name__}")
    p.check_wait(wait)
    request = p.Reserve(
        id=0,
        worker=worker,
        lease_seconds=_check_int("lease_seconds", lease_seconds),
        limit=_check_int("limit", limit),
        wait=float(wait),
    )
    return Call(request, _leases, wait=float(wait))


def ack_call(lease: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    return Call(p.Ack(id=0, task_id=task_id, worker=worker, generation=generation), _nothing)


def ack_and_reserve_call(lease: Any, *, lease_seconds: Any, limit: Any, wait: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    reserve = reserve_call(worker, lease_seconds=lease_seconds, limit=limit, wait=wait).request
    request = p.AckAndReserve(id=0, task_id=task_id, worker=worker, generation=generation,
                           lease_seconds=reserve.lease_seconds, limit=reserve.limit, wait=reserve.wait)
    return Call(request, _leases, wait=reserve.wait)


def release_call(lease: Any, *, delay: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    request = p.Release(id=0, task_id=task_id, worker=worker, generation=generation, delay=_check_int("delay", delay))
    return Call(request, _nothing)


def touch_call(lease: Any, *, lease_seconds: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    request = p.Touch(
        id=0,
        task_id=task_id,
        worker=worker,
        generation=generation,
        lease_seconds=_check_int("lease_seconds", lease_seconds),
    )
    return Call(request, lambda answer: p.lease_from_wire(answer.lease))


def force_release_call(task_ids: Iterable[Any]) -> Call:
    # Never retried: after a lost answer a retry finds the tasks no longer leased.
    ids = [_check_str("task_id", task_id) for task_id in task_ids]
    if not ids:
        return Call(None, _no_ids)
    return Call(p.ForceRelease(id=0, task_ids=ids), lambda answer: answer.task_ids)


def revive_call(task_ids: Iterable[Any]) -> Call:
    ids = [_check_str("task_id", task_id) for task_id in task_ids]
    if not ids:
        return Call(None, _no_ids)
    return Call(p.Revive(id=0, task_ids=ids), lambda answer: answer.task_ids)


def get_call(task_id: Any) -> Call:
    request = p.Get(id=0, task_id=_check_str("task_id", task_id))
    return Call(request, lambda answer: None if answer.task is None else p.task_from_wire(answer.task))


def tasks_call(status: Any) -> Call:
    if status is not None:
        _check_str("status", status)
    return Call(p.Tasks(id=0, status=status), lambda answer: [p.task_from_wire(task) for task in answer.tasks])


def tasks_page_call(status: Any, *, after: Any, limit: Any) -> Call:
    """One page of ``tasks`` (SPEC §8b): ``limit`` must be given (the shells loop for None)."""
    if status is not None:
        _check_str("status", status)
    after, limit = check_page(after, limit)
    return Call(p.TasksPage(id=0, status=status, after=after, limit=limit),
                lambda answer: [p.task_from_wire(task) for task in answer.tasks])


def cancel_call(task_id: Any) -> Call:
    # Retried after a lost answer: a second cancel of the task it completed does nothing.
    return Call(p.Cancel(id=0, task_id=_check_str("task_id", task_id)), _nothing)


def workers_call() -> Call:
    return Call(p.Workers(id=0), lambda answer: [WorkerView(w.worker, w.leases, w.connected)
                                                 for w in answer.workers])


def connections_call() -> Call:
    return Call(p.Connections(id=0), lambda answer: [
        p.ConnectionView(c.connection, tuple(c.workers), c.leases, c.requests, c.last_request_age_seconds)
        for c in answer.connections])


def stats_call() -> Call:
    return Call(p.Stats(id=0), lambda answer: p.stats_from_wire(answer.stats))


def compact_call() -> Call:
    return Call(p.Compact(id=0), lambda answer: answer.seq)


def pause_call() -> Call:
    # Idempotent: pausing twice is paused; so retrying is safe.
    return Call(p.Pause(id=0), lambda answer: answer.paused)


def resume_call() -> Call:
    return Call(p.Resume(id=0), lambda answer: answer.paused)


def backup_begin_call() -> Call:
    # Not retried: the pin belongs to the connection that asked for it.
    return Call(p.BackupBegin(id=0), p.manifest_from_wire)


def backup_end_call() -> Call:
    return Call(p.BackupEnd(id=0), _nothing)


def daemon_stats_call() -> Call:
    return Call(p.DaemonStatsReq(id=0), lambda answer: p.daemon_stats_from_wire(answer.stats))


