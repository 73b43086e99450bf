"""How big a snapshot can be, known without writing it: Engine.snapshot_bytes_bound.

walqueued checks the free space against this bound before it forks a
snapshot child, so it must never be below the snapshot then written, and it
must count what the WAL does not carry: a reserve names its worker once for
up to 1,000 tasks and the snapshot repeats it per task; a put carries no
identity. The claims: over random histories (every record type, numbers and
names of every length, reopens between compactions) the bound is never below
the snapshot; where the WAL says once what the snapshot repeats, it still
holds, where "snapshot plus WAL since" was off by a factor of five and more;
and for an ordinary put + reserve + ack history it stays within 1.5x.
"""

from __future__ import annotations

import contextlib
import os
import random

import pytest

from walqueue import Queue, StaleLease
from walqueue.fs import OsFileSystem
from walqueue.snapshot import snapshot_name
from walqueue.snapshot_size import PUT_ENTRY_EXTRA_BYTES


def test_the_snapshot_bound_counts_what_the_wal_does_not_carry(tmp_path):
    """Engine.snapshot_bytes_bound against the snapshot then written: never below it, and well
    below the WAL-based estimate's error where the snapshot repeats what the WAL says once."""
    assert PUT_ENTRY_EXTRA_BYTES == 189  # docs/daemon.md, "The space a snapshot needs"
    with Queue(tmp_path / "leases") as queue:
        queue.put_many([{"task_id": f"t{n:03}", "payload": {}} for n in range(200)])
        queue.reserve("w" * 1000, now=100, lease_seconds=3600, limit=200)
        bound, wal_bytes = queue.engine.snapshot_bytes_bound(), queue.stats().wal_bytes
        size = os.path.getsize(tmp_path / "leases" / snapshot_name(queue.compact()))
        assert wal_bytes < size / 5  # what the old estimate (snapshot + WAL since) took it for
        assert size <= bound <= size + 1024
    with Queue(tmp_path / "cycles") as queue:  # put, reserve, ack of 100-byte payloads
        for n in range(300):
            queue.put(f"task-{n:011}", {"blob": "x" * 88})
            (lease,) = queue.reserve("worker-1", now=100, lease_seconds=30)
            queue.ack(lease, now=101)
        queue.compact()
        for n in range(300, 600):
            queue.put(f"task-{n:011}", {"blob": "x" * 88})
            (lease,) = queue.reserve("worker-1", now=200, lease_seconds=30)
            queue.ack(lease, now=201)
        bound = queue.engine.snapshot_bytes_bound()
        size = os.path.getsize(tmp_path / "cycles" / snapshot_name(queue.compact()))
        assert size <= bound <= 1.5 * size  # payloads acked since the snapshot still counted


def random_operation(queue: Queue, rng: random.Random, clock: list[int], leases: list) -> None:
    """One random call, with the numbers and names that change an entry's length the most."""
    now = clock[0]
    choice = rng.random()
    if choice < 0.3:
        first = queue.stats().last_seq * 100
        queue.put_many([{"task_id": f"t{first + n}", "payload": {"x": "é" * rng.randint(0, 40)},
                         "available_at": rng.choice([0, now + 10 ** rng.randint(0, 12)]),
                         "max_attempts": rng.randint(1, 3)} for n in range(rng.randint(1, 20))])
    elif choice < 0.5:
        leases += queue.reserve(rng.choice(["w", "w\n" * 200, "ü" * 300]), now=now,
                                lease_seconds=rng.choice([1, 10 ** rng.randint(1, 15)]), limit=rng.randint(1, 50))
    elif choice < 0.8 and leases:
        lease = leases.pop(rng.randrange(len(leases)))
        with contextlib.suppress(StaleLease):
            if choice < 0.65:
                queue.ack(lease, now=now)
            elif choice < 0.75:
                queue.release(lease, now=now, delay=rng.choice([0, 10 ** rng.randint(0, 14)]))
            else:
                leases.append(queue.touch(lease, now=now, lease_seconds=rng.choice([1, 10 ** rng.randint(1, 15)])))
    elif choice < 0.9:
        clock[0] += rng.choice([1, 10 ** rng.randint(1, 8)])
        queue.engine.expire_due(now=clock[0])
    elif dead := [task.task_id for task in queue.tasks("dead")][:30]:
        queue.revive(dead, now=now)


class NoSync(OsFileSystem):
    """Files without their fsyncs: sizes are what these tests look at, not durability."""

    def fsync(self, fd: int) -> None:
        pass

    def fdatasync(self, fd: int) -> None:
        pass

    def fsync_directory(self, directory) -> None:
        pass


@pytest.mark.parametrize("seed", [1, 2, 3])
def test_the_snapshot_bound_is_never_below_the_snapshot_over_random_histories(tmp_path, seed):
    rng = random.Random(seed)
    clock, leases = [1_000], []
    queue = Queue(tmp_path, filesystem=NoSync())
    try:
        for step in range(60):
            with queue.batch():
                for _ in range(rng.randint(1, 25)):
                    random_operation(queue, rng, clock, leases)
            if rng.random() < 0.2:  # a reopen: the bound starts from the published snapshot and the replay
                queue.close()
                queue = Queue(tmp_path, filesystem=NoSync())
            if rng.random() < 0.4:
                bound = queue.engine.snapshot_bytes_bound()
                size = os.path.getsize(tmp_path / snapshot_name(queue.compact()))
                assert size <= bound, f"seed {seed}, step {step}: a snapshot of {size} bytes, bound {bound}"
    finally:
        queue.close()
