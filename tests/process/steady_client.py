"""A well-behaved worker that keeps putting, reserving and acking while others misbehave.

``python -m tests.process.steady_client SOCKET PREFIX STOP_FILE MAX_SECONDS``

Every answer is printed as one JSON line the moment it arrives, so what was
answered survives this process being stopped at any point::

    {"op": "put", "task_id": T}                       the put was answered ok (durable)
    {"op": "ack", "task_id": T, "generation": G}       the ack was answered ok (durable)
    {"op": "error", "call": C, "error": NAME, "message": M}
    {"summary": {"puts": N, "acks": N, "errors": N, "max_latency": S}}   last line

It stops when STOP_FILE exists or after MAX_SECONDS; the summary's
``max_latency`` is the slowest single call in seconds, so a test can tell
that the daemon kept answering this client promptly.
"""

from __future__ import annotations

import json
import os
import sys
import time

from walqueue import WalQueueError
from walqueue.client import Client


def emit(record: dict) -> None:
    print(json.dumps(record), flush=True)


def main(socket_path: str, prefix: str, stop_file: str, max_seconds: str) -> int:
    deadline = time.monotonic() + float(max_seconds)
    counts = {"puts": 0, "acks": 0, "errors": 0}
    max_latency = 0.0
    client = Client(socket_path, retry_seconds=5, timeout=30)
    index = 0

    def timed(call_name: str, call):
        nonlocal max_latency
        started = time.monotonic()
        try:
            return call()
        except WalQueueError as exc:
            counts["errors"] += 1
            emit({"op": "error", "call": call_name, "error": type(exc).__name__, "message": str(exc)[:300]})
            time.sleep(0.05)
            return None
        finally:
            max_latency = max(max_latency, time.monotonic() - started)

    try:
        while not os.path.exists(stop_file) and time.monotonic() < deadline:
            task_id = f"{prefix}-{index:06d}"
            index += 1
            put = lambda task_id=task_id, index=index: client.put(task_id, {"index": index})  # noqa: E731
            if timed("put", put) == task_id:
                counts["puts"] += 1
                emit({"op": "put", "task_id": task_id})
            leases = timed("reserve", lambda: client.reserve(prefix, lease_seconds=60, limit=2)) or []
            for lease in leases:
                if timed("ack", lambda lease=lease: client.ack(lease) or True):
                    counts["acks"] += 1
                    emit({"op": "ack", "task_id": lease.task_id, "generation": lease.generation})
    finally:
        client.close()
        emit({"summary": {**counts, "max_latency": round(max_latency, 3)}})
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:]))
