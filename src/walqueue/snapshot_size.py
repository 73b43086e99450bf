"""How much one record can change the size of a snapshot, without writing one (SPEC §4's entries).

walqueued checks the free space before it forks a snapshot child, so it
needs the size of the snapshot it is about to write, cheaply and never too
small. `State.commit` adds `growth(...)` of each record to
`State.snapshot_growth`; a snapshot of the state then takes at most the size
of one taken earlier plus the growth since (`Engine.snapshot_bytes_bound`).

A snapshot entry is the canonical JSON of a task's eleven fields in a frame.
What a record does to the entries it touches, and the bound counted:

  put      new entries: each task's task_id, key, payload, available_at and
           max_attempts are encoded in the put's frame exactly as in its
           entry, so the tasks take at most the frame's body plus
           PUT_ENTRY_EXTRA_BYTES each (what an entry has that the put does
           not: attempts, deadline, generation, the 64-digit identity,
           status, worker, the frame's length and digest);
  reserve  once per task leased: its worker's JSON and deadline (null
           before), a longer status, a digit more for attempts and
           generation at most. The record names the worker once; the
           snapshot repeats it per task, which is why the WAL is no bound;
  ack, release, expire
           worker and deadline become null, status and available_at change
           (an acked task's payload, at least "{}", becomes null);
  touch    the deadline's digits; revive: attempts, available_at, status.

Only the lengths of numbers and names are computed (a reserve's worker is
encoded once per record), so the cost is O(tasks the record names), like the
record's own. Lengths freed are counted low: a worker's characters and
quotes for its JSON, so escapes and UTF-8 only make the bound looser. No
I/O, no clock.
"""

from __future__ import annotations

from functools import lru_cache

from .codec import FRAME_OVERHEAD_BYTES, canonical_json
from .validation import STATUSES

READY, LEASED, COMPLETED, DEAD = STATUSES
_NULL_BYTES = len(b"null")
_EMPTY_PAYLOAD_BYTES = len(b"{}")
# A string's canonical JSON takes at least its characters and two quotes.
_QUOTES_BYTES = 2
# Status names in canonical JSON, quotes included.
_STATUS_BYTES = {status: len(canonical_json(status)) for status in STATUSES}


def _put_entry_extra_bytes() -> int:
    """What a just-put task's framed entry takes beyond the task's JSON in its put record."""
    put = {"available_at": 0, "key": "", "max_attempts": 1, "payload": {}, "task_id": ""}
    entry = {**put, "attempts": 0, "deadline": None, "generation": 0, "identity": "0" * 64,
             "status": READY, "worker": None}
    return FRAME_OVERHEAD_BYTES + len(canonical_json(entry)) - len(canonical_json(put))


PUT_ENTRY_EXTRA_BYTES = _put_entry_extra_bytes()


@lru_cache(maxsize=4096)
def _name_bytes(name: str) -> int:
    """The length of a name's canonical JSON: a reserve's worker, the same few again and again."""
    return len(canonical_json(name))


def _digits(number: int) -> int:
    """The length of a non-negative integer in canonical JSON."""
    return len(str(number))


def growth(op: str, record: dict, targets: list, body_bytes: int | None) -> int:
    """An upper bound on how much committing this checked record changes the snapshot's size.

    `targets` are what State.check returned: the put's task fields, or the
    tasks the record changes, still holding their values from before it.
    `body_bytes` is the length of the record's canonical JSON, if the caller
    has its frame; without it a put is encoded again to measure it.
    """
    leased, ready = _STATUS_BYTES[LEASED], _STATUS_BYTES[READY]
    if op == "put":
        if body_bytes is None:
            body_bytes = len(canonical_json(record))
        return body_bytes + len(targets) * PUT_ENTRY_EXTRA_BYTES
    if op == "reserve":
        deadline = record["now"] + record["lease_seconds"]
        per_task = (leased - ready + 2 + _digits(deadline) - _NULL_BYTES
                    + _name_bytes(record["worker"]) - _NULL_BYTES)
        return len(targets) * per_task
    if op == "ack":
        (task,) = targets
        return (_STATUS_BYTES[COMPLETED] - leased + _NULL_BYTES - _EMPTY_PAYLOAD_BYTES
                + _NULL_BYTES - _digits(task.deadline)
                + _NULL_BYTES - len(task.worker) - _QUOTES_BYTES)
    if op == "release" or op == "expire":
        # Ready again (or dead, shorter still), at a new available_at.
        total = 0
        for task in targets:
            available_at = task.deadline if op == "expire" else record["now"] + record["delay"]
            total += (ready - leased + _digits(available_at) - _digits(task.available_at)
                      + _NULL_BYTES - _digits(task.deadline)
                      + _NULL_BYTES - len(task.worker) - _QUOTES_BYTES)
        return total
    if op == "touch":
        (task,) = targets
        return _digits(record["now"] + record["lease_seconds"]) - _digits(task.deadline)
    if op == "revive":
        now = _digits(record["now"])
        return sum(ready - _STATUS_BYTES[DEAD] + _digits(0) - _digits(task.attempts)
                   + now - _digits(task.available_at) for task in targets)
    raise AssertionError(f"no snapshot growth for op {op!r}")


def compiled_terms() -> tuple[int, int, int]:
    """The constant parts of `growth` for put, reserve and ack, for the compiled twin of
    State.apply (walqueue.replay): a put adds its body and this much per task; a reserve this
    plus its deadline's digits and its worker's JSON per task; an ack this minus its deadline's
    digits and its worker's characters."""
    leased, ready = _STATUS_BYTES[LEASED], _STATUS_BYTES[READY]
    return (PUT_ENTRY_EXTRA_BYTES,
            leased - ready + 2 - 2 * _NULL_BYTES,
            _STATUS_BYTES[COMPLETED] - leased + 3 * _NULL_BYTES - _EMPTY_PAYLOAD_BYTES - _QUOTES_BYTES)
