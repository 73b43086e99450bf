"""walqueue.worker.policy's decisions, on both Workers (threads and asyncio), over an
in-memory client that is neither walqueue.client nor walqueue.pg: the Workers need only
the backend contract. No daemon, no sleeping: time is a clock that jumps to the end of
every timed wait (tests/unit/clocks.py)."""

import asyncio
import logging
import sys

import pytest

from walqueue import InvalidRequest
from walqueue.worker import Worker
from walqueue.worker.aio import Worker as AsyncWorker

from .clocks import AsyncManualClock, ManualClock
from .memory_client import AsyncMemoryClient, MemoryClient, MemoryQueue

TEST_SECONDS = 20


class Shell:
    """One of the two Workers, built and run the same way by the tests."""

    def __init__(self, name):
        self.name = name
        self.clock = ManualClock(jump=True) if name == "threads" else AsyncManualClock(jump=True)
        self.queue = MemoryQueue(self.clock)

    def worker(self, handler, **options):
        # No toucher: on a jumping clock its interval would pass at every wait.
        options = {"wait": 0, "touch": False, "clock": self.clock, **options}
        if self.name == "threads":
            return Worker(MemoryClient(self.queue), "w", handler, **options)

        async def call(lease):  # the same handler, awaited
            return handler(lease)

        return AsyncWorker(AsyncMemoryClient(self.queue), "w", call, **options)

    def run(self, worker, **options):
        if self.name == "threads":
            return worker.run(**options)
        return asyncio.run(asyncio.wait_for(worker.run(**options), TEST_SECONDS))

    def finishes(self):
        """The calls that end or extend leases, in order."""
        return [call[:2] for call in self.queue.calls if call[0] in ("ack", "ack_and_reserve", "release", "touch")]


@pytest.fixture(params=["threads", "asyncio"])
def shell(request):
    return Shell(request.param)


def fail_on(*task_ids):
    def handler(lease):
        if lease.task_id in task_ids:
            raise RuntimeError(f"{lease.task_id} failed on purpose")

    return handler


def test_a_success_is_acked_and_a_failure_released_with_backoff(shell):
    shell.queue.put("a-ok")
    shell.queue.put("b-bad")
    worker = shell.worker(fail_on("b-bad"), backoff=lambda attempts: 7)
    assert shell.run(worker, max_tasks=2) == 2
    # The ack of "a-ok" reserves "b-bad" in the same call; "b-bad" is released, then looked at.
    assert shell.finishes() == [("ack_and_reserve", "a-ok"), ("release", "b-bad")]
    assert ("release", "b-bad", 7) in shell.queue.calls and ("get", "b-bad") in shell.queue.calls
    assert (worker.processed, worker.failed) == (1, 1)
    assert shell.queue.view("b-bad").available_at == int(shell.clock.now()) + 7


def test_the_last_task_is_acked_alone_and_the_others_reserve_their_successor(shell):
    for task_id in "abc":
        shell.queue.put(task_id)
    assert shell.run(shell.worker(fail_on()), max_tasks=3) == 3
    assert shell.finishes() == [("ack_and_reserve", "a"), ("ack_and_reserve", "b"), ("ack", "c")]


def test_a_lost_ack_counts_as_done_when_the_retry_finds_the_task_completed_at_its_generation(shell, caplog):
    shell.queue.put("t")
    shell.queue.faults["ack"] = ["lost"]  # applied, answer lost
    worker = shell.worker(fail_on())
    with caplog.at_level(logging.INFO, "walqueue.worker"):
        assert shell.run(worker, max_tasks=1) == 1
    assert shell.finishes() == [("ack", "t"), ("ack", "t")]  # no third try
    assert "task t generation 1 attempt 1: done in" in caplog.text and "lost" not in caplog.text


def test_a_lost_ack_and_reserve_is_retried_as_a_plain_ack(shell):
    for task_id in "abc":
        shell.queue.put(task_id)
    shell.queue.faults["ack_and_reserve"] = ["lost"]  # it acked "a" and leased "b", then the answer was lost
    assert shell.run(shell.worker(fail_on()), max_tasks=2) == 2
    assert shell.finishes() == [("ack_and_reserve", "a"), ("ack", "a"), ("ack", "c")]
    assert shell.queue.view("a").status == "completed"
    # "b" was leased by the lost answer: it is due again only when that lease expires.
    assert shell.queue.view("b").status == "leased"


