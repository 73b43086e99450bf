"""The client shells against real walqueued processes: a daemon that stops cleanly removes
its socket file, so a client that has talked to it takes the missing file for a restart
and retries its put and its reads (walqueue.retry), while a client that never reached a
daemon at a path gives up at once (tests/unit/test_client_core.py); and the sync client's
threads each have a connection."""

import asyncio
import os
import threading

import pytest

from walqueue.client import Client, NoSocket, aio


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


def test_the_reads_are_retried_across_a_clean_restart_as_puts_are(make_daemon):
    # walqueue.retry: get, tasks and stats change nothing, so both shells send them again.
    daemon = make_daemon()
    with Client(daemon.socket_path, retry_seconds=20) as client:
        client.put("a", {})
        assert daemon.terminate() == 0
        restarted = make_daemon(start=False)
        restarted.start(wait_ready=False)  # a Python start takes far longer than the first attempt
        assert client.get("a").status == "ready"
        assert [task.task_id for task in client.tasks()] == ["a"]

    async def scenario():
        async with aio.Client(restarted.socket_path, retry_seconds=20) as asynchronous:
            assert (await asynchronous.stats()).ready == 1
            assert restarted.terminate() == 0
            make_daemon(start=False).start(wait_ready=False)
            assert (await asynchronous.stats()).ready == 1
            assert (await asynchronous.get("a")).status == "ready"

    asyncio.run(asyncio.wait_for(scenario(), 30))


def test_a_fresh_client_of_a_stopped_daemon_says_the_socket_is_missing(make_daemon):
    daemon = make_daemon()
    assert daemon.terminate() == 0
    with Client(daemon.socket_path) as client, pytest.raises(NoSocket, match="no such file"):
        client.stats()


def test_a_waiting_reserve_in_one_thread_does_not_hold_up_another_threads_calls(daemon):
    with Client(daemon.socket_path) as client:
        leased = []
        waiter = threading.Thread(target=lambda: leased.extend(client.reserve("w", wait=30)), daemon=True)
        waiter.start()
        daemon.wait_for_log("parked reserve")  # the reserve waits in the daemon (its log: no event to await)
        putter = threading.Thread(target=client.put, args=("a", {}), daemon=True)
        putter.start()
        putter.join(10)  # one shared connection would make it wait out the reserve's 30 s
        assert not putter.is_alive()
        waiter.join(10)
        assert [lease.task_id for lease in leased] == ["a"]  # woken by the other thread's put
