"""walqueue-ctl backup, pause and resume against a real walqueued.

The backup test runs seeded worker processes against the daemon, backs up
in the middle, and then rebuilds the state as of the backup's seq from the
source directory's own records (the snapshot CURRENT names, then each WAL
record up to that seq, applied one by one): the copy must open with exactly
that state, and verify clean. The pin tests hold a real walqueue-ctl in the
middle of its copy (tests/process/stalled_ctl.py) and kill it by pid.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import os
import signal
import subprocess
import sys

import pytest

from walqueue import InvalidRequest, Queue, TaskView
from walqueue.client import Client, aio
from walqueue.codec import scan_frames
from walqueue.ctl.errors import EXIT_USAGE
from walqueue.fs import OsFileSystem
from walqueue.snapshot import load_snapshot, read_current
from walqueue.wal import list_segments

from .daemon import REPO, STOP_SECONDS, child_env, sigint_at_its_default, wait_until
from .test_ctl_process import ctl, json_lines

SEED = int(os.environ.get("WALQUEUE_TEST_SEED", "20261129"))
WORKERS = 3
# A bound only: the load runs until the test closes its stdin, well after the backup.
REQUESTS_PER_WORKER = 1_000_000
# Records the load writes before the compaction, between it and the backup, and after the backup.
RECORDS_BETWEEN = 150
# Never compact on its own: the source directory must keep every record
# after the snapshot, so the expected state can be rebuilt from it.
NO_AUTOMATIC_COMPACTION = ("--compact-wal-bytes", str(2**40))


def replay(directory, seq: int) -> list[TaskView]:
    """The tasks as of `seq`, rebuilt from `directory`'s snapshot and WAL records."""
    fs = OsFileSystem()
    handle = fs.open_directory(str(directory))
    snapshot_seq, snapshot_file = read_current(fs, handle)
    assert snapshot_seq <= seq, "the source was compacted past the backup's seq"
    state = load_snapshot(fs, handle, snapshot_file, snapshot_seq)
    fs.close_directory(handle)
    for _, name in list_segments(os.listdir(directory)):
        for frame in scan_frames((directory / name).read_bytes(), name):
            record = frame.value
            if snapshot_seq < record["seq"] <= seq:
                state.apply(record)
    assert state.last_seq == seq, f"the source holds records up to {state.last_seq}, not {seq}"
    fields = [field.name for field in dataclasses.fields(TaskView)]
    return [TaskView(**{name: entry[name] for name in fields}) for entry in state.entries()]


def test_a_backup_under_concurrent_load_opens_with_exactly_the_state_at_its_seq(make_daemon, workdir):
    print(f"seed {SEED} (set WALQUEUE_TEST_SEED to replay)")
    daemon = make_daemon(*NO_AUTOMATIC_COMPACTION)
    s = ("--socket", daemon.socket_path)
    load = [subprocess.Popen([sys.executable, "-m", "tests.process.backup_load", daemon.socket_path,
                              f"w{number}", str(SEED), str(REQUESTS_PER_WORKER)],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True, env=child_env(), cwd=REPO)
            for number in range(WORKERS)]
    try:
        def written(after_seq: int, records: int) -> bool:
            for process in load:
                if process.poll() is not None:
                    raise AssertionError(f"a load process ended early: {process.communicate()}")
            stats = client.stats()
            # Over a hundred tasks, too: the expected state below must be worth comparing.
            tasks = stats.ready + stats.leased + stats.completed + stats.dead
            return stats.last_seq - after_seq >= records and tasks > 100

        with Client(daemon.socket_path) as client:
            wait_until(lambda: written(0, RECORDS_BETWEEN), 60, "the load to write")
            compacted = json_lines(ctl(*s, "compact"))[0]["seq"]
            assert compacted > 0  # so the copy holds WAL records too
            wait_until(lambda: written(compacted, RECORDS_BETWEEN), 60, "records after the snapshot")
            backup = ctl(*s, "backup", workdir / "copy", "--json")
            assert backup.returncode == 0, backup.stderr
            (result,) = json_lines(backup)
            # The load goes on after the backup because the test waits for it to, not because
            # the load processes happened to get less of the CPU than walqueue-ctl.
            wait_until(lambda: written(result["seq"], RECORDS_BETWEEN), 60, "records after the backup")
        for process in load:
            out, err = process.communicate(timeout=120)  # closes its stdin: stop
            assert process.returncode == 0, err
    finally:
        for process in load:
            if process.poll() is None:
                process.kill()
                process.communicate(timeout=STOP_SECONDS)
    with Client(daemon.socket_path) as client:
        final_seq = client.stats().last_seq
    assert daemon.terminate() == 0
    seq = result["seq"]
    assert result["directory"] == str(workdir / "copy")
    assert 0 < seq < final_seq, "the load must go on after the backup, or the test proves little"
    copy_files = list((workdir / "copy").iterdir())  # before opening it makes a LOCK
    expected = replay(daemon.directory, seq)
    verify = ctl("verify", workdir / "copy")
    assert verify.returncode == 0, verify.stdout + verify.stderr
    with Queue(workdir / "copy") as copy:
        assert copy.stats().last_seq == seq
        assert list(copy.tasks()) == expected
    assert any(task.status == "leased" for task in expected) and len(expected) > 100
    assert result["files"] == len(copy_files) and result["bytes"] == sum(p.stat().st_size for p in copy_files)


