"""walqueued as a real process: every request type, pipelining, group commit,
blocking reserve, the real clock, signals, crashes, bad input and failures."""

import json
import os
import re
import signal
import socket
import stat
import struct
import subprocess
import sys
import time

import pytest

import walqueue
from walqueue import InvalidRequest, KeyConflict, PutRequest, QueueClosed, StaleLease, speedups
from walqueue import protocol as p
from walqueue.client import Client, Connection, DaemonUnavailable

from .daemon import child_env, read_message, wait_until

HOOK = ("--test-hook", "tests.process.hooks:hook")


def raw_connect(path: str) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(path)
    return sock


def hello(sock: socket.socket) -> None:
    sock.sendall(p.encode(p.Hello(id=1, version=p.PROTOCOL_VERSION)))
    assert isinstance(read_message(sock), p.HelloOk)


def test_every_request_type_round_trips_through_the_daemon(daemon):
    with Client(daemon.directory.parent / "wq.sock") as client:
        assert client.put("a", {"n": 1}) == "a"
        assert client.put("a", {"n": 1}) == "a"  # identical retry
        with pytest.raises(KeyConflict):
            client.put("a", {"n": 2})
        assert client.put_many([PutRequest("b", {}), {"task_id": "c", "payload": {"l": [1, 2]}}]) == ["b", "c"]
        assert client.put_many([]) == []
        leases = client.reserve("w1", lease_seconds=60, limit=2)
        assert [lease.task_id for lease in leases] == ["a", "b"]
        assert leases[0].payload == {"n": 1} and leases[0].generation == 1
        client.ack(leases[0])
        with pytest.raises(StaleLease) as stale:
            client.ack(leases[0])
        assert (stale.value.task_id, stale.value.status, stale.value.generation) == ("a", "completed", 1)
        touched = client.touch(leases[1], lease_seconds=120)
        assert touched.deadline >= leases[1].deadline and touched.generation == leases[1].generation
        client.release(leases[1], delay=0)
        assert client.get("b").status == "ready"
        assert client.get("missing") is None
        client.put("d", {}, max_attempts=1)
        (lease_d,) = [lease for lease in client.reserve("w2", limit=3) if lease.task_id == "d"]
        client.release(lease_d)
        assert client.get("d").status == "dead"
        assert [task.task_id for task in client.tasks("dead")] == ["d"]
        assert client.revive(["d", "d"]) == ["d"]
        assert client.revive([]) == []
        with pytest.raises(InvalidRequest):
            client.revive(["a"])
        assert [task.task_id for task in client.tasks()] == ["a", "b", "c", "d"]
        stats = client.stats()
        assert (stats.completed, stats.dead) == (1, 0)
        seq = client.compact()
        assert seq == stats.last_seq and client.stats().snapshot_seq == seq
        with pytest.raises(InvalidRequest):
            client.reserve("", lease_seconds=0)
        with pytest.raises(InvalidRequest):
            client.put("e", {"bad": float("nan")})
        with pytest.raises(InvalidRequest):
            client.tasks("bogus")
        # Errors never cost the connection: the same client keeps working.
        assert client.put("e", {}, delay=5) == "e"
        assert client.get("e").available_at >= int(time.time()) + 4


def test_walqueued_reports_its_version_to_a_version_2_hello_and_on_its_command_line(daemon):
    sock = raw_connect(daemon.socket_path)
    sock.sendall(p.encode(p.Hello(id=1, version=2)) + p.encode(p.DaemonStatsReq(id=2)))
    answer = read_message(sock)
    assert (answer.version, answer.walqueue_version) == (2, walqueue.__version__)
    assert read_message(sock).stats.version == walqueue.__version__
    sock.close()
    with Client(daemon.socket_path) as client:  # this package's clients announce the newest version
        assert client.daemon_stats().version == walqueue.__version__
        assert client.daemon_stats().speedups == speedups.PATH   # protocol version 7
    version_1 = raw_connect(daemon.socket_path)  # a version-1 client is sent version 1's fields
    version_1.sendall(p.encode(p.Hello(id=1, version=1)) + p.encode(p.DaemonStatsReq(id=2)))
    assert read_message(version_1).walqueue_version == ""
    assert read_message(version_1).stats.version == ""
    version_1.close()
    printed = subprocess.run([sys.executable, "-m", "walqueue.daemon.cli", "--version"], env=child_env(),
                             capture_output=True, text=True, timeout=60)
    assert printed.returncode == 0 and printed.stdout == f"walqueued {walqueue.__version__}\n{speedups.describe()}\n"


def test_pipelined_requests_are_answered_by_id(daemon):
    connection = Connection(daemon.socket_path)
    requests = [p.Put(id=0, task_id=f"t{index:03d}", payload={"i": index}) for index in range(200)]
    requests.append(p.Get(id=0, task_id="t007"))
    ids = connection.send(*requests)
    # Read the answers in reverse order: the connection keeps the others by id.
    answers = {request_id: connection.receive(request_id) for request_id in reversed(ids)}
    assert [answers[i][0].task_id for i in ids[:-1]] == [f"t{index:03d}" for index in range(200)]
    assert answers[ids[-1]][0].task.payload == {"i": 7}
    connection.close()
    # Connects and disconnects are logged with the peer's credentials.
    daemon.wait_for_log(f"pid={os.getpid()} uid={os.getuid()}", count=2)
    assert "disconnect" in daemon.log()


