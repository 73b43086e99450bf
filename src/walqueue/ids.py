"""Task ids that sort by creation time, for first-in first-out queues.

The queue leases ready tasks in ``(available_at, task_id)`` order, comparing
task ids as Python strings (SPEC §2), so ``job-10`` comes before ``job-9``.
Tasks put with the same ``available_at`` run in arrival order only if their
ids sort in arrival order: zero-padded counters (``f"job-{n:012d}"``) or the
ids this module makes.

``time_ordered_id()`` is a UUIDv7 (RFC 9562) in its canonical text form,
``xxxxxxxx-xxxx-7xxx-yxxx-xxxxxxxxxxxx`` in lowercase hex: 48 bits of Unix
time in milliseconds, the version, a 12-bit counter, the variant and 62
random bits. Lowercase hex of a fixed length sorts as its number does, so the
strings sort by creation time.

Invariants: within one process every id is greater than the one before it
(as a str), also when the wall clock steps back or more than 4,096 ids are
made in one millisecond (the counter then carries into the timestamp, which
runs ahead of the clock until the clock catches up); ids of different
processes made in the same millisecond are unordered among themselves, and
62 random bits each keep them apart. Thread-safe; standard library only.
"""

from __future__ import annotations

import os
import threading
import time
import uuid

from walqueue.errors import InvalidRequest

__all__ = ["time_ordered_id"]

_COUNTER_BITS = 12
_COUNTER_LIMIT = 1 << _COUNTER_BITS
# A new millisecond starts its counter at a random value below half the
# range, so ids are not guessable from their neighbours and there is room to count.
_COUNTER_START_LIMIT = _COUNTER_LIMIT // 2
_RANDOM_BITS = 62
_VERSION = 7
_VARIANT = 0b10

_lock = threading.Lock()
_last_milliseconds = 0
_last_counter = 0


def time_ordered_id(prefix: str = "") -> str:
    """A new id that sorts after every id this process made before, optionally prefixed.

    ``time_ordered_id("email-")`` gives e.g.
    ``"email-019b2f6e-8f41-7a3c-9d2e-5b0c1f7e4a10"``. Ids with the same prefix
    sort by creation time. Raises InvalidRequest if ``prefix`` is not a str.
    """
    if not isinstance(prefix, str):
        raise InvalidRequest(f"prefix must be a str, got {type(prefix).__name__}")
    milliseconds, counter = _next_stamp(time.time_ns() // 1_000_000)
    random_bits = int.from_bytes(os.urandom(8)) >> (64 - _RANDOM_BITS)
    value = (milliseconds << 80) | (_VERSION << 76) | (counter << 64) | (_VARIANT << 62) | random_bits
    return prefix + str(uuid.UUID(int=value))


def _next_stamp(clock_milliseconds: int) -> tuple[int, int]:
    """(milliseconds, counter) greater than the last pair handed out."""
    global _last_milliseconds, _last_counter
    with _lock:
        if clock_milliseconds > _last_milliseconds:
            milliseconds = clock_milliseconds
            counter = int.from_bytes(os.urandom(2)) % _COUNTER_START_LIMIT
        elif _last_counter + 1 < _COUNTER_LIMIT:
            milliseconds, counter = _last_milliseconds, _last_counter + 1
        else:
            milliseconds = _last_milliseconds + 1  # the counter is full: borrow the next millisecond
            counter = int.from_bytes(os.urandom(2)) % _COUNTER_START_LIMIT
        _last_milliseconds, _last_counter = milliseconds, counter
        return milliseconds, counter