def stalled_backup(daemon, dest) -> subprocess.Popen:
    """A real walqueue-ctl backup holding the daemon's pin in the middle of its copy."""
    process = subprocess.Popen([sys.executable, "-m", "tests.process.stalled_ctl", "--socket",
                                daemon.socket_path, "backup", str(dest)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=child_env(), cwd=REPO)
    line = process.stdout.readline()
    assert line.startswith("copying"), (line, process.stderr.read() if process.poll() is not None else "")
    return process


def test_a_backup_pins_its_files_until_its_ctl_dies(make_daemon, workdir):
    daemon = make_daemon("--compact-wal-bytes", "2000")
    s = ("--socket", daemon.socket_path)
    with Client(daemon.socket_path) as client:
        client.put("first", {})
        holder = stalled_backup(daemon, workdir / "copy")
        try:
            pinned = client.stats().snapshot_seq
            refused = ctl(*s, "compact")
            assert refused.returncode == EXIT_USAGE and "backup is in progress" in refused.stderr
            second = ctl(*s, "backup", workdir / "other")
            assert second.returncode == EXIT_USAGE and "already in progress" in second.stderr
            assert not (workdir / "other").exists() or not any((workdir / "other").iterdir())
            for index in range(40):  # well past --compact-wal-bytes: compaction is deferred
                client.put(f"t{index}", {"pad": "x" * 50})
            stats = client.stats()
            assert stats.snapshot_seq == pinned and stats.wal_bytes > 2000
        finally:
            os.kill(holder.pid, signal.SIGKILL)
            holder.communicate(timeout=STOP_SECONDS)
        daemon.wait_for_log("backup pin released")
        client.put("after", {"pad": "x" * 50})  # the first write after the pin compacts (in the background)
        wait_until(lambda: client.stats().snapshot_seq > pinned, 20, "the compaction after the pin")
        assert json_lines(ctl(*s, "compact"))[0]["seq"] == client.stats().last_seq
        assert ctl(*s, "backup", workdir / "again").returncode == 0


def test_backup_end_releases_the_pin_and_belongs_to_its_connection(daemon):
    with Client(daemon.socket_path) as holder, Client(daemon.socket_path) as other:
        holder.put("a", {})
        manifest = holder.backup_begin()
        assert manifest.seq == 1 and manifest.files[-1][0] == "CURRENT"
        with pytest.raises(InvalidRequest, match="backup is in progress"):
            other.compact()
        with pytest.raises(InvalidRequest, match="holds no backup pin"):
            other.backup_end()
        holder.backup_end()
        other.put("b", {})
        assert other.compact() == 2


def test_paused_reserves_get_nothing_while_writes_go_on(daemon, client_process):
    with Client(daemon.socket_path) as client:
        client.put("held-1", {})
        client.put("held-2", {})
        acked, released = client.reserve("w", lease_seconds=60, limit=2)
        assert client.pause() is True and client.pause() is True  # idempotent
        client.put("a", {})
        client.put("b", {})
        assert client.reserve("w", wait=0) == []
        first = client_process("reserve", daemon.socket_path, "first", 60)
        daemon.wait_for_log("parked reserve")
        second = client_process("reserve", daemon.socket_path, "second", 60)
        daemon.wait_for_log("parked reserve", count=2)
        # Acks, touches and releases go on; nothing is leased.
        client.ack(acked)
        released = client.touch(released, lease_seconds=120)
        client.release(released)
        assert client.get("held-1").status == "completed"
        assert [client.get(task).status for task in ("a", "b", "held-2")] == ["ready"] * 3
        assert client.stats().leased == 0
        # Resume serves the waiting reserves first, in arrival order (a and b
        # were due before held-2 was released).
        assert client.resume() is False and client.resume() is False
        assert json.loads(first.result(timeout=20)[1])["task_ids"] == ["a"]
        assert json.loads(second.result(timeout=20)[1])["task_ids"] == ["b"]
        assert [lease.task_id for lease in client.reserve("w")] == ["held-2"]


def test_a_parked_reserve_waits_through_the_pause_and_the_ctl_commands_work(daemon, client_process):
    s = ("--socket", daemon.socket_path)
    assert json_lines(ctl(*s, "pause")) == [{"paused": True}]
    waiting = client_process("reserve", daemon.socket_path, "w", 60)
    daemon.wait_for_log("parked reserve")
    assert json_lines(ctl(*s, "put", "job")) == [{"task_id": "job"}]
    assert ctl(*s, "reserve", "other").stdout == ""  # paused: nothing, exit 0
    assert json_lines(ctl(*s, "resume")) == [{"paused": False}]
    assert json.loads(waiting.result(timeout=20)[1])["task_ids"] == ["job"]


def test_a_daemon_restart_resumes(make_daemon):
    daemon = make_daemon()
    with Client(daemon.socket_path) as client:
        client.put("job", {})
        client.pause()
        assert client.reserve("w") == []
    assert daemon.terminate() == 0
    make_daemon()
    with Client(daemon.socket_path) as client:
        assert [lease.task_id for lease in client.reserve("w")] == ["job"]


def test_the_asyncio_client_pauses_resumes_and_begins_a_backup(daemon):
    async def scenario():
        async with aio.Client(daemon.socket_path) as client:
            await client.put("job", {})
            assert await client.pause() is True
            assert await client.reserve("w") == []
            assert await client.resume() is False
            manifest = await client.backup_begin()
            await client.backup_end()
            (lease,) = await client.reserve("w")
            return manifest, lease

    manifest, lease = asyncio.run(scenario())
    assert manifest.seq == 1 and lease.task_id == "job"



def half_way_backup(daemon, dest) -> subprocess.Popen:
    """A real walqueue-ctl backup into `dest`, stopped after its first file (bounded wait)."""
    import selectors

    process = subprocess.Popen([sys.executable, "-m", "tests.process.interrupted_ctl", "--socket",
                                daemon.socket_path, "backup", str(dest)],
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                               env=child_env(), cwd=REPO, preexec_fn=sigint_at_its_default)
    with selectors.DefaultSelector() as selector:
        selector.register(process.stdout, selectors.EVENT_READ)
        ready = selector.select(timeout=STOP_SECONDS)
    if not ready:
        process.kill()
        process.wait(timeout=STOP_SECONDS)
        pytest.fail("walqueue-ctl backup never reached its first file")
    line = process.stdout.readline()
    assert line.startswith("copied "), (line, process.stderr.read() if process.poll() is not None else "")
    return process


def backed_up_queue(make_daemon):
    daemon = make_daemon()
    with Client(daemon.socket_path) as client:
        for index in range(20):
            client.put(f"t{index}", {"pad": "x" * 50})
        client.compact()  # so the copy has several files: segments, a snapshot, CURRENT
        client.put("after", {})
    return daemon


def test_ctrl_c_during_backup_removes_the_half_copied_dest_and_releases_the_pin(make_daemon, workdir):
    """Issue 23: a Ctrl-C during backup left a DEST that verify called CORRUPT ("keep as evidence")."""
    daemon = backed_up_queue(make_daemon)
    dest = workdir / "copy"
    process = half_way_backup(daemon, dest)
    try:
        assert dest.is_dir() and any(dest.iterdir())  # half copied
        process.send_signal(signal.SIGINT)
        _, stderr = process.communicate(timeout=STOP_SECONDS)
    finally:
        if process.poll() is None:
            process.kill()
            process.wait(timeout=STOP_SECONDS)
    assert process.returncode == 10, stderr
    assert "backup interrupted" in stderr and "was removed" in stderr, stderr
    assert not dest.exists()
    assert json_lines(ctl("--socket", daemon.socket_path, "compact"))  # the pin is gone
    assert ctl("--socket", daemon.socket_path, "backup", dest).returncode == 0  # and again works


def test_a_backup_killed_half_way_leaves_a_dest_verify_calls_an_incomplete_backup(make_daemon, workdir):
    daemon = backed_up_queue(make_daemon)
    dest = workdir / "copy"
    process = half_way_backup(daemon, dest)
    process.kill()  # no cleanup can run: what is on disk stays
    process.communicate(timeout=STOP_SECONDS)
    verified = ctl("verify", dest)
    assert verified.returncode == 10, verified.stdout + verified.stderr
    assert "INCOMPLETE BACKUP" in verified.stdout and "evidence" not in verified.stdout


def test_get_after_a_restore_says_what_the_restored_directory_holds(make_daemon, workdir):
    """Issue 23: after a restore, `get` of a task put after the backup said only "was never put"."""
    daemon = make_daemon()
    s = ("--socket", daemon.socket_path)
    assert ctl(*s, "put", "before", "{}").returncode == 0
    (backed_up,) = json_lines(ctl(*s, "backup", workdir / "copy", "--json"))
    assert ctl(*s, "put", "after", "{}").returncode == 0
    restored = make_daemon(directory=workdir / "copy", socket_path=str(workdir / "restored.sock"))
    missing = ctl("--socket", restored.socket_path, "get", "after")
    assert missing.returncode == 7, missing.stderr
    message = " ".join(missing.stderr.split())
    assert f"holds every task put up to seq {backed_up['seq']}" in message, message
    assert str(workdir / "copy") in message and "restored from a backup" in message
    assert "put it again" in message
