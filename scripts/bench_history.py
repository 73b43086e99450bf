#!/usr/bin/env python3
"""What a long history costs (issue 11): N completed tasks, and what they cost. Not a test.

    .venv/bin/python scripts/bench_history.py                      # N = 0, 1M, 10M
    .venv/bin/python scripts/bench_history.py --sizes 0,1000000 --runs 5
    .venv/bin/python scripts/bench_history.py --sizes 0,2000 --runs 1   # tiny (the smoke test)

For each N it fills a fresh directory through the library with N completed
tasks (17-character ids, key = id, 100-byte payloads; put_many of 1,000, one
reserve of 1,000, 1,000 acks, all inside one batch()), then reports:

  - RSS per tombstone: the writer's resident set after gc.collect()
    (/proc/self/statm), and that of a fresh process that reopened the
    directory, each minus the same figure at N = 0, divided by N;
  - compact(): its duration in the writer, and the snapshot's size;
  - recovery: the duration of Queue(directory) in a fresh process (a
    snapshot load and an empty WAL), tombstones per second (of wall time,
    and of the process's CPU time, which a busy machine disturbs less), its peak RSS
    (getrusage's ru_maxrss) and that peak's ratio to the steady RSS after
    it; plus the same for a directory whose WAL holds the last `--wal-acks`
    acks after the snapshot (the ack replay).

Every measurement runs in a child process (this script, sub-command
`child`) so that its heap and peak are its own. Medians of `--runs` reopens.
The library-only part is all there is for now (`--library-only`, the
default); the daemon part of issue 11 (walqueued on the filled directory,
16 clients for 60 s, latencies, compactions inside the window) is meant to
be a second stage (`--daemon`, refused for now) that runs on each directory
measure_library fills, before it is deleted, and adds its figures to the row.

The benchmark imports walqueue from this checkout's src/.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

ROUND_TASKS = 1000      # put_many, reserve and acks per round
WORKER = "history-worker"
NOW = 1                 # every call happens at this time: no lease expires
LEASE_SECONDS = 3600
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def task_id(i: int) -> str:
    return f"task-{i:012d}"     # 17 characters


def payload(i: int) -> dict:
    """100 bytes of canonical JSON."""
    return {"body": f"{i:012d}" + "x" * 77}


# ----------------------------------------------------------------------------
# Child side: one measurement per process; each returns a dict of numbers.
# ----------------------------------------------------------------------------

def resident_bytes() -> int:
    """This process's resident set now, after a full collection."""
    gc.collect()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES


def peak_bytes() -> int:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def fill(q, count: int, first: int = 0) -> None:
    """`count` tasks put, reserved and acked, one batch (one fsync) per round."""
    for start in range(first, first + count, ROUND_TASKS):
        stop = min(start + ROUND_TASKS, first + count)
        with q.batch():
            q.put_many([{"task_id": task_id(i), "payload": payload(i)} for i in range(start, stop)])
            for lease in q.reserve(WORKER, now=NOW, lease_seconds=LEASE_SECONDS,
                                   limit=stop - start):
                q.ack(lease, now=NOW)


def child_fill(args: dict) -> dict:
    """Fill the directory, measure the writer, compact, then add the WAL acks."""
    from walqueue import Queue
    directory, n = Path(args["dir"]), args["n"]
    before = resident_bytes()
    started = time.perf_counter()
    with Queue(directory) as q:
        fill(q, n)
        fill_seconds = time.perf_counter() - started
        writer = resident_bytes()
        started = time.perf_counter()
        q.compact()
        compact_seconds = time.perf_counter() - started
        snapshot_bytes = sum(p.stat().st_size for p in directory.glob("snapshot-*.snap"))
        assert q.stats().completed == n
    wal = Path(args["wal_dir"])
    shutil.copytree(directory, wal)
    os.unlink(wal / "LOCK")
    with Queue(wal) as q:
        fill(q, args["wal_acks"], first=n)
        wal_bytes = q.stats().wal_bytes
    return {"fill_seconds": fill_seconds, "writer_rss_bytes": writer,
            "writer_rss_before_bytes": before, "compact_seconds": compact_seconds,
            "snapshot_bytes": snapshot_bytes, "wal_bytes": wal_bytes}


def child_open(args: dict) -> dict:
    """Reopen a directory: the recovery's duration, its peak RSS and the steady RSS after it."""
    from walqueue import Queue
    before = resident_bytes()
    started, started_cpu = time.perf_counter(), time.process_time()
    q = Queue(args["dir"])
    seconds, cpu_seconds = time.perf_counter() - started, time.process_time() - started_cpu
    peak = peak_bytes()
    steady = resident_bytes()
    stats = q.stats()
    q.close()
    return {"open_seconds": seconds, "open_cpu_seconds": cpu_seconds, "peak_rss_bytes": peak, "steady_rss_bytes": steady,
            "rss_before_bytes": before, "completed": stats.completed,
            "replayed_frames": stats.last_seq - stats.snapshot_seq}


CHILDREN = {"fill": child_fill, "open": child_open}


def run_child(kind: str, **args) -> dict:
    done = subprocess.run([sys.executable, __file__, "child", kind, json.dumps(args)],
                          capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"child {kind} {args} failed:\n{done.stderr}")
    return json.loads(done.stdout.splitlines()[-1])


# ----------------------------------------------------------------------------
# Parent side
# ----------------------------------------------------------------------------

