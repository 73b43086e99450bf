"""``ack_and_reserve``: one request, one fsync, for a worker's ack and its next reservation."""

import asyncio
import threading

import pytest

from walqueue import InvalidRequest, StaleLease, aio
from walqueue.client import Client


def socket_of(daemon):
    return daemon.directory.parent / "wq.sock"


def test_it_acks_and_leases_the_next_task_to_the_same_worker(daemon):
    with Client(socket_of(daemon)) as client:
        client.put_many([{"task_id": "a", "payload": {}}, {"task_id": "b", "payload": {"n": 2}}])
        (first,) = client.reserve("w", lease_seconds=60)
        (second,) = client.ack_and_reserve(first, lease_seconds=90)
        assert (second.task_id, second.worker, second.payload) == ("b", "w", {"n": 2})
        assert client.get("a").status == "completed"
        task_b = client.get("b")
        assert (task_b.status, task_b.worker, task_b.generation) == ("leased", "w", 1)
        # Nothing left: the ack still happens and the answer is an empty list.
        assert client.ack_and_reserve(second) == []
        assert client.get("b").status == "completed"


def test_a_stale_ack_reserves_nothing(daemon):
    with Client(socket_of(daemon)) as client:
        client.put_many([{"task_id": "a", "payload": {}}, {"task_id": "b", "payload": {}}])
        (lease,) = client.reserve("w", lease_seconds=60)
        client.ack(lease)
        with pytest.raises(StaleLease) as stale:
            client.ack_and_reserve(lease)
        assert (stale.value.task_id, stale.value.status, stale.value.generation) == ("a", "completed", 1)
        assert client.get("b").status == "ready"


@pytest.mark.parametrize("arguments", [{"lease_seconds": 0}, {"limit": 0}, {"wait": -1},
                                       {"lease_seconds": 2**63 - 1}])
def test_a_rejected_reserve_half_leaves_the_lease_unacked(daemon, arguments):
    with Client(socket_of(daemon)) as client:
        client.put("a", {})
        (lease,) = client.reserve("w", lease_seconds=60)
        with pytest.raises(InvalidRequest):
            client.ack_and_reserve(lease, **arguments)
        assert client.get("a").status == "leased"
        client.ack(lease)


def test_the_reserve_half_waits_and_is_woken_by_a_put(daemon):
    with Client(socket_of(daemon)) as worker, Client(socket_of(daemon)) as producer:
        producer.put("a", {})
        (lease,) = worker.reserve("w", lease_seconds=60)
        got: list = []
        waiter = threading.Thread(target=lambda: got.extend(worker.ack_and_reserve(lease, wait=10)), daemon=True)
        waiter.start()
        # The put once the reserve half waits (the daemon's log: no event to await), not after a
        # 0.3 s pause, which a busy machine could outlast: the put would then come first and the
        # reserve half take "b" at once, waking from nothing.
        daemon.wait_for_log("parked reserve")
        producer.put("b", {})
        waiter.join(20)
        assert [nxt.task_id for nxt in got] == ["b"]
        assert producer.get("a").status == "completed"


def test_the_asyncio_client_has_it_too(daemon):
    async def main():
        async with aio.Client(socket_of(daemon)) as client:
            await client.put("a", {})
            await client.put("b", {})
            (lease,) = await client.reserve("w")
            (nxt,) = await client.ack_and_reserve(lease)
            return nxt.task_id, (await client.get("a")).status

    assert asyncio.run(main()) == ("b", "completed")


def test_while_paused_the_ack_happens_and_the_reserve_half_gets_nothing(daemon):
    with Client(socket_of(daemon)) as client:
        client.put_many([{"task_id": "a", "payload": {}}, {"task_id": "b", "payload": {}}])
        (lease,) = client.reserve("w", lease_seconds=60)
        client.pause()
        try:
            assert client.ack_and_reserve(lease) == []
            assert client.get("a").status == "completed"
            assert client.get("b").status == "ready"
        finally:
            client.resume()
        assert [nxt.task_id for nxt in client.reserve("w")] == ["b"]
