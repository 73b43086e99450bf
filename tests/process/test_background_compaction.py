"""walqueued compacts in a forked child while it serves: real daemons, real children, real signals.

The child is held in "writing" by tests/process/hooks.py's ``child_hook``
(``WALQUEUE_TEST_CHILD_GATE``: a FIFO it blocks on, its pid written first),
so each test acts while a snapshot is being written:

* other clients are served meanwhile, and ``compact`` is answered only once
  CURRENT names a snapshot covering it (a pipelined ``stats`` behind it is
  answered first);
* SIGTERM kills and reaps the child, answers the waiting ``compact`` with an
  error, leaves no snapshot behind and exits 0;
* SIGKILL of the daemon takes the child along within a moment, and the next
  daemon finds the directory unlocked and every answered write;
* a child SIGSTOPped while it writes is killed at its deadline (its floor
  shortened for the test), the waiting ``compact`` is answered with the
  error, the log and the report say it, and the next attempt compacts;
* on a real, nearly full file system (a tmpfs mounted for the test; root
  only) a compaction that cannot be written backs off — a few spaced
  attempts, no reopen, every put answered — says why in the log and the
  report, and succeeds once there is room again.
"""

from __future__ import annotations

import errno
import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

import pytest

from walqueue import protocol as p
from walqueue.client import Client
from walqueue.fs import OsFileSystem
from walqueue.snapshot import read_current

from .crash_harness import process_exits
from .daemon import _process_state, read_message, wait_until

CHILD_HOOK = ("--test-child-hook", "tests.process.hooks:child_hook")
CHILD_EXIT_SECONDS = 5.0


class RawConnection:
    """A wire connection that says hello in protocol version 3 (the compaction figures)."""

    def __init__(self, socket_path: str) -> None:
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.settimeout(30)
        self.sock.connect(socket_path)
        self.send(p.Hello(id=0, version=p.COMPACTION_REPORTING_VERSION))
        assert isinstance(read_message(self.sock), p.HelloOk)

    def send(self, *messages) -> None:
        self.sock.sendall(b"".join(p.encode(message) for message in messages))

    def receive(self):
        message = read_message(self.sock)
        assert message is not None, "the daemon closed the connection"
        return message

    def report(self) -> p.DaemonStats:
        self.send(p.DaemonStatsReq(id=99))
        return p.daemon_stats_from_wire(self.receive().stats)

    def close(self) -> None:
        self.sock.close()


class Gate:
    """The FIFO tests/process/hooks.py's child hook blocks on; ``pids`` the children that reached it."""

    def __init__(self, workdir: Path) -> None:
        self.path = str(workdir / "gate")
        os.mkfifo(self.path)
        self._fd: int | None = None

    @property
    def env(self) -> dict[str, str]:
        return {"WALQUEUE_TEST_CHILD_GATE": self.path}

    def pids(self) -> list[int]:
        try:
            with open(self.path + ".pids") as file:
                return [int(line) for line in file.read().split()]
        except FileNotFoundError:
            return []

    def wait_child(self, count: int = 1) -> int:
        """The pid of the count-th child, once it waits at the gate."""
        return wait_until(lambda: len(self.pids()) >= count and self.pids()[count - 1], 20,
                          f"snapshot child number {count} at the gate")

    def open(self) -> None:
        """Let every child through from now on (until the test ends)."""
        self._fd = os.open(self.path, os.O_RDWR)  # never blocks, keeps the bytes for later readers
        os.write(self._fd, b"g" * 64)

    def close(self) -> None:
        if self._fd is not None:
            os.close(self._fd)


@pytest.fixture
def gate(workdir):
    made = Gate(workdir)
    yield made
    made.close()


def snapshots(directory: Path) -> list[str]:
    return sorted(name for name in os.listdir(directory) if name.startswith("snapshot-"))