def measure_library(n: int, scratch: Path, runs: int, wal_acks: int) -> dict:
    directory, wal = scratch / f"n{n}", scratch / f"n{n}-wal"
    result = {"n": n, "fill": run_child("fill", dir=str(directory), wal_dir=str(wal), n=n,
                                        wal_acks=wal_acks)}
    for name, path in (("open", directory), ("open_wal", wal)):
        samples = [run_child("open", dir=str(path)) for _ in range(runs)]
        result[name] = {"samples": samples,
                        **{key: statistics.median(sample[key] for sample in samples)
                           for key in ("open_seconds", "open_cpu_seconds", "peak_rss_bytes",
                                       "steady_rss_bytes")}}
    shutil.rmtree(directory)
    shutil.rmtree(wal)
    return result


def summarize(results: list[dict]) -> list[dict]:
    """One row per N, the RSS figures relative to N = 0 (or the smallest N)."""
    base = min(results, key=lambda result: result["n"])
    rows = []
    for result in results:
        n, fill, opened, replayed = result["n"], result["fill"], result["open"], result["open_wal"]

        def per(now: int, then: int, n: int = n) -> float | None:
            return (now - then) / n if n != base["n"] else None
        rows.append({
            "n": n,
            "writer_rss_per_tombstone": per(fill["writer_rss_bytes"], base["fill"]["writer_rss_bytes"]),
            "reopened_rss_per_tombstone": per(opened["steady_rss_bytes"],
                                              base["open"]["steady_rss_bytes"]),
            "snapshot_bytes": fill["snapshot_bytes"],
            "compact_seconds": fill["compact_seconds"],
            "fill_seconds": fill["fill_seconds"],
            "open_seconds": opened["open_seconds"],
            "tombstones_per_second": n / opened["open_seconds"] if n else None,
            "tombstones_per_cpu_second": n / opened["open_cpu_seconds"] if n else None,
            "peak_rss_bytes": opened["peak_rss_bytes"],
            "steady_rss_bytes": opened["steady_rss_bytes"],
            "peak_ratio": opened["peak_rss_bytes"] / opened["steady_rss_bytes"],
            "wal_bytes": fill["wal_bytes"],
            "wal_open_seconds": replayed["open_seconds"],
            "wal_peak_ratio": replayed["peak_rss_bytes"] / replayed["steady_rss_bytes"],
        })
    return rows


def table(rows: list[dict], wal_acks: int) -> str:
    def number(value, digits=0, unit=""):
        return "—" if value is None else f"{value:,.{digits}f}{unit}"
    mib = 1 << 20
    lines = ["| N | RSS/tombstone, writer | RSS/tombstone, reopened | snapshot | compact() "
             "| open | tombstones/s (per CPU s) | peak RSS | steady RSS | peak/steady "
             f"| open with {wal_acks:,} acks in the WAL | its peak/steady |",
             "|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for row in rows:
        lines.append(" | ".join([
            f"| {row['n']:,}", number(row["writer_rss_per_tombstone"], 1, " B"),
            number(row["reopened_rss_per_tombstone"], 1, " B"),
            number(row["snapshot_bytes"] / mib, 1, " MiB"), number(row["compact_seconds"], 2, " s"),
            number(row["open_seconds"], 2, " s"),
            f"{number(row['tombstones_per_second'])} ({number(row['tombstones_per_cpu_second'])})",
            number(row["peak_rss_bytes"] / mib, 0, " MiB"),
            number(row["steady_rss_bytes"] / mib, 0, " MiB"), number(row["peak_ratio"], 2),
            number(row["wal_open_seconds"], 2, " s"), number(row["wal_peak_ratio"], 2) + " |"]))
    return "\n".join(lines)


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sizes", type=lambda text: [int(x) for x in text.split(",")],
                        default=[0, 1_000_000, 10_000_000],
                        help="comma-separated N (default 0,1000000,10000000); the smallest is the baseline")
    parser.add_argument("--runs", type=int, default=3, help="reopens per N (the median is shown)")
    parser.add_argument("--wal-acks", type=int, default=100_000,
                        help="tasks put, reserved and acked after the snapshot for the WAL replay figure")
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--library-only", dest="daemon", action="store_false",
                      help="only the library's figures (the default for now)")
    mode.add_argument("--daemon", action="store_true",
                      help="also walqueued under load on each filled directory (not built yet)")
    parser.set_defaults(daemon=False)
    parser.add_argument("--json", metavar="PATH", help="write every sample here")
    parser.add_argument("--tmp-dir", metavar="DIR", default=None,
                        help="where the scratch directories go (deleted at the end)")
    args = parser.parse_args(argv)
    if args.daemon:
        parser.error("the daemon part is not built yet: it is to run walqueued on each directory "
                     "measure_library fills, before it is deleted; use --library-only")
    return args


def main(argv: list[str]) -> int:
    if argv[:1] == ["child"]:
        print(json.dumps(CHILDREN[argv[1]](json.loads(argv[2]))))
        return 0
    args = parse_args(argv)
    started = datetime.datetime.now(datetime.UTC)
    results = []
    with tempfile.TemporaryDirectory(prefix="bench-history-", dir=args.tmp_dir) as scratch:
        for n in sorted(set(args.sizes)):
            print(f"[bench_history] N = {n:,} ...", file=sys.stderr, flush=True)
            result = measure_library(n, Path(scratch), args.runs, args.wal_acks)
            results.append(result)
    rows = summarize(results)
    print(f"bench_history {started:%Y-%m-%d %H:%M} UTC, {platform.python_version()}, "
          f"{os.cpu_count()} CPUs, load {os.getloadavg()[0]:.1f}, medians of {args.runs} reopens")
    print(table(rows, args.wal_acks))
    if args.json:
        Path(args.json).write_text(json.dumps({"started": started.isoformat(), "runs": args.runs,
                                               "wal_acks": args.wal_acks, "rows": rows,
                                               "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
