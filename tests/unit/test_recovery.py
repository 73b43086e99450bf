"""SPEC §5 recovery: torn tails are truncated, everything else that is not a
complete valid frame is CorruptStore naming the file and the offset or seq,
CURRENT decides which snapshot counts (never a fallback), and leftovers of
an interrupted compaction never resurrect or double-apply state.

The directories are written here by hand from SPEC §4 (see frames.py).
"""

import json
import random
import shutil
import struct

import pytest

from walqueue import MAX_FRAME_BYTES, CorruptStore, Queue

from .frames import (
    ack_record,
    canonical,
    current_bytes,
    current_record,
    expire_record,
    frame,
    frame_body,
    frames,
    names_number,
    put_record,
    put_task,
    read_dir,
    release_record,
    reserve_record,
    revive_record,
    snapshot_bytes,
    snapshot_end,
    snapshot_entry,
    snapshot_header,
    snapshot_name,
    touch_record,
    wal_name,
)

# The base history: a and b put; a leased (deadline 10); a acked.
R1 = put_record(1, put_task("a", {"n": 1}), put_task("b", {"n": "ü"}, max_attempts=1))
R2 = reserve_record(2, 0, "w", 10, ["a"])
R3 = ack_record(3, 1, "a", "w", 1)
PREFIX = frames(R1, R2)
FINAL = frame(R3)
WAL1 = wal_name(1)
NEXT_PUT = put_record(3, put_task("c", {}))


@pytest.fixture
def directory(tmp_path):
    path = tmp_path / "queue"
    path.mkdir()
    return path


def files_without_lock(directory):
    return {name: data for name, data in read_dir(directory).items() if name != "LOCK"}


def assert_corrupt(directory, filename, *, offset=None, seqs=()):
    """Opening raises CorruptStore naming filename and the offset (or one of
    several acceptable offsets) or one of seqs, and changes no file (a corrupt
    store is evidence, not a torn tail)."""
    before = files_without_lock(directory)
    with pytest.raises(CorruptStore) as caught:
        Queue(directory)
    message = str(caught.value)
    assert filename in message, message
    rest = message.replace(str(directory), "").replace(filename, "")
    offsets = [] if offset is None else [offset] if isinstance(offset, int) else list(offset)
    numbers = offsets + list(seqs)
    if numbers:
        assert any(names_number(rest, number) for number in numbers), (
            f"none of {numbers} named in {message!r}"
        )
    # The same, structured (CorruptStore's fields), so no caller parses the message.
    error = caught.value
    assert error.file == filename, (error.file, message)
    if numbers:
        assert error.offset in offsets or error.seq in seqs, (error.offset, error.seq, message)
    assert files_without_lock(directory) == before
    return caught.value


def assert_state_before_final(q):
    """The state after R1 and R2 only."""
    assert q.get("a").status == "leased"
    assert q.get("a").generation == 1
    assert q.get("b").status == "ready"
    assert q.stats().last_seq == 2


def assert_state_after_final(q):
    assert q.get("a").status == "completed"
    assert q.stats().last_seq == 3


# -- torn tails ---------------------------------------------------------------


@pytest.mark.parametrize("cut", range(len(FINAL)))
def test_a_final_frame_torn_at_any_byte_is_truncated_and_the_sequence_continues(directory, cut):
    (directory / WAL1).write_bytes(PREFIX + FINAL[:cut])
    phases = []
    with Queue(directory, hook=phases.append) as q:
        assert (directory / WAL1).read_bytes() == PREFIX
        assert_state_before_final(q)
        assert q.stats().wal_bytes == len(PREFIX)
        assert ("recover.after_truncate" in phases) == (cut > 0)
        q.put("c", {})
    assert (directory / WAL1).read_bytes() == PREFIX + frame(NEXT_PUT)
    with Queue(directory) as q:
        assert q.get("c").status == "ready"
        assert q.stats().last_seq == 3


