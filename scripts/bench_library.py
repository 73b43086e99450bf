#!/usr/bin/env python3
"""Benchmark of the walqueue library (issue 2). Not a test: pytest never collects it.

    .venv/bin/python scripts/bench_library.py              # full: 100,000 and 1,000,000 tasks
    .venv/bin/python scripts/bench_library.py --quick      # 100,000 only, under a minute
    .venv/bin/python scripts/bench_library.py --sizes 2000 --runs 1   # tiny (the smoke test)
    .venv/bin/python scripts/bench_library.py profile wal-replay --size 100000

Every measurement runs in a fresh child process (this script, same
interpreter, sub-command `child`), so its timing starts from a clean heap
and its peak memory is its own. Peak memory is the child's peak resident set
size, VmHWM from /proc/self/status (what getrusage's ru_maxrss reports, but
not inherited from the parent across exec, and resettable between two phases
of one child through /proc/self/clear_refs). It includes the interpreter
(reported separately as the baseline) and the pages of the memory-mapped
snapshot/WAL files the library reads.

The fixtures (directories holding N tasks) are built once per size and
copied by the parent before any measurement that writes to them; all of
them live under one temporary directory that is deleted at the end. The
page cache is warm (nothing drops it), so recovery times are CPU-bound
times, not cold-disk times.

The benchmark imports walqueue from this checkout's src/, whatever is
installed in the venv.
"""

from __future__ import annotations

import argparse
import contextlib
import cProfile
import datetime
import gc
import json
import os
import platform
import pstats
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))

WORKER = "bench-worker"
LEASE_SECONDS = 3600
NOW = 1                 # every reserve/ack/release happens at this time: no lease expires
PUT_FRAME_TASKS = 1000  # put_many size used to build the fixtures
SMALL_RESERVE_READY = 1000


def task_id(i: int) -> str:
    return f"task-{i:09d}"


def payload(i: int) -> dict:
    """The payload of every task: a small realistic JSON object (~95 bytes)."""
    return {"kind": "email", "n": i, "priority": "normal", "template": "welcome-v2",
            "to": f"user-{i}@example.com"}


def payload_bytes() -> int:
    return len(json.dumps(payload(123456), sort_keys=True, separators=(",", ":")))


# ----------------------------------------------------------------------------
# Child side: one measurement per process. Each returns a dict of numbers.
# ----------------------------------------------------------------------------

