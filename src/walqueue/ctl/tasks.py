"""walqueue-ctl's task commands: put a task, look at tasks (get, tasks, next, dead),
and bring dead ones back (revive)."""

from __future__ import annotations

import datetime
import sys
from typing import TextIO

import click

from walqueue import display
from walqueue.backend import DAEMON_STATS
from walqueue.ctl.backends import Ctl
from walqueue.ctl.errors import (
    DAEMON_CODES,
    EXIT_KEY_CONFLICT,
    EXIT_NOT_FOUND,
    CtlError,
    not_found,
)
from walqueue.ctl.group import JSON_ALREADY, command, json_option, pass_ctl
from walqueue.ctl.output import emit, parse_json_object, print_task_pages, print_tasks

DEFAULT_NEXT_LIMIT = 10
STATUSES = ("ready", "leased", "completed", "dead")


def payload_text(payload: str | None, stdin: TextIO | None) -> tuple[str, str]:
    """The payload's JSON text, and how to name it in an error.

    '-' reads stdin. Without PAYLOAD_JSON, a stdin that is not a terminal is
    read too (`echo '{"to": 1}' | walqueue-ctl put ID`), so a piped payload is
    never dropped for {}; a terminal, an empty stdin or none at all is {}.
    """
    if payload is not None and payload != "-":
        return payload, "the payload"
    if payload is None and (stdin is None or stdin.isatty()):
        return "{}", "the payload"
    text = stdin.read() if stdin is not None else ""
    if payload is None and not text.strip():
        return "{}", "the payload"  # nothing was piped: nothing to drop
    return text, "the payload on stdin"


# The largest time a task may be due at (SPEC §1: below 2**63).
MAX_TIME = 2**63 - 1


class MomentType(click.ParamType):
    """--at: Unix seconds, or an ISO 8601 time with its UTC offset (2026-12-03T02:00:00Z)."""

    name = "EPOCH|ISO8601"

    def convert(self, value, parameter, ctx) -> int:
        if isinstance(value, int):
            return value
        text = value.strip()
        if text.isdigit():
            seconds = int(text)
        else:
            try:
                moment = datetime.datetime.fromisoformat(text)
            except ValueError:
                self.fail(f"{value!r} is neither Unix seconds nor an ISO 8601 time "
                          f"(e.g. 2026-12-03T02:00:00Z)", parameter, ctx)
            if moment.tzinfo is None:
                # A time without an offset means another hour on every machine with another
                # zone, and a repeated put must name the same second everywhere.
                self.fail(f"{value!r} has no UTC offset: add Z or e.g. +01:00", parameter, ctx)
            seconds = int(moment.timestamp())
            if seconds != moment.timestamp():
                self.fail(f"{value!r} is not a whole second", parameter, ctx)
        if not 0 <= seconds <= MAX_TIME:
            self.fail(f"{value!r} is outside 0..{MAX_TIME} Unix seconds", parameter, ctx)
        return seconds


DELAY_CONFLICT_ADVICE = (
    "A put with --delay is due at now + delay, and that time is part of the request's identity "
    "(SPEC §2), so the same put a second later is a different request. To put a scheduled task "
    "you may repeat, give the time itself: --at EPOCH or --at ISO8601 (e.g. "
    "2026-12-03T02:00:00Z).")


@command(*DAEMON_CODES, EXIT_KEY_CONFLICT, short_help='Put a task (idempotent by key).')
@click.argument("task_id")
@click.argument("payload", required=False, default=None, metavar="[PAYLOAD_JSON|-]")
@click.option("--key", default=None,
              help="Idempotency key [default: the task id]. A key already used by a different "
                   "request is a key conflict (exit 6).")
@click.option("--delay", type=click.IntRange(min=0), default=None,
              help="Due this many seconds from now. The due time is part of the identity, so "
                   "running the same put again later is a key conflict (exit 6): use --at for a "
                   "put you may repeat.")
