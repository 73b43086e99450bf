"""Measure what a queue costs on disk and in memory, per task and per operation.

    .venv/bin/python scripts/disk_sizing.py [--tasks 100000] [--payload-bytes 100]
        [--id-chars 13] [--dir PATH] [--no-ram] [--json]

For docs/operations.md ("Disk and memory sizing"). Standard library and the
walqueue library only; no daemon. It builds queue directories in a
temporary directory (``--dir`` to put them on the disk you are sizing) and
measures, with task ids of ``--id-chars`` characters (the key defaults to the
id) and payloads whose canonical JSON is exactly ``--payload-bytes`` bytes:

* WAL bytes per operation: a ``put`` of one task, a ``put_many`` per task
  (1,000 tasks a frame), a ``reserve`` of one task, ``ack``, ``release``,
  ``touch``, and an ``expire`` frame reaping one lease; and one
  put + reserve + ack cycle;
* snapshot bytes per task: ready (live), leased, dead (keeps its payload)
  and completed (a tombstone: payload dropped, id, key and identity kept);
* with RAM measurement (the default), the resident memory a freshly opened
  queue holds per ready task and per tombstone, each in a fresh child
  process (VmRSS growth across ``Queue(directory)``, so it includes the
  allocator's slack, as an operator sees it), plus the Python heap the
  queue keeps (``tracemalloc``).

Every figure is a difference of two measurements divided by a task count,
so the fixed parts (the snapshot's header and end frames, an empty
segment) do not inflate it. The numbers depend on id and payload length:
rerun with yours.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import subprocess
import sys
import tempfile
import time
import tracemalloc
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))

from walqueue import PutRequest, Queue  # noqa: E402

NOW = 1_800_000_000  # the explicit clock, in Unix seconds like the daemon's (frames hold its digits)
LEASE_SECONDS = 30
PUT_MANY_TASKS = 1000
BATCH_TASKS = 1000  # frames per fsync while filling: one fsync a put would take minutes
WORKER = "worker-1"


def payload_of(size: int) -> dict:
    """A payload whose canonical JSON is exactly ``size`` bytes: {"body":"xxx..."}."""
    overhead = len('{"body":""}')
    if size < overhead:
        raise SystemExit(f"--payload-bytes must be at least {overhead}")
    return {"body": "x" * (size - overhead)}


def task_id_of(index: int, chars: int) -> str:
    """``t`` and zero-padded digits, ``chars`` characters in all."""
    return "t" + str(index).zfill(chars - 1)


def wal_bytes(q: Queue) -> int:
    return q.stats().wal_bytes


def snapshot_bytes(directory: Path) -> int:
    (snapshot,) = directory.glob("snapshot-*.snap")
    return snapshot.stat().st_size


def fill(directory: Path, count: int, payload: dict, id_chars: int, *, max_attempts: int = 3,
         first: int = 0) -> Queue:
    """A queue in ``directory`` with ``count`` ready tasks put one frame each."""
    q = Queue(directory)
    for start in range(first, first + count, BATCH_TASKS):
        with q.batch():
            for index in range(start, min(start + BATCH_TASKS, first + count)):
                q.put(task_id_of(index, id_chars), payload, max_attempts=max_attempts)
    return q


def per_task_snapshot(directory: Path, q: Queue, count: int, base_bytes: int) -> float:
    q.compact()
    return (snapshot_bytes(directory) - base_bytes) / count


def measure_operations(work: Path, payload: dict, id_chars: int) -> dict:
    """WAL bytes of one frame of each kind, on a small queue."""
    q = Queue(work / "operations")
    sizes = {}
    before = wal_bytes(q)
    q.put(task_id_of(0, id_chars), payload)
    sizes["put (one task, one frame)"] = wal_bytes(q) - before

    before = wal_bytes(q)
    (lease,) = q.reserve(WORKER, now=NOW, lease_seconds=LEASE_SECONDS)
    sizes["reserve (one task)"] = wal_bytes(q) - before
    before = wal_bytes(q)
    lease = q.touch(lease, now=NOW, lease_seconds=LEASE_SECONDS)
    sizes["touch"] = wal_bytes(q) - before
    before = wal_bytes(q)
    q.release(lease, now=NOW, delay=0)
    sizes["release"] = wal_bytes(q) - before
    q.close()

    # A reserve past the deadline writes an expire frame, then its reserve frame.
    q = Queue(work / "operations-2")
    q.put(task_id_of(0, id_chars), payload)
    q.reserve(WORKER, now=NOW, lease_seconds=LEASE_SECONDS)
    reserve_size = sizes["reserve (one task)"]
    before = wal_bytes(q)
    (lease,) = q.reserve(WORKER, now=NOW + LEASE_SECONDS, lease_seconds=LEASE_SECONDS)
    sizes["expire (one lease reaped)"] = wal_bytes(q) - before - reserve_size
    before = wal_bytes(q)
    q.ack(lease, now=NOW + LEASE_SECONDS)
    sizes["ack"] = wal_bytes(q) - before
    q.close()
    sizes["cycle: put + reserve + ack"] = (sizes["put (one task, one frame)"] + reserve_size + sizes["ack"])
    return sizes


def measure(work: Path, count: int, payload_size: int, id_chars: int) -> dict:
    payload = payload_of(payload_size)
    results: dict = {"tasks": count, "payload_bytes": payload_size, "id_chars": id_chars}
    results["wal_bytes_per_operation"] = measure_operations(work, payload, id_chars)

    # Snapshot of a queue holding one task: the fixed header and end frames plus one entry.
    one = work / "one"
    q = fill(one, 1, payload, id_chars)
    q.compact()
    one_task_snapshot = snapshot_bytes(one)
    q.close()

    # Ready tasks, one put per frame.
    live = work / "live"
    q = fill(live, count, payload, id_chars, max_attempts=1)
    results["wal_bytes_per_put"] = wal_bytes(q) / count
    started = time.monotonic()
    q.compact()
    results["compact_seconds_ready"] = round(time.monotonic() - started, 2)
    results["snapshot_bytes_per_ready_task"] = (snapshot_bytes(live) - one_task_snapshot) / (count - 1)
    results["snapshot_fixed_bytes"] = one_task_snapshot - results["snapshot_bytes_per_ready_task"]
    q.close()

    # The same tasks put 1,000 to a frame.
    many = work / "put-many"
    q = Queue(many)
    for start in range(0, count, PUT_MANY_TASKS):
        q.put_many([PutRequest(task_id_of(index, id_chars), payload)
                    for index in range(start, min(start + PUT_MANY_TASKS, count))])
    results["wal_bytes_per_task_put_many_1000"] = wal_bytes(q) / count
    q.close()

    # Leased: every task of the live queue reserved (one reserve frame of up to 1,000).
    q = Queue(live)
    before = wal_bytes(q)
    leases = []
    with q.batch():
        for _ in range(0, count, 1000):
            leases += q.reserve(WORKER, now=NOW, lease_seconds=LEASE_SECONDS, limit=1000)
    results["wal_bytes_per_task_reserve_1000"] = (wal_bytes(q) - before) / count
    results["snapshot_bytes_per_leased_task"] = per_task_snapshot(
        live, q, count, one_task_snapshot - results["snapshot_bytes_per_ready_task"])

    # Dead: released at their only attempt; they keep their payload.
    with q.batch():
        for lease in leases:
            q.release(lease, now=NOW)
    results["snapshot_bytes_per_dead_task"] = per_task_snapshot(live, q, count, results["snapshot_fixed_bytes"])
    q.close()

    # Completed: put, reserve and ack every task, then compact.
    done = work / "completed"
    q = fill(done, count, payload, id_chars)
    before = wal_bytes(q)
    with q.batch():
        for _ in range(0, count, 1000):
            for lease in q.reserve(WORKER, now=NOW, lease_seconds=LEASE_SECONDS, limit=1000):
                q.ack(lease, now=NOW)
    q.close()
    # Recovery from the WAL alone: every put, reserve and ack frame replayed.
    started = time.monotonic()
    q = Queue(done)
    results["replay_seconds"] = round(time.monotonic() - started, 2)
    results["replay_frames"] = q.stats().last_seq
    results["replay_wal_bytes"] = wal_bytes(q)
    started = time.monotonic()
    results["snapshot_bytes_per_tombstone"] = per_task_snapshot(done, q, count, results["snapshot_fixed_bytes"])
    results["compact_seconds_completed"] = round(time.monotonic() - started, 2)
    q.close()
    return results


def ram_child(directory: str) -> None:
    """In a fresh process: memory held by ``Queue(directory)``; prints JSON."""
    gc.collect()
    rss_before = proc_status("VmRSS")
    q = Queue(directory)
    gc.collect()
    rss_after = proc_status("VmRSS")
    peak = proc_status("VmHWM")
    tasks = _task_count(q)
    q.close()
    del q
    gc.collect()
    tracemalloc.start()
    q = Queue(directory)
    gc.collect()
    heap, _peak = tracemalloc.get_traced_memory()
    q.close()
    print(json.dumps({"tasks": tasks, "rss_bytes": rss_after - rss_before, "peak_bytes": peak - rss_before,
                      "heap_bytes": heap}))


def _task_count(q: Queue) -> int:
    stats = q.stats()
    return stats.ready + stats.leased + stats.completed + stats.dead


def proc_status(field: str) -> int:
    """A memory figure of this process from /proc/self/status, in bytes."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {field} in /proc/self/status")


