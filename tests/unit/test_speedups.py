"""walqueue._speedups against the pure-Python reference: the differential test (issue 22).

The extension must accept exactly what the reference accepts, read it to the
same values, and leave to the reference (which raises) what it rejects: the
same error class, offset and message. Each check runs both paths on one input
(tests/speedups_cases.py): seeded random cases of every kind, hypothesis
buffers, the non-canonical bodies, and mutations of real files (a queue's WAL
and snapshot: every truncation, flipped bytes, bad lengths and digests). The
broken variants (tests/broken_speedups.py) show the check can fail: it finds
each. scripts/speedups_differential.py runs a million seeded cases or more.

On the pure path (WALQUEUE_NO_EXTENSIONS=1, or no compiler) there is nothing
to compare and the differential tests skip; the subprocess tests still run.
"""

from __future__ import annotations

import hashlib
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests import broken_speedups
from tests.speedups_cases import (
    NOT_CANONICAL,
    check_case,
    nested,
    raw_frame,
    scan_differs,
    snapshot_bytes,
    snapshot_differs,
    tombstone_entry,
    write_differs,
)
from walqueue import Queue, speedups
from walqueue.codec import encode_frame
from walqueue.state import State
from walqueue.tombstones import ENTRY

REPO = Path(__file__).resolve().parents[2]
compiled_only = pytest.mark.skipif(not speedups.COMPILED, reason=speedups.describe())
SEED = 22_2026


def run_cases(seed: int, count: int, *, first: bool = False) -> list[tuple[int, str, str]]:
    """The differences among `count` seeded cases (only the first one, `first`)."""
    rng = random.Random(seed)
    found = []
    for index in range(count):
        kind, difference = check_case(rng)
        if difference is not None:
            found.append((index, kind, difference))
            if first:
                break
    return found


@compiled_only
def test_seeded_random_cases_of_every_kind_agree():
    assert run_cases(SEED, 1000) == []


@compiled_only
@pytest.mark.parametrize("body", NOT_CANONICAL, ids=range(len(NOT_CANONICAL)))
def test_a_body_the_reference_rejects_is_rejected_alike(body):
    before = encode_frame({"seq": 1})
    data = before + raw_frame(body) + encode_frame({"seq": 2})
    assert scan_differs(data) is None
    assert scan_differs(data, ENTRY) is None


@compiled_only
@pytest.mark.parametrize("depth", [1, 60, 1000, 5000])
def test_deep_nesting_reads_alike(depth):
    assert scan_differs(encode_frame(nested(min(depth, 100)))) is None
    # Deeper than the encoder recurses: written by hand, read (or refused) alike.
    assert scan_differs(raw_frame(b'{"a":' + b"[" * depth + b"1" + b"]" * depth + b"}")) is None


@compiled_only
@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.binary(max_size=200), st.booleans())
def test_arbitrary_bytes_read_alike(data, stop):
    assert scan_differs(data, ENTRY if stop else None) is None


@compiled_only
@settings(max_examples=200, deadline=None)
@given(st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8),
                    lambda children: st.lists(children, max_size=3)
                    | st.dictionaries(st.text(max_size=4), children, max_size=3), max_leaves=12),
       st.integers(min_value=0, max_value=2**32 - 1))
def test_hypothesis_values_framed_then_damaged_read_alike(value, damage):
    try:
        data = encode_frame({"v": value})
    except ValueError:   # NaN or infinity: no canonical form to write
        return
    assert scan_differs(data) is None
    position = damage % len(data)
    flipped = data[:position] + bytes([data[position] ^ (1 + damage % 255)]) + data[position + 1:]
    assert scan_differs(flipped) is None
    assert scan_differs(data[:position]) is None
    assert scan_differs(data + data[:position]) is None


@pytest.fixture(scope="module")
def real_files(tmp_path_factory) -> dict[str, bytes]:
    """A queue's own WAL segment and snapshot, of put, reserve, ack traffic and tombstones."""
    directory = tmp_path_factory.mktemp("queue")
    queue = Queue(directory)
    try:
        for round_ in range(3):
            queue.put_many([{"task_id": f"t-{round_}-{n:04d}", "payload": {"n": n, "s": "é"}}
                            for n in range(300)])
            for lease in queue.reserve("w", now=10, lease_seconds=60, limit=290):
                queue.ack(lease, now=11)
            if round_ == 1:
                queue.compact()
    finally:
        queue.close()
    files = {path.name: path.read_bytes() for path in directory.iterdir()
             if path.suffix in (".log", ".snap") and path.stat().st_size}
    assert any(name.endswith(".snap") for name in files) and any(name.endswith(".log") for name in files)
    return files


@compiled_only
def test_real_files_read_alike_and_every_truncation_of_them_too(real_files):
    for name, data in real_files.items():
        check = snapshot_differs if name.endswith(".snap") else scan_differs
        assert check(data) is None, name
        cuts = sorted({*range(0, 120), *range(len(data) - 120, len(data)),
                       *random.Random(name).sample(range(len(data)), 60)})
        for cut in cuts:
            assert check(data[:cut]) is None, (name, cut)


