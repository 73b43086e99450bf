"""walqueue.pg.AsyncClient: the Client's calls as coroutines, on one event loop.

What it proves: put, put_many, reserve, ack_and_reserve, touch, release,
revive, get, tasks and stats answer as the sync client does (same values,
same StaleLease and KeyConflict); concurrent coroutines share the client;
a waiting reserve is woken by a put from another coroutine; close is
idempotent and later calls raise QueueClosed.
"""

from __future__ import annotations

import asyncio

import pytest

from tests.postgres import unique_name
from walqueue import KeyConflict, PutRequest, QueueClosed, StaleLease
from walqueue.pg import AsyncClient


def test_the_async_client_answers_like_the_sync_one(postgres):
    async def main():
        async with AsyncClient(postgres.dsn, queue=unique_name("aio")) as client:
            assert await client.put("a", {"n": 1}, max_attempts=1) == "a"
            assert await client.put_many([PutRequest("b", {}), PutRequest("a", {"n": 1}, max_attempts=1)]) == ["b", "a"]
            with pytest.raises(KeyConflict):
                await client.put("a", {"n": 2})
            first, second = await client.reserve("w", limit=2, lease_seconds=30)
            touched = await client.touch(first, lease_seconds=90)
            assert touched.deadline > first.deadline
            await client.release(first)
            assert (await client.get("a")).status == "dead"
            assert await client.revive(["a"]) == ["a"]
            assert [lease.task_id for lease in await client.ack_and_reserve(second)] == ["a"]
            with pytest.raises(StaleLease) as stale:
                await client.ack(second)
            assert (stale.value.status, stale.value.generation) == ("completed", 1)
            stats = await client.stats()
            assert (stats.ready, stats.leased, stats.completed, stats.dead) == (0, 1, 1, 0)
            assert [view.task_id for view in await client.tasks("completed")] == ["b"]

    asyncio.run(main())


def test_concurrent_coroutines_share_it_and_a_put_wakes_a_waiting_reserve(postgres):
    async def main():
        client = AsyncClient(postgres.dsn, queue=unique_name("aio"))
        try:
            waiting = asyncio.create_task(client.reserve("w", wait=20))
            await asyncio.sleep(0.3)
            await asyncio.gather(*(client.put(f"t{n}", {}) for n in range(5)))
            leases = await asyncio.wait_for(waiting, 25)
            assert len(leases) == 1
            assert (await client.stats()).ready == 4
        finally:
            await client.close()
            await client.close()
        with pytest.raises(QueueClosed):
            await client.stats()

    asyncio.run(main())
