"""The differential check of walqueue._speedups against the pure-Python reference, and its cases.

Used by tests/unit/test_speedups.py (a few thousand cases, seeded) and by
scripts/speedups_differential.py (a seeded run of a million or more). Each
check runs one input through both paths in this process and returns None
when they agree, else a description of the difference:

  - `scan_differs(data, stop)`: codec.scan_frames' compiled walk against
    the pure reader: the frames (offsets, and values with their types), the
    Tail, or the error (class, offset, message), and the bytes told to
    `progress`;
  - `snapshot_differs(data)`: snapshot loading (the bulk tombstone load):
    the entries and counts of the State, lookups of its tombstones, or the
    error;
  - `write_differs(state)`: the frames of a snapshot's entries, byte for byte.

The extension is whatever `speedups.speedups` is when called, so a broken
variant (tests/broken_speedups.py) is checked by patching it there.
"""

from __future__ import annotations

import hashlib
import json
import random
from contextlib import contextmanager
from unittest import mock

from walqueue import bulk, codec, speedups, tombstones
from walqueue.codec import Frame, canonical_json, encode_frame, frame_of_body
from walqueue.errors import CorruptStore, WalQueueError
from walqueue.snapshot import FORMAT, _parse_snapshot
from walqueue.state import State
from walqueue.tombstones import ENTRY


def typed(value):
    """`value` with its types spelled out: 1, 1.0 and True are equal in Python, not here."""
    try:
        return _typed(value)
    except RecursionError:   # nested deeper than Python recurses: its canonical text says it all
        return ("deep", canonical_json(value) if _encodable(value) else repr(type(value)))


def _encodable(value) -> bool:
    try:
        canonical_json(value)
    except (RecursionError, ValueError):
        return False
    return True


def _typed(value):
    if type(value) is dict:
        return ("dict", tuple((key, _typed(item)) for key, item in value.items()))
    if type(value) is list:
        return ("list", tuple(_typed(item) for item in value))
    if type(value) is float:
        return ("float", repr(value))
    return (type(value).__name__, value)


@contextmanager
def pure_path():
    """The reference path, in this process (what WALQUEUE_NO_EXTENSIONS=1 selects at import)."""
    with mock.patch.object(speedups, "COMPILED", False), \
            mock.patch.object(tombstones, "_find", tombstones._Block.find), \
            mock.patch.object(tombstones, "_search", tombstones._Block.search), \
            mock.patch.object(tombstones, "_index_find", tombstones._Index.find):
        yield


def _scan_outcome(data, stop, compiled: bool):
    told = []
    frames = []
    if compiled:
        scanner = codec._scan_compiled(data, "f", told.append, 0, stop)
    else:
        scanner = codec._scan_pure(data, "f", None, told.append, stop=stop)
    try:
        while True:
            frame = next(scanner)
            frames.append((frame.offset, frame.end, typed(frame.value)))
    except StopIteration as stopped:
        end = ("tail", stopped.value.offset, stopped.value.kind)
    except CorruptStore as error:
        # What `progress` was told before an error is not compared: the read stops there.
        return frames, ("error", type(error).__name__, error.offset, str(error)), None
    return frames, end, sum(told)


def scan_differs(data, stop=None) -> str | None:
    """None if both paths read `data` alike, else what differs."""
    pure = _scan_outcome(data, stop, compiled=False)
    compiled = _scan_outcome(data, stop, compiled=True)
    if pure == compiled:
        return None
    return _difference(pure, compiled)


def _difference(pure, compiled) -> str:
    if pure[0] != compiled[0]:
        for index, (left, right) in enumerate(zip(pure[0], compiled[0], strict=False)):
            if left != right:
                return f"frame {index}: pure {left!r:.300}, compiled {right!r:.300}"
        return f"pure read {len(pure[0])} frames, compiled {len(compiled[0])}"
    return f"pure {pure[1:]!r:.400}, compiled {compiled[1:]!r:.400}"


def _snapshot_outcome(data, compiled: bool):
    if compiled:
        return _load(data)
    with pure_path():
        return _load(data)


def _load(data):
    try:
        state = _parse_snapshot(data, "s", 1)
    except (CorruptStore, WalQueueError) as error:
        return ("error", type(error).__name__, getattr(error, "offset", None), str(error))
    entries = tuple(typed(entry) for entry in state.entries())
    found = tuple((task_id, state.tombstones.get(task_id), state.tombstones.get_by_key(task_id))
                  for task_id in _probes(state))
    return ("state", entries, tuple(sorted(state.counts.items())), state._last_loaded, found)