def peak_rss_kib() -> int:
    """Peak RSS of this process (VmHWM), in KiB; ru_maxrss if /proc is missing."""
    try:
        with open("/proc/self/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1])
    except OSError:
        pass
    import resource
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss


def reset_peak_rss() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False if not possible."""
    try:
        with open("/proc/self/clear_refs", "w") as clear_refs:
            clear_refs.write("5")
        return True
    except OSError:
        return False


def fill(q, start: int, stop: int, frame_tasks: int = PUT_FRAME_TASKS) -> None:
    for first in range(start, stop, frame_tasks):
        q.put_many([{"task_id": task_id(i), "payload": payload(i)}
                    for i in range(first, min(first + frame_tasks, stop))])


def cycles(q, count: int, per_batch: int = 1000) -> None:
    """`count` reserve(limit=1) cycles, alternately ack and release: 2 small frames each."""
    done = 0
    while done < count:
        with q.batch():
            for _ in range(min(per_batch, count - done)):
                (lease,) = q.reserve(WORKER, now=NOW, lease_seconds=LEASE_SECONDS)
                if done % 2 == 0:
                    q.ack(lease, now=NOW)
                else:
                    q.release(lease, now=NOW)
                done += 1


def child_build(args: dict) -> dict:
    """Build the fixtures of one size under args['base']:

    wal/      N tasks put in put_many frames of 1000, then C reserve cycles
              (alternately ack and release): N/1000 put frames + 2C small frames
    snap/     the N tasks (all ready) in a snapshot, empty WAL
    snapwal/  snap/ plus the same C cycles: snapshot + 2C small frames
    """
    from walqueue import Queue
    base, n, c = Path(args["base"]), args["n"], args["cycles"]
    wal, snap, snapwal = base / "wal", base / "snap", base / "snapwal"
    started = time.perf_counter()
    with Queue(wal) as q:
        fill(q, 0, n)
        put_seconds = time.perf_counter() - started
        shutil.copytree(wal, snapwal)   # every frame is fsynced: a consistent copy
        cycles(q, c)
        last_seq = q.stats().last_seq
    with Queue(snapwal) as q:
        q.compact()
        shutil.copytree(snapwal, snap)
        cycles(q, c)
    for directory in (wal, snap, snapwal):
        with contextlib.suppress(FileNotFoundError):
            os.unlink(directory / "LOCK")
    put_frames = -(-n // PUT_FRAME_TASKS)
    return {"put_many_tasks_per_s": n / put_seconds, "put_frames": put_frames,
            "small_frames": 2 * c, "wal_frames": last_seq, "build_seconds": time.perf_counter() - started,
            "bytes": {name: sum(f.stat().st_size for f in (base / name).iterdir())
                      for name in ("wal", "snap", "snapwal")}}


def child_fsync(args: dict) -> dict:
    count = args["count"]
    fd = os.open(os.path.join(args["dir"], "fsync.bin"), os.O_WRONLY | os.O_APPEND | os.O_CREAT)
    record = b"x" * 100
    try:
        started = time.perf_counter()
        for _ in range(count):
            os.write(fd, record)
            os.fsync(fd)
        seconds = time.perf_counter() - started
    finally:
        os.close(fd)
    return {"fsyncs_per_s": count / seconds}


def child_put(args: dict) -> dict:
    """put() one at a time (one fsync each), put() in batch() of 100, put_many(1000)."""
    from walqueue import Queue
    single, batched, frames = args["single"], args["batched"], args["put_many_frames"]
    with Queue(args["dir"]) as q:
        started = time.perf_counter()
        for i in range(single):
            q.put(task_id(i), payload(i))
        single_seconds = time.perf_counter() - started

        first = single
        started = time.perf_counter()
        for start in range(first, first + batched, 100):
            with q.batch():
                for i in range(start, start + 100):
                    q.put(task_id(i), payload(i))
        batched_seconds = time.perf_counter() - started

        first += batched
        started = time.perf_counter()
        fill(q, first, first + frames * PUT_FRAME_TASKS)
        many_seconds = time.perf_counter() - started
    return {"put_single_per_s": single / single_seconds,
            "put_batch100_per_s": batched / batched_seconds,
            "put_many1000_tasks_per_s": frames * PUT_FRAME_TASKS / many_seconds}


def child_cycle(args: dict) -> dict:
    """reserve(limit=1) + ack cycles on a queue of `ready` ready tasks, without and
    with batch() (100 cycles per batch)."""
    from walqueue import Queue
    single, batched = args["single"], args["batched"]
    with Queue(args["dir"]) as q:
        fill(q, 0, args["ready"])
        started = time.perf_counter()
        for _ in range(single):
            (lease,) = q.reserve(WORKER, now=NOW, lease_seconds=LEASE_SECONDS)
            q.ack(lease, now=NOW)
        single_seconds = time.perf_counter() - started
        started = time.perf_counter()
        for _ in range(batched // 100):
            with q.batch():
                for _ in range(100):
                    (lease,) = q.reserve(WORKER, now=NOW, lease_seconds=LEASE_SECONDS)
                    q.ack(lease, now=NOW)
        batched_seconds = time.perf_counter() - started
    return {"cycle_single_per_s": single / single_seconds,
            "cycle_batch100_per_s": batched // 100 * 100 / batched_seconds}


def child_wal_recovery(args: dict) -> dict:
    """Open a directory whose WAL holds everything (no snapshot), then compact() it."""
    from walqueue import Queue
    gc.collect()
    baseline = peak_rss_kib()
    started = time.perf_counter()
    q = Queue(args["dir"])
    open_seconds = time.perf_counter() - started
    peak = peak_rss_kib()
    stats = q.stats()
    started = time.perf_counter()
    q.compact()
    compact_seconds = time.perf_counter() - started
    q.close()
    return {"open_seconds": open_seconds, "peak_rss_kib": peak, "baseline_rss_kib": baseline,
            "compact_seconds": compact_seconds, "last_seq": stats.last_seq,
            "tasks": stats.ready + stats.leased + stats.completed + stats.dead}


def child_snapshot_recovery(args: dict) -> dict:
    """Open snap/ (snapshot only), close it, then open snapwal/ (the same snapshot
    plus 2C small frames), timing the snapshot-loading part of that second open
    separately so the replay of the small frames can be isolated two ways:
      by_phase:    small frames / (open(snapwal) - its own load_snapshot time)
      by_subtract: small frames / (open(snapwal) - open(snap))
    """
    from walqueue import Queue
    try:  # the module whose load_snapshot recovery calls
        import walqueue.recovery as queue_module
    except ImportError:
        import walqueue.queue as queue_module
    gc.collect()
    baseline = peak_rss_kib()
    started = time.perf_counter()
    q = Queue(args["snap"])
    snap_seconds = time.perf_counter() - started
    snap_peak = peak_rss_kib()
    tasks = q.stats().ready
    q.close()
    del q
    gc.collect()
    resettable = reset_peak_rss()

    load_seconds: list[float] = []
    original = getattr(queue_module, "load_snapshot", None)
    if original is not None:
        def timed_load(*a, **k):
            t0 = time.perf_counter()
            try:
                return original(*a, **k)
            finally:
                load_seconds.append(time.perf_counter() - t0)
        queue_module.load_snapshot = timed_load
    try:
        started = time.perf_counter()
        q = Queue(args["snapwal"])
        snapwal_seconds = time.perf_counter() - started
    finally:
        if original is not None:
            queue_module.load_snapshot = original
    snapwal_peak = peak_rss_kib()
    last_seq, snapshot_seq = q.stats().last_seq, q.stats().snapshot_seq
    q.close()
    frames = last_seq - snapshot_seq
    result = {"snap_open_seconds": snap_seconds, "snap_peak_rss_kib": snap_peak,
              "baseline_rss_kib": baseline, "tasks": tasks, "small_frames": frames,
              "snapwal_open_seconds": snapwal_seconds,
              "snapwal_peak_rss_kib": snapwal_peak if resettable else None,
              # None when noise makes the difference of two ~equal opens <= 0
              "replay_by_subtract_frames_per_s": (frames / (snapwal_seconds - snap_seconds)
                                                  if snapwal_seconds > snap_seconds else None)}
    if load_seconds:
        replay = snapwal_seconds - load_seconds[0]
        result["snapwal_load_snapshot_seconds"] = load_seconds[0]
        result["replay_by_phase_seconds"] = replay
        result["replay_by_phase_frames_per_s"] = frames / max(replay, 1e-9)
    return result


def child_reserve(args: dict) -> dict:
    """reserve(limit=1), then release, on a queue of `ready` ready tasks.

    Batched: `count` reserves inside batch() blocks of 100 (no fsync inside);
    each call is timed on its own, so the reserve and release costs are
    separate. Unbatched: `unbatched` reserves and releases with an fsync each.
    """
    from walqueue import Queue
    q = Queue(args["dir"])
    ready = q.stats().ready
    clock = time.perf_counter_ns
    reserve_ns = release_ns = 0
    count = args["count"]
    done = 0
    while done < count:
        with q.batch():
            for _ in range(min(100, count - done)):
                t0 = clock()
                (lease,) = q.reserve(WORKER, now=NOW, lease_seconds=LEASE_SECONDS)
                t1 = clock()
                q.release(lease, now=NOW)
                t2 = clock()
                reserve_ns += t1 - t0
                release_ns += t2 - t1
                done += 1
    unbatched = args["unbatched"]
    reserve_sync_ns = release_sync_ns = 0
    for _ in range(unbatched):
        t0 = clock()
        (lease,) = q.reserve(WORKER, now=NOW, lease_seconds=LEASE_SECONDS)
        t1 = clock()
        q.release(lease, now=NOW)
        t2 = clock()
        reserve_sync_ns += t1 - t0
        release_sync_ns += t2 - t1
    q.close()
    return {"ready": ready, "reserve_us": reserve_ns / count / 1000,
            "release_us": release_ns / count / 1000,
            "reserve_fsync_us": reserve_sync_ns / unbatched / 1000,
            "release_fsync_us": release_sync_ns / unbatched / 1000}


CHILDREN = {
    "build": child_build,
    "fsync": child_fsync,
    "put": child_put,
    "cycle": child_cycle,
    "wal-recovery": child_wal_recovery,
    "snapshot-recovery": child_snapshot_recovery,
    "reserve": child_reserve,
}


def run_child_main(kind: str, args: dict) -> None:
    result = CHILDREN[kind](args)
    print(json.dumps(result), flush=True)


# ----------------------------------------------------------------------------
# Parent side
# ----------------------------------------------------------------------------

def spawn(kind: str, **args) -> dict:
    command = [sys.executable, str(Path(__file__).resolve()), "child", kind, json.dumps(args)]
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    if done.returncode != 0:
        raise SystemExit(f"child {kind} {args} failed with exit code {done.returncode}:\n"
                         f"{done.stderr}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def say(message: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def machine_info(tmp_base: str) -> dict:
    info = {"date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "nproc": os.cpu_count(), "python": platform.python_version(),
            "platform": platform.platform(), "cpu": None, "memory": None, "filesystem": None,
            "tmp_dir": tmp_base,
            "same_device_as_project": os.stat(tmp_base).st_dev == os.stat(ROOT).st_dev}
    with contextlib.suppress(OSError):
        for line in open("/proc/cpuinfo"):
            if line.startswith("model name"):
                info["cpu"] = line.split(":", 1)[1].strip()
                break
    with contextlib.suppress(OSError):
        for line in open("/proc/meminfo"):
            if line.startswith("MemTotal:"):
                info["memory"] = f"{int(line.split()[1]) / 1024 / 1024:.1f} GiB"
                break
    with contextlib.suppress(OSError, subprocess.SubprocessError):
        df = subprocess.run(["df", "-T", tmp_base], capture_output=True, text=True, check=True)
        fields = df.stdout.splitlines()[-1].split()
        info["filesystem"] = f"{fields[1]} on {fields[0]} (mounted at {fields[-1]})"
    return info


def median_of(samples: list[float]) -> float:
    return statistics.median(samples)


class Table:
    def __init__(self) -> None:
        self.rows: list[dict] = []

    def add(self, metric: str, samples: list[float | None], unit: str, *, target: str = "",
            passes=None, digits: int = 0) -> None:
        samples = [s for s in samples if s is not None]
        if not samples:
            return
        median = median_of(samples)
        verdict = "—" if passes is None else ("pass" if passes(median) else "FAIL")
        self.rows.append({"metric": metric, "unit": unit, "median": median, "min": min(samples),
                          "max": max(samples), "samples": samples, "target": target or "—",
                          "verdict": verdict, "digits": digits})

    def markdown(self) -> str:
        lines = ["| metric | median | min–max | target | pass/fail |",
                 "|---|---:|---:|---|---|"]
        for row in self.rows:
            f = _formatter(row["digits"])
            unit = f" {row['unit']}" if row["unit"] else ""
            lines.append(f"| {row['metric']} | {f(row['median'])}{unit} | "
                         f"{f(row['min'])}–{f(row['max'])} | {row['target']} | {row['verdict']} |")
        return "\n".join(lines)


def _formatter(digits: int):
    return lambda value: f"{value:,.{digits}f}"


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true",
                        help="100,000 tasks only and shorter loops (a smoke run)")
    parser.add_argument("--sizes", type=lambda s: [int(x) for x in s.split(",")],
                        help="comma-separated task counts (default 100000,1000000; "
                             "--quick: 100000)")
    parser.add_argument("--runs", type=int, default=3, help="runs per measurement (default 3)")
    parser.add_argument("--json", metavar="PATH", help="write all results and samples here")
    parser.add_argument("--tmp-dir", metavar="DIR", default=None,
                        help="where the scratch directory goes (default: the system tmp)")
    parser.add_argument("--smoke", action="store_true",
                        help="tiny loops (about 20 fsyncs each): checks that the script "
                             "works, measures nothing worth reading; for the smoke test")
    args = parser.parse_args(argv)
    if args.sizes is None:
        args.sizes = [100_000] if args.quick else [100_000, 1_000_000]
    if args.runs < 1 or any(n < 2 for n in args.sizes):
        parser.error("--runs must be >= 1 and every size >= 2")
    return args


def bench(argv: list[str]) -> int:
    args = parse_args(argv)
    command = shlex.join([os.path.relpath(sys.executable), os.path.relpath(__file__), *argv])
    sizes = sorted(set(args.sizes))
    large = sizes[-1]
    small_ready = min(SMALL_RESERVE_READY, large)
    loops = ({"fsync": 200, "put_single": 200, "put_batched": 5_000, "put_many_frames": 5,
              "cycle_single": 100, "cycle_batched": 5_000,
              "reserve": 1_000, "reserve_unbatched": 100} if args.quick else
             {"fsync": 1_000, "put_single": 1_000, "put_batched": 20_000, "put_many_frames": 20,
              "cycle_single": 500, "cycle_batched": 20_000,
              "reserve": 2_000, "reserve_unbatched": 200})

    if args.smoke:
        loops = {"fsync": 20, "put_single": 20, "put_batched": 200, "put_many_frames": 1,
                 "cycle_single": 10, "cycle_batched": 200,
                 "reserve": 200, "reserve_unbatched": 10}

    tmp_base = args.tmp_dir or tempfile.gettempdir()
    os.makedirs(tmp_base, exist_ok=True)
    info = machine_info(tmp_base)
    info["load_before"] = os.getloadavg()
    scratch = Path(tempfile.mkdtemp(prefix="walqueue-bench-", dir=tmp_base))
    say(f"scratch directory {scratch} ({info['filesystem']}); sizes {sizes}, {args.runs} runs")
    results: dict = {"command": command, "machine": info, "sizes": sizes, "runs": args.runs,
                     "payload": payload(123), "payload_json_bytes": payload_bytes(),
                     "loops": loops, "builds": {}, "samples": {}}
    samples = results["samples"]
    started = time.perf_counter()
    try:
        fixtures = {}
        build_sizes = sorted(set(sizes) | {small_ready})
        for n in build_sizes:
            base = scratch / f"n{n}"
            base.mkdir()
            c = max(n // 10, 1)
            say(f"building fixtures for {n:,} tasks ({c:,} cycles)")
            results["builds"][n] = spawn("build", base=str(base), n=n, cycles=c)
            fixtures[n] = base

        def work_copy(source: Path) -> Path:
            target = scratch / "work"
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(source, target)
            return target

        def fresh_dir() -> Path:
            target = scratch / "work"
            if target.exists():
                shutil.rmtree(target)
            target.mkdir()
            return target

        def record(name: str, value) -> None:
            samples.setdefault(name, []).append(value)

        for run in range(args.runs):
            say(f"run {run + 1}/{args.runs}")
            record("fsync", spawn("fsync", dir=str(fresh_dir()), count=loops["fsync"]))
            record("put", spawn("put", dir=str(fresh_dir()), single=loops["put_single"],
                                batched=loops["put_batched"],
                                put_many_frames=loops["put_many_frames"]))
            record("cycle", spawn("cycle", dir=str(fresh_dir()),
                                  ready=loops["cycle_single"] + loops["cycle_batched"],
                                  single=loops["cycle_single"], batched=loops["cycle_batched"]))
            for n in sizes:
                say(f"  recovery, {n:,} tasks")
                record(f"wal-recovery-{n}",
                       spawn("wal-recovery", dir=str(work_copy(fixtures[n] / "wal"))))
                record(f"snapshot-recovery-{n}",
                       spawn("snapshot-recovery", snap=str(fixtures[n] / "snap"),
                             snapwal=str(fixtures[n] / "snapwal")))
            for n in sorted({small_ready, large}):
                say(f"  reserve cost, {n:,} ready")
                record(f"reserve-{n}", spawn("reserve", dir=str(work_copy(fixtures[n] / "snap")),
                                             count=loops["reserve"],
                                             unbatched=loops["reserve_unbatched"]))
        work = scratch / "work"
        if work.exists():
            shutil.rmtree(work)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    info["load_after"] = os.getloadavg()
    info["seconds"] = time.perf_counter() - started

    table = build_table(results, sizes, small_ready, large)
    results["table"] = table.rows
    print(report(results, table, small_ready, large))
    if args.json:
        Path(args.json).write_text(json.dumps(results, indent=2, default=str) + "\n")
    return 0


def build_table(results: dict, sizes: list[int], small_ready: int, large: int) -> Table:
    s = results["samples"]
    t = Table()

    def col(name: str, field: str) -> list:
        return [sample.get(field) for sample in s[name]]

    fsync = col("fsync", "fsyncs_per_s")
    t.add("fsync baseline: append 100 B + fsync", fsync, "/s")
    single = col("put", "put_single_per_s")
    t.add("put() one at a time (1 fsync each)", single, "puts/s")
    t.add("put() one at a time ÷ fsync rate", [a / b for a, b in zip(single, fsync, strict=True)],
          "", digits=2)
    t.add("put() inside batch() of 100", col("put", "put_batch100_per_s"), "puts/s")
    t.add("put_many() of 1,000 (1 fsync each)", col("put", "put_many1000_tasks_per_s"), "tasks/s")
    t.add("reserve+ack cycle, no batch (2 fsyncs)", col("cycle", "cycle_single_per_s"), "cycles/s")
    t.add("reserve+ack cycle inside batch() of 100", col("cycle", "cycle_batch100_per_s"),
          "cycles/s")
    for n in sizes:
        build = results["builds"][n]
        frames, small = build["wal_frames"], build["small_frames"]
        wal, snap = f"wal-recovery-{n}", f"snapshot-recovery-{n}"
        label = f"{n:,} tasks"
        opens = col(wal, "open_seconds")
        t.add(f"recovery from WAL, {label} ({build['put_frames']:,} put + {small:,} small "
              f"frames)", opens, "s", digits=2)
        t.add(f"recovery from WAL, {label}: tasks/s", [n / x for x in opens], "tasks/s")
        t.add(f"recovery from WAL, {label}: frames/s (all frames)",
              [frames / x for x in opens], "frames/s")
        t.add(f"recovery from WAL, {label}: peak RSS", [k / 1024 for k in col(wal, "peak_rss_kib")],
              "MiB")
        snap_opens = col(snap, "snap_open_seconds")
        t.add(f"recovery from snapshot, {label}", snap_opens, "s", digits=2)
        t.add(f"snapshot load, {label}", [n / x for x in snap_opens], "tasks/s",
              target=">= 200,000", passes=lambda m: m >= 200_000)
        t.add(f"recovery from snapshot, {label}: peak RSS",
              [k / 1024 for k in col(snap, "snap_peak_rss_kib")], "MiB")
        t.add(f"WAL replay of {small:,} small reserve/ack/release frames after a {label} "
              f"snapshot (open minus its own snapshot load)",
              col(snap, "replay_by_phase_frames_per_s"), "frames/s",
              target=">= 100,000", passes=lambda m: m >= 100_000)
        subtracted = col(snap, "replay_by_subtract_frames_per_s")
        dropped = subtracted.count(None)
        t.add("cross-check: same, as small frames / (open(snapshot+WAL) − open(snapshot only)); "
              "noisy: a difference of two large times"
              + (f" ({dropped} run(s) with a difference <= 0 left out)" if dropped else ""),
              subtracted, "frames/s")
        t.add(f"snapshot write: compact() of {label}", col(wal, "compact_seconds"), "s", digits=2)
    r_small, r_large = f"reserve-{small_ready}", f"reserve-{large}"
    small_us, large_us = col(r_small, "reserve_us"), col(r_large, "reserve_us")
    for n, name in ((small_ready, r_small), (large, r_large)):
        label = f"{n:,} ready"
        t.add(f"reserve(limit=1) inside batch(), {label}", col(name, "reserve_us"), "µs", digits=1)
        t.add(f"release() inside batch(), {label}", col(name, "release_us"), "µs", digits=1)
        t.add(f"reserve(limit=1) with its fsync, {label}", col(name, "reserve_fsync_us"), "µs",
              digits=1)
    if large != small_ready:
        t.add(f"reserve cost ratio, {large:,} vs {small_ready:,} ready (per run)",
              [b / a for a, b in zip(small_us, large_us, strict=True)], "×", digits=2,
              target="< 3", passes=lambda m: m < 3)
    return t


def _baseline_mib(results: dict) -> float:
    values = [sample["baseline_rss_kib"] for name, samples in results["samples"].items()
              if name.startswith("wal-recovery") for sample in samples]
    return median_of(values) / 1024 if values else float("nan")


def report(results: dict, table: Table, small_ready: int, large: int) -> str:
    info = results["machine"]
    build_lines = []
    for n, build in results["builds"].items():
        sizes = ", ".join(f"{name}/ {size / 2**20:,.1f} MiB" for name, size in build["bytes"].items())
        build_lines.append(f"- {int(n):,} tasks: {build['wal_frames']:,} WAL frames "
                           f"({build['put_frames']:,} put_many frames of {PUT_FRAME_TASKS:,} + "
                           f"{build['small_frames']:,} small frames); {sizes}")
    load_before = ", ".join(f"{x:.2f}" for x in info["load_before"])
    load_after = ", ".join(f"{x:.2f}" for x in info["load_after"])
    return "\n".join([
        f"# walqueue library benchmark — {info['date']}",
        "",
        f"Command: `{results['command']}`",
        f"Machine: {info['nproc']} CPUs ({info['cpu']}), {info['memory']} RAM, "
        f"Python {info['python']}, {info['platform']}",
        f"Scratch files: {info['tmp_dir']} — {info['filesystem']}; same device as the project: "
        f"{info['same_device_as_project']}",
        f"Load average before: {load_before}; after: {load_after}; "
        f"took {info['seconds']:.0f} s",
        f"Payload ({results['payload_json_bytes']} bytes of JSON): "
        f"`{json.dumps(results['payload'])}`",
        f"Medians of {results['runs']} run(s), each measurement in a fresh child process; "
        "peak RSS = VmHWM of that child (includes the interpreter, "
        f"{_baseline_mib(results):.0f} MiB after imports, and the mapped file pages). "
        "Page cache warm.",
        "Fixtures:",
        *build_lines,
        "",
        table.markdown(),
    ])


# ----------------------------------------------------------------------------
# Profiling the slow paths
# ----------------------------------------------------------------------------

PROFILE_TARGETS = ("wal-replay", "snapshot-load", "small-frame-replay", "compact")


def profile(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="bench_library.py profile")
    parser.add_argument("target", choices=PROFILE_TARGETS)
    parser.add_argument("--size", type=int, default=100_000)
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--sort", default="tottime")
    args = parser.parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="walqueue-profile-"))
    try:
        spawn("build", base=str(scratch), n=args.size, cycles=max(args.size // 10, 1))
        from walqueue import Queue
        if args.target == "compact":
            q = Queue(scratch / "wal")
            run = q.compact
        else:
            directory = {"wal-replay": "wal", "snapshot-load": "snap",
                         "small-frame-replay": "snapwal"}[args.target]
            if args.target == "small-frame-replay":
                # Load the snapshot before profiling and hand it to the open,
                # so that only the replay of the small frames is profiled.
                import walqueue.recovery as recovery_module
                from walqueue.fs import OsFileSystem
                from walqueue.snapshot import load_snapshot, read_current
                fs = OsFileSystem()
                path = fs.open_directory(str(scratch / directory))
                seq, name = read_current(fs, path)
                state = load_snapshot(fs, path, name, seq)
                recovery_module.load_snapshot = lambda *a, **k: state

            def run() -> None:
                Queue(scratch / directory).close()
        profiler = cProfile.Profile()
        started = time.perf_counter()
        profiler.runcall(run)
        print(f"{args.target}, {args.size:,} tasks: {time.perf_counter() - started:.2f} s "
              f"under cProfile")
        pstats.Stats(profiler).sort_stats(args.sort).print_stats(args.top)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return 0


def main(argv: list[str]) -> int:
    if argv[:1] == ["child"]:
        run_child_main(argv[1], json.loads(argv[2]))
        return 0
    if argv[:1] == ["profile"]:
        return profile(argv[1:])
    return bench(argv)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
