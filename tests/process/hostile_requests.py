"""Hostile requests that are cheap to send and were once costly to refuse, and a timed bystander.

Used by tests/process/test_hostile.py and scripts/bench_hostile.py. Each
builder returns one complete frame, built from raw msgpack bytes (building
millions of Python objects to encode would make the sender the bottleneck):

* ``empty_lists_put``: a ``put`` whose payload is a list of ~17.8M empty
  lists, just under the body bound (once: 2.6 GiB and a 25.7 s stall);
* ``undecodable_arrays``: a body of 17M empty arrays that decodes to no
  request (once: 1.3 GiB just to find its id);
* ``oversized_put_many``: a 600,000-item ``put_many``, more than one WAL
  frame can hold (once: 9.3 s to refuse);
* ``ints_put``: a ``put`` whose payload is a list of ~17.8M one-byte integers,
  35 MB of JSON, more than one WAL frame can hold (once: ~2 s each to refuse,
  15 s when the body was not msgspec's own encoding);
* ``million_lists_put`` (not in HOSTILE: it is refused by validation, not
  before it): a ``put`` just under 1 MiB, the size the daemon checks before
  decoding, holding a million empty lists (once: 20 of them held 1,462 MiB).

``python -m tests.process.hostile_requests SOCKET SECONDS`` is the bystander:
it puts, reserves and acks in a loop for SECONDS and prints one JSON line,
``{"latencies": [seconds, ...], "errors": N}``, one latency per call.
"""

from __future__ import annotations

import json
import struct
import sys
import time

import msgspec

from walqueue import WalQueueError
from walqueue import protocol as p


def _str(text: str) -> bytes:
    return msgspec.msgpack.encode(text)


def _framed(body: bytes) -> bytes:
    return struct.pack(">I", len(body)) + body


def empty_lists_put(request_id: int, count: int | None = None) -> bytes:
    head = (b"\x84" + _str("type") + _str("put") + _str("id") + msgspec.msgpack.encode(request_id)
            + _str("task_id") + _str("hostile-lists") + _str("payload") + b"\x81" + _str("x"))
    if count is None:
        count = p.MAX_BODY_BYTES - len(head) - 5 - 64
    return _framed(head + b"\xdd" + struct.pack(">I", count) + b"\x90" * count)


def undecodable_arrays(request_id: int, count: int = 17_000_000) -> bytes:
    return _framed(b"\x82" + _str("id") + msgspec.msgpack.encode(request_id) + _str("junk")
                   + b"\xdd" + struct.pack(">I", count) + b"\x90" * count)


def oversized_put_many(request_id: int, items: int = 600_000) -> bytes:
    item_head = b"\x82" + _str("task_id")
    payload = _str("payload") + b"\x80"
    body = [b"\x83", _str("type"), _str("put_many"), _str("id"), msgspec.msgpack.encode(request_id),
            _str("requests"), b"\xdd", struct.pack(">I", items)]
    body.extend(item_head + _str(f"h{index:07d}") + payload for index in range(items))
    return _framed(b"".join(body))


def ints_put(request_id: int, count: int | None = None) -> bytes:
    head = _put_head(request_id, "hostile-ints")
    if count is None:
        count = p.MAX_BODY_BYTES - len(head) - 5 - 64
    return _framed(head + b"\xdd" + struct.pack(">I", count) + b"\x01" * count)


def million_lists_put(request_id: int, task_id: str = "hostile-million-lists") -> bytes:
    head = _put_head(request_id, task_id)
    count = p.PEEK_MIN_BODY_BYTES - 1 - len(head) - 5
    return _framed(head + b"\xdd" + struct.pack(">I", count) + b"\x90" * count)


def _put_head(request_id: int, task_id: str) -> bytes:
    """A put's body up to its payload's one value: {"type": "put", "id": .., "task_id": .., "payload": {"x": """
    return (b"\x84" + _str("type") + _str("put") + _str("id") + msgspec.msgpack.encode(request_id)
            + _str("task_id") + _str(task_id) + _str("payload") + b"\x81" + _str("x"))


HOSTILE = {"empty_lists_put": empty_lists_put, "undecodable_arrays": undecodable_arrays,
           "oversized_put_many": oversized_put_many, "ints_put": ints_put}


def quantile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))]


def bystander(socket_path: str, seconds: float) -> dict:
    """Put, reserve and ack for ``seconds``; every call's latency."""
    from walqueue.client import Client

    latencies: list[float] = []
    errors = 0
    deadline = time.monotonic() + seconds
    with Client(socket_path, timeout=60, retry_seconds=0) as client:
        index = 0
        while time.monotonic() < deadline:
            index += 1
            for call in ("put", "reserve", "ack"):
                started = time.monotonic()
                try:
                    if call == "put":
                        client.put(f"bystander-{index}", {"n": index})
                    elif call == "reserve":
                        leases = client.reserve("bystander")
                    elif leases:
                        client.ack(leases[0])
                except WalQueueError:
                    errors += 1
                latencies.append(time.monotonic() - started)
    return {"latencies": latencies, "errors": errors}


if __name__ == "__main__":
    print(json.dumps(bystander(sys.argv[1], float(sys.argv[2]))), flush=True)
