"""walqueue.schedule.Scheduler with an injected clock, on a real walqueue.Queue.

The key checks (two schedulers put each period once; a restart catches up
within its window and logs what it skipped; an outage skips nothing still
in its window) are functions that raise AssertionError, run against the
real scheduler and against each deliberately broken variant of
tests/scheduler_broken.py, which they must catch. Time never passes by
itself here: a ManualClock moves when the test says, a JumpingClock to the
end of each wait.
"""

from __future__ import annotations

import logging
import threading

import pytest

from tests import scheduler_broken
from walqueue import Queue
from walqueue.errors import Unavailable
from walqueue.schedule import JumpingClock, Scheduler, parse
from walqueue.schedule.periods import task_id

START = 1_796_220_000  # 2026-12-02T14:00:00Z, a multiple of 60
MINUTE = 60


class ManualClock:
    """Time moves only by set(); a wait returns at once (the tests call step())."""

    def __init__(self, now: float) -> None:
        self.time = now

    def now(self) -> float:
        return self.time

    def wait(self, event: threading.Event, seconds: float) -> bool:
        return event.is_set()


class EndingClock(JumpingClock):
    """A JumpingClock that stops the scheduler (sets the event it waits on) at its end."""

    def wait(self, event: threading.Event, seconds: float) -> bool:
        if self.now() + seconds > self.end:
            event.set()
            return True
        return super().wait(event, seconds)


class Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.levelname} {record.getMessage()}")

    def having(self, text: str) -> list[str]:
        return [line for line in self.lines if text in line]


def logger(name: str) -> tuple[logging.Logger, Lines]:
    log = logging.getLogger(f"tests.scheduler.{name}")
    log.propagate = False
    log.setLevel(logging.DEBUG)
    for handler in list(log.handlers):
        log.removeHandler(handler)
    lines = Lines()
    log.addHandler(lines)
    return log, lines


def schedule(text: str):
    return parse(text, "schedule.toml", now=START)


EVERY_MINUTE = '[[task]]\nname = "tick"\nevery = 60\npayload = { kind = "tick" }\n'


def ids_of(queue: Queue, name: str = "tick") -> list[str]:
    return [task.task_id for task in queue.tasks() if task.task_id.startswith(f"{name}@")]


def minute_ids(first: int, last: int, name: str = "tick") -> list[str]:
    return [task_id(name, START + minute * MINUTE) for minute in range(first, last + 1)]


# -- the key checks ---------------------------------------------------------------------


def check_two_schedulers_put_each_period_once(directory) -> None:
    """Two schedulers, their clocks 7 s apart (as two machines' are), over 100 periods."""
    entries = schedule(EVERY_MINUTE)
    with Queue(directory) as queue:
        clocks = [ManualClock(START + 30), ManualClock(START + 37)]
        logs = [logger("first"), logger("second")]
        schedulers = [Scheduler(queue, entries, clock=clock, logger=log)
                      for clock, (log, _) in zip(clocks, logs, strict=True)]
        for minute in range(100):
            for clock, scheduler in zip(clocks, schedulers, strict=True):
                clock.time = START + minute * MINUTE + (30 if clock is clocks[0] else 37)
                scheduler.step()
        assert ids_of(queue) == minute_ids(0, 99)
        for task in queue.tasks():
            assert task.available_at == START + minute_ids(0, 99).index(task.task_id) * MINUTE
            assert task.payload == {"kind": "tick"} and task.max_attempts == 3
        for scheduler, (_, lines) in zip(schedulers, logs, strict=True):
            assert scheduler.counts["conflicts"] == 0, lines.having("conflict")
            assert scheduler.counts["skipped"] == 0


def check_a_restart_catches_up_within_its_window(directory) -> Lines:
    """Down from minute 10 to minute 15 with catch_up = 3: 13, 14 and 15 are put, 11 and 12
    are logged as skipped."""
    entries = schedule(EVERY_MINUTE + "catch_up = 3\n")
    with Queue(directory) as queue:
        clock = ManualClock(START)
        first = Scheduler(queue, entries, clock=clock, logger=logger("before")[0])
        for minute in range(11):
            clock.time = START + minute * MINUTE + 1
            first.step()
        # The scheduler dies; a new one starts at 15:30 into the schedule.
        clock.time = START + 15 * MINUTE + 30
        log, lines = logger("after")
        second = Scheduler(queue, entries, clock=clock, logger=log)
        second.step()
        # At its start the first one put its window too: minutes -2 to 0.
        assert ids_of(queue) == minute_ids(-2, 10) + minute_ids(13, 15)
        assert all(task.available_at == START + (minute_ids(-2, 15).index(task.task_id) - 2) * MINUTE
                   for task in queue.tasks())
        assert lines.having("caught up") == [
            f"INFO caught up: {task_id('tick', START + 13 * MINUTE)}, 2 period(s) back, started 150 s ago",
            f"INFO caught up: {task_id('tick', START + 14 * MINUTE)}, 1 period(s) back, started 90 s ago"]
        assert lines.having("skipped:") == [
            f"WARNING skipped: 2 period(s) of tick older than its window (catch_up = 3), never put: "
            f"{task_id('tick', START + 11 * MINUTE)}, {task_id('tick', START + 12 * MINUTE)} "
            f"(the last one put before them: {task_id('tick', START + 10 * MINUTE)})"]
        assert second.counts["conflicts"] == 0
    return lines


