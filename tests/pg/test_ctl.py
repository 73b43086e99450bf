"""walqueue-ctl --dsn URL [--queue NAME] against a real PostgreSQL (SPEC §9):
the same commands, arguments and output as against walqueued, `migrate`, and
exit 2 naming the PostgreSQL tool for walqueued's own commands."""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner

from tests.postgres import unique_name
from walqueue import ctl


@pytest.fixture
def run(postgres):
    queue = unique_name("ctl")

    def run(*args: str, stdin: str | None = None, dsn: str | None = postgres.dsn):
        prefix = ["--dsn", dsn, "--queue", queue] if dsn is not None else []
        result = CliRunner().invoke(ctl.cli, [*prefix, *args], input=stdin)
        return result.exit_code, result.stdout, result.stderr

    return run


def test_migrate_reports_the_schema_version_and_is_idempotent(run):
    from walqueue.pg import SCHEMA_VERSION

    for _ in range(2):
        code, out, _ = run("migrate")
        assert code == 0
        assert json.loads(out) == {"schema_version": SCHEMA_VERSION}


def test_the_daemon_commands_work_the_same_on_postgresql(run):
    assert run("migrate")[0] == 0
    code, out, _ = run("put", "report-7", '{"month": "2026-11"}')
    assert (code, json.loads(out)) == (0, {"task_id": "report-7"})
    code, out, _ = run("reserve", "worker-1", "--lease-seconds", "60")
    assert code == 0
    lease = json.loads(out)
    assert (lease["task_id"], lease["worker"], lease["generation"]) == ("report-7", "worker-1", 1)
    assert run("ack", "-", stdin=out)[0] == 0
    code, out, _ = run("get", "report-7")
    assert code == 0 and json.loads(out)["status"] == "completed"
    code, out, _ = run("stats", "--json")
    stats = json.loads(out)
    assert (stats["completed"], stats["ready"], stats["last_seq"], stats["wal_bytes"]) == (1, 0, 0, 0)
    code, out, _ = run("tasks", "--json")
    assert [json.loads(line)["task_id"] for line in out.splitlines()] == ["report-7"]
    # A stale ack exits 5 as it does against walqueued.
    assert run("ack", "report-7", "--worker", "worker-1", "--generation", "1")[0] == 5


def test_the_stats_table_shows_the_counts_without_the_wal_zeros_and_json_keeps_them(run):
    """Issue 23: last_seq, snapshot_seq and wal_bytes, always 0 here, were shown as figures."""
    run("migrate")
    run("put", "a", "{}")
    code, out, _ = run("stats")
    assert code == 0
    assert [line.split()[0] for line in out.splitlines()] == ["ready", "leased", "completed", "dead"]
    assert out.splitlines()[0].split() == ["ready", "1"]
    code, out, _ = run("--json", "stats")
    assert code == 0 and {"last_seq": 0, "snapshot_seq": 0, "wal_bytes": 0}.items() <= json.loads(out).items()


def test_dead_and_revive(run):
    run("migrate")
    run("put", "once", "{}", "--max-attempts", "1")
    code, out, _ = run("reserve", "w")
    assert run("release", "-", stdin=out)[0] == 0
    code, out, _ = run("dead", "--json")
    assert code == 0 and [json.loads(line)["task_id"] for line in out.splitlines()] == ["once"]
    code, out, _ = run("revive", "once")
    assert (code, json.loads(out)) == (0, {"task_ids": ["once"]})


@pytest.mark.parametrize("command", [["verify", "/tmp"], ["backup", "/tmp/x"], ["compact"], ["pause"],
                                     ["resume"], ["metrics"], ["top", "--count", "1"]])
def test_walqueueds_own_commands_exit_2_naming_what_to_use(run, command):
    code, _, err = run(*command)
    assert code == 2
    assert "not available with --dsn" in err
    if command[0] in ("verify", "backup", "compact"):
        assert any(tool in err for tool in ("pg_amcheck", "pg_basebackup", "VACUUM"))


def test_a_missing_schema_says_to_migrate_and_is_not_created_by_other_commands(postgres, run):
    import psycopg

    database = unique_name("empty")
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{database}"')
    empty = psycopg.conninfo.make_conninfo(postgres.dsn, dbname=database)
    code, _, err = run("stats", dsn=empty)
    assert code == 1 and "migrate" in err
    assert run("put", "t", "{}", dsn=empty)[0] == 1  # still no schema: nothing created
    assert run("migrate", dsn=empty)[0] == 0
    assert run("put", "t", "{}", dsn=empty)[0] == 0


def test_an_unreachable_database_exits_3(run, tmp_path):
    # --timeout 1: PostgreSQL is retried until the timeout (30 s by default) before exit 3.
    code, _, err = run("--timeout", "1", "stats", dsn=f"postgresql:///nowhere?host={tmp_path}&port=1")
    assert code == 3
    assert "PostgreSQL" in err


def test_queue_without_dsn_and_dsn_with_socket_are_usage_errors(tmp_path):
    runner = CliRunner()
    assert runner.invoke(ctl.cli, ["--queue", "q", "stats"]).exit_code == 2
    both = runner.invoke(ctl.cli, ["--dsn", "postgresql:///x", "--socket", str(tmp_path), "stats"])
    assert both.exit_code == 2 and "not both" in both.stderr
    assert runner.invoke(ctl.cli, ["migrate"]).exit_code == 2


def test_a_socket_on_the_command_line_beats_walqueue_dsn_from_the_environment(tmp_path):
    result = CliRunner().invoke(ctl.cli, ["--socket", str(tmp_path / "none.sock"), "stats"],
                                env={"WALQUEUE_DSN": "postgresql:///x"})
    assert result.exit_code == 3
    assert "walqueued" in result.stderr
