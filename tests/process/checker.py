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
14. ``ack_and_reserve`` is judged as the ack and the reserve it is made of
    (``split_requests``): answered ok, its ack is held to 3, 5, 6 and 8 and
    every lease it returned to 4 and 5 like a reserve's; answered StaleLease,
    its ack is held to 8 and it reserved nothing, so it explains no
    generation in 12; unanswered, it explains generations in 12 only if its
    ack is on disk (the task completed at that generation): the ack frame is
    written before the reserve frame, so a reserve that survived without its
    ack is a generation nobody can account for.
15. Each worker's frames in the WAL follow its log (``wal_order_problems``):
    a worker makes one request at a time, so the ack, release, touch and
    reserve records that name it are, in order, the frames of its requests:
    all of them for a request answered ok, none for one answered with an
    error (a StaleLease writes nothing), and for an unanswered one a prefix
    of them — for ack_and_reserve nothing, the ack, or the ack and then the
    reserve, never the reserve without its ack. The daemons compact every
    few KiB, so the records judged are those the harness read while the
    daemons ran and after each kill (``WalHistory``) plus the final WAL, in
    runs of consecutive seqs; a run may begin or end inside a request's
    frames. A complete frame once read never changes (``wal rewritten``).
"""

from __future__ import annotations

import json
import os
from collections import Counter, defaultdict
from collections.abc import Iterable
from pathlib import Path

from walqueue import CorruptStore, Queue
from walqueue.wal import SegmentReader, list_segments

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


class _BytesReads:
    """Reads a segment into bytes, never mapping it: a daemon may be truncating it meanwhile."""

    @staticmethod
    def read(directory: str, name: str) -> bytes:
        with open(os.path.join(directory, name), "rb") as file:
            return file.read()


def read_wal(directory: str | Path) -> list[dict]:
    """The records of the WAL segments in the directory, oldest first, read leniently.

    Integrity is verify's business (13): a segment that vanishes or ends in
    something other than whole frames (it may be being written by a running
    daemon) contributes the records read before that point.
    """
    try:
        segments = list_segments(os.listdir(directory))
    except FileNotFoundError:
        return []
    records = []
    for first_seq, filename in segments:
        reader = SegmentReader(_BytesReads(), str(directory), first_seq, filename, newest=True)
        try:
            records.extend(record for _, record, _ in reader.records())
        except (OSError, CorruptStore):
            continue
    return records


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
          tasks: dict | None = None, wal_history: WalHistory | None = None) -> list[str]:
    """The list of violations (see the module docstring); ``tasks`` overrides reading the directory.

    ``wal_history``: the WAL records the harness read while the daemons ran
    and at each kill, judged by 15 together with the final WAL.
    """
    records = read_logs(log_paths)
    if tasks is None:
        violations = verify_problems(directory)  # read-only: before Queue() may truncate anything
        tasks = read_directory(directory)
        history = wal_history if wal_history is not None else WalHistory()
        history.add(read_wal(directory))
        violations += history.conflicts
        for piece in history.pieces():
            violations += wal_order_problems(records, piece)
    else:
        violations = []
    return violations + check_records(records, tasks, drained=drained)


class WalHistory:
    """WAL records read at different moments, merged by seq.

    A complete frame, once written, is never taken back (a process death
    keeps what it wrote; recovery truncates only an incomplete last frame),
    so two reads of one seq that differ are a violation.
    """

    def __init__(self) -> None:
        self.records: dict[int, dict] = {}
        self.conflicts: list[str] = []

    def add(self, records: Iterable[dict]) -> None:
        for record in records:
            earlier = self.records.setdefault(record["seq"], record)
            if earlier != record and len(self.conflicts) < MAX_VIOLATIONS_PER_KIND:
                self.conflicts.append(f"wal rewritten: seq {record['seq']} was read as {earlier} and later as "
                                      f"{record}")

    def pieces(self) -> list[list[dict]]:
        """The records in runs of consecutive seqs (what was never read leaves a gap)."""
        pieces: list[list[dict]] = []
        for seq in sorted(self.records):
            if not pieces or pieces[-1][-1]["seq"] != seq - 1:
                pieces.append([])
            pieces[-1].append(self.records[seq])
        return pieces


WORKER_OPS = ("ack", "release", "touch", "reserve")  # the WAL records that name the worker


def _lease_key(op: str, task_id: str, generation: int) -> tuple:
    return (op, task_id, generation)


def expected_frames(records: list[dict]) -> dict[str, list[tuple[str, list[list[tuple]]]]]:
    """{worker: [(log line, the frame sequences its request may have left), ...]} in request order.

    A frame is ``(op, task_id, generation)`` or ``("reserve", frozenset of task ids)``;
    ``("reserve", None)`` stands for a reserve whose answer was lost (any task ids).
    """
    by_worker: dict[str, list] = defaultdict(list)
    seen_reserves = set()
    for line in sorted(records, key=lambda line: (line["worker"], line["index"])):
        op, outcome = line["op"], line["outcome"]
        if op not in (*WORKER_OPS, "ack_and_reserve"):
            continue
        if op == "reserve":
            if outcome == "ok":
                # One line per lease of one answer: they share ``started``.
                request = (line["worker"], line["started"])
                if request in seen_reserves:
                    continue
                seen_reserves.add(request)
                ids = frozenset(other["task_id"] for other in records if other["op"] == "reserve"
                                and other["outcome"] == "ok" and (other["worker"], other["started"]) == request
                                and other["task_id"] is not None)
                frames = [("reserve", ids)] if ids else []
            else:
                frames = [("reserve", None)]
        elif op == "ack_and_reserve":
            frames = [_lease_key("ack", line["task_id"], line["generation"])]
            if outcome == "ok" and line["leases"]:
                frames.append(("reserve", frozenset(task_id for task_id, _ in line["leases"])))
            elif outcome == "unknown":
                frames.append(("reserve", None))
        else:
            frames = [_lease_key(op, line["task_id"], line["generation"])]
        if outcome == "ok":
            choices = [frames]
        elif outcome == "unknown":
            choices = [frames[:length] for length in range(len(frames) + 1)]
        else:  # answered with an error, or never sent: nothing written
            choices = [[]]
        by_worker[line["worker"]].append((line["log"], choices))
    return by_worker


def _frame_of(record: dict) -> tuple:
    if record["op"] == "reserve":
        return ("reserve", frozenset(record["task_ids"]))
    return _lease_key(record["op"], record["task_id"], record["generation"])


def _matches(pattern: tuple, frame: tuple) -> bool:
    if pattern[0] == "reserve" and pattern[1] is None:
        return frame[0] == "reserve"
    return pattern == frame


def wal_order_problems(records: list[dict], wal: list[dict]) -> list[str]:
    """15: every worker's WAL records, in order, are what its requests may have written."""
    actual: dict[str, list[tuple]] = defaultdict(list)
    for record in wal:
        if record["op"] in WORKER_OPS:
            actual[record["worker"]].append((_frame_of(record), record["seq"]))
    expected = expected_frames(records)
    problems = []
    for worker, frames in sorted(actual.items()):
        stuck = _align([frame for frame, _ in frames], expected.get(worker, []))
        if stuck is not None:
            frame, seq = frames[stuck]
            problems.append(f"wal order: worker {worker}'s WAL record seq {seq} {frame} does not follow "
                            f"from its log: no request of it answered or left unanswered could have "
                            f"written it there")
    return problems


