"""A reap of more than 10,000 leases is several atomic expire frames, each recovered alone.

What it proves: with 10,001 expired leases, `reserve` writes two `expire`
frames (10,000 ids, then 1, in (deadline, task_id) order) before its
`reserve` frame, exactly as the reference model does; and a death between the
two expire frames reopens to the state with only the first 10,000 reaped,
after which the next reserve reaps the last one and ends where the model ends.
"""

from __future__ import annotations

from pathlib import Path

import walqueue
from tests.crash.matrix import logical_state, model_state
from tests.model import disk
from tests.model.reference import EXPIRE_IDS_PER_FRAME, ReferenceQueue

TASK_COUNT = EXPIRE_IDS_PER_FRAME + 1


class DieAtSecondFrame:
    def __init__(self) -> None:
        self.armed = False
        self.before_writes = 0
        self.raised: BaseException | None = None

    def __call__(self, phase: str) -> None:
        if not self.armed or phase != "wal.before_write":
            return
        self.before_writes += 1
        if self.before_writes == 2:
            self.raised = walqueue.InjectedCrash("between the expire frames")
            raise self.raised


def _lease_everything(queue: walqueue.Queue, model: ReferenceQueue) -> None:
    requests = [
        {"task_id": f"t{index:05d}", "payload": {"i": index}} for index in range(TASK_COUNT)
    ]
    queue.put_many(requests)
    model.put_many(requests)
    # Deadlines 1..11 in groups of 1000, so the reap order is by deadline, then id.
    for round_number in range(TASK_COUNT // 1000 + 1):
        lease_seconds = 11 - round_number
        leases = queue.reserve("w", now=0, lease_seconds=lease_seconds, limit=1000)
        model_leases = model.reserve("w", now=0, lease_seconds=lease_seconds, limit=1000)
        assert [lease.task_id for lease in leases] == [lease.task_id for lease in model_leases]
    assert model.counts()["leased"] == TASK_COUNT


def test_a_reap_of_10001_leases_writes_two_expire_frames_like_the_model(tmp_path: Path) -> None:
    model = ReferenceQueue()
    with walqueue.Queue(tmp_path / "q") as queue:
        _lease_everything(queue, model)
        [lease] = queue.reserve("v", now=20, lease_seconds=5)
        [model_lease] = model.reserve("v", now=20, lease_seconds=5)
        assert (lease.task_id, lease.generation) == (model_lease.task_id, model_lease.generation)
        assert logical_state(queue, with_wal_bytes=True) == model_state(model, with_wal_bytes=True)
    records = disk.wal_records(tmp_path / "q")
    assert [len(r["task_ids"]) for r in records if r["op"] == "expire"] == [10_000, 1]
    assert records == model.records


def test_a_death_between_two_expire_frames_keeps_exactly_the_first(tmp_path: Path) -> None:
    directory = tmp_path / "q"
    model = ReferenceQueue()
    hook = DieAtSecondFrame()
    queue = walqueue.Queue(directory, hook=hook)
    _lease_everything(queue, model)
    hook.armed = True
    try:
        queue.reserve("v", now=20, lease_seconds=5)
    except walqueue.InjectedCrash as error:
        assert error is hook.raised
    else:
        raise AssertionError("the reserve did not reach a second frame")
    partial = model.clone()
    first_expire = partial.reap_records(20)[0]
    partial._append(first_expire)
    with walqueue.Queue(directory) as reopened:
        assert logical_state(reopened) == model_state(partial)
        leases = reopened.reserve("v", now=20, lease_seconds=5)
        assert [lease.task_id for lease in leases] == [
            lease.task_id for lease in partial.reserve("v", now=20, lease_seconds=5)
        ]
        assert logical_state(reopened) == model_state(partial)
    queue.close()
