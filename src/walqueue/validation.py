"""Argument validation shared by the API and by record checking (SPEC §1).

Pure functions: each returns the normalized value or raises InvalidRequest
naming the field. The same checks decide whether a record read from disk is
well-formed, so a value the API would refuse can never be replayed.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from itertools import compress
from typing import Any

from .errors import InvalidRequest
from .values import PutRequest

MAX_NAME_BYTES = 1024
MAX_INT = 2**63 - 1          # every integer parameter is 0 <= n < 2**63
MAX_RESERVE_LIMIT = 1000
MAX_PAYLOAD_DEPTH = 512      # far beyond real payloads, well inside the recursion limit
# Payload integers must fit msgpack, the daemon's wire format (int64 or uint64):
# a task the daemon could store but not hand out would burn its attempts unrun.
MIN_PAYLOAD_INT = -(2**63)
MAX_PAYLOAD_INT = 2**64 - 1
# What a payload may cost in memory, not only in bytes: each object or array is
# a dict or list of 56-200 bytes, from as little as one byte of msgpack (once
# 20 puts of a million empty lists each, 19.8 MiB sent, held 1,462 MiB of the
# daemon's memory, and again after a restart). A payload holds at most this
# many objects and arrays, itself included, and the payloads of one request
# (a put_many) at most MAX_REQUEST_CONTAINERS in all.
MAX_PAYLOAD_CONTAINERS = 100_000
MAX_REQUEST_CONTAINERS = 1_048_576


def name(value: Any, field: str) -> str:
    """A task id, key or worker: non-empty str, <= 1024 UTF-8 bytes."""
    if type(value) is str and 0 < len(value) <= MAX_NAME_BYTES and value.isascii():
        return value  # the common case: ASCII, so one byte per character
    if not isinstance(value, str):
        raise InvalidRequest(f"{field} must be a str, not {type(value).__name__}")
    if not value:
        raise InvalidRequest(f"{field} must not be empty")
    try:
        size = len(value.encode("utf-8"))
    except UnicodeEncodeError:
        raise InvalidRequest(f"{field} {value!r} is not encodable as UTF-8") from None
    if size > MAX_NAME_BYTES:
        raise InvalidRequest(f"{field} is {size} bytes as UTF-8, above {MAX_NAME_BYTES}")
    return str(value)


def integer(value: Any, field: str, minimum: int = 0, maximum: int = MAX_INT) -> int:
    """An int (never a bool) with minimum <= value <= maximum."""
    if type(value) is int and minimum <= value <= maximum:
        return value
    if isinstance(value, bool) or not isinstance(value, int):
        raise InvalidRequest(f"{field} must be an int, not {type(value).__name__}")
    if value < minimum or value > maximum:
        raise InvalidRequest(f"{field}={value} is out of range [{minimum}, {maximum}]")
    return int(value)


def time_plus(now: int, amount: int, field: str) -> int:
    """now + amount, which must stay below 2**63."""
    total = now + amount
    if total > MAX_INT:
        raise InvalidRequest(f"now + {field} = {total} is not below 2**63")
    return total


class Containers:
    """The objects and arrays the payloads of one request may still hold.

    One per request: a put's single payload, or all of a put_many's. Each
    payload may hold at most MAX_PAYLOAD_CONTAINERS, and all together at most
    MAX_REQUEST_CONTAINERS.
    """

    def __init__(self) -> None:
        self.left = MAX_REQUEST_CONTAINERS

    def limit(self) -> int:
        """How many the next payload may hold."""
        return min(MAX_PAYLOAD_CONTAINERS, self.left)

    def spend(self, count: int) -> None:
        self.left -= count

    def refusal(self, field: str) -> InvalidRequest:
        """The error for a payload at ``field`` that holds more than `limit`."""
        if self.left >= MAX_PAYLOAD_CONTAINERS:
            return InvalidRequest(
                f"{field} holds more than {MAX_PAYLOAD_CONTAINERS} objects and arrays, the most a "
                f"payload may hold (each costs the queue's memory as long as the task lives)")
        return InvalidRequest(
            f"{field}: the payloads of this request hold more than {MAX_REQUEST_CONTAINERS} objects "
            f"and arrays in all, the most one request may hold; split it into several")


def payload(value: Any, field: str = "payload", containers: Containers | None = None) -> dict:
    """A JSON object, returned as a fresh copy equal to its JSON round trip.

    Its objects and arrays are counted against ``containers`` (a fresh
    Containers when None: the payload is a request of its own).
    """
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{field} must be a JSON object (a mapping), not {type(value).__name__}")
    containers = containers if containers is not None else Containers()
    budget = _Budget(containers, field)
    copy = _json_value(value, field, 0, budget)
    containers.spend(budget.spent)
    return copy


class _Budget:
    """One payload's objects and arrays, counted as `payload` walks it."""

    __slots__ = ("containers", "field", "limit", "spent")

    def __init__(self, containers: Containers, field: str) -> None:
        self.containers, self.field = containers, field
        self.limit, self.spent = containers.limit(), 0

    def one_more(self) -> None:
        self.spent += 1
        if self.spent > self.limit:
            raise self.containers.refusal(self.field)