def _probes(state: State) -> list[str]:
    names = [name.decode() for name, _ in state.tombstones.frozen()]
    return names[::7] + [name + "~" for name in names[:3]] + ["absent"]


def snapshot_differs(data) -> str | None:
    pure = _snapshot_outcome(data, compiled=False)
    compiled = _snapshot_outcome(data, compiled=True)
    if pure == compiled:
        return None
    if pure[0] == compiled[0] == "state":
        for name, left, right in zip(("entries", "counts", "last", "lookups"), pure[1:], compiled[1:], strict=True):
            if left != right:
                return f"{name}: pure {left!r:.300}, compiled {right!r:.300}"
    return f"pure {pure!r:.400}, compiled {compiled!r:.400}"


def write_differs(state: State) -> str | None:
    compiled = b"".join(bulk.entry_frames(state))
    with pure_path():
        pure = b"".join(bulk.entry_frames(state))
    reference = b"".join(frame_of_body(body) for body in state.entry_bodies())
    if pure != reference:
        return "the pure bulk writer differs from State.entry_bodies"
    if compiled == pure:
        return None
    at = next(index for index, (a, b) in enumerate(zip(pure + b"\0", compiled + b"\1", strict=False)) if a != b)
    return f"compiled frames differ from byte {at}: pure {pure[at:at + 80]!r}, compiled {compiled[at:at + 80]!r}"


# -- case generation ---------------------------------------------------------------

_NAME_CHARS = "abcxyz09-_. ~!#[]{}é€𝄞\"\\\n\t\x01\x7f/"
_KEYS = ["a", "b", "ab", "B", "", "é", "z", "\n", "\"", "key", "𝄞", "seq", "op", "\x1f"]


def random_string(rng: random.Random, size: int = 8) -> str:
    return "".join(rng.choice(_NAME_CHARS) for _ in range(rng.randrange(size + 1)))


def random_number(rng: random.Random):
    kind = rng.randrange(8)
    if kind == 0:
        return rng.randrange(-10, 10)
    if kind == 1:
        return rng.randrange(-2**70, 2**70)
    if kind == 2:
        return rng.choice([0.0, -0.0, 0.1, 1.5, 1e16, 1e-7, 1e22, 123456789.0, 2.5e-308, 1.7e308])
    if kind == 3:
        return rng.uniform(-1e6, 1e6)
    if kind == 4:
        return rng.choice([10**18 - 1, 10**18, 10**19, -10**18, 2**63 - 1, 2**63, -2**63])
    return rng.randrange(10**rng.randrange(1, 20))


def random_value(rng: random.Random, depth: int = 0):
    kind = rng.randrange(9 if depth < 4 else 6)
    if kind == 0:
        return None
    if kind == 1:
        return rng.choice([True, False])
    if kind in (2, 3):
        return random_number(rng)
    if kind in (4, 5):
        return random_string(rng)
    if kind == 6:
        return [random_value(rng, depth + 1) for _ in range(rng.randrange(4))]
    return random_object(rng, depth + 1)


def random_object(rng: random.Random, depth: int = 0) -> dict:
    return {rng.choice(_KEYS) if rng.random() < 0.7 else random_string(rng, 4):
            random_value(rng, depth) for _ in range(rng.randrange(5))}


def nested(depth: int) -> dict:
    value: object = 1
    for _ in range(depth):
        value = {"a": [value]}
    return value


# Bodies that read as JSON, or nearly, and are not canonical (or not valid), each with a
# good digest once framed: what the reference rejects, and the extension must leave to it.
NOT_CANONICAL = [
    b'{"a": 1}', b'{"b":1,"a":2}', b'{"a":1,"a":1}', b'{"a":"\\/"}', b'{"a":"\\u00e9"}',
    b'{"a":"\\u000A"}', b'{"a":"\\u000a"}', b'{"a":"\\u001F"}', b'{"a":"\\u0041"}', b'{"a":1.0e0}',
    b'{"a":1E5}', b'{"a":-0}', b'{"a":01}', b'{"a":1.50}', b'{"a":.5}', b'{"a":1.}', b'{"a":NaN}',
    b'{"a":Infinity}', b'{"a":-Infinity}', b'{"a":1e999}', b'{"a":"\\ud800"}', b'{"a":"\\ud834\\udd1e"}',
    b'{"a":"\xff"}', b'{"a":"\xc0\xaf"}', b'{"a":"\xed\xa0\x80"}', b'{"a":"\x01"}', b'{"a":tru}',
    b'{"a":[1,]}', b'{"a":1,}', b'[1]', b'"a"', b'1', b'null', b'{}{}', b'{} ', b' {}', b'{"a"}',
    b'{"a":1}x', b'{"a":"\\x"}', b'{"a":"\\U0001"}', b'{"a":1e5}', b'{"a":100000000000000000000}',
    b'{"a":' + b"9" * 4301 + b'}', b'{"a":true,"a":false}', b'{"\\u0000":1,"\\u0001":1}',
    b'{"a":"\\b\\f"}', b'{"a":"\\t","b":"\\u0009"}', b'{"\xc3\xa9":1,"z":2}',
    b'{"a":' + b"[" * 70 + b"]" * 70 + b"}", b'{"a":' + b"[" * 2000 + b"]" * 2000 + b"}",
    b'{"a":-1.5E-7}', b'{"a":1e-07}', b'{"a":1e+16}', b'{"a":1.0E16}',
]


