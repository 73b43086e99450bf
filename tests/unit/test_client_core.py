"""The client core without a daemon: what a failed connect says, that both shells give up
at once on a path that cannot be a daemon's socket, and that they retry exactly the calls
walqueue.retry names (its rules themselves: tests/unit/test_retry.py)."""

import asyncio
import socket

import pytest

import walqueue.client.blocking as blocking
from walqueue import InvalidRequest
from walqueue.client import Client, DaemonUnavailable, NoSocket, aio
from walqueue.client.address import connect_error, not_a_socket


def test_a_failed_connect_names_what_is_at_the_path(tmp_path):
    missing = str(tmp_path / "nonexist")
    regular = tmp_path / "file"
    regular.write_text("")
    dangling = tmp_path / "link"
    dangling.symlink_to(tmp_path / "nowhere")
    assert not_a_socket(missing) == "no such file"
    assert not_a_socket(str(regular)) == "it is a regular file, not a socket"
    assert not_a_socket(str(tmp_path)) == "it is a directory, not a socket"
    assert not_a_socket(str(dangling)) == "it is a dangling symbolic link, not a socket"
    refused = ConnectionRefusedError(111, "Connection refused")
    error = connect_error(missing, FileNotFoundError(2, "No such file"), reached_before=False)
    assert type(error) is NoSocket and "no such file" in str(error) and missing in str(error)
    assert type(connect_error(str(regular), refused, reached_before=True)) is NoSocket
    # Once a daemon answered there, a missing socket is a restart: retryable.
    restarting = connect_error(missing, FileNotFoundError(2, "No such file"), reached_before=True)
    assert type(restarting) is DaemonUnavailable and "restarting" in str(restarting)


def test_a_socket_file_nobody_listens_on_stays_retryable(tmp_path):
    path = str(tmp_path / "dead.sock")
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(path)
    leftover.close()  # a dead daemon's socket file: it may come back
    assert not_a_socket(path) is None
    error = connect_error(path, ConnectionRefusedError(111, "Connection refused"), reached_before=False)
    assert type(error) is DaemonUnavailable


@pytest.fixture
def sleeps(monkeypatch):
    """The sync client's pauses between retries, recorded instead of slept."""
    recorded = []
    monkeypatch.setattr(blocking.time, "sleep", recorded.append)
    return recorded


def test_the_sync_client_gives_up_at_once_on_a_missing_path_or_a_regular_file(tmp_path, sleeps):
    regular = tmp_path / "file"
    regular.write_text("")
    for path, reason in ((tmp_path / "nonexist", "no such file"), (regular, "regular file, not a socket")):
        with Client(path, retry_seconds=10) as client, pytest.raises(NoSocket, match=reason):
            client.put("a", {})  # a put is retried for a restarting daemon, but not for this
    assert sleeps == []


def test_the_sync_client_retries_a_put_on_a_refused_socket_until_retry_seconds(tmp_path, sleeps):
    path = str(tmp_path / "dead.sock")
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(path)
    leftover.close()
    with Client(path, retry_seconds=0.2) as client, pytest.raises(DaemonUnavailable) as failure:
        client.put("a", {})
    assert type(failure.value) is DaemonUnavailable and sleeps  # it paused and tried again


def refused_socket(tmp_path) -> str:
    """A dead daemon's socket file: a connect is refused, and the daemon may come back."""
    path = str(tmp_path / "dead.sock")
    leftover = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    leftover.bind(path)
    leftover.close()
    return path


def test_the_sync_client_retries_the_reads_on_a_refused_socket_but_never_a_reserve(tmp_path, sleeps):
    path = refused_socket(tmp_path)
    with Client(path, retry_seconds=0.2) as client:
        for read in (lambda: client.get("a"), client.tasks, client.stats, client.daemon_stats):
            sleeps.clear()
            with pytest.raises(DaemonUnavailable):
                read()
            assert sleeps, read  # it paused and tried again (walqueue.retry: reads are safe to resend)
        sleeps.clear()
        for write in (lambda: client.reserve("w"), lambda: client.revive(["a"]), client.compact):
            with pytest.raises(DaemonUnavailable):
                write()
        assert sleeps == []  # never sent twice blindly


def test_the_asyncio_client_retries_the_reads_on_a_refused_socket_but_never_a_reserve(tmp_path, monkeypatch):
    path = refused_socket(tmp_path)
    recorded = []

    async def sleep(seconds):
        recorded.append(seconds)

    monkeypatch.setattr(aio.asyncio, "sleep", sleep)

    async def scenario():
        async with aio.Client(path, retry_seconds=0.2) as client:
            with pytest.raises(DaemonUnavailable):
                await client.get("a")
            assert recorded  # retried
            recorded.clear()
            with pytest.raises(DaemonUnavailable):
                await client.reserve("w")
            assert recorded == []

    asyncio.run(asyncio.wait_for(scenario(), 10))


def test_the_asyncio_client_gives_up_at_once_on_a_missing_path(tmp_path, monkeypatch):
    recorded = []

    async def sleep(seconds):
        recorded.append(seconds)

    monkeypatch.setattr(aio.asyncio, "sleep", sleep)

    async def scenario():
        async with aio.Client(tmp_path / "nonexist", retry_seconds=10) as client:
            with pytest.raises(NoSocket, match="no such file"):
                await client.put("a", {})

    asyncio.run(asyncio.wait_for(scenario(), 10))
    assert recorded == []


def test_a_bad_argument_raises_when_the_asyncio_call_is_awaited():
    client = aio.Client("/nonexistent/walqueued.sock")
    pending = client.put(7, {})  # nothing raised yet: the call is a coroutine
    with pytest.raises(InvalidRequest, match="task_id must be a str"):
        asyncio.run(pending)


def test_walqueue_aio_still_names_the_asyncio_client_and_worker():
    # docs/daemon.md showed `from walqueue.aio import Client, Worker` in 0.2; the classes
    # now live with their kind (walqueue.client.aio, walqueue.worker.aio).
    import walqueue.aio
    import walqueue.worker.aio

    assert walqueue.aio.Client is aio.Client and walqueue.aio.AsyncConnection is aio.AsyncConnection
    assert walqueue.aio.Worker is walqueue.worker.aio.Worker
    assert walqueue.aio.DaemonUnavailable is DaemonUnavailable
