"""The fixed operation script of the crash matrix, and what the model says of it.

What it proves: nothing alone. It fixes one script that performs every kind of
writing operation SPEC §4 knows — put, put_many (with an identical retry),
reserve (plain, and with a reap that sends one lease back to ready and one to
dead), touch, ack, release (to ready with a delay, and to dead), revive (with
a duplicate id), cancel (SPEC §8b: of a dead task, three frames, and of a due
ready one, two) — and two compactions, the second of which deletes the first
snapshot and the segments it covers. `ScriptModel` runs it on the reference
model and records, per operation, the results, the frames written (so the
matrix can name the exact state after any number of complete frames) and the
seq each compaction publishes.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from tests.model.driver import Action, call_model
from tests.model.reference import ModelLease, ReferenceQueue


def _put(task_id: str, **options: Any) -> dict[str, Any]:
    return {"task_id": task_id, "payload": {"task": task_id, "list": [1, "two"]}, **options}


def _lease(task_id: str, worker: str, generation: int) -> ModelLease:
    # Only task_id, worker and generation identify a lease; the rest is informational.
    return ModelLease(task_id, worker, generation, 0, generation, None)


def _requests(*fields: dict[str, Any]) -> list[dict[str, Any]]:
    return [{"form": "mapping", "fields": f} for f in fields]


SCRIPT: tuple[Action, ...] = (
    Action("put", _put("a", max_attempts=2)),  # 0
    Action(
        "put_many",
        {
            "requests": _requests(
                _put("a", max_attempts=2),  # an identical retry: skipped
                _put("b"),
                _put("c", available_at=5, max_attempts=1),
                _put("d", key="kd", max_attempts=1),
            )
        },
    ),  # 1
    Action("reserve", {"worker": "w1", "now": 10, "lease_seconds": 10, "limit": 2}),  # 2: a, b
    Action("touch", {"lease": _lease("a", "w1", 1), "now": 12, "lease_seconds": 20}),  # 3
    Action("ack", {"lease": _lease("a", "w1", 1), "now": 13}),  # 4
    Action("release", {"lease": _lease("b", "w1", 1), "now": 14, "delay": 3}),  # 5: b ready at 17
    Action("reserve", {"worker": "w2", "now": 20, "lease_seconds": 5, "limit": 3}),  # 6: d, c, b
    Action("compact"),  # 7
    Action("release", {"lease": _lease("d", "w2", 1), "now": 21, "delay": 0}),  # 8: d dead
    # 9: reaps b (-> ready) and c (-> dead), then leases b again.
    Action("reserve", {"worker": "w3", "now": 40, "lease_seconds": 5, "limit": 1}),
    Action("revive", {"task_ids": ["c", "d", "c"], "now": 41}),  # 10
    Action("put", _put("e")),  # 11
    Action("ack", {"lease": _lease("b", "w3", 3), "now": 42}),  # 12
    Action("compact"),  # 13: deletes snapshot 7's file and the segments it covered
    Action("put_many", {"requests": _requests(_put("f"), _put("g", key="kg"))}),  # 14
    Action("reserve", {"worker": "w1", "now": 50, "lease_seconds": 5, "limit": 5}),  # 15: c, d, e, f, g
    # 16: reaps the five (c and d, at max_attempts 1, -> dead; e, f, g -> ready at 55), leases e.
    Action("reserve", {"worker": "w2", "now": 60, "lease_seconds": 5, "limit": 1}),
    Action("cancel", {"task_id": "c", "now": 61}),  # 17: dead -> revive, reserve, ack
    Action("cancel", {"task_id": "f", "now": 61}),  # 18: ready and due -> reserve, ack
)

# The batched variant: each group runs inside one `with q.batch():`.
BATCHES: tuple[tuple[int, ...], ...] = (
    (0, 1),
    (2, 3, 4),
    (5, 6, 7, 8),  # a compaction in the middle of a batch
    (9, 10),
    (11, 12, 13),  # a compaction at the end of a batch
    (14, 15),
    (16,),
    (17, 18),  # two cancels in one batch: one fsync for their five frames
)


@dataclass
class ScriptModel:
    """The reference model's account of SCRIPT."""

    results: list[Any] = field(default_factory=list)
    frames_end: list[int] = field(default_factory=list)  # last_seq after each operation
    records: list[dict[str, Any]] = field(default_factory=list)
    compaction_seqs: list[int] = field(default_factory=list)  # in script order
    final: ReferenceQueue = field(default_factory=ReferenceQueue)

    @classmethod
    def build(cls, script: tuple[Action, ...] = SCRIPT) -> ScriptModel:
        model = ReferenceQueue()
        account = cls()
        for action in script:
            result = call_model(model, action)
            account.results.append(result)
            account.frames_end.append(model.last_seq)
            if action.name == "compact":
                account.compaction_seqs.append(result)
        account.records = [dict(record) for record in model.records]
        account.final = model
        return account

    def after_frames(self, frame_count: int, snapshot_seq: int) -> ReferenceQueue:
        """The model state once exactly `frame_count` frames are complete."""
        return ReferenceQueue.replay(self.records[:frame_count], snapshot_seq=snapshot_seq)

    def frames_of(self, index: int) -> range:
        start = self.frames_end[index - 1] if index else 0
        return range(start, self.frames_end[index])
