"""Argument validation shared by the API and by record checking (SPEC §1).

Pure functions: each returns the normalized value or raises InvalidRequest
naming the field. The same checks decide whether a record read from disk is
well-formed, so a value the API would refuse can never be replayed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .errors import InvalidRequest

MAX_NAME_BYTES = 1024
MAX_INT = 2**63 - 1          # every integer parameter is 0 <= n < 2**63
MAX_RESERVE_LIMIT = 1000
MAX_PAYLOAD_DEPTH = 512      # far beyond real payloads, well inside the recursion limit
# Payload integers must fit msgpack, the daemon's wire format (int64 or uint64):
# a task the daemon could store but not hand out would burn its attempts unrun.
MIN_PAYLOAD_INT = -(2**63)
MAX_PAYLOAD_INT = 2**64 - 1


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


def payload(value: Any, field: str = "payload") -> dict:
    """A JSON object, returned as a fresh copy equal to its JSON round trip."""
    if not isinstance(value, Mapping):
        raise InvalidRequest(f"{field} must be a JSON object (a mapping), not {type(value).__name__}")
    return _json_value(value, field, 0)


def plain_json(value: Any, depth: int = 0) -> bool:
    """True if `value` is a dict that `payload` would accept and return equal to itself:
    only dict, list, str, int, float, bool and None, exactly those types, within every
    bound. A fast check, no copy: False means "ask `payload`", which says what is wrong."""
    if depth >= _PLAIN_DEPTH:
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
            if not plain_json(item, depth + 1):
                return False
        elif item is not None and kind is not bool:
            return False
    return True


# plain_json recurses only this deep; deeper payloads take `payload`'s walk.
_PLAIN_DEPTH = 64


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _json_value(value: Any, path: str, depth: int) -> Any:
    if depth > MAX_PAYLOAD_DEPTH:
        raise InvalidRequest(f"{path} is nested deeper than {MAX_PAYLOAD_DEPTH} levels")
    if value is None or value is True or value is False:
        return value
    if isinstance(value, str):
        _check_utf8(value, path)
        return str(value)
    if isinstance(value, int):
        if not MIN_PAYLOAD_INT <= value <= MAX_PAYLOAD_INT:
            raise InvalidRequest(
                f"{path} is an integer of {value.bit_length()} bits, outside [-2**63, 2**64 - 1]: "
                f"the daemon's wire format cannot carry it (send it as a string)")
        return int(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise InvalidRequest(f"{path} is {value!r}; only finite numbers are allowed")
        return float(value)
    if isinstance(value, Mapping):
        copy = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise InvalidRequest(f"{path} has a key {key!r} that is not a str")
            _check_utf8(key, f"{path} key")
            copy[str(key)] = _json_value(item, f"{path}[{key!r}]", depth + 1)
        return copy
    if isinstance(value, (list, tuple)):
        return [_json_value(item, f"{path}[{index}]", depth + 1)
                for index, item in enumerate(value)]
    raise InvalidRequest(f"{path} is a {type(value).__name__}, which is not a JSON value")


def _check_utf8(text: str, path: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidRequest(f"{path} {text!r} is not encodable as UTF-8") from None


def status(value: Any, field: str = "status") -> str | None:
    if value is None or value in STATUSES:
        return value
    raise InvalidRequest(f"{field} must be one of {', '.join(STATUSES)} or None, not {value!r}")


STATUSES = ("ready", "leased", "completed", "dead")
