"""Listing in pages (SPEC §8b): tasks in task_id order after a cursor, at most `limit`.

`tasks(status, after=, limit=)` must cost O(limit), not O(tasks), also with
millions of completed tasks. The state keeps the live tasks (ready, leased,
dead) in a dict and the completed ones in the packed tombstone store, which
is already in task id order (tombstones.py: `after(name)` starts a walk at a
cursor). What this module adds is the other half: `LiveIndex`, the live task
ids of each status in sorted blocks (`SortedIds`), kept by the state's
transitions, so a page merges at most four ordered walks that each start at
the cursor by bisection:

    ready ids  ─┐
    leased ids ─┼─ merged by UTF-8 bytes (= Python str order) ─ first `limit`
    dead ids   ─┤
    tombstones ─┘  (only for status None or "completed")

Costs: `SortedIds.add`/`discard` are a bisection over the blocks' last ids
and one insort/delete in a block of at most 2 * BLOCK_IDS ids (memmoves in
C); starting a walk is two bisections. A page of `limit` costs
O(log n + limit). Nothing here does I/O or reads a clock.

A walk reads the blocks as they are: take the page before the state changes
again (the callers build it at once, inside one call).
"""

from __future__ import annotations

import heapq
from bisect import bisect_left, bisect_right, insort
from collections.abc import Iterator
from itertools import islice
from operator import itemgetter
from typing import Any

from .errors import InvalidRequest

BLOCK_IDS = 1000
MAX_PAGE_TASKS = 10_000  # one page's bound: a listing of everything is `limit=None`
LIVE_STATUSES = ("ready", "leased", "dead")


def check_page(after: Any, limit: Any) -> tuple[str | None, int | None]:
    """The checked cursor and limit of a paged listing. Raises InvalidRequest.

    `after` is None (from the start) or any str (the tasks whose id is greater
    are listed; it need not be an id that exists); `limit` is None (no bound) or
    an int in [1, MAX_PAGE_TASKS].
    """
    if after is not None:
        if not isinstance(after, str):
            raise InvalidRequest(f"after must be a task id (str) or None, not {type(after).__name__}")
        try:
            after.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise InvalidRequest(f"after {after!r} cannot be encoded as UTF-8: {exc.reason}") from None
    if limit is not None:
        if type(limit) is not int or not 1 <= limit <= MAX_PAGE_TASKS:
            raise InvalidRequest(f"limit must be an int in [1, {MAX_PAGE_TASKS}] or None, not {limit!r}")
    return after, limit


class SortedIds:
    """A set of task ids kept in str order, in blocks of at most 2 * BLOCK_IDS ids."""

    __slots__ = ("_blocks", "_lasts", "_count")

    def __init__(self) -> None:
        self._blocks: list[list[str]] = []
        self._lasts: list[str] = []   # each block's greatest id
        self._count = 0

    def __len__(self) -> int:
        return self._count

    def __iter__(self) -> Iterator[str]:
        return self.after(None)

    def add(self, task_id: str) -> None:
        """Add an id that is not in the set."""
        blocks, lasts = self._blocks, self._lasts
        self._count += 1
        if lasts and task_id > lasts[-1]:  # after every id: the common case of ids that grow
            block = blocks[-1]
            block.append(task_id)
            lasts[-1] = task_id
            if len(block) > 2 * BLOCK_IDS:
                self._split(len(blocks) - 1)
            return
        if not blocks:
            blocks.append([task_id])
            lasts.append(task_id)
            return
        position = bisect_left(lasts, task_id)
        block = blocks[position]
        insort(block, task_id)
        if len(block) > 2 * BLOCK_IDS:
            self._split(position)

    def _split(self, position: int) -> None:
        """Halve a block grown past 2 * BLOCK_IDS ids (an insertion costs at most one block's)."""
        blocks, lasts = self._blocks, self._lasts
        block = blocks[position]
        upper = block[BLOCK_IDS:]
        del block[BLOCK_IDS:]
        blocks.insert(position + 1, upper)
        lasts.insert(position + 1, upper[-1])
        lasts[position] = block[-1]

    def discard(self, task_id: str) -> None:
        """Remove an id if it is in the set."""
        blocks, lasts = self._blocks, self._lasts
        position = bisect_left(lasts, task_id)
        if position == len(lasts):
            return
        block = blocks[position]
        if block[-1] == task_id and len(block) > 1:  # the greatest of its block: no bisection
            block.pop()
            lasts[position] = block[-1]
            self._count -= 1
            return
        index = bisect_left(block, task_id)
        if index == len(block) or block[index] != task_id:
            return
        del block[index]
        self._count -= 1
        if not block:
            del blocks[position]
            del lasts[position]
        elif index == len(block):
            lasts[position] = block[-1]

    def after(self, after: str | None) -> Iterator[str]:
        """The ids greater than `after` (all for None), in order."""
        blocks = self._blocks
        if after is None:
            position, index = 0, 0
        else:
            position = bisect_right(self._lasts, after)
            index = bisect_right(blocks[position], after) if position < len(blocks) else 0
        if position == len(blocks):
            return
        yield from islice(blocks[position], index, None)
        for block in islice(blocks, position + 1, None):
            yield from block


class LiveIndex:
    """The live task ids by status, each a SortedIds: `ready`, `leased`, `dead`, and the same
    three by name in `by_status` (the state's transitions reach the attributes directly: a
    reserve or release moves every task it changes, so each call saved counts)."""

    __slots__ = ("ready", "leased", "dead", "by_status")

    def __init__(self) -> None:
        self.ready, self.leased, self.dead = SortedIds(), SortedIds(), SortedIds()
        self.by_status = {"ready": self.ready, "leased": self.leased, "dead": self.dead}

    def move(self, task_id: str, old: str, new: str) -> None:
        """A task changed status (the hot paths of reserve and ack call the SortedIds directly)."""
        self.by_status[old].discard(task_id)
        self.by_status[new].add(task_id)


def page(live: LiveIndex, tombstones: Any, status: str | None, after: str | None,
         limit: int | None) -> Iterator[Any]:
    """The items of a page in task id order: a live task's id (a str) or a tombstone (from
    `tombstones.after`), at most `limit` of them (all for None)."""
    if status is None:
        walks = [_encoded(ids.after(after)) for ids in live.by_status.values()]
    elif status == "completed":
        walks = []
    else:
        walks = [_encoded(live.by_status[status].after(after))]
    if status in (None, "completed") and len(tombstones):
        walks.append(tombstones.after(None if after is None else after.encode("utf-8")))
    if not walks:
        return iter(())
    merged = walks[0] if len(walks) == 1 else heapq.merge(*walks, key=itemgetter(0))
    return islice(map(itemgetter(1), merged), limit)


def _encoded(ids: Iterator[str]) -> Iterator[tuple[bytes, str]]:
    # UTF-8 bytes order is str order: the live ids merge with the tombstones' names.
    return ((task_id.encode("utf-8"), task_id) for task_id in ids)


def lease_holders(live: LiveIndex, tasks: dict) -> list[tuple[str, int]]:
    """(worker, leases held) for every worker holding a lease, by name: O(leases)."""
    counts: dict[str, int] = {}
    for task_id in live.by_status["leased"]:
        worker = tasks[task_id].worker
        counts[worker] = counts.get(worker, 0) + 1
    return sorted(counts.items())
