"""The queue's state machine: tasks, their indexes, and the transitions.

No I/O, no clock, no randomness. `check(record)` decides whether a WAL record
is valid against the current state and raises the library error that says
why not; `commit(change)` applies a checked record. `apply(record)` is both,
and is what recovery calls; the Queue calls `check`, writes the frame, then
`commit`s the same change, so serving and recovering run the same code.

Invariants kept (and checked when a snapshot is loaded):
  - keys and task ids are unique and never reused (tombstones stay);
  - ready: attempts < max_attempts; dead: attempts == max_attempts;
    generation >= attempts; only leased tasks have a worker and a deadline;
    only completed tasks have no payload.

Where tasks live: `tasks` holds the live ones (ready, leased, dead: a dead
task keeps its payload and can be revived) as Task objects, and
`task_id_by_key` their keys; a completed task leaves both for `tombstones`,
a packed store (see tombstones.py) that costs a fraction of a Task. Ack is
the only way in, while serving as while replaying, and a snapshot loads its
completed entries straight into it, so serving and recovery build the same
store. Ids and keys are unique across both.

Indexes: `_ready` is a heap of (available_at, task_id) and `_leases` a heap
of (deadline, task_id). Entries are never removed in place; an entry is live
only while the task still has that status and that time, so stale entries
are dropped when they surface (also when the task has become a tombstone
since), and the heaps are filtered when more than
half of them is stale. Leasing one task among a million ready ones therefore
costs O(log n).

Two figures for monitoring (the daemon's metrics) are kept by a
`Monitoring` (walqueue.monitoring), told of each change as it is committed,
so recovery rebuilds them exactly as serving built them.

How big a snapshot of the state would be, without writing one (walqueued
checks the free space before it compacts): `snapshot_growth` adds up, record
by record, what snapshot_size.growth bounds each one changed the snapshot's
size by; loading snapshot entries adds nothing, so a snapshot of the state
now takes at most the size of one taken earlier plus the growth since then.
"""

from __future__ import annotations

import heapq
import re
from array import array
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

from . import validation
from .codec import canonical_json
from .errors import InvalidRequest, KeyConflict, StaleLease
from .listing import LiveIndex
from .monitoring import Monitoring
from .puts import identity_digest, identity_of, plan_puts
from .snapshot_size import growth as snapshot_growth_of
from .tombstones import Tombstone, TombstoneStore

READY, LEASED, COMPLETED, DEAD = validation.STATUSES
MAX_EXPIRE_IDS = 10_000

RECORD_FIELDS = {
    "put": frozenset({"op", "seq", "tasks"}),
    "expire": frozenset({"now", "op", "seq", "task_ids"}),
    "reserve": frozenset({"lease_seconds", "now", "op", "seq", "task_ids", "worker"}),
    "ack": frozenset({"generation", "now", "op", "seq", "task_id", "worker"}),
    "release": frozenset({"delay", "generation", "now", "op", "seq", "task_id", "worker"}),
    "touch": frozenset({"generation", "lease_seconds", "now", "op", "seq", "task_id", "worker"}),
    "revive": frozenset({"now", "op", "seq", "task_ids"}),
}
PUT_TASK_FIELDS = frozenset({"available_at", "key", "max_attempts", "payload", "task_id"})
ENTRY_FIELDS = frozenset({"attempts", "available_at", "deadline", "generation", "identity", "key",
                          "max_attempts", "payload", "status", "task_id", "worker"})
_IDENTITY = re.compile(r"[0-9a-f]{64}")  # a SHA-256 hex digest, lowercase
_NONE = type(None)
# status -> the types of (worker, deadline, payload) a snapshot entry must have
_ENTRY_SHAPES = {
    READY: (_NONE, _NONE, dict),
    LEASED: (str, int, dict),
    COMPLETED: (_NONE, _NONE, type(None)),
    DEAD: (_NONE, _NONE, dict),
}


