"""Random WAL traffic applied both ways: State.apply against its compiled twin (walqueue.replay).

A case is one seeded run of records against two fresh States, one applied by
`state.apply` (the reference), the other by `replay.applier(state)`: mostly
the put/reserve/ack traffic the twin decides itself, with release, touch,
expire and revive between them (those it leaves to the reference, and they
make the tasks the twin meets later: pinned identities, dead and revived
ones), and a share of records broken in one field, the way a damaged or
hostile WAL would be: every check the twin makes has a record here that
fails it. After every record both must have said the same (nothing, or the
same error class and message) and hold the same state, down to the heaps,
the listing index and the monitoring figures. `writer_differs` does the same
for the Engine's pair, check before the frame is written and commit after
(`replay.writer_steps`). tests/unit/test_replay_twin.py runs these;
scripts/speedups_differential.py --replay runs many more.
"""

from __future__ import annotations

import copy
import json
import random

from walqueue import replay
from walqueue.codec import canonical_json
from walqueue.errors import WalQueueError
from walqueue.state import State

_NAME_CHARS = "abcz09-_. "
_ODD_WORKERS = ["w\"q", "w\\b", "w\nx", "w\x01", "w\x7f", "é-worker", "w" * 1024, "w" * 1025, ""]


_PARTS = ("last_seq", "snapshot_growth", "counts", "tasks", "keys", "entries", "ready heap",
          "lease heap", "ready ids", "leased ids", "dead ids", "ready FIFO", "delayed", "halves",
          "past half", "half cursor")


def fingerprint(state: State) -> tuple:
    """Everything a record can change, in an order both paths must also agree on."""
    tasks = tuple(repr((task.task_id, task.key, task.identity, task.status, task.attempts,
                        task.max_attempts, task.generation, task.available_at, task.deadline,
                        task.worker, canonical_json(task.payload), task.ready_seq,
                        task.lease_start)) for task in state.tasks.values())
    index = state.live_index
    monitoring = state.monitoring
    return (state.last_seq, state.snapshot_growth, tuple(state.counts.items()), tasks,
            tuple(state.task_id_by_key.items()), tuple(map(canonical_json, state.entries())),
            tuple(state._ready), tuple(state._leases),
            tuple(index.ready), tuple(index.leased), tuple(index.dead),
            tuple(monitoring._ready_fifo), tuple(monitoring._delayed), tuple(monitoring._halves),
            tuple(sorted(monitoring._past_half)), monitoring._half_cursor)


def _outcome(apply, record, body_bytes):
    try:
        apply(record, body_bytes)
    except WalQueueError as error:
        return type(error).__name__, str(error)
    return None


