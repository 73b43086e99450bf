#!/usr/bin/env python3
"""Benchmark: one sync per write, appending vs a preallocated WAL segment (issue 5).

    .venv/bin/python scripts/bench_wal_sync.py                 # 2,000 writes per run, 3 runs
    .venv/bin/python scripts/bench_wal_sync.py --writes 200 --runs 1   # quick look

Not a test: pytest never collects it, and it asserts nothing about speed.
Two groups of measurements, each the median of `--runs` runs in a fresh
directory under `--tmp-dir` (default: the system temporary directory; make
sure it is on the file system you care about -- tmpfs makes every sync free):

  raw probes   serial 200-byte writes, each followed by its sync, on a bare file:
               - append (O_APPEND) + fsync            (Queue's default)
               - append + fdatasync
               - pwrite into os.posix_fallocate'd space + fdatasync
               - pwrite into written zeros + fdatasync
  Queue.put()  one at a time (one transaction and one sync each), with
               preallocate_bytes=0 and with 4 MiB, the daemon's default.

The rates are writes (or puts) per second. On a machine other processes are
using, compare rates from the same run only; the load average is printed.
"""

from __future__ import annotations

import argparse
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

from walqueue import Queue  # noqa: E402 - after the path set-up above

RECORD = b"x" * 200
PREALLOCATE_BYTES = 4 * 1024 * 1024


def _file(directory: Path, name: str, flags: int) -> int:
    return os.open(directory / name, os.O_WRONLY | os.O_CREAT | os.O_CLOEXEC | flags, 0o600)


def _append_and(sync, name: str):
    """A probe: serial appends to a growing file, each followed by ``sync``."""
    def probe(directory: Path, writes: int) -> float:
        fd = _file(directory, name, os.O_APPEND)
        try:
            started = time.perf_counter()
            for _ in range(writes):
                os.write(fd, RECORD)
                sync(fd)
            return writes / (time.perf_counter() - started)
        finally:
            os.close(fd)
    return probe


probe_append_fsync = _append_and(os.fsync, "append-fsync")
probe_append_fdatasync = _append_and(os.fdatasync, "append-fdatasync")


def _pwrite_fdatasync(fd: int, writes: int) -> float:
    started = time.perf_counter()
    offset = 0
    for _ in range(writes):
        os.pwrite(fd, RECORD, offset)
        os.fdatasync(fd)
        offset += len(RECORD)
    return writes / (time.perf_counter() - started)


def probe_fallocate_fdatasync(directory: Path, writes: int) -> float:
    fd = _file(directory, "fallocate", 0)
    try:
        os.posix_fallocate(fd, 0, writes * len(RECORD))
        os.fsync(fd)
        return _pwrite_fdatasync(fd, writes)
    finally:
        os.close(fd)


def probe_zeros_fdatasync(directory: Path, writes: int) -> float:
    fd = _file(directory, "zeros", 0)
    try:
        os.write(fd, bytes(writes * len(RECORD)))
        os.fsync(fd)
        return _pwrite_fdatasync(fd, writes)
    finally:
        os.close(fd)


def put_rate(preallocate_bytes: int) -> Callable[[Path, int], float]:
    def measure(directory: Path, writes: int) -> float:
        with Queue(directory / "queue", preallocate_bytes=preallocate_bytes) as queue:
            started = time.perf_counter()
            for number in range(writes):
                queue.put(f"task-{number:09d}", {"n": number})
            return writes / (time.perf_counter() - started)
    return measure


MEASUREMENTS: dict[str, Callable[[Path, int], float]] = {
    "raw: append + fsync": probe_append_fsync,
    "raw: append + fdatasync": probe_append_fdatasync,
    "raw: posix_fallocate'd + pwrite + fdatasync": probe_fallocate_fdatasync,
    "raw: written zeros + pwrite + fdatasync": probe_zeros_fdatasync,
    "Queue.put(), preallocate_bytes=0": put_rate(0),
    f"Queue.put(), preallocate_bytes={PREALLOCATE_BYTES}": put_rate(PREALLOCATE_BYTES),
}


def main() -> int:
    parser = argparse.ArgumentParser(description="Sync rates: appending vs a preallocated WAL.")
    parser.add_argument("--writes", type=int, default=2000, help="writes (or puts) per run")
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement (median reported)")
    parser.add_argument("--tmp-dir", default=None, help="where the scratch directories go")
    arguments = parser.parse_args()
    scratch = Path(tempfile.mkdtemp(prefix="walqueue-bench-sync-", dir=arguments.tmp_dir))
    results: dict[str, list[float]] = {name: [] for name in MEASUREMENTS}
    load_before = os.getloadavg()
    try:
        # Interleaved (run 1 of everything, then run 2, ...), so a burst of
        # load elsewhere hits every measurement rather than one.
        for run in range(arguments.runs):
            for name, measure in MEASUREMENTS.items():
                directory = scratch / f"run{run}-{len(results[name])}-{abs(hash(name))}"
                directory.mkdir()
                results[name].append(measure(directory, arguments.writes))
                shutil.rmtree(directory)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    load_after = os.getloadavg()
    print(f"{platform.node()} {platform.system()} {platform.release()}, Python {platform.python_version()}, "
          f"{os.cpu_count()} CPUs; scratch on {arguments.tmp_dir or tempfile.gettempdir()}")
    print(f"{arguments.writes} writes per run, median of {arguments.runs} run(s); load average "
          f"{load_before[0]:.2f} before, {load_after[0]:.2f} after")
    print()
    print("| measurement | median /s | min–max /s |")
    print("|---|---:|---:|")
    for name, rates in results.items():
        print(f"| {name} | {statistics.median(rates):,.0f} | {min(rates):,.0f}–{max(rates):,.0f} |")
    plain = statistics.median(results["Queue.put(), preallocate_bytes=0"])
    preallocated = statistics.median(results[f"Queue.put(), preallocate_bytes={PREALLOCATE_BYTES}"])
    print()
    print(f"put() one at a time: {preallocated / plain:.2f}x with a preallocated segment")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
