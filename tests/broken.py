"""Deliberately broken variants of the library, each one plausible change.

A test that cannot fail proves nothing. Each variant here is the real
library with a single change that could survive a code review, applied by
patching one function for the length of a test run. `tests/crash/
test_broken_variants.py` runs the ordinary suites with a variant active
(environment variable WALQUEUE_BROKEN, read by tests/conftest.py) and
requires them to go red; the same suites are green on the real library.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Callable, Iterator
from unittest import mock

from walqueue import backup as backup_module
from walqueue import directory as directory_module
from walqueue import fs as fs_module
from walqueue import recovery as recovery_module
from walqueue import snapshot as snapshot_module
from walqueue import store as store_module
from walqueue.codec import encode_frame
from walqueue.engine import Engine
from walqueue.state import COMPLETED, LEASED, READY, State, Task
from walqueue.wal import ActiveSegment


def _newest_snapshot_wins(fs, directory):
    """Recovery that trusts the newest snapshot file instead of CURRENT."""
    names = sorted(name for name in fs.listdir(directory) if snapshot_module.is_snapshot_name(name))
    if not names:
        return None
    return int(names[-1][len("snapshot-"):-len(".snap")]), names[-1]


def _delete_before_publishing(self):
    """Compaction that deletes the covered WAL before CURRENT names the new snapshot."""
    store = self._store
    return (store.rotate, self._write_snapshot, store.delete_covered, store.publish)


_real_entry = Task.entry


def _entry_without_lease(self):
    """A snapshot that writes leased tasks as ready: lease owners and deadlines lost."""
    entry = _real_entry(self)
    if entry["status"] == LEASED:
        entry.update(status=READY, worker=None, deadline=None)
    return entry


def _trust_plain_tombstones(state, task_ids, numbers):
    """Snapshot loading whose fast path for tombstones trusts the entries it matched:
    task_id order and counters go unchecked."""
    return True


def _write_snapshot_without_tombstones(fs, directory, state):
    """A snapshot that leaves completed tasks out, so their keys could be reused."""
    live = [entry for entry in state.entries() if entry["status"] != COMPLETED]
    filename = snapshot_module.snapshot_name(state.last_seq)
    frames = [encode_frame({"format": 1, "kind": "walqueue.snapshot", "seq": state.last_seq,
                            "task_count": len(live)})]
    frames += [encode_frame(entry) for entry in live]
    frames.append(encode_frame({"kind": "end", "task_count": len(live)}))
    fd = fs.create(directory, filename)
    try:
        fs.write(fd, b"".join(frames))
        fs.fsync(fd)
    finally:
        fs.close(fd)
    return filename


def _append_before_checking(self, record):
    """Writes the frame first and checks the lease after: a stale ack leaves a frame."""
    frame = encode_frame(record)
    self._store._active.append(frame)  # no hook, as before issue 21: the variant is the order only
    change = self._state.check(record)
    self._state.commit(change)


_real_commit_expire = State._commit_expire


def _expire_at_now(self, record, targets):
    """A reap that makes expired tasks available at `now`, not at their old deadline."""
    _real_commit_expire(self, record, targets)
    for task in targets:
        if task.status == READY:
            task.available_at = record["now"]


_real_current_lease = State._current_lease


def _lease_valid_at_its_deadline(self, record):
    """An off-by-one: a lease still counts at now == deadline."""
    task = self.tasks.get(record["task_id"])
    if task is not None and task.deadline is not None and record["now"] == task.deadline:
        record = {**record, "now": record["now"] - 1}
    return _real_current_lease(self, record)


def _keep_torn_tail(self, size):
    """Recovery that leaves a torn tail in place and appends after it."""


_real_copy_file = backup_module._copy_file


def _copy_whole_file(source, target, length, source_path):
    """A backup that copies each file's current size, not the manifest's length:
    it picks up records written after the backup's seq (and a preallocated tail)."""
    _real_copy_file(source, target, os.fstat(source).st_size, source_path)


def _unmark_before_publishing(source, target, length, source_path):
    """A backup that removes its BACKUP-INCOMPLETE marker before CURRENT is in place, not after:
    a copy that dies while writing CURRENT looks like a corrupt queue, not an unfinished backup."""
    marker = os.path.join(os.path.dirname(target), backup_module.INCOMPLETE_BACKUP)
    if os.path.basename(target) == backup_module.CURRENT_TMP and os.path.exists(marker):
        os.unlink(marker)
    _real_copy_file(source, target, length, source_path)


