"""Links and foreign owners in the queue directory cannot redirect the library's writes.

A user who can write into a queue directory (issue 12) could plant a
symbolic or hard link where the library will write -- LOCK, a segment,
CURRENT.tmp, a snapshot, CURRENT -- and have a process with more rights
write through it. For every file the library writes, a link there to a
"victim" file outside the directory leaves the victim's bytes unchanged:
the library either refuses with CorruptStore naming the file, or replaces
the link by a file of its own. `check_directory_safety` names what lets
another user into the directory, and Queue warns about it.
"""

from __future__ import annotations

import os
import stat
import warnings
from pathlib import Path

import pytest

from walqueue import CorruptStore, Queue
from walqueue.directory import check_directory_safety
from walqueue.errors import UnsafeDirectoryWarning
from walqueue.verify import CORRUPT, verify_directory

from .frames import snapshot_name, wal_name

VICTIM_BYTES = b"root's precious file\n"


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "victim"
    path.write_bytes(VICTIM_BYTES)
    return path


@pytest.fixture
def directory(tmp_path) -> Path:
    return tmp_path / "queue"


def queue_with_tasks(directory: Path) -> None:
    with Queue(directory) as q:
        q.put("a", {"n": 1})
        q.put("b", {"n": 2})


def assert_refused(directory: Path, name: str, error: CorruptStore) -> None:
    assert error.file == name and str(error).startswith(f"{name}: is a symbolic link"), error
    assert str(directory) in str(error)


def test_a_linked_lock_file_is_refused_and_its_target_not_created(directory, tmp_path):
    directory.mkdir()
    (directory / "LOCK").symlink_to(tmp_path / "would-be-created")
    with pytest.raises(CorruptStore) as caught:
        Queue(directory)
    assert_refused(directory, "LOCK", caught.value)
    assert not (tmp_path / "would-be-created").exists()
    assert sorted(path.name for path in directory.iterdir()) == ["LOCK"]  # nothing else made


def test_a_linked_lock_file_to_an_existing_file_leaves_it_unchanged(directory, victim):
    directory.mkdir()
    (directory / "LOCK").symlink_to(victim)
    with pytest.raises(CorruptStore, match="LOCK: is a symbolic link"):
        Queue(directory)
    assert victim.read_bytes() == VICTIM_BYTES


def test_a_linked_active_segment_is_refused_at_open_and_by_verify(directory, victim):
    queue_with_tasks(directory)
    segment = directory / wal_name(1)
    victim.write_bytes(segment.read_bytes())  # even a victim that looks like a segment
    before = victim.read_bytes()
    segment.unlink()
    segment.symlink_to(victim)
    with pytest.raises(CorruptStore) as caught:
        Queue(directory)
    assert_refused(directory, wal_name(1), caught.value)
    assert victim.read_bytes() == before
    (problem,) = verify_directory(directory).by_severity(CORRUPT)
    assert (problem.file, problem.offset) == (wal_name(1), None) and "symbolic link" in problem.what


def test_a_hard_linked_active_segment_is_refused_before_anything_is_written(directory, tmp_path):
    queue_with_tasks(directory)
    segment = directory / wal_name(1)
    other = tmp_path / "other-name"
    os.link(segment, other)
    before = other.read_bytes()
    with open(segment, "ab") as file:
        file.write(b"\x00\x00")  # a torn tail open would otherwise truncate, through the link
    with pytest.raises(CorruptStore, match=rf"{wal_name(1)}: has 2 hard links"):
        Queue(directory)
    assert other.read_bytes() == before + b"\x00\x00"  # not truncated


def test_a_link_planted_where_rotation_creates_the_next_segment_is_refused(directory, victim):
    queue_with_tasks(directory)
    q = Queue(directory)
    (directory / wal_name(3)).symlink_to(victim)  # seq 2 is the last: the next segment is 3
    with pytest.raises(CorruptStore) as caught:
        q.compact()
    assert_refused(directory, wal_name(3), caught.value)
    assert victim.read_bytes() == VICTIM_BYTES


def test_a_dangling_link_planted_where_rotation_creates_the_next_segment_creates_nothing(
        directory, tmp_path):
    queue_with_tasks(directory)
    q = Queue(directory)
    (directory / wal_name(3)).symlink_to(tmp_path / "would-be-created")
    with pytest.raises(CorruptStore, match="is a symbolic link"):
        q.compact()
    assert not (tmp_path / "would-be-created").exists()


