"""walqueue-scheduler's and `walqueue-ctl schedule`'s command lines, without a daemon.

A broken schedule file is refused at start (exit 2) naming its line, before
any connection; --queue with a socket is a usage error; an unreachable queue
at start exits 3; without cronsim both tools say which extra to install.
`walqueue-ctl schedule` shows the next runs with or without a queue, and the
last period put when one is named (a Queue behind the client factory here;
tests/process/test_scheduler_process.py runs both against walqueued).
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

import pytest
from click.testing import CliRunner

from walqueue import Queue
from walqueue import ctl as ctl_module
from walqueue.ctl import backends as ctl_backends
from walqueue.ctl.errors import EXIT_USAGE
from walqueue.schedule import cli, periods

REPO = Path(__file__).resolve().parents[2]
NOW = 1_796_220_187  # 2026-12-02T14:03:07Z
GOOD = '[[task]]\nname = "tick"\nevery = 3600\n\n[[task]]\nname = "nightly"\ncron = "30 2 * * *"\ntimezone = "Europe/Berlin"\n'


@pytest.fixture
def files(tmp_path):
    (tmp_path / "good.toml").write_text(GOOD)
    (tmp_path / "bad.toml").write_text('[[task]]\nname = "x"\n\ncron = "30 25 * * *"\n')
    return tmp_path


def run_scheduler(*args):
    return CliRunner().invoke(cli.main, [str(arg) for arg in args])


def test_a_broken_schedule_file_is_refused_at_start_naming_the_line(files):
    result = run_scheduler(files / "missing.sock", files / "bad.toml")
    assert result.exit_code == cli.EXIT_USAGE, result.output
    assert "bad.toml:4: [[task]] 'x': cron '30 25 * * *': Bad hour field" in result.output
    result = run_scheduler(files / "missing.sock", files / "nowhere.toml")
    assert result.exit_code == cli.EXIT_USAGE and "cannot read the schedule file" in result.output


def test_queue_is_for_postgresql_only(files):
    result = run_scheduler(files / "wq.sock", files / "good.toml", "--queue", "orders")
    assert result.exit_code == cli.EXIT_USAGE and "--queue names a queue on PostgreSQL" in result.output


def test_an_unreachable_queue_at_start_exits_3(files):
    result = run_scheduler(files / "wq.sock", files / "good.toml")
    assert result.exit_code == cli.EXIT_UNAVAILABLE, result.output
    assert "cannot reach walqueued at" in result.output


def test_a_dsn_libpq_cannot_parse_is_a_usage_error_not_a_traceback(files):
    result = run_scheduler("postgresql://%zz@db/app", files / "good.toml")
    assert result.exit_code == cli.EXIT_USAGE, result.output
    assert "cannot parse the DSN" in result.output
    assert isinstance(result.exception, SystemExit)  # a usage error, not an InvalidRequest traceback


def test_a_bad_test_clock_is_a_usage_error(files, monkeypatch):
    monkeypatch.setenv("WALQUEUE_SCHEDULER_TEST_CLOCK", "soon")
    result = run_scheduler(files / "wq.sock", files / "good.toml")
    assert result.exit_code == cli.EXIT_USAGE and "is not START:END" in result.output


def test_help_lists_the_exit_codes_and_the_file_format():
    result = run_scheduler("--help")
    assert result.exit_code == 0
    for code in ("0  stopped by SIGTERM or SIGINT", "1  failure", "2  usage", "3  the queue"):
        assert code in result.output
    assert "[[task]]" in result.output and "catch_up" in result.output


WITHOUT_CRONSIM = ("import sys; sys.modules['cronsim'] = None; sys.argv[0] = '{program}'; "
                   "from {module} import main; main()")


@pytest.mark.parametrize("program, module, args", [
    ("walqueue-scheduler", "walqueue.schedule.cli", ["wq.sock", "good.toml"]),
    ("walqueue-ctl", "walqueue.ctl", ["schedule", "good.toml"]),
])
def test_without_cronsim_both_tools_name_the_extra_to_install(files, program, module, args):
    result = subprocess.run([sys.executable, "-c", WITHOUT_CRONSIM.format(program=program, module=module),
                             *args], cwd=files, capture_output=True, text=True, timeout=60,
                            env={"PYTHONPATH": str(REPO / "src"), "PATH": "/usr/bin:/bin"})
    assert result.returncode == 2, result.stderr
    assert "pip install -e '.[scheduler]'" in result.stderr


# -- walqueue-ctl schedule ----------------------------------------------------------------


@pytest.fixture
def ctl(files, monkeypatch):
    """walqueue-ctl at NOW; with a queue named, its client is a Queue in a temporary directory."""
    monkeypatch.setattr(time, "time", lambda: float(NOW))
    monkeypatch.delenv("WALQUEUE_SOCKET", raising=False)
    monkeypatch.delenv("WALQUEUE_DSN", raising=False)
    queue = Queue(files / "queue")
    opened = []
    monkeypatch.setattr(ctl_backends, "CLIENT_FACTORY", lambda path, **options: opened.append(path) or queue)

    def invoke(*args):
        return CliRunner().invoke(ctl_module.cli, [str(arg) for arg in args])

    invoke.queue, invoke.opened = queue, opened
    yield invoke
    queue.close()


def test_without_a_queue_it_says_so_and_shows_only_the_next_runs(ctl, files):
    result = ctl("schedule", files / "good.toml", "--count", "2")
    assert result.exit_code == 0, result.output
    assert result.output.startswith("No queue named (--socket, --dir or --dsn): showing the next runs only")
    assert "tick@2026-12-02T15:00:00Z" in result.output and "tick@2026-12-02T16:00:00Z" in result.output
    assert "2026-12-03 02:30:00 CET   2026-12-03T01:30:00Z   nightly@2026-12-03T01:30:00Z" in result.output
    assert "  last  " not in result.output and ctl.opened == []


def test_with_a_queue_it_shows_the_last_period_put_and_puts_nothing(ctl, files):
    ctl.queue.put("tick@2026-12-02T12:00:00Z", {}, key="tick@2026-12-02T12:00:00Z",
                  available_at=periods.latest_start(periods.Timing(every=3600), NOW) - 7200)
    before = [task.task_id for task in ctl.queue.tasks()]
    result = ctl("--socket", files / "wq.sock", "schedule", files / "good.toml")
    assert result.exit_code == 0, result.output
    assert "last  2026-12-02 12:00:00 UTC   2026-12-02T12:00:00Z   tick@2026-12-02T12:00:00Z (ready)" in result.output
    assert "last  none put in the last 100 period(s)" in result.output  # nightly
    with Queue(files / "queue") as queue:  # walqueue-ctl closed its client, here the Queue
        assert [task.task_id for task in queue.tasks()] == before


def test_json_gives_one_object_per_entry(ctl, files):
    result = ctl("--socket", files / "wq.sock", "schedule", files / "good.toml", "--json", "--count", "1")
    assert result.exit_code == 0, result.output
    tick, nightly = (json.loads(line) for line in result.output.splitlines())
    assert tick["next"] == [{"start": 1_796_223_600, "utc": "2026-12-02T15:00:00Z", "task_id": "tick@2026-12-02T15:00:00Z",
                             "local": periods.local_time(1_796_223_600, None)}]
    assert (tick["last_put"], tick["periods_looked_at"]) == (None, 100)
    assert (nightly["timezone"], nightly["line"], nightly["cron"]) == ("Europe/Berlin", 5, "30 2 * * *")


def test_a_broken_schedule_file_is_an_error_naming_the_line(ctl, files):
    result = ctl("schedule", files / "bad.toml")
    assert result.exit_code == EXIT_USAGE
    assert "bad.toml:4: [[task]] 'x': cron '30 25 * * *': Bad hour field" in result.output
    result = ctl("schedule", files / "bad.toml", "--json")
    error = json.loads(result.output.strip().splitlines()[-1])
    assert (error["code"], error["error"]) == (2, "ScheduleFileError") and "bad.toml:4" in error["message"]
