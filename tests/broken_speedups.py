"""Deliberately broken variants of walqueue._speedups, each one plausible slip in the C.

The differential check (tests/speedups_cases.py) compares the extension with
the pure reference; tests/unit/test_speedups.py requires it to find each of
these, and nothing on the real extension. A variant is the real module
wrapped, with one function changed in Python to behave as the slip would:
swapped in for `walqueue.speedups.speedups` for the length of a test
(`installed(name)`).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
from collections.abc import Iterator
from unittest import mock

from walqueue import speedups
from walqueue.codec import canonical_json
from walqueue.errors import KeyConflict, WalQueueError
from walqueue.state import LEASED, RECORD_FIELDS

_LENGTH, _DIGEST = 4, 32


class _Wrapped:
    """The real extension: every name not overridden is the real one."""

    def __init__(self, real) -> None:
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)


class AcceptsBadDigest(_Wrapped):
    """The frame walk forgets to compare the digest: a frame whose SHA-256 fails, but whose body
    is good canonical JSON, is returned as a frame (the reference raises CorruptStore)."""

    def scan(self, data, offset, stop_at_entry, max_frames, frame_type):
        frames, offset, code = self._real.scan(data, offset, stop_at_entry, max_frames, frame_type)
        while code == self.SCAN_DEFER and len(frames) < max_frames:
            frame = _bad_digest_frame(data, offset, frame_type)
            if frame is None:
                break
            frames.append(frame)
            offset = frame[1]
            more, offset, code = self._real.scan(data, offset, stop_at_entry, max_frames - len(frames),
                                                 frame_type)
            frames += more
        return frames, offset, code


def _bad_digest_frame(data, offset: int, frame_type):
    """The frame at `offset` if only its digest is wrong (length in bounds, body canonical)."""
    if len(data) - offset < _LENGTH + _DIGEST:
        return None
    length = int.from_bytes(data[offset:offset + _LENGTH], "big")
    end = offset + _LENGTH + length + _DIGEST
    if length == 0 or end > len(data):
        return None
    body = bytes(data[offset + _LENGTH:end - _DIGEST])
    if hashlib.sha256(body).digest() == bytes(data[end - _DIGEST:end]):
        return None
    try:
        value = json.loads(body)
    except ValueError:
        return None
    canonical = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    if type(value) is not dict or canonical.encode() != body:
        return None
    return frame_type(offset, end, value)


class DefersPastTheFrame(_Wrapped):
    """The frame walk, handing a frame it cannot decide back, reports the offset after that
    frame's length field instead of the frame's start: the reference then reads (and names)
    the wrong place."""

    def scan(self, data, offset, stop_at_entry, max_frames, frame_type):
        frames, offset, code = self._real.scan(data, offset, stop_at_entry, max_frames, frame_type)
        if code == self.SCAN_DEFER and offset + _LENGTH <= len(data):
            offset += _LENGTH
        return frames, offset, code


class IgnoresTaskIdOrder(_Wrapped):
    """The tombstone load forgets the task_id order rule (it is told no last id): an entry out
    of order after the first block is loaded (the reference says it is out of order)."""

    def load_tombstones(self, data, offset, limit, last_id, taken):
        return self._real.load_tombstones(data, offset, limit, b"", taken)


class DropsABlocksLastFrame(_Wrapped):
    """The snapshot writer encodes one tombstone too few per block (an off-by-one in the count)."""

    def tombstone_frames(self, names, name_bounds, values, value_bounds, identities, numbers,
                         order, count):
        return self._real.tombstone_frames(names, name_bounds, values, value_bounds, identities,
                                           numbers, order, max(count - 1, 1))


# -- the compiled twin of State.apply (Applier, _apply.c) ------------------------------------


class _SlippedApplier(_Wrapped):
    """The real Applier, except where `slip(state, record, body_bytes)` says it does otherwise
    (it returns True when it took the record itself)."""

    def Applier(self, *, state, **kwargs):   # noqa: N802 -- the extension's type name
        real = self._real.Applier(state=state, **kwargs)

        def apply(record, body_bytes=None):
            if not self.slip(state, record, body_bytes):
                real(record, body_bytes)
        return apply

    @staticmethod
    def slip(state, record, body_bytes) -> bool:
        raise NotImplementedError


def _well_formed(record, op: str) -> bool:
    return type(record) is dict and record.get("op") == op and record.keys() == RECORD_FIELDS[op]


def _commit_unchecked(state, record, targets, body_bytes) -> bool:
    state.commit((record["op"], record, targets), body_bytes)
    return True


class AckIgnoresTheWorker(_SlippedApplier):
    """The ack's lease check forgets to compare the worker: another worker's ack of a current
    lease completes the task (the reference raises StaleLease)."""

    @staticmethod
    def slip(state, record, body_bytes) -> bool:
        if not _well_formed(record, "ack") or record["seq"] != state.last_seq + 1:
            return False
        task = state.tasks.get(record["task_id"])
        if (task is None or task.status != LEASED or task.worker == record["worker"]
                or task.generation != record["generation"] or not record["now"] < task.deadline):
            return False
        return _commit_unchecked(state, record, [task], body_bytes)


class AckAtTheDeadline(_SlippedApplier):
    """An off-by-one in the ack's lease check: now == deadline still counts as leased."""

    @staticmethod
    def slip(state, record, body_bytes) -> bool:
        if not _well_formed(record, "ack") or record["seq"] != state.last_seq + 1:
            return False
        task = state.tasks.get(record["task_id"])
        if (task is None or task.status != LEASED or task.worker != record["worker"]
                or task.generation != record["generation"] or record["now"] != task.deadline):
            return False
        return _commit_unchecked(state, record, [task], body_bytes)


