"""Recovery edge cases found while documenting the format (each was once accepted)."""

from __future__ import annotations

import os

import pytest

from walqueue import CorruptStore, Queue
from walqueue.codec import encode_frame


def test_a_junk_frame_covered_by_the_snapshot_is_still_corrupt(tmp_path) -> None:
    queue = Queue(tmp_path)
    queue.put("a", {})
    queue.put("b", {})
    queue.compact()  # snapshot through seq 2; wal-1 deleted, wal-3 active
    queue.put("c", {})
    queue.close()
    # A leftover segment covered by the snapshot, whose first frame is not a record.
    (tmp_path / "wal-00000000000000000001.log").write_bytes(
        encode_frame({"bogus": 1, "seq": 1}) + encode_frame({"op": "nonsense", "seq": 2}))
    os.unlink(tmp_path / "wal-00000000000000000003.log")
    (tmp_path / "wal-00000000000000000001.log").write_bytes(
        (tmp_path / "wal-00000000000000000001.log").read_bytes()
        + encode_frame({"op": "put", "seq": 3, "tasks": [
            {"available_at": 0, "key": "c", "max_attempts": 3, "payload": {}, "task_id": "c"}]}))
    with pytest.raises(CorruptStore, match=r"wal-0+1\.log: frame at offset 0 \(seq 1\)"):
        Queue(tmp_path)


def test_a_segment_named_for_seq_zero_is_corrupt(tmp_path) -> None:
    (tmp_path / "wal-00000000000000000000.log").write_bytes(encode_frame({"junk": True, "seq": 0}))
    with pytest.raises(CorruptStore, match="wal-0+0.log"):
        Queue(tmp_path)


def test_creating_the_queue_directory_fsyncs_its_parent(tmp_path, monkeypatch) -> None:
    from walqueue import directory as directory_module

    synced: list[int] = []   # inodes of the directories whose entries were fsynced
    real = directory_module._fsync_directory

    def recording(fd: int) -> None:
        synced.append(os.fstat(fd).st_ino)
        real(fd)

    monkeypatch.setattr(directory_module, "_fsync_directory", recording)
    Queue(tmp_path / "new").close()
    assert synced == [tmp_path.stat().st_ino]
    synced.clear()
    Queue(tmp_path / "new").close()
    assert synced == []
