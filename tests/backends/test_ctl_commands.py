"""Every walqueue-ctl command, run against both backends: a real walqueued and a queue
on the session's PostgreSQL. None may end in a traceback: each works, or exits
with one of the codes its --help documents and a message on stderr.

The commands run in one scenario (a task is put before it is leased, leased
before it is acked, dead before it is revived), in process with CliRunner, so
an uncaught exception is the result's exception. The scenario must name every
command of the group: a new command is added here, with what it should do on
each backend.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
from pathlib import Path

import pytest
from click.testing import CliRunner

from tests.postgres import session_server, unique_name
from tests.process.daemon import Daemon
from walqueue.ctl import cli
from walqueue.ctl.errors import EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE

# walqueued's own commands, which a queue on PostgreSQL has no use for (SPEC §9).
DAEMON_ONLY = {"verify", "backup", "compact", "pause", "resume", "metrics", "top"}


def scenario(workdir: Path, directory: Path) -> list[tuple[str, ...]]:
    return [
        ("migrate",),
        ("put", "a", '{"n": 1}'),
        ("put", "b"),
        ("put", "c", "{}", "--max-attempts", "1"),
        ("get", "a"),
        ("tasks",),
        ("next",),
        ("stats",),
        ("reserve", "w", "--limit", "3"),  # a, b and c, each at generation 1
        ("workers",),
        ("touch", "a", "--worker", "w", "--generation", "1", "--lease-seconds", "60"),
        ("ack", "a", "--worker", "w", "--generation", "1"),
        ("release", "c", "--worker", "w", "--generation", "1"),  # dead: out of attempts
        ("dead",),
        ("revive", "c"),
        ("force-release", "b", "--yes"),
        ("cancel", "b"),  # ready again: completed without running
        ("compact",),
        ("pause",),
        ("resume",),
        ("metrics",),
        ("top", "--count", "1"),
        ("backup", str(workdir / "copy")),
        ("verify", str(directory)),
        ("schedule", str(schedule_file(workdir))),
    ]


def schedule_file(workdir: Path) -> Path:
    path = workdir / "schedule.toml"
    path.write_text('[[task]]\nname = "nightly"\ncron = "0 3 * * *"\n')
    return path


def expected_code(backend: str, command: str) -> int:
    if backend == "walqueued":
        return EXIT_USAGE if command == "migrate" else EXIT_OK  # migrate is PostgreSQL's
    return EXIT_USAGE if command in DAEMON_ONLY else EXIT_OK


def documented_codes(command: str) -> set[int]:
    epilog = cli.commands[command].epilog
    return {int(code) for code in re.findall(r"^\s*(\d+)  ", epilog.split("Exit codes:")[1], re.M)}


@pytest.fixture(params=["walqueued", "postgres"])
def target(request):
    """(backend name, the group options that point walqueue-ctl at it, a work directory,
    the queue directory verify reads)."""
    workdir = Path(tempfile.mkdtemp(prefix="wq-", dir="/tmp"))
    try:
        if request.param == "walqueued":
            daemon = Daemon(workdir, workdir / "queue", str(workdir / "wq.sock"))
            daemon.start()
            try:
                yield "walqueued", ["--socket", daemon.socket_path], workdir, daemon.directory
            finally:
                daemon.cleanup()
            return
        server = session_server(request)
        yield ("postgres", ["--dsn", server.dsn, "--queue", unique_name("ctl")], workdir,
               workdir / "queue")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.mark.parametrize("command", [["get", "nosuch"], ["revive", "real", "nosuch"],
                                     ["force-release", "real", "nosuch", "--yes"],
                                     ["cancel", "nosuch"]])
def test_no_such_task_is_exit_7_on_every_command_and_backend(target, command):
    """Issue 23: `get nosuch` exited 7 and `revive nosuch` 2; force-release said 2 as well."""
    backend, options, _, _ = target
    runner = CliRunner()
    if backend == "postgres":
        assert runner.invoke(cli, [*options, "migrate"]).exit_code == EXIT_OK
    assert runner.invoke(cli, [*options, "put", "real", "{}"]).exit_code == EXIT_OK
    result = runner.invoke(cli, [*options, *command])
    assert result.exit_code == EXIT_NOT_FOUND, result.output
    assert "no task 'nosuch'" in result.stderr
    real = runner.invoke(cli, [*options, "get", "real"])
    assert real.exit_code == EXIT_OK and json.loads(real.stdout)["status"] == "ready"  # unchanged


def test_every_command_works_or_exits_with_a_documented_code_and_a_message(target):
    backend, options, workdir, directory = target
    steps = scenario(workdir, directory)
    assert {step[0] for step in steps} == set(cli.commands), "the scenario must run every command"
    runner = CliRunner()
    for step in steps:
        result = runner.invoke(cli, [*options, *step])
        name = step[0]
        where = f"{backend}: walqueue-ctl {' '.join(step)}"
        if result.exception is not None and not isinstance(result.exception, SystemExit):
            raise AssertionError(f"{where} ended in {result.exception!r}") from result.exception
        assert "Traceback" not in result.output, where
        assert result.exit_code in documented_codes(name), (where, result.exit_code, result.stderr)
        if result.exit_code != EXIT_OK:
            assert result.stderr.startswith("Error: ") and len(result.stderr) > 20, (where, result.stderr)
        assert result.exit_code == expected_code(backend, name), (where, result.output)
