"""The library's side of SPEC §8b: cancel's planning and its one batch, and the indexes that
page a listing (walqueue.cancel, walqueue.listing, TombstoneStore.after).

The semantics on every face are tests/unit/test_semantics_steer.py's; these are the library's
own claims: one fsync per cancel, records readable by any walqueue, a crash in the middle
recovered to a state a second cancel completes, and pages that are cut from the listing
exactly, also across the tombstone store's blocks and SortedIds' splits.
"""

import random

import pytest

from tests.unit.frames import wal_records
from walqueue import InjectedCrash, InvalidRequest, Queue, TaskView
from walqueue import cancel as cancelling
from walqueue.listing import BLOCK_IDS, SortedIds
from walqueue.tombstones import BLOCK_TOMBSTONES, TombstoneStore


def dead_task(queue, task_id="d", now=1):
    queue.put(task_id, {"x": 1}, max_attempts=1)
    (lease,) = queue.reserve("w", now=now, lease_seconds=10)
    queue.release(lease, now=now)


def test_a_cancel_is_one_batch_made_durable_by_one_fsync(tmp_path):
    phases = []
    with Queue(tmp_path / "q", hook=phases.append) as queue:
        dead_task(queue)
        queue.put("r", {})
        del phases[:]
        queue.cancel("d", now=3)
        assert phases == ["wal.before_write", "wal.after_write"] * 3 + ["wal.after_sync"]
        del phases[:]
        queue.cancel("r", now=3)
        assert phases == ["wal.before_write", "wal.after_write"] * 2 + ["wal.after_sync"]
        del phases[:]
        queue.cancel("r", now=4)  # completed: nothing written, nothing synced
        assert phases == []


def test_cancels_inside_a_batch_join_it(tmp_path):
    phases = []
    with Queue(tmp_path / "q", hook=phases.append) as queue:
        queue.put_many([{"task_id": "a", "payload": {}}, {"task_id": "b", "payload": {}}])
        del phases[:]
        with queue.batch():
            queue.cancel("a", now=1)
            queue.cancel("b", now=1)
        assert phases.count("wal.after_sync") == 1 and phases[-1] == "wal.after_sync"


def test_a_cancel_is_written_as_records_any_walqueue_reads_and_recovers(tmp_path):
    with Queue(tmp_path / "q") as queue:
        dead_task(queue)
        queue.cancel("d", now=5)
        expected = queue.get("d")
    ops = [(record["op"], record.get("worker")) for record in wal_records(tmp_path / "q")]
    assert ops[-3:] == [("revive", None), ("reserve", cancelling.CANCEL_WORKER),
                        ("ack", cancelling.CANCEL_WORKER)]
    with Queue(tmp_path / "q") as queue:
        assert queue.get("d") == expected == TaskView("d", "d", "completed", 1, 1, 2, 5, None, None, None)


def test_a_crash_between_a_cancels_frames_leaves_a_task_a_second_cancel_completes(tmp_path):
    # The reading docs/spec.md gives: not atomic across a crash (three records), so the caller,
    # who got no answer, cancels again; the task is then ready (revived) and due.
    calls = []

    def die_after_the_revive_frame(phase):
        calls.append(phase)
        if phase == "wal.after_write" and len(calls) > 4:
            raise InjectedCrash("after the revive frame")

    with Queue(tmp_path / "q") as queue:
        dead_task(queue)
    queue = Queue(tmp_path / "q", hook=die_after_the_revive_frame)
    calls.clear()
    queue.put("filler", {})  # two hook calls of its own
    with pytest.raises(InjectedCrash):
        queue.cancel("d", now=5)
    with Queue(tmp_path / "q") as queue:
        assert queue.get("d").status == "ready"
        queue.cancel("d", now=6)
        assert queue.get("d").status == "completed"


def test_a_reserve_by_a_reserved_name_is_refused_but_its_records_replay(tmp_path):
    with Queue(tmp_path / "q") as queue:
        queue.put("t", {})
        with pytest.raises(InvalidRequest, match="reserved"):
            queue.reserve("walqueue:cancel", now=1, lease_seconds=1)
        queue.cancel("t", now=1)  # writes a reserve by that name: recovery applies it
    with Queue(tmp_path / "q") as queue:
        assert queue.get("t").status == "completed"


def test_cancel_checks_now_before_writing(tmp_path):
    with Queue(tmp_path / "q") as queue:
        dead_task(queue)
        before = queue.stats().last_seq
        with pytest.raises(InvalidRequest):
            queue.cancel("d", now=2**63 - 1)  # the cancel's one-second lease would overflow
        assert queue.stats().last_seq == before and queue.get("d").status == "dead"


def test_the_refusals_say_which_case_it_is():
    ready_later = TaskView("t", "t", "ready", 0, 3, 0, 50, None, None, {})
    leased = TaskView("t", "t", "leased", 1, 3, 4, 0, 90, "w9", {})
    assert "not due until 50 (now=10)" in cancelling.refusal("t", ready_later, 10)
    assert cancelling.refusal("t", ready_later, 50) is None
    assert "leased by 'w9' (generation 4, deadline 90)" in cancelling.refusal("t", leased, 10)
    assert "unknown" in cancelling.refusal("t", None, 10)
    done = TaskView("t", "t", "completed", 1, 3, 1, 0, None, None, None)
    assert cancelling.check("t", done, 10) is False