@click.option("--at", "at", type=MomentType(), default=None,
              help="Due at this time: Unix seconds, or ISO 8601 with an offset "
                   "(2026-12-03T02:00:00Z). Repeating the put is idempotent. Not with --delay.")
@click.option("--available-at", type=click.IntRange(min=0), default=None,
              help="Due at this Unix time (seconds), as --at EPOCH.")
@click.option("--max-attempts", type=click.IntRange(min=1), default=3, show_default=True,
              help="Leases after which a task that keeps failing (released or expired) is dead.")
@json_option(JSON_ALREADY)
@pass_ctl
def put(ctl: Ctl, task_id: str, payload: str | None, key: str | None, delay: int | None,
        at: int | None, available_at: int | None, max_attempts: int, as_json: bool) -> None:
    """Put a task; PAYLOAD_JSON is a JSON object ('-' reads it from stdin; default {}).

    Without PAYLOAD_JSON, a payload piped on stdin is read (`echo '{"to": 1}'
    | walqueue-ctl put ID`); a terminal or an empty stdin gives {}.
    Prints {"task_id": ...}. Putting the identical request again is a no-op
    that prints the same id; with --delay it is not identical a second later
    (the due time is part of it), so repeatable scheduled puts use --at. Tasks are leased in (available_at, task_id)
    order, so ids that should run in arrival order must sort that way
    (zero-padded numbers, or time-ordered ids).
    """
    given = [name for name, value in (("--delay", delay), ("--at", at),
                                      ("--available-at", available_at)) if value is not None]
    if len(given) > 1:
        raise click.UsageError(f"give {' or '.join(given)}, not both" if len(given) == 2 else
                               "give one of --delay, --at and --available-at")
    due = at if at is not None else available_at
    value = parse_json_object(*payload_text(payload, sys.stdin))
    try:
        task = ctl.client.put(task_id, value, key=key, available_at=due or 0, delay=delay,
                              max_attempts=max_attempts)
    except CtlError as exc:
        if exc.name != "KeyConflict" or delay is None:
            raise
        first_line = exc.format_message().splitlines()[0]
        raise CtlError(f"{first_line}\n{DELAY_CONFLICT_ADVICE}", exc.exit_code, exc.name,
                       exc.fields) from exc
    emit({"task_id": task})


@command(*DAEMON_CODES, EXIT_NOT_FOUND)
@click.argument("task_id")
@json_option(JSON_ALREADY)
@pass_ctl
def get(ctl: Ctl, task_id: str, as_json: bool) -> None:
    """Print one task as JSON (exit 7 if there is no such task).

    For walqueued, the error says what its directory holds (every task put
    up to its last seq): after a restore, a task put after the backup's seq
    is not there, and putting it again is safe.
    """
    task = ctl.client.get(task_id)
    if task is None:
        raise not_found(task_id, what_the_queue_holds(ctl))
    emit(task)


def what_the_queue_holds(ctl: Ctl) -> str:
    """Why a task id is not found, as far as the backend can say it truly."""
    never = " (completed and dead tasks stay listed, so it was never put)"
    if DAEMON_STATS not in ctl.capabilities:
        return never
    try:
        report = ctl.client.daemon_stats()
    except CtlError:
        return never  # the get was answered; the explanation is only a courtesy
    started = datetime.datetime.fromtimestamp(int(report.start_time_seconds), datetime.UTC)
    return (f" at {display.name(report.directory)}, which holds every task put up to seq "
            f"{report.queue.last_seq}, completed and dead ones included (walqueued opened it at "
            f"{started:%Y-%m-%dT%H:%M:%SZ}). So it was never put there, or, if that directory was "
            f"restored from a backup, it was put after the backup's seq: put it again (an "
            f"identical put is idempotent)")


LIMIT_OPTION = click.option("--limit", type=click.IntRange(min=1), default=None,
                            help="Show at most this many tasks [default: all].")