class FlakyClient:
    """The queue, out of reach (Unavailable, nothing applied) while the clock is in [down, up)."""

    def __init__(self, queue: Queue, clock, down: int, up: int) -> None:
        self.queue, self.clock, self.down, self.up = queue, clock, down, up
        self.refused = 0

    def _reachable(self) -> None:
        if self.down <= self.clock.now() < self.up:
            self.refused += 1
            raise Unavailable("the test's outage")

    def put(self, *args, **kwargs):
        self._reachable()
        return self.queue.put(*args, **kwargs)

    def get(self, task_id):
        self._reachable()
        return self.queue.get(task_id)


def check_an_outage_skips_nothing_in_its_window(directory, outage_minutes: int = 3) -> Lines:
    """catch_up = 5; the queue is out of reach from 20:00 for `outage_minutes` minutes."""
    entries = schedule(EVERY_MINUTE + "catch_up = 5\n")
    with Queue(directory) as queue:
        clock = EndingClock(START + 1, START + 40 * MINUTE + 1)
        client = FlakyClient(queue, clock, START + 20 * MINUTE, START + (20 + outage_minutes) * MINUTE)
        log, lines = logger(f"outage{outage_minutes}")
        scheduler = Scheduler(client, entries, clock=clock, logger=log)
        scheduler.run()
        # The periods older than the window when the queue answers again: the retry comes
        # 18.5 s into the minute the outage ends (0.5 + 1 + 2 + 5 + 10 s, then every 30 s).
        lost = max(0, outage_minutes - 5 + 1)
        assert ids_of(queue) == minute_ids(-4, 19) + minute_ids(20 + lost, 40)
        assert scheduler.counts["skipped"] == lost
        assert client.refused > 0 and lines.having("unavailable")
    return lines


KEY_CHECKS = {
    "two schedulers": check_two_schedulers_put_each_period_once,
    "restart": check_a_restart_catches_up_within_its_window,
    "outage": check_an_outage_skips_nothing_in_its_window,
}
# Which key checks each broken variant must fail.
CAUGHT = {
    "random_task_ids": {"two schedulers", "restart", "outage"},
    "available_at_of_the_clock": {"two schedulers", "restart"},
    "no_catch_up": {"restart", "outage"},
    "gives_up_on_outage": {"outage"},
}


def test_every_variant_has_its_expectation():
    assert set(CAUGHT) == set(scheduler_broken.VARIANTS)


@pytest.mark.parametrize("check", KEY_CHECKS)
def test_the_real_scheduler_passes_the_key_checks(tmp_path, check):
    KEY_CHECKS[check](tmp_path / "queue")


@pytest.mark.parametrize("variant, check", [(variant, check) for variant in sorted(CAUGHT)
                                            for check in KEY_CHECKS])
def test_each_broken_variant_fails_exactly_the_checks_expected(tmp_path, variant, check):
    with scheduler_broken.active(variant):
        try:
            KEY_CHECKS[check](tmp_path / "queue")
        except AssertionError:
            caught = True
        else:
            caught = False
    assert caught == (check in CAUGHT[variant])


# -- more behaviour -----------------------------------------------------------------------


def test_two_schedulers_put_each_period_once(tmp_path):
    check_two_schedulers_put_each_period_once(tmp_path / "queue")


def test_a_restarted_scheduler_catches_up_its_window_and_logs_what_it_skipped(tmp_path):
    check_a_restart_catches_up_within_its_window(tmp_path / "queue")


def test_an_outage_shorter_than_the_window_skips_nothing(tmp_path):
    lines = check_an_outage_skips_nothing_in_its_window(tmp_path / "queue", outage_minutes=3)
    assert lines.having("answers again")
    assert not lines.having("skipped:")


def test_an_outage_longer_than_the_window_skips_only_what_left_it_and_says_so(tmp_path):
    lines = check_an_outage_skips_nothing_in_its_window(tmp_path / "queue", outage_minutes=8)
    # Each period is logged as it leaves the window, while the outage goes on.
    assert lines.having("skipped:") == [
        f"WARNING skipped: 1 period(s) of tick older than its window (catch_up = 5), never put: "
        f"{task_id('tick', START + minute * MINUTE)} (the last one put before them: "
        f"{task_id('tick', START + 19 * MINUTE)})" for minute in (20, 21, 22, 23)]


