"""An independent, in-memory reference model of SPEC §2 (and the frames of §4).

What it proves: nothing by itself; it is the oracle. It is written from SPEC.md
alone, as plainly as possible (dictionaries, sorted lists, no indexes), so that
a disagreement with the real `walqueue.Queue` points at the library, not at a
second clever implementation. It imports nothing from walqueue.

The model is driven by the same calls as `Queue` (put, put_many, reserve, ack,
release, touch, revive, cancel, get, tasks, stats, compact). Every writing call first
validates its arguments (SPEC §1), then checks them against the state, then
builds the §4 record(s) it would write and applies them with `apply_record`,
the one transition function. So the model also knows:

- `records`: every frame the library would have written, in order, with its
  `seq` (one per writing call; a reserve writes one `expire` frame per 10,000
  reaped leases and then one `reserve` frame; no-ops, idempotent puts and
  rejected calls write nothing);
- `last_seq`, `snapshot_seq` and `wal_bytes` (the complete frames written since
  the published snapshot, each 4 + len(canonical JSON) + 32 bytes);
- `ReferenceQueue.replay(records)`: the state after any prefix of frames, which
  the crash matrix uses to say exactly what a recovered directory must hold.

Errors are the model's own classes, each naming the walqueue exception the
library must raise (`spec_name`); `StaleLease` carries the task's current
status and generation like the library's.
"""

from __future__ import annotations

import copy
import hashlib
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

MAX_FRAME_BYTES = 16 * 1024 * 1024
# WALQueue's decision beyond SPEC (docs/guarantees.md): objects and arrays per payload, and in
# all the payloads of one request.
MAX_PAYLOAD_CONTAINERS = 100_000
MAX_REQUEST_CONTAINERS = 1_048_576
MAX_TEXT_BYTES = 1024
INT_LIMIT = 2**63
MAX_LIMIT = 1000
EXPIRE_IDS_PER_FRAME = 10_000
# SPEC §8b: worker names the queue keeps for itself; cancel's records use the first.
CANCEL_WORKER = "walqueue:cancel"
RESERVED_WORKER_PREFIX = "walqueue:"
CANCEL_LEASE_SECONDS = 1  # how long a crash between a cancel's reserve and ack holds the task
FRAME_OVERHEAD_BYTES = 4 + 32
STATUSES = ("ready", "leased", "completed", "dead")

TASKVIEW_FIELDS = (
    "task_id",
    "key",
    "status",
    "attempts",
    "max_attempts",
    "generation",
    "available_at",
    "deadline",
    "worker",
    "payload",
)
LEASE_FIELDS = ("task_id", "worker", "generation", "deadline", "attempts", "payload")
STATS_FIELDS = ("ready", "leased", "completed", "dead", "last_seq", "snapshot_seq", "wal_bytes")
PUT_FIELDS = ("task_id", "payload", "key", "available_at", "max_attempts")


# --- errors -------------------------------------------------------------------------


class ModelError(Exception):
    """A call the model rejects; `spec_name` is the walqueue class expected."""

    spec_name = "WalQueueError"


class ModelInvalidRequest(ModelError):
    spec_name = "InvalidRequest"


class ModelKeyConflict(ModelError):
    spec_name = "KeyConflict"


class ModelStaleLease(ModelError):
    spec_name = "StaleLease"

    def __init__(self, message: str, task_id: str, status: str | None, generation: int | None):
        super().__init__(message)
        self.task_id = task_id
        self.status = status
        self.generation = generation


# --- values -------------------------------------------------------------------------


class ModelLease(NamedTuple):
    """Field-for-field the SPEC's `Lease`; compares equal to `lease_tuple(real)`."""

    task_id: str
    worker: str
    generation: int
    deadline: int
    attempts: int
    payload: Any


class ModelTaskView(NamedTuple):
    """Field-for-field the SPEC's `TaskView`."""

    task_id: str
    key: str
    status: str
    attempts: int
    max_attempts: int
    generation: int
    available_at: int
    deadline: int | None
    worker: str | None
    payload: Any


