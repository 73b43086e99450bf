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
2. A power cut at any hook call of a script covering every operation, two
   compactions and one compaction in steps (as walqueued runs it), keeping a seeded choice of unsynced writes, reopens without
   CorruptStore to the state after some prefix of the frames written, never
   fewer than the operations answered before the cut.
3. The same after a process crash at any hook call, a reopen, and two more
   answered puts: both survive the power cut.

Everything runs twice: appending (the default) and with the active segment
preallocated (`preallocate_bytes`, a small step so the script grows the
allocation many times and some frames need more than one step). With
preallocation the fsyncs are different (fdatasync per sync; the seal and
close trim the zeros and fsync), and so is the one outcome that is not a
clean prefix: a write torn inside the preallocated region leaves a non-zero
prefix followed by zeros, which fails its digest and is CorruptStore by
SPEC §5. The tear model "zeros" (ext4's unwritten extents, for a frame
inside one fresh extent) never produces it and claim 2 holds exactly; the
model "prefix" produces it, and the test checks that every CorruptStore is
exactly that case (the newest segment, named file and offset, zeros after
the torn bytes) and that cutting the segment there, as docs/failure-model.md
tells an operator, loses no answered operation.
"""

from __future__ import annotations

import contextlib
import random
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.simdisk import SimFileSystem
from walqueue import CorruptStore, InjectedCrash, PutRequest, Queue

SEEDS_PER_POINT = 3
TORN_SEEDS_PER_POINT = 12  # the torn-prefix case needs a cut during an unsynced write
# Small enough that the script grows the allocation many times, and smaller
# than its larger frames, which must then grow it by more than one step.
PREALLOCATE_BYTES = 256

# Each fsync of the library, named by the function that calls it.
FSYNC_SITES = [
    ("sync", "fsync"),                        # WAL append (and seal) fsync
    ("truncate", "fsync"),                    # torn tail cut at open
    ("rotate", "fsync_directory"),           # the new segment's name
    ("write_snapshot", "fsync"),              # the snapshot's bytes
    ("publish", "fsync"),                    # CURRENT.tmp's bytes
    ("publish", "fsync_directory"),          # the rename over CURRENT
    ("delete_covered", "fsync_directory"),   # the deletions after publishing
    ("_recover", "fsync_directory"),          # a segment created, or garbage deleted, at open
]
# Removing these loses answered writes, or leaves a directory that does not open.
# The other three only break the phase table: the truncation and the rename over
# CURRENT are made durable by the next fsync of the same file or directory anyway,
# and the deletions are redone by the next open.
HARMFUL_END_TO_END = {("sync", "fsync"), ("rotate", "fsync_directory"),
                      ("write_snapshot", "fsync"), ("publish", "fsync"),
                      ("_recover", "fsync_directory")}

# With preallocation the WAL sync is an fdatasync, and the seal (and close)
# trims the zeros and fsyncs: without that fsync a power cut after a rotation
# can leave zeros in a sealed segment, which is CorruptStore.
PREALLOCATED_FSYNC_SITES = [("sync", "fdatasync"), ("trim", "fsync")] + [
    site for site in FSYNC_SITES if site != ("sync", "fsync")]
PREALLOCATED_HARMFUL_END_TO_END = {("sync", "fdatasync"), ("trim", "fsync")} | (
    HARMFUL_END_TO_END - {("sync", "fsync")})


@dataclass(frozen=True)
class Mode:
    """How the queue writes its WAL, and what a power cut may do to a torn write."""

    preallocate_bytes: int
    tear: str  # SimFileSystem.power_loss's tear model

    @property
    def sites(self) -> list[tuple[str, str]]:
        return PREALLOCATED_FSYNC_SITES if self.preallocate_bytes else FSYNC_SITES

    @property
    def harmful(self) -> set[tuple[str, str]]:
        return PREALLOCATED_HARMFUL_END_TO_END if self.preallocate_bytes else HARMFUL_END_TO_END


APPEND = Mode(0, "prefix")
PREALLOCATE = Mode(PREALLOCATE_BYTES, "zeros")
PREALLOCATE_TORN = Mode(PREALLOCATE_BYTES, "prefix")
MODES = {"append": APPEND, "preallocate": PREALLOCATE}


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
        yield lambda: self._compaction_in_steps()

    def run(self) -> None:
        for step in self.steps():
            step()
            self.answered_seq = self.queue.stats().last_seq

    def _reserve(self, worker, **arguments):
        for lease in self.queue.reserve(worker, **arguments):
            self.leases[lease.task_id] = lease

    def _compaction_in_steps(self):
        """walqueued's compaction: the snapshot written while more frames are appended."""
        q = self.queue
        compaction = q.engine.begin_compaction()
        q.engine.write_compaction_snapshot(compaction)  # the daemon's forked child does this
        q.put("h", {"n": 8})
        self.answered_seq = q.stats().last_seq
        q.engine.finish_compaction(compaction)

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
            durable, volatile = disk.durable_image(directory), disk.volatile_image(directory)
            if phase == "wal.after_sync":
                # A compaction in steps appends while its snapshot is being
                # written: that file is not published yet (its name becomes
                # durable with CURRENT's), and an orphan is never read.
                durable, volatile = (
                    {name: data for name, data in image.items()
                     if not name.startswith("snapshot-") or current_names(volatile) == name}
                    for image in (durable, volatile))
            if durable != volatile:
                failures.append(f"{phase}: something the process wrote would not survive a power cut")
        elif phase in ("snapshot.after_write", "current.after_write"):
            pattern = "snapshot-" if phase == "snapshot.after_write" else "CURRENT.tmp"
            for name, inode in disk.volatile[directory].items():
                if name.startswith(pattern) and bytes(inode.content) != inode.synced:
                    failures.append(f"{phase}: {name} is not fsynced")
    return check, failures


