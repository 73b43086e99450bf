"""The queue directory is reached once and judged on the descriptors the walk holds.

The attack (issue 20 item 1): the safety check judged the directory's
resolved path, then the Queue opened the original path; an attacker who can
write a directory on the way flipped a symbolic link in between, and a root
walqueued served the attacker's directory. Each test here fails on the code
before walqueue.directory: a link in a directory others may write was not a
finding at all, and a link flipped after the check redirected the open.
"""

from __future__ import annotations

import logging
import os
import stat
from pathlib import Path

import pytest

from walqueue import CorruptStore, Queue
from walqueue.daemon import cli as daemon_cli
from walqueue.daemon.exits import EXIT_DIRECTORY_UNSAFE, EXIT_DIRECTORY_UNUSABLE
from walqueue.directory import LAST, NEVER, PARENTS, check_directory_safety, open_queue_directory

ROOT = os.geteuid() == 0
OTHER_UID = 12345


def reached(path, **options):
    opened = open_queue_directory(path, **options)
    if opened.directory is not None:
        os.close(opened.directory.fd)
    return opened


# -- the walk ---------------------------------------------------------------------------------


@pytest.mark.parametrize("relative", ["q", "a/../q", "./link/./b/../../q", "link/b", "abslink", "a/up/q"])
def test_the_walk_reaches_what_the_kernel_reaches(tmp_path, monkeypatch, relative):
    (tmp_path / "q").mkdir()
    (tmp_path / "a" / "b").mkdir(parents=True)
    (tmp_path / "link").symlink_to("a")
    (tmp_path / "abslink").symlink_to(tmp_path / "q")
    (tmp_path / "a" / "up").symlink_to("..")
    monkeypatch.chdir(tmp_path)
    opened = reached(relative)
    assert opened.directory.path == os.path.realpath(relative)
    assert opened.findings == () and not opened.created


def test_a_link_loop_and_a_file_on_the_way_are_errors_naming_the_path(tmp_path):
    (tmp_path / "loop").symlink_to("loop")
    with pytest.raises(OSError, match="symbolic links"):
        reached(tmp_path / "loop" / "q")
    (tmp_path / "file").write_text("")
    with pytest.raises(NotADirectoryError, match=f"{tmp_path}/file is not a directory"):
        reached(tmp_path / "file" / "q")


def test_a_link_in_a_directory_others_may_write_is_a_finding_naming_it(tmp_path):
    """The issue's attack as the walk sees it: the link points at a safe directory, but
    whoever may write the directory holding the link decides where the path leads."""
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o750)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "queue").symlink_to(safe)
    (finding,) = check_directory_safety(shared / "queue")
    assert finding.startswith(f"{shared}, which holds the symbolic link {shared}/queue")
    assert "writable by its group and others (mode 0777)" in finding
    assert check_directory_safety(safe) == []


@pytest.mark.skipif(not ROOT, reason="a link owned by another user needs root")
def test_in_a_root_sticky_directory_only_a_link_of_roots_or_the_users_is_trusted(tmp_path):
    sticky = tmp_path / "tmp-like"
    sticky.mkdir()
    sticky.chmod(0o777 | stat.S_ISVTX)
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o750)
    link = sticky / "queue"
    link.symlink_to(safe)
    assert check_directory_safety(link) == []
    os.lchown(link, OTHER_UID, OTHER_UID)
    (finding,) = check_directory_safety(link)
    assert f"the symbolic link {link} on the way to the queue directory is owned by uid {OTHER_UID}" in finding


# -- creating ----------------------------------------------------------------------------------


def test_last_creates_only_the_last_component_and_never_on_an_unsafe_way(tmp_path):
    with pytest.raises(FileNotFoundError, match=f"{tmp_path}/missing does not exist"):
        reached(tmp_path / "missing" / "queue", create=LAST)
    assert not (tmp_path / "missing").exists()
    opened = reached(tmp_path / "queue", create=LAST)
    assert opened.created and stat.S_IMODE((tmp_path / "queue").stat().st_mode) == 0o750
    assert not reached(tmp_path / "queue", create=LAST).created
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    refused = reached(shared / "queue", create=LAST)
    assert refused.directory is None and not refused.created
    assert f"{shared}, a parent of {shared}/queue, is writable" in refused.findings[0]
    assert os.listdir(shared) == []


def test_never_creates_nothing_and_parents_creates_the_whole_path(tmp_path):
    with pytest.raises(FileNotFoundError):
        reached(tmp_path / "a", create=NEVER)
    assert reached(tmp_path / "a" / "b" / "c", create=PARENTS).created
    assert (tmp_path / "a" / "b" / "c").is_dir()


# -- the Queue uses what was judged -------------------------------------------------------------


def test_a_queue_keeps_writing_where_it_was_opened_when_the_path_is_flipped(tmp_path):
    first, second = tmp_path / "first", tmp_path / "second"
    first.mkdir(mode=0o750)
    second.mkdir(mode=0o750)
    link = tmp_path / "queue"
    link.symlink_to(first)
    with Queue(link) as queue:
        link.unlink()
        link.symlink_to(second)
        queue.put("a", {})
        queue.compact()
        queue.put("b", {})
    assert os.listdir(second) == []
    with Queue(first) as queue:
        assert [task.task_id for task in queue.tasks()] == ["a", "b"]


