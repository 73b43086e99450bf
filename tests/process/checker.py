"""The crash harness's checker: the queue directory and the workers' logs, read from outside.

``check(directory, log_paths, drained=...)`` runs after the daemon has been
stopped. It reads only two things: the directory, offline, through
``walqueue.Queue`` (and ``walqueue.verify`` when it exists), and the JSON-lines
logs the worker processes wrote (format in tests/process/crash_worker.py).
It returns a list of violations, each a sentence naming the task, the
generation and the log lines at fault; empty means every claim held:

1. Every put answered ok exists on disk, with the key and max_attempts it was
   put with (and, unless completed, its payload).
2. No phantom: every task on disk was put by some worker (answered ok,
   error or unknown). No put was refused: each carries a fresh task id and
   key, and a retry repeats the same request, so KeyConflict would mean
   idempotency broke.
3. Every ack answered ok is completed, at exactly the acked generation; no
   task was acked ok under two generations (completed twice).
4. A generation is handed out once: no two reserves answered ok returned the
   same (task, generation); a generation seen in a log is at most the one on
   disk; a reserve that began after another ended returned a higher
   generation (generations only grow).
5. A completed task never runs again: no reserve answered a generation above
   the one that was acked.
6. A lease ends once: ack ok and release ok of one (task, generation) do not
   both happen, nor two of them; a touch answered ok after the lease ended is
   a violation; a touch answers the lease's own generation.
7. A release answered ok is not lost: the task is not still leased under
   that generation.
8. A StaleLease answer changed nothing: an ack answered StaleLease (and never
   answered ok or unknown for that lease) did not complete the task at that
   generation; the generation it reports is never below the lease's; after an
   ack ok, a second ack of that lease reports "completed" at that generation
   (SPEC §8: how a client tells its own completed ack from a lost lease).
9. An ack sent after the lease's deadline (``late``) is never answered ok.
10. The counters agree: attempts equal the generation (the workload never
    revives), a dead task used all its attempts, a ready one did not.
11. After a successful drain, nothing is ready or leased: every task put ok is
    completed or dead.
12. Every generation on disk was answered to some reserve, or there were
    enough reserves whose answers were lost to account for it.
13. The directory verifies clean (``walqueue.verify``), when that module exists.
"""

from __future__ import annotations

import json
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from walqueue import Queue

MAX_VIOLATIONS_PER_KIND = 20


def read_logs(log_paths: Iterable[str | Path]) -> list[dict]:
    """Every line of every log, as dicts. A torn last line (a killed writer) is skipped."""
    records = []
    for path in log_paths:
        text = Path(path).read_text()
        lines = text.split("\n")
        for number, line in enumerate(lines, 1):
            if not line:
                continue
            try:
                record = json.loads(line)
            except json.JSONDecodeError:
                if number == len(lines):  # no newline after it: the writer died mid-line
                    continue
                raise
            record["log"] = f"{Path(path).name}:{number}"
            records.append(record)
    return records


def read_directory(directory: str | Path) -> dict[str, object]:
    """{task_id: TaskView} of the directory, opened offline (the daemon must be stopped)."""
    with Queue(directory) as queue:
        return {task.task_id: task for task in queue.tasks()}


def verify_problems(directory: str | Path) -> list[str]:
    try:
        from walqueue.verify import verify_directory
    except ImportError:
        return []
    report = verify_directory(directory)
    return [f"verify: {problem.severity} at {problem.location()}: {problem.what}"
            for problem in report.problems if problem.severity in ("corrupt", "unreadable")]


def _puts(records: list[dict]) -> Iterable[tuple[dict, dict]]:
    """(record, request) for every task a put or put_many line carries."""
    for record in records:
        if record["op"] == "put":
            yield record, record["request"]
        elif record["op"] == "put_many":
            for request in record["tasks"]:
                yield record, request


def check(directory: str | Path, log_paths: Iterable[str | Path], *, drained: bool = True,
          tasks: dict | None = None) -> list[str]:
    """The list of violations (see the module docstring); ``tasks`` overrides reading the directory."""
    records = read_logs(log_paths)
    if tasks is None:
        violations = verify_problems(directory)  # read-only: before Queue() may truncate anything
        tasks = read_directory(directory)
    else:
        violations = []
    return violations + check_records(records, tasks, drained=drained)


