#!/usr/bin/env python3
"""walqueue-web's cost: each page's render time on a big queue, and what a dashboard costs the
daemon's other clients. Not a test (docs/web.md quotes its output).

    .venv/bin/python scripts/bench_web.py                         # 1,000,000 tombstones, 100,000 ready
    .venv/bin/python scripts/bench_web.py --tombstones 100000 --ready 10000 --runs 3

1. Render times. The queue directory gets --tombstones completed tasks and
   --ready ready ones through the library (batches of 1,000, one fsync each),
   then walqueued serves it and walqueue-web serves walqueued. Each page is
   fetched --rounds times a run, one of each per round, the rounds at least
   1.05 s apart so that each round's `/` reads the figures afresh from the
   daemon (the web process reuses them for up to 1 s: `/overview.json`,
   fetched right after, shows that reuse, as a second browser open in the
   same second would see it). Printed: each page's
   p50 and p99 (the median over --runs runs of each run's figure), against
   the target of 200 ms.
2. Bystanders. A bystander process runs put, reserve and ack cycles for
   --seconds against the same daemon, alone and then while a "dashboard"
   fetches what an open overview fetches (/overview.json and /plot.svg),
   every second, alternating; each figure is the median of --runs runs, and
   the ratio with/without is against the target of >= 0.95. A second
   dashboard, which also loads a /tasks page every second, is measured the
   same way.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
import bench_processes  # noqa: E402 - beside this script

FILL_BATCH = 1000
ROUND_SECONDS = 1.05
TARGET_SECONDS = 0.200
TARGET_RATIO = 0.95
START_SECONDS = 120.0


def env() -> dict[str, str]:
    variables = dict(os.environ)
    variables["PYTHONPATH"] = str(ROOT / "src")
    return variables


def fill(directory: Path, tombstones: int, ready: int) -> float:
    from walqueue import Queue

    started = time.monotonic()
    with Queue(directory) as queue:
        for start in range(0, tombstones, FILL_BATCH):
            stop = min(tombstones, start + FILL_BATCH)
            with queue.batch():
                queue.put_many([{"task_id": f"done-{index:09d}", "payload": {"n": index}}
                                for index in range(start, stop)])
                for lease in queue.reserve("filler", now=1, lease_seconds=60, limit=stop - start):
                    queue.ack(lease, now=2)
        for start in range(0, ready, FILL_BATCH):
            with queue.batch():
                queue.put_many([{"task_id": f"ready-{index:09d}", "payload": {"n": index}}
                                for index in range(start, min(ready, start + FILL_BATCH))])
        for index in range(3):  # a few dead tasks and leases, for the pages that show them
            queue.put(f"dead-{index}", {"n": index}, max_attempts=1)
        now = int(time.time())
        for lease in queue.reserve("bench", now=now, lease_seconds=60, limit=3):  # the dead-* first
            queue.release(lease, now=now)
        queue.reserve("bench", now=now, lease_seconds=3600, limit=3)  # leases held for the run
        queue.compact()
    return time.monotonic() - started


def wait_for(condition, seconds: float, what: str):
    deadline = time.monotonic() + seconds
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise SystemExit(f"bench_web: no {what} within {seconds} s")
        time.sleep(0.05)


class Process:
    def __init__(self, command: list[str], log: Path) -> None:
        self.log_path = log
        with open(log, "wb") as out:
            self.proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, env=env(),
                                         stdin=subprocess.DEVNULL)

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def stop(self) -> None:
        bench_processes.stop(self.proc)


def daemon_answers(socket_path: str) -> bool:
    from walqueue.client import Client

    try:
        with Client(socket_path, timeout=5, retry_seconds=0) as client:
            client.stats()
        return True
    except Exception:  # noqa: BLE001 - not up yet
        return False


def fetch(url: str) -> float:
    started = time.perf_counter()
    with urllib.request.urlopen(url, timeout=30) as answer:
        answer.read()
        if answer.status != 200:
            raise SystemExit(f"bench_web: {url} answered {answer.status}")
    return time.perf_counter() - started


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def render_run(base: str, pages: list[str], rounds: int) -> dict[str, tuple[float, float]]:
    times: dict[str, list[float]] = {page: [] for page in pages}
    for _ in range(rounds):
        started = time.monotonic()
        for page in pages:
            times[page].append(fetch(base + page))
        time.sleep(max(0.0, ROUND_SECONDS - (time.monotonic() - started)))
    return {page: (percentile(values, 0.5), percentile(values, 0.99)) for page, values in times.items()}


def bystander(socket_path: str, seconds: float, results) -> None:
    from walqueue.client import Client

    with Client(socket_path) as client:
        number = 0
        deadline = time.monotonic() + seconds
        started = time.monotonic()
        while time.monotonic() < deadline:
            task_id = f"by-{os.getpid()}-{time.monotonic_ns()}-{number}"
            client.put(task_id, {"n": number})
            for lease in client.reserve("bystander", lease_seconds=60):
                client.ack(lease)
            number += 1
        results.put(number / (time.monotonic() - started))


def dashboard(base: str, pages: list[str], stop) -> None:
    while not stop.is_set():
        started = time.monotonic()
        for page in pages:
            fetch(base + page)
        stop.wait(max(0.0, 1.0 - (time.monotonic() - started)))


def bystander_rate(socket_path: str, seconds: float, base: str, pages: list[str] | None) -> float:
    context = multiprocessing.get_context("spawn")
    results = context.Queue()
    stop = context.Event()
    viewer = None
    if pages is not None:
        viewer = context.Process(target=dashboard, args=(base, pages, stop))
        viewer.start()
    worker = context.Process(target=bystander, args=(socket_path, seconds, results))
    worker.start()
    rate = results.get(timeout=seconds + 60)
    worker.join(30)
    if viewer is not None:
        stop.set()
        viewer.join(30)
    return rate


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tombstones", type=int, default=1_000_000)
    parser.add_argument("--ready", type=int, default=100_000)
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (the median is shown)")
    parser.add_argument("--rounds", type=int, default=20, help="fetches of each page per run")
    parser.add_argument("--seconds", type=float, default=5.0, help="a bystander run's length")
    args = parser.parse_args()
    if args.runs < 3:
        parser.error("--runs must be at least 3 (medians of >= 3 runs)")
    scratch = Path(tempfile.mkdtemp(prefix="wq-bench-web-", dir="/tmp"))
    processes: list[Process] = []
    try:
        directory = scratch / "queue"
        fill_seconds = fill(directory, args.tombstones, args.ready)
        socket_path = str(scratch / "wq.sock")
        processes.append(Process([sys.executable, "-m", "walqueue.daemon.cli", "serve", str(directory),
                                  "--socket", socket_path], scratch / "daemon.log"))
        wait_for(lambda: daemon_answers(socket_path), START_SECONDS, "answer from walqueued")
        web = Process([sys.executable, "-m", "walqueue.web.cli", socket_path, "--listen", "127.0.0.1:0"],
                      scratch / "web.log")
        processes.append(web)
        found = wait_for(lambda: re.search(r"at (http://127\.0\.0\.1:\d+)/", web.log()), START_SECONDS,
                         "walqueue-web")
        base = found.group(1)
        middle = f"ready-{args.ready // 2:09d}"
        pages = ["/", "/overview.json", "/plot.svg", "/tasks", "/tasks?status=ready",
                 f"/tasks?after=done-{args.tombstones // 2:09d}", f"/tasks?status=ready&after={middle}",
                 "/tasks?prefix=ready-00005", f"/tasks/{middle}", "/dead", "/leases", "/workers", "/cancel"]
        for page in pages:
            fetch(base + page)  # warm up: templates compiled, connections open
        runs = [render_run(base, pages, args.rounds) for _ in range(args.runs)]
        print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs; {args.tombstones:,} tombstones + "
              f"{args.ready:,} ready tasks (filled in {fill_seconds:.0f} s); medians of {args.runs} runs "
              f"of {args.rounds} fetches a page")
        print()
        print("| page | p50 ms | p99 ms | target p99 <= 200 ms |")
        print("|---|---:|---:|---|")
        for page in pages:
            p50 = statistics.median(run[page][0] for run in runs)
            p99 = statistics.median(run[page][1] for run in runs)
            print(f"| `{page}` | {p50 * 1000:.1f} | {p99 * 1000:.1f} | "
                  f"{'met' if p99 <= TARGET_SECONDS else 'MISSED'} |")
        print()
        dashboards = {"overview open, refreshing every 1 s": ["/overview.json", "/plot.svg"],
                      "overview + a /tasks page every 1 s": ["/overview.json", "/plot.svg", "/tasks"]}
        print(f"| bystander put+reserve+ack cycles/s ({args.seconds:g} s runs) | without | with | "
              f"ratio | target >= {TARGET_RATIO} |")
        print("|---|---:|---:|---:|---|")
        for name, dashboard_pages in dashboards.items():
            without, with_dashboard = [], []
            for _ in range(args.runs):  # alternating, so drift hits both alike
                without.append(bystander_rate(socket_path, args.seconds, base, None))
                with_dashboard.append(bystander_rate(socket_path, args.seconds, base, dashboard_pages))
            ratio = statistics.median(w / o for w, o in zip(with_dashboard, without, strict=True))
            print(f"| {name} | {statistics.median(without):.0f} | {statistics.median(with_dashboard):.0f} | "
                  f"{ratio:.3f} | {'met' if ratio >= TARGET_RATIO else 'MISSED'} |")
    finally:
        for process in reversed(processes):
            process.stop()
        shutil.rmtree(scratch, ignore_errors=True)


if __name__ == "__main__":
    main()
