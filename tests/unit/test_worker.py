"""walqueue.worker's decisions, against a scripted client (no daemon needed)."""

import time

from walqueue import Lease, StaleLease
from walqueue.client import Client, DaemonUnavailable
from walqueue.worker import Worker, exponential_backoff


class ScriptedClient(Client):
    """A Client whose calls replay a script instead of talking to a daemon."""

    def __init__(self, leases, ack_outcomes=(), release_outcomes=()):
        super().__init__("/nonexistent/walqueued.sock")
        self.leases = list(leases)
        self.ack_outcomes = list(ack_outcomes)
        self.release_outcomes = list(release_outcomes)
        self.calls = []

    def reserve(self, worker, *, lease_seconds=30, limit=1, wait=0):
        return [self.leases.pop(0)] if self.leases else []

    def _outcome(self, outcomes, name, *args):
        self.calls.append((name, *args))
        if outcomes:
            outcome = outcomes.pop(0)
            if outcome is not None:
                raise outcome

    def ack(self, lease):
        self._outcome(self.ack_outcomes, "ack", lease.task_id)

    def ack_and_reserve(self, lease, *, lease_seconds=30, limit=1, wait=0):
        self._outcome(self.ack_outcomes, "ack_and_reserve", lease.task_id)
        return self.reserve(lease.worker, lease_seconds=lease_seconds, limit=limit, wait=wait)

    def release(self, lease, *, delay=0):
        self._outcome(self.release_outcomes, "release", lease.task_id, delay)

    def touch(self, lease, *, lease_seconds):
        self.calls.append(("touch", lease.task_id))
        return lease


def lease(task_id, attempts=1, generation=1):
    return Lease(task_id, "w", generation, 100, attempts, {})


def test_backoff_doubles_from_one_second_and_is_capped():
    assert [exponential_backoff(n) for n in (1, 2, 3, 4)] == [1, 2, 4, 8]
    assert exponential_backoff(50) == 300


def test_a_successful_handler_is_acked_and_a_failing_one_released_with_backoff():
    client = ScriptedClient([lease("ok"), lease("bad", attempts=3)])

    def handler(current):
        if current.task_id == "bad":
            raise RuntimeError("boom")

    worker = Worker(client, "w", handler, touch=False, wait=0)
    assert worker.run(max_tasks=2) == 2
    # The ack of "ok" reserves "bad" in the same request; "bad" is released.
    assert client.calls == [("ack_and_reserve", "ok"), ("release", "bad", 4)]
    assert (worker.processed, worker.failed) == (1, 1)


def test_an_ack_whose_answer_was_lost_counts_as_done_when_the_retry_finds_it_completed(monkeypatch):
    import walqueue.worker as worker_module

    monkeypatch.setattr(worker_module, "RECONNECT_PAUSE_SECONDS", 0)  # no daemon to wait for
    completed = StaleLease("gone", task_id="t", status="completed", generation=1)
    client = ScriptedClient([lease("t")], ack_outcomes=[DaemonUnavailable("lost"), completed])
    worker = Worker(client, "w", lambda current: None, touch=False, wait=0)
    assert worker.run(max_tasks=1) == 1
    assert client.calls == [("ack", "t"), ("ack", "t")]
    assert worker.processed == 1


def test_the_last_task_is_acked_alone_and_the_others_reserve_their_successor():
    client = ScriptedClient([lease("a"), lease("b"), lease("c")])
    worker = Worker(client, "w", lambda current: None, touch=False, wait=0)
    assert worker.run(max_tasks=3) == 3
    assert client.calls == [("ack_and_reserve", "a"), ("ack_and_reserve", "b"), ("ack", "c")]


def test_a_lost_ack_and_reserve_is_retried_as_a_plain_ack_that_counts_its_own_completion(monkeypatch):
    import walqueue.worker as worker_module

    monkeypatch.setattr(worker_module, "RECONNECT_PAUSE_SECONDS", 0)
    completed = StaleLease("gone", task_id="a", status="completed", generation=1)
    client = ScriptedClient([lease("a"), lease("b")], ack_outcomes=[DaemonUnavailable("lost"), completed])
    worker = Worker(client, "w", lambda current: None, touch=False, wait=0)
    assert worker.run(max_tasks=2) == 2
    # The retry is a retry: the StaleLease of the same generation means the first
    # attempt took effect, so no warning path and no third try. "b" is then reserved.
    assert client.calls == [("ack_and_reserve", "a"), ("ack", "a"), ("ack", "b")]


def test_a_stale_ack_and_reserve_reserves_nothing_and_the_worker_reserves_again():
    lost = StaleLease("lost it", task_id="a", status="leased", generation=2)
    client = ScriptedClient([lease("a"), lease("b")], ack_outcomes=[lost])
    worker = Worker(client, "w", lambda current: None, touch=False, wait=0)
    assert worker.run(max_tasks=2) == 2
    assert client.calls == [("ack_and_reserve", "a"), ("ack", "b")]


def test_one_toucher_thread_touches_a_long_handler_lease_and_stops_before_the_ack():
    import threading


    started = threading.active_count()
    client = ScriptedClient([lease("slow"), lease("fast")])
    seen = []

    def handler(current):
        if current.task_id == "slow":
            # interval = max(1, lease_seconds / 3) = 1 s: wait for one touch.
            deadline = time.monotonic() + 5
            while ("touch", "slow") not in client.calls and time.monotonic() < deadline:
                time.sleep(0.01)
        seen.append(threading.active_count())

    worker = Worker(client, "w", handler, lease_seconds=3, wait=0)
    assert worker.run(max_tasks=2) == 2
    assert ("touch", "slow") in client.calls
    assert ("touch", "fast") not in client.calls
    # Nothing touches after the ack that ended the lease.
    assert client.calls.index(("touch", "slow")) < client.calls.index(("ack_and_reserve", "slow"))
    assert seen == [started + 1, started + 1]  # one thread for both tasks
    assert threading.active_count() == started  # and it is gone after run()
