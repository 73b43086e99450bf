"""walqueue.client.aio against real walqueued processes: every method, the library's
errors, reconnects, blocking reserves, pipelining and the async worker.

Each test is a plain function running one coroutine under ``asyncio.run``,
bounded as a whole by ``asyncio.wait_for``.
"""

import asyncio
import dataclasses
import time

import pytest

from walqueue import InvalidRequest, KeyConflict, PutRequest, QueueClosed, StaleLease
from walqueue import protocol as p
from walqueue.client.aio import Client, DaemonUnavailable
from walqueue.worker.aio import Worker

TEST_SECONDS = 15.0


def run(coroutine, seconds: float = TEST_SECONDS):
    return asyncio.run(asyncio.wait_for(coroutine, seconds))


def test_every_method_round_trips_through_the_daemon(daemon):
    async def scenario():
        async with Client(daemon.directory.parent / "wq.sock") as client:
            assert await client.put("a", {"n": 1}) == "a"
            assert await client.put("a", {"n": 1}) == "a"  # identical retry
            assert await client.put_many([PutRequest("b", {}), {"task_id": "c", "payload": {"l": [1, 2]}}]) == ["b", "c"]
            assert await client.put_many([]) == []
            leases = await client.reserve("w1", lease_seconds=60, limit=2)
            assert [lease.task_id for lease in leases] == ["a", "b"]
            assert leases[0].payload == {"n": 1} and leases[0].generation == 1
            assert await client.ack(leases[0]) is None
            touched = await client.touch(leases[1], lease_seconds=120)
            assert touched.deadline >= leases[1].deadline and touched.generation == leases[1].generation
            assert await client.release(leases[1], delay=0) is None
            assert (await client.get("b")).status == "ready"
            assert await client.get("missing") is None
            await client.put("d", {}, max_attempts=1)
            (lease_d,) = [lease for lease in await client.reserve("w2", limit=3) if lease.task_id == "d"]
            await client.release(lease_d)
            assert [task.task_id for task in await client.tasks("dead")] == ["d"]
            assert await client.revive(["d"]) == ["d"]
            assert await client.revive([]) == []
            assert [task.task_id for task in await client.tasks()] == ["a", "b", "c", "d"]
            stats = await client.stats()
            assert (stats.completed, stats.dead) == (1, 0)
            seq = await client.compact()
            assert seq == stats.last_seq and (await client.stats()).snapshot_seq == seq
            assert await client.put("e", {}, delay=5) == "e"
            assert (await client.get("e")).available_at >= int(time.time()) + 4
        assert client.closed
        with pytest.raises(QueueClosed):
            await client.stats()

    run(scenario())


def test_errors_are_the_library_exceptions_and_keep_the_connection(daemon):
    async def scenario():
        async with Client(daemon.socket_path) as client:
            await client.put("a", {"n": 1}, key="k")
            with pytest.raises(KeyConflict):
                await client.put("other", {"n": 2}, key="k")
            with pytest.raises(InvalidRequest):
                await client.put(7, {})  # caught before sending
            with pytest.raises(InvalidRequest):
                await client.put("e", {"bad": float("nan")})  # judged by the daemon
            with pytest.raises(InvalidRequest):
                await client.reserve("w", lease_seconds=0)
            with pytest.raises(InvalidRequest):
                await client.revive(["a"])
            with pytest.raises(InvalidRequest):
                await client.tasks("bogus")
            connection = client._connection
            (lease,) = await client.reserve("w")
            await client.ack(lease)
            # The second ack shows the completed task under the lease's own generation.
            with pytest.raises(StaleLease) as stale:
                await client.ack(lease)
            assert (stale.value.task_id, stale.value.status, stale.value.generation) == ("a", "completed", 1)
            with pytest.raises(StaleLease) as unknown:
                await client.touch(dataclasses.replace(lease, task_id="nope"), lease_seconds=5)
            assert (unknown.value.status, unknown.value.generation) == (None, None)
            assert client._connection is connection  # no error cost the connection

    run(scenario())


def test_an_unreachable_daemon_raises_daemon_unavailable(workdir):
    async def scenario():
        client = Client(workdir / "absent.sock", retry_seconds=0.3)
        with pytest.raises(DaemonUnavailable):
            await client.stats()
        with pytest.raises(DaemonUnavailable):
            await client.put("a", {})  # retried for retry_seconds, then given up
        with pytest.raises(ConnectionError):  # DaemonUnavailable is also a ConnectionError
            await client.reserve("w")
        await client.close()

    run(scenario())