def current_names(image: dict[str, bytes]) -> str | None:
    """The snapshot file CURRENT names in a directory image, if any."""
    data = image.get("CURRENT")
    if data is None:
        return None
    return re.search(rb'"snapshot":"([^"]+)"', data).group(1).decode()


def torn_tail_setup(disk: SimFileSystem, directory: str, mode: Mode) -> None:
    """Leave a torn tail (a partial frame) in the newest segment, as a crash would."""
    queue = Queue(directory, filesystem=disk, preallocate_bytes=mode.preallocate_bytes)
    queue.put("t1", {})
    queue.close()
    (name,) = [n for n in disk.volatile[directory] if n.startswith("wal-")]
    inode = disk.volatile[directory][name]
    inode.content += b"\x00\x00\x00\x30{\"op\""
    inode.synced = bytes(inode.content)


def phase_table_failures(mode: Mode = APPEND, skip=None) -> list[str]:
    with scratch() as directory:
        return _phase_table_failures(directory, mode, skip)


def _phase_table_failures(directory: str, mode: Mode, skip) -> list[str]:
    disk = SimFileSystem(skip=skip)
    check, failures = check_phase_table(disk, directory)
    torn_tail_setup(disk, directory, mode)
    queue = Queue(directory, hook=lambda phase: check(phase), filesystem=disk,  # recovers the tail
                  preallocate_bytes=mode.preallocate_bytes)
    Script(queue).run()
    queue.close()
    # Not a phase, but the same promise: close() leaves only durable frames.
    if disk.durable_image(directory) != disk.volatile_image(directory):
        failures.append("close: something the process wrote would not survive a power cut")
    if mode.preallocate_bytes and disk.allocations == 0:
        failures.append("the script never preallocated")
    return failures


@dataclass
class Outcomes:
    """What the power cuts of one mode led to."""

    failures: list[str]
    torn_in_preallocation: list[str]  # CorruptStore of the documented shape, each repaired


def power_loss_failures(die_at: int, seed: int, *, mode: Mode = APPEND, skip=None,
                        then_continue: bool = False, outcomes: Outcomes | None = None):
    """Die at hook call `die_at`, optionally reopen and answer two puts, cut the power, reopen."""
    outcomes = outcomes if outcomes is not None else Outcomes([], [])
    with scratch() as directory:
        return _power_loss_failures(directory, die_at, seed, mode, skip, then_continue, outcomes)


def _power_loss_failures(directory: str, die_at: int, seed: int, mode: Mode, skip,
                         then_continue: bool, outcomes: Outcomes):
    disk = SimFileSystem(skip=skip)
    hook = Hook(die_at=die_at)
    queue = Queue(directory, hook=hook, filesystem=disk, preallocate_bytes=mode.preallocate_bytes)
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
        queue = Queue(directory, filesystem=disk, preallocate_bytes=mode.preallocate_bytes)
        extra = [queue.put("z1", {}), queue.put("z2", {})]
        answered = queue.stats().last_seq
        queue.close()
    disk.power_loss(random.Random(seed), tear=mode.tear)
    context = (f"die_at={die_at} seed={seed} {mode} skip={skip} then_continue={then_continue}")
    try:
        reopened = Queue(directory, filesystem=disk, preallocate_bytes=mode.preallocate_bytes)
    except CorruptStore as error:
        if not (mode.preallocate_bytes and mode.tear == "prefix"):
            return [f"{context}: reopen raised CorruptStore: {error}"]
        problem = cut_a_frame_torn_in_preallocation(disk, directory, error)
        if problem is not None:
            return [f"{context}: reopen raised CorruptStore ({error}), {problem}"]
        outcomes.torn_in_preallocation.append(f"{context}: {error}")
        try:
            reopened = Queue(directory, filesystem=disk, preallocate_bytes=mode.preallocate_bytes)
        except Exception as error:  # noqa: BLE001 - reported with the replay context
            return [f"{context}: after cutting the torn frame, reopen raised "
                    f"{type(error).__name__}: {error}"]
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


_TORN_MESSAGE = re.compile(r"(wal-\d{20}\.log): frame at offset (\d+) fails its SHA-256 checksum")