def test_group_commit_answers_many_clients_with_fewer_fsyncs_than_requests(make_daemon, workdir, client_process):
    sync_log = workdir / "syncs"
    daemon = make_daemon(*HOOK, env={"WALQUEUE_TEST_SYNC_LOG": str(sync_log)})
    processes = [client_process("pipelined_puts", daemon.socket_path, f"p{n}", 100) for n in range(4)]
    processes += [client_process("puts", daemon.socket_path, f"s{n}", 25) for n in range(4)]
    for process in processes:
        code, out, err = process.result()
        assert code == 0, err
    requests = 4 * 100 + 4 * 25
    syncs = sync_log.stat().st_size
    with Client(daemon.socket_path) as client:
        assert client.stats().ready == requests
    assert 0 < syncs < requests / 2, f"{syncs} fsyncs for {requests} durable puts"


def send_waiting_reserve(connection: Connection, worker: str, wait: float) -> int:
    """Send a reserve that will wait, and return once the daemon has parked it.

    A connection's requests are applied in order, so once the stats sent
    right behind the reserve is answered, the reserve has been handled: it
    is waiting (an event to await, not a log to poll).
    """
    reserve_id, stats_id = connection.send(p.Reserve(id=0, worker=worker, wait=wait), p.Stats(id=0))
    connection.receive(stats_id)
    return reserve_id


def test_a_parked_reserve_is_woken_by_another_process_put(daemon, client_process):
    connection = Connection(daemon.socket_path)
    reserve_id = send_waiting_reserve(connection, "w", 30)
    started = time.monotonic()
    code, out, err = client_process("puts", daemon.socket_path, "job", 1).result(timeout=20)
    assert code == 0, err
    (answer,) = connection.receive(reserve_id)
    assert [lease.task_id for lease in answer.leases] == ["job-00000"]
    assert time.monotonic() - started < 10  # far below its 30 s wait
    connection.close()


def test_parked_reserves_are_served_in_arrival_order(daemon):
    first, second = Connection(daemon.socket_path), Connection(daemon.socket_path)
    first_id = send_waiting_reserve(first, "first", 30)
    second_id = send_waiting_reserve(second, "second", 30)
    with Client(daemon.socket_path) as client:
        client.put("one", {})
        assert [lease.task_id for lease in first.receive(first_id)[0].leases] == ["one"]
        client.put("two", {})
        assert [lease.task_id for lease in second.receive(second_id)[0].leases] == ["two"]
    first.close()
    second.close()


def test_a_delay_elapsing_wakes_a_parked_reserve_without_a_request(daemon):
    with Client(daemon.socket_path) as client:
        client.put("later", {}, delay=2)
        due = client.get("later").available_at
        (lease,) = client.reserve("w", wait=20, lease_seconds=30)
    # Read off the daemon's own clock (a lease's deadline is its grant second + 30), not the
    # test's: the test's seconds also hold an fsync and however long the test waited for the CPU.
    granted = lease.deadline - 30
    assert lease.task_id == "later" and granted >= due  # not before it was due
    # Woken at the due second, not at the end of the wait, 20 s after a reserve sent no earlier
    # than the put: at least at second due - 2 + 20.
    assert granted < due + 18


def test_a_lease_expires_on_the_real_clock_and_wakes_a_waiting_worker(daemon):
    with Client(daemon.socket_path) as client:
        client.put("job", {})
        (lease,) = client.reserve("slow", lease_seconds=1)
        (again,) = client.reserve("fast", lease_seconds=30, wait=20)
        assert again.task_id == "job" and again.generation == lease.generation + 1
        # On the daemon's own clock (the grant second is the deadline - 30), not the test's, which
        # also holds the fsync of the reap and the new lease: leased again once the first lease
        # ended, and then, not when the wait, sent in the second the first lease began, ended.
        granted = again.deadline - 30
        assert lease.deadline <= granted < lease.deadline - 1 + 20
        with pytest.raises(StaleLease) as stale:
            client.ack(lease)
        assert stale.value.status == "leased" and stale.value.generation == again.generation


def test_an_expired_lease_is_reaped_by_the_daemon_on_its_own_without_any_request(daemon):
    with Client(daemon.socket_path) as client:
        client.put("once", {}, max_attempts=1)
        (lease,) = client.reserve("w", lease_seconds=1)
        # No request at all until the daemon has reaped (SPEC 8a): any request would run a turn,
        # which reaps what is due, so a poll by request could not tell its own timer did. Its
        # log says when, on its own clock (the timer is checked against the deadline, on a fake
        # clock, in tests/unit/test_loop.py).
        daemon.wait_for_log("expired 1 lease(s) at ")
        (reaped_at,) = re.findall(r"expired 1 lease\(s\) at (\d+)", daemon.log())
        assert int(reaped_at) >= lease.deadline
        assert client.get("once").status == "dead"
        assert [task.task_id for task in client.tasks("dead")] == ["once"]
        assert client.stats().leased == 0
        with pytest.raises(StaleLease) as stale:
            client.ack(lease)
        assert stale.value.status == "dead"


def test_a_reserve_wait_ends_with_no_leases(daemon):
    with Client(daemon.socket_path) as client:
        started = time.monotonic()
        assert client.reserve("w", wait=1) == []
        assert 0.9 <= time.monotonic() - started < 5
        with pytest.raises(InvalidRequest):
            client.reserve("w", wait=301)


