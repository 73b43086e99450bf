"""walqueue-ctl's argument handling, output formats and exit codes, with CliRunner.

The commands run against `FakeClient`: the real library `Queue` in a
temporary directory behind the `Client` method names, with a clock the test
sets, so every answer and exception is the library's own. The real daemon
round trips are in tests/process/test_ctl_process.py.
"""

import json
import re

import click
import pytest
from click.testing import CliRunner

import walqueue
from walqueue import Queue
from walqueue.client import Client, DaemonUnavailable
from walqueue.ctl import backends, cli, errors, output
from walqueue.ctl.errors import (
    EXIT_CORRUPT,
    EXIT_FAILURE,
    EXIT_KEY_CONFLICT,
    EXIT_NOT_FOUND,
    EXIT_OK,
    EXIT_STALE_LEASE,
    EXIT_UNAVAILABLE,
    EXIT_UNREADABLE,
    EXIT_USAGE,
)
from walqueue.daemon.recorder import Recorder

EXIT_CODES = {EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_UNAVAILABLE, EXIT_CORRUPT, EXIT_STALE_LEASE,
              EXIT_KEY_CONFLICT, EXIT_NOT_FOUND, EXIT_UNREADABLE, errors.EXIT_NO_QUEUE, errors.EXIT_PAUSED}