def test_compact_answers_after_publishing_while_others_are_served(make_daemon, gate):
    daemon = make_daemon(*CHILD_HOOK, env=gate.env)
    with Client(daemon.socket_path) as client:
        for n in range(5):
            client.put(f"t{n}", {"n": n})
        connection = RawConnection(daemon.socket_path)
        try:
            connection.send(p.Compact(id=1), p.Stats(id=2))
            child = gate.wait_child()
            # The stats request behind the compact is answered; the compact is not, yet.
            answer = connection.receive()
            assert isinstance(answer, p.StatsOk) and answer.id == 2
            assert client.put("during", {}) == "during"  # others are served too
            report = connection.report()
            assert report.compaction_in_progress and report.queue.snapshot_seq == 0
            gate.open()
            answer = connection.receive()
            assert answer == p.Compacted(id=1, seq=5)
            fs = OsFileSystem()
            handle = fs.open_directory(str(daemon.directory))
            try:
                assert read_current(fs, handle) == (5, "snapshot-00000000000000000005.snap")
            finally:
                fs.close_directory(handle)
            assert process_exits(child, CHILD_EXIT_SECONDS)
            report = connection.report()
            assert not report.compaction_in_progress and report.compactions_total == 1
            assert report.snapshot_bytes == os.path.getsize(daemon.directory / "snapshot-00000000000000000005.snap")
            assert report.last_compaction_pause_seconds is not None
        finally:
            connection.close()
    assert daemon.terminate() == 0


def test_sigterm_while_a_child_writes_kills_it_answers_the_waiting_compact_and_exits_0(make_daemon, gate):
    daemon = make_daemon(*CHILD_HOOK, env=gate.env)
    with Client(daemon.socket_path) as client:
        client.put("a", {})
    connection = RawConnection(daemon.socket_path)
    try:
        connection.send(p.Compact(id=1))
        child = gate.wait_child()
        daemon.proc.send_signal(signal.SIGTERM)
        answer = connection.receive()
        assert answer.error == "WalQueueError" and "stopping" in answer.message
        assert daemon.proc.wait(10) == 0
    finally:
        connection.close()
    assert process_exits(child, 0.0)  # reaped before the daemon exited
    assert snapshots(daemon.directory) == [] and "CURRENT" not in os.listdir(daemon.directory)
    restarted = make_daemon()
    with Client(restarted.socket_path) as client:
        assert client.get("a").status == "ready"


def test_a_killed_daemon_takes_its_child_along_and_the_next_one_finds_the_directory_free(make_daemon, gate):
    daemon = make_daemon(*CHILD_HOOK, "--compact-wal-bytes", "1", "--compact-wal-ratio", "0", env=gate.env)
    with Client(daemon.socket_path) as client:
        client.put("a", {})
        child = gate.wait_child()
        client.put("b", {})  # answered while the child writes
    assert daemon.kill() == -9
    assert process_exits(child, CHILD_EXIT_SECONDS), f"snapshot child {child} outlived its killed parent by {CHILD_EXIT_SECONDS} s"
    restarted = make_daemon()  # exits 3 if an orphan still held the LOCK
    with Client(restarted.socket_path) as client:
        assert [task.task_id for task in client.tasks()] == ["a", "b"]


def test_a_stopped_snapshot_child_is_killed_at_its_deadline_and_the_compaction_backs_off(make_daemon, gate):
    daemon = make_daemon(*CHILD_HOOK, "--test-child-deadline-floor", "3", env=gate.env)
    with Client(daemon.socket_path) as client:
        client.put("a", {})
    connection = RawConnection(daemon.socket_path)
    try:
        connection.send(p.Compact(id=1))
        child = gate.wait_child()
        os.kill(child, signal.SIGSTOP)
        wait_until(lambda: _process_state(child) == "T", 10, f"snapshot child {child} to stop")
        gate.open()  # a stopped child cannot go on all the same
        answer = connection.receive()  # once its deadline, 3 s after the fork, has passed
        assert answer.error == "WalQueueError", answer
        assert f"the snapshot child pid {child} did not exit within 3 s, so it was killed" in answer.message
        assert process_exits(child, CHILD_EXIT_SECONDS)
        report = wait_until(lambda: (lambda report: not report.compaction_in_progress and report)(
            connection.report()), 10, "the killed child to be reaped")
        assert report.compaction_failures_total == 1 and report.write_failures_total == 0
        assert "killed" in report.last_compaction_error
        assert "compaction failed (1 in a row)" in daemon.log()
        assert snapshots(daemon.directory) == []
        # After the back-off the next child (through the open gate) compacts.
        with Client(daemon.socket_path) as client:
            client.put("b", {})
            wait_until(lambda: connection.report().compaction_retry_in_seconds == 0.0, 10, "the back-off to end")
            assert client.compact() == 2
    finally:
        connection.close()
    assert daemon.terminate() == 0


