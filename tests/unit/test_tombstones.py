"""Tombstones (completed tasks) kept packed: the store agrees with a dict, the
snapshot's tombstone entries are written and read without the JSON codec
yet byte for byte as SPEC §4 says, and every rule a general entry must keep
is kept on the fast path too (the bad entry named by its offset)."""

from __future__ import annotations

import random

import pytest

from walqueue import CorruptStore, Queue, speedups
from walqueue import tombstones as tombstones_module
from walqueue.codec import canonical_json
from walqueue.state import State
from walqueue.tombstones import ENTRY, Tombstone, TombstoneStore, entry_body

from .frames import (
    current_bytes,
    frame,
    frame_body,
    snapshot_end,
    snapshot_entry,
    snapshot_header,
    snapshot_name,
)

NAME_ALPHABET = "abcxyz-_09 ~\"\\\n\té€😀"


def random_name(rng: random.Random, plain: bool) -> str:
    alphabet = "abcxyz-_09~ " if plain else NAME_ALPHABET
    return "".join(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))


def random_tombstone(rng: random.Random, task_id: str, key: str) -> Tombstone:
    big = rng.choice([0, 1, 7, 2**31, 2**63 - 1])
    max_attempts = rng.randint(1, 5) if big < 2**31 else big
    attempts = rng.randint(1, max_attempts) if max_attempts < 10 else max_attempts
    return Tombstone(task_id, key, rng.randbytes(32), attempts, max_attempts,
                     attempts + rng.choice([0, 1, 1000]) if attempts < 2**62 else attempts,
                     rng.choice([0, 5, 1_700_000_000, 2**63 - 1]))


def entry_of(tombstone: Tombstone) -> dict:
    return {"attempts": tombstone.attempts, "available_at": tombstone.available_at,
            "deadline": None, "generation": tombstone.generation,
            "identity": tombstone.identity.hex(), "key": tombstone.key,
            "max_attempts": tombstone.max_attempts, "payload": None, "status": "completed",
            "task_id": tombstone.task_id, "worker": None}


@pytest.fixture
def small_blocks(monkeypatch):
    """Blocks of 4 tombstones, so that a few dozen fill, split and chain many."""
    monkeypatch.setattr(tombstones_module, "BLOCK_TOMBSTONES", 4)


def test_an_empty_store_finds_nothing_not_even_an_empty_name() -> None:
    store = TombstoneStore()
    assert len(store) == 0 and list(store.frozen()) == []
    for name in ("", "a", "\udcff"):
        assert store.get(name) is None and store.get_by_key(name) is None and name not in store


@pytest.mark.parametrize("arrival", ["ascending", "descending", "random"])
def test_the_store_agrees_with_a_dict_whatever_the_arrival_order(small_blocks, arrival) -> None:
    for seed in range(30):
        rng = random.Random(seed)
        expected: dict[str, Tombstone] = {}
        keys: set[str] = set()
        while len(expected) < rng.randint(1, 60):
            task_id = random_name(rng, plain=seed % 2 == 0)
            key = task_id if rng.random() < 0.7 else random_name(rng, plain=False)
            if task_id not in expected and key not in keys:
                expected[task_id] = random_tombstone(rng, task_id, key)
                keys.add(key)
        order = sorted(expected, key=lambda name: name.encode())
        if arrival == "descending":
            order.reverse()
        elif arrival == "random":
            rng.shuffle(order)
        store = TombstoneStore()
        frozen_after = rng.randrange(len(order))
        for index, task_id in enumerate(order):
            if index == frozen_after:
                frozen, frozen_ids = store.frozen(), sorted(order[:index])
            store.add(*expected[task_id])
        where = f"seed {seed}, {arrival}"
        assert len(store) == len(expected), where
        for task_id, tombstone in expected.items():
            assert store.get(task_id) == tombstone, where
            assert task_id in store, where
            assert store.get_by_key(tombstone.key) == tombstone, where
        for task_id in ("", "never", "\udcff", order[0] + "\x00"):
            assert store.get(task_id) is None and task_id not in store, where
            if task_id not in keys:
                assert store.get_by_key(task_id) is None, where
        walked = [tombstone for _, tombstone in store.frozen()]
        assert walked == [expected[task_id] for task_id in sorted(expected)], where
        # A frozen view walks exactly what was there when it was taken.
        assert [tombstone.task_id for _, tombstone in frozen] == frozen_ids, where
        bodies = list(store.frozen().bodies())
        assert bodies == [(tombstone.task_id.encode(), canonical_json(entry_of(tombstone)))
                          for tombstone in walked], where


