#!/usr/bin/env python3
"""What reading a snapshot of tombstones costs, step by step (issue 11). Not a test.

    .venv/bin/python scripts/probe_recovery_floor.py [--tombstones 300000] [--runs 3]

Why recovery stays far from 1M tombstones/s. SPEC §4–§5 make every snapshot
entry its own frame, and recovery must check each frame's length, its
SHA-256 digest and that its body is canonical JSON, then store the entry.
This writes a snapshot of N tombstones (17-character ids, as
bench_history.py's) to a temporary directory and times, in CPU seconds of
this process, passes over it that each do one step more:

  1. walk: read each frame's length and slice its body (nothing checked);
  2. + canonical: match each body against tombstones.ENTRY, the fast path's
     check of the canonical form;
  3. + digest: hash each body with hashlib.sha256;
  4. load_snapshot: the real reader, which also builds the tombstone store;
  5. Queue(directory): the whole open.

Per tombstone in microseconds, and the rate that step alone would allow.
Medians over --runs. Imports walqueue from this checkout's src/.
"""

from __future__ import annotations

import argparse
import hashlib
import shutil
import statistics
import struct
import sys
import tempfile
import time
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from walqueue import Queue  # noqa: E402
from walqueue.codec import DIGEST_BYTES, LENGTH_BYTES  # noqa: E402
from walqueue.fs import OsFileSystem  # noqa: E402
from walqueue.snapshot import CURRENT, current_frame, load_snapshot, write_snapshot  # noqa: E402
from walqueue.state import COMPLETED, State  # noqa: E402
from walqueue.tombstones import ENTRY  # noqa: E402

SEQ = 1
_LENGTH = struct.Struct(">I")


def write_directory(directory: Path, count: int) -> str:
    """A queue directory whose snapshot holds `count` tombstones; returns the snapshot's name."""
    state = State()
    ids = [f"task-{i:012d}".encode() for i in range(count)]
    state.tombstones.extend(ids, b"".join(hashlib.sha256(i).digest() for i in ids),
                            array("q", [1, 3, 1, 1_700_000_000] * count))
    state.counts[COMPLETED] += count
    state.last_seq = SEQ
    fs = OsFileSystem()
    handle = fs.open_directory(directory)
    try:
        name = write_snapshot(fs, handle, state)
    finally:
        fs.close_directory(handle)
    (directory / CURRENT).write_bytes(current_frame(SEQ))
    return name


def bodies(data: bytes):
    """Each frame's body, by its length alone (the first frame, the header, included)."""
    offset, size, unpack = 0, len(data), _LENGTH.unpack_from
    while offset + LENGTH_BYTES <= size:
        (length,) = unpack(data, offset)
        start = offset + LENGTH_BYTES
        yield data[start:start + length]
        offset = start + length + DIGEST_BYTES


def walk(data: bytes, _directory: Path, _name: str) -> None:
    for _ in bodies(data):
        pass


def canonical(data: bytes, _directory: Path, _name: str) -> None:
    match = ENTRY.fullmatch
    for body in bodies(data):
        match(body)


def digest(data: bytes, _directory: Path, _name: str) -> None:
    match, sha256 = ENTRY.fullmatch, hashlib.sha256
    for body in bodies(data):
        match(body)
        sha256(body).digest()


def load(_data: bytes, directory: Path, name: str) -> None:
    fs = OsFileSystem()
    handle = fs.open_directory(directory)
    try:
        load_snapshot(fs, handle, name, SEQ)
    finally:
        fs.close_directory(handle)


def open_queue(_data: bytes, directory: Path, _name: str) -> None:
    Queue(directory).close()


STEPS = [("1. walk (lengths, bodies)", walk), ("2. + canonical (ENTRY match)", canonical),
         ("3. + digest (SHA-256)", digest), ("4. load_snapshot (+ the store)", load),
         ("5. Queue(directory)", open_queue)]


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tombstones", type=int, default=300_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tmp-dir", default=None, help="where the temporary directory goes")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="wq-floor-", dir=args.tmp_dir))
    try:
        directory = scratch / "queue"
        directory.mkdir()
        name = write_directory(directory, args.tombstones)
        data = (directory / name).read_bytes()
        print(f"{args.tombstones:,} tombstones, snapshot {len(data):,} bytes, "
              f"{len(data) / max(args.tombstones, 1):.0f} bytes each; median of {args.runs} runs")
        print("| step | µs per tombstone | tombstones/s that allows |")
        print("|---|---:|---:|")
        for label, step in STEPS:
            seconds = []
            for _ in range(args.runs):
                started = time.process_time()
                step(data, directory, name)
                seconds.append(time.process_time() - started)
            per = statistics.median(seconds) / max(args.tombstones, 1)
            rate = f"{1 / per:,.0f}" if per > 0 else "-"
            print(f"| {label} | {per * 1e6:.2f} | {rate} |")
    finally:
        shutil.rmtree(scratch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
