"""walqueue-worker against a real walqueued: it processes tasks with N handlers at once,
finishes the task in hand on SIGTERM, releases a hung task at --stop-timeout, and exits 0.
Every process is stopped by pid; every wait is bounded."""

import os
import select
import signal
import subprocess
import sys
import threading

import pytest

from walqueue.client import Client

from .daemon import REPO, STOP_SECONDS, child_env

EXIT_SECONDS = 30.0
HANDLERS = "tests.process.worker_handlers"


class WorkerProcess:
    """``python -m walqueue.worker.cli ARGS``, its stderr read line by line as it comes."""

    def __init__(self, directory, *args):
        self.lines = []
        self._changed = threading.Condition()
        self.proc = subprocess.Popen([sys.executable, "-m", "walqueue.worker.cli", *map(str, args)],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     env=child_env({"WQ_TEST_DIR": str(directory)}), cwd=REPO, text=True)
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self):
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line.rstrip("\n"))
                self._changed.notify_all()

    def log(self):
        with self._changed:
            return "\n".join(self.lines)

    def wait_for_line(self, text, timeout=EXIT_SECONDS):
        with self._changed:
            if not self._changed.wait_for(lambda: any(text in line for line in self.lines), timeout):
                raise AssertionError(f"no {text!r} from walqueue-worker in {timeout} s; log:\n{self.log()}")

    def exit_code(self, timeout=EXIT_SECONDS):
        try:
            code = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            raise AssertionError(f"walqueue-worker still running after {timeout} s; log:\n{self.log()}") from None
        self._reader.join(STOP_SECONDS)
        return code

    def cleanup(self):
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(STOP_SECONDS)
        self._reader.join(STOP_SECONDS)


@pytest.fixture
def start_worker(workdir):
    started = []

    def start(*args):
        process = WorkerProcess(workdir, *args)
        started.append(process)
        return process

    yield start
    for process in started:
        process.cleanup()
        print(f"--- walqueue-worker {process.proc.args[3:]} ---\n{process.log()}")


@pytest.fixture
def started_fifo(workdir):
    """The reading end of the handlers' ``started`` FIFO; ``next_task()`` waits for a line."""
    os.mkfifo(workdir / "started")
    os.mkfifo(workdir / "go")
    fd = os.open(workdir / "started", os.O_RDONLY | os.O_NONBLOCK)

    class Started:
        def next_task(self, timeout=EXIT_SECONDS):
            poller = select.poll()
            poller.register(fd, select.POLLIN)
            assert poller.poll(timeout * 1000), f"no handler started within {timeout} s"
            return os.read(fd, 4096).decode().strip()

    yield Started()
    os.close(fd)


def let_go(workdir):
    """Let the blocked ``blocking`` handler return: open ``go`` for writing and close it."""
    # A blocking open returns once the handler has opened it for reading.
    opener = threading.Thread(target=lambda: os.close(os.open(workdir / "go", os.O_WRONLY)), daemon=True)
    opener.start()
    opener.join(EXIT_SECONDS)
    assert not opener.is_alive(), f"no handler opened {workdir / 'go'} in {EXIT_SECONDS} s"


def done(workdir):
    path = workdir / "done"
    return path.read_text().split() if path.exists() else []


def test_it_processes_the_queue_with_n_handlers_and_logs_each_outcome(daemon, workdir, start_worker):
    with Client(daemon.socket_path) as client:
        client.put_many([{"task_id": f"t{n:02d}", "payload": {}} for n in range(12)])
        worker = start_worker(daemon.socket_path, f"{HANDLERS}:record", "--concurrency", 3, "--max-tasks", 12,
                              "--wait", 1, "--name", "cli-1")
        assert worker.exit_code() == 0
        assert sorted(done(workdir)) == [f"t{n:02d}" for n in range(12)]
        assert all(task.status == "completed" for task in client.tasks())
    assert sum("attempt 1: done in" in line for line in worker.lines) == 12
    assert "worker cli-1: serving" in worker.log() and "12 done, 0 failed" in worker.log()


