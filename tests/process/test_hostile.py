"""A real walqueued under abuse keeps serving everyone else and loses nothing.

While a well-behaved worker process (tests/process/steady_client.py) puts,
reserves and acks, the test throws at the daemon, one after another:
truncated frames followed by a disconnect, length prefixes past the bound
(followed by a flood), a maximal frame left half-sent, unknown request
types, a wrong protocol version, requests before hello, a client that
pipelines requests and never reads its answers, more idle connections than
``--max-connections``, and clients SIGKILLed mid-request. Throughout, the
daemon's RSS (from /proc/PID/status) stays bounded and other clients are
answered promptly; afterwards the daemon stops cleanly and the directory,
opened offline with ``walqueue.Queue``, holds every answered put and ack.

A client that requests compactions back to back cannot make the daemon
hold deleted files (their descriptors, their hidden blocks) beyond
``MAX_FILES_BEING_FREED``, counted in /proc/PID/fd, and they are all freed
once it stops.

Access: the socket's mode decides who may connect (a forked child that drops
to ``nobody``), and the directory and its files carry no world access, even
under umask 000.

(Random and mutated bytes through the decoders and the daemon's receive path
are fuzzed in-process in tests/unit/test_wire_fuzz.py; test_daemon.py covers
single garbage and oversized frames, deep nesting and the hello timeout.)
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import select
import shutil
import signal
import socket
import stat
import struct
import subprocess
import sys
import time
from pathlib import Path

import pytest

from walqueue import InvalidRequest, PutRequest, Queue
from walqueue import protocol as p
from walqueue.client import Client, DaemonUnavailable
from walqueue.daemon.freeing import MAX_FILES_BEING_FREED

from .daemon import REPO, child_env, read_message, wait_until

MAX_CONNECTIONS = 20
# The daemon's own per-connection bounds, from server.py and protocol.py.
OUTPUT_HIGH_WATER_BYTES = 8 * 1024 * 1024
MIB = 1024 * 1024
# How far the daemon's RSS may rise above its baseline during all the abuse:
# one maximal body buffered (17 MiB), one connection's answers at the high-water
# mark (8 MiB) plus the objects of one turn of requests, and allocator slack.
RSS_GROWTH_BOUND_BYTES = 96 * MIB
# The well-behaved client's slowest call may not exceed this (a loaded
# 2-core machine; the daemon itself answers in milliseconds).
STEADY_MAX_LATENCY_SECONDS = 5.0
NOBODY = 65534


def rss_bytes(pid: int) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    raise AssertionError(f"no VmRSS for pid {pid}")


def raw_connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    return sock


def greeted(path: str) -> socket.socket:
    sock = raw_connect(path)
    sock.sendall(p.encode(p.Hello(id=1, version=p.PROTOCOL_VERSION)))
    assert isinstance(read_message(sock), p.HelloOk)
    return sock


def send_hello(sock: socket.socket) -> None:
    """Say hello; a daemon with a full table may already have refused and closed (its reason is buffered)."""
    try:
        sock.sendall(p.encode(p.Hello(id=1, version=p.PROTOCOL_VERSION)))
    except (BrokenPipeError, ConnectionResetError):
        pass


def expect_fatal(sock: socket.socket, *, request_id=None, text: str = "") -> p.Error:
    """The next answer is a fatal InvalidRequest, then the daemon closes the connection."""
    error = read_message(sock)
    assert isinstance(error, p.Error) and error.fatal, error
    assert error.error in {"InvalidRequest", "WalQueueError"}, error
    if request_id is not None:
        assert error.id == request_id, error
    assert text in error.message, error
    assert read_message(sock) is None, "the connection stayed open after a fatal error"
    sock.close()
    return error


def send_until_blocked(sock: socket.socket, data: bytes, seconds: float) -> tuple[int, str]:
    """Write ``data`` without blocking for at most ``seconds``; returns (bytes sent, how it ended)."""
    sock.setblocking(False)
    sent = 0
    deadline = time.monotonic() + seconds
    while sent < len(data):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            return sent, "blocked"
        _, writable, _ = select.select([], [sock], [], min(remaining, 0.2))
        if not writable:
            continue
        try:
            sent += sock.send(data[sent:sent + 1024 * 1024])
        except (BrokenPipeError, ConnectionResetError):
            return sent, "closed"
    return sent, "all sent"


class Abuse:
    """Runs the abuses against one daemon, checking after each that others are still served."""

    def __init__(self, daemon, bystander: Client) -> None:
        self.daemon = daemon
        self.path = daemon.socket_path
        self.bystander = bystander
        self.baseline = rss_bytes(daemon.pid)
        self.peak = self.baseline
        self.bystander_puts: list[str] = []

    def sample(self) -> int:
        rss = rss_bytes(self.daemon.pid)
        self.peak = max(self.peak, rss)
        assert rss - self.baseline < RSS_GROWTH_BOUND_BYTES, (
            f"daemon RSS grew from {self.baseline // MIB} MiB to {rss // MIB} MiB")
        return rss

    def still_serving(self, after: str) -> None:
        assert self.daemon.proc.poll() is None, f"the daemon died after {after}"
        started = time.monotonic()
        task_id = f"bystander-{after}"
        assert self.bystander.put(task_id, {"after": after}) == task_id
        assert self.bystander.get(task_id) is not None
        elapsed = time.monotonic() - started
        assert elapsed < STEADY_MAX_LATENCY_SECONDS, f"bystander waited {elapsed:.1f} s after {after}"
        self.bystander_puts.append(task_id)
        self.sample()

    # -- the abuses ----------------------------------------------------------------

    def truncated_frames_then_disconnect(self) -> None:
        hello = p.encode(p.Hello(id=1, version=p.PROTOCOL_VERSION))
        put = p.encode(p.Put(id=2, task_id="never", payload={"x": 1}))
        disconnects = self.daemon.log().count("disconnect")
        for partial in (b"\x00\x00", hello[:7], hello + put[:3], hello + put[:-1],
                        hello + struct.pack(">I", 1000) + b"\x85" * 10):
            sock = raw_connect(self.path)
            sock.sendall(partial)
            sock.close()
        # A disconnect leaves nothing behind: the cut put was never applied.
        wait_until(lambda: self.daemon.log().count("disconnect") >= disconnects + 5, 10, "five disconnects")
        assert self.bystander.get("never") is None

    def oversized_length_prefixes(self) -> None:
        for length in (p.MAX_BODY_BYTES + 1, 2**32 - 1):
            sock = greeted(self.path)
            # The prefix alone is refused; a flood behind it is never buffered.
            sent, ending = send_until_blocked(sock, struct.pack(">I", length) + bytes(64 * MIB), 5)
            assert ending in {"closed", "blocked"}, (length, sent, ending)
            sock.settimeout(10)
            error = read_message(sock)
            assert error is None or (isinstance(error, p.Error) and error.fatal), error
            sock.close()
            self.sample()

    def maximal_frame_left_half_sent(self) -> None:
        # Legal: the daemon buffers up to one MAX_BODY_BYTES body per connection.
        sock = greeted(self.path)
        sent, ending = send_until_blocked(sock, struct.pack(">I", p.MAX_BODY_BYTES) + bytes(12 * MIB), 10)
        assert ending == "all sent", (sent, ending)
        self.still_serving("a half-sent maximal frame")
        sock.close()

    def unknown_request_types(self) -> None:
        for body, request_id in ((p.encode_value({"type": "frobnicate", "id": 4}), 4),
                                 (p.encode_value({"type": "put_ok", "id": 5, "task_id": "x"}), 5),
                                 (p.encode_value({"id": 6}), 6),
                                 (p.encode_value([1, 2, 3]), None),
                                 (p.encode_value("stats"), None)):
            sock = greeted(self.path)
            sock.sendall(p.frame(body))
            expect_fatal(sock, request_id=request_id)

    def wrong_protocol_version(self) -> None:
        for version in (0, max(p.DAEMON_PROTOCOL_VERSIONS) + 1, 2**63):
            sock = raw_connect(self.path)
            sock.sendall(p.encode(p.Hello(id=7, version=version)))
            expect_fatal(sock, request_id=7, text=f"protocol version {version}")

    def requests_before_hello(self) -> None:
        for request in (p.Put(id=8, task_id="sneaky", payload={}), p.Compact(id=9), p.Stats(id=10)):
            sock = raw_connect(self.path)
            sock.sendall(p.encode(request) + p.encode(p.Hello(id=11, version=p.PROTOCOL_VERSION)))
            expect_fatal(sock, request_id=request.id, text="expected hello first")
        assert self.bystander.get("sneaky") is None

    def never_reads_its_answers(self) -> None:
        # Due far in the future, so the steady worker never takes it.
        self.bystander.put("fat", {"pad": "x" * 4096}, available_at=2**40)
        sock = greeted(self.path)
        requests = b"".join(p.encode(p.Get(id=index, task_id="fat")) for index in range(12, 200_000))
        sent, ending = send_until_blocked(sock, requests, 2)
        # The daemon stopped reading once its answers piled up: the rest of the
        # pipeline stays in the kernel's buffers, at the sender's cost.
        assert ending == "blocked" and sent < len(requests), (sent, len(requests), ending)
        for _ in range(5):
            self.still_serving("a client that never reads")
        sock.close()

    def more_idle_connections_than_allowed(self) -> None:
        idle: list[socket.socket] = []
        refusal = None
        try:
            for _ in range(MAX_CONNECTIONS + 5):
                sock = raw_connect(self.path)
                send_hello(sock)
                answer = read_message(sock)
                if isinstance(answer, p.HelloOk):
                    idle.append(sock)
                    continue
                refusal = answer
                assert read_message(sock) is None
                sock.close()
                break
            assert isinstance(refusal, p.Error) and refusal.fatal, refusal
            assert refusal.id is None and "too many connections" in refusal.message
            # Two connections are the steady client's and the bystander's.
            assert len(idle) <= MAX_CONNECTIONS - 2
            self.still_serving("a full connection table")
            with pytest.raises(DaemonUnavailable, match="too many connections"):
                Client(self.path, retry_seconds=0).stats()
        finally:
            for sock in idle:
                sock.close()

        def new_client_works() -> bool:
            try:
                with Client(self.path, retry_seconds=0) as fresh:
                    return fresh.stats() is not None
            except DaemonUnavailable:
                return False

        wait_until(new_client_works, 10, "a connection once the idle ones closed")

    def clients_killed_mid_request(self) -> None:
        code = (
            "import sys, socket\n"
            "from walqueue import protocol as p\n"
            "sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)\n"
            "sock.connect(sys.argv[1])\n"
            "sock.sendall(p.encode(p.Hello(id=1, version=p.PROTOCOL_VERSION)))\n"
            "if sys.argv[2] == 'half':\n"
            "    sock.sendall(p.encode(p.Put(id=2, task_id='killed-half', payload={'i': -1}))[:-5])\n"
            "    print('sent', flush=True)\n"
            "    sys.stdin.read()\n"
            "index = 0\n"
            "while True:\n"
            "    sock.sendall(b''.join(p.encode(p.Put(id=2 + index + n, task_id=f'killed-{index + n:06d}',\n"
            "                                         payload={'i': index + n})) for n in range(100)))\n"
            "    index += 100\n"
            "    if index == 100:\n"
            "        print('sent', flush=True)\n"
        )
        for mode in ("half", "stream"):
            child = subprocess.Popen([sys.executable, "-c", code, self.path, mode], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, env=child_env(), cwd=REPO, text=True)
            try:
                ready, _, _ = select.select([child.stdout], [], [], 15)
                assert ready and child.stdout.readline() == "sent\n", f"{mode} client did not start"
                child.send_signal(signal.SIGKILL)
                assert child.wait(10) == -signal.SIGKILL
            finally:
                if child.poll() is None:
                    child.kill()
                    child.wait(10)
                child.stdin.close()
                child.stdout.close()
        assert self.bystander.get("killed-half") is None


def test_a_daemon_under_abuse_keeps_serving_everyone_and_loses_nothing(make_daemon, workdir):
    daemon = make_daemon("--max-connections", str(MAX_CONNECTIONS))
    stop_file = workdir / "stop-steady"
    steady_log = workdir / "steady.jsonl"
    with open(steady_log, "w") as out:
        steady = subprocess.Popen([sys.executable, "-m", "tests.process.steady_client", daemon.socket_path,
                                   "steady", str(stop_file), "120"],
                                  stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                  env=child_env(), cwd=REPO)
    bystander = Client(daemon.socket_path, timeout=10, retry_seconds=0)
    try:
        wait_until(lambda: steady_log.read_text().count('"op": "ack"') >= 5, 20, "the steady client's acks")
        abuse = Abuse(daemon, bystander)
        for name in ("truncated_frames_then_disconnect", "oversized_length_prefixes",
                     "maximal_frame_left_half_sent", "unknown_request_types", "wrong_protocol_version",
                     "requests_before_hello", "never_reads_its_answers", "more_idle_connections_than_allowed",
                     "clients_killed_mid_request"):
            getattr(abuse, name)()
            abuse.still_serving(name)
        acks_during_abuse = steady_log.read_text().count('"op": "ack"')
        stop_file.touch()
        assert steady.wait(30) == 0
    finally:
        bystander.close()
        if steady.poll() is None:
            steady.kill()
            steady.wait(10)
    print(f"daemon RSS baseline {abuse.baseline / MIB:.1f} MiB, peak {abuse.peak / MIB:.1f} MiB")
    records = [json.loads(line) for line in steady_log.read_text().splitlines()]
    summary = records[-1]["summary"]
    assert summary["errors"] == 0, [r for r in records if r.get("op") == "error"]
    assert summary["max_latency"] < STEADY_MAX_LATENCY_SECONDS, summary
    assert summary["acks"] >= 5 and acks_during_abuse >= 5, summary
    log = daemon.log()
    assert daemon.terminate() == 0, log
    assert "Traceback" not in log and "write failed" not in log and "CRITICAL" not in log

    with Queue(daemon.directory) as queue:
        for record in records:
            if record.get("op") == "put":
                assert queue.get(record["task_id"]) is not None, f"answered put lost: {record}"
            elif record.get("op") == "ack":
                task = queue.get(record["task_id"])
                assert (task.status, task.generation) == ("completed", record["generation"]), record
        for task_id in abuse.bystander_puts:
            assert queue.get(task_id) is not None, f"bystander's answered put lost: {task_id}"
        # The killed clients' puts that made it are whole: never a torn or foreign task.
        for task in queue.tasks():
            assert task.task_id.startswith(("steady-", "bystander-", "killed-", "fat")), task
            if task.task_id.startswith("killed-") and task.status != "completed":
                assert task.payload == {"i": int(task.task_id.split("-")[1])}, task
    try:
        from walqueue.verify import verify_directory
    except ImportError:
        return
    report = verify_directory(daemon.directory)
    # A clean SIGTERM leaves nothing to say: no torn tail, no leftover file.
    assert report.healthy and not report.problems, report.render()


def test_answers_to_a_client_that_never_reads_stay_bounded_whatever_the_payload(make_daemon):
    daemon = make_daemon()
    with Client(daemon.socket_path) as bystander:
        # A payload of many small values: every get copies it into new objects
        # (~800 KB each), and encodes to ~100 KB. Once (hostile-1) 300 such
        # unread answers pinned 229 MiB.
        bystander.put("wide", {"values": [0] * 100_000})
        baseline = rss_bytes(daemon.pid)
        sock = greeted(daemon.socket_path)
        requests = b"".join(p.encode(p.Get(id=index, task_id="wide")) for index in range(2, 2002))
        sock.sendall(requests)  # 68 KiB: read in one turn
        # Each bystander answer comes after at least one turn that served gets;
        # the daemon stops building answers at its high-water mark.
        peak = baseline
        for _ in range(10):
            started = time.monotonic()
            assert bystander.stats().ready == 1
            assert time.monotonic() - started < STEADY_MAX_LATENCY_SECONDS
            peak = max(peak, rss_bytes(daemon.pid))
            time.sleep(0.05)  # let further turns run between samples
        sock.close()
    assert peak - baseline < 4 * OUTPUT_HIGH_WATER_BYTES, (
        f"RSS grew {(peak - baseline) / MIB:.0f} MiB for 2000 unread answers")


def test_a_client_cannot_forge_lines_in_the_daemon_log(daemon):
    forged = "2026-01-01 00:00:00,000 walqueued[1] CRITICAL forged by a client"
    for body in (p.encode_value({"type": "stats", "id": 3, f"x\n{forged}": 1}),
                 p.encode_value({"type": f"frob\n{forged}", "id": 4}),
                 p.encode_value({"type": "get", "id": 5, "task_id": 7, f"y\r\n{forged}": 1})):
        sock = greeted(daemon.socket_path)
        sock.sendall(p.frame(body))
        expect_fatal(sock)
    daemon.wait_for_log("protocol error", count=3)
    # SPEC: one line an event. No line may begin with what a client sent.
    lines = daemon.log().splitlines()
    assert not [line for line in lines if line.startswith(forged)], "a client forged a daemon log line"
    assert all(" walqueued[" in line[:60] for line in lines if line), [
        line for line in lines if line and " walqueued[" not in line[:60]]


def test_a_worker_killed_while_waiting_in_reserve_is_never_handed_a_lease(daemon):
    code = ("import sys; from walqueue.client import Client; "
            "Client(sys.argv[1]).reserve('doomed', wait=30, lease_seconds=60)")
    child = subprocess.Popen([sys.executable, "-c", code, daemon.socket_path], stdin=subprocess.DEVNULL,
                             env=child_env(), cwd=REPO)
    try:
        daemon.wait_for_log("parked reserve")
        child.send_signal(signal.SIGKILL)
        assert child.wait(10) == -signal.SIGKILL
    finally:
        if child.poll() is None:
            child.kill()
            child.wait(10)
    with Client(daemon.socket_path) as client:
        client.stats()  # a turn in which the dead worker's end of stream is read too
        client.put("job", {}, max_attempts=1)
        leases = client.reserve("alive", wait=3)
        # Otherwise the task is leased to 'doomed' for 60 s and then, with
        # max_attempts=1, dies without ever having run.
        assert [lease.task_id for lease in leases] == ["job"], client.get("job")


def test_many_unread_listings_of_a_big_queue_do_not_stall_other_clients(make_daemon, workdir):
    # Once (hostile-4) each listing sorted every id and encoded 8 MiB in the
    # same turn: fifty of them over 200,000 tasks made a bystander wait 20 s.
    with Queue(workdir / "queue") as queue:
        for start in range(0, 100_000, 5_000):
            queue.put_many([{"task_id": f"t{index:07d}", "payload": {}} for index in range(start, start + 5_000)])
    daemon = make_daemon("--log-level", "info")
    listers: list[socket.socket] = []
    with Client(daemon.socket_path) as bystander:
        bystander.stats()
        try:
            listers = [greeted(daemon.socket_path) for _ in range(40)]
            for sock in listers:  # all at once, and never read the answers
                sock.sendall(p.encode(p.Tasks(id=2)))
            # Served meanwhile; the bound that makes it prompt (one listing started and 2 MiB of
            # them encoded a turn) is counted turn by turn in tests/unit/test_hostile_loop.py:
            # timed here, a busy machine made the bystander wait 1.9 to 2.4 s (4 busy loops).
            for _ in range(10):
                assert bystander.stats().ready == 100_000
            # And the listings are whole: the first one read to its end.
            listers[0].settimeout(60)
            listed = 0
            while (message := read_message(listers[0])) is not None:
                listed += len(message.tasks)
                if not message.more:
                    break
            assert listed == 100_000
        finally:
            for sock in listers:
                sock.close()


def test_thousands_of_idle_connections_meet_the_default_bound_cleanly(daemon):
    import resource

    wanted = 1600
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft != resource.RLIM_INFINITY and soft < wanted + 64:
        if hard != resource.RLIM_INFINITY and hard < wanted + 64:
            pytest.skip(f"the open-file limit {hard} is below {wanted + 64}")
        resource.setrlimit(resource.RLIMIT_NOFILE, (wanted + 64, hard))
    with Client(daemon.socket_path) as bystander:
        bystander.stats()
        baseline = rss_bytes(daemon.pid)
        opened: list[socket.socket] = []
        try:
            for _ in range(wanted):
                sock = raw_connect(daemon.socket_path)
                opened.append(sock)
                send_hello(sock)
            answers = [read_message(sock) for sock in opened]
            accepted = sum(isinstance(answer, p.HelloOk) for answer in answers)
            refused = [answer for answer in answers if not isinstance(answer, p.HelloOk)]
            # The default bound (1024) counts the bystander too.
            assert accepted == 1023, accepted
            assert all(isinstance(a, p.Error) and a.fatal and "too many connections" in a.message
                       for a in refused), refused[:3]
            assert bystander.put("still", {}) == "still"
            assert rss_bytes(daemon.pid) - baseline < 32 * MIB
        finally:
            for sock in opened:
                sock.close()


# -- access ------------------------------------------------------------------------


def try_as_nobody(path: str, groups: list[int]) -> str:
    """Fork a child that drops to uid/gid ``nobody`` with ``groups`` and calls the daemon.

    Returns "ok" or the refusal. The child never returns into pytest.
    """
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child
        outcome = b"child failed before connecting"
        try:
            os.close(read_end)
            os.setgroups(groups)
            os.setgid(NOBODY)
            os.setuid(NOBODY)
            try:
                with Client(path, timeout=10, retry_seconds=0) as client:
                    client.stats()
                outcome = b"ok"
            except DaemonUnavailable as exc:
                outcome = f"refused: {exc}".encode()[:500]
        except BaseException as exc:
            outcome = f"child error: {exc!r}".encode()[:500]
        finally:
            os.write(write_end, outcome)
            os._exit(0)
    os.close(write_end)
    try:
        deadline = time.monotonic() + 20
        while True:
            done, _ = os.waitpid(pid, os.WNOHANG)
            if done:
                break
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                raise AssertionError("the unprivileged child hung")
            time.sleep(0.02)
        return os.read(read_end, 1000).decode()
    finally:
        os.close(read_end)


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a child as another uid (nobody)")
def test_the_socket_mode_decides_who_may_connect(make_daemon, workdir):
    os.chmod(workdir, 0o755)  # the socket's directory must not be what refuses
    socket_gid = os.getegid()
    expected = {
        "0600": {"stranger": False, "in group": False},
        "0660": {"stranger": False, "in group": True},
        "0666": {"stranger": True, "in group": True},
    }
    for mode, outcomes in expected.items():
        path = str(workdir / f"mode-{mode}.sock")
        daemon = make_daemon("--socket-mode", mode, socket_path=path)
        assert stat.S_IMODE(os.stat(path).st_mode) == int(mode, 8)
        assert os.stat(path).st_gid == socket_gid
        for who, allowed in outcomes.items():
            outcome = try_as_nobody(path, [socket_gid] if who == "in group" else [])
            if allowed:
                assert outcome == "ok", (mode, who, outcome)
            else:
                assert outcome.startswith("refused") and "Permission denied" in outcome, (mode, who, outcome)
        with Client(path) as owner:  # the owner may always connect
            assert owner.stats().last_seq == 0
        assert daemon.terminate() == 0


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to start a child as another uid (nobody)")
def test_the_default_socket_is_reached_only_through_the_directory_s_group(make_daemon, workdir):
    # The default socket lives inside the 0750 queue directory: even 0666 on
    # the socket does not let a stranger past the directory.
    os.chmod(workdir, 0o755)
    daemon = make_daemon("--socket-mode", "0666", socket_path=str(workdir / "queue" / "walqueued.sock"))
    assert stat.S_IMODE(os.stat(daemon.directory).st_mode) == 0o750
    assert try_as_nobody(daemon.socket_path, []).startswith("refused")
    assert try_as_nobody(daemon.socket_path, [os.getegid()]) == "ok"
    assert daemon.terminate() == 0


def test_the_directory_and_its_files_carry_no_world_access_even_under_umask_0(make_daemon, workdir):
    daemon = make_daemon(start=False)
    daemon.start(popen_kwargs={"umask": 0})
    with Client(daemon.socket_path) as client:
        client.put("a", {"secret": "payload"})
        (lease,) = client.reserve("w")
        client.compact()
        client.ack(lease)
    directory = Path(daemon.directory)
    names = sorted(os.listdir(directory))
    assert "LOCK" in names and "CURRENT" in names
    assert any(name.startswith("wal-") for name in names) and any(name.startswith("snapshot-") for name in names)
    assert stat.S_IMODE(directory.stat().st_mode) == 0o750
    for name in names:
        mode = stat.S_IMODE((directory / name).stat().st_mode)
        assert mode == 0o640, f"{name} has mode {mode:04o}"
    assert stat.S_IMODE(os.stat(daemon.socket_path).st_mode) == 0o660
    assert daemon.terminate() == 0


# -- old data the wire cannot carry (issue 12 item 3) --------------------------------------


def test_a_task_the_wire_cannot_carry_does_not_take_innocent_leases_with_it(make_daemon, workdir):
    # Written before the library refused integers beyond 64 bits: a crafted
    # frame, as an old walqueue would have written it. Once, encoding the
    # reserve answer failed as a whole: the innocent tasks leased with the
    # poisoned one were handed to no one (with max_attempts=1, dead unrun).
    from tests.unit import frames

    directory = workdir / "queue"
    directory.mkdir(mode=0o750)
    tasks = [frames.put_task("a-poison", {"n": 2**70}, max_attempts=2)]
    tasks += [frames.put_task(f"b-innocent-{number}", {"n": number}, max_attempts=1) for number in range(3)]
    (directory / frames.wal_name(1)).write_bytes(frames.frame(frames.put_record(1, *tasks)))
    daemon = make_daemon(directory=directory)
    with Client(daemon.socket_path, retry_seconds=0) as client:
        leases = client.reserve("w", limit=3, lease_seconds=60)
        # The poisoned task is leased (as written) but left out of the answer;
        # another due task takes its place.
        assert [lease.task_id for lease in leases] == [f"b-innocent-{n}" for n in range(3)], leases
        for lease in leases:
            client.ack(lease)
        stats = client.stats()
        assert (stats.completed, stats.leased, stats.ready) == (3, 1, 0), stats
        assert client.reserve("w", limit=5) == []  # nothing due: the poison's lease runs on
        with pytest.raises(InvalidRequest, match="cannot be sent"):
            client.get("a-poison")
    daemon.wait_for_log("a-poison")
    log = daemon.log()
    assert "write failed" not in log and "Traceback" not in log, log


# -- requests built to be costly to refuse (issue 12 item 4) ---------------------------------

# Generous: the daemon answers the bystander in milliseconds; scripts/bench_hostile.py
# measures the p99 (under 50 ms) on a quiet machine.
BYSTANDER_P99_BOUND_SECONDS = 0.5
BYSTANDER_MAX_BOUND_SECONDS = 2.5


def test_requests_built_to_be_costly_are_refused_cheaply_while_a_bystander_is_served(make_daemon, workdir):
    # Once: a put of ~17.8M empty lists took 2.6 GiB and stalled the loop 25.7 s;
    # an undecodable body of 17M arrays took 1.3 GiB to find its id; a
    # 600,000-item put_many took 9.3 s to refuse while a bystander waited 9.2 s;
    # a put of 17.8M one-byte integers took seconds to be refused for its JSON.
    from .hostile_requests import HOSTILE, quantile

    daemon = make_daemon()
    baseline = rss_bytes(daemon.pid)
    report_path = workdir / "bystander.json"
    with open(report_path, "w") as report:
        bystander = subprocess.Popen([sys.executable, "-m", "tests.process.hostile_requests",
                                      daemon.socket_path, "8"], stdout=report, env=child_env(), cwd=REPO)
    peak = baseline
    try:
        sock = greeted(daemon.socket_path)
        request_id = 100
        for _ in range(2):
            for kind, build in HOSTILE.items():
                request_id += 1
                sock.sendall(build(request_id))
                answer = read_message(sock)
                assert isinstance(answer, p.Error) and not answer.fatal, (kind, answer)
                # Refused before any step per value: while it arrived, or at C speed once decoded.
                assert answer.id == request_id and re.search("refused before (decoding|validating)",
                                                             answer.message), answer
                peak = max(peak, rss_bytes(daemon.pid))
        sock.sendall(p.encode(p.Stats(id=1)))  # the connection stays usable
        assert isinstance(read_message(sock), p.StatsOk)
        sock.close()
        assert bystander.wait(60) == 0
    finally:
        if bystander.poll() is None:
            bystander.kill()
            bystander.wait(10)
    outcome = json.loads(report_path.read_text())
    latencies = outcome["latencies"]
    print(f"bystander: {len(latencies)} calls, p99 {quantile(latencies, 0.99) * 1000:.1f} ms, "
          f"max {max(latencies) * 1000:.1f} ms; daemon RSS {baseline / MIB:.0f} -> {peak / MIB:.0f} MiB")
    assert outcome["errors"] == 0
    assert quantile(latencies, 0.99) < BYSTANDER_P99_BOUND_SECONDS, latencies
    assert max(latencies) < BYSTANDER_MAX_BOUND_SECONDS
    assert peak - baseline < 64 * MIB, f"RSS rose {(peak - baseline) / MIB:.0f} MiB"


def test_payloads_of_a_million_empty_lists_are_refused_and_hold_no_memory(make_daemon):
    # Issue 20 item 6: 20 puts just under the 1 MiB checked before decoding, a
    # million empty lists each (19.8 MiB sent), were stored and held 1,462 MiB
    # of the daemon's memory, again after a restart.
    from .hostile_requests import million_lists_put

    daemon = make_daemon()
    with Client(daemon.socket_path, timeout=30, retry_seconds=0) as bystander:
        bystander.put("before", {})
        baseline = rss_bytes(daemon.pid)
        sock = greeted(daemon.socket_path)
        for number in range(20):
            sock.sendall(million_lists_put(100 + number, task_id=f"lists-{number}"))
            answer = read_message(sock)
            assert isinstance(answer, p.Error) and not answer.fatal and answer.id == 100 + number, answer
            assert answer.error == "InvalidRequest" and "objects and arrays" in answer.message, answer
            assert bystander.put(f"between-{number}", {}) == f"between-{number}"
        sock.close()
        grown = rss_bytes(daemon.pid) - baseline
        assert bystander.stats().ready == 21, "none of the 20 was stored"
    assert grown < 64 * MIB, f"RSS rose {grown / MIB:.0f} MiB"
    assert daemon.terminate() == 0
    with Queue(daemon.directory) as queue:
        assert [view.task_id for view in queue.tasks() if view.task_id.startswith("lists-")] == []


# -- frames left half-sent on many connections (issue 12 item 5) ---------------------------


def test_idle_half_sent_frames_cannot_block_a_bystander_s_large_put_many(make_daemon):
    # Once the input budget counted declared bytes and a frame in progress had
    # no deadline: fifteen connections that sent a ~17 MiB length prefix and
    # one byte held the budget for ever, and a bystander's 1.5 MB put_many
    # failed after 16.8 s with "[Errno 11] Resource temporarily unavailable".
    daemon = make_daemon()
    idle = []
    try:
        for _ in range(15):
            sock = greeted(daemon.socket_path)
            sock.sendall(struct.pack(">I", p.MAX_BODY_BYTES) + b"\x85")
            idle.append(sock)
        requests = [{"task_id": f"big-{index:05d}", "payload": {"pad": "x" * 60}} for index in range(15_000)]
        with Client(daemon.socket_path, timeout=30, retry_seconds=0) as bystander:
            bystander.stats()
            started = time.monotonic()
            assert len(bystander.put_many(requests)) == 15_000
            elapsed = time.monotonic() - started
        assert elapsed < 5.0, f"the bystander's put_many took {elapsed:.1f} s"
    finally:
        for sock in idle:
            sock.close()


@pytest.mark.parametrize("chained", [3, 6])
def test_chained_frame_deadlines_cannot_starve_a_bystander_s_large_put_many(make_daemon, chained):
    # Issue 20 item 4: K near-empty 17 MiB frames, filler to the 256 MiB budget,
    # one more byte on each but the first. A waiting frame's deadline once
    # stopped and started afresh when it could read, so the K frames took
    # their 27 s in turn: the bystander's 1.5 MB put_many waited 67.7 s (K=3)
    # and 148.6 s (K=6). Admitted within 5 s whatever K.
    daemon = make_daemon()
    held: list[socket.socket] = []
    try:
        chain = []
        for _ in range(chained):
            sock = greeted(daemon.socket_path)
            sock.sendall(struct.pack(">I", p.MAX_BODY_BYTES) + b"\x85")
            chain.append(sock)
        held += chain
        filler = struct.pack(">I", p.MAX_BODY_BYTES) + bytes(p.MAX_BODY_BYTES - 1)  # all but the last byte
        for _ in range(-(-256 * MIB // len(filler))):  # to the budget, and past it
            sock = greeted(daemon.socket_path)
            held.append(sock)
            send_until_blocked(sock, filler, 10)  # the last may wait for room
        for sock in chain[1:]:
            sock.sendall(b"\x00")
        requests = [{"task_id": f"big-{index:05d}", "payload": {"pad": "x" * 60}} for index in range(15_000)]
        with Client(daemon.socket_path, timeout=60, retry_seconds=0) as bystander:
            bystander.stats()
            started = time.monotonic()
            assert len(bystander.put_many(requests)) == 15_000
            elapsed = time.monotonic() - started
        print(f"{chained} chained frames: the bystander's put_many took {elapsed:.2f} s")
        assert elapsed < 5.0, f"the bystander's put_many took {elapsed:.1f} s with {chained} chained frames"
    finally:
        for sock in held:
            sock.close()
    assert daemon.terminate() == 0


# -- a directory a restart cannot fix (issue 12 item 8) ------------------------------------


def test_a_directory_in_place_of_current_tmp_stops_the_start_with_exit_5(make_daemon, workdir):
    # Once exit 1, which Restart=on-failure retried for ever.
    with Queue(workdir / "queue") as queue:
        queue.put("a", {})
    (workdir / "queue" / "CURRENT.tmp").mkdir()
    daemon = make_daemon(start=False)
    daemon.start(wait_ready=False)
    assert daemon.proc.wait(30) == 5, daemon.log()
    assert "CURRENT.tmp" in daemon.log() and "restarting will not help" in daemon.log()


@pytest.mark.parametrize("kind", ["directory", "fifo"])
@pytest.mark.parametrize("entry", ["CURRENT", "snapshot", "segment", "LOCK"])
def test_an_entry_of_the_wrong_type_stops_the_start_with_exit_5_at_once(make_daemon, workdir, entry, kind):
    """Issue 20 item 10: a directory there exited 1 (restarted for ever); a FIFO hung open()
    for ever while EXTEND_TIMEOUT_USEC kept systemd waiting."""
    directory = workdir / "queue"
    with Queue(directory) as queue:
        queue.put("a", {})
        queue.compact()
        queue.put("b", {})
    names = {"CURRENT": "CURRENT", "LOCK": "LOCK",
             "snapshot": next(name for name in os.listdir(directory) if name.startswith("snapshot-")),
             "segment": next(name for name in os.listdir(directory) if name.startswith("wal-"))}
    name = names[entry]
    os.unlink(directory / name)
    if kind == "directory":
        os.mkdir(directory / name)
    else:
        os.mkfifo(directory / name)
    daemon = make_daemon(start=False)
    daemon.start(wait_ready=False)
    assert daemon.proc.wait(30) == 5, daemon.log()
    assert f"{name} is a {'directory' if kind == 'directory' else 'FIFO'}, not a file" in daemon.log()
    assert "restarting will not help" in daemon.log()


def test_a_queue_path_that_is_a_file_stops_the_start_with_exit_5(make_daemon, workdir):
    (workdir / "queue").write_text("not a directory")  # once a usage error (2), as if mistyped
    daemon = make_daemon(start=False)
    daemon.start(wait_ready=False)
    assert daemon.proc.wait(30) == 5, daemon.log()
    assert f"{workdir}/queue is not a directory" in daemon.log()


@pytest.mark.skipif(os.geteuid() != 0, reason="a directory and a file of another user need root")
def test_a_root_daemon_never_serves_an_attackers_directory_however_the_link_is_flipped(make_daemon, workdir):
    """Issue 20 item 1, as the attacker ran it: a link in a directory the attacker may write
    (group-writable, not sticky) is flipped between a safe root-owned queue and the
    attacker's own, holding a WAL segment the attacker still owns. The old daemon served
    the attacker's directory within 3 starts; now the link's holder is judged, every start
    is refused, and nothing of the attacker's changes."""
    import threading

    shared = workdir / "shared"
    shared.mkdir()
    shared.chmod(0o770)
    os.chown(shared, 0, 12345)   # the attacker's group may write it
    safe = workdir / "safe"
    safe.mkdir(mode=0o750)
    attackers = workdir / "attackers"
    attackers.mkdir(mode=0o755)
    planted = attackers / "wal-00000000000000000001.log"
    planted.write_bytes(b"")
    os.chown(attackers, 12345, 12345)
    os.chown(planted, 12345, 12345)
    link = shared / "queue"
    link.symlink_to(safe)
    stop = threading.Event()

    def flip() -> None:
        spare = shared / "spare"
        while not stop.is_set():
            for target in (attackers, safe):
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(spare)
                os.symlink(target, spare)
                os.replace(spare, link)

    flipper = threading.Thread(target=flip, daemon=True)
    flipper.start()
    try:
        for _ in range(5):
            daemon = make_daemon(directory=link, start=False)
            daemon.start(wait_ready=False)
            assert daemon.proc.wait(30) == 6, daemon.log()
            assert f"{shared}, which holds the symbolic link {link}" in daemon.log()
    finally:
        stop.set()
        flipper.join(10)
    assert planted.read_bytes() == b"" and sorted(os.listdir(attackers)) == [planted.name]
    assert os.listdir(safe) == []


