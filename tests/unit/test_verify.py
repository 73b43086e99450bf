"""`walqueue.verify`: offline, read-only, and in agreement with recovery.

The central claim: `verify_directory(d)` reports a "corrupt" problem if and
only if `Queue(d)` raises CorruptStore, its first one at the file and offset
that CorruptStore names, and on a directory that opens, its summary equals
the opened queue's stats. It is checked on hand-made damage
(every problem reported, with file and offset) and by hypothesis on real
directories whose bytes are flipped, cut, extended, deleted, renamed or
re-framed with a valid checksum around an invalid record. Every verify call
is wrapped in a check that no byte, no mtime and no file name changed.
"""

import json
import os
import shutil
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from walqueue import CorruptStore, InjectedCrash, Queue
from walqueue.verify import CORRUPT, NOTE, TORN_TAIL, verify_directory

from .frames import (
    ack_record,
    current_bytes,
    frame,
    frame_body,
    frames,
    put_record,
    put_task,
    reserve_record,
    snapshot_bytes,
    snapshot_entry,
    snapshot_name,
    wal_name,
)


def fingerprint(directory: Path) -> dict:
    """Every entry's name, bytes, mode and mtime (ns)."""
    result = {}
    for path in sorted(directory.iterdir()):
        info = path.lstat()
        data = path.read_bytes() if path.is_file() else None
        result[path.name] = (data, info.st_mode, info.st_mtime_ns, info.st_size)
    return result


def verify(directory: Path):
    """verify's report, asserting that it changed nothing (not even the directory's mtime)."""
    before = fingerprint(directory)
    directory_mtime = directory.stat().st_mtime_ns
    report = verify_directory(directory)
    assert fingerprint(directory) == before
    assert directory.stat().st_mtime_ns == directory_mtime
    return report


def open_outcome(directory: Path):
    """('corrupt', the CorruptStore) or ('ok', stats) of opening the directory."""
    try:
        with Queue(directory) as q:
            return "ok", q.stats()
    except CorruptStore as error:
        return "corrupt", error


def assert_agrees(directory: Path):
    """Verify, then open: corrupt iff CorruptStore, the first corrupt problem
    where CorruptStore says, and the summary matches the stats."""
    report = verify(directory)
    sizes = {path.name: path.stat().st_size for path in directory.iterdir() if path.is_file()}
    outcome, detail = open_outcome(directory)
    problems = "\n".join(f"  {p.severity}: {p.what}" for p in report.problems)
    assert report.corrupt == (outcome == "corrupt"), f"open: {outcome} {detail}\nverify:\n{problems}"
    if outcome == "corrupt":
        first = report.by_severity(CORRUPT)[0]
        assert (first.file, first.offset, first.seq) == (detail.file, detail.offset, detail.seq), (
            f"open: {detail}\nverify:\n{problems}")
        assert first.file is not None and first.file in str(detail), detail  # the message names it too
    if not report.queue_found:  # nothing left of the queue: open makes a new, empty one
        assert outcome == "ok" and detail.last_seq == 0 and not report.problems
        return report
    if outcome == "ok":
        stats = detail
        counts = {"ready": stats.ready, "leased": stats.leased,
                  "completed": stats.completed, "dead": stats.dead}
        assert report.counts == counts
        assert (report.last_seq, report.snapshot_seq or 0, report.wal_bytes) == (
            stats.last_seq, stats.snapshot_seq, stats.wal_bytes)
        for problem in report.by_severity(TORN_TAIL):
            # open truncated exactly the reported tail
            assert sizes[problem.file] > problem.offset
            assert (directory / problem.file).stat().st_size == problem.offset
    return report


@pytest.fixture
def directory(tmp_path):
    path = tmp_path / "queue"
    path.mkdir()
    return path


# -- healthy directories -----------------------------------------------------------------


def build_history(directory: Path, *, compact: bool) -> None:
    with Queue(directory) as q:
        q.put_many([{"task_id": f"t{i}", "payload": {"i": i, "s": "ü" * i}} for i in range(6)])
        q.put("zonce", {}, max_attempts=1)
        leases = q.reserve("w", now=10, lease_seconds=5, limit=3)
        q.ack(leases[0], now=11)
        q.release(leases[1], now=11, delay=3)
        q.touch(leases[2], now=12, lease_seconds=30)
        if compact:
            q.compact()
        (dead,) = [lease for lease in q.reserve("w", now=20, lease_seconds=5, limit=10)
                   if lease.task_id == "zonce"]
        q.release(dead, now=21)
        q.revive(["zonce"], now=22)
        q.reserve("v", now=100, lease_seconds=5, limit=2)  # expires the rest


