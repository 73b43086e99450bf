"""How the pages write names, times and figures; pure functions used as Jinja2 filters.

Names (task ids, keys, workers) and payloads are any strings (SPEC §1), so
they go through walqueue.display first, which writes control, bidi and
invisible characters as escapes (`\\u202e`), and then through Jinja2's HTML
escaping (autoescape is on for every template), which makes `<script>`
text. An id in a URL is percent-encoded whole (`/` included).
"""

from __future__ import annotations

import json
import time
from typing import Any
from urllib.parse import quote, unquote

from walqueue import display


def name(value: str | None) -> str:
    return "-" if value is None else display.name(value)


def text(message: str) -> str:
    """A message that quotes names: controls and bidi escaped, backslashes kept."""
    return display.text(message)


def url_part(value: str) -> str:
    """`value` as one path segment or query value (surrogates, which no id holds, kept)."""
    return quote(value, safe="", errors="surrogatepass")


def task_url(task_id: str) -> str:
    """The URL of a task's page: /tasks/ID, or /task?id=ID for the ids `.` and `..`, which a
    browser would take for a path's dot segments even percent-encoded."""
    if task_id in (".", ".."):
        return "/task?id=" + url_part(task_id)
    return "/tasks/" + url_part(task_id)


def from_url_part(value: str) -> str:
    """The id a form sent as `url_part(id)` (forms carry ids encoded: HTML would turn a NUL in a
    value into U+FFFD, and browsers rewrite line breaks)."""
    return unquote(value, errors="strict")


def payload_text(payload: dict | None) -> str:
    """A payload pretty-printed, with display's escapes for what a reader could not see."""
    if payload is None:
        return "-"
    # The indentation's line breaks are the only raw ones (json.dumps escapes those in strings),
    # so each line is escaped on its own and the breaks are kept.
    text = json.dumps(payload, indent=2, ensure_ascii=False, sort_keys=False)
    return "\n".join(display.json_text(line) for line in text.split("\n"))


duration = display.duration  # 42 s, 3 min 5 s, 2 h 10 min, 3 d 4 h (shared with walqueue-ctl top)


def relative(at: int | float | None, now: float) -> str:
    """"in 3 min", "2 h 5 min ago" or "now", from `now`."""
    if at is None:
        return "-"
    if at <= 0:
        return "due"
    difference = at - now
    if abs(difference) < 1:
        return "now"
    return f"in {duration(difference)}" if difference > 0 else f"{duration(-difference)} ago"


def local_time(at: int | float | None) -> str:
    """A time as the server's local time, with its zone (0 is 'at once')."""
    if at is None:
        return "-"
    if at <= 0:
        return "0 (at once)"
    return time.strftime("%Y-%m-%d %H:%M:%S %Z", time.localtime(at))


def milliseconds(seconds: float | None) -> str:
    return "-" if seconds is None else f"{seconds * 1000:.3g} ms"


def number(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.1f}"
    return str(value)


FILTERS = {"name": name, "text": text, "task_url": task_url, "url_part": url_part, "payload_text": payload_text, "duration": duration,
           "local_time": local_time, "milliseconds": milliseconds, "number": number}
