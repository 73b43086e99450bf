"""The state's two figures for monitoring (walqueued's metrics), kept without a clock.

  - each task remembers `ready_seq`, the seq of the record that last made it
    ready (put, release, expire, revive; 0 for a task loaded ready from a
    snapshot: "ready since the snapshot at least"), and the ready FIFO holds
    ready_seq, task_id, ready_seq, task_id, ... flat (16 bytes an entry, no
    tuple) in seq order, stale entries dropped lazily like the state's heaps',
    so the longest-waiting ready task is found in amortized O(1);
  - each leased task remembers `lease_start`, the `now` of the reserve or
    touch that set its deadline (None for a lease loaded from a snapshot,
    whose format does not carry it). `_halves` is a heap of (lease_start +
    deadline, task_id), twice each lease's middle, and `_past_half` the ids
    of the leases found at or past their middle by the last count: a count
    at a `now` no earlier than the last one moves only the leases that
    reached their middle since, so a report costs amortized O(1), not
    O(leases) (once 1,024 pipelined reports over 100k leases took one
    39.8 s loop turn).

The state machine (walqueue.state) tells a `Monitoring` of each change as it
commits it, so recovery rebuilds these indexes exactly as serving built
them; the figures are asked through the state. Each call is given the
state's live tasks (`tasks`, task id -> Task) rather than keeping them.
"""

from __future__ import annotations

import heapq
from collections import deque
from collections.abc import Callable, Iterable

from . import validation

READY, LEASED = validation.STATUSES[:2]


class Monitoring:
    def __init__(self) -> None:
        # Ready episodes in seq order, and those found delayed when they reached the head,
        # by available_at.
        self._ready_fifo: deque[int | str] = deque()
        self._delayed: list[tuple[int, int, str]] = []
        self._halves: list[tuple[int, str]] = []
        self._past_half: set[str] = set()
        self._half_cursor = -1  # 2 * the `now` of the last count of leases past half

    # -- what the state machine tells ---------------------------------------

    def became_ready(self, seq: int, task_id: str) -> None:
        """A record at `seq` made the task ready (0: loaded ready from a snapshot)."""
        self._ready_fifo.append(seq)
        self._ready_fifo.append(task_id)

    def lease_started(self, task) -> None:
        """A reserve or touch gave `task` a lease with a known start: its middle joins `_halves`."""
        self._past_half.discard(task.task_id)
        heapq.heappush(self._halves, (task.lease_start + task.deadline, task.task_id))

    def lease_ended(self, task_id: str) -> None:
        """The task's lease ended (ack, release, expire)."""
        self._past_half.discard(task_id)

    def tidy_ready(self, tasks: dict, ready_count: int) -> None:
        """Drop stale ready-FIFO entries once they outnumber the ready tasks (amortized)."""
        if len(self._ready_fifo) <= 4 * ready_count + 2048:
            return
        kept: deque[int | str] = deque()
        entries = iter(self._ready_fifo)
        for seq in entries:
            task_id = next(entries)
            if _is_ready_since(tasks.get(task_id), seq):
                kept.append(seq)
                kept.append(task_id)
        self._ready_fifo = kept

    def tidy_halves(self, tasks: dict, leased_count: int) -> None:
        """Drop stale `_halves` entries once they outnumber the live leases (O(entries), amortized)."""
        halves = self._halves
        if len(halves) <= 2 * leased_count + 1024:
            return
        past_half = self._past_half
        live = {(twice_middle, task_id) for twice_middle, task_id in halves
                if (task := tasks.get(task_id)) is not None and task.status == LEASED
                and task.lease_start is not None and task.lease_start + task.deadline == twice_middle
                and task_id not in past_half}
        halves[:] = live
        heapq.heapify(halves)

    # -- the figures ----------------------------------------------------------

    def ready_due_since(self, tasks: dict, ready_count: int, now: int,
                        seq_time: Callable[[int], int]) -> int | None:
        """The earliest time since which a ready task has been due, or None if none is due at `now`.

        A ready task has been due since max(available_at, seq_time(ready_seq)):
        it became ready at seq ready_seq, and could be leased from its
        available_at on. `seq_time` maps a seq to a time no later than the
        one at which it was written (the caller's clock; this module has
        none), must not decrease as the seq grows, and must be the same
        map from call to call (it may only lower old times, as the daemon's
        SeqClock does when it thins samples). Amortized O(1): each
        ready episode leaves the FIFO once, either as stale or to the
        `_delayed` heap when it was delayed (available_at later than it
        became ready); the FIFO head is then the longest-waiting immediate
        task and the heap head the delayed task due first.
        """
        fifo, delayed = self._ready_fifo, self._delayed
        oldest = None
        while fifo:
            seq, task_id = fifo[0], fifo[1]
            task = tasks.get(task_id)
            if task is None or task.status != READY or task.ready_seq != seq:
                fifo.popleft()
                fifo.popleft()
                continue
            became_ready = seq_time(seq)
            if task.available_at > became_ready:
                fifo.popleft()
                fifo.popleft()
                heapq.heappush(delayed, (task.available_at, seq, task_id))
                continue
            oldest = became_ready
            break
        while delayed:
            available_at, seq, task_id = delayed[0]
            task = tasks.get(task_id)
            if task is None or task.status != READY or task.ready_seq != seq:
                heapq.heappop(delayed)
                continue
            if available_at <= now and (oldest is None or available_at < oldest):
                oldest = available_at
            break
        if len(delayed) > 2 * ready_count + 1024:
            delayed[:] = [entry for entry in delayed
                          if _is_ready_since(tasks.get(entry[2]), entry[1])]
            heapq.heapify(delayed)
        return oldest

    def leases_past_half(self, tasks: dict, leases: Iterable[tuple[int, str]], now: int) -> int:
        """How many leased tasks are at or past the middle of their lease at `now`.

        The middle is halfway from lease_start (the reserve's or the last
        touch's now) to the deadline; leases whose deadline has passed but
        that no reserve has reaped yet count too. Leases loaded from a
        snapshot have no known start and are not counted until touched.
        Amortized O(1) while `now` does not go back (the daemon's never
        does): each lease joins `_past_half` once, when `_halves` reaches it.
        A `now` earlier than the last one's is counted by a walk over every
        lease (`leases`: the state's (deadline, task_id) entries), O(leased tasks).
        """
        twice_now = 2 * now
        if twice_now < self._half_cursor:
            return count_past_half(tasks, leases, now)
        halves, past_half = self._halves, self._past_half
        while halves and halves[0][0] <= twice_now:
            twice_middle, task_id = heapq.heappop(halves)
            task = tasks.get(task_id)
            if (task is not None and task.status == LEASED and task.lease_start is not None
                    and task.lease_start + task.deadline == twice_middle):
                past_half.add(task_id)  # a duplicate entry of the same lease adds nothing
        self._half_cursor = twice_now
        return len(past_half)


def count_past_half(tasks: dict, leases: Iterable[tuple[int, str]], now: int) -> int:
    """leases_past_half by a walk over every lease entry (stale and duplicate ones skipped)."""
    seen: set[str] = set()
    count = 0
    for deadline, task_id in leases:
        task = tasks.get(task_id)
        if task is None or task.status != LEASED or task.deadline != deadline or task_id in seen:
            continue
        seen.add(task_id)
        if task.lease_start is not None and 2 * now >= task.lease_start + deadline:
            count += 1
    return count


def _is_ready_since(task, seq: int) -> bool:
    return task is not None and task.status == READY and task.ready_seq == seq
