"""Benchmark walqueued: durable put+reserve+ack cycles/s with 1, 4 and 16 worker
processes, p50/p99 latency per request type, beside baselines measured in the
same run on the same disk: the serial fsync rate and a plain Python Unix-socket
echo round trip.

    .venv/bin/python scripts/bench_daemon.py [--seconds 3] [--runs 3] [--workers 1,4,16]
        [--latency-samples 300] [--compaction-tasks 100000,1000000]

Every figure is the median of ``--runs`` runs (each run gets a fresh queue
directory and a fresh daemon, started as a user would: no test hook). The
daemon's own count of its WAL fsyncs (``daemon_stats().fsyncs_total``) gives
requests per fsync, measured, not inferred. Not part of the test suite.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import shutil
import socket
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]
import bench_processes  # noqa: E402 - beside this script

from walqueue import protocol as p  # noqa: E402
from walqueue.client import Client  # noqa: E402

READY_SECONDS = 30.0
OPS = ("put", "reserve", "ack")
SERVE_OPTIONS: list[str] = []  # extra `walqueued serve` options, from the command line


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


# -- baselines ---------------------------------------------------------------------


def fsync_rate(directory: Path, seconds: float) -> float:
    """Serial append+fsync of a 200-byte record, like one WAL frame per transaction."""
    path = directory / "fsync-probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
    record = b"x" * 200
    count = 0
    started = time.monotonic()
    try:
        while time.monotonic() - started < seconds:
            os.write(fd, record)
            os.fsync(fd)
            count += 1
    finally:
        os.close(fd)
        path.unlink()
    return count / (time.monotonic() - started)


def fsync_rate_in_var(seconds: float) -> float:
    scratch = Path(tempfile.mkdtemp(prefix="bench-fsync-", dir=REPO / "var"))
    try:
        return fsync_rate(scratch, seconds)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


def _echo_server(path: str, ready) -> None:
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen()
    ready.set()
    conn, _ = listener.accept()
    while True:
        data = conn.recv(65536)
        if not data:
            return
        conn.sendall(data)


def echo_round_trip(directory: Path, seconds: float) -> tuple[float, float]:
    """(round trips/s, p50 µs) of a 4-byte-length-framed 64-byte message over a Unix socket."""
    path = str(directory / "echo.sock")
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_echo_server, args=(path, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(10):
            raise RuntimeError("echo server did not start")
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        sock.connect(path)
        message = struct.pack(">I", 64) + b"m" * 64
        latencies = []
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            sent = time.perf_counter()
            sock.sendall(message)
            received = 0
            while received < len(message):
                received += len(sock.recv(65536))
            latencies.append(time.perf_counter() - sent)
        elapsed = time.monotonic() - started
        sock.close()
    finally:
        server.join(5)
        if server.is_alive():
            server.kill()
            server.join(5)
        if os.path.exists(path):
            os.unlink(path)
    return len(latencies) / elapsed, percentile(latencies, 0.5) * 1e6


# -- the daemon ---------------------------------------------------------------------


class DaemonRun:
    """A walqueued subprocess on a fresh directory, run as a user would (no test hook).

    Its fsyncs are counted by the daemon itself (``daemon_stats().fsyncs_total``).
    """

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.directory = workdir / "queue"
        self.socket_path = str(workdir / "wq.sock")
        self.notify_path = str(workdir / "notify.sock")

    def __enter__(self) -> DaemonRun:
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(self.notify_path)
        env = dict(os.environ, NOTIFY_SOCKET=self.notify_path,
                   PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))
        self.log = open(self.workdir / "daemon.log", "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "walqueue.daemon.cli", "serve", str(self.directory), "--socket",
             self.socket_path, "--log-level", "warning", *SERVE_OPTIONS],
            stdout=self.log, stderr=self.log, env=env, cwd=REPO)
        notify.settimeout(READY_SECONDS)
        try:
            while b"READY=1" not in notify.recv(4096):
                pass
        finally:
            notify.close()
        return self

    def syncs(self) -> int:
        """WAL fsyncs so far, as the daemon counts them (one per batch that wrote)."""
        with Client(self.socket_path, name="bench-syncs") as client:
            return client.daemon_stats().fsyncs_total

    def __exit__(self, *exc_info) -> None:
        bench_processes.stop(self.proc)
        self.log.close()


def _worker(socket_path: str, name: str, seconds: float, barrier, results) -> None:
    latencies: dict[str, list[float]] = {op: [] for op in OPS}
    cycles = 0
    with Client(socket_path, name=name) as client:
        client.stats()  # connect before the clock starts
        barrier.wait()
        started = time.monotonic()
        index = 0
        while time.monotonic() - started < seconds:
            index += 1
            t0 = time.perf_counter()
            client.put(f"{name}-{index:08d}", {"n": index})
            t1 = time.perf_counter()
            leases = client.reserve(name, lease_seconds=60)
            t2 = time.perf_counter()
            latencies["put"].append(t1 - t0)
            latencies["reserve"].append(t2 - t1)
            for lease in leases:
                t3 = time.perf_counter()
                client.ack(lease)
                latencies["ack"].append(time.perf_counter() - t3)
                cycles += 1
        elapsed = time.monotonic() - started
    results.put((cycles, elapsed, latencies))


def daemon_run(workers: int, seconds: float) -> dict:
    workdir = Path(tempfile.mkdtemp(prefix="bench-", dir=REPO / "var"))
    try:
        with DaemonRun(workdir) as daemon:
            barrier = multiprocessing.Barrier(workers + 1)
            results = multiprocessing.Queue()
            processes = [multiprocessing.Process(target=_worker,
                                                 args=(daemon.socket_path, f"w{n}", seconds, barrier, results))
                         for n in range(workers)]
            for process in processes:
                process.start()
            barrier.wait(60)
            syncs_before = daemon.syncs()
            gathered = [results.get(timeout=seconds + 60) for _ in processes]
            syncs = daemon.syncs() - syncs_before
            for process in processes:
                process.join(30)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    cycles = sum(item[0] for item in gathered)
    elapsed = max(item[1] for item in gathered)
    latencies = {op: [value for item in gathered for value in item[2][op]] for op in OPS}
    requests = sum(len(values) for values in latencies.values())
    return {
        "cycles_per_second": cycles / elapsed,
        "requests_per_fsync": requests / max(1, syncs),
        "p50": {op: percentile(latencies[op], 0.5) * 1e3 for op in OPS},
        "p99": {op: percentile(latencies[op], 0.99) * 1e3 for op in OPS},
    }


def request_latencies(samples: int) -> dict[str, tuple[float, float]]:
    """(p50 ms, p99 ms) of every request type from one client on an otherwise idle daemon."""
    from walqueue import PutRequest

    timings: dict[str, list[float]] = {}

    def timed(name, call, *args, **kwargs):
        started = time.perf_counter()
        value = call(*args, **kwargs)
        timings.setdefault(name, []).append(time.perf_counter() - started)
        return value

    workdir = Path(tempfile.mkdtemp(prefix="bench-latency-", dir=REPO / "var"))
    try:
        with DaemonRun(workdir) as daemon, Client(daemon.socket_path) as client:
            for index in range(samples):
                task_id = f"a{index:06d}"  # sorts before the put_many ids: reserved first
                timed("put", client.put, task_id, {"n": index}, max_attempts=1)
                timed("put_many(10)", client.put_many,
                      [PutRequest(f"z{index:06d}-{n}", {"n": n}) for n in range(10)])
                (lease,) = timed("reserve", client.reserve, "w", limit=1)
                lease = timed("touch", client.touch, lease, lease_seconds=60)
                timed("release", client.release, lease)  # max_attempts=1: now dead
                timed("revive", client.revive, [lease.task_id])
                (lease,) = client.reserve("w", limit=1)
                timed("ack", client.ack, lease)
                timed("get", client.get, task_id)
                timed("stats", client.stats)
                timed("tasks(dead)", client.tasks, "dead")
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return {name: (percentile(values, 0.5) * 1e3, percentile(values, 0.99) * 1e3)
            for name, values in timings.items()}


def compaction_stall(tasks: int, runs: int) -> tuple[float, float]:
    """(compact round trip s, stall seen by another client s), medians of ``runs`` compactions
    of a queue holding ``tasks`` tasks."""
    from walqueue import Queue

    workdir = Path(tempfile.mkdtemp(prefix="bench-compact-", dir=REPO / "var"))
    try:
        directory = workdir / "queue"
        with Queue(directory) as queue:
            for start in range(0, tasks, 5000):
                queue.put_many([{"task_id": f"t{index:08d}", "payload": {"n": index}}
                                for index in range(start, min(tasks, start + 5000))])
            queue.compact()
        compacts, stalls = [], []
        with DaemonRun(workdir) as daemon, Client(daemon.socket_path) as first, \
                Client(daemon.socket_path) as second:
            first.stats(), second.stats()
            for run in range(runs):
                first.put(f"extra-{run}", {})  # so the compaction has something to publish
                connection = first._connected()
                (compact_id,) = connection.send(p.Compact(id=0))
                started = time.perf_counter()
                second.stats()
                stalls.append(time.perf_counter() - started)
                connection.receive(compact_id, timeout=600)
                compacts.append(time.perf_counter() - started)
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    return statistics.median(compacts), statistics.median(stalls)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=3.0, help="length of each measured run")
    parser.add_argument("--runs", type=int, default=3, help="runs per figure (the median is shown)")
    parser.add_argument("--workers", default="1,4,16", help="comma-separated worker process counts")
    parser.add_argument("--latency-samples", type=int, default=300,
                        help="samples per request type for the one-client latency table (0: skip)")
    parser.add_argument("--compaction-tasks", default="",
                        help="also measure how long compaction stalls service at these queue sizes")
    parser.add_argument("--preallocate-wal-bytes", type=int, default=None,
                        help="passed to walqueued serve (default: the daemon's own default)")
    args = parser.parse_args()
    if args.preallocate_wal_bytes is not None:
        SERVE_OPTIONS[:] = ["--preallocate-wal-bytes", str(args.preallocate_wal_bytes)]
    if args.runs < 3:
        parser.error("--runs must be at least 3 (medians of >= 3 runs)")
    (REPO / "var").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-base-", dir=REPO / "var"))
    try:
        fsyncs = statistics.median(fsync_rate(scratch, args.seconds) for _ in range(args.runs))
        echoes = [echo_round_trip(scratch, args.seconds) for _ in range(args.runs)]
        echo_rate = statistics.median(rate for rate, _ in echoes)
        echo_p50 = statistics.median(p50 for _, p50 in echoes)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, medians of {args.runs} runs "
          f"of {args.seconds:g} s")
    print(f"baseline: serial fsync {fsyncs:,.0f}/s; Unix-socket echo {echo_rate:,.0f} round trips/s "
          f"(p50 {echo_p50:.0f} µs)")
    print()
    print("per row: the disk's fsync rate is measured again for 1 s right before each run, and")
    print("'x fsync' is the median of cycles/s divided by that adjacent rate (the disk drifts)")
    header = (f"{'workers':>7} {'cycles/s':>10} {'fsync/s':>8} {'x fsync':>8} {'req/fsync':>9} "
              + " ".join(f"{op + ' p50/p99 ms':>20}" for op in OPS))
    print(header)
    print("-" * len(header))
    for workers in (int(n) for n in args.workers.split(",") if n):
        runs = []
        for _ in range(args.runs):
            adjacent = fsync_rate_in_var(1.0)
            run = daemon_run(workers, args.seconds)
            run["fsync_per_second"] = adjacent
            run["x_fsync"] = run["cycles_per_second"] / adjacent
            runs.append(run)
        rate = statistics.median(run["cycles_per_second"] for run in runs)
        adjacent = statistics.median(run["fsync_per_second"] for run in runs)
        ratio = statistics.median(run["x_fsync"] for run in runs)
        per_fsync = statistics.median(run["requests_per_fsync"] for run in runs)
        cells = " ".join(
            f"{statistics.median(r['p50'][op] for r in runs):>9.2f}/{statistics.median(r['p99'][op] for r in runs):<10.2f}"
            for op in OPS)
        print(f"{workers:>7} {rate:>10,.0f} {adjacent:>8,.0f} {ratio:>8.2f} {per_fsync:>9.1f} {cells}")
    if args.latency_samples:
        runs = [request_latencies(args.latency_samples) for _ in range(args.runs)]
        print()
        print(f"one client, idle daemon, {args.latency_samples} samples a run: p50 / p99 ms")
        for name in runs[0]:
            p50 = statistics.median(run[name][0] for run in runs)
            p99 = statistics.median(run[name][1] for run in runs)
            print(f"  {name:<13} {p50:>7.2f} / {p99:<7.2f}")
    for tasks in (int(n) for n in args.compaction_tasks.split(",") if n):
        compact_seconds, stall_seconds = compaction_stall(tasks, args.runs)
        print(f"compaction at {tasks:,} tasks: compact answered in {compact_seconds:.2f} s; "
              f"another client's stats waited {stall_seconds:.2f} s")


if __name__ == "__main__":
    main()
