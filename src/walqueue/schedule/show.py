"""What `walqueue-ctl schedule SCHEDULE_FILE` shows: each entry's next runs and the last period put.

`report(entries, now=..., count=..., lookup=...)` computes it (pure but for
`lookup`, which is the backend's `get`; None when no queue was named, and
then only the next runs are shown). It reads and puts nothing else: the
last period put is found by getting the task ids of the entry's periods,
newest first, starting at the current one, for at most
LOOKBACK_PERIODS periods. `render` makes a table for a human, `to_json`
one JSON object per entry.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from walqueue import display
from walqueue.schedule import periods
from walqueue.schedule.entries import Entry
from walqueue.schedule.runner import LOOKBACK_PERIODS

DEFAULT_COUNT = 3
MAX_COUNT = 100


@dataclasses.dataclass(frozen=True)
class EntryReport:
    entry: Entry
    next_starts: list[int]
    looked_up: bool                      # False: no queue named, nothing was looked up
    last_put: tuple[int, str] | None     # (period start, the task's status)
    periods_looked_at: int


def report(entries: list[Entry], *, now: int, count: int = DEFAULT_COUNT,
           lookup: Callable[[str], Any] | None = None,
           lookback_periods: int = LOOKBACK_PERIODS) -> list[EntryReport]:
    """The next `count` period starts of each entry after `now`, and (with `lookup`) its last
    period put at or before `now`. Raises what `lookup` raises."""
    reports = []
    for entry in entries:
        upcoming = list(_take(periods.starts_after(entry.timing, now, periods.LATEST_START), count))
        last_put, looked_at = None, 0
        if lookup is not None:
            for start in periods.previous_starts(entry.timing, now + 1, lookback_periods):
                looked_at += 1
                task = lookup(periods.task_id(entry.name, start))
                if task is not None:
                    last_put = (start, task.status)
                    break
        reports.append(EntryReport(entry, upcoming, lookup is not None, last_put, looked_at))
    return reports


def _take(iterator, count: int):
    for index, item in enumerate(iterator):
        if index >= count:
            return
        yield item


def render(reports: list[EntryReport], *, target: str | None) -> str:
    """The reports as text for a terminal; `target` None says no queue was named."""
    lines = []
    if target is None:
        lines.append("No queue named (--socket, --dir or --dsn): showing the next runs only, not the "
                     "last periods put.")
    for item in reports:
        entry = item.entry
        lines.append("")
        header = f"{display.name(entry.name)}: {display.name(entry.describe())}, catch_up {entry.catch_up}"
        if entry.line is not None:
            header += f" (line {entry.line})"
        lines.append(header)
        zone = entry.timezone  # None for every: this machine's local time
        for start in item.next_starts:
            lines.append(f"  next  {periods.local_time(start, zone)}   {periods.utc_time(start)}   "
                         f"{display.name(periods.task_id(entry.name, start))}")
        if not item.next_starts:
            lines.append("  next  none (no period starts within 50 years)")
        if item.looked_up:
            if item.last_put is None:
                lines.append(f"  last  none put in the last {item.periods_looked_at} period(s)")
            else:
                start, status = item.last_put
                lines.append(f"  last  {periods.local_time(start, zone)}   {periods.utc_time(start)}   "
                             f"{display.name(periods.task_id(entry.name, start))} ({status})")
    return "\n".join(lines).lstrip("\n")


def to_json(item: EntryReport) -> dict[str, Any]:
    """One entry's report as a JSON object (times as seconds since the epoch and as UTC text)."""
    entry = item.entry
    value: dict[str, Any] = {
        "name": entry.name, "line": entry.line, "cron": entry.cron, "every": entry.every,
        "timezone": entry.timezone, "catch_up": entry.catch_up,
        "next": [{"start": start, "utc": periods.utc_time(start),
                  "local": periods.local_time(start, entry.timezone),
                  "task_id": periods.task_id(entry.name, start)} for start in item.next_starts],
    }
    if item.looked_up:
        value["last_put"] = None if item.last_put is None else {
            "start": item.last_put[0], "utc": periods.utc_time(item.last_put[0]),
            "task_id": periods.task_id(entry.name, item.last_put[0]), "status": item.last_put[1]}
        value["periods_looked_at"] = item.periods_looked_at
    return value
