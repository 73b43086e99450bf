"""This package's clients announce the newest protocol version and fall back
through the older ones they know when the daemon is older (walqueued 0.1
speaks only 1 and refuses any other hello; the daemons before the slow-turn
figures speak up to 4, those before error codes up to 5): an upgraded client
keeps working against a daemon that is not upgraded yet (docs/upgrades.md
upgrades either side first). A refusal is recognised by its code (version 6)
or, from a daemon that sends none, by its shape, never by its text."""

from __future__ import annotations

import asyncio
import socket
import threading

import msgspec
import pytest

from walqueue import InvalidRequest, QueueStats
from walqueue import protocol as p
from walqueue.client import Client, DaemonUnavailable, aio
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
    """Speaks protocol versions 1 to `newest` only, and answers a newer hello as walqueued 0.1 did
    (or with `refusal`, a message of another text, and a code if it has one).

    It answers `stats`; a request whose tag is in `unknown` it answers as a daemon that does
    not know it: a fatal InvalidRequest (no code: as the daemons up to version 5), then it closes.
    """

    def __init__(self, path: str, newest: int = 1, *, refusal: str | None = None,
                 code: str | msgspec.UnsetType = msgspec.UNSET, unknown: frozenset[str] = frozenset()) -> None:
        super().__init__(daemon=True)
        self.newest = newest
        self.refusal = refusal
        self.code = code
        self.unknown = unknown
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
                    message = self.refusal or (f"protocol version {hello.version} is not supported; "
                                               f"this daemon speaks version 1 to {self.newest}")
                    connection.sendall(p.encode(p.Error(id=hello.id, error="InvalidRequest", fatal=True,
                                                        message=message, code=self.code)))
                    continue
                connection.sendall(p.encode(p.HelloOk(id=hello.id, version=hello.version,
                                                      server="walqueued/1",
                                                      max_body_bytes=p.MAX_BODY_BYTES)))
                while (request := read_request(connection)) is not None:  # until the client closes
                    tag = request.__struct_config__.tag
                    if tag in self.unknown:
                        connection.sendall(p.encode(p.Error(
                            id=request.id, error="InvalidRequest", fatal=True,
                            message=f"undecodable request: Invalid value '{tag}' - at `$.type`")))
                        break
                    stats = QueueStats(1, 0, 0, 0, 1, 0, 100)
                    connection.sendall(p.encode(p.StatsOk(id=request.id, stats=stats)))

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
    assert server.hellos == [p.EXPIRY_REPORTING_VERSION, p.ERROR_CODE_VERSION, p.TURN_REPORTING_VERSION,
                            p.COMPACTION_REPORTING_VERSION]


def test_a_daemon_that_speaks_up_to_5_is_spoken_to_in_5(workdir):
    server = OldDaemon(str(workdir / "five.sock"), newest=p.TURN_REPORTING_VERSION)
    server.start()
    try:
        with Client(str(workdir / "five.sock")) as client:
            assert client.stats().ready == 1
    finally:
        server.close()
    assert server.hellos == [p.EXPIRY_REPORTING_VERSION, p.ERROR_CODE_VERSION, p.TURN_REPORTING_VERSION]


def test_a_daemon_that_speaks_up_to_6_is_spoken_to_in_6_and_reports_no_expiries(workdir):
    server = OldDaemon(str(workdir / "six.sock"), newest=p.ERROR_CODE_VERSION, code=p.UNSUPPORTED_VERSION)
    server.start()
    try:
        with Client(str(workdir / "six.sock")) as client:
            assert client.stats().ready == 1
    finally:
        server.close()
    assert server.hellos == [p.EXPIRY_REPORTING_VERSION, p.ERROR_CODE_VERSION]


@pytest.mark.parametrize("refusal, code", [
    ("no", msgspec.UNSET),   # a daemon before codes, whatever its words
    ("versión 7 no soportada", msgspec.UNSET),
    ("we have moved on", p.UNSUPPORTED_VERSION),   # a daemon with codes: the code decides
], ids=["old-terse", "old-other-words", "coded"])
def test_the_fallback_does_not_read_the_refusal_s_text(workdir, refusal, code):
    server = OldDaemon(str(workdir / "words.sock"), newest=p.TURN_REPORTING_VERSION, refusal=refusal, code=code)
    server.start()
    try:
        with Client(str(workdir / "words.sock")) as client:
            assert client.stats().ready == 1
    finally:
        server.close()
    assert server.hellos == [p.EXPIRY_REPORTING_VERSION, p.ERROR_CODE_VERSION, p.TURN_REPORTING_VERSION]


def test_a_coded_refusal_that_is_not_about_the_version_is_not_a_fallback(workdir):
    server = OldDaemon(str(workdir / "other.sock"), newest=0, refusal="protocol version 7 is not supported",
                       code="something_else")
    server.start()
    try:
        with Client(str(workdir / "other.sock")) as client, pytest.raises(DaemonUnavailable) as refused:
            client.stats()
    finally:
        server.close()
    assert server.hellos == [p.EXPIRY_REPORTING_VERSION]   # no second hello, whatever the text says
    assert isinstance(refused.value.__cause__, InvalidRequest)


@pytest.mark.parametrize("shell", ["sync", "asyncio"])
def test_a_request_an_older_daemon_does_not_know_is_its_invalid_request_and_the_next_call_works(
        workdir, shell):
    # walqueued 0.1 knows no daemon_stats: it answers a fatal InvalidRequest, with no code, and
    # closes. The call raises InvalidRequest (nothing was applied); the next call reconnects.
    server = OldDaemon(str(workdir / "unknown.sock"), newest=1, unknown=frozenset({"daemon_stats"}))
    server.start()
    try:
        if shell == "sync":
            with Client(str(workdir / "unknown.sock")) as client:
                with pytest.raises(InvalidRequest, match="undecodable request") as raised:
                    client.daemon_stats()
                assert client.stats().ready == 1
        else:
            async def main():
                async with aio.Client(str(workdir / "unknown.sock")) as client:
                    with pytest.raises(InvalidRequest, match="undecodable request") as raised:
                        await client.daemon_stats()
                    assert (await client.stats()).ready == 1
                    return raised

            raised = asyncio.run(asyncio.wait_for(main(), 30))
    finally:
        server.close()
    assert type(raised.value) is InvalidRequest and raised.value.code == "invalid_request"


def test_the_asyncio_client_falls_back_to_version_1_for_an_older_daemon(old_daemon, workdir):
    async def main():
        async with aio.Client(str(workdir / "old.sock")) as client:
            return await client.stats()

    assert asyncio.run(main()).ready == 1
    assert old_daemon.hellos == list(CLIENT_PROTOCOL_VERSIONS)