@pytest.mark.parametrize("compact", [False, True])
def test_a_healthy_directory_has_no_problem_and_the_same_summary_as_open(directory, compact):
    build_history(directory, compact=compact)
    report = assert_agrees(directory)
    assert report.healthy and report.problems == ()
    assert report.segments == 1 and report.total_bytes > 0
    assert (report.snapshot is not None) == compact


def test_an_empty_directory_is_no_queue_and_verify_creates_no_lock_file(directory):
    report = verify(directory)
    assert not report.queue_found and not report.healthy and not report.corrupt
    assert report.exit_code() == 11 and "NO QUEUE" in report.render()
    assert list(directory.iterdir()) == []


def test_a_parent_of_queue_directories_is_no_queue_and_names_them(directory):
    Queue(directory / "orders").close()
    (directory / "notes.txt").write_text("not a queue file")
    report = verify(directory)
    assert not report.queue_found and report.queue_subdirectories == ("orders",)
    assert f"walqueue-ctl verify {directory / 'orders'}" in report.render()
    assert report.to_json()["queue_found"] is False


def test_a_new_empty_queue_is_healthy(directory):
    Queue(directory).close()
    assert sorted(path.name for path in directory.iterdir()) == ["LOCK", wal_name(1)]
    report = assert_agrees(directory)
    assert report.healthy and report.problems == () and report.exit_code() == 0
    assert report.counts == dict.fromkeys(["ready", "leased", "completed", "dead"], 0)


def test_progress_counts_every_byte_recovery_reads_up_to_the_total(directory):
    build_history(directory, compact=True)
    with Queue(directory) as q:  # a second segment after the snapshot's
        q.put_many([{"task_id": f"p{i}", "payload": {"i": i}} for i in range(2000)])
    read = sum(path.stat().st_size for path in directory.iterdir()
               if path.name.startswith(("wal-", "snapshot-")))
    calls = []
    report = verify_directory(directory, progress=lambda done, total: calls.append((done, total)))
    assert report.healthy
    assert len(calls) > 2  # within the files too, not only between them
    assert all(total == read for _, total in calls)
    dones = [done for done, _ in calls]
    assert dones == sorted(dones) and dones[-1] == read


def test_a_missing_directory_is_an_error_not_a_report(tmp_path):
    with pytest.raises(FileNotFoundError):
        verify_directory(tmp_path / "nope")
    assert not (tmp_path / "nope").exists()


def test_verify_names_the_pid_holding_the_lock(directory):
    with Queue(directory) as q:
        q.put("a", {})
        report = verify_directory(directory)
    assert report.lock_holder == os.getpid()
    assert verify_directory(directory).lock_holder is None


def test_verify_makes_no_call_that_could_change_a_file(directory, monkeypatch):
    """Stronger than comparing bytes (and meaningful as root, whom chmod does
    not stop): every os.open is read-only and nothing that writes is called."""
    build_history(directory, compact=True)
    (directory / "CURRENT.tmp").write_bytes(b"leftover")
    segment = next(directory.glob("wal-*.log"))
    with open(segment, "ab") as file:
        file.write(b"\x00\x00\x01")  # a torn tail, which open would truncate
    real_open = os.open
    writing = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
    opened = []

    def read_only_open(path, flags, *args, **kwargs):
        assert not flags & writing, f"os.open({path!r}) with writing flags {flags:#o}"
        opened.append(os.path.basename(path))
        return real_open(path, flags, *args, **kwargs)

    def forbidden(name):
        def call(*args, **kwargs):
            raise AssertionError(f"verify called os.{name}{args}")
        return call

    monkeypatch.setattr(os, "open", read_only_open)
    for name in ("write", "pwrite", "ftruncate", "truncate", "unlink", "remove", "rename", "replace",
                 "mkdir", "makedirs", "rmdir", "fsync", "fdatasync", "chmod", "utime", "link", "symlink"):
        monkeypatch.setattr(os, name, forbidden(name))
    report = verify_directory(directory)
    monkeypatch.undo()
    assert report.healthy and [p.severity for p in report.problems].count(TORN_TAIL) == 1
    assert "LOCK" not in opened and segment.name in opened


