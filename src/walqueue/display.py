"""Names made safe to print: task ids, keys and worker names in log lines and tables.

A task id, key or worker name is any string (SPEC §1): it may hold a newline
that forges a second log line, an escape sequence that rewrites the terminal,
or a bidi control (U+202E) that makes the text read backwards. `escape()`
writes every such character as a Python-style escape, so what is printed is
one line and shows exactly which characters the name holds.

Invariants: the result holds only printable characters (`str.isprintable()`);
it is the input unchanged when the input has no backslash and no character
that is not printable; different inputs give different results (a backslash
is doubled, so an escape in the output always stands for one character).
Standard library only; used by the Workers and by walqueue-ctl alike.
"""

from __future__ import annotations

__all__ = ["escape"]


def escape(text: str) -> str:
    """``text`` with backslashes doubled and every non-printable character escaped.

    Non-printable is Python's rule (``str.isprintable()``): control characters
    (C0, DEL, C1), format characters such as the bidi controls U+202A-U+202E
    and U+2066-U+2069, line and paragraph separators, spaces other than
    U+0020, surrogates, private-use and unassigned code points. They become
    ``\\xNN``, ``\\uNNNN`` or ``\\UNNNNNNNN``. Raises TypeError for a non-str.
    """
    if not isinstance(text, str):
        raise TypeError(f"escape() takes a str, got {type(text).__name__}")
    if text.isprintable() and "\\" not in text:
        return text  # the common case, without building a new string
    return "".join(_escape_character(character) for character in text)


def _escape_character(character: str) -> str:
    if character == "\\":
        return "\\\\"
    if character.isprintable():
        return character
    code = ord(character)
    if code <= 0xFF:
        return f"\\x{code:02x}"
    if code <= 0xFFFF:
        return f"\\u{code:04x}"
    return f"\\U{code:08x}"