class PutChecksOnlyItsFirstTask(_SlippedApplier):
    """The put's conflict loop stops after the first task: a later task whose id or key is
    taken (by the task before it, here) is put anyway (the reference raises KeyConflict)."""

    @staticmethod
    def slip(state, record, body_bytes) -> bool:
        if (not _well_formed(record, "put") or record["seq"] != state.last_seq + 1
                or not _conflicts_after_its_first_task(state, record)):
            return False
        return _commit_unchecked(state, record, record["tasks"], body_bytes)


def _conflicts_after_its_first_task(state, record) -> bool:
    """True for a put of tasks of one shape that the reference rejects with KeyConflict and
    would take with its first task alone: what a conflict check of the first task misses."""
    tasks = record.get("tasks") if type(record) is dict else None
    if type(tasks) is not list or len(tasks) < 2:
        return False
    try:
        state.check(record)
        return False
    except KeyConflict:
        pass
    except WalQueueError:
        return False
    try:
        state.check({**record, "tasks": tasks[:1]})
    except WalQueueError:
        return False
    return all(type(task) is dict and task.keys() == tasks[0].keys() for task in tasks)


class ReserveGrowthUnescaped(_SlippedApplier):
    """The reserve's snapshot bound counts its worker as len + 2 characters, forgetting JSON's
    escapes: a worker with a quote or a newline makes the bound too small."""

    @staticmethod
    def slip(state, record, body_bytes) -> bool:
        if not _well_formed(record, "reserve") or type(record["worker"]) is not str:
            return False
        before = state.snapshot_growth
        try:
            state.apply(record, body_bytes)
        finally:
            if state.snapshot_growth != before:
                worker = record["worker"]
                state.snapshot_growth -= len(record["task_ids"]) * (
                    len(canonical_json(worker)) - len(worker) - 2)
        return True


class ReserveForgetsTheMonitoring(_Wrapped):
    """The reserve forgets to tell the monitoring a lease started (the figures of leases past
    half their time then miss it)."""

    def Applier(self, *, state, **kwargs):   # noqa: N802 -- the extension's type name
        state.monitoring.lease_started = lambda task: None
        try:
            return self._real.Applier(state=state, **kwargs)
        finally:
            del state.monitoring.lease_started


class _SlippedWriter(_Wrapped):
    """The real Applier, whose writer's pair (check, commit) slips where `check_slip` or
    `commit_slip` says: each returns True when it took the call itself."""

    def Applier(self, *, state, **kwargs):   # noqa: N802 -- the extension's type name
        real = self._real.Applier(state=state, **kwargs)
        variant = self

        class Twin:
            def __call__(self, record, body_bytes=None):
                return real(record, body_bytes)

            def check(self, record):
                return variant.check_slip(state, record) or real.check(record)

            def commit(self, change, body_bytes):
                if not variant.commit_slip(state, real, change, body_bytes):
                    real.commit(change, body_bytes)
        return Twin()

    @staticmethod
    def check_slip(state, record):
        return None

    @staticmethod
    def commit_slip(state, real, change, body_bytes) -> bool:
        return False


class WriterPutChecksOnlyItsFirstTask(_SlippedWriter):
    """The writer's check of a put looks at its first task only (its COMMIT, trusting the check,
    runs no conflict check again): a later task whose id or key is taken is put anyway."""

    @staticmethod
    def check_slip(state, record):
        if not _conflicts_after_its_first_task(state, record):
            return None
        return ("put", record, record["tasks"])


class WriterPutCommitSkipsTheGrowth(_SlippedWriter):
    """A put committed after its check jumps past the snapshot bound's growth (a label one line
    too low): the bound of the snapshot to come is too small."""

    @staticmethod
    def commit_slip(state, real, change, body_bytes) -> bool:
        if type(change) is not dict or change.get("op") != "put":
            return False
        before = state.snapshot_growth
        real.commit(change, body_bytes)
        state.snapshot_growth = before
        return True


VARIANTS = {
    "accepts_bad_digest": AcceptsBadDigest,
    "defers_past_the_frame": DefersPastTheFrame,
    "ignores_task_id_order": IgnoresTaskIdOrder,
    "drops_a_blocks_last_frame": DropsABlocksLastFrame,
}
# The twin's, found by tests/replay_cases.py's differential (tests/unit/test_replay_twin.py).
TWIN_VARIANTS = {
    "ack_ignores_the_worker": AckIgnoresTheWorker,
    "ack_at_the_deadline": AckAtTheDeadline,
    "put_checks_only_its_first_task": PutChecksOnlyItsFirstTask,
    "reserve_growth_unescaped": ReserveGrowthUnescaped,
    "reserve_forgets_the_monitoring": ReserveForgetsTheMonitoring,
}


# The writer's pair (check before the frame, commit after), found by tests/replay_cases.py's
# writer_differs (tests/unit/test_replay_twin.py).
WRITER_VARIANTS = {
    "writer_put_checks_only_its_first_task": WriterPutChecksOnlyItsFirstTask,
    "writer_put_commit_skips_the_growth": WriterPutCommitSkipsTheGrowth,
}


@contextlib.contextmanager
def installed(name: str) -> Iterator[None]:
    """The variant `name` as the extension every caller of walqueue.speedups uses."""
    assert speedups.COMPILED, "the broken variants wrap the compiled extension"
    variant = VARIANTS.get(name) or TWIN_VARIANTS.get(name) or WRITER_VARIANTS[name]
    with mock.patch.object(speedups, "speedups", variant(speedups.speedups)):
        yield
