"""The PostgreSQL client's calls without I/O, shared by Client and AsyncClient (walqueue.pg.api).

Each `*_call()` validates the API's arguments exactly as the library does
(walqueue.validation; InvalidRequest before anything is sent) and returns a
`Call`: the one SQL statement to run (a named query of sql/calls.sql, each
a function of the schema, so one statement is one transaction and one round
trip), its parameters, how to turn the rows into the library's values, and
how to turn the functions' SQLSTATEs WQ001/WQ002/WQ003 into KeyConflict,
StaleLease and InvalidRequest with a message naming the task. A Call is
named by its API method, which is how walqueue.retry decides whether it is
sent again after a lost answer. `failure()` maps any other psycopg error:
a broken connection, a shutdown or a read-only standby is
DatabaseUnavailable (the call's outcome is unknown); serialization failures
and deadlocks are `retryable()` inside the call.

Ids, keys and workers travel as the bytes of their UTF-8; payloads as §4's
canonical JSON text. Parameters and results use PostgreSQL's binary format
(`%b`, and cursors made with binary=True): bytea then travels as itself,
not hex-escaped, and an integer is 8 bytes, not digits to parse. Integers
are wrapped as Int8/Int4, so a statement's parameter types, and with them
its one prepared statement, do not change with the values' sizes.
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, NamedTuple

import psycopg
from psycopg.types.numeric import Int4, Int8

from walqueue import cancel, listing, validation
from walqueue.backend import ACK_AND_RESERVE, FORCE_RELEASE
from walqueue.codec import MAX_FRAME_BYTES, MAX_FRAME_TEXT, canonical_json, mebibytes
from walqueue.dsn import redacted
from walqueue.errors import InvalidRequest, KeyConflict, StaleLease, Unavailable, WalQueueError
from walqueue.pg import schema
from walqueue.pg.queries import CHANNEL_PREFIX, Queries
from walqueue.puts import identity_of, plan_puts
from walqueue.values import Lease, QueueStats, TaskView, WorkerView

# What Client and AsyncClient do beyond the common contract (walqueue.backend).
CAPABILITIES = frozenset({ACK_AND_RESERVE, FORCE_RELEASE})
MAX_WAIT_SECONDS = 300
KEY_CONFLICT, STALE_LEASE, INVALID_REQUEST = "WQ001", "WQ002", "WQ003"
# Serialization failure and deadlock: the transaction was rolled back whole.
RETRYABLE_STATES = frozenset({"40001", "40P01"})
# A shutting-down server, a read-only standby, a server out of connections:
# the database cannot take the call now (SQLSTATE classes 08 and 57 too).
UNAVAILABLE_STATES = frozenset({"25006", "53300", "53400"})


class DatabaseUnavailable(Unavailable):
    """PostgreSQL could not be reached, or the connection broke before the answer.

    The call may or may not have taken effect (a retried put is idempotent; a
    retried ack that gets StaleLease "completed" at its own generation had
    succeeded).
    """


class Call(NamedTuple):
    """One API call without I/O.

    `statement` is None when the call needs no round trip (an empty batch).
    `convert(rows)` gives the API's return value; `error(diag_state,
    detail)` the library exception for one of the functions' SQLSTATEs;
    `name` is the API method's (walqueue.retry's rules are by name). A
    reserve may wait up to `wait` seconds for `limit` leases; while it
    waits it runs `again` (a reserve for the same worker; None: itself).
    A tuple: one is built per call, and a frozen dataclass costs a setattr
    per field.
    """

    statement: str | None
    params: tuple | None  # None for a statement without parameters (walqueue.pg.queries on `%`)
    convert: Callable[[list[tuple]], Any]
    error: Callable[[str, dict], WalQueueError] | None = None
    name: str = ""
    wait: float = 0.0
    limit: int = 0
    again: Call | None = None


# The API's statements, in sql/calls.sql.
CALLS_FILE = "calls.sql"


def statements(schema_name: str) -> Queries:
    """The statements of sql/calls.sql for one schema (`statements(s).put`, ...)."""
    return Queries(CALLS_FILE, schema_name)


# -- encoding ------------------------------------------------------------------


def encode_name(text: str) -> bytes:
    return text.encode("utf-8")


def decode_name(data: bytes | None) -> str | None:
    return None if data is None else bytes(data).decode("utf-8")


def queue_name(value: Any) -> str:
    """A queue name: a §1 name without NUL (it is a text column)."""
    name = validation.name(value, "queue")
    if "\x00" in name:
        raise InvalidRequest(f"queue {name!r} contains NUL, which a queue name cannot")
    return name


# PostgreSQL names are at most 63 bytes; the NOTIFY channel is "walqueue:" + the schema.
MAX_SCHEMA_BYTES = 63 - len(CHANNEL_PREFIX)
# CREATE SCHEMA refuses names with this prefix (reserved for the system's schemas).
RESERVED_SCHEMA_PREFIX = "pg_"


def schema_name(value: Any) -> str:
    """A schema name: 1 to 54 bytes of UTF-8 without NUL, not starting with `pg_`.

    Anything else goes: the schema is always composed as a quoted identifier
    (and function bodies get a dollar quote the name does not hold), so quotes,
    `%`, `$`, spaces and placeholders of any style are just characters. 54
    bytes leave room for the NOTIFY channel, "walqueue:" + the name, within
    PostgreSQL's 63.
    """
    name = validation.name(value, "schema")
    if "\x00" in name:
        raise InvalidRequest(f"schema {name!r} contains NUL, which a PostgreSQL name cannot")
    size = len(name.encode("utf-8"))
    if size > MAX_SCHEMA_BYTES:
        raise InvalidRequest(f"schema {name!r} is {size} bytes as UTF-8, above {MAX_SCHEMA_BYTES} "
                             f"(its NOTIFY channel, {CHANNEL_PREFIX!r} + the name, must fit "
                             f"PostgreSQL's 63)")
    if name.startswith(RESERVED_SCHEMA_PREFIX):
        raise InvalidRequest(f"schema {name!r} starts with {RESERVED_SCHEMA_PREFIX!r}, which "
                             f"PostgreSQL reserves for system schemas")
    return name


def wait_seconds(wait: Any) -> float:
    if type(wait) is bool or not isinstance(wait, int | float):
        raise InvalidRequest(f"wait must be a number of seconds, not {type(wait).__name__}")
    if not (math.isfinite(wait) and 0 <= wait <= MAX_WAIT_SECONDS):
        raise InvalidRequest(f"wait={wait} is out of range [0, {MAX_WAIT_SECONDS}]")
    return float(wait)


def _payload(text: str | None) -> dict | None:
    return None if text is None else json.loads(text)


# -- put -----------------------------------------------------------------------


def put_call(statements: Queries, queue: str, task_id: Any, payload: Any, *, key: Any,
             available_at: Any, delay: Any, max_attempts: Any, now: int) -> Call:
    """`put`; `delay` becomes an absolute available_at from `now` once, here, so a
    retried put keeps its identity."""
    if delay is not None:
        delay = validation.integer(delay, "delay")
        if available_at != 0:
            raise InvalidRequest(f"task {task_id!r}: give delay or available_at, not both")
        available_at = validation.time_plus(now, delay, "delay")
    request = validation.put_request(task_id, payload, key, available_at, max_attempts)
    return _put_requests(statements, queue, [request], lambda ids: ids[0], "put")


def put_many_call(statements: Queries, queue: str, requests: Iterable[Any]) -> Call:
    return _put_requests(statements, queue, validation.put_requests(requests), lambda ids: ids, "put_many")


def _put_requests(statements: Queries, queue: str, requests: list[dict],
                  finish: Callable[[list[str]], Any], name: str) -> Call:
    if not requests:
        return Call(None, (), lambda rows: finish([]), name=name)
    # The rules inside one list (identical duplicates collapse, any other
    # collision is a KeyConflict) are the library's own, against an empty
    # store; a list of one has nothing to collide with.
    ids, unique = plan_puts(requests) if len(requests) > 1 else (
        [requests[0]["task_id"]], requests)
    texts = [canonical_json(request["payload"]).decode("utf-8") for request in unique]
    total = sum(map(len, texts))
    if total > MAX_FRAME_BYTES:
        raise InvalidRequest(f"the payloads of this put total {total} bytes ({mebibytes(total)}) of "
                             f"JSON, above the limit of {MAX_FRAME_TEXT} on one transaction")
    columns = (
        [encode_name(request["task_id"]) for request in unique],
        [encode_name(request["key"]) for request in unique],
        [bytes.fromhex(identity_of(request["task_id"], request["payload"], request["available_at"],
                                   request["max_attempts"])) for request in unique],
        [Int8(request["max_attempts"]) for request in unique],
        [Int8(request["available_at"]) for request in unique],
        texts,
    )
    if len(unique) == 1:
        statement, params = statements.put_one, (queue, *(column[0] for column in columns))
    else:
        statement, params = statements.put, (queue, *columns)
    sent = [request["task_id"] for request in unique]

    def convert(rows: list[tuple]) -> Any:
        resolved = dict(zip(sent, (decode_name(task_id) for task_id in rows[0][0]), strict=True))
        return finish([resolved[task_id] for task_id in ids])

    def error(state: str, detail: dict) -> WalQueueError:
        request = unique[detail["index"]]
        if detail["reason"] == "key":
            owner = bytes.fromhex(detail["task_id"]).decode("utf-8")
            return KeyConflict(f"key {request['key']!r} is already used by task {owner!r} "
                               f"with a different request")
        return KeyConflict(f"task id {request['task_id']!r} is already used (under another key)")

    return Call(statement, params, convert, error, name)


# -- leases --------------------------------------------------------------------


def _lease_fields(lease: Any) -> tuple[str, str, int]:
    try:
        task_id, worker, generation = lease.task_id, lease.worker, lease.generation
    except AttributeError:
        raise InvalidRequest(f"expected a Lease, not {type(lease).__name__}") from None
    return (validation.name(task_id, "lease.task_id"), validation.name(worker, "lease.worker"),
            validation.integer(generation, "lease.generation"))


def _stale(task_id: str, worker: str, generation: int) -> Callable[[str, dict], WalQueueError]:
    def error(state: str, detail: dict) -> WalQueueError:
        status, current = detail.get("status"), detail.get("generation")
        if status is None:
            problem = "is unknown"
        elif status != "leased":
            problem = f"is {status} (generation {current})"
        elif current != generation:
            problem = f"is leased at generation {current}, not {generation}"
        else:
            problem = f"is not leased by {worker!r} at generation {generation} any more"
        return StaleLease(f"task {task_id!r} {problem}: the lease is stale",
                          task_id=task_id, status=status, generation=current)
    return error


def _invalid(state: str, detail: dict) -> WalQueueError:
    return InvalidRequest(detail.get("message", "invalid request"))


def _stale_or_invalid(task_id: str, worker: str, generation: int) -> Callable[[str, dict], WalQueueError]:
    """A lease call's errors: StaleLease for WQ002, InvalidRequest (an argument out of range) else."""
    stale = _stale(task_id, worker, generation)

    def error(state: str, detail: dict) -> WalQueueError:
        return stale(state, detail) if state == STALE_LEASE else _invalid(state, detail)
    return error


@dataclass(frozen=True)
class Reserved:
    """A reserve's answer: the leases, and when leasing nothing, the server time at
    which a task next becomes due or a lease expires (None: nothing pending)."""

    leases: list[Lease]
    next_due: int | None


def _reserved(worker: str, wait: float) -> Callable[[list[tuple]], Reserved | list[Lease]]:
    """A reserve's rows as the leases, or for one that may wait (`wait`) as a `Reserved`."""
    def leases(rows: list[tuple]) -> list[Lease]:
        return [Lease(decode_name(task_id), worker, generation, deadline, attempts, _payload(text))
                for task_id, generation, deadline, attempts, text in rows if task_id is not None]

    def reserved(rows: list[tuple]) -> Reserved:
        found = leases(rows)
        return Reserved(found, rows[0][2] if rows and not found else None)
    return reserved if wait else leases


def _reserve_arguments(lease_seconds: Any, limit: Any, wait: Any) -> tuple[int, int, float]:
    return (validation.integer(lease_seconds, "lease_seconds", minimum=1),
            validation.integer(limit, "limit", minimum=1, maximum=validation.MAX_RESERVE_LIMIT),
            wait_seconds(wait))


def reserve_call(statements: Queries, queue: str, worker: Any, *, lease_seconds: Any,
                 limit: Any, wait: Any) -> Call:
    """Its `convert` gives the leases, or with a `wait` a `Reserved` (what a waiter needs)."""
    worker = cancel.check_worker(validation.name(worker, "worker"))
    lease_seconds, limit, wait = _reserve_arguments(lease_seconds, limit, wait)
    return Call(statements.reserve, (queue, encode_name(worker), Int8(lease_seconds), Int4(limit)),
                _reserved(worker, wait), _invalid, "reserve", wait, limit)


def ack_call(statements: Queries, queue: str, lease: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    return Call(statements.ack, (queue, encode_name(task_id), encode_name(worker), Int8(generation)),
                _nothing, _stale(task_id, worker, generation), "ack")


def ack_and_reserve_call(statements: Queries, queue: str, lease: Any, *, lease_seconds: Any,
                         limit: Any, wait: Any) -> Call:
    """Its `convert` gives the leases, or with a `wait` a `Reserved`, for the lease's worker; if
    it leased nothing and may wait, the waiting goes on with plain reserves (the ack is done)."""
    task_id, worker, generation = _lease_fields(lease)
    lease_seconds, limit, wait = _reserve_arguments(lease_seconds, limit, wait)
    params = (queue, encode_name(task_id), encode_name(worker), Int8(generation), Int8(lease_seconds),
              Int4(limit))
    again = None
    if wait:
        again = reserve_call(statements, queue, worker, lease_seconds=lease_seconds, limit=limit,
                             wait=wait)
    return Call(statements.ack_and_reserve, params, _reserved(worker, wait),
                _stale_or_invalid(task_id, worker, generation), "ack_and_reserve", wait, limit, again)


def release_call(statements: Queries, queue: str, lease: Any, *, delay: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    delay = validation.integer(delay, "delay")
    return Call(statements.release,
                (queue, encode_name(task_id), encode_name(worker), Int8(generation), Int8(delay)),
                _nothing, _stale_or_invalid(task_id, worker, generation), "release")


def touch_call(statements: Queries, queue: str, lease: Any, *, lease_seconds: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    lease_seconds = validation.integer(lease_seconds, "lease_seconds", minimum=1)

    def convert(rows: list[tuple]) -> Lease:
        ((deadline, attempts, text),) = rows
        return Lease(task_id, worker, generation, deadline, attempts, _payload(text))

    return Call(statements.touch,
                (queue, encode_name(task_id), encode_name(worker), Int8(generation),
                 Int8(lease_seconds)),
                convert, _stale_or_invalid(task_id, worker, generation), "touch")


def _nothing(rows: list[tuple]) -> None:
    return None


# -- revive and reads ----------------------------------------------------------


def revive_call(statements: Queries, queue: str, task_ids: Any) -> Call:
    if isinstance(task_ids, (str, bytes)) or not isinstance(task_ids, Iterable):
        raise InvalidRequest("task_ids must be a list of task ids")
    unique = list(dict.fromkeys(validation.name(task_id, f"task_ids[{index}]")
                                for index, task_id in enumerate(task_ids)))
    if not unique:
        return Call(None, (), lambda rows: [], name="revive")

    def error(state: str, detail: dict) -> WalQueueError:
        task_id, status = unique[detail["index"]], detail.get("status")
        if status is None:
            return InvalidRequest(f"task {task_id!r} is unknown")
        return InvalidRequest(f"task {task_id!r} is {status}, not dead")

    return Call(statements.revive, (queue, [encode_name(task_id) for task_id in unique]),
                lambda rows: unique, error, "revive")


def force_release_call(statements: Queries, queue: str, task_ids: Any) -> Call:
    """End the listed tasks' current leases, whoever holds them (an operator's call).

    All or nothing: InvalidRequest, changing nothing, if one is unknown, not
    leased, or leased past its deadline. Not retried: after a lost answer a
    retry would find the tasks no longer leased.
    """
    if isinstance(task_ids, (str, bytes)) or not isinstance(task_ids, Iterable):
        raise InvalidRequest("task_ids must be a list of task ids")
    unique = list(dict.fromkeys(validation.name(task_id, f"task_ids[{index}]")
                                for index, task_id in enumerate(task_ids)))
    if not unique:
        return Call(None, (), lambda rows: [], name="force_release")

    def convert(rows: list[tuple]) -> list[str]:
        ((index, status, _),) = rows
        if index is not None:
            raise InvalidRequest(f"task {unique[index]!r} is {status or 'unknown'}, not leased: "
                                 f"there is no lease to release")
        return unique

    return Call(statements.force_release, (queue, [encode_name(task_id) for task_id in unique]),
                convert, name="force_release")


def _view(row: tuple) -> TaskView:
    task_id, key, status, attempts, max_attempts, generation, available_at, deadline, worker, text = row
    return TaskView(decode_name(task_id), decode_name(key), status, attempts, max_attempts,
                    generation, available_at, deadline, decode_name(worker), _payload(text))


def get_call(statements: Queries, queue: str, task_id: Any) -> Call:
    task_id = validation.name(task_id, "task_id")
    return Call(statements.get, (queue, encode_name(task_id)),
                lambda rows: _view(rows[0]) if rows else None, name="get")


def tasks_call(statements: Queries, queue: str, status: Any) -> Call:
    status = validation.status(status)
    return Call(statements.tasks, (queue, status), lambda rows: [_view(row) for row in rows],
                name="tasks")


def tasks_page_call(statements: Queries, queue: str, status: Any, *, after: Any, limit: Any) -> Call:
    """A page of `tasks` (SPEC §8b): one statement on an index that serves it (O(limit));
    `limit` None is every task after the cursor."""
    status = validation.status(status)
    after, limit = listing.check_page(after, limit)
    cursor = b"" if after is None else encode_name(after)
    bound = None if limit is None else Int8(limit)
    if status is None:
        statement, params = statements.page_all, (queue, cursor, bound)
    elif status == "completed":
        statement, params = statements.page_completed, (queue, cursor, bound)
    else:
        statement, params = statements.page_live, (queue, status, cursor, bound)
    return Call(statement, params, lambda rows: [_view(row) for row in rows], name="tasks")


def cancel_call(statements: Queries, queue: str, task_id: Any) -> Call:
    """SPEC §8b's cancel in one statement. Retried after a lost answer: cancelling a completed
    task does nothing."""
    task_id = validation.name(task_id, "task_id")

    def convert(rows: list[tuple]) -> None:
        ((cancelled, now, status, attempts, max_attempts, generation, available_at, deadline, worker,
          completed),) = rows
        if cancelled:
            return
        if status is None and completed:
            return  # completed already: nothing happens
        view = None if status is None else TaskView(
            task_id, task_id, status, attempts, max_attempts, generation, available_at, deadline,
            decode_name(worker), None)
        problem = cancel.refusal(task_id, view, now)
        if problem is None:
            # Cancellable as this statement's snapshot saw it, yet not deleted: a concurrent
            # transaction (a reserve, a reap) changed it first.
            problem = (f"task {task_id!r} changed while it was being cancelled (a worker leased "
                       f"it at that moment?): look at it again")
        if problem is not None:
            raise InvalidRequest(problem)

    return Call(statements.cancel, (queue, encode_name(task_id)), convert, name="cancel")


def workers_call(statements: Queries, queue: str) -> Call:
    """The workers seen in leases; `connected` is always False: PostgreSQL's clients are not
    this client's to see (docs/postgres.md)."""
    return Call(statements.workers, (queue,),
                lambda rows: [WorkerView(decode_name(worker), count, False) for worker, count in rows],
                name="workers")


def expired_total_call(statements: Queries, queue: str) -> Call:
    return Call(statements.expired_total, (queue,), lambda rows: int(rows[0][0]), name="expired_total")


def stats_call(statements: Queries, queue: str) -> Call:
    def convert(rows: list[tuple]) -> QueueStats:
        ((ready, leased, completed, dead),) = rows
        return QueueStats(ready, leased, completed, dead, last_seq=0, snapshot_seq=0, wal_bytes=0)
    return Call(statements.stats, (queue,), convert, name="stats")


# -- the client's own statements (not API calls, never retried) -----------------


def setup_call(statements: Queries) -> Call:
    """At connect: (fsync, synchronous_commit, the server's clock in seconds since the epoch)."""
    return Call(statements.setup, None, lambda rows: rows[0], name="setup")


def schema_exists_call(bookkeeping: Queries, schema_name: str) -> Call:
    return Call(bookkeeping.exists, (schema_name,), lambda rows: rows[0][0], name="exists")


def installed_call(bookkeeping: Queries) -> Call:
    """Its `convert` gives a `schema.Installed`."""
    return Call(bookkeeping.installed, None, schema.installed_of, name="installed")


def registration_call(statement: str, params: tuple) -> Call:
    """A waiter's registration (walqueue.pg.wakeup.Service.registration)."""
    return Call(statement, params, _nothing, name="register")


# -- errors --------------------------------------------------------------------


def retryable(error: BaseException) -> bool:
    """A serialization failure or deadlock: rolled back whole, safe to run again."""
    return isinstance(error, psycopg.Error) and getattr(error, "sqlstate", None) in RETRYABLE_STATES


def describe(dsn: str) -> str:
    """The DSN as messages show it: without its passwords (SPEC §8b), as the user wrote it."""
    return redacted(dsn) or "the default server"


def check_dsn(dsn: str) -> None:
    """InvalidRequest, naming the DSN without its password, if libpq cannot parse it.

    Checked before any pool or connection is made: psycopg_pool logs each
    failed attempt with libpq's message, and libpq's parse errors quote
    pieces of the DSN, its password's too (`invalid percent-encoded token:
    "s3c%zz"`). Raised `from None`: a traceback would print the cause.
    """
    if not isinstance(dsn, str):
        raise InvalidRequest(f"dsn must be a str, got {type(dsn).__name__}")
    try:
        psycopg.conninfo.conninfo_to_dict(dsn)
    except psycopg.ProgrammingError as error:
        message = redacted(str(error).strip(), dsn)
    except UnicodeDecodeError:  # psycopg decodes libpq's answer, percent-decoded bytes and all
        message = "a percent-encoded value in it is not UTF-8"
    else:
        return
    raise InvalidRequest(f"cannot parse the DSN {describe(dsn)}: {message}") from None


def failure(call: Call | None, error: psycopg.Error, dsn: str) -> BaseException:
    """The exception a call raises for `error`: `error` itself if it is none of ours
    (a bug, not the world); the caller keeps `error` as the cause. A message
    names the database by `dsn` and quotes psycopg's, both without the password."""
    state = error.sqlstate or ""
    if state in (KEY_CONFLICT, STALE_LEASE, INVALID_REQUEST):
        detail_text = error.diag.message_detail
        detail = json.loads(detail_text) if detail_text else {}
        if state == INVALID_REQUEST and not detail:
            return InvalidRequest(error.diag.message_primary or "invalid request")
        if call is None or call.error is None:
            return InvalidRequest(error.diag.message_primary or "invalid request")
        return call.error(state, detail)
    if (isinstance(error, (psycopg.OperationalError, psycopg.InterfaceError))
            or state in UNAVAILABLE_STATES or state[:2] in ("08", "57")):
        return DatabaseUnavailable(f"PostgreSQL at {describe(dsn)}: {redacted(str(error), dsn)}".rstrip())
    return error