class Task:
    __slots__ = ("task_id", "key", "identity", "status", "attempts", "max_attempts",
                 "generation", "available_at", "deadline", "worker", "payload",
                 "ready_seq", "lease_start")

    def __init__(self, task_id, key, identity, status, attempts, max_attempts, generation,
                 available_at, deadline, worker, payload, ready_seq=0, lease_start=None):
        self.task_id = task_id
        self.key = key
        self.identity = identity
        self.status = status
        self.attempts = attempts
        self.max_attempts = max_attempts
        self.generation = generation
        self.available_at = available_at
        self.deadline = deadline
        self.worker = worker
        self.payload = payload
        self.ready_seq = ready_seq  # seq of the record that last made it ready (see the header)
        self.lease_start = lease_start  # `now` of the reserve/touch that set the deadline

    def pin_identity(self) -> str:
        """The identity, computed from the put's fields while they are still unchanged.

        A task put through the WAL gets its identity lazily (hashing every
        task on replay is a third of recovery time); it must be pinned before
        available_at or the payload first change, which every transition that
        changes them does first.
        """
        if self.identity is None:
            self.identity = identity_of(self.task_id, self.payload, self.available_at,
                                        self.max_attempts)
        return self.identity

    def entry(self) -> dict:
        """This task as a snapshot entry (SPEC §4)."""
        return {"attempts": self.attempts, "available_at": self.available_at,
                "deadline": self.deadline, "generation": self.generation,
                "identity": self.pin_identity(), "key": self.key,
                "max_attempts": self.max_attempts, "payload": self.payload,
                "status": self.status, "task_id": self.task_id, "worker": self.worker}