LISTING_JSON = "Print each task as a JSON line (TaskView's fields); errors as JSON on stderr."


@command(*DAEMON_CODES, short_help="List tasks (all, or those of one --status).")
@click.option("--status", type=click.Choice(STATUSES), default=None,
              help="Only tasks with this status [default: every status].")
@LIMIT_OPTION
@json_option(LISTING_JSON)
@pass_ctl
def tasks(ctl: Ctl, status: str | None, limit: int | None, as_json: bool) -> None:
    """List tasks in task_id order, as a table or (--json) one task per line.

    The table shows times in UTC, with how far ahead they are ("(in 25
    min)") by this machine's clock; a ready task not yet due is "delayed".
    --json gives the exact fields (times as Unix seconds, status "ready").
    Completed tasks stay listed for ever (as tombstones without payload), so
    on a long-lived queue use --status or --limit. The listing is read in
    pages of 1,000 tasks (each costs the queue as much as its page, however
    long the history), so it is not one moment's state: a task that moves
    meanwhile may show twice or not at all; --json prints each page as it
    comes.
    """
    print_task_pages(ctl, status, limit,
                     ("TASK_ID", "STATUS", "ATTEMPTS", "AVAILABLE_AT", "WORKER", "DEADLINE", "PAYLOAD"),
                     as_json, f"no {status} tasks" if status else "no tasks")


@command(*DAEMON_CODES, name="next", short_help="The next tasks reserve would lease, unleased.")
@click.option("--limit", type=click.IntRange(min=1), default=DEFAULT_NEXT_LIMIT, show_default=True,
              help="Show at most this many tasks.")
@json_option(LISTING_JSON)
@pass_ctl
def next_tasks(ctl: Ctl, limit: int, as_json: bool) -> None:
    """The ready tasks in the order reserve leases them, without leasing any.

    That order is (available_at, task_id), not arrival order: `job-10` comes
    before `job-9`. Tasks not yet due are listed after the due ones, with
    when they become due (DUE, by this machine's clock). This reads the
    whole ready listing (`tasks --status ready`) and sorts it here, so it
    costs as much as that listing.
    """
    ready = sorted(ctl.client.tasks("ready"), key=lambda task: (task.available_at, task.task_id))
    print_tasks(ready[:limit], len(ready),
                ("TASK_ID", "DUE", "AVAILABLE_AT", "ATTEMPTS", "PAYLOAD"), as_json, "no ready tasks")


@command(*DAEMON_CODES, short_help="List dead tasks (out of attempts).")
@LIMIT_OPTION
@json_option(LISTING_JSON)
@pass_ctl
def dead(ctl: Ctl, limit: int | None, as_json: bool) -> None:
    """List dead tasks (out of attempts); bring them back with `revive`, or drop them with
    `cancel`. Read in pages of 1,000, as `tasks`."""
    print_task_pages(ctl, "dead", limit,
                     ("TASK_ID", "KEY", "ATTEMPTS", "GENERATION", "AVAILABLE_AT", "PAYLOAD"),
                     as_json, "no dead tasks")


@command(*DAEMON_CODES, EXIT_NOT_FOUND)
@click.argument("task_ids", nargs=-1, required=True, metavar="TASK_ID...")
@json_option(JSON_ALREADY)
@pass_ctl
def revive(ctl: Ctl, task_ids: tuple[str, ...], as_json: bool) -> None:
    """Make dead tasks ready again (attempts reset). Prints {"task_ids": [...]}.

    All or nothing: if one listed task is not dead, none is revived (exit 2;
    exit 7 if the queue does not hold one of them).
    """
    try:
        revived = ctl.client.revive(list(task_ids))
    except CtlError as exc:
        unknown = ctl.unknown_task(task_ids, ": nothing was revived") if exc.name == "InvalidRequest" else None
        if unknown is None:
            raise
        raise unknown from exc
    emit({"task_ids": revived})