# -- a nearly full disk ----------------------------------------------------------------------

TMPFS_BYTES = 4 * 1024 * 1024
FLOOR_BYTES = 32 * 1024
PAYLOAD = {"pad": "x" * 100}


@pytest.fixture
def small_disk(workdir):
    """A 4 MiB tmpfs mounted for the test (root only), unmounted after."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    mount_point = workdir / "small"
    mount_point.mkdir()
    result = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={TMPFS_BYTES},mode=0700", "tmpfs",
                             str(mount_point)], capture_output=True, text=True, timeout=30)
    if result.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs: {result.stderr.strip()}")
    try:
        yield mount_point
    finally:
        subprocess.run(["umount", "-l", str(mount_point)], capture_output=True, timeout=30)


def fill(path: Path, leave_bytes: int) -> None:
    """Write zeros to ``path`` until only about ``leave_bytes`` are free on its file system."""
    stats = os.statvfs(path.parent)
    size = stats.f_bavail * stats.f_frsize - leave_bytes
    with open(path, "wb") as file:
        try:
            file.write(b"\0" * max(0, size))
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def test_a_full_disk_backs_off_compaction_without_a_reopen_and_says_why(make_daemon, small_disk):
    directory = small_disk / "queue"
    daemon = make_daemon("--compact-wal-bytes", str(FLOOR_BYTES), "--compact-wal-ratio", "0",
                         directory=directory)
    connection = RawConnection(daemon.socket_path)
    with Client(daemon.socket_path) as client:
        for n in range(400):  # history that compacts fine: a snapshot of ~100 KiB
            client.put(f"early-{n:04}", PAYLOAD)
        wait_until(lambda: (lambda report: report.compactions_total >= 1 and not report.compaction_in_progress)(
            connection.report()), 20, "a first compaction, and none in flight")
        # Room for the WAL of the puts below, not for another snapshot of the history.
        fill(small_disk / "filler", leave_bytes=120 * 1024)
        started = time.monotonic()
        answered = 0
        for n in range(250):
            assert client.put(f"late-{n:04}", PAYLOAD) == f"late-{n:04}"
            answered += 1
        elapsed = time.monotonic() - started
        report = connection.report()
        # Attempts are spaced by the back-off (1, 2, 4, ... s), not one per write: at most
        # log2(elapsed + 1) + 2 of them, against the 250 writes that crossed the threshold.
        assert 1 <= report.compaction_failures_total <= int(elapsed + 1).bit_length() + 2, report
        assert report.write_failures_total == 0, "a failed compaction made the daemon reopen"
        assert report.wal_segments <= report.compaction_failures_total + 2
        assert "free space" in report.last_compaction_error or "No space" in report.last_compaction_error
        assert report.compaction_consecutive_failures >= 1 and report.compaction_retry_in_seconds is not None
        assert "compaction failed (1 in a row)" in daemon.log()
        assert not [name for name in snapshots(directory)
                    if name != f"snapshot-{report.queue.snapshot_seq:020d}.snap"], "a partial snapshot was left"
        # Room again: the next write after the back-off compacts, and the report is healthy.
        os.unlink(small_disk / "filler")
        extra = iter(range(10**6))
        wait_until(lambda: client.put(f"again-{next(extra):06}", PAYLOAD)
                   and connection.report().compaction_consecutive_failures == 0, 60,
                   "a compaction after the disk has room")
        report = connection.report()
        assert report.last_compaction_error == "" and report.write_failures_total == 0
        assert client.stats().ready == 400 + answered + next(extra)
    connection.close()
    assert daemon.terminate() == 0