class State:
    def __init__(self) -> None:
        self.tasks: dict[str, Task] = {}       # the live tasks: ready, leased, dead
        self.task_id_by_key: dict[str, str] = {}
        self.tombstones = TombstoneStore()     # the completed tasks
        self.live_index = LiveIndex()          # live ids by status, sorted: pages (listing.py)
        self.counts = dict.fromkeys(validation.STATUSES, 0)
        self.last_seq = 0
        self._ready: list[tuple[int, str]] = []
        self._leases: list[tuple[int, str]] = []
        self.monitoring = Monitoring()         # the daemon's figures (see the header)
        self._last_loaded = ""  # the task id of the last snapshot entry loaded
        # An upper bound on what the records committed so far added to the
        # snapshot's size (see the header); a snapshot loaded adds nothing.
        self.snapshot_growth = 0

    # -- queries --------------------------------------------------------

    def get(self, task_id: str) -> Task | None:
        """The task with this id (a tombstone as a fresh completed Task), or None."""
        task = self.tasks.get(task_id)
        if task is None:
            tombstone = self.tombstones.get(task_id)
            if tombstone is not None:
                return _task_of(tombstone)
        return task

    def task_count(self) -> int:
        return len(self.tasks) + len(self.tombstones)

    def due_ready(self, now: int, limit: int) -> list[str]:
        """Up to `limit` ready tasks with available_at <= now, in lease order."""
        return _peek(self.tasks, self._ready, READY, "available_at", now, limit)

    def expired(self, now: int, limit: int) -> list[str]:
        """Up to `limit` leased tasks with deadline <= now, by (deadline, task_id)."""
        return _peek(self.tasks, self._leases, LEASED, "deadline", now, limit)

    def next_due_time(self) -> int | None:
        """The earliest available_at of a ready task or deadline of a lease."""
        times = [_peek_time(self.tasks, self._ready, READY, "available_at"), self.next_lease_deadline()]
        times = [time for time in times if time is not None]
        return min(times) if times else None

    def next_lease_deadline(self) -> int | None:
        """The earliest deadline of a lease."""
        return _peek_time(self.tasks, self._leases, LEASED, "deadline")

    def ready_due_since(self, now: int, seq_time: Callable[[int], int]) -> int | None:
        """The earliest time since which a ready task has been due, or None if none is due at
        `now` (Monitoring.ready_due_since says how `seq_time` must behave)."""
        return self.monitoring.ready_due_since(self.tasks, self.counts[READY], now, seq_time)

    def leases_past_half(self, now: int) -> int:
        """How many leased tasks are at or past the middle of their lease at `now`
        (Monitoring.leases_past_half)."""
        return self.monitoring.leases_past_half(self.tasks, self._leases, now)

    def plan_put(self, requests: list[dict]) -> tuple[list[str], list[dict]]:
        """puts.plan_puts (SPEC §2: ids per request, the new tasks) against this state's tasks."""
        return plan_puts(requests, owner_of_key=self._owner_of_key, key_of_task=self._key_of_task)

    def _owner_of_key(self, key: str) -> tuple[str, str] | None:
        """(task id, identity) of the task that holds `key`, or None."""
        task_id = self.task_id_by_key.get(key)
        if task_id is not None:
            task = self.tasks[task_id]
            return task.task_id, task.pin_identity()
        tombstone = self.tombstones.get_by_key(key)
        if tombstone is not None:
            return tombstone.task_id, tombstone.identity.hex()
        return None

    def _key_of_task(self, task_id: str) -> str | None:
        task = self.get(task_id)
        return None if task is None else task.key

    def _key_taken(self, key: str) -> bool:
        return key in self.task_id_by_key or self.tombstones.has_key(key)

    # -- transitions ----------------------------------------------------

    def apply(self, record: Any, body_bytes: int | None = None) -> None:
        """Check a record against the state and apply it (`body_bytes`: as for `commit`)."""
        self.commit(self.check(record), body_bytes)

    def check(self, record: Any) -> tuple:
        """Validate a record against the state; return the change to commit.

        Raises InvalidRequest for a malformed record, KeyConflict for a put
        that collides, StaleLease for a lease that is not current.
        """
        if type(record) is not dict:
            raise InvalidRequest(f"a record must be an object, not {type(record).__name__}")
        op = record.get("op")
        fields = RECORD_FIELDS.get(op) if isinstance(op, str) else None
        if fields is None:
            raise InvalidRequest(f"unknown op {op!r}")
        if record.keys() != fields:
            raise InvalidRequest(
                f"{op} record has fields {sorted(record)}, expected {sorted(fields)}")
        seq = record["seq"]
        if type(seq) is not int or seq != self.last_seq + 1 or seq > validation.MAX_INT:
            seq = validation.integer(seq, "seq", minimum=1)  # raises what is wrong, if not the next seq
            raise InvalidRequest(f"seq {seq} does not follow seq {self.last_seq}")
        return getattr(self, _CHECKS[op])(record)

    def commit(self, change: tuple, body_bytes: int | None = None) -> None:
        """Apply a change `check` returned.

        `body_bytes` is the length of the record's canonical JSON (its
        frame's body), which a writer or reader of the frame knows; without
        it a put's record is encoded again to measure it (snapshot_size).
        """
        op, record, targets = change
        self.snapshot_growth += snapshot_growth_of(op, record, targets, body_bytes)
        getattr(self, _COMMITS[op])(record, targets)
        self.last_seq = record["seq"]

    def _check_put(self, record):
        tasks = record["tasks"]
        if type(tasks) is not list or not tasks:
            raise InvalidRequest("put record needs a non-empty list of tasks")
        new_ids: set[str] = set()
        new_keys: set[str] = set()
        for index, task in enumerate(tasks):
            task_id, key = _put_task_names(task, index)
            if key in new_keys or self._key_taken(key):
                raise KeyConflict(f"key {key!r} is already used")
            if task_id in new_ids or task_id in self.tasks or task_id in self.tombstones:
                raise KeyConflict(f"task id {task_id!r} is already used")
            new_keys.add(key)
            new_ids.add(task_id)
        return ("put", record, tasks)

    def _commit_put(self, record, tasks):
        seq = record["seq"]
        became_ready = self.monitoring.became_ready
        for fields in tasks:
            task_id, payload = fields["task_id"], fields["payload"]
            available_at, max_attempts = fields["available_at"], fields["max_attempts"]
            task = Task(task_id, fields["key"], None,  # identity: see Task.pin_identity
                        READY, 0, max_attempts, 0, available_at, None, None, payload, seq)
            self.tasks[task_id] = task
            self.task_id_by_key[task.key] = task_id
            self.live_index.ready.add(task_id)
            self.counts[READY] += 1
            heapq.heappush(self._ready, (available_at, task_id))
            became_ready(seq, task_id)
        self._tidy(self._ready, READY)

    def _check_expire(self, record):
        now = validation.integer(record["now"], "now")
        targets = self._listed_tasks(record["task_ids"], MAX_EXPIRE_IDS)
        self._check_due(targets, LEASED, "deadline", now, "expire")
        return ("expire", record, targets)

    def _commit_expire(self, record, targets):
        seq = record["seq"]
        for task in targets:
            task.pin_identity()
            task.available_at = task.deadline
            self._end_lease(task, seq)
        self._tidy(self._ready, READY)

    def _check_reserve(self, record):
        now = validation.integer(record["now"], "now")
        lease_seconds = validation.integer(record["lease_seconds"], "lease_seconds", minimum=1)
        validation.time_plus(now, lease_seconds, "lease_seconds")
        validation.name(record["worker"], "worker")
        targets = self._listed_tasks(record["task_ids"], validation.MAX_RESERVE_LIMIT)
        self._check_due(targets, READY, "available_at", now, "be reserved")
        return ("reserve", record, targets)

    def _commit_reserve(self, record, targets):
        now = record["now"]
        deadline = now + record["lease_seconds"]
        worker = record["worker"]
        counts, index = self.counts, self.live_index
        for task in targets:
            task.status = LEASED
            index.ready.discard(task.task_id)
            index.leased.add(task.task_id)
            task.attempts += 1
            task.generation += 1
            task.worker = worker
            task.deadline = deadline
            task.lease_start = now
            heapq.heappush(self._leases, (deadline, task.task_id))
            self.monitoring.lease_started(task)
        counts[READY] -= len(targets)
        counts[LEASED] += len(targets)
        self._tidy(self._leases, LEASED)
        self.monitoring.tidy_halves(self.tasks, counts[LEASED])

    def _check_ack(self, record):
        return ("ack", record, [self._current_lease(record)])

    def _commit_ack(self, record, targets):
        (task,) = targets
        # The task leaves the live tasks for the tombstones: stale heap and
        # FIFO entries for it find no live task and are dropped.
        identity = bytes.fromhex(task.identity) if task.identity is not None else identity_digest(
            task.task_id, task.payload, task.available_at, task.max_attempts)
        self.monitoring.lease_ended(task.task_id)
        del self.tasks[task.task_id]
        del self.task_id_by_key[task.key]
        self.live_index.leased.discard(task.task_id)
        self.tombstones.add(task.task_id, task.key, identity, task.attempts, task.max_attempts,
                            task.generation, task.available_at)
        self.counts[LEASED] -= 1
        self.counts[COMPLETED] += 1

    def _check_release(self, record):
        task = self._current_lease(record)
        delay = validation.integer(record["delay"], "delay")
        validation.time_plus(record["now"], delay, "delay")
        return ("release", record, [task])

    def _commit_release(self, record, targets):
        (task,) = targets
        task.pin_identity()
        task.available_at = record["now"] + record["delay"]
        self._end_lease(task, record["seq"])
        self._tidy(self._ready, READY)

    def _check_touch(self, record):
        task = self._current_lease(record)
        lease_seconds = validation.integer(record["lease_seconds"], "lease_seconds", minimum=1)
        validation.time_plus(record["now"], lease_seconds, "lease_seconds")
        return ("touch", record, [task])

    def _commit_touch(self, record, targets):
        (task,) = targets
        task.deadline = record["now"] + record["lease_seconds"]
        task.lease_start = record["now"]
        heapq.heappush(self._leases, (task.deadline, task.task_id))
        self.monitoring.lease_started(task)
        self._tidy(self._leases, LEASED)
        self.monitoring.tidy_halves(self.tasks, self.counts[LEASED])

    def _check_revive(self, record):
        validation.integer(record["now"], "now")
        targets = self._listed_tasks(record["task_ids"], None)
        for task in targets:
            if task.status != DEAD:
                raise InvalidRequest(f"task {task.task_id!r} is {task.status}, not dead")
        return ("revive", record, targets)

    def _commit_revive(self, record, targets):
        now, seq = record["now"], record["seq"]
        for task in targets:
            task.pin_identity()  # already pinned when it died; kept for the invariant
            task.status = READY
            self.live_index.move(task.task_id, DEAD, READY)
            task.attempts = 0
            task.available_at = now
            task.ready_seq = seq
            heapq.heappush(self._ready, (now, task.task_id))
            self.monitoring.became_ready(seq, task.task_id)
        self.counts[DEAD] -= len(targets)
        self.counts[READY] += len(targets)
        self._tidy(self._ready, READY)

    # -- helpers --------------------------------------------------------

    def _listed_tasks(self, task_ids, maximum: int | None) -> list[Task]:
        if type(task_ids) is not list or not task_ids:
            raise InvalidRequest("task_ids must be a non-empty list")
        if maximum is not None and len(task_ids) > maximum:
            raise InvalidRequest(f"task_ids lists {len(task_ids)} tasks, above {maximum}")
        targets = []
        for index, task_id in enumerate(task_ids):
            task = self.get(task_id) if type(task_id) is str else None
            if task is None:
                validation.name(task_id, f"task_ids[{index}]")
                raise InvalidRequest(f"task {task_id!r} is unknown")
            targets.append(task)
        if len(set(task_ids)) != len(task_ids):
            raise InvalidRequest("task_ids lists a task more than once")
        return targets

    def _check_due(self, targets: list[Task], status: str, attribute: str, now: int,
                   action: str) -> None:
        """Each task has `status` and is due at `now`; they come in (time, task_id) order."""
        previous = None
        for task in targets:
            time = getattr(task, attribute)
            if task.status != status or time > now:
                raise InvalidRequest(f"task {task.task_id!r} is {task.status} with {attribute} "
                                     f"{time}; it cannot {action} at now={now}")
            if previous is not None and (time, task.task_id) <= previous:
                raise InvalidRequest(f"task {task.task_id!r} is out of ({attribute}, task_id) order")
            previous = (time, task.task_id)

    def _current_lease(self, record) -> Task:
        task_id = validation.name(record["task_id"], "task_id")
        worker = validation.name(record["worker"], "worker")
        generation = validation.integer(record["generation"], "generation")
        now = validation.integer(record["now"], "now")
        task = self.get(task_id)
        if task is None:
            raise StaleLease(f"task {task_id!r} is unknown", task_id=task_id,
                             status=None, generation=None)
        if task.status != LEASED:
            problem = f"is {task.status}"
        elif task.generation != generation:
            problem = f"is leased at generation {task.generation}, not {generation}"
        elif task.worker != worker:
            problem = f"is leased by another worker, not {worker!r}"
        elif not now < task.deadline:
            problem = f"lease expired at {task.deadline} (now={now})"
        else:
            return task
        raise StaleLease(f"task {task_id!r} {problem}: the lease is stale",
                         task_id=task_id, status=task.status, generation=task.generation)

    def _end_lease(self, task: Task, seq: int) -> None:
        """Leased -> ready (at `seq`), or dead once attempts reach max_attempts."""
        task.worker = None
        task.deadline = None
        self.monitoring.lease_ended(task.task_id)
        self.counts[LEASED] -= 1
        if task.attempts >= task.max_attempts:
            task.status = DEAD
        else:
            task.status = READY
            task.ready_seq = seq
            heapq.heappush(self._ready, (task.available_at, task.task_id))
            self.monitoring.became_ready(seq, task.task_id)
        self.live_index.move(task.task_id, LEASED, task.status)
        self.counts[task.status] += 1

    def _tidy(self, heap: list, status: str) -> None:
        """Drop stale heap entries once they outnumber the live ones."""
        if status == READY:
            self.monitoring.tidy_ready(self.tasks, self.counts[READY])
        if len(heap) <= 2 * self.counts[status] + 1024:
            return
        attribute = "available_at" if status == READY else "deadline"
        tasks = self.tasks
        live = {(time, task_id) for time, task_id in heap
                if (task := tasks.get(task_id)) is not None and task.status == status
                and getattr(task, attribute) == time}
        heap[:] = live
        heapq.heapify(heap)

    # -- in task_id order: listings and snapshots ---------------------------

    def in_order(self, status: str | None = None) -> Iterator[Task]:
        """The tasks (optionally of one status) in task_id order.

        Which tasks is fixed when called; each is as it is when the iterator
        reaches it. Costs O(live tasks) when called, not O(history).
        """
        live = sorted(task_id for task_id, task in self.tasks.items()
                      if status is None or task.status == status)
        if status not in (None, COMPLETED) or not self.tombstones:
            return map(self.get, live)   # a live task may be a tombstone when reached
        return (self.get(item) if type(item) is str else _task_of(item)
                for item in _merged(live, self.tombstones.frozen()))

    def entries(self) -> Iterator[dict]:
        """Every task as a snapshot entry (a dict), in task_id order."""
        return (self.tasks[item].entry() if type(item) is str else _task_of(item).entry()
                for item in _merged(sorted(self.tasks), self.tombstones.frozen()))

    def entry_bodies(self) -> Iterator[bytes]:
        """Every task's snapshot entry as canonical JSON, in task_id order (what a snapshot holds).

        Tombstones are formatted from their packed form, without a dict or
        the JSON encoder; the extra memory is O(live tasks).
        """
        tasks = self.tasks
        return (canonical_json(tasks[item].entry()) if type(item) is str else item
                for item in _merged(sorted(tasks), self.tombstones.frozen().bodies()))

    def load_entry(self, entry: Any) -> None:
        """Add one snapshot entry; entries must come in ascending task_id order.

        Raises InvalidRequest naming what is wrong with the entry.
        """
        if type(entry) is not dict or entry.keys() != ENTRY_FIELDS:
            raise InvalidRequest(f"a task entry must have exactly the fields {sorted(ENTRY_FIELDS)}")
        task_id = validation.name(entry["task_id"], "task_id")
        key = validation.name(entry["key"], "key")
        identity, status = entry["identity"], entry["status"]
        attempts, max_attempts = entry["attempts"], entry["max_attempts"]
        generation, available_at = entry["generation"], entry["available_at"]
        worker, deadline, payload = entry["worker"], entry["deadline"], entry["payload"]
        if type(identity) is not str or _IDENTITY.fullmatch(identity) is None:
            raise InvalidRequest(f"task {task_id!r}: identity must be 64 lowercase hex digits")
        shape = _ENTRY_SHAPES.get(status) if type(status) is str else None
        if shape is None:
            raise InvalidRequest(f"task {task_id!r}: unknown status {status!r}")
        if (type(worker), type(deadline), type(payload)) != shape:
            raise InvalidRequest(f"task {task_id!r}: a {status} task must have worker, deadline "
                                 f"and payload of types {[kind.__name__ for kind in shape]}")
        for field in ("attempts", "max_attempts", "generation", "available_at"):
            validation.integer(entry[field], field)
        if status == LEASED:
            validation.name(worker, "worker")
            validation.integer(deadline, "deadline")
        if not (attempts <= generation and 1 <= max_attempts and attempts <= max_attempts) \
                or (status == READY and attempts >= max_attempts) \
                or (status == DEAD and attempts != max_attempts) \
                or (status != READY and status != DEAD and attempts < 1):
            raise InvalidRequest(f"task {task_id!r}: attempts={attempts}, max_attempts={max_attempts}, "
                                 f"generation={generation} are impossible for a {status} task")
        if task_id <= self._last_loaded:
            raise InvalidRequest(f"task {task_id!r} is out of task_id order")
        if self._key_taken(key):
            raise InvalidRequest(f"key {key!r} is used by two tasks")
        self._last_loaded = task_id
        if status == COMPLETED:
            self.tombstones.add(task_id, key, bytes.fromhex(identity), attempts, max_attempts,
                                generation, available_at)
            self.counts[COMPLETED] += 1
            return
        self.tasks[task_id] = Task(task_id, key, identity, status, attempts, max_attempts,
                                   generation, available_at, deadline, worker, payload)
        self.task_id_by_key[key] = task_id
        self.live_index.by_status[status].add(task_id)
        self.counts[status] += 1
        if status == READY:
            self._ready.append((available_at, task_id))
            self.monitoring.became_ready(0, task_id)  # ready_seq 0: since the snapshot at least
        elif status == LEASED:
            self._leases.append((deadline, task_id))

    # The snapshot reader's fast path for completed entries (snapshot.load_plain_tombstones)
    # checks them in bulk, then adds them through these.

    @property
    def last_loaded(self) -> str:
        """The task id of the last snapshot entry loaded ("" before the first)."""
        return self._last_loaded

    def key_taken(self, key: str) -> bool:
        """True if a task (live or completed) holds `key`."""
        return self._key_taken(key)

    def keys_besides_ids(self) -> bool:
        """True if some key held is not its task's id (every live task's key counts)."""
        return bool(self.task_id_by_key) or self.tombstones.has_other_keys()

    def load_tombstones(self, task_ids: list[bytes], identities: bytes, numbers: array) -> None:
        """Add completed entries keyed by their ids, checked already: ids (UTF-8) ascending after
        `last_loaded`, free; 32 bytes of `identities` each; `numbers` their four numbers."""
        self.tombstones.extend(task_ids, identities, numbers)
        self.counts[COMPLETED] += len(task_ids)
        self._last_loaded = task_ids[-1].decode()

    def load_tombstone(self, task_id: str, key: str, identity: bytes, attempts: int,
                       max_attempts: int, generation: int, available_at: int) -> None:
        """Add one completed snapshot entry, checked already (as for load_tombstones)."""
        self.tombstones.add(task_id, key, identity, attempts, max_attempts, generation, available_at)
        self.counts[COMPLETED] += 1
        self._last_loaded = task_id

    def finish_loading(self, seq: int) -> None:
        """Called after the last snapshot entry: heapify and set the seq."""
        heapq.heapify(self._ready)
        heapq.heapify(self._leases)
        self.last_seq = seq