def _align(frames: list[tuple], requests: list) -> int | None:
    """None if ``frames`` could be what a run of consecutive ``requests`` wrote; else where it fails.

    The frames read may begin and end anywhere: inside a request's frames
    too (the reads before and after them missed, or the read came between
    two frames of one request), so the first request may contribute the end
    of its frames and the last one their beginning.
    """
    count = len(frames)
    if count == 0:
        return None
    reach: set[int] = set()  # frame positions reachable before the current request
    best = 0
    for _, choices in requests:
        following = set()
        starts = [(position, choice) for position in reach for choice in choices]
        # Or the frames read begin here, possibly inside this request's frames.
        starts += [(0, choice[cut:]) for choice in choices for cut in range(len(choice))]
        for position, choice in starts:
            matched = 0
            while matched < len(choice) and position + matched < count \
                    and _matches(choice[matched], frames[position + matched]):
                matched += 1
            if position + matched == count:
                return None  # every frame read is placed (the rest of this request unread)
            if matched == len(choice):
                following.add(position + matched)
            best = max(best, position + matched)
        reach = following
    return min(best, count - 1)


def split_requests(records: list[dict]) -> list[dict]:
    """The records with every ``ack_and_reserve`` line replaced by the ack and reserves it stands for.

    The ack line keeps the outcome, error and StaleLease fields; answered ok,
    one reserve line per lease it returned; unanswered, one reserve line with
    its ``limit`` and ``after_ack`` (the lease whose ack must be on disk for
    that reserve to have happened). Answered with an error: no reserve line.
    """
    split = []
    for record in records:
        if record["op"] != "ack_and_reserve":
            split.append(record)
            continue
        common = {key: value for key, value in record.items() if key not in ("leases", "limit", "lease_seconds")}
        split.append(dict(common, op="ack", via="ack_and_reserve"))
        if record["outcome"] == "ok":
            for task_id, generation in record["leases"]:
                split.append(dict(common, op="reserve", via="ack_and_reserve", task_id=task_id,
                                  generation=generation))
        elif record["outcome"] == "unknown":
            split.append(dict(common, op="reserve", via="ack_and_reserve", task_id=None, generation=None,
                              limit=record["limit"], after_ack=[record["task_id"], record["generation"]]))
    return split