def check_records(records: list[dict], tasks: dict, *, drained: bool) -> list[str]:
    violations: list[str] = []
    counts: dict[str, int] = defaultdict(int)

    def violation(kind: str, message: str) -> None:
        counts[kind] += 1
        if counts[kind] <= MAX_VIOLATIONS_PER_KIND:
            violations.append(f"{kind}: {message}")

    # 1 and 2: puts against the disk.
    requested: dict[str, dict] = {}
    answered_ok: dict[str, str] = {}
    for record, request in _puts(records):
        task_id = request["task_id"]
        earlier = requested.setdefault(task_id, request)
        if earlier != request:
            violation("harness", f"task {task_id} was put with two different requests ({record['log']})")
        if record["outcome"] == "ok":
            answered_ok.setdefault(task_id, record["log"])
    for record in records:
        if record["op"] in ("put", "put_many") and record["outcome"] == "error" \
                and record["error"] in ("KeyConflict", "InvalidRequest"):
            # Every put carries a fresh task id and key, and a retry repeats the
            # very same request: only a broken idempotency check can refuse one.
            violation("put refused", f"{record['op']} answered {record['error']} ({record['log']})")
    for task_id, where in answered_ok.items():
        task = tasks.get(task_id)
        if task is None:
            violation("lost put", f"task {task_id} was answered ok ({where}) but is not in the directory")
            continue
        request = requested[task_id]
        if task.key != (request["key"] or task_id) or task.max_attempts != request["max_attempts"]:
            violation("wrong task", f"task {task_id} on disk has key {task.key!r}, max_attempts "
                      f"{task.max_attempts}; it was put ({where}) with {request['key']!r}, "
                      f"{request['max_attempts']}")
        if task.status != "completed" and task.payload != request["payload"]:
            violation("wrong task", f"task {task_id} on disk has payload {task.payload!r}, put with "
                      f"{request['payload']!r} ({where})")
    for task_id, task in tasks.items():
        if task_id not in requested:
            violation("phantom", f"task {task_id} ({task.status}, generation {task.generation}) is in the "
                      "directory but no worker ever put it")

    # Lease-related lines, by task.
    by_task: dict[str, list[dict]] = defaultdict(list)
    for record in records:
        if record["op"] in ("reserve", "ack", "release", "touch") and record.get("task_id") is not None:
            by_task[record["task_id"]].append(record)

    for task_id, lines in sorted(by_task.items()):
        task = tasks.get(task_id)
        disk_generation = task.generation if task is not None else None
        if task is None:
            violation("phantom", f"task {task_id} appears in leases ({lines[0]['log']}) but not in the directory")
            continue

        # 3: acks answered ok.
        acked = {}
        for line in lines:
            if line["op"] == "ack" and line["outcome"] == "ok":
                acked.setdefault(line["generation"], line["log"])
        if len(acked) > 1:
            violation("completed twice", f"task {task_id} was acked ok under generations {sorted(acked)} "
                      f"({', '.join(acked.values())})")
        for generation, where in acked.items():
            if task.status != "completed" or task.generation != generation:
                violation("lost ack", f"task {task_id} was acked ok at generation {generation} ({where}) "
                          f"but is {task.status} at generation {task.generation} on disk")

        # 4 and 5: generations handed out by reserves.
        reserves = [line for line in lines if line["op"] == "reserve" and line["outcome"] == "ok"]
        handed: dict[int, str] = {}
        for line in reserves:
            generation = line["generation"]
            if generation in handed:
                violation("double lease", f"task {task_id} generation {generation} was handed out twice "
                          f"({handed[generation]} and {line['log']})")
            handed.setdefault(generation, line["log"])
            if generation > disk_generation:
                violation("generation went back", f"task {task_id} was reserved at generation {generation} "
                          f"({line['log']}) but has generation {disk_generation} on disk")
            for acked_generation, where in acked.items():
                if generation > acked_generation:
                    violation("ran after completion", f"task {task_id} was acked ok at generation "
                              f"{acked_generation} ({where}) and reserved again at {generation} ({line['log']})")
        ordered = sorted(reserves, key=lambda line: line["finished"])
        highest_before = []  # (finished, max generation among reserves finished by then)
        running = -1
        for line in ordered:
            running = max(running, line["generation"])
            highest_before.append((line["finished"], running, line["log"]))
        for line in reserves:
            earlier = [entry for entry in highest_before if entry[0] < line["started"]]
            if earlier and earlier[-1][1] >= line["generation"]:
                violation("generation went back", f"task {task_id} reserved at generation {line['generation']} "
                          f"({line['log']}) after a reserve that had returned {earlier[-1][1]} had ended")

        # 6 and 7: a lease ends once; a release answered ok is not lost.
        ends: dict[int, list[dict]] = defaultdict(list)
        for line in lines:
            if line["op"] in ("ack", "release") and line["outcome"] == "ok":
                ends[line["generation"]].append(line)
        for generation, ended in ends.items():
            if len(ended) > 1:
                violation("lease ended twice", f"task {task_id} generation {generation} was ended ok "
                          f"{len(ended)} times ({', '.join(line['op'] + ' ' + line['log'] for line in ended)})")
            first_end = min(line["finished"] for line in ended)
            for line in lines:
                if line["op"] == "touch" and line["outcome"] == "ok" and line["generation"] == generation \
                        and line["started"] > first_end:
                    violation("touch after end", f"task {task_id} generation {generation} was touched ok "
                              f"({line['log']}) after its lease ended ({ended[0]['log']})")
            for line in ended:
                if line["op"] == "release" and task.status == "leased" and task.generation == generation:
                    violation("lost release", f"task {task_id} was released ok at generation {generation} "
                              f"({line['log']}) but is still leased under it on disk")
        for line in lines:
            if line["op"] == "touch" and line["outcome"] == "ok" and line["answered_generation"] != line["generation"]:
                violation("touch", f"touch of task {task_id} generation {line['generation']} answered a lease "
                          f"of generation {line['answered_generation']} ({line['log']})")

        # 8 and 9: StaleLease answers changed nothing; late acks are refused.
        may_have_acked = {line["generation"] for line in lines
                          if line["op"] == "ack" and line["outcome"] in ("ok", "unknown")}
        for line in lines:
            if line["outcome"] != "error" or line["error"] != "StaleLease":
                continue
            generation = line["generation"]
            if line["stale_generation"] is not None and line["stale_generation"] < generation:
                violation("generation went back", f"StaleLease for task {task_id} generation {generation} "
                          f"reported generation {line['stale_generation']} ({line['log']})")
            if line["op"] == "ack" and generation not in may_have_acked and task.status == "completed" \
                    and task.generation == generation:
                violation("stale ack completed", f"task {task_id} is completed at generation {generation}, "
                          f"whose only ack was answered StaleLease ({line['log']})")
        for line in lines:
            if line["op"] != "ack" or line["error"] != "StaleLease":
                continue
            acked_before = [ack for ack in lines if ack["op"] == "ack" and ack["outcome"] == "ok"
                            and ack["generation"] == line["generation"] and ack["finished"] < line["started"]]
            if acked_before and (line["stale_status"], line["stale_generation"]) != ("completed", line["generation"]):
                violation("stale answer", f"a second ack of task {task_id} generation {line['generation']} "
                          f"({line['log']}) after its ack ok ({acked_before[0]['log']}) reported "
                          f"{line['stale_status']} at generation {line['stale_generation']}, not completed at "
                          f"{line['generation']}")
        for line in lines:
            if line["op"] == "ack" and line.get("late") and line["outcome"] == "ok":
                violation("late ack", f"task {task_id} generation {line['generation']} was acked ok after its "
                          f"deadline ({line['log']})")

    # 10: the counters agree with the statuses. The workload never revives a
    # task, so every reserve added one attempt and one generation.
    for task_id, task in tasks.items():
        if task.attempts != task.generation:
            violation("counters", f"task {task_id} has attempts {task.attempts} but generation "
                      f"{task.generation}, and nobody revived it")
        if task.status == "dead" and task.attempts < task.max_attempts:
            violation("counters", f"task {task_id} is dead after {task.attempts} of {task.max_attempts} attempts")
        if task.status == "ready" and task.attempts >= task.max_attempts:
            violation("counters", f"task {task_id} is ready after {task.attempts} of {task.max_attempts} attempts")

    # 12: every generation on disk was handed out by a reserve that either was
    # answered (and logged) or whose answer was lost; a lost one leased at most
    # its ``limit`` tasks.
    unlogged = sum(len(missing_generations(records, task_id, task.generation)) for task_id, task in tasks.items())
    could_have = sum(line.get("limit") or 0 for line in records
                     if line["op"] == "reserve" and line["outcome"] == "unknown")
    if unlogged > could_have:
        violation("unexplained generation", f"{unlogged} generations on disk were never answered to a reserve, "
                  f"but the reserves whose answers were lost could lease at most {could_have} tasks")

    # 11: after a drain nothing is ready or leased.
    if drained:
        for task_id, task in tasks.items():
            if task.status not in ("completed", "dead"):
                violation("not drained", f"task {task_id} is {task.status} after the drain reported the queue empty")

    for kind, count in counts.items():
        if count > MAX_VIOLATIONS_PER_KIND:
            violations.append(f"{kind}: ... {count - MAX_VIOLATIONS_PER_KIND} more")
    return violations