def test_python_dash_m_walqueue_verify_needs_only_the_standard_library(directory, capsys):
    from walqueue.verify import main

    build_history(directory, compact=False)
    assert main([str(directory)]) == 0 and "HEALTHY" in capsys.readouterr().out
    segment = next(directory.glob("wal-*.log"))
    damaged = bytearray(segment.read_bytes())
    damaged[7] ^= 1
    segment.write_bytes(bytes(damaged))
    assert main(["--json", str(directory)]) == 4
    assert json.loads(capsys.readouterr().out)["corrupt"] is True
    assert main([str(directory / "missing")]) == 8


def test_the_agreement_check_catches_a_verify_that_reports_another_offset(directory, monkeypatch):
    """assert_agrees has teeth: a keep-going reader that misplaces a problem fails it."""
    from walqueue import codec

    blobs = [bytearray(frame(record)) for record in (R1, R2, R3)]
    blobs[1][10] ^= 0xFF
    (directory / wal_name(1)).write_bytes(b"".join(blobs))
    assert_agrees(directory)
    real_resume = codec._resume

    def misplaced(data, problem, *args):
        shifted = CorruptStore(str(problem), file=problem.file, offset=problem.offset + 1)
        return real_resume(data, shifted, *args)

    monkeypatch.setattr(codec, "_resume", misplaced)
    with pytest.raises(AssertionError, match="verify"):
        assert_agrees(directory)


# -- torn tails and leftovers are not errors ------------------------------------------------


R1 = put_record(1, put_task("a", {"n": 1}), put_task("b", {}))
R2 = reserve_record(2, 0, "w", 10, ["a"])
R3 = ack_record(3, 1, "a", "w", 1)


@pytest.mark.parametrize("cut", [1, 3, 4, 20, len(frame(R3)) - 1])
def test_a_torn_final_frame_is_a_torn_tail_with_its_offset(directory, cut):
    (directory / wal_name(1)).write_bytes(frames(R1, R2) + frame(R3)[:cut])
    report = assert_agrees(directory)
    (problem,) = report.problems
    assert (problem.severity, problem.file, problem.offset) == (TORN_TAIL, wal_name(1), len(frames(R1, R2)))
    assert report.healthy


def test_a_zero_filled_tail_is_a_torn_tail(directory):
    (directory / wal_name(1)).write_bytes(frames(R1, R2) + bytes(4096))
    report = assert_agrees(directory)
    assert [p.severity for p in report.problems] == [TORN_TAIL]
    assert "zero bytes" in report.problems[0].what


def test_a_sparse_tail_of_a_terabyte_is_judged_by_its_holes_not_read(directory):
    """Issue 20 item 14: a 4 GiB sparse segment took 23.5 s (a 1 TiB one ~1.7 h, and a copy of
    the tail in memory): the zero check read every hole. Now only ranges holding data are
    read, so this one finishes at once (before: past the suite's timeout, or out of memory)."""
    segment = directory / wal_name(1)
    segment.write_bytes(frames(R1, R2))
    with open(segment, "r+b") as file:
        file.truncate(1 << 40)
    report = verify_directory(directory)   # (assert_agrees would read the file whole to compare)
    (problem,) = report.problems
    assert (problem.severity, problem.offset) == (TORN_TAIL, len(frames(R1, R2)))
    assert f"{(1 << 40) - len(frames(R1, R2))} zero bytes" in problem.what
    with Queue(directory) as queue:   # open truncates it the same way
        assert queue.stats().last_seq == 2
    assert segment.stat().st_size == len(frames(R1, R2))


def test_a_byte_after_a_hole_still_makes_the_tail_incomplete_not_zeros(directory):
    segment = directory / wal_name(1)
    segment.write_bytes(frames(R1, R2))
    with open(segment, "r+b") as file:
        file.seek(64 << 20)
        file.write(b"\x01")   # data again after a 64 MiB hole
    report = assert_agrees(directory)   # what follows the frames is not all zeros: corrupt
    assert report.corrupt and report.by_severity(CORRUPT)[0].offset == len(frames(R1, R2))


def test_a_fifo_named_like_a_segment_is_reported_as_unreadable_not_waited_on(directory):
    (directory / wal_name(1)).write_bytes(frames(R1, R2))
    os.mkfifo(directory / wal_name(3))
    report = verify_directory(directory)
    (problem,) = [problem for problem in report.problems if problem.file == wal_name(3)]
    assert problem.severity == "unreadable" and "is a FIFO, not a file" in problem.what
    assert report.exit_code() == 8


