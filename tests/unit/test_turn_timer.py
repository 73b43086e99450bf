"""TurnTimer: a slow loop turn is logged with where its time went; a fast one is not."""

import logging

import pytest

from walqueue.daemon.turn_timer import TurnTimer


class FakeClock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def timed():
    """(clock, timer): a TurnTimer with a 100 ms bound, on a clock the test moves."""
    clock = FakeClock()
    return clock, TurnTimer(slow_seconds=0.1, clock=clock)


def test_a_slow_turn_is_logged_with_its_parts(timed, caplog):
    clock, timer = timed
    with caplog.at_level(logging.WARNING, logger="walqueued"):
        timer.polled(0.0)
        clock.now += 0.002
        timer.part("reading")
        clock.now += 0.25
        timer.part("applying and fsync")
        timer.part("answering")   # took no time: left out of the line
        timer.end()
    assert timer.slow_turns == 1
    assert abs(timer.longest_seconds - 0.252) < 1e-9
    [record] = caplog.records
    assert record.getMessage() == ("a loop turn took 252 ms, answering no one: reading 2 ms, "
                                   "applying and fsync 250 ms")


def test_a_slow_turn_says_how_much_of_a_part_was_its_fsync(timed, caplog):
    clock, timer = timed
    with caplog.at_level(logging.WARNING, logger="walqueued"):
        timer.polled(0.0)
        clock.now += 0.289
        timer.part("applying and fsync", of_which=("fsync", 0.2875))
        clock.now += 0.003
        timer.part("answering", of_which=("fsync", 0.0))   # a share of nothing is not said
        timer.end()
    [record] = caplog.records
    assert record.getMessage() == ("a loop turn took 292 ms, answering no one: "
                                   "applying and fsync 289 ms (fsync 288 ms), answering 3 ms")


def test_fast_turns_are_not_logged(timed, caplog):
    clock, timer = timed
    with caplog.at_level(logging.WARNING, logger="walqueued"):
        for _ in range(3):
            timer.polled(1.0)
            clock.now += 0.09
            timer.part("applying and fsync")
            timer.end()
            clock.now += 0.5   # waiting in the next poll, within its timeout
    assert timer.slow_turns == 0 and not caplog.records
    assert abs(timer.longest_seconds - 0.09) < 1e-9


def test_a_poll_long_past_its_timeout_is_logged(timed, caplog):
    clock, timer = timed
    with caplog.at_level(logging.WARNING, logger="walqueued"):
        timer.end()
        clock.now += 0.3
        timer.polled(0.0)      # asked not to wait, came back 300 ms later
        timer.end()
        clock.now += 5.0
        timer.polled(None)     # no timeout: any wait is an idle daemon
        timer.end()
        clock.now += 1.05
        timer.polled(1.0)      # 50 ms late: not a stall worth a line
    [record] = caplog.records
    assert "returned 300 ms after its 0 ms timeout" in record.getMessage()
