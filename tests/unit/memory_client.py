"""An in-memory backend: the whole client contract of walqueue.backend, with no daemon and no
database, and faults to inject. ``MemoryClient`` is its sync face (a ``Backend``),
``AsyncMemoryClient`` its asyncio face (an ``AsyncBackend``): neither is walqueue.client nor
walqueue.pg, which is the point (the Workers need only walqueue.worker.policy's contract, and
the conformance suite, tests/backends/faces.py, holds it to SPEC §2 beside the real clients).

``MemoryQueue`` holds the tasks, written from SPEC §2 as plainly as possible (dictionaries and
sorted lists): permanent keys and identities, put_many all or nothing, (available_at, task_id)
order, attempts and generations, StaleLease with the task's status and generation, dead at
max_attempts, revive, payload copies. Arguments are checked by walqueue.validation, the
library's own rules (SPEC §1), so a bad argument fails here as it fails everywhere else; the
frame-size bound of §1 is the WAL's and is not modelled.

``now`` is ``int(clock.now())``, the test's clock, read once a call. Like the services (SPEC
§8a, §9: leases end on time), this backend reaps every expired lease before each call of a
client, so a lease presented at its deadline finds its task already ``ready`` (or ``dead``).

Test-side helpers keep the Worker tests short: ``queue.put(task_id)`` (payload ``{}``),
``queue.reserve(worker, lease_seconds, limit)``, ``queue.view(task_id)`` (which does not reap:
it shows the state as it is), ``queue.tasks`` (task_id -> a dict of the task's fields),
``queue.calls`` (every client call, in order) and ``queue.faults`` (operation -> a list of
"lost": applied, answer lost; "down": not applied; None: no fault, consumed one a call).
``queue.writes`` counts the changes applied: a call that writes nothing leaves it alone.
"""

import copy
import hashlib
import json
import math
import threading
from collections.abc import Iterable, Mapping

from walqueue import (
    InvalidRequest,
    KeyConflict,
    Lease,
    PutRequest,
    QueueClosed,
    QueueStats,
    StaleLease,
    TaskView,
    WorkerView,
    cancel,
    listing,
    validation,
)
from walqueue.backend import ACK_AND_RESERVE
from walqueue.errors import Unavailable

MAX_WAIT_SECONDS = 300  # SPEC §8: 0 <= wait <= 300
PUT_FIELDS = ("task_id", "payload", "key", "available_at", "max_attempts")


class LostAnswer(Unavailable):
    """Stands for DaemonUnavailable / DatabaseUnavailable: the Workers catch the base class."""


