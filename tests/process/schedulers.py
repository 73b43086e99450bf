"""walqueue-scheduler processes for tests: started with the test-only jumping clock, their log
read from a file, stopped by pid. Used against walqueued (tests/process) and PostgreSQL (tests/pg).

`two_schedulers_side_by_side(target, ...)` starts two schedulers on one queue,
lets them begin at the same moment (a start gate), runs them over 100 periods and returns what they logged; `check_each_period_once`
reads the queue afterwards and raises AssertionError unless each period is
there exactly once, with the identity a period must have, and nobody met a
conflict.
"""

from __future__ import annotations

import itertools
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

from tests.process.daemon import REPO, STOP_SECONDS, child_env, wait_until
from walqueue.schedule.periods import task_id

START = 1_796_220_000  # 2026-12-02T14:00:00Z, a multiple of 60
MINUTE = 60
PERIODS = 100
WAIT_SECONDS = 60.0
_numbers = itertools.count(1)
HANDLED = re.compile(r" (?:INFO (?:put|already put|caught up)|ERROR conflict): ")


def schedule_file(directory: Path, *, catch_up: int = 1, payload: str = '{ kind = "tick" }') -> Path:
    path = directory / f"schedule-{next(_numbers)}.toml"
    path.write_text(f'[[task]]\nname = "tick"\nevery = 60\ncatch_up = {catch_up}\npayload = {payload}\n')
    return path


def minute_id(minute: int) -> str:
    return task_id("tick", START + minute * MINUTE)


class SchedulerProcess:
    """One walqueue-scheduler on a JumpingClock from `start` to `end` (seconds since the epoch)."""

    def __init__(self, workdir: Path, target: str, schedule: Path, *, start: int, end: int,
                 args: tuple[str, ...] = (), variant: str | None = None, gate: Path | None = None) -> None:
        self.log_path = workdir / f"scheduler-{next(_numbers)}.log"
        env = child_env({"WALQUEUE_SCHEDULER_TEST_CLOCK": f"{start}:{end}"})
        if gate is not None:
            env["WALQUEUE_TEST_START_GATE"] = str(gate)
        if variant is not None:
            env["WALQUEUE_SCHEDULER_BROKEN"] = variant
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "tests.process.scheduler_proc", target, str(schedule), *args],
                stdin=subprocess.DEVNULL, stdout=log, stderr=log, env=env, cwd=REPO)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for_log(self, text: str, timeout: float = WAIT_SECONDS) -> None:
        def there() -> bool:
            if text in self.log():
                return True
            if self.proc.poll() is not None:
                raise AssertionError(f"walqueue-scheduler exited with {self.proc.returncode} before "
                                     f"logging {text!r}:\n{self.log()}")
            return False

        wait_until(there, timeout, f"{text!r} in the scheduler's log")

    def terminate(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"walqueue-scheduler ignored SIGTERM:\n{self.log()}") from None

    def kill(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(STOP_SECONDS)

    def lines(self, text: str) -> list[str]:
        return [line for line in self.log().splitlines() if text in line]

    def handled(self) -> int:
        """Periods it has put, found put, caught up or met a conflict for (one log line each)."""
        if self.proc.poll() is not None:
            raise AssertionError(f"walqueue-scheduler exited with {self.proc.returncode}:\n{self.log()}")
        return len(HANDLED.findall(self.log()))


def two_schedulers_side_by_side(workdir: Path, target: str, *, args: tuple[str, ...] = (),
                                variant: str | None = None) -> list[str]:
    """Two schedulers started at once over periods 0..99 (each puts 0 at its start, then each
    next one as its clock jumps there); both stopped by SIGTERM once they have reached 99.
    Returns their logs."""
    schedule = schedule_file(workdir)
    window = dict(start=START + 30, end=START + (PERIODS - 1) * MINUTE + 30)
    gate = workdir / f"gate-{next(_numbers)}"
    os.mkfifo(gate)
    # Held open for reading and writing, so the schedulers' opens do not block (tests/process/scheduler_proc.py).
    gate_fd = os.open(gate, os.O_RDWR)
    processes = [SchedulerProcess(workdir, target, schedule, args=args, variant=variant, gate=gate, **window)
                 for _ in range(2)]
    try:
        for process in processes:
            process.wait_for_log("gate: waiting")
        os.write(gate_fd, b"go")  # one byte each: both begin now
        for process in processes:
            wait_until(lambda process=process: process.handled() >= PERIODS, WAIT_SECONDS,
                       f"the scheduler to handle {PERIODS} periods; its log:\n{process.log()}")
        codes = [process.terminate() for process in processes]
    finally:
        os.close(gate_fd)
        for process in processes:
            process.kill()
    logs = [process.log() for process in processes]
    assert codes == [0, 0], logs
    for log in logs:
        assert "SIGTERM: stopping" in log and "stopped: " in log, log
    return logs


def check_each_period_once(tasks, logs: list[str]) -> None:
    """The queue holds each of the 100 periods exactly once, as the schedule says, and
    neither scheduler met a conflict."""
    ticks = sorted((task for task in tasks if task.task_id.startswith("tick@")), key=lambda task: task.task_id)
    assert [task.task_id for task in ticks] == [minute_id(minute) for minute in range(PERIODS)]
    for minute, task in enumerate(ticks):
        assert (task.key, task.available_at, task.max_attempts, task.payload) == (
            task.task_id, START + minute * MINUTE, 3, {"kind": "tick"}), task
    for log in logs:
        conflicts = [line for line in log.splitlines() if "conflict: " in line]
        assert conflicts == [], conflicts[:3]
