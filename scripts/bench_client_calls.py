#!/usr/bin/env python3
"""Instructions the plain Client spends per request, counted by callgrind. Not a test.

    .venv/bin/python scripts/bench_client_calls.py [OTHER_SRC] [--cycles 300]

A walqueued runs outside valgrind on a queue in /dev/shm; a client process
runs put, reserve, ack cycles against it under valgrind's callgrind, once
with 100 cycles and once with 100 + ``--cycles``. The difference divided by
the requests between them is the client's own instructions per request
(user space: the kernel's share of each send and recv is not counted),
without its start-up. Instruction counts do not depend on the machine's
load, so two trees compare in one run: OTHER_SRC is another tree's ``src``
(``git archive REV src | tar -x -C /tmp/base``, plus the built extension).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from profile_daemon import start_daemon, stop_daemon  # scripts/ is this script's own directory

ROOT = Path(__file__).resolve().parent.parent
SHORT_CYCLES = 100

CLIENT = """
import sys
from walqueue.client import Client
socket_path, cycles, tag = sys.argv[1], int(sys.argv[2]), sys.argv[3]
with Client(socket_path, name="bench") as client:
    for i in range(cycles):
        client.put(f"{tag}-{i}", {"data": "x" * 100})
        (lease,) = client.reserve("bench", lease_seconds=60)
        client.ack(lease)
"""


def instructions(src: str, cycles: int) -> float:
    """The client's instructions per request with the tree at `src`, daemon and client alike."""
    env = dict(os.environ, PYTHONPATH=os.path.abspath(src), PYTHONHASHSEED="1")
    directory = tempfile.mkdtemp(prefix="bench-client-calls-", dir="/dev/shm")
    queue = os.path.join(directory, "q")
    socket_path = os.path.join(queue, "walqueued.sock")
    daemon = start_daemon(queue, ["-m", "walqueue.daemon.cli"], env)
    try:
        counts = []
        for run, run_cycles in enumerate((SHORT_CYCLES, SHORT_CYCLES + cycles)):
            done = subprocess.run(
                ["valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null", sys.executable,
                 "-c", CLIENT, socket_path, str(run_cycles), f"run{run}"],
                env=env, capture_output=True, text=True, timeout=1800)
            found = re.search(r"Collected : (\d+)", done.stderr)
            if done.returncode != 0 or found is None:
                raise SystemExit(f"the client under callgrind failed:\n{done.stderr[-2000:]}")
            counts.append(int(found.group(1)))
    finally:
        stop_daemon(daemon)
        shutil.rmtree(directory, ignore_errors=True)
    return (counts[1] - counts[0]) / (3 * cycles)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other_src", nargs="?", help="another tree's src, measured first")
    parser.add_argument("--cycles", type=int, default=300, help="the cycles between the two runs")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        raise SystemExit("needs valgrind (apt-get install valgrind)")
    trees = ([("other", args.other_src)] if args.other_src else []) + [("this", str(ROOT / "src"))]
    print(f"plain Client, put + reserve + ack: instructions per request of the client process "
          f"under callgrind ({args.cycles} cycles)")
    for label, src in trees:
        print(f"  {label:>5} {os.path.abspath(src)}: {instructions(src, args.cycles):,.0f}", flush=True)


if __name__ == "__main__":
    main()