# op -> the names of State's check and commit of that op, built once, not per record (looked
# up by name on the instance, so a test that patches one, tests/broken.py, still reaches it).
_CHECKS = {op: "_check_" + op for op in RECORD_FIELDS}
_COMMITS = {op: "_commit_" + op for op in RECORD_FIELDS}


def _put_task_names(task: Any, index: int) -> tuple[str, str]:
    """(task_id, key) of task `index` of a put record, its fields checked (State._check_put).

    The common case, every field plain and in range, is told in one expression;
    the field names of an error (``tasks[3].key``) are built only for a task
    that fails, by the checks in validation, which then raise what is wrong.
    """
    if type(task) is dict and task.keys() == PUT_TASK_FIELDS:
        task_id, key = task["task_id"], task["key"]
        available_at, max_attempts = task["available_at"], task["max_attempts"]
        if (type(task_id) is str and 0 < len(task_id) <= validation.MAX_NAME_BYTES and task_id.isascii()
                and type(key) is str and 0 < len(key) <= validation.MAX_NAME_BYTES and key.isascii()
                and type(available_at) is int and 0 <= available_at <= validation.MAX_INT
                and type(max_attempts) is int and 1 <= max_attempts <= validation.MAX_INT
                and type(task["payload"]) is dict):
            return task_id, key
    where = f"tasks[{index}]"
    if type(task) is not dict or task.keys() != PUT_TASK_FIELDS:
        raise InvalidRequest(f"{where} must be an object with fields {sorted(PUT_TASK_FIELDS)}")
    task_id = validation.name(task["task_id"], f"{where}.task_id")
    key = validation.name(task["key"], f"{where}.key")
    validation.integer(task["available_at"], f"{where}.available_at")
    validation.integer(task["max_attempts"], f"{where}.max_attempts", minimum=1)
    if type(task["payload"]) is not dict:
        raise InvalidRequest(f"{where}.payload must be an object")
    return task_id, key


