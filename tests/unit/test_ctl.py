"""walqueue-ctl's argument handling, output formats and exit codes, with CliRunner.

The commands run against `FakeClient`: the real library `Queue` in a
temporary directory behind the `Client` method names, with a clock the test
sets, so every answer and exception is the library's own. The real daemon
round trips are in tests/process/test_ctl_process.py.
"""

import json
import re

import pytest
from click.testing import CliRunner

from walqueue import Queue
from walqueue import ctl as ctl_module
from walqueue.client import DaemonUnavailable
from walqueue.ctl import (
    EXIT_CORRUPT,
    EXIT_FAILURE,
    EXIT_KEY_CONFLICT,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_STALE_LEASE,
    EXIT_UNAVAILABLE,
    EXIT_UNREADABLE,
    EXIT_USAGE,
    cli,
)
from walqueue.daemon.recorder import Recorder

EXIT_CODES = {EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_CORRUPT, EXIT_STALE_LEASE,
              EXIT_KEY_CONFLICT, EXIT_NOT_FOUND, EXIT_UNREADABLE}


class FakeClient:
    """The Client API over an in-process Queue; `now` is set by the test."""

    instances: list["FakeClient"] = []

    def __init__(self, queue: Queue, clock: list[int], path: str, **options) -> None:
        self.queue, self.clock, self.path, self.options = queue, clock, path, options
        self.closed = False
        FakeClient.instances.append(self)

    def put(self, task_id, payload, *, key=None, available_at=0, delay=None, max_attempts=3):
        if delay is not None:
            available_at = self.clock[0] + delay
        return self.queue.put(task_id, payload, key=key, available_at=available_at,
                              max_attempts=max_attempts)

    def reserve(self, worker, *, lease_seconds=30, limit=1, wait=0):
        return self.queue.reserve(worker, now=self.clock[0], lease_seconds=lease_seconds, limit=limit)

    def ack(self, lease):
        self.queue.ack(lease, now=self.clock[0])

    def release(self, lease, *, delay=0):
        self.queue.release(lease, now=self.clock[0], delay=delay)

    def touch(self, lease, *, lease_seconds):
        return self.queue.touch(lease, now=self.clock[0], lease_seconds=lease_seconds)

    def revive(self, task_ids):
        return self.queue.revive(task_ids, now=self.clock[0])

    def get(self, task_id):
        return self.queue.get(task_id)

    def tasks(self, status=None):
        return list(self.queue.tasks(status))

    def stats(self):
        return self.queue.stats()

    def compact(self):
        return self.queue.compact()

    def daemon_stats(self):
        recorder = Recorder(next_seq=1, now=0, recovery_seconds=0.25)
        return recorder.report(self.queue, now=self.clock[0], connections=1, parked_reserves=0,
                               paused=False, compact_wal_bytes=1000, directory="/var/q")

    def close(self):
        self.closed = True


@pytest.fixture
def queue(tmp_path):
    with Queue(tmp_path / "queue") as q:
        yield q


@pytest.fixture
def clock():
    return [100]


@pytest.fixture
def run(monkeypatch, queue, clock):
    """run(*args, input=None) -> click Result, against the fake daemon."""
    FakeClient.instances.clear()
    monkeypatch.setattr(ctl_module, "CLIENT_FACTORY",
                        lambda path, **options: FakeClient(queue, clock, path, **options))
    monkeypatch.delenv("WALQUEUE_SOCKET", raising=False)
    runner = CliRunner()

    def invoke(*args, input=None, env=None):
        result = runner.invoke(cli, list(args), input=input, env=env, catch_exceptions=False)
        assert result.exit_code in EXIT_CODES, result.output
        return result

    return invoke


def lines(result) -> list[dict]:
    return [json.loads(line) for line in result.stdout.splitlines()]


# -- put ------------------------------------------------------------------------------


def test_put_prints_the_task_id_and_an_identical_put_is_idempotent(run, queue):
    first = run("put", "a", '{"n": 1}', "--key", "k", "--max-attempts", "5")
    assert first.exit_code == 0 and lines(first) == [{"task_id": "a"}]
    assert run("put", "a", '{"n": 1}', "--key", "k", "--max-attempts", "5").exit_code == 0
    task = queue.get("a")
    assert (task.key, task.max_attempts, task.payload) == ("k", 5, {"n": 1})


def test_put_defaults_to_an_empty_payload_and_reads_dash_from_stdin(run, queue):
    assert run("put", "a").exit_code == 0
    assert run("put", "b", "-", input='{"from": "stdin"}\n').exit_code == 0
    assert queue.get("a").payload == {} and queue.get("b").payload == {"from": "stdin"}


