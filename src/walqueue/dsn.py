"""A DSN's credentials kept out of everything printed (SPEC §8b); standard library only.

`redacted(text, dsn=None)` is the one function every tool, log line and
error message goes through before it shows a DSN, or text that may quote
one: `postgresql://u:***@host/db`, `host=db password=***`.

It masks every password `text` shows itself:

* in a `postgresql://` or `postgres://` URL (the scheme in any case), the
  `user:password@` part: everything from the first `:` to the last `@`,
  so a password holding a raw `@` or `/` is masked whole;
* in such a URL's query, the value of any parameter whose name contains
  `password` (`password`, `sslpassword`), up to the next `&name=`;
* in libpq's key=value form, the value of any keyword containing
  `password`: a single-quoted value up to its closing quote (backslash
  escapes honoured; unterminated: to the end), an unquoted one up to the
  next ` keyword=` (not the first space: `password=a b` is not valid, but
  its `b` is still secret), or to the end.

With `dsn`, it also masks that DSN's passwords wherever they appear in
`text` (as written, percent-decoded, unescaped, and each of their words):
libpq's messages about a DSN it cannot parse quote pieces of it
(`invalid percent-encoded token: "s3c%zz"`, `missing "=" after "pw"`).

The parse is deliberately cruder than libpq's and errs towards masking
more: a URL that begins `text` runs to its end, one inside a message ends at
whitespace or a quote. A value that is `***` already is left as it is, so
redacting a message built of redacted parts changes nothing.
"""

from __future__ import annotations

import re
from urllib.parse import unquote

MASK = "***"

_SCHEME = re.compile(r"postgres(?:ql)?://", re.IGNORECASE)
_URL_END = re.compile(r"[\s\"']")
# A keyword naming a secret, at the start of a word, and its "=" (libpq allows spaces around it).
_SECRET_KEYWORD = re.compile(r"(?<!\w)\w*password\w*\s*=\s*", re.IGNORECASE)
# Where an unquoted key=value value surely ends: whitespace, then the next keyword and its "=".
_NEXT_KEYWORD = re.compile(r"\s+\w+\s*=")
# Where a URL query value surely ends: the next parameter that has a "=".
_NEXT_PARAMETER = re.compile(r"&[^&=]*=")
_ESCAPE = re.compile(r"\\(.)", re.DOTALL)
# A value redacted already: the mask, then the end, a space, or the ": " of a message going on.
_ALREADY_MASKED = re.compile(re.escape(MASK) + r"(?=$|\s|:\s|:$)")


def redacted(text: str, dsn: str | None = None) -> str:
    """`text` with every password it shows, and every one of `dsn`'s, replaced by `***`."""
    if not isinstance(text, str):
        raise TypeError(f"redacted() takes the text as a str, got {type(text).__name__}")
    if dsn is not None and not isinstance(dsn, str):
        raise TypeError(f"redacted() takes the dsn as a str or None, got {type(dsn).__name__}")
    spans = _password_spans(text)
    secrets = set() if dsn is None else _secrets(dsn, _password_spans(dsn))
    shown = text
    for start, end in reversed(spans):
        shown = shown[:start] + MASK + shown[end:]
    return _scrub(shown, secrets)


def _password_spans(text: str) -> list[tuple[int, int]]:
    """The (start, end) of each password in `text`, in order, not overlapping."""
    spans: list[tuple[int, int]] = []
    urls: list[tuple[int, int]] = []
    for match in _SCHEME.finditer(text):
        if urls and match.start() < urls[-1][1]:
            continue  # a scheme inside the URL before it (in its password, say)
        if text[:match.start()].strip() == "":
            end = len(text)  # the text is the URL: a raw space in it is part of it
        else:
            found = _URL_END.search(text, match.end())
            end = len(text) if found is None else found.start()
        urls.append((match.start(), end))
        spans.extend(_url_spans(text, match.end(), end))
    value_end = 0
    for match in _SECRET_KEYWORD.finditer(text):
        start = match.end()
        in_url = any(url_start <= match.start() < url_end for url_start, url_end in urls)
        if in_url and text[match.start() - 1] in "?&":
            continue  # a parameter of a URL's query: done above
        if match.start() < value_end:
            continue  # inside the value before it
        if _ALREADY_MASKED.match(text, start):
            value_end = start + len(MASK)  # so a message made of redacted parts keeps the rest
        elif text.startswith("'", start):
            value_end = _quoted_end(text, start)
        else:
            value_end = _unquoted_end(text, start)
        spans.append((start, value_end))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(spans):  # a value running to the end may cover a URL's password
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged


def _url_spans(text: str, start: int, end: int) -> list[tuple[int, int]]:
    """The passwords of the URL whose authority starts at `start` and that ends at `end`."""
    spans = []
    query_from = start
    at = text.rfind("@", start, end)
    if at >= 0:
        colon = text.find(":", start, at)
        if colon >= 0:
            spans.append((colon + 1, at))
        query_from = at + 1
    question = text.find("?", query_from, end)
    if question < 0:
        return spans
    position = question + 1
    while position < end:
        following = _NEXT_PARAMETER.search(text, position, end)
        parameter_end = end if following is None else following.start()
        name, equals, _ = text[position:parameter_end].partition("=")
        if equals and "password" in unquote(name).lower():
            spans.append((position + len(name) + 1, parameter_end))
        position = parameter_end + 1
    return spans


def _quoted_end(text: str, start: int) -> int:
    """Just past the quote closing the value that opens at `start`, or the end of `text`."""
    position = start + 1
    while position < len(text):
        if text[position] == "\\":
            position += 2
        elif text[position] == "'":
            return position + 1
        else:
            position += 1
    return len(text)


def _unquoted_end(text: str, start: int) -> int:
    """Where an unquoted value starting at `start` ends: before the next ` keyword=`, or the end."""
    position = start
    while position < len(text):
        if text[position] == "\\":
            position += 2  # an escaped space belongs to the value
        elif text[position].isspace() and _NEXT_KEYWORD.match(text, position):
            return position
        else:
            position += 1
    return len(text.rstrip()) if len(text.rstrip()) > start else len(text)


def _secrets(text: str, spans: list[tuple[int, int]]) -> set[str]:
    """Each password at `spans` as written, decoded and unescaped, and each of its words."""
    found = set()
    for start, end in spans:
        raw = text[start:end]
        inner = raw[1:-1] if len(raw) >= 2 and raw[0] == raw[-1] == "'" else raw.lstrip("'")
        for form in (raw, inner, unquote(raw), _ESCAPE.sub(r"\1", inner)):
            found.add(form)
            found.update(form.split())
    return {secret for secret in found if secret.strip() and secret != MASK}


def _scrub(text: str, secrets: set[str]) -> str:
    """`text` with each secret masked: a long one anywhere, a word of one only as a whole word."""
    for secret in sorted(secrets, key=len, reverse=True):
        if secret not in text:
            continue
        if len(secret.strip()) >= 4:
            text = text.replace(secret, MASK)
        else:
            # A short word (a piece of a password, or a short password) only where it stands alone,
            # as libpq quotes it ("pw"), so "a" in a password leaves the other a's of a message.
            text = re.sub(rf"(?<![^\s\"'=:@]){re.escape(secret)}(?![^\s\"'&@])", MASK, text)
    return text
