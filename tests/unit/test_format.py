"""SPEC §3–§4, byte for byte: the WAL, snapshot and CURRENT files the
library writes equal frames built here from the SPEC, and directories
written here by hand open with the expected state."""

import json

import pytest

from walqueue import MAX_FRAME_BYTES, Lease, PutRequest, Queue, QueueStats, TaskView

from .frames import (
    ack_record,
    canonical,
    current_bytes,
    expire_record,
    frame,
    frames,
    identity,
    parse_frames,
    put_record,
    put_task,
    read_dir,
    release_record,
    reserve_record,
    revive_record,
    snapshot_bytes,
    snapshot_entry,
    snapshot_name,
    touch_record,
    wal_bytes_on_disk,
    wal_name,
)

P1 = {"n": 1, "s": "héllo ☃ \U0001f600", "f": 1.5, "list": [None, True, {"z": [], "a": {}}]}
P2 = {"b": 2, "a": 1}
P3 = {"three": 3}
P4 = {"four": [4.25, -1]}


@pytest.fixture
def directory(tmp_path):
    return tmp_path / "queue"


def run_script(q):
    """Every kind of operation; returns the records SPEC §4 says it writes."""
    records = []
    q.put("t1", P1)
    records.append(put_record(1, put_task("t1", P1)))
    q.put("t2", P2, key="k2", available_at=5, max_attempts=1)
    records.append(put_record(2, put_task("t2", P2, key="k2", available_at=5, max_attempts=1)))
    q.put_many([PutRequest("t4", P4, max_attempts=5), {"task_id": "t3", "payload": P3}])
    records.append(put_record(3, put_task("t4", P4, max_attempts=5), put_task("t3", P3)))
    t1, t3 = q.reserve("w1", now=10, lease_seconds=30, limit=2)
    assert (t1.task_id, t3.task_id) == ("t1", "t3")
    records.append(reserve_record(4, 10, "w1", 30, ["t1", "t3"]))
    q.ack(t1, now=11)
    records.append(ack_record(5, 11, "t1", "w1", 1))
    t3 = q.touch(t3, now=12, lease_seconds=5)
    assert t3.deadline == 17
    records.append(touch_record(6, 12, "t3", "w1", 1, 5))
    (t4,) = q.reserve("w2", now=20, lease_seconds=10, limit=1)
    assert t4.task_id == "t4"
    records.append(expire_record(7, 20, ["t3"]))
    records.append(reserve_record(8, 20, "w2", 10, ["t4"]))
    q.release(t4, now=21, delay=3)
    records.append(release_record(9, 21, "t4", "w2", 1, delay=3))
    (t2,) = q.reserve("w3", now=30, lease_seconds=1, limit=1)
    assert t2.task_id == "t2"
    records.append(reserve_record(10, 30, "w3", 1, ["t2"]))
    (t3,) = q.reserve("w3", now=31, lease_seconds=100, limit=1)
    assert t3.task_id == "t3" and t3.generation == 2
    records.append(expire_record(11, 31, ["t2"]))
    records.append(reserve_record(12, 31, "w3", 100, ["t3"]))
    assert q.revive(["t2", "t2"], now=40) == ["t2"]
    records.append(revive_record(13, 40, ["t2"]))
    # No frame: an identical retry, a stale ack, an empty reserve.
    q.put("t1", P1)
    assert q.reserve("w4", now=0, lease_seconds=1) == []
    return records


def expected_entries_after_script():
    """The complete state after run_script, as snapshot entries in task_id order."""
    return [
        snapshot_entry(
            "t1", None, status="completed", attempts=1, generation=1, identity_payload=P1
        ),
        snapshot_entry(
            "t2",
            P2,
            key="k2",
            status="ready",
            attempts=0,
            max_attempts=1,
            generation=1,
            available_at=40,
            original_available_at=5,
        ),
        snapshot_entry(
            "t3",
            P3,
            status="leased",
            attempts=2,
            generation=2,
            deadline=131,
            worker="w3",
            available_at=17,
            original_available_at=0,
        ),
        snapshot_entry(
            "t4",
            P4,
            status="ready",
            attempts=1,
            max_attempts=5,
            generation=1,
            available_at=24,
            original_available_at=0,
        ),
    ]


def test_the_wal_holds_exactly_one_canonical_frame_per_transaction(directory):
    with Queue(directory) as q:
        records = run_script(q)
    assert sorted(read_dir(directory)) == ["LOCK", wal_name(1)]
    assert (directory / wal_name(1)).read_bytes() == frames(*records)