def test_put_delay_and_available_at(run, queue, clock):
    run("put", "later", "--delay", "30")
    run("put", "at", "--available-at", "5000")
    assert queue.get("later").available_at == clock[0] + 30
    assert queue.get("at").available_at == 5000
    both = run("put", "x", "--delay", "1", "--available-at", "2")
    assert both.exit_code == EXIT_USAGE and "not both" in both.stderr


@pytest.mark.parametrize("payload", ["not json", "[1, 2]", '"text"', "{"])
def test_put_rejects_a_payload_that_is_not_a_json_object(run, queue, payload):
    result = run("put", "a", payload)
    assert result.exit_code == EXIT_USAGE and "payload" in result.stderr
    assert queue.get("a") is None


def test_put_with_a_conflicting_key_exits_6_and_says_what_to_do(run):
    run("put", "a", '{"n": 1}')
    result = run("put", "a", '{"n": 2}')
    assert result.exit_code == EXIT_KEY_CONFLICT
    assert "already used" in result.stderr and "identical put" in result.stderr


def test_a_request_the_library_rejects_exits_2(run):
    result = run("put", "x" * 2000)
    assert result.exit_code == EXIT_USAGE and "Nothing was written" in result.stderr


def test_bad_options_are_usage_errors(run):
    assert run("put", "a", "--max-attempts", "0").exit_code == EXIT_USAGE
    assert run("reserve", "w", "--limit", "1001").exit_code == EXIT_USAGE
    assert run("reserve", "w", "--wait", "301").exit_code == EXIT_USAGE
    assert run("nosuchcommand").exit_code == EXIT_USAGE


# -- reserve | ack - ------------------------------------------------------------------


def test_reserve_prints_one_lease_per_line_and_ack_dash_completes_them(run, queue):
    for name in "abc":
        run("put", name, json.dumps({"name": name}))
    reserved = run("reserve", "w1", "--limit", "2", "--lease-seconds", "60")
    leases = lines(reserved)
    assert [lease["task_id"] for lease in leases] == ["a", "b"]
    assert set(leases[0]) == {"task_id", "worker", "generation", "deadline", "attempts", "payload"}
    assert leases[0]["deadline"] == 160 and leases[0]["payload"] == {"name": "a"}
    acked = run("ack", "-", input=reserved.stdout)
    assert acked.exit_code == 0 and acked.stdout == ""
    assert [queue.get(name).status for name in "abc"] == ["completed", "completed", "ready"]


def test_reserve_with_nothing_due_prints_nothing_and_exits_0(run):
    result = run("reserve", "w")
    assert result.exit_code == 0 and result.stdout == ""


def test_ack_by_task_id_needs_worker_and_generation(run, queue):
    run("put", "a")
    (lease,) = lines(run("reserve", "w"))
    assert run("ack", "a", "--worker", "w").exit_code == EXIT_USAGE
    assert run("ack", "-", "--worker", "w", input="").exit_code == EXIT_USAGE
    assert run("ack", "a", "--worker", "w", "--generation", str(lease["generation"])).exit_code == 0
    assert queue.get("a").status == "completed"


def test_a_stale_lease_exits_5_naming_the_tasks_current_status(run):
    run("put", "a")
    (lease,) = lines(run("reserve", "w"))
    args = ("a", "--worker", "w", "--generation", str(lease["generation"]))
    assert run("ack", *args).exit_code == 0
    again = run("ack", *args)
    assert again.exit_code == EXIT_STALE_LEASE
    assert "now completed at generation 1" in again.stderr and "reserve again" in again.stderr
    unknown = run("release", "zz", "--worker", "w", "--generation", "1")
    assert unknown.exit_code == EXIT_STALE_LEASE and "unknown" in unknown.stderr


def test_ack_dash_goes_on_after_a_bad_line_and_exits_with_the_first_failure(run, queue):
    for name in "ab":
        run("put", name)
    reserved = run("reserve", "w", "--limit", "2").stdout.splitlines()
    stdin = "\n".join([reserved[0], "not json", '{"task_id": "a"}', "", reserved[1]]) + "\n"
    result = run("ack", "-", input=stdin)
    assert result.exit_code == EXIT_USAGE
    assert "stdin line 2" in result.stderr and "stdin line 3" in result.stderr
    assert "stdin line 1" not in result.stderr
    assert [queue.get(name).status for name in "ab"] == ["completed", "completed"]


