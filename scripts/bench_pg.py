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
and all its backends, in cores), and after the run the dead tuples
(pg_stat_user_tables.n_dead_tup) and total size of each table. Prints a
Markdown table. The numbers depend on the machine and its load: say so
when you quote them.

    .venv/bin/python scripts/bench_pg.py [--clients 1,4,16] [--seconds 5] [--systems ...]
        [--not-durable]    # fsync off: where the CPU, not the disk, is the limit
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import os
import platform
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
        leases = client.reserve(name, lease_seconds=LEASE_SECONDS)
        if not leases:
            raise RuntimeError("walqueue.pg: nothing to reserve")
        for lease in leases:
            client.ack(lease)
        return 1

    return cycle


def walqueue_ack_next_cycle(dsn: str) -> Callable[[], int]:
    from walqueue.pg import Client

    name = f"w{os.getpid()}"
    client = Client(dsn, queue="bench", migrate=False, pool_size=1, reaper=False)
    counter = iter(range(1 << 62))
    held = []

    def cycle() -> int:
        client.put(f"{name}-{next(counter):010d}", PAYLOAD)
        if held:
            leases = client.ack_and_reserve(held.pop(), lease_seconds=LEASE_SECONDS)
        else:
            leases = client.reserve(name, lease_seconds=LEASE_SECONDS)
        if not leases:
            raise RuntimeError("walqueue.pg: nothing to reserve")
        held.extend(leases)
        return 1

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
        if job is None:
            raise RuntimeError("procrastinate: nothing to fetch")
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


def client_loop(system: str, dsn: str, warmup: float, seconds: float, barrier, results) -> None:
    cycle = SYSTEMS[system][1](dsn)
    started = time.monotonic()
    while time.monotonic() - started < warmup:
        cycle()
    barrier.wait()
    latencies, tasks = [], 0
    started = time.monotonic()
    while time.monotonic() - started < seconds:
        t0 = time.perf_counter()
        done = cycle()
        elapsed = time.perf_counter() - t0
        tasks += done
        latencies.extend([elapsed / max(done, 1)] * max(done, 1) if done > 1 else [elapsed])
    results.put((tasks, time.monotonic() - started, latencies))


def table_figures(dsn: str) -> list[tuple[str, int, int]]:
    """(table, n_dead_tup, total bytes) of every user table, after stats are flushed."""
    import psycopg

    time.sleep(1.5)  # backends flush their table statistics at most once a second
    with psycopg.connect(dsn, autocommit=True) as connection:
        return connection.execute(
            "SELECT schemaname || '.' || relname, n_dead_tup, pg_total_relation_size(relid) "
            "FROM pg_stat_user_tables WHERE n_live_tup + n_dead_tup > 0 "
            "ORDER BY pg_total_relation_size(relid) DESC").fetchall()


def one_run(server, system: str, clients: int, warmup: float, seconds: float) -> dict:
    import psycopg

    database = f"bench_{abs(hash((system, clients, time.time()))) % 10**8}"
    with psycopg.connect(server.dsn, autocommit=True) as connection:
        connection.execute(f'CREATE DATABASE "{database}"')
    dsn = server.dsn.replace("dbname=postgres", f"dbname={database}")
    processes = []
    try:
        SYSTEMS[system][0](dsn)
        barrier = multiprocessing.Barrier(clients + 1)
        results = multiprocessing.Queue()
        processes = [multiprocessing.Process(target=client_loop,
                                             args=(system, dsn, warmup, seconds, barrier, results))
                     for _ in range(clients)]
        for process in processes:
            process.start()
        barrier.wait(warmup + 120)
        cpu_before, window_start = server_cpu_seconds(server.pid), time.monotonic()
        gathered = [results.get(timeout=seconds + 120) for _ in processes]
        window = time.monotonic() - window_start
        cpu = (server_cpu_seconds(server.pid) - cpu_before) / window
        for process in processes:
            process.join(30)
        tables = table_figures(dsn)
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
    return {"rate": tasks / elapsed, "p50": percentile(latencies, 0.5),
            "p99": percentile(latencies, 0.99), "cpu": cpu, "tables": tables}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--clients", default="1,4,16")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--warmup", type=float, default=1.0)
    parser.add_argument("--runs", type=int, default=1, help="runs per cell; the median is shown")
    parser.add_argument("--systems", default=",".join(SYSTEMS))
    parser.add_argument("--not-durable", action="store_true",
                        help="fsync=off, synchronous_commit=off: the CPU-bound ceiling, not a result "
                             "to compare with durable systems")
    args = parser.parse_args()
    from tests.postgres import PostgresServer

    clients_list = [int(value) for value in args.clients.split(",")]
    systems = [name.strip() for name in args.systems.split(",")]
    server = PostgresServer(fsync=not args.not_durable, settings={"max_connections": "300"})
    durability = "fsync=off, synchronous_commit=off (NOT durable)" if args.not_durable else \
        "fsync=on, synchronous_commit=on"
    rows, bloat = [], []
    try:
        server.start()
        for clients in clients_list:
            for system in systems:
                runs = [one_run(server, system, clients, args.warmup, args.seconds)
                        for _ in range(args.runs)]
                best = sorted(runs, key=lambda run: run["rate"])[len(runs) // 2]
                rows.append((system, clients, statistics.median(run["rate"] for run in runs), best))
                bloat.append((system, clients, best["tables"]))
                print(f"{system} x{clients}: {best['rate']:,.0f}/s", file=sys.stderr, flush=True)
    finally:
        server.cleanup()
    print(f"machine: {platform.node()}, {os.cpu_count()} CPUs, load average "
          f"{' '.join(f'{value:.2f}' for value in os.getloadavg())} at the end; PostgreSQL "
          f"{durability}; {args.seconds} s per cell after {args.warmup} s warm-up, "
          f"median of {args.runs}\n")
    print("| system | clients | cycles/s | p50 ms | p99 ms | server CPU (cores) |")
    print("|---|---:|---:|---:|---:|---:|")
    for system, clients, rate, best in rows:
        print(f"| {system} | {clients} | {rate:,.0f} | {best['p50'] * 1e3:.2f} | "
              f"{best['p99'] * 1e3:.2f} | {best['cpu']:.2f} |")
    by_cell = {(system, clients): rate for system, clients, rate, _ in rows}
    peer = "procrastinate defer+fetch+finish"
    print()
    for clients in clients_list:
        if (peer, clients) not in by_cell:
            continue
        for system in systems:
            if system != peer and (system, clients) in by_cell:
                print(f"- {clients} clients: {system} = {by_cell[system, clients] / by_cell[peer, clients]:.2f}x procrastinate")
    print("\nTables after each run (n_dead_tup, total size):\n")
    for system, clients, tables in bloat:
        listing = ", ".join(f"{name} {dead:,} dead / {size / 1024:,.0f} KiB" for name, dead, size in tables[:5])
        print(f"- {system} x{clients}: {listing}")


if __name__ == "__main__":
    main()