def raw_frame(body: bytes, *, digest: bytes | None = None, length: int | None = None) -> bytes:
    length = len(body) if length is None else length
    return (length.to_bytes(4, "big") + body
            + (hashlib.sha256(body).digest() if digest is None else digest))


def tombstone_entry(task_id: str, *, key: str | None = None, attempts: int = 1,
                    max_attempts: int = 3, generation: int = 1, available_at: int = 1_700_000_000,
                    identity: str | None = None) -> dict:
    return {"attempts": attempts, "available_at": available_at, "deadline": None,
            "generation": generation,
            "identity": identity or hashlib.sha256(task_id.encode()).hexdigest(),
            "key": task_id if key is None else key, "max_attempts": max_attempts,
            "payload": None, "status": "completed", "task_id": task_id, "worker": None}


def live_entry(task_id: str, *, key: str | None = None) -> dict:
    return {"attempts": 0, "available_at": 5, "deadline": None, "generation": 0,
            "identity": hashlib.sha256(b"live" + task_id.encode()).hexdigest(),
            "key": task_id if key is None else key, "max_attempts": 3, "payload": {"n": 1},
            "status": "ready", "task_id": task_id, "worker": None}


def random_entries(rng: random.Random) -> list[dict]:
    """Snapshot entries in task_id order: mostly plain tombstones, some live tasks, odd names."""
    # Mostly small (cheap: a million cases in minutes); a sixth cross a block's bound.
    count = rng.choice([0, 1, 2, 5, 13, 40, 0, 1, 3, 8, 20, 60, 511, 512, 513, 700, 1100, 1025]
                       if rng.random() < 0.5 else [0, 1, 2, 3, 5, 8, 13, 21, 40])
    prefix = rng.choice(["t-", "job/", "é-", "a\"b-", "x"])
    ids = sorted({f"{prefix}{rng.randrange(10**6):06d}" for _ in range(count)})
    entries = []
    for task_id in ids:
        roll = rng.random()
        if roll < 0.03:
            entries.append(live_entry(task_id))
        elif roll < 0.05:
            entries.append(tombstone_entry(task_id, key="k/" + task_id))
        elif roll < 0.06:
            entries.append(tombstone_entry(task_id, attempts=2, max_attempts=2**40, generation=7))
        else:
            entries.append(tombstone_entry(task_id, attempts=rng.randrange(1, 3), max_attempts=3,
                                           generation=rng.randrange(2, 5)))
    return entries


def snapshot_bytes(entries: list[dict], *, count: int | None = None) -> bytes:
    count = len(entries) if count is None else count
    frames = [encode_frame({"format": FORMAT, "kind": "walqueue.snapshot", "seq": 1,
                            "task_count": count})]
    frames += [encode_frame(entry) for entry in entries]
    frames.append(encode_frame({"kind": "end", "task_count": count}))
    return b"".join(frames)


def mutate_entries(rng: random.Random, entries: list[dict]) -> list[dict]:
    """One change that breaks a rule of State.load_entry (or none), digests kept good."""
    entries = [dict(entry) for entry in entries]
    if not entries:
        return entries
    index = rng.randrange(len(entries))
    entry = entries[index]
    change = rng.randrange(12)
    if change == 0:
        entry["attempts"] = 0
    elif change == 1:
        entry["attempts"] = entry["max_attempts"] + 1
    elif change == 2:
        entry["generation"] = 0
    elif change == 3 and index:
        entries[index - 1], entries[index] = entries[index], entries[index - 1]
    elif change == 4 and index:
        entry["key"] = entries[index - 1]["task_id"]
    elif change == 5:
        entry["available_at"] = 2**63
    elif change == 6:
        entry["max_attempts"] = 2**63 + 5
    elif change == 7 and index:
        entry["task_id"] = entries[index - 1]["task_id"]
    elif change == 8:
        entry["identity"] = entry["identity"].upper()
    elif change == 9:
        entry["key"] = entry["task_id"] + "\n"
    elif change == 10 and index:
        entries[index - 1]["key"] = entry["task_id"]
    return entries


