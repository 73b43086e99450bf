#!/usr/bin/env python3
"""Benchmark: WALQueue on PostgreSQL beside procrastinate, on one throwaway server.

Starts a PostgreSQL cluster of its own (tests/postgres.py: initdb in a temp
directory, Unix socket only) with durable settings — fsync=on,
synchronous_commit=on — and, for each system and client count, a fresh
database, then runs closed-loop cycles of a 100-byte task in N client
processes (1, 4, 16 by default) for a few seconds after a warm-up:

- `walqueue.pg put+reserve+ack`: put, reserve, ack (three transactions);
- `walqueue.pg put+ack_and_reserve`: put, then ack the task in hand and
  reserve the next in one call (two transactions);
- `walqueue.pg limit=10`: put_many of 10, reserve limit=10, 10 acks
  (a "cycle" is one task, so the rate is tasks/s);
- `procrastinate defer+fetch+finish`: defer a job, fetch it as a worker
  does, finish it (three transactions), procrastinate's own API.

For each: cycles/s, p50/p99 of a cycle, the server's CPU (the postmaster
and all its backends, in cores), CPU per cycle of the clients and of the
server (utime+stime, microseconds: on a busy machine these move far less
than cycles/s), transactions per cycle (pg_stat_database; for walqueue.pg
every call is one statement in autocommit, so this is also its round trips
per cycle), and after the run the dead tuples
(pg_stat_user_tables.n_dead_tup) and total size of each table. Prints a
Markdown table. The numbers depend on the machine and its load: say so
when you quote them.

    .venv/bin/python scripts/bench_pg.py [--clients 1,4,16] [--seconds 5] [--systems ...]
        [--not-durable]    # fsync off: where the CPU, not the disk, is the limit
        [--baseline DIR]   # A/B: also run walqueue.pg from another src/ tree, alternately

`--baseline` takes a copy of an older `src/` (`git archive COMMIT src | tar -x
-C /tmp/base`, then `--baseline /tmp/base/src`); each cell then runs the
baseline and this checkout alternately (A B B A ...) and shows both.
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
import resource
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(REPO / "src"), str(REPO)]

PAYLOAD = {"data": "x" * 100}
LEASE_SECONDS = 60


def percentile(values: list[float], fraction: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(fraction * len(ordered)))] if ordered else float("nan")


def server_cpu_seconds(postmaster: int) -> float:
    """CPU seconds of the postmaster, its live backends and the backends it has reaped.

    Backends that exit during a run (short connections) are counted through
    the postmaster's cutime/cstime, so the figure never goes backwards.
    """
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            fields = Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()
        except (FileNotFoundError, ProcessLookupError, IndexError):
            continue
        pid, parent = int(entry), int(fields[1])
        if pid == postmaster:
            total += sum(int(value) for value in fields[11:15])  # utime stime cutime cstime
        elif parent == postmaster:
            total += int(fields[11]) + int(fields[12])
    return total / ticks


# -- the systems: each a factory of cycle() in a client process -------------------------


def walqueue_cycle(dsn: str) -> Callable[[], int]:
    from walqueue.pg import Client

    name = f"w{os.getpid()}"
    client = Client(dsn, queue="bench", migrate=False, pool_size=1, reaper=False)
    counter = iter(range(1 << 62))

    def cycle() -> int:
        client.put(f"{name}-{next(counter):010d}", PAYLOAD)
        # SKIP LOCKED may pass over every ready row another transaction holds: then
        # this cycle completes nothing, and the task put waits for a later reserve.
        leases = client.reserve(name, lease_seconds=LEASE_SECONDS)
        for lease in leases:
            client.ack(lease)
        return len(leases)

    return cycle


def walqueue_ack_next_cycle(dsn: str) -> Callable[[], int]:
    from walqueue.pg import Client

    name = f"w{os.getpid()}"
    client = Client(dsn, queue="bench", migrate=False, pool_size=1, reaper=False)
    counter = iter(range(1 << 62))
    held = []

    def cycle() -> int:
        client.put(f"{name}-{next(counter):010d}", PAYLOAD)
        if held:  # a cycle: the held task acked, the next one leased
            leases, done = client.ack_and_reserve(held.pop(), lease_seconds=LEASE_SECONDS), 1
        else:  # nothing held: another client took the last ready task; lease one to start again
            leases, done = client.reserve(name, lease_seconds=LEASE_SECONDS), 0
        held.extend(leases)
        return done

    return cycle


def walqueue_batch_cycle(dsn: str) -> Callable[[], int]:
    from walqueue.pg import Client

    name = f"w{os.getpid()}"
    client = Client(dsn, queue="bench", migrate=False, pool_size=1, reaper=False)
    counter = iter(range(1 << 62))

    def cycle() -> int:
        client.put_many([{"task_id": f"{name}-{next(counter):010d}", "payload": PAYLOAD}
                         for _ in range(10)])
        leases = client.reserve(name, lease_seconds=LEASE_SECONDS, limit=10)
        for lease in leases:
            client.ack(lease)
        return len(leases)

    return cycle


def _procrastinate_app(dsn: str):
    import procrastinate

    app = procrastinate.App(connector=procrastinate.PsycopgConnector(conninfo=dsn))

    @app.task(name="bench")
    def bench(data: str) -> None:  # never run: the benchmark fetches and finishes by hand
        return None

    return app, bench


def procrastinate_cycle(dsn: str) -> Callable[[], int]:
    from procrastinate import jobs

    app, bench = _procrastinate_app(dsn)
    loop = asyncio.new_event_loop()
    loop.run_until_complete(app.open_async())
    manager = app.job_manager
    worker_id = loop.run_until_complete(manager.register_worker())

    async def one() -> int:
        await bench.defer_async(data=PAYLOAD["data"])
        job = await manager.fetch_job(queues=None, worker_id=worker_id)
        if job is None:  # as for walqueue.pg: another worker holds every ready job
            return 0
        await manager.finish_job(job, status=jobs.Status.SUCCEEDED, delete_job=False)
        return 1

    return lambda: loop.run_until_complete(one())


def prepare_walqueue(dsn: str) -> None:
    from walqueue.pg import migrate

    migrate(dsn)


def prepare_procrastinate(dsn: str) -> None:
    app, _ = _procrastinate_app(dsn)

    async def apply() -> None:
        async with app.open_async():
            await app.schema_manager.apply_schema_async()

    asyncio.run(apply())


SYSTEMS = {
    "walqueue.pg put+reserve+ack": (prepare_walqueue, walqueue_cycle),
    "walqueue.pg put+ack_and_reserve": (prepare_walqueue, walqueue_ack_next_cycle),
    "walqueue.pg limit=10": (prepare_walqueue, walqueue_batch_cycle),
    "procrastinate defer+fetch+finish": (prepare_procrastinate, procrastinate_cycle),
}


def use_source(src: str | None) -> None:
    """In a fresh process: import walqueue from `src` (a baseline's src/ tree) from now on."""
    if src is not None:
        sys.path.insert(0, src)


def process_cpu_seconds() -> float:
    """utime+stime of this process, all its threads."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def client_loop(system: str, dsn: str, warmup: float, seconds: float, barrier, results,
                src: str | None = None) -> None:
    use_source(src)
    cycle = SYSTEMS[system][1](dsn)
    started = time.monotonic()
    warm_cycles = 0
    while time.monotonic() - started < warmup:
        warm_cycles += cycle()
    barrier.wait()
    latencies, tasks = [], 0
    cpu_before = process_cpu_seconds()
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        t0 = time.perf_counter()
        done = cycle()
        elapsed = time.perf_counter() - t0
        tasks += done
        latencies.extend([elapsed / max(done, 1)] * max(done, 1) if done > 1 else [elapsed])
    results.put((tasks, time.monotonic() - started, latencies, process_cpu_seconds() - cpu_before,
                 warm_cycles))


def prepare(system: str, dsn: str, src: str | None) -> None:
    use_source(src)
    SYSTEMS[system][0](dsn)


def transactions(dsn: str) -> int:
    """Committed and rolled-back transactions of the DSN's database so far."""
    import psycopg

    with psycopg.connect(dsn, autocommit=True) as connection:
        return connection.execute("SELECT xact_commit + xact_rollback FROM pg_stat_database "
                                  "WHERE datname = current_database()").fetchone()[0]


def table_figures(dsn: str) -> list[tuple[str, int, int]]:
    """(table, n_dead_tup, total bytes) of every user table, after stats are flushed."""
    import psycopg

    time.sleep(1.5)  # backends flush their table statistics at most once a second
    with psycopg.connect(dsn, autocommit=True) as connection:
        return connection.execute(
            "SELECT schemaname || '.' || relname, n_dead_tup, pg_total_relation_size(relid) "
            "FROM pg_stat_user_tables WHERE n_live_tup + n_dead_tup > 0 "
            "ORDER BY pg_total_relation_size(relid) DESC").fetchall()


def one_run(server, system: str, clients: int, warmup: float, seconds: float,
            src: str | None = None) -> dict:
    """One cell on a fresh database of `server`: rate, p50/p99 (seconds), server CPU
    (cores), CPU per cycle of clients and server and transactions per cycle, tables.

    walqueue is imported only in child processes (from `src` when given), so
    one parent can run two source trees.
    """
    import psycopg

    database = f"bench_{abs(hash((system, clients, time.time()))) % 10**8}"
    with psycopg.connect(server.dsn, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{database}"')
    dsn = server.dsn.replace("dbname=postgres", f"dbname={database}")
    processes = []
    try:
        preparing = multiprocessing.Process(target=prepare, args=(system, dsn, src))
        preparing.start()
        preparing.join(120)
        if preparing.exitcode != 0:
            raise RuntimeError(f"preparing {system} failed (exit code {preparing.exitcode})")
        transactions_before = transactions(dsn)
        barrier = multiprocessing.Barrier(clients + 1)
        results = multiprocessing.Queue()
        processes = [multiprocessing.Process(target=client_loop,
                                             args=(system, dsn, warmup, seconds, barrier, results,
                                                   src))
                     for _ in range(clients)]
        for process in processes:
            process.start()
        barrier.wait(warmup + 120)
        cpu_before, window_start = server_cpu_seconds(server.pid), time.monotonic()
        gathered = [results.get(timeout=seconds + 120) for _ in processes]
        window = time.monotonic() - window_start
        server_cpu = server_cpu_seconds(server.pid) - cpu_before
        for process in processes:
            process.join(30)
        tables = table_figures(dsn)  # waits for the backends' statistics too
        transactions_during = transactions(dsn) - transactions_before
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(10)
        with psycopg.connect(server.dsn, autocommit=True) as connection:
            connection.execute(f'DROP DATABASE IF EXISTS "{database}" WITH (FORCE)')
    tasks = sum(item[0] for item in gathered)
    elapsed = max(item[1] for item in gathered)
    latencies = [value for item in gathered for value in item[2]]
    all_tasks = tasks + sum(item[4] for item in gathered)
    return {"rate": tasks / elapsed, "p50": percentile(latencies, 0.5),
            "p99": percentile(latencies, 0.99), "latencies": latencies, "cpu": server_cpu / window,
            "client_us": sum(item[3] for item in gathered) / max(tasks, 1) * 1e6,
            "server_us": server_cpu / max(tasks, 1) * 1e6,
            # Warm-up cycles and each client's connect count too (a few per client).
            "transactions": transactions_during / max(all_tasks, 1), "tables": tables}


FIGURES = ("rate", "cpu", "client_us", "server_us", "transactions")


def summary(runs: list[dict]) -> dict:
    """The median of each figure over a cell's runs and the rate's min and max; p50, p99
    and the slowest cycle over every cycle of every run; the tables of its median-rate run."""
    cell = {name: statistics.median(run[name] for run in runs) for name in FIGURES}
    cell["min"] = min(run["rate"] for run in runs)
    cell["max"] = max(run["rate"] for run in runs)
    latencies = [value for run in runs for value in run["latencies"]]
    cell["p50"], cell["p99"] = percentile(latencies, 0.5), percentile(latencies, 0.99)
    cell["slowest"] = max(latencies, default=float("nan"))
    cell["tables"] = sorted(runs, key=lambda run: run["rate"])[len(runs) // 2]["tables"]
    return cell


def run_cells(server, systems: list[str], clients_list: list[int], warmup: float, seconds: float,
              runs: int, baseline: str | None = None) -> dict:
    """{(label, clients): summary}; with `baseline`, each walqueue cell also runs the
    baseline tree (label + " [baseline]"), alternating A B B A ... so that load drifts
    on the machine hit both alike."""
    cells = {}
    for clients in clients_list:
        for system in systems:
            trees = [None, baseline] if baseline and system.startswith("walqueue") else [None]
            gathered: dict = {tree: [] for tree in trees}
            for index in range(runs):
                order = trees if index % 2 == 0 else trees[::-1]
                for tree in order:
                    gathered[tree].append(one_run(server, system, clients, warmup, seconds, tree))
            for tree, tree_runs in gathered.items():
                label = system if tree is None else f"{system} [baseline]"
                cells[label, clients] = summary(tree_runs)
                print(f"{label} x{clients}: {cells[label, clients]['rate']:,.0f}/s", file=sys.stderr,
                      flush=True)
    return cells


def make_server(durable: bool = True, base: Path | None = None):
    """The benchmark's own cluster, not yet started (tests/postgres.py): fsync and
    synchronous_commit on unless `durable` is False, room for 16 clients and their pools.
    `base` is the directory it lives in (default: a new one in /tmp). The caller
    starts it and calls cleanup(), which stops it by pid and removes the directory."""
    from tests.postgres import PostgresServer

    return PostgresServer(fsync=durable, settings={"max_connections": "300"}, base=base)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=1, help="runs per cell; the medians are shown")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--baseline", help="another src/ tree to run beside this one (A/B)")
    parser.add_argument("--not-durable", action="store_true",
                        help="fsync=off, synchronous_commit=off: the CPU-bound ceiling, not a result "
                             "to compare with durable systems")
    args = parser.parse_args()
    clients_list = [int(value) for value in args.clients.split(",")]
    systems = [name.strip() for name in args.systems.split(",")]
    server = make_server(durable=not args.not_durable)
    durability = "fsync=off, synchronous_commit=off (NOT durable)" if args.not_durable else \
        "fsync=on, synchronous_commit=on"
    try:
        server.start()
        cells = run_cells(server, systems, clients_list, args.warmup, args.seconds, args.runs,
                          args.baseline)
    finally:
        server.cleanup()
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{value:.2f}' for value in os.getloadavg())} at the end; PostgreSQL "
          f"{durability}; {args.seconds} s per cell after {args.warmup} s warm-up, "
          f"median of {args.runs}\n")
    print("| system | clients | cycles/s | p50 ms | p99 ms | server CPU (cores) "
          "| client CPU µs/cycle | server CPU µs/cycle | transactions/cycle |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|")
    for (label, clients), cell in cells.items():
        print(f"| {label} | {clients} | {cell['rate']:,.0f} | {cell['p50'] * 1e3:.2f} | "
              f"{cell['p99'] * 1e3:.2f} | {cell['cpu']:.2f} | {cell['client_us']:,.0f} | "
              f"{cell['server_us']:,.0f} | {cell['transactions']:.2f} |")
    peer = "procrastinate defer+fetch+finish"
    print()
    for (label, clients), cell in cells.items():
        if label != peer and (peer, clients) in cells:
            print(f"- {clients} clients: {label} = {cell['rate'] / cells[peer, clients]['rate']:.2f}x "
                  f"procrastinate")
    print("\nTables after each cell's median run (n_dead_tup, total size):\n")
    for (label, clients), cell in cells.items():
        listing = ", ".join(f"{name} {dead:,} dead / {size / 1024:,.0f} KiB"
                            for name, dead, size in cell["tables"][:5])
        print(f"- {label} x{clients}: {listing}")


if __name__ == "__main__":
    main()