class Traffic:
    """Records that follow a state of its own, kept in step by `follow`, a share of them broken.

    Its own: the queries that pick what to lease (due_ready, expired) drop stale heap entries,
    so asking the compared states would change what is compared.
    """

    def __init__(self, rng: random.Random) -> None:
        self.rng = rng
        self.state = State()
        self.now = rng.randrange(0, 50)
        self.serial = 0
        self.workers = ["w1", "w2", rng.choice(_ODD_WORKERS[:5])]

    def _name(self) -> str:
        self.serial += 1
        rng = self.rng
        if rng.random() < 0.03:
            return rng.choice(["é" + str(self.serial), "", "x" * 1025, "x" * 1024])
        # Ids that mostly grow (the tombstone store's common case), some that do not.
        prefix = "t" if rng.random() < 0.85 else rng.choice("abs")
        return f"{prefix}{self.serial:05d}" + "".join(rng.choice(_NAME_CHARS) for _ in range(rng.randrange(3)))

    def record(self) -> dict:
        rng, state = self.rng, self.state
        self.now += rng.choice([0, 0, 1, 1, 2, 5, 40])
        ready = state.due_ready(self.now, 5)
        leased = [task for task in state.tasks.values() if task.status == "leased"]
        dead = [task.task_id for task in state.tasks.values() if task.status == "dead"]
        roll = rng.random()
        if roll < 0.3 or not (ready or leased):
            record = self._put()
        elif roll < 0.55 and ready:
            count = rng.randrange(1, len(ready) + 1)
            record = {"op": "reserve", "now": self.now, "lease_seconds": rng.choice([1, 5, 30, 10**6]),
                      "task_ids": ready[:count], "worker": rng.choice(self.workers)}
        elif roll < 0.85 and leased:
            task = rng.choice(leased)
            record = {"op": "ack", "now": min(self.now, task.deadline - 1), "task_id": task.task_id,
                      "worker": task.worker, "generation": task.generation}
        elif roll < 0.9 and leased:
            task = rng.choice(leased)
            record = {"op": "release", "now": min(self.now, task.deadline - 1), "task_id": task.task_id,
                      "worker": task.worker, "generation": task.generation, "delay": rng.choice([0, 3])}
        elif roll < 0.93 and leased:
            task = rng.choice(leased)
            record = {"op": "touch", "now": min(self.now, task.deadline - 1), "task_id": task.task_id,
                      "worker": task.worker, "generation": task.generation, "lease_seconds": 7}
        elif roll < 0.97 and state.expired(self.now, 3):
            record = {"op": "expire", "now": self.now, "task_ids": state.expired(self.now, 3)}
        elif dead:
            record = {"op": "revive", "now": self.now, "task_ids": dead[:2]}
        else:
            record = self._put()
        record["seq"] = state.last_seq + 1
        if rng.random() < 0.25:
            record = self._break(record)
        return record

    def follow(self, record) -> None:
        """The record as the compared states took it: applied, or rejected."""
        try:
            self.state.apply(copy.deepcopy(record))
        except WalQueueError:
            pass

    def _put(self) -> dict:
        rng = self.rng
        tasks = []
        for _ in range(rng.choice([1, 1, 1, 2, 3])):
            task_id = self._name()
            key = task_id if rng.random() < 0.8 else self._name()
            tasks.append({"task_id": task_id, "key": key, "available_at": rng.choice([0, self.now, self.now + 3]),
                          "max_attempts": rng.choice([1, 2, 3]),
                          "payload": rng.choice([{}, {"n": self.serial}, {"s": "é\"x", "l": [1, None]}])})
        return {"op": "put", "tasks": tasks}

    def _taken_name(self) -> str:
        """An id or key some task (live or completed) holds already."""
        names = [task.task_id for task in self.state.tasks.values()] + [
            entry["task_id"] for entry in self.state.entries() if entry["status"] == "completed"]
        return self.rng.choice(names) if names else "t00001"

    def _break(self, record: dict) -> dict:
        """The record with one thing wrong (or, now and then, right after all)."""
        rng = self.rng
        record = copy.deepcopy(record)
        op = record["op"]
        choices = ["seq", "seq_type", "extra", "missing", "op", "not_dict"]
        if op == "put":
            choices += ["taken_id", "taken_key", "twice", "task_extra", "task_field", "tasks_empty"]
        if op == "reserve":
            choices += ["not_due", "order", "twice_listed", "unknown", "worker", "now", "lease", "many", "huge"]
        if op == "ack":
            choices += ["generation", "worker", "deadline", "unknown", "completed", "now", "bool"]
        choice = rng.choice(choices)
        if choice == "seq":
            record["seq"] += rng.choice([-1, 1, 2])
        elif choice == "seq_type":
            record["seq"] = rng.choice([True, float(record["seq"]), str(record["seq"]), 2**64])
        elif choice == "extra":
            record["extra"] = 1
        elif choice == "missing":
            del record[rng.choice(sorted(record))]
        elif choice == "op":
            record["op"] = rng.choice(["Put", "", 3, None, "acks"])
        elif choice == "not_dict":
            return rng.choice([[record], "record", None])
        elif choice in ("taken_id", "taken_key"):
            record["tasks"][0]["task_id" if choice == "taken_id" else "key"] = self._taken_name()
        elif choice == "twice":
            record["tasks"].append(dict(record["tasks"][0]))
        elif choice == "task_extra":
            record["tasks"][0]["extra"] = 1
        elif choice == "task_field":
            field = rng.choice(["task_id", "key", "available_at", "max_attempts", "payload"])
            record["tasks"][0][field] = rng.choice([None, 1.5, True, -1, 0, 2**63, "x", [], ""])
        elif choice == "tasks_empty":
            record["tasks"] = rng.choice([[], {}, None])
        elif choice == "not_due":
            later = [task.task_id for task in self.state.tasks.values()
                     if task.status == "ready" and task.available_at > record["now"]]
            record["task_ids"] = later[:1] or record["task_ids"]
            record["now"] = max(0, record["now"] - rng.randrange(0, 5))
        elif choice == "order":
            record["task_ids"] = record["task_ids"][::-1]
        elif choice == "twice_listed":
            record["task_ids"] = record["task_ids"] + record["task_ids"][:1]
        elif choice == "unknown":
            if op == "ack":
                record["task_id"] = "nobody"
            else:
                record["task_ids"] = record["task_ids"] + [rng.choice(["nobody", 7, None])]
        elif choice == "completed":
            record["task_id"] = self._taken_name()
        elif choice == "worker":
            record["worker"] = rng.choice(_ODD_WORKERS + [None, 3])
        elif choice == "now":
            record["now"] = rng.choice([-1, True, None, 2**63, 1.0])
        elif choice == "lease":
            record["lease_seconds"] = rng.choice([0, -1, 2**63 - 1, True, None])
        elif choice == "many":
            record["task_ids"] = record["task_ids"] * 1001
        elif choice == "huge":
            record["now"] = 2**63 - 2
        elif choice == "generation":
            record["generation"] += rng.choice([-1, 1])
        elif choice == "deadline":
            task = self.state.tasks.get(record["task_id"])
            if task is not None and task.deadline is not None:
                record["now"] = task.deadline + rng.choice([0, 1])
        elif choice == "bool":
            record["generation"] = bool(record["generation"])
        return record


