"""`Queue(preallocate_bytes=N)`: a preallocated active segment, synced with fdatasync.

What it proves: the argument is validated before the directory is touched;
a live preallocated segment is its frames then zeros, which open cuts after
a crash and which sealing and closing trim, so only the newest segment ever
ends in zeros (a sealed one with zeros stays CorruptStore); an answered
operation survives a power cut that keeps nothing unsynced; a file system
that cannot preallocate gets plain appends, while ENOSPC is the write error
it is; verify accepts a live preallocated directory. And the one case SPEC §5
makes corruption: a frame torn inside the preallocated region (its first
bytes, then zeros) fails its digest, and open and verify name the segment and
the frame's offset; cutting the segment there (docs/failure-model.md) keeps
every answered operation.

The byte-exact layout of a preallocated segment is in test_format.py; the
crash matrix and the power-loss suite run with preallocation too.
"""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from tests.simdisk import SimFileSystem
from walqueue import CorruptStore, InjectedCrash, InvalidRequest, Queue, QueueClosed
from walqueue import fs as fs_module
from walqueue.verify import CORRUPT, TORN_TAIL, verify_directory
from walqueue.verify import main as verify_main

from .frames import frame, frames, put_record, put_task, wal_name

STEP = 4096


class DieAt:
    """A hook that raises InjectedCrash at the n-th call of one phase (n from 1)."""

    def __init__(self, phase: str, nth: int = 1) -> None:
        self.phase, self.left = phase, nth

    def __call__(self, phase: str) -> None:
        if phase == self.phase:
            self.left -= 1
            if self.left == 0:
                raise InjectedCrash(f"died at {phase}")


def put_frame(seq: int, task_id: str, payload=None) -> bytes:
    return frame(put_record(seq, put_task(task_id, payload or {})))


@pytest.mark.parametrize("value", [-1, 1024**3 + 1, True, 1.5, "4096", None])
def test_preallocate_bytes_is_validated_before_the_directory_is_touched(tmp_path, value):
    with pytest.raises(InvalidRequest, match="preallocate_bytes"):
        Queue(tmp_path / "q", preallocate_bytes=value)
    assert not (tmp_path / "q").exists()


def test_a_crash_leaves_zeros_that_open_cuts_before_appending_and_preallocating_again(tmp_path):
    directory = tmp_path / "q"
    queue = Queue(directory, preallocate_bytes=STEP, hook=DieAt("wal.after_sync", 2))
    queue.put("a", {})
    with pytest.raises(InjectedCrash):
        queue.put("b", {})
    segment = directory / wal_name(1)
    written = put_frame(1, "a") + put_frame(2, "b")
    assert segment.read_bytes() == written + bytes(STEP - len(written))
    phases = []
    with Queue(directory, preallocate_bytes=STEP, hook=phases.append) as reopened:
        assert phases == ["recover.after_truncate"]
        assert segment.read_bytes() == written  # cut (and fsynced) before any append
        assert reopened.stats().wal_bytes == len(written)
        reopened.put("c", {})
        assert segment.stat().st_size == len(written) + STEP  # preallocated again, from the cut
    assert segment.read_bytes() == written + put_frame(3, "c")


def test_a_crash_right_after_rotation_leaves_the_sealed_segment_trimmed(tmp_path):
    directory = tmp_path / "q"
    queue = Queue(directory, preallocate_bytes=STEP, hook=DieAt("wal.after_rotate"))
    queue.put("a", {})
    queue.put("b", {})
    with pytest.raises(InjectedCrash):
        queue.compact()
    assert (directory / wal_name(1)).read_bytes() == put_frame(1, "a") + put_frame(2, "b")
    assert (directory / wal_name(3)).read_bytes() == b""
    with Queue(directory, preallocate_bytes=STEP) as reopened:
        assert [view.task_id for view in reopened.tasks()] == ["a", "b"]
        assert reopened.compact() == 2


def test_zeros_after_the_frames_of_a_sealed_segment_are_still_corrupt_store(tmp_path):
    directory = tmp_path / "q"
    directory.mkdir()
    (directory / wal_name(1)).write_bytes(put_frame(1, "a") + bytes(STEP))
    (directory / wal_name(2)).write_bytes(put_frame(2, "b"))
    with pytest.raises(CorruptStore, match=rf"{wal_name(1)}: sealed segment has zero bytes .* "
                                           rf"offset {len(put_frame(1, 'a'))}"):
        Queue(directory, preallocate_bytes=STEP)


def test_an_answered_put_survives_a_power_cut_that_keeps_nothing_unsynced(tmp_path):
    disk = SimFileSystem()
    queue = Queue(tmp_path, filesystem=disk, preallocate_bytes=STEP)
    queue.put("a", {})
    assert disk.allocations == 1
    # The process dies (no close, so no trim) and the power goes.
    queue.engine._die()
    disk.power_loss(None)
    with Queue(tmp_path, filesystem=disk, preallocate_bytes=STEP) as reopened:
        assert reopened.get("a") is not None


def test_close_trims_the_zeros_durably(tmp_path):
    disk = SimFileSystem()
    with Queue(tmp_path, filesystem=disk, preallocate_bytes=STEP) as queue:
        queue.put("a", {})
    disk.power_loss(None)
    assert disk.volatile_image(str(tmp_path))[wal_name(1)] == put_frame(1, "a")


