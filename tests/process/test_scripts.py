"""scripts/test and scripts/serve do what the README says they do."""

import subprocess

from walqueue.client import Client

from .daemon import REPO, child_env

SCRIPT_SECONDS = 300.0  # scripts/test may (re)install the venv first


def collected(*args: str) -> list[str]:
    """The test ids `scripts/test --collect-only -q ARGS` would run."""
    result = subprocess.run([str(REPO / "scripts" / "test"), "--collect-only", "-q",
                             "-p", "no:cacheprovider", *args], capture_output=True, text=True,
                            cwd=REPO, env=child_env(), timeout=SCRIPT_SECONDS)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    return [line for line in result.stdout.splitlines() if "::" in line]


def test_scripts_test_arguments_replace_the_default_paths_and_options_alone_run_everything():
    only = collected("tests/unit/test_display.py")
    assert only and all(test.startswith("tests/unit/test_display.py::") for test in only)
    everything = collected("-k", "not hypothetical_nothing")
    assert {test.split("/")[1] for test in everything} >= {"unit", "process", "crash", "model"}
    assert len(everything) > 10 * len(only)


def test_scripts_serve_serves_the_directory_it_is_given(make_daemon, workdir):
    directory = workdir / "emails"
    daemon = make_daemon(directory=directory, socket_path=str(directory / "walqueued.sock"),
                         start=False)
    daemon.start(command=[str(REPO / "scripts" / "serve"), str(directory), "--log-level", "debug"])
    with Client(directory, timeout=20) as client:  # a directory means its walqueued.sock
        assert client.put("email-1", {}) == "email-1"
    assert daemon.terminate() == 0
