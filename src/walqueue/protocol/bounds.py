"""The request bounds: cheap checks of a hostile body before it costs a step per value.

Decoding builds one Python object per msgpack map or array (~60-150 bytes
from 1 byte of body), and the library validates a payload a value at a time;
a request the daemon would refuse anyway must not make it build millions of
objects (or stall its loop doing so) first. So a request body is checked, in
this order, each check only as costly as the bytes it reads:

1. while it arrives (``walqueue.protocol.framing.FrameReader``, bodies of
   PEEK_MIN_BODY_BYTES and more): its leading scalar fields (`peek_fields`,
   O(1)), refusing a put_many of more items than one WAL frame holds
   (`early_refusal`); and the bytes that could start a map or an array,
   counted at C speed (`container_header_bound`), refused past
   MAX_CONTAINER_HEADERS;
2. once decoded: a put whose payloads' JSON cannot fit one WAL frame
   (`costly_put_refusal`, msgspec's JSON at C speed);
3. a body that differs from its re-encoding (not sent by this package's
   clients) is walked for a map with a key twice (`duplicate_key`), after
   its payloads' objects and arrays were counted against the library's bound.

The refusals return why a body is refused, or None: none raises for a
hostile body, and nothing here does I/O. (`check_wait`, the one argument
bound both sides check before a reserve waits, raises InvalidRequest.)
"""

from __future__ import annotations

import math
import re
from typing import Any

import msgspec

from walqueue import MAX_FRAME_BYTES, InvalidRequest
from walqueue.codec import MAX_FRAME_TEXT
from walqueue.protocol.messages import Put, PutMany, Request
from walqueue.validation import Containers, count_containers

__all__ = [
    "MAX_CONTAINER_HEADERS", "MAX_FLOAT_JSON_CHARS", "MAX_PEEK_FIELDS", "MAX_PUT_MANY_ITEMS",
    "MAX_WAIT_SECONDS", "MIN_OVERSIZED_BODY_BYTES", "MIN_PUT_TASK_JSON_BYTES", "PEEK_MIN_BODY_BYTES",
    "PEEK_PREFIX_BYTES", "check_wait", "container_header_bound", "costly_put_refusal", "duplicate_key",
    "early_refusal", "peek_fields", "peek_id",
]

MAX_WAIT_SECONDS = 300
# Every map or array starts with one of the bytes below: their count in a body
# bounds the containers from above (bytes inside strings and numbers count too,
# e.g. UTF-8 continuation bytes, so dense non-ASCII text of about 1 MiB and
# more can reach it).
MAX_CONTAINER_HEADERS = 1024 * 1024
_CONTAINER_HEADER_BYTES = bytes([*range(0x80, 0xA0), 0xDC, 0xDD, 0xDE, 0xDF])
_OTHER_BYTES = bytes(byte for byte in range(256) if byte not in _CONTAINER_HEADER_BYTES)
# A put_many writes all its new tasks in one WAL frame; the smallest task is
# 72 bytes of JSON and a comma, so more items than this can never fit (even
# identical duplicates, which collapse, count: the bound is on the request).
MIN_PUT_TASK_JSON_BYTES = 73
MAX_PUT_MANY_ITEMS = MAX_FRAME_BYTES // MIN_PUT_TASK_JSON_BYTES
# Bodies below this cannot hold more put_many items than allowed (an item is at
# least 20 bytes of msgpack) nor more container headers: the request bounds
# look only at larger ones, and at their first PEEK_PREFIX_BYTES for the fields.
PEEK_MIN_BODY_BYTES = 1024 * 1024
PEEK_PREFIX_BYTES = 4096
# The id of an undecodable body is looked for among at most this many leading
# fields of its top-level map, skipping only scalar values: O(1), whatever the body.
MAX_PEEK_FIELDS = 8


def check_wait(wait: float) -> None:
    """Raise InvalidRequest unless ``0 <= wait <= MAX_WAIT_SECONDS``."""
    if not (math.isfinite(wait) and 0 <= wait <= MAX_WAIT_SECONDS):
        raise InvalidRequest(f"wait must be between 0 and {MAX_WAIT_SECONDS} seconds, got {wait!r}")


def container_header_bound(data: bytes | bytearray) -> int:
    """How many bytes of ``data`` could start a msgpack map or array (an upper bound on containers)."""
    return len(data.translate(None, _OTHER_BYTES))


# -- peeking at the leading fields -------------------------------------------------

