"""walqueue.ids.time_ordered_id: ids that sort by creation time as Python strs (FIFO order)."""

import threading
import uuid

import pytest

import walqueue.ids as ids
from walqueue import InvalidRequest, Queue
from walqueue.ids import time_ordered_id


def test_ids_are_uuid7_strings_that_sort_in_creation_order():
    made = [time_ordered_id() for _ in range(20000)]  # many per millisecond: the counter carries
    assert made == sorted(made) and len(set(made)) == len(made)
    parsed = uuid.UUID(made[0])
    assert (parsed.version, parsed.variant, str(parsed)) == (7, uuid.RFC_4122, made[0])


def test_the_prefix_is_kept_and_a_bad_one_is_named():
    assert time_ordered_id("email-").startswith("email-")
    with pytest.raises(InvalidRequest, match="prefix must be a str, got int"):
        time_ordered_id(7)


def test_order_holds_when_the_clock_steps_back_and_when_a_millisecond_overflows(monkeypatch):
    clock = iter([5_000_000_000_000, 4_000_000_000_000] + [4_000_000_000_000] * 5000)
    monkeypatch.setattr(ids.time, "time_ns", lambda: next(clock) * 1_000_000)
    made = [time_ordered_id() for _ in range(5002)]
    assert made == sorted(made) and len(set(made)) == len(made)
    # More than 4,096 ids in the stalled millisecond: the timestamp ran ahead.
    assert int(made[-1][:8] + made[-1][9:13], 16) > 5_000_000_000_000


def test_ids_from_many_threads_are_distinct():
    made, lock = [], threading.Lock()

    def make():
        batch = [time_ordered_id() for _ in range(2000)]
        assert batch == sorted(batch)
        with lock:
            made.extend(batch)

    threads = [threading.Thread(target=make) for _ in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert len(set(made)) == 8000


def test_tasks_with_time_ordered_ids_are_leased_first_in_first_out(tmp_path):
    with Queue(tmp_path / "q") as q:
        put = [q.put(time_ordered_id("job-"), {"n": n}) for n in range(12)]
        leased = q.reserve("w", now=1, lease_seconds=10, limit=12)
        assert [lease.task_id for lease in leased] == put
        # Counters would not: job-10 sorts before job-9.
        assert sorted(["job-9", "job-10"]) == ["job-10", "job-9"]