@compiled_only
def test_real_files_with_flipped_bytes_bad_lengths_and_bad_digests_read_alike(real_files):
    rng = random.Random(SEED)
    for name, data in real_files.items():
        check = snapshot_differs if name.endswith(".snap") else scan_differs
        frame_starts = _frame_starts(data)
        for _ in range(80):
            position = rng.randrange(len(data))
            flipped = bytearray(data)
            flipped[position] ^= 1 << rng.randrange(8)
            assert check(bytes(flipped)) is None, (name, "flip", position)
        for start in rng.sample(frame_starts, min(12, len(frame_starts))):
            length = int.from_bytes(data[start:start + 4], "big")
            for bad in (0, 1, length - 1, length + 1, 2**24 + 1, 2**32 - 1):
                changed = data[:start] + bad.to_bytes(4, "big") + data[start + 4:]
                assert check(changed) is None, (name, "length", start, bad)
            end = start + 4 + length + 32
            digest = data[:end - 32] + hashlib.sha256(b"other").digest() + data[end:]
            assert check(digest) is None, (name, "digest", start)


def _frame_starts(data: bytes) -> list[int]:
    starts, offset = [], 0
    while offset + 4 <= len(data):
        starts.append(offset)
        offset += 4 + int.from_bytes(data[offset:offset + 4], "big") + 32
    return starts


@compiled_only
def test_rule_breaking_tombstones_across_block_bounds_load_alike():
    entries = [tombstone_entry(f"t-{n:05d}") for n in range(1200)]
    for index in (0, 1, 511, 512, 513, 1024):
        for change in ("order", "attempts", "key", "huge"):
            changed = [dict(entry) for entry in entries]
            if change == "order" and index:
                changed[index - 1], changed[index] = changed[index], changed[index - 1]
            elif change == "attempts":
                changed[index]["attempts"] = 0
            elif change == "key" and index:
                changed[index]["key"] = changed[index - 1]["task_id"]
            elif change == "huge":
                changed[index]["available_at"] = 2**63
            assert snapshot_differs(snapshot_bytes(changed)) is None, (index, change)


@compiled_only
@pytest.mark.parametrize("name", sorted(broken_speedups.VARIANTS))
def test_the_differential_finds_each_broken_variant(name):
    with broken_speedups.installed(name):
        found = run_cases(SEED, 3000, first=True)
    assert found, f"the differential missed the broken variant {name}"


@compiled_only
def test_the_extension_hashes_as_hashlib():
    rng = random.Random(1)
    for size in [*range(0, 130), 1000, 4096, 65537]:
        data = rng.randbytes(size)
        assert speedups.speedups.sha256(data) == hashlib.sha256(data).digest()
        assert speedups.speedups.sha256_portable(data) == hashlib.sha256(data).digest()


def path_in_a_subprocess(**environment: str) -> str:
    env = {key: value for key, value in os.environ.items() if key != "WALQUEUE_NO_EXTENSIONS"}
    env.update(environment)
    result = subprocess.run(
        [sys.executable, "-c", "from walqueue import speedups, codec; "
         "print(speedups.PATH, speedups.COMPILED, speedups.EXTENSION_FILE is None); "
         "print(speedups.describe())"],
        env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_walqueue_no_extensions_1_forces_the_pure_path():
    out = path_in_a_subprocess(WALQUEUE_NO_EXTENSIONS="1")
    assert out.splitlines() == ["pure False True", "speedups: pure (WALQUEUE_NO_EXTENSIONS=1)"]


def test_without_the_variable_the_built_extension_is_used():
    extension = list((REPO / "src" / "walqueue").glob("_speedups*.so"))
    if not extension:
        pytest.skip("the extension is not built here (no compiler): the pure path is all there is")
    out = path_in_a_subprocess(WALQUEUE_NO_EXTENSIONS="0")
    assert out.splitlines()[0] == "compiled True False"
    assert "speedups: compiled (" in out and "_speedups" in out



def test_a_failed_build_of_the_extension_warns_and_installs_on(tmp_path):
    # setup.py as pip runs it, in a copy, with a compiler that always fails (CC=/bin/false).
    for name in ("setup.py", "pyproject.toml", "README.md", "src/walqueue/_speedups.c"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes((REPO / name).read_bytes())
    env = dict(os.environ, CC="/bin/false")
    result = subprocess.run([sys.executable, "setup.py", "-q", "build_ext", "--inplace"], cwd=tmp_path,
                            env=env, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stderr.count("WARNING: walqueue._speedups was not built") == 1, result.stderr
    assert "pure-Python path" in result.stderr
    assert not list(tmp_path.rglob("_speedups*.so"))


@compiled_only
@pytest.mark.parametrize("numbers", [(1, 3, 1, 0), (9, 9, 9, 9), (10, 10, 10, 10), (99, 100, 101, 2**32 - 1),
                                     (1, 2**32, 2**32, 2**63 - 1), (1, 2**63 - 1, 2**62, -1)])
def test_snapshot_entries_of_edge_numbers_and_names_that_need_escapes_are_written_alike(numbers):
    # The extension writes the digits and the escapes itself (no snprintf, no JSON encoder).
    state = State()
    for index in range(600):
        name = f"n-{index:05d}" if index % 50 else f'q"\\\n\x01-{index:05d}é'
        state.tombstones.add(name, name if index % 7 else "k" + name,
                             hashlib.sha256(name.encode()).digest(), *numbers)
    assert write_differs(state) is None