def test_file_names_are_printed_escaped_in_text_and_in_json(directory, capsys):
    """Issue 20 item 14: python -m walqueue.verify printed names raw (ESC, C1, bidi), and
    --json left C1 and bidi raw."""
    from walqueue.verify import main

    (directory / wal_name(1)).write_bytes(frames(R1, R2))
    hostile = "evil\x1b[2J\x9b31m\u202egol.txt"
    (directory / hostile).write_text("")
    assert main([str(directory)]) == 0
    out = capsys.readouterr().out
    assert "evil\\x1b[2J\\x9b31m\\u202egol.txt" in out
    assert not any(character in out for character in "\x1b\x9b\u202e")
    assert main(["--json", str(directory)]) == 0
    out = capsys.readouterr().out
    assert not any(character in out for character in "\x1b\x9b\u202e")
    assert [problem["file"] for problem in json.loads(out)["problems"]] == [hostile]   # exact


def test_a_damaged_length_that_would_swallow_later_frames_is_corrupt_not_a_torn_tail(directory):
    """A torn write leaves nothing complete after it: a length running past the
    end with a complete frame further on is damage (codec's rule), and the
    scan goes on at that frame."""
    middle = bytearray(frame(R2))
    middle[1] ^= 0x01  # the length now runs past the end of the file
    (directory / wal_name(1)).write_bytes(frame(R1) + bytes(middle) + frame(R3))
    report = assert_agrees(directory)
    (problem,) = report.by_severity(CORRUPT)
    assert problem.offset == len(frame(R1))
    assert f"complete frame follows at offset {len(frame(R1)) + len(middle)}" in problem.what
    assert not report.by_severity(TORN_TAIL)


def test_leftovers_of_an_interrupted_compaction_are_notes(directory):
    def crash_after_publish(phase):
        if phase == "current.after_publish":
            raise InjectedCrash(phase)

    build_history(directory, compact=False)
    q = Queue(directory, hook=crash_after_publish)
    with pytest.raises(InjectedCrash):
        q.compact()
    (directory / "CURRENT.tmp").write_bytes(b"garbage")
    (directory / snapshot_name(999)).write_bytes(b"garbage")
    (directory / "notes.txt").write_text("hello")
    report = assert_agrees(directory)
    assert report.healthy
    notes = {problem.file: problem.what for problem in report.by_severity(NOTE)}
    assert set(notes) == {"CURRENT.tmp", snapshot_name(999), wal_name(1), "notes.txt"}
    assert "covered" in notes[wal_name(1)] and "orphan" in notes[snapshot_name(999)]


# -- corruption: every problem, with file and offset --------------------------------------


def test_every_damaged_frame_is_reported_not_only_the_first(directory):
    records = [put_record(seq, put_task(f"t{seq}", {"n": seq})) for seq in range(1, 7)]
    blobs = [bytearray(frame(record)) for record in records]
    blobs[1][10] ^= 0xFF   # checksum failure in seq 2
    blobs[4][-1] ^= 0xFF   # checksum failure in seq 5
    (directory / wal_name(1)).write_bytes(b"".join(blobs))
    report = assert_agrees(directory)
    corrupt = report.by_severity(CORRUPT)
    starts = [sum(len(b) for b in blobs[:i]) for i in range(len(blobs))]
    assert [(p.file, p.offset) for p in corrupt] == [(wal_name(1), starts[1]), (wal_name(1), starts[4])]
    assert all("checksum" in p.what for p in corrupt)
    assert report.counts is None and report.last_seq == 1


def test_a_bad_length_is_reported_and_the_scan_resumes_at_the_next_valid_frame(directory):
    junk = b"\xff\xff\xff\xff" + b"junk" * 10
    (directory / wal_name(1)).write_bytes(frame(R1) + junk + frames(R2, R3))
    report = assert_agrees(directory)
    (problem,) = report.by_severity(CORRUPT)
    assert problem.offset == len(frame(R1))
    assert f"next valid frame starts at offset {len(frame(R1)) + len(junk)}" in problem.what


def test_problems_in_several_files_are_all_reported(directory):
    (directory / wal_name(1)).write_bytes(frames(R1, R2))          # sealed, fine
    (directory / wal_name(4)).write_bytes(frame(put_record(4, put_task("c", {}))))  # gap: 3 missing
    (directory / wal_name(5)).write_bytes(frame(put_record(6, put_task("d", {}))))  # name says 5
    report = assert_agrees(directory)
    corrupt = [(p.file, p.seq) for p in report.by_severity(CORRUPT)]
    assert (wal_name(4), 4) in corrupt and (wal_name(5), 6) in corrupt


