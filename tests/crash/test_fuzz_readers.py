"""Hostile bytes on disk can only produce the documented outcomes.

Random and mutated WAL segments, snapshots and CURRENT files are opened by
the library. The only acceptable outcomes are: the queue opens (a torn or
zero tail of the newest segment truncated, nothing else changed), or
CorruptStore naming the file. Never another exception, a hang (every
example is bounded by pytest-timeout) or a silent skip: when the queue
opens, every complete frame that was on disk is accounted for.
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from walqueue import CorruptStore, Queue
from walqueue.codec import encode_frame
from walqueue.verify import CORRUPT, verify_directory

FUZZ = settings(max_examples=150, deadline=None, derandomize=True,
                suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


def build_template(directory: Path) -> None:
    """A directory with a snapshot, CURRENT and a WAL suffix of every record kind."""
    queue = Queue(directory)
    queue.put("a", {"n": 1})
    queue.put_many([{"task_id": "b", "payload": {"n": 2}}, {"task_id": "c", "payload": {}}])
    (lease,) = queue.reserve("w", now=5, lease_seconds=10)
    queue.compact()
    queue.ack(lease, now=6)
    leases = queue.reserve("w", now=7, lease_seconds=1, limit=2)
    queue.touch(leases[0], now=7, lease_seconds=20)
    queue.reserve("w2", now=9, lease_seconds=3)  # reaps the other lease
    queue.close()


TEMPLATE_FILES = ("CURRENT", "snapshot", "wal")


def file_for(directory: Path, kind: str) -> Path:
    if kind == "CURRENT":
        return directory / "CURRENT"
    (path,) = [p for p in directory.iterdir() if p.name.startswith(kind + "-")]
    return path


def outcome_of_open(directory: Path) -> str:
    """Verify, then open the directory and say what happened; anything undocumented raises."""
    report = verify_directory(directory)
    first = next(iter(report.by_severity(CORRUPT)), None)
    try:
        queue = Queue(directory)
    except CorruptStore as error:
        names = {p.name for p in directory.iterdir()} | {"CURRENT"}
        assert error.file in names and error.file in str(error), f"names no file: {error!r}"
        if error.offset is not None and (directory / error.file).exists():
            assert 0 <= error.offset <= (directory / error.file).stat().st_size, error
        assert first is not None, f"verify calls it healthy, open raised {error}"
        assert (first.file, first.offset, first.seq) == (error.file, error.offset, error.seq), (
            f"open: {error}; verify: {first}")
        return "corrupt"
    assert first is None, f"verify calls it corrupt ({first}), yet it opens"
    try:
        stats = queue.stats()
        assert stats.last_seq >= stats.snapshot_seq
        list(queue.tasks())
        # A queue that opened must be usable: the next frame continues the sequence.
        queue.put("fuzz-new-task", {"after": "fuzz"})
        assert queue.stats().last_seq == stats.last_seq + 1
    finally:
        queue.close()
    reopened = Queue(directory)
    try:
        assert reopened.get("fuzz-new-task") is not None
    finally:
        reopened.close()
    return "opened"


mutation = st.one_of(
    st.tuples(st.just("flip"), st.integers(min_value=0), st.integers(min_value=1, max_value=255)),
    st.tuples(st.just("truncate"), st.integers(min_value=0), st.just(0)),
    st.tuples(st.just("insert"), st.integers(min_value=0), st.binary(min_size=1, max_size=40)),
    st.tuples(st.just("append"), st.just(0), st.binary(min_size=1, max_size=60)),
)


def mutate(data: bytes, operation) -> bytes:
    kind, position, argument = operation
    if kind == "append":
        return data + argument
    if not data:
        return data + (argument if isinstance(argument, bytes) else b"\x01")
    position %= len(data) + (1 if kind != "flip" else 0)
    if kind == "flip":
        return data[:position] + bytes([data[position] ^ argument]) + data[position + 1:]
    if kind == "truncate":
        return data[:position]
    return data[:position] + argument + data[position:]


@FUZZ
@given(kind=st.sampled_from(TEMPLATE_FILES), operations=st.lists(mutation, min_size=1, max_size=3))
def test_mutated_files_open_or_raise_corrupt_store_only(tmp_path_factory, kind, operations) -> None:
    template = tmp_path_factory.mktemp("template")
    build_template(template)
    directory = tmp_path_factory.mktemp("fuzzed")
    shutil.copytree(template, directory, dirs_exist_ok=True)
    os.unlink(directory / "LOCK")
    target = file_for(directory, kind)
    data = target.read_bytes()
    for operation in operations:
        data = mutate(data, operation)
    target.write_bytes(data)
    outcome_of_open(directory)


@FUZZ
@given(junk=st.binary(max_size=300), name=st.sampled_from(
    ["wal-00000000000000000001.log", "CURRENT", "snapshot-00000000000000000001.snap"]))
def test_random_bytes_in_any_file_open_or_raise_corrupt_store_only(tmp_path_factory, junk, name) -> None:
    directory = tmp_path_factory.mktemp("junk")
    (directory / name).write_bytes(junk)
    if name.startswith("snapshot"):
        (directory / "CURRENT").write_bytes(
            encode_frame({"format": 1, "seq": 1, "snapshot": name}))
    outcome_of_open(directory)


@FUZZ
@given(records=st.lists(st.dictionaries(
    st.sampled_from(["op", "seq", "tasks", "task_ids", "now", "worker", "generation",
                     "lease_seconds", "delay", "task_id"]),
    st.one_of(st.none(), st.booleans(), st.integers(min_value=-2, max_value=2**64),
              st.text(max_size=5), st.lists(st.text(max_size=3), max_size=3),
              st.sampled_from(["put", "expire", "reserve", "ack", "release", "touch", "revive"]))),
    min_size=1, max_size=5))
def test_well_framed_but_arbitrary_records_open_or_raise_corrupt_store_only(tmp_path_factory, records) -> None:
    # Valid frames (right digest, canonical JSON) holding arbitrary objects reach
    # the state machine's checks: those must reject them as CorruptStore too.
    directory = tmp_path_factory.mktemp("records")
    (directory / "wal-00000000000000000001.log").write_bytes(
        b"".join(encode_frame(record) for record in records))
    outcome_of_open(directory)
