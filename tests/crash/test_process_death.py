"""A real process death (os._exit at a hook call) recovers like the simulated one.

What it proves: `InjectedCrash` lets the library's own clean-up run (files
closed, buffers flushed); a dying process runs none of it. Here a child
process runs the crash script and calls `os._exit` inside the hook at each
hook call in turn; the parent reopens the directory (the kernel released the
flock) and must find exactly the model state after the frames that were
complete at that call, then resume the script to the uninterrupted final
state. The child is forked, so no interpreter shutdown runs either. A frame
left in a user-space buffer at `wal.after_write`, or a lock that outlives its
process, fails here.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path

import pytest

import walqueue
from tests.crash.matrix import (
    MATRIX_PREALLOCATE_BYTES,
    MatrixReport,
    ScriptRunner,
    learn_hook_calls,
    logical_state,
    model_state,
    took_effect,
)
from tests.crash.script import SCRIPT, ScriptModel
from tests.model.driver import call_real, default_factory

EXIT_CODE = 86


def _die_at(directory: Path, crash_at: int, preallocate_bytes: int) -> int:
    """Forks a child that runs SCRIPT and `os._exit`s inside hook call `crash_at`."""
    # A fork copies only this thread: a lock another thread held would stay held in the child.
    # Tests before this one must leave no thread running (the conformance faces once left
    # PostgreSQL's listener for the whole session).
    assert threading.active_count() == 1, f"forking beside other threads: {threading.enumerate()}"
    pid = os.fork()
    if pid == 0:  # the child: no clean-up of any kind may run
        try:
            calls: list[str] = []

            def hook(phase: str) -> None:
                calls.append(phase)
                if len(calls) - 1 == crash_at:
                    os._exit(EXIT_CODE)

            queue = walqueue.Queue(directory, hook=hook, preallocate_bytes=preallocate_bytes)
            for action in SCRIPT:
                call_real(queue, action)
        finally:
            os._exit(3)  # never reached the crash point, or raised
    _, status = os.waitpid(pid, 0)
    return os.waitstatus_to_exitcode(status)


@pytest.fixture(scope="module")
def learned() -> tuple[ScriptModel, list]:
    account = ScriptModel.build()
    report = MatrixReport()
    calls = learn_hook_calls(default_factory, account, False, report)
    assert not report.failures, report.failures
    return account, calls


@pytest.mark.parametrize("preallocate_bytes", [0, MATRIX_PREALLOCATE_BYTES],
                         ids=["append", "preallocate"])
def test_a_process_killed_at_every_hook_call_recovers_to_exactly_the_complete_frames(
    learned: tuple[ScriptModel, list], tmp_path: Path, preallocate_bytes: int
) -> None:
    account, calls = learned
    failures: list[str] = []
    for crash_at, point in enumerate(calls):
        directory = tmp_path / f"q{crash_at}"
        context = f"process death at hook call {crash_at} ({point.phase}, op {point.op_index})"
        exit_code = _die_at(directory, crash_at, preallocate_bytes)
        if exit_code != EXIT_CODE:
            failures.append(f"{context}: the child exited with {exit_code}")
            continue
        with walqueue.Queue(directory, preallocate_bytes=preallocate_bytes) as reopened:
            snapshot_seq = account.compaction_seqs[point.publishes - 1] if point.publishes else 0
            expected = model_state(account.after_frames(point.frames_complete, snapshot_seq))
            state = logical_state(reopened)
            if state != expected:
                failures.append(f"{context}: reopened {state!r}\n   expected {expected!r}")
                continue
            resume_at = point.op_index + took_effect(account, point, reopened)
            ScriptRunner(account, failures, context).run(reopened, resume_at, False, None)
            if logical_state(reopened) != model_state(account.final):
                failures.append(f"{context}: resumed to {logical_state(reopened)!r}")
    assert len(calls) > len(SCRIPT) * 3  # every call was a crash point
    assert not failures, "\n".join(failures)