def test_an_invalid_record_with_a_valid_checksum_names_its_seq(directory):
    bad = ack_record(3, 1, "a", "w", 7)  # generation 7 is not the lease's
    (directory / wal_name(1)).write_bytes(frames(R1, R2, bad))
    report = assert_agrees(directory)
    (problem,) = report.by_severity(CORRUPT)
    assert (problem.offset, problem.seq) == (len(frames(R1, R2)), 3)
    assert "invalid 'ack' record" in problem.what


def test_a_non_canonical_frame_is_corrupt(directory):
    body = json.dumps(R2, sort_keys=True).encode()  # spaces: not canonical
    (directory / wal_name(1)).write_bytes(frame(R1) + frame_body(body) + frame(R3))
    report = assert_agrees(directory)
    assert "canonical" in report.by_severity(CORRUPT)[0].what


def published(directory: Path, *, snapshot: bytes | None = None, current: bytes | None = None) -> None:
    entries = [snapshot_entry("a", {"n": 1}), snapshot_entry("b", {})]
    (directory / snapshot_name(1)).write_bytes(snapshot if snapshot is not None else snapshot_bytes(1, entries))
    (directory / "CURRENT").write_bytes(current if current is not None else current_bytes(1))
    (directory / wal_name(2)).write_bytes(frame(reserve_record(2, 0, "w", 10, ["a"])))


def test_a_published_snapshot_verifies(directory):
    published(directory)
    report = assert_agrees(directory)
    assert report.healthy and report.snapshot_seq == 1 and report.counts["leased"] == 1


def test_a_damaged_current_is_corrupt_and_segments_are_still_checked(directory):
    current = bytearray(current_bytes(1))
    current[8] ^= 1
    published(directory, current=bytes(current))
    damaged = bytearray((directory / wal_name(2)).read_bytes())
    damaged[-1] ^= 1
    (directory / wal_name(2)).write_bytes(bytes(damaged))
    report = assert_agrees(directory)
    assert [p.file for p in report.by_severity(CORRUPT)] == ["CURRENT", wal_name(2)]


def test_a_missing_snapshot_is_corrupt(directory):
    published(directory)
    (directory / snapshot_name(1)).unlink()
    report = assert_agrees(directory)
    assert "does not exist" in report.by_severity(CORRUPT)[0].what


def test_several_damaged_snapshot_frames_are_all_reported(directory):
    entries = [snapshot_entry(f"t{i}", {"i": i}) for i in range(5)]
    data = bytearray(snapshot_bytes(1, entries))
    header = len(frame({"format": 1, "kind": "walqueue.snapshot", "seq": 1, "task_count": 5}))
    sizes = [len(frame(entry)) for entry in entries]
    second = header + sizes[0]
    fourth = header + sum(sizes[:3])
    data[second + 20] ^= 1
    data[fourth + 20] ^= 1
    published(directory, snapshot=bytes(data))
    report = assert_agrees(directory)
    assert [p.offset for p in report.by_severity(CORRUPT)] == [second, fourth]


def test_several_invalid_snapshot_entries_are_all_reported(directory):
    entries = [snapshot_entry(f"t{i}", {"i": i}) for i in range(5)]
    entries[1]["attempts"] = -1
    entries[3]["identity"] = "not hex"
    data = snapshot_bytes(1, entries)
    header = len(frame({"format": 1, "kind": "walqueue.snapshot", "seq": 1, "task_count": 5}))
    starts = [header + sum(len(frame(entry)) for entry in entries[:i]) for i in range(5)]
    published(directory, snapshot=data)
    report = assert_agrees(directory)
    assert [p.offset for p in report.by_severity(CORRUPT)] == [starts[1], starts[3]]


# -- the damage tests/unit/test_recovery.py feeds to open, fed to verify too ----------------

try:  # its tables of invalid records, CURRENTs and snapshots; reused, not copied
    from . import test_recovery as recovery
except Exception:  # a file being edited must not hide this module's tests
    recovery = None


def recovery_table(name: str) -> dict:
    return dict(getattr(recovery, name, None) or {})


def first_corrupt_file(report) -> str:
    return report.by_severity(CORRUPT)[0].file


