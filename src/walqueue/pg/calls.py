"""The PostgreSQL client's calls without I/O, shared by Client and AsyncClient.

Each `*_call()` validates the API's arguments exactly as the library does
(walqueue.validation; InvalidRequest before anything is sent) and returns a
`Call`: the one SQL statement to run (a function of the schema, so one
statement is one transaction and one round trip), its parameters, how to
turn the rows into the library's values, and how to turn the functions'
SQLSTATEs WQ001/WQ002/WQ003 into KeyConflict, StaleLease and InvalidRequest
with a message naming the task. `failure()` maps any other psycopg error:
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
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import psycopg
from psycopg.types.numeric import Int4, Int8

from walqueue import validation
from walqueue.backend import ACK_AND_RESERVE, FORCE_RELEASE
from walqueue.codec import MAX_FRAME_BYTES, canonical_json
from walqueue.dsn import redacted
from walqueue.errors import InvalidRequest, KeyConflict, StaleLease, Unavailable, WalQueueError
from walqueue.pg.schema import CHANNEL_PREFIX, qualified
from walqueue.queue import _put_request, _put_request_of
from walqueue.state import State, identity_of
from walqueue.values import Lease, QueueStats, TaskView

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


@dataclass(frozen=True)
class Call:
    """One API call without I/O.

    `statement` is None when the call needs no round trip (an empty batch).
    `convert(rows)` gives the API's return value; `error(diag_state,
    detail)` the library exception for one of the functions' SQLSTATEs;
    `idempotent` calls may be retried after DatabaseUnavailable.
    """

    statement: str | None
    params: tuple
    convert: Callable[[list[tuple]], Any]
    error: Callable[[str, dict], WalQueueError] | None = None
    idempotent: bool = False
    wait: float = 0.0


class Statements:
    """The SQL text of each operation for one schema (prepared by the server on first use).

    Every statement is a SELECT, so every call's answer is rows (a void
    function gives one row holding NULL).
    """

    def __init__(self, schema: str) -> None:
        self.schema = schema

        def function(name: str, arguments: str, returns_set: bool = True) -> str:
            if returns_set:
                return f"SELECT * FROM {qualified(schema, name)}({arguments})"
            return f"SELECT {qualified(schema, name)}({arguments})"

        self.put = function("put", "%b, %b, %b, %b, %b, %b, %b", False)
        # One task: scalars, which cost the client far less to send than lists.
        self.put_one = function("put", "%b, ARRAY[%b::bytea], ARRAY[%b::bytea], ARRAY[%b::bytea], "
                                "ARRAY[%b::int8], ARRAY[%b::int8], ARRAY[%b::text]", False)
        self.reserve = function("reserve", "%b, %b, %b, %b")
        self.ack = function("ack", "%b, %b, %b, %b", False)
        self.ack_and_reserve = function("ack_and_reserve", "%b, %b, %b, %b, %b, %b")
        self.release = function("release", "%b, %b, %b, %b, %b", False)
        self.touch = function("touch", "%b, %b, %b, %b, %b")
        self.revive = function("revive", "%b, %b", False)
        self.get = function("get", "%b, %b")
        self.tasks = function("tasks", "%b, %b")
        self.stats = function("stats", "%b")
        self.force_release = _force_release_statement(schema)


def _force_release_statement(schema: str) -> str:
    """End the current leases of a list of tasks, all or none, in one statement.

    The live rows are locked in task_id order (as revive's, so two cannot
    deadlock); if any task is not leased, or its lease has expired, nothing
    is updated and the one row answers the first such task's index and
    status. Otherwise each lease ends as a release at the server's now would
    (ready, or dead at max_attempts; the generation stays, so the holder's
    next ack is stale) and waiters hear of the ready ones.
    """
    live, completed = qualified(schema, "live"), qualified(schema, "completed")
    clock, announce = qualified(schema, "clock"), qualified(schema, "announce")
    return f"""
        WITH args AS (SELECT %b::text AS queue, %b::bytea[] AS ids, {clock}() AS now),
        locked AS (
            SELECT l.task_id, l.status, l.deadline FROM {live} AS l, args
            WHERE l.queue = args.queue AND l.task_id = ANY (args.ids)
            ORDER BY l.task_id FOR UPDATE OF l
        ),
        refused AS (
            SELECT w.ordinality - 1 AS index,
                   CASE WHEN k.status = 'leased' THEN 'expired'
                        WHEN k.status IS NOT NULL THEN k.status
                        WHEN EXISTS (SELECT 1 FROM {completed} AS c
                                     WHERE c.queue = args.queue AND c.task_id = w.id)
                        THEN 'completed' END AS status
            FROM args CROSS JOIN LATERAL unnest(args.ids) WITH ORDINALITY AS w(id, ordinality)
            LEFT JOIN locked AS k ON k.task_id = w.id
            WHERE k.status IS DISTINCT FROM 'leased' OR k.deadline <= args.now
            ORDER BY w.ordinality LIMIT 1
        ),
        released AS (
            UPDATE {live} AS l
            SET status = CASE WHEN l.attempts >= l.max_attempts THEN 'dead' ELSE 'ready' END,
                available_at = args.now, deadline = NULL, worker = NULL
            FROM args, locked
            WHERE NOT EXISTS (SELECT 1 FROM refused)
              AND l.queue = args.queue AND l.task_id = locked.task_id
            RETURNING l.status
        )
        SELECT (SELECT index FROM refused), (SELECT status FROM refused),
               {announce}((SELECT queue FROM args),
                          (SELECT count(*) FROM released WHERE status = 'ready'), NULL)"""


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


def put_call(statements: Statements, queue: str, task_id: Any, payload: Any, *, key: Any,
             available_at: Any, delay: Any, max_attempts: Any, now: int) -> Call:
    """`put`; `delay` becomes an absolute available_at from `now` once, here, so a
    retried put keeps its identity."""
    if delay is not None:
        delay = validation.integer(delay, "delay")
        if available_at != 0:
            raise InvalidRequest(f"task {task_id!r}: give delay or available_at, not both")
        available_at = validation.time_plus(now, delay, "delay")
    request = _put_request(task_id, payload, key, available_at, max_attempts, "")
    return _put_requests(statements, queue, [request], lambda ids: ids[0])


def put_many_call(statements: Statements, queue: str, requests: Iterable[Any]) -> Call:
    if isinstance(requests, (str, bytes, Mapping)) or not isinstance(requests, Iterable):
        raise InvalidRequest("requests must be a list of PutRequest or mappings")
    containers = validation.Containers()  # the request's, shared by its payloads
    validated = [_put_request_of(item, index, containers) for index, item in enumerate(requests)]
    return _put_requests(statements, queue, validated, lambda ids: ids)


def _put_requests(statements: Statements, queue: str, requests: list[dict],
                  finish: Callable[[list[str]], Any]) -> Call:
    if not requests:
        return Call(None, (), lambda rows: finish([]))
    # The rules inside one list (identical duplicates collapse, any other
    # collision is a KeyConflict) are the library's own, against an empty
    # store; a list of one has nothing to collide with.
    ids, unique = State().plan_put(requests) if len(requests) > 1 else (
        [requests[0]["task_id"]], requests)
    texts = [canonical_json(request["payload"]).decode("utf-8") for request in unique]
    if sum(map(len, texts)) > MAX_FRAME_BYTES:
        raise InvalidRequest(f"the payloads of this put total more than {MAX_FRAME_BYTES} bytes")
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

    return Call(statement, params, convert, error, idempotent=True)


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


@dataclass(frozen=True)
class Reserved:
    """A reserve's answer: the leases, and when leasing nothing, the server time at
    which a task next becomes due or a lease expires (None: nothing pending)."""

    leases: list[Lease]
    next_due: int | None


def _reserved(worker: str) -> Callable[[list[tuple]], Reserved]:
    def convert(rows: list[tuple]) -> Reserved:
        leases = [Lease(decode_name(task_id), worker, generation, deadline, attempts, _payload(text))
                  for task_id, generation, deadline, attempts, text in rows if task_id is not None]
        next_due = None
        if not leases and rows:
            next_due = rows[0][2]
        return Reserved(leases, next_due)
    return convert


def _reserve_arguments(lease_seconds: Any, limit: Any, wait: Any) -> tuple[int, int, float]:
    return (validation.integer(lease_seconds, "lease_seconds", minimum=1),
            validation.integer(limit, "limit", minimum=1, maximum=validation.MAX_RESERVE_LIMIT),
            wait_seconds(wait))


def reserve_call(statements: Statements, queue: str, worker: Any, *, lease_seconds: Any,
                 limit: Any, wait: Any) -> Call:
    """Its `convert` gives a `Reserved`."""
    worker = validation.name(worker, "worker")
    lease_seconds, limit, wait = _reserve_arguments(lease_seconds, limit, wait)
    return Call(statements.reserve, (queue, encode_name(worker), Int8(lease_seconds), Int4(limit)),
                _reserved(worker), _invalid, wait=wait)


def ack_call(statements: Statements, queue: str, lease: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    return Call(statements.ack, (queue, encode_name(task_id), encode_name(worker), Int8(generation)),
                lambda rows: None, _stale(task_id, worker, generation))


def ack_and_reserve_call(statements: Statements, queue: str, lease: Any, *, lease_seconds: Any,
                         limit: Any, wait: Any) -> Call:
    """Its `convert` gives a `Reserved` for the lease's worker."""
    task_id, worker, generation = _lease_fields(lease)
    lease_seconds, limit, wait = _reserve_arguments(lease_seconds, limit, wait)
    stale = _stale(task_id, worker, generation)
    params = (queue, encode_name(task_id), encode_name(worker), Int8(generation), Int8(lease_seconds),
              Int4(limit))
    return Call(statements.ack_and_reserve, params, _reserved(worker),
                lambda state, detail: stale(state, detail) if state == STALE_LEASE
                else _invalid(state, detail), wait=wait)


def release_call(statements: Statements, queue: str, lease: Any, *, delay: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    delay = validation.integer(delay, "delay")
    stale = _stale(task_id, worker, generation)
    return Call(statements.release,
                (queue, encode_name(task_id), encode_name(worker), Int8(generation), Int8(delay)),
                lambda rows: None,
                lambda state, detail: stale(state, detail) if state == STALE_LEASE
                else _invalid(state, detail))


def touch_call(statements: Statements, queue: str, lease: Any, *, lease_seconds: Any) -> Call:
    task_id, worker, generation = _lease_fields(lease)
    lease_seconds = validation.integer(lease_seconds, "lease_seconds", minimum=1)
    stale = _stale(task_id, worker, generation)

    def convert(rows: list[tuple]) -> Lease:
        ((deadline, attempts, text),) = rows
        return Lease(task_id, worker, generation, deadline, attempts, _payload(text))

    return Call(statements.touch,
                (queue, encode_name(task_id), encode_name(worker), Int8(generation),
                 Int8(lease_seconds)),
                convert,
                lambda state, detail: stale(state, detail) if state == STALE_LEASE
                else _invalid(state, detail))


# -- revive and reads ----------------------------------------------------------


def revive_call(statements: Statements, queue: str, task_ids: Any) -> Call:
    if isinstance(task_ids, (str, bytes)) or not isinstance(task_ids, Iterable):
        raise InvalidRequest("task_ids must be a list of task ids")
    unique = list(dict.fromkeys(validation.name(task_id, f"task_ids[{index}]")
                                for index, task_id in enumerate(task_ids)))
    if not unique:
        return Call(None, (), lambda rows: [])

    def error(state: str, detail: dict) -> WalQueueError:
        task_id, status = unique[detail["index"]], detail.get("status")
        if status is None:
            return InvalidRequest(f"task {task_id!r} is unknown")
        return InvalidRequest(f"task {task_id!r} is {status}, not dead")

    return Call(statements.revive, (queue, [encode_name(task_id) for task_id in unique]),
                lambda rows: unique, error)


def force_release_call(statements: Statements, queue: str, task_ids: Any) -> Call:
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
        return Call(None, (), lambda rows: [])

    def convert(rows: list[tuple]) -> list[str]:
        ((index, status, _),) = rows
        if index is not None:
            raise InvalidRequest(f"task {unique[index]!r} is {status or 'unknown'}, not leased: "
                                 f"there is no lease to release")
        return unique

    return Call(statements.force_release, (queue, [encode_name(task_id) for task_id in unique]),
                convert)


def _view(row: tuple) -> TaskView:
    task_id, key, status, attempts, max_attempts, generation, available_at, deadline, worker, text = row
    return TaskView(decode_name(task_id), decode_name(key), status, attempts, max_attempts,
                    generation, available_at, deadline, decode_name(worker), _payload(text))


def get_call(statements: Statements, queue: str, task_id: Any) -> Call:
    task_id = validation.name(task_id, "task_id")
    return Call(statements.get, (queue, encode_name(task_id)),
                lambda rows: _view(rows[0]) if rows else None, idempotent=True)


def tasks_call(statements: Statements, queue: str, status: Any) -> Call:
    status = validation.status(status)
    return Call(statements.tasks, (queue, status), lambda rows: [_view(row) for row in rows],
                idempotent=True)


def stats_call(statements: Statements, queue: str) -> Call:
    def convert(rows: list[tuple]) -> QueueStats:
        ((ready, leased, completed, dead),) = rows
        return QueueStats(ready, leased, completed, dead, last_seq=0, snapshot_seq=0, wal_bytes=0)
    return Call(statements.stats, (queue,), convert, idempotent=True)


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