# msgpack's scalar formats by first byte: how many bytes follow the first
# byte before the value's own data, and for strings/bins/exts how many of
# those give the data's length (fixed-size values: (size, 0)).
_SCALAR_SIZES = {0xC0: (0, 0), 0xC2: (0, 0), 0xC3: (0, 0), 0xCA: (4, 0), 0xCB: (8, 0),
                 0xCC: (1, 0), 0xCD: (2, 0), 0xCE: (4, 0), 0xCF: (8, 0), 0xD0: (1, 0), 0xD1: (2, 0),
                 0xD2: (4, 0), 0xD3: (8, 0), 0xD4: (2, 0), 0xD5: (3, 0), 0xD6: (5, 0), 0xD7: (9, 0),
                 0xD8: (17, 0), 0xD9: (1, 1), 0xDA: (2, 2), 0xDB: (4, 4), 0xC4: (1, 1), 0xC5: (2, 2),
                 0xC6: (4, 4), 0xC7: (2, 1), 0xC8: (3, 2), 0xC9: (5, 4)}


def _scalar(body: bytes, offset: int) -> tuple[Any, int] | None:
    """The scalar at ``offset`` (str, int or None for any other scalar) and the offset after it;
    None if a map or array (or nothing) starts there."""
    if offset >= len(body):
        return None
    first = body[offset]
    if first <= 0x7F:
        return first, offset + 1
    if first >= 0xE0:
        return first - 0x100, offset + 1
    if 0xA0 <= first <= 0xBF:
        end = offset + 1 + (first & 0x1F)
        return body[offset + 1:end].decode("utf-8", "replace"), end
    if first not in _SCALAR_SIZES:
        return None
    size, length_bytes = _SCALAR_SIZES[first]
    start = offset + 1
    if length_bytes:
        data_length = int.from_bytes(body[start:start + length_bytes], "big")
        end = start + size + data_length
        if first in (0xD9, 0xDA, 0xDB):
            return body[start + length_bytes:end].decode("utf-8", "replace"), end
        return None, end
    if 0xCC <= first <= 0xD3:
        return int.from_bytes(body[start:start + size], "big", signed=first >= 0xD0), start + size
    return None, start + size


def _container_length(body: bytes, offset: int) -> int | None:
    """The element count of the msgpack array at ``offset``, or None if none starts there."""
    if offset >= len(body):
        return None
    first = body[offset]
    if 0x90 <= first <= 0x9F:
        return first & 0x0F
    if first in (0xDC, 0xDD):
        size = 2 if first == 0xDC else 4
        return int.from_bytes(body[offset + 1:offset + 1 + size], "big")
    return None


def peek_fields(body: bytes) -> dict[str, Any]:
    """The scalar fields leading the body's top-level map, in O(1) whatever the body.

    Reads at most MAX_PEEK_FIELDS fields and stops at the first value that is
    not a scalar; an array value is recorded as its element count (so a
    put_many's ``requests`` count is known without decoding its items).
    Nothing else of the body is looked at, so a huge or hostile body costs
    what its first few fields cost. Best effort: returns what it could read.
    """
    fields: dict[str, Any] = {}
    if not body:
        return fields
    first = body[0]
    if 0x80 <= first <= 0x8F:
        count, offset = first & 0x0F, 1
    elif first in (0xDE, 0xDF):
        size = 2 if first == 0xDE else 4
        count, offset = int.from_bytes(body[1:1 + size], "big"), 1 + size
    else:
        return fields
    for _ in range(min(count, MAX_PEEK_FIELDS)):
        key = _scalar(body, offset)
        if key is None or not isinstance(key[0], str):
            break
        name, offset = key
        value = _scalar(body, offset)
        if value is None:
            elements = _container_length(body, offset)
            if elements is not None:
                fields[name] = elements
            break
        fields[name], offset = value
    return fields


def peek_id(body: bytes) -> int | None:
    """Best effort: the integer ``id`` of an undecodable message, for its error answer."""
    candidate = peek_fields(body).get("id")
    if type(candidate) is int and 0 <= candidate < 2**64:
        return candidate
    return None


def early_refusal(prefix: bytes, length: int) -> str | None:
    """Why a request body of ``length`` bytes starting with ``prefix`` is refused unread, or None.

    Today: a put_many of more items than one WAL frame can hold.
    """
    fields = peek_fields(prefix)
    items = fields.get("requests")
    if fields.get("type") == "put_many" and type(items) is int and items > MAX_PUT_MANY_ITEMS:
        return (f"put_many of {items} items refused before decoding: one transaction is one WAL frame "
                f"of at most {MAX_FRAME_TEXT}, which holds at most {MAX_PUT_MANY_ITEMS} tasks; "
                f"split it into several put_many calls")
    return None


# -- the duplicate-key walk ---------------------------------------------------------