@pytest.mark.parametrize("name", sorted(recovery_table("INVALID_RECORDS")))
def test_every_invalid_record_of_the_recovery_tests_is_corrupt_at_its_seq(directory, name):
    record = recovery_table("INVALID_RECORDS")[name]
    (directory / wal_name(1)).write_bytes(recovery.PREFIX + frame(record))
    report = assert_agrees(directory)
    assert report.corrupt and first_corrupt_file(report) == wal_name(1)
    assert report.by_severity(CORRUPT)[0].offset == len(recovery.PREFIX)


@pytest.mark.parametrize("name", sorted(recovery_table("NON_CANONICAL_BODIES")))
def test_every_non_canonical_body_of_the_recovery_tests_is_corrupt(directory, name):
    body = recovery_table("NON_CANONICAL_BODIES")[name]
    (directory / wal_name(1)).write_bytes(recovery.PREFIX + frame_body(body))
    report = assert_agrees(directory)
    assert report.corrupt and report.by_severity(CORRUPT)[0].offset == len(recovery.PREFIX)


@pytest.mark.parametrize("name", sorted(recovery_table("CURRENT_VARIANTS")))
def test_every_bad_current_of_the_recovery_tests_is_corrupt(directory, name):
    recovery.write_published(directory, current=recovery_table("CURRENT_VARIANTS")[name])
    (directory / snapshot_name(3)).write_bytes(snapshot_bytes(3, recovery.SNAP_ENTRIES))
    report = assert_agrees(directory)
    assert report.corrupt and first_corrupt_file(report) == "CURRENT"


@pytest.mark.parametrize("name", sorted(recovery_table("SNAPSHOT_VARIANTS")))
def test_every_malformed_snapshot_of_the_recovery_tests_is_corrupt(directory, name):
    data, offsets = recovery_table("SNAPSHOT_VARIANTS")[name]
    recovery.write_published(directory, snapshot=data)
    (directory / wal_name(1)).write_bytes(recovery.PREFIX)
    report = assert_agrees(directory)
    assert report.corrupt and first_corrupt_file(report) == recovery.SNAP2


@pytest.mark.skipif(recovery is None, reason="tests/unit/test_recovery.py does not import")
@pytest.mark.parametrize("position", range(0, 300, 7))
def test_flips_of_the_recovery_tests_published_directory_agree(directory, position):
    recovery.write_published(directory)
    names = sorted(path.name for path in directory.iterdir())
    path = directory / names[position % len(names)]
    data = bytearray(path.read_bytes())
    data[position % len(data)] ^= 0x08
    path.write_bytes(bytes(data))
    assert_agrees(directory)


# -- hypothesis: damage to real directories -------------------------------------------------


def crash_at(phase_name):
    def hook(phase):
        if phase == phase_name:
            raise InjectedCrash(phase)
    return hook


def build_base(directory: Path, kind: str) -> None:
    """Real directories: one segment; a snapshot and a newer segment; a sealed
    and an active segment with an orphan snapshot left by a crash."""
    build_history(directory, compact=kind != "plain")
    if kind == "sealed":
        q = Queue(directory, hook=crash_at("current.after_write"))
        with pytest.raises(InjectedCrash):
            q.compact()
        del q
        with Queue(directory) as q:
            q.put("late", {"x": [1, 2]})


_BASES: dict[tuple[Path, str], Path] = {}


def base_copy(tmp_root: Path, kind: str) -> Path:
    if (tmp_root, kind) not in _BASES:
        source = tmp_root / f"base-{kind}"
        source.mkdir()
        build_base(source, kind)
        (source / "LOCK").unlink()
        _BASES[tmp_root, kind] = source
    target = tmp_root / f"case-{len(list(tmp_root.iterdir()))}"
    shutil.copytree(_BASES[tmp_root, kind], target)
    return target


def mutate_value(value, draw):
    """The JSON value with one field changed, removed or added."""
    if not isinstance(value, dict) or not value:
        return {"op": "put"}
    key = draw(st.sampled_from(sorted(value)))
    action = draw(st.sampled_from(["replace", "remove", "add", "seq"]))
    changed = dict(value)
    if action == "remove":
        del changed[key]
    elif action == "add":
        changed["extra"] = 1
    elif action == "seq" and "seq" in changed:
        changed["seq"] = draw(st.integers(0, 30))
    else:
        changed[key] = draw(st.one_of(st.none(), st.booleans(), st.integers(-2, 40),
                                      st.sampled_from(["a", "t1", "w", "ready", ""]),
                                      st.lists(st.sampled_from(["t0", "t1", "zonce", "zz"]), max_size=3)))
    return changed


