#!/usr/bin/env python3
"""The compiled path beside the pure one, and the machine's floor, in one run (issue 22). Not a test.

    .venv/bin/python scripts/bench_speedups.py [--tombstones 1000000] [--wal-cycles 20000] [--runs 3]

Writes, in a temporary directory, a queue whose snapshot holds N tombstones
(17-character ids, key = id, as bench_history.py's) and another whose WAL
holds C put+reserve+ack cycles (3 frames each, 100-byte payloads, no
snapshot), then times in fresh processes, once with walqueue._speedups and
once with WALQUEUE_NO_EXTENSIONS=1:

  - restart: Queue(directory) on the snapshot, wall time -> tombstones/s
    (the page cache is warm: the file was just written or read; what is
    timed is the CPU work of recovery, not the disk);
  - WAL replay: Queue(directory) on the WAL, wall time -> frames/s;
  - snapshot writing: snapshot.write_snapshot of the recovered state into a
    fresh directory (what walqueued's snapshot child runs), wall time ->
    tombstones/s.

And the floor, in this process: reading the snapshot file sequentially and
hashing all of it with hashlib.sha256 (one call), the work no reader of the
format can skip. Each figure is the median of --runs, as wall time and as
CPU time of the process (user + system: on a shared machine the wall time
also counts the waits for a CPU). Imports walqueue from this checkout's src/.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from array import array
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

SEQ = 1
PATHS = ("compiled", "pure")


def write_snapshot_directory(directory: Path, count: int) -> str:
    """A queue directory whose snapshot holds `count` tombstones; returns the snapshot's name."""
    from walqueue.fs import OsFileSystem
    from walqueue.snapshot import CURRENT, current_frame, write_snapshot
    from walqueue.state import COMPLETED, State

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


def write_wal_directory(directory: Path, cycles: int) -> int:
    """A queue directory whose WAL holds `cycles` put+reserve+ack cycles, each its own frame
    (a reserve of one task, as a worker makes it); returns its frames."""
    from walqueue import Queue

    queue = Queue(directory)
    try:
        with queue.batch():
            for index in range(cycles):
                queue.put(f"task-{index:012d}", {"data": "x" * 100})
                for lease in queue.reserve("w", now=1, lease_seconds=60):
                    queue.ack(lease, now=1)
        frames = queue.stats().last_seq
    finally:
        queue.close()
    return frames


def floor_seconds(path: Path) -> tuple[float, float]:
    """Sequential read plus SHA-256 of the whole file: (wall, CPU) seconds."""
    started, cpu = time.perf_counter(), time.process_time()
    digest = hashlib.sha256()
    with open(path, "rb") as file:
        while chunk := file.read(1 << 20):
            digest.update(chunk)
    digest.digest()
    return time.perf_counter() - started, time.process_time() - cpu


def child(mode: str, snapshot_dir: Path, wal_dir: Path, out_dir: Path) -> dict:
    """Run in a fresh process: time restart, WAL replay and snapshot writing on this path."""
    from walqueue import Queue, speedups
    from walqueue.fs import OsFileSystem
    from walqueue.recovery import plan_recovery
    from walqueue.snapshot import write_snapshot

    assert speedups.PATH == mode, (speedups.PATH, mode)
    result = {}
    started, cpu = time.perf_counter(), time.process_time()
    Queue(snapshot_dir).close()
    result["restart"] = time.perf_counter() - started
    result["restart_cpu"] = time.process_time() - cpu
    started, cpu = time.perf_counter(), time.process_time()
    Queue(wal_dir).close()
    result["replay"] = time.perf_counter() - started
    result["replay_cpu"] = time.process_time() - cpu
    fs = OsFileSystem()
    handle = fs.open_directory(snapshot_dir)
    try:
        state = plan_recovery(fs, handle).state
    finally:
        fs.close_directory(handle)
    shutil.rmtree(out_dir, ignore_errors=True)
    out_dir.mkdir()
    target = fs.open_directory(out_dir)
    try:
        started, cpu = time.perf_counter(), time.process_time()
        write_snapshot(fs, target, state)
        result["write"] = time.perf_counter() - started
        result["write_cpu"] = time.process_time() - cpu
    finally:
        fs.close_directory(target)
    return result


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tombstones", type=int, default=1_000_000)
    parser.add_argument("--wal-cycles", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--tmp-dir", default=None, help="where the temporary directories go")
    parser.add_argument("--child", nargs=4, metavar=("MODE", "SNAPSHOT", "WAL", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        mode, *dirs = args.child
        print(json.dumps(child(mode, *map(Path, dirs))))
        return 0
    began = time.perf_counter()
    scratch = Path(tempfile.mkdtemp(prefix="wq-speedups-", dir=args.tmp_dir))
    try:
        snapshot_dir, wal_dir = scratch / "snapshot", scratch / "wal"
        snapshot_dir.mkdir()
        wal_dir.mkdir()
        name = write_snapshot_directory(snapshot_dir, args.tombstones)
        frames = write_wal_directory(wal_dir, args.wal_cycles)
        size = (snapshot_dir / name).stat().st_size
        timings = {mode: [] for mode in PATHS}
        floors = []
        for _ in range(args.runs):
            floors.append(floor_seconds(snapshot_dir / name))
            for mode in PATHS:
                env = dict(os.environ, WALQUEUE_NO_EXTENSIONS="1" if mode == "pure" else "")
                output = subprocess.run(
                    [sys.executable, __file__, "--child", mode, str(snapshot_dir), str(wal_dir),
                     str(scratch / f"out-{mode}")],
                    env=env, check=True, capture_output=True, text=True, timeout=3600).stdout
                timings[mode].append(json.loads(output))
        n = args.tombstones
        print(f"{n:,} tombstones (snapshot {size:,} bytes), WAL of {frames:,} frames "
              f"({args.wal_cycles:,} put+reserve+ack cycles); median of {args.runs} runs; "
              f"{os.cpu_count()} CPUs; load average {os.getloadavg()[0]:.1f} at the end "
              f"({time.perf_counter() - began:.0f} s in all)")
        floor = statistics.median(wall for wall, _ in floors)
        floor_cpu = statistics.median(cpu for _, cpu in floors)
        print("| figure | compiled | pure | compiled/pure | floor (read + SHA-256) |")
        print("|---|---:|---:|---:|---:|")
        rows = (("restart, tombstones/s", "restart", n), ("WAL replay, frames/s", "replay", frames),
                ("snapshot writing, tombstones/s", "write", n))
        for label, key, items in rows:
            for suffix, column, floor_time in (("", key, floor), (" per CPU second", key + "_cpu", floor_cpu)):
                rate = {mode: items / statistics.median(run[column] for run in timings[mode])
                        for mode in PATHS}
                floor_text = f"{n / floor_time:,.0f}" if key == "restart" else "-"
                print(f"| {label}{suffix} | {rate['compiled']:,.0f} | {rate['pure']:,.0f} | "
                      f"{rate['compiled'] / rate['pure']:.2f}x | {floor_text} |")
        restart = statistics.median(run["restart"] for run in timings["compiled"])
        print(f"compiled restart / floor: {restart / floor:.2f}x the floor's time "
              f"({size / floor / 1e6:,.0f} MB/s read + SHA-256)")
    finally:
        shutil.rmtree(scratch)
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
