"""walqueue.worker.aio.Worker's tasks: the toucher, concurrency, the stop deadline (which cancels
the handler); over the in-memory client, on a clock that moves only when the test says.
The policy's decisions are in test_worker_policy.py, for both Workers."""

import asyncio

import pytest

from walqueue.client import aio
from walqueue.worker.aio import Worker

from .clocks import AsyncManualClock
from .memory_client import AsyncMemoryClient, MemoryQueue
from .worker_logs import LogWaiter

TEST_SECONDS = 20


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, TEST_SECONDS))


def test_the_toucher_extends_a_long_handlers_lease_and_stops_before_the_ack():
    async def scenario():
        clock = AsyncManualClock()
        queue = MemoryQueue(clock)
        queue.put("a-slow")
        queue.put("b-fast")
        touched = asyncio.Event()

        class Client(AsyncMemoryClient):
            async def touch(self, lease, **options):
                touched.set()
                return await super().touch(lease, **options)

        async def handler(lease):
            if lease.task_id == "a-slow":
                await touched.wait()

        worker = Worker(Client(queue), "w", handler, lease_seconds=3, wait=0, clock=clock)
        running = asyncio.create_task(worker.run(max_tasks=2))
        assert await clock.advance_to_next_deadline() == pytest.approx(1001.0)
        assert await running == 2
        return [call[:2] for call in queue.calls]

    calls = run(scenario())
    assert ("touch", "a-slow") in calls and ("touch", "b-fast") not in calls
    assert calls.index(("touch", "a-slow")) < calls.index(("ack_and_reserve", "a-slow"))


def test_n_handlers_are_in_hand_at_once():
    async def scenario():
        clock = AsyncManualClock(jump=True)
        queue = MemoryQueue(clock)
        for number in range(100):
            queue.put(f"t{number:03d}")
        in_hand, most, all_in = [0], [0], asyncio.Event()

        async def handler(lease):
            in_hand[0] += 1
            most[0] = max(most[0], in_hand[0])
            if in_hand[0] == 100:
                all_in.set()
            await all_in.wait()  # never set unless a hundred run at once
            in_hand[0] -= 1

        worker = Worker(AsyncMemoryClient(queue), "w", handler, wait=0, concurrency=100, touch=False, clock=clock)
        assert await worker.run(max_tasks=100) == 100
        assert all(task["status"] == "completed" for task in queue.tasks.values())
        return most[0]

    assert run(scenario()) == 100


def test_a_task_not_done_by_the_stop_deadline_is_cancelled_and_released():
    async def scenario():
        clock = AsyncManualClock()
        queue = MemoryQueue(clock)
        queue.put("hung")
        in_hand, cancelled = asyncio.Event(), asyncio.Event()

        async def handler(lease):
            in_hand.set()
            try:
                await asyncio.Event().wait()  # never returns by itself
            except asyncio.CancelledError:
                cancelled.set()
                raise

        worker = Worker(AsyncMemoryClient(queue), "w", handler, wait=0, touch=False, stop_timeout_seconds=10,
                        clock=clock)
        with LogWaiter() as logs:
            running = asyncio.create_task(worker.run())
            await in_hand.wait()
            worker.stop()
            assert await clock.advance_to_next_deadline() == pytest.approx(1010.0)
            assert await running == 1
        assert cancelled.is_set() and queue.tasks["hung"]["status"] == "ready"
        assert "task hung generation 1: not done 10 s after stop(); released" in logs.messages

    run(scenario())


def test_a_plain_function_runs_as_the_handler_too():
    async def scenario():
        clock = AsyncManualClock(jump=True)
        queue = MemoryQueue(clock)
        queue.put("t")
        seen = []
        worker = Worker(AsyncMemoryClient(queue), "w", seen.append, wait=0, clock=clock)
        assert await worker.run(max_tasks=1) == 1
        return seen, queue.tasks["t"]["status"]

    seen, status = run(scenario())
    assert [lease.task_id for lease in seen] == ["t"] and status == "completed"


def test_a_path_means_an_asyncio_daemon_client_named_after_the_worker():
    worker = Worker("/nonexistent/walqueued.sock", "mailer-1", lambda lease: None)
    assert isinstance(worker.client, aio.Client) and worker.client.name == "mailer-1"