class ModelStats(NamedTuple):
    ready: int
    leased: int
    completed: int
    dead: int
    last_seq: int
    snapshot_seq: int
    wal_bytes: int


@dataclass
class Task:
    task_id: str
    key: str
    identity: str
    status: str
    attempts: int
    max_attempts: int
    generation: int
    available_at: int
    deadline: int | None
    worker: str | None
    payload: Any

    def view(self) -> ModelTaskView:
        return ModelTaskView(
            self.task_id,
            self.key,
            self.status,
            self.attempts,
            self.max_attempts,
            self.generation,
            self.available_at,
            self.deadline,
            self.worker,
            copy.deepcopy(self.payload),
        )


def lease_tuple(lease: Any) -> ModelLease:
    """A real (or model) lease as a comparable tuple; the payload is deep-copied."""
    return ModelLease(*(copy.deepcopy(getattr(lease, name)) for name in LEASE_FIELDS))


def view_tuple(view: Any) -> ModelTaskView:
    """A real (or model) TaskView as a comparable tuple; the payload is deep-copied."""
    return ModelTaskView(*(copy.deepcopy(getattr(view, name)) for name in TASKVIEW_FIELDS))


def stats_tuple(stats: Any) -> ModelStats:
    return ModelStats(*(getattr(stats, name) for name in STATS_FIELDS))


# --- canonical JSON and frames (SPEC §4) --------------------------------------------


def canonical_json(value: Any) -> bytes:
    return json.dumps(
        value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
    ).encode("utf-8")


def encode_frame(record: Mapping[str, Any]) -> bytes:
    body = canonical_json(record)
    return len(body).to_bytes(4, "big") + body + hashlib.sha256(body).digest()


def identity_of(task_id: str, payload: Any, available_at: int, max_attempts: int) -> str:
    value = {
        "available_at": available_at,
        "max_attempts": max_attempts,
        "payload": payload,
        "task_id": task_id,
    }
    return hashlib.sha256(canonical_json(value)).hexdigest()


# --- validation (SPEC §1) -----------------------------------------------------------


def _check_text(value: Any, what: str) -> str:
    if not isinstance(value, str) or value == "":
        raise ModelInvalidRequest(f"{what} must be a non-empty str, got {value!r}")
    try:
        encoded = value.encode("utf-8")
    except UnicodeEncodeError:
        raise ModelInvalidRequest(f"{what} is not encodable as UTF-8: {value!r}") from None
    if len(encoded) > MAX_TEXT_BYTES:
        raise ModelInvalidRequest(f"{what} is longer than {MAX_TEXT_BYTES} bytes")
    return value


def _check_int(value: Any, what: str, minimum: int = 0) -> int:
    if not isinstance(value, int) or isinstance(value, bool):
        raise ModelInvalidRequest(f"{what} must be an int, got {value!r}")
    if not minimum <= value < INT_LIMIT:
        raise ModelInvalidRequest(f"{what} out of range: {value!r}")
    return value


def _check_sum(a: int, b: int, what: str) -> None:
    if a + b >= INT_LIMIT:
        raise ModelInvalidRequest(f"{what} reaches 2**63")


def _plain_json(value: Any, where: str) -> Any:
    """The JSON value as plain dict/list/scalars, or ModelInvalidRequest."""
    if value is None or isinstance(value, bool):
        return value
    if isinstance(value, int):
        # The daemon's wire (msgpack) carries int64 and uint64 only.
        if not -(2**63) <= value < 2**64:
            raise ModelInvalidRequest(f"{where}: integer {value} does not fit 64 bits")
        return value
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ModelInvalidRequest(f"{where}: non-finite float {value!r}")
        return value
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:
            raise ModelInvalidRequest(f"{where}: string not encodable as UTF-8") from None
        return value
    if isinstance(value, list | tuple):
        return [_plain_json(item, where) for item in value]
    if isinstance(value, Mapping):
        result = {}
        for key, item in value.items():
            if not isinstance(key, str):
                raise ModelInvalidRequest(f"{where}: non-str key {key!r}")
            _plain_json(key, where)
            result[key] = _plain_json(item, where)
        return result
    raise ModelInvalidRequest(f"{where}: not a JSON value: {value!r}")