def test_an_ack_that_never_arrived_is_sent_again(shell):
    shell.queue.put("t")
    shell.queue.faults["ack"] = ["down", "down"]
    assert shell.run(shell.worker(fail_on()), max_tasks=1) == 1
    assert shell.finishes() == [("ack", "t")] * 3
    assert shell.queue.view("t").status == "completed"


def test_a_retried_ack_that_finds_the_lease_expired_is_not_taken_for_success(shell, caplog):
    shell.queue.put("t")

    def expire_then_lose(lease):
        shell.clock.advance(60)  # the lease (30 s) runs out while the handler runs
        shell.queue.faults["ack"] = ["down"]

    with caplog.at_level(logging.INFO, "walqueue.worker"):
        shell.run(shell.worker(expire_then_lose, touch=False), max_tasks=1)
    # The retry's StaleLease says "ready at generation 1": the same generation, but not completed.
    assert shell.queue.view("t").status == "ready"
    assert "the lease was lost before the ack (the task is ready at generation 1)" in caplog.text
    assert "done in" not in caplog.text


def test_a_stale_lease_on_the_first_ack_is_not_taken_for_success(shell, caplog):
    shell.queue.put("t")

    def lose_the_lease(lease):
        shell.clock.advance(60)  # the lease expires while the handler runs ...
        shell.queue.reserve("other", 30, 1)  # ... and another worker leases the task (generation 2)

    with caplog.at_level(logging.INFO, "walqueue.worker"):
        shell.run(shell.worker(lose_the_lease), max_tasks=1)
    assert shell.finishes() == [("ack", "t")]  # not sent again
    assert "lost before the ack (the task is leased at generation 2)" in caplog.text
    assert shell.queue.view("t").worker == "other"


def test_a_retried_release_that_finds_the_task_ready_at_its_generation_is_done(shell):
    shell.queue.put("t")
    shell.queue.faults["release"] = ["lost"]
    worker = shell.worker(fail_on("t"))
    shell.run(worker, max_tasks=1)
    assert shell.finishes() == [("release", "t"), ("release", "t")]
    assert shell.queue.view("t").status == "ready"


def test_a_stale_ack_and_reserve_reserves_nothing_and_the_worker_reserves_again(shell):
    shell.queue.put("a")
    shell.queue.put("b")

    def expire(lease):
        if lease.task_id == "a":
            shell.clock.advance(60)

    shell.run(shell.worker(expire, touch=False), max_tasks=2)
    calls = [call[:2] for call in shell.queue.calls if call[0] != "get"]
    assert calls[:3] == [("reserve", "w"), ("ack_and_reserve", "a"), ("reserve", "w")]


def test_a_task_that_ran_out_of_attempts_is_logged_as_dead_with_the_handlers_exception(shell, caplog):
    shell.queue.put("last-try", max_attempts=1)
    with caplog.at_level(logging.INFO, "walqueue.worker"):
        shell.run(shell.worker(fail_on("last-try")), max_tasks=1)
    (record,) = [r for r in caplog.records if "last-try" in r.getMessage()]
    message = record.getMessage()
    assert "task last-try generation 1 attempt 1: the handler raised RuntimeError" in message
    assert "dead after 1 of 1 attempts" in message and "due again" not in message
    assert record.exc_info is not None and "failed on purpose" in str(record.exc_info[1])


def test_a_task_with_attempts_left_is_logged_as_due_again(shell, caplog):
    shell.queue.put("flaky", max_attempts=3)
    with caplog.at_level(logging.INFO, "walqueue.worker"):
        shell.run(shell.worker(fail_on("flaky"), backoff=lambda attempts: 4), max_tasks=1)
    assert "due again in 4 s (attempt 1 of 3)" in caplog.text


def test_a_handlers_multiline_message_stays_on_the_outcome_line(shell, caplog):
    shell.queue.put("t")

    def handler(lease):
        raise ValueError("first line\nsecond line")

    with caplog.at_level(logging.INFO, "walqueue.worker"):
        shell.run(shell.worker(handler), max_tasks=1)
    (record,) = [r for r in caplog.records if "handler raised" in r.getMessage()]
    assert "ValueError: first line\\x0asecond line; due again" in record.getMessage()


