"""The checker of the PostgreSQL load tests: the workers' logs against the final tables.

A twin of tests/process/checker.py for a backend without our WAL: it reads
the JSON-lines logs of tests/pg/load_worker.py and the queue's final state
(every TaskView, read through a Client after the run) and returns a list of
violations, each a sentence naming the task and generation; empty means:

1. No lost answered write: every put answered ok exists with its payload
   (unless completed); every ack answered ok (alone or in ack_and_reserve)
   left the task completed at exactly that generation; a release answered
   ok left it no longer leased at that generation.
2. No phantom: every task in the queue was put by some worker.
3. A generation is handed out once: no two reserves answered the same
   (task, generation).
4. No task leased twice at once: when generation g+1 of a task was
   answered, lease g had ended — its deadline (the latest a touch answered)
   was at or before g+1's reserve time (deadline minus lease_seconds, both
   server times), or a release of g (answered ok, or unknown) began before
   g+1's reserve returned.
5. A completed task never runs again: no reserve answered a generation
   above the one it completed at.
6. A StaleLease changed nothing: an ack refused at (task, g) and not also
   answered ok or unknown for g did not complete the task at g; the
   generation it reports is never below the lease's.
7. Counters agree: attempts equal generation (the workload never revives);
   without faults, every generation of every task was answered to a reserve
   (with faults, a reserve whose answer was lost may explain one).
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Iterable
from pathlib import Path

MAX_VIOLATIONS = 30


def read_logs(paths: Iterable[str | Path]) -> list[dict]:
    entries = []
    for path in paths:
        if not Path(path).exists():
            continue  # a worker that has not started yet
        lines = Path(path).read_text().splitlines()
        for line in lines:
            try:
                entries.append(json.loads(line))
            except json.JSONDecodeError:
                if line is not lines[-1]:
                    raise
                # a line being written while a running load is read
    return entries


def _leases_answered(entries: list[dict]):
    """(task_id, generation) -> (entry, deadline, attempts) for every lease answered ok."""
    for entry in entries:
        if entry["outcome"] == "ok" and entry["op"] in ("reserve", "ack_and_reserve"):
            for task_id, generation, deadline, attempts in entry["leases"]:
                yield task_id, generation, deadline, attempts, entry


def check(entries: list[dict], tasks: dict, *, faults: bool = False) -> list[str]:
    """Violations of the claims above; `tasks` maps task_id -> TaskView (the final state)."""
    problems: list[str] = []

    def problem(text: str) -> None:
        if len(problems) < MAX_VIOLATIONS:
            problems.append(text)

    put_ok, put_any = {}, set()
    for entry in entries:
        if entry["op"] in ("put", "put_many"):
            for task_id, payload in entry["tasks"]:
                put_any.add(task_id)
                if entry["outcome"] == "ok":
                    put_ok[task_id] = payload
    for task_id, payload in put_ok.items():
        view = tasks.get(task_id)
        if view is None:
            problem(f"lost put: {task_id!r} was answered ok but is not in the queue")
        elif view.status != "completed" and view.payload != payload:
            problem(f"{task_id!r} holds payload {view.payload!r}, put with {payload!r}")
    for task_id in tasks:
        if task_id not in put_any:
            problem(f"phantom task {task_id!r}: no worker put it")

    leases: dict[str, dict[int, tuple]] = defaultdict(dict)
    for task_id, generation, deadline, _attempts, entry in _leases_answered(entries):
        if generation in leases[task_id]:
            other = leases[task_id][generation][1]
            problem(f"{task_id!r} generation {generation} was answered to two reserves "
                    f"({other['worker']} and {entry['worker']})")
        leases[task_id][generation] = (deadline, entry)

    touched = defaultdict(list)   # (task, g) -> deadlines answered to touches
    ends = defaultdict(list)      # (task, g) -> entries of releases answered ok or unknown
    acks_ok, acks_maybe, acks_refused = {}, set(), []
    for entry in entries:
        op, outcome = entry["op"], entry["outcome"]
        if op not in ("ack", "ack_and_reserve", "release", "touch"):
            continue
        lease = (entry["task_id"], entry["generation"])
        if op == "touch" and outcome == "ok":
            touched[lease].append(entry["deadline"])
        elif op == "release" and outcome in ("ok", "unknown"):
            ends[lease].append(entry)
            if outcome == "ok":
                view = tasks.get(lease[0])
                if view is not None and view.status == "leased" and view.generation == lease[1]:
                    problem(f"lost release: {lease[0]!r} is still leased at generation {lease[1]}")
        elif op in ("ack", "ack_and_reserve"):
            if outcome == "ok":
                acks_ok[lease] = entry
            elif outcome == "unknown":
                acks_maybe.add(lease)
            elif entry.get("error") == "StaleLease":
                acks_refused.append(entry)

    for (task_id, generation), entry in acks_ok.items():
        view = tasks.get(task_id)
        if view is None or view.status != "completed" or view.generation != generation:
            state = None if view is None else (view.status, view.generation)
            problem(f"lost ack: {task_id!r} generation {generation} was acked ok by "
                    f"{entry['worker']} but the task is {state}")
    for entry in acks_refused:
        lease = (entry["task_id"], entry["generation"])
        if lease in acks_ok or lease in acks_maybe:
            continue
        view = tasks.get(lease[0])
        if view is not None and view.status == "completed" and view.generation == lease[1]:
            problem(f"a refused ack completed {lease[0]!r} at generation {lease[1]}")
        reported = entry.get("generation_now")
        if reported is not None and reported < lease[1]:
            problem(f"StaleLease for {lease[0]!r} reported generation {reported}, "
                    f"below the lease's {lease[1]}")

    for task_id, by_generation in leases.items():
        view = tasks.get(task_id)
        if view is not None and view.status == "completed":
            for generation in by_generation:
                if generation > view.generation:
                    problem(f"{task_id!r} ran again: generation {generation} was leased after it "
                            f"completed at generation {view.generation}")
        for generation, (deadline, entry) in sorted(by_generation.items()):
            following = by_generation.get(generation + 1)
            if following is None:
                continue
            next_deadline, next_entry = following
            reserve_time = next_deadline - next_entry["lease_seconds"]
            held_until = max([deadline, *touched[task_id, generation]])
            released = any(end["start"] < next_entry["end"] for end in ends[task_id, generation])
            if not (held_until <= reserve_time or released):
                problem(f"{task_id!r} leased twice at once: generation {generation + 1} to "
                        f"{next_entry['worker']} at server time {reserve_time} while generation "
                        f"{generation} ({entry['worker']}) was held until {held_until} and not "
                        f"released")
        if view is None:
            continue
        if view.attempts != view.generation:
            problem(f"{task_id!r} has attempts {view.attempts} but generation {view.generation}")
        if not faults:
            missing = [g for g in range(1, view.generation + 1) if g not in by_generation]
            if missing:
                problem(f"{task_id!r} generations {missing} were never answered to a reserve")
    return problems