def reframe(data: bytes, index: int, draw) -> bytes:
    """Re-encode the index-th frame with one field changed and a valid checksum."""
    offset, position = 0, 0
    while offset + 4 <= len(data):
        length = int.from_bytes(data[offset:offset + 4], "big")
        end = offset + 4 + length + 32
        if end > len(data):
            break
        if position == index:
            try:
                value = json.loads(data[offset + 4:offset + 4 + length])
            except ValueError:
                return data
            return data[:offset] + frame(mutate_value(value, draw)) + data[end:]
        offset, position = end, position + 1
    return data


DAMAGES = ["flip", "flip", "cut", "append", "zeros", "delete", "rename", "reframe", "reframe"]


def apply_damage(directory: Path, name: str, kind: str, draw) -> None:
    path = directory / name
    if not path.exists():
        return
    data = path.read_bytes()
    if kind == "flip" and data:
        position = draw(st.integers(0, len(data) - 1))
        flipped = bytearray(data)
        flipped[position] ^= draw(st.integers(1, 255))
        path.write_bytes(bytes(flipped))
    elif kind == "cut":
        path.write_bytes(data[:draw(st.integers(0, max(0, len(data) - 1)))])
    elif kind == "append":
        path.write_bytes(data + draw(st.binary(min_size=1, max_size=60)))
    elif kind == "zeros":
        path.write_bytes(data + bytes(draw(st.integers(1, 100))))
    elif kind == "delete":
        path.unlink()
    elif kind == "rename" and name.startswith("wal-"):
        path.rename(directory / wal_name(draw(st.integers(0, 25))))
    elif kind == "reframe":
        path.write_bytes(reframe(data, draw(st.integers(0, 12)), draw))


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(kind=st.sampled_from(["plain", "compacted", "sealed"]), data=st.data())
def test_verify_says_corrupt_exactly_when_open_raises_corrupt_store(tmp_path, kind, data):
    directory = base_copy(tmp_path, kind)
    for _ in range(data.draw(st.integers(1, 3), label="damages")):
        names = sorted(path.name for path in directory.iterdir())
        if not names:
            break
        name = data.draw(st.sampled_from(names), label="file")
        how = data.draw(st.sampled_from(DAMAGES), label="damage")
        apply_damage(directory, name, how, data.draw)
    assert_agrees(directory)