@pytest.mark.parametrize("name", ["CURRENT.tmp", snapshot_name(2)])
def test_a_link_where_compaction_writes_is_replaced_by_a_file_of_its_own(directory, victim, name):
    """CURRENT.tmp and a same-seq orphan snapshot are what a crash leaves: compaction
    unlinks whatever has the name (never following it) and creates a new file."""
    queue_with_tasks(directory)
    with Queue(directory) as q:
        (directory / name).symlink_to(victim)
        assert q.compact() == 2
    assert victim.read_bytes() == VICTIM_BYTES
    assert not (directory / name).is_symlink()
    with Queue(directory) as reopened:
        assert reopened.stats().snapshot_seq == 2 and reopened.get("b") is not None


def test_publishing_over_a_linked_current_replaces_the_link(directory, victim):
    queue_with_tasks(directory)
    with Queue(directory) as q:
        (directory / "CURRENT").symlink_to(victim)
        q.compact()
    assert victim.read_bytes() == VICTIM_BYTES and not (directory / "CURRENT").is_symlink()


@pytest.mark.parametrize("target", ["CURRENT", "snapshot"])
def test_a_linked_current_or_snapshot_is_refused_at_open(directory, tmp_path, target):
    queue_with_tasks(directory)
    with Queue(directory) as q:
        q.compact()
    name = "CURRENT" if target == "CURRENT" else snapshot_name(2)
    moved = tmp_path / "moved"
    (directory / name).rename(moved)
    (directory / name).symlink_to(moved)
    with pytest.raises(CorruptStore) as caught:
        Queue(directory)
    assert_refused(directory, name, caught.value)
    assert verify_directory(directory).by_severity(CORRUPT)[0].file == name


def test_a_linked_queue_directory_path_is_followed(tmp_path):
    """The directory's own path is the caller's choice; only files in it are guarded."""
    real = tmp_path / "real"
    queue_with_tasks(real)
    (tmp_path / "alias").symlink_to(real)
    with Queue(tmp_path / "alias") as q:
        assert q.get("a") is not None


# -- check_directory_safety ----------------------------------------------------------------------


def test_a_private_directory_has_no_findings_and_opens_without_warning(directory):
    directory.mkdir(mode=0o750)
    assert check_directory_safety(directory) == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", UnsafeDirectoryWarning)
        Queue(directory).close()


def test_a_directory_writable_by_others_is_named_with_the_chmod_that_fixes_it(directory):
    directory.mkdir()
    directory.chmod(0o777)
    (finding,) = check_directory_safety(directory)
    assert "writable by its group and others (mode 0777)" in finding
    assert finding.endswith(f"chmod go-w {directory}")
    with pytest.warns(UnsafeDirectoryWarning, match="writable by its group and others"):
        Queue(directory).close()


def test_a_parent_writable_by_others_is_named_unless_root_owned_and_sticky(tmp_path):
    parent = tmp_path / "shared"
    parent.mkdir()
    queue = parent / "queue"
    queue.mkdir(mode=0o700)
    parent.chmod(0o777)
    findings = check_directory_safety(queue)
    owned_by_root = parent.stat().st_uid == 0
    if owned_by_root:
        assert len(findings) == 1 and f"{parent}, a parent of {queue}" in findings[0]
        parent.chmod(0o777 | stat.S_ISVTX)  # like /tmp
        assert check_directory_safety(queue) == []
    else:
        assert any(f"{parent}, a parent" in finding for finding in findings)


@pytest.mark.skipif(os.geteuid() != 0, reason="giving a directory to another user needs root")
def test_a_directory_or_parent_owned_by_another_user_is_named(tmp_path):
    parent = tmp_path / "home-of-someone"
    parent.mkdir(mode=0o755)
    queue = parent / "queue"
    queue.mkdir(mode=0o700)
    os.chown(queue, 12345, 12345)
    (finding,) = check_directory_safety(queue)
    assert "is owned by uid 12345" in finding and finding.endswith(f"chown root {queue}")
    os.chown(queue, 0, 0)
    os.chown(parent, 12345, 12345)
    (finding,) = check_directory_safety(queue)
    assert f"{parent}, a parent of {queue}, is owned by uid 12345" in finding


def test_write_access_for_the_owners_private_group_is_harmless_and_any_other_group_is_named(directory):
    """umask 002 systems make directories 0775 with the owner's private group: no one else
    can write through it; a shared group can."""
    import grp
    import pwd

    user = pwd.getpwuid(os.geteuid())
    try:
        private = grp.getgrgid(user.pw_gid)
    except KeyError:
        pytest.skip("the user's primary group has no entry")
    if private.gr_name != user.pw_name or set(private.gr_mem) - {user.pw_name}:
        pytest.skip(f"the user's primary group {private.gr_name} is not a private group")
    directory.mkdir()
    directory.chmod(0o770)
    assert check_directory_safety(directory) == []
    if os.geteuid() == 0:  # giving the directory to another group needs root
        os.chown(directory, -1, 12345)
        (finding,) = check_directory_safety(directory)
        assert "writable by its group (mode 0770)" in finding
