#!/usr/bin/env python3
"""A/B the library's hot path: another source tree against this checkout. Not a test.

    git worktree add /tmp/wq-base <commit>        # or any copy of an older src/
    .venv/bin/python scripts/bench_ab.py /tmp/wq-base/src [--rounds 15] [--scale 1.0]

On a shared or busy machine `bench_library.py`'s medians of 3 swing far more
than a change to the state machine costs. This measures only CPU-bound
figures (a queue directory on /dev/shm when it exists, so fsyncs are
cheap), runs the two trees alternately in fresh processes, A then B, then B
then A, for `--rounds` rounds, and reports the minimum (the run least
disturbed by other load) and the median of each figure per tree.

Figures, per operation: put() inside batch() of 100; put_many() of 1,000
per task; reserve+ack and reserve+release inside batch() of 100; then the
time to reopen (recover) the directory from its WAL, and from a snapshot.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

CHILD = r"""
import gc, json, os, sys, tempfile, time
sys.path.insert(0, sys.argv[1])
scale = float(sys.argv[2])
from walqueue import Queue
PAYLOAD = {"kind": "email", "n": 1, "priority": "normal", "template": "welcome-v2",
           "to": "user@example.com"}
batches, frames = max(1, int(200 * scale)), max(1, int(20 * scale))
cycles = max(1, int(100 * scale))
scratch = "/dev/shm" if os.path.isdir("/dev/shm") else None
out = {}
with tempfile.TemporaryDirectory(dir=scratch) as directory:
    path = os.path.join(directory, "queue")
    q = Queue(path)
    started = time.perf_counter()
    for batch in range(batches):
        with q.batch():
            for i in range(100):
                q.put(f"p{batch}-{i}", PAYLOAD)
    out["put_batch100_us"] = (time.perf_counter() - started) / (batches * 100) * 1e6
    started = time.perf_counter()
    for frame in range(frames):
        q.put_many([{"task_id": f"m{frame}-{i}", "payload": PAYLOAD} for i in range(1000)])
    out["put_many1000_us_per_task"] = (time.perf_counter() - started) / (frames * 1000) * 1e6
    for name, finish in (("reserve_ack_batch100_us", q.ack), ("reserve_release_batch100_us", q.release)):
        started = time.perf_counter()
        for _ in range(cycles):
            with q.batch():
                for _ in range(100):
                    (lease,) = q.reserve("w", now=1, lease_seconds=3600)
                    finish(lease, now=1)
        out[name] = (time.perf_counter() - started) / (cycles * 100) * 1e6
    q.close()
    gc.collect()
    started = time.perf_counter()
    q = Queue(path)
    out["recover_wal_s"] = time.perf_counter() - started
    q.compact()
    q.close()
    gc.collect()
    started = time.perf_counter()
    Queue(path).close()
    out["recover_snapshot_s"] = time.perf_counter() - started
print(json.dumps(out))
"""


def measure(source: str, scale: float) -> dict[str, float]:
    done = subprocess.run([sys.executable, "-c", CHILD, source, str(scale)], capture_output=True,
                          text=True, check=True)
    return json.loads(done.stdout)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("baseline", help="the other tree's src/ directory (holding walqueue/)")
    parser.add_argument("--rounds", type=int, default=15)
    parser.add_argument("--scale", type=float, default=1.0, help="work per run (1.0: ~5 s)")
    args = parser.parse_args()
    if not (Path(args.baseline) / "walqueue" / "state.py").is_file():
        parser.error(f"{args.baseline} has no walqueue/state.py; give a src/ directory")
    trees = {"baseline": args.baseline, "this": str(ROOT / "src")}
    results: dict[str, list[dict[str, float]]] = {name: [] for name in trees}
    for round_number in range(args.rounds):
        order = list(trees.items())
        for name, source in order if round_number % 2 == 0 else reversed(order):
            results[name].append(measure(source, args.scale))
    print(f"{args.rounds} rounds, load average after: {os.getloadavg()}")
    print("| figure | baseline min | this min | change | baseline median | this median |")
    print("|---|---:|---:|---:|---:|---:|")
    for figure in results["baseline"][0]:
        base = [run[figure] for run in results["baseline"]]
        this = [run[figure] for run in results["this"]]
        change = 100 * (min(this) - min(base)) / min(base)
        print(f"| {figure} | {min(base):.3f} | {min(this):.3f} | {change:+.1f}% | "
              f"{statistics.median(base):.3f} | {statistics.median(this):.3f} |")


if __name__ == "__main__":
    main()