@pytest.mark.parametrize("cut", [1, 4, len(FINAL) // 2, len(FINAL) - 1])
def test_a_torn_tail_of_the_newest_segment_after_a_sealed_one_is_truncated(directory, cut):
    (directory / WAL1).write_bytes(frame(R1))
    (directory / wal_name(2)).write_bytes(frame(R2) + FINAL[:cut])
    with Queue(directory) as q:
        assert_state_before_final(q)
        q.put("c", {})
    assert (directory / wal_name(2)).read_bytes() == frame(R2) + frame(NEXT_PUT)
    assert (directory / WAL1).read_bytes() == frame(R1)


def test_a_torn_first_frame_of_the_only_segment_leaves_an_empty_queue(directory):
    (directory / WAL1).write_bytes(frame(R1)[:-1])
    with Queue(directory) as q:
        assert list(q.tasks()) == []
        assert q.stats().last_seq == 0
        q.put("c", {})
    assert (directory / WAL1).read_bytes() == frame(put_record(1, put_task("c", {})))


@pytest.mark.parametrize("zeros", [1, 3, 4, 5, 36, 4096])
def test_a_zero_filled_tail_is_truncated(directory, zeros):
    (directory / WAL1).write_bytes(PREFIX + FINAL + bytes(zeros))
    phases = []
    with Queue(directory, hook=phases.append) as q:
        assert (directory / WAL1).read_bytes() == PREFIX + FINAL
        assert_state_after_final(q)
        assert "recover.after_truncate" in phases
        q.put("c", {})
    assert (directory / WAL1).read_bytes() == PREFIX + FINAL + frame(
        put_record(4, put_task("c", {}))
    )


def test_a_zero_filled_empty_newest_segment_is_truncated(directory):
    (directory / WAL1).write_bytes(bytes(100))
    with Queue(directory) as q:
        assert q.stats().last_seq == 0
    assert (directory / WAL1).read_bytes() == b""


@pytest.mark.parametrize("zeros", [4, 8, 100])
def test_zeros_followed_by_a_non_zero_byte_are_corrupt(directory, zeros):
    (directory / WAL1).write_bytes(PREFIX + FINAL + bytes(zeros) + b"\x01")
    assert_corrupt(directory, WAL1, offset=len(PREFIX + FINAL))


def test_a_frame_of_length_max_frame_bytes_running_past_the_end_is_a_torn_tail(directory):
    (directory / WAL1).write_bytes(PREFIX + struct.pack(">I", MAX_FRAME_BYTES) + b"xyz")
    with Queue(directory) as q:
        assert_state_before_final(q)
    assert (directory / WAL1).read_bytes() == PREFIX


@pytest.mark.parametrize(
    ("length", "after"),
    [
        # (Four zero bytes followed by nothing or only zeros is a zero tail.)
        (length, after)
        for length in [0, MAX_FRAME_BYTES + 1, 2**32 - 1]
        for after in [b"", b"xyz", b"\x00" * 3 + b"x"]
        if not (length == 0 and set(after) <= {0})
    ],
)
def test_a_length_of_zero_or_above_the_bound_is_corrupt_even_at_the_end(directory, length, after):
    (directory / WAL1).write_bytes(PREFIX + struct.pack(">I", length) + after)
    assert_corrupt(directory, WAL1, offset=len(PREFIX))


# -- sealed segments ----------------------------------------------------------


@pytest.mark.parametrize("cut", range(1, len(FINAL)))
def test_the_same_cut_in_a_sealed_segment_is_corrupt(directory, cut):
    (directory / WAL1).write_bytes(PREFIX + FINAL[:cut])
    (directory / wal_name(3)).write_bytes(FINAL)
    assert_corrupt(directory, WAL1, offset=len(PREFIX))


def test_a_zero_filled_tail_in_a_sealed_segment_is_corrupt(directory):
    (directory / WAL1).write_bytes(PREFIX + bytes(8))
    (directory / wal_name(3)).write_bytes(FINAL)
    assert_corrupt(directory, WAL1, offset=len(PREFIX))


def test_a_torn_sealed_segment_is_corrupt_even_when_the_newest_is_empty(directory):
    (directory / WAL1).write_bytes(PREFIX + FINAL[:7])
    (directory / wal_name(3)).write_bytes(b"")
    assert_corrupt(directory, WAL1, offset=len(PREFIX))


# -- flipped bytes ------------------------------------------------------------


def flip(data: bytes, position: int) -> bytes:
    return data[:position] + bytes([data[position] ^ 0xFF]) + data[position + 1 :]


def outcome_of_flip(frame_bytes: bytes, position: int, room: int) -> str:
    """What SPEC §5 makes of a frame with one byte flipped, `room` being the
    number of bytes from the frame's start to the end of the file: "torn"
    when the length now runs past the end of the file, else "corrupt"."""
    if position >= 4:
        return "corrupt"  # the digest no longer matches
    (length,) = struct.unpack(">I", flip(frame_bytes, position)[:4])
    if length == 0 or length > MAX_FRAME_BYTES:
        return "corrupt"
    if 4 + length + 32 > room:
        return "torn"
    return "corrupt"


@pytest.mark.parametrize("position", range(len(FINAL)))
def test_a_flipped_byte_in_the_final_frame_is_corrupt_unless_the_length_runs_past_the_end(
    directory, position
):
    (directory / WAL1).write_bytes(PREFIX + flip(FINAL, position))
    if outcome_of_flip(FINAL, position, len(FINAL)) == "torn":
        with Queue(directory) as q:
            assert_state_before_final(q)
        assert (directory / WAL1).read_bytes() == PREFIX
    else:
        assert_corrupt(directory, WAL1, offset=len(PREFIX))


def test_the_flip_outcomes_cover_both_cases():
    outcomes = {outcome_of_flip(FINAL, position, len(FINAL)) for position in range(4)}
    assert outcomes == {"torn", "corrupt"}


MIDDLE = frame(R2)


@pytest.mark.parametrize("position", range(len(MIDDLE)))
def test_a_flipped_byte_in_a_frame_followed_by_others_is_corrupt(directory, position):
    """Also where the flipped length now runs past the end of the file: a
    torn write leaves one partial frame at the very end, so the complete,
    valid frame R3 after it proves the length damaged. Truncating there would
    silently drop the answered R2 and R3."""
    (directory / WAL1).write_bytes(frame(R1) + flip(MIDDLE, position) + FINAL)
    assert_corrupt(directory, WAL1, offset=len(frame(R1)))


def test_some_flipped_middle_lengths_run_past_the_end_of_the_file():
    room = len(MIDDLE) + len(FINAL)
    assert "torn" in {outcome_of_flip(MIDDLE, position, room) for position in range(4)}


@pytest.mark.parametrize("position", range(len(FINAL)))
def test_a_flipped_byte_in_a_sealed_segment_is_always_corrupt(directory, position):
    (directory / WAL1).write_bytes(PREFIX + flip(FINAL, position))
    (directory / wal_name(4)).write_bytes(frame(put_record(4, put_task("c", {}))))
    assert_corrupt(directory, WAL1, offset=len(PREFIX))


# -- non-canonical and invalid frames ----------------------------------------


def body_of(record):
    return canonical(record)


def unsorted(record):
    return json.dumps(dict(reversed(list(record.items()))), separators=(",", ":")).encode()


FLOAT_PUT = put_record(3, put_task("c", {"x": 1.0, "s": "é"}))
NON_CANONICAL_BODIES = {
    "spaces": json.dumps(R3, sort_keys=True).encode(),
    "unsorted-keys": unsorted(R3),
    "leading-space": b" " + body_of(R3),
    "trailing-newline": body_of(R3) + b"\n",
    "duplicate-key": body_of(R3).replace(b'{"generation":1,', b'{"generation":1,"generation":1,'),
    "float-as-1.0e0": body_of(FLOAT_PUT).replace(b"1.0", b"1.0e0"),
    "float-as-1.00": body_of(FLOAT_PUT).replace(b"1.0", b"1.00"),
    "ascii-escaped": json.dumps(FLOAT_PUT, sort_keys=True, separators=(",", ":")).encode(),
    "escaped-letter": body_of(R3).replace(b'"worker":"w"', b'"worker":"\\u0077"'),
    "escaped-slash": body_of(put_record(3, put_task("c", {"u": "a/b"}))).replace(b"/", b"\\/"),
    "int-as-float": body_of(R3).replace(b'"now":1', b'"now":1.0'),
    "nan": body_of(FLOAT_PUT).replace(b"1.0", b"NaN"),
    "infinity": body_of(FLOAT_PUT).replace(b"1.0", b"Infinity"),
    "overflowing-float": body_of(FLOAT_PUT).replace(b"1.0", b"1e400"),
    "invalid-utf8": body_of(FLOAT_PUT).replace("é".encode(), b"\xff"),
    "lone-surrogate-escape": body_of(FLOAT_PUT).replace("é".encode(), b"\\ud800"),
    "not-json": b"hello",
    "truncated-json": body_of(R3)[:-1],
    "json-array": b"[1,2]",
    "json-string": b'"ack"',
    "json-null": b"null",
}


@pytest.mark.parametrize("name", NON_CANONICAL_BODIES)
def test_a_frame_with_a_valid_digest_but_non_canonical_or_invalid_json_is_corrupt(directory, name):
    body = NON_CANONICAL_BODIES[name]
    assert body != body_of(R3)
    (directory / WAL1).write_bytes(PREFIX + frame_body(body))
    assert_corrupt(directory, WAL1, offset=len(PREFIX), seqs=[3])


def without(record, field):
    return {name: value for name, value in record.items() if name != field}


def put_with_task(**fields):
    return {"op": "put", "seq": 3, "tasks": [put_task("c", {}) | fields]}


INVALID_RECORDS = {
    "extra-field": R3 | {"extra": 1},
    "missing-worker": without(R3, "worker"),
    "missing-seq": without(R3, "seq"),
    "missing-now": without(R3, "now"),
    "unknown-op": R3 | {"op": "frobnicate"},
    "op-in-capitals": R3 | {"op": "ACK"},
    "seq-as-bool": R3 | {"seq": True},
    "seq-as-string": R3 | {"seq": "3"},
    "ack-of-a-ready-task": ack_record(3, 1, "b", "w", 0),
    "ack-of-an-unknown-task": ack_record(3, 1, "zz", "w", 1),
    "ack-with-the-wrong-generation": ack_record(3, 1, "a", "w", 2),
    "ack-by-the-wrong-worker": ack_record(3, 1, "a", "v", 1),
    "ack-at-the-deadline": ack_record(3, 10, "a", "w", 1),
    "ack-with-a-negative-now": ack_record(3, -1, "a", "w", 1),
    "ack-with-now-2**63": ack_record(3, 2**63, "a", "w", 1),
    "ack-with-generation-true": ack_record(3, 1, "a", "w", True),
    "release-overflowing-now-plus-delay": release_record(3, 1, "a", "w", 1, delay=2**63 - 1),
    "touch-at-the-deadline": touch_record(3, 10, "a", "w", 1, 5),
    "touch-with-lease-seconds-0": touch_record(3, 1, "a", "w", 1, 0),
    "reserve-of-a-leased-task": reserve_record(3, 1, "w", 5, ["a"]),
    "reserve-of-an-unknown-task": reserve_record(3, 1, "w", 5, ["zz"]),
    "reserve-with-lease-seconds-0": reserve_record(3, 1, "w", 0, ["b"]),
    "reserve-with-an-empty-worker": reserve_record(3, 1, "", 5, ["b"]),
    "reserve-overflowing-deadline": reserve_record(3, 2**63 - 1, "w", 1, ["b"]),
    "reserve-listing-a-task-twice": reserve_record(3, 1, "w", 5, ["b", "b"]),
    "expire-of-a-lease-not-yet-expired": expire_record(3, 9, ["a"]),
    "expire-of-a-ready-task": expire_record(3, 20, ["b"]),
    "revive-of-a-leased-task": revive_record(3, 1, ["a"]),
    "revive-of-an-unknown-task": revive_record(3, 1, ["zz"]),
    "put-of-a-used-task-id": put_record(3, put_task("a", {"n": 1})),
    "put-of-a-used-key": put_record(3, put_task("c", {}, key="b")),
    "put-listing-a-task-id-twice": put_record(3, put_task("c", {}), put_task("c", {})),
    "put-task-with-an-extra-field": put_with_task(identity="0" * 64),
    "put-task-without-a-key": {"op": "put", "seq": 3, "tasks": [without(put_task("c", {}), "key")]},
    "put-task-with-a-null-key": put_with_task(key=None),
    "put-task-with-an-empty-id": put_with_task(task_id="", key="c"),
    "put-task-with-a-list-payload": put_with_task(payload=[]),
    "put-task-with-max-attempts-0": put_with_task(max_attempts=0),
    "put-task-with-a-negative-available-at": put_with_task(available_at=-1),
    "put-task-with-a-1025-byte-id": put_with_task(task_id="x" * 1025, key="c"),
    "put-with-tasks-not-a-list": {"op": "put", "seq": 3, "tasks": {"c": {}}},
}


@pytest.mark.parametrize("name", INVALID_RECORDS)
def test_a_valid_frame_holding_an_invalid_record_is_corrupt(directory, name):
    (directory / WAL1).write_bytes(PREFIX + frame(INVALID_RECORDS[name]))
    assert_corrupt(directory, WAL1, offset=len(PREFIX), seqs=[3])


def test_a_reserve_of_a_task_that_is_not_yet_due_is_corrupt(directory):
    records = [
        put_record(1, put_task("a", {}, available_at=100)),
        reserve_record(2, 99, "w", 5, ["a"]),
    ]
    (directory / WAL1).write_bytes(frames(*records))
    assert_corrupt(directory, WAL1, offset=len(frame(records[0])), seqs=[2])


def test_a_revive_listing_a_task_twice_is_corrupt(directory):
    records = [
        put_record(1, put_task("a", {}, max_attempts=1)),
        reserve_record(2, 0, "w", 5, ["a"]),
        expire_record(3, 5, ["a"]),
        revive_record(4, 6, ["a", "a"]),
    ]
    (directory / WAL1).write_bytes(frames(*records))
    assert_corrupt(directory, WAL1, offset=len(frames(*records[:3])), seqs=[4])


def test_the_same_revive_listing_the_task_once_is_valid(directory):
    records = [
        put_record(1, put_task("a", {}, max_attempts=1)),
        reserve_record(2, 0, "w", 5, ["a"]),
        expire_record(3, 5, ["a"]),
        revive_record(4, 6, ["a"]),
    ]
    (directory / WAL1).write_bytes(frames(*records))
    with Queue(directory) as q:
        assert q.get("a").status == "ready"


def test_a_json_list_record_with_a_valid_digest_is_corrupt(directory):
    (directory / WAL1).write_bytes(PREFIX + frame([R3]))
    assert_corrupt(directory, WAL1, offset=len(PREFIX), seqs=[3])


def test_a_frame_covered_by_the_snapshot_must_still_be_a_well_formed_record(directory):
    """Skipped frames (seq <= S) are not applied, but a frame that is not a
    record at all is still corruption found on disk (SPEC §4)."""
    write_published(directory)
    (directory / wal_name(3)).unlink()
    # One segment holding frames both below and above the snapshot's seq 2.
    (directory / WAL1).write_bytes(frame(R1) + frame({"bogus": 1, "seq": 2}) + FINAL)
    assert_corrupt(directory, WAL1, offset=len(frame(R1)), seqs=[2])


def test_a_segment_named_wal_zero_is_corrupt(directory):
    (directory / wal_name(0)).write_bytes(frame({"junk": True, "seq": 0}))
    with pytest.raises(CorruptStore) as caught:
        Queue(directory)
    assert wal_name(0) in str(caught.value)


# -- sequence -----------------------------------------------------------------


def test_a_sequence_gap_inside_a_segment_is_corrupt(directory):
    (directory / WAL1).write_bytes(PREFIX + frame(R3 | {"seq": 4}))
    assert_corrupt(directory, WAL1, offset=len(PREFIX), seqs=[3, 4])


def test_a_repeated_seq_inside_a_segment_is_corrupt(directory):
    (directory / WAL1).write_bytes(PREFIX + frame(put_record(2, put_task("c", {}))))
    assert_corrupt(directory, WAL1, offset=len(PREFIX), seqs=[2, 3])


def test_a_sequence_gap_between_segments_is_corrupt(directory):
    (directory / WAL1).write_bytes(PREFIX)
    (directory / wal_name(4)).write_bytes(frame(R3 | {"seq": 4}))
    error = assert_corrupt(directory, wal_name(4), seqs=[3, 4])
    assert error is not None


def test_overlapping_segments_are_corrupt(directory):
    (directory / WAL1).write_bytes(PREFIX + FINAL)
    (directory / wal_name(3)).write_bytes(FINAL)
    with pytest.raises(CorruptStore):
        Queue(directory)


@pytest.mark.parametrize("first_seq", [2, 3])
def test_a_segment_whose_first_frame_disagrees_with_its_name_is_corrupt(directory, first_seq):
    (directory / wal_name(first_seq)).write_bytes(PREFIX)
    with pytest.raises(CorruptStore) as caught:
        Queue(directory)
    assert wal_name(first_seq) in str(caught.value)


def test_a_later_segment_whose_first_frame_disagrees_with_its_name_is_corrupt(directory):
    (directory / WAL1).write_bytes(PREFIX)
    (directory / wal_name(4)).write_bytes(frame(R3))
    assert_corrupt(directory, wal_name(4), offset=0, seqs=[3, 4])


def test_a_first_segment_not_starting_at_one_without_a_snapshot_is_corrupt(directory):
    (directory / wal_name(2)).write_bytes(frame(R2 | {"seq": 2}))
    with pytest.raises(CorruptStore):
        Queue(directory)


# -- CURRENT and snapshots ----------------------------------------------------

SNAP_ENTRIES = [
    snapshot_entry(
        "a", {"n": 1}, status="leased", attempts=1, generation=1, deadline=10, worker="w"
    ),
    snapshot_entry("b", {"n": "ü"}, max_attempts=1),
]
SNAP = snapshot_bytes(2, SNAP_ENTRIES)
SNAP2 = snapshot_name(2)
CURRENT2 = current_bytes(2)


def write_published(directory, *, snapshot=SNAP, current=CURRENT2, suffix=FINAL):
    """A compacted directory: snapshot at seq 2, CURRENT, and wal-3 with R3."""
    (directory / SNAP2).write_bytes(snapshot)
    (directory / "CURRENT").write_bytes(current)
    (directory / wal_name(3)).write_bytes(suffix)


def test_a_well_formed_published_directory_opens(directory):
    write_published(directory)
    with Queue(directory) as q:
        assert_state_after_final(q)
        assert q.stats().snapshot_seq == 2


@pytest.mark.parametrize("position", range(len(CURRENT2)))
def test_a_flipped_byte_in_current_is_corrupt(directory, position):
    write_published(directory, current=flip(CURRENT2, position))
    (directory / WAL1).write_bytes(PREFIX)  # a fallback that must not be taken
    assert_corrupt(directory, "CURRENT", offset=0, seqs=[2])


@pytest.mark.parametrize("cut", range(len(CURRENT2)))
def test_a_truncated_current_is_corrupt(directory, cut):
    write_published(directory, current=CURRENT2[:cut])
    (directory / WAL1).write_bytes(PREFIX)
    assert_corrupt(directory, "CURRENT", offset=0)


AFTER_CURRENT = len(CURRENT2)
CURRENT_VARIANTS = {
    "extra-field": frame(current_record(2) | {"extra": 1}),
    "missing-format": frame(without(current_record(2), "format")),
    "missing-snapshot": frame(without(current_record(2), "snapshot")),
    "format-2": frame(current_record(2) | {"format": 2}),
    "seq-disagrees-with-name": frame(current_record(2) | {"seq": 3}),
    "name-disagrees-with-seq": frame(current_record(2) | {"snapshot": snapshot_name(3)}),
    "short-name": frame(current_record(2) | {"snapshot": "snapshot-2.snap"}),
    "path-in-name": frame(current_record(2) | {"snapshot": "../queue/" + SNAP2}),
    "seq-as-string": frame(current_record(2) | {"seq": "2"}),
    "seq-zero": frame({"format": 1, "seq": 0, "snapshot": snapshot_name(0)}),
    "two-frames": CURRENT2 + CURRENT2,
    "trailing-garbage": CURRENT2 + b"x",
    "trailing-zeros": CURRENT2 + bytes(8),
    "non-canonical": frame_body(json.dumps(current_record(2), sort_keys=True).encode()),
    "json-list": frame([current_record(2)]),
}


@pytest.mark.parametrize("name", CURRENT_VARIANTS)
def test_a_current_with_wrong_fields_or_bytes_is_corrupt(directory, name):
    write_published(directory, current=CURRENT_VARIANTS[name])
    (directory / snapshot_name(3)).write_bytes(snapshot_bytes(3, SNAP_ENTRIES))
    assert_corrupt(directory, "CURRENT", offset=(0, AFTER_CURRENT))


def test_a_current_naming_a_missing_snapshot_is_corrupt_not_a_fallback(directory):
    (directory / WAL1).write_bytes(PREFIX + FINAL)  # the whole history is here...
    (directory / "CURRENT").write_bytes(CURRENT2)  # ...but CURRENT names nothing
    (directory / snapshot_name(1)).write_bytes(snapshot_bytes(1, []))
    error = assert_corrupt(directory, SNAP2)
    assert "CURRENT" in str(error) or SNAP2 in str(error)


def test_a_snapshot_whose_header_disagrees_with_current_on_seq_is_corrupt(directory):
    write_published(directory, snapshot=snapshot_bytes(3, SNAP_ENTRIES))
    assert_corrupt(directory, SNAP2, offset=0, seqs=[2, 3])


def frame_starts(data: bytes) -> list[int]:
    starts, offset = [], 0
    while offset < len(data):
        starts.append(offset)
        (length,) = struct.unpack_from(">I", data, offset)
        offset += 4 + length + 32
    return starts


def frame_start_of(data: bytes, position: int) -> int:
    return max(start for start in frame_starts(data) if start <= position)


@pytest.mark.parametrize("position", range(len(SNAP)))
def test_a_flipped_byte_in_the_published_snapshot_is_corrupt(directory, position):
    write_published(directory, snapshot=flip(SNAP, position))
    (directory / WAL1).write_bytes(PREFIX)
    assert_corrupt(directory, SNAP2, offset=frame_start_of(SNAP, position))


@pytest.mark.parametrize("cut", range(len(SNAP)))
def test_a_truncated_published_snapshot_is_corrupt(directory, cut):
    write_published(directory, snapshot=SNAP[:cut])
    (directory / WAL1).write_bytes(PREFIX)
    # The frame that is cut, or the end of the file where the next frame
    # (the end frame) was due.
    assert_corrupt(directory, SNAP2, offset=(frame_start_of(SNAP, cut), cut))


A, B = SNAP_ENTRIES
HEADER = snapshot_header(2, 2)
END = snapshot_end(2)


def variant(data: bytes, *frame_indexes: int, at_end: bool = False):
    """A damaged snapshot and the offsets a CorruptStore may name for it: the
    start of any of frame_indexes, or (at_end) the end of the file."""
    starts = frame_starts(data) if not at_end else []
    offsets = [starts[index] for index in frame_indexes] + ([len(data)] if at_end else [])
    return data, tuple(offsets)


SNAPSHOT_VARIANTS = {
    "entries-out-of-order": variant(frames(HEADER, B, A, END), 1, 2),
    "entry-repeated": variant(frames(snapshot_header(2, 3), A, A, B, snapshot_end(3)), 2),
    "two-entries-sharing-a-key": variant(frames(HEADER, A, B | {"key": "a"}, END), 2),
    "header-count-too-high": variant(frames(snapshot_header(2, 3), A, B, snapshot_end(3)), 0, 3),
    "header-count-too-low": variant(frames(snapshot_header(2, 1), A, B, snapshot_end(1)), 0, 2, 3),
    "end-count-wrong": variant(frames(HEADER, A, B, snapshot_end(1)), 0, 3),
    "end-kind-wrong": variant(frames(HEADER, A, B, END | {"kind": "END"}), 3),
    "end-with-extra-field": variant(frames(HEADER, A, B, END | {"extra": 1}), 3),
    "no-end-frame": variant(frames(HEADER, A, B), at_end=True),
    "frame-after-end": variant(frames(HEADER, A, B, END, END), 4),
    "entry-after-end": variant(frames(HEADER, A, END, B), 2, 3),
    "garbage-after-end": (SNAP + b"x", (len(SNAP),)),
    "zeros-after-end": (SNAP + bytes(8), (len(SNAP),)),
    "header-format-2": variant(frames(HEADER | {"format": 2}, A, B, END), 0),
    "header-kind-wrong": variant(frames(HEADER | {"kind": "snapshot"}, A, B, END), 0),
    "header-extra-field": variant(frames(HEADER | {"extra": 1}, A, B, END), 0),
    "header-missing": variant(frames(A, B, END), 0),
    "entry-extra-field": variant(frames(HEADER, A | {"extra": 1}, B, END), 1),
    "entry-missing-identity": variant(frames(HEADER, without(A, "identity"), B, END), 1),
    "entry-short-identity": variant(frames(HEADER, A | {"identity": "ab"}, B, END), 1),
    "entry-identity-not-hex": variant(frames(HEADER, A | {"identity": "z" * 64}, B, END), 1),
    "entry-status-bogus": variant(frames(HEADER, A, B | {"status": "bogus"}, END), 2),
    "entry-leased-without-worker": variant(frames(HEADER, A | {"worker": None}, B, END), 1),
    "entry-leased-without-deadline": variant(frames(HEADER, A | {"deadline": None}, B, END), 1),
    "entry-negative-attempts": variant(frames(HEADER, A, B | {"attempts": -1}, END), 2),
    "entry-list-payload": variant(frames(HEADER, A, B | {"payload": []}, END), 2),
    "entry-empty-task-id": variant(frames(HEADER, A, B | {"task_id": ""}, END), 2),
    "entry-max-attempts-0": variant(frames(HEADER, A, B | {"max_attempts": 0}, END), 2),
    "entry-generation-bool": variant(frames(HEADER, A | {"generation": True}, B, END), 1),
}


@pytest.mark.parametrize("name", SNAPSHOT_VARIANTS)
def test_a_malformed_published_snapshot_is_corrupt(directory, name):
    data, offsets = SNAPSHOT_VARIANTS[name]
    write_published(directory, snapshot=data)
    (directory / WAL1).write_bytes(PREFIX)
    assert_corrupt(directory, SNAP2, offset=offsets)


# -- orphans, leftovers, CURRENT.tmp -----------------------------------------

GHOST_SNAPSHOT = snapshot_bytes(9, [snapshot_entry("ghost", {"boo": True})])


def test_an_orphan_snapshot_without_current_is_ignored(directory):
    (directory / WAL1).write_bytes(PREFIX + FINAL)
    (directory / snapshot_name(9)).write_bytes(GHOST_SNAPSHOT)
    (directory / snapshot_name(2)).write_bytes(SNAP)
    with Queue(directory) as q:
        assert_state_after_final(q)
        assert q.get("ghost") is None
        assert q.stats().snapshot_seq == 0


def test_an_orphan_snapshot_newer_than_currents_is_ignored(directory):
    write_published(directory)
    (directory / snapshot_name(9)).write_bytes(GHOST_SNAPSHOT)
    with Queue(directory) as q:
        assert_state_after_final(q)
        assert q.get("ghost") is None
        assert q.stats().snapshot_seq == 2
        q.put("c", {})
    with Queue(directory) as q:
        assert q.get("ghost") is None
        assert q.stats().last_seq == 4


def test_a_garbage_orphan_snapshot_is_ignored(directory):
    write_published(directory)
    (directory / snapshot_name(3)).write_bytes(b"garbage")
    with Queue(directory) as q:
        assert_state_after_final(q)


def test_current_tmp_is_never_authoritative_without_current(directory):
    (directory / WAL1).write_bytes(PREFIX + FINAL)
    (directory / snapshot_name(9)).write_bytes(GHOST_SNAPSHOT)
    (directory / "CURRENT.tmp").write_bytes(current_bytes(9))
    with Queue(directory) as q:
        assert_state_after_final(q)
        assert q.get("ghost") is None
        assert q.stats().snapshot_seq == 0


def test_current_tmp_is_never_authoritative_beside_current(directory):
    write_published(directory)
    (directory / snapshot_name(9)).write_bytes(GHOST_SNAPSHOT)
    (directory / "CURRENT.tmp").write_bytes(current_bytes(9))
    with Queue(directory) as q:
        assert_state_after_final(q)
        assert q.get("ghost") is None
        assert q.stats().snapshot_seq == 2


def test_a_garbage_current_tmp_is_ignored(directory):
    write_published(directory)
    (directory / "CURRENT.tmp").write_bytes(b"\x00\x01garbage")
    with Queue(directory) as q:
        assert_state_after_final(q)


def history(q):
    q.put("a", {"n": 1})
    q.put("b", {"n": 2}, max_attempts=1)
    (lease,) = q.reserve("w", now=0, lease_seconds=10, limit=1)
    q.ack(lease, now=1)
    q.reserve("w", now=2, lease_seconds=3, limit=1)


def snapshot_of_state(q):
    return list(q.tasks()), q.stats().last_seq


def test_old_sealed_segments_copied_back_after_compaction_do_not_double_apply(directory):
    with Queue(directory) as q:
        history(q)
        old_segment = (directory / WAL1).read_bytes()
        seq = q.compact()
        q.put("c", {})
        q.reserve("w", now=5, lease_seconds=3, limit=5)  # expires b (dead), leases c
        expected = snapshot_of_state(q)
    assert not (directory / WAL1).exists()
    (directory / WAL1).write_bytes(old_segment)
    with Queue(directory) as q:
        assert snapshot_of_state(q) == expected
        assert q.stats().snapshot_seq == seq
        q.put("d", {})
        expected = snapshot_of_state(q)
    with Queue(directory) as q:
        assert snapshot_of_state(q) == expected


def test_an_old_snapshot_and_segment_left_behind_by_a_later_compaction_are_ignored(directory):
    with Queue(directory) as q:
        history(q)
        q.compact()
        q.put("c", {})
        left_behind = {name: data for name, data in read_dir(directory).items() if name != "LOCK"}
        q.compact()
        q.put("d", {})
        expected = snapshot_of_state(q)
    for name, data in left_behind.items():
        if name != "CURRENT" and not (directory / name).exists():
            (directory / name).write_bytes(data)
    with Queue(directory) as q:
        assert snapshot_of_state(q) == expected


def test_a_snapshot_written_but_not_published_leaves_the_wal_authoritative(directory):
    """As if compaction died after snapshot.after_write: the new snapshot is an
    orphan, the old segment still holds everything."""
    with Queue(directory) as q:
        history(q)
        expected = snapshot_of_state(q)
    pre_compaction = directory.parent / "copy"
    shutil.copytree(directory, pre_compaction)
    with Queue(directory) as q:
        seq = q.compact()
    (pre_compaction / snapshot_name(seq)).write_bytes((directory / snapshot_name(seq)).read_bytes())
    with Queue(pre_compaction) as q:
        assert snapshot_of_state(q) == expected
        assert q.stats().snapshot_seq == 0


def test_a_failed_open_releases_the_lock(directory):
    (directory / WAL1).write_bytes(PREFIX + frame(R3 | {"seq": 9}))
    for _ in range(2):
        with pytest.raises(CorruptStore):
            Queue(directory)
    (directory / WAL1).write_bytes(PREFIX)
    with Queue(directory) as q:
        assert_state_before_final(q)


def test_corrupt_store_fields_survive_pickling_and_default_to_none():
    import pickle

    error = CorruptStore("wal-x: frame at offset 7 (seq 3): bad", file="wal-x", offset=7, seq=3)
    copy = pickle.loads(pickle.dumps(error))
    assert (str(copy), copy.file, copy.offset, copy.seq) == (str(error), "wal-x", 7, 3)
    bare = CorruptStore("no location")
    assert (bare.file, bare.offset, bare.seq) == (None, None, None)


def test_corrupt_store_is_not_a_value_error():
    assert not issubclass(CorruptStore, ValueError)
    assert not issubclass(CorruptStore, KeyError)


@pytest.mark.parametrize("cut", range(len(FINAL)))
def test_a_torn_tail_of_the_segment_after_a_snapshot_is_truncated(directory, cut):
    write_published(directory, suffix=FINAL[:cut])
    with Queue(directory) as q:
        assert_state_before_final(q)
        assert q.stats().snapshot_seq == 2
        q.put("c", {})
    assert (directory / wal_name(3)).read_bytes() == frame(NEXT_PUT)


# -- garbage can only be CorruptStore ---------------------------------------


def damage(rng: random.Random, data: bytes) -> bytes:
    """One to three random edits: flip, overwrite, insert, delete, truncate."""
    data = bytearray(data)
    for _ in range(rng.randint(1, 3)):
        kind = rng.choice(["flip", "overwrite", "insert", "delete", "truncate"])
        position = rng.randrange(len(data) + 1) if data else 0
        if kind == "flip" and position < len(data):
            data[position] ^= 1 << rng.randrange(8)
        elif kind == "overwrite" and position < len(data):
            data[position] = rng.randrange(256)
        elif kind == "insert":
            data[position:position] = bytes(rng.randrange(256) for _ in range(rng.randint(1, 8)))
        elif kind == "delete" and position < len(data):
            del data[position : position + rng.randint(1, 8)]
        elif kind == "truncate":
            del data[position:]
    return bytes(data)


@pytest.mark.parametrize("target", ["wal", "snapshot", "current"])
def test_damaged_files_only_ever_open_or_raise_corrupt_store(tmp_path, target):
    """Seeded: a failure names its seed. Whatever the damage, open either
    succeeds or raises CorruptStore -- never ValueError, KeyError,
    JSONDecodeError, UnicodeDecodeError, IndexError, struct.error..."""
    for seed in range(150):
        rng = random.Random(seed)
        directory = tmp_path / f"{target}-{seed}"
        directory.mkdir()
        if target == "wal":
            (directory / WAL1).write_bytes(damage(rng, PREFIX + FINAL))
        elif target == "snapshot":
            write_published(directory, snapshot=damage(rng, SNAP))
        else:
            write_published(directory, current=damage(rng, CURRENT2))
        try:
            with Queue(directory) as q:
                q.put("probe", {})
        except CorruptStore:
            pass
        except Exception as error:  # noqa: BLE001 - the point of the test
            pytest.fail(f"seed {seed}: {type(error).__name__}: {error}")


ODD_VALUES = [None, True, False, -1, 0, 2**63, 1.5, "", "x", "a" * 1025, [], [1], {}, {"a": 1}]
TEMPLATES = [
    ack_record(3, 1, "a", "w", 1),
    release_record(3, 1, "a", "w", 1, delay=2),
    touch_record(3, 1, "a", "w", 1, 5),
    reserve_record(3, 1, "v", 5, ["b"]),
    expire_record(3, 10, ["a"]),
    revive_record(3, 1, ["b"]),
    put_record(3, put_task("c", {"k": 1})),
]


def odd_variants():
    """Every template with one field (or one field of its put task, or one
    listed id) replaced by each odd value, or removed."""
    for template in TEMPLATES:
        for field in template:
            yield without(template, field)
            for value in ODD_VALUES:
                yield template | {field: value}
        if template["op"] == "put":
            task = template["tasks"][0]
            for field in task:
                yield template | {"tasks": [without(task, field)]}
                for value in ODD_VALUES:
                    yield template | {"tasks": [task | {field: value}]}
        if "task_ids" in template:
            for value in ODD_VALUES:
                yield template | {"task_ids": [value]}


def test_records_with_odd_field_values_only_ever_open_or_raise_corrupt_store(tmp_path):
    for index, record in enumerate(odd_variants()):
        directory = tmp_path / f"odd-{index}"
        directory.mkdir()
        (directory / WAL1).write_bytes(PREFIX + frame(record))
        try:
            with Queue(directory) as q:
                assert q.stats().last_seq == 3
        except CorruptStore as error:
            assert WAL1 in str(error)
        except Exception as error:  # noqa: BLE001 - the point of the test
            pytest.fail(f"{record}: {type(error).__name__}: {error}")


def odd_snapshots():
    """The published snapshot with one field of the header, an entry, or the
    end frame replaced by each odd value, or removed."""
    parts = [HEADER, A, B, END]
    for index, part in enumerate(parts):
        for field in part:
            for replaced in [without(part, field)] + [part | {field: v} for v in ODD_VALUES]:
                yield frames(*parts[:index], replaced, *parts[index + 1 :])


def test_snapshots_with_odd_field_values_only_ever_open_or_raise_corrupt_store(tmp_path):
    for index, data in enumerate(odd_snapshots()):
        directory = tmp_path / f"odd-{index}"
        directory.mkdir()
        write_published(directory, snapshot=data, suffix=b"")
        try:
            with Queue(directory) as q:
                q.stats()
        except CorruptStore as error:
            assert SNAP2 in str(error)
        except Exception as error:  # noqa: BLE001 - the point of the test
            pytest.fail(f"{data!r}: {type(error).__name__}: {error}")


def test_currents_with_odd_field_values_only_ever_open_or_raise_corrupt_store(tmp_path):
    record = current_record(2)
    variants = [without(record, field) for field in record] + [
        record | {field: value} for field in record for value in ODD_VALUES
    ]
    for index, value in enumerate(variants):
        directory = tmp_path / f"odd-{index}"
        directory.mkdir()
        write_published(directory, current=frame(value), suffix=b"")
        try:
            with Queue(directory) as q:
                q.stats()
        except CorruptStore as error:
            assert "CURRENT" in str(error)
        except Exception as error:  # noqa: BLE001 - the point of the test
            pytest.fail(f"{value!r}: {type(error).__name__}: {error}")