def identity(request):
    """SPEC §2's identity: sha256 of the canonical JSON of the ORIGINAL request's four fields."""
    fields = {name: request[name] for name in ("available_at", "max_attempts", "payload", "task_id")}
    text = json.dumps(fields, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()


def checked_request(task_id, payload, key, available_at, max_attempts, where="", containers=None):
    """A put request with every field checked (SPEC §1), its payload a fresh copy."""
    task_id = validation.name(task_id, f"{where}task_id")
    key = task_id if key is None else validation.name(key, f"{where}key")
    return {"task_id": task_id, "key": key,
            "available_at": validation.integer(available_at, f"{where}available_at"),
            "max_attempts": validation.integer(max_attempts, f"{where}max_attempts", minimum=1),
            "payload": validation.payload(payload, f"{where}payload", containers)}


def checked_requests(requests):
    if isinstance(requests, (str, bytes, Mapping)) or not isinstance(requests, Iterable):
        raise InvalidRequest("requests must be a list of PutRequest or mappings")
    containers = validation.Containers()  # shared: the bound is on the whole request
    checked = []
    for index, item in enumerate(requests):
        where = f"requests[{index}]."
        if isinstance(item, PutRequest):
            fields = {name: getattr(item, name) for name in PUT_FIELDS}
        elif isinstance(item, Mapping):
            if set(item) - set(PUT_FIELDS) or not {"task_id", "payload"} <= set(item):
                raise InvalidRequest(f"{where[:-1]} must have the fields task_id and payload, and "
                                     f"may have key, available_at and max_attempts")
            fields = {"key": None, "available_at": 0, "max_attempts": 3, **item}
        else:
            raise InvalidRequest(f"{where[:-1]} must be a PutRequest or a mapping, not {type(item).__name__}")
        checked.append(checked_request(*(fields[name] for name in PUT_FIELDS), where, containers))
    return checked


def checked_wait(wait):
    if isinstance(wait, bool) or not isinstance(wait, (int, float)):
        raise InvalidRequest(f"wait must be a number of seconds, got {type(wait).__name__}")
    if not (math.isfinite(wait) and 0 <= wait <= MAX_WAIT_SECONDS):
        raise InvalidRequest(f"wait must be between 0 and {MAX_WAIT_SECONDS} seconds, got {wait!r}")
    return wait


def checked_lease(lease):
    """(task_id, worker, generation) of a Lease, each checked."""
    return (validation.name(getattr(lease, "task_id", None), "lease.task_id"),
            validation.name(getattr(lease, "worker", None), "lease.worker"),
            validation.integer(getattr(lease, "generation", None), "lease.generation"))


class MemoryQueue:
    """Tasks and leases; ``now`` comes from the test's clock."""

    def __init__(self, clock):
        self.clock = clock
        self.tasks = {}  # task_id -> the task's fields (and its key's identity)
        self.keys = {}  # key -> task_id
        self.calls = []  # (operation, task_id or worker, ...) in call order
        self.faults = {}  # operation -> list of "lost" (applied, answer lost), "down" (not applied), None
        self.writes = 0
        self._lock = threading.RLock()

    def now(self):
        return validation.integer(int(self.clock.now()), "the clock's now")

    def call(self, operation, subject, apply, *details):
        """A client's call: recorded, its fault (if any) injected, the expired leases reaped first."""
        with self._lock:
            self.calls.append((operation, subject, *details))
            faults = self.faults.get(operation)
            fault = faults.pop(0) if faults else None
            if fault == "down":
                raise LostAnswer(f"{operation}: the service is down")
            self._reap(self.now())
            value = apply()
            if fault == "lost":
                raise LostAnswer(f"{operation}: the answer was lost")
            return value

    # -- writes ---------------------------------------------------------------------

    def put(self, task_id, payload=None, *, key=None, available_at=0, max_attempts=3):
        """One task (test-side: the payload defaults to ``{}``); returns its id."""
        request = checked_request(task_id, {} if payload is None else payload, key, available_at, max_attempts)
        return self.put_checked([request])[0]

    def put_checked(self, requests):
        """SPEC §2's put_many of checked requests: all new tasks, or KeyConflict and nothing."""
        with self._lock:
            ids, new, new_ids = [], {}, set()
            for request in requests:
                request["identity"] = identity(request)
                key, task_id = request["key"], request["task_id"]
                owner = self.keys.get(key)
                if owner is not None:
                    if self.tasks[owner]["identity"] != request["identity"]:
                        raise KeyConflict(f"key {key!r} is already used by task {owner!r} with a different request")
                    ids.append(owner)
                elif key in new:
                    if new[key]["identity"] != request["identity"]:
                        raise KeyConflict(f"key {key!r} appears twice in the request with different requests")
                    ids.append(new[key]["task_id"])
                elif task_id in self.tasks:
                    raise KeyConflict(f"task id {task_id!r} is already used (under key {self.tasks[task_id]['key']!r})")
                elif task_id in new_ids:
                    raise KeyConflict(f"task id {task_id!r} appears twice in the request under different keys")
                else:
                    new[key] = request
                    new_ids.add(task_id)
                    ids.append(task_id)
            for request in new.values():
                self.keys[request["key"]] = request["task_id"]
                self.tasks[request["task_id"]] = {
                    "key": request["key"], "identity": request["identity"], "status": "ready", "attempts": 0,
                    "max_attempts": request["max_attempts"], "generation": 0,
                    "available_at": request["available_at"], "deadline": None, "worker": None,
                    "payload": request["payload"]}
            if new:
                self.writes += 1
            return ids

    def _end_lease(self, task, status, available_at):
        task.update(status=status, available_at=available_at, deadline=None, worker=None)

    def _reap(self, now):
        expired = [task for task in self.tasks.values() if task["status"] == "leased" and task["deadline"] <= now]
        for task in expired:
            self._end_lease(task, "dead" if task["attempts"] >= task["max_attempts"] else "ready", task["deadline"])
        if expired:
            self.writes += 1

    def reserve(self, worker, lease_seconds, limit):
        """SPEC §2's reserve at the clock's now: reap, then lease up to `limit` due tasks."""
        with self._lock:
            worker = cancel.check_worker(validation.name(worker, "worker"))
            lease_seconds = validation.integer(lease_seconds, "lease_seconds", minimum=1)
            limit = validation.integer(limit, "limit", minimum=1, maximum=validation.MAX_RESERVE_LIMIT)
            now = self.now()
            deadline = validation.time_plus(now, lease_seconds, "lease_seconds")
            self._reap(now)
            due = sorted((task["available_at"], task_id) for task_id, task in self.tasks.items()
                         if task["status"] == "ready" and task["available_at"] <= now)
            leases = []
            for _, task_id in due[:limit]:
                task = self.tasks[task_id]
                task.update(status="leased", attempts=task["attempts"] + 1, generation=task["generation"] + 1,
                            worker=worker, deadline=deadline)
                leases.append(self._lease_of(task_id))
            if leases:
                self.writes += 1
            return leases

    def current(self, lease, now):
        """The task of a current lease (SPEC §2: leased, same worker and generation, now < deadline)."""
        task_id, worker, generation = checked_lease(lease)
        task = self.tasks.get(task_id)
        if (task is None or task["status"] != "leased" or task["generation"] != generation
                or task["worker"] != worker or not now < task["deadline"]):
            status = None if task is None else task["status"]
            raise StaleLease(f"task {task_id!r}: the lease of {worker!r} at generation {generation} is not "
                             f"current (the task is {status or 'unknown'})", task_id=task_id, status=status,
                             generation=None if task is None else task["generation"])
        return task

    def ack(self, lease):
        with self._lock:
            task = self.current(lease, self.now())
            self._end_lease(task, "completed", task["available_at"])
            task["payload"] = None
            self.writes += 1

    def release(self, lease, delay):
        with self._lock:
            now = self.now()
            available_at = validation.time_plus(now, validation.integer(delay, "delay"), "delay")
            task = self.current(lease, now)
            self._end_lease(task, "dead" if task["attempts"] >= task["max_attempts"] else "ready", available_at)
            self.writes += 1

    def touch(self, lease, lease_seconds):
        with self._lock:
            now = self.now()
            deadline = validation.time_plus(
                now, validation.integer(lease_seconds, "lease_seconds", minimum=1), "lease_seconds")
            task = self.current(lease, now)
            task["deadline"] = deadline
            self.writes += 1
            return self._lease_of(lease.task_id)

    def revive(self, task_ids):
        """Every listed task must be dead (else InvalidRequest, nothing changed); each becomes ready now."""
        with self._lock:
            if isinstance(task_ids, (str, bytes, Mapping)) or not isinstance(task_ids, Iterable):
                raise InvalidRequest("task_ids must be a list of task ids")
            unique = list(dict.fromkeys(validation.name(task_id, "task_id") for task_id in task_ids))
            for task_id in unique:
                task = self.tasks.get(task_id)
                if task is None:
                    raise InvalidRequest(f"task {task_id!r} is unknown, not dead")
                if task["status"] != "dead":
                    raise InvalidRequest(f"task {task_id!r} is {task['status']}, not dead")
            now = self.now()
            for task_id in unique:
                self.tasks[task_id].update(status="ready", attempts=0, available_at=now)
            if unique:
                self.writes += 1
            return unique

    def cancel(self, task_id):
        """SPEC §8b: a due ready or a dead task becomes completed unleased (walqueue.cancel's readings)."""
        with self._lock:
            task_id, now = validation.name(task_id, "task_id"), self.now()
            view = self.view(task_id)
            if cancel.check(task_id, view, now):
                attempts, generation, available_at = cancel.completed_counters(view, now)
                self.tasks[task_id].update(status="completed", attempts=attempts, generation=generation,
                                           available_at=available_at, payload=None)
                self.writes += 1

    # -- reads ----------------------------------------------------------------------

    def _lease_of(self, task_id):
        task = self.tasks[task_id]
        return Lease(task_id, task["worker"], task["generation"], task["deadline"], task["attempts"],
                     copy.deepcopy(task["payload"]))

    def view(self, task_id):
        with self._lock:
            task = self.tasks.get(validation.name(task_id, "task_id"))
            if task is None:
                return None
            return TaskView(task_id, task["key"], task["status"], task["attempts"], task["max_attempts"],
                            task["generation"], task["available_at"], task["deadline"], task["worker"],
                            copy.deepcopy(task["payload"]))

    def listing(self, status, after=None, limit=None):
        with self._lock:
            status = validation.status(status)
            after, limit = listing.check_page(after, limit)
            views = [self.view(task_id) for task_id in sorted(self.tasks)
                     if (status is None or self.tasks[task_id]["status"] == status)
                     and (after is None or task_id > after)]
            return views if limit is None else views[:limit]

    def workers(self):
        """The lease holders by name; none is ``connected``: there are no connections here."""
        with self._lock:
            counts = {}
            for task in self.tasks.values():
                if task["status"] == "leased":
                    counts[task["worker"]] = counts.get(task["worker"], 0) + 1
            return [WorkerView(worker, leases, False) for worker, leases in sorted(counts.items())]

    def stats(self):
        """Counts by status; last_seq, snapshot_seq and wal_bytes are 0: there is no WAL here."""
        with self._lock:
            counts = {status: 0 for status in validation.STATUSES}
            for task in self.tasks.values():
                counts[task["status"]] += 1
            return QueueStats(counts["ready"], counts["leased"], counts["completed"], counts["dead"], 0, 0, 0)


class MemoryClient:
    """The sync face: every call of walqueue.backend.Backend, through ``queue.call``."""

    capabilities = frozenset({ACK_AND_RESERVE})

    def __init__(self, queue):
        self.queue = queue
        self._closed = False

    @property
    def closed(self):
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        self.close()

    def close(self):
        self._closed = True

    def _call(self, operation, subject, apply, *details):
        if self._closed:
            raise QueueClosed("this MemoryClient is closed")
        return self.queue.call(operation, subject, apply, *details)

    def put(self, task_id, payload, *, key=None, available_at=0, delay=None, max_attempts=3):
        def apply():
            at = available_at
            if delay is not None:
                if available_at != 0:
                    raise InvalidRequest(f"task {task_id!r}: give delay or available_at, not both")
                at = validation.time_plus(self.queue.now(), validation.integer(delay, "delay"), "delay")
            return self.queue.put_checked([checked_request(task_id, payload, key, at, max_attempts)])[0]

        return self._call("put", task_id, apply)

    def put_many(self, requests):
        requests = list(requests) if isinstance(requests, Iterable) and not isinstance(
            requests, (str, bytes, Mapping)) else requests
        return self._call("put_many", None, lambda: self.queue.put_checked(checked_requests(requests)))

    def reserve(self, worker, *, lease_seconds=30, limit=1, wait=0):
        def apply():
            checked_wait(wait)  # nothing waits here: a reserve answers at once
            return self.queue.reserve(worker, lease_seconds, limit)

        return self._call("reserve", worker, apply, wait, limit)

    def ack(self, lease):
        return self._call("ack", lease.task_id, lambda: self.queue.ack(lease))

    def ack_and_reserve(self, lease, *, lease_seconds=30, limit=1, wait=0):
        def apply():
            # The reserve half's arguments first: a refused reserve must not leave the ack done.
            checked_wait(wait)
            validation.integer(limit, "limit", minimum=1, maximum=validation.MAX_RESERVE_LIMIT)
            validation.time_plus(self.queue.now(), validation.integer(lease_seconds, "lease_seconds", minimum=1),
                                 "lease_seconds")
            self.queue.ack(lease)
            return self.queue.reserve(lease.worker, lease_seconds, limit)

        return self._call("ack_and_reserve", lease.task_id, apply, wait)

    def release(self, lease, *, delay=0):
        return self._call("release", lease.task_id, lambda: self.queue.release(lease, delay), delay)

    def touch(self, lease, *, lease_seconds):
        return self._call("touch", lease.task_id, lambda: self.queue.touch(lease, lease_seconds))

    def revive(self, task_ids):
        task_ids = list(task_ids) if isinstance(task_ids, Iterable) and not isinstance(
            task_ids, (str, bytes, Mapping)) else task_ids
        return self._call("revive", None, lambda: self.queue.revive(task_ids))

    def get(self, task_id):
        return self._call("get", task_id, lambda: self.queue.view(task_id))

    def tasks(self, status=None, *, after=None, limit=None):
        return self._call("tasks", status, lambda: self.queue.listing(status, after, limit))

    def cancel(self, task_id):
        return self._call("cancel", task_id, lambda: self.queue.cancel(task_id))

    def workers(self):
        return self._call("workers", None, self.queue.workers)

    def stats(self):
        return self._call("stats", None, self.queue.stats)


class AsyncMemoryClient:
    """The asyncio face of the same queue: each call of MemoryClient, as a coroutine."""

    capabilities = MemoryClient.capabilities

    def __init__(self, queue):
        self._sync = MemoryClient(queue)
        self.queue = queue

    @property
    def closed(self):
        return self._sync.closed

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc_info):
        await self.close()

    async def close(self):
        self._sync.close()

    async def put(self, task_id, payload, **options):
        return self._sync.put(task_id, payload, **options)

    async def put_many(self, requests):
        return self._sync.put_many(requests)

    async def reserve(self, worker, **options):
        return self._sync.reserve(worker, **options)

    async def ack(self, lease):
        return self._sync.ack(lease)

    async def ack_and_reserve(self, lease, **options):
        return self._sync.ack_and_reserve(lease, **options)

    async def release(self, lease, **options):
        return self._sync.release(lease, **options)

    async def touch(self, lease, **options):
        return self._sync.touch(lease, **options)

    async def revive(self, task_ids):
        return self._sync.revive(task_ids)

    async def get(self, task_id):
        return self._sync.get(task_id)

    async def tasks(self, status=None, **options):
        return self._sync.tasks(status, **options)

    async def cancel(self, task_id):
        return self._sync.cancel(task_id)

    async def workers(self):
        return self._sync.workers()

    async def stats(self):
        return self._sync.stats()