# -- the indexes of a paged listing ---------------------------------------------------------


def test_sorted_ids_stay_sorted_through_splits_and_removals():
    rng = random.Random(24)
    ids, kept = SortedIds(), set()
    for _ in range(5 * BLOCK_IDS):
        task_id = f"t{rng.randrange(10 * BLOCK_IDS):05d}"
        if task_id in kept and rng.random() < 0.5:
            ids.discard(task_id)
            kept.discard(task_id)
        elif task_id not in kept:
            ids.add(task_id)
            kept.add(task_id)
    assert list(ids) == sorted(kept) and len(ids) == len(kept)
    for after in ("", "t03000", "t05000x", "u", sorted(kept)[-1]):
        assert list(ids.after(after)) == [task_id for task_id in sorted(kept) if task_id > after]
    ids.discard("absent")
    assert len(ids) == len(kept)


def test_tombstones_walk_from_a_cursor_across_blocks_and_splits():
    rng = random.Random(7)
    store = TombstoneStore()
    names = [f"id-{n:06d}" for n in rng.sample(range(10**6), 3 * BLOCK_TOMBSTONES)]
    for name in names:  # out of order: blocks split
        store.add(name, name, bytes(32), 1, 1, 1, 0)
    ordered = sorted(names)
    for after in (None, ordered[0], ordered[BLOCK_TOMBSTONES], "id-5", ordered[-1], "zzz"):
        walked = [name.decode() for name, _ in store.after(None if after is None else after.encode())]
        assert walked == [name for name in ordered if after is None or name > after]


def cancel_cut_after_its_reserve(directory, now, max_attempts=2):
    """A queue holding "t" leased by an interrupted cancel at `now` (a crash at the reserve
    frame's wal.after_write), reopened."""
    calls = []

    def die_after_the_reserve_frame(phase):
        calls.append(phase)
        if phase == "wal.after_write" and len(calls) == 2:
            raise InjectedCrash("after the reserve frame")

    with Queue(directory) as queue:
        queue.put("t", {}, max_attempts=max_attempts)
    queue = Queue(directory, hook=die_after_the_reserve_frame)
    with pytest.raises(InjectedCrash):
        queue.cancel("t", now=now)
    return Queue(directory)


def test_a_cancel_a_crash_cut_after_its_reserve_is_finished_by_the_next_cancel(tmp_path):
    # The task is held by the cancel's own lease, one second, so no worker can lease it meanwhile,
    # and cancelling again within it writes only the missing ack.
    with cancel_cut_after_its_reserve(tmp_path / "q", 5) as queue:
        held = queue.get("t")
        assert (held.status, held.worker, held.deadline) == ("leased", cancelling.CANCEL_WORKER, 6)
        assert queue.reserve("w", now=5, lease_seconds=10) == []
        seq = queue.stats().last_seq
        queue.cancel("t", now=5)
        assert queue.stats().last_seq == seq + 1  # the ack alone
        assert queue.get("t") == TaskView("t", "t", "completed", 1, 2, 1, 0, None, None, None)


def test_a_cancel_retried_after_the_interrupted_ones_lease_lapsed_finishes_it(tmp_path):
    # No reap has ended the lapsed lease yet (the library has no timer): the retry expires it
    # itself, then reserves and acks, in one batch.
    with cancel_cut_after_its_reserve(tmp_path / "q", 5) as queue:
        seq = queue.stats().last_seq
        queue.cancel("t", now=60)
        assert queue.stats().last_seq == seq + 3  # expire, reserve, ack
        assert queue.get("t") == TaskView("t", "t", "completed", 2, 2, 2, 6, None, None, None)


def test_a_lapsed_interrupted_cancel_at_its_last_attempt_is_revived_then_cancelled(tmp_path):
    # The cancel's reserve used the task's one attempt: the expire leaves it dead, so a revive
    # comes before the reserve and ack (the counters: as a dead task's cancel leaves them).
    with cancel_cut_after_its_reserve(tmp_path / "q", 5, max_attempts=1) as queue:
        queue.cancel("t", now=9)
        assert queue.get("t") == TaskView("t", "t", "completed", 1, 1, 2, 9, None, None, None)
    ops = [record["op"] for record in wal_records(tmp_path / "q")]
    assert ops[-4:] == ["expire", "revive", "reserve", "ack"]


def test_once_the_interrupted_cancels_lease_is_reaped_the_task_is_a_workers_again(tmp_path):
    # The reading of docs/spec.md: a cancel cut short and never retried is as if never asked,
    # one second later (an attempt used).
    with cancel_cut_after_its_reserve(tmp_path / "q", 5) as queue:
        (lease,) = queue.reserve("w", now=6, lease_seconds=10)
        assert (lease.task_id, lease.attempts) == ("t", 2)



def test_the_lapsed_cancel_check_goes_red_when_the_retry_only_acks(tmp_path):
    # tests/broken_see.py: the records before the lapsed case (the ack alone, stale by then).
    from tests import broken_see
    with broken_see.active("lapsed_cancel_acked_alone"), pytest.raises(Exception):  # noqa: B017, PT011
        test_a_cancel_retried_after_the_interrupted_ones_lease_lapsed_finishes_it(tmp_path)
