"""walqueue-worker's command line without a daemon: usage errors exit 2 and say what is
wrong, an unreachable service exits 3, and --help documents the exit codes.
tests/process/test_worker_process.py runs it against a real walqueued."""

import sys

import click
import pytest
from click.testing import CliRunner

from walqueue.dsn import redacted
from walqueue.worker import cli


@pytest.fixture
def run(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "path", list(sys.path))  # the command puts the working directory first
    (tmp_path / "jobs.py").write_text(
        "NOT_CALLABLE = 3\n"
        "def handle(lease):\n    pass\n"
        "async def handle_async(lease):\n    pass\n")
    (tmp_path / "broken.py").write_text("raise RuntimeError('configuration missing')\n")

    def invoke(*args):
        return CliRunner().invoke(cli.main, [str(arg) for arg in args])

    yield invoke
    for name in ("jobs", "broken"):
        sys.modules.pop(name, None)


@pytest.mark.parametrize("handler, says", [
    ("jobs", "is not MODULE:FUNCTION"),
    ("nowhere:handle", "cannot import nowhere: ModuleNotFoundError"),
    ("broken:handle", "cannot import broken: RuntimeError: configuration missing"),
    ("jobs:missing", "jobs has no attribute 'missing'"),
    ("jobs:NOT_CALLABLE", "jobs:NOT_CALLABLE is a int, not a function"),
])
def test_a_handler_that_cannot_be_loaded_is_a_usage_error(run, tmp_path, handler, says):
    result = run(tmp_path / "wq.sock", handler)
    assert result.exit_code == cli.EXIT_USAGE, result.output
    assert says in result.output


def test_a_bad_option_is_a_usage_error(run, tmp_path):
    result = run(tmp_path / "wq.sock", "jobs:handle", "--concurrency", "0")
    assert result.exit_code == cli.EXIT_USAGE and "--concurrency" in result.output


@pytest.mark.parametrize("handler", ["jobs:handle", "jobs:handle_async"])
def test_a_missing_socket_exits_3_at_once_and_says_so(run, tmp_path, handler):
    result = run(tmp_path / "nonexist", handler)
    assert result.exit_code == cli.EXIT_UNAVAILABLE, result.output
    assert "no such file" in result.output and "nonexist" in result.output


def test_queue_is_for_postgresql_targets_only(run, tmp_path):
    result = run(tmp_path / "wq.sock", "jobs:handle", "--queue", "orders")
    assert result.exit_code == cli.EXIT_USAGE and "PostgreSQL" in result.output


def test_async_handlers_are_recognised_also_as_callable_objects():
    class Handler:
        async def __call__(self, lease):
            pass

    async def function(lease):
        pass

    assert cli.is_async(function) and cli.is_async(Handler()) and not cli.is_async(print)


def test_help_lists_every_option_and_the_exit_codes():
    assert all(parameter.help for parameter in cli.main.params if isinstance(parameter, click.Option))
    text = CliRunner().invoke(cli.main, ["--help"]).output
    for code in ("0  stopped by SIGTERM", "2  usage", "3  the service"):
        assert code in text


@pytest.mark.parametrize("target, code", [
    ("host=/nonexistent user=worker password=s3cretPW9 dbname=jobs", cli.EXIT_UNAVAILABLE),  # taken for a path
    ("postgresql://worker:s3cretPW9%zz@/jobs", cli.EXIT_USAGE),  # libpq cannot parse it
])
def test_a_password_in_target_is_never_printed(run, target, code):
    result = run(target, "jobs:handle")
    assert result.exit_code == code, result.output
    assert "s3cretPW9" not in result.output
    assert "password=***" in result.output or "worker:***@" in result.output


def test_help_says_where_a_password_goes_and_shows_none():
    text = CliRunner().invoke(cli.main, ["--help"]).output
    assert "~/.pgpass" in text and "postgresql://worker@db/app" in text
    assert redacted(text) == text
