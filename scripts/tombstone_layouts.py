#!/usr/bin/env python3
"""What a tombstone costs in each in-memory layout considered for issue 11. Not a test.

    .venv/bin/python scripts/tombstone_layouts.py              # 1,000,000 tombstones
    .venv/bin/python scripts/tombstone_layouts.py --count 100000

Each layout holds N completed tasks (17-character ids, key = id) in a fresh
child process; the figures are its resident set after gc.collect() minus
the same process's before filling, per tombstone, plus the CPU time of N
inserts in id order and of N lookups of ids that are not there (what every
put of a new task asks), and the memory a fork()ed child copies from the
parent while it walks them all in id order as a snapshot writer would
(the growth of its Private_Dirty in /proc/self/smaps_rollup). Layouts:

  task-objects   what the library kept before: a Task (13 slots, hex identity)
                 in the tasks dict, and its key in task_id_by_key
  tuple-in-dict  id -> (key or None, 32-byte identity, 4 counters) in one dict
  bytes-in-dict  id -> one packed bytes record (key, identity, counters) in one dict
  blocks         walqueue.tombstones.TombstoneStore (what the library keeps now)
"""

from __future__ import annotations

import argparse
import gc
import hashlib
import json
import os
import struct
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "src"))
PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")
LAYOUTS = ("task-objects", "tuple-in-dict", "bytes-in-dict", "blocks")
_RECORD = struct.Struct("<qqqq32s")


def resident_bytes() -> int:
    gc.collect()
    with open("/proc/self/statm") as statm:
        return int(statm.read().split()[1]) * PAGE_BYTES


def measure(layout: str, count: int) -> dict:
    from walqueue.state import COMPLETED, Task
    from walqueue.tombstones import TombstoneStore
    identity = hashlib.sha256(b"x").digest()
    before = resident_bytes()
    # Each id is made as it is stored, so a layout that keeps it pays for it.
    ids = (f"task-{i:012d}" for i in range(count))
    started = time.process_time()
    if layout == "task-objects":
        tasks, keys = {}, {}
        for task_id in ids:
            tasks[task_id] = Task(task_id, task_id, identity.hex(), COMPLETED, 1, 3, 1, 0,
                                  None, None, None)
            keys[task_id] = task_id
        find = tasks.get
        walk = lambda: [tasks[task_id].entry() for task_id in sorted(tasks)]  # noqa: E731
    elif layout in ("tuple-in-dict", "bytes-in-dict"):
        if layout == "tuple-in-dict":
            tasks = {task_id: (None, identity, 1, 3, 1, 0) for task_id in ids}
        else:
            tasks = {task_id: _RECORD.pack(1, 3, 1, 0, identity) for task_id in ids}
        find = tasks.get
        walk = lambda: [tasks[task_id] for task_id in sorted(tasks)]  # noqa: E731
    else:
        store = TombstoneStore()
        for task_id in ids:
            store.add(task_id, task_id, identity, 1, 3, 1, 0)
        find = store.get
        walk = lambda: sum(1 for _ in store.frozen().bodies())  # noqa: E731
    insert_seconds = time.process_time() - started
    after = resident_bytes()
    misses = [f"miss-{i:012d}" for i in range(count)]
    started = time.process_time()
    for task_id in misses:
        find(task_id)
    lookup_seconds = time.process_time() - started
    return {"layout": layout, "bytes_per_tombstone": (after - before) / count,
            "insert_us": insert_seconds / count * 1e6, "miss_lookup_us": lookup_seconds / count * 1e6,
            "forked_walk_copied_bytes": forked_walk_copied_bytes(walk)}


def private_dirty_bytes() -> int:
    with open("/proc/self/smaps_rollup") as rollup:
        for line in rollup:
            if line.startswith("Private_Dirty:"):
                return int(line.split()[1]) * 1024
    raise RuntimeError("no Private_Dirty in /proc/self/smaps_rollup")


def forked_walk_copied_bytes(walk) -> int:
    """How much a fork()ed child's private dirty memory grows while it runs `walk`."""
    gc.collect()
    gc.freeze()   # as a daemon would before forking: the child's collector leaves them alone
    reader, writer = os.pipe()
    child = os.fork()
    if child == 0:
        before = private_dirty_bytes()
        walk()
        os.write(writer, str(private_dirty_bytes() - before).encode())
        os._exit(0)
    os.close(writer)
    os.waitpid(child, 0)
    with os.fdopen(reader) as answer:
        return int(answer.read())


def main(argv: list[str]) -> int:
    if argv[:1] == ["child"]:
        print(json.dumps(measure(argv[1], int(argv[2]))))
        return 0
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    args = parser.parse_args(argv)
    print(f"| layout ({args.count:,} tombstones) | RSS per tombstone | insert, CPU | "
          f"lookup of an absent id, CPU | a fork()ed child's private memory growth walking them |\n"
          f"|---|---:|---:|---:|---:|")
    for layout in LAYOUTS:
        done = subprocess.run([sys.executable, __file__, "child", layout, str(args.count)],
                              capture_output=True, text=True, check=True)
        row = json.loads(done.stdout)
        print(f"| {layout} | {row['bytes_per_tombstone']:.0f} B | {row['insert_us']:.2f} µs "
              f"| {row['miss_lookup_us']:.2f} µs "
              f"| {row['forked_walk_copied_bytes'] / args.count:.1f} B per tombstone |")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
