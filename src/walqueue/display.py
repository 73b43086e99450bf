"""Names and messages made safe to print for a human; standard library only.

Task ids, keys and worker names are any non-empty strings (SPEC §1), so a
name printed raw can move the cursor, recolour the terminal (ESC and C1
controls), start a new line that forges a table row, reorder what follows
(bidi controls), or hide in plain sight: `é` composed (NFC) and `e` plus a
combining accent (NFD) look the same, and so do `ab` and `a<U+200B>b`.

Three pure functions, one rule each (and `duration`, a time span as an
operator reads it, which walqueue-ctl top and walqueue-web share):

* `name(text)` is what tables and messages print for a name: exact and
  unambiguous. Every character that a terminal would act on or not show
  (categories Cc, Cf, Cs, Co, Cn, Zl, Zp, and every space but U+0020) is
  written as a Python escape (`\\x1b`, `\\u202e`, `\\U000e0041`); a
  backslash is doubled, so an escape can never be mistaken for the
  characters of one. In a string that is not in NFC, combining marks are
  escaped too, so its NFD form shows as `e\\u0301`, apart from `é`; a
  combining mark at the very start (which would join the column before it)
  is always escaped.
* `text(message)` is the same for prose that quotes names (a daemon's error
  message): the same characters escaped, but backslashes left alone, since a
  message is read, not copied (and Python's repr in it has escaped already).
* `json_text(encoded)` takes JSON text and writes the same characters as
  JSON `\\u` escapes: the value it decodes to is unchanged (JSON output stays
  exact), but no control or bidi character reaches the terminal raw;
  `json_line(value)` encodes a value so (compact, keys sorted, non-ASCII
  text readable).

Not detected: look-alikes across scripts (Latin `a`, Cyrillic `а`) and
compatibility forms (`ﬁ`, fullwidth letters); use `--json` to see an id
exactly.
"""

from __future__ import annotations

import json
import unicodedata
from typing import Any

# Characters a terminal acts on or does not show: controls (C0, DEL, C1),
# format characters (bidi controls, zero-width spaces and joiners, tags),
# surrogates, private use, unassigned, line and paragraph separators.
_HIDDEN_CATEGORIES = frozenset({"Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp"})
_COMBINING_CATEGORIES = frozenset({"Mn", "Mc", "Me"})


def _hidden(character: str) -> bool:
    category = unicodedata.category(character)
    return category in _HIDDEN_CATEGORIES or (category == "Zs" and character != " ")


def _python_escape(character: str) -> str:
    code = ord(character)
    if code < 0x100:
        return f"\\x{code:02x}"
    if code < 0x10000:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"


def _escape(value: str, *, double_backslash: bool) -> str:
    mark_combining = unicodedata.normalize("NFC", value) != value
    out = []
    for index, character in enumerate(value):
        if character == "\\" and double_backslash:
            out.append("\\\\")
        elif _hidden(character) or (
                unicodedata.category(character) in _COMBINING_CATEGORIES
                and (mark_combining or index == 0)):
            out.append(_python_escape(character))
        else:
            out.append(character)
    return "".join(out)


def name(value: str) -> str:
    """The printable, unambiguous form of a task id, key, worker name or path."""
    return _escape(value, double_backslash=True)


def text(message: str) -> str:
    """A message with its control, bidi and invisible characters escaped (backslashes kept)."""
    return _escape(message, double_backslash=False)


def _json_escape(character: str) -> str:
    code = ord(character)
    if code < 0x10000:
        return f"\\u{code:04x}"
    code -= 0x10000  # astral: a UTF-16 surrogate pair, as JSON spells it
    return f"\\u{0xD800 + (code >> 10):04x}\\u{0xDC00 + (code & 0x3FF):04x}"


def json_text(encoded: str) -> str:
    """JSON text with the characters `name()` escapes written as `\\u` escapes.

    Such characters can only stand inside JSON strings, where an escape
    decodes to the same character, so the value is unchanged.
    """
    if encoded.isascii() and encoded.isprintable():
        return encoded  # the common case, in one pass
    return "".join(_json_escape(c) if _hidden(c) else c for c in encoded)


def json_line(value: Any) -> str:
    """`value` as one line of JSON, safe to print (see json_text)."""
    return json_text(json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")))


def duration(seconds: float, *, zero_remainder: bool = False) -> str:
    """42 s, 3 min 5 s, 2 h 10 min, 3 d 4 h: whole seconds, at most two units. A zero second unit
    is left out ("3 min") unless `zero_remainder` ("3 min 0 s", for columns that keep their width)."""
    whole = int(seconds)
    if whole < 60:
        return f"{whole} s"
    for unit, size, smaller, smaller_size in (("d", 86400, "h", 3600), ("h", 3600, "min", 60),
                                              ("min", 60, "s", 1)):
        if whole >= size:
            rest = whole % size // smaller_size
            return f"{whole // size} {unit}" + (f" {rest} {smaller}" if rest or zero_remainder else "")
    raise AssertionError("unreachable")