def test_the_client_reconnects_after_a_daemon_restart(make_daemon):
    daemon = make_daemon()

    async def scenario():
        client = Client(daemon.socket_path, retry_seconds=0)  # reads are retried otherwise (walqueue.retry)
        await client.put("a", {})
        assert daemon.terminate() == 0
        with pytest.raises(DaemonUnavailable):
            await client.stats()
        second = make_daemon()
        assert (await client.stats()).ready == 1
        # Closed by the daemon while idle: noticed before sending, so a
        # reserve (never retried) just works after another clean restart.
        assert second.terminate() == 0
        make_daemon()
        assert [lease.task_id for lease in await client.reserve("w")] == ["a"]
        await client.close()

    run(scenario())


def test_a_put_is_retried_across_a_reconnect_but_a_reserve_never_is(make_daemon):
    daemon = make_daemon()

    async def scenario():
        client = Client(daemon.socket_path, retry_seconds=20)
        await client.put("a", {})
        parked = asyncio.create_task(client.reserve("w", wait=30, lease_seconds=60))
        waiting = asyncio.create_task(client.reserve("w", wait=30, lease_seconds=60))
        await asyncio.sleep(0)
        leased = await asyncio.wait_for(parked, 5)  # "a" is due: the first one returns at once
        assert [lease.task_id for lease in leased] == ["a"]
        await asyncio.wait_for(wait_parked(daemon), 5)
        daemon.kill()
        # The parked reserve fails at once rather than being retried for 20 s.
        with pytest.raises(DaemonUnavailable):
            await asyncio.wait_for(waiting, 5)
        restarted = make_daemon(start=False)
        restarted.start(wait_ready=False)
        # The put's first attempt fails (nothing listens yet, or the
        # connection is dead); the client retries until the new daemon answers.
        assert await asyncio.wait_for(client.put("b", {}), 15) == "b"
        restarted.wait_for_notification("READY=1", 10)
        assert {task.task_id for task in await client.tasks()} == {"a", "b"}
        await client.close()

    run(scenario(), 20)


async def wait_parked(daemon) -> None:
    """Until the daemon's log shows a parked reserve (polling a file: no event to await)."""
    while "parked reserve" not in daemon.log():
        await asyncio.sleep(0.02)


def test_a_blocking_reserve_is_woken_by_a_put_from_another_coroutine(daemon):
    async def scenario():
        async with Client(daemon.socket_path) as client:
            started = time.monotonic()
            reserve = asyncio.create_task(client.reserve("w", wait=10))
            await asyncio.wait_for(wait_parked(daemon), 5)  # the put must be what wakes it
            assert not reserve.done()
            # Same client, same connection: the parked reserve holds nothing up.
            assert await client.put("wake", {"x": 1}) == "wake"
            (lease,) = await asyncio.wait_for(reserve, 5)
            assert lease.task_id == "wake" and time.monotonic() - started < 5
            # A reserve whose wait runs out returns no leases.
            assert await client.reserve("w", wait=0.2) == []

    run(scenario())


def test_many_coroutines_pipeline_on_one_connection(daemon):
    async def scenario():
        async with Client(daemon.socket_path) as client:
            await client.stats()
            connection = client._connection
            ids = [f"t{index:03d}" for index in range(300)]
            answers = await asyncio.gather(*(client.put(task_id, {"i": index}) for index, task_id in enumerate(ids)))
            assert answers == ids
            views = await asyncio.gather(*(client.get(task_id) for task_id in ids[::-1]))
            assert [view.payload["i"] for view in views] == list(range(299, -1, -1))
            leases = await asyncio.gather(*(client.reserve(f"w{n}", limit=10) for n in range(30)))
            assert sorted(lease.task_id for batch in leases for lease in batch) == ids
            assert client._connection is connection  # one connection throughout
            # A cancelled call leaves the connection usable; its answer is dropped.
            with pytest.raises(TimeoutError):
                await asyncio.wait_for(client.reserve("late", wait=5), 0.2)
            assert (await client.stats()).leased == 300
            assert client._connection is connection

    run(scenario())