def cut_a_frame_torn_in_preallocation(disk: SimFileSystem, directory: str,
                                      error: CorruptStore) -> str | None:
    """Check `error` is the documented case, then cut the segment there as an operator would.

    The case (docs/failure-model.md): the newest segment's last frame fails
    its digest, and after its first bytes everything to the end of the file
    is zero -- a write torn inside the preallocated region. Returns None
    when it is exactly that (and cuts the segment at the frame), else what
    is different.
    """
    match = _TORN_MESSAGE.search(str(error))
    if match is None:
        return "not a frame failing its digest"
    name, offset = match.group(1), int(match.group(2))
    newest = max(n for n in disk.volatile[directory] if n.startswith("wal-"))
    if name != newest:
        return f"in {name}, not in the newest segment {newest}"
    inode = disk.volatile[directory][name]
    rest = bytes(inode.content[offset:])
    written = len(rest.rstrip(b"\x00"))
    if written == 0 or written >= len(rest) - 32:
        return "the bytes from the named offset are not a torn prefix followed by zeros"
    del inode.content[offset:]
    inode.synced = bytes(inode.content)
    return None


def all_power_loss_failures(skip=None, *, mode: Mode = APPEND, stop_at_first: bool = False,
                            outcomes: Outcomes | None = None,
                            seeds: int = SEEDS_PER_POINT) -> list[str]:
    outcomes = outcomes if outcomes is not None else Outcomes([], [])
    for die_at in range(REFERENCE_CALLS + 1):
        for seed in range(seeds):
            for then_continue in (False, True):
                outcomes.failures += power_loss_failures(
                    die_at, seed, mode=mode, skip=skip, then_continue=then_continue,
                    outcomes=outcomes)
                if outcomes.failures and stop_at_first:
                    return outcomes.failures
    return outcomes.failures


def test_the_reference_run_covers_every_frame_and_both_compactions() -> None:
    assert sorted(PREFIX_STATES) == list(range(max(PREFIX_STATES) + 1))
    assert REFERENCE_CALLS > 40


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_every_durable_phase_leaves_the_durable_image_spec_promises(mode: Mode) -> None:
    assert phase_table_failures(mode) == []


@pytest.mark.parametrize("mode", MODES.values(), ids=MODES.keys())
def test_a_power_cut_at_any_hook_call_keeps_every_answered_write(mode: Mode) -> None:
    failures = all_power_loss_failures(mode=mode)
    assert failures == [], "\n".join(failures[:10])


def test_a_write_torn_inside_the_preallocated_region_is_the_one_corrupt_store_and_loses_nothing_answered() -> None:
    # SPEC §5 leaves no choice: a non-zero prefix followed by zeros is not a
    # zero tail, so the frame fails its digest and open raises CorruptStore.
    # Every such outcome is checked to be exactly that shape, and after the
    # cut docs/failure-model.md describes, the state holds every answered
    # operation (the same checks as any other power cut).
    outcomes = Outcomes([], [])
    failures = all_power_loss_failures(mode=PREALLOCATE_TORN, outcomes=outcomes,
                                       seeds=TORN_SEEDS_PER_POINT)
    assert failures == [], "\n".join(failures[:10])
    assert outcomes.torn_in_preallocation, "the torn-prefix model never produced the documented case"


def _site_cases(harmful: bool | None):
    cases = []
    for name, mode in MODES.items():
        for site in mode.sites:
            if harmful is None or (site in mode.harmful) == harmful:
                cases.append(pytest.param(mode, site, id=f"{name}-{'-'.join(site)}"))
    return cases


@pytest.mark.parametrize(("mode", "site"), _site_cases(None))
def test_removing_any_fsync_breaks_the_phase_table(mode: Mode, site) -> None:
    failures = phase_table_failures(mode, skip=site)
    assert failures, f"removing the fsync in {site[0]} went unnoticed"


@pytest.mark.parametrize(("mode", "site"), _site_cases(True))
def test_removing_a_harmful_fsync_loses_answered_writes_after_a_power_cut(mode: Mode, site) -> None:
    failures = all_power_loss_failures(skip=site, mode=mode, stop_at_first=True)
    assert failures, f"removing the fsync in {site[0]} lost nothing in any power cut"


@pytest.mark.parametrize(("mode", "site"), _site_cases(False))
def test_removing_a_redundant_fsync_loses_nothing_end_to_end(mode: Mode, site) -> None:
    # Pins down the claim in HARMFUL_END_TO_END's comment, so it cannot go stale.
    assert all_power_loss_failures(skip=site, mode=mode) == []


def test_the_simulated_disk_forgets_what_was_not_fsynced(tmp_path: Path) -> None:
    disk = SimFileSystem()
    directory = str(tmp_path / "d")
    disk.makedirs(directory)
    fd = disk.create(directory, "synced")
    disk.write(fd, b"kept")
    disk.fsync(fd)
    disk.close(fd)
    disk.fsync_directory(directory)
    fd = disk.create(directory, "unnamed")
    disk.write(fd, b"data")
    disk.fsync(fd)  # its bytes are durable, but not its name
    disk.power_loss(random.Random(0))
    assert disk.volatile_image(directory) == {"synced": b"kept"}
