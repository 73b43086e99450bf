"""A seeded worker process for the backup tests: ``python -m tests.process.backup_load SOCKET WORKER SEED COUNT``.

Makes random requests (puts, reserves with short and long leases, acks,
releases with delays, touches), one at a time, so the WAL gets every kind of
record, expiries included, until its stdin is closed (or after ``COUNT``, a
bound for a test that forgot it): the test, not the speed of this process
against the others, decides how long the load lasts. Prints {"requests": N}
at the end.
"""

import json
import random
import select
import sys

from walqueue import StaleLease
from walqueue.client import Client


def main(path: str, worker: str, seed: str, count: str) -> None:
    rng = random.Random(f"{seed}/{worker}")
    held = []
    made = 0
    with Client(path, retry_seconds=0, name=worker) as client:
        for index in range(int(count)):
            if select.select([sys.stdin], [], [], 0)[0]:
                break  # stdin readable: at its end, the test says stop
            made += 1
            choice = rng.random()
            if not held and choice >= 0.7:
                choice = rng.random() * 0.7  # nothing held to finish: put or reserve
            if choice < 0.4:
                client.put(f"{worker}-{index:05d}", {"worker": worker, "index": index},
                           max_attempts=rng.randint(1, 3))
            elif choice < 0.7:
                held += client.reserve(worker, lease_seconds=rng.choice([1, 60]), limit=rng.randint(1, 3))
            else:
                lease = held.pop(rng.randrange(len(held)))
                try:
                    action = rng.random()
                    if action < 0.6:
                        client.ack(lease)
                    elif action < 0.85:
                        client.release(lease, delay=rng.choice([0, 1, 3600]))
                    else:
                        held.append(client.touch(lease, lease_seconds=60))
                except StaleLease:
                    pass  # its 1 s lease expired: another worker may hold it now
    print(json.dumps({"requests": made}), flush=True)


if __name__ == "__main__":
    main(*sys.argv[1:])