def _containers(value: Any) -> int:
    """The objects and arrays in a plain JSON value, itself included."""
    if isinstance(value, dict):
        return 1 + sum(_containers(item) for item in value.values())
    if isinstance(value, list):
        return 1 + sum(_containers(item) for item in value)
    return 0


def _check_payload(payload: Any, task_id: str) -> Any:
    if not isinstance(payload, Mapping):
        raise ModelInvalidRequest(f"payload of {task_id!r} must be a JSON object")
    plain = _plain_json(payload, f"payload of {task_id!r}")
    if _containers(plain) > MAX_PAYLOAD_CONTAINERS:
        raise ModelInvalidRequest(f"payload of {task_id!r} holds too many objects and arrays")
    # "Stored as the JSON round trip of what was given".
    return json.loads(canonical_json(plain))


@dataclass(frozen=True)
class _Put:
    task_id: str
    key: str
    payload: Any
    available_at: int
    max_attempts: int
    identity: str


def _normalize_put(request: Any) -> _Put:
    if isinstance(request, Mapping):
        fields = dict(request)
        unknown = set(fields) - set(PUT_FIELDS)
        if unknown:
            raise ModelInvalidRequest(f"unknown put fields {sorted(unknown)}")
        if "task_id" not in fields or "payload" not in fields:
            raise ModelInvalidRequest("a put request needs task_id and payload")
    elif all(hasattr(request, name) for name in PUT_FIELDS):
        fields = {name: getattr(request, name) for name in PUT_FIELDS}
    else:
        raise ModelInvalidRequest(f"not a put request: {request!r}")
    task_id = _check_text(fields["task_id"], "task_id")
    key = fields.get("key")
    key = task_id if key is None else _check_text(key, "key")
    available_at = _check_int(fields.get("available_at", 0), "available_at")
    max_attempts = _check_int(fields.get("max_attempts", 3), "max_attempts", minimum=1)
    payload = _check_payload(fields["payload"], task_id)
    identity = identity_of(task_id, payload, available_at, max_attempts)
    return _Put(task_id, key, payload, available_at, max_attempts, identity)


# --- the model ----------------------------------------------------------------------


