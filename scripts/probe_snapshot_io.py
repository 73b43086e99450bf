#!/usr/bin/env python3
"""How a big snapshot's I/O delays a WAL fsync beside it, on the file system of DIR. Not a test.

    python3 scripts/probe_snapshot_io.py DIR [--megabytes 300] [--runs 3] [--idle-seconds 10]
        [--only TEXT]

Why walqueued's snapshot child fdatasyncs every 4 MiB and why the daemon frees
a deleted file's blocks 1 MiB at a time at 16 MiB/s (docs/daemon.md,
"Compaction under load"). A loop appends 200 bytes + fsync to a WAL-like file
while something else happens, and reports that loop's p50 and max fsync time
and how long it ran, and how many of its fsyncs took over 100 ms:

0. nothing else, for --idle-seconds (10 s): the disk's own noise;
1. a forked writer writes a MEGABYTES file in 1 MiB writes, then fsyncs it:
   one fsync at the end, versus an fdatasync every 1 or 4 MiB; then paced
   at 32 MiB/s, as walqueued's child writes (MEGABYTES / 32 seconds), with
   an fdatasync every 4 or 1 MiB, or every 4 MiB from the idle I/O class
   (ioprio_set, on x86_64 and aarch64);
2. deleting a MEGABYTES file: a plain unlink, in a thread (the name and the
   blocks at once), versus unlink with a descriptor kept open and the file
   truncated 8 or 1 MiB between two of the loop's fsyncs (as fast as the loop
   goes), or 1 MiB at most every 25 or 62.5 ms (40 or 16 MiB/s).

Standard library only. Medians over --runs; the machine's load is printed.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import statistics
import threading
import time
from functools import partial

MIB = 1 << 20
PACED_MIB_PER_SECOND = 32  # about walqueued's snapshot child, which its CPU bounds
SLOW_FSYNC_SECONDS = 0.1   # a turn over 100 ms is a stall every client sees


def wal_fsync(fd: int) -> float:
    started = time.perf_counter()
    os.write(fd, b"y" * 200)
    os.fsync(fd)
    return time.perf_counter() - started


def big_file(path: str, megabytes: int) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    try:
        for _ in range(megabytes):
            os.write(fd, b"z" * MIB)
        os.fsync(fd)
    finally:
        os.close(fd)


def paced_writer(path: str, megabytes: int, sync_every_mib: int, mib_per_second: float = 0.0) -> None:
    big_file_fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o640)
    started = time.monotonic()
    for written in range(1, megabytes + 1):
        os.write(big_file_fd, b"x" * MIB)
        if sync_every_mib and written % sync_every_mib == 0:
            os.fdatasync(big_file_fd)
        if mib_per_second:
            time.sleep(max(0.0, started + written / mib_per_second - time.monotonic()))
    os.fsync(big_file_fd)
    os.close(big_file_fd)


# ioprio_set(2) by machine: the standard library has no binding, and the number differs.
IOPRIO_SET = {"x86_64": 251, "aarch64": 30}.get(os.uname().machine)
IOPRIO_CLASS_IDLE = 3


def idle_io_class() -> None:
    """Put the calling process in the idle I/O class (served when nothing else asks the disk)."""
    libc = ctypes.CDLL(None, use_errno=True)
    # IOPRIO_WHO_PROCESS (1), this process (0), class << 13.
    if libc.syscall(IOPRIO_SET, 1, 0, IOPRIO_CLASS_IDLE << 13) != 0:
        raise OSError(ctypes.get_errno(), "ioprio_set")


def beside_a_writer(directory: str, wal: int, megabytes: int, sync_every_mib: int,
                    mib_per_second: float = 0.0, idle_class: bool = False) -> list[float]:
    """WAL fsync times while a forked writer writes MEGABYTES: as fast as it can, or paced at
    mib_per_second (walqueued's snapshot child writes about 30 MB/s, bound by its CPU)."""
    path = os.path.join(directory, "probe.snap")
    pid = os.fork()
    if pid == 0:
        try:
            if idle_class:
                idle_io_class()
            paced_writer(path, megabytes, sync_every_mib, mib_per_second)
        finally:
            os._exit(0)
    times = []
    while os.waitpid(pid, os.WNOHANG) == (0, 0):
        times.append(wal_fsync(wal))
    os.unlink(path)
    return times


def beside_nothing(wal: int, seconds: float) -> list[float]:
    """WAL fsync times with nothing else going on: the disk's own noise, the baseline."""
    times = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        times.append(wal_fsync(wal))
    return times


def beside_a_deletion(directory: str, wal: int, megabytes: int, step_mib: int = 0,
                      every_seconds: float = 0.0) -> list[float]:
    """WAL fsync times while a MEGABYTES file is deleted: at once in a thread, or STEP_MIB at a time.

    Stepped, the file is truncated by step_mib between two WAL fsyncs, at most
    once every `every_seconds` (the WAL fsyncs go on in between).
    """
    path = os.path.join(directory, "probe.snap")
    big_file(path, megabytes)
    times = []
    if step_mib:
        fd = os.open(path, os.O_WRONLY)
        os.unlink(path)
        size = os.fstat(fd).st_size
        next_step = 0.0
        while size:
            if time.monotonic() >= next_step:
                size = max(0, size - step_mib * MIB)
                os.ftruncate(fd, size)
                next_step = time.monotonic() + every_seconds
            times.append(wal_fsync(wal))
        os.close(fd)
        return times
    deleting = threading.Thread(target=os.unlink, args=(path,))
    deleting.start()
    times.append(wal_fsync(wal))
    while deleting.is_alive():
        times.append(wal_fsync(wal))
    deleting.join()
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("directory")
    parser.add_argument("--megabytes", type=int, default=300)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--idle-seconds", type=float, default=10.0,
                        help="how long the first case (nothing beside) runs")
    parser.add_argument("--only", default="", help="run only the cases whose name contains this")
    args = parser.parse_args()
    wal = os.open(os.path.join(args.directory, "probe.wal"), os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o640)
    print(f"{args.megabytes} MB in {args.directory}; load average {os.getloadavg()[0]:.1f}")
    paced = f"writer at {PACED_MIB_PER_SECOND} MiB/s"
    paced_cases = [(f"{paced}, fdatasync every {mib} MiB",
                    partial(beside_a_writer, args.directory, wal, args.megabytes, mib, PACED_MIB_PER_SECOND))
                   for mib in (4, 1)]
    if IOPRIO_SET is not None:
        paced_cases.append((f"{paced}, every 4 MiB, idle I/O class",
                            partial(beside_a_writer, args.directory, wal, args.megabytes, 4, PACED_MIB_PER_SECOND,
                                    idle_class=True)))
    cases = [(f"nothing beside, for {args.idle_seconds:g} s", partial(beside_nothing, wal, args.idle_seconds)),
             ("writer, one fsync at the end", lambda: beside_a_writer(args.directory, wal, args.megabytes, 0)),
             ("writer, fdatasync every 1 MiB", lambda: beside_a_writer(args.directory, wal, args.megabytes, 1)),
             ("writer, fdatasync every 4 MiB", lambda: beside_a_writer(args.directory, wal, args.megabytes, 4)),
             *paced_cases,
             ("unlink in a thread", lambda: beside_a_deletion(args.directory, wal, args.megabytes))]
    cases += [(f"unlink, then truncate {step} MiB steps", partial(beside_a_deletion, args.directory, wal,
                                                                 args.megabytes, step))
              for step in (8, 1)]
    # walqueued's pace is 16 MiB/s (walqueue.daemon.freeing.BYTES_PER_SECOND): 1 MiB every 62.5 ms.
    cases += [(f"  ... 1 MiB at most every {ms:g} ms", partial(beside_a_deletion, args.directory, wal,
                                                             args.megabytes, 1, ms / 1e3))
              for ms in (25, 62.5)]
    if args.only:
        cases = [case for case in cases if args.only in case[0]]
    try:
        for name, run in cases:
            p50s, maxes, totals, slow = [], [], [], 0
            for _ in range(args.runs):
                times = sorted(run())
                p50s.append(times[len(times) // 2])
                maxes.append(times[-1])
                totals.append(sum(times))
                slow += sum(seconds > SLOW_FSYNC_SECONDS for seconds in times)
            print(f"  {name:<48} WAL fsync p50 {statistics.median(p50s) * 1e3:6.1f} ms, "
                  f"max {statistics.median(maxes) * 1e3:6.1f} ms (longest {max(maxes) * 1e3:6.1f}), "
                  f"over {statistics.median(totals):5.1f} s (median of {args.runs}); "
                  f"{slow} over {SLOW_FSYNC_SECONDS * 1e3:.0f} ms in all")
    finally:
        os.close(wal)
        os.unlink(os.path.join(args.directory, "probe.wal"))


if __name__ == "__main__":
    main()
