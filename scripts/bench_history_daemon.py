"""The daemon half of the history benchmark (issue 11): walqueued on a directory holding N
completed tasks, under 16 client processes, with compactions inside the window.

    .venv/bin/python scripts/bench_history_daemon.py [--tasks 0,1000000] [--seconds 60]
        [--clients 16] [--compact-wal-bytes 8388608] [--compact-wal-ratio 0]
        [--directory DIR] [--json PATH] [--plot PNG] [--tmp-dir DIR]
    .venv/bin/python scripts/bench_history_daemon.py --fill-only 10000000 --directory DIR
    .venv/bin/python scripts/bench_history_daemon.py --tasks 0 --directory DIR --seconds 240
    .venv/bin/python scripts/bench_history_daemon.py --replot RESULTS.json --plot docs/history.png

For each N of ``--tasks`` (and then for ``--directory``, a directory filled
ahead with ``--fill-only N``: 10M tasks take ~15 minutes to fill, which
need not happen in the quiet moment the window wants), it fills a fresh directory through
the library with N completed tasks (17-character ids, 100-byte payloads, in
batches of 1,000, then one compaction, so the daemon starts from a
snapshot), starts walqueued on it (as a user would: no test hook) and runs
``--clients`` client processes for ``--seconds``. Each client alternates
two cycles, put + reserve + ack and put + ack_and_reserve (acking the lease
the previous one handed out). Reported per N, over the whole window:

* cycles/s (acks answered), p50/p99/max cycle latency, the longest gap
  between two answers one client saw, and the longest time in which no
  client got any answer ("daemon silent": every client's answer times
  merged; the stall a compaction would cause, where a client's own gap also
  counts the time that client waited for a CPU);
* the daemon's RSS at the end and its peak, and the peak of the daemon plus
  its snapshot child (the child's copy-on-write pages), sampled every 0.2 s;
* every compaction of the window from the daemon's log: its duration (from
  rotation to publication), how long the loop paused for it (rotation and
  fork) and the snapshot's size; snapshot bytes written / WAL bytes written
  from the daemon's own counters (protocol version 5 ``daemon_stats``);
* the daemon's own account of its turns: the longest loop turn since it
  started ("longest turn": the longest it answered no one, which the
  clients' "daemon silent" can exceed by the time they waited for a CPU),
  and its warnings of turns over 100 ms in the window, with where each
  turn's time went (JSON only: ``slow_turns``);
* the restart after the window: time from start to READY (recovery) and the
  peak RSS of the restarted process;
* second by second (JSON ``series``): cycles answered, the longest cycle
  that ended and the longest silence that ended in that second, which
  ``--plot PNG`` draws with the compactions shaded (docs/history.png); a
  saved JSON is drawn again with ``--replot JSON --plot PNG``.

The window forces compactions with a low floor (``--compact-wal-bytes``, 8 MiB)
and ``--compact-wal-ratio 0``, so that at least two happen inside it whatever N:
with a 1M-task snapshot (~290 MB) the production trigger (ratio 1) would
compact only after ~290 MB of WAL, minutes at this load. (An automatic
compaction waits until the last one's deleted files are freed, at 16 MiB/s:
at 10M, two compactions need a window of about 480 s.) The write
amplification of the production trigger is then given by its arithmetic from
the measured growth g of the snapshot per WAL byte: <= 1/ratio + g
(docs/daemon.md). The targets of issue 11 are printed beside the figures.
Not part of the test suite (tests/process/test_bench_history_daemon.py runs
it on tiny sizes). The machine's load is printed: figures from a busy
machine are noisy; compare ratios taken in one run.
"""

from __future__ import annotations

import argparse
import array
import itertools
import json
import multiprocessing
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from walqueue import Queue  # noqa: E402
from walqueue import protocol as p  # noqa: E402
from walqueue.client import Client  # noqa: E402

READY_SECONDS = 600.0  # a 10M-task recovery takes minutes
STOP_SECONDS = 120.0
RSS_SAMPLE_SECONDS = 0.2
FILL_BATCH = 1000
PAYLOAD = {"data": "x" * 90}  # 100 bytes as canonical JSON
COMPACTED = re.compile(r"^(\S+ \S+) walqueued\[\d+\] INFO compacted (\d+) WAL bytes \w+(?: \w+)? through "
                       r"seq (\d+) in ([\d.]+) s \(loop paused ([\d.]+) s; snapshot (\d+) bytes", re.M)
