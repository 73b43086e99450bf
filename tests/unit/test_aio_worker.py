"""walqueue.aio.Worker's decisions, against a scripted client (no daemon needed)."""

import asyncio

import walqueue.aio as aio
from walqueue import Lease, StaleLease
from walqueue.aio import Client, DaemonUnavailable, Worker


class ScriptedClient(Client):
    """An async Client whose calls replay a script instead of talking to a daemon."""

    def __init__(self, leases, ack_outcomes=(), release_outcomes=()):
        super().__init__("/nonexistent/walqueued.sock")
        self.leases = list(leases)
        self.ack_outcomes = list(ack_outcomes)
        self.release_outcomes = list(release_outcomes)
        self.calls = []

    async def reserve(self, worker, *, lease_seconds=30, limit=1, wait=0):
        return [self.leases.pop(0)] if self.leases else []

    def _outcome(self, outcomes, name, *args):
        self.calls.append((name, *args))
        if outcomes:
            outcome = outcomes.pop(0)
            if outcome is not None:
                raise outcome

    async def ack(self, lease):
        self._outcome(self.ack_outcomes, "ack", lease.task_id)

    async def ack_and_reserve(self, lease, *, lease_seconds=30, limit=1, wait=0):
        self._outcome(self.ack_outcomes, "ack_and_reserve", lease.task_id)
        return await self.reserve(lease.worker, lease_seconds=lease_seconds, limit=limit, wait=wait)

    async def release(self, lease, *, delay=0):
        self._outcome(self.release_outcomes, "release", lease.task_id, delay)


def lease(task_id, attempts=1, generation=1):
    return Lease(task_id, "w", generation, 100, attempts, {})


def run(coroutine):
    return asyncio.run(asyncio.wait_for(coroutine, 10))


def test_a_successful_handler_is_acked_and_a_failing_one_released_with_backoff():
    client = ScriptedClient([lease("ok"), lease("bad", attempts=3)])

    async def handler(current):
        if current.task_id == "bad":
            raise RuntimeError("boom")

    worker = Worker(client, "w", handler, touch=False, wait=0)
    assert run(worker.run(max_tasks=2)) == 2
    # The ack of "ok" reserves "bad" in the same request; "bad" is released.
    assert client.calls == [("ack_and_reserve", "ok"), ("release", "bad", 4)]
    assert (worker.processed, worker.failed) == (1, 1)


def test_an_ack_whose_answer_was_lost_counts_as_done_when_the_retry_finds_it_completed(monkeypatch):
    monkeypatch.setattr(aio, "RECONNECT_PAUSE_SECONDS", 0)  # no daemon to wait for
    completed = StaleLease("gone", task_id="t", status="completed", generation=1)
    client = ScriptedClient([lease("t")], ack_outcomes=[DaemonUnavailable("lost"), completed])
    worker = Worker(client, "w", lambda current: None, touch=False, wait=0)
    assert run(worker.run(max_tasks=1)) == 1
    assert client.calls == [("ack", "t"), ("ack", "t")]
    assert worker.processed == 1


def test_a_stale_lease_on_the_first_ack_is_not_taken_for_success():
    lost = StaleLease("lost", task_id="t", status="leased", generation=2)
    client = ScriptedClient([lease("t")], ack_outcomes=[lost])
    worker = Worker(client, "w", lambda current: None, touch=False, wait=0)
    assert run(worker.run(max_tasks=1)) == 1
    assert client.calls == [("ack", "t")]  # not retried


def test_the_last_task_is_acked_alone_and_the_others_reserve_their_successor():
    client = ScriptedClient([lease("a"), lease("b"), lease("c")])
    worker = Worker(client, "w", lambda current: None, touch=False, wait=0)
    assert run(worker.run(max_tasks=3)) == 3
    assert client.calls == [("ack_and_reserve", "a"), ("ack_and_reserve", "b"), ("ack", "c")]


def test_a_lost_ack_and_reserve_is_retried_as_a_plain_ack_that_counts_its_own_completion(monkeypatch):
    monkeypatch.setattr(aio, "RECONNECT_PAUSE_SECONDS", 0)
    completed = StaleLease("gone", task_id="a", status="completed", generation=1)
    client = ScriptedClient([lease("a"), lease("b")], ack_outcomes=[DaemonUnavailable("lost"), completed])
    worker = Worker(client, "w", lambda current: None, touch=False, wait=0)
    assert run(worker.run(max_tasks=2)) == 2
    assert client.calls == [("ack_and_reserve", "a"), ("ack", "a"), ("ack", "b")]
