"""Backups (walqueue.backup, Queue.backup_manifest, walqueue-ctl backup/pause/resume in process).

A copy must open with exactly the source's state as of the manifest's seq,
whatever was written after it; it must never overwrite anything; and a copy
that stopped half way must not open as a queue.
"""

from __future__ import annotations

import json
import os
import stat
from unittest import mock

import pytest
from click.testing import CliRunner

from walqueue import CorruptStore, Queue, QueueLocked
from walqueue import backup as backup_module
from walqueue.backup import (
    BackupError,
    BackupIncomplete,
    DestinationNotEmpty,
    SourceUnreadable,
    backup_directory,
    copy_manifest,
)
from walqueue.ctl import backends, cli
from walqueue.ctl import errors as ctl_errors
from walqueue.ctl.errors import EXIT_DEST_NOT_EMPTY, EXIT_OK
from walqueue.values import BackupManifest
from walqueue.verify import verify_directory


def state_of(queue: Queue) -> tuple:
    """Everything observable: every task (all fields) and the seq."""
    return list(queue.tasks()), queue.stats().last_seq


def busy_queue(directory, *, compact: bool = True) -> Queue:
    """A queue with every kind of record, compacted half way when `compact`."""
    queue = Queue(directory)
    for index in range(6):
        queue.put(f"t{index}", {"index": index}, max_attempts=2)
    first = queue.reserve("w", now=100, lease_seconds=30, limit=3)
    queue.ack(first[0], now=101)
    queue.release(first[1], now=101, delay=5)
    if compact:
        queue.compact()
    queue.put("after", {"compacted": compact})
    second = queue.reserve("w", now=200, lease_seconds=30, limit=2)  # expires first[2]
    queue.touch(second[0], now=201, lease_seconds=60)
    return queue


def more_writes(queue: Queue) -> None:
    """Writes after the manifest, which the copy must not contain."""
    queue.put("late", {"after": "the manifest"})
    for lease in queue.reserve("w2", now=300, lease_seconds=30, limit=10):
        queue.ack(lease, now=301)


def test_a_copy_opens_with_exactly_the_state_as_of_the_manifest_seq(tmp_path):
    queue = busy_queue(tmp_path / "source")
    manifest = queue.backup_manifest()
    expected = state_of(queue)
    assert manifest.seq == expected[1]
    more_writes(queue)
    assert state_of(queue) != expected

    result = copy_manifest(manifest, tmp_path / "copy")

    assert (result.seq, result.files) == (manifest.seq, len(manifest.files))
    assert result.bytes == sum(length for _, length in manifest.files)
    with Queue(tmp_path / "copy") as copy:
        assert state_of(copy) == expected
    queue.close()


def test_a_queue_never_compacted_is_compacted_first_so_the_copy_has_a_current(tmp_path):
    queue = busy_queue(tmp_path / "source", compact=False)
    assert queue.stats().snapshot_seq == 0
    manifest = queue.backup_manifest()
    assert queue.stats().snapshot_seq == manifest.seq
    names = [name for name, _ in manifest.files]
    assert names[-1] == "CURRENT" and names[-2] == f"snapshot-{manifest.seq:020d}.snap"
    expected = state_of(queue)
    more_writes(queue)
    copy_manifest(manifest, tmp_path / "copy")
    with Queue(tmp_path / "copy") as copy:
        assert state_of(copy) == expected
    queue.close()


def test_an_empty_queue_copies_as_one_empty_segment(tmp_path):
    with Queue(tmp_path / "source") as queue:
        manifest = queue.backup_manifest()
        assert manifest.files == (("wal-00000000000000000001.log", 0),)
        copy_manifest(manifest, tmp_path / "copy")
    with Queue(tmp_path / "copy") as copy:
        assert state_of(copy) == ([], 0)


