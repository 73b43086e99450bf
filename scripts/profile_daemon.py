#!/usr/bin/env python3
"""Where walqueued's time goes per request, measured two ways in one run.

1. Without a profiler: the daemon's CPU seconds (utime+stime from /proc) and the
   clients' CPU seconds per request, for N client processes doing put +
   ack_and_reserve cycles for S seconds.
2. Under cProfile: the same load, the daemon's own time grouped by where it is
   spent (the fsync, socket syscalls, the library, the wire protocol, the
   daemon's service and its loop), as a share of all the time the daemon's thread was not idle
   in epoll, plus the top functions.

cProfile slows pure-Python code more than C and syscalls, so read (2) for the
proportions between groups, and (1) for absolute microseconds.

    .venv/bin/python scripts/profile_daemon.py --clients 16 --seconds 5
    .venv/bin/python scripts/profile_daemon.py --clients 1 --mode client --no-profile --src /tmp/base/src

``--mode client`` runs the plain Client cycle (put, reserve, ack) instead;
``--src`` runs the daemon and the clients from another tree's ``src`` (an A/B
on a busy machine: alternate the trees and compare medians); ``--no-profile``
skips (2). (1) also splits the daemon's CPU into user and system time, and
times a bare 200-byte append + fsync on the same file system: the kernel's
share of one WAL write, which no daemon code can remove.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import pstats
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PAYLOAD = {"data": "x" * 100}

GROUPS = (
    # (label, predicate on (file, function name)) — first match wins
    ("fsync (the WAL's durability)", lambda f, n: n in ("<built-in method posix.fsync>", "<built-in method posix.fdatasync>")),
    ("epoll wait (idle)", lambda f, n: n == "<method 'poll' of 'select.epoll' objects>"),
    ("socket syscalls (send, recv)", lambda f, n: "_socket.socket" in n),
    ("WAL write syscalls", lambda f, n: n == "<built-in method posix.write>" or "pwrite" in n),
    ("JSON + SHA-256 (frames, identities)",
     lambda f, n: "json" in f or "json" in n.lower() or "sha256" in n or "HASH" in n),
    ("library: validation", lambda f, n: f.endswith("validation.py") or f.endswith("values.py")),
    ("library: state machine", lambda f, n: f.endswith("state.py")),
    ("library: queue, codec, wal", lambda f, n: f.endswith(("queue.py", "codec.py", "wal.py", "fs.py"))),
    ("wire protocol (msgspec, framing)", lambda f, n: os.path.join("walqueue", "protocol", "") in f or "msgspec" in n),
    ("daemon: service (sans-IO)", lambda f, n: f.endswith(os.path.join("daemon", "service.py"))),
    ("daemon: loop, connections, commit",
     lambda f, n: os.path.join("walqueue", "daemon", "") in f or "selectors" in f),
    # "other": builtins called from everywhere (isinstance, len, getattr, dataclass
    # __init__, dict and list methods), the metrics recorder, logging.
)


def cpu_seconds(pid: int) -> tuple[float, float]:
    """(user, system) CPU seconds of a process: utime and stime of /proc/PID/stat."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    tick = os.sysconf("SC_CLK_TCK")
    return int(fields[11]) / tick, int(fields[12]) / tick


def fsync_floor(directory: Path, writes: int = 2000) -> tuple[float, float]:
    """(system CPU, wall) seconds of one 200-byte append plus its fsync on a bare file in
    `directory`: the kernel's share of a WAL write that no daemon code can remove."""
    path = directory / "fsync-floor.probe"
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_APPEND, 0o600)
    try:
        before, started = os.times(), time.monotonic()
        for _ in range(writes):
            os.write(fd, b"x" * 200)
            os.fsync(fd)
        after, ended = os.times(), time.monotonic()
    finally:
        os.close(fd)
        path.unlink()
    return (after.system - before.system) / writes, (ended - started) / writes


def client(socket_path: str, seconds: float, mode: str, results) -> None:
    from walqueue.client import Client

    name = f"p{os.getpid()}"
    with Client(socket_path, name=name) as c:
        c.stats()
        held, count = None, 0
        started_cpu, started = time.process_time(), time.monotonic()
        while time.monotonic() - started < seconds:
            c.put(f"{name}-{count}", PAYLOAD)
            count += 1
            if mode == "client":
                (lease,) = c.reserve(name, lease_seconds=60)
                c.ack(lease)
                continue
            leases = c.ack_and_reserve(held, lease_seconds=60) if held else c.reserve(name, lease_seconds=60)
            held = leases[0]
        results.put((count, time.process_time() - started_cpu))


def start_daemon(queue: str, daemon_args: list[str], env: dict | None = None) -> subprocess.Popen:
    """Start walqueued serving `queue` and wait, 30 s at most, until its socket is there."""
    daemon = subprocess.Popen([sys.executable, *daemon_args, "serve", queue, "--log-level", "warning"], env=env)
    deadline = time.monotonic() + 30
    while not os.path.exists(os.path.join(queue, "walqueued.sock")):
        if daemon.poll() is not None or time.monotonic() > deadline:
            stop_daemon(daemon)
            raise SystemExit("walqueued did not start")
        time.sleep(0.05)
    return daemon


