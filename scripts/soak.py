"""Soak walqueued: many worker processes for minutes, with compactions and SIGKILLs.

    .venv/bin/python scripts/soak.py --minutes 3 [--workers 8] [--kill-every 20]
        [--compact-wal-bytes 262144] [--compact-wal-ratio 1.0] [--seed 1] [--tombstones 100000] [--keep]
    .venv/bin/python scripts/soak.py --seconds 10 ...      (the smoke test's size)

What runs:

* one walqueued (``--compact-wal-bytes`` small, so it compacts every few
  seconds on its own, in a forked child), SIGKILLed about every
  ``--kill-every`` seconds (seeded jitter) and restarted at once, as a
  supervisor would; the snapshot children it had at the kill (from /proc)
  must be gone within ``CHILD_EXIT_SECONDS``;
* ``--workers`` processes of tests/process/crash_worker.py, each a seeded mix
  through ``walqueue.client``: puts and put_manys (some delayed by 1-2 s),
  reserves with 1-3 s leases, acks, releases (some delayed), touches,
  "stalls" (a lease abandoned to expire, an ack sent after the deadline),
  double acks, and the odd compaction on request. They log every operation
  with its outcome and reconnect after each kill;
* a feeder process (also a logged crash_worker, which only puts) that tops
  the queue up whenever fewer than ``--feed-ready`` tasks are ready: the
  workers' own put rate falls as dead tasks accumulate (their backlog count
  never forgets a task that died), and the load must not fade with it;
* every ``--sample-every`` seconds a line: elapsed time, daemon incarnation,
  its RSS (VmRSS from /proc), the queue's counts, and the operations per
  second answered ok since the last line.

At the end the workers stop, the queue is drained, the daemon is stopped
with SIGTERM, and tests/process/checker.py reads the directory offline and
the workers' logs: every answered put exists, every answered ack is
completed, nothing completed twice, generations only grow, no phantom, ...

Memory: the daemon's state is every live task plus a tombstone per completed
task (ids and keys are never reused), so RSS may grow only with the completed
count. ``--tombstones N`` measures the bytes per tombstone in the library
alone (RSS after N and after 2N completed tasks, in a fresh process), and the
soak compares the daemon's RSS growth within each incarnation against that.

The last line is ``soak verdict: PASS ...`` or ``soak verdict: FAIL ...``;
the exit code is 0 on PASS. Every process started here is stopped by pid.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from tests.process import checker  # noqa: E402
from tests.process.crash_harness import process_exits  # noqa: E402
from tests.process.crash_worker import CrashWorker, wait_for_daemon  # noqa: E402
from tests.process.daemon import Daemon, child_env  # noqa: E402
from walqueue.client import Client, DaemonUnavailable  # noqa: E402

MIB = 1024 * 1024
READY_SECONDS = 30.0
WORKER_STOP_SECONDS = 60.0
CHILD_EXIT_SECONDS = 5.0  # a killed daemon's snapshot child must be gone by then
DRAIN_SECONDS = 120.0
# A worker's own safety bound on top of the soak's duration (crash_worker exits 1 past it).
WORKER_SLACK_SECONDS = 300.0
# RSS growth within one incarnation may exceed (completed tasks added) x
# (bytes per tombstone) by this much: allocator arenas, buffers, the
# snapshot being written, live tasks (bounded by the workers' backlogs).
RSS_SLACK_BYTES = 48 * MIB

TOMBSTONE_PROGRAM = r"""
import gc, json, os, shutil, sys, tempfile
from walqueue import Queue

def rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024

count = int(sys.argv[1])
batch = 1000
directory = tempfile.mkdtemp(prefix="wq-tomb-", dir="/tmp")
samples = []
try:
    queue = Queue(os.path.join(directory, "queue"))
    done = 0
    for target in (count, 2 * count):
        while done < target:
            size = min(batch, target - done)
            # Task ids and payloads shaped like the soak's (worker-counter, a small dict).
            with queue.batch():
                queue.put_many([{"task_id": f"w{(done + i) % 8}-{done + i:09d}",
                                 "payload": {"worker": "w", "n": done + i}} for i in range(size)])
                for lease in queue.reserve("w", now=1, lease_seconds=60, limit=size):
                    queue.ack(lease, now=1)
            done += size
            if queue.stats().wal_bytes > 64 * 1024 * 1024:
                queue.compact()
        queue.compact()
        gc.collect()
        samples.append({"completed": queue.stats().completed, "rss": rss()})
    queue.close()
