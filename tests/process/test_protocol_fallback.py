"""This package's clients announce the newest protocol version and fall back
through the older ones they know when the daemon is older (walqueued 0.1
speaks only 1 and refuses any other hello; the daemons before the slow-turn
figures speak up to 4): an upgraded client keeps working against a daemon
that is not upgraded yet (docs/upgrades.md upgrades either side first)."""

from __future__ import annotations

import asyncio
import socket
import threading

import pytest

from walqueue import QueueStats
from walqueue import protocol as p
from walqueue.client import Client, aio
from walqueue.client.calls import CLIENT_PROTOCOL_VERSIONS


def read_request(connection: socket.socket):
    """One request from a raw socket, or None at end of stream."""
    reader = p.FrameReader()
    while (body := reader.next_body()) is None:
        data = connection.recv(65536)
        if not data:
            return None
        reader.feed(data)
    return p.decode_request(body)


class OldDaemon(threading.Thread):
    """Speaks protocol versions 1 to `newest` only, and answers a newer hello as walqueued 0.1 did."""

    def __init__(self, path: str, newest: int = 1) -> None:
        super().__init__(daemon=True)
        self.newest = newest
        self.listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.listener.bind(path)
        self.listener.listen()
        self.hellos: list[int] = []

    def run(self) -> None:
        while True:
            try:
                connection, _ = self.listener.accept()
            except OSError:
                return
            with connection:
                hello = read_request(connection)
                self.hellos.append(hello.version)
                if not 1 <= hello.version <= self.newest:
                    connection.sendall(p.encode(p.Error(
                        id=hello.id, error="InvalidRequest", fatal=True,
                        message=f"protocol version {hello.version} is not supported; "
                                f"this daemon speaks version 1 to {self.newest}")))
                    continue
                connection.sendall(p.encode(p.HelloOk(id=hello.id, version=hello.version,
                                                      server="walqueued/1",
                                                      max_body_bytes=p.MAX_BODY_BYTES)))
                request = read_request(connection)
                stats = QueueStats(1, 0, 0, 0, 1, 0, 100)
                connection.sendall(p.encode(p.StatsOk(id=request.id, stats=stats)))
                read_request(connection)  # until the client closes

    def close(self) -> None:
        self.listener.close()


@pytest.fixture
def old_daemon(workdir):
    server = OldDaemon(str(workdir / "old.sock"))
    server.start()
    yield server
    server.close()


def test_the_sync_client_falls_back_to_version_1_for_an_older_daemon(old_daemon, workdir):
    with Client(str(workdir / "old.sock")) as client:
        assert client.stats().ready == 1
    assert old_daemon.hellos == list(CLIENT_PROTOCOL_VERSIONS)  # the newest, ..., 1


def test_a_daemon_that_speaks_up_to_4_is_spoken_to_in_4(workdir):
    server = OldDaemon(str(workdir / "four.sock"), newest=p.COMPACTION_REPORTING_VERSION)
    server.start()
    try:
        with Client(str(workdir / "four.sock")) as client:
            assert client.stats().ready == 1
    finally:
        server.close()
    assert server.hellos == [p.TURN_REPORTING_VERSION, p.COMPACTION_REPORTING_VERSION]


def test_the_asyncio_client_falls_back_to_version_1_for_an_older_daemon(old_daemon, workdir):
    async def main():
        async with aio.Client(str(workdir / "old.sock")) as client:
            return await client.stats()

    assert asyncio.run(main()).ready == 1
    assert old_daemon.hellos == list(CLIENT_PROTOCOL_VERSIONS)
