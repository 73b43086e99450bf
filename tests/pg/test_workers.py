"""walqueue.worker.Worker and walqueue.aio.Worker run unchanged on a PostgreSQL client (SPEC §9).

What it proves: handed a walqueue.pg.Client (or AsyncClient), each Worker
leases, runs the handler, acks through ack_and_reserve, releases a failing
task until it is dead, and returns after max_tasks.
"""

from __future__ import annotations

import asyncio

from tests.postgres import unique_name
from walqueue import PutRequest
from walqueue.pg import AsyncClient


def test_the_thread_worker_runs_on_a_postgres_client(make_client):
    from walqueue.worker import Worker

    client = make_client()
    client.put_many([PutRequest(f"t{n}", {"n": n}) for n in range(5)])
    client.put("bad", {"fail": True}, max_attempts=1)
    seen = []

    def handler(lease):
        if lease.payload.get("fail"):
            raise RuntimeError("this task always fails")
        seen.append(lease.task_id)

    worker = Worker(client, "w1", handler, lease_seconds=30, wait=1)
    assert worker.run(max_tasks=6) == 6
    assert sorted(seen) == [f"t{n}" for n in range(5)]
    stats = client.stats()
    assert (stats.completed, stats.dead) == (5, 1)


def test_the_asyncio_worker_runs_on_a_postgres_async_client(postgres):
    from walqueue.aio import Worker

    async def main():
        async with AsyncClient(postgres.dsn, queue=unique_name("aio-worker")) as client:
            await client.put_many([PutRequest(f"t{n}", {}) for n in range(3)])
            seen = []

            async def handler(lease):
                seen.append(lease.task_id)

            assert await Worker(client, "w1", handler, wait=1).run(max_tasks=3) == 3
            assert sorted(seen) == ["t0", "t1", "t2"]
            assert (await client.stats()).completed == 3

    asyncio.run(main())