def test_a_fresh_directory_holds_an_empty_first_segment(directory):
    with Queue(directory) as q:
        assert q.stats() == QueueStats(0, 0, 0, 0, 0, 0, 0)
    assert read_dir(directory) == {"LOCK": (directory / "LOCK").read_bytes(), wal_name(1): b""}


def test_non_ascii_payload_strings_are_written_as_raw_utf8(directory):
    with Queue(directory) as q:
        q.put("ü-id", {"ключ": "значение ☃"}, key="ключ-key")
    data = (directory / wal_name(1)).read_bytes()
    assert "значение ☃".encode() in data
    assert "ü-id".encode() in data
    assert b"\\u" not in data
    assert data == frame(put_record(1, put_task("ü-id", {"ключ": "значение ☃"}, key="ключ-key")))


def test_a_float_payload_value_is_written_as_python_writes_it(directory):
    payload = {"one": 1.0, "tiny": 1e-300, "big": 1e300, "third": 1 / 3, "neg": -0.0}
    with Queue(directory) as q:
        q.put("floats", payload)
        assert q.get("floats").payload == payload
    assert (directory / wal_name(1)).read_bytes() == frame(
        put_record(1, put_task("floats", payload))
    )
    assert b'"one":1.0' in (directory / wal_name(1)).read_bytes()


def test_wal_bytes_equals_the_size_of_the_segments(directory):
    with Queue(directory) as q:
        for n in range(3):
            q.put(f"t{n}", {"n": n})
            assert q.stats().wal_bytes == wal_bytes_on_disk(directory)
        q.compact()
        assert q.stats().wal_bytes == 0 == wal_bytes_on_disk(directory)
        q.put("t9", {})
        assert (
            q.stats().wal_bytes
            == wal_bytes_on_disk(directory)
            == len(frame(put_record(4, put_task("t9", {}))))
        )