def _peek(tasks: dict, heap, status, attribute, now, limit) -> list[str]:
    """Up to `limit` live entries of `heap` due at `now`, in heap order; stale ones are dropped."""
    if not heap or heap[0][0] > now:
        return []  # nothing due: the common case of the reap before every reserve
    picked: list[str] = []
    seen: set[str] = set()
    kept: list[tuple[int, str]] = []
    while heap and len(picked) < limit and heap[0][0] <= now:
        entry = heapq.heappop(heap)
        time, task_id = entry
        task = tasks.get(task_id)
        if (task is None or task.status != status or getattr(task, attribute) != time
                or task_id in seen):
            continue  # stale, or a duplicate of an entry already kept
        seen.add(task_id)
        picked.append(task_id)
        kept.append(entry)
    for entry in kept:
        heapq.heappush(heap, entry)
    return picked


def _peek_time(tasks: dict, heap, status, attribute) -> int | None:
    """The time of the first live entry of `heap` (stale ones are dropped), or None."""
    while heap:
        time, task_id = heap[0]
        task = tasks.get(task_id)
        if task is not None and task.status == status and getattr(task, attribute) == time:
            return time
        heapq.heappop(heap)
    return None


def _merged(live: list[str], tombstones) -> Iterator:
    """Sorted live task ids and (UTF-8 id, item) pairs of tombstones, merged in task_id order.

    Yields a live task's id (a str) or a tombstone's item.
    """
    position, count = 0, len(live)
    upcoming = live[0].encode() if live else None
    for name, item in tombstones:
        while upcoming is not None and upcoming < name:
            yield live[position]
            position += 1
            upcoming = live[position].encode() if position < count else None
        yield item
    yield from islice(live, position, None)


def _task_of(tombstone: Tombstone) -> Task:
    """A tombstone as a completed Task (a copy: changing it changes nothing)."""
    return Task(tombstone.task_id, tombstone.key, tombstone.identity.hex(), COMPLETED,
                tombstone.attempts, tombstone.max_attempts, tombstone.generation,
                tombstone.available_at, None, None, None)


