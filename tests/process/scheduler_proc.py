"""`walqueue-scheduler` for the tests: optionally a deliberately broken variant, optionally held
at a start gate so that several schedulers begin at the same moment.

python -m tests.process.scheduler_proc TARGET FILE [OPTIONS]

- WALQUEUE_SCHEDULER_BROKEN=NAME: run the variant NAME of tests/scheduler_broken.py.
- WALQUEUE_TEST_START_GATE=FIFO: after the imports (the slow part of a start), open
  FIFO, say "gate: waiting" on stderr, and wait (at most GATE_SECONDS) for one byte
  from it before running. The test holds the FIFO open for reading and writing, so
  the open does not block, and writes one byte per scheduler to let them all go.
"""

import os
import select
import sys

from tests import scheduler_broken
from walqueue.schedule import cli

GATE_SECONDS = 60.0


def wait_at_the_gate(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        print("gate: waiting", file=sys.stderr, flush=True)
        readable, _, _ = select.select([fd], [], [], GATE_SECONDS)
        if not readable or not os.read(fd, 1):
            sys.exit(f"gate: nobody opened {path} within {GATE_SECONDS} s")
    finally:
        os.close(fd)


if __name__ == "__main__":
    gate = os.environ.get("WALQUEUE_TEST_START_GATE")
    if gate:
        wait_at_the_gate(gate)
    with scheduler_broken.active(os.environ.get("WALQUEUE_SCHEDULER_BROKEN") or None):
        cli.main(prog_name="walqueue-scheduler")