def _header(body: bytes, offset: int) -> tuple[str, Any, int]:
    """("map" | "array", entry count, offset of the first entry) or ("scalar", value, end)."""
    first = body[offset]
    if 0x80 <= first <= 0x8F:
        return "map", first & 0x0F, offset + 1
    if 0x90 <= first <= 0x9F:
        return "array", first & 0x0F, offset + 1
    if first in (0xDC, 0xDD, 0xDE, 0xDF):
        size = 2 if first in (0xDC, 0xDE) else 4
        kind = "array" if first in (0xDC, 0xDD) else "map"
        return kind, int.from_bytes(body[offset + 1:offset + 1 + size], "big"), offset + 1 + size
    scalar = _scalar(body, offset)
    if scalar is None:
        raise ValueError(f"no msgpack value at offset {offset}")
    value, end = scalar
    if value is None:  # compare keys of other types by their bytes
        value = bytes(body[offset:end])
    return "scalar", value, end


# For the duplicate-key walk: the whole size of a msgpack value of fixed size by its first
# byte (0 for a map, an array, a string, bin or ext whose length follows, and the invalid 0xc1);
# the (length bytes, type bytes) that follow the first byte of a string, bin or ext; and a run of
# one-byte values (fixints, nil, booleans, the empty string), stepped over at once in an array.
_FIXED_SIZES = [0] * 256
for _byte in (*range(0x00, 0x80), *range(0xE0, 0x100), 0xC0, 0xC2, 0xC3):
    _FIXED_SIZES[_byte] = 1
for _byte in range(0xA0, 0xC0):
    _FIXED_SIZES[_byte] = 1 + (_byte & 0x1F)
for _byte, _size in ((0xCC, 2), (0xCD, 3), (0xCE, 5), (0xCF, 9), (0xD0, 2), (0xD1, 3), (0xD2, 5),
                     (0xD3, 9), (0xCA, 5), (0xCB, 9), (0xD4, 3), (0xD5, 4), (0xD6, 6), (0xD7, 10),
                     (0xD8, 18)):
    _FIXED_SIZES[_byte] = _size
_VARIABLE_SIZES = {0xD9: (1, 0), 0xDA: (2, 0), 0xDB: (4, 0), 0xC4: (1, 0), 0xC5: (2, 0), 0xC6: (4, 0),
                   0xC7: (1, 1), 0xC8: (2, 1), 0xC9: (4, 1)}
_ONE_BYTE_VALUES = re.compile(rb"[\x00-\x7f\xa0\xc0\xc2\xc3\xe0-\xff]+")


def _after_variable(body: bytes, offset: int, first: int) -> int:
    """The offset after the string, bin or ext at ``offset`` (its first byte ``first``)."""
    length_bytes, type_bytes = _VARIABLE_SIZES[first]
    start = offset + 1 + length_bytes
    return start + type_bytes + int.from_bytes(body[offset + 1:start], "big")


def _container(body: bytes, offset: int, first: int) -> tuple[bool, int, int] | None:
    """(is a map, entries, offset of the first entry) if a map or an array starts at ``offset``."""
    if 0x80 <= first <= 0x9F:
        return first < 0x90, first & 0x0F, offset + 1
    if first in (0xDC, 0xDD, 0xDE, 0xDF):
        size = 2 if first in (0xDC, 0xDE) else 4
        return first >= 0xDE, int.from_bytes(body[offset + 1:offset + 1 + size], "big"), offset + 1 + size
    return None


