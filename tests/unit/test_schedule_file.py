"""The schedule file (walqueue.schedule.entries): a good file gives its entries with SPEC
§8b's defaults; a broken one is refused with the file and the line of what is wrong, and
says what would be right."""

from __future__ import annotations

import textwrap

import pytest

from walqueue.schedule import entries
from walqueue.schedule.entries import ScheduleFileError, parse
from walqueue.schedule.periods import Timing

NOW = 1_796_220_187  # 2026-12-02T14:03:07Z


def parsed(text: str):
    return parse(textwrap.dedent(text), "schedule.toml", now=NOW)


def test_a_good_file_gives_its_entries_with_the_defaults():
    found = parsed("""\
        # the nightly report
        [[task]]
        name = "nightly-report"
        cron = "30  2 * * *"
        timezone = "Europe/Berlin"
        max_attempts = 5
        catch_up = 3
        [task.payload]
        kind = "report"
        pages = [1, 2.5, true]

        [[task]]
        name = "heartbeat"
        every = 60
        """)
    nightly, heartbeat = found
    assert nightly.timing == Timing(cron="30 2 * * *", zone="Europe/Berlin")
    assert (nightly.payload, nightly.max_attempts, nightly.catch_up, nightly.line) == (
        {"kind": "report", "pages": [1, 2.5, True]}, 5, 3, 2)
    assert heartbeat.timing == Timing(every=60)
    assert (heartbeat.payload, heartbeat.max_attempts, heartbeat.catch_up, heartbeat.line) == ({}, 3, 1, 12)
    assert heartbeat.timezone is None and nightly.timezone == "Europe/Berlin"
    assert parsed('[[task]]\nname = "x"\ncron = "0 0 * * *"\n')[0].timezone == "UTC"


BROKEN = {
    "toml syntax": ('[[task]]\nname = "x"\nevery = \n', 3, "not valid TOML: Invalid value"),
    "unterminated string": ('[[task]]\nname = "x\n', 2, "not valid TOML"),
    "unknown field": ('[[task]]\nname = "x"\nevery = 60\ncatchup = 2\n', 4,
                      "unknown field 'catchup' (the fields are: name, cron, every"),
    "unknown top-level key": ('title = "mine"\n[[task]]\nname = "x"\nevery = 60\n', 1,
                              "unknown top-level key 'title'"),
    "no name": ('[[task]]\nevery = 60\n', 1, "has no name"),
    "name not a string": ('[[task]]\nname = 7\nevery = 60\n', 2, "name must be a non-empty string, not an integer"),
    "name with a space": ('[[task]]\nname = "a b"\nevery = 60\n', 2, "holds a space or a control character"),
    "doubled name": ('[[task]]\nname = "x"\nevery = 60\n\n[[task]]\nname = "x"\nevery = 30\n', 6,
                     "name 'x' is already used at line 1"),
    "neither cron nor every": ('[[task]]\nname = "x"\n', 1, "give exactly one of cron"),
    "both cron and every": ('[[task]]\nname = "x"\ncron = "* * * * *"\nevery = 60\n', 1, "has both cron and every"),
    "six cron fields": ('[[task]]\nname = "x"\ncron = "0 30 2 * * *"\n', 3, "has 6 fields; a cron expression has five"),
    "bad minute": ('[[task]]\nname = "x"\n\ncron = "61 * * * *"\n', 4, "cron '61 * * * *': Bad minute field"),
    "bad day of week": ('[[task]]\nname = "x"\ncron = "0 0 * * FUNDAY"\n', 3, "Bad day-of-week field"),
    "cron not a string": ('[[task]]\nname = "x"\ncron = 5\n', 3, "cron must be a string"),
    "never fires": ('[[task]]\nname = "x"\ncron = "* * */20 * 1L"\n', 3, "never fires"),
    "unknown time zone": ('[[task]]\nname = "x"\ncron = "0 0 * * *"\ntimezone = "Europe/Atlantis"\n', 4,
                          "unknown time zone 'Europe/Atlantis'"),
    "time zone with every": ('[[task]]\nname = "x"\nevery = 60\ntimezone = "UTC"\n', 4,
                             "timezone applies to cron only"),
    "every a float": ('[[task]]\nname = "x"\nevery = 60.0\n', 3, "every must be whole seconds (an integer"),
    "every a string": ('[[task]]\nname = "x"\nevery = "5m"\n', 3, "every must be whole seconds"),
    "every zero": ('[[task]]\nname = "x"\nevery = 0\n', 3, "every = 0 is out of range"),
    "payload not a table": ('[[task]]\nname = "x"\nevery = 60\npayload = [1]\n', 4, "payload must be a table"),
    "payload with a date": ('[[task]]\nname = "x"\nevery = 60\npayload = { day = 2026-12-02 }\n', 4,
                            "is a date, which is not a JSON value"),
    "payload with nan": ('[[task]]\nname = "x"\nevery = 60\n[task.payload]\nratio = nan\n', 4,
                         "only finite numbers are allowed"),
    "max_attempts zero": ('[[task]]\nname = "x"\nevery = 60\nmax_attempts = 0\n', 4, "max_attempts = 0 is out of range"),
    "max_attempts a boolean": ('[[task]]\nname = "x"\nevery = 60\nmax_attempts = true\n', 4,
                               "max_attempts must be an integer, not a boolean"),
    "catch_up above the bound": ('[[task]]\nname = "x"\nevery = 60\ncatch_up = 1001\n', 4,
                                 "catch_up = 1001 is out of range [1, 1000]"),
    "the second entry": ('[[task]]\nname = "a"\nevery = 60\n\n[[task]]\nname = "b"\ncron = "* * *"\n', 7,
                         "[[task]] 'b': cron '* * *': has 3 fields"),
}


@pytest.mark.parametrize("case", BROKEN)
def test_a_broken_file_is_refused_naming_the_line(case):
    text, line, says = BROKEN[case]
    error = parse_error(text)
    assert error.line == line, str(error)
    assert str(error).startswith(f"schedule.toml:{line}: ")
    assert says in str(error)


def parse_error(text: str) -> ScheduleFileError:
    with pytest.raises(ScheduleFileError) as caught:
        parse(text, "schedule.toml", now=NOW)
    return caught.value


def test_a_file_without_entries_is_refused():
    for text in ("", "# nothing yet\n", "task = []\n"):
        assert "has no [[task]] entries" in str(parse_error(text))


def test_entries_written_inline_are_named_by_their_number():
    error = parse_error('task = [{ name = "a", every = 60 }, { name = "b", every = -1 }]\n')
    assert error.line is None
    assert "[[task]] number 2 'b': every = -1 is out of range" in str(error)


def test_a_missing_or_unreadable_file_is_refused_naming_it(tmp_path):
    with pytest.raises(ScheduleFileError, match="missing.toml: cannot read the schedule file"):
        entries.load(tmp_path / "missing.toml", now=NOW)
    (tmp_path / "latin1.toml").write_bytes(b'[[task]]\nname = "caf\xe9"\nevery = 60\n')
    with pytest.raises(ScheduleFileError, match=r"latin1.toml:2: is not UTF-8"):
        entries.load(tmp_path / "latin1.toml", now=NOW)
    (tmp_path / "good.toml").write_text('[[task]]\nname = "x"\nevery = 60\n')
    assert [entry.name for entry in entries.load(tmp_path / "good.toml", now=NOW)] == ["x"]
