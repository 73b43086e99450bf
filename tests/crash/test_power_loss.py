"""Power loss on a simulated disk (tests/simdisk.py): fsyncs are where SPEC says.

A process kill keeps the page cache, so only a power cut shows a missing
fsync. Three claims, each also run against the library with one fsync
removed (the `skip` of the simulated disk), where it must fail:

1. At each phase of SPEC §6 that promises durability, the durable image is
   what the phase table says: after `wal.after_sync`, `wal.after_rotate`,
   `current.after_publish`, `compact.after_delete` and
   `recover.after_truncate` everything the process sees would survive a
   power cut; after `snapshot.after_write` the snapshot's bytes and after
   `current.after_write` CURRENT.tmp's bytes would.
2. A power cut at any hook call of a script covering every operation and two
   compactions, keeping a seeded choice of unsynced writes, reopens without
   CorruptStore to the state after some prefix of the frames written, never
   fewer than the operations answered before the cut.
3. The same after a process crash at any hook call, a reopen, and two more
   answered puts: both survive the power cut.
"""

from __future__ import annotations

import contextlib
import random
import shutil
import tempfile
from pathlib import Path

import pytest

from tests.simdisk import SimFileSystem
from walqueue import InjectedCrash, PutRequest, Queue

SEEDS_PER_POINT = 3

# Each fsync of the library, named by the function that calls it.
FSYNC_SITES = [
    ("sync", "fsync"),                        # WAL append (and seal) fsync
    ("truncate", "fsync"),                    # torn tail cut at open
    ("_rotate", "fsync_directory"),           # the new segment's name
    ("write_snapshot", "fsync"),              # the snapshot's bytes
    ("_publish", "fsync"),                    # CURRENT.tmp's bytes
    ("_publish", "fsync_directory"),          # the rename over CURRENT
    ("_delete_covered", "fsync_directory"),   # the deletions after publishing
    ("_recover", "fsync_directory"),          # a segment created, or garbage deleted, at open
]
# Removing these loses answered writes, or leaves a directory that does not open.
# The other three only break the phase table: the truncation and the rename over
# CURRENT are made durable by the next fsync of the same file or directory anyway,
# and the deletions are redone by the next open.
HARMFUL_END_TO_END = {("sync", "fsync"), ("_rotate", "fsync_directory"),
                      ("write_snapshot", "fsync"), ("_publish", "fsync"),
                      ("_recover", "fsync_directory")}


