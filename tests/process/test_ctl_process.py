"""walqueue-ctl as a real process against a real walqueued: every command,
`reserve | ack -` through an OS pipe, a blocking reserve woken by another
process's put, the exit codes, and `verify` on the daemon's own directory
(healthy and corrupt) changing no byte."""

import json
import os
import subprocess
import sys
import time

import pytest

from walqueue.ctl.errors import (
    EXIT_CORRUPT,
    EXIT_KEY_CONFLICT,
    EXIT_NOT_FOUND,
    EXIT_PAUSED,
    EXIT_STALE_LEASE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
)

from .daemon import REPO, child_env

CTL_SECONDS = 20.0


def ctl_command(*args) -> list[str]:
    return [sys.executable, "-m", "walqueue.ctl", *map(str, args)]


def ctl(*args, input: str | None = None, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run walqueue-ctl to completion (bounded); returns its CompletedProcess."""
    return subprocess.run(ctl_command(*args), input=input, capture_output=True, text=True,
                          env=child_env(env), cwd=REPO, timeout=CTL_SECONDS)


def json_lines(result) -> list[dict]:
    assert result.returncode == 0, result.stderr
    return [json.loads(line) for line in result.stdout.splitlines()]


def fingerprint(directory) -> dict:
    return {path.name: (path.read_bytes(), path.stat().st_mtime_ns)
            for path in sorted(directory.iterdir()) if path.is_file()}


def test_every_command_round_trips_through_a_real_daemon(daemon):
    s = ("--socket", daemon.socket_path)
    assert json_lines(ctl(*s, "put", "a", '{"n": 1}')) == [{"task_id": "a"}]
    assert json_lines(ctl(*s, "put", "b", "-", "--key", "kb", input='{"from": "stdin"}')) == [{"task_id": "b"}]
    assert json_lines(ctl(*s, "put", "later", "--delay", "3600")) == [{"task_id": "later"}]
    assert json_lines(ctl(*s, "put", "d", "--max-attempts", "1")) == [{"task_id": "d"}]
    assert ctl(*s, "put", "a", '{"n": 2}').returncode == EXIT_KEY_CONFLICT

    (task,) = json_lines(ctl(*s, "get", "b"))
    assert (task["key"], task["payload"], task["status"]) == ("kb", {"from": "stdin"}, "ready")
    (later,) = json_lines(ctl(*s, "get", "later"))
    assert later["available_at"] >= int(time.time()) + 3590
    missing = ctl(*s, "get", "nope")
    assert missing.returncode == EXIT_NOT_FOUND and "nope" in missing.stderr

    leases = json_lines(ctl(*s, "reserve", "w", "--limit", "3", "--lease-seconds", "60"))
    assert [lease["task_id"] for lease in leases] == ["a", "b", "d"]
    a, b, d = leases
    assert ctl(*s, "ack", "a", "--worker", "w", "--generation", a["generation"]).returncode == 0
    stale = ctl(*s, "ack", "a", "--worker", "w", "--generation", a["generation"])
    assert stale.returncode == EXIT_STALE_LEASE and "completed" in stale.stderr
    (touched,) = json_lines(ctl(*s, "touch", "-", "--lease-seconds", "600", input=json.dumps(b) + "\n"))
    assert touched["task_id"] == "b" and touched["deadline"] > b["deadline"]
    assert ctl(*s, "release", "-", "--delay", "5", input=json.dumps(touched) + "\n").returncode == 0
    assert ctl(*s, "release", "d", "--worker", "w", "--generation", d["generation"]).returncode == 0

    dead_table = ctl(*s, "dead")
    assert dead_table.returncode == 0 and dead_table.stdout.splitlines()[1].split()[0] == "d"
    assert [t["task_id"] for t in json_lines(ctl(*s, "dead", "--json"))] == ["d"]
    assert json_lines(ctl(*s, "revive", "d")) == [{"task_ids": ["d"]}]
    assert ctl(*s, "revive", "d").returncode == EXIT_USAGE  # no longer dead

    (stats,) = json_lines(ctl(*s, "stats", "--json"))
    assert (stats["ready"], stats["completed"], stats["dead"]) == (3, 1, 0)
    table = ctl(*s, "stats")
    assert table.returncode == 0 and "completed" in table.stdout
    (compacted,) = json_lines(ctl(*s, "compact"))
    assert compacted["seq"] == stats["last_seq"]
    (after,) = json_lines(ctl(*s, "stats", "--json"))
    assert after["snapshot_seq"] == compacted["seq"]


def test_reserve_piped_into_ack_dash_through_a_real_pipe(daemon):
    s = ("--socket", daemon.socket_path)
    for name in ("t1", "t2", "t3"):
        assert ctl(*s, "put", name).returncode == 0
    env = child_env()
    reserve = subprocess.Popen(ctl_command(*s, "reserve", "w", "--limit", "3"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, env=env, cwd=REPO)
    ack = subprocess.Popen(ctl_command(*s, "ack", "-"), stdin=reserve.stdout, stdout=subprocess.PIPE,
                           stderr=subprocess.PIPE, env=env, cwd=REPO)
    reserve.stdout.close()  # ack holds the only read end now
    try:
        ack_out, ack_err = ack.communicate(timeout=CTL_SECONDS)
        reserve_err = reserve.communicate(timeout=CTL_SECONDS)[1]
    finally:
        for process in (reserve, ack):
            if process.poll() is None:
                process.kill()
                process.wait(5)
    assert reserve.returncode == 0, reserve_err
    assert ack.returncode == 0 and ack_out == b"", ack_err
    for name in ("t1", "t2", "t3"):
        (task,) = json_lines(ctl(*s, "get", name))
        assert task["status"] == "completed"


def test_a_waiting_reserve_is_woken_by_a_put_from_another_process(daemon):
    s = ("--socket", daemon.socket_path)
    waiting = subprocess.Popen(ctl_command(*s, "reserve", "w", "--wait", "60"), stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=child_env(), cwd=REPO)
    try:
        daemon.wait_for_log("parked reserve", timeout=10)  # the daemon logs at debug level
        started = time.monotonic()
        assert ctl(*s, "put", "wake").returncode == 0
        out, err = waiting.communicate(timeout=CTL_SECONDS)
    finally:
        if waiting.poll() is None:
            waiting.kill()
            waiting.wait(5)
    assert waiting.returncode == 0, err
    assert [json.loads(line)["task_id"] for line in out.splitlines()] == ["wake"]
    assert time.monotonic() - started < 15


def test_dir_and_environment_find_the_daemons_socket(make_daemon, workdir):
    directory = workdir / "queue"
    daemon = make_daemon(socket_path=str(directory / "walqueued.sock"))
    assert json_lines(ctl("--dir", directory, "put", "a")) == [{"task_id": "a"}]
    (task,) = json_lines(ctl("get", "a", env={"WALQUEUE_SOCKET": daemon.socket_path}))
    assert task["task_id"] == "a"


def test_no_daemon_exits_3_quickly_with_advice(workdir):
    started = time.monotonic()
    result = ctl("--socket", workdir / "none.sock", "stats")
    assert result.returncode == EXIT_UNAVAILABLE
    assert "walqueued serve" in result.stderr and str(workdir / "none.sock") in result.stderr
    assert time.monotonic() - started < 10


def test_verify_the_daemons_directory_healthy_then_corrupt_changing_no_byte(daemon):
    s = ("--socket", daemon.socket_path)
    for name in ("a", "b", "c"):
        assert ctl(*s, "put", name, '{"x": "' + name * 50 + '"}').returncode == 0
    assert ctl(*s, "compact").returncode == 0
    assert ctl(*s, "put", "d").returncode == 0
    assert json_lines(ctl(*s, "reserve", "w"))[0]["task_id"] == "a"
    assert daemon.terminate() == 0
    directory = daemon.directory

    before = fingerprint(directory)
    healthy = ctl("verify", directory)
    assert healthy.returncode == 0, healthy.stdout + healthy.stderr
    assert "HEALTHY" in healthy.stdout and "ready 3, leased 1" in healthy.stdout
    (report,) = json_lines(ctl("verify", "--json", directory))
    assert report["healthy"] and report["snapshot_seq"] == 3 and report["problems"] == []
    assert fingerprint(directory) == before

    segment = next(directory.glob("wal-*.log"))
    damaged = bytearray(segment.read_bytes())
    damaged[len(damaged) // 2] ^= 0x40
    segment.write_bytes(bytes(damaged))
    before = fingerprint(directory)
    corrupt = ctl("verify", directory)
    assert corrupt.returncode == EXIT_CORRUPT
    assert "CORRUPT" in corrupt.stdout and segment.name in corrupt.stdout
    assert fingerprint(directory) == before
    assert set(os.listdir(directory)) == set(before)


def test_the_installed_console_script_runs_and_documents_exit_codes():
    script = os.path.join(os.path.dirname(sys.executable), "walqueue-ctl")
    if not os.path.exists(script):
        pytest.skip(f"{script} is not installed (pip install -e . creates it)")
    result = subprocess.run([script, "--help"], capture_output=True, text=True, timeout=CTL_SECONDS,
                            env=child_env(), cwd=REPO)
    assert result.returncode == 0 and "Exit codes:" in result.stdout and "verify" in result.stdout


def test_verify_beside_a_running_daemon_names_it_and_takes_nothing(daemon):
    s = ("--socket", daemon.socket_path)
    assert ctl(*s, "put", "a").returncode == 0
    before = fingerprint(daemon.directory)
    result = ctl("verify", daemon.directory)
    assert result.returncode == 0, result.stdout + result.stderr
    assert f"held by pid {daemon.pid}" in result.stdout
    assert fingerprint(daemon.directory) == before
    assert ctl(*s, "put", "b").returncode == 0  # the daemon kept its lock and serves on
    assert daemon.terminate() == 0


def test_tasks_next_and_json_errors_through_a_real_daemon(daemon, workdir):
    s = ("--socket", daemon.socket_path)
    for name in ("job-9", "job-10", "job-11"):
        assert ctl(*s, "put", name).returncode == 0
    assert [t["task_id"] for t in json_lines(ctl(*s, "next", "--json"))] == ["job-10", "job-11", "job-9"]
    assert [t["task_id"] for t in json_lines(ctl(*s, "reserve", "w"))] == ["job-10"]
    (leased,) = json_lines(ctl(*s, "tasks", "--status", "leased", "--json"))
    assert (leased["task_id"], leased["worker"]) == ("job-10", "w")
    table = ctl(*s, "tasks").stdout.splitlines()
    assert [row.split()[:2] for row in table[1:]] == [["job-10", "leased"], ["job-11", "ready"],
                                                      ["job-9", "ready"]]
    conflict = ctl(*s, "put", "job-9", '{"other": 1}', "--json")
    assert conflict.returncode == EXIT_KEY_CONFLICT
    assert json.loads(conflict.stderr)["error"] == "KeyConflict"
    regular = workdir / "regular-file"
    regular.write_text("")
    unreachable = ctl("--socket", regular, "stats", "--json")
    error = json.loads(unreachable.stderr)
    assert unreachable.returncode == EXIT_UNAVAILABLE == error["code"]
    assert error["error"] == "DaemonUnavailable" and "regular file, not a socket" in error["message"]
    version = ctl("--version")
    assert version.returncode == 0 and version.stdout.startswith("walqueue-ctl ")


def test_a_payload_piped_into_put_is_stored_not_dropped(daemon):
    """Issue 23: `echo '{"to":1}' | walqueue-ctl put ID` stored {} and exited 0."""
    s = ("--socket", daemon.socket_path)
    assert json_lines(ctl(*s, "put", "piped", input='{"to": 1}\n')) == [{"task_id": "piped"}]
    assert json_lines(ctl(*s, "get", "piped"))[0]["payload"] == {"to": 1}


def test_force_release_ends_a_lease_by_task_id_after_asking(daemon):
    """Issue 12 item 6: an operator ends leases granted during a clock jump, whoever holds them."""
    s = ("--socket", daemon.socket_path)
    assert ctl(*s, "put", "a-stuck", "{}").returncode == 0
    assert ctl(*s, "put", "b-other", "{}").returncode == 0
    (lease,) = json_lines(ctl(*s, "reserve", "w1", "--lease-seconds", "3600"))
    # Not on a terminal and no --yes: nothing happens.
    refused = ctl(*s, "force-release", "a-stuck")
    assert refused.returncode == 2 and "--yes" in refused.stderr
    # One of the tasks is not leased: all or nothing.
    assert ctl(*s, "force-release", "a-stuck", "b-other", "--yes").returncode == 2
    assert json_lines(ctl(*s, "get", "a-stuck"))[0]["status"] == "leased"
    assert json_lines(ctl(*s, "force-release", "a-stuck", "--yes")) == [{"task_ids": ["a-stuck"]}]
    task = json_lines(ctl(*s, "get", "a-stuck"))[0]
    assert (task["status"], task["attempts"], task["generation"]) == ("ready", 1, 1)
    # The worker that held it can no longer complete it.
    assert ctl(*s, "ack", "-", input=json.dumps(lease)).returncode == EXIT_STALE_LEASE


def test_reserve_from_a_paused_daemon_says_so_and_exits_12(daemon):
    """Issue 23: reserve while paused printed nothing and exited 0, like an empty queue."""
    s = ("--socket", daemon.socket_path)
    assert ctl(*s, "put", "a").returncode == 0
    assert json_lines(ctl(*s, "pause")) == [{"paused": True}]
    held = ctl(*s, "reserve", "w")
    assert (held.returncode, held.stdout) == (EXIT_PAUSED, "")
    assert "paused" in held.stderr and "walqueue-ctl resume" in held.stderr
    assert json_lines(ctl(*s, "resume")) == [{"paused": False}]
    assert [lease["task_id"] for lease in json_lines(ctl(*s, "reserve", "w"))] == ["a"]
    empty = ctl(*s, "reserve", "w")
    assert (empty.returncode, empty.stdout, empty.stderr) == (0, "", "")


def test_walqueued_max_lease_seconds_bounds_reserve_and_touch(make_daemon):
    """Issue 23 (SPEC §8b): a lease longer than --max-lease-seconds is refused, naming the bound."""
    daemon = make_daemon("--max-lease-seconds", "60")
    s = ("--socket", daemon.socket_path)
    assert ctl(*s, "put", "a").returncode == 0
    refused = ctl(*s, "reserve", "w", "--lease-seconds", "61")
    assert refused.returncode == EXIT_USAGE and "bound of 60 s" in refused.stderr, refused.stderr
    (lease,) = json_lines(ctl(*s, "reserve", "w", "--lease-seconds", "60"))
    longer = ctl(*s, "touch", "-", "--lease-seconds", "3600", input=json.dumps(lease) + "\n")
    assert longer.returncode == EXIT_USAGE and "--max-lease-seconds" in longer.stderr
    assert json_lines(ctl(*s, "get", "a"))[0]["deadline"] == lease["deadline"]  # nothing written