def stop_daemon(daemon: subprocess.Popen) -> None:
    """SIGINT (a clean stop, so cProfile writes its file), then SIGKILL if it is still there after 60 s."""
    daemon.send_signal(signal.SIGINT)
    try:
        daemon.wait(60)
    except subprocess.TimeoutExpired:
        daemon.kill()
        daemon.wait(10)


def load(daemon_args: list[str], clients: int, seconds: float, mode: str = "ack_and_reserve") -> dict:
    directory = tempfile.mkdtemp(prefix="profile-daemon-", dir=REPO / "var")
    socket_path = os.path.join(directory, "q", "walqueued.sock")
    daemon = start_daemon(os.path.join(directory, "q"), daemon_args)
    try:
        results = multiprocessing.Queue()
        workers = [multiprocessing.Process(target=client, args=(socket_path, seconds, mode, results))
                   for _ in range(clients)]
        before = cpu_seconds(daemon.pid)
        for worker in workers:
            worker.start()
        gathered = [results.get(timeout=seconds + 60) for _ in workers]
        user, system = (end - start for end, start in zip(cpu_seconds(daemon.pid), before, strict=True))
        for worker in workers:
            worker.join(30)
    finally:
        stop_daemon(daemon)
        shutil.rmtree(directory, ignore_errors=True)
    cycles = sum(count for count, _ in gathered)
    requests = (3 if mode == "client" else 2) * cycles
    return {"cycles_per_second": cycles / seconds, "requests": requests,
            "daemon_us": (user + system) / requests * 1e6, "daemon_user_us": user / requests * 1e6,
            "daemon_system_us": system / requests * 1e6,
            "client_us": sum(cpu for _, cpu in gathered) / requests * 1e6}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--top", type=int, default=15, help="functions listed by own time")
    parser.add_argument("--mode", choices=("ack_and_reserve", "client"), default="ack_and_reserve",
                        help="put + ack_and_reserve cycles, or the plain Client's put, reserve, ack")
    parser.add_argument("--src", help="run the daemon and clients from this src directory instead")
    parser.add_argument("--no-profile", action="store_true", help="measure CPU per request only")
    args = parser.parse_args()
    (REPO / "var").mkdir(exist_ok=True)
    if args.src:
        source = os.path.abspath(args.src)
        sys.path.insert(0, source)  # the clients (forked from here) import it too
        os.environ["PYTHONPATH"] = os.pathsep.join([source, os.environ.get("PYTHONPATH", "")])

    plain = load(["-m", "walqueue.daemon.cli"], args.clients, args.seconds, args.mode)
    cycle = "put, reserve, ack" if args.mode == "client" else "put + ack_and_reserve"
    print(f"{args.clients} clients, {cycle} cycles, {args.seconds:g} s, no profiler:")
    print(f"  {plain['cycles_per_second']:,.0f} cycles/s; daemon CPU {plain['daemon_us']:.0f} us per request; "
          f"client CPU {plain['client_us']:.0f} us per request (each client its own process)")
    floor_system, floor_wall = fsync_floor(REPO / "var")
    print(f"  the daemon's CPU: user {plain['daemon_user_us']:.0f} us, system {plain['daemon_system_us']:.0f} us "
          f"per request; a bare 200-byte append + fsync in var/ costs {floor_system * 1e6:.0f} us of system "
          f"CPU ({floor_wall * 1e6:.0f} us wall)")
    if args.no_profile:
        return

    profile = Path(tempfile.mkdtemp(prefix="profile-", dir=REPO / "var")) / "daemon.prof"
    profiled = load(["-m", "cProfile", "-o", str(profile), "-m", "walqueue.daemon.cli"], args.clients, args.seconds,
                    args.mode)
    stats = pstats.Stats(str(profile))
    shares: dict[str, float] = {label: 0.0 for label, _ in GROUPS}
    shares["other"] = 0.0
    for (filename, _line, name), (_cc, _nc, own, _cum, _callers) in stats.stats.items():
        label = next((label for label, matches in GROUPS if matches(filename, name)), "other")
        shares[label] += own
    busy = sum(seconds for label, seconds in shares.items() if not label.startswith("epoll"))
    print(f"\nunder cProfile ({profiled['requests']:,} requests): the daemon's busy time per request, by group")
    for label, seconds in sorted(shares.items(), key=lambda item: -item[1]):
        if label.startswith("epoll"):
            continue
        print(f"  {label:<38} {seconds / busy:6.1%}  {seconds / profiled['requests'] * 1e6:7.1f} us")
    print(f"  (idle in epoll: {shares['epoll wait (idle)']:.2f} s of the run)\n")
    stats.sort_stats("tottime").print_stats(args.top)
    shutil.rmtree(profile.parent, ignore_errors=True)


if __name__ == "__main__":
    main()
