"""Run walqueued as a real subprocess for tests, and always stop it.

Readiness is awaited through a fake NOTIFY_SOCKET (the daemon's READY=1),
never by sleeping; every wait has a deadline; a daemon is stopped by pid with
SIGTERM, then SIGKILL if it does not exit in time.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import select
import signal
import socket
import struct
import subprocess
import sys
import time
from pathlib import Path

from walqueue import protocol as p

REPO = Path(__file__).resolve().parents[2]
READY_SECONDS = 15.0
STOP_SECONDS = 10.0
_numbers = itertools.count(1)


def child_env(extra: dict[str, str] | None = None) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(REPO / "src"), str(REPO)])
    for name in ("NOTIFY_SOCKET", "WATCHDOG_USEC", "WATCHDOG_PID", "LISTEN_FDS", "LISTEN_PID"):
        env.pop(name, None)
    env.update(extra or {})
    return env


def sigint_at_its_default() -> None:
    """A child's preexec_fn: SIGINT at its default action, as a terminal's shell gives it. A
    runner started in the background (`cmd &` in a script) ignores SIGINT and passes that on,
    so a Python child would install no KeyboardInterrupt handler and a shell could not trap it:
    a test of what Ctrl-C does would then fail for its runner's reason, not the code's."""
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def wait_until(condition, timeout: float, what: str, interval: float = 0.01):
    """Poll ``condition`` until it returns a truthy value or ``timeout`` passes."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout} s waiting for {what}")
        time.sleep(interval)


def _process_state(pid: int) -> str:
    """The state letter of /proc/<pid>/stat ("T" when stopped by a signal)."""
    with open(f"/proc/{pid}/stat") as stat:
        return stat.read().rpartition(")")[2].split()[0]


class Daemon:
    """One walqueued process on ``directory``, listening on ``socket_path``."""

    def __init__(self, workdir: Path, directory: Path, socket_path: str, args: tuple = (),
                 env: dict[str, str] | None = None) -> None:
        self.workdir = workdir
        self.directory = directory
        self.socket_path = socket_path
        self.args = tuple(args)
        self.env = dict(env or {})
        number = next(_numbers)
        self.log_path = workdir / f"daemon-{number}.log"
        self.notify_path = str(workdir / f"notify-{number}.sock")
        self.notifications: list[str] = []
        self.proc: subprocess.Popen | None = None
        self._notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        self._notify.bind(self.notify_path)

    def command(self) -> list[str]:
        return [sys.executable, "-m", "walqueue.daemon.cli", "serve", str(self.directory),
                "--socket", self.socket_path, "--log-level", "debug", *self.args]

    def start(self, *, wait_ready: bool = True, popen_kwargs: dict | None = None,
              command: list[str] | None = None) -> Daemon:
        env = child_env({"NOTIFY_SOCKET": self.notify_path, **self.env})
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(command or self.command(), stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, env=env, cwd=REPO,
                                         **(popen_kwargs or {}))
        if wait_ready:
            self.wait_for_notification("READY=1", READY_SECONDS)
        return self

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def wait_for_notification(self, text: str, timeout: float) -> str:
        """Receive sd_notify datagrams until one contains ``text``."""
        deadline = time.monotonic() + timeout
        for message in self.notifications:
            if text in message.split("\n"):
                return message
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise AssertionError(f"no {text!r} from walqueued in {timeout} s; log:\n{self.log()}")
            if self.proc is not None and self.proc.poll() is not None and text == "READY=1":
                raise AssertionError(f"walqueued exited with {self.proc.returncode} before READY=1; "
                                     f"log:\n{self.log()}")
            self._notify.settimeout(min(remaining, 0.2))
            try:
                message = self._notify.recv(4096).decode()
            except TimeoutError:
                continue
            self.notifications.append(message)
            if text in message.split("\n"):
                return message

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for_log(self, text: str, timeout: float = 10.0, count: int = 1) -> None:
        wait_until(lambda: self.log().count(text) >= count, timeout, f"{text!r} in the daemon log")

    @contextlib.contextmanager
    def paused(self, timeout: float = 10.0):
        """SIGSTOP the daemon, and SIGCONT it on leaving; inside, it is known to be stopped.

        kill() returns before the signal takes effect: a daemon busy on the
        other CPU runs on for a moment, and could read what the test sends next.
        """
        os.kill(self.pid, signal.SIGSTOP)
        try:
            wait_until(lambda: _process_state(self.pid) == "T", timeout, "walqueued to stop")
            yield
        finally:
            os.kill(self.pid, signal.SIGCONT)

    def terminate(self, timeout: float = STOP_SECONDS) -> int:
        """SIGTERM, wait; returns the exit code (SIGKILL and fail if it hangs)."""
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"walqueued ignored SIGTERM for {timeout} s; log:\n{self.log()}") from None

    def kill(self) -> int:
        assert self.proc is not None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGKILL)
        return self.proc.wait(STOP_SECONDS)

    def cleanup(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.kill()
        self._notify.close()


class ClientProcess:
    """``python -m tests.process.clientproc ARGS`` with its stdout captured."""

    def __init__(self, *args: str) -> None:
        self.proc = subprocess.Popen([sys.executable, "-m", "tests.process.clientproc", *args],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                     stderr=subprocess.PIPE, env=child_env(), cwd=REPO, text=True)
        self._early = b""  # stdout read by wait_for_lines, given back by result()

    def wait_for_lines(self, count: int, timeout: float) -> None:
        """Return once the process has printed ``count`` lines (what it printed, it was answered)."""
        fd = self.proc.stdout.fileno()
        deadline = time.monotonic() + timeout
        while (printed := self._early.count(b"\n")) < count:
            remaining = deadline - time.monotonic()
            readable, _, _ = select.select([fd], [], [], max(remaining, 0))
            if not readable:
                raise AssertionError(f"the client printed {printed} of {count} lines in {timeout:.0f} s")
            chunk = os.read(fd, 65536)
            if not chunk:
                raise AssertionError(f"the client exited after {printed} of {count} lines: "
                                     f"{self.proc.stderr.read()}")
            self._early += chunk

    def result(self, timeout: float = 30.0) -> tuple[int, str, str]:
        try:
            out, err = self.proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            out, err = self.proc.communicate(timeout=STOP_SECONDS)
            raise AssertionError(f"client process timed out: {err}") from None
        return self.proc.returncode, self._early.decode() + out, err

    def cleanup(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.communicate(timeout=STOP_SECONDS)


def read_message(sock: socket.socket):
    """One framed answer from a raw socket, or None at end of stream (or a reset)."""
    data = b""
    try:
        while len(data) < 4:
            chunk = sock.recv(4 - len(data))
            if not chunk:
                return None
            data += chunk
        (length,) = struct.unpack(">I", data)
        body = b""
        while len(body) < length:
            chunk = sock.recv(length - len(body))
            assert chunk, "stream ended inside a frame"
            body += chunk
    except ConnectionResetError:
        return None
    return p.decode_response(body)