finally:
    shutil.rmtree(directory, ignore_errors=True)
print(json.dumps(samples))
"""


def snapshot_children(pid: int) -> list[int]:
    """The daemon's children now (its snapshot children), from /proc."""
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as file:
            return [int(child) for child in file.read().split()]
    except OSError:
        return []


def rss_bytes(pid: int) -> int | None:
    try:
        with open(f"/proc/{pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) * 1024
    except (FileNotFoundError, ProcessLookupError):
        return None
    return None


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU time the process has used so far (from /proc/PID/stat)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
    except (FileNotFoundError, ProcessLookupError):
        return None
    # After the ")" closing the command name: utime and stime are fields 12 and 13.
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def measure_tombstone_bytes(count: int) -> float:
    """RSS growth per completed task between ``count`` and ``2 * count`` of them, library only."""
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-c", TOMBSTONE_PROGRAM, str(count)], capture_output=True,
                            text=True, env=child_env(), cwd=REPO, timeout=600, check=True)
    first, second = json.loads(result.stdout)
    per_tombstone = (second["rss"] - first["rss"]) / (second["completed"] - first["completed"])
    print(f"tombstones (library only): RSS {first['rss'] / MIB:.1f} MiB at {first['completed']} completed, "
          f"{second['rss'] / MIB:.1f} MiB at {second['completed']} -> {per_tombstone:.0f} bytes per tombstone "
          f"({time.monotonic() - started:.1f} s)", flush=True)
    return per_tombstone


def feed(socket_path: str, log_path: str, seed: str, stop_file: str, target: str) -> int:
    """The feeder process: put_many (logged like any worker's) while fewer than ``target`` are ready."""
    feeder = CrashWorker(socket_path, log_path, "feeder", int(seed), stop_file)
    try:
        while not feeder.stopping():
            try:
                ready = feeder.client.stats().ready
            except DaemonUnavailable:
                wait_for_daemon(feeder.client, stop_file)
                continue
            if ready < int(target):
                feeder.put_many()
            else:
                time.sleep(0.05)  # the queue is full enough; look again shortly
    finally:
        feeder.close()
    return 0


def index_checker_lookups() -> None:
    """Make the checker's per-task scan of all records an indexed lookup, with the same answers.

    ``checker.missing_generations(records, task_id, generation)`` scans every
    record for every task: fine for a crash-proof seed, quadratic for a soak
    (18,000 tasks x 130,000 records took minutes). The wrapper builds the
    task -> generations-answered index once per records list. It changes no
    verdict; it is skipped if the checker no longer has that function.
    """
    original = getattr(checker, "missing_generations", None)
    if original is None:
        return
    indexes: dict[int, tuple[list, dict[str, set[int]]]] = {}

    def missing_generations(records: list[dict], task_id: str, generation: int) -> set[int]:
        entry = indexes.get(id(records))
        if entry is None or entry[0] is not records:
            handed: dict[str, set[int]] = {}
            for line in records:
                if line["op"] == "reserve" and line["outcome"] == "ok" and line.get("task_id") is not None:
                    handed.setdefault(line["task_id"], set()).add(line["generation"])
            entry = indexes[id(records)] = (records, handed)
        return set(range(1, generation + 1)) - entry[1].get(task_id, set())

    checker.missing_generations = missing_generations


