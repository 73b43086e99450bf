"""A daemon that stops cleanly removes its socket file: a client that has talked to it
takes the missing file for a restart and retries its put, while a client that never
reached a daemon at a path gives up at once (tests/unit/test_client_core.py)."""

import asyncio
import os

import pytest

from walqueue import aio
from walqueue.client import Client, NoSocket


def test_a_put_is_retried_across_a_clean_restart_that_removed_the_socket(make_daemon):
    daemon = make_daemon()
    with Client(daemon.socket_path, retry_seconds=20) as client:
        client.put("a", {})
        assert daemon.terminate() == 0
        assert not os.path.exists(daemon.socket_path)  # walqueued removed it on the way out
        restarted = make_daemon(start=False)
        restarted.start(wait_ready=False)  # a Python start takes far longer than the first attempt
        assert client.put("b", {}) == "b"
        assert {task.task_id for task in client.tasks()} == {"a", "b"}


def test_the_asyncio_client_retries_across_it_too(make_daemon):
    daemon = make_daemon()

    async def scenario():
        async with aio.Client(daemon.socket_path, retry_seconds=20) as client:
            await client.put("a", {})
            assert daemon.terminate() == 0
            restarted = make_daemon(start=False)
            restarted.start(wait_ready=False)
            assert await client.put("b", {}) == "b"

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_fresh_client_of_a_stopped_daemon_says_the_socket_is_missing(make_daemon):
    daemon = make_daemon()
    assert daemon.terminate() == 0
    with Client(daemon.socket_path) as client, pytest.raises(NoSocket, match="no such file"):
        client.stats()
