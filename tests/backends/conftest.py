"""One fixture, three backends: the client-level semantic tests run against walqueued,
PostgreSQL and the in-memory backend of tests/unit/memory_client.py.

`backend` is parametrized; `backend.client()` opens another client of the
same queue (a walqueue.client.Client on the test's own daemon process, a
walqueue.pg.Client on a fresh queue of the session's cluster, or a
MemoryClient of one MemoryQueue on the real clock), and `backend.name` says
which. Every client and the daemon are closed or stopped after the test.
These tests use each backend's own clock in real time (delays, waits); the
conformance suite on the faces of tests/backends/faces.py sets the clocks.
"""

from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

import pytest

from tests.postgres import session_server, unique_name
from tests.process.daemon import Daemon


class Backend:
    def __init__(self, name: str, opener) -> None:
        self.name = name
        self._opener = opener
        self._clients: list = []

    def client(self):
        client = self._opener()
        self._clients.append(client)
        return client

    def close(self) -> None:
        for client in self._clients:
            client.close()


class RealClock:
    def now(self) -> float:
        return time.time()


@pytest.fixture(params=["walqueued", "postgres", "memory"])
def backend(request):
    if request.param == "memory":
        from tests.unit.memory_client import MemoryClient, MemoryQueue

        queue = MemoryQueue(RealClock())
        backend = Backend("memory", lambda: MemoryClient(queue))
        yield backend
        backend.close()
        return
    if request.param == "walqueued":
        from walqueue.client import Client as DaemonClient

        workdir = Path(tempfile.mkdtemp(prefix="wq-", dir="/tmp"))
        daemon = Daemon(workdir, workdir / "queue", str(workdir / "wq.sock"))
        daemon.start()
        backend = Backend("walqueued", lambda: DaemonClient(daemon.socket_path))
        try:
            yield backend
        finally:
            backend.close()
            daemon.cleanup()
            shutil.rmtree(workdir, ignore_errors=True)
        return
    from walqueue.pg import Client as PostgresClient

    server = session_server(request)
    queue = unique_name("q")
    backend = Backend("postgres", lambda: PostgresClient(server.dsn, queue=queue))
    try:
        yield backend
    finally:
        backend.close()