def missing_generations(records: list[dict], task_id: str, generation: int) -> set[int]:
    """Generations 1..``generation`` of the task that no reserve answered ok."""
    handed = {line["generation"] for line in records
              if line["op"] == "reserve" and line["outcome"] == "ok" and line.get("task_id") == task_id}
    return set(range(1, generation + 1)) - handed


def in_doubt(records: list[dict], tasks: dict) -> Counter:
    """What became of writes whose answer was lost (outcome unknown), as read on disk.

    ``"ack recovered"``: the task is completed at that generation although no
    ack of that lease was answered ok — the frame was on disk when the daemon
    died, and recovery kept it. ``"ack lost"``: it is not — the daemon died
    before the frame was complete. ``"reserve recovered"``: generations on
    disk that no reserve answer carried (a lease granted, then the answer
    lost). Seeing these shows the kills landed inside requests.
    """
    outcome: Counter = Counter()
    answered = {(line["task_id"], line["generation"]) for line in records
                if line["op"] == "ack" and line["outcome"] == "ok"}
    for line in records:
        if line["op"] != "ack" or line["outcome"] != "unknown":
            continue
        lease = (line["task_id"], line["generation"])
        if lease in answered or line["task_id"] not in tasks:
            continue
        task = tasks[line["task_id"]]
        completed = task.status == "completed" and task.generation == line["generation"]
        outcome["ack recovered" if completed else "ack lost"] += 1
    for task_id, task in tasks.items():
        outcome["reserve recovered"] += len(missing_generations(records, task_id, task.generation))
    return outcome