@pytest.mark.skipif(os.geteuid() != 0 or not shutil.which("unshare"),
                    reason="needs root and unshare(1) for a private read-only mount")
def test_a_read_only_file_system_at_start_exits_5(workdir):
    directory = workdir / "queue"
    with Queue(directory) as queue:
        queue.put("a", {})
    script = (f"mount --bind {directory} {directory} && mount -o remount,ro,bind {directory} && "
              f"exec {sys.executable} -m walqueue.daemon.cli serve {directory} --socket {workdir}/wq.sock")
    result = subprocess.run(["unshare", "-m", "sh", "-c", script], capture_output=True, text=True,
                            env=child_env(), cwd=REPO, timeout=60)
    if "mount:" in result.stderr:
        pytest.skip(f"no private mounts here: {result.stderr.strip()}")
    assert result.returncode == 5, result.stderr
    assert "Read-only file system" in result.stderr and "restarting will not help" in result.stderr


def test_a_payload_with_a_key_twice_is_refused_and_nothing_is_stored(daemon):
    # msgspec lets the last of two equal keys win: this put once stored {"k": 2}.
    def entry(key: str, value) -> bytes:
        return p.encode_value(key) + p.encode_value(value)

    payload = b"\x82" + entry("k", 1) + entry("k", 2)
    body = (b"\x84" + entry("type", "put") + entry("id", 5) + entry("task_id", "twice")
            + p.encode_value("payload") + payload)
    sock = greeted(daemon.socket_path)
    sock.sendall(p.frame(body) + p.encode(p.Get(id=6, task_id="twice")))
    refused, answer = read_message(sock), read_message(sock)
    assert isinstance(refused, p.Error) and not refused.fatal and refused.id == 5, refused
    assert "key 'k' appears twice in request['payload']" in refused.message
    assert answer == p.TaskOk(id=6, task=None)
    sock.close()


