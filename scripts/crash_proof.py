"""Run the real-kill crash proof over many seeds and print one summary line.

    .venv/bin/python scripts/crash_proof.py --seeds 100 [--start 0] [--jobs 3]

Each seed runs walqueued as a child process, SIGKILLs it at seeded phases
(through tests/process/kill_hook.py) or at seeded moments while worker
processes use it, restarts it on the same directory after every kill, drains
the queue and checks the directory and the workers' logs
(tests/process/crash_harness.py, tests/process/checker.py). Seeds run
``--jobs`` at a time: a seed spends most of its time waiting for leases to
expire, so a few run side by side even on two cores.

``--broken VARIANT`` runs the daemons on one of the deliberately broken
libraries of tests/broken.py (or a broken daemon of
tests/process/broken_hook.py), to watch the proof go red.

Exit status: 0 when every seed held with zero violations, 1 otherwise. Every
failed seed is printed with its schedule, its violations, the directory that
was kept and the command that replays it::

    .venv/bin/python scripts/crash_proof.py --seeds 1 --start SEED
"""

from __future__ import annotations

import argparse
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "src"), str(REPO)]

from tests.process.crash_harness import Summary, run_seed  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seeds", type=int, required=True, help="how many seeds to run")
    parser.add_argument("--start", type=int, default=0, help="the first seed")
    parser.add_argument("--jobs", type=int, default=3, help="seeds run side by side")
    parser.add_argument("--quiet", action="store_true", help="no line per seed")
    parser.add_argument("--broken", default=None, metavar="VARIANT",
                        help="run the daemons on a deliberately broken library (tests/broken.py) or daemon "
                             "(DAEMON_VARIANTS in tests/process/broken_hook.py); "
                             "the run is then expected to FAIL")
    args = parser.parse_args(argv)
    if args.seeds < 1 or args.jobs < 1:
        parser.error("--seeds and --jobs must be at least 1")
    started = time.monotonic()
    summary = Summary()
    seeds = range(args.start, args.start + args.seeds)
    with ThreadPoolExecutor(args.jobs) as pool:
        for result in pool.map(lambda seed: run_seed(seed, broken=args.broken), seeds):
            summary.add(result)
            if not args.quiet:
                print(f"seed {result.seed}: kills={result.kills} operations={result.operations} "
                      f"tasks={result.tasks} {'ok' if result.ok else 'FAILED'} ({result.seconds:.1f} s)",
                      file=sys.stderr, flush=True)
            if not result.ok:
                print(result.report(), flush=True)
    print(f"{summary.line()} seconds={time.monotonic() - started:.0f}")
    if summary.failed_seeds:
        print(f"FAILED seeds: {summary.failed_seeds}; replay one with: "
              f"{sys.executable} scripts/crash_proof.py --seeds 1 --start {summary.failed_seeds[0]}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