def test_sigterm_answers_parked_reserves_closes_and_removes_the_socket(daemon, client_process):
    with Client(daemon.socket_path) as client:
        client.put("kept", {})
        # Taken before the reserver starts, so that it parks: taken after, the reserver could
        # reach the daemon first (whichever process gets the CPU), take "kept" and never park.
        client.reserve("other")
    reserver = client_process("reserve", daemon.socket_path, "w", 60)
    daemon.wait_for_log("parked reserve")
    assert daemon.terminate() == 0
    code, out, err = reserver.result(timeout=10)
    assert code == 0 and json.loads(out)["task_ids"] == [], err
    assert not os.path.exists(daemon.socket_path)
    daemon.wait_for_notification("STOPPING=1", 5)
    assert "stopped" in daemon.log()


def test_a_second_daemon_on_the_same_directory_exits_3_naming_it(daemon, make_daemon, workdir):
    second = make_daemon(socket_path=str(workdir / "other.sock"), start=False)
    second.start(wait_ready=False)
    assert second.proc.wait(15) == 3
    assert str(daemon.directory) in second.log()
    with Client(daemon.socket_path) as client:  # the first one is unaffected
        assert client.stats().ready == 0


def test_sigkill_and_restart_keep_every_answered_write(make_daemon, client_process):
    daemon = make_daemon()
    writer = client_process("puts", daemon.socket_path, "k", 100000)
    # The writer's own lines, not the queue's count, say what was answered: a put can be durable
    # (and counted by another client) before its answer reaches the writer.
    writer.wait_for_lines(50, 20)
    daemon.kill()
    code, out, err = writer.result(timeout=20)
    answered = [json.loads(line) for line in out.splitlines()]
    assert code != 0 and len(answered) >= 50
    restarted = make_daemon()  # same directory, same socket path (stale now)
    with Client(restarted.socket_path) as client:
        stored = {task.task_id for task in client.tasks()}
    assert set(answered) <= stored


def test_garbage_and_oversized_frames_close_only_their_connection(daemon):
    with Client(daemon.socket_path) as bystander:
        bystander.put("before", {})
        garbage = raw_connect(daemon.socket_path)
        hello(garbage)
        garbage.sendall(struct.pack(">I", 5) + b"\xc1\xc1\xc1\xc1\xc1")
        error = read_message(garbage)
        assert isinstance(error, p.Error) and error.fatal and error.error == "InvalidRequest"
        assert read_message(garbage) is None  # closed

        oversized = raw_connect(daemon.socket_path)
        hello(oversized)
        # Only the length prefix: the daemon must refuse without waiting for the body.
        oversized.sendall(struct.pack(">I", p.MAX_BODY_BYTES + 1))
        error = read_message(oversized)
        assert isinstance(error, p.Error) and error.fatal and str(p.MAX_BODY_BYTES) in error.message
        assert read_message(oversized) is None

        no_hello = raw_connect(daemon.socket_path)
        no_hello.sendall(p.encode(p.Stats(id=9)))
        error = read_message(no_hello)
        assert isinstance(error, p.Error) and error.id == 9 and "hello" in error.message

        wrong_version = raw_connect(daemon.socket_path)
        wrong_version.sendall(p.encode(p.Hello(id=1, version=99)))
        error = read_message(wrong_version)
        assert isinstance(error, p.Error) and "99" in error.message

        unknown_field = raw_connect(daemon.socket_path)
        hello(unknown_field)
        unknown_field.sendall(p.frame(p.encode_value({"type": "stats", "id": 3, "extra": 1})))
        error = read_message(unknown_field)
        assert isinstance(error, p.Error) and error.id == 3 and "extra" in error.message

        deep = raw_connect(daemon.socket_path)
        hello(deep)
        deep.sendall(p.frame(b"\x91" * 200_000 + b"\xc0"))
        error = read_message(deep)
        assert isinstance(error, p.Error) and error.fatal

        partial = raw_connect(daemon.socket_path)
        hello(partial)
        partial.sendall(struct.pack(">I", 1000) + b"only part of the body")
        partial.close()  # gone mid-frame

        for sock in (garbage, oversized, no_hello, wrong_version, unknown_field, deep):
            sock.close()
        assert bystander.put("after", {}) == "after"
        assert bystander.stats().ready == 2


def test_the_client_reconnects_after_a_daemon_restart(make_daemon):
    daemon = make_daemon()
    client = Client(daemon.socket_path, retry_seconds=0)  # reads are retried otherwise (walqueue.retry)
    client.put("a", {})
    assert daemon.terminate() == 0
    with pytest.raises(DaemonUnavailable):
        client.stats()
    make_daemon()
    assert client.stats().ready == 1
    assert client.put("b", {}) == "b"
    client.close()


def test_an_idle_client_does_not_notice_a_clean_daemon_restart(make_daemon):
    daemon = make_daemon()
    client = Client(daemon.socket_path)
    client.put("a", {})
    assert daemon.terminate() == 0
    make_daemon()
    # The old connection was closed by the daemon while idle: the client
    # sees that before sending and reconnects, so even a reserve just works.
    assert [lease.task_id for lease in client.reserve("w")] == ["a"]
    client.close()