def test_a_directory_others_can_write_is_refused_with_exit_6_before_any_file_is_opened(make_daemon, workdir):
    """Issue 12 item 1: whoever can write into the directory could plant a link where the
    daemon writes. walqueued refuses to start (the library's Queue only warns) and says
    what to chmod; it opens nothing, not even LOCK."""
    directory = workdir / "queue"
    directory.mkdir()
    directory.chmod(0o777)
    daemon = make_daemon(start=False)
    daemon.start(wait_ready=False)
    assert daemon.proc.wait(30) == 6, daemon.log()
    assert f"chmod go-w {directory}" in daemon.log()
    assert os.listdir(directory) == []
    directory.chmod(0o750)
    assert make_daemon().terminate() == 0  # the same directory, made safe, serves


@pytest.mark.skipif(os.geteuid() != 0, reason="giving the directory to another user needs root")
def test_a_root_daemon_refuses_a_directory_another_user_owns_and_never_follows_its_links(
        make_daemon, workdir):
    """The attack of issue 12 item 1: as root, a daemon on a directory owned by another
    user followed that user's `wal-...log -> /root-owned-file`. Now it refuses to start;
    and a link planted after the start is never followed (O_NOFOLLOW)."""
    directory = workdir / "queue"
    directory.mkdir(mode=0o750)
    victim = workdir / "root-owned-file"
    victim.write_bytes(b"precious")
    (directory / "CURRENT.tmp").symlink_to(victim)
    os.chown(directory, 12345, 12345)
    daemon = make_daemon(start=False)
    daemon.start(wait_ready=False)
    assert daemon.proc.wait(30) == 6, daemon.log()
    assert "owned by uid 12345" in daemon.log() and f"chown root {directory}" in daemon.log()
    assert victim.read_bytes() == b"precious"


def deleted_files_held(pid: int) -> int:
    """How many deleted files process ``pid`` holds open (as /proc/PID/fd shows them)."""
    held = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            held += os.readlink(f"/proc/{pid}/fd/{fd}").endswith(" (deleted)")
        except FileNotFoundError:  # closed meanwhile
            continue
    return held


def test_back_to_back_compact_requests_cannot_pile_up_deleted_files(make_daemon):
    daemon = make_daemon()
    with Client(daemon.socket_path) as client:
        # A snapshot of ~2 MiB: each compaction deletes the last one, too big to free at once.
        client.put_many([PutRequest(f"t{n:05}", {"blob": "x" * 500}) for n in range(3000)])
        held = []
        for n in range(30):
            client.put(f"r{n:02}", {})
            assert client.compact() == client.stats().last_seq
            held.append(deleted_files_held(daemon.pid))
        assert max(held) <= MAX_FILES_BEING_FREED, held
        wait_until(lambda: deleted_files_held(daemon.pid) == 0, 60, "every deleted file freed")
        assert client.stats().completed == 0 and client.get("r29") is not None
    assert daemon.terminate() == 0