def _seal_without_trim(self):
    """Rotation that syncs the preallocated segment but keeps its zeros: a sealed segment ends in zeros."""
    self.sync()


_real_sync = ActiveSegment.sync


def _sync_without_fdatasync(self):
    """A preallocating segment that skips fdatasync (the write went into space already allocated)."""
    if self.preallocate_bytes:
        self.unsynced = False
        return
    _real_sync(self)


def _create_truncating(self, directory, name):
    return fs_module.open_at(directory, name, os.O_WRONLY | os.O_CREAT | os.O_TRUNC)


@contextlib.contextmanager
def _patched_open_flags():
    """Files in the queue directory opened as before issue 12: without O_NOFOLLOW, created
    without O_EXCL, truncated in place: a link planted there is followed and written through."""
    with mock.patch.object(fs_module, "_FLAGS", os.O_CLOEXEC), \
            mock.patch.object(fs_module, "_creating", lambda new: os.O_CREAT), \
            mock.patch.object(fs_module.OsFileSystem, "create", _create_truncating):
        yield


_real_engine_init = Engine.__init__


def _init_reaching_the_path_again(self, directory, *, opened=None, **options):
    """An Engine that reaches its directory by its path again, ignoring the descriptor it was
    given, as walqueued's Queue did before issue 20: a link flipped in between redirects it."""
    _real_engine_init(self, directory, **options)


def _cancel_in_two_batches(self, task_id, *, now):
    """Cancel whose revive is its own batch, made durable before the reserve and ack are
    written: two fsyncs where SPEC §8b says one batch, and a crash between them leaves the
    dead task durably ready, for a worker to run, after the cancel was asked for."""
    from walqueue import cancel as cancelling
    from walqueue.engine import view_of

    self.check_open()
    task = self._state.get(task_id)
    view = None if task is None else view_of(task)
    if cancelling.check(task_id, view, now):
        records = cancelling.records(view, now)
        for group in (records[:-2], records[-2:]):
            if group:
                with self.batch():
                    for record in group:
                        record["seq"] = self._next_seq()
                        self._append(record)


VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "recovery_trusts_the_newest_snapshot":
        lambda: mock.patch.object(recovery_module, "read_current", _newest_snapshot_wins),
    "compaction_deletes_before_publishing":
        lambda: mock.patch.object(Engine, "_compaction_steps", _delete_before_publishing),
    "snapshot_drops_lease_state":
        lambda: mock.patch.object(Task, "entry", _entry_without_lease),
    "snapshot_drops_tombstones":
        lambda: mock.patch.object(store_module, "write_snapshot", _write_snapshot_without_tombstones),
    "stale_ack_appends_a_frame":
        lambda: mock.patch.object(Engine, "_append", _append_before_checking),
    "reap_forgets_the_old_deadline":
        lambda: mock.patch.object(State, "_commit_expire", _expire_at_now),
    "lease_valid_at_its_deadline":
        lambda: mock.patch.object(State, "_current_lease", _lease_valid_at_its_deadline),
    "torn_tail_left_in_place":
        lambda: mock.patch.object(ActiveSegment, "truncate", _keep_torn_tail),
    "backup_copies_current_file_sizes":
        lambda: mock.patch.object(backup_module, "_copy_file", _copy_whole_file),
    "backup_unmarks_before_publishing":
        lambda: mock.patch.object(backup_module, "_copy_file", _unmark_before_publishing),
    "seal_without_trim":
        lambda: mock.patch.object(ActiveSegment, "seal", _seal_without_trim),
    "prealloc_no_sync":
        lambda: mock.patch.object(ActiveSegment, "sync", _sync_without_fdatasync),
    "opens_follow_links": _patched_open_flags,
    "queue_reaches_the_path_again":
        lambda: mock.patch.object(Engine, "__init__", _init_reaching_the_path_again),
    # The check before issue 20: whoever may replace a link on the way is not asked about.
    "walk_trusts_every_link":
        lambda: mock.patch.object(directory_module, "_judge_link", lambda chain, name, link: []),
    "cancel_in_two_batches":
        lambda: mock.patch.object(Engine, "cancel", _cancel_in_two_batches),
    "plain_tombstones_unchecked":
        lambda: mock.patch.object(snapshot_module, "_plain_tombstones_in_order_and_possible",
                                  _trust_plain_tombstones),
}


@contextlib.contextmanager
def active(name: str) -> Iterator[None]:
    """Run the body with the named variant patched in. KeyError for an unknown name."""
    with VARIANTS[name]():
        yield