def test_the_manifest_lists_sealed_segments_a_stopped_compaction_left(tmp_path):
    source = tmp_path / "source"
    queue = busy_queue(source)
    queue.put("x", {})

    def crash_after_write(phase):
        if phase == "snapshot.after_write":
            raise RuntimeError("power cut")

    queue.engine._store.hook = crash_after_write
    with pytest.raises(RuntimeError):
        queue.compact()
    with Queue(source) as reopened:  # CURRENT names the old snapshot; two segments follow it
        manifest = reopened.backup_manifest()
        segments = [name for name, _ in manifest.files if name.startswith("wal-")]
        assert len(segments) == 2
        expected = state_of(reopened)
        more_writes(reopened)
        copy_manifest(manifest, tmp_path / "copy")
    with Queue(tmp_path / "copy") as copy:
        assert state_of(copy) == expected


def test_only_the_manifest_length_of_a_preallocated_active_segment_is_copied(tmp_path):
    queue = busy_queue(tmp_path / "source")
    manifest = queue.backup_manifest()
    expected = state_of(queue)
    active, length = next((name, length) for name, length in manifest.files
                          if name.startswith("wal-"))
    assert length > 0
    # What a preallocating writer leaves: zeros past the complete frames.
    os.truncate(tmp_path / "source" / active, length + 64 * 1024)

    copy_manifest(manifest, tmp_path / "copy")

    assert (tmp_path / "copy" / active).stat().st_size == length
    report = verify_directory(tmp_path / "copy")
    assert not report.problems, report.render()
    with Queue(tmp_path / "copy") as copy:
        assert state_of(copy) == expected
    queue.close()


def test_a_copy_verifies_clean_and_has_the_documented_modes(tmp_path):
    queue = busy_queue(tmp_path / "source")
    manifest = queue.backup_manifest()
    old_umask = os.umask(0o077)
    try:
        copy_manifest(manifest, tmp_path / "copy")
    finally:
        os.umask(old_umask)
    queue.close()
    report = verify_directory(tmp_path / "copy")
    assert not report.corrupt and not report.unreadable and not report.problems, report.render()
    assert stat.S_IMODE((tmp_path / "copy").stat().st_mode) == 0o750
    copied = sorted((path.name, path.stat().st_size) for path in (tmp_path / "copy").iterdir())
    assert copied == sorted(manifest.files)  # no LOCK, no CURRENT.tmp, no socket
    for path in (tmp_path / "copy").iterdir():
        assert stat.S_IMODE(path.stat().st_mode) == 0o640, path.name


def test_an_existing_empty_directory_is_used_and_keeps_its_mode(tmp_path):
    queue = busy_queue(tmp_path / "source")
    (tmp_path / "copy").mkdir(mode=0o700)
    copy_manifest(queue.backup_manifest(), tmp_path / "copy")
    queue.close()
    assert stat.S_IMODE((tmp_path / "copy").stat().st_mode) == 0o700
    assert not verify_directory(tmp_path / "copy").corrupt


@pytest.mark.parametrize("occupant", ["file", "directory", "dest_is_a_file"])
def test_a_destination_that_is_not_new_or_empty_is_refused_untouched(tmp_path, occupant):
    queue = busy_queue(tmp_path / "source")
    dest = tmp_path / "copy"
    if occupant == "dest_is_a_file":
        dest.write_text("precious")
    else:
        dest.mkdir()
        if occupant == "file":
            (dest / "notes.txt").write_text("precious")
        else:
            (dest / "sub").mkdir()
    before = sorted(str(path) for path in tmp_path.rglob("*") if "source" not in path.parts)

    with pytest.raises(DestinationNotEmpty, match="never overwrite"):
        copy_manifest(queue.backup_manifest(), dest)

    assert sorted(str(path) for path in tmp_path.rglob("*") if "source" not in path.parts) == before
    if occupant == "file":
        assert (dest / "notes.txt").read_text() == "precious"
    queue.close()


