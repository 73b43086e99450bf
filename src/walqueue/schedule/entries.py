"""The schedule file (SPEC §8b): TOML, one `[[task]]` table per entry.

```toml
[[task]]
name = "nightly-report"        # the task ids: nightly-report@2026-12-02T01:30:00Z
cron = "30 2 * * *"            # five fields: minute hour day-of-month month day-of-week
timezone = "Europe/Berlin"     # cron only; an IANA name; default UTC
payload = { kind = "report" }  # a table; default {}
max_attempts = 5               # default 3
catch_up = 3                   # periods put after a scheduler was down; default 1

[[task]]
name = "heartbeat"
every = 60                     # whole seconds; period k starts at k*60 s since the epoch (UTC)
```

`load(path, now=...)` and `parse(text, path, now=...)` return the entries
or raise `ScheduleFileError` naming the file and line of what is wrong:
TOML syntax (as tomllib reports it), an unknown field (a typo such as
`catchup` would otherwise be ignored), a missing or doubled name, a bad cron
expression or time zone, a payload that is not JSON (TOML dates and times,
inf and nan are not), a number out of range. `now` is only used to check
that a cron expression fires at all (cronsim looks 50 years ahead).

tomllib does not say where a table came from, so the lines are found in the
text: the k-th `[[task]]` header is the k-th entry, and a field is the line
inside that entry's stretch of text that assigns it (or the header when the
field is written some other way). When the headers cannot be matched to
the entries (an inline `task = [...]` array) errors name the entry by its
number instead.
"""

from __future__ import annotations

import dataclasses
import os
import re
import tomllib
from typing import Any

from walqueue import validation
from walqueue.codec import MAX_FRAME_BYTES, canonical_json
from walqueue.errors import InvalidRequest
from walqueue.schedule import periods

FIELDS = ("name", "cron", "every", "timezone", "payload", "max_attempts", "catch_up")
DEFAULT_MAX_ATTEMPTS = 3  # SPEC §1's default for put
DEFAULT_CATCH_UP = 1
MAX_CATCH_UP = 1000  # periods put at once after a scheduler was down
MAX_EVERY_SECONDS = 100 * 366 * 86400
MAX_ENTRIES = 10_000
MAX_FILE_BYTES = 4 * 1024 * 1024
# The key is NAME@YYYY-MM-DDTHH:MM:SSZ and must stay within SPEC §1's 1024 bytes.
MAX_NAME_BYTES = validation.MAX_NAME_BYTES - len("@2026-12-02T01:30:00Z")
# A payload leaves room in one frame for the rest of the put record.
MAX_PAYLOAD_BYTES = MAX_FRAME_BYTES - 64 * 1024

_TASK_HEADER = re.compile(r"""^\s*\[\[\s*(?:task|"task"|'task')\s*\]\]\s*(?:#.*)?$""")
_ANY_HEADER = re.compile(r"^\s*\[")
_TOML_POSITION = re.compile(r"\s*\(at line (\d+), column (\d+)\)$")
_TOML_END = re.compile(r"\s*\(at end of document\)$")


class ScheduleFileError(ValueError):
    """The schedule file cannot be used. `path` and `line` (None when unknown) say where."""

    def __init__(self, message: str, *, path: str, line: int | None = None) -> None:
        where = f"{path}:{line}" if line is not None else path
        super().__init__(f"{where}: {message}")
        self.path = path
        self.line = line


@dataclasses.dataclass(frozen=True)
class Entry:
    """One `[[task]]` of a schedule file, checked. `line` is its header's line (None if unknown)."""

    name: str
    timing: periods.Timing
    payload: dict
    max_attempts: int = DEFAULT_MAX_ATTEMPTS
    catch_up: int = DEFAULT_CATCH_UP
    line: int | None = None

    @property
    def cron(self) -> str | None:
        return self.timing.cron

    @property
    def every(self) -> int | None:
        return self.timing.every

    @property
    def timezone(self) -> str | None:
        """The cron expression's time zone; None for `every` (aligned to the epoch in UTC)."""
        return self.timing.zone if self.timing.cron is not None else None

    def describe(self) -> str:
        """How the entry's periods start, for a human."""
        if self.timing.every is not None:
            return f"every {self.timing.every} s"
        return f"cron '{self.timing.cron}' in {self.timing.zone}"


def load(path: str | os.PathLike, *, now: int) -> list[Entry]:
    """The entries of the schedule file at `path`. Raises ScheduleFileError (also when it cannot be read)."""
    name = os.fspath(path)
    try:
        with open(name, "rb") as file:
            data = file.read(MAX_FILE_BYTES + 1)
    except OSError as error:
        raise ScheduleFileError(f"cannot read the schedule file: {error.strerror or error}",
                                path=name) from None
    if len(data) > MAX_FILE_BYTES:
        raise ScheduleFileError(f"is larger than {MAX_FILE_BYTES} bytes; is it a schedule file?", path=name)
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as error:
        line = data[:error.start].count(b"\n") + 1
        raise ScheduleFileError("is not UTF-8 (TOML files are)", path=name, line=line) from None
    return parse(text, name, now=now)


