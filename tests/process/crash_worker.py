"""A worker process for the crash harness: seeded operations through ``walqueue.client``.

``python -m tests.process.crash_worker SOCKET LOG WORKER SEED STOP_FILE MAX_SECONDS``
puts, reserves, acks (alone and through ack_and_reserve), releases, touches
and sometimes compacts, with every choice drawn from
``random.Random(f"{SEED}:{WORKER}")``, until STOP_FILE
exists (or MAX_SECONDS pass — a safety bound; the harness treats reaching it
as a failure). The daemon is killed and restarted under it: the worker waits
for the daemon to come back (polling with a deadline), retries its puts
(idempotent: the same task id, payload, key and absolute ``available_at``)
and goes on.

Every operation is appended to LOG as one JSON line (``OpLog``), written
with one ``os.write`` on an ``O_APPEND`` descriptor before the next
operation starts, so the checker reads it even if this process dies::

    {"worker": W, "index": I,
     "op": "put"|"put_many"|"reserve"|"ack"|"ack_and_reserve"|"release"|"touch"|"compact",
     "outcome": "ok"|"error"|"unknown", "error": CLASS|null,
     "task_id": T|null, "generation": G|null, "started": MONOTONIC, "finished": MONOTONIC, ...}

* ``unknown``: the connection died after the request may have been sent
  (``DaemonUnavailable`` other than a failed connect): it may or may not
  have been applied.
* ``error`` with ``DaemonUnavailable``: the connect itself failed, nothing
  was sent.
* a ``reserve`` is logged as one line per lease it returned (outcome ok),
  or one line without a task id (an empty answer, an error or unknown).
* ``put`` lines carry the whole request (payload, key, available_at,
  max_attempts); ``put_many`` lines carry ``tasks``, a list of them.
* an ``ack_and_reserve`` line names the acked lease (``task_id``,
  ``generation``), its ``limit`` and ``lease_seconds``, and, answered ok,
  ``leases``: the [task_id, generation] pairs it returned (handled from then
  on like leases a reserve returned).
* ``StaleLease`` lines carry the task's ``stale_status`` and
  ``stale_generation`` as the daemon reported them.

Task ids encode the worker and a counter: ``W-000042``. Times are
``time.monotonic()`` (one clock for every process on the machine), so the
checker can order operations of different workers that did not overlap.
"""

from __future__ import annotations

import json
import os
import random
import sys
import time
from typing import Any

from walqueue import InvalidRequest, KeyConflict, StaleLease, WalQueueError
from walqueue.client import Client, DaemonUnavailable

CALL_TIMEOUT_SECONDS = 20.0
CLIENT_RETRY_SECONDS = 2.0
DAEMON_WAIT_SECONDS = 30.0
DAEMON_POLL_SECONDS = 0.02
PUT_RETRY_SECONDS = 30.0
# A worker keeps at most this many of its own tasks unprocessed-by-it before it prefers reserving.
BACKLOG_LIMIT = 12


class OpLog:
    """Append-only JSON lines, one ``os.write`` each, so no line is half-buffered in this process."""

    def __init__(self, path: str, worker: str) -> None:
        self.worker = worker
        self.index = 0
        self._fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)

    def write(self, op: str, outcome: str, started: float, *, error: str | None = None,
              task_id: str | None = None, generation: int | None = None, **extra: Any) -> None:
        self.index += 1
        line = {"worker": self.worker, "index": self.index, "op": op, "outcome": outcome, "error": error,
                "task_id": task_id, "generation": generation, "started": started,
                "finished": time.monotonic(), **extra}
        os.write(self._fd, (json.dumps(line, sort_keys=True) + "\n").encode())

    def close(self) -> None:
        os.close(self._fd)


