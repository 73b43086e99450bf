"""walqueue.display: what a terminal would act on or hide is escaped; JSON keeps its value."""

import json
import unicodedata

import pytest

from walqueue import display

ESC_RECOLOUR = "evil\x1b[31mred\x1b[0m"
FORGED_ROW = "a\nforged-row  dead  1/1"


@pytest.mark.parametrize("raw, shown", [
    ("plain-id_42", "plain-id_42"),
    ("café", "café"),                                   # NFC: printed as is
    ("日本語-タスク", "日本語-タスク"),
    (ESC_RECOLOUR, "evil\\x1b[31mred\\x1b[0m"),
    (FORGED_ROW, "a\\x0aforged-row  dead  1/1"),
    ("tab\there", "tab\\x09here"),
    ("del\x7f c1\x9b", "del\\x7f c1\\x9b"),
    ("abc\u202edcba", "abc\\u202edcba"),                # right-to-left override
    ("a\u2066b\u2069", "a\\u2066b\\u2069"),             # bidi isolates
    ("a\u200bb", "a\\u200bb"),                          # zero-width space
    ("a\u200db\ufeff", "a\\u200db\\ufeff"),             # zero-width joiner, BOM
    ("tag\U000e0041", "tag\\U000e0041"),                # an invisible tag character
    ("line\u2028sep", "line\\u2028sep"),
    ("no\u00a0break", "no\\xa0break"),                  # looks like a space
    ("back\\slash", "back\\\\slash"),                   # never mistaken for an escape
    ("\u0301starts-with-a-mark", "\\u0301starts-with-a-mark"),
])
def test_a_name_is_printed_with_everything_hidden_or_active_escaped(raw, shown):
    assert display.name(raw) == shown


def test_the_nfc_and_nfd_forms_of_one_id_are_told_apart():
    composed = unicodedata.normalize("NFC", "café")
    decomposed = unicodedata.normalize("NFD", "café")
    assert composed != decomposed
    assert display.name(composed) == "café"
    assert display.name(decomposed) == "cafe\\u0301"


def test_an_id_with_a_zero_width_character_differs_from_the_plain_one():
    assert display.name("ab") != display.name("a\u200bb")


def test_the_escaped_form_is_unambiguous():
    # A literal backslash-x-1-b and a real ESC must not print alike.
    assert display.name("\\x1b") != display.name("\x1b")
    for raw in (ESC_RECOLOUR, FORGED_ROW, "a\u200bb", "\\u200b", "cafe\u0301"):
        shown = display.name(raw)
        assert shown.isprintable() and "\x1b" not in shown and "\n" not in shown
        assert shown.encode("ascii", "backslashreplace").decode("unicode_escape") == raw


def test_a_message_escapes_controls_but_keeps_its_backslashes():
    message = "task 'a\\x1b' is leased; worker \x1b]0;pwned\x07 said\nforged"
    assert display.text(message) == "task 'a\\x1b' is leased; worker \\x1b]0;pwned\\x07 said\\x0aforged"


@pytest.mark.parametrize("value", [
    {"task_id": ESC_RECOLOUR, "payload": {"k\u202e": "v\x9b\u200b", "tag": "\U000e0041"}},
    {"task_id": "café", "n": 1, "list": ["\u2028", "plain"]},
])
def test_json_text_keeps_the_value_exactly_and_shows_nothing_raw(value):
    encoded = json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
    safe = display.json_text(encoded)
    assert json.loads(safe) == value
    assert safe.isprintable()
    assert "café" in safe or "café" not in encoded  # ordinary text stays readable


def test_json_text_leaves_plain_json_untouched():
    encoded = '{"task_id":"a","payload":{"to":"ada@example.com"}}'
    assert display.json_text(encoded) is encoded


def test_a_duration_reads_as_an_operator_says_it_with_or_without_its_zero_remainder():
    from walqueue.display import duration
    assert [duration(s) for s in (0, 59.9, 60, 185, 3600, 3725, 90000)] == [
        "0 s", "59 s", "1 min", "3 min 5 s", "1 h", "1 h 2 min", "1 d 1 h"]
    assert duration(60, zero_remainder=True) == "1 min 0 s" and duration(3600, zero_remainder=True) == "1 h 0 min"
