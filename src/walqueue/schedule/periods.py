"""The period arithmetic of the scheduler: pure functions of a schedule and a time.

A *period* of a schedule entry is named by its start, a whole number of
seconds since the Unix epoch (UTC). Every function here takes the time it
reasons about as an argument: none reads a clock, so the scheduler, its
tests and `walqueue-ctl schedule` all compute the same periods, and two
schedulers on two machines compute the same task ids and identities.

- `every = N`: period k starts at k*N seconds since the epoch, in UTC. The
  alignment is the epoch's, not the moment a scheduler started, so every
  scheduler agrees on it; `every = 86400` starts at 00:00:00Z. Leap seconds
  do not exist in Unix time, so neither do they here.
- `cron = "m h dom mon dow"`: the periods start at the expression's fire
  times in the entry's time zone, as cronsim computes them. cronsim follows
  Debian's cron, DST included: a job at a fixed time (the minute and hour
  fields not starting with `*`) whose local time does not exist on a
  spring-forward day runs at the first minute that exists after it (a 02:30
  job in Europe/Berlin on 2026-03-29 runs at 03:00 CEST, 01:00Z); one whose
  local time happens twice on a fall-back day runs once, at the first
  occurrence (02:30 CEST, 00:30Z, on 2026-10-25). A job whose minute or hour
  field starts with `*` runs by the clock as it is: `0 * * * *` runs 24
  times on a 23-hour day and 26 times on a 25-hour one.

The canonical sequence of an entry's periods is cronsim's forward
iteration, made strictly increasing (a fall-back day can make Debian's rules
name a local time that lies before the one iterated from; such a fire time
is one already passed, and is dropped). Looking backwards (the latest period
at or before a time) uses cronsim's reverse iteration only to find where to
start, then walks that same forward sequence, so both directions agree.

cronsim is imported here and only here: the rest of walqueue.schedule
reaches it through these functions.
"""

from __future__ import annotations

import dataclasses
import zoneinfo
from collections.abc import Iterator
from datetime import UTC, datetime

try:
    from cronsim import CronSim, CronSimError
except ImportError as error:  # an optional dependency: say which extra brings it
    raise ImportError(f"walqueue.schedule needs cronsim, which is not installed ({error}): "
                      f"from the clone, pip install -e '.[scheduler]' (docs/scheduler.md)") from error

# Period starts the scheduler can name: from the epoch to the last second of
# year 9999 (the key's YYYY has four digits).
LATEST_START = int(datetime(9999, 12, 31, 23, 59, 59, tzinfo=UTC).timestamp())
CRON_FIELDS = 5
# cronsim gives up after 50 years without a fire time; so do we, saying so.
CRON_HORIZON_YEARS = 50
KEY_TIME_FORMAT = "%Y-%m-%dT%H:%M:%SZ"


class NeverFires(ValueError):
    """A cron expression with no fire time in the next (or last) CRON_HORIZON_YEARS years."""


@dataclasses.dataclass(frozen=True)
class Timing:
    """When an entry's periods start: exactly one of `cron` and `every` is set.

    `zone` is the cron expression's time zone (an IANA name); `every` has
    none: it is aligned to the epoch in UTC.
    """

    cron: str | None = None
    every: int | None = None
    zone: str = "UTC"

    def __post_init__(self) -> None:
        if (self.cron is None) == (self.every is None):
            raise ValueError("a Timing has exactly one of cron and every")


def parse_cron(expression: str) -> str:
    """The expression, checked: five fields cronsim accepts. Raises ValueError saying what is wrong."""
    fields = expression.split()
    if len(fields) != CRON_FIELDS:
        raise ValueError(f"has {len(fields)} fields; a cron expression has five: minute, hour, "
                         f"day of month, month, day of week (e.g. '30 2 * * *')")
    try:
        CronSim(expression, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as error:
        raise ValueError(f"{error} field") from None
    return " ".join(fields)


def zone_of(name: str) -> zoneinfo.ZoneInfo:
    """The IANA time zone `name`. Raises ValueError naming it if there is no such zone."""
    try:
        return zoneinfo.ZoneInfo(name)
    except (zoneinfo.ZoneInfoNotFoundError, ValueError):
        raise ValueError(f"unknown time zone {name!r}: give an IANA name such as 'Europe/Berlin', "
                         f"'America/New_York' or 'UTC'") from None


def task_id(name: str, start: int) -> str:
    """The task id and key of `name`'s period starting at `start`: NAME@YYYY-MM-DDTHH:MM:SSZ."""
    return f"{name}@{datetime.fromtimestamp(start, UTC).strftime(KEY_TIME_FORMAT)}"


def _forward(timing: Timing, after: int) -> Iterator[int]:
    """The period starts strictly after `after`, increasing, up to LATEST_START."""
    if timing.every is not None:
        start = (after // timing.every + 1) * timing.every
        while start <= LATEST_START:
            yield start
            start += timing.every
        return
    zone = zone_of(timing.zone)
    iterator = CronSim(timing.cron, datetime.fromtimestamp(after, zone))
    last = after
    for fire in iterator:
        start = int(fire.timestamp())
        if start > LATEST_START:
            return
        if start > last:  # see the module docstring: a fall-back day can name a passed time
            last = start
            yield start


def next_start(timing: Timing, after: int) -> int:
    """The first period start strictly after `after`. Raises NeverFires if there is none."""
    for start in _forward(timing, after):
        return start
    raise NeverFires(f"no period starts within {CRON_HORIZON_YEARS} years after {utc_time(after)}")


def starts_after(timing: Timing, after: int, until: int) -> Iterator[int]:
    """The period starts s with after < s <= until, increasing."""
    for start in _forward(timing, after):
        if start > until:
            return
        yield start


def latest_start(timing: Timing, at: int) -> int | None:
    """The latest period start at or before `at` (the period `at` lies in), or None if none
    started in the CRON_HORIZON_YEARS years before it (or before the epoch)."""
    if at < 0:
        return None
    if timing.every is not None:
        return at // timing.every * timing.every
    zone = zone_of(timing.zone)
    # cronsim's reverse iteration yields times before its start: start it a second after `at`.
    backwards = CronSim(timing.cron, datetime.fromtimestamp(at + 1, zone), reverse=True)
    for fire in backwards:
        anchor = int(fire.timestamp())
        if anchor > at:
            continue
        found = None
        for start in starts_after(timing, anchor - 1, at):
            found = start
        if found is not None:
            return found
    return None


def window(timing: Timing, at: int, periods: int) -> list[int]:
    """The last `periods` period starts at or before `at`, oldest first (fewer near the epoch)."""
    starts: list[int] = []
    latest = latest_start(timing, at)
    while latest is not None and len(starts) < periods:
        starts.append(latest)
        latest = latest_start(timing, latest - 1)
    starts.reverse()
    return starts


def previous_starts(timing: Timing, before: int, limit: int) -> Iterator[int]:
    """Up to `limit` period starts strictly before `before`, newest first."""
    latest = latest_start(timing, before - 1)
    count = 0
    while latest is not None and count < limit:
        yield latest
        count += 1
        latest = latest_start(timing, latest - 1)


def local_time(start: int, zone: str | None) -> str:
    """`start` as a wall-clock time in `zone` (None: this machine's), with its zone's abbreviation."""
    moment = datetime.fromtimestamp(start, UTC)
    local = moment.astimezone(zone_of(zone)) if zone is not None else moment.astimezone()
    return local.strftime("%Y-%m-%d %H:%M:%S %Z")


def utc_time(start: int) -> str:
    return datetime.fromtimestamp(start, UTC).strftime(KEY_TIME_FORMAT)