def log_time(text: str) -> float:
    """Unix time of a log line's timestamp (``2026-12-01 14:08:21,123``, local time)."""
    return time.mktime(time.strptime(text[:19], "%Y-%m-%d %H:%M:%S")) + int(text[20:23]) / 1000


def merged_answers(answer_times: list) -> list[float]:
    """Every client's answer times (one array per client), merged in time order."""
    return sorted(itertools.chain.from_iterable(answer_times))


def daemon_silence(merged: list[float]) -> dict:
    """The longest time in which no client got an answer (``merged_answers``): what "the
    daemon answers at least every 100 ms" is about. A single client's longest gap can also
    be that client waiting for a CPU (16 of them share 2 here)."""
    longest, end = 0.0, merged[0] if merged else 0.0
    for before, after in itertools.pairwise(merged):
        if after - before > longest:
            longest, end = after - before, after
    return {"longest_gap": longest, "longest_gap_end": end}


def per_second(start: float, seconds: float, cycle_ends: list, latencies: list, merged: list[float]) -> dict:
    """The window second by second (wall times from ``start``): cycles that ended in each second,
    the longest of them (ms), and the longest time without any answer that ended in it (ms).
    ``cycle_ends`` and ``latencies`` are one list per client; ``merged`` is ``merged_answers``."""
    buckets = max(1, int(seconds + 0.999))
    cycles, longest = [0] * buckets, [0.0] * buckets
    silence = [0.0] * buckets

    def bucket(when: float) -> int | None:
        index = int(when - start)
        return index if 0 <= index < buckets else None

    for ends, durations in zip(cycle_ends, latencies, strict=True):
        for end, duration in zip(ends, durations, strict=True):
            if (index := bucket(end)) is not None:
                cycles[index] += 1
                longest[index] = max(longest[index], duration * 1e3)
    for before, after in itertools.pairwise(merged):
        if (index := bucket(after)) is not None:
            silence[index] = max(silence[index], (after - before) * 1e3)
    return {"start": start, "cycles": cycles, "longest_cycle_ms": [round(value, 1) for value in longest],
            "silence_ms": [round(value, 1) for value in silence]}


def gap_context(client: dict, compactions: list[dict]) -> str:
    """Where the longest gap fell against the compactions: at a fork, during a child's write, outside."""
    end, start = client["longest_gap_end"], client["longest_gap_end"] - client["longest_gap"]
    for item in compactions:
        began = item["published"] - item["seconds"]
        if start - 0.01 <= began <= end + 0.01:
            return "at a rotation and fork"
        if abs(item["published"] - end) <= client["longest_gap"] + 0.01:
            return "at a publication"
        if began < start and end < item["published"]:
            return f"while a child wrote ({start - began:.1f} s after its fork)"
    return "outside any compaction"


DEFAULT_RATIO = 1.0  # the production trigger, whose write amplification is given by its arithmetic
SLOW_TURN = re.compile(r"^\S+ (\S+) walqueued\[\d+\] WARNING ((?:a loop turn took|the loop's poll returned) .*)$",
                       re.M)
RECOVERED = re.compile(r"recovered .* in ([\d.]+) s:")
TARGETS = {
    "cycles_ratio": 0.9,  # cycles/s at N >= 0.9 x at 0
    "max_latency_ms": 100.0,
    "p99_ratio": 2.0,  # p99 at N <= 2 x p99 at 0
    "amplification": 2.0,  # snapshot bytes written <= 2 x WAL bytes written
}


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def task_id(index: int) -> str:
    return f"history-{index:09d}"  # 17 characters


def fill(directory: Path, tasks: int) -> float:
    """N completed tasks through the library, in batches of FILL_BATCH, then a compaction; seconds."""
    started = time.monotonic()
    with Queue(directory) as queue:
        for start in range(0, tasks, FILL_BATCH):
            with queue.batch():
                queue.put_many([{"task_id": task_id(index), "payload": PAYLOAD}
                                for index in range(start, min(tasks, start + FILL_BATCH))])
                for lease in queue.reserve("filler", now=1, lease_seconds=60, limit=FILL_BATCH):
                    queue.ack(lease, now=2)
        queue.compact()
    return time.monotonic() - started


