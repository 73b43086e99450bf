"""walqueued's logger, and the escaping that keeps one event on one log line."""

from __future__ import annotations

import logging

log = logging.getLogger("walqueued")


def one_line(text: str) -> str:
    """``text`` with every non-printable character escaped, for a log line.

    Client bytes reach log messages (e.g. an unknown field's name in a
    decode error); a newline there must not start a forged log line.
    """
    if text.isprintable():
        return text
    return "".join(ch if ch.isprintable() else ch.encode("unicode_escape").decode("ascii") for ch in text)