def replay_differs(rng: random.Random, records: int = 120) -> str | None:
    """One case: `records` records of random traffic applied both ways; the first difference."""
    reference, twin_state = State(), State()
    twin = replay.applier(twin_state)
    if twin == twin_state.apply:
        return "replay.applier gave the reference's apply: the twin is not what runs"
    traffic = Traffic(rng)
    for number in range(records):
        record = traffic.record()
        body = None   # now and then unknown: the reference then measures a put itself
        if rng.random() < 0.95:
            try:
                body = len(canonical_json(record))
            except (TypeError, ValueError):
                pass
        expected = _outcome(reference.apply, copy.deepcopy(record), body)
        got = _outcome(twin, copy.deepcopy(record), body)
        traffic.follow(record)
        if (difference := _difference(number, record, expected, got, reference, twin_state)):
            return difference
    return None


def _difference(number, record, expected, got, reference: State, twin_state: State) -> str | None:
    """What tells the two paths apart after `record`: what they said, or a part of their states."""
    if expected != got:
        return f"record {number} {_show(record)}: reference {expected!r}, twin {got!r}"
    left, right = fingerprint(reference), fingerprint(twin_state)
    if left == right:
        return None
    part = next(name for name, a, b in zip(_PARTS, left, right, strict=True) if a != b)
    return (f"record {number} {_show(record)}: the states' {part} differ after it "
            f"({expected!r}): reference {left[_PARTS.index(part)]!r:.200}, "
            f"twin {right[_PARTS.index(part)]!r:.200}")


def _written(check, commit, record):
    """What the Engine does with a record: check it, then (after its frame is written) commit it."""
    try:
        change = check(record)
    except WalQueueError as error:
        return type(error).__name__, str(error)
    commit(change, len(canonical_json(record)))
    return None


def writer_differs(rng: random.Random, records: int = 120) -> str | None:
    """One case of the writer's pair: State.check then State.commit against `replay.writer_steps`."""
    reference, twin_state = State(), State()
    check, commit = replay.writer_steps(twin_state)
    if check == twin_state.check:
        return "replay.writer_steps gave the reference's check: the twin is not what runs"
    traffic = Traffic(rng)
    for number in range(records):
        record = traffic.record()
        expected = _written(reference.check, reference.commit, copy.deepcopy(record))
        got = _written(check, commit, copy.deepcopy(record))
        traffic.follow(record)
        if (difference := _difference(number, record, expected, got, reference, twin_state)):
            return difference
    return None


def _show(record) -> str:
    return json.dumps(record, default=repr)[:300]


__all__ = ["Traffic", "fingerprint", "replay_differs", "writer_differs"]