# -- /proc ----------------------------------------------------------------------------


def status_kib(pid: int, field: str) -> int:
    """A field of /proc/PID/status in KiB (VmRSS, VmHWM); 0 if the process is gone."""
    try:
        with open(f"/proc/{pid}/status") as file:
            for line in file:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except (FileNotFoundError, ProcessLookupError):
        pass
    return 0


def children(pid: int) -> list[int]:
    try:
        with open(f"/proc/{pid}/task/{pid}/children") as file:
            return [int(child) for child in file.read().split()]
    except (FileNotFoundError, ProcessLookupError):
        return []


class RssSampler(threading.Thread):
    """Peak RSS of the daemon alone and of the daemon plus its (snapshot) children."""

    def __init__(self, pid: int) -> None:
        super().__init__(daemon=True)
        self.pid = pid
        self.peak_kib = 0
        self.peak_with_children_kib = 0
        self._done = threading.Event()

    def run(self) -> None:
        while not self._done.wait(RSS_SAMPLE_SECONDS):
            own = status_kib(self.pid, "VmRSS")
            self.peak_kib = max(self.peak_kib, own)
            self.peak_with_children_kib = max(
                self.peak_with_children_kib, own + sum(status_kib(child, "VmRSS") for child in children(self.pid)))

    def stop(self) -> None:
        self._done.set()
        if self.is_alive():
            self.join(10)


# -- the daemon ---------------------------------------------------------------------------


