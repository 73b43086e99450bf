"""`python -m walqueue.cli DIRECTORY`: a JSON-lines front end (SPEC §7).

One JSON object per input line, one answer per output line, in order:

    {"op":"put","task_id":"t1","payload":{"n":1},"id":7}
    {"ok":true,"task_id":"t1","id":7}

Success is {"ok":true, ...result}; failure is
{"ok":false,"error":"<ExceptionClassName>","message":"..."}. A request's
"id" is echoed; a StaleLease failure also carries the task's current
"task_id", "status" and "generation". A malformed line gets an InvalidRequest answer and the
stream goes on; blank lines are skipped. Exit codes: 0 at end of input,
2 usage, 3 the directory is locked (QueueLocked), 4 it is corrupt
(CorruptStore), 5 a write failed and the queue could not be reopened.
Standard library only.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
from typing import Any

from .errors import CorruptStore, InvalidRequest, QueueLocked, StaleLease, WalQueueError
from .queue import Queue

EXIT_OK, EXIT_USAGE, EXIT_LOCKED, EXIT_CORRUPT, EXIT_REOPEN_FAILED = 0, 2, 3, 4, 5

# op -> (required fields, optional fields)
OPERATIONS: dict[str, tuple[tuple[str, ...], tuple[str, ...]]] = {
    "put": (("task_id", "payload"), ("key", "available_at", "max_attempts")),
    "put_many": (("requests",), ()),
    "reserve": (("worker", "now", "lease_seconds"), ("limit",)),
    "ack": (("task_id", "worker", "generation", "now"), ()),
    "release": (("task_id", "worker", "generation", "now"), ("delay",)),
    "touch": (("task_id", "worker", "generation", "now", "lease_seconds"), ()),
    "revive": (("task_ids", "now"), ()),
    "get": (("task_id",), ()),
    "stats": ((), ()),
    "compact": ((), ()),
}


@dataclasses.dataclass(frozen=True)
class LeaseRef:
    """What ack/release/touch need of a lease, from a request's fields."""

    task_id: Any
    worker: Any
    generation: Any


def execute(queue: Queue, request: dict) -> dict:
    """Run one request against the queue; return the result fields."""
    op = request.get("op")
    if not isinstance(op, str) or op not in OPERATIONS:
        raise InvalidRequest(f"op must be one of {', '.join(OPERATIONS)}, not {op!r}")
    required, optional = OPERATIONS[op]
    fields = {name: value for name, value in request.items() if name not in ("op", "id")}
    unknown = sorted(set(fields) - set(required) - set(optional))
    if unknown:
        raise InvalidRequest(f"{op} does not take {', '.join(unknown)}")
    missing = [name for name in required if name not in fields]
    if missing:
        raise InvalidRequest(f"{op} needs {', '.join(missing)}")
    if op in ("ack", "release", "touch"):
        lease = LeaseRef(fields.pop("task_id"), fields.pop("worker"), fields.pop("generation"))
        if op == "ack":
            queue.ack(lease, **fields)
            return {}
        if op == "release":
            queue.release(lease, **fields)
            return {}
        return {"lease": dataclasses.asdict(queue.touch(lease, **fields))}
    if op == "put":
        task_id = fields.pop("task_id")
        payload = fields.pop("payload")
        return {"task_id": queue.put(task_id, payload, **fields)}
    if op == "put_many":
        requests = fields["requests"]
        if not isinstance(requests, list):
            raise InvalidRequest("requests must be a list of objects")
        return {"task_ids": queue.put_many(requests)}
    if op == "reserve":
        worker = fields.pop("worker")
        leases = queue.reserve(worker, **fields)
        return {"leases": [dataclasses.asdict(lease) for lease in leases]}
    if op == "revive":
        if not isinstance(fields["task_ids"], list):
            raise InvalidRequest("task_ids must be a list")
        return {"task_ids": queue.revive(fields["task_ids"], now=fields["now"])}
    if op == "get":
        task = queue.get(fields["task_id"])
        return {"task": None if task is None else dataclasses.asdict(task)}
    if op == "stats":
        return {"stats": dataclasses.asdict(queue.stats())}
    return {"seq": queue.compact()}


def parse_line(line: bytes) -> dict:
    """Decode one input line into a request object. Raises InvalidRequest."""
    try:
        request = json.loads(line.decode("utf-8"))
    except (UnicodeDecodeError, ValueError, RecursionError) as error:
        raise InvalidRequest(f"the line is not valid JSON: {error}") from None
    if not isinstance(request, dict):
        raise InvalidRequest(f"a request must be a JSON object, not {type(request).__name__}")
    return request


def failure(error: BaseException) -> dict:
    answer = {"ok": False, "error": type(error).__name__, "message": str(error)}
    if isinstance(error, StaleLease):
        # Lets a retrying caller tell its own completed ack from a lost lease.
        answer.update(task_id=error.task_id, status=error.status, generation=error.generation)
    return answer


def serve(directory: str, lines, write) -> int:
    """Answer every line of `lines` (bytes) through `write(str)`; return the exit code."""
    try:
        queue = Queue(directory)
    except QueueLocked as error:
        print(f"walqueue.cli: {error}", file=sys.stderr)
        return EXIT_LOCKED
    except CorruptStore as error:
        print(f"walqueue.cli: {error}", file=sys.stderr)
        return EXIT_CORRUPT
    try:
        for line in lines:
            if not line.strip():
                continue
            request: dict = {}
            try:
                request = parse_line(line)
                answer = {"ok": True, **execute(queue, request)}
            except WalQueueError as error:
                answer = failure(error)
            except OSError as error:
                # The write failed and the Queue closed itself; nothing was
                # answered as a success, so reopen and go on.
                answer = failure(error)
                try:
                    queue = Queue(directory)
                except WalQueueError as reopen_error:
                    write(_dumps(_with_id(answer, request)))
                    print(f"walqueue.cli: cannot reopen {directory}: {reopen_error}",
                          file=sys.stderr)
                    return EXIT_REOPEN_FAILED
            write(_dumps(_with_id(answer, request)))
    finally:
        queue.close()
    return EXIT_OK


def _with_id(answer: dict, request: dict) -> dict:
    if "id" in request:
        answer["id"] = request["id"]
    return answer


def _dumps(value: dict) -> str:
    return json.dumps(value, allow_nan=False) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m walqueue.cli",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        description="Serve JSON-lines requests from stdin against the queue in DIRECTORY.\n\n"
                    "One JSON object per line in, one answer per line out, in order:\n"
                    '  {"op": OP, ...arguments, "id": optional}  ->  {"ok": true, ...} or\n'
                    '  {"ok": false, "error": EXCEPTION_NAME, "message": ...}\n'
                    "OP is put, put_many, reserve, ack, release, touch, revive, get, stats or\n"
                    "compact (SPEC §7); reserve, ack, release, touch and revive need \"now\"\n"
                    "(Unix seconds): the library reads no clock. Example:\n"
                    '  {"op": "put", "task_id": "t1", "payload": {"n": 1}}\n'
                    '  {"op": "reserve", "worker": "w", "now": 1700000000, "lease_seconds": 30}',
        epilog="Exit codes: 0 end of input, 2 usage, 3 directory locked, 4 corrupt store, "
               "5 a write failed and the queue could not be reopened.")
    parser.add_argument("directory", help="the queue directory (created if missing)")
    arguments = parser.parse_args(argv)

    def write(text: str) -> None:
        sys.stdout.write(text)
        sys.stdout.flush()

    return serve(arguments.directory, sys.stdin.buffer, write)


if __name__ == "__main__":
    sys.exit(main())
