"""walqueue-ctl's SPEC §8b commands: cancel, workers, and tasks/dead read in pages.

Against test_ctl.py's fake daemon (the Client API over an in-process Queue), with CliRunner;
tests/backends/test_ctl_commands.py runs the same commands on a real walqueued and on
PostgreSQL.
"""

import json

from tests.unit import test_ctl
from tests.unit.test_ctl import FakeClient, lines
from walqueue.ctl.errors import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE
from walqueue.ctl.output import PAGE_TASKS
from walqueue.protocol import ConnectionView

# test_ctl.py's fixtures: the fake daemon, its queue and its clock.
run, queue, clock = test_ctl.run, test_ctl.queue, test_ctl.clock


def test_cancel_completes_ready_and_dead_tasks_and_prints_their_ids(run, queue):
    queue.put("r", {})
    queue.put("d", {}, max_attempts=1)
    (lease,) = queue.reserve("w", now=100, lease_seconds=10, limit=1)  # d: before r in id order
    queue.release(lease, now=100)  # d is dead (max_attempts 1), r ready
    assert queue.get("d").status == "dead"
    result = run("cancel", "r", "d", "r")
    assert result.exit_code == EXIT_OK, result.output
    assert lines(result) == [{"task_ids": ["r", "d"]}]
    assert {queue.get("r").status, queue.get("d").status} == {"completed"}


def test_cancel_stops_at_a_refusal_and_says_what_was_done(run, queue):
    queue.put("a", {})
    queue.put("later", {}, available_at=10_000)
    queue.put("c", {})
    result = run("cancel", "a", "later", "c")
    assert result.exit_code == EXIT_USAGE
    first = result.stderr.splitlines()[0]
    assert "not due until 10000" in first and "cancelled before it: a" in first and "not tried: c" in first
    assert queue.get("a").status == "completed" and queue.get("c").status == "ready"


def test_cancel_of_a_leased_task_names_its_lease(run, queue):
    queue.put("t", {})
    queue.reserve("busy-worker", now=100, lease_seconds=30)
    result = run("cancel", "t")
    assert result.exit_code == EXIT_USAGE and "leased by 'busy-worker'" in result.stderr
    assert "nothing was cancelled" in result.stderr


def test_cancel_of_an_unknown_task_is_exit_7(run):
    result = run("cancel", "nosuch")
    assert result.exit_code == EXIT_NOT_FOUND and "no task 'nosuch'" in result.stderr


def test_workers_prints_a_table_or_json_lines(run, queue):
    queue.put_many([{"task_id": f"t{i}", "payload": {}} for i in range(3)])
    queue.reserve("zeta", now=100, lease_seconds=30, limit=2)
    queue.reserve("alpha\u202e", now=100, lease_seconds=30, limit=1)
    table = run("workers")
    assert table.exit_code == EXIT_OK
    rows = table.stdout.splitlines()
    assert rows[0].split() == ["WORKER", "LEASES", "CONNECTED"]
    assert "\u202e" not in table.stdout  # a hostile name is escaped for a human
    assert rows[2].split() == ["zeta", "2", "no"]
    assert lines(run("workers", "--json")) == [
        {"worker": "alpha\u202e", "leases": 1, "connected": False},
        {"worker": "zeta", "leases": 2, "connected": False}]


def test_workers_with_none_says_so(run):
    assert run("workers").stdout.strip() == "no workers"


def test_workers_on_walqueued_shows_each_connections_requests_and_last_requests_age(run, queue, monkeypatch):
    shown = [ConnectionView("fd=7 pid=41 uid=1000 client='walqueue-worker'", ("zeta", "\u202ex"), 2, 1503, 0.25),
             ConnectionView("fd=9 pid=42 uid=0", (), 0, 1, 12.0)]
    monkeypatch.setattr(FakeClient, "connections_to_show", shown)
    queue.put("t", {})
    queue.reserve("zeta", now=100, lease_seconds=30)
    table = run("workers")
    assert table.exit_code == EXIT_OK, table.output
    head, connections = table.stdout.split("\n\n")
    assert head.splitlines()[1].split() == ["zeta", "1", "no"]
    rows = connections.splitlines()
    assert rows[0].split() == ["CONNECTION", "WORKERS", "LEASES", "REQUESTS", "LAST", "REQUEST"]
    assert rows[1].endswith("2       1503      0.2 s ago") and "zeta, \\u202ex" in rows[1]
    assert rows[2].split()[-6:] == ["-", "0", "1", "12.0", "s", "ago"]
    assert lines(run("workers", "--connections", "--json"))[0] == {
        "connection": "fd=7 pid=41 uid=1000 client='walqueue-worker'", "workers": ["zeta", "\u202ex"],
        "leases": 2, "requests": 1503, "last_request_age_seconds": 0.25}
    assert lines(run("workers", "--json")) == [{"worker": "zeta", "leases": 1, "connected": False}]


def test_tasks_reads_the_listing_in_pages_of_a_thousand(run, queue):
    count = 2 * PAGE_TASKS + 5
    queue.put_many([{"task_id": f"t{i:05d}", "payload": {}} for i in range(count)])
    result = run("tasks", "--json")
    ids = [task["task_id"] for task in lines(result)]
    assert ids == [f"t{i:05d}" for i in range(count)]
    (client,) = FakeClient.instances
    assert client.listings == [(None, None, PAGE_TASKS), (None, "t00999", PAGE_TASKS),
                               (None, "t01999", PAGE_TASKS)]


def test_tasks_limit_asks_for_no_more_than_it_shows(run, queue):
    queue.put_many([{"task_id": f"t{i:05d}", "payload": {}} for i in range(1500)])
    result = run("tasks", "--limit", "1200", "--status", "ready")
    assert result.exit_code == EXIT_OK
    assert result.stdout.rstrip().endswith("... and 300 more (--limit)")
    (client,) = FakeClient.instances
    assert client.listings == [("ready", None, 1000), ("ready", "t00999", 200)]


def test_dead_reads_pages_of_dead_tasks(run, queue):
    queue.put_many([{"task_id": f"t{i}", "payload": {}, "max_attempts": 1} for i in range(3)])
    for lease in queue.reserve("w", now=100, lease_seconds=10, limit=2):
        queue.release(lease, now=100)
    result = run("dead", "--json")
    assert [task["task_id"] for task in lines(result)] == ["t0", "t1"]
    assert FakeClient.instances[0].listings == [("dead", None, PAGE_TASKS)]
    assert json.loads(result.stdout.splitlines()[0])["status"] == "dead"
