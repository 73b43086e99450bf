"""Benchmark WALQueue beside the durable queues users compare it with:
beanstalkd (binlog, ``-f 0``: fsync on every write), Redis (``appendonly yes``,
``appendfsync always``) and a SQLite table (``journal_mode=WAL``,
``synchronous=FULL``) beside walqueued; and WALQueue on PostgreSQL
(``walqueue.pg``) beside procrastinate on one PostgreSQL server with
``fsync=on`` and ``synchronous_commit=on``. All measured in one run
on the same machine and disk.

    .venv/bin/python scripts/bench_peers.py [--seconds 5] [--runs 3] [--clients 1,4,16]
        [--warmup 1] [--quick] [--systems LABEL|GROUP,...] [--no-plot] [--out docs/benchmarks.md]

``--systems`` takes labels (see ``--help``) or the groups ``walqueued``, ``local``
(beanstalkd, Redis, SQLite) and ``pg`` (the four PostgreSQL rows), so that a
quick check can run a few.

Workload "cycle", closed loop, in the most durable setting of each system: put
a 100-byte task, claim it, complete it. Each client is its own process with
its own connection; claims take whatever task is due, so clients share one
queue. Every cell is the median (with min-max) of ``--runs`` runs of
``--seconds`` each, after ``--warmup`` seconds of the same load; every run
starts a fresh server on a fresh directory. Latency is one whole cycle (p50,
p99 over every cycle of every run). Server CPU is utime+stime from
/proc/PID/stat over the measured window, as a share of one core.

The PostgreSQL rows are measured by scripts/bench_pg.py's own functions (its
cycles, its per-run database, its server CPU, transactions and table figures):
one cluster of tests/postgres.py for all of them, started as bench_pg starts it
(in the system's temp directory, which PostgreSQL's own user can reach; on
this machine the same disk as var/), a fresh database for every run, and ``n_dead_tup`` and the table sizes read after each
run.

The machine's limits come from the same run: serial append+fsync, fdatasync
overwriting a preallocated file, and a Python Unix-socket echo round trip with
1 and 16 clients.

Needs the ``bench`` extra (greenstalk, redis, matplotlib, psycopg, procrastinate)
and the beanstalkd, redis-server and PostgreSQL binaries of the systems chosen;
when missing it installs them (pip into this project's .venv; apt-get as root).
Every server is stopped by pid and waited for, also on errors. Writes
``--out`` (a Markdown report) and a PNG plot beside it (not with
``--no-plot``). A smoke test runs it with tiny settings
(tests/unit/test_bench_smoke.py); the full run is not part of the test suite.
"""

from __future__ import annotations

import argparse
import datetime
import importlib.util
import multiprocessing
import os
import platform
import shlex
import shutil
import socket
import sqlite3
import statistics
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO), str(REPO / "scripts")]

import bench_pg  # noqa: E402  (scripts/: the PostgreSQL rows; imports only the standard library here)

PAYLOAD_BYTES = 100
PAYLOAD = b"p" * PAYLOAD_BYTES
READY_SECONDS = 30.0
STOP_SECONDS = 30.0
LEASE_SECONDS = 60
PIP_EXTRA = ".[bench]"
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


# -- installing what is missing ----------------------------------------------------------

# What each system's clients import, and the binary and Debian package of its server.
MODULES = {"beanstalkd -f 0": ("greenstalk",), "Redis appendfsync always": ("redis",),
           "procrastinate defer+fetch+finish": ("psycopg", "psycopg_pool", "procrastinate")}
BINARIES = {"beanstalkd -f 0": ("beanstalkd", "beanstalkd"),
            "Redis appendfsync always": ("redis-server", "redis-server")}
PG_PACKAGE = "postgresql"  # Debian's; tests/postgres.py finds /usr/lib/postgresql/*/bin


def ensure_installed(systems: list[str], plot: bool = True) -> None:
    """pip-install the bench extra and apt-get the servers that `systems` need when missing."""
    from tests.postgres import find_binaries

    wanted = [module for system in systems for module in MODULES.get(system, ())]
    wanted += [module for system in systems if system in bench_pg.SYSTEMS
               for module in ("psycopg", "psycopg_pool")]
    wanted += ["matplotlib"] if plot else []
    missing_modules = sorted({name for name in wanted if importlib.util.find_spec(name) is None})
    if missing_modules:
        print(f"installing the bench extra ({', '.join(missing_modules)} missing)", flush=True)
        venv_python = REPO / ".venv" / "bin" / "python"
        python = venv_python if venv_python.exists() else Path(sys.executable)
        subprocess.run([str(python), "-m", "pip", "install", "-q", "-e", PIP_EXTRA], cwd=REPO, check=True)
        if python.resolve() != Path(sys.executable).resolve():
            raise SystemExit(f"installed into {python}; run this script with it")
        importlib.invalidate_caches()
    packages = sorted({BINARIES[system][1] for system in systems
                       if system in BINARIES and shutil.which(BINARIES[system][0]) is None})
    if any(system in bench_pg.SYSTEMS for system in systems) and find_binaries() is None:
        packages.append(PG_PACKAGE)
    if not packages:
        return
    if os.geteuid() != 0:
        raise SystemExit(f"missing servers: run `sudo apt-get install -y {' '.join(packages)}`")
    print(f"apt-get installing {' '.join(packages)}", flush=True)
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    install = ["apt-get", "install", "-y", "-q", *packages]
    if subprocess.run(install, env=env).returncode != 0:
        subprocess.run(["apt-get", "update", "-q"], env=env, check=True)
        subprocess.run(install, env=env, check=True)


# -- measuring helpers -------------------------------------------------------------------


def percentile(values: list[float], fraction: float) -> float:
    if not values:
        return float("nan")
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))]


def cpu_seconds(pid: int) -> float:
    """utime+stime of a process, in seconds (fields 14 and 15 of /proc/PID/stat)."""
    text = Path(f"/proc/{pid}/stat").read_text()
    fields = text[text.rindex(")") + 2:].split()  # the command name may hold spaces
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_until(ready: Callable[[], bool], what: str) -> None:
    deadline = time.monotonic() + READY_SECONDS
    while not ready():
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not become ready in {READY_SECONDS:g} s")
        time.sleep(0.02)


