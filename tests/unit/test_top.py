"""walqueue.ctl.top: the view is a pure function of two DaemonStats samples.

The live loop against a real daemon, in a pseudo-terminal, is in
tests/process/test_top_process.py.
"""

import dataclasses
import io

import pytest

from walqueue import QueueStats
from walqueue.ctl import top
from walqueue.metrics import DaemonStats


def sample(**changes) -> DaemonStats:
    queue = QueueStats(ready=10, leased=2, completed=100, dead=1, last_seq=500, snapshot_seq=400,
                       wal_bytes=3 * 1024 * 1024)
    report = DaemonStats(
        queue=queue, oldest_ready_age_seconds=75, leases_past_half=1, wal_segments=2,
        compact_wal_bytes=64 << 20, fsyncs_total=1000, fsync_seconds_total=2.0,
        fsync_p50_seconds=0.0012, fsync_p99_seconds=0.0045, fsync_window=1000,
        requests_total=4000, requests_per_fsync=4.0, write_failures_total=0, compactions_total=3,
        last_compaction_seconds=0.5, connections=5, parked_reserves=2, paused=False,
        uptime_seconds=3600.0, start_time_seconds=1_700_000_000.0, last_recovery_seconds=0.1,
        directory="/var/lib/walqueue")
    queue_changes = {key: changes.pop(key) for key in list(changes) if hasattr(queue, key)}
    return dataclasses.replace(report, queue=dataclasses.replace(queue, **queue_changes), **changes)


def test_rates_are_per_second_of_daemon_uptime_between_the_two_samples():
    before = sample()
    after = sample(uptime_seconds=3602.0, ready=14, completed=110, requests_total=4100,
                   fsyncs_total=1030)
    figures = top.figures(before, after)
    # 4 more ready and 10 more completed: 14 tasks put in 2 s.
    assert figures["puts_per_second"] == 7.0
    assert figures["completions_per_second"] == 5.0
    assert figures["requests_per_second"] == 50.0 and figures["fsyncs_per_second"] == 15.0
    assert figures["rate_seconds"] == 2.0
    assert (figures["ready"], figures["completed"], figures["connections"]) == (14, 110, 5)


def test_no_rates_without_an_earlier_sample_or_across_a_daemon_restart():
    assert top.figures(None, sample())["puts_per_second"] is None
    restarted = sample(uptime_seconds=3.0, start_time_seconds=1_700_003_600.0, requests_total=10)
    figures = top.figures(sample(), restarted)
    assert figures["requests_per_second"] is None and figures["rate_seconds"] is None
    same_moment = top.figures(sample(), sample())
    assert same_moment["fsyncs_per_second"] is None


def test_the_frame_shows_every_figure_an_operator_watches():
    frame = "\n".join(top.frame(top.figures(sample(), sample(uptime_seconds=3601.0,
                                                              requests_total=4040, slow_turns_total=2,
                                                              longest_turn_seconds=0.131))))
    for text in ("walqueued /var/lib/walqueue   up 1 h 0 min",
                 "ready 10   leased 2   completed 100   dead 1",
                 "requests 40.0/s", "put 0.0/s",
                 "oldest ready 1 min 15 s", "leases past half 1",
                 "p50 1.2 ms", "p99 4.5 ms", "requests/fsync 4.0",
                 "turns over 100 ms 2 (longest 131 ms)", "connections 5   parked reserves 2", "WAL 3.0 MiB in 2 segments",
                 "q quits"):
        assert text in frame, text
    assert "PAUSED" not in frame


def test_the_frame_marks_a_pause_a_missing_figure_and_a_stale_sample():
    frame = "\n".join(top.frame(top.figures(None, sample(paused=True, fsync_p99_seconds=None,
                                                         requests_per_fsync=None)),
                                error="cannot connect to walqueued"))
    assert "PAUSED" in frame and "p99 -" in frame and "requests/fsync -" in frame
    assert "rates     put -   completed -" in frame
    assert "NOT CURRENT: cannot connect to walqueued; retrying" in frame


def test_a_hostile_directory_name_cannot_reach_the_terminal_raw():
    lines = top.frame(top.figures(None, sample(directory="/q\x1b[2J\nforged")),
                      error="daemon said \x1b]0;x\x07")
    assert len(lines) == 9 and all("\x1b" not in line and "\n" not in line for line in lines)
    assert lines[0].startswith("walqueued /q\\x1b[2J\\x0aforged")


@pytest.mark.parametrize("seconds, text", [(0, "0 s"), (59.9, "59 s"), (60, "1 min 0 s"),
                                           (3725, "1 h 2 min"), (90000, "1 d 1 h")])
def test_durations_read_as_an_operator_says_them(seconds, text):
    assert top.duration_text(seconds) == text


def test_due_text():
    assert top.due_text(100, 100) == "now" and top.due_text(50, 100) == "now"
    assert top.due_text(142, 100) == "in 42 s"


def test_run_without_a_terminal_prints_count_frames_and_samples_in_between():
    samples = [sample(uptime_seconds=3601.0, requests_total=4010), "daemon went away"]
    output = io.StringIO()
    top.run(sample(), lambda: samples.pop(0), interval=0.01, count=3, stdin=io.StringIO(),
            stdout=output)
    frames = output.getvalue().split("q quits · every 0.01 s\n\n")
    assert len(frames) == 4 and frames[-1] == ""  # three frames, each ended by a blank line
    assert "requests -" in frames[0] and "requests 10.0/s" in frames[1]
    assert "NOT CURRENT: daemon went away" in frames[2] and "requests 10.0/s" in frames[2]
    assert samples == []