def duplicate_key(body: bytes) -> tuple[str, Any] | None:
    """(where, key) for the first map in the msgpack ``body`` with a key twice, or None.

    ``where`` is "the request" for the top-level map, else its path, such as
    ``request['payload']['a']``.

    A walk over the body, in Python: the slow path, taken only when the cheap
    signal in `walqueue.protocol.framing.decode_request` says the body may
    hold one. Scalars are stepped over by a table of sizes, without a frame
    each, and a run of one-byte values in an array at once: 16.7M small
    integers cost one regular expression match, not 16.7M steps (issue 20
    item 3: the walk once took 15 s over such a body).
    """
    fixed, variable, one_byte_run = _FIXED_SIZES, _VARIABLE_SIZES, _ONE_BYTE_VALUES.match
    # One frame per open map or array: [entries left, keys seen (a map) or None, label in
    # parent, entries in all]; an entry of a map is a key and its value.
    stack: list[list] = []
    offset = 0
    label: Any = None  # of the value at offset, in its parent
    try:
        while True:
            first = body[offset]
            opened = _container(body, offset, first)
            if opened is None:
                raise ValueError("the request is not a map")  # only at the top: see below
            is_map, count, offset = opened
            stack.append([count, set() if is_map else None, label, count])
            # Walk the innermost open container until it opens another one (which the
            # outer loop pushes) or ends (and is popped, its parent walked on).
            while stack:
                frame = stack[-1]
                left, keys = frame[0], frame[1]
                opened_child = False
                while left:
                    if keys is not None:  # a key, then its value
                        first = body[offset]
                        if 0xA0 <= first <= 0xBF:
                            end = offset + 1 + (first & 0x1F)
                            key: Any = body[offset + 1:end].decode("utf-8", "replace")
                        else:
                            kind, key, end = _header(body, offset)
                            if kind != "scalar":
                                raise ValueError("a map or array as a key")
                        offset = end
                        if key in keys:
                            path = "".join(f"[{item[2]!r}]" for item in stack[1:])
                            return ("the request" if len(stack) == 1 else "request" + path), key
                        keys.add(key)
                    first = body[offset]
                    size = fixed[first]
                    if size == 1 and keys is None:
                        run = min(one_byte_run(body, offset).end() - offset, left)
                        offset += run
                        left -= run
                    elif size:
                        offset += size
                        left -= 1
                    elif first in variable:
                        offset = _after_variable(body, offset, first)
                        left -= 1
                    else:
                        label = key if keys is not None else frame[3] - left
                        left -= 1
                        opened_child = True
                        break
                frame[0] = left
                if opened_child:
                    break
                stack.pop()
            if not stack:
                return None
    except (ValueError, IndexError):
        return None  # not msgpack after all: msgspec decided otherwise, and is the judge


# -- puts the library would refuse ---------------------------------------------------

# The library's JSON (canonical: sorted keys, no spaces) and msgspec's JSON of one value
# differ only in key order, which costs no byte, and in how a float is written: each
# takes 3 to 24 characters either way. So msgspec's length, less this much per float,
# is a lower bound of the library's, found at C speed.
MAX_FLOAT_JSON_CHARS = 24
_NOT_FLOAT_HEADERS = bytes(byte for byte in range(256) if byte not in (0xCA, 0xCB))
# JSON takes at most six bytes for one byte of msgpack (0xc2 is "false,", a control
# character in a string "\u0001"): a shorter body cannot carry payloads too big for one frame.
MIN_OVERSIZED_BODY_BYTES = MAX_FRAME_BYTES // 6
_json_encoder = msgspec.json.Encoder()


def _payloads(request: Put | PutMany) -> list[dict[str, Any]]:
    """The payloads a put or put_many could write, one per task id (identical duplicates collapse)."""
    if type(request) is Put:
        return [request.payload]
    return list({item.task_id: item.payload for item in reversed(request.requests)}.values())


def costly_put_refusal(request: Request, body: bytes, *, walked: bool, sized: bool = False) -> str | None:
    """Why a put or put_many the library would refuse is refused now, before anything costs
    a step per value, or None.

    Its payloads' JSON cannot fit one WAL frame (msgspec's JSON, at C speed:
    once six 17 MB puts of 16.7M one-byte integers took 12 s to refuse), or,
    when the body is about to be ``walked`` for duplicate keys, its payloads
    hold more objects and arrays than validation allows (counted as the
    library counts them; the library applies the same rule to every request).
    ``sized``: its size was checked already.
    """
    kind = type(request)
    if kind is not Put and kind is not PutMany:
        return None
    if not sized and len(body) > MIN_OVERSIZED_BODY_BYTES:
        payloads = _payloads(request)
        try:
            encoded = len(_json_encoder.encode(payloads)) - len(payloads) - 1  # "[", "]" and commas
        except (msgspec.EncodeError, TypeError, ValueError, OverflowError, RecursionError):
            encoded = 0  # not JSON: the library says what is wrong
        floats = len(body.translate(None, _NOT_FLOAT_HEADERS))
        at_least = encoded - MAX_FLOAT_JSON_CHARS * floats
        if at_least > MAX_FRAME_BYTES:
            return (f"{kind.__struct_config__.tag} of {len(body)} bytes refused "
                    f"before validating: its payloads take at least {at_least} bytes of JSON, and one "
                    f"transaction is one WAL frame of at most {MAX_FRAME_TEXT}")
    if walked:
        containers = Containers()
        for index, payload in enumerate(_payloads(request) if kind is Put else
                                        [item.payload for item in request.requests]):
            limit = containers.limit()
            count = count_containers(payload, limit)
            if count > limit:
                field = "payload" if kind is Put else f"requests[{index}].payload"
                return f"{containers.refusal(field)} (refused before validating)"
            containers.spend(count)
    return None