def test_the_async_worker_acks_releases_and_keeps_long_leases(daemon):
    async def scenario():
        async with Client(daemon.socket_path) as client:
            await client.put("ok", {})
            await client.put("bad", {"fail": True}, max_attempts=2)
            await client.put("slow", {"sleep": 3.5})
            seen = {}

            async def handler(lease):
                seen[lease.task_id] = lease
                if lease.payload.get("fail"):
                    raise RuntimeError("handler failed")
                if "sleep" in lease.payload:
                    await asyncio.sleep(lease.payload["sleep"])
                    # Still ours past the 3 s lease: touched in the background.
                    view = await client.get(lease.task_id)
                    assert (view.status, view.generation) == ("leased", lease.generation)
                    assert view.deadline > lease.deadline

            worker = Worker(client, "helper", handler, lease_seconds=3, wait=1)
            assert await worker.run(max_tasks=3) == 3
            assert (worker.processed, worker.failed) == (2, 1)
            assert (await client.get("ok")).status == "completed"
            slow = await client.get("slow")
            assert (slow.status, slow.generation) == ("completed", 1)
            bad = await client.get("bad")
            # Released with the first backoff (1 s), not dead yet.
            assert (bad.status, bad.attempts) == ("ready", 1)
            assert bad.available_at >= seen["bad"].deadline - 3 + 1
            # stop() ends run() after the current wait.
            stopper = Worker(daemon.socket_path, "idle", handler, wait=0.2)
            stopper.stop()
            assert await stopper.run() == 0
            await stopper.client.close()

    run(scenario())


def test_connections_past_the_bound_are_refused_with_daemon_unavailable(make_daemon):
    daemon = make_daemon("--max-connections", "1")

    async def scenario():
        # No retries for the refused one: a read is retried otherwise (walqueue.retry).
        async with Client(daemon.socket_path) as first, Client(daemon.socket_path, retry_seconds=0) as refused:
            await first.stats()
            with pytest.raises(DaemonUnavailable, match="too many connections"):
                await refused.stats()
            assert await first.put("a", {}) == "a"

    run(scenario())


def test_a_call_that_times_out_drops_the_connection_for_every_waiting_call(daemon):
    async def scenario():
        # No retries: the reads would be sent again (walqueue.retry) for retry_seconds.
        async with Client(daemon.socket_path, timeout=0.5, retry_seconds=0) as client:
            await client.stats()
            first = client._connection
            with daemon.paused():  # the daemon stops answering
                outcomes = await asyncio.gather(client.stats(), client.get("x"), client.reserve("w", wait=0.1),
                                                return_exceptions=True)
            assert all(isinstance(outcome, DaemonUnavailable) for outcome in outcomes), outcomes
            assert first.broken
            # The next call reconnects.
            assert (await client.stats()).ready == 0
            assert client._connection is not first

    run(scenario())


def test_neither_client_shell_has_protocol_code_of_its_own():
    # They build no request message, encode nothing and retry nothing themselves:
    # walqueue.client.calls and walqueue.retry do that for both.
    import inspect

    import walqueue.client.aio
    import walqueue.client.blocking

    request_types = [cls.__name__ for cls in p.Request.__args__ if cls is not p.Hello]
    for shell in (walqueue.client.aio, walqueue.client.blocking):
        source = inspect.getsource(shell)
        assert not [name for name in request_types if f"{name}(" in source], shell.__name__
        assert "p.encode(" not in source and "msgspec" not in source and "RETRY_BACKOFF" not in source
        assert "def put(" not in source and "def reserve(" not in source  # the methods are walqueue.client.api's


def test_socket_paths_longer_than_sun_path_and_oversized_requests(make_daemon, workdir):
    deep = workdir / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    path = str(deep / "walqueued.sock")
    assert len(path) > 108
    make_daemon(socket_path=path)

    async def scenario():
        async with Client(path) as client:
            assert await client.put("a", {}) == "a"
            connection = client._connection
            # Too large for one frame: refused before anything is sent.
            with pytest.raises(InvalidRequest, match="cannot send put"):
                await client.put("huge", {"blob": "x" * (p.MAX_BODY_BYTES + 1)})
            assert await client.get("huge") is None
            assert client._connection is connection

    run(scenario())