def test_a_file_system_that_cannot_preallocate_gets_plain_appends(tmp_path):
    disk = SimFileSystem(can_allocate=False)
    with Queue(tmp_path, filesystem=disk, preallocate_bytes=STEP) as queue:
        queue.put("a", {})
        assert disk.volatile_image(str(tmp_path))[wal_name(1)] == put_frame(1, "a")
        queue.put("b", {})
        queue.engine._die()
    disk.power_loss(None)
    with Queue(tmp_path, filesystem=disk, preallocate_bytes=STEP) as reopened:
        assert [view.task_id for view in reopened.tasks()] == ["a", "b"]
    assert disk.allocations == 0


@pytest.mark.parametrize("code", [errno.EOPNOTSUPP, errno.EINVAL])
def test_the_real_file_system_falls_back_when_posix_fallocate_is_not_supported(
    tmp_path, monkeypatch, code
):
    def unsupported(fd, offset, length):
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(fs_module.os, "posix_fallocate", unsupported)
    with Queue(tmp_path / "q", preallocate_bytes=STEP) as queue:
        queue.put("a", {})
        queue.put("b", {})
        assert (tmp_path / "q" / wal_name(1)).read_bytes() == put_frame(1, "a") + put_frame(2, "b")


def test_no_space_for_the_allocation_is_a_write_error_that_closes_the_queue(tmp_path, monkeypatch):
    def full(fd, offset, length):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    directory = tmp_path / "q"
    with Queue(directory, preallocate_bytes=STEP) as queue:
        queue.put("a", {})
        queue.put("b", {"fill": "x" * STEP})  # the next put needs a new step
        monkeypatch.setattr(fs_module.os, "posix_fallocate", full)
        with pytest.raises(OSError) as raised:
            queue.put("c", {"fill": "y" * STEP})
        assert raised.value.errno == errno.ENOSPC
        with pytest.raises(QueueClosed):
            queue.stats()
    monkeypatch.undo()
    with Queue(directory, preallocate_bytes=STEP) as reopened:
        assert [view.task_id for view in reopened.tasks()] == ["a", "b"]


def test_verify_accepts_a_live_preallocated_directory_and_reports_its_zero_tail(tmp_path, capsys):
    directory = tmp_path / "q"
    with Queue(directory, preallocate_bytes=STEP) as queue:
        queue.put("a", {})
        size = len(put_frame(1, "a"))
        report = verify_directory(directory)
        assert report.healthy and report.wal_bytes == size
        (tail,) = report.by_severity(TORN_TAIL)
        assert (tail.file, tail.offset) == (wal_name(1), size)
        assert f"{STEP - size} zero bytes" in tail.what
        assert verify_main([str(directory)]) == 0
        assert "TORN-TAIL" in capsys.readouterr().out


def test_a_frame_torn_inside_the_preallocated_region_is_corrupt_store_naming_file_and_offset(
    tmp_path,
):
    # The case SPEC §5 cannot tell from damage (docs/failure-model.md): a
    # power cut during the sync of c kept c's first bytes but not the rest,
    # which reads as the preallocated zeros.
    directory = tmp_path / "q"
    queue = Queue(directory, preallocate_bytes=STEP, hook=DieAt("wal.after_write", 3))
    queue.put("a", {})
    queue.put("b", {})
    with pytest.raises(InjectedCrash):
        queue.put("c", {"n": 3})  # written, never synced, never answered
    answered = put_frame(1, "a") + put_frame(2, "b")
    torn = put_frame(3, "c", {"n": 3})[:20]
    segment = directory / wal_name(1)
    segment.write_bytes(answered + torn + bytes(STEP - len(answered) - len(torn)))

    with pytest.raises(CorruptStore) as raised:
        Queue(directory, preallocate_bytes=STEP)
    assert str(raised.value) == (f"{wal_name(1)}: frame at offset {len(answered)} "
                                 f"fails its SHA-256 checksum")
    report = verify_directory(directory)
    (problem,) = report.by_severity(CORRUPT)
    assert (problem.file, problem.offset) == (wal_name(1), len(answered))
    assert f"only its first {len(torn)} bytes are non-zero" in problem.what
    assert "torn inside a preallocated segment" in problem.what
    assert report.last_seq == 2  # every answered operation is before the torn frame

    # What docs/failure-model.md tells the operator to do for exactly this shape.
    with open(segment, "r+b") as file:
        file.truncate(len(answered))
    with Queue(directory, preallocate_bytes=STEP) as reopened:
        assert [view.task_id for view in reopened.tasks()] == ["a", "b"]
    assert segment.read_bytes() == frames(put_record(1, put_task("a", {})),
                                          put_record(2, put_task("b", {})))


def test_verify_does_not_call_other_damage_a_torn_write(tmp_path):
    directory = tmp_path / "q"
    with Queue(directory, preallocate_bytes=STEP) as queue:
        queue.put("a", {})
        queue.put("b", {})
    segment = directory / wal_name(1)
    data = bytearray(segment.read_bytes())
    data[10] ^= 0x01  # a flipped bit in the first frame: frames follow it
    segment.write_bytes(bytes(data) + bytes(100))
    problems = verify_directory(directory).by_severity(CORRUPT)
    assert problems and not any("torn inside" in problem.what for problem in problems)


def test_wal_bytes_counts_frames_not_the_allocation(tmp_path):
    with Queue(tmp_path / "q", preallocate_bytes=STEP) as queue:
        queue.put("a", {})
        assert queue.stats().wal_bytes == len(put_frame(1, "a"))
        assert Path(tmp_path / "q" / wal_name(1)).stat().st_size == STEP
