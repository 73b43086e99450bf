"""Time docs/daemon.md's asyncio example, 100 tasks of a 0.1 s handler, at several concurrencies.

    .venv/bin/python scripts/bench_worker_example.py [--tasks 100] [--handler-seconds 0.1]
        [--concurrency 1,10,100] [--runs 3]

Each run starts a fresh walqueued (as the tests do, via tests/process/daemon.py), puts
the tasks with ``asyncio.gather`` as the example does, then times
``Worker(client, "mailer-1", handler, wait=1, concurrency=N).run(max_tasks=tasks)``.
Prints the median and the minimum of the runs for each N. With one task in hand at a
time the run cannot beat tasks x handler seconds; with N it should approach that
divided by N, plus the round trips. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import asyncio
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from tests.process.daemon import Daemon  # noqa: E402
from walqueue.client.aio import Client  # noqa: E402
from walqueue.worker.aio import Worker  # noqa: E402


async def example(socket_path: str, tasks: int, handler_seconds: float, concurrency: int) -> float:
    async def send_email(lease):
        await asyncio.sleep(handler_seconds)

    async with Client(socket_path) as client:
        await asyncio.gather(*(client.put(f"email-{n}", {"to": n}) for n in range(tasks)))
        started = time.perf_counter()
        handled = await Worker(client, "mailer-1", send_email, wait=1, concurrency=concurrency).run(max_tasks=tasks)
        seconds = time.perf_counter() - started
        assert handled == tasks and (await client.stats()).completed == tasks
    return seconds


def one_run(tasks: int, handler_seconds: float, concurrency: int) -> float:
    workdir = Path(tempfile.mkdtemp(prefix="wq-bench-", dir="/tmp"))
    daemon = Daemon(workdir, workdir / "queue", str(workdir / "wq.sock"))
    try:
        daemon.start()
        return asyncio.run(example(daemon.socket_path, tasks, handler_seconds, concurrency))
    finally:
        daemon.cleanup()
        shutil.rmtree(workdir, ignore_errors=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tasks", type=int, default=100)
    parser.add_argument("--handler-seconds", type=float, default=0.1)
    parser.add_argument("--concurrency", default="1,10,100", help="comma-separated")
    parser.add_argument("--runs", type=int, default=3)
    options = parser.parse_args()
    print(f"{options.tasks} tasks, handler {options.handler_seconds} s, {options.runs} runs each")
    print("| concurrency | run() median s | min s |")
    print("|---:|---:|---:|")
    for concurrency in (int(n) for n in options.concurrency.split(",")):
        seconds = [one_run(options.tasks, options.handler_seconds, concurrency) for _ in range(options.runs)]
        print(f"| {concurrency} | {statistics.median(seconds):.2f} | {min(seconds):.2f} |", flush=True)


if __name__ == "__main__":
    main()
