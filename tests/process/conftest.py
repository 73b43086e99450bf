"""Fixtures for the process tests: a short scratch directory and daemon/client factories."""

import shutil
import tempfile
from pathlib import Path

import pytest

from .daemon import ClientProcess, Daemon


@pytest.fixture
def workdir():
    # Unix socket paths are limited to ~107 bytes, so not pytest's tmp_path.
    path = Path(tempfile.mkdtemp(prefix="wq-", dir="/tmp"))
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.fixture
def make_daemon(workdir):
    daemons: list[Daemon] = []

    def make(*args: str, env: dict | None = None, directory: Path | None = None,
             socket_path: str | None = None, start: bool = True) -> Daemon:
        daemon = Daemon(workdir, directory or workdir / "queue",
                        socket_path or str(workdir / "wq.sock"), args, env)
        daemons.append(daemon)
        if start:
            daemon.start()
        return daemon

    yield make
    for daemon in daemons:
        daemon.cleanup()
        # Captured output is shown only when the test failed: the daemon's log.
        print(f"--- {daemon.log_path.name} ---\n{daemon.log()}")


@pytest.fixture
def daemon(make_daemon):
    return make_daemon()


@pytest.fixture
def client_process():
    processes: list[ClientProcess] = []

    def start(*args: str) -> ClientProcess:
        process = ClientProcess(*map(str, args))
        processes.append(process)
        return process

    yield start
    for process in processes:
        process.cleanup()
