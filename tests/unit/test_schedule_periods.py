"""walqueue.schedule.periods: when periods start, as pure functions of a time.

Every time here is given, never read from a clock: DST changes in
Europe/Berlin and America/New_York, month ends, a leap day, every=N aligned
to the epoch, and the catch-up window. Looking backwards (latest_start) must
agree with the forward sequence everywhere, DST days included, or two
schedulers (or one, before and after a restart) would name different periods.
"""

from __future__ import annotations

import bisect
import itertools
from datetime import UTC, datetime

import pytest

from walqueue.schedule import periods
from walqueue.schedule.periods import Timing


def at(text: str) -> int:
    """Seconds since the epoch of an ISO time with its offset (Z for UTC)."""
    return int(datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp())


def utc(starts) -> list[str]:
    return [periods.utc_time(start) for start in starts]


def local(starts, zone) -> list[str]:
    return [periods.local_time(start, zone) for start in starts]


BERLIN_0230 = Timing(cron="30 2 * * *", zone="Europe/Berlin")
NEW_YORK_0230 = Timing(cron="30 2 * * *", zone="America/New_York")
NEW_YORK_0130 = Timing(cron="30 1 * * *", zone="America/New_York")


def test_a_daily_0230_job_in_berlin_runs_at_0300_when_the_clocks_spring_forward():
    # 2026-03-29 02:00 CET becomes 03:00 CEST: 02:30 does not exist that day.
    starts = periods.starts_after(BERLIN_0230, at("2026-03-27T12:00:00Z"), at("2026-03-31T12:00:00Z"))
    starts = list(starts)
    assert local(starts, "Europe/Berlin") == [
        "2026-03-28 02:30:00 CET", "2026-03-29 03:00:00 CEST", "2026-03-30 02:30:00 CEST",
        "2026-03-31 02:30:00 CEST"]
    assert utc(starts) == ["2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z",
                           "2026-03-31T00:30:00Z"]


def test_a_daily_0230_job_in_berlin_runs_once_when_the_clocks_fall_back():
    # 2026-10-25 03:00 CEST becomes 02:00 CET: 02:30 happens twice, the job runs at the first.
    starts = list(periods.starts_after(BERLIN_0230, at("2026-10-24T12:00:00Z"), at("2026-10-26T12:00:00Z")))
    assert utc(starts) == ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]
    assert local(starts, "Europe/Berlin") == ["2026-10-25 02:30:00 CEST", "2026-10-26 02:30:00 CET"]


def test_new_york_spring_forward_and_fall_back_follow_the_same_rules():
    # 2026-03-08: 02:00 EST -> 03:00 EDT (02:30 missing); 2026-11-01: 02:00 EDT -> 01:00 EST (01:30 twice).
    spring = list(periods.starts_after(NEW_YORK_0230, at("2026-03-07T12:00:00Z"), at("2026-03-09T12:00:00Z")))
    assert local(spring, "America/New_York") == ["2026-03-08 03:00:00 EDT", "2026-03-09 02:30:00 EDT"]
    fall = list(periods.starts_after(NEW_YORK_0130, at("2026-10-31T12:00:00Z"), at("2026-11-02T12:00:00Z")))
    assert local(fall, "America/New_York") == ["2026-11-01 01:30:00 EDT", "2026-11-02 01:30:00 EST"]
    # 02:30 on the fall-back day is not ambiguous in New York: it runs once, in EST.
    plain = list(periods.starts_after(NEW_YORK_0230, at("2026-10-31T12:00:00Z"), at("2026-11-01T12:00:00Z")))
    assert local(plain, "America/New_York") == ["2026-11-01 02:30:00 EST"]


def test_an_hourly_job_runs_by_the_clock_as_it_is_23_and_25_times_on_dst_days():
    hourly = Timing(cron="0 * * * *", zone="Europe/Berlin")
    spring = list(periods.starts_after(hourly, at("2026-03-29T00:00:00+01:00") - 1, at("2026-03-30T00:00:00+02:00") - 1))
    fall = list(periods.starts_after(hourly, at("2026-10-25T00:00:00+02:00") - 1, at("2026-10-26T00:00:00+01:00") - 1))
    assert (len(spring), len(fall)) == (23, 25)
    assert all(later - earlier == 3600 for earlier, later in zip(fall, fall[1:], strict=False))


def test_month_ends_a_job_on_the_31st_skips_shorter_months_and_L_is_the_last_day():
    on_31st = Timing(cron="0 12 31 * *")
    assert utc(periods.starts_after(on_31st, at("2026-01-01T00:00:00Z"), at("2026-06-01T00:00:00Z"))) == [
        "2026-01-31T12:00:00Z", "2026-03-31T12:00:00Z", "2026-05-31T12:00:00Z"]
    last_day = Timing(cron="0 0 L * *")
    assert utc(periods.starts_after(last_day, at("2026-01-15T00:00:00Z"), at("2026-05-01T00:00:00Z"))) == [
        "2026-01-31T00:00:00Z", "2026-02-28T00:00:00Z", "2026-03-31T00:00:00Z", "2026-04-30T00:00:00Z"]
    first = Timing(cron="0 0 1 * *")
    assert periods.latest_start(first, at("2026-03-01T00:00:00Z") - 1) == at("2026-02-01T00:00:00Z")
    assert periods.latest_start(first, at("2026-03-01T00:00:00Z")) == at("2026-03-01T00:00:00Z")


