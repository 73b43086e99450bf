"""walqueued under systemd-style socket activation, driven by systemd's own
`systemd-socket-activate` (what walqueued.socket does, without PID 1): the
socket exists before the daemon, the first client's connection starts it,
walqueued serves the passed descriptor (LISTEN_FDS/LISTEN_PID) and does not
unlink a socket it does not own when it stops."""

import shutil
import signal
import subprocess
import sys

import pytest

from walqueue.client import Client

from .daemon import REPO, STOP_SECONDS, child_env, wait_until

ACTIVATE = shutil.which("systemd-socket-activate")
pytestmark = pytest.mark.skipif(ACTIVATE is None, reason="systemd-socket-activate is not installed "
                                "(Debian package systemd)")


def test_the_first_connection_starts_walqueued_on_the_socket_systemd_holds(workdir):
    socket_path = workdir / "activated.sock"
    log_path = workdir / "activate.log"
    command = [ACTIVATE, "--listen", str(socket_path), "--setenv", "PYTHONPATH",
               sys.executable, "-m", "walqueue.server", "serve", str(workdir / "queue"),
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