def mutate_bytes(rng: random.Random, data: bytes) -> bytes:
    """One damage to a buffer of frames: truncation, a flipped byte, a bad length, garbage, ..."""
    if not data:
        return rng.choice([b"", b"\0\0", b"\0\0\0\0", raw_frame(b"{}")])
    kind = rng.randrange(8)
    position = rng.randrange(len(data))
    if kind == 0:
        return data[:position]
    if kind == 1:
        return data[:position] + bytes([data[position] ^ (1 << rng.randrange(8))]) + data[position + 1:]
    if kind == 2:
        return data + b"\0" * rng.randrange(1, 40)
    if kind == 3:
        return data + bytes(rng.randrange(256) for _ in range(rng.randrange(1, 60)))
    if kind == 4:
        return data[:position] + rng.randbytes(4) + data[position + 4:]
    if kind == 5:
        length = rng.choice([0, 1, 2**24, 2**24 + 1, 2**32 - 1, rng.randrange(2**16)])
        return length.to_bytes(4, "big") + data[4:]
    if kind == 6:
        return data[:position] + data[position + rng.randrange(1, 50):]
    return data


def random_frames(rng: random.Random) -> bytes:
    """A buffer of frames: canonical records, tombstone entries, non-canonical bodies, damage."""
    parts = []
    for _ in range(rng.randrange(1, 6)):
        roll = rng.random()
        if roll < 0.45:
            parts.append(encode_frame(random_object(rng)))
        elif roll < 0.6:
            parts.append(encode_frame(tombstone_entry(random_string(rng) or "x")))
        elif roll < 0.8:
            parts.append(raw_frame(rng.choice(NOT_CANONICAL)))
        elif roll < 0.9:
            body = canonical_json(random_object(rng))
            parts.append(raw_frame(body, digest=rng.randbytes(32)))
        else:
            body = canonical_json(random_object(rng))
            flip = rng.randrange(len(body))
            parts.append(raw_frame(body[:flip] + bytes([body[flip] ^ 0x20]) + body[flip + 1:]))
    data = b"".join(parts)
    return mutate_bytes(rng, data) if rng.random() < 0.5 else data


def random_state(rng: random.Random) -> State:
    """A State with tombstones loaded, some added out of order (split blocks), live tasks."""
    state = State()
    entries = random_entries(rng)
    for entry in entries:
        state.load_entry(entry)
    for _ in range(rng.randrange(0, 30)):
        task_id = random_string(rng, 10) or "y"
        if task_id not in state.tasks and state.tombstones.get(task_id) is None \
                and not state._key_taken(task_id) and "\n" not in task_id:
            numbers = (1, rng.choice([3, 2**40]), 1, 5)
            state.tombstones.add(task_id, task_id, hashlib.sha256(task_id.encode()).digest(), *numbers)
    return state


# The share of each kind of case: a frame walk costs ~0.5 ms, a snapshot load or
# write ~15-20 ms (both paths, a State each), so the long run leans on walks.
MIX = {"scan": 0.6, "snapshot": 0.3}
LONG_RUN_MIX = {"scan": 0.97, "snapshot": 0.025}


def check_case(rng: random.Random, mix: dict[str, float] = MIX) -> tuple[str, str | None]:
    """One random case of a random kind (`mix`: the shares of scan and snapshot cases, the rest
    writes): (kind, difference or None)."""
    roll = rng.random()
    if roll < mix["scan"]:
        data = random_frames(rng)
        return "scan", scan_differs(data, ENTRY if rng.random() < 0.3 else None)
    if roll < mix["scan"] + mix["snapshot"]:
        entries = random_entries(rng)
        if rng.random() < 0.5:
            entries = mutate_entries(rng, entries)
        data = snapshot_bytes(entries)
        if rng.random() < 0.2:
            data = mutate_bytes(rng, data)
        return "snapshot", snapshot_differs(data)
    return "write", write_differs(random_state(rng))


def as_json(value) -> str:
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


__all__ = ["LONG_RUN_MIX", "MIX", "Frame", "NOT_CANONICAL", "check_case", "nested", "pure_path", "random_frames",
           "raw_frame", "scan_differs", "snapshot_bytes", "snapshot_differs", "tombstone_entry",
           "live_entry", "typed", "write_differs", "as_json"]
