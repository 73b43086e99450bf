"""walqueue-scheduler against a real walqueued: two schedulers side by side put each of 100
periods exactly once (and a scheduler with random ids, tests/scheduler_broken.py, is caught
putting duplicates); a scheduler killed with SIGKILL and restarted catches up within its
window and logs what it skipped; SIGTERM stops it with exit 0; walqueue-ctl schedule reads the
last period put. The schedulers run on the test-only jumping clock
(WALQUEUE_SCHEDULER_TEST_CLOCK), so 100 minutes take as long as 100 puts."""

from __future__ import annotations

import subprocess
import sys

import pytest

from tests.process.daemon import REPO, child_env
from tests.process.schedulers import (
    MINUTE,
    START,
    SchedulerProcess,
    check_each_period_once,
    minute_id,
    schedule_file,
    two_schedulers_side_by_side,
)
from walqueue.client import Client


def tasks_of(daemon):
    with Client(daemon.socket_path) as client:
        return client.tasks()


def test_two_schedulers_side_by_side_put_each_of_100_periods_once(daemon, workdir):
    logs = two_schedulers_side_by_side(workdir, daemon.socket_path)
    check_each_period_once(tasks_of(daemon), logs)


def test_the_check_catches_a_scheduler_that_puts_random_ids(daemon, workdir):
    logs = two_schedulers_side_by_side(workdir, daemon.socket_path, variant="random_task_ids")
    tasks = tasks_of(daemon)
    assert len(tasks) == 2 * 100  # each period twice: what the key prevents
    with pytest.raises(AssertionError):
        check_each_period_once(tasks, logs)


def test_the_check_catches_schedulers_whose_identity_depends_on_their_clock(daemon, workdir):
    logs = two_schedulers_side_by_side(workdir, daemon.socket_path, variant="available_at_of_the_clock")
    with pytest.raises(AssertionError, match="conflict|available_at|tick@"):
        check_each_period_once(tasks_of(daemon), logs)


def test_a_scheduler_killed_and_restarted_catches_up_within_its_window(daemon, workdir):
    schedule = schedule_file(workdir, catch_up=3)
    first = SchedulerProcess(workdir, daemon.socket_path, schedule, start=START + 30, end=START + 5 * MINUTE + 30)
    try:
        first.wait_for_log(f"put: {minute_id(5)}")
    finally:
        assert first.kill() == -9
    # Restarted at 7:30: its window is 5, 6 and 7; 5 was put before the kill.
    second = SchedulerProcess(workdir, daemon.socket_path, schedule, start=START + 7 * MINUTE + 30,
                              end=START + 7 * MINUTE + 30)
    try:
        second.wait_for_log(f"put: {minute_id(7)}")
    finally:
        assert second.terminate() == 0, second.log()
    assert second.lines("already put: ") and minute_id(5) in second.lines("already put: ")[0]
    assert [minute_id(6) in line for line in second.lines("caught up: ")] == [True]
    assert second.lines("skipped: ") == []
    # Down again until 15:30: 13, 14 and 15 are put, 8 to 12 are skipped and logged.
    third = SchedulerProcess(workdir, daemon.socket_path, schedule, start=START + 15 * MINUTE + 30,
                             end=START + 15 * MINUTE + 30)
    try:
        third.wait_for_log(f"put: {minute_id(15)}")
    finally:
        assert third.terminate() == 0, third.log()
    (skipped,) = third.lines("skipped: ")
    assert (f"skipped: 5 period(s) of tick older than its window (catch_up = 3), never put: {minute_id(8)} … "
            f"{minute_id(12)} (the last one put before them: {minute_id(7)})") in skipped
    assert [task.task_id for task in tasks_of(daemon)] == [minute_id(m) for m in [*range(-2, 8), 13, 14, 15]]
    # walqueue-ctl schedule reads the last period put (the real clock is past 15:30).
    result = subprocess.run([sys.executable, "-m", "walqueue.ctl", "--socket", daemon.socket_path, "schedule",
                             str(schedule)], capture_output=True, text=True, env=child_env(), cwd=REPO,
                            timeout=60)
    assert result.returncode == 0, result.stderr
    assert "catch_up 3" in result.stdout and "  last  " in result.stdout


def test_sigint_stops_it_cleanly_and_a_broken_file_is_refused_before_connecting(daemon, workdir):
    schedule = schedule_file(workdir)
    process = SchedulerProcess(workdir, daemon.socket_path, schedule, start=START + 30, end=START + 30)
    try:
        process.wait_for_log(f"put: {minute_id(0)}")
        process.proc.send_signal(2)
        assert process.proc.wait(10) == 0
    finally:
        process.kill()
    assert "SIGINT: stopping" in process.log() and "stopped: 1 put" in process.log()
    broken = workdir / "broken.toml"
    broken.write_text('[[task]]\nname = "tick"\nevery = 60\nmax_attempts = "3"\n')
    refused = SchedulerProcess(workdir, daemon.socket_path, broken, start=START, end=START)
    assert refused.proc.wait(30) == 2
    assert "broken.toml:4: [[task]] 'tick': max_attempts must be an integer, not a string" in refused.log()