def test_the_back_off_grows_and_resets_when_the_queue_answers(tmp_path):
    lines = check_an_outage_skips_nothing_in_its_window(tmp_path / "queue", outage_minutes=3)
    pauses = [line.split("trying again in ")[1].split(" s")[0] for line in lines.having("trying again")]
    assert pauses[:6] == ["0.5", "1", "2", "5", "10", "30"]
    assert set(pauses[6:]) <= {"30"}


def test_a_changed_payload_is_a_conflict_logged_and_the_scheduler_goes_on(tmp_path):
    with Queue(tmp_path / "queue") as queue:
        clock = ManualClock(START + 5)
        Scheduler(queue, schedule(EVERY_MINUTE), clock=clock).step()
        changed = schedule(EVERY_MINUTE.replace('"tick" }', '"tock" }'))
        log, lines = logger("conflict")
        scheduler = Scheduler(queue, changed, clock=clock, logger=log)
        scheduler.step()
        clock.time += MINUTE
        scheduler.step()
        assert scheduler.counts["conflicts"] == 1
        (conflict,) = lines.having("conflict")
        assert conflict.startswith(f"ERROR conflict: {task_id('tick', START)} was put before with another "
                                   f"identity")
        assert queue.get(task_id("tick", START)).payload == {"kind": "tick"}  # left as it is
        assert queue.get(task_id("tick", START + MINUTE)).payload == {"kind": "tock"}


def test_a_period_already_put_is_not_resurrected_and_a_new_entry_says_it_is_new(tmp_path):
    with Queue(tmp_path / "queue") as queue:
        clock = ManualClock(START + 5)
        log, lines = logger("new")
        Scheduler(queue, schedule(EVERY_MINUTE), clock=clock, logger=log).step()
        assert lines.having("none of the 100 periods before its window (catch_up = 1) was put")
        (lease,) = queue.reserve("w", now=START + 6, lease_seconds=30)
        queue.ack(lease, now=START + 7)
        log, lines = logger("again")
        again = Scheduler(queue, schedule(EVERY_MINUTE), clock=clock, logger=log)
        again.step()
        assert queue.get(task_id("tick", START)).status == "completed"
        assert lines.having("already put") == [f"INFO already put: {task_id('tick', START)} (completed), "
                                               f"as this file says"]
        assert not lines.having("skipped:")


def test_a_daily_job_puts_one_task_a_day_across_both_dst_changes(tmp_path):
    entries = schedule('[[task]]\nname = "nightly"\ncron = "30 2 * * *"\ntimezone = "Europe/Berlin"\n'
                       '[[task]]\nname = "hourly"\ncron = "0 * * * *"\ntimezone = "Europe/Berlin"\n')
    begin = 1_774_656_000  # 2026-03-28T00:00:00Z
    with Queue(tmp_path / "queue") as queue:
        clock = EndingClock(begin, begin + 2 * 86400)
        Scheduler(queue, entries, clock=clock, logger=logger("spring")[0]).run()
        assert ids_of(queue, "nightly") == ["nightly@2026-03-27T01:30:00Z", "nightly@2026-03-28T01:30:00Z",
                                            "nightly@2026-03-29T01:00:00Z"]
        hourly = ids_of(queue, "hourly")
        assert len(hourly) == 49 and len(set(hourly)) == 49  # the previous hour's and 48 real hours


class WaitingClock(JumpingClock):
    """A frozen JumpingClock that says when run() first waits, its first round done."""

    def __init__(self, at: float) -> None:
        super().__init__(at, at)
        self.waiting = threading.Event()

    def wait(self, event: threading.Event, seconds: float) -> bool:
        self.waiting.set()
        return super().wait(event, seconds)


def test_stop_from_another_thread_ends_run(tmp_path):
    with Queue(tmp_path / "queue") as queue:
        clock = WaitingClock(START)  # frozen: run() waits until stopped
        scheduler = Scheduler(queue, schedule(EVERY_MINUTE), clock=clock, logger=logger("stop")[0])
        thread = threading.Thread(target=scheduler.run)
        thread.start()
        # Stopped once it waits: a stop before its first round (the thread may start late)
        # rightly puts nothing, and CI once saw that.
        assert clock.waiting.wait(10), "run() never waited"
        scheduler.stop()
        thread.join(10)
        assert not thread.is_alive()
        assert scheduler.stopped and ids_of(queue) == [task_id("tick", START)]


def test_entries_with_one_name_are_refused():
    (entry,) = schedule(EVERY_MINUTE)
    with pytest.raises(ValueError, match="same name"):
        Scheduler(None, [entry, entry])