def test_release_with_delay_and_touch_print_what_they_should(run, queue, clock):
    for name in "ab":
        run("put", name)
    reserved = run("reserve", "w", "--limit", "2", "--lease-seconds", "10")
    first, second = reserved.stdout.splitlines()
    clock[0] += 5
    touched = run("touch", "-", "--lease-seconds", "100", input=first + "\n")
    (lease,) = lines(touched)
    assert (lease["task_id"], lease["deadline"]) == ("a", clock[0] + 100)
    released = run("release", "-", "--delay", "7", input=second + "\n")
    assert released.exit_code == 0 and released.stdout == ""
    task = queue.get("b")
    assert (task.status, task.available_at) == ("ready", clock[0] + 7)
    assert run("touch", "a", "--worker", "w", "--generation", "1").exit_code == EXIT_USAGE


# -- get, stats, dead, revive, compact -------------------------------------------------


def test_get_prints_the_task_and_a_missing_task_exits_7(run):
    run("put", "a", '{"n": 1}')
    (task,) = lines(run("get", "a"))
    assert task["status"] == "ready" and task["payload"] == {"n": 1}
    missing = run("get", "nope")
    assert missing.exit_code == EXIT_NOT_FOUND and "nope" in missing.stderr and missing.stdout == ""


def test_stats_prints_a_table_or_json(run):
    run("put", "a")
    table = run("stats")
    assert re.search(r"^ready\s+1$", table.stdout, re.M) and re.search(r"^last_seq\s+1$", table.stdout, re.M)
    assert re.search(r"^last_compaction_seconds\s+-$", table.stdout, re.M)
    assert re.search(r"^last_recovery_seconds\s+0.25$", table.stdout, re.M)
    (stats,) = lines(run("stats", "--json"))
    # The QueueStats keys stay at the top level, so older consumers keep working.
    queue_keys = {"ready": 1, "leased": 0, "completed": 0, "dead": 0, "last_seq": 1,
                  "snapshot_seq": 0, "wal_bytes": stats["wal_bytes"]}
    assert {key: stats[key] for key in queue_keys} == queue_keys
    assert stats["oldest_ready_age_seconds"] == 100 and stats["fsync_p99_seconds"] is None
    assert stats["directory"] == "/var/q" and "queue" not in stats


def test_metrics_prints_the_prometheus_text(run):
    from prometheus_client.parser import text_string_to_metric_families

    run("put", "a")
    result = run("metrics")
    assert result.exit_code == 0
    families = {family.name: family for family in text_string_to_metric_families(result.stdout)}
    tasks = {sample.labels["status"]: sample.value for sample in families["walqueue_tasks"].samples}
    assert tasks == {"ready": 1, "leased": 0, "completed": 0, "dead": 0}


def make_dead(run, *names):
    for name in names:
        run("put", name, '{"long": "' + "x" * 100 + '"}', "--max-attempts", "1")
    reserved = run("reserve", "w", "--limit", str(len(names)))
    run("release", "-", input=reserved.stdout)


def test_dead_lists_dead_tasks_as_a_table_or_json_lines_and_revive_brings_them_back(run, queue):
    assert run("dead").stdout.strip() == "no dead tasks"
    make_dead(run, "d1", "d2")
    table = run("dead").stdout.splitlines()
    assert table[0].split() == ["TASK_ID", "KEY", "ATTEMPTS", "GENERATION", "AVAILABLE_AT", "PAYLOAD"]
    assert table[1].split()[:4] == ["d1", "d1", "1/1", "1"] and table[1].endswith("...")
    assert [task["task_id"] for task in lines(run("dead", "--json"))] == ["d1", "d2"]
    revived = run("revive", "d1", "d2", "d1")
    assert lines(revived) == [{"task_ids": ["d1", "d2"]}]
    assert queue.get("d1").status == "ready"


def test_revive_of_a_task_that_is_not_dead_exits_2_and_revives_nothing(run, queue):
    make_dead(run, "d1")
    run("put", "alive")
    result = run("revive", "d1", "alive")
    assert result.exit_code == EXIT_USAGE and "alive" in result.stderr
    assert queue.get("d1").status == "dead"
    assert run("revive").exit_code == EXIT_USAGE


def test_compact_prints_the_snapshot_seq(run):
    run("put", "a")
    assert lines(run("compact")) == [{"seq": 1}]


# -- where the daemon is, and when it is not there ------------------------------------


