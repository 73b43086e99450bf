"""walqueue.worker.Worker's threads: the toucher, concurrency, the one waiting reserve, the
stop deadline; over the in-memory client, on a clock that moves only when the test says.
The policy's decisions are in test_worker_policy.py, for both Workers."""

import signal
import sys
import threading
import time

import pytest

from walqueue import InvalidRequest
from walqueue.client import Client
from walqueue.worker import Worker, exponential_backoff

from .clocks import REAL_SECONDS, ManualClock
from .memory_client import MemoryClient, MemoryQueue
from .worker_logs import LogWaiter


class TouchSignallingClient(MemoryClient):
    def __init__(self, queue):
        super().__init__(queue)
        self.touched = threading.Event()

    def touch(self, lease, *, lease_seconds):
        touched = super().touch(lease, lease_seconds=lease_seconds)
        self.touched.set()
        return touched


def in_thread(function):
    """Run ``function`` in a thread; returns (thread, outcome dict with "value" or "error")."""
    outcome = {}

    def target():
        try:
            outcome["value"] = function()
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=target, daemon=True)
    thread.start()
    return thread, outcome


def test_backoff_doubles_from_one_second_and_is_capped():
    assert [exponential_backoff(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 8]
    assert exponential_backoff(50) == 300


def test_the_toucher_extends_a_long_handlers_lease_each_interval_and_stops_before_the_ack():
    clock = ManualClock()
    queue = MemoryQueue(clock)
    queue.put("a-slow")
    queue.put("b-fast")
    client = TouchSignallingClient(queue)
    threads_seen = []

    def handler(lease):
        threads_seen.append(threading.current_thread())
        if lease.task_id == "a-slow":
            assert client.touched.wait(REAL_SECONDS)

    started = threading.active_count()
    worker = Worker(client, "w", handler, lease_seconds=3, wait=0, clock=clock)
    runner, outcome = in_thread(lambda: worker.run(max_tasks=2))
    # The interval is max(1, 3 / 3) = 1 s after the lease was taken in hand.
    deadline = clock.advance_to_next_deadline()
    runner.join(REAL_SECONDS)
    assert outcome == {"value": 2}
    calls = [call[:2] for call in queue.calls]
    assert ("touch", "a-slow") in calls and ("touch", "b-fast") not in calls
    assert calls.index(("touch", "a-slow")) < calls.index(("ack_and_reserve", "a-slow"))
    assert queue.tasks["b-fast"]["status"] == "completed"
    assert deadline == pytest.approx(1001.0)
    assert threads_seen[0] is threads_seen[1]  # one slot thread for both tasks, not one per task
    assert threading.active_count() == started  # and every thread is gone after run()


def test_n_handlers_are_in_hand_at_once_each_in_its_own_thread():
    clock = ManualClock(jump=True)
    queue = MemoryQueue(clock)
    for number in range(4):
        queue.put(f"t{number}")
    all_in_hand = threading.Barrier(4, timeout=REAL_SECONDS)  # broken unless four run at once
    names = set()

    def handler(lease):
        names.add(threading.current_thread().name)
        all_in_hand.wait()

    worker = Worker(MemoryClient(queue), "w", handler, wait=0, concurrency=4, touch=False, clock=clock)
    assert worker.run(max_tasks=4) == 4
    assert worker.processed == 4 and len(names) == 4
    assert all(task["status"] == "completed" for task in queue.tasks.values())


class BlockingReserveClient(MemoryClient):
    """A reserve with wait > 0 blocks until ``wake`` is set; counts the ones in flight at once."""

    def __init__(self, queue):
        super().__init__(queue)
        self.wake = threading.Event()
        self.in_flight = 0
        self.most_in_flight = 0
        self.first_waiting = threading.Event()
        self._lock = threading.Lock()

    def reserve(self, worker, *, lease_seconds=30, limit=1, wait=0):
        with self._lock:
            self.in_flight += 1
            self.most_in_flight = max(self.most_in_flight, self.in_flight)
        self.first_waiting.set()
        try:
            assert self.wake.wait(REAL_SECONDS)
            return super().reserve(worker, lease_seconds=lease_seconds, limit=limit, wait=wait)
        finally:
            with self._lock:
                self.in_flight -= 1


def test_idle_slots_take_turns_so_only_one_reserve_waits_in_the_service():
    clock = ManualClock()
    client = BlockingReserveClient(MemoryQueue(clock))
    worker = Worker(client, "w", lambda lease: None, wait=30, concurrency=3, touch=False, clock=clock)
    runner, outcome = in_thread(worker.run)
    assert client.first_waiting.wait(REAL_SECONDS)
    clock.wait_for_waiting(3)  # the two other slots wait for the turn, the supervisor for the slots
    assert client.in_flight == 1
    worker.stop()
    client.wake.set()
    runner.join(REAL_SECONDS)
    assert outcome == {"value": 0} and client.most_in_flight == 1


def test_the_turns_holder_reserves_for_the_slots_waiting_behind_it():
    clock = ManualClock()
    queue = MemoryQueue(clock)
    client = BlockingReserveClient(queue)
    worker = Worker(client, "w", lambda lease: None, wait=30, concurrency=4, touch=False, clock=clock)
    runner, outcome = in_thread(lambda: worker.run(max_tasks=4))
    assert client.first_waiting.wait(REAL_SECONDS)
    clock.wait_for_waiting(4)  # three slots behind the turn, and the supervisor
    for number in range(4):
        queue.put(f"t{number}")
    client.wake.set()
    runner.join(REAL_SECONDS)
    assert outcome == {"value": 4}
    # However many slots waited when the first reserve was sent, the next one asks for
    # exactly the slots still without a task: never one reserve per slot.
    limits = [call[3] for call in queue.calls if call[0] == "reserve"]
    assert sum(limits) == 4 and len(limits) <= 2, limits
    assert all(task["status"] == "completed" for task in queue.tasks.values())


def test_a_task_not_done_by_the_stop_deadline_is_released_and_run_returns():
    clock = ManualClock()
    queue = MemoryQueue(clock)
    queue.put("hung")
    in_hand, unblock = threading.Event(), threading.Event()

    def handler(lease):
        in_hand.set()
        assert unblock.wait(REAL_SECONDS)

    worker = Worker(MemoryClient(queue), "w", handler, wait=0, touch=False, stop_timeout_seconds=10, clock=clock)
    with LogWaiter() as logs:
        runner, outcome = in_thread(worker.run)
        assert in_hand.wait(REAL_SECONDS)
        worker.stop()
        assert clock.advance_to_next_deadline() == pytest.approx(1010.0)
        runner.join(REAL_SECONDS)
        assert outcome == {"value": 1}
        assert queue.tasks["hung"]["status"] == "ready"  # released, due again at once
        assert "task hung generation 1: not done 10 s after stop(); released" in logs.messages
        unblock.set()  # the handler returns at last: it finds its lease released and finishes nothing
        logs.wait_for("returned after the stop deadline")
    assert [call[0] for call in queue.calls] == ["reserve", "release"]


def test_stop_lets_the_task_in_hand_finish_and_takes_no_other():
    clock = ManualClock()  # not jumping: the 60 s stop deadline must not pass
    queue = MemoryQueue(clock)
    queue.put("a")
    queue.put("b")
    in_hand, unblock = threading.Event(), threading.Event()

    def handler(lease):
        in_hand.set()
        assert unblock.wait(REAL_SECONDS)

    worker = Worker(MemoryClient(queue), "w", handler, wait=0, touch=False, stop_timeout_seconds=60, clock=clock)
    runner, outcome = in_thread(worker.run)
    assert in_hand.wait(REAL_SECONDS)
    worker.stop()
    unblock.set()
    runner.join(REAL_SECONDS)
    assert outcome == {"value": 1}
    assert (queue.tasks["a"]["status"], queue.tasks["b"]["status"]) == ("completed", "ready")


def test_a_coroutine_function_is_refused_as_a_thread_workers_handler():
    async def handler(lease):
        pass

    with pytest.raises(InvalidRequest, match="coroutine function: run it on walqueue.aio.Worker"):
        Worker(MemoryClient(MemoryQueue(ManualClock())), "w", handler)


def test_a_handler_returning_an_awaitable_fails_instead_of_being_acked(caplog):
    clock = ManualClock(jump=True)
    queue = MemoryQueue(clock)
    queue.put("t")

    async def work():
        pass

    worker = Worker(MemoryClient(queue), "w", lambda lease: work(), wait=0, clock=clock)
    worker.run(max_tasks=1)
    assert worker.failed == 1 and queue.tasks["t"]["status"] == "ready"
    assert "returned an awaitable" in caplog.text


def test_a_path_means_a_daemon_client_named_after_the_worker():
    worker = Worker("/nonexistent/walqueued.sock", "mailer-1", lambda lease: None)
    assert isinstance(worker.client, Client) and worker.client.name == "mailer-1"


def test_a_signal_the_kernel_gave_a_handlers_thread_still_stops_run():
    # Python runs signal handlers in the main thread; a signal delivered to another thread (here
    # sent to the handler's own) waited for run()'s untimed join, which only stop() ends: a
    # SIGTERM that walqueue-worker never acted on (tests/process/test_worker_process.py once).
    queue = MemoryQueue(ManualClock())
    queue.put("a")
    handled_in_time, stopped = [], threading.Event()

    def handler(lease):
        # Sent once the main thread waits in run()'s join (a pause could end before it got there,
        # and the signal would then find it running, and prove nothing).
        deadline = time.monotonic() + REAL_SECONDS / 4
        while not main_thread_joins_in_run():
            assert time.monotonic() < deadline, "the main thread never reached run()'s join"
            time.sleep(0.01)
        signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
        # Whether the main thread ran the Python handler while this one still waited: an order,
        # not a time (an untimed join returns only once this handler has returned).
        handled_in_time.append(stopped.wait(REAL_SECONDS / 4))

    def on_signal(signal_number, frame):
        worker.stop()
        stopped.set()

    worker = Worker(MemoryClient(queue), "w", handler, wait=0, touch=False)
    previous = signal.signal(signal.SIGUSR1, on_signal)
    rescue = threading.Timer(REAL_SECONDS / 2, worker.stop)   # bounds run() if the handler never runs
    rescue.start()
    try:
        worker.run()   # in the main thread, where Python runs signal handlers
    finally:
        rescue.cancel()
        signal.signal(signal.SIGUSR1, previous)
    assert handled_in_time == [True]


def main_thread_joins_in_run() -> bool:
    """True while the main thread is in a Thread.join that Worker.run called."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    while frame is not None and frame.f_back is not None and frame.f_back.f_code is not Worker.run.__code__:
        frame = frame.f_back
    return frame is not None and frame.f_code is threading.Thread.join.__code__


@pytest.fixture
def no_logging_configured(monkeypatch):
    """Makes the program one that configured no logging, when called in the test's body:
    no handler on the root logger or walqueue.worker (pytest adds its capture handlers to the
    root for the call phase, after fixtures). Everything is put back afterwards."""
    import logging

    from walqueue.worker.policy import log

    def configure_none():
        monkeypatch.setattr(logging.getLogger(), "handlers", [])
        monkeypatch.setattr(log, "handlers", [])
        monkeypatch.setattr(log, "level", logging.NOTSET)
        log.manager._clear_cache()
        return log

    yield configure_none
    log.manager._clear_cache()


def run_one_task(name):
    clock = ManualClock(jump=True)
    queue = MemoryQueue(clock)
    queue.put(name)
    Worker(MemoryClient(queue), "w", lambda lease: None, wait=0, touch=False, clock=clock).run(max_tasks=1)


def test_a_worker_in_a_program_without_logging_logs_its_tasks_on_stderr(no_logging_configured, capsys):
    """Issue 23: a plain script's Worker logged nothing for its tasks (only warnings reached stderr)."""
    log = no_logging_configured()
    run_one_task("email-1")
    run_one_task("email-2")
    lines = capsys.readouterr().err.splitlines()
    assert [line.split(" walqueue.worker INFO ", 1)[1] for line in lines if "done in" in line] == [
        line.split(" walqueue.worker INFO ", 1)[1] for line in lines]  # nothing but the task lines
    assert [line.split(": done in")[0].split("INFO ")[1] for line in lines] == [
        "task email-1 generation 1 attempt 1", "task email-2 generation 1 attempt 1"]
    assert len(log.handlers) == 1  # one handler, however many runs


def test_a_program_that_configures_logging_gets_each_line_once(no_logging_configured, capsys):
    import logging

    log = no_logging_configured()
    run_one_task("before")  # the Worker's default handler is in place now
    root = logging.StreamHandler()  # the program configures logging after all (sys.stderr: capsys)
    root.setFormatter(logging.Formatter("ROOT %(message)s"))
    logging.getLogger().handlers.append(root)
    logging.getLogger().setLevel(logging.INFO)
    try:
        run_one_task("after")
    finally:
        logging.getLogger().handlers.remove(root)
        logging.getLogger().setLevel(logging.WARNING)
    after = [line for line in capsys.readouterr().err.splitlines() if "task after" in line]
    assert after == ["ROOT task after generation 1 attempt 1: " + after[0].split(": ", 1)[1]]
    assert log.handlers == []  # it stepped aside


def test_a_reserve_outage_is_one_warning_and_one_all_clear_however_many_retries():
    """Issue 23: a restart under a worker logged a warning per retry (20 in 8 s)."""
    clock = ManualClock(jump=True)
    queue = MemoryQueue(clock)
    queue.put("after")
    queue.faults["reserve"] = ["down"] * 5
    with LogWaiter() as logs:
        Worker(MemoryClient(queue), "w", lambda lease: None, wait=0, touch=False, clock=clock).run(max_tasks=1)
    failed = [m for m in logs.messages if "reserve failed," in m]
    assert len(failed) == 1 and "logged again when it works" in failed[0], logs.messages
    assert [m for m in logs.messages if "works again" in m] == [
        "worker w: reserve works again after 5 failed attempt(s) over 5 s"]
    assert sum("failed again" in m for m in logs.messages) == 4  # the retries: DEBUG
    assert queue.tasks["after"]["status"] == "completed"