def names_to_look_up(seed: int, most: int) -> tuple[list[bytes], list[bytes], list[bytes]]:
    """(names in order, the same in a random arrival order for two seeds in three, probes: the
    names and names around them) of a lookup differential's case."""
    rng = random.Random(seed)
    names = sorted({random_name(rng, plain=seed % 2 == 0).encode() for _ in range(rng.randint(0, most))})
    arrival = names[:]
    if seed % 3:
        rng.shuffle(arrival)
    probes = names + [name + b"\x00" for name in names] + [name[:-1] for name in names] + [
        b"", b"\xff", b"a", b"zzzz", "é".encode(), "😀".encode()]
    return names, arrival, probes


def lookup_differences(seed: int) -> list[str]:
    """A block filled in a random arrival order, then both lookups asked, compiled and pure, of
    every name it holds and of names around them; every disagreement, described."""
    names, arrival, probes = names_to_look_up(seed, 40)
    block = tombstones_module._Block()
    for name in arrival:   # as _Index.add inserts: at the rank the pure search gives
        block.insert(block.search(name)[0], name, b"", bytes(32), (1, 3, 1, 0))
    if seed % 5 == 0 and len(block):   # every name hashed alike: the find's compare loop decides
        block.hashes = tombstones_module.array("I", [hash(names[0]) & 0xFFFFFFFF] * len(block))
    real = speedups.speedups
    differences = []
    for probe in probes:
        for name, compiled, pure in (("find", real.block_find, tombstones_module._Block.find),
                                     ("search", real.block_search, tombstones_module._Block.search)):
            if compiled(block, probe) != pure(block, probe):
                differences.append(f"seed {seed}: {name}({probe!r}) compiled {compiled(block, probe)} "
                                   f"pure {pure(block, probe)}")
    return differences


def index_differences(seed: int) -> list[str]:
    """An index of small blocks filled in a random order, asked by `_Index.find` and its
    compiled twin for every name it holds and names around them; every disagreement."""
    _, arrival, probes = names_to_look_up(seed, 60)
    index = tombstones_module._Index()
    for name in arrival:
        index.add(name, b"", bytes(32), (1, 3, 1, 0))
    compiled, pure = speedups.speedups.index_find, tombstones_module._Index.find
    return [f"seed {seed}: find({probe!r}) compiled {compiled(index, probe)} pure {pure(index, probe)}"
            for probe in probes if compiled(index, probe) != pure(index, probe)]


@pytest.mark.skipif(not speedups.COMPILED, reason=speedups.describe())
def test_the_compiled_block_lookups_answer_as_the_pure_ones() -> None:
    differences = [difference for seed in range(400) for difference in lookup_differences(seed)]
    assert differences == []
    assert tombstones_module._find is speedups.speedups.block_find   # and the store uses them


@pytest.mark.skipif(not speedups.COMPILED, reason=speedups.describe())
def test_the_compiled_index_lookup_answers_as_the_pure_one(monkeypatch) -> None:
    monkeypatch.setattr(tombstones_module, "BLOCK_TOMBSTONES", 4)   # many blocks, splits among them
    assert [difference for seed in range(300) for difference in index_differences(seed)] == []
    assert tombstones_module._index_find is speedups.speedups.index_find
    real = speedups.speedups.index_find

    def first_block_only(index, name):   # the deliberately broken twin: bisects nothing
        found = real(index, name)
        return found if found is None or found[0] is index.blocks[0] else None

    monkeypatch.setattr(speedups.speedups, "index_find", first_block_only, raising=False)
    assert any(index_differences(seed) for seed in range(50))


@pytest.mark.skipif(not speedups.COMPILED, reason=speedups.describe())
def test_the_lookup_differential_finds_a_search_that_stops_one_short(monkeypatch) -> None:
    real = speedups.speedups.block_search

    def one_short(block, name):   # the deliberately broken twin: a rank one too small
        rank, index = real(block, name)
        return (max(rank - 1, 0), index) if index < 0 else (rank, index)

    monkeypatch.setattr(speedups.speedups, "block_search", one_short, raising=False)
    assert any(lookup_differences(seed) for seed in range(50))


def test_a_tombstone_entry_is_formatted_exactly_as_canonical_json() -> None:
    rng = random.Random(7)
    for _ in range(2000):
        tombstone = random_tombstone(rng, random_name(rng, plain=False), random_name(rng, plain=False))
        assert entry_body(tombstone) == canonical_json(entry_of(tombstone)), tombstone