def test_a_put_is_retried_across_a_reconnect(make_daemon):
    daemon = make_daemon()
    client = Client(daemon.socket_path, retry_seconds=20)
    client.put("a", {})
    daemon.kill()
    # The put's first attempt fails on the dead connection; the client retries
    # until the restarted daemon answers.
    restarted = make_daemon(start=False)
    restarted.start(wait_ready=False)
    assert client.put("b", {}) == "b"
    restarted.wait_for_notification("READY=1", 10)
    assert {task.task_id for task in client.tasks()} == {"a", "b"}
    client.close()


def test_a_failed_write_is_answered_with_an_error_and_service_continues(make_daemon, workdir):
    fail_file = workdir / "fail"
    daemon = make_daemon(*HOOK, env={"WALQUEUE_TEST_FAIL_FILE": str(fail_file)})
    with Client(daemon.socket_path, retry_seconds=0) as client:
        client.put("a", {})
        fail_file.touch()
        connection = Connection(daemon.socket_path)
        (request_id,) = connection.send(p.Put(id=0, task_id="b", payload={}))
        (answer,) = connection.receive(request_id)
        assert isinstance(answer, p.Error) and answer.error == "QueueClosed"
        assert "no space left" in answer.message
        assert not fail_file.exists()
        assert client.get("b") is None
        assert client.put("b", {}) == "b"
        assert [task.task_id for task in client.tasks()] == ["a", "b"]
        connection.close()
    assert "reopened" in daemon.log()


def test_a_bug_in_request_handling_stops_the_daemon_loudly_instead_of_reopening(make_daemon):
    # The stats handler of this daemon raises a TypeError (tests/process/broken_hook.py).
    daemon = make_daemon("--test-hook", "tests.process.broken_hook:hook",
                         env={"WALQUEUE_BROKEN": "stats_handler_has_a_bug"})
    with Client(daemon.socket_path, retry_seconds=0) as client:
        client.put("a", {})
        with pytest.raises(DaemonUnavailable):
            client.stats()
    assert daemon.proc.wait(10) == 1
    log = daemon.log()
    assert "Traceback" in log and "TypeError: stats() takes a bug" in log
    assert "reopened" not in log and "write failed" not in log
    restarted = make_daemon()  # what was answered before the bug is kept
    with Client(restarted.socket_path) as client:
        assert client.get("a").status == "ready"


def test_notify_socket_gets_ready_watchdog_and_stopping(make_daemon):
    daemon = make_daemon(env={"WATCHDOG_USEC": "200000"})
    assert "READY=1" in daemon.wait_for_notification("READY=1", 1)
    daemon.wait_for_notification("WATCHDOG=1", 5)
    assert daemon.terminate() == 0
    daemon.wait_for_notification("STOPPING=1", 5)