@pytest.mark.parametrize("handler, status", [("exits", 3), ("exits_async", 2)])
def test_a_handler_calling_sys_exit_fails_its_task_and_the_worker_goes_on(daemon, workdir, start_worker, handler,
                                                                         status):
    """sys.exit(3) in a handler is not walqueue-worker's exit 3 (unreachable), nor sys.exit(2)
    its exit 2 (usage: not restarted by the unit): the task is released with back-off, and
    the worker takes the next one."""
    with Client(daemon.socket_path) as client:
        client.put("a-exits", {"exit": status}, max_attempts=3)
        client.put("b-ok", {})
        worker = start_worker(daemon.socket_path, f"{HANDLERS}:{handler}", "--max-tasks", 2, "--wait", 1)
        assert worker.exit_code() == 0
        failed = client.get("a-exits")
        assert (failed.status, failed.attempts, failed.worker) == ("ready", 1, None)
        assert client.get("b-ok").status == "completed"
    assert done(workdir) == ["b-ok"]
    assert f"task a-exits generation 1 attempt 1: the handler raised SystemExit: {status}" in worker.log()
    assert "due again in 1 s (attempt 1 of 3)" in worker.log() and "1 done, 1 failed" in worker.log()


def test_sigterm_mid_task_lets_it_finish_then_exits_0(daemon, workdir, start_worker, started_fifo):
    with Client(daemon.socket_path) as client:
        client.put("a-slow", {})
        client.put("b-next", {})
        worker = start_worker(daemon.socket_path, f"{HANDLERS}:blocking", "--wait", 1)
        assert started_fifo.next_task() == "a-slow"
        worker.proc.send_signal(signal.SIGTERM)
        worker.wait_for_line("SIGTERM: taking no new task")
        let_go(workdir)
        assert worker.exit_code() == 0
        assert client.get("a-slow").status == "completed"
        assert client.get("b-next").status == "ready"  # not taken after the stop
    assert "task a-slow generation 1 attempt 1: done in" in worker.log()


def test_a_hung_task_is_released_at_the_stop_timeout(daemon, workdir, start_worker, started_fifo):
    with Client(daemon.socket_path) as client:
        client.put("hung", {})
        worker = start_worker(daemon.socket_path, f"{HANDLERS}:blocking", "--wait", 1, "--stop-timeout", 1)
        assert started_fifo.next_task() == "hung"
        worker.proc.send_signal(signal.SIGINT)
        assert worker.exit_code() == 0
        task = client.get("hung")
        assert (task.status, task.attempts, task.worker) == ("ready", 1, None)
    assert "task hung generation 1: not done 1 s after stop(); released" in worker.log()


def test_an_async_handler_runs_n_at_once_on_the_asyncio_worker(daemon, workdir, start_worker):
    with Client(daemon.socket_path) as client:
        client.put_many([{"task_id": f"a{n:02d}", "payload": {"seconds": 0.2}} for n in range(20)])
        worker = start_worker(daemon.socket_path, f"{HANDLERS}:sleeping", "--concurrency", 10, "--max-tasks", 20,
                              "--wait", 1)
        assert worker.exit_code() == 0
        assert len(done(workdir)) == 20 and all(task.status == "completed" for task in client.tasks())
    assert "(asyncio), concurrency 10" in worker.log()


def test_a_hung_async_handler_is_cancelled_and_released_at_the_stop_timeout(daemon, workdir, start_worker,
                                                                            started_fifo):
    with Client(daemon.socket_path) as client:
        client.put("hung", {})
        worker = start_worker(daemon.socket_path, f"{HANDLERS}:hanging", "--wait", 1, "--stop-timeout", 1)
        assert started_fifo.next_task() == "hung"
        worker.proc.send_signal(signal.SIGTERM)
        assert worker.exit_code() == 0
        assert client.get("hung").status == "ready"



@pytest.mark.parametrize("handler", ["blocking", "hanging"], ids=["threads", "asyncio"])
def test_a_second_ctrl_c_forces_the_exit_and_releases_the_leases_in_hand(daemon, workdir, start_worker,
                                                                        started_fifo, handler):
    """Issue 23: a second Ctrl-C on walqueue-worker waited out --stop-timeout (as Celery's does not)."""
    with Client(daemon.socket_path) as client:
        client.put("hung", {})
        # A stop timeout far beyond the test's bounds: only the second Ctrl-C can end it in time.
        worker = start_worker(daemon.socket_path, f"{HANDLERS}:{handler}", "--wait", 1,
                              "--stop-timeout", 3600)
        assert started_fifo.next_task() == "hung"
        worker.proc.send_signal(signal.SIGINT)
        worker.wait_for_line("SIGINT: taking no new task")
        worker.proc.send_signal(signal.SIGINT)
        assert worker.exit_code() == 0
        task = client.get("hung")
        assert (task.status, task.attempts, task.worker) == ("ready", 1, None)  # released, not expired
    log = worker.log()
    assert "SIGINT again: forcing the stop" in log
    assert "task hung generation 1: not done at a forced stop; released" in log