def test_the_entry_pattern_matches_canonical_plain_tombstones_and_nothing_else() -> None:
    tombstone = Tombstone("task-1", "task-1", bytes(range(32)), 1, 3, 2, 0)
    body = entry_body(tombstone)
    assert ENTRY.fullmatch(body).groups() == (
        b"1", b"0", b"2", bytes(range(32)).hex().encode(), b"task-1", b"3", b"task-1")
    not_taken = [
        body.replace(b'"attempts":1', b'"attempts":01'),         # not canonical
        body.replace(b'"attempts":1', b'"attempts": 1'),         # not canonical
        body.replace(b'"task_id":"task-1"', b'"task_id":"task\\u0031"'),  # an escape
        body.replace(b'"key":"task-1"', b'"key":""'),            # an empty key
        body.replace(b'"payload":null', b'"payload":{}'),         # not a tombstone
        body.replace(bytes(range(32)).hex().encode(), b"A" * 64),  # upper-case hex
        body + b" ",
    ]
    for other in not_taken:
        assert ENTRY.fullmatch(other) is None, other


# -- snapshots -------------------------------------------------------------------


def completed(task_id, key=None, attempts=1, max_attempts=3, generation=1, available_at=0):
    return snapshot_entry(task_id, {}, key=key, status="completed", attempts=attempts,
                          max_attempts=max_attempts, generation=generation,
                          available_at=available_at) | {"payload": None}


def write_snapshot(directory, entries: list, bodies: dict[int, bytes] | None = None) -> list[int]:
    """A hand-written snapshot at seq 1 (entry i's body replaced by bodies[i]); the entries' offsets."""
    directory.mkdir(exist_ok=True)
    data = bytearray(frame(snapshot_header(1, len(entries))))
    offsets = []
    for index, entry in enumerate(entries):
        offsets.append(len(data))
        data += frame_body((bodies or {}).get(index) or canonical_json(entry))
    data += frame(snapshot_end(len(entries)))
    (directory / snapshot_name(1)).write_bytes(bytes(data))
    (directory / "CURRENT").write_bytes(current_bytes(1))
    return offsets


def mixed_entries(count: int) -> list[dict]:
    """Tombstones, most with key = id, some with another key or a non-ASCII id, and live tasks."""
    entries = []
    for index in range(count):
        task_id = f"t{index:05d}"
        if index % 97 == 5:
            entries.append(snapshot_entry(task_id, {"n": index}))
        elif index % 89 == 3:
            entries.append(completed(task_id, key=f"key-{index}"))
        elif index % 83 == 4:
            entries.append(completed(task_id + "é"))
        else:
            # Some numbers need 8 bytes, in blocks that held only 4-byte ones so far.
            entries.append(completed(task_id, attempts=1 + index % 3, generation=2 + index % 3,
                                     available_at=index if index % 700 else 2**63 - 1 - index))
    return entries


def test_a_snapshot_of_tombstones_and_live_tasks_loads_and_is_written_back_byte_for_byte(
        tmp_path) -> None:
    entries = mixed_entries(3000)
    write_snapshot(tmp_path / "q", entries)
    original = (tmp_path / "q" / snapshot_name(1)).read_bytes()
    with Queue(tmp_path / "q") as q:
        stats = q.stats()
        assert (stats.ready, stats.completed) == (31, 2969)
        assert [view.task_id for view in q.tasks()] == [entry["task_id"] for entry in entries]
        assert q.get("t00100").status == "completed" and q.get("t00100").attempts == 2
        assert q.put("t00003", {}, key="key-3") == "t00003"   # the identity of {} as its payload
        q.put("z-after", {})   # sorts after every other task
        q.compact()
    rewritten = (tmp_path / "q" / snapshot_name(2)).read_bytes()
    header = len(frame(snapshot_header(1, 3001)))
    assert rewritten[header:].startswith(original[len(frame(snapshot_header(1, 3000))):
                                                  -len(frame(snapshot_end(3000)))])


def test_the_fast_path_loads_the_same_state_as_the_general_reader(tmp_path) -> None:
    entries = mixed_entries(1500)
    write_snapshot(tmp_path / "q", entries)
    with Queue(tmp_path / "q") as q:
        fast = list(q.tasks())
    general = State()
    for entry in entries:
        general.load_entry(entry)
    general.finish_loading(1)
    assert [view.task_id for view in fast] == [task.task_id for task in general.in_order()]
    assert list(general.entries()) == entries