def _completed_at(tasks: dict, lease: list) -> bool:
    task = tasks.get(lease[0])
    return task is not None and task.status == "completed" and task.generation == lease[1]


def check_records(records: list[dict], tasks: dict, *, drained: bool) -> list[str]:
    records = split_requests(records)
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
    # its ``limit`` tasks, and the reserve half of a lost ack_and_reserve
    # leased nothing unless its ack is on disk (14).
    unlogged = sum(len(missing_generations(records, task_id, task.generation)) for task_id, task in tasks.items())
    lost = [line for line in records if line["op"] == "reserve" and line["outcome"] == "unknown"]
    could_have = sum(line.get("limit") or 0 for line in lost
                     if "after_ack" not in line or _completed_at(tasks, line["after_ack"]))
    if unlogged > could_have:
        without_ack = [line["log"] for line in lost if "after_ack" in line and not _completed_at(tasks, line["after_ack"])]
        stale = [line["log"] for line in records if line.get("via") == "ack_and_reserve" and line["op"] == "ack"
                 and line["error"] == "StaleLease"]
        violation("unexplained generation", f"{unlogged} generations on disk were never answered to a reserve, "
                  f"but the reserves whose answers were lost could lease at most {could_have} tasks "
                  f"(not counted: {len(without_ack)} unanswered ack_and_reserve whose ack is not on disk, "
                  f"{len(stale)} ack_and_reserve answered StaleLease)")

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
    before the frame was complete. ``"ack_and_reserve ack recovered"`` and
    ``"... lost"``: the same for the ack half of an unanswered ack_and_reserve.
    ``"reserve recovered"``: generations on
    disk that no reserve answer carried (a lease granted, then the answer
    lost). Seeing these shows the kills landed inside requests.
    """
    records = split_requests(records)
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
        which = "ack_and_reserve ack" if line.get("via") == "ack_and_reserve" else "ack"
        outcome[f"{which} recovered" if completed else f"{which} lost"] += 1
    for task_id, task in tasks.items():
        outcome["reserve recovered"] += len(missing_generations(records, task_id, task.generation))
    return outcome