def test_task_ids_in_log_lines_are_escaped(shell, caplog):
    forged = "a\n2026-12-01 INFO task admin generation 1: done\u202e"
    shell.queue.put(forged)
    with caplog.at_level(logging.INFO, "walqueue.worker"):
        shell.run(shell.worker(fail_on()), max_tasks=1)
    (line,) = [r.getMessage() for r in caplog.records if "done in" in r.getMessage()]
    assert "\n" not in line and "\u202e" not in line and "a\\x0a2026-12-01" in line and "\\u202e" in line


def test_stop_before_run_takes_no_task(shell):
    shell.queue.put("t")
    worker = shell.worker(fail_on())
    worker.stop()
    assert shell.run(worker) == 0
    assert shell.queue.calls == []


@pytest.mark.parametrize("option, value, named", [
    ("concurrency", 0, "concurrency must be an int >= 1, got 0"),
    ("lease_seconds", 1.5, "lease_seconds must be an int >= 1"),
    ("wait", -1, "wait must be a number of seconds >= 0"),
    ("stop_timeout_seconds", float("nan"), "stop_timeout_seconds must be a number of seconds"),
])
def test_a_bad_option_is_refused_with_its_name(shell, option, value, named):
    with pytest.raises(InvalidRequest, match=named):
        shell.worker(fail_on(), **{option: value})


def run_to_the_end(shell, worker, **options):
    """shell.run, but a SystemExit or KeyboardInterrupt out of run() fails the test (not the session)."""
    try:
        return shell.run(worker, **options)
    except (SystemExit, KeyboardInterrupt) as exc:
        pytest.fail(f"run() ended with {exc!r}: the handler's exit left the Worker")


@pytest.mark.parametrize("status", [3, 2, 0, None])
def test_a_handlers_sys_exit_is_its_tasks_failure_and_the_worker_goes_on(shell, caplog, status):
    """sys.exit(3) in a handler must not become walqueue-worker's exit 3 ("unreachable"), nor
    sys.exit(2) its usage error: it fails the task, which is released with backoff."""
    shell.queue.put("a-exits", max_attempts=3)
    shell.queue.put("b-ok")

    def handler(lease):
        if lease.task_id == "a-exits":
            sys.exit(status)

    worker = shell.worker(handler, backoff=lambda attempts: 7)
    with caplog.at_level(logging.INFO, "walqueue.worker"):
        assert run_to_the_end(shell, worker, max_tasks=2) == 2
    assert ("release", "a-exits", 7) in shell.queue.calls and ("ack", "b-ok") in shell.finishes()
    assert (worker.processed, worker.failed) == (1, 1)
    assert shell.queue.view("a-exits").status == "ready"
    (record,) = [r for r in caplog.records if "a-exits" in r.getMessage()]
    assert f"the handler raised SystemExit: {status}" in record.getMessage()
    assert "due again in 7 s (attempt 1 of 3)" in record.getMessage()


def test_a_keyboard_interrupt_from_a_handler_thread_is_its_tasks_failure():
    """In the thread Worker the handler runs in a slot thread, where Python never raises a
    Ctrl-C (signals go to the main thread): a KeyboardInterrupt there is the handler's own."""
    shell = Shell("threads")
    shell.queue.put("a-interrupts")
    shell.queue.put("b-ok")

    def handler(lease):
        if lease.task_id == "a-interrupts":
            raise KeyboardInterrupt

    worker = shell.worker(handler, backoff=lambda attempts: 7)
    assert run_to_the_end(shell, worker, max_tasks=2) == 2
    assert ("release", "a-interrupts", 7) in shell.queue.calls and (worker.processed, worker.failed) == (1, 1)


def test_a_keyboard_interrupt_in_an_asyncio_handler_stops_the_worker_as_a_ctrl_c_does():
    """The asyncio Worker's handlers run on the event loop's thread, normally the main one,
    where Ctrl-C arrives as KeyboardInterrupt: it ends run() and is not taken for a failure."""
    shell = Shell("asyncio")
    shell.queue.put("a-interrupts")
    shell.queue.put("b-ok")

    def handler(lease):
        if lease.task_id == "a-interrupts":
            raise KeyboardInterrupt

    worker = shell.worker(handler)
    with pytest.raises(KeyboardInterrupt):
        shell.run(worker, max_tasks=2)
    assert worker.failed == 0 and shell.queue.view("b-ok").status == "ready"
    assert not any(call[0] == "release" for call in shell.queue.calls)  # its lease is left to expire