class ReferenceQueue:
    """SPEC §2 in memory. Plain and slow on purpose."""

    def __init__(self) -> None:
        self.tasks_by_id: dict[str, Task] = {}
        self.task_id_by_key: dict[str, str] = {}
        self.records: list[dict[str, Any]] = []
        self.snapshot_seq = 0

    # -- bookkeeping --

    @property
    def last_seq(self) -> int:
        return len(self.records)

    @property
    def wal_bytes(self) -> int:
        return sum(
            FRAME_OVERHEAD_BYTES + len(canonical_json(record))
            for record in self.records[self.snapshot_seq :]
        )

    @classmethod
    def replay(cls, records: Sequence[Mapping[str, Any]], snapshot_seq: int = 0) -> ReferenceQueue:
        """The model after applying `records` (which must start at seq 1)."""
        model = cls()
        for record in records:
            model._append(copy.deepcopy(dict(record)))
        model.snapshot_seq = snapshot_seq
        return model

    def clone(self) -> ReferenceQueue:
        return copy.deepcopy(self)

    def _append(self, record: dict[str, Any]) -> None:
        record["seq"] = self.last_seq + 1
        self.apply_record(record)
        self.records.append(record)

    # -- the transition function: one record, one atomic change --

    def apply_record(self, record: Mapping[str, Any]) -> None:
        op = record["op"]
        if op == "put":
            for entry in record["tasks"]:
                assert entry["task_id"] not in self.tasks_by_id
                assert entry["key"] not in self.task_id_by_key
                self.tasks_by_id[entry["task_id"]] = Task(
                    task_id=entry["task_id"],
                    key=entry["key"],
                    identity=identity_of(
                        entry["task_id"],
                        entry["payload"],
                        entry["available_at"],
                        entry["max_attempts"],
                    ),
                    status="ready",
                    attempts=0,
                    max_attempts=entry["max_attempts"],
                    generation=0,
                    available_at=entry["available_at"],
                    deadline=None,
                    worker=None,
                    payload=copy.deepcopy(entry["payload"]),
                )
                self.task_id_by_key[entry["key"]] = entry["task_id"]
        elif op == "expire":
            for task_id in record["task_ids"]:
                task = self.tasks_by_id[task_id]
                assert task.status == "leased" and task.deadline <= record["now"]
                task.available_at = task.deadline
                self._end_lease(task)
        elif op == "reserve":
            for task_id in record["task_ids"]:
                task = self.tasks_by_id[task_id]
                assert task.status == "ready" and task.available_at <= record["now"]
                task.status = "leased"
                task.attempts += 1
                task.generation += 1
                task.worker = record["worker"]
                task.deadline = record["now"] + record["lease_seconds"]
        elif op in ("ack", "release", "touch"):
            task = self.tasks_by_id[record["task_id"]]
            assert self._is_current(task, record["worker"], record["generation"], record["now"])
            if op == "ack":
                task.status = "completed"
                task.worker = None
                task.deadline = None
                task.payload = None
            elif op == "release":
                task.available_at = record["now"] + record["delay"]
                self._end_lease(task)
            else:
                task.deadline = record["now"] + record["lease_seconds"]
        elif op == "revive":
            for task_id in record["task_ids"]:
                task = self.tasks_by_id[task_id]
                assert task.status == "dead"
                task.status = "ready"
                task.attempts = 0
                task.available_at = record["now"]
        else:
            raise AssertionError(f"unknown op {op!r}")

    @staticmethod
    def _end_lease(task: Task) -> None:
        task.status = "dead" if task.attempts >= task.max_attempts else "ready"
        task.worker = None
        task.deadline = None

    @staticmethod
    def _is_current(task: Task | None, worker: str, generation: int, now: int) -> bool:
        return (
            task is not None
            and task.status == "leased"
            and task.worker == worker
            and task.generation == generation
            and now < task.deadline
        )

    # -- the public calls --

    def put(
        self,
        task_id: Any,
        payload: Any,
        *,
        key: Any = None,
        available_at: Any = 0,
        max_attempts: Any = 3,
    ) -> str:
        request = {
            "task_id": task_id,
            "payload": payload,
            "key": key,
            "available_at": available_at,
            "max_attempts": max_attempts,
        }
        return self.put_many([request])[0]

    def put_many(self, requests: Sequence[Any]) -> list[str]:
        puts = [_normalize_put(request) for request in list(requests)]
        if sum(_containers(put.payload) for put in puts) > MAX_REQUEST_CONTAINERS:
            raise ModelInvalidRequest("the payloads of this put_many hold too many objects and arrays")
        ids: list[str] = []
        new: list[_Put] = []
        new_by_key: dict[str, _Put] = {}
        new_ids: set[str] = set()
        for put in puts:
            known_id = self.task_id_by_key.get(put.key)
            if known_id is not None:
                known = self.tasks_by_id[known_id]
                if known.identity != put.identity:
                    raise ModelKeyConflict(f"key {put.key!r} is taken by another request")
                ids.append(known.task_id)
                continue
            if put.key in new_by_key:
                if new_by_key[put.key].identity != put.identity:
                    raise ModelKeyConflict(f"key {put.key!r} appears twice, differently")
                ids.append(new_by_key[put.key].task_id)
                continue
            if put.task_id in self.tasks_by_id or put.task_id in new_ids:
                raise ModelKeyConflict(f"task id {put.task_id!r} is already used")
            new_by_key[put.key] = put
            new_ids.add(put.task_id)
            new.append(put)
            ids.append(put.task_id)
        if new:
            record = {
                "op": "put",
                "tasks": [
                    {
                        "available_at": put.available_at,
                        "key": put.key,
                        "max_attempts": put.max_attempts,
                        "payload": put.payload,
                        "task_id": put.task_id,
                    }
                    for put in new
                ],
            }
            if len(canonical_json({**record, "seq": self.last_seq + 1})) > MAX_FRAME_BYTES:
                raise ModelInvalidRequest("the put transaction exceeds MAX_FRAME_BYTES")
            self._append(record)
        return ids

    def reap_records(self, now: int) -> list[dict[str, Any]]:
        """The expire records a reserve at `now` would write (not applied)."""
        expired = sorted(
            (task.deadline, task.task_id)
            for task in self.tasks_by_id.values()
            if task.status == "leased" and task.deadline <= now
        )
        ids = [task_id for _, task_id in expired]
        return [
            {"now": now, "op": "expire", "task_ids": ids[start : start + EXPIRE_IDS_PER_FRAME]}
            for start in range(0, len(ids), EXPIRE_IDS_PER_FRAME)
        ]

    def reserve(
        self, worker: Any, *, now: Any, lease_seconds: Any, limit: Any = 1
    ) -> list[ModelLease]:
        _check_text(worker, "worker")
        if worker.startswith(RESERVED_WORKER_PREFIX):
            raise ModelInvalidRequest(f"worker {worker!r} is reserved")
        _check_int(now, "now")
        _check_int(lease_seconds, "lease_seconds", minimum=1)
        _check_int(limit, "limit", minimum=1)
        if limit > MAX_LIMIT:
            raise ModelInvalidRequest(f"limit {limit} above {MAX_LIMIT}")
        _check_sum(now, lease_seconds, "now + lease_seconds")
        for record in self.reap_records(now):
            self._append(record)
        due = sorted(
            (task.available_at, task.task_id)
            for task in self.tasks_by_id.values()
            if task.status == "ready" and task.available_at <= now
        )
        chosen = [task_id for _, task_id in due[:limit]]
        if not chosen:
            return []
        self._append(
            {
                "lease_seconds": lease_seconds,
                "now": now,
                "op": "reserve",
                "task_ids": chosen,
                "worker": worker,
            }
        )
        return [self._lease_of(self.tasks_by_id[task_id]) for task_id in chosen]

    @staticmethod
    def _lease_of(task: Task) -> ModelLease:
        return ModelLease(
            task.task_id,
            task.worker,
            task.generation,
            task.deadline,
            task.attempts,
            copy.deepcopy(task.payload),
        )

    def _check_lease(self, lease: Any, now: int) -> tuple[str, str, int]:
        task_id = _check_text(getattr(lease, "task_id", None), "lease task_id")
        worker = _check_text(getattr(lease, "worker", None), "lease worker")
        generation = _check_int(getattr(lease, "generation", None), "lease generation")
        _check_int(now, "now")
        return task_id, worker, generation

    def _require_current(self, task_id: str, worker: str, generation: int, now: int) -> None:
        task = self.tasks_by_id.get(task_id)
        if not self._is_current(task, worker, generation, now):
            raise ModelStaleLease(
                f"lease on {task_id!r} (generation {generation}) is not current",
                task_id,
                None if task is None else task.status,
                None if task is None else task.generation,
            )

    def ack(self, lease: Any, *, now: Any) -> None:
        task_id, worker, generation = self._check_lease(lease, now)
        self._require_current(task_id, worker, generation, now)
        self._append(
            {
                "generation": generation,
                "now": now,
                "op": "ack",
                "task_id": task_id,
                "worker": worker,
            }
        )

    def release(self, lease: Any, *, now: Any, delay: Any = 0) -> None:
        task_id, worker, generation = self._check_lease(lease, now)
        _check_int(delay, "delay")
        _check_sum(now, delay, "now + delay")
        self._require_current(task_id, worker, generation, now)
        self._append(
            {
                "delay": delay,
                "generation": generation,
                "now": now,
                "op": "release",
                "task_id": task_id,
                "worker": worker,
            }
        )

    def touch(self, lease: Any, *, now: Any, lease_seconds: Any) -> ModelLease:
        task_id, worker, generation = self._check_lease(lease, now)
        _check_int(lease_seconds, "lease_seconds", minimum=1)
        _check_sum(now, lease_seconds, "now + lease_seconds")
        self._require_current(task_id, worker, generation, now)
        self._append(
            {
                "generation": generation,
                "lease_seconds": lease_seconds,
                "now": now,
                "op": "touch",
                "task_id": task_id,
                "worker": worker,
            }
        )
        return self._lease_of(self.tasks_by_id[task_id])

    def revive(self, task_ids: Sequence[Any], *, now: Any) -> list[str]:
        ids = [_check_text(task_id, "task_id") for task_id in list(task_ids)]
        _check_int(now, "now")
        unique = list(dict.fromkeys(ids))
        for task_id in unique:
            task = self.tasks_by_id.get(task_id)
            if task is None or task.status != "dead":
                status = None if task is None else task.status
                raise ModelInvalidRequest(f"cannot revive {task_id!r}: status {status}")
        if unique:
            self._append({"now": now, "op": "revive", "task_ids": unique})
        return unique

    def cancel(self, task_id: Any, *, now: Any) -> None:
        """SPEC §8b: a dead task, or a ready one due at `now`, becomes completed through the
        records §4 has: revive (if dead), reserve and ack by CANCEL_WORKER. Completed: nothing.
        Not due, leased or unknown: InvalidRequest, nothing written."""
        _check_text(task_id, "task_id")
        _check_int(now, "now")
        _check_sum(now, CANCEL_LEASE_SECONDS, "now + the cancel's lease")
        task = self.tasks_by_id.get(task_id)
        interrupted = task is not None and task.status == "leased" and task.worker == CANCEL_WORKER
        if task is None or (task.status == "leased" and not interrupted) or (
                task.status == "ready" and task.available_at > now):
            status = None if task is None else task.status
            raise ModelInvalidRequest(f"cannot cancel {task_id!r}: status {status}")
        if task.status == "completed":
            return
        if interrupted and now < task.deadline:  # a cancel a crash cut after its reserve: its ack
            self._append({"generation": task.generation, "now": now, "op": "ack", "task_id": task_id,
                          "worker": CANCEL_WORKER})
            return
        if interrupted:  # its lease lapsed: ended as a reap ends it, then cancelled as any task
            self._append({"now": now, "op": "expire", "task_ids": [task_id]})
        if task.status == "dead":
            self._append({"now": now, "op": "revive", "task_ids": [task_id]})
        self._append({"lease_seconds": CANCEL_LEASE_SECONDS, "now": now, "op": "reserve",
                      "task_ids": [task_id], "worker": CANCEL_WORKER})
        self._append({"generation": task.generation, "now": now, "op": "ack", "task_id": task_id,
                      "worker": CANCEL_WORKER})

    def get(self, task_id: Any) -> ModelTaskView | None:
        _check_text(task_id, "task_id")
        task = self.tasks_by_id.get(task_id)
        return None if task is None else task.view()

    def tasks(self, status: str | None = None) -> list[ModelTaskView]:
        if status is not None and status not in STATUSES:
            raise ModelInvalidRequest(f"unknown status {status!r}")
        return [
            self.tasks_by_id[task_id].view()
            for task_id in sorted(self.tasks_by_id)
            if status is None or self.tasks_by_id[task_id].status == status
        ]

    def counts(self) -> dict[str, int]:
        counts = dict.fromkeys(STATUSES, 0)
        for task in self.tasks_by_id.values():
            counts[task.status] += 1
        return counts

    def stats(self) -> ModelStats:
        counts = self.counts()
        return ModelStats(
            counts["ready"],
            counts["leased"],
            counts["completed"],
            counts["dead"],
            self.last_seq,
            self.snapshot_seq,
            self.wal_bytes,
        )

    def compact(self) -> int:
        self.snapshot_seq = self.last_seq
        return self.snapshot_seq

    # -- the §4 snapshot content, for checking files on disk --

    def snapshot_entries(self) -> list[dict[str, Any]]:
        return [
            {
                "attempts": task.attempts,
                "available_at": task.available_at,
                "deadline": task.deadline,
                "generation": task.generation,
                "identity": task.identity,
                "key": task.key,
                "max_attempts": task.max_attempts,
                "payload": copy.deepcopy(task.payload),
                "status": task.status,
                "task_id": task.task_id,
                "worker": task.worker,
            }
            for task_id, task in sorted(self.tasks_by_id.items())
        ]