BAD_TOMBSTONES = {
    "out of task_id order": (lambda entries: entries.insert(300, entries.pop(299)),
                             "out of task_id order", 300),
    "a repeated task id": (lambda entries: entries.__setitem__(300, entries[299]),
                           "out of task_id order", 300),
    "attempts above generation": (lambda entries: entries.__setitem__(
        300, completed("t00300", attempts=2, generation=1)), "impossible", 300),
    "attempts above max_attempts": (lambda entries: entries.__setitem__(
        300, completed("t00300", attempts=4, generation=4)), "impossible", 300),
    "zero attempts": (lambda entries: entries.__setitem__(
        300, completed("t00300", attempts=0, generation=0)), "impossible", 300),
    "a number of 2**63": (lambda entries: entries.__setitem__(
        300, completed("t00300", available_at=2**63)), "out of range", 300),
    "a key used by an earlier live task": (lambda entries: entries.__setitem__(
        10, snapshot_entry("t00010", {}, key="t00300")), "used by two tasks", 300),
    "a key used by an earlier tombstone": (lambda entries: entries.__setitem__(
        10, completed("t00010", key="t00300")), "used by two tasks", 300),
    "a key used twice in one block": (lambda entries: entries.__setitem__(
        300, completed("t00300", key="t00299x")) or entries.__setitem__(
        301, completed("t00301", key="t00299x")), "used by two tasks", 301),
}


@pytest.mark.parametrize("damage", sorted(BAD_TOMBSTONES))
def test_a_tombstone_entry_breaking_a_rule_is_corrupt_and_named_by_its_offset(tmp_path,
                                                                                damage) -> None:
    change, message, bad = BAD_TOMBSTONES[damage]
    entries = [completed(f"t{index:05d}") for index in range(1000)]
    change(entries)
    offsets = write_snapshot(tmp_path / "q", entries)
    with pytest.raises(CorruptStore, match=rf"entry at offset {offsets[bad]}: .*{message}"):
        Queue(tmp_path / "q")


@pytest.mark.parametrize("damage", ["flipped byte", "non-canonical", "torn"])
def test_a_damaged_tombstone_frame_is_reported_by_the_general_reader(tmp_path, damage) -> None:
    entries = [completed(f"t{index:05d}") for index in range(1000)]
    body = canonical_json(entries[700])
    bodies = {700: body.replace(b'"generation":1', b'"generation": 1')} \
        if damage == "non-canonical" else None
    offsets = write_snapshot(tmp_path / "q", entries, bodies)
    path = tmp_path / "q" / snapshot_name(1)
    data = bytearray(path.read_bytes())
    if damage == "flipped byte":
        data[offsets[700] + 20] ^= 1
        expected = rf"offset {offsets[700]} fails its SHA-256 checksum"
    elif damage == "torn":
        del data[offsets[700] + 40:]
        expected = rf"an incomplete frame at offset {offsets[700]}"
    else:
        expected = rf"offset {offsets[700]} is not in canonical JSON form"
    path.write_bytes(bytes(data))
    with pytest.raises(CorruptStore, match=expected):
        Queue(tmp_path / "q")


def test_a_first_frame_that_is_a_tombstone_is_not_a_header(tmp_path) -> None:
    directory = tmp_path / "q"
    directory.mkdir()
    entry = completed("a")
    (directory / snapshot_name(1)).write_bytes(frame(entry) + frame(snapshot_end(0)))
    (directory / "CURRENT").write_bytes(current_bytes(1))
    with pytest.raises(CorruptStore, match="header frame at offset 0 is not a format-1"):
        Queue(directory)


# -- serving ------------------------------------------------------------------------


def test_acked_tasks_leave_the_live_tasks_for_the_store_and_answer_as_before(tmp_path) -> None:
    with Queue(tmp_path / "q") as q:
        q.put_many([{"task_id": f"t{index}", "payload": {"n": index},
                     "key": f"k{index}" if index % 2 else None} for index in range(50)])
        for lease in q.reserve("w", now=1, lease_seconds=10, limit=50):
            q.ack(lease, now=2)
        state = q.engine._state
        assert state.tasks == {} and state.task_id_by_key == {} and len(state.tombstones) == 50
        assert q.put("t3", {"n": 3}, key="k3") == "t3"
        assert q.put("t4", {"n": 4}) == "t4"
        assert q.stats().completed == 50
        assert [view.task_id for view in q.tasks("completed")] == sorted(f"t{i}" for i in range(50))


def test_tasks_lists_what_there_was_when_called_each_as_it_is_when_reached(tmp_path) -> None:
    with Queue(tmp_path / "q") as q:
        q.put_many([{"task_id": f"t{index}", "payload": {}} for index in range(6)])
        leases = q.reserve("w", now=1, lease_seconds=10, limit=3)
        q.ack(leases[0], now=2)                       # t0: a tombstone before the call
        listing = q.tasks()
        q.ack(leases[1], now=3)                       # t1: leased when called, completed now
        q.put("t15", {})
        (late,) = [lease for lease in q.reserve("w", now=4, lease_seconds=10, limit=4)
                   if lease.task_id == "t15"]
        q.ack(late, now=5)                            # t15: not there when called
        assert [(view.task_id, view.status) for view in listing] == [
            ("t0", "completed"), ("t1", "completed"), ("t2", "leased"), ("t3", "leased"),
            ("t4", "leased"), ("t5", "leased")]


