"""walqueued as the units in systemd/ run it, without PID 1.

Socket activation driven by systemd's own `systemd-socket-activate` (what
walqueued.socket does): the socket exists before the daemon, the first
client's connection starts it, walqueued serves the passed descriptor
(LISTEN_FDS/LISTEN_PID) and does not unlink a socket it does not own. And
each service's ExecStart, specifiers expanded, starts a daemon that serves
on the path its .socket unit listens on."""

import os
import shutil
import signal
import subprocess
import sys

import pytest

from walqueue.client import Client

from .daemon import REPO, STOP_SECONDS, child_env, wait_until

ACTIVATE = shutil.which("systemd-socket-activate")


@pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate is not installed "
                    "(Debian package systemd)")
def test_the_first_connection_starts_walqueued_on_the_socket_systemd_holds(workdir):
    socket_path = workdir / "activated.sock"
    log_path = workdir / "activate.log"
    command = [ACTIVATE, "--listen", str(socket_path), "--setenv", "PYTHONPATH",
               sys.executable, "-m", "walqueue.daemon.cli", "serve", str(workdir / "queue"),
               "--socket", str(socket_path)]
    env = child_env()
    with open(log_path, "wb") as log:
        activator = subprocess.Popen(command, stdin=subprocess.DEVNULL, stdout=log, stderr=log,
                                     env=env, cwd=REPO)
    try:
        wait_until(lambda: socket_path.exists() or activator.poll() is not None, 10,
                   "the activator's socket")
        assert activator.poll() is None, log_path.read_text()
        assert not (workdir / "queue").exists()  # nothing runs until a client connects
        with Client(socket_path, timeout=20) as client:
            assert client.put("a", {"n": 1}) == "a"
            assert client.stats().ready == 1
        text = log_path.read_text()
        assert "listening on the socket passed by systemd" in text, text
        activator.send_signal(signal.SIGTERM)  # the activator exec'd into walqueued: same pid
        assert activator.wait(STOP_SECONDS) == 0, log_path.read_text()
        assert socket_path.exists()  # systemd's socket: the daemon leaves it alone
    finally:
        if activator.poll() is None:
            activator.kill()
            activator.wait(STOP_SECONDS)


UNITS = REPO / "systemd"


def unit_value(filename: str, key: str) -> str:
    (value,) = [line.partition("=")[2] for line in (UNITS / filename).read_text().splitlines()
                if line.startswith(f"{key}=")]
    return value


@pytest.mark.parametrize("service, socket_unit", [("walqueued.service", "walqueued.socket"),
                                                  ("walqueued@.service", "walqueued@.socket")])
def test_the_units_exec_start_runs_and_serves_on_the_socket_units_path(make_daemon, workdir, service,
                                                                        socket_unit):
    """systemd-analyze checks the unit's syntax, not walqueued's arguments: run
    ExecStart with its specifiers expanded (%S, %t, %i) and talk to it."""
    expand = {"%S": str(workdir / "state"), "%t": str(workdir / "run"), "%i": "orders"}

    def expanded(text: str) -> str:
        for specifier, value in expand.items():
            text = text.replace(specifier, value)
        return text

    binary, *arguments = expanded(unit_value(service, "ExecStart")).split()
    assert binary == "/opt/walqueue/current/bin/walqueued"  # where scripts/install puts it
    socket_path = expanded(unit_value(socket_unit, "ListenStream"))
    assert arguments[arguments.index("--socket") + 1] == socket_path
    os.makedirs(os.path.dirname(socket_path), mode=0o750)  # systemd's RuntimeDirectory=
    directory = arguments[1]
    # systemd's StateDirectory= (walqueued itself creates only a last component: SPEC §8b).
    assert directory == expanded("%S/" + unit_value(service, "StateDirectory"))
    os.makedirs(directory, mode=0o750)
    daemon = make_daemon(directory=directory, socket_path=socket_path, start=False)
    daemon.start(command=[sys.executable, "-m", "walqueue.daemon.cli", *arguments])
    with Client(socket_path, timeout=20) as client:
        assert client.put("a", {}) == "a"
    assert os.stat(socket_path).st_mode & 0o777 == 0o660
    assert daemon.terminate() == 0
    assert not os.path.exists(socket_path)  # its own socket (not systemd's): removed at exit
    assert os.path.isdir(directory) and any(name.startswith("wal-") for name in os.listdir(directory))