@pytest.mark.skipif(not ROOT, reason="a file owned by another user needs root")
def test_a_file_another_user_owns_is_refused_before_anything_is_read_or_written(tmp_path):
    directory = tmp_path / "queue"
    with Queue(directory) as queue:
        queue.put("a", {})
    (segment,) = [name for name in os.listdir(directory) if name.startswith("wal-")]
    before = (directory / segment).read_bytes()
    os.chown(directory / segment, OTHER_UID, OTHER_UID)
    with pytest.raises(CorruptStore, match=f"{segment}: is owned by uid {OTHER_UID}, not by uid 0") as caught:
        Queue(directory)
    assert caught.value.file == segment
    assert (directory / segment).read_bytes() == before


def test_an_entry_of_the_wrong_type_is_refused_at_once_not_waited_on(tmp_path):
    """A FIFO under a name the queue reads would block open() for ever (issue 20 item 10)."""
    from walqueue.fs import NotARegularFile

    directory = tmp_path / "queue"
    Queue(directory).close()
    os.mkfifo(directory / "CURRENT")
    with pytest.raises(NotARegularFile, match="CURRENT is a FIFO, not a file"):
        Queue(directory)
    os.unlink(directory / "CURRENT")
    os.mkdir(directory / "CURRENT")
    with pytest.raises(NotARegularFile, match="CURRENT is a directory") as caught:
        Queue(directory)
    assert isinstance(caught.value, IsADirectoryError) or caught.value.errno == 21


# -- the daemon ---------------------------------------------------------------------------------


class _Served(Exception):
    """Raised by the fake Loop: the daemon got as far as serving."""


@pytest.fixture
def serve(monkeypatch):
    """serve_directory(directory) up to the Loop it would run; returns its exit code, or the
    opened Queue when it got as far as serving."""
    monkeypatch.delenv("LISTEN_FDS", raising=False)
    monkeypatch.delenv("NOTIFY_SOCKET", raising=False)
    served = {}

    class FakeLoop:
        def __init__(self, directory, queue, listener, **options):
            served["queue"], served["listener"] = queue, listener

        def run(self):
            raise _Served

    monkeypatch.setattr(daemon_cli, "Loop", FakeLoop)

    def run(directory: Path, socket_path: Path | None = None):
        try:
            return daemon_cli.serve_directory(str(directory), socket_path=socket_path and str(socket_path),
                                              mode=0o600, compact_wal_bytes=10**9, max_connections=4,
                                              hook=None)
        except _Served:
            served["queue"].close()
            served["listener"].close()
            return "served"

    return run


def test_walqueued_serves_the_directory_it_judged_though_the_link_is_flipped_before_the_open(
        tmp_path, serve, monkeypatch):
    """Deterministically what the attacker raced for: the link is flipped to another
    directory after the judgment, just before the Queue is opened. The old daemon then
    opened the other one by its path; now the Queue gets the judged descriptor."""
    judged, other = tmp_path / "judged", tmp_path / "other"
    judged.mkdir(mode=0o750)
    other.mkdir(mode=0o750)
    link = tmp_path / "queue"
    link.symlink_to(judged)
    real_open = daemon_cli.open_reporting_progress

    def flip_then_open(*args, **options):
        link.unlink()
        link.symlink_to(other)
        return real_open(*args, **options)

    monkeypatch.setattr(daemon_cli, "open_reporting_progress", flip_then_open)
    assert serve(link) == "served"
    assert os.listdir(other) == []
    assert "LOCK" in os.listdir(judged) and "walqueued.sock" in os.listdir(judged)


def test_walqueued_refuses_a_path_through_a_link_others_may_replace(tmp_path, serve):
    safe = tmp_path / "safe"
    safe.mkdir(mode=0o750)
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o777)
    (shared / "queue").symlink_to(safe)
    assert serve(shared / "queue") == EXIT_DIRECTORY_UNSAFE
    assert os.listdir(safe) == []


@pytest.mark.skipif(not ROOT, reason="a file owned by another user needs root")
def test_walqueued_refuses_a_directory_holding_another_users_file_with_exit_6(tmp_path, serve):
    """A root daemon appended to a WAL segment the attacker had planted and still owned."""
    directory = tmp_path / "queue"
    Queue(directory).close()
    (segment,) = [name for name in os.listdir(directory) if name.startswith("wal-")]
    os.chown(directory / segment, OTHER_UID, OTHER_UID)
    assert serve(directory) == EXIT_DIRECTORY_UNSAFE
    assert sorted(os.listdir(directory)) == ["LOCK", segment]
    assert (directory / segment).stat().st_size == 0


def test_walqueued_creates_a_missing_last_component_only(tmp_path, serve, caplog):
    caplog.set_level(logging.INFO, logger="walqueued")
    assert serve(tmp_path / "typo" / "queue") == EXIT_DIRECTORY_UNUSABLE
    assert os.listdir(tmp_path) == []
    assert "typo does not exist" in caplog.text
    assert serve(tmp_path / "queue") == "served"
    assert f"created a new, empty queue at {tmp_path}/queue" in caplog.text


def test_walqueued_creates_nothing_when_its_socket_is_in_use(tmp_path, serve):
    import socket

    live = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    live.bind(str(tmp_path / "live.sock"))
    live.listen()
    try:
        assert serve(tmp_path / "queue", tmp_path / "live.sock") == 3
    finally:
        live.close()
    assert os.listdir(tmp_path) == ["live.sock"]