def test_the_pages_of_a_mapped_file_already_read_are_handed_back(tmp_path) -> None:
    from walqueue.fs import RELEASE_BYTES, OsFileSystem, release_pages

    def resident_bytes() -> int:
        with open("/proc/self/statm") as statm:
            return int(statm.read().split()[1]) * 4096

    path = tmp_path / "file"
    path.write_bytes(bytes(range(256)) * (3 * RELEASE_BYTES // 256))
    fs = OsFileSystem()
    directory = fs.open_directory(str(tmp_path))
    try:
        data = fs.read(directory, path.name)
    finally:
        fs.close_directory(directory)
    try:
        assert sum(data[offset + 1] for offset in range(0, len(data), 4096)) > 0  # every page read
        assert release_pages(data, 0, RELEASE_BYTES - 1) == 0   # not enough yet: kept
        before = resident_bytes()
        assert release_pages(data, 0, len(data)) == len(data)
        assert before - resident_bytes() > 2 * RELEASE_BYTES
        assert data[len(data) - 1] == 255   # what was handed back reads the same
    finally:
        data.close()
    assert release_pages(b"x" * RELEASE_BYTES * 2, 0, RELEASE_BYTES * 2) == 0   # not a mapping


# -- verify: the same reader keeping going -------------------------------------------


def verify_agrees_with_open(directory):
    """verify's report, its first corrupt problem where open's CorruptStore says."""
    from walqueue.verify import CORRUPT, verify_directory

    report = verify_directory(directory)
    try:
        with Queue(directory) as q:
            stats = q.stats()
    except CorruptStore as error:
        first = report.by_severity(CORRUPT)[0]
        assert (first.file, first.offset, first.seq) == (error.file, error.offset, error.seq)
    else:
        assert not report.corrupt
        assert report.counts == {"ready": stats.ready, "leased": stats.leased,
                                 "completed": stats.completed, "dead": stats.dead}
    return [problem.offset for problem in report.by_severity(CORRUPT)]


def test_verify_of_a_snapshot_of_tombstones_counts_what_open_loads(tmp_path) -> None:
    write_snapshot(tmp_path / "q", mixed_entries(3000))
    assert verify_agrees_with_open(tmp_path / "q") == []


@pytest.mark.parametrize("damage", sorted(BAD_TOMBSTONES))
def test_verify_names_a_tombstone_entry_breaking_a_rule_by_its_offset(tmp_path, damage) -> None:
    change, _, bad = BAD_TOMBSTONES[damage]
    entries = [completed(f"t{index:05d}") for index in range(1000)]
    change(entries)
    offsets = write_snapshot(tmp_path / "q", entries)
    assert verify_agrees_with_open(tmp_path / "q")[0] == offsets[bad]


def test_verify_reports_every_bad_tombstone_entry_and_damaged_frame_in_order(tmp_path) -> None:
    entries = [completed(f"t{index:05d}") for index in range(2000)]
    entries[100] = completed("t00100", attempts=0, generation=0)      # a rule, in a block
    entries[900] = completed("t00900", attempts=5, generation=5)      # another block
    entries[901] = completed("t00901", available_at=2**63)            # the same block
    offsets = write_snapshot(tmp_path / "q", entries)
    path = tmp_path / "q" / snapshot_name(1)
    data = bytearray(path.read_bytes())
    data[offsets[1500] + 20] ^= 1                                      # a damaged frame
    path.write_bytes(bytes(data))
    found = verify_agrees_with_open(tmp_path / "q")
    assert found == [offsets[100], offsets[900], offsets[901], offsets[1500]]


def test_verify_progress_counts_the_fast_paths_bytes_once(tmp_path) -> None:
    from walqueue.verify import verify_directory

    write_snapshot(tmp_path / "q", mixed_entries(3000))
    size = (tmp_path / "q" / snapshot_name(1)).stat().st_size
    calls = []
    verify_directory(tmp_path / "q", progress=lambda done, total: calls.append((done, total)))
    assert len(calls) > 3 and all(total == size for _, total in calls)
    dones = [done for done, _ in calls]
    assert dones == sorted(dones) and dones[-2] == size   # the readers' own count, before finish()