def parse(text: str, path: str = "<schedule>", *, now: int) -> list[Entry]:
    """The entries of a schedule file's text. Raises ScheduleFileError naming the line."""
    try:
        document = tomllib.loads(text)
    except tomllib.TOMLDecodeError as error:
        raise _syntax_error(error, text, path) from None
    lines = _Lines(text)
    for key in document:
        if key != "task":
            raise ScheduleFileError(f"unknown top-level key {key!r}: a schedule file holds only "
                                    f"[[task]] tables", path=path, line=lines.top_level(key))
    tasks = document.get("task")
    if tasks is None or tasks == []:
        raise ScheduleFileError("has no [[task]] entries: add one table per periodic task, e.g.\n"
                                "  [[task]]\n  name = \"heartbeat\"\n  every = 60", path=path)
    if not isinstance(tasks, list) or not all(isinstance(task, dict) for task in tasks):
        raise ScheduleFileError("'task' must be an array of tables, written [[task]]", path=path,
                                line=lines.top_level("task"))
    if len(tasks) > MAX_ENTRIES:
        raise ScheduleFileError(f"has {len(tasks)} entries, more than {MAX_ENTRIES}", path=path)
    lines.match_entries(len(tasks))
    entries: list[Entry] = []
    first_line_of: dict[str, int | None] = {}
    for index, table in enumerate(tasks):
        entry = _entry(table, index, lines, path, now)
        if entry.name in first_line_of:
            first = first_line_of[entry.name]
            where = f"line {first}" if first is not None else "an earlier entry"
            raise ScheduleFileError(f"name {entry.name!r} is already used at {where}: each entry "
                                    f"needs a name of its own (it makes the task ids)", path=path,
                                    line=lines.field(index, "name"))
        first_line_of[entry.name] = entry.line
        entries.append(entry)
    return entries


def _syntax_error(error: tomllib.TOMLDecodeError, text: str, path: str) -> ScheduleFileError:
    message = str(error)
    position = _TOML_POSITION.search(message)
    if position is not None:
        return ScheduleFileError(f"not valid TOML: {message[:position.start()]} "
                                 f"(column {position.group(2)})", path=path,
                                 line=int(position.group(1)))
    end = _TOML_END.search(message)
    if end is not None:
        return ScheduleFileError(f"not valid TOML: {message[:end.start()]} (at the end of the file)",
                                 path=path, line=text.count("\n") + 1)
    return ScheduleFileError(f"not valid TOML: {message}", path=path)


class _Lines:
    """Where things are in the text: the `[[task]]` headers and the lines that assign fields."""

    def __init__(self, text: str) -> None:
        self.text_lines = text.splitlines()
        self.headers = [number for number, line in enumerate(self.text_lines, 1) if _TASK_HEADER.match(line)]
        self.matched = False

    def match_entries(self, count: int) -> None:
        self.matched = len(self.headers) == count

    def header(self, index: int) -> int | None:
        return self.headers[index] if self.matched else None

    def _assignment(self, key: str, first: int, last: int) -> int | None:
        pattern = re.compile(rf"""^\s*(?:{re.escape(key)}|"{re.escape(key)}"|'{re.escape(key)}')\s*[=.]""")
        for number in range(first, last + 1):
            if pattern.match(self.text_lines[number - 1]):
                return number
        return None

    def field(self, index: int, key: str) -> int | None:
        """The line assigning `key` in entry `index` (its header's line if not found)."""
        header = self.header(index)
        if header is None:
            return None
        following = self.headers[index + 1] - 1 if index + 1 < len(self.headers) else len(self.text_lines)
        found = self._assignment(key, header + 1, following)
        if found is None and key == "payload":
            sub_table = re.compile(r"^\s*\[\s*task\s*\.\s*payload\b")
            found = next((number for number in range(header + 1, following + 1)
                          if sub_table.match(self.text_lines[number - 1])), None)
        return found or header

    def top_level(self, key: str) -> int | None:
        """The line of a top-level key or table named `key`, if it is before the first [[task]]
        or written as a table header."""
        last = (self.headers[0] - 1) if self.headers else len(self.text_lines)
        found = self._assignment(key, 1, last)
        if found is not None:
            return found
        header = re.compile(rf"""^\s*\[+\s*(?:{re.escape(key)}|"{re.escape(key)}"|'{re.escape(key)}')\s*[\].]""")
        return next((number for number, line in enumerate(self.text_lines, 1) if header.match(line)), None)