class LogTail:
    """Counts ok operations in the workers' JSON-lines logs, reading only what is new."""

    def __init__(self, paths: list[Path]) -> None:
        self.offsets = {path: 0 for path in paths}
        self.ok: Counter = Counter()
        self.outcomes: Counter = Counter()

    def update(self) -> None:
        for path in self.offsets:
            try:
                with open(path, "rb") as log:
                    log.seek(self.offsets[path])
                    data = log.read()
            except FileNotFoundError:
                continue
            complete = data[:data.rfind(b"\n") + 1]
            self.offsets[path] += len(complete)
            for line in complete.splitlines():
                record = json.loads(line)
                self.outcomes[record["outcome"]] += 1
                if record["outcome"] == "ok":
                    self.ok[record["op"]] += 1

    def total_ok(self) -> int:
        return sum(self.ok.values())


class Soak:
    def __init__(self, args: argparse.Namespace, workdir: Path) -> None:
        self.args = args
        self.workdir = workdir
        self.directory = workdir / "queue"
        self.socket_path = str(workdir / "wq.sock")
        self.stop_file = workdir / "stop"
        self.rng = random.Random(args.seed)
        self.daemons: list[Daemon] = []
        self.workers: list[subprocess.Popen] = []
        self.worker_logs = [workdir / f"w{number}.jsonl" for number in range(args.workers)]
        if args.feed_ready > 0:
            self.worker_logs.append(workdir / "feeder.jsonl")
        self.tail = LogTail(self.worker_logs)
        self.kills = 0
        self.kills_with_a_child = 0
        self.child_problems: list[str] = []
        # Per incarnation: (first sample's RSS and completed count, the largest RSS excess seen).
        self.memory_excess: list[float] = []
        self.rss_samples: list[int] = []

    @property
    def daemon(self) -> Daemon:
        return self.daemons[-1]

    def start_daemon(self) -> Daemon:
        daemon = Daemon(self.workdir, self.directory, self.socket_path,
                        ("--compact-wal-bytes", str(self.args.compact_wal_bytes),
                         "--compact-wal-ratio", str(self.args.compact_wal_ratio), "--log-level", "info"))
        self.daemons.append(daemon)
        daemon.start()
        return daemon

    def start_workers(self) -> None:
        limit = str(self.args.duration + WORKER_SLACK_SECONDS)
        for number in range(self.args.workers):
            log_path = self.worker_logs[number]
            with open(self.workdir / f"w{number}.err", "ab") as stderr:
                self.workers.append(subprocess.Popen(
                    [sys.executable, "-m", "tests.process.crash_worker", self.socket_path, str(log_path),
                     f"w{number}", str(self.args.seed), str(self.stop_file), limit],
                    stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, env=child_env(), cwd=REPO))
        if self.args.feed_ready > 0:
            with open(self.workdir / "feeder.err", "ab") as stderr:
                self.workers.append(subprocess.Popen(
                    [sys.executable, str(Path(__file__).resolve()), "feed", self.socket_path,
                     str(self.workdir / "feeder.jsonl"), str(self.args.seed), str(self.stop_file),
                     str(self.args.feed_ready)],
                    stdin=subprocess.DEVNULL, stdout=stderr, stderr=stderr, env=child_env(), cwd=REPO))

    def next_kill_in(self) -> float:
        return self.args.kill_every * self.rng.uniform(0.5, 1.5)

    def run(self, per_tombstone: float | None) -> tuple[list[str], list[str]]:
        """The soak; returns (checker violations, memory problems)."""
        self.start_daemon()
        self.start_workers()
        monitor = Client(self.socket_path, timeout=30, retry_seconds=0)
        started = time.monotonic()
        end = started + self.args.duration
        next_kill = started + self.next_kill_in() if self.args.kill_every > 0 else float("inf")
        next_sample = started
        last_sample_time, last_ok, last_acks, last_seq = started, 0, 0, 0
        last_cpu: tuple[int, float] | None = None  # (daemon pid, its CPU seconds) at the last sample
        incarnation_start: tuple[int, int] | None = None  # (rss, completed) at this incarnation's first sample
        worst_excess = 0.0
        try:
            while True:
                now = time.monotonic()
                if now >= end:
                    break
                if now >= next_kill:
                    # SIGKILL at an arbitrary moment of the load, then restart like a supervisor.
                    children = snapshot_children(self.daemon.pid)
                    self.daemon.kill()
                    self.kills += 1
                    self.kills_with_a_child += bool(children)
                    self.child_problems += [f"snapshot child pid {pid} outlived its daemon by more than "
                                            f"{CHILD_EXIT_SECONDS} s" for pid in children
                                            if not process_exits(pid, CHILD_EXIT_SECONDS)]
                    self.daemon.cleanup()
                    self.start_daemon()
                    incarnation_start = None
                    next_kill = time.monotonic() + self.next_kill_in()
                    continue
                if now >= next_sample:
                    self.tail.update()
                    try:
                        stats = monitor.stats()
                    except DaemonUnavailable:
                        stats = None
                    rss = rss_bytes(self.daemon.pid)
                    ok, acks = self.tail.total_ok(), self.tail.ok["ack"]
                    interval = max(now - last_sample_time, 1e-9)
                    seq = last_seq if stats is None else stats.last_seq
                    rates = (f"{(ok - last_ok) / interval:6.1f} ok ops/s, {(acks - last_acks) / interval:5.1f} "
                             f"acks/s, {(seq - last_seq) / interval:6.1f} WAL frames/s")
                    cpu = cpu_seconds(self.daemon.pid)
                    if cpu is not None and last_cpu is not None and last_cpu[0] == self.daemon.pid:
                        rates += f", daemon CPU {100 * (cpu - last_cpu[1]) / interval:3.0f}%"
                    last_cpu = None if cpu is None else (self.daemon.pid, cpu)
                    last_sample_time, last_ok, last_acks, last_seq = now, ok, acks, seq
                    counts = ("ready ? leased ? completed ? dead ?" if stats is None else
                              f"ready {stats.ready} leased {stats.leased} completed {stats.completed} "
                              f"dead {stats.dead}")
                    print(f"t={now - started:6.1f}s daemon#{len(self.daemons)} pid {self.daemon.pid} "
                          f"rss {0 if rss is None else rss / MIB:6.1f} MiB | {counts} | {rates}", flush=True)
                    if rss is not None and stats is not None:
                        self.rss_samples.append(rss)
                        if incarnation_start is None:
                            incarnation_start = (rss, stats.completed)
                        elif per_tombstone is not None:
                            allowed = (stats.completed - incarnation_start[1]) * max(per_tombstone, 0)
                            worst_excess = max(worst_excess, rss - incarnation_start[0] - allowed)
                    next_sample = now + self.args.sample_every
                time.sleep(min(0.05, max(0.0, min(next_kill, next_sample, end) - time.monotonic())))
            monitor.close()
            return self.finish(started, worst_excess, per_tombstone)
        finally:
            monitor.close()
            self.cleanup()

    def finish(self, started: float, worst_excess: float, per_tombstone: float | None):
        elapsed = time.monotonic() - started
        self.stop_file.touch()
        problems: list[str] = []
        for worker in self.workers:
            try:
                code = worker.wait(WORKER_STOP_SECONDS)
            except subprocess.TimeoutExpired:
                problems.append(f"worker pid {worker.pid} did not stop within {WORKER_STOP_SECONDS} s")
                continue
            if code != 0:
                problems.append(f"worker pid {worker.pid} exited with {code}")
        self.tail.update()
        drain_log = self.workdir / "drain.jsonl"
        drainer = CrashWorker(self.socket_path, str(drain_log), "drain", self.args.seed, None)
        try:
            drained = drainer.drain(DRAIN_SECONDS)
        finally:
            drainer.close()
        if not drained:
            problems.append(f"the drain did not empty the queue within {DRAIN_SECONDS} s")
        with Client(self.socket_path, timeout=30) as client:
            final = client.stats()
        final_rss = rss_bytes(self.daemon.pid)
        code = self.daemon.terminate()
        if code != 0:
            problems.append(f"walqueued exited with {code} after SIGTERM")
        ok = self.tail.total_ok()
        problems += self.child_problems
        print(f"workers {self.args.workers}, {elapsed:.0f} s, {self.kills} SIGKILLs and restarts "
              f"({self.kills_with_a_child} while a snapshot child wrote), "
              f"{ok} operations answered ok ({ok / elapsed:.0f}/s): "
              + ", ".join(f"{op} {count}" for op, count in sorted(self.tail.ok.items())), flush=True)
        print("outcomes: " + ", ".join(f"{name} {count}" for name, count in sorted(self.tail.outcomes.items())))
        print(f"final: completed {final.completed}, dead {final.dead}, last_seq {final.last_seq}, "
              f"snapshot_seq {final.snapshot_seq}; daemon RSS at the end {final_rss / MIB:.1f} MiB, "
              f"max sampled {max(self.rss_samples, default=0) / MIB:.1f} MiB", flush=True)
        if per_tombstone is not None:
            print(f"memory: largest RSS growth within an incarnation beyond its completed tasks x "
                  f"{per_tombstone:.0f} B = {worst_excess / MIB:.1f} MiB (bound {RSS_SLACK_BYTES / MIB:.0f} MiB)")
            if worst_excess > RSS_SLACK_BYTES:
                problems.append(f"daemon RSS grew {worst_excess / MIB:.1f} MiB beyond its tombstones")
        index_checker_lookups()
        checking = time.monotonic()
        violations = checker.check(self.directory, [*self.worker_logs, drain_log], drained=drained)
        print(f"checker: {len(violations)} violation(s) in {time.monotonic() - checking:.1f} s", flush=True)
        return violations, problems

    def cleanup(self) -> None:
        """Stop, by pid, every process this soak started that still runs."""
        for worker in self.workers:
            if worker.poll() is None:
                worker.send_signal(signal.SIGKILL)
                worker.wait(10)
        for daemon in self.daemons:
            daemon.cleanup()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    length = parser.add_mutually_exclusive_group()
    length.add_argument("--minutes", type=float, help="how long to run the load (default 3)")
    length.add_argument("--seconds", type=float, help="the same in seconds")
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--kill-every", type=float, default=20.0,
                        help="mean seconds between SIGKILLs of the daemon (0: never)")
    parser.add_argument("--compact-wal-bytes", type=int, default=256 * 1024)
    parser.add_argument("--compact-wal-ratio", type=float, default=1.0)
    parser.add_argument("--feed-ready", type=int, default=40,
                        help="a feeder keeps at least this many tasks ready (0: no feeder)")
    parser.add_argument("--sample-every", type=float, default=5.0)
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--tombstones", type=int, default=100_000,
                        help="measure bytes per tombstone between N and 2N completed tasks (0: skip)")
    parser.add_argument("--keep", action="store_true", help="keep the work directory")
    args = parser.parse_args(argv)
    args.duration = args.seconds if args.seconds is not None else 60 * (args.minutes or 3)

    per_tombstone = measure_tombstone_bytes(args.tombstones) if args.tombstones > 0 else None
    workdir = Path(tempfile.mkdtemp(prefix="wq-soak-", dir="/tmp"))  # short: socket paths
    print(f"soak: {args.duration:.0f} s, {args.workers} workers, seed {args.seed}, kill every "
          f"~{args.kill_every:g} s, compact past {args.compact_wal_bytes} WAL bytes, in {workdir}", flush=True)
    soak = Soak(args, workdir)
    try:
        violations, problems = soak.run(per_tombstone)
    except Exception as exc:
        violations, problems = [], [f"soak harness: {exc!r}"]
    failures = violations + problems
    for failure in failures[:50]:
        print(f"  {failure}")
    keep = args.keep or bool(failures)
    if not keep:
        shutil.rmtree(workdir, ignore_errors=True)
    verdict = "PASS" if not failures else "FAIL"
    print(f"soak verdict: {verdict} — checker: {len(violations)} violation(s), other problems: {len(problems)}, "
          f"{soak.kills} kills, {soak.tail.total_ok()} ok operations"
          + (f"; kept {workdir}" if keep else ""), flush=True)
    return 0 if verdict == "PASS" else 1


if __name__ == "__main__":
    if sys.argv[1:2] == ["feed"]:
        sys.exit(feed(*sys.argv[2:]))
    sys.exit(main())