@pytest.mark.parametrize("failing", ["wal-", "snapshot-", "CURRENT"])
def test_a_copy_that_fails_half_way_never_opens_as_a_queue(tmp_path, failing):
    queue = busy_queue(tmp_path / "source")
    manifest = queue.backup_manifest()
    queue.close()
    real_copy = backup_module._copy_file

    def copy_until(source, target, length, source_path):
        if os.path.basename(target).startswith(failing):
            # Half the file, then the disk fills up.
            real_copy(source, target, length // 2, source_path)
            raise OSError(28, "No space left on device")
        real_copy(source, target, length, source_path)

    with mock.patch.object(backup_module, "_copy_file", copy_until):
        with pytest.raises(BackupIncomplete, match="delete it and back up again") as caught:
            copy_manifest(manifest, tmp_path / "copy")
    assert isinstance(caught.value.__cause__, OSError)
    assert not (tmp_path / "copy" / "CURRENT").exists()
    assert verify_directory(tmp_path / "copy").corrupt
    with pytest.raises(CorruptStore, match="sequence gap"):
        Queue(tmp_path / "copy")


def test_a_destination_inside_the_queue_directory_is_refused(tmp_path):
    queue = busy_queue(tmp_path / "source")
    with pytest.raises(BackupError, match="outside"):
        copy_manifest(queue.backup_manifest(), tmp_path / "source" / "backups")
    assert not (tmp_path / "source" / "backups").exists()
    queue.close()


def test_ctl_backup_into_the_queue_directory_exits_2_and_releases_the_pin(fake, tmp_path):
    result = CliRunner().invoke(cli, ["backup", str(tmp_path / "source" / "copy")])
    assert result.exit_code == ctl_errors.EXIT_USAGE and "outside" in result.stderr
    assert fake.calls == ["backup_begin", "backup_end"]


def test_an_unreadable_source_file_writes_nothing(tmp_path):
    queue = busy_queue(tmp_path / "source")
    manifest = queue.backup_manifest()
    queue.close()
    snapshot = next(name for name, _ in manifest.files if name.startswith("snapshot-"))
    os.unlink(tmp_path / "source" / snapshot)
    with pytest.raises(SourceUnreadable, match=snapshot):
        copy_manifest(manifest, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


@pytest.mark.parametrize("files", [
    (("../../etc/passwd", 10),),
    (("wal-00000000000000000001.log", -1),),
    (("wal-00000000000000000001.log", 5),),                      # records without a snapshot
    (("wal-00000000000000000002.log", 0), ("CURRENT", 10)),      # CURRENT without its snapshot
    (("snapshot-00000000000000000001.snap", 10), ("CURRENT", 10)),  # no segment
    (("wal-00000000000000000001.log", 0), ("wal-00000000000000000001.log", 0)),
])
def test_a_manifest_that_cannot_describe_a_queue_writes_nothing(tmp_path, files):
    manifest = BackupManifest(str(tmp_path / "source"), 1, files)
    with pytest.raises(BackupError):
        copy_manifest(manifest, tmp_path / "copy")
    assert not (tmp_path / "copy").exists()


def test_offline_backup_holds_the_lock_and_refuses_a_served_queue(tmp_path):
    queue = busy_queue(tmp_path / "source")
    with pytest.raises(QueueLocked):
        backup_directory(tmp_path / "source", tmp_path / "copy")
    assert not (tmp_path / "copy").exists()
    expected = state_of(queue)
    queue.close()
    result = backup_directory(tmp_path / "source", tmp_path / "copy")
    assert result.seq == expected[1]
    with Queue(tmp_path / "copy") as copy:
        assert state_of(copy) == expected


def test_offline_backup_command_line(tmp_path, capsys):
    busy_queue(tmp_path / "source").close()
    assert backup_module.main([str(tmp_path / "source"), str(tmp_path / "copy")]) == 0
    printed = json.loads(capsys.readouterr().out)
    assert printed["directory"] == str(tmp_path / "copy") and printed["files"] == 3
    assert backup_module.main([str(tmp_path / "source"), str(tmp_path / "copy")]) == 1
    assert "not empty" in capsys.readouterr().err


# -- walqueue-ctl backup / pause / resume against an in-process fake daemon --------------


class FakeDaemon:
    """The few Client calls backup and pause use, over an in-process Queue."""

    def __init__(self, queue: Queue) -> None:
        self.queue = queue
        self.paused = False
        self.pinned = False
        self.calls: list[str] = []

    def client(self, path, **options):
        return self

    def backup_begin(self):
        self.calls.append("backup_begin")
        assert not self.pinned
        self.pinned = True
        manifest = self.queue.backup_manifest()
        more_writes(self.queue)  # the daemon keeps serving while the ctl copies
        return manifest

    def backup_end(self):
        self.calls.append("backup_end")
        assert self.pinned
        self.pinned = False

    def pause(self):
        self.paused = True
        return True

    def resume(self):
        self.paused = False
        return False

    def close(self):
        pass


@pytest.fixture
def fake(monkeypatch, tmp_path):
    daemon = FakeDaemon(busy_queue(tmp_path / "source"))
    monkeypatch.setattr(backends, "CLIENT_FACTORY", daemon.client)
    monkeypatch.delenv("WALQUEUE_SOCKET", raising=False)
    yield daemon
    daemon.queue.close()


def test_ctl_backup_copies_verifies_releases_the_pin_and_prints_json(fake, tmp_path):
    expected = state_of(fake.queue)
    result = CliRunner().invoke(cli, ["backup", str(tmp_path / "copy"), "--json"],
                                catch_exceptions=False)
    assert result.exit_code == EXIT_OK, result.output
    printed = json.loads(result.stdout)
    assert printed["seq"] == expected[1] and printed["directory"] == str(tmp_path / "copy")
    assert printed["bytes"] == sum(path.stat().st_size for path in (tmp_path / "copy").iterdir())
    assert fake.calls == ["backup_begin", "backup_end"] and not fake.pinned
    fake.queue.close()
    with Queue(tmp_path / "copy") as copy:
        assert state_of(copy) == expected


def test_ctl_backup_into_a_non_empty_directory_exits_9_before_asking_the_daemon(fake, tmp_path):
    (tmp_path / "copy").mkdir()
    (tmp_path / "copy" / "keep").write_text("x")
    result = CliRunner().invoke(cli, ["backup", str(tmp_path / "copy")])
    assert result.exit_code == EXIT_DEST_NOT_EMPTY
    assert "not empty" in result.stderr and fake.calls == []


def test_ctl_backup_releases_the_pin_when_the_copy_fails(fake, tmp_path):
    with mock.patch.object(backup_module, "_copy_file", side_effect=OSError(28, "No space left")):
        result = CliRunner().invoke(cli, ["backup", str(tmp_path / "copy")])
    assert result.exit_code == ctl_errors.EXIT_BACKUP_INCOMPLETE
    assert "incomplete" in result.stderr and "delete it" in result.stderr
    assert fake.calls == ["backup_begin", "backup_end"]


def test_ctl_backup_that_cannot_read_the_queue_says_whom_to_run_as(fake, tmp_path):
    real_open = os.open

    def denied(path, flags, *args, **kwargs):
        if os.fspath(path).startswith(str(tmp_path / "source")):
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, flags, *args, **kwargs)

    with mock.patch.object(backup_module.os, "open", denied):
        result = CliRunner().invoke(cli, ["backup", str(tmp_path / "copy")])
    assert result.exit_code == ctl_errors.EXIT_UNREADABLE
    assert "Permission denied" in result.stderr and "member of its group" in result.stderr
    assert not (tmp_path / "copy").exists()  # nothing written
    assert fake.calls == ["backup_begin", "backup_end"]


def test_ctl_pause_and_resume_print_the_paused_state(fake):
    runner = CliRunner()
    assert json.loads(runner.invoke(cli, ["pause"]).stdout) == {"paused": True}
    assert fake.paused
    assert json.loads(runner.invoke(cli, ["resume"]).stdout) == {"paused": False}
    assert not fake.paused


def test_ctl_help_documents_the_backup_exit_codes():
    text = CliRunner().invoke(cli, ["backup", "--help"]).output
    for line in ("9  backup: DEST exists", "10  backup: the copy failed or was interrupted half way"):
        assert line in text


def copy_then(stop: BaseException, after: str):
    """A _copy_file that copies half of the file named `after...` and then raises `stop`."""
    real_copy = backup_module._copy_file

    def copy(source, target, length, source_path):
        if os.path.basename(target).startswith(after):
            real_copy(source, target, length // 2, source_path)
            raise stop
        real_copy(source, target, length, source_path)

    return copy


@pytest.mark.parametrize("failing", ["wal-", "snapshot-", "CURRENT"])
def test_a_copy_killed_half_way_is_an_incomplete_backup_to_verify_not_a_corrupt_queue(tmp_path, failing):
    """Issue 23: a backup stopped half way made verify say "CORRUPT ... keep as evidence"."""
    from walqueue import InjectedCrash
    from walqueue.ctl.offline import verify as verify_command

    queue = busy_queue(tmp_path / "source")
    manifest = queue.backup_manifest()
    queue.close()
    # InjectedCrash stands for SIGKILL or a power cut: no cleanup runs, what is on disk stays.
    with mock.patch.object(backup_module, "_copy_file", copy_then(InjectedCrash("killed"), failing)):
        with pytest.raises(InjectedCrash):
            copy_manifest(manifest, tmp_path / "copy")
    report = verify_directory(tmp_path / "copy")
    assert report.incomplete_backup and not report.healthy
    assert report.exit_code() == ctl_errors.EXIT_BACKUP_INCOMPLETE
    text = report.render()
    assert "INCOMPLETE BACKUP" in text and "run walqueue-ctl backup again" in text
    assert "CORRUPT" not in text and "evidence" not in text
    result = CliRunner().invoke(cli, ["verify", str(tmp_path / "copy")])
    assert result.exit_code == ctl_errors.EXIT_BACKUP_INCOMPLETE and "INCOMPLETE BACKUP" in result.stdout
    assert "10  " in verify_command.epilog
    with pytest.raises(CorruptStore):  # and it still never opens as a queue
        Queue(tmp_path / "copy")


def test_a_finished_copy_carries_no_marker(tmp_path):
    queue = busy_queue(tmp_path / "source")
    copy_manifest(queue.backup_manifest(), tmp_path / "copy")
    queue.close()
    assert not (tmp_path / "copy" / "BACKUP-INCOMPLETE").exists()
    assert verify_directory(tmp_path / "copy").healthy


@pytest.mark.parametrize("existing", [False, True], ids=["new-dest", "empty-dest"])
def test_a_ctrl_c_during_the_copy_removes_what_it_wrote(tmp_path, existing):
    queue = busy_queue(tmp_path / "source")
    manifest = queue.backup_manifest()
    queue.close()
    if existing:
        (tmp_path / "copy").mkdir()
    with mock.patch.object(backup_module, "_copy_file", copy_then(KeyboardInterrupt(), "snapshot-")):
        with pytest.raises(KeyboardInterrupt):
            copy_manifest(manifest, tmp_path / "copy")
    if existing:
        assert list((tmp_path / "copy").iterdir()) == []
    else:
        assert not (tmp_path / "copy").exists()


def test_ctl_backup_interrupted_says_what_it_left_and_releases_the_pin(fake, tmp_path):
    with mock.patch.object(backup_module, "_copy_file", copy_then(KeyboardInterrupt(), "wal-")):
        result = CliRunner().invoke(cli, ["backup", str(tmp_path / "copy")])
    assert result.exit_code == ctl_errors.EXIT_BACKUP_INCOMPLETE, result.output
    assert "backup interrupted" in result.stderr and "was removed" in result.stderr
    assert not (tmp_path / "copy").exists()
    assert fake.calls == ["backup_begin", "backup_end"] and not fake.pinned
