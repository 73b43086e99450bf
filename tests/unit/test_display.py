"""walqueue.display.escape: names print as one line of printable characters, unambiguously."""

import random

import pytest

from walqueue.display import escape


@pytest.mark.parametrize("name, shown", [
    ("email-1", "email-1"),
    ("ünïcödé-任务", "ünïcödé-任务"),
    ("a\nb", "a\\x0ab"),
    ("\x1b[2J", "\\x1b[2J"),
    ("\x7f\x85", "\\x7f\\x85"),
    ("invoice-\u202egnp.exe", "invoice-\\u202egnp.exe"),
    ("\u2066x\u2069", "\\u2066x\\u2069"),
    ("zero\u200bwidth", "zero\\u200bwidth"),
    ("line\u2028sep", "line\\u2028sep"),
    ("nbsp\u00a0", "nbsp\\xa0"),
    ("lone\ud800", "lone\\ud800"),
    ("private\U000f0000", "private\\U000f0000"),
    ("back\\slash", "back\\\\slash"),
    ("", ""),
])
def test_control_bidi_and_invisible_characters_are_escaped(name, shown):
    assert escape(name) == shown


def test_the_output_is_printable_and_tells_different_names_apart():
    seed = random.randrange(2**32)
    generator = random.Random(seed)
    alphabet = ["a", "\\", "x", "0", "\n", "\u202e", "\x00", "\ud800", "é", " ", "u"]
    seen = {}
    for _ in range(3000):
        name = "".join(generator.choice(alphabet) for _ in range(generator.randrange(6)))
        shown = escape(name)
        assert shown.isprintable(), f"seed {seed}: {name!r} -> {shown!r}"
        assert seen.setdefault(shown, name) == name, f"seed {seed}: {name!r} and {seen[shown]!r} both show as {shown!r}"


def test_a_name_that_is_not_a_str_is_refused_by_type():
    with pytest.raises(TypeError, match="takes a str, got bytes"):
        escape(b"task")
