"""Dying at any hook call never loses a complete frame nor shows an incomplete one.

What it proves: for a fixed script covering every writing operation and two
compactions, run plainly and in `with q.batch()` groups, a simulated death at
each hook call (`InjectedCrash`) leaves a directory that reopens to exactly
the reference model's state after the frames that were complete at that
moment; the dead Queue is closed and its lock released at once; resuming the
script (re-running the interrupted call only if it did not take effect) ends
where the uninterrupted run ends. The same holds when the hook raises an
ordinary OSError (a failing write or fsync, SPEC §3). Torn and zero-filled
WAL tails are truncated on open, and dying right after that truncation is
survivable. All
nine SPEC §6 phases are exercised, and no other phase name is ever used. See
tests/crash/matrix.py for the details of each check.

Everything runs twice: with the default appending WAL and with the active
segment preallocated (`preallocate_bytes`), where a dead process leaves
zeros after its last frame and every reopen must cut them.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

import walqueue
from tests.crash.matrix import (
    PHASES,
    MatrixReport,
    QueueFactory,
    disk_full,
    preallocating_factory,
    run_crash_matrix,
)
from tests.crash.script import SCRIPT, ScriptModel
from tests.model import disk
from tests.model.driver import default_factory


def _failures(report: MatrixReport) -> str:
    return "\n".join(report.failures[:20]) + (
        f"\n... {len(report.failures) - 20} more" if len(report.failures) > 20 else ""
    )


FACTORIES = {"append": default_factory, "preallocate": preallocating_factory}


@pytest.fixture(scope="module", params=list(FACTORIES))
def factory(request: pytest.FixtureRequest) -> QueueFactory:
    return FACTORIES[request.param]


@pytest.fixture(scope="module")
def plain_report(factory: QueueFactory) -> MatrixReport:
    return run_crash_matrix(factory, batched=False)


@pytest.fixture(scope="module")
def batched_report(factory: QueueFactory) -> MatrixReport:
    return run_crash_matrix(factory, batched=True)


def test_the_script_covers_every_writing_operation_and_two_compactions() -> None:
    account = ScriptModel.build()
    ops = [record["op"] for record in account.records]
    assert set(ops) == {"put", "expire", "reserve", "ack", "release", "touch", "revive"}
    expire = next(record for record in account.records if record["op"] == "expire")
    assert expire["task_ids"] == ["b", "c"]  # b goes back to ready, c dies
    assert account.compaction_seqs[0] < account.compaction_seqs[1] < account.final.last_seq
    # The release at op 8 sends d to dead; the revive brings c and d back.
    assert account.results[10] == ["c", "d"]
    assert [action.name for action in SCRIPT].count("compact") == 2
    assert account.frames_end[1] - account.frames_end[0] == 1  # one put_many frame


def test_a_crash_at_every_hook_call_recovers_to_exactly_the_complete_frames(
    plain_report: MatrixReport,
) -> None:
    assert plain_report.hook_calls > 40
    assert len(plain_report.crash_points) == plain_report.hook_calls
    assert not plain_report.failures, _failures(plain_report)


def test_a_crash_at_every_hook_call_inside_batches_recovers_to_exactly_the_complete_frames(
    batched_report: MatrixReport,
) -> None:
    assert len(batched_report.crash_points) == batched_report.hook_calls
    assert not batched_report.failures, _failures(batched_report)


@pytest.mark.parametrize("batched", [False, True], ids=["plain", "batched"])
def test_a_failing_write_at_every_hook_call_closes_the_queue_and_recovers_the_same_way(
    factory: QueueFactory, batched: bool,
) -> None:
    report = run_crash_matrix(factory, batched=batched, make_error=disk_full)
    assert len(report.crash_points) == report.hook_calls
    assert not report.failures, _failures(report)


def test_batches_sync_less_often_than_single_calls(
    plain_report: MatrixReport, batched_report: MatrixReport
) -> None:
    assert batched_report.hook_calls < plain_report.hook_calls


def test_the_matrix_exercises_all_nine_phases_and_no_others(
    plain_report: MatrixReport, batched_report: MatrixReport
) -> None:
    assert plain_report.phases_seen == PHASES
    assert batched_report.phases_seen == PHASES


def _reports_before_write_too_late(directory: Path, hook: Any = None) -> walqueue.Queue:
    """A factory whose hook claims `wal.before_write` only once the frame is written."""
    if hook is None:
        return walqueue.Queue(directory)

    def late(phase: str) -> None:
        if phase == "wal.before_write":
            return
        if phase == "wal.after_write":
            hook("wal.before_write")
        hook(phase)

    return walqueue.Queue(directory, hook=late)


def _forgets_the_last_frame_on_open(directory: Path, hook: Any = None) -> walqueue.Queue:
    """A factory that drops the newest complete frame before every hook-less open."""
    segments = sorted(Path(directory).glob("wal-*.log"))
    if segments and hook is None:
        frames = disk.read_frames(segments[-1])
        if frames:
            with open(segments[-1], "r+b") as segment:
                segment.truncate(frames[-1].offset)
    return walqueue.Queue(directory, hook=hook)


@pytest.mark.parametrize(
    "factory", [_reports_before_write_too_late, _forgets_the_last_frame_on_open]
)
def test_the_matrix_catches_a_queue_that_shows_or_loses_the_wrong_frames(
    factory: Callable[..., Any],
) -> None:
    report = run_crash_matrix(factory)
    assert report.failures
