"""A worker process for the PostgreSQL load, fault and failover tests.

`python -m tests.pg.load_worker --dsn-file F --queue Q --schema S --worker W
--seconds N --seed K --log L` runs a seeded random mix of put, put_many,
reserve, ack, ack_and_reserve, release, touch, late (expired) leases and
deliberately stale acks on one queue for N seconds, and writes one JSON line
per call to L (format below), flushed as it goes. On DatabaseUnavailable it
logs the call as "unknown", re-reads the DSN from F (a failover test points
it at the promoted standby) and goes on; it never retries a lost call, so the
log says exactly what was answered.

A line: {"op", "worker", "start", "end" (time.monotonic, shared by all
processes of the machine), "outcome": "ok" | "error" | "unknown", "error"
(the class name), "status"/"generation" (a StaleLease's), and per op:
put/put_many "tasks": [[task_id, payload], ...]; reserve "lease_seconds",
"leases": [[task_id, generation, deadline, attempts], ...]; ack, release,
touch "task_id", "generation" (touch also "deadline"); ack_and_reserve both.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time

from walqueue import StaleLease, WalQueueError
from walqueue.errors import Unavailable
from walqueue.pg import Client

LONG_LEASE_SECONDS = 30
SHORT_LEASE_SECONDS = 1


class Log:
    def __init__(self, path: str, worker: str) -> None:
        self.file = open(path, "a", buffering=1)
        self.worker = worker

    def call(self, op: str, fields: dict, function, *args, **kwargs):
        """Run `function(*args, **kwargs)`, log the outcome; returns (outcome, result)."""
        start = time.monotonic()
        entry = {"op": op, "worker": self.worker, "start": start, **fields}
        try:
            result = function(*args, **kwargs)
        except StaleLease as error:
            entry.update(outcome="error", error="StaleLease", status=error.status,
                         generation_now=error.generation)
            result, outcome = None, "error"
        except Unavailable as error:
            entry.update(outcome="unknown", error=type(error).__name__, message=str(error)[:200])
            result, outcome = None, "unknown"
        except WalQueueError as error:
            entry.update(outcome="error", error=type(error).__name__, message=str(error)[:200])
            result, outcome = None, "error"
        else:
            outcome = "ok"
            entry["outcome"] = "ok"
        entry["end"] = time.monotonic()
        if outcome == "ok" and result is not None and op in ("reserve", "ack_and_reserve"):
            entry["leases"] = [[lease.task_id, lease.generation, lease.deadline, lease.attempts]
                               for lease in result]
        if outcome == "ok" and op == "touch":
            entry["deadline"] = result.deadline
        self.file.write(json.dumps(entry) + "\n")
        return outcome, result


def fields_of(lease, **more) -> dict:
    return {"task_id": lease.task_id, "generation": lease.generation, **more}


def run(args) -> None:
    rng = random.Random(args.seed)
    log = Log(args.log, args.worker)
    client = None
    held: list = []       # leases this worker believes it holds
    old: list = []        # leases it gave back: acking one again must be refused
    serial = 0
    end = time.monotonic() + args.seconds
    while time.monotonic() < end:
        if client is None:
            try:
                with open(args.dsn_file) as file:
                    dsn = file.read().strip()
                client = Client(dsn, queue=args.queue, schema=args.schema, migrate=False,
                                connect_seconds=3, retry_seconds=0)
            except Unavailable:
                time.sleep(0.2)
                continue
        choice = rng.random()
        outcome = "ok"
        if choice < 0.22:
            serial += 1
            task_id = f"{args.worker}-{serial}"
            payload = {"n": serial, "w": args.worker}
            outcome, _ = log.call("put", {"tasks": [[task_id, payload]]}, client.put, task_id,
                                  payload)
        elif choice < 0.27:
            tasks = []
            for _ in range(3):
                serial += 1
                tasks.append([f"{args.worker}-{serial}", {"n": serial}])
            outcome, _ = log.call("put_many", {"tasks": tasks}, client.put_many,
                                  [{"task_id": task_id, "payload": payload}
                                   for task_id, payload in tasks])
        elif choice < 0.30 and old:
            lease = rng.choice(old)
            outcome, _ = log.call("ack", fields_of(lease, stale=True), client.ack, lease)
        elif choice < 0.33 and held:
            # Release one lease and at once take everything due: often the same
            # task again, at the next generation; then ack the released lease,
            # which must be refused (a backend that ignores generations takes it).
            lease = held.pop(rng.randrange(len(held)))
            outcome, _ = log.call("release", fields_of(lease), client.release, lease)
            if outcome == "ok":
                old.append(lease)
                outcome, leases = log.call("reserve", {"lease_seconds": LONG_LEASE_SECONDS},
                                           client.reserve, args.worker,
                                           lease_seconds=LONG_LEASE_SECONDS, limit=50)
                held += leases or []
                outcome, _ = log.call("ack", fields_of(lease, stale=True), client.ack, lease)
        elif not held or choice < 0.45:
            lease_seconds = SHORT_LEASE_SECONDS if rng.random() < 0.1 else LONG_LEASE_SECONDS
            outcome, leases = log.call("reserve", {"lease_seconds": lease_seconds}, client.reserve,
                                       args.worker, lease_seconds=lease_seconds,
                                       limit=rng.randint(1, 3))
            if lease_seconds == SHORT_LEASE_SECONDS:
                old += leases or []  # left to expire
            else:
                held += leases or []
        else:
            lease = held.pop(rng.randrange(len(held)))
            action = rng.random()
            if action < 0.55:
                outcome, _ = log.call("ack", fields_of(lease), client.ack, lease)
                if outcome == "ok":
                    old.append(lease)
            elif action < 0.7:
                outcome, leases = log.call(
                    "ack_and_reserve", fields_of(lease, lease_seconds=LONG_LEASE_SECONDS),
                    client.ack_and_reserve, lease, lease_seconds=LONG_LEASE_SECONDS, limit=2)
                held += leases or []
                if outcome == "ok":
                    old.append(lease)
            elif action < 0.85:
                outcome, _ = log.call("release", fields_of(lease), client.release, lease)
                if outcome == "ok":
                    old.append(lease)
            else:
                outcome, touched = log.call("touch", fields_of(lease), client.touch, lease,
                                            lease_seconds=LONG_LEASE_SECONDS)
                if outcome == "ok":
                    held.append(touched)
        old = old[-20:]
        if outcome == "unknown":
            client.close()
            client = None
            held.clear()
    if client is not None:
        client.close()


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    for name in ("dsn-file", "queue", "schema", "worker", "log"):
        parser.add_argument(f"--{name}", required=True)
    parser.add_argument("--seconds", type=float, required=True)
    parser.add_argument("--seed", type=int, required=True)
    run(parser.parse_args(argv))


if __name__ == "__main__":
    main(sys.argv[1:])