def test_a_leap_day_job_runs_every_four_years_and_every_day_includes_feb_29():
    leap = Timing(cron="0 0 29 2 *")
    assert utc([periods.next_start(leap, at("2025-03-01T00:00:00Z"))]) == ["2028-02-29T00:00:00Z"]
    assert utc([periods.latest_start(leap, at("2027-12-31T00:00:00Z"))]) == ["2024-02-29T00:00:00Z"]
    assert utc(periods.window(leap, at("2028-03-01T00:00:00Z"), 3)) == [
        "2020-02-29T00:00:00Z", "2024-02-29T00:00:00Z", "2028-02-29T00:00:00Z"]
    daily = Timing(every=86400)
    assert [periods.task_id("daily", start) for start in
            periods.starts_after(daily, at("2028-02-28T00:00:00Z") - 1, at("2028-03-01T00:00:00Z"))] == [
        "daily@2028-02-28T00:00:00Z", "daily@2028-02-29T00:00:00Z", "daily@2028-03-01T00:00:00Z"]


@pytest.mark.parametrize("every", [1, 7, 60, 3600, 86400, 604800])
def test_every_n_seconds_is_aligned_to_the_unix_epoch(every):
    timing = Timing(every=every)
    for now in (0, 1, every - 1, every, 1_796_220_187, 1_796_220_187 + every * 3):
        start = periods.latest_start(timing, now)
        assert start % every == 0 and start <= now < start + every
        assert periods.next_start(timing, now) == start + every
    # A week from the epoch starts on a Thursday (1970-01-01), not on the day a scheduler started.
    if every == 604800:
        assert datetime.fromtimestamp(periods.latest_start(timing, 1_796_220_187), UTC).strftime("%A") == "Thursday"


def test_the_task_id_is_the_name_and_the_period_start_in_utc():
    assert periods.task_id("report", at("2026-12-02T02:30:00+01:00")) == "report@2026-12-02T01:30:00Z"
    assert periods.task_id("a@b", 0) == "a@b@1970-01-01T00:00:00Z"


def test_the_window_is_the_last_catch_up_periods_that_started_oldest_first():
    timing = Timing(every=60)
    now = at("2026-12-02T10:05:30Z")
    assert utc(periods.window(timing, now, 1)) == ["2026-12-02T10:05:00Z"]
    assert utc(periods.window(timing, now, 3)) == ["2026-12-02T10:03:00Z", "2026-12-02T10:04:00Z",
                                                   "2026-12-02T10:05:00Z"]
    assert periods.window(timing, 90, 5) == [0, 60]  # nothing before the epoch
    # At the very second a period starts, it is in its window.
    assert periods.window(timing, at("2026-12-02T10:06:00Z"), 1) == [at("2026-12-02T10:06:00Z")]
    cron = Timing(cron="30 2 * * *", zone="Europe/Berlin")
    assert utc(periods.window(cron, at("2026-03-30T12:00:00Z"), 3)) == [
        "2026-03-28T01:30:00Z", "2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]
    assert list(periods.previous_starts(timing, at("2026-12-02T10:05:00Z"), 2)) == [
        at("2026-12-02T10:04:00Z"), at("2026-12-02T10:03:00Z")]


DST_DAYS = [("Europe/Berlin", "2026-03-29"), ("Europe/Berlin", "2026-10-25"),
            ("America/New_York", "2026-03-08"), ("America/New_York", "2026-11-01"),
            ("Australia/Lord_Howe", "2026-04-05")]  # a half-hour DST shift
EXPRESSIONS = ["30 2 * * *", "0 1-3 * * *", "*/20 * * * *", "15,45 2 * * *", "0 * * * *", "59 23 * * *"]


@pytest.mark.parametrize("zone, day", DST_DAYS)
@pytest.mark.parametrize("expression", EXPRESSIONS)
def test_looking_back_agrees_with_the_forward_sequence_on_dst_days(zone, day, expression):
    timing = Timing(cron=expression, zone=zone)
    begin = at(f"{day}T00:00:00Z") - 86400
    end = begin + 3 * 86400
    forward = list(periods.starts_after(timing, begin - 86400, end + 86400))
    assert forward == sorted(set(forward))
    for now in range(begin, end, 17 * 60 + 13):  # every 17 min 13 s, so no phase is favoured
        later = bisect.bisect_right(forward, now)
        assert periods.latest_start(timing, now) == forward[later - 1], periods.utc_time(now)
        # Iterating from any point yields the same periods after it (schedulers agree
        # whenever they started).
        assert list(itertools.islice(periods.starts_after(timing, now, end + 86400), 4)) == forward[later:later + 4]


def test_a_bad_cron_expression_says_what_is_wrong():
    with pytest.raises(ValueError, match="has 6 fields; a cron expression has five"):
        periods.parse_cron("0 30 2 * * *")
    with pytest.raises(ValueError, match="Bad minute field"):
        periods.parse_cron("61 * * * *")
    with pytest.raises(ValueError, match="Bad day-of-month field"):
        periods.parse_cron("0 0 30 2 *")
    with pytest.raises(ValueError, match="unknown time zone 'Mars/Olympus'"):
        periods.zone_of("Mars/Olympus")
    # Never fires: day 1 or 21 that is also the last Monday (cronsim's README).
    with pytest.raises(periods.NeverFires):
        periods.next_start(Timing(cron="* * */20 * 1L"), at("2026-01-01T00:00:00Z"))
