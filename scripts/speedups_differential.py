#!/usr/bin/env python3
"""The long differential run of walqueue._speedups against the pure reference (issue 22).

Seeded random cases (tests/speedups_cases.py: frame walks of random and
damaged buffers, snapshot loads of random and rule-breaking entries, snapshot
writes of random states), each run both ways in this process; every
difference is printed with its case number (rerun one: --seed S --start N
--count 1). tests/unit/test_speedups.py runs a few thousand of the same in
the suite. Exit 1 if any case differs, 2 if the extension is not built.

    .venv/bin/python scripts/speedups_differential.py --count 1000000 --seed 22

With --replay, a case is instead one run of 120 records of random WAL traffic
applied by State.apply and by its compiled twin (tests/replay_cases.py,
compared after every record), then the same records through the writer's
pair, State.check and State.commit against the twin's (the Engine's path);
case N of seed S is random.Random(S * 1000003 + N) for each:

    .venv/bin/python scripts/speedups_differential.py --replay --count 10000 --seed 22
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from collections import Counter
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from tests.replay_cases import replay_differs, writer_differs  # noqa: E402
from tests.speedups_cases import LONG_RUN_MIX, check_case  # noqa: E402
from walqueue import speedups  # noqa: E402

REPLAY_RECORDS = 120


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--count", type=int, default=1_000_000)
    parser.add_argument("--seed", type=int, default=22)
    parser.add_argument("--start", type=int, default=0, help="skip this many cases first")
    parser.add_argument("--report-every", type=int, default=100_000)
    parser.add_argument("--replay", action="store_true",
                        help="compare State.apply with its compiled twin instead")
    args = parser.parse_args()
    if not speedups.COMPILED:
        print(f"nothing to compare: {speedups.describe()}", file=sys.stderr)
        return 2
    if args.replay:
        differences, elapsed = compare(replay_cases(args), args.report_every)
        what = f"{args.count} replay cases ({args.count * REPLAY_RECORDS} records, applied and written)"
    else:
        kinds = Counter()
        differences, elapsed = compare(frame_cases(args, kinds), args.report_every)
        what = f"{args.count} cases ({dict(kinds)})"
    print(f"seed {args.seed}: {what}, {differences} differences, {elapsed:.0f} s; "
          f"{speedups.describe()}")
    return 1 if differences else 0


def frame_cases(args, kinds: Counter):
    """(case number, label, difference) of the frame-walk, snapshot and write cases."""
    rng = random.Random(args.seed)
    for index in range(args.start + args.count):
        kind, difference = check_case(rng, LONG_RUN_MIX)
        if index >= args.start:
            kinds[kind] += 1
            yield index, f" ({kind})", difference


def replay_cases(args):
    """(case number, label, difference) of the replay cases: each has its own seed."""
    for index in range(args.start, args.start + args.count):
        seed = args.seed * 1_000_003 + index
        if (difference := replay_differs(random.Random(seed), REPLAY_RECORDS)) is not None:
            yield index, " (applied)", difference
        else:
            yield index, " (written)", writer_differs(random.Random(seed), REPLAY_RECORDS)


def compare(cases, report_every: int) -> tuple[int, float]:
    """Print each difference and the progress; (differences, seconds)."""
    differences, started = 0, time.perf_counter()
    for done, (index, label, difference) in enumerate(cases, 1):
        if difference is not None:
            differences += 1
            print(f"case {index}{label}: {difference}", flush=True)
        if done % report_every == 0:
            print(f"{done} cases, {differences} differences, {time.perf_counter() - started:.0f} s",
                  flush=True)
    return differences, time.perf_counter() - started


if __name__ == "__main__":
    sys.exit(main())