@pytest.mark.parametrize("kind", ["plain", "compacted", "sealed"])
def test_every_single_byte_flip_of_a_real_directory_agrees_with_open(tmp_path, kind):
    """Exhaustive over positions (with one xor value): each flip's verdict matches open."""
    base = base_copy(tmp_path, kind)
    for name in sorted(path.name for path in base.iterdir()):
        size = (base / name).stat().st_size
        for position in range(0, size, max(1, size // 100)):
            directory = tmp_path / "flip"
            shutil.copytree(base, directory)
            path = directory / name
            flipped = bytearray(path.read_bytes())
            flipped[position] ^= 0x10
            path.write_bytes(bytes(flipped))
            try:
                assert_agrees(directory)
            except AssertionError as error:
                raise AssertionError(f"{kind}: flip of {name} at {position}: {error}") from None
            shutil.rmtree(directory)


def test_a_snapshot_entry_with_a_list_status_is_corrupt(directory):
    """Once a library bug (TypeError from open; fixed): verify and open agree."""
    entry = snapshot_entry("a", {})
    entry["status"] = []
    published(directory, snapshot=snapshot_bytes(1, [entry]))
    (directory / wal_name(2)).unlink()
    report = assert_agrees(directory)
    assert "unknown status" in report.by_severity(CORRUPT)[0].what


def test_a_covered_record_whose_op_is_a_list_is_corrupt(directory):
    published(directory)
    (directory / wal_name(2)).unlink()
    (directory / wal_name(1)).write_bytes(frame({"op": [], "seq": 1}))
    report = assert_agrees(directory)
    assert "not a well-formed record" in report.by_severity(CORRUPT)[0].what
    with pytest.raises(CorruptStore):
        Queue(directory)


# -- hypothesis: random histories, crashes included, then damage -----------------------------

OPERATIONS = st.lists(st.one_of(
    st.tuples(st.just("put"), st.integers(0, 30)),
    st.tuples(st.just("reserve"), st.integers(1, 4)),
    st.tuples(st.just("finish"), st.sampled_from(["ack", "release"])),
    st.tuples(st.just("compact"), st.none()),
    st.tuples(st.just("crash"), st.sampled_from(["wal.after_write", "wal.after_rotate",
                                                  "snapshot.after_write", "current.after_write",
                                                  "current.after_publish", "compact.after_delete"])),
), max_size=25)


def run_history(directory: Path, operations) -> None:
    """Apply operations with a rising clock; a crash kills the Queue at a phase of a compaction or write."""
    now, leases, crash = 0, [], None

    def hook(phase):
        if phase == crash:
            raise InjectedCrash(phase)

    q = Queue(directory, hook=hook)
    for index, (op, argument) in enumerate(operations):
        now += 1
        try:
            if op == "put":
                q.put(f"t{argument:02d}", {"i": argument}, max_attempts=2)
            elif op == "reserve":
                leases += q.reserve("w", now=now, lease_seconds=3, limit=argument)
            elif op == "finish" and leases:
                lease = leases.pop(0)
                getattr(q, argument)(lease, now=now)
            elif op == "compact":
                q.compact()
            elif op == "crash":
                crash = argument
                q.put(f"c{index}", {})
                q.compact()
        except InjectedCrash:
            del q  # dead: its lock is released, its files stay as they are
            crash, leases = None, []
            if index == len(operations) - 1:
                return  # leave the leftovers of the crash for verify to see
            q = Queue(directory, hook=hook)
        except Exception as error:  # a stale lease or a used id: fine, nothing written
            assert type(error).__name__ in ("StaleLease", "KeyConflict"), error
    q.close()


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(operations=OPERATIONS, data=st.data())
def test_random_histories_with_crashes_verify_like_they_open_before_and_after_damage(
        tmp_path_factory, operations, data):
    directory = tmp_path_factory.mktemp("history") / "queue"
    run_history(directory, operations)
    (directory / "LOCK").unlink()
    report = assert_agrees(directory)
    assert report.healthy
    for _ in range(data.draw(st.integers(0, 2), label="damages")):
        names = sorted(path.name for path in directory.iterdir() if path.name != "LOCK")
        if not names:
            break
        name = data.draw(st.sampled_from(names), label="file")
        apply_damage(directory, name, data.draw(st.sampled_from(DAMAGES), label="damage"), data.draw)
        (directory / "LOCK").unlink(missing_ok=True)
        assert_agrees(directory)


def test_a_damaged_first_frame_after_the_snapshot_reports_the_snapshots_seq_as_the_last(directory):
    with Queue(directory) as q:
        q.put_many([{"task_id": f"t{i}", "payload": {}} for i in range(3)])
        seq = q.compact()
        q.put("after", {})
        q.put("later", {})
    segment = directory / wal_name(seq + 1)
    data = bytearray(segment.read_bytes())
    data[40] ^= 0x01  # inside the first frame's body
    segment.write_bytes(bytes(data))
    report = verify(directory)
    assert not report.healthy
    assert report.last_seq == seq  # applied from the snapshot, not "unknown"


# -- walqueue-ctl verify: exit codes and progress ---------------------------------------------


def test_walqueue_ctl_verify_of_a_parent_of_queues_exits_11_and_shows_no_progress_when_piped(
        tmp_path):
    pytest.importorskip("click")
    from click.testing import CliRunner

    from walqueue.ctl import cli

    Queue(tmp_path / "orders").close()
    result = CliRunner().invoke(cli, ["verify", str(tmp_path)])
    assert result.exit_code == 11, result.output
    assert "NO QUEUE" in result.stdout and "orders/ holds a queue" in result.stdout
    assert result.stderr == ""  # CliRunner's stderr is no terminal: no progress bar
    assert "11  verify: the directory holds no queue" in CliRunner().invoke(cli, ["--help"]).stdout
    assert CliRunner().invoke(cli, ["verify", str(tmp_path / "orders")]).exit_code == 0


def test_walqueue_ctl_verify_draws_a_progress_bar_on_a_terminal(directory, monkeypatch):
    pytest.importorskip("click")
    import io
    import sys

    from walqueue.ctl import offline

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    build_history(directory, compact=True)
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    with offline._progress_bar_on_a_terminal("verifying") as progress:
        assert verify_directory(directory, progress=progress).healthy
    assert "verifying" in terminal.getvalue() and "100%" in terminal.getvalue()
    monkeypatch.setattr(sys, "stderr", io.StringIO())
    with offline._progress_bar_on_a_terminal("verifying") as progress:
        assert progress is None
