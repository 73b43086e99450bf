"""scripts/test and scripts/serve do what the README says they do."""

import os
import signal
import subprocess

import pytest

from walqueue.client import Client

from .daemon import REPO, child_env, sigint_at_its_default, wait_until

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


def alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def kill_group(group: int) -> None:
    try:
        os.killpg(group, signal.SIGKILL)
    except ProcessLookupError:
        try:
            os.kill(group, signal.SIGKILL)  # a process that had not made its group yet
        except ProcessLookupError:
            pass


@pytest.mark.parametrize("pass_", ["inline", "pure"])
@pytest.mark.parametrize("to", ["the-script", "its-group"])
def test_ctrl_c_on_scripts_test_stops_both_pytest_processes(workdir, to, pass_):
    """Issue 23: Ctrl-C on scripts/test left the pytest processes running.

    "its-group" is a terminal's Ctrl-C (the foreground group gets SIGINT); "the-script" is
    SIGINT to the script alone (a supervisor, or `kill -INT`), which a foreground pytest
    used to hold off until it ended by itself. "pure": the Ctrl-C comes during the pure-Python
    path's pass (WALQUEUE_NO_EXTENSIONS=1), which runs where the in-process group ran.
    """
    waiting = "tests/process/interruptible.py::test_inline -q -p no:cacheprovider"
    env = child_env({"WALQUEUE_INTERRUPT_DIR": str(workdir),
                     "WALQUEUE_TEST_BESIDE": "tests/process/interruptible.py::test_beside -q -p no:cacheprovider",
                     "WALQUEUE_TEST_INLINE": waiting if pass_ == "inline" else "",
                     "WALQUEUE_TEST_PURE": waiting if pass_ == "pure" else ""})
    script = subprocess.Popen([str(REPO / "scripts" / "test")], cwd=REPO, env=env, start_new_session=True,
                              preexec_fn=sigint_at_its_default, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    pids = []
    try:
        wait_until(lambda: all((workdir / name).exists() for name in ("beside", "inline")), SCRIPT_SECONDS,
                   "both pytest processes running their test")
        pids = [int((workdir / name).read_text()) for name in ("beside", "inline")]
        if pass_ == "pure":
            assert (workdir / "inline.extensions").read_text() == "1"
        if to == "the-script":
            script.send_signal(signal.SIGINT)
        else:
            os.killpg(script.pid, signal.SIGINT)
        output, _ = script.communicate(timeout=30)
        assert script.returncode == 130, output
        wait_until(lambda: not any(alive(pid) for pid in pids), 15, "the pytest processes gone")
    finally:
        # Each pytest leads a process group of its own, and the script leads its session: kill
        # the groups, so that nothing they started holds the script's output pipe open.
        for group in [*pids, script.pid]:
            if alive(group):
                kill_group(group)
        if script.poll() is None:
            script.kill()
            script.communicate(timeout=30)
    assert "interrupted; stopping every pytest process" in output
