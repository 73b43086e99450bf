"""Blocking reserve on PostgreSQL: LISTEN/NOTIFY wake-ups, timers, no herd, no lost wake-up, the reaper.

What it proves, with the safety poll pushed out of reach (so only a
notification or a timer can wake a waiter, and a lost wake-up shows as a
reserve that returns empty):
- a put, a release and a revive wake a waiting reserve, through a
  notification sent by the writing transaction;
- a put of k tasks wakes k of n waiters in the process, not all of them;
- racing a put against a reserve that is just starting to wait never loses
  the wake-up (many rounds);
- a task put with a delay, and a lease that expires, are leased at their
  time by the head waiter's timer;
- without LISTEN (listen=False, as behind a transaction-mode pooler) waiters
  poll and still get the task;
- expired leases are reaped by a client's reaper although nobody reserves.
"""

from __future__ import annotations

import threading
import time

import pytest

from walqueue import PutRequest
from walqueue.pg import wakeup

WAIT_SECONDS = 20


@pytest.fixture
def no_safety_poll(monkeypatch):
    monkeypatch.setattr(wakeup, "SAFETY_POLL_SECONDS", 300.0)


class Reserver(threading.Thread):
    """A thread blocked in reserve(wait=...) on its own client; `.leases` once done."""

    def __init__(self, client, worker: str, wait: float = WAIT_SECONDS, **options) -> None:
        super().__init__(daemon=True)
        self.client, self.worker, self.wait, self.options = client, worker, wait, options
        self.leases = None
        self.error = None

    def run(self) -> None:
        try:
            self.leases = self.client.reserve(self.worker, wait=self.wait, **self.options)
        except Exception as error:  # noqa: BLE001 - reported by the test
            self.error = error


def waiting(service: wakeup.Service, queue: str, count: int) -> None:
    """Until `count` waiters of `queue` are registered and idle (bounded)."""
    deadline = time.monotonic() + 10
    while True:
        with service._lock:
            state = service._queues.get(queue)
            idle = 0 if state is None else sum(not w.woken for w in state.waiters)
            registered = state is not None and state.registered
        if idle >= count and registered:
            return
        assert time.monotonic() < deadline, f"{idle} of {count} waiters idle, registered={registered}"
        time.sleep(0.01)


def test_a_put_wakes_a_waiting_reserve_by_notification(make_client, no_safety_poll):
    consumer = make_client()
    producer = make_client(queue=consumer.queue)
    reserver = Reserver(consumer, "w")
    reserver.start()
    service = consumer._service_for_waits()
    waiting(service, consumer.queue, 1)
    woken = service.woken
    producer.put("t", {})
    reserver.join(WAIT_SECONDS + 5)
    assert [lease.task_id for lease in reserver.leases] == ["t"]
    assert service.woken == woken + 1


def test_a_put_of_k_tasks_wakes_k_waiters_not_all(make_client, no_safety_poll):
    producer = make_client()
    consumers = [make_client(queue=producer.queue, reaper=False) for _ in range(6)]
    reservers = [Reserver(client, f"w{n}") for n, client in enumerate(consumers)]
    for reserver in reservers:
        reserver.start()
    service = consumers[0]._service_for_waits()
    waiting(service, producer.queue, 6)
    woken = service.woken
    producer.put_many([PutRequest("a", {}), PutRequest("b", {})])
    deadline = time.monotonic() + 10
    while sum(r.leases is not None for r in reservers) < 2:
        assert time.monotonic() < deadline
        time.sleep(0.01)
    assert service.woken - woken == 2
    waiting(service, producer.queue, 4)  # the other four still wait
    producer.put_many([PutRequest(f"c{n}", {}) for n in range(4)])
    for reserver in reservers:
        reserver.join(WAIT_SECONDS + 5)
    assert sorted(lease.task_id for r in reservers for lease in r.leases) == \
        ["a", "b", "c0", "c1", "c2", "c3"]


def test_a_release_and_a_revive_wake_waiters(make_client, no_safety_poll):
    client = make_client()
    client.put("t", {}, max_attempts=1)
    (lease,) = client.reserve("w", lease_seconds=60)
    other = make_client(queue=client.queue)
    reserver = Reserver(other, "w2")
    reserver.start()
    service = other._service_for_waits()
    waiting(service, client.queue, 1)
    woken = service.woken
    client.release(lease)  # max_attempts=1: dead, nothing due: no waiter is woken
    client.revive(["t"])
    reserver.join(WAIT_SECONDS + 5)
    assert [lease.task_id for lease in reserver.leases] == ["t"]
    # One wake-up, the revive's. Notifications arrive in commit order, so one the release had
    # sent would have come first and counted too (a waiter woken for nothing finds nothing and
    # waits on: a pause and a look whether it still waits could not tell).
    assert service.woken == woken + 1


def test_a_put_racing_a_reserve_that_starts_waiting_is_never_missed(make_client, no_safety_poll):
    consumer = make_client()
    producer = make_client(queue=consumer.queue)
    for round_number in range(25):
        reserver = Reserver(consumer, "w", wait=10)
        reserver.start()
        # No waiting here: the put lands anywhere in the reserve's start-up.
        producer.put(f"t{round_number}", {})
        reserver.join(15)
        assert reserver.leases, f"round {round_number}: the wake-up was lost"
        consumer.ack(reserver.leases[0])


def test_a_delayed_task_is_leased_at_its_time_by_the_timer(make_client, no_safety_poll):
    client = make_client()
    client.put("later", {}, delay=2)
    due = client.get("later").available_at
    (lease,) = client.reserve("w", wait=WAIT_SECONDS, lease_seconds=30)
    # Read off the server's clock (a lease's deadline is its grant second + 30), not the test's,
    # whose seconds also hold the commits and however long the test waited for the CPU.
    granted = lease.deadline - 30
    assert lease.task_id == "later" and granted >= due  # not before it was due
    # Leased by the timer at the due second, not by the last try at the end of the wait, 20 s
    # after a reserve that began no earlier than the put: at least at second due - 2 + 20.
    assert granted < due - 2 + WAIT_SECONDS


def test_an_expired_lease_is_leased_again_by_the_timer(make_client, no_safety_poll):
    client = make_client(reaper=False)
    client.put("t", {})
    (first,) = client.reserve("w1", lease_seconds=1)
    (second,) = client.reserve("w2", wait=WAIT_SECONDS)
    assert (second.task_id, second.generation) == ("t", 2)


def test_without_listen_waiters_poll_and_still_get_the_task(make_client):
    consumer = make_client(listen=False)
    producer = make_client(queue=consumer.queue)
    reserver = Reserver(consumer, "w")
    reserver.start()
    time.sleep(0.3)
    producer.put("t", {})
    reserver.join(WAIT_SECONDS + 5)
    assert [lease.task_id for lease in reserver.leases] == ["t"]
    assert consumer._service_for_waits().polling


def test_expired_leases_are_reaped_although_nobody_reserves(make_client):
    client = make_client()  # its reaper runs in this process
    client.put("t", {}, max_attempts=1)
    client.reserve("w", lease_seconds=1)
    deadline = time.monotonic() + 10
    while client.get("t").status != "dead":
        assert time.monotonic() < deadline, "the expired lease was not reaped"
        time.sleep(0.1)