def test_socket_dir_and_environment_choose_the_socket(run):
    run("--socket", "/x/s.sock", "stats")
    run("--dir", "/var/q", "stats")
    run("stats", env={"WALQUEUE_SOCKET": "/env.sock"})
    run("--dir", "/var/q", "stats", env={"WALQUEUE_SOCKET": "/env.sock"})
    run("stats")
    assert [client.path for client in FakeClient.instances] == [
        "/x/s.sock", "/var/q/walqueued.sock", "/env.sock", "/var/q/walqueued.sock",
        "/run/walqueue/walqueued.sock"]
    assert all(client.closed for client in FakeClient.instances)
    both = run("--socket", "/a", "--dir", "/b", "stats")
    assert both.exit_code == EXIT_USAGE and "not both" in both.stderr


def test_an_unreachable_daemon_exits_3_and_says_how_to_fix_it(run, monkeypatch):
    def unreachable(path, **options):
        raise DaemonUnavailable(f"cannot connect to walqueued at {path}: [Errno 2] No such file")

    monkeypatch.setattr(ctl_module, "CLIENT_FACTORY", unreachable)
    result = run("--socket", "/nowhere.sock", "stats")
    assert result.exit_code == EXIT_UNAVAILABLE
    assert "/nowhere.sock" in result.stderr and "walqueued serve" in result.stderr
    stdin = '{"task_id": "a", "worker": "w", "generation": 1}\n' * 3
    piped = run("--socket", "/nowhere.sock", "ack", "-", input=stdin)
    assert piped.exit_code == EXIT_UNAVAILABLE and piped.stderr.count("cannot connect") == 1


def test_a_daemon_side_write_failure_exits_1(run, monkeypatch, queue):
    from walqueue import QueueClosed

    def failing_put(self, *args, **kwargs):
        raise QueueClosed("write failed: [Errno 28] No space left on device")

    monkeypatch.setattr(FakeClient, "put", failing_put)
    result = run("put", "a")
    assert result.exit_code == EXIT_FAILURE and "retry" in result.stderr


def test_help_documents_every_exit_code(run):
    for args in ([], ["verify"], ["ack"], ["put"]):
        text = run(*args, "--help").stdout
        for code in sorted(EXIT_CODES):
            assert re.search(rf"^\s+{code}  \S", text, re.M), (args, code)


# -- verify ---------------------------------------------------------------------------


def healthy_directory(tmp_path):
    directory = tmp_path / "healthy"
    with Queue(directory) as q:
        q.put("a", {})
        q.put("b", {})
        q.reserve("w", now=1, lease_seconds=10)
    (directory / "LOCK").unlink()
    return directory


def test_verify_a_healthy_directory_exits_0_with_a_human_report(run, tmp_path):
    directory = healthy_directory(tmp_path)
    result = run("verify", str(directory))
    assert result.exit_code == 0
    assert "HEALTHY" in result.stdout and "ready 1, leased 1" in result.stdout
    assert "problems" not in result.stdout
    assert not (directory / "LOCK").exists()


def test_verify_reports_a_torn_tail_but_exits_0(run, tmp_path):
    directory = healthy_directory(tmp_path)
    segment = next(directory.glob("wal-*.log"))
    size = segment.stat().st_size
    with open(segment, "ab") as file:
        file.write(b"\x00\x00\x01")
    result = run("verify", str(directory))
    assert result.exit_code == 0
    assert f"TORN-TAIL  {segment.name}, offset {size}" in result.stdout


def test_verify_a_corrupt_directory_exits_4_listing_every_problem(run, tmp_path):
    directory = healthy_directory(tmp_path)
    segment = next(directory.glob("wal-*.log"))
    data = bytearray(segment.read_bytes())
    data[10] ^= 1
    data[-5] ^= 1
    segment.write_bytes(bytes(data))
    result = run("verify", str(directory))
    assert result.exit_code == EXIT_CORRUPT
    assert "CORRUPT: opening it would fail" in result.stdout
    assert result.stdout.count("CORRUPT    ") == 2 and "offset 0" in result.stdout
    (report,) = lines(run("verify", "--json", str(directory)))
    assert report["corrupt"] is True and report["healthy"] is False
    assert [p["offset"] for p in report["problems"] if p["severity"] == "corrupt"][0] == 0
    assert report["problems"][0]["file"] == segment.name


def test_verify_a_missing_directory_exits_8(run, tmp_path):
    result = run("verify", str(tmp_path / "missing"))
    assert result.exit_code == EXIT_UNREADABLE and "does not exist" in result.stderr
    assert not (tmp_path / "missing").exists()


def test_verify_needs_no_daemon(run, monkeypatch, tmp_path):
    def no_client(path, **options):
        raise AssertionError("verify must not contact the daemon")

    monkeypatch.setattr(ctl_module, "CLIENT_FACTORY", no_client)
    assert run("verify", str(healthy_directory(tmp_path))).exit_code == 0