def plain_json(value: Any, limit: int | None = None) -> int:
    """How many objects and arrays `value` holds (at least 1) if it is a dict that
    `payload` would accept and return equal to itself: only dict, list, str, int,
    float, bool and None, exactly those types, within every bound, with at most
    `limit` objects and arrays. A fast check, no copy: 0 means "ask `payload`",
    which says what is wrong. `limit` defaults to MAX_PAYLOAD_CONTAINERS."""
    limit = MAX_PAYLOAD_CONTAINERS if limit is None else limit
    budget = [limit]
    return limit - budget[0] if _plain(value, 0, budget) else 0


def count_containers(value: Any, limit: int) -> int:
    """The dicts and lists in `value`, a tree of dicts, lists and scalars (as msgspec decodes
    them), itself included; it stops counting past `limit`.

    Each container costs a step; its items are sorted by type at C speed, so a
    list of a million numbers costs no million steps.
    """
    count = 0
    stack = [value]
    pop, push = stack.pop, stack.extend
    is_container = _CONTAINER_TYPES.__contains__
    while stack:
        item = pop()
        count += 1
        if count > limit:
            break
        items = item.values() if type(item) is dict else item
        push(compress(items, map(is_container, map(type, items))))
    return count


_CONTAINER_TYPES = frozenset((dict, list))


def _plain(value: Any, depth: int, budget: list[int]) -> bool:
    if depth >= _PLAIN_DEPTH:
        return False
    budget[0] -= 1
    if budget[0] < 0:
        return False
    if type(value) is dict:
        for key in value:
            if type(key) is not str or not (key.isascii() or _encodable(key)):
                return False
        items = value.values()
    elif type(value) is list and depth:
        items = value
    else:
        return False
    for item in items:
        kind = type(item)
        if kind is str:
            if not (item.isascii() or _encodable(item)):
                return False
        elif kind is int:
            if not MIN_PAYLOAD_INT <= item <= MAX_PAYLOAD_INT:
                return False
        elif kind is float:
            if not math.isfinite(item):
                return False
        elif kind is dict or kind is list:
            if not _plain(item, depth + 1, budget):
                return False
        elif item is not None and kind is not bool:
            return False
    return True


# _plain recurses only this deep; deeper payloads take `payload`'s walk.
_PLAIN_DEPTH = 64


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_value(value: Any, path: Any, depth: int, budget: _Budget) -> Any:
    # `path` is the field's name or a (parent, key or index) pair, spelled out only for an
    # error: formatting it for every item cost more than the rest of the walk.
    if depth > MAX_PAYLOAD_DEPTH:
        raise InvalidRequest(f"{_spelled(path)} is nested deeper than {MAX_PAYLOAD_DEPTH} levels")
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        _check_utf8(value, path)
        return str(value)
    if isinstance(value, int):
        if not MIN_PAYLOAD_INT <= value <= MAX_PAYLOAD_INT:
            raise InvalidRequest(
                f"{_spelled(path)} is an integer of {value.bit_length()} bits, outside [-2**63, 2**64 - 1]: "
                f"the daemon's wire format cannot carry it (send it as a string)")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequest(f"{_spelled(path)} is {value!r}; only finite numbers are allowed")
        return float(value)
    if isinstance(value, (list, tuple)):
        budget.one_more()
        return [_json_value(item, (path, index), depth + 1, budget) for index, item in enumerate(value)]
    if isinstance(value, Mapping):
        budget.one_more()
        copy = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidRequest(f"{_spelled(path)} has a key {key!r} that is not a str")
            _check_utf8(key, (path, _KEY))
            copy[str(key)] = _json_value(item, (path, key), depth + 1, budget)
        return copy
    raise InvalidRequest(f"{_spelled(path)} is a {type(value).__name__}, which is not a JSON value")