def stop_process(process: subprocess.Popen) -> None:
    """SIGTERM the server by pid, wait; SIGKILL if it does not exit."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(STOP_SECONDS)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(STOP_SECONDS)


# -- the machine's limits ------------------------------------------------------------------


def fsync_append_rate(directory: Path, seconds: float) -> float:
    """Serial append of a 200-byte record + fsync: the file grows on every sync."""
    from bench_daemon import fsync_rate

    return fsync_rate(directory, seconds)


def fdatasync_overwrite_rate(directory: Path, seconds: float) -> float:
    """Serial 200-byte write + fdatasync into a preallocated, already-synced 64 MiB file."""
    path = directory / "fdatasync-probe"
    size = 64 << 20
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o600)
    record = b"y" * 200
    try:
        os.write(fd, b"\0" * size)  # real blocks, not a hole: later writes only overwrite
        os.fsync(fd)
        offset = 0
        count = 0
        started = time.monotonic()
        while time.monotonic() - started < seconds:
            os.pwrite(fd, record, offset)
            os.fdatasync(fd)
            offset = (offset + len(record)) % (size - len(record))
            count += 1
        elapsed = time.monotonic() - started
    finally:
        os.close(fd)
        path.unlink()
    return count / elapsed


def _echo_serve(path: str, ready) -> None:
    import selectors

    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(path)
    listener.listen(64)
    listener.setblocking(False)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    ready.set()
    while True:
        for key, _ in selector.select():
            if key.fileobj is listener:
                conn, _ = listener.accept()
                conn.setblocking(True)
                selector.register(conn, selectors.EVENT_READ)
                continue
            conn = key.fileobj
            data = conn.recv(65536)
            if not data:
                selector.unregister(conn)
                conn.close()
                continue
            conn.sendall(data)


def _echo_client(path: str, seconds: float, barrier, results) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(path)
    message = struct.pack(">I", 64) + b"m" * 64
    count = 0
    barrier.wait()
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        sock.sendall(message)
        received = 0
        while received < len(message):
            received += len(sock.recv(65536))
        count += 1
    results.put((count, time.monotonic() - started))
    sock.close()


def echo_rate(directory: Path, clients: int, seconds: float) -> float:
    """Round trips/s of a 68-byte message against one single-threaded Python selector server."""
    path = str(directory / f"echo-{clients}.sock")
    ready = multiprocessing.Event()
    server = multiprocessing.Process(target=_echo_serve, args=(path, ready), daemon=True)
    server.start()
    try:
        if not ready.wait(10):
            raise RuntimeError("echo server did not start")
        barrier = multiprocessing.Barrier(clients)
        results = multiprocessing.Queue()
        workers = [multiprocessing.Process(target=_echo_client, args=(path, seconds, barrier, results))
                   for _ in range(clients)]
        for worker in workers:
            worker.start()
        gathered = [results.get(timeout=seconds + 60) for _ in workers]
        for worker in workers:
            worker.join(30)
    finally:
        server.kill()
        server.join(10)
        if os.path.exists(path):
            os.unlink(path)
    return sum(count for count, _ in gathered) / max(elapsed for _, elapsed in gathered)


# -- the systems ------------------------------------------------------------------------------
#
# Each system is a server context manager yielding (address, server pid or None) and
# a client factory that, inside a client process, returns a ``cycle()`` callable doing
# one put + claim + complete and raising if the claim came back empty.


@contextmanager
def beanstalkd_server(workdir: Path) -> Iterator[tuple[object, int | None]]:
    port = free_port()
    binlog = workdir / "binlog"
    binlog.mkdir()
    log = open(workdir / "beanstalkd.log", "wb")
    process = subprocess.Popen(["beanstalkd", "-f", "0", "-b", str(binlog), "-l", "127.0.0.1",
                                "-p", str(port)], stdout=log, stderr=log)
    try:
        def listening() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"beanstalkd exited with {process.returncode}")
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                return True
            except OSError:
                return False

        wait_until(listening, "beanstalkd")
        yield ("127.0.0.1", port), process.pid
    finally:
        stop_process(process)
        log.close()


def beanstalkd_client(address) -> Callable[[], None]:
    import greenstalk

    client = greenstalk.Client(tuple(address), encoding=None)

    def cycle() -> None:
        client.put(PAYLOAD)
        job = client.reserve(timeout=10)
        client.delete(job)

    return cycle


@contextmanager
def redis_server(workdir: Path) -> Iterator[tuple[object, int | None]]:
    path = str(workdir / "redis.sock")
    log = open(workdir / "redis.log", "wb")
    process = subprocess.Popen(
        ["redis-server", "--port", "0", "--unixsocket", path, "--unixsocketperm", "600",
         "--appendonly", "yes", "--appendfsync", "always", "--save", "", "--dir", str(workdir),
         "--daemonize", "no"], stdout=log, stderr=log)
    try:
        import redis

        def answering() -> bool:
            if process.poll() is not None:
                raise RuntimeError(f"redis-server exited with {process.returncode}")
            try:
                return bool(redis.Redis(unix_socket_path=path).ping())
            except (redis.ConnectionError, FileNotFoundError):
                return False

        wait_until(answering, "redis-server")
        yield path, process.pid
    finally:
        stop_process(process)
        log.close()


def redis_client(address) -> Callable[[], None]:
    """The reliable-queue pattern: LPUSH, LMOVE into a processing list, LREM to complete."""
    import redis

    client = redis.Redis(unix_socket_path=address)
    processing = f"processing:{os.getpid()}"

    def cycle() -> None:
        client.lpush("queue", PAYLOAD)
        task = client.lmove("queue", processing, "RIGHT", "LEFT")
        if task is None:
            raise RuntimeError("redis: nothing to claim")
        client.lrem(processing, 1, task)

    return cycle


@contextmanager
def sqlite_database(workdir: Path) -> Iterator[tuple[object, int | None]]:
    path = str(workdir / "queue.db")
    connection = sqlite3.connect(path)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("CREATE TABLE tasks (id INTEGER PRIMARY KEY, payload BLOB NOT NULL, "
                       "state INTEGER NOT NULL DEFAULT 0, worker TEXT)")
    connection.execute("CREATE INDEX tasks_due ON tasks (state, id)")
    connection.commit()
    connection.close()
    yield path, None  # no server: the work is in the client processes


def sqlite_client(address) -> Callable[[], None]:
    """Three transactions per cycle, each durable on commit (WAL + synchronous=FULL)."""
    connection = sqlite3.connect(address, isolation_level=None, timeout=60)
    connection.execute("PRAGMA journal_mode=WAL")
    connection.execute("PRAGMA synchronous=FULL")
    worker = f"w{os.getpid()}"

    def cycle() -> None:
        connection.execute("INSERT INTO tasks (payload) VALUES (?)", (PAYLOAD,))
        connection.execute("BEGIN IMMEDIATE")
        try:
            row = connection.execute(
                "UPDATE tasks SET state = 1, worker = ? WHERE id = "
                "(SELECT id FROM tasks WHERE state = 0 ORDER BY id LIMIT 1) RETURNING id",
                (worker,)).fetchone()
            connection.execute("COMMIT")
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        if row is None:
            raise RuntimeError("sqlite: nothing to claim")
        connection.execute("DELETE FROM tasks WHERE id = ? AND worker = ?", (row[0], worker))

    return cycle


@contextmanager
def walqueue_server(workdir: Path) -> Iterator[tuple[object, int | None]]:
    """walqueued as scripts/bench_daemon.py starts it (its fsyncs are counted)."""
    from bench_daemon import DaemonRun

    with DaemonRun(workdir) as daemon:
        global _current_daemon
        _current_daemon = daemon
        try:
            yield daemon.socket_path, daemon.proc.pid
        finally:
            _current_daemon = None


_current_daemon = None  # the walqueued of the run in progress, to read its fsync count


def walqueue_client(address) -> Callable[[], None]:
    from walqueue.client import Client

    name = f"w{os.getpid()}"
    client = Client(address, name=name)
    client.stats()  # connect now, not inside the first cycle
    payload = {"data": PAYLOAD.decode()}
    counter = iter(range(1 << 62))

    def cycle() -> None:
        client.put(f"{name}-{next(counter):010d}", payload)
        leases = client.reserve(name, lease_seconds=LEASE_SECONDS)
        if not leases:
            raise RuntimeError("walqueue: nothing to claim")
        for lease in leases:
            client.ack(lease)

    return cycle


def walqueue_ack_next_client(address) -> Callable[[], None]:
    """put, then ack the task in hand and reserve the next in one request (ack_and_reserve)."""
    from walqueue.client import Client

    name = f"w{os.getpid()}"
    client = Client(address, name=name)
    client.stats()
    payload = {"data": PAYLOAD.decode()}
    counter = iter(range(1 << 62))
    held = []

    def cycle() -> None:
        client.put(f"{name}-{next(counter):010d}", payload)
        if held:
            leases = client.ack_and_reserve(held.pop(), lease_seconds=LEASE_SECONDS)
        else:
            leases = client.reserve(name, lease_seconds=LEASE_SECONDS)
        if not leases:
            raise RuntimeError("walqueue: nothing to claim")
        held.extend(leases)

    return cycle


def _cycle_loop(factory, address, warmup: float, seconds: float, barrier, results) -> None:
    cycle = factory(address)
    started = time.monotonic()
    while time.monotonic() - started < warmup:
        cycle()
    barrier.wait()
    latencies = []
    cpu_started = time.process_time()
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        t0 = time.perf_counter()
        cycle()
        latencies.append(time.perf_counter() - t0)
    results.put((len(latencies), time.monotonic() - started, latencies, time.process_time() - cpu_started))


def _worker_loop(_factory, address, warmup: float, seconds: float, barrier, results) -> None:
    """The cycle through walqueue.worker.Worker: the handler puts the next task, the
    Worker reserves and acks. A cycle's latency is the time between two handler calls;
    a timer stops the Worker when the measured window ends."""
    import threading

    from walqueue.client import Client
    from walqueue.worker import Worker

    name = f"w{os.getpid()}"
    client = Client(address, name=name)
    payload = {"data": PAYLOAD.decode()}
    state = {"n": 0, "measuring": False, "started": time.monotonic(), "last": None}
    latencies: list[float] = []

    def handler(_lease) -> None:
        if not state["measuring"] and time.monotonic() - state["started"] >= warmup:
            barrier.wait()
            state.update(measuring=True, started=time.monotonic(), last=None, cpu=time.process_time())
            threading.Timer(seconds, worker.stop).start()
        now = time.perf_counter()
        if state["measuring"] and state["last"] is not None:
            latencies.append(now - state["last"])
        state["last"] = now
        state["n"] += 1
        client.put(f"{name}-{state['n']:010d}", payload)

    # wait=1: once another client has stopped and taken its task out of the loop, a
    # reserve may come back empty; the Worker then sees stop() within a second.
    worker = Worker(client, name, handler, lease_seconds=LEASE_SECONDS, wait=1)
    client.put(f"{name}-seed", payload)
    worker.run()
    elapsed = min(time.monotonic() - state["started"], seconds)
    cpu = time.process_time() - state["cpu"]  # the whole process: the lease toucher thread too
    client.close()
    results.put((len(latencies), elapsed, latencies, cpu))


SYSTEMS: dict[str, tuple[Callable, Callable, Callable]] = {
    # label: (server, client factory, client loop)
    "beanstalkd -f 0": (beanstalkd_server, beanstalkd_client, _cycle_loop),
    "Redis appendfsync always": (redis_server, redis_client, _cycle_loop),
    "SQLite WAL synchronous=FULL": (sqlite_database, sqlite_client, _cycle_loop),
    "WALQueue (Client)": (walqueue_server, walqueue_client, _cycle_loop),
    "WALQueue (Worker)": (walqueue_server, walqueue_client, _worker_loop),
    "WALQueue (ack+next)": (walqueue_server, walqueue_ack_next_client, _cycle_loop),
}


# Requests a cycle sends, the divisor of CPU per request: WALQueue put, reserve, ack; or put
# and ack_and_reserve (the Worker acks with ack_and_reserve too); the peers' three commands
# (put, reserve, delete; LPUSH, LMOVE, LREM; three transactions).
REQUESTS_PER_CYCLE = {"beanstalkd -f 0": 3, "Redis appendfsync always": 3, "SQLite WAL synchronous=FULL": 3,
                      "WALQueue (Client)": 3, "WALQueue (Worker)": 2, "WALQueue (ack+next)": 2}
assert set(REQUESTS_PER_CYCLE) == set(SYSTEMS)
OURS = ("WALQueue (Client)", "WALQueue (Worker)", "WALQueue (ack+next)")

# The PostgreSQL rows: scripts/bench_pg.py's systems, under its labels.
PG_SYSTEMS = tuple(bench_pg.SYSTEMS)
PG_PEER = "procrastinate defer+fetch+finish"
PG_OURS = tuple(system for system in PG_SYSTEMS if system != PG_PEER)
# One task per cycle, as procrastinate's fetch: the PostgreSQL targets are judged on these.
PG_SINGLE = ("walqueue.pg put+reserve+ack", "walqueue.pg put+ack_and_reserve")
assert set(PG_SINGLE) <= set(PG_OURS) and PG_PEER in PG_SYSTEMS
ALL_SYSTEMS = (*SYSTEMS, *PG_SYSTEMS)
GROUPS = {"walqueued": OURS, "local": tuple(system for system in SYSTEMS if system not in OURS),
          "pg": PG_SYSTEMS}


def one_run(system: str, clients: int, warmup: float, seconds: float) -> dict:
    server, factory, loop = SYSTEMS[system]
    workdir = Path(tempfile.mkdtemp(prefix="bench-peers-", dir=REPO / "var"))
    processes: list[multiprocessing.Process] = []
    try:
        with server(workdir) as (address, pid):
            barrier = multiprocessing.Barrier(clients + 1)
            results = multiprocessing.Queue()
            processes = [multiprocessing.Process(target=loop, args=(factory, address, warmup, seconds,
                                                                    barrier, results))
                         for _ in range(clients)]
            for process in processes:
                process.start()
            barrier.wait(warmup + 120)
            daemon = _current_daemon
            syncs_before = daemon.syncs() if daemon is not None else 0
            cpu_before = cpu_seconds(pid) if pid else 0.0
            window_start = time.monotonic()
            gathered = [results.get(timeout=seconds + 120) for _ in processes]
            window = time.monotonic() - window_start
            server_cpu_seconds = cpu_seconds(pid) - cpu_before if pid else None
            cpu = server_cpu_seconds / window if pid else None
            syncs = daemon.syncs() - syncs_before if daemon is not None else None
            for process in processes:
                process.join(30)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(10)
        shutil.rmtree(workdir, ignore_errors=True)
    cycles = sum(item[0] for item in gathered)
    elapsed = max(item[1] for item in gathered)
    latencies = [value for item in gathered for value in item[2]]
    requests = cycles * REQUESTS_PER_CYCLE[system]
    return {"rate": cycles / elapsed, "latencies": latencies, "cpu": cpu,
            # CPU per request in microseconds: the server's over the window, the clients' over theirs
            "server_us": None if server_cpu_seconds is None else server_cpu_seconds / requests * 1e6,
            "client_us": sum(item[3] for item in gathered) / requests * 1e6,
            "requests_per_fsync": None if syncs is None else
            requests / max(1, syncs)}


@contextmanager
def postgres_server() -> Iterator[object]:
    """bench_pg's durable cluster (fsync=on, synchronous_commit=on) in a new temp directory, started;
    stopped by its pid (tests/postgres.py: SIGINT, then SIGQUIT, then SIGKILL, each
    waited for) and removed on the way out, also on errors."""
    server = bench_pg.make_server(durable=True)
    try:
        server.start()
        yield server
    finally:
        server.cleanup()


def pg_cell(server, system: str, clients: int, warmup: float, seconds: float, runs: int) -> dict:
    """One PostgreSQL cell through bench_pg.run_cells (a fresh database per run), in the
    units of this report's cells (ms), with bench_pg's extra figures kept."""
    cell = dict(bench_pg.run_cells(server, [system], [clients], warmup, seconds, runs)[system, clients])
    cell.update(median=cell["rate"], p50=cell["p50"] * 1e3, p99=cell["p99"] * 1e3,
                slowest=cell["slowest"] * 1e3, requests_per_fsync=None)
    return cell


# -- the report ---------------------------------------------------------------------------------


def load_average() -> str:
    return " ".join(Path("/proc/loadavg").read_text().split()[:3])


def machine() -> dict[str, str]:
    cpu_model = "unknown"
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu_model = line.split(":", 1)[1].strip()
            break
    memory = "unknown"
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal"):
            memory = f"{int(line.split()[1]) / (1 << 20):.1f} GiB"
    disk = subprocess.run(["df", "-T", str(REPO / "var")], capture_output=True, text=True).stdout.strip()
    from importlib.metadata import PackageNotFoundError, version

    from tests.postgres import find_binaries

    pg_bin = find_binaries()
    versions = {}
    for name, command in (("beanstalkd", ["beanstalkd", "-v"]), ("redis", ["redis-server", "--version"]),
                          ("postgres", [str(pg_bin / "postgres") if pg_bin else "postgres", "--version"])):
        if shutil.which(command[0]) is None:
            versions[name] = f"{name}: not installed"
            continue
        versions[name] = subprocess.run(command, capture_output=True, text=True).stdout.strip()
    try:
        versions["procrastinate"] = f"procrastinate {version('procrastinate')}"
    except PackageNotFoundError:
        versions["procrastinate"] = "procrastinate: not installed"
    return {"nproc": str(os.cpu_count()), "cpu": cpu_model, "memory": memory,
            "python": sys.version.split()[0], "kernel": platform.release(), "disk": disk,
            "sqlite": sqlite3.sqlite_version, **versions}


def best_ours(cells: dict, clients: int) -> tuple[str, dict] | None:
    """The fastest WALQueue variant at this client count (each is a way the API is meant to be used)."""
    measured = [(system, cells[(system, clients)]) for system in OURS if (system, clients) in cells]
    return max(measured, key=lambda item: item[1]["median"]) if measured else None


def ratio(cells: dict, system: str, clients: int, peer: str) -> str:
    ours = cells.get((system, clients))
    theirs = cells.get((peer, clients))
    if not ours or not theirs:
        return "n/a"
    return f"{ours['median'] / theirs['median']:.2f}x"


def verdict(value: float, needed: float) -> str:
    """A target that `value` must reach: met, or missed by how much."""
    if value >= needed:
        return "met"
    return f"**missed** ({value / needed:.0%} of the target; {needed / value:.2f}x short)"


def verdict_at_most(value: float, limit: float) -> str:
    """A limit that `value` must stay under: met, or missed by how much."""
    return "met" if value <= limit else f"**missed** ({value / limit:.2f}x the limit)"


TARGETS = (
    # (clients, peer, minimum ratio of WALQueue's cycles/s to the peer's)
    (16, "beanstalkd -f 0", 2.0),
    (16, "Redis appendfsync always", 1.5),
    (4, "beanstalkd -f 0", 1.0),
    (4, "Redis appendfsync always", 1.0),
    (1, "Redis appendfsync always", 1.0),
    (1, "beanstalkd -f 0", 1.0),  # a goal, not a hard target
)
MIN_REQUESTS_PER_FSYNC = 8.0
MIN_SHARE_OF_SOCKET_CEILING = 0.30


def target_lines(cells: dict, limits: dict, clients_list: list[int]) -> list[str]:
    """One line per target, judged on the fastest WALQueue variant: met, or missed by how much."""
    lines = []
    for clients, peer, needed in TARGETS:
        best = best_ours(cells, clients)
        theirs = cells.get((peer, clients))
        if not best or not theirs:
            continue
        system, ours = best
        value = ours["median"] / theirs["median"]
        lines.append(f"- {clients} client(s), >= {needed:.1f}x {peer}: {value:.2f}x ({system}), "
                     f"{verdict(value, needed)}")
    top = max(clients_list)
    best = best_ours(cells, top)
    if best and top == 16:
        system, ours = best
        if ours["requests_per_fsync"] is not None:
            lines.append(f"- {top} clients, >= {MIN_REQUESTS_PER_FSYNC:g} requests per fsync: "
                         f"{ours['requests_per_fsync']:.1f} ({system}), "
                         f"{verdict(ours['requests_per_fsync'], MIN_REQUESTS_PER_FSYNC)}")
        if top in limits["echo"]:
            share = ours["median"] / (limits["echo"][top] / 3)
            lines.append(f"- {top} clients, >= {MIN_SHARE_OF_SOCKET_CEILING:.0%} of the socket ceiling: "
                         f"{share:.0%} ({system}), {verdict(share, MIN_SHARE_OF_SOCKET_CEILING)}")
    return lines or ["- no WALQueue and peer cells to compare"]


CORE_RATIO_TARGETS = (
    # (clients, WALQueue variant, peer, minimum ratio of cycles/s)
    (16, "WALQueue (Client)", "beanstalkd -f 0", 2.0),
    (16, "WALQueue (Client)", "Redis appendfsync always", 1.0),
    (16, "WALQueue (ack+next)", "Redis appendfsync always", 1.5),
    (1, "WALQueue (Client)", "Redis appendfsync always", 1.0),
)
# walqueued's CPU per request, microseconds, by client count (plain Client)
CORE_SERVER_US = {16: 60.0, 1: 100.0}
CORE_CLIENT_OVER_REDIS = 1.5  # the plain Client's CPU per request over redis-py's


def core_target_lines(cells: dict) -> list[str]:
    """Issue 22's targets: named variants against the peers, and CPU per request."""
    lines = []
    for clients, system, peer, needed in CORE_RATIO_TARGETS:
        ours, theirs = cells.get((system, clients)), cells.get((peer, clients))
        if ours and theirs:
            value = ours["median"] / theirs["median"]
            lines.append(f"- {clients} client(s), {system} >= {needed:.1f}x {peer}: {value:.2f}x, "
                         f"{verdict(value, needed)}")
    for clients, limit in CORE_SERVER_US.items():
        ours = cells.get(("WALQueue (Client)", clients))
        if ours and ours.get("server_us") is not None:
            value = ours["server_us"]
            lines.append(f"- {clients} client(s), walqueued CPU per request <= {limit:.0f} us: {value:.0f} us, "
                         f"{verdict_at_most(value, limit)}")
    for clients in (1, 16):
        ours, redis = cells.get(("WALQueue (Client)", clients)), cells.get(("Redis appendfsync always", clients))
        if ours and redis:
            value = ours["client_us"] / redis["client_us"]
            lines.append(f"- {clients} client(s), Client CPU per request <= {CORE_CLIENT_OVER_REDIS:.1f}x "
                         f"redis-py's: {ours['client_us']:.0f} us against {redis['client_us']:.0f} us, "
                         f"{value:.2f}x, {verdict_at_most(value, CORE_CLIENT_OVER_REDIS)}")
    return lines or ["- no WALQueue and peer cells to compare"]