def _entry(table: dict[str, Any], index: int, lines: _Lines, path: str, now: int) -> Entry:
    header = lines.header(index)
    label = f"[[task]] number {index + 1}" if header is None else "[[task]]"

    def fail(key: str | None, message: str) -> ScheduleFileError:
        line = header if key is None else lines.field(index, key)
        name = table.get("name")
        named = f" {name!r}" if isinstance(name, str) and name else ""
        return ScheduleFileError(f"{label}{named}: {message}", path=path, line=line)

    unknown = [key for key in table if key not in FIELDS]
    if unknown:
        raise fail(unknown[0], f"unknown field {unknown[0]!r} (the fields are: {', '.join(FIELDS)})")
    name = table.get("name")
    if name is None:
        raise fail(None, "has no name: give each entry a name = \"...\" (it makes the task ids)")
    if not isinstance(name, str) or not name:
        raise fail("name", f"name must be a non-empty string, not {_kind(name)}")
    if any(character.isspace() or not character.isprintable() for character in name):
        raise fail("name", f"name {name!r} holds a space or a control character; task ids are "
                           f"read in logs and tables, so names have none")
    try:
        size = len(name.encode("utf-8"))
    except UnicodeEncodeError:
        raise fail("name", f"name {name!r} is not encodable as UTF-8") from None
    if size > MAX_NAME_BYTES:
        raise fail("name", f"name is {size} bytes as UTF-8, above {MAX_NAME_BYTES} (the task id "
                           f"adds the period's start and must stay within {validation.MAX_NAME_BYTES})")

    has_cron, has_every = "cron" in table, "every" in table
    if has_cron == has_every:
        raise fail(None, "give exactly one of cron = \"m h dom mon dow\" and every = SECONDS"
                         if not has_cron else "has both cron and every: give one of them")
    if has_cron:
        expression = table["cron"]
        if not isinstance(expression, str):
            raise fail("cron", f"cron must be a string such as \"30 2 * * *\", not {_kind(expression)}")
        try:
            expression = periods.parse_cron(expression)
        except ValueError as error:
            raise fail("cron", f"cron {table['cron']!r}: {error}") from None
        zone_name = table.get("timezone", "UTC")
        if not isinstance(zone_name, str):
            raise fail("timezone", f"timezone must be a string such as \"Europe/Berlin\", not {_kind(zone_name)}")
        try:
            periods.zone_of(zone_name)
        except ValueError as error:
            raise fail("timezone", f"timezone: {error}") from None
        timing = periods.Timing(cron=expression, zone=zone_name)
        try:
            periods.next_start(timing, now)
        except periods.NeverFires as error:
            raise fail("cron", f"cron {expression!r} never fires: {error}") from None
    else:
        every = table["every"]
        if type(every) is not int:
            raise fail("every", f"every must be whole seconds (an integer such as 60), not {_kind(every)}")
        if not 1 <= every <= MAX_EVERY_SECONDS:
            raise fail("every", f"every = {every} is out of range [1, {MAX_EVERY_SECONDS}] seconds")
        if "timezone" in table:
            raise fail("timezone", "timezone applies to cron only: every = N is aligned to the Unix "
                                   "epoch in UTC (period k starts at k*N seconds)")
        timing = periods.Timing(every=every)

    payload = table.get("payload", {})
    if not isinstance(payload, dict):
        raise fail("payload", f"payload must be a table, such as payload = {{ kind = \"report\" }}, "
                              f"not {_kind(payload)}")
    try:
        payload = validation.payload(payload)
        size = len(canonical_json(payload))
    except InvalidRequest as error:
        raise fail("payload", f"{error} (TOML dates and times are not JSON: write them as strings)") from None
    if size > MAX_PAYLOAD_BYTES:
        raise fail("payload", f"payload is {size} bytes as JSON, above {MAX_PAYLOAD_BYTES}")
    max_attempts = _integer(table, "max_attempts", DEFAULT_MAX_ATTEMPTS, 1, validation.MAX_INT, fail)
    catch_up = _integer(table, "catch_up", DEFAULT_CATCH_UP, 1, MAX_CATCH_UP, fail)
    return Entry(name=name, timing=timing, payload=payload, max_attempts=max_attempts, catch_up=catch_up,
                 line=header)


def _integer(table: dict[str, Any], key: str, default: int, minimum: int, maximum: int, fail) -> int:
    value = table.get(key, default)
    if type(value) is not int:
        raise fail(key, f"{key} must be an integer, not {_kind(value)}")
    if not minimum <= value <= maximum:
        raise fail(key, f"{key} = {value} is out of range [{minimum}, {maximum}]")
    return value


def _kind(value: Any) -> str:
    """What TOML calls the type of a parsed value."""
    if isinstance(value, bool):
        return "a boolean"
    if isinstance(value, int):
        return "an integer"
    if isinstance(value, float):
        return "a float"
    if isinstance(value, str):
        return "a string"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, dict):
        return "a table"
    return f"a {type(value).__name__}"
