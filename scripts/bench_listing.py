#!/usr/bin/env python3
"""What a page of a listing costs beside the whole listing (SPEC §8b, issue 24). Not a test.

    .venv/bin/python scripts/bench_listing.py                          # 1M completed, 10k ready
    .venv/bin/python scripts/bench_listing.py --completed 1000000 --ready 10000 --runs 5
    .venv/bin/python scripts/bench_listing.py --completed 3000 --ready 100 --runs 1   # tiny

It fills a fresh directory through the library with `--completed` completed tasks
(17-character ids, put_many of 1,000, reserved and acked in one batch a round) and
`--ready` ready ones after them, compacts, and then measures, each the median of
`--runs` runs (and the spread, min..max):

  - library: `Queue.tasks(status, limit=1000)` (the first page, and a page after a
    cursor in the middle) beside `list(Queue.tasks(status))`, the whole listing, in
    this process;
  - walqueued (started on the directory as a user would, READY awaited on a notify
    socket): the same through `walqueue.client.Client`, `tasks(status, after=,
    limit=1000)` beside `tasks(status)` (one answer of every task, which is what
    `walqueue-ctl tasks` asked for before pages).

For each it prints the ratio whole / page, measured in the same run. Statuses:
"completed" (the tombstone store), "ready" (the live index) and all (both merged).
The benchmark imports walqueue from this checkout's src/.
"""

from __future__ import annotations

import argparse
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
import bench_processes  # noqa: E402 - beside this script

from walqueue import Queue  # noqa: E402
from walqueue.client import Client  # noqa: E402

ROUND_TASKS = 1000
PAGE = 1000
READY_SECONDS = 300.0


def task_id(i: int) -> str:
    return f"task-{i:012d}"


def fill(directory: Path, completed: int, ready: int) -> float:
    started = time.perf_counter()
    with Queue(directory) as queue:
        for start in range(0, completed, ROUND_TASKS):
            stop = min(start + ROUND_TASKS, completed)
            with queue.batch():
                queue.put_many([{"task_id": task_id(i), "payload": {"n": i}} for i in range(start, stop)])
                for lease in queue.reserve("filler", now=1, lease_seconds=3600, limit=stop - start):
                    queue.ack(lease, now=1)
        for start in range(completed, completed + ready, ROUND_TASKS):
            stop = min(start + ROUND_TASKS, completed + ready)
            queue.put_many([{"task_id": task_id(i), "payload": {"n": i}} for i in range(start, stop)])
        queue.compact()
    return time.perf_counter() - started


def timed(function, runs: int) -> tuple[float, float, float, int]:
    """(median, min, max) seconds of `runs` calls, and how many tasks the last one listed."""
    seconds, count = [], 0
    for _ in range(runs):
        started = time.perf_counter()
        count = len(function())
        seconds.append(time.perf_counter() - started)
    return statistics.median(seconds), min(seconds), max(seconds), count


class Daemon:
    """walqueued on `directory`, READY awaited on a notify socket; stopped by pid."""

    def __init__(self, workdir: Path, directory: Path) -> None:
        self.socket_path = str(workdir / "wq.sock")
        notify_path = str(workdir / "notify.sock")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        notify.settimeout(1.0)
        env = dict(os.environ, NOTIFY_SOCKET=notify_path, PYTHONPATH=str(ROOT / "src"))
        self.log = open(workdir / "walqueued.log", "wb")  # noqa: SIM115 - closed in stop()
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "walqueue.daemon.cli", "serve", str(directory), "--socket",
             self.socket_path, "--log-level", "warning"], stdout=self.log, stderr=self.log, env=env)
        deadline = time.monotonic() + READY_SECONDS
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"walqueued exited with {self.proc.returncode}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"walqueued not ready in {READY_SECONDS} s")
                try:
                    if b"READY=1" in notify.recv(4096):
                        break
                except TimeoutError:
                    continue
        except BaseException:
            self.stop()
            raise
        finally:
            notify.close()

    def stop(self) -> None:
        bench_processes.stop(self.proc)
        self.log.close()


def measure(label: str, tasks, middle: str, runs: int, whole_runs: int) -> list[tuple]:
    rows = []
    for status in ("completed", "ready", None):
        name = status or "all"
        first = timed(lambda s=status: list(tasks(s, limit=PAGE)), runs)
        deep = timed(lambda s=status: list(tasks(s, after=middle, limit=PAGE)), runs)
        whole = timed(lambda s=status: list(tasks(s)), whole_runs)
        rows.append((label, name, first, deep, whole))
    return rows


def milliseconds(figure: tuple[float, float, float, int]) -> str:
    median, low, high, _ = figure
    return f"{median * 1000:9.2f} ({low * 1000:.2f}..{high * 1000:.2f})"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--completed", type=int, default=1_000_000)
    parser.add_argument("--ready", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5, help="runs of each page measurement")
    parser.add_argument("--whole-runs", type=int, default=3, help="runs of each whole listing")
    parser.add_argument("--keep", action="store_true", help="keep the scratch directory")
    args = parser.parse_args(argv)
    workdir = Path(tempfile.mkdtemp(prefix="wq-bench-listing-"))
    directory = workdir / "queue"
    try:
        fill_seconds = fill(directory, args.completed, args.ready)
        print(f"filled {args.completed:,} completed + {args.ready:,} ready tasks in {fill_seconds:.1f} s")
        middle = task_id(args.completed // 2)
        rows = []
        with Queue(directory) as queue:
            rows += measure("library", queue.tasks, middle, args.runs, args.whole_runs)
        daemon = Daemon(workdir, directory)
        try:
            with Client(daemon.socket_path, timeout=600) as client:
                rows += measure("walqueued", client.tasks, middle, args.runs, args.whole_runs)
        finally:
            daemon.stop()
        print(f"\nmilliseconds, median (min..max); pages of {PAGE}: {args.runs} runs, whole: "
              f"{args.whole_runs} runs; middle cursor {middle}")
        print(f"{'where':10} {'status':10} {'first page':>26} {'page after middle':>26} "
              f"{'whole listing':>28} {'tasks':>9} {'whole/page':>10}")
        for label, status, first, deep, whole in rows:
            print(f"{label:10} {status:10} {milliseconds(first):>26} {milliseconds(deep):>26} "
                  f"{milliseconds(whole):>28} {whole[3]:>9,} {whole[0] / first[0]:>9.0f}x")
    finally:
        if not args.keep:
            shutil.rmtree(workdir, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
