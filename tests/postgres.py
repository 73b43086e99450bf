"""Throwaway PostgreSQL clusters for the tests, started and stopped by the suite.

`PostgresServer(fsync=...)` runs initdb in a temp directory and starts the
postmaster itself (a child of this process, so it is stopped by its pid):
Unix socket only (listen_addresses='', the socket in the temp directory), a
port picked at random. initdb refuses to run as root, so as root the cluster
belongs to the `postgres` user and the binaries run as that user.

Every wait is bounded. `stop()` sends SIGINT (fast shutdown) and escalates to
SIGQUIT and SIGKILL; `kill()` is `pg_ctl stop -m immediate` (SIGQUIT), a crash
as far as the database is concerned (it recovers from its WAL at the next
start).

`find_binaries()` returns the bin directory or None; `require_binaries()`
fails the run under CI=true and otherwise skips with how to install it.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import random
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path

START_SECONDS = 60.0
STOP_SECONDS = 30.0
INSTALL_HINT = ("PostgreSQL is not installed: `apt-get install postgresql` (scripts/test does it "
                "when run as root), or point WALQUEUE_PG_BIN at a directory holding initdb and postgres")


def find_binaries() -> Path | None:
    """The directory with initdb and postgres: $WALQUEUE_PG_BIN, else the newest Debian install."""
    configured = os.environ.get("WALQUEUE_PG_BIN")
    candidates = [configured] if configured else sorted(
        glob.glob("/usr/lib/postgresql/*/bin"), key=lambda path: int(path.split("/")[-2]),
        reverse=True)
    for candidate in candidates:
        path = Path(candidate)
        if (path / "initdb").is_file() and (path / "postgres").is_file():
            return path
    return None


def require_binaries() -> Path:
    """The bin directory; under CI=true its absence fails the run, elsewhere it skips."""
    import pytest

    found = find_binaries()
    if found is not None:
        return found
    if os.environ.get("CI") == "true":
        pytest.fail(f"CI=true and {INSTALL_HINT}", pytrace=False)
    pytest.skip(INSTALL_HINT)


def _run_as() -> str | None:
    """The user the cluster runs as: `postgres` when we are root (initdb refuses root)."""
    return "postgres" if os.geteuid() == 0 else None


class PostgresServer:
    """One cluster in its own temp directory. `dsn` connects over the Unix socket."""

    def __init__(self, *, fsync: bool = True, settings: dict[str, str] | None = None,
                 bin_dir: Path | None = None, base: Path | None = None,
                 data_from: Path | None = None) -> None:
        self.bin_dir = bin_dir or require_binaries()
        self.user = _run_as()
        self.base = base or Path(tempfile.mkdtemp(prefix="wq-pg-", dir="/tmp"))
        self.data = self.base / "data"
        self.log_path = self.base / "postgres.log"
        self.port = random.randint(20000, 59999)
        self.settings = {
            "listen_addresses": "''",
            "unix_socket_directories": f"'{self.base}'",
            "port": str(self.port),
            "fsync": "on" if fsync else "off",
            "synchronous_commit": "on" if fsync else "off",
            "full_page_writes": "on" if fsync else "off",
            "max_connections": "200",
            "shared_buffers": "64MB",
            "log_min_messages": "warning",
            **(settings or {}),
        }
        self.proc: subprocess.Popen | None = None
        if self.user is not None:
            os.chown(self.base, *self._ids())
        if data_from is None:
            self._run([self.bin_dir / "initdb", "-D", self.data, "-E", "UTF8", "--locale=C",
                       "--auth=trust", "--no-sync", "-U", "postgres"])
        self.write_settings()

    def _ids(self) -> tuple[int, int]:
        entry = pwd.getpwnam(self.user)
        return entry.pw_uid, entry.pw_gid

    def _run(self, command: list, timeout: float = START_SECONDS) -> str:
        result = subprocess.run([str(part) for part in command], user=self.user, group=self.user,
                                stdin=subprocess.DEVNULL, capture_output=True, text=True,
                                timeout=timeout, cwd=self.base)
        if result.returncode != 0:
            raise RuntimeError(f"{command[0]} failed ({result.returncode}): {result.stderr}")
        return result.stdout

    def write_settings(self) -> None:
        lines = "".join(f"{name} = {value}\n" for name, value in self.settings.items())
        path = self.data / "postgresql.auto.conf"
        path.write_text("# written by tests/postgres.py\n" + lines)
        if self.user is not None:
            os.chown(path, *self._ids())

    @property
    def dsn(self) -> str:
        return f"host={self.base} port={self.port} user=postgres dbname=postgres"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@/{database}?host={self.base}&port={self.port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None
        return self.proc.pid

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self) -> PostgresServer:
        """Start the postmaster and wait (bounded) until it accepts connections."""
        log = open(self.log_path, "ab")
        try:
            self.proc = subprocess.Popen([str(self.bin_dir / "postgres"), "-D", str(self.data)],
                                         user=self.user, group=self.user, stdin=subprocess.DEVNULL,
                                         stdout=log, stderr=log, cwd=self.base)
        finally:
            log.close()
        deadline = time.monotonic() + START_SECONDS
        while not self.accepting():
            if self.proc.poll() is not None:
                raise RuntimeError(f"postgres exited with {self.proc.returncode}:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise RuntimeError(f"postgres not ready after {START_SECONDS} s:\n{self.log()}")
            time.sleep(0.05)
        return self

    def accepting(self) -> bool:
        """True once postmaster.pid says the server is ready for connections."""
        try:
            lines = (self.data / "postmaster.pid").read_text().splitlines()
        except FileNotFoundError:
            return False
        # Line 8 is the postmaster's status (PM_STATUS_READY = "ready   ").
        return len(lines) >= 8 and lines[7].strip() in ("ready", "standby")

    def _signal_and_wait(self, signals: tuple[int, ...]) -> int | None:
        if self.proc is None:
            return None
        for number in signals:
            if self.proc.poll() is not None:
                break
            with contextlib.suppress(ProcessLookupError):
                self.proc.send_signal(number)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(STOP_SECONDS)
        return self.proc.wait(STOP_SECONDS)

    def stop(self) -> None:
        """Fast shutdown (SIGINT), then SIGQUIT, then SIGKILL, each bounded."""
        self._signal_and_wait((signal.SIGINT, signal.SIGQUIT, signal.SIGKILL))

    def kill(self) -> None:
        """`pg_ctl stop -m immediate`: SIGQUIT, no checkpoint; recovery at the next start."""
        self._signal_and_wait((signal.SIGQUIT, signal.SIGKILL))

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-20000:]
        except FileNotFoundError:
            return ""

    def cleanup(self) -> None:
        try:
            self.stop()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def standby(self, name: str = "standby") -> PostgresServer:
        """A streaming standby of this (running) server: pg_basebackup -R into a new cluster."""
        base = Path(tempfile.mkdtemp(prefix="wq-pg-standby-", dir="/tmp"))
        if self.user is not None:
            os.chown(base, *self._ids())
        self._run([self.bin_dir / "pg_basebackup", "-h", self.base, "-p", self.port, "-U",
                   "postgres", "-D", base / "data", "-R", "-X", "stream", "-c", "fast"])
        settings = {key: value for key, value in self.settings.items()
                    if key not in ("port", "unix_socket_directories")}
        settings["primary_conninfo"] = (f"'host={self.base} port={self.port} user=postgres "
                                        f"application_name={name}'")
        settings["hot_standby"] = "on"
        return PostgresServer(bin_dir=self.bin_dir, base=base, data_from=self.base,
                              settings=settings, fsync=self.settings["fsync"] == "on")

    def promote(self) -> None:
        self._run([self.bin_dir / "pg_ctl", "promote", "-D", self.data, "-w", "-t",
                   str(int(START_SECONDS))])


# -- pytest helpers: one fast cluster per test session ------------------------

_SESSION_KEY = "walqueue_postgres_server"


def session_server(request) -> PostgresServer:
    """The session's shared cluster (fsync off: semantic tests only), started once.

    Kept on the pytest config so tests/pg and tests/backends share it, and
    stopped by pid when the session ends. Tests that kill or restart a server,
    or need fsync, start their own PostgresServer.
    """
    config = request.config
    server = getattr(config, _SESSION_KEY, None)
    if server is None:
        require_binaries()
        server = PostgresServer(fsync=False)
        config.add_cleanup(server.cleanup)
        server.start()
        setattr(config, _SESSION_KEY, server)
    return server


_names = iter(range(1, 10**9))


def unique_name(prefix: str) -> str:
    """A queue or schema name no other test in this session uses."""
    return f"{prefix}-{os.getpid()}-{next(_names)}"