def measure_ram(work: Path) -> dict:
    """Each kind of queue opened in a fresh child process."""
    results = {}

    def child(label: str, name: str) -> None:
        output = subprocess.run([sys.executable, __file__, "--ram-child", str(work / name)],
                                check=True, capture_output=True, text=True, timeout=600).stdout
        measured = json.loads(output)
        for figure in ("rss", "peak", "heap"):
            results[f"{figure}_bytes_per_{label}"] = measured[f"{figure}_bytes"] / measured["tasks"]

    child("ready_task_from_wal", "put-many")
    with Queue(work / "put-many") as q:
        q.compact()
    child("ready_task_from_snapshot", "put-many")
    child("tombstone_from_snapshot", "completed")
    return results


def report(results: dict) -> str:
    lines = [
        f"tasks={results['tasks']}  payload={results['payload_bytes']} B of canonical JSON  "
        f"task id={results['id_chars']} chars (key = id)",
        "",
        "WAL bytes per frame (36 bytes of framing included):",
    ]
    for name, size in results["wal_bytes_per_operation"].items():
        lines.append(f"  {name:<34} {size:>8,} B")
    lines += [
        "",
        "WAL bytes per task:",
        f"  put, one task a frame              {results['wal_bytes_per_put']:>8,.1f} B",
        f"  put_many, 1,000 tasks a frame      {results['wal_bytes_per_task_put_many_1000']:>8,.1f} B",
        f"  reserve, 1,000 tasks a frame       {results['wal_bytes_per_task_reserve_1000']:>8,.1f} B",
        "",
        "snapshot bytes per task:",
        f"  ready (live)                       {results['snapshot_bytes_per_ready_task']:>8,.1f} B",
        f"  leased                             {results['snapshot_bytes_per_leased_task']:>8,.1f} B",
        f"  dead (payload kept)                {results['snapshot_bytes_per_dead_task']:>8,.1f} B",
        f"  completed (tombstone)              {results['snapshot_bytes_per_tombstone']:>8,.1f} B",
        f"  fixed per snapshot                 {results['snapshot_fixed_bytes']:>8,.1f} B",
        "",
        f"compact(): {results['compact_seconds_ready']} s for {results['tasks']:,} ready tasks, "
        f"{results['compact_seconds_completed']} s for {results['tasks']:,} tombstones",
        f"open (recovery) replaying {results['replay_frames']:,} frames, "
        f"{results['replay_wal_bytes']:,} WAL bytes: {results['replay_seconds']} s",
    ]
    if "rss_bytes_per_ready_task_from_wal" in results:
        lines += ["", "memory of a freshly opened queue, per task: RSS growth, peak RSS growth "
                  "during the open, Python heap kept (tracemalloc):"]
        for label, key in (("ready, recovered from the WAL", "ready_task_from_wal"),
                           ("ready, loaded from a snapshot", "ready_task_from_snapshot"),
                           ("completed, from a snapshot", "tombstone_from_snapshot")):
            lines.append(f"  {label:<34} {results['rss_bytes_per_' + key]:>6,.0f} B RSS"
                         f" {results['peak_bytes_per_' + key]:>6,.0f} B peak"
                         f" {results['heap_bytes_per_' + key]:>6,.0f} B heap")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=100_000, help="tasks per measured queue (default 100000)")
    parser.add_argument("--payload-bytes", type=int, default=100,
                        help="canonical JSON bytes of each payload (default 100)")
    parser.add_argument("--id-chars", type=int, default=13, help="characters per task id (default 13)")
    parser.add_argument("--dir", help="where to build the queues (default: a temporary directory)")
    parser.add_argument("--no-ram", action="store_true", help="skip the memory measurement")
    parser.add_argument("--json", action="store_true", help="print the results as one JSON object")
    parser.add_argument("--ram-child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.ram_child:
        ram_child(args.ram_child)
        return
    if args.tasks < 2:
        parser.error("--tasks must be at least 2")
    if args.id_chars < len(str(args.tasks - 1)) + 1:
        parser.error(f"--id-chars {args.id_chars} is too short for {args.tasks} distinct ids")
    with tempfile.TemporaryDirectory(prefix="walqueue-sizing-", dir=args.dir) as work:
        results = measure(Path(work), args.tasks, args.payload_bytes, args.id_chars)
        if not args.no_ram:
            results.update(measure_ram(Path(work)))
    print(json.dumps(results, indent=2) if args.json else report(results))


if __name__ == "__main__":
    os.environ.setdefault("PYTHONHASHSEED", "0")
    main()