class FakeClient:
    """The Client API over an in-process Queue; `now` is set by the test."""

    instances: list["FakeClient"] = []
    connections_to_show: list = []  # what connections() answers (walqueue.protocol.ConnectionView)

    def __init__(self, queue: Queue, clock: list[int], path: str, **options) -> None:
        self.queue, self.clock, self.path, self.options = queue, clock, path, options
        self.closed = False
        self.paused = False
        self.listings = []  # the tasks() calls: (status, after, limit)
        self.shown_connections = list(FakeClient.connections_to_show)
        FakeClient.instances.append(self)

    def put(self, task_id, payload, *, key=None, available_at=0, delay=None, max_attempts=3):
        if delay is not None:
            available_at = self.clock[0] + delay
        return self.queue.put(task_id, payload, key=key, available_at=available_at,
                              max_attempts=max_attempts)

    def reserve(self, worker, *, lease_seconds=30, limit=1, wait=0):
        if self.paused:
            return []
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

    def tasks(self, status=None, *, after=None, limit=None):
        self.listings.append((status, after, limit))
        return list(self.queue.tasks(status, after=after, limit=limit))

    def cancel(self, task_id):
        self.queue.cancel(task_id, now=self.clock[0])

    def workers(self):
        return self.queue.workers()

    def connections(self):  # walqueued's view; the library has no connections
        return list(self.shown_connections)

    def stats(self):
        return self.queue.stats()

    def compact(self):
        return self.queue.compact()

    def daemon_stats(self):
        recorder = Recorder(next_seq=1, now=0, recovery_seconds=0.25)
        return recorder.report(self.queue.engine, now=self.clock[0], connections=1, parked_reserves=0,
                               paused=self.paused, compact_wal_bytes=1000, directory="/var/q")

    def pause(self):
        self.paused = True
        return True

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
    monkeypatch.setattr(backends, "CLIENT_FACTORY",
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


def test_put_without_a_payload_reads_a_piped_stdin_instead_of_dropping_it(run, queue):
    """Issue 23: `echo '{"to":1}' | walqueue-ctl put ID` stored {} and exited 0."""
    assert lines(run("put", "piped", input='{"to": 1}\n')) == [{"task_id": "piped"}]
    assert queue.get("piped").payload == {"to": 1}
    assert run("put", "empty", input="").exit_code == 0  # nothing piped: nothing to drop
    assert queue.get("empty").payload == {}
    bad = run("put", "bad", input="to=1\n")
    assert bad.exit_code == EXIT_USAGE and "the payload on stdin is not valid JSON" in bad.stderr
    assert queue.get("bad") is None
    # An argument wins: stdin is not read at all.
    assert run("put", "arg", '{"n": 2}', input='{"n": 3}').exit_code == 0
    assert queue.get("arg").payload == {"n": 2}


def test_put_without_a_payload_on_a_terminal_reads_nothing():
    from walqueue.ctl.tasks import payload_text

    class Terminal:
        def isatty(self):
            return True

        def read(self):
            raise AssertionError("a terminal's stdin must not be read")

    assert payload_text(None, Terminal()) == ("{}", "the payload")
    assert payload_text(None, None) == ("{}", "the payload")  # no stdin at all (fd 0 closed)


def test_put_delay_and_available_at(run, queue, clock):
    run("put", "later", "--delay", "30")
    run("put", "at", "--available-at", "5000")
    assert queue.get("later").available_at == clock[0] + 30
    assert queue.get("at").available_at == 5000
    both = run("put", "x", "--delay", "1", "--available-at", "2")
    assert both.exit_code == EXIT_USAGE and "not both" in both.stderr


def test_put_at_takes_unix_seconds_or_an_iso_time_and_a_repeat_is_idempotent(run, queue, clock):
    """Issue 23: `put ID --delay 60` twice is a KeyConflict; --at is the repeatable form."""
    assert lines(run("put", "nightly", "--at", "2026-12-03T02:00:00Z")) == [{"task_id": "nightly"}]
    clock[0] += 5  # a second run, later
    assert run("put", "nightly", "--at", "2026-12-03T03:00:00+01:00").exit_code == 0  # same second
    assert queue.get("nightly").available_at == 1796263200
    assert run("put", "epoch", "--at", "5000").exit_code == 0
    assert queue.get("epoch").available_at == 5000
    for bad, says in (("2026-12-03T02:00:00", "no UTC offset"), ("tomorrow", "neither Unix seconds"),
                      ("2026-12-03T02:00:00.5Z", "whole second")):
        refused = run("put", "bad", "--at", bad)
        assert refused.exit_code == EXIT_USAGE and says in refused.stderr, refused.stderr
    assert queue.get("bad") is None
    assert "not both" in run("put", "x", "--at", "1", "--delay", "1").stderr


def test_a_repeated_put_with_delay_is_a_key_conflict_that_points_at_at(run, queue, clock):
    assert run("put", "later", "--delay", "60").exit_code == 0
    clock[0] += 1
    again = run("put", "later", "--delay", "60")
    assert again.exit_code == EXIT_KEY_CONFLICT
    assert "part of the request's identity" in again.stderr and "--at" in again.stderr
    error = json.loads(run("put", "later", "--delay", "60", "--json").stderr)
    assert error["error"] == "KeyConflict" and "--at EPOCH" in error["message"]
    help_text = " ".join(run("put", "--help").stdout.split())
    assert "put again later is a key conflict (exit 6): use --at" in help_text


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


def test_reserve_while_paused_says_so_on_stderr_and_exits_12(run, queue, monkeypatch):
    """Issue 23: a reserve from a paused daemon printed nothing and exited 0, like an empty queue."""
    run("put", "a")
    monkeypatch.setattr(FakeClient, "__init__", paused_init(FakeClient.__init__))
    result = run("reserve", "w")
    assert result.exit_code == errors.EXIT_PAUSED and result.stdout == ""
    assert "paused" in result.stderr and "walqueue-ctl resume" in result.stderr
    assert queue.get("a").status == "ready"
    assert json.loads(run("reserve", "w", "--json").stderr)["error"] == "Paused"


def paused_init(init):
    def paused_client(self, *args, **kwargs):
        init(self, *args, **kwargs)
        self.paused = True
    return paused_client


def test_an_empty_reserve_from_a_running_daemon_exits_0(run):
    result = run("reserve", "w")
    assert (result.exit_code, result.stdout, result.stderr) == (0, "", "")


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


def test_json_before_the_command_is_the_command_s_json(run):
    """Issue 23: `walqueue-ctl --json stats` was "no such option", though help says any command."""
    run("put", "a")
    (stats,) = lines(run("--json", "stats"))
    assert stats["ready"] == 1
    assert [task["task_id"] for task in lines(run("--json", "tasks"))] == ["a"]
    missing = run("--json", "get", "nope")
    assert json.loads(missing.stderr)["code"] == EXIT_NOT_FOUND
    unknown = run("--json", "nosuchcommand")
    assert json.loads(unknown.stderr)["error"] == "UsageError"


def test_the_stats_table_leaves_out_the_wal_figures_of_a_backend_without_a_wal(run, monkeypatch):
    """On PostgreSQL last_seq, snapshot_seq and wal_bytes are always 0: not shown as figures."""
    from walqueue import backend

    monkeypatch.setattr(Client, "capabilities", frozenset({backend.FORCE_RELEASE}))
    run("put", "a")
    table = run("stats").stdout
    assert re.search(r"^ready\s+1$", table, re.M)
    assert not re.search(r"^(last_seq|snapshot_seq|wal_bytes)\b", table, re.M)
    (stats,) = lines(run("stats", "--json"))
    assert {"last_seq", "snapshot_seq", "wal_bytes"} <= set(stats)


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


def test_revive_of_an_unknown_task_exits_7_like_get_and_revives_nothing(run, queue):
    """Issue 23: `get nosuch` exited 7 but `revive nosuch` 2: one code for "no such task"."""
    make_dead(run, "d1")
    result = run("revive", "d1", "nosuch")
    assert result.exit_code == EXIT_NOT_FOUND and "no task 'nosuch'" in result.stderr
    assert queue.get("d1").status == "dead"
    error = json.loads(run("revive", "nosuch", "--json").stderr)
    assert (error["code"], error["error"]) == (EXIT_NOT_FOUND, "NotFound")


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

    monkeypatch.setattr(backends, "CLIENT_FACTORY", unreachable)
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


def help_codes(text: str) -> list[int]:
    """The exit codes a --help text lists (its "Exit codes:" block)."""
    block = text.split("Exit codes:", 1)[1]
    return [int(code) for code in re.findall(r"^\s+(\d+)  \S", block, re.M)]


def test_the_group_help_lists_every_exit_code_once(run):
    text = run("--help").stdout
    assert help_codes(text) == list(errors.EXIT_MEANINGS) == list(range(13))
    assert "_WALQUEUE_CTL_COMPLETE=bash_source" in text


@pytest.mark.parametrize("command, own", [
    ("put", {0, 1, 2, 3, 6}), ("get", {0, 1, 2, 3, 7}), ("ack", {0, 1, 2, 3, 5}),
    ("revive", {0, 1, 2, 3, 7}), ("force-release", {0, 1, 2, 3, 7}),
    ("tasks", {0, 1, 2, 3}), ("backup", {0, 1, 2, 3, 4, 8, 9, 10}), ("verify", {0, 1, 2, 4, 8, 10, 11}), ("reserve", {0, 1, 2, 3, 12}),
])
def test_each_command_help_lists_its_own_exit_codes(run, command, own):
    text = run(command, "--help").stdout
    assert set(help_codes(text)) == own
    assert "walqueue-ctl --help explains them all" in text


def test_every_command_has_dash_h_and_json(run):
    assert run("-h").stdout == run("--help").stdout
    for name, command in cli.commands.items():
        short = run(name, "-h")
        assert short.exit_code == 0 and short.stdout.startswith("Usage:"), name
        assert any(isinstance(p, click.Option) and "--json" in p.opts for p in command.params), name


def test_version_prints_the_package_version(run):
    result = run("--version")
    assert result.exit_code == 0 and result.stdout == f"walqueue-ctl {walqueue.__version__}\n"


def test_shell_completion_is_served_under_the_documented_variable():
    result = CliRunner().invoke(cli, [], prog_name="walqueue-ctl",
                                env={"_WALQUEUE_CTL_COMPLETE": "bash_source"})
    assert result.exit_code == 0 and "complete " in result.stdout
    assert "_WALQUEUE_CTL_COMPLETE" in result.stdout


# -- tasks and next -------------------------------------------------------------------


def test_tasks_lists_every_task_or_one_status_as_a_table_or_json(run, queue):
    for name in ("b", "a", "c"):
        run("put", name, '{"n": 1}')
    run("reserve", "w1")  # leases a
    table = run("tasks").stdout.splitlines()
    assert table[0].split() == ["TASK_ID", "STATUS", "ATTEMPTS", "AVAILABLE_AT", "WORKER", "DEADLINE",
                                "PAYLOAD"]
    assert [row.split()[:2] for row in table[1:]] == [["a", "leased"], ["b", "ready"], ["c", "ready"]]
    assert table[1].split()[4] == "w1"
    listed = lines(run("tasks", "--status", "ready", "--json"))
    assert [task["task_id"] for task in listed] == ["b", "c"]
    assert set(listed[0]) == {"task_id", "key", "status", "attempts", "max_attempts", "generation",
                              "available_at", "deadline", "worker", "payload"}
    limited = run("tasks", "--limit", "2").stdout.splitlines()
    assert len(limited) == 4 and limited[-1] == "... and 1 more (--limit)"
    assert len(lines(run("tasks", "--limit", "2", "--json"))) == 2
    assert run("tasks", "--status", "dead").stdout == "no dead tasks\n"
    bad = run("tasks", "--status", "done")
    assert bad.exit_code == EXIT_USAGE and "'done' is not one of" in bad.stderr


def test_next_shows_the_reserve_order_without_leasing(run, queue, clock):
    run("put", "job-9")
    run("put", "job-10")
    run("put", "later", "--delay", "3600")
    run("put", "earliest", "--available-at", "1")
    listed = lines(run("next", "--json"))
    order = [task["task_id"] for task in listed]
    # (available_at, task_id): 0 before 1 before now + 3600; "job-10" sorts before "job-9".
    assert order == ["job-10", "job-9", "earliest", "later"]
    assert all(task["status"] == "ready" and task["generation"] == 0 for task in listed)
    assert [queue.get(name).status for name in order] == ["ready"] * 4  # nothing was leased
    table = run("next", "--limit", "3").stdout.splitlines()
    assert table[0].split() == ["TASK_ID", "DUE", "AVAILABLE_AT", "ATTEMPTS", "PAYLOAD"]
    assert [row.split()[0] for row in table[1:4]] == order[:3]
    assert table[4] == "... and 1 more (--limit)"
    reserved = [lease["task_id"] for lease in lines(run("reserve", "w", "--limit", "3"))]
    assert reserved == order[:3]  # exactly what next said reserve would hand out
    assert run("next", "--limit", "0").exit_code == EXIT_USAGE


def test_the_tasks_table_shows_times_in_utc_and_delayed_tasks_as_delayed(run, clock, monkeypatch):
    """Issue 23: AVAILABLE_AT showed 0 or a raw epoch, and a delayed task "ready"."""
    clock[0] = 1_764_700_000  # 2025-12-02T18:26:40Z
    monkeypatch.setattr(output.time, "time", lambda: float(clock[0]))
    run("put", "due")
    run("put", "later", "--delay", "1500")
    run("put", "idle")
    run("reserve", "w", "--lease-seconds", "60")  # leases "due" ("due" < "idle", both due)
    rows = {row.split()[0]: row for row in run("tasks").stdout.splitlines()[1:]}
    assert rows["later"].split()[1:6] == ["delayed", "0/3", "2025-12-02T18:51:40Z", "(in", "25"]
    assert rows["idle"].split()[1:4] == ["ready", "0/3", "-"]  # put without a delay: due since 0
    assert "2025-12-02T18:27:40Z (in 1 min 0 s)" in rows["due"]  # its deadline
    exact = {task["task_id"]: task for task in lines(run("tasks", "--json"))}
    assert exact["later"]["status"] == "ready" and exact["later"]["available_at"] == clock[0] + 1500
    assert exact["due"]["deadline"] == clock[0] + 60


def test_the_next_table_says_when_a_task_is_due(run, clock, monkeypatch):
    monkeypatch.setattr(output.time, "time", lambda: 1000.0)
    run("put", "now", "--available-at", "999")
    run("put", "soon", "--available-at", "1042")
    rows = [row.split() for row in run("next").stdout.splitlines()[1:]]
    assert rows[0][:2] == ["now", "now"] and rows[1][:4] == ["soon", "in", "42", "s"]


# -- one output convention: --json, errors as JSON objects ------------------------------


def json_error(result) -> dict:
    (line,) = result.stderr.splitlines()
    return json.loads(line)


def test_under_json_an_error_is_one_json_object_on_stderr(run):
    run("put", "a", '{"n": 1}')
    conflict = run("put", "a", '{"n": 2}', "--json")
    assert conflict.exit_code == EXIT_KEY_CONFLICT and conflict.stdout == ""
    error = json_error(conflict)
    assert (error["code"], error["error"]) == (EXIT_KEY_CONFLICT, "KeyConflict")
    assert "already used" in error["message"]
    missing = json_error(run("get", "nope", "--json"))
    assert (missing["code"], missing["error"]) == (EXIT_NOT_FOUND, "NotFound")
    usage = run("reserve", "w", "--limit", "0", "--json")
    assert usage.exit_code == EXIT_USAGE
    assert json_error(usage)["code"] == EXIT_USAGE and json_error(usage)["error"] == "UsageError"
    unknown_option = run("tasks", "--json", "--no-such-option")
    assert unknown_option.exit_code == EXIT_USAGE and json_error(unknown_option)["error"] == "UsageError"
    plain = run("get", "nope")
    assert plain.stderr.startswith("Error: no task 'nope'")


def test_a_stale_lease_under_json_carries_the_tasks_status_and_generation(run):
    run("put", "a")
    (lease,) = lines(run("reserve", "w"))
    args = ("a", "--worker", "w", "--generation", str(lease["generation"]))
    run("ack", *args)
    error = json_error(run("ack", *args, "--json"))
    assert error["code"] == EXIT_STALE_LEASE and error["error"] == "StaleLease"
    assert (error["task_id"], error["status"], error["generation"]) == ("a", "completed", 1)


def test_ack_dash_under_json_reports_each_failed_line_with_its_number(run, queue):
    run("put", "a")
    reserved = run("reserve", "w").stdout
    result = run("ack", "-", "--json", input="[1]\n" + reserved + "{\n")
    assert result.exit_code == EXIT_USAGE
    errors = [json.loads(line) for line in result.stderr.splitlines()]
    assert [(e["line"], e["code"]) for e in errors] == [(1, EXIT_USAGE), (3, EXIT_USAGE)]
    assert "an array" in errors[0]["message"]
    assert queue.get("a").status == "completed"


@pytest.mark.parametrize("payload, kind", [("null", "null"), ("[1]", "an array"), ('"x"', "a string"),
                                           ("3", "a number"), ("true", "true")])
def test_a_payload_that_is_not_an_object_is_named_as_json_names_it(run, payload, kind):
    result = run("put", "a", payload)
    assert result.exit_code == EXIT_USAGE
    assert f"the payload must be a JSON object, not {kind}\n" in result.stderr


def test_a_bad_stdin_line_is_named_once(run):
    result = run("ack", "-", input="not json\n")
    assert result.stderr.startswith("Error: stdin line 1: the lease is not valid JSON: ")
    assert result.stderr.count("line 1:") == 1


def test_a_socket_path_that_is_a_regular_file_says_it_is_not_a_socket(run, monkeypatch, tmp_path):
    monkeypatch.setattr(backends, "CLIENT_FACTORY", Client)  # the real client
    regular = tmp_path / "not-a-socket"
    regular.write_text("")
    result = run("--socket", str(regular), "stats")
    assert result.exit_code == EXIT_UNAVAILABLE
    assert f"{regular}: it is a regular file, not a socket" in result.stderr
    assert "refused" not in result.stderr
    missing = run("--socket", str(tmp_path / "gone" / "walqueued.sock"), "stats")
    assert missing.exit_code == EXIT_UNAVAILABLE and "does not exist" in missing.stderr


def test_backup_into_a_missing_parent_names_it_and_exits_2_before_asking_the_daemon(run, tmp_path):
    dest = tmp_path / "no" / "such" / "backup"
    result = run("backup", str(dest))  # FakeClient has no backup_begin: calling it would fail
    assert result.exit_code == EXIT_USAGE
    assert f"the parent of DEST, {tmp_path / 'no' / 'such'}, does not exist" in result.stderr
    assert "Nothing was written" in result.stderr and not (tmp_path / "no").exists()


# -- names are escaped for a human, exact in JSON ----------------------------------------

HOSTILE = "evil\x1b[31m\nforged  dead  1/1\u202e"
SHOWN = "evil\\x1b[31m\\x0aforged  dead  1/1\\u202e"


@pytest.mark.parametrize("command", [["tasks"], ["next"], ["dead"]])
def test_a_hostile_task_id_is_escaped_in_tables_and_exact_in_json(run, command):
    if command == ["dead"]:
        make_dead(run, HOSTILE)
    else:
        assert run("put", HOSTILE, json.dumps({"k": "\x1b[2J"})).exit_code == 0
    table = run(*command).stdout
    assert "\x1b" not in table and "\u202e" not in table
    assert len(table.splitlines()) == 2 and table.splitlines()[1].startswith(SHOWN)
    raw = run(*command, "--json").stdout
    assert "\x1b" not in raw and "\u202e" not in raw  # escaped as JSON \\u escapes
    assert [task["task_id"] for task in lines(run(*command, "--json"))] == [HOSTILE]


def test_nfc_and_nfd_ids_look_different_in_a_table(run):
    import unicodedata

    run("put", unicodedata.normalize("NFC", "café"))
    run("put", unicodedata.normalize("NFD", "café"))
    ids = [row.split()[0] for row in run("tasks").stdout.splitlines()[1:]]
    assert sorted(ids) == ["cafe\\u0301", "café"]


def test_a_hostile_id_in_an_error_message_is_escaped(run):
    result = run("get", HOSTILE)
    assert result.exit_code == EXIT_NOT_FOUND and "\x1b" not in result.stderr
    assert SHOWN in result.stderr


# -- top --------------------------------------------------------------------------------


def test_top_prints_json_lines_for_count_refreshes(run):
    run("put", "a")
    result = run("top", "--count", "2", "--interval", "0.1", "--json")
    assert result.exit_code == 0
    records = lines(result)
    assert len(records) == 2 and records[0]["ready"] == 1 and records[0]["error"] is None
    assert records[0]["puts_per_second"] is None  # no earlier sample for the first one


def test_top_piped_prints_one_frame_after_another_without_escapes(run):
    result = run("top", "--count", "2", "--interval", "0.1")
    assert result.exit_code == 0 and "\x1b" not in result.stdout
    assert result.stdout.count("tasks     ready 0") == 2


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

    monkeypatch.setattr(backends, "CLIENT_FACTORY", no_client)
    assert run("verify", str(healthy_directory(tmp_path))).exit_code == 0
