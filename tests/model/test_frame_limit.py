"""The MAX_FRAME_BYTES bound sits exactly where SPEC §1/§4 put it.

What it proves: a put whose record (canonical JSON, `seq` included) is exactly
MAX_FRAME_BYTES long is accepted, written as one frame and recovered after a
reopen; one byte more is `InvalidRequest` and writes nothing — the reference
model, which computes the record itself, agrees on both.
"""

from __future__ import annotations

from pathlib import Path

import walqueue
from tests.model.reference import (
    MAX_FRAME_BYTES,
    ModelInvalidRequest,
    ReferenceQueue,
    canonical_json,
)


def _payload_with_record_size(model: ReferenceQueue, task_id: str, size: int) -> dict[str, str]:
    def record_size(padding: int) -> int:
        task = {
            "available_at": 0,
            "key": task_id,
            "max_attempts": 3,
            "payload": {"pad": "x" * padding},
            "task_id": task_id,
        }
        record = {"op": "put", "seq": model.last_seq + 1, "tasks": [task]}
        return len(canonical_json(record))

    padding = size - record_size(0)
    assert record_size(padding) == size
    return {"pad": "x" * padding}


def test_a_put_of_exactly_max_frame_bytes_is_written_and_one_byte_more_is_rejected(
    tmp_path: Path,
) -> None:
    assert walqueue.MAX_FRAME_BYTES == MAX_FRAME_BYTES
    model = ReferenceQueue()
    directory = tmp_path / "q"
    with walqueue.Queue(directory) as queue:
        queue.put("small", {})
        model.put("small", {})
        too_big = _payload_with_record_size(model, "big", MAX_FRAME_BYTES + 1)
        try:
            model.put("big", too_big)
        except ModelInvalidRequest:
            pass
        else:
            raise AssertionError("the model accepted an oversized frame")
        try:
            queue.put("big", too_big)
        except walqueue.InvalidRequest:
            pass
        else:
            raise AssertionError("the queue accepted a frame over MAX_FRAME_BYTES")
        assert queue.stats().last_seq == 1
        fits = _payload_with_record_size(model, "big", MAX_FRAME_BYTES)
        assert queue.put("big", fits) == model.put("big", fits) == "big"
        assert queue.stats().last_seq == model.last_seq == 2
        assert queue.stats().wal_bytes == model.wal_bytes
    with walqueue.Queue(directory) as reopened:
        assert reopened.get("big").payload == fits
        assert reopened.stats().last_seq == 2
