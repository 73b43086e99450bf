"""walqueue-ctl's output: JSON lines for data, tables for a human, JSON input checked.

For a human every name (task id, key, worker, directory) goes through
`walqueue.display`, so control, bidi and invisible characters are escaped;
JSON keeps every value exact (`display.json_line`).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from collections.abc import Callable
from typing import Any

import click

from walqueue import display
from walqueue.ctl import top
from walqueue.ctl.errors import EXIT_USAGE, CtlError

PAYLOAD_COLUMN_CHARS = 60
PAGE_TASKS = 1000  # a listing's page: one request each, costing the queue O(page) (SPEC §8b)


def emit(value: Any) -> None:
    """Print one JSON value on one line (dataclasses as objects)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    click.echo(display.json_line(value))


def json_kind(value: Any) -> str:
    """How JSON names the type of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    return "a number"


def parse_json_object(text: str, what: str) -> dict:
    """`text` as a JSON object; raises CtlError (exit 2) naming `what` otherwise."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CtlError(f"{what} is not valid JSON: {exc}", EXIT_USAGE, "InvalidJSON") from None
    if not isinstance(value, dict):
        raise CtlError(f"{what} must be a JSON object, not {json_kind(value)}", EXIT_USAGE,
                       "InvalidJSON")
    return value


def table(rows: list[list[str]], *, err: bool = False) -> None:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
                   err=err)


def cell(value: Any) -> str:
    """One value of a report (`stats`) as a table shows it."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) >= 1e5 else f"{value:.6g}"
    if isinstance(value, bool):
        return str(value).lower()
    return display.name(value) if isinstance(value, str) else str(value)


def payload_cell(payload: dict | None) -> str:
    if payload is None:
        return "-"
    text = display.json_line(payload)  # JSON's own escapes, and no character shown raw
    if len(text) > PAYLOAD_COLUMN_CHARS:
        text = text[:PAYLOAD_COLUMN_CHARS - 3] + "..."
    return text


def _optional(value: Any, render: Callable[[Any], str] = str) -> str:
    return "-" if value is None else render(value)


def moment_text(epoch: int | None, now: int) -> str:
    """A Unix time as a person reads it: UTC to the second, and how far ahead it is.

    None and 0 (a task put without a delay: due since the epoch) are "-"; a
    time still ahead says "(in 25 min)". `--json` keeps the exact integer.
    """
    if not epoch:
        return "-"
    try:
        text = datetime.datetime.fromtimestamp(epoch, datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
    except (OverflowError, OSError, ValueError):  # beyond the calendar datetime knows
        text = str(epoch)
    return f"{text} (in {top.duration_text(epoch - now)})" if epoch > now else text


def status_text(task: Any, now: int) -> str:
    """A task's status for a table: a ready task that is not yet due is "delayed"."""
    return "delayed" if task.status == "ready" and task.available_at > now else task.status


# How each column of a task table shows a TaskView (now: this machine's clock, in seconds).
TASK_COLUMNS: dict[str, Callable[[Any, int], str]] = {
    "TASK_ID": lambda task, now: display.name(task.task_id),
    "KEY": lambda task, now: display.name(task.key),
    "STATUS": status_text,
    "DUE": lambda task, now: top.due_text(task.available_at, now),
    "ATTEMPTS": lambda task, now: f"{task.attempts}/{task.max_attempts}",
    "GENERATION": lambda task, now: str(task.generation),
    "AVAILABLE_AT": lambda task, now: moment_text(task.available_at, now),
    "WORKER": lambda task, now: _optional(task.worker, display.name),
    "DEADLINE": lambda task, now: moment_text(task.deadline, now),
    "PAYLOAD": lambda task, now: payload_cell(task.payload),
}


def print_tasks(tasks: list, total: int, columns: tuple[str, ...], as_json: bool, nothing: str) -> None:
    """A listing: one TaskView JSON per line, or a table; says how many were left out."""
    if as_json:
        for task in tasks:
            emit(task)
        return
    if not tasks:
        click.echo(nothing)
        return
    now = int(time.time())
    table([list(columns)] + [[TASK_COLUMNS[column](task, now) for column in columns] for task in tasks])
    if total > len(tasks):
        click.echo(f"... and {total - len(tasks)} more (--limit)")


def task_pages(client: Any, status: str | None, limit: int | None):
    """The listing of `status` as pages (lists of TaskView) of at most PAGE_TASKS, at most
    `limit` tasks in all; each page is one `tasks(status, after=, limit=)` call."""
    after, left = None, limit
    while left is None or left > 0:
        size = PAGE_TASKS if left is None else min(PAGE_TASKS, left)
        page = client.tasks(status, after=after, limit=size)
        if page:
            yield page
        if len(page) < size:
            return
        after = page[-1].task_id
        if left is not None:
            left -= len(page)


def print_task_pages(ctl: Any, status: str | None, limit: int | None, columns: tuple[str, ...],
                     as_json: bool, nothing: str) -> None:
    """`print_tasks` of a listing read in pages: JSON lines as each page comes, or one table
    (and, past --limit, how many more the queue's counts say there are)."""
    if as_json:
        for page in task_pages(ctl.client, status, limit):
            for task in page:
                emit(task)
        return
    shown = [task for page in task_pages(ctl.client, status, limit) for task in page]
    total = len(shown)
    if limit is not None and total == limit:
        counts = ctl.client.stats()
        total = max(total, getattr(counts, status) if status else
                    counts.ready + counts.leased + counts.completed + counts.dead)
    print_tasks(shown, total, columns, False, nothing)
