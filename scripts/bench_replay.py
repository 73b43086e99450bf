#!/usr/bin/env python3
"""WAL replay of put/reserve/ack traffic, in frames per second of CPU: A/B two trees in one run. Not a test.

    .venv/bin/python scripts/bench_replay.py [OTHER_SRC] [--cycles 50000] [--rounds 3]
    .venv/bin/python scripts/bench_replay.py --profile [--cycles 20000]

One fixture, built once with this tree in /dev/shm (the page cache is not
what is measured): ``--cycles`` cycles of put (one task, a 100-byte
payload), reserve(limit=1) and ack, each its own frame, so 3 x cycles small
frames in the WAL and no snapshot, the traffic a daemon writes between two
compactions. Each measurement is a fresh child process that opens the
directory read-only the way open recovers it (``recovery.plan_recovery``:
frame scan, checks and replay, no writes) and reports the process CPU time
of that call. With OTHER_SRC (another tree's ``src``, e.g. an export of
main), the two trees run alternately for ``--rounds`` rounds on the same
fixture; the median and min of each are printed. ``--profile`` runs
cProfile over one open instead.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PAYLOAD = {"data": "x" * 100}


def build(directory: str, cycles: int) -> int:
    """Write the fixture with this tree's Engine; returns its frame count."""
    sys.path.insert(0, str(ROOT / "src"))
    from walqueue.engine import Engine

    engine = Engine(directory)
    with engine.batch():
        for cycle in range(cycles):
            now = 1_000 + cycle // 100
            engine.put([{"available_at": 0, "key": f"task-{cycle:09d}", "max_attempts": 3,
                         "payload": dict(PAYLOAD), "task_id": f"task-{cycle:09d}"}])
            (task,) = engine.reserve("worker-1", now=now, lease_seconds=30)
            engine.ack(task.task_id, "worker-1", task.generation, now=now)
    frames = engine.stats().last_seq
    engine.close()
    return frames


def child(src: str, directory: str, profile: bool) -> dict:
    sys.path.insert(0, os.path.abspath(src))
    import time

    from walqueue.fs import OsFileSystem
    from walqueue.recovery import plan_recovery

    fs = OsFileSystem()
    target = fs.open_directory(directory)
    if profile:
        import cProfile
        import pstats

        profiler = cProfile.Profile()
        profiler.enable()
        plan = plan_recovery(fs, target)
        profiler.disable()
        pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(30)
    start = time.process_time()
    plan = plan_recovery(fs, target)
    seconds = time.process_time() - start
    return {"seconds": seconds, "frames": plan.state.last_seq}


def run_child(src: str, directory: str) -> dict:
    output = subprocess.run([sys.executable, __file__, "--child", src, directory], check=True,
                            capture_output=True, text=True).stdout
    return json.loads(output)


def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "--child":
        print(json.dumps(child(sys.argv[2], sys.argv[3], profile=False)))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other_src", nargs="?", help="another tree's src/ to compare with this one's")
    parser.add_argument("--cycles", type=int, default=50_000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--profile", action="store_true", help="cProfile one open with this tree")
    args = parser.parse_args()
    scratch = "/dev/shm" if os.path.isdir("/dev/shm") else None
    with tempfile.TemporaryDirectory(dir=scratch) as directory:
        queue_dir = os.path.join(directory, "queue")
        frames = build(queue_dir, args.cycles)
        if args.profile:
            print(json.dumps(child(str(ROOT / "src"), queue_dir, profile=True)))
            return
        trees = {"this": str(ROOT / "src")}
        if args.other_src:
            trees = {"other": args.other_src, **trees}
        results: dict[str, list[dict]] = {name: [] for name in trees}
        for round_number in range(args.rounds):
            order = list(trees) if round_number % 2 == 0 else list(reversed(trees))
            for name in order:
                results[name].append(run_child(trees[name], queue_dir))
        print(f"WAL replay of {frames:,} frames ({args.cycles:,} put/reserve/ack cycles), "
              f"{args.rounds} rounds (process CPU of plan_recovery; /dev/shm)")
        for name, runs in results.items():
            rates = [run["frames"] / run["seconds"] for run in runs]
            print(f"  {name:>5} {trees[name]}: median {statistics.median(rates):9,.0f} frames/s, "
                  f"max {max(rates):9,.0f} frames/s")


if __name__ == "__main__":
    main()
