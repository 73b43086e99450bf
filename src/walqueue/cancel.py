"""Cancel (SPEC §8b): a due ready task, or a dead one, becomes completed without being run.

Pure planning, no I/O and no clock: given a task as it is now (a TaskView, or
None) and `now`, say why it cannot be cancelled (`refusal`), or which records
cancel it (`records`). The records are only those SPEC §4 already has, so the
disk format does not change and any reader of a WAL (recovery, verify, an older
walqueue) applies them as it applies every other record:

    1. {"op": "revive", ...}    only for a dead task: dead -> ready, attempts 0, at now;
    2. {"op": "reserve", ...}   the one task, by the worker CANCEL_WORKER;
    3. {"op": "ack", ...}       that lease, at the generation the reserve gave it.

The caller writes them in ONE batch (one fsync: walqueued answers after it),
and no caller can lease the task in between: the batch is one call of the
single writer. Worker names starting with RESERVED_WORKER_PREFIX are the
queue's own (`check_worker`), so no client's lease can ever be mistaken for
a cancel's, nor a cancel's for a client's.

Three records are not one transaction: a crash between them (the crash matrix
finds every such point) leaves the task revived (ready), or leased by
CANCEL_WORKER. The caller got no answer and cancels again, which must then
finish the job, whenever it comes: a ready or dead task is cancelled as any
other; a task leased by CANCEL_WORKER is an interrupted cancel, finished by
the ack alone while its lease lasts, and once the lease has lapsed by an
`expire` of it first (then revive if that made it dead, reserve and ack).
The lease is CANCEL_LEASE_SECONDS, one second: the ack is in the same batch
at the same `now`, so one second is all it needs, and a cancel cut short
holds its task for one second, not a minute: then the lease is reaped like
any other (walqueued's timer, or the next reserve) and the task is ready
again, one attempt used (dead if it was its last), as if the cancel had never
been asked; a cancel retried later still finishes it.

Readings (docs/spec.md):
  - completed: nothing happens, nothing is written (cancelling twice is harmless,
    so a lost answer may be retried);
  - ready but not due, leased by a worker (also a lease past its deadline that
    no reap has ended yet), unknown: InvalidRequest, the message saying which case, and
    when it becomes cancellable or which lease holds it;
  - the completed task keeps its key (ids and keys are never reused), and its
    counters are those the records leave: attempts + 1 (1 for a task that was
    dead, whose revive reset them), generation + 1, available_at unchanged
    (now for a dead task).
"""

from __future__ import annotations

from .errors import InvalidRequest
from .values import TaskView

RESERVED_WORKER_PREFIX = "walqueue:"
CANCEL_WORKER = "walqueue:cancel"
# The cancel's lease is acked in the same batch at the same `now`; it outlives the batch only if a
# crash interrupts the cancel, and then holds the task for one second (see the header).
CANCEL_LEASE_SECONDS = 1


def reserved_worker(worker: str) -> bool:
    """True for a worker name the queue keeps for itself (SPEC §8b)."""
    return worker.startswith(RESERVED_WORKER_PREFIX)


def check_worker(worker: str) -> str:
    """`worker` unchanged; InvalidRequest if it is one of the queue's reserved names."""
    if reserved_worker(worker):
        raise InvalidRequest(f"worker {worker!r}: names starting with {RESERVED_WORKER_PREFIX!r} are "
                             f"reserved for the queue's own leases (cancel); choose another name")
    return worker


def refusal(task_id: str, task: TaskView | None, now: int) -> str | None:
    """Why `task` cannot be cancelled at `now` (the InvalidRequest message), or None if it can
    (or is completed already, when cancel does nothing)."""
    if task is None:
        return f"task {task_id!r} is unknown: there is nothing to cancel"
    if task.status == "ready" and task.available_at > now:
        return (f"task {task_id!r} is ready but not due until {task.available_at} (now={now}); "
                f"it can be cancelled from then on")
    if task.status == "leased" and task.worker == CANCEL_WORKER:
        return None  # an interrupted cancel: finished by its ack (after an expire, once lapsed)
    if task.status == "leased":
        return (f"task {task_id!r} is leased by {task.worker!r} (generation {task.generation}, "
                f"deadline {task.deadline}); it can be cancelled once that lease ends "
                f"(release it, or force-release it as an operator)")
    return None


def check(task_id: str, task: TaskView | None, now: int) -> bool:
    """True if cancel must write (a due ready or a dead task), False if the task is completed.

    Raises InvalidRequest (see `refusal`) otherwise.
    """
    problem = refusal(task_id, task, now)
    if problem is not None:
        raise InvalidRequest(problem)
    return task.status != "completed"


def records(task: TaskView, now: int) -> list[dict]:
    """The records that cancel `task` (dead, ready and due at `now`, or held by an interrupted
    cancel), without their "seq"."""
    planned: list[dict] = []
    if task.status == "leased":  # CANCEL_WORKER's: an interrupted cancel
        if now < task.deadline:  # its lease still holds: only its ack is missing
            return [{"generation": task.generation, "now": now, "op": "ack", "task_id": task.task_id,
                     "worker": CANCEL_WORKER}]
        # Lapsed: end it as a reap would (ready at its deadline, due now; dead at its last attempt).
        planned.append({"now": now, "op": "expire", "task_ids": [task.task_id]})
        dead = task.attempts >= task.max_attempts
    else:
        dead = task.status == "dead"
    if dead:
        planned.append({"now": now, "op": "revive", "task_ids": [task.task_id]})
    planned.append({"lease_seconds": CANCEL_LEASE_SECONDS, "now": now, "op": "reserve",
                    "task_ids": [task.task_id], "worker": CANCEL_WORKER})
    planned.append({"generation": task.generation + 1, "now": now, "op": "ack",
                    "task_id": task.task_id, "worker": CANCEL_WORKER})
    return planned


def completed_counters(task: TaskView, now: int) -> tuple[int, int, int]:
    """(attempts, generation, available_at) of the task once cancelled: what `records` leave,
    for the backends that write no records (PostgreSQL, the memory backend)."""
    if task.status == "dead":
        return 1, task.generation + 1, now
    return task.attempts + 1, task.generation + 1, task.available_at