def classify(exc: BaseException) -> tuple[str, str, dict]:
    """(outcome, error class, extra fields) for an exception a client call raised."""
    extra: dict = {}
    if isinstance(exc, DaemonUnavailable):
        # Only a failed connect certainly sent nothing (walqueue.client: "cannot connect ...").
        if str(exc).startswith("cannot connect"):
            return "error", "DaemonUnavailable", {"sent": False}
        return "unknown", "DaemonUnavailable", extra
    if isinstance(exc, StaleLease):
        extra = {"stale_status": exc.status, "stale_generation": exc.generation}
        return "error", "StaleLease", extra
    if isinstance(exc, KeyConflict | InvalidRequest):
        return "error", type(exc).__name__, extra
    # Any other daemon-side error (e.g. a failed write it answered with an error)
    # promises nothing either way.
    return "unknown", type(exc).__name__, extra


def wait_for_daemon(client: Client, stop_file: str | None, seconds: float = DAEMON_WAIT_SECONDS) -> bool:
    """Poll until the daemon answers (True), the stop file appears or the time runs out (False)."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if stop_file is not None and os.path.exists(stop_file):
            return False
        try:
            client.stats()
            return True
        except DaemonUnavailable:
            time.sleep(DAEMON_POLL_SECONDS)  # polling a condition, with a deadline
    return False


class CrashWorker:
    """One worker's seeded loop. Also used (``drain``) by the harness itself."""

    def __init__(self, socket_path: str, log_path: str, worker: str, seed: int, stop_file: str | None) -> None:
        self.worker = worker
        self.rng = random.Random(f"{seed}:{worker}")
        self.stop_file = stop_file
        self.log = OpLog(log_path, worker)
        self.client = Client(socket_path, timeout=CALL_TIMEOUT_SECONDS, retry_seconds=CLIENT_RETRY_SECONDS,
                             name=worker)
        self.counter = 0
        self.outstanding = 0  # tasks this worker put minus tasks it acked or saw end

    def close(self) -> None:
        self.client.close()
        self.log.close()

    def stopping(self) -> bool:
        return self.stop_file is not None and os.path.exists(self.stop_file)

    # -- operations, each logged ---------------------------------------------

    def _call(self, op: str, call, *, task_id=None, generation=None, **fields):
        """Run ``call()``; log its outcome; return (outcome, result)."""
        started = time.monotonic()
        try:
            value = call()
        except WalQueueError as exc:
            outcome, error, extra = classify(exc)
            self.log.write(op, outcome, started, error=error, task_id=task_id, generation=generation,
                           **fields, **extra)
            if isinstance(exc, DaemonUnavailable):
                wait_for_daemon(self.client, self.stop_file)
            return outcome, exc
        return "ok", (started, value)

    def new_request(self) -> dict:
        self.counter += 1
        task_id = f"{self.worker}-{self.counter:06d}"
        delay = self.rng.choice([0, 0, 0, 0, 1, 2])
        payload = {"worker": self.worker, "n": self.counter, "text": "x" * self.rng.randint(0, 300)}
        return {
            "task_id": task_id,
            "payload": payload,
            "key": self.rng.choice([None, None, f"key-{task_id}"]),
            "available_at": int(time.time()) + delay if delay else 0,
            "max_attempts": self.rng.randint(2, 6),
        }

    def put(self) -> None:
        request = self.new_request()
        deadline = time.monotonic() + PUT_RETRY_SECONDS
        while True:
            outcome, value = self._call("put", lambda: self.client.put(**request),
                                        task_id=request["task_id"], request=request)
            if outcome == "ok":
                started, _ = value
                self.log.write("put", "ok", started, task_id=request["task_id"], request=request)
                self.outstanding += 1
                return
            # Retried with the very same request: same identity, so idempotent.
            if outcome == "error" and not isinstance(value, DaemonUnavailable):
                return
            if time.monotonic() >= deadline or self.stopping():
                return

    def put_many(self) -> None:
        requests = [self.new_request() for _ in range(self.rng.randint(2, 4))]
        deadline = time.monotonic() + PUT_RETRY_SECONDS
        while True:
            outcome, value = self._call("put_many", lambda: self.client.put_many(requests), tasks=requests)
            if outcome == "ok":
                started, _ = value
                self.log.write("put_many", "ok", started, tasks=requests)
                self.outstanding += len(requests)
                return
            if outcome == "error" and not isinstance(value, DaemonUnavailable):
                return
            if time.monotonic() >= deadline or self.stopping():
                return

    def reserve(self, *, limit: int, lease_seconds: int, wait: float) -> list:
        outcome, value = self._call(
            "reserve", lambda: self.client.reserve(self.worker, lease_seconds=lease_seconds, limit=limit, wait=wait),
            limit=limit, lease_seconds=lease_seconds)
        if outcome != "ok":
            return []
        started, leases = value
        for lease in leases:
            self.log.write("reserve", "ok", started, task_id=lease.task_id, generation=lease.generation,
                           attempts=lease.attempts, deadline=lease.deadline, lease_seconds=lease_seconds)
        if not leases:
            self.log.write("reserve", "ok", started, limit=limit, lease_seconds=lease_seconds)
        return leases

    def ack(self, lease, **extra: Any) -> str:
        outcome, value = self._call("ack", lambda: self.client.ack(lease),
                                    task_id=lease.task_id, generation=lease.generation, **extra)
        if outcome == "ok":
            self.log.write("ack", "ok", value[0], task_id=lease.task_id, generation=lease.generation, **extra)
        return outcome

    def ack_and_reserve(self, lease, *, limit: int, lease_seconds: int, wait: float) -> tuple[str, list]:
        """Ack ``lease`` and reserve in one request: (outcome, the leases it returned)."""
        outcome, value = self._call(
            "ack_and_reserve",
            lambda: self.client.ack_and_reserve(lease, lease_seconds=lease_seconds, limit=limit, wait=wait),
            task_id=lease.task_id, generation=lease.generation, limit=limit, lease_seconds=lease_seconds)
        if outcome != "ok":
            return outcome, []
        started, leases = value
        self.log.write("ack_and_reserve", "ok", started, task_id=lease.task_id, generation=lease.generation,
                       limit=limit, lease_seconds=lease_seconds,
                       leases=[[next_lease.task_id, next_lease.generation] for next_lease in leases])
        return outcome, leases

    def release(self, lease, delay: int) -> str:
        outcome, value = self._call("release", lambda: self.client.release(lease, delay=delay),
                                    task_id=lease.task_id, generation=lease.generation, delay=delay)
        if outcome == "ok":
            self.log.write("release", "ok", value[0], task_id=lease.task_id, generation=lease.generation,
                           delay=delay)
        return outcome

    def touch(self, lease, lease_seconds: int):
        outcome, value = self._call("touch", lambda: self.client.touch(lease, lease_seconds=lease_seconds),
                                    task_id=lease.task_id, generation=lease.generation,
                                    lease_seconds=lease_seconds)
        if outcome != "ok":
            return None
        started, touched = value
        self.log.write("touch", "ok", started, task_id=lease.task_id, generation=lease.generation,
                       lease_seconds=lease_seconds, answered_generation=touched.generation,
                       deadline=touched.deadline)
        return touched

    def compact(self) -> None:
        outcome, value = self._call("compact", self.client.compact)
        if outcome == "ok":
            self.log.write("compact", "ok", value[0], seq=value[1])

    # -- the seeded loop -------------------------------------------------------

    def handle(self, lease) -> list:
        """Do something seeded with one lease; returns the leases an ack_and_reserve handed back."""
        action = self.rng.choices(
            ["ack", "ack_and_reserve", "release", "touch", "abandon", "late", "ack twice", "ack released",
             "ack_and_reserve twice", "ack_and_reserve released"],
            [28, 25, 13, 15, 5, 2, 3, 3, 3, 3])[0]
        if action == "ack":
            if self.ack(lease) == "ok":
                self.outstanding -= 1
        elif action == "ack_and_reserve":
            outcome, leases = self._ack_and_reserve(lease)
            if outcome == "ok":
                self.outstanding -= 1
            return leases
        elif action == "release":
            self.release(lease, self.rng.choice([0, 0, 1]))
        elif action == "ack twice":
            # The second ack must be refused (StaleLease: completed, this generation).
            if self.ack(lease) == "ok":
                self.outstanding -= 1
                self.ack(lease)
        elif action == "ack_and_reserve twice":
            # Refused the same way, and reserving nothing.
            if self.ack(lease) == "ok":
                self.outstanding -= 1
                return self._ack_and_reserve(lease)[1]
        elif action == "ack released":
            # An ack of a lease already given back must be refused.
            if self.release(lease, 0) == "ok":
                self.ack(lease)
        elif action == "ack_and_reserve released":
            if self.release(lease, 0) == "ok":
                return self._ack_and_reserve(lease)[1]
        elif action == "touch":
            touched = self.touch(lease, self.rng.randint(1, 3))
            if touched is not None and self.ack(touched) == "ok":
                self.outstanding -= 1
        elif action == "late":
            # Ack once wall time has reached the lease's deadline: the daemon's now is
            # then at least the deadline, so it must answer StaleLease (SPEC §2: now < deadline).
            deadline = time.monotonic() + lease.deadline - time.time() + 0.02
            while time.monotonic() < deadline and not self.stopping():
                time.sleep(0.05)  # waiting for wall time to pass a deadline; nothing to await
            if time.monotonic() >= deadline:
                self.ack(lease, late=True)
        # "abandon": keep nothing; the lease expires in the daemon.
        return []

    def _ack_and_reserve(self, lease) -> tuple[str, list]:
        return self.ack_and_reserve(lease, limit=self.rng.randint(1, 2), lease_seconds=self.rng.randint(1, 3),
                                    wait=self.rng.choice([0, 0, 0.2]))

    def drain(self, seconds: float) -> bool:
        """Reserve and ack until nothing is ready or leased; False if ``seconds`` ran out."""
        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            leases = self.reserve(limit=100, lease_seconds=60, wait=0.5)
            for lease in leases:
                self.ack(lease)
            if leases:
                continue
            try:
                stats = self.client.stats()
            except DaemonUnavailable:
                wait_for_daemon(self.client, None)
                continue
            if stats.ready == 0 and stats.leased == 0:
                return True
        return False

    def step(self) -> None:
        kinds = ["put", "put_many", "reserve", "compact"]
        weights = [30, 10, 58, 2] if self.outstanding < BACKLOG_LIMIT else [5, 2, 91, 2]
        kind = self.rng.choices(kinds, weights)[0]
        if kind == "put":
            self.put()
        elif kind == "put_many":
            self.put_many()
        elif kind == "compact":
            self.compact()
        else:
            leases = self.reserve(limit=self.rng.randint(1, 3), lease_seconds=self.rng.randint(1, 3),
                                  wait=self.rng.choice([0, 0, 0.2]))
            # Leases an ack_and_reserve returns join the queue of leases in hand.
            while leases and not self.stopping():
                leases.extend(self.handle(leases.pop(0)))

    def run(self, max_seconds: float) -> int:
        deadline = time.monotonic() + max_seconds
        wait_for_daemon(self.client, self.stop_file)
        while not self.stopping():
            if time.monotonic() >= deadline:
                print(f"crash_worker {self.worker}: still running after {max_seconds} s", file=sys.stderr)
                return 1
            self.step()
        return 0


def main(argv: list[str]) -> int:
    socket_path, log_path, worker, seed, stop_file, max_seconds = argv
    crash_worker = CrashWorker(socket_path, log_path, worker, int(seed), stop_file)
    try:
        return crash_worker.run(float(max_seconds))
    finally:
        crash_worker.close()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