def test_a_preallocated_segment_holds_the_frames_then_zeros_and_after_close_only_the_frames(
    directory,
):
    step = 1024
    q = Queue(directory, preallocate_bytes=step)
    records = run_script(q)
    expected = frames(*records)
    data = (directory / wal_name(1)).read_bytes()
    # Allocated from offset 0 in whole steps, just enough for every frame.
    assert len(data) == -(-len(expected) // step) * step
    assert data == expected + bytes(len(data) - len(expected))
    assert q.stats().wal_bytes == len(expected)  # the frames, never the allocation
    q.close()
    assert sorted(read_dir(directory)) == ["LOCK", wal_name(1)]
    assert (directory / wal_name(1)).read_bytes() == expected


def test_a_frame_larger_than_the_preallocation_step_grows_it_by_whole_steps(directory):
    payload = {"blob": "x" * 1000}
    expected = frame(put_record(1, put_task("big", payload)))
    with Queue(directory, preallocate_bytes=64) as q:
        q.put("big", payload)
        data = (directory / wal_name(1)).read_bytes()
        assert len(data) == -(-len(expected) // 64) * 64
        assert data == expected + bytes(len(data) - len(expected))
    assert (directory / wal_name(1)).read_bytes() == expected


def test_a_preallocated_queue_writes_the_same_files_as_an_appending_one(tmp_path):
    for name, step in (("append", 0), ("preallocate", 300)):
        with Queue(tmp_path / name, preallocate_bytes=step) as q:
            run_script(q)
            q.compact()
            q.put("after", P1)
    appended, preallocated = read_dir(tmp_path / "append"), read_dir(tmp_path / "preallocate")
    assert appended == preallocated
    assert (tmp_path / "append" / wal_name(14)).read_bytes() == frame(
        put_record(14, put_task("after", P1)))


def test_an_expire_frame_lists_ids_in_old_deadline_then_task_id_order(directory):
    with Queue(directory) as q:
        q.put_many([PutRequest(task_id, {}) for task_id in ["d", "c", "b", "a"]])
        q.reserve("w", now=0, lease_seconds=9, limit=1)  # a, deadline 9
        q.reserve("w", now=0, lease_seconds=3, limit=1)  # b, deadline 3
        q.reserve("w", now=1, lease_seconds=8, limit=1)  # c, deadline 9
        q.reserve("w", now=1, lease_seconds=2, limit=1)  # d, deadline 3
        assert q.reserve("w", now=9, lease_seconds=1, limit=1000) != []
    data = (directory / wal_name(1)).read_bytes()
    assert frame(expire_record(6, 9, ["b", "d", "a", "c"])) in data
    assert data.endswith(frame(reserve_record(7, 9, "w", 1, ["b", "d", "a", "c"])))


def test_a_reap_of_more_than_10000_leases_spans_several_frames(directory):
    count = 10_001
    with Queue(directory) as q:
        q.put_many([PutRequest(f"t{n:05d}", {}) for n in range(count)])
        for _ in range(11):
            q.reserve("w", now=0, lease_seconds=5, limit=1000)
        q.reserve("w", now=5, lease_seconds=5, limit=1)
    ids = [f"t{n:05d}" for n in range(count)]
    records = parse_frames((directory / wal_name(1)).read_bytes())
    assert [record["seq"] for record in records] == list(range(1, len(records) + 1))
    expires, last = records[12:-1], records[-1]
    assert len(expires) >= 2
    assert all(record["op"] == "expire" and record["now"] == 5 for record in expires)
    assert all(1 <= len(record["task_ids"]) <= 10_000 for record in expires)
    assert [task_id for record in expires for task_id in record["task_ids"]] == ids
    assert last == reserve_record(len(records), 5, "w", 5, ["t00000"])


def test_compaction_writes_the_exact_snapshot_and_current_and_rotates_the_wal(directory):
    with Queue(directory) as q:
        run_script(q)
        assert q.compact() == 13
        assert q.stats().snapshot_seq == 13
    files = read_dir(directory)
    assert sorted(files) == sorted(["LOCK", "CURRENT", snapshot_name(13), wal_name(14)])
    assert files[wal_name(14)] == b""
    assert files["CURRENT"] == current_bytes(13)
    assert files[snapshot_name(13)] == snapshot_bytes(13, expected_entries_after_script())


def test_a_second_compaction_deletes_the_previous_snapshot_and_segment(directory):
    with Queue(directory) as q:
        run_script(q)
        q.compact()
        q.put("t5", {"five": 5}, available_at=1000)
        (lease,) = q.reserve("w9", now=40, lease_seconds=2, limit=1)
        assert lease.task_id == "t4"
        assert q.compact() == 15
        assert (directory / wal_name(14)).exists() is False
    files = read_dir(directory)
    assert sorted(files) == sorted(["LOCK", "CURRENT", snapshot_name(15), wal_name(16)])
    assert files["CURRENT"] == current_bytes(15)
    entries = expected_entries_after_script()
    entries[3] |= {
        "status": "leased",
        "attempts": 2,
        "generation": 2,
        "deadline": 42,
        "worker": "w9",
    }
    entries.append(snapshot_entry("t5", {"five": 5}, available_at=1000))
    assert files[snapshot_name(15)] == snapshot_bytes(15, entries)


def test_appends_after_compaction_go_to_the_new_segment(directory):
    with Queue(directory) as q:
        run_script(q)
        q.compact()
        q.put("t5", {})
    assert (directory / wal_name(14)).read_bytes() == frame(put_record(14, put_task("t5", {})))


def test_compact_of_a_queue_that_never_wrote_writes_nothing(directory):
    with Queue(directory) as q:
        assert q.compact() == 0
    assert sorted(read_dir(directory)) == ["LOCK", wal_name(1)]


def test_a_put_frame_of_exactly_max_frame_bytes_is_written(directory):
    base = len(canonical(put_record(1, put_task("big", {"b": ""}))))
    blob = "x" * (MAX_FRAME_BYTES - base)
    with Queue(directory) as q:
        q.put("big", {"b": blob})
    data = (directory / wal_name(1)).read_bytes()
    assert len(data) == 4 + MAX_FRAME_BYTES + 32
    assert data[:4] == MAX_FRAME_BYTES.to_bytes(4, "big")
    with Queue(directory) as q:
        assert q.get("big").payload == {"b": blob}


# -- directories written by hand ----------------------------------------------


def view(task_id, **fields):
    defaults = {
        "key": task_id,
        "status": "ready",
        "attempts": 0,
        "max_attempts": 3,
        "generation": 0,
        "available_at": 0,
        "deadline": None,
        "worker": None,
        "payload": {},
    }
    return TaskView(task_id=task_id, **(defaults | fields))


def test_a_hand_written_wal_opens_with_the_state_it_describes(directory):
    directory.mkdir()
    records = [
        put_record(1, put_task("a", {"x": 1}), put_task("b", {"y": [2]}, key="kb", max_attempts=1)),
        reserve_record(2, 7, "w", 10, ["a", "b"]),
        ack_record(3, 8, "a", "w", 1),
        expire_record(4, 17, ["b"]),
        revive_record(5, 20, ["b"]),
        put_record(6, put_task("c", {}, available_at=3)),
        reserve_record(7, 21, "v", 4, ["c"]),
        touch_record(8, 22, "c", "v", 1, 9),
        release_record(9, 23, "c", "v", 1, delay=2),
    ]
    (directory / wal_name(1)).write_bytes(frames(*records))
    with Queue(directory) as q:
        assert list(q.tasks()) == [
            view("a", status="completed", attempts=1, generation=1, payload=None),
            view("b", key="kb", max_attempts=1, generation=1, available_at=20, payload={"y": [2]}),
            view("c", attempts=1, generation=1, available_at=25),
        ]
        stats = q.stats()
        assert (stats.last_seq, stats.snapshot_seq, stats.wal_bytes) == (
            9,
            0,
            len(frames(*records)),
        )
        assert q.put("b", {"y": [2]}, key="kb", max_attempts=1) == "b"
        q.put("d", {})
    assert (directory / wal_name(1)).read_bytes() == frames(
        *records, put_record(10, put_task("d", {}))
    )


def test_a_hand_written_snapshot_current_and_wal_suffix_open_with_their_state(directory):
    directory.mkdir()
    entries = [
        snapshot_entry(
            "a", None, status="completed", attempts=1, generation=1, identity_payload={"x": 1}
        ),
        snapshot_entry(
            "b",
            {"y": 2},
            key="kb",
            status="leased",
            attempts=2,
            generation=5,
            deadline=50,
            worker="w",
            available_at=9,
            original_available_at=4,
        ),
        snapshot_entry(
            "c", {"z": 3}, status="dead", attempts=1, max_attempts=1, generation=1, available_at=12
        ),
    ]
    (directory / snapshot_name(7)).write_bytes(snapshot_bytes(7, entries))
    (directory / "CURRENT").write_bytes(current_bytes(7))
    suffix = [ack_record(8, 30, "b", "w", 5), revive_record(9, 31, ["c"])]
    (directory / wal_name(8)).write_bytes(frames(*suffix))
    with Queue(directory) as q:
        assert list(q.tasks()) == [
            view("a", status="completed", attempts=1, generation=1, payload=None),
            view(
                "b",
                key="kb",
                status="completed",
                attempts=2,
                generation=5,
                available_at=9,
                payload=None,
            ),
            view("c", max_attempts=1, generation=1, available_at=31, payload={"z": 3}),
        ]
        assert q.stats() == QueueStats(
            ready=1,
            leased=0,
            completed=2,
            dead=0,
            last_seq=9,
            snapshot_seq=7,
            wal_bytes=len(frames(*suffix)),
        )
        # The identity in the snapshot is the one of the ORIGINAL request.
        assert q.put("b", {"y": 2}, key="kb", available_at=4) == "b"
        assert q.put("a", {"x": 1}) == "a"
        q.put("d", {})
    assert (directory / wal_name(8)).read_bytes() == frames(
        *suffix, put_record(10, put_task("d", {}))
    )


def test_a_leased_task_in_a_hand_written_snapshot_keeps_its_lease(directory):
    directory.mkdir()
    entries = [
        snapshot_entry("b", {}, status="leased", attempts=1, generation=3, deadline=50, worker="w")
    ]
    (directory / snapshot_name(2)).write_bytes(snapshot_bytes(2, entries))
    (directory / "CURRENT").write_bytes(current_bytes(2))
    with Queue(directory) as q:
        assert q.reserve("x", now=49, lease_seconds=1) == []
        q.touch(Lease("b", "w", 3, 50, 1, {}), now=49, lease_seconds=10)
        (again,) = q.reserve("x", now=59, lease_seconds=1)
        assert again.generation == 4
    # No segment existed: one was created at S+1 and holds the new frames.
    assert sorted(read_dir(directory)) == sorted(["LOCK", "CURRENT", snapshot_name(2), wal_name(3)])
    assert (directory / wal_name(3)).read_bytes() == frames(
        touch_record(3, 49, "b", "w", 3, 10),
        expire_record(4, 59, ["b"]),
        reserve_record(5, 59, "x", 1, ["b"]),
    )


def test_frames_covered_by_the_snapshot_are_skipped_inside_a_segment(directory):
    directory.mkdir()
    records = [
        put_record(1, put_task("a", {})),
        put_record(2, put_task("b", {})),
        reserve_record(3, 0, "w", 5, ["a"]),
        ack_record(4, 1, "a", "w", 1),
    ]
    (directory / wal_name(1)).write_bytes(frames(*records))
    entries = [
        snapshot_entry("a", {}, status="leased", attempts=1, generation=1, deadline=5, worker="w"),
        snapshot_entry("b", {}),
    ]
    (directory / snapshot_name(3)).write_bytes(snapshot_bytes(3, entries))
    (directory / "CURRENT").write_bytes(current_bytes(3))
    with Queue(directory) as q:
        assert q.get("a").status == "completed"
        assert q.get("b").status == "ready"
        assert q.stats().last_seq == 4
        q.put("c", {})
    assert (directory / wal_name(1)).read_bytes().endswith(frame(put_record(5, put_task("c", {}))))


def test_several_hand_written_segments_are_read_in_order_and_the_newest_appended(directory):
    directory.mkdir()
    (directory / wal_name(1)).write_bytes(
        frames(put_record(1, put_task("a", {})), put_record(2, put_task("b", {})))
    )
    (directory / wal_name(3)).write_bytes(frame(reserve_record(3, 0, "w", 5, ["a", "b"])))
    (directory / wal_name(4)).write_bytes(frame(ack_record(4, 1, "b", "w", 1)))
    with Queue(directory) as q:
        assert [v.status for v in q.tasks()] == ["leased", "completed"]
        q.put("c", {})
    assert (directory / wal_name(4)).read_bytes() == frames(
        ack_record(4, 1, "b", "w", 1), put_record(5, put_task("c", {}))
    )
    assert len((directory / wal_name(3)).read_bytes()) == len(
        frame(reserve_record(3, 0, "w", 5, ["a", "b"]))
    )


def test_an_empty_newest_segment_after_a_snapshot_is_where_appends_go(directory):
    directory.mkdir()
    (directory / snapshot_name(4)).write_bytes(snapshot_bytes(4, [snapshot_entry("a", {})]))
    (directory / "CURRENT").write_bytes(current_bytes(4))
    (directory / wal_name(5)).write_bytes(b"")
    with Queue(directory) as q:
        assert q.stats().last_seq == 4
        q.put("b", {"k": "v"})
    assert (directory / wal_name(5)).read_bytes() == frame(put_record(5, put_task("b", {"k": "v"})))


def test_the_canonical_encoding_used_here_is_the_one_in_the_spec():
    value = {"b": [1, 2.5, None], "a": "é"}
    assert canonical(value) == b'{"a":"\xc3\xa9","b":[1,2.5,null]}'
    assert json.loads(canonical(value)) == value


def test_identities_survive_recovery_of_a_wal_that_moved_or_dropped_what_they_hash(directory):
    """The identity is of the ORIGINAL request, also when the task's payload
    was dropped (ack) or its available_at moved (release, expire, revive)
    before anyone asked for the identity."""
    directory.mkdir()
    records = [
        put_record(
            1,
            put_task("a", {"x": 1}, available_at=2),
            put_task("b", {"y": 2}, available_at=3, max_attempts=1),
            put_task("c", {"z": 3}, available_at=4),
        ),
        reserve_record(2, 5, "w", 5, ["a", "b", "c"]),
        ack_record(3, 6, "a", "w", 1),
        release_record(4, 6, "c", "w", 1, delay=9),
        expire_record(5, 10, ["b"]),
        revive_record(6, 11, ["b"]),
    ]
    (directory / wal_name(1)).write_bytes(frames(*records))
    with Queue(directory) as q:
        assert q.compact() == 6
        assert q.put("a", {"x": 1}, available_at=2) == "a"
        assert q.put("b", {"y": 2}, available_at=3, max_attempts=1) == "b"
        assert q.put("c", {"z": 3}, available_at=4) == "c"
    assert (directory / snapshot_name(6)).read_bytes() == snapshot_bytes(
        6,
        [
            snapshot_entry(
                "a",
                None,
                status="completed",
                attempts=1,
                generation=1,
                available_at=2,
                identity_payload={"x": 1},
            ),
            snapshot_entry(
                "b",
                {"y": 2},
                max_attempts=1,
                generation=1,
                available_at=11,
                original_available_at=3,
            ),
            snapshot_entry(
                "c", {"z": 3}, attempts=1, generation=1, available_at=15, original_available_at=4
            ),
        ],
    )
    # And once more through the snapshot just written.
    with Queue(directory) as q:
        q.put("d", {})
        assert q.compact() == 7
        assert q.put("b", {"y": 2}, available_at=3, max_attempts=1) == "b"
    entries = parse_frames((directory / snapshot_name(7)).read_bytes())[1:-1]
    assert [entry["identity"] for entry in entries[:3]] == [
        identity("a", {"x": 1}, 2),
        identity("b", {"y": 2}, 3, 1),
        identity("c", {"z": 3}, 4),
    ]