class Script:
    """Every writing operation and two compactions, on one queue."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.leases: dict[str, object] = {}
        self.answered_seq = 0  # last_seq when the most recent operation returned

    def steps(self):
        q = self.queue
        yield lambda: q.put("a", {"n": 1})
        yield lambda: q.put("b", {"n": 2}, max_attempts=1)
        yield lambda: q.put_many([PutRequest("c", {"n": 3}), {"task_id": "d", "payload": {}}])
        yield lambda: self._reserve("w1", now=10, lease_seconds=5, limit=3)
        yield lambda: q.ack(self.leases.pop("a"), now=11)
        yield lambda: q.touch(self.leases["c"], now=11, lease_seconds=50)
        yield lambda: q.compact()
        yield lambda: self._reserve("w2", now=20, lease_seconds=5, limit=1)   # reaps b: dead
        yield lambda: q.release(self.leases.pop("d"), now=21, delay=2)
        yield lambda: q.revive(["b"], now=22)
        yield lambda: self._batch()
        yield lambda: q.compact()
        yield lambda: q.put("g", {"n": 7})

    def run(self) -> None:
        for step in self.steps():
            step()
            self.answered_seq = self.queue.stats().last_seq

    def _reserve(self, worker, **arguments):
        for lease in self.queue.reserve(worker, **arguments):
            self.leases[lease.task_id] = lease

    def _batch(self):
        with self.queue.batch():
            self.queue.put("e", {"n": 5})
            self.queue.put("f", {"n": 6})
            self._reserve("w3", now=30, lease_seconds=5, limit=2)


def logical_state(queue: Queue) -> tuple:
    return tuple(queue.tasks())


class Hook:
    """Records the state before each frame; optionally dies at hook call `die_at`."""

    def __init__(self, die_at: int | None = None, check=None) -> None:
        self.calls = 0
        self.die_at = die_at
        self.check = check
        self.queue: Queue | None = None
        self.states: dict[int, tuple] = {}  # last_seq -> state with exactly that many frames

    def __call__(self, phase: str) -> None:
        if phase == "wal.before_write" and self.queue is not None:
            self.states.setdefault(self.queue.stats().last_seq, logical_state(self.queue))
        if self.check is not None:
            self.check(phase)
        index, self.calls = self.calls, self.calls + 1
        if index == self.die_at:
            raise InjectedCrash(f"died at hook call {index} ({phase})")


@contextlib.contextmanager
def scratch():
    """A real directory for the LOCK file; the simulated disk holds everything else."""
    directory = tempfile.mkdtemp(prefix="walqueue-sim-")
    try:
        yield directory
    finally:
        shutil.rmtree(directory, ignore_errors=True)


def reference_run() -> tuple[int, dict[int, tuple]]:
    """Hook calls of an uninterrupted run, and the state after every prefix of frames."""
    with scratch() as directory:
        return _reference_run(directory)


def _reference_run(directory: str) -> tuple[int, dict[int, tuple]]:
    disk, hook = SimFileSystem(), Hook()
    queue = Queue(directory, hook=hook, filesystem=disk)
    hook.queue = queue
    Script(queue).run()
    hook.states[queue.stats().last_seq] = logical_state(queue)
    queue.close()
    return hook.calls, hook.states


REFERENCE_CALLS, PREFIX_STATES = reference_run()


def check_phase_table(disk: SimFileSystem, directory: str):
    """A hook that checks, at each phase, the durable image SPEC §6 promises."""
    failures: list[str] = []
    complete = {"wal.after_sync", "wal.after_rotate", "current.after_publish",
                "compact.after_delete", "recover.after_truncate"}

    def check(phase: str) -> None:
        if phase in complete:
            if disk.durable_image(directory) != disk.volatile_image(directory):
                failures.append(f"{phase}: something the process wrote would not survive a power cut")
        elif phase in ("snapshot.after_write", "current.after_write"):
            pattern = "snapshot-" if phase == "snapshot.after_write" else "CURRENT.tmp"
            for name, inode in disk.volatile[directory].items():
                if name.startswith(pattern) and bytes(inode.content) != inode.synced:
                    failures.append(f"{phase}: {name} is not fsynced")
    return check, failures


def torn_tail_setup(disk: SimFileSystem, directory: str) -> None:
    """Leave a torn tail (a partial frame) in the newest segment, as a crash would."""
    queue = Queue(directory, filesystem=disk)
    queue.put("t1", {})
    queue.close()
    (name,) = [n for n in disk.volatile[directory] if n.startswith("wal-")]
    inode = disk.volatile[directory][name]
    inode.content += b"\x00\x00\x00\x30{\"op\""
    inode.synced = bytes(inode.content)


def phase_table_failures(skip=None) -> list[str]:
    with scratch() as directory:
        return _phase_table_failures(directory, skip)


def _phase_table_failures(directory: str, skip) -> list[str]:
    disk = SimFileSystem(skip=skip)
    check, failures = check_phase_table(disk, directory)
    torn_tail_setup(disk, directory)
    queue = Queue(directory, hook=lambda phase: check(phase), filesystem=disk)  # recovers the tail
    Script(queue).run()
    queue.close()
    return failures


def power_loss_failures(die_at: int, seed: int, *, skip=None, then_continue: bool = False):
    """Die at hook call `die_at`, optionally reopen and answer two puts, cut the power, reopen."""
    with scratch() as directory:
        return _power_loss_failures(directory, die_at, seed, skip, then_continue)


def _power_loss_failures(directory: str, die_at: int, seed: int, skip, then_continue: bool):
    disk = SimFileSystem(skip=skip)
    hook = Hook(die_at=die_at)
    queue = Queue(directory, hook=hook, filesystem=disk)
    hook.queue = queue
    script = Script(queue)
    try:
        script.run()
    except InjectedCrash:
        pass
    else:
        queue.close()  # no fsync outside a batch: the same as dying here
    answered = script.answered_seq
    extra = []
    if then_continue:
        queue = Queue(directory, filesystem=disk)
        extra = [queue.put("z1", {}), queue.put("z2", {})]
        answered = queue.stats().last_seq
        queue.close()
    disk.power_loss(random.Random(seed))
    context = f"die_at={die_at} seed={seed} skip={skip} then_continue={then_continue}"
    try:
        reopened = Queue(directory, filesystem=disk)
    except Exception as error:  # noqa: BLE001 - reported with the replay context
        return [f"{context}: reopen raised {type(error).__name__}: {error}"]
    try:
        seq = reopened.stats().last_seq
        if seq < answered:
            return [f"{context}: {answered - seq} answered frames lost (seq {seq} < {answered})"]
        if extra:
            missing = [task_id for task_id in extra if reopened.get(task_id) is None]
            return [f"{context}: answered puts {missing} lost"] if missing else []
        if PREFIX_STATES.get(seq) != logical_state(reopened):
            return [f"{context}: state at seq {seq} is not the state after {seq} frames"]
        return []
    finally:
        reopened.close()


def all_power_loss_failures(skip=None, *, stop_at_first: bool = False) -> list[str]:
    failures: list[str] = []
    for die_at in range(REFERENCE_CALLS + 1):
        for seed in range(SEEDS_PER_POINT):
            for then_continue in (False, True):
                failures += power_loss_failures(die_at, seed, skip=skip,
                                                then_continue=then_continue)
                if failures and stop_at_first:
                    return failures
    return failures


def test_the_reference_run_covers_every_frame_and_both_compactions() -> None:
    assert sorted(PREFIX_STATES) == list(range(max(PREFIX_STATES) + 1))
    assert REFERENCE_CALLS > 40


def test_every_durable_phase_leaves_the_durable_image_spec_promises() -> None:
    assert phase_table_failures() == []


def test_a_power_cut_at_any_hook_call_keeps_every_answered_write() -> None:
    failures = all_power_loss_failures()
    assert failures == [], "\n".join(failures[:10])


@pytest.mark.parametrize("site", FSYNC_SITES, ids=["-".join(site) for site in FSYNC_SITES])
def test_removing_any_fsync_breaks_the_phase_table(site) -> None:
    failures = phase_table_failures(skip=site)
    assert failures, f"removing the fsync in {site[0]} went unnoticed"


@pytest.mark.parametrize("site", sorted(HARMFUL_END_TO_END),
                         ids=["-".join(site) for site in sorted(HARMFUL_END_TO_END)])
def test_removing_a_harmful_fsync_loses_answered_writes_after_a_power_cut(site) -> None:
    failures = all_power_loss_failures(skip=site, stop_at_first=True)
    assert failures, f"removing the fsync in {site[0]} lost nothing in any power cut"


@pytest.mark.parametrize("site", sorted(set(FSYNC_SITES) - HARMFUL_END_TO_END),
                         ids=["-".join(site) for site in sorted(set(FSYNC_SITES) - HARMFUL_END_TO_END)])
def test_removing_a_redundant_fsync_loses_nothing_end_to_end(site) -> None:
    # Pins down the claim in HARMFUL_END_TO_END's comment, so it cannot go stale.
    assert all_power_loss_failures(skip=site) == []


def test_the_simulated_disk_forgets_what_was_not_fsynced(tmp_path: Path) -> None:
    disk = SimFileSystem()
    directory = str(tmp_path / "d")
    disk.makedirs(directory)
    fd = disk.create(f"{directory}/synced")
    disk.write(fd, b"kept")
    disk.fsync(fd)
    disk.close(fd)
    disk.fsync_directory(directory)
    fd = disk.create(f"{directory}/unnamed")
    disk.write(fd, b"data")
    disk.fsync(fd)  # its bytes are durable, but not its name
    disk.power_loss(random.Random(0))
    assert disk.volatile_image(directory) == {"synced": b"kept"}