class Daemon:
    """walqueued on ``directory``, started as a user would; READY awaited on a notify socket."""

    def __init__(self, workdir: Path, directory: Path, options: list[str], name: str) -> None:
        self.socket_path = str(workdir / "wq.sock")
        self.log_path = workdir / f"{name}.log"
        notify_path = str(workdir / f"{name}-notify.sock")
        notify = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        notify.bind(notify_path)
        env = dict(os.environ, NOTIFY_SOCKET=notify_path, PYTHONPATH=os.pathsep.join([str(REPO / "src"), str(REPO)]))
        started = time.monotonic()
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "walqueue.daemon.cli", "serve", str(directory), "--socket",
                 self.socket_path, "--log-level", "info", *options],
                stdout=log, stderr=log, env=env, cwd=REPO)
        notify.settimeout(1.0)
        deadline = started + READY_SECONDS
        try:
            while True:
                if self.proc.poll() is not None:
                    raise RuntimeError(f"walqueued exited with {self.proc.returncode}: {self.log_tail()}")
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
            os.unlink(notify_path)
        self.ready_seconds = time.monotonic() - started
        self.peak_at_ready_kib = status_kib(self.proc.pid, "VmHWM")
        recovered = RECOVERED.search(self.log_path.read_text(errors="replace"))
        self.recovery_seconds = float(recovered[1]) if recovered else float("nan")

    def log_tail(self) -> str:
        return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-20:])

    def report(self) -> p.DaemonStats:
        """daemon_stats in protocol version 5 (with the compaction and turn figures)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
            sock.settimeout(60)
            sock.connect(self.socket_path)
            sock.sendall(p.encode(p.Hello(id=0, version=p.TURN_REPORTING_VERSION)) +
                         p.encode(p.DaemonStatsReq(id=1)))
            answers = {}
            reader = p.FrameReader()
            while 1 not in answers:
                chunk = sock.recv(1 << 16)
                if not chunk:
                    raise RuntimeError("walqueued closed the report connection")
                reader.feed(chunk)
                while (body := reader.next_body()) is not None:
                    message = p.decode_response(body)
                    answers[message.id] = message
        return p.daemon_stats_from_wire(answers[1].stats)

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(STOP_SECONDS)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


# -- clients -------------------------------------------------------------------------------


def client_process(socket_path: str, name: str, start_at: float, end_at: float, results) -> None:
    """Alternate put + reserve + ack and put + ack_and_reserve until ``end_at`` (monotonic).

    Task ids are new in every run (``r<unix time, hex>-<name>-<n>``): a
    directory measured again holds the last run's ids as tombstones, and
    putting one again is an idempotent no-op leaving nothing to reserve. They
    grow with time and sort after the filled ``history-`` ids, as ids made
    from a clock do.
    """
    prefix = f"r{int(time.time()):08x}-{name}"
    latencies: list[float] = []
    cycle_ends = array.array("d")  # wall time at which each cycle of `latencies` ended
    answer_times = array.array("d")  # wall time of every answer: merged, they show when the daemon answered no one
    longest_gap = 0.0
    longest_gap_end = 0.0  # wall time, to place it against the compactions in the daemon's log
    cycles = errors = index = 0
    held = None  # the lease the last ack_and_reserve handed out
    with Client(socket_path, name=name) as client:
        client.stats()  # connected before the window opens
        while time.monotonic() < start_at:
            time.sleep(max(0.0, min(0.05, start_at - time.monotonic())))  # the shared start time
        last_answer = time.perf_counter()

        def answered() -> None:
            nonlocal last_answer, longest_gap, longest_gap_end
            now = time.perf_counter()
            answer_times.append(time.time())
            if now - last_answer > longest_gap:
                longest_gap, longest_gap_end = now - last_answer, answer_times[-1]
            last_answer = now

        while time.monotonic() < end_at:
            index += 1
            started = time.perf_counter()
            try:
                client.put(f"{prefix}-{index:07d}", PAYLOAD)
                answered()
                if index % 2:  # put + reserve + ack
                    leases = client.reserve(name, lease_seconds=300)
                    answered()
                    for lease in leases:
                        client.ack(lease)
                        answered()
                        cycles += 1
                elif held is not None:  # put + ack_and_reserve: ack the held lease, hold the next
                    leases = client.ack_and_reserve(held, lease_seconds=300)
                    answered()
                    cycles += 1
                    held = leases[0] if leases else None
                else:  # the first lease to hold
                    held = next(iter(client.reserve(name, lease_seconds=300)), None)
                    answered()
            except Exception:  # noqa: BLE001 - counted and reported, the window goes on
                errors += 1
                continue
            latencies.append(time.perf_counter() - started)
            cycle_ends.append(time.time())
    results.put({"cycles": cycles, "errors": errors, "latencies": latencies, "cycle_ends": cycle_ends,
                 "longest_gap": longest_gap,
                 "longest_gap_end": longest_gap_end, "answer_times": answer_times})


# -- one N ---------------------------------------------------------------------------------


def measure(workdir: Path, directory: Path, tasks: int | None, args) -> dict:
    options = ["--compact-wal-bytes", str(args.compact_wal_bytes), "--compact-wal-ratio", str(args.compact_wal_ratio)]
    daemon = Daemon(workdir, directory, options, f"daemon-{'directory' if tasks is None else tasks}")
    sampler = RssSampler(daemon.proc.pid)
    try:
        before = daemon.report()
        if tasks is None:  # a directory filled ahead: counted by the daemon, not by a second recovery
            tasks = sum(getattr(before.queue, status) for status in ("ready", "leased", "completed", "dead"))
        log_offset = daemon.log_path.stat().st_size
        results = multiprocessing.Queue()
        start_at = time.monotonic() + 2.0 + 0.1 * args.clients
        end_at = start_at + args.seconds
        start_wall = time.time() + (start_at - time.monotonic())
        processes = [multiprocessing.Process(target=client_process,
                                             args=(daemon.socket_path, f"c{n:02d}", start_at, end_at, results))
                     for n in range(args.clients)]
        for process in processes:
            process.start()
        sampler.start()
        gathered = [results.get(timeout=args.seconds + 300) for _ in processes]
        for process in processes:
            process.join(60)
        after = daemon.report()
        rss_end_kib = status_kib(daemon.proc.pid, "VmRSS")
        window_log = daemon.log_path.read_bytes()[log_offset:].decode(errors="replace")
    finally:
        sampler.stop()
        daemon.stop()
    compactions = [{"published": log_time(m[1]), "covered_bytes": int(m[2]), "seq": int(m[3]),
                    "seconds": float(m[4]), "pause_seconds": float(m[5]), "snapshot_bytes": int(m[6])}
                   for m in COMPACTED.finditer(window_log)]
    restart = Daemon(workdir, directory, options, f"restart-{tasks}")
    restart.stop()
    latencies = [value for item in gathered for value in item["latencies"]]
    answers = merged_answers([item["answer_times"] for item in gathered])  # sorted once, read twice
    silence = daemon_silence(answers)
    snapshot_written = after.snapshot_bytes_written_total - before.snapshot_bytes_written_total
    wal_written = after.wal_bytes_written_total - before.wal_bytes_written_total
    growth = None
    if len(compactions) >= 2:
        covered = sum(item["covered_bytes"] for item in compactions[1:])
        growth = (compactions[-1]["snapshot_bytes"] - compactions[0]["snapshot_bytes"]) / max(1, covered)
    return {
        "tasks": tasks,
        "cycles_per_second": sum(item["cycles"] for item in gathered) / args.seconds,
        "errors": sum(item["errors"] for item in gathered),
        "p50_ms": percentile(latencies, 0.5) * 1e3,
        "p99_ms": percentile(latencies, 0.99) * 1e3,
        "max_ms": max(latencies, default=float("nan")) * 1e3,
        "longest_gap_ms": max(item["longest_gap"] for item in gathered) * 1e3,
        "longest_gap_when": gap_context(max(gathered, key=lambda item: item["longest_gap"]), compactions),
        "silence_ms": silence["longest_gap"] * 1e3,
        "silence_when": gap_context(silence, compactions),
        "silence_end": silence["longest_gap_end"],  # wall time, beside the compactions' "published"
        "longest_turn_ms": after.longest_turn_seconds * 1e3,  # since the daemon started
        "rss_end_mib": rss_end_kib / 1024,
        "rss_peak_mib": sampler.peak_kib / 1024,
        "rss_peak_with_child_mib": sampler.peak_with_children_kib / 1024,
        "compactions": compactions,
        # The daemon's own account of its stalls (walqueue.daemon.turn_timer), first ones first.
        "slow_turns": [f"{when} {text}" for when, text in SLOW_TURN.findall(window_log)[:50]],
        "snapshot_bytes_written": snapshot_written,
        "wal_bytes_written": wal_written,
        "amplification": snapshot_written / max(1, wal_written),
        "growth_per_wal_byte": growth,
        "production_bound": None if growth is None else 1.0 / DEFAULT_RATIO + growth,
        "write_failures": after.write_failures_total - before.write_failures_total,
        "compaction_failures": after.compaction_failures_total - before.compaction_failures_total,
        "restart_seconds": restart.ready_seconds,
        "recovery_seconds": restart.recovery_seconds,
        "restart_peak_rss_mib": restart.peak_at_ready_kib / 1024,
        "series": per_second(start_wall, args.seconds, [item["cycle_ends"] for item in gathered],
                             [item["latencies"] for item in gathered], answers),
    }


def print_table(rows: list[dict], args) -> None:
    base = rows[0] if rows and rows[0]["tasks"] == 0 else None
    print(f"\n{args.clients} clients, {args.seconds:g} s window, --compact-wal-bytes {args.compact_wal_bytes} "
          f"--compact-wal-ratio {args.compact_wal_ratio:g}; load average {os.getloadavg()[0]:.1f} "
          f"on {os.cpu_count()} CPUs")
    print("| N | cycles/s | p50 ms | p99 ms | max ms | longest gap ms | daemon silent ms | longest turn ms | "
          "compactions | durations s "
          "(max) | loop pause max ms | snapshot MB | snapshot/WAL written | g | restart s (recovery) | "
          "restart peak RSS MiB | RSS end / peak / +child MiB | errors |")
    print("|" + "---:|" * 18)
    for row in rows:
        compactions = row["compactions"]
        durations = [item["seconds"] for item in compactions]
        print(f"| {row['tasks']:,} | {row['cycles_per_second']:,.0f} | {row['p50_ms']:.1f} | {row['p99_ms']:.1f} | "
              f"{row['max_ms']:.1f} | {row['longest_gap_ms']:.1f} | {row['silence_ms']:.1f} | "
              f"{row['longest_turn_ms']:.1f} | {len(compactions)} | "
              f"{percentile(durations, 0.5):.2f} ({max(durations, default=float('nan')):.2f}) | "
              f"{max((item['pause_seconds'] for item in compactions), default=float('nan')) * 1e3:.1f} | "
              f"{(compactions[-1]['snapshot_bytes'] / 1e6 if compactions else float('nan')):.1f} | "
              f"{row['amplification']:.2f} | "
              f"{'-' if row['growth_per_wal_byte'] is None else format(row['growth_per_wal_byte'], '.2f')} | "
              f"{row['restart_seconds']:.2f} ({row['recovery_seconds']:.2f}) | {row['restart_peak_rss_mib']:.0f} | "
              f"{row['rss_end_mib']:.0f} / {row['rss_peak_mib']:.0f} / {row['rss_peak_with_child_mib']:.0f} | "
              f"{row['errors']} |")
    for row in rows:
        print(f"- N={row['tasks']:,}: one client's longest gap fell {row['longest_gap_when']}; "
              f"the daemon's longest silence {row['silence_when']}")
    print("\nTargets (issue 11):")
    for row in rows:
        checks = [f"max {row['max_ms']:.0f} ms <= {TARGETS['max_latency_ms']:.0f}: "
                  f"{'met' if row['max_ms'] <= TARGETS['max_latency_ms'] else 'NOT met'}",
                  f"daemon silent at most {row['silence_ms']:.0f} ms <= {TARGETS['max_latency_ms']:.0f}: "
                  f"{'met' if row['silence_ms'] <= TARGETS['max_latency_ms'] else 'NOT met'}",
                  f"at least two compactions in the window: {'yes' if len(row['compactions']) >= 2 else 'NO'}"]
        if base is not None and row is not base:
            ratio = row["cycles_per_second"] / base["cycles_per_second"]
            p99_ratio = row["p99_ms"] / base["p99_ms"]
            checks.append(f"cycles/s {ratio:.2f}x N=0 (>= {TARGETS['cycles_ratio']}: "
                          f"{'met' if ratio >= TARGETS['cycles_ratio'] else 'NOT met'})")
            checks.append(f"p99 {p99_ratio:.2f}x N=0 (<= {TARGETS['p99_ratio']}: "
                          f"{'met' if p99_ratio <= TARGETS['p99_ratio'] else 'NOT met'})")
        if row["production_bound"] is not None:
            checks.append(f"production trigger (ratio {DEFAULT_RATIO:g}): snapshot/WAL <= 1/ratio + g = "
                          f"{row['production_bound']:.2f} (<= {TARGETS['amplification']:g}: "
                          f"{'met' if row['production_bound'] <= TARGETS['amplification'] else 'NOT met'})")
        print(f"- N={row['tasks']:,}: " + "; ".join(checks))


def write_plot(path: Path, rows: list[dict], clients: int) -> None:
    """Per N, second by second: cycles/s above, the longest cycle and the daemon's longest silence
    below, with the 100 ms bound; each compaction shaded from its rotation to its publication.
    Needs matplotlib (the ``bench`` extra); imported only here."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (rate, latency) = plt.subplots(2, 1, sharex=True, figsize=(10, 6.5), dpi=110)
    for row, color in zip(rows, itertools.cycle(["tab:blue", "tab:orange", "tab:green", "tab:purple"])):
        series = row.get("series")
        if series is None:
            continue  # a JSON from before the series were kept
        label = f"N = {row['tasks']:,}"
        seconds = [index + 0.5 for index in range(len(series["cycles"]))]  # the middle of each second
        rate.plot(seconds, series["cycles"], color=color, linewidth=0.9, label=label)
        latency.plot(seconds, series["longest_cycle_ms"], color=color, linewidth=0.9,
                     label=f"{label}: longest cycle")
        latency.plot(seconds, series["silence_ms"], color=color, linewidth=0.7, linestyle=":",
                     label=f"{label}: daemon silent")
        for item in row["compactions"]:
            began = item["published"] - item["seconds"] - series["start"]
            for axes in (rate, latency):
                axes.axvspan(began, item["published"] - series["start"], color=color, alpha=0.12, linewidth=0)
    latency.axhline(TARGETS["max_latency_ms"], color="tab:red", linewidth=0.8, linestyle="--",
                    label=f"{TARGETS['max_latency_ms']:.0f} ms")
    rate.set_ylabel("cycles answered per second")
    rate.set_ylim(bottom=0)
    rate.set_title(f"walqueued under {clients} clients, second by second (shaded: a snapshot child writing)")
    latency.set_ylabel("ms, longest in each second")
    latency.set_xlabel("seconds into the window")
    latency.set_ylim(bottom=0)
    for axes in (rate, latency):
        axes.grid(True, alpha=0.3)
        axes.legend(fontsize=7, loc="upper right")
    figure.tight_layout()
    figure.savefig(path)
    plt.close(figure)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tasks", default="0,1000000", help="comma-separated N to fill and measure")
    parser.add_argument("--directory", type=Path, default=None,
                        help="also measure this directory (filled by --fill-only, say, ahead of a quiet "
                             "moment), after the --tasks given explicitly (for a baseline in the same run)")
    parser.add_argument("--fill-only", type=int, default=None, metavar="N",
                        help="fill --directory with N completed tasks and stop (it is measured later)")
    parser.add_argument("--seconds", type=float, default=60.0)
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--compact-wal-bytes", type=int, default=8 * 1024 * 1024)
    parser.add_argument("--compact-wal-ratio", type=float, default=0.0)
    parser.add_argument("--json", type=Path, default=None, help="also write the figures here")
    parser.add_argument("--plot", type=Path, default=None,
                        help="also draw the window second by second in this PNG (needs matplotlib)")
    parser.add_argument("--replot", type=Path, default=None, metavar="JSON",
                        help="measure nothing: draw --plot from the rows of a JSON written by --json")
    parser.add_argument("--tmp-dir", type=Path, default=REPO / "var")
    explicit_tasks = any(arg == "--tasks" or arg.startswith("--tasks=") for arg in argv or sys.argv[1:])
    args = parser.parse_args(argv)
    # A SIGTERM (a timeout, an impatient user) unwinds through the finally blocks: walqueued
    # and the clients are stopped by pid, the scratch directories removed.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.replot is not None:
        if args.plot is None:
            parser.error("--replot needs --plot")
        saved = json.loads(args.replot.read_text())
        write_plot(args.plot, saved["rows"], int(saved["arguments"]["clients"]))
        return 0
    if args.fill_only is not None:
        if args.directory is None:
            parser.error("--fill-only needs --directory")
        print(f"filled {args.fill_only:,} completed tasks in {fill(args.directory, args.fill_only):.1f} s")
        return 0
    args.tmp_dir.mkdir(parents=True, exist_ok=True)
    rows = []
    if args.directory is None or explicit_tasks:
        for tasks in [int(text) for text in args.tasks.split(",")]:
            scratch = Path(tempfile.mkdtemp(prefix="bench-history-", dir=args.tmp_dir))
            workdir = Path(tempfile.mkdtemp(prefix="bench-history-", dir="/tmp"))
            try:
                seconds = fill(scratch / "queue", tasks)
                print(f"filled {tasks:,} completed tasks in {seconds:.1f} s", flush=True)
                rows.append(measure(workdir, scratch / "queue", tasks, args))
                print(json.dumps({key: value for key, value in rows[-1].items()
                                  if key not in ("compactions", "series")}),
                      flush=True)
            finally:
                shutil.rmtree(scratch, ignore_errors=True)
                shutil.rmtree(workdir, ignore_errors=True)
    if args.directory is not None:
        workdir = Path(tempfile.mkdtemp(prefix="bench-history-", dir="/tmp"))  # short socket paths
        try:
            rows.append(measure(workdir, args.directory, None, args))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)
    print_table(rows, args)
    if args.json is not None:
        args.json.write_text(json.dumps({"arguments": {key: str(value) for key, value in vars(args).items()},
                                         "rows": rows}, indent=2))
    if args.plot is not None:
        write_plot(args.plot, rows, args.clients)
    return 0


if __name__ == "__main__":
    sys.exit(main())