PG_RATIO_TARGET = 1.5  # walqueue.pg single-task cycles/s over procrastinate's, at 4 and 16 clients
PG_RATIO_CLIENTS = (4, 16)
PG_MIN_RATE = 2500.0  # walqueue.pg single-task cycles/s at 16 clients
PG_RATE_CLIENTS = 16


def best_pg(cells: dict, clients: int) -> tuple[str, dict] | None:
    """The fastest single-task walqueue.pg variant at this client count."""
    measured = [(system, cells[(system, clients)]) for system in PG_SINGLE if (system, clients) in cells]
    return max(measured, key=lambda item: item[1]["median"]) if measured else None


def pg_target_lines(cells: dict) -> list[str]:
    """Issue 13's targets, judged on the fastest single-task walqueue.pg variant (limit=10
    moves ten tasks per call, procrastinate one); a target with no cell says so."""
    lines = []
    for clients in PG_RATIO_CLIENTS:
        best, theirs = best_pg(cells, clients), cells.get((PG_PEER, clients))
        label = f"- {clients} clients, >= {PG_RATIO_TARGET:.1f}x procrastinate"
        if not best or not theirs:
            lines.append(f"{label}: not measured in this run")
            continue
        value = best[1]["median"] / theirs["median"]
        lines.append(f"{label}: {value:.2f}x ({best[0]}), {verdict(value, PG_RATIO_TARGET)}")
    best = best_pg(cells, PG_RATE_CLIENTS)
    label = f"- {PG_RATE_CLIENTS} clients, >= {PG_MIN_RATE:,.0f} single-task cycles/s"
    if best:
        lines.append(f"{label}: {best[1]['median']:,.0f} ({best[0]}), "
                     f"{verdict(best[1]['median'], PG_MIN_RATE)}")
    else:
        lines.append(f"{label}: not measured in this run")
    return lines