_KEY = object()  # the last step of a path that names an object's key itself


def _spelled(path: Any) -> str:
    """`payload['a'][0]` from (("payload", "a"), 0); (parent, _KEY) names a key of parent."""
    steps = []
    while isinstance(path, tuple):
        path, step = path
        steps.append(step)
    text = path
    for step in reversed(steps):
        text += " key" if step is _KEY else f"[{step!r}]" if isinstance(step, str) else f"[{step}]"
    return text


def _check_utf8(text: str, path: Any) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"{_spelled(path)} {text!r} is not encodable as UTF-8") from None


def status(value: Any, field: str = "status") -> str | None:
    if value is None or value in STATUSES:
        return value
    raise InvalidRequest(f"{field} must be one of {', '.join(STATUSES)} or None, not {value!r}")


STATUSES = ("ready", "leased", "completed", "dead")


# -- a put request (SPEC §1 put / put_many) -------------------------------------------------

PUT_FIELDS = ("task_id", "payload", "key", "available_at", "max_attempts")
_checked_payload = payload  # put_request's parameter of that name hides the function


def put_request(task_id: Any, payload: Any, key: Any = None, available_at: Any = 0,
                max_attempts: Any = 3, *, where: str = "", copy: bool = True,
                containers: Containers | None = None) -> dict:
    """A validated put request, shaped like a task of a put record (the one check of a put).

    ``where`` prefixes the field names in errors (``requests[2].``). Without
    ``copy`` a payload that is plain JSON already is kept as it is
    (plain_json): for a caller that hands the payload over (walqueued's,
    freshly decoded); any other goes through the full check and copy. Its
    objects and arrays count against ``containers``, the request's (a
    put_many passes the same one for every item; None: a request of its own).
    """
    task_id = name(task_id, f"{where}task_id")
    available_at = integer(available_at, f"{where}available_at")
    key = task_id if key is None else name(key, f"{where}key")
    max_attempts = integer(max_attempts, f"{where}max_attempts", minimum=1)
    if containers is None:
        containers = Containers()
    if not copy and (count := plain_json(payload, containers.limit())):
        containers.spend(count)
    else:
        payload = _checked_payload(payload, f"{where}payload", containers)
    return {"available_at": available_at, "key": key, "max_attempts": max_attempts, "payload": payload,
            "task_id": task_id}


def put_request_of(item: Any, index: int, containers: Containers | None = None) -> dict:
    """put_request of item ``index`` of a put_many: a PutRequest or a mapping of its field names."""
    where = f"requests[{index}]."
    if isinstance(item, PutRequest):
        fields = {field: getattr(item, field) for field in PUT_FIELDS}
    elif isinstance(item, Mapping):
        unknown = set(item) - set(PUT_FIELDS)
        if unknown:
            raise InvalidRequest(f"{where[:-1]} has unknown fields {sorted(map(str, unknown))}")
        missing = {"task_id", "payload"} - set(item)
        if missing:
            raise InvalidRequest(f"{where[:-1]} is missing {sorted(missing)}")
        fields = {"key": None, "available_at": 0, "max_attempts": 3, **item}
    else:
        raise InvalidRequest(f"{where[:-1]} must be a PutRequest or a mapping, not {type(item).__name__}")
    return put_request(fields["task_id"], fields["payload"], fields["key"], fields["available_at"],
                       fields["max_attempts"], where=where, containers=containers)


def put_requests(requests: Any) -> list[dict]:
    """put_request_of every item of a put_many's list, sharing one container budget."""
    if isinstance(requests, (str, bytes, Mapping)) or not isinstance(requests, Iterable):
        raise InvalidRequest("requests must be a list of PutRequest or mappings")
    containers = Containers()
    return [put_request_of(item, index, containers) for index, item in enumerate(requests)]