def test_a_stale_socket_file_is_replaced_and_the_mode_applied(make_daemon, workdir):
    path = str(workdir / "stale.sock")
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(path)
    leftover.close()  # the file stays, nobody listens: a dead owner's socket
    daemon = make_daemon(socket_path=path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o660
    with Client(path) as client:
        assert client.stats().ready == 0
    assert daemon.terminate() == 0
    other = make_daemon("--socket-mode", "0600", socket_path=path)
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert other.terminate() == 0


def test_the_default_socket_lives_in_the_directory(make_daemon, workdir):
    daemon = make_daemon(start=False)
    daemon.start(command=[*daemon.command()[:5], "--log-level", "debug"])
    with Client(daemon.directory) as client:
        assert client.put("x", {}) == "x"


def test_connections_past_the_bound_are_refused_others_keep_working(make_daemon):
    daemon = make_daemon("--max-connections", "2")
    first, second = Client(daemon.socket_path), Client(daemon.socket_path)
    first.stats(), second.stats()
    with pytest.raises(DaemonUnavailable, match="too many connections"):
        Client(daemon.socket_path, retry_seconds=0).stats()  # a read is retried otherwise
    assert first.put("a", {}) == "a"
    first.close()
    wait_until(lambda: "disconnect" in daemon.log(), 10, "the disconnect")
    third = Client(daemon.socket_path)
    assert third.stats().ready == 1
    second.close(), third.close()


def test_socket_activation_uses_the_passed_descriptor(make_daemon, workdir):
    path = str(workdir / "activated.sock")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    daemon = make_daemon(start=False, socket_path=str(workdir / "unused.sock"))
    # Like systemd: the socket is fd 3 and LISTEN_PID names the daemon itself.
    launcher = ("import os, sys; os.dup2(int(sys.argv[1]), 3); "
                "os.environ.update(LISTEN_PID=str(os.getpid()), LISTEN_FDS='1'); "
                "os.execv(sys.executable, [sys.executable, *sys.argv[2:]])")
    command = [daemon.command()[0], "-c", launcher, str(listener.fileno()), *daemon.command()[1:]]
    daemon.start(command=command, popen_kwargs={"pass_fds": (listener.fileno(),)})
    listener.close()
    with Client(path) as client:
        assert client.put("a", {}) == "a"
    assert not os.path.exists(str(workdir / "unused.sock"))
    assert daemon.terminate() == 0
    assert os.path.exists(path)  # systemd's socket is not ours to remove


def test_compaction_happens_on_its_own_past_the_threshold(make_daemon):
    # Ratio 0: the floor alone decides. A forked child writes each snapshot in
    # the background, so the WAL is back under the floor once the last one is published.
    daemon = make_daemon("--compact-wal-bytes", "2000", "--compact-wal-ratio", "0")
    with Client(daemon.socket_path) as client:
        for index in range(30):
            client.put(f"t{index}", {"pad": "x" * 50})
        wait_until(lambda: (lambda stats: stats.snapshot_seq > 0 and stats.wal_bytes <= 2000)(client.stats()),
                   20, "a background compaction to publish")
    assert "compacted" in daemon.log()


def test_the_worker_helper_acks_releases_and_keeps_long_leases(daemon, client_process):
    with Client(daemon.socket_path) as client:
        client.put("ok", {})
        client.put("bad", {"fail": True}, max_attempts=1)
        # Past its 3 s lease, which (granted in a whole second of the daemon's clock) lasts 2 to 3 s:
        # the worker touches every second, so the first touch has a second to spare. A 2 s lease
        # lasted as little as 1 s, and its first touch, a second after the answer, came too late
        # whenever the grant fell late in its second.
        client.put("slow", {"sleep": 3.5})
        worker = client_process("work", daemon.socket_path, "helper", 3, 3)
        code, out, err = worker.result(timeout=30)
        assert code == 0, err
        assert json.loads(out) == {"handled": 3, "processed": 2, "failed": 1}
        assert client.get("ok").status == "completed"
        assert client.get("bad").status == "dead"
        slow = client.get("slow")
        # Touched in the background: acked under its first and only lease.
        assert (slow.status, slow.generation) == ("completed", 1)


def test_the_daemon_exits_non_zero_when_the_reopen_after_a_failed_write_fails(make_daemon, workdir):
    fail_file = workdir / "fail"
    segment = workdir / "queue" / f"wal-{1:020d}.log"
    daemon = make_daemon(*HOOK, env={"WALQUEUE_TEST_FAIL_FILE": str(fail_file),
                                     "WALQUEUE_TEST_CORRUPT_SEGMENT": str(segment)})
    with Client(daemon.socket_path, retry_seconds=0) as client:
        client.put("a", {})
        fail_file.touch()
        with pytest.raises((QueueClosed, DaemonUnavailable)):
            client.put("b", {})
    assert daemon.proc.wait(10) == 4
    assert "reopening" in daemon.log() and "CorruptStore" in daemon.log()
    daemon.wait_for_notification("STOPPING=1", 5)


def test_long_listings_arrive_in_chunks_and_are_reassembled(daemon):
    with Client(daemon.socket_path) as client:
        client.put_many([{"task_id": f"t{index:02d}", "payload": {"pad": "x" * 100_000}}
                         for index in range(25)])
        tasks = client.tasks()
        assert [task.task_id for task in tasks] == [f"t{index:02d}" for index in range(25)]
        leases = client.reserve("w", limit=25)
        assert len(leases) == 25 and all(len(lease.payload["pad"]) == 100_000 for lease in leases)
    connection = Connection(daemon.socket_path)
    (request_id,) = connection.send(p.Tasks(id=0))
    messages = connection.receive(request_id)
    assert len(messages) > 1 and [m.more for m in messages] == [True] * (len(messages) - 1) + [False]
    connection.close()


@pytest.mark.parametrize("signal_number", [signal.SIGTERM, signal.SIGINT])
def test_a_stop_signal_mid_stream_answers_only_durable_writes_and_exits_0(make_daemon, signal_number):
    daemon = make_daemon()
    connection = Connection(daemon.socket_path)
    ids = connection.send(*[p.Put(id=0, task_id=f"t{index:04d}", payload={"i": index})
                            for index in range(2000)])
    connection.receive(ids[0])  # the daemon is working through the stream
    daemon.proc.send_signal(signal_number)
    answered = []
    for request_id in ids[1:]:
        try:
            (answer,) = connection.receive(request_id, timeout=10)
        except DaemonUnavailable:
            break  # closed by the stopping daemon: the rest were never applied or answered
        assert isinstance(answer, p.PutOk)
        answered.append(answer.task_id)
    assert daemon.proc.wait(10) == 0
    connection.close()
    restarted = make_daemon()
    with Client(restarted.socket_path) as client:
        stored = {task.task_id for task in client.tasks()}
    assert {"t0000", *answered} <= stored


def test_a_long_recovery_extends_the_start_timeout_before_ready(make_daemon, workdir):
    first = make_daemon()
    with Client(first.socket_path) as client:
        client.put("a", {})
    assert first.terminate() == 0
    with open(workdir / "queue" / f"wal-{1:020d}.log", "ab") as segment:
        segment.write(b"\0\0\0\x40torn")  # an incomplete last frame: a torn tail
    slow = make_daemon(*HOOK, env={"WALQUEUE_TEST_RECOVERY_SECONDS": "2.5"}, start=False)
    slow.start(wait_ready=False)
    progress = slow.wait_for_notification("EXTEND_TIMEOUT_USEC=30000000", 15)
    assert "STATUS=recovering" in progress
    slow.wait_for_notification("READY=1", 15)
    ready_index = next(i for i, m in enumerate(slow.notifications) if "READY=1" in m.split("\n"))
    assert slow.notifications.index(progress) < ready_index
    with Client(slow.socket_path) as client:
        assert client.get("a").status == "ready"


def test_a_slow_reader_of_a_long_listing_does_not_hold_up_other_clients(daemon):
    with Client(daemon.socket_path) as client:
        for start in range(0, 120, 10):
            client.put_many([{"task_id": f"t{index:03d}", "payload": {"pad": "x" * 100_000}}
                             for index in range(start, start + 10)])
        reader = Connection(daemon.socket_path)
        (request_id,) = reader.send(p.Tasks(id=0))
        # 12 MB are due to the reader, which reads nothing yet; the daemon
        # encodes only up to its high-water mark and serves everyone else.
        for _ in range(5):
            assert client.stats().ready == 120
        messages = reader.receive(request_id)
        listed = [task.task_id for message in messages for task in message.tasks]
        assert listed == [f"t{index:03d}" for index in range(120)]
        reader.close()


def test_one_client_can_be_shared_by_threads(daemon):
    import threading

    results: dict[int, list[str]] = {}
    with Client(daemon.socket_path) as client:
        def put_some(thread: int) -> None:
            results[thread] = [client.put(f"th{thread}-{index:02d}", {"i": index}) for index in range(40)]

        threads = [threading.Thread(target=put_some, args=(n,)) for n in range(8)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(30)
        assert all(not thread.is_alive() for thread in threads)
        for thread, ids in results.items():
            assert ids == [f"th{thread}-{index:02d}" for index in range(40)]
        assert client.stats().ready == 8 * 40


def test_a_release_and_a_revive_wake_parked_reserves(daemon):
    import threading

    def reserve_in_background(results: list) -> threading.Thread:
        def run():
            with Client(daemon.socket_path) as own:
                started = time.monotonic()
                results.extend(own.reserve("parked", wait=30))
                results.append(time.monotonic() - started)

        thread = threading.Thread(target=run)
        thread.start()
        return thread

    with Client(daemon.socket_path) as client:
        client.put("job", {}, max_attempts=2)
        (lease,) = client.reserve("holder")
        woken: list = []
        thread = reserve_in_background(woken)
        daemon.wait_for_log("parked reserve")
        client.release(lease)  # attempts 1 of 2: ready again, due now
        thread.join(20)
        assert woken[0].task_id == "job" and woken[1] < 10
        client.release(woken[0])  # attempts 2 of 2: dead
        assert client.get("job").status == "dead"
        woken = []
        thread = reserve_in_background(woken)
        daemon.wait_for_log("parked reserve", count=2)
        client.revive(["job"])
        thread.join(20)
        assert woken[0].task_id == "job" and woken[1] < 10


def test_random_well_typed_requests_get_answers_never_a_dead_daemon(daemon):
    import random

    seed = random.randrange(2**32)
    rng = random.Random(seed)
    strings = ["", "a", "t1", "t2", "é", "\x00", "x" * 1025, "w"]
    integers = [0, 1, 2, -1, 3, 2**63 - 1, 2**63, 2**64 - 1, -(2**63)]
    values = [None, True, 1.5, float("nan"), float("inf"), 2**64 - 1, -(2**63), "s", b"bytes", [1, [2]], {"k": {}}]

    def text():
        return rng.choice(strings)

    def number():
        return rng.choice(integers)

    def payload():
        return {text() or "k": rng.choice(values) for _ in range(rng.randrange(3))}

    def put_item():
        return p.PutItem(task_id=text(), payload=payload(), key=rng.choice([None, text()]),
                         available_at=number(), max_attempts=number())

    makers = [
        lambda: p.Put(0, text(), payload(), rng.choice([None, text()]), number(), number()),
        lambda: p.PutMany(0, [put_item() for _ in range(rng.randrange(4))]),
        lambda: p.Reserve(0, text(), number(), number(), rng.choice([0.0, -1.0, 301.0, float("nan")])),
        lambda: p.Ack(0, text(), text(), number()),
        lambda: p.Release(0, text(), text(), number(), number()),
        lambda: p.Touch(0, text(), text(), number(), number()),
        lambda: p.Revive(0, [text() for _ in range(rng.randrange(3))]),
        lambda: p.Get(0, text()),
        lambda: p.Tasks(0, rng.choice([None, "ready", "dead", "bogus", ""])),
        lambda: p.Stats(0),
    ]
    connection = Connection(daemon.socket_path)
    requests = [rng.choice(makers)() for _ in range(400)]
    ids = connection.send(*requests)
    for request, request_id in zip(requests, ids, strict=True):
        messages = connection.receive(request_id)
        for message in messages:
            if isinstance(message, p.Error):
                assert message.error in {"InvalidRequest", "KeyConflict", "StaleLease"}, (seed, request, message)
                assert not message.fatal, (seed, request, message)
    connection.close()
    with Client(daemon.socket_path) as client:
        client.stats()
    assert "write failed" not in daemon.log(), seed
    assert daemon.proc.poll() is None, seed


def test_a_file_that_is_not_a_socket_is_never_replaced(make_daemon, workdir):
    path = workdir / "precious"
    path.write_text("keep me")
    daemon = make_daemon(socket_path=str(path), start=False)
    daemon.start(wait_ready=False)
    assert daemon.proc.wait(15) == 2
    assert path.read_text() == "keep me"
    assert "not a socket" in daemon.log()


def test_a_socket_another_server_answers_on_is_not_taken_over(make_daemon, workdir):
    first = make_daemon()
    second = make_daemon(directory=workdir / "other-queue", socket_path=first.socket_path, start=False)
    second.start(wait_ready=False)
    assert second.proc.wait(15) == 3
    with Client(first.socket_path) as client:
        assert client.stats().ready == 0


def test_a_connection_that_never_says_hello_is_closed(make_daemon):
    daemon = make_daemon("--hello-timeout", "0.5")
    silent = raw_connect(daemon.socket_path)
    started = time.monotonic()
    error = read_message(silent)
    assert isinstance(error, p.Error) and error.fatal and "hello" in error.message
    assert read_message(silent) is None and time.monotonic() - started < 5
    silent.close()
    with Client(daemon.socket_path) as client:  # a prompt client is unaffected
        assert client.stats().ready == 0


def test_a_listing_in_progress_ends_with_an_error_when_the_queue_is_reopened(make_daemon, workdir):
    from walqueue.client import result

    fail_file = workdir / "fail"
    daemon = make_daemon(*HOOK, env={"WALQUEUE_TEST_FAIL_FILE": str(fail_file)})
    with Client(daemon.socket_path, retry_seconds=0) as client:
        for start in range(0, 120, 10):
            client.put_many([{"task_id": f"t{index:03d}", "payload": {"pad": "x" * 100_000}}
                             for index in range(start, start + 10)])
        reader = Connection(daemon.socket_path)
        (request_id,) = reader.send(p.Tasks(id=0))
        client.stats()  # the listing has begun (answers are in order per turn)
        fail_file.touch()
        with pytest.raises(QueueClosed):
            client.put("boom", {})
        messages = reader.receive(request_id)
        assert isinstance(messages[-1], p.Error) and messages[-1].error == "QueueClosed"
        assert all(isinstance(message, p.TaskList) and message.more for message in messages[:-1])
        with pytest.raises(QueueClosed):
            result(messages)
        reader.close()
        assert len(client.tasks()) == 120  # listing again works


def test_socket_paths_longer_than_sun_path_work(make_daemon, workdir):
    deep = workdir / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "walqueued.sock")
    assert len(path) > 108
    daemon = make_daemon(socket_path=path)
    with Client(path) as client:
        assert client.put("a", {}) == "a"
    assert daemon.terminate() == 0
    assert not os.path.exists(path)


def test_sigkill_under_concurrent_load_loses_no_answered_put_or_ack(make_daemon, client_process):
    answered_puts: set[str] = set()
    answered_acks: set[str] = set()
    for round_number in range(2):
        daemon = make_daemon()
        workers = [client_process("logged_cycles", daemon.socket_path, f"r{round_number}w{n}") for n in range(3)]
        with Client(daemon.socket_path) as watcher:
            target = len(answered_puts) + 150
            wait_until(lambda target=target: watcher.stats().last_seq >= target, 20, "load on the daemon")
        daemon.kill()
        for worker in workers:
            code, out, err = worker.result(timeout=20)
            assert code == 0, err
            for line in out.splitlines():
                kind, task_id = json.loads(line)
                (answered_puts if kind == "put" else answered_acks).add(task_id)
    restarted = make_daemon()
    with Client(restarted.socket_path) as client:
        tasks = {task.task_id: task.status for task in client.tasks()}
    assert answered_puts <= set(tasks)
    assert all(tasks[task_id] == "completed" for task_id in answered_acks)
    assert len(answered_acks) > 50


def test_a_bad_socket_mode_is_a_usage_error(make_daemon):
    daemon = make_daemon("--socket-mode", "0999", start=False)
    daemon.start(wait_ready=False)
    assert daemon.proc.wait(15) == 2
    assert "octal" in daemon.log()


def test_three_hundred_parked_workers_each_get_exactly_one_task(daemon):
    waiting = [Connection(daemon.socket_path) for _ in range(300)]
    ids = [connection.send(p.Reserve(id=0, worker=f"w{n}", wait=30))[0] for n, connection in enumerate(waiting)]
    daemon.wait_for_log("parked reserve", count=300)
    with Client(daemon.socket_path) as client:
        started = time.monotonic()
        for index in range(300):
            client.put(f"t{index:03d}", {})
        received = []
        for connection, request_id in zip(waiting, ids, strict=True):
            (answer,) = connection.receive(request_id, timeout=10)
            received.append([lease.task_id for lease in answer.leases])
            connection.close()
        elapsed = time.monotonic() - started
        assert all(len(task_ids) == 1 for task_ids in received)
        assert sorted(task_id for task_ids in received for task_id in task_ids) == [f"t{i:03d}" for i in range(300)]
        assert client.stats().leased == 300 and elapsed < 20


def test_a_client_that_reads_late_gets_every_answer_in_order(daemon):
    with Client(daemon.socket_path) as bystander:
        bystander.put("wide", {"values": [0] * 100_000})  # ~100 KB per answer
        late = raw_connect(daemon.socket_path)
        hello(late)
        # 120 answers of ~100 KB: more than the 8 MiB high-water mark.
        late.sendall(b"".join(p.encode(p.Get(id=index, task_id="wide")) for index in range(2, 122))
                     + p.encode(p.Stats(id=122)))
        # Only about 8 MiB of its answers are built; the rest of its requests
        # wait for it to read, and other clients are served meanwhile.
        assert bystander.put("meanwhile", {}) == "meanwhile"
        answers = [read_message(late) for _ in range(121)]
        assert [answer.id for answer in answers] == list(range(2, 123))
        assert all(len(answer.task.payload["values"]) == 100_000 for answer in answers[:-1])
        assert answers[-1].stats.ready == 2  # applied after "meanwhile", in its own order
        late.close()


def test_one_connection_cannot_park_unbounded_reserves(daemon):
    from walqueue.daemon.service import MAX_PARKED_PER_CONNECTION

    sock = raw_connect(daemon.socket_path)
    hello(sock)
    count = MAX_PARKED_PER_CONNECTION + 1
    sock.sendall(b"".join(p.encode(p.Reserve(id=index, worker="w", wait=30)) for index in range(2, 2 + count)))
    error = read_message(sock)
    assert isinstance(error, p.Error) and error.id == 1 + count and not error.fatal
    assert error.error == "InvalidRequest" and "too many waiting reserves" in error.message
    with Client(daemon.socket_path) as client:
        client.put("job", {})  # goes to the first parked reserve
    assert read_message(sock).id == 2
    sock.close()


def test_a_client_with_descriptors_above_1024_keeps_its_connection(daemon):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"the open-file limit {hard} is below 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    fillers = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]
    try:
        with Client(daemon.socket_path) as client:
            client.stats()
            first = client._connection
            for _ in range(3):
                client.stats()
            assert client._connection is first  # no reconnect per call
    finally:
        for fd in fillers:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_many_unread_listings_do_not_stall_other_clients(daemon):
    with Client(daemon.socket_path) as bystander:
        for start in range(0, 8_000, 4_000):
            bystander.put_many([{"task_id": f"t{index:06d}", "payload": {"pad": "x" * 1_200}}
                                for index in range(start, start + 4_000)])
        readers = []
        for _ in range(30):
            sock = raw_connect(daemon.socket_path)
            hello(sock)
            readers.append(sock)
        for sock in readers:  # back to back, so they land in the same turns
            sock.sendall(p.encode(p.Tasks(id=2)))  # ~10 MB each: past the high-water mark
        # Served meanwhile, because a turn starts at most one listing and encodes at most 2 MiB
        # of them (without those limits a stats waited ~1.5 s here, with them ~0.04 s): that is
        # counted turn by turn in tests/unit/test_hostile_loop.py, not timed here, where a busy
        # machine stretches any wait.
        for _ in range(20):
            assert bystander.stats().ready == 8_000
        first = readers[0]
        first.settimeout(30)
        listed = []
        while True:
            message = read_message(first)
            listed += message.tasks
            if not message.more:
                break
        assert len(listed) == 8_000
        for sock in readers:
            sock.close()


def test_a_worker_killed_while_parked_is_never_handed_a_lease(daemon, client_process):
    doomed = client_process("reserve", daemon.socket_path, "doomed", 30)
    daemon.wait_for_log("parked reserve")
    doomed.proc.kill()
    doomed.proc.wait(10)
    with Client(daemon.socket_path) as client:
        client.put("job", {}, max_attempts=1)
        (lease,) = client.reserve("alive", wait=5)
        assert (lease.task_id, lease.worker, lease.attempts) == ("job", "alive", 1)


def test_a_reserve_from_a_peer_that_already_closed_leases_nothing(daemon):
    with Client(daemon.socket_path) as client:
        client.put("job", {})
        sock = raw_connect(daemon.socket_path)
        hello(sock)
        # Paused, the daemon finds the request and the end of stream together,
        # as after a worker that died right after sending.
        with daemon.paused():
            sock.sendall(p.encode(p.Reserve(id=2, worker="gone")))
            sock.shutdown(socket.SHUT_WR)
        answer = read_message(sock)
        assert answer.id == 2 and answer.leases == []
        sock.close()
        assert client.get("job").status == "ready"


def test_before_hello_only_a_small_frame_is_accepted(daemon):
    sock = raw_connect(daemon.socket_path)
    sock.sendall(struct.pack(">I", p.MAX_HELLO_BYTES + 1))
    error = read_message(sock)
    assert isinstance(error, p.Error) and error.fatal and str(p.MAX_HELLO_BYTES) in error.message
    assert read_message(sock) is None
    sock.close()
    with Client(daemon.socket_path, name="n" * 10_000) as client:  # a long name is cut, not refused
        assert client.stats().ready == 0


def test_large_frames_still_travel_both_ways(daemon):
    with Client(daemon.socket_path) as client:
        big = {"blob": "b" * (3 * 1024 * 1024)}  # a 3 MiB frame: counted in the input budget
        assert client.put("big", big) == "big"
        assert client.get("big").payload == big
        (lease,) = client.reserve("w")
        assert lease.payload == big


def test_walqueue_ctl_calls_are_not_logged_at_info(make_daemon):
    """Issue 23: the daemon logged INFO for every ctl connect and disconnect."""
    from .test_ctl_process import ctl

    daemon = make_daemon("--log-level", "info")  # after the harness's debug: the last one wins
    for _ in range(3):
        assert ctl("--socket", daemon.socket_path, "stats").returncode == 0
    assert daemon.terminate() == 0  # every connection has been closed and logged by now
    log = daemon.log()
    assert "ready: serving" in log and "stopped" in log
    assert not re.search(r"\b(dis)?connect\b", log), log