def pg_lines(cells: dict, systems: list[str], clients_list: list[int]) -> list[str]:
    """The report's PostgreSQL section: bench_pg's figures, the ratios, the targets."""
    pg = [system for system in systems if system in PG_SYSTEMS]
    if not pg:
        return []
    lines = [
        "",
        "## WALQueue on PostgreSQL beside procrastinate",
        "",
        "Measured by `scripts/bench_pg.py`'s functions in this run: one PostgreSQL cluster "
        "(`fsync=on`, `synchronous_commit=on`, `full_page_writes=on`, Unix socket, "
        "`shared_buffers=64MB`, `max_connections=300`, otherwise the defaults, autovacuum on) for "
        "all these rows, a fresh "
        "database for every run, one connection per client process. The server CPU above is "
        "the postmaster and all its backends. (put+reserve+ack) is `walqueue.pg.Client` put, "
        "reserve, ack: three transactions; (put+ack_and_reserve) is put, then `ack_and_reserve` "
        "of the task in hand: two; (limit=10) is `put_many` of 10, `reserve(limit=10)`, 10 acks, "
        "and one of its cycles is one task (p50/p99 are a call's time divided by its tasks). "
        "procrastinate is its own API as a worker uses it: `defer_async`, then the job manager's "
        "`fetch_job` and `finish_job` (three transactions; the job row is kept, as by default).",
        "",
        "| system | clients | client CPU us/cycle | server CPU us/cycle | transactions/cycle "
        "| tables after the median run: n_dead_tup, total size |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for system in pg:
        for clients in clients_list:
            cell = cells.get((system, clients))
            if cell is None:
                continue
            tables = "; ".join(f"`{name}` {dead:,} dead, {size / 1024:,.0f} KiB"
                               for name, dead, size in cell["tables"][:4]) or "-"
            lines.append(f"| {system} | {clients} | {cell['client_us']:,.0f} | {cell['server_us']:,.0f} | "
                         f"{cell['transactions']:.2f} | {tables} |")
    lines += [
        "",
        "Transactions per cycle count the warm-up and each client's connect too. The tables are "
        "read 1.5 s after the clients stop (the backends flush their statistics at most once a "
        "second).",
        "",
        "| clients | walqueue.pg variant | vs procrastinate | vs the fastest walqueued variant | target |",
        "|---:|---|---:|---:|---|",
    ]
    for clients in sorted(clients_list, reverse=True):
        fastest_local = best_ours(cells, clients)
        for system in PG_OURS:
            ours = cells.get((system, clients))
            if ours is None:
                continue
            local = (f"{ours['median'] / fastest_local[1]['median']:.2f}x ({fastest_local[0]})"
                     if fastest_local else "n/a")
            target = []
            if system in PG_SINGLE and clients in PG_RATIO_CLIENTS:
                target.append(f">= {PG_RATIO_TARGET:.1f}x procrastinate")
            if system in PG_SINGLE and clients == PG_RATE_CLIENTS:
                target.append(f">= {PG_MIN_RATE:,.0f}/s")
            lines.append(f"| {clients} | {system} | {ratio(cells, system, clients, PG_PEER)} | {local} | "
                         f"{', '.join(target)} |")
    lines += [
        "",
        "### Targets for PostgreSQL, checked against this run",
        "",
        "Judged on the fastest single-task variant (put+reserve+ack or put+ack_and_reserve); "
        "limit=10 is shown above, not judged.",
        "",
        *pg_target_lines(cells),
    ]
    return lines


def write_report(out: Path, plot: Path | None, args, command: str, limits: dict, cells: dict,
                 systems: list[str], clients_list: list[int], info: dict, started: str) -> None:
    lines = [
        "# Benchmarks: WALQueue beside beanstalkd, Redis, SQLite and, on PostgreSQL, procrastinate",
        "",
        f"Generated by `scripts/bench_peers.py` on {started}. Command:",
        "",
        "```",
        command,
        "```",
        "",
        f"Workload \"cycle\": put a {PAYLOAD_BYTES}-byte task, claim it, complete it; closed loop; "
        f"each client is its own process with its own connection; {args.warmup:g} s warm-up, then "
        f"{args.seconds:g} s measured; {args.runs} run(s) per cell, each on a fresh server and "
        "directory (the PostgreSQL rows: a fresh database on one server, see below). cycles/s is the median with min-max; p50/p99 is one whole cycle over every "
        "cycle of every run of the cell; server CPU is utime+stime of the server process over "
        "the measured window (1.00 = one core busy).",
        "",
        "Durability settings, the most durable each system offers:",
        "",
        "- beanstalkd `-f 0 -b DIR` (fsync the binlog on every write), TCP on 127.0.0.1. "
        "put, reserve, delete. beanstalkd does not write a reservation to its binlog.",
        "- Redis `--appendonly yes --appendfsync always --save ''`, Unix socket. LPUSH, "
        "LMOVE into a per-client processing list, LREM.",
        "- SQLite 3 `journal_mode=WAL`, `synchronous=FULL`, one connection per client "
        "process: INSERT; `BEGIN IMMEDIATE` + `UPDATE ... RETURNING` claim + COMMIT; DELETE "
        "(three durable transactions; no server, so no server CPU).",
        "- WALQueue: walqueued on a Unix socket, fsync before every answer, default options. "
        "(Client) is `walqueue.client.Client` put, reserve, ack (three requests); (ack+next) is "
        "put, then `ack_and_reserve` of the task in hand (two requests: the ack and the next "
        "claim share one request and one fsync); (Worker) is `walqueue.worker.Worker` with a "
        "handler that puts the next task (it acks with `ack_and_reserve`; its lease toucher "
        "thread is on). req/fsync divides by the daemon's own count of its WAL fsyncs "
        "(`daemon_stats().fsyncs_total`, read before and after the window); the daemon runs "
        "with its defaults and no test hook.",
        "- WALQueue on PostgreSQL (`walqueue.pg`) and procrastinate on one PostgreSQL server "
        "with `fsync=on`, `synchronous_commit=on`: see the section on PostgreSQL below.",
        "",
        "## Cycles per second",
        "",
        "| system | clients | cycles/s (median) | min-max | p50 ms | p99 ms | max ms | server CPU | req/fsync |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for system in systems:
        for clients in clients_list:
            cell = cells.get((system, clients))
            if cell is None:
                lines.append(f"| {system} | {clients} | failed: {cells.get(('error', system, clients))} "
                             "| | | | | | |")
                continue
            cpu = "-" if cell["cpu"] is None else f"{cell['cpu']:.2f}"
            per_fsync = "-" if cell["requests_per_fsync"] is None else f"{cell['requests_per_fsync']:.1f}"
            lines.append(f"| {system} | {clients} | {cell['median']:,.0f} | "
                         f"{cell['min']:,.0f}-{cell['max']:,.0f} | {cell['p50']:.2f} | {cell['p99']:.2f} | "
                         f"{cell['slowest']:.0f} | {cpu} | {per_fsync} |")
    lines += [
        "",
        *([f"![cycles/s against client count]({plot.name})", ""] if plot else []),
        "## The machine's limits (same run, same disk)",
        "",
        "| probe | per second |",
        "|---|---:|",
        f"| append 200 B + fsync, file grows | {limits['fsync_append']:,.0f} |",
        f"| overwrite 200 B + fdatasync, preallocated file | {limits['fdatasync_overwrite']:,.0f} |",
    ]
    for clients, rate in limits["echo"].items():
        lines.append(f"| Python Unix-socket echo, {clients} client(s), round trips | {rate:,.0f} |")
    lines += [
        "",
        "## Ratios (WALQueue cycles/s divided by the peer's, medians)",
        "",
        "| clients | WALQueue variant | vs beanstalkd -f 0 | vs Redis appendfsync always | vs SQLite | target |",
        "|---:|---|---:|---:|---:|---|",
    ]
    targets = {16: ">= 2.0x beanstalkd, >= 1.5x Redis", 4: ">= 1.0x both", 1: ">= 1.0x Redis (goal: beanstalkd)"}
    for clients in sorted(clients_list, reverse=True):
        for system in OURS:
            if (system, clients) not in cells:
                continue
            lines.append(f"| {clients} | {system} | {ratio(cells, system, clients, 'beanstalkd -f 0')} | "
                         f"{ratio(cells, system, clients, 'Redis appendfsync always')} | "
                         f"{ratio(cells, system, clients, 'SQLite WAL synchronous=FULL')} | "
                         f"{targets.get(clients, '')} |")
    top = max(clients_list)
    best = best_ours(cells, top)
    if best and top in limits["echo"]:
        ceiling = limits["echo"][top] / 3
        lines += ["", f"Socket ceiling at {top} clients (echo round trips/s / 3): {ceiling:,.0f} cycles/s; "
                  f"{best[0]} reaches {best[1]['median'] / ceiling:.0%} of it (target >= 30 %)."]
    lines += [
        "",
        "## CPU per request",
        "",
        "Server CPU (utime+stime of the server process over the window) and client CPU (each client "
        "process's own, over its window, summed) divided by the requests answered: a cycle is three "
        "requests for beanstalkd, Redis, SQLite (transactions) and WALQueue (Client), two for "
        "(ack+next) and (Worker). Medians of the runs.",
        "",
        "| system | clients | requests/cycle | server CPU us/request | client CPU us/request |",
        "|---|---:|---:|---:|---:|",
    ]
    for system in (system for system in systems if system in SYSTEMS):  # PostgreSQL's: below
        for clients in clients_list:
            cell = cells.get((system, clients))
            if cell is None:
                continue
            server = "-" if cell["server_us"] is None else f"{cell['server_us']:.0f}"
            lines.append(f"| {system} | {clients} | {REQUESTS_PER_CYCLE[system]} | {server} | "
                         f"{cell['client_us']:.0f} |")
    lines += [
        "",
        "## Targets for walqueued beside its peers, checked against this run",
        "",
        *target_lines(cells, limits, clients_list),
        "",
        "The targets of the compiled core, same run:",
        "",
        *core_target_lines(cells),
        *pg_lines(cells, systems, clients_list),
        "",
        "## The machine",
        "",
        f"- nproc: {info['nproc']}; CPU: {info['cpu']}; memory: {info['memory']}",
        f"- Python {info['python']}; Linux {info['kernel']}; SQLite {info['sqlite']}; "
        f"{info['beanstalkd']}; {info['redis']}; {info['postgres']}; {info['procrastinate']}",
        f"- load average (1, 5, 15 min) at the start: {info['load_start']}; at the end: {info['load_end']} "
        "(the benchmark's own servers and clients count too; shown so that other work on the machine is visible)",
        "- disk (`df -T` of the directory every server and probe wrote to):",
        "",
        "```",
        info["disk"],
        "```",
        "",
    ]
    out.write_text("\n".join(lines))


def write_plot(plot: Path, cells: dict, systems: list[str], clients_list: list[int]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(figsize=(9, 5.5), dpi=120)
    for system in systems:
        points = [(clients, cells[(system, clients)]) for clients in clients_list if (system, clients) in cells]
        if not points:
            continue
        xs = [clients for clients, _ in points]
        medians = [cell["median"] for _, cell in points]
        below = [cell["median"] - cell["min"] for _, cell in points]
        above = [cell["max"] - cell["median"] for _, cell in points]
        style = "-" if system.startswith(("WALQueue", "walqueue.pg")) else "--"
        marker = "s" if system in PG_SYSTEMS else "o"  # squares: on the PostgreSQL server
        axes.errorbar(xs, medians, yerr=[below, above], marker=marker, linestyle=style, capsize=3,
                      label=system)
    axes.set_xscale("log", base=2)
    axes.set_xticks(clients_list, [str(clients) for clients in clients_list])
    axes.set_xlabel("client processes")
    axes.set_ylabel("cycles/s (put + claim + complete), median, bars min-max")
    axes.set_title("Durable queue cycles/s on one machine (squares: on PostgreSQL)")
    axes.set_ylim(bottom=0)
    axes.grid(True, alpha=0.3)
    axes.legend(fontsize=8)
    figure.tight_layout()
    figure.savefig(plot)
    plt.close(figure)


def select_systems(parser: argparse.ArgumentParser, spec: str) -> list[str]:
    """The labels and groups of --systems, in the report's order (all when empty)."""
    if not spec:
        return list(ALL_SYSTEMS)
    chosen = set()
    for name in (part.strip() for part in spec.split(",")):
        if name in GROUPS:
            chosen.update(GROUPS[name])
        elif name in ALL_SYSTEMS:
            chosen.add(name)
        else:
            parser.error(f"unknown system {name!r}; known: {', '.join(ALL_SYSTEMS)}; "
                         f"groups: {', '.join(GROUPS)}")
    return [system for system in ALL_SYSTEMS if system in chosen]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, help="length of each measured run (default 5)")
    parser.add_argument("--runs", type=int, help="runs per cell, the median is shown (default 3)")
    parser.add_argument("--clients", help="comma-separated client process counts (default 1,4,16)")
    parser.add_argument("--warmup", type=float, help="seconds of load before each measured run (default 1)")
    parser.add_argument("--systems", default="",
                        help="comma-separated labels or groups (walqueued, local, pg); default all: "
                             + ", ".join(ALL_SYSTEMS))
    parser.add_argument("--quick", action="store_true",
                        help="smoke run: defaults of 1 run, 2 s, 0.5 s warm-up, clients 1 and 4 "
                             "(each still set by its own option)")
    parser.add_argument("--no-plot", action="store_true", help="write the report without the PNG")
    parser.add_argument("--out", default=str(REPO / "docs" / "benchmarks.md"), help="the Markdown report")
    args = parser.parse_args()
    command = " ".join(shlex.quote(part) for part in [".venv/bin/python", "scripts/bench_peers.py", *sys.argv[1:]])
    defaults = {"runs": 1, "seconds": 2.0, "clients": "1,4", "warmup": 0.5} if args.quick else \
        {"runs": 3, "seconds": 5.0, "clients": "1,4,16", "warmup": 1.0}
    for name, value in defaults.items():
        if getattr(args, name) is None:
            setattr(args, name, value)
    clients_list = [int(n) for n in args.clients.split(",") if n]
    systems = select_systems(parser, args.systems)
    ensure_installed(systems, plot=not args.no_plot)
    load_start = load_average()
    started = datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC")
    (REPO / "var").mkdir(exist_ok=True)
    scratch = Path(tempfile.mkdtemp(prefix="bench-peers-limits-", dir=REPO / "var"))
    try:
        probe_seconds = min(args.seconds, 3.0)
        limits = {
            "fsync_append": fsync_append_rate(scratch, probe_seconds),
            "fdatasync_overwrite": fdatasync_overwrite_rate(scratch, probe_seconds),
            "echo": {clients: echo_rate(scratch, clients, probe_seconds) for clients in sorted({1, max(clients_list)})},
        }
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"limits: append+fsync {limits['fsync_append']:,.0f}/s, overwrite+fdatasync "
          f"{limits['fdatasync_overwrite']:,.0f}/s, echo "
          + ", ".join(f"{c} client(s) {r:,.0f}/s" for c, r in limits["echo"].items()), flush=True)
    cells: dict = {}
    for system in (system for system in systems if system in SYSTEMS):
        for clients in clients_list:
            runs = []
            try:
                for _ in range(args.runs):
                    runs.append(one_run(system, clients, args.warmup, args.seconds))
            except Exception as exc:  # one broken peer should not lose the rest of the report
                print(f"{system} x{clients}: FAILED {exc!r}", flush=True)
                cells[("error", system, clients)] = repr(exc)
                continue
            rates = [run["rate"] for run in runs]
            latencies = [value for run in runs for value in run["latencies"]]
            cpus = [run["cpu"] for run in runs if run["cpu"] is not None]
            per_fsync = [run["requests_per_fsync"] for run in runs if run["requests_per_fsync"] is not None]
            server_us = [run["server_us"] for run in runs if run["server_us"] is not None]
            cell = {"median": statistics.median(rates), "min": min(rates), "max": max(rates),
                    "p50": percentile(latencies, 0.5) * 1e3, "p99": percentile(latencies, 0.99) * 1e3,
                    "slowest": max(latencies) * 1e3, "cpu": statistics.median(cpus) if cpus else None,
                    "requests_per_fsync": statistics.median(per_fsync) if per_fsync else None,
                    "server_us": statistics.median(server_us) if server_us else None,
                    "client_us": statistics.median(run["client_us"] for run in runs)}
            cells[(system, clients)] = cell
            print(f"{system:<28} x{clients:<3} {cell['median']:>9,.0f} cycles/s "
                  f"({cell['min']:,.0f}-{cell['max']:,.0f}) p50 {cell['p50']:.2f} ms p99 {cell['p99']:.2f} ms",
                  flush=True)
    pg = [system for system in systems if system in PG_SYSTEMS]
    if pg:
        # In the system's temp directory (tests/postgres.py), not under the checkout: the
        # postgres user must reach it, and a checkout may sit in a private directory.
        with postgres_server() as server:  # one cluster, a fresh database per run
            for system in pg:
                for clients in clients_list:
                    try:
                        cell = pg_cell(server, system, clients, args.warmup, args.seconds, args.runs)
                    except Exception as exc:  # as above: keep the other rows
                        print(f"{system} x{clients}: FAILED {exc!r}", flush=True)
                        cells[("error", system, clients)] = repr(exc)
                        continue
                    cells[(system, clients)] = cell
                    print(f"{system:<33} x{clients:<3} {cell['median']:>9,.0f} cycles/s "
                          f"({cell['min']:,.0f}-{cell['max']:,.0f}) p50 {cell['p50']:.2f} ms "
                          f"p99 {cell['p99']:.2f} ms", flush=True)
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    plot = None if args.no_plot else out.with_suffix(".png")
    if plot:
        write_plot(plot, cells, systems, clients_list)
    info = machine()
    info.update(load_start=load_start, load_end=load_average())
    write_report(out, plot, args, command, limits, cells, systems, clients_list, info, started)
    print(f"wrote {out}" + (f" and {plot}" if plot else ""))


if __name__ == "__main__":
    main()
