"""Client programs the process tests run in separate processes.

``python -m tests.process.clientproc MODE SOCKET ...``; results go to stdout
as JSON lines, so a test can read what was answered before a crash.
"""

import json
import sys
import time

from walqueue import protocol as p
from walqueue.client import Client, Connection


def puts(path: str, prefix: str, count: str) -> None:
    """Sequential puts; prints each id once its answer arrived (i.e. it is durable)."""
    with Client(path, retry_seconds=0) as client:
        for index in range(int(count)):
            task_id = client.put(f"{prefix}-{index:05d}", {"index": index})
            print(json.dumps(task_id), flush=True)


def pipelined_puts(path: str, prefix: str, count: str) -> None:
    """Send ``count`` puts in one write, then read every answer."""
    connection = Connection(path)
    requests = [p.Put(id=0, task_id=f"{prefix}-{index:05d}", payload={"index": index})
                for index in range(int(count))]
    ids = connection.send(*requests)
    answered = [connection.receive(request_id)[0].task_id for request_id in ids]
    connection.close()
    print(json.dumps(answered), flush=True)


def reserve(path: str, worker: str, wait: str, lease_seconds: str = "30") -> None:
    with Client(path) as client:
        started = time.monotonic()
        leases = client.reserve(worker, wait=float(wait), lease_seconds=int(lease_seconds))
        elapsed = time.monotonic() - started
    print(json.dumps({"task_ids": [lease.task_id for lease in leases], "elapsed": elapsed}), flush=True)


def logged_cycles(path: str, worker: str) -> None:
    """put + reserve + ack until killed, printing each answered write as it is answered."""
    from walqueue.client import DaemonUnavailable

    with Client(path, retry_seconds=0) as client:
        index = 0
        while True:
            index += 1
            try:
                task_id = client.put(f"{worker}-{index:06d}", {"n": index})
                print(json.dumps(["put", task_id]), flush=True)
                for lease in client.reserve(worker, lease_seconds=60):
                    client.ack(lease)
                    print(json.dumps(["ack", lease.task_id]), flush=True)
            except DaemonUnavailable:
                return


def cycles(path: str, worker: str, count: str) -> None:
    """put + reserve + ack, ``count`` times, one request at a time."""
    with Client(path) as client:
        done = 0
        for index in range(int(count)):
            client.put(f"{worker}-{index:06d}", {"n": index})
            for lease in client.reserve(worker, lease_seconds=60):
                client.ack(lease)
                done += 1
    print(json.dumps({"acked": done}), flush=True)


def work(path: str, worker: str, count: str, lease_seconds: str) -> None:
    """Run walqueue.worker for ``count`` tasks; payload {"sleep": s} or {"fail": true}."""
    from walqueue.worker import Worker

    def handler(lease):
        time.sleep(lease.payload.get("sleep", 0))  # stands for a long job
        if lease.payload.get("fail"):
            raise RuntimeError(f"task {lease.task_id} failed on purpose")

    runner = Worker(path, worker, handler, lease_seconds=int(lease_seconds), wait=10,
                    backoff=lambda attempts: 0)
    handled = runner.run(max_tasks=int(count))
    print(json.dumps({"handled": handled, "processed": runner.processed, "failed": runner.failed}),
          flush=True)


if __name__ == "__main__":
    globals()[sys.argv[1]](*sys.argv[2:])
