"""The daemon's figures without a daemon: the state's two monitoring queries,
the seq clock, the recorder's window, the Prometheus text (parsed with
prometheus_client, not string-matched), the wire form and --metrics-listen."""

import dataclasses
import math
import random
import socket

import pytest
from prometheus_client.parser import text_string_to_metric_families

import walqueue
from walqueue import Queue, QueueStats
from walqueue import protocol as p
from walqueue.daemon.metrics_http import ListenError, parse_listen
from walqueue.daemon.recorder import MAX_SEQ_SAMPLES, Recorder, SeqClock, quantile
from walqueue.metrics import FSYNC_WINDOW, FSYNC_WINDOW_SECONDS, DaemonStats, render_prometheus
from walqueue.monitoring import count_past_half
from walqueue.state import READY

# -- oldest due ready task ----------------------------------------------------------


def times(mapping: dict[int, int]):
    """A seq -> time function from the seqs at which the clock moved (monotone, a step function)."""
    def seq_time(seq: int) -> int:
        return max((time for first, time in mapping.items() if first <= seq), default=0)
    return seq_time


def test_the_oldest_due_ready_task_is_the_one_ready_longest(tmp_path):
    with Queue(tmp_path / "q") as q:
        q.put("b", {})  # seq 1
        q.put("a", {})  # seq 2: served first (task_id order) but ready later
        seq_time = times({1: 10, 2: 20, 3: 30, 4: 40})
        assert q.engine.ready_due_since(now=50, seq_time=seq_time) == 10
        (lease,) = q.reserve("w", now=30, lease_seconds=60)  # seq 3 leases "a"
        assert lease.task_id == "a"
        assert q.engine.ready_due_since(now=50, seq_time=seq_time) == 10
        (lease_b,) = q.reserve("w", now=30, lease_seconds=60)  # seq 4 leases "b"
        assert q.engine.ready_due_since(now=50, seq_time=seq_time) is None
        q.release(lease, now=45)  # seq 5 (time 40 by the map): due from available_at 45
        assert q.engine.ready_due_since(now=50, seq_time=seq_time) == 45
        q.release(lease_b, now=46)  # seq 6
        assert q.engine.ready_due_since(now=50, seq_time=seq_time) == 45


def test_a_delayed_task_counts_from_its_available_at_and_only_once_due(tmp_path):
    with Queue(tmp_path / "q") as q:
        q.put("later", {}, available_at=100)  # seq 1, written at time 5
        seq_time = times({1: 5, 2: 60})
        assert q.engine.ready_due_since(now=50, seq_time=seq_time) is None
        q.put("now", {})  # seq 2, written at 60
        assert q.engine.ready_due_since(now=70, seq_time=seq_time) == 60
        assert q.engine.ready_due_since(now=150, seq_time=seq_time) == 60
        (lease,) = q.reserve("w", now=150, lease_seconds=10)  # (0, "now") comes first
        assert lease.task_id == "now"
        assert q.engine.ready_due_since(now=150, seq_time=seq_time) == 100
        # A put whose available_at is already past when written counts from the write.
        q.put("past", {}, available_at=1)  # seq 4
        assert q.engine.ready_due_since(now=150, seq_time=times({1: 5, 2: 60, 4: 90})) == 90


def test_revived_and_expired_tasks_count_from_the_record_that_made_them_ready(tmp_path):
    with Queue(tmp_path / "q") as q:
        q.put("x", {}, max_attempts=1)  # seq 1
        (lease,) = q.reserve("w", now=10, lease_seconds=5)  # seq 2
        q.release(lease, now=11)  # seq 3: dead
        assert q.engine.ready_due_since(now=20, seq_time=lambda seq: seq) is None
        q.revive(["x"], now=20)  # seq 4, available_at 20
        assert q.engine.ready_due_since(now=30, seq_time=lambda seq: 10 * seq) == 40
        q.put("y", {})  # seq 5
        q.reserve("w", now=30, lease_seconds=5, limit=2)  # seq 6 leases x and y until 35
        assert q.engine.ready_due_since(now=40, seq_time=lambda seq: seq) is None
        q.put("z", {})  # seq 7: (0, "z") is leased before the expired "y" (35, "y")
        q.reserve("w", now=40, lease_seconds=5, limit=1)  # seq 8 expires x (dead), y; seq 9 leases z
        assert q.get("y").status == "ready" and q.get("x").status == "dead"
        # "y" is due from its old deadline 35, and ready since seq 8 (time 40 by this map).
        assert q.engine.ready_due_since(now=50, seq_time=lambda seq: 5 * seq) == 40


def meaningful_slots(q) -> dict:
    """ready_seq of the ready tasks, lease_start of the leased ones (the others are leftovers)."""
    return {task_id: task.ready_seq if task.status == "ready" else task.lease_start
            for task_id, task in q.engine._state.tasks.items() if task.status in ("ready", "leased")}


def test_tasks_loaded_from_a_snapshot_count_from_the_earliest_time_and_replay_is_identical(tmp_path):
    directory = tmp_path / "q"
    with Queue(directory) as q:
        q.put("old", {})  # seq 1
        q.compact()
        q.put("new", {})  # seq 2
        leases = q.reserve("w", now=100, lease_seconds=10, limit=2)  # seq 3, both until 110
        q.release(leases[0], now=101)  # seq 4: "new" ready again
        q.put("newer", {})  # seq 5
        q.touch(leases[1], now=104, lease_seconds=2)  # seq 6: "old" leased from 104 to 106
        before = (q.engine.ready_due_since(now=200, seq_time=lambda seq: seq),
                  q.engine.leases_past_half(105), q.engine.leases_past_half(104))
        state = meaningful_slots(q)
    with Queue(directory) as q:
        after = (q.engine.ready_due_since(now=200, seq_time=lambda seq: seq),
                 q.engine.leases_past_half(105), q.engine.leases_past_half(104))
        assert after == before == (5, 1, 0)
        assert meaningful_slots(q) == state == {"new": 4, "newer": 5, "old": 104}
        q.compact()
    with Queue(directory) as q:
        # Loaded from the snapshot: ready since seq 0 (the earliest time there is),
        # and the lease's start is unknown, so it is not counted.
        assert q.engine.ready_due_since(now=200, seq_time=lambda seq: 1000 + seq) == 1000
        assert q.engine.leases_past_half(105) == 0


def test_the_ready_fifo_stays_bounded_when_nobody_asks(tmp_path):
    with Queue(tmp_path / "q") as q:
        with q.batch():
            for round_number in range(3000):
                q.put(f"t{round_number}", {})
                (lease,) = q.reserve("w", now=1, lease_seconds=10)
                q.ack(lease, now=1)
        state = q.engine._state
        assert len(state.monitoring._ready_fifo) <= 2 * (2 * state.counts[READY] + 1025)


def test_the_oldest_due_ready_time_matches_a_brute_force_search():
    seed = random.randrange(2**32)
    rng = random.Random(seed)
    import tempfile
    with tempfile.TemporaryDirectory() as directory, Queue(directory) as q:
        ready_seq: dict[str, int] = {}  # what the test itself saw make each task ready
        leases = []
        now = 0

        def seq_time(seq: int) -> int:
            return seq // 3  # any non-decreasing map will do

        for step in range(400):
            now += rng.choice([0, 0, 1, 5])
            action = rng.random()
            if action < 0.35:
                name = f"t{step}"
                q.put(name, {}, available_at=rng.choice([0, 0, now + rng.randrange(-20, 40)]) if now > 20 else 0)
                ready_seq[name] = q.stats().last_seq
            elif action < 0.6:
                before = {view.task_id for view in q.tasks("ready")}
                leases += q.reserve("w", now=now, lease_seconds=rng.randrange(1, 30), limit=rng.randrange(1, 4))
                expired_now = {view.task_id for view in q.tasks("ready")} - before
                for task_id in expired_now:
                    ready_seq[task_id] = q.engine._state.tasks[task_id].ready_seq
                    assert ready_seq[task_id] <= q.stats().last_seq
            elif action < 0.85 and leases:
                lease = leases.pop(rng.randrange(len(leases)))
                view = q.get(lease.task_id)
                if view.status != "leased" or view.generation != lease.generation or now >= view.deadline:
                    continue
                if rng.random() < 0.5:
                    q.ack(lease, now=now)
                else:
                    q.release(lease, now=now, delay=rng.choice([0, 10]))
                    ready_seq[lease.task_id] = q.stats().last_seq
            elif action < 0.9:
                dead = [view.task_id for view in q.tasks("dead")]
                if dead:
                    q.revive(dead, now=now)
                    for task_id in dead:
                        ready_seq[task_id] = q.stats().last_seq
            query_now = now + rng.choice([0, 3, 30])
            expected = min((max(view.available_at, seq_time(ready_seq[view.task_id]))
                            for view in q.tasks("ready") if view.available_at <= query_now), default=None)
            assert q.engine.ready_due_since(query_now, seq_time) == expected, f"seed {seed}, step {step}"


# -- leases past half ---------------------------------------------------------------


def test_leases_past_half_counts_from_the_reserve_or_the_last_touch(tmp_path):
    with Queue(tmp_path / "q") as q:
        q.put("a", {})
        q.put("b", {})
        (lease,) = q.reserve("w", now=0, lease_seconds=10)
        assert [q.engine.leases_past_half(now) for now in (0, 4, 5, 9, 20)] == [0, 0, 1, 1, 1]
        lease = q.touch(lease, now=6, lease_seconds=10)  # 6 .. 16: half at 11
        assert [q.engine.leases_past_half(now) for now in (10, 11)] == [0, 1]
        lease = q.touch(lease, now=7, lease_seconds=9)  # same deadline, new start: half at 11.5
        assert [q.engine.leases_past_half(now) for now in (11, 12)] == [0, 1]
        q.reserve("w", now=7, lease_seconds=1)  # "b", 7 .. 8
        assert q.engine.leases_past_half(8) == 1 and q.engine.leases_past_half(12) == 2
        q.ack(lease, now=12)
        assert q.engine.leases_past_half(12) == 1


class CountingTasks(dict):
    """The state's live tasks, counting the lookups a figure makes."""

    lookups = 0

    def get(self, key, default=None):
        CountingTasks.lookups += 1
        return super().get(key, default)


def test_reports_at_a_later_now_count_each_lease_once_not_every_lease_each_time(tmp_path):
    # Issue 20 item 3: every daemon_stats walked every lease, so 1,024 pipelined
    # reports over 100k leases made one 39.8 s loop turn.
    leases, reports = 2000, 500
    with Queue(tmp_path / "q") as q:
        q.put_many([{"task_id": f"t{index:05d}", "payload": {}} for index in range(leases)])
        for start in range(0, leases, 1000):
            q.reserve("w", now=start, lease_seconds=10_000, limit=1000)
        state = q.engine._state
        state.tasks = CountingTasks(state.tasks)
        CountingTasks.lookups = 0
        figures = [q.engine.leases_past_half(now) for now in range(5000, 5000 + reports)]
        assert figures == [1000] * 500, figures[:3]  # those leased at 0 are past 5000
        # Each lease is looked at once, when it reaches its middle; a walk per
        # report would be reports x leases = 1,000,000 lookups.
        assert CountingTasks.lookups <= leases, CountingTasks.lookups
        assert q.engine.leases_past_half(6000) == 2000


def test_leases_past_half_kept_incrementally_matches_a_count_of_every_lease(tmp_path):
    rng = random.Random(20)
    with Queue(tmp_path / "q") as q:
        q.put_many([{"task_id": f"t{index:03d}", "payload": {}, "max_attempts": 1000}
                    for index in range(60)])
        held: dict[str, object] = {}
        now = 0
        for _ in range(1500):
            now += rng.choice((0, 0, 1, 2, 5))
            action = rng.random()
            if action < 0.3:
                for lease in q.reserve("w", now=now, lease_seconds=rng.randint(1, 30),
                                       limit=rng.randint(1, 4)):
                    held[lease.task_id] = lease
            elif held and action < 0.8:
                task_id = rng.choice(sorted(held))
                lease = held.pop(task_id)
                if lease.deadline <= now:
                    continue
                if action < 0.5:
                    held[task_id] = q.touch(lease, now=now, lease_seconds=rng.randint(1, 30))
                elif action < 0.65:
                    q.release(lease, now=now)
                else:
                    q.ack(lease, now=now)
                    q.put(f"{task_id}-{now}-{rng.random()}", {}, max_attempts=1000)
            elif action < 0.9:
                q.engine.expire_due(now=now)
            expected = count_past_half(q.engine._state.tasks, q.engine._state._leases, now)
            assert q.engine.leases_past_half(now) == expected, now
            if rng.random() < 0.05:  # a caller's earlier now is counted by a walk, and changes nothing
                earlier = rng.randint(0, now)
                assert q.engine.leases_past_half(earlier) == count_past_half(q.engine._state.tasks, q.engine._state._leases, earlier)
        assert len(q.engine._state.monitoring._halves) <= 2 * q.stats().leased + 1024 + 4


# -- the seq clock and the recorder ---------------------------------------------


def test_the_seq_clock_maps_seqs_to_a_time_no_later_than_their_write():
    clock = SeqClock(next_seq=11, now=100)  # seqs 1..10 came before the start
    clock.note(11, 100)  # same second: ignored
    clock.note(11, 101)  # nothing written since: seq 11 is later still
    clock.note(15, 105)
    clock.note(15, 106)
    assert [clock.time_of(seq) for seq in (1, 10, 11, 14, 15, 99)] == [101, 101, 101, 101, 106, 106]
    assert len(clock) == 2
    clock.note(13, 107)  # a reopen forgot seqs 13..14: the sample above goes
    assert clock.time_of(12) == 101 and clock.time_of(13) == 107


def test_the_seq_clock_thins_old_samples_and_stays_a_lower_bound():
    clock = SeqClock(next_seq=1, now=0)
    written = {}
    for second in range(1, 3 * MAX_SEQ_SAMPLES):
        clock.note(second * 2, second)
        written[second * 2] = second
    assert len(clock) <= MAX_SEQ_SAMPLES
    previous = 0
    for seq, second in written.items():
        mapped = clock.time_of(seq)
        assert previous <= mapped <= second
        previous = mapped
    assert clock.time_of(written.keys().__reversed__().__next__()) == 3 * MAX_SEQ_SAMPLES - 1


def test_the_recorder_reports_quantiles_and_requests_per_fsync_over_a_recent_window(tmp_path):
    clock = [1000.0]
    recorder = Recorder(next_seq=1, now=0, recovery_seconds=1.5, clock=lambda: clock[0],
                        wall_clock=lambda: 1.7e9)
    with Queue(tmp_path / "q") as q:
        report = recorder.report(q.engine, now=5, connections=2, parked_reserves=3, paused=True,
                                 compact_wal_bytes=99, directory="/d")
        assert (report.fsync_p50_seconds, report.fsync_p99_seconds, report.requests_per_fsync) == (None,) * 3
        recorder.batch_ended(0.5, 7, fsynced=False)  # a read-only batch
        for index in range(100):
            recorder.batch_ended((index + 1) / 1000, 2, fsynced=True)
        recorder.compacted(0.25)
        recorder.write_failed()
        clock[0] += 10
        report = recorder.report(q.engine, now=5, connections=2, parked_reserves=3, paused=True,
                                 compact_wal_bytes=99, directory="/d")
        assert report.fsyncs_total == 100 and report.requests_total == 207
        assert report.fsync_p50_seconds == 0.05 and report.fsync_p99_seconds == 0.099
        assert report.requests_per_fsync == 2.0 and report.fsync_window == 100
        assert math.isclose(report.fsync_seconds_total, sum(range(1, 101)) / 1000)
        assert (report.compactions_total, report.last_compaction_seconds, report.write_failures_total) == (1, 0.25, 1)
        assert (report.uptime_seconds, report.start_time_seconds, report.last_recovery_seconds) == (10, 1.7e9, 1.5)
        assert (report.connections, report.parked_reserves, report.paused, report.wal_segments) == (2, 3, True, 1)
        assert report.version == walqueue.__version__
        clock[0] += FSYNC_WINDOW_SECONDS + 1  # the window empties; the totals stay
        report = recorder.report(q.engine, now=5, connections=0, parked_reserves=0, paused=False,
                                 compact_wal_bytes=99, directory="/d")
        assert report.fsync_window == 0 and report.fsync_p99_seconds is None and report.fsyncs_total == 100
        for _ in range(FSYNC_WINDOW + 10):
            recorder.batch_ended(0.001, 1, fsynced=True)
        report = recorder.report(q.engine, now=5, connections=0, parked_reserves=0, paused=False,
                                 compact_wal_bytes=99, directory="/d")
        assert report.fsync_window == FSYNC_WINDOW


def test_the_fsync_window_is_sorted_once_per_change_not_once_per_report(tmp_path, monkeypatch):
    # Issue 20 item 3: a turn may answer a thousand pipelined reports; each sorted the window.
    from walqueue.daemon import recorder as recorder_module

    sorts = []
    monkeypatch.setattr(recorder_module, "sorted", lambda values: sorts.append(1) or sorted(values),
                        raising=False)
    clock = [1000.0]
    recorder = Recorder(next_seq=1, now=0, recovery_seconds=0.0, clock=lambda: clock[0])
    for index in range(FSYNC_WINDOW):
        recorder.batch_ended(index / 1e6, 1, fsynced=True)
    with Queue(tmp_path / "q") as q:
        def report():
            return recorder.report(q.engine, now=5, connections=0, parked_reserves=0, paused=False,
                                   compact_wal_bytes=99, directory="/d")
        reports = [report() for _ in range(1000)]
        assert len(sorts) == 1 and {r.fsync_window for r in reports} == {FSYNC_WINDOW}
        recorder.batch_ended(1.0, 3, fsynced=True)
        assert report().requests_per_fsync > 1 and len(sorts) == 2
        clock[0] += FSYNC_WINDOW_SECONDS + 1  # entries leaving the window change it too
        assert report().fsync_window == 0 and len(sorts) == 3


def test_quantile_is_nearest_rank():
    assert quantile([], 0.5) is None
    assert quantile([3.0], 0.99) == 3.0
    assert quantile([1.0, 2.0, 3.0, 4.0], 0.5) == 2.0
    assert quantile([float(n) for n in range(1, 101)], 0.99) == 99.0


# -- the Prometheus text ------------------------------------------------------------

EXPECTED_FAMILIES = {
    # family name as prometheus_client reports it -> type
    "walqueue_info": "gauge",
    "walqueue_build_info": "gauge",
    "walqueue_tasks": "gauge",
    "walqueue_oldest_ready_age_seconds": "gauge",
    "walqueue_leases_past_half": "gauge",
    "walqueue_last_seq": "gauge",
    "walqueue_snapshot_seq": "gauge",
    "walqueue_wal_bytes": "gauge",
    "walqueue_compaction_threshold_bytes": "gauge",
    "walqueue_wal_segments": "gauge",
    "walqueue_leases_expired": "counter",
    "walqueue_fsync_duration_seconds": "summary",
    "walqueue_requests": "counter",
    "walqueue_requests_per_fsync": "gauge",
    "walqueue_write_failures": "counter",
    "walqueue_compactions": "counter",
    "walqueue_last_compaction_duration_seconds": "gauge",
    "walqueue_connections": "gauge",
    "walqueue_parked_reserves": "gauge",
    "walqueue_paused": "gauge",
    "walqueue_uptime_seconds": "gauge",
    "walqueue_start_time_seconds": "gauge",
    "walqueue_last_recovery_duration_seconds": "gauge",
    "walqueue_clock_steps": "counter",
    "walqueue_clock_offset_seconds": "gauge",
    "walqueue_last_compaction_pause_seconds": "gauge",
    "walqueue_compact_wal_ratio": "gauge",
    "walqueue_compaction_in_progress": "gauge",
    "walqueue_compaction_failures": "counter",
    "walqueue_compaction_consecutive_failures": "gauge",
    "walqueue_compaction_retry_in_seconds": "gauge",
    "walqueue_last_compaction_error_info": "gauge",
    "walqueue_snapshot_bytes": "gauge",
    "walqueue_snapshot_bytes_written": "counter",
    "walqueue_wal_bytes_written": "counter",
    "walqueue_slow_turns": "counter",
    "walqueue_longest_turn_seconds": "gauge",
}


def sample_stats(**changes) -> DaemonStats:
    fields = dict(
        queue=QueueStats(ready=5, leased=2, completed=30, dead=1, last_seq=77, snapshot_seq=40,
                         wal_bytes=12345),
        oldest_ready_age_seconds=42, leases_past_half=1, wal_segments=2, compact_wal_bytes=64 << 20,
        fsyncs_total=60, fsync_seconds_total=0.75, fsync_p50_seconds=0.002, fsync_p99_seconds=0.031,
        fsync_window=60, requests_total=500, requests_per_fsync=8.25, write_failures_total=3,
        compactions_total=4, last_compaction_seconds=0.5, connections=6, parked_reserves=7,
        paused=True, uptime_seconds=3600.5, start_time_seconds=1.8e9, last_recovery_seconds=0.125,
        directory="/var/lib/walqueue", version="1.2.3", compact_wal_ratio=1.0,
        compaction_in_progress=True, compaction_failures_total=2, compaction_consecutive_failures=2,
        last_compaction_error='OSError: [Errno 28] No space left on device: "snapshot"',
        compaction_retry_in_seconds=3.5, last_compaction_pause_seconds=0.004, snapshot_bytes=4096,
        snapshot_bytes_written_total=8192, wal_bytes_written_total=65536, slow_turns_total=3,
        longest_turn_seconds=0.25, expired_total=9, speedups="compiled",
    )
    fields.update(changes)
    return DaemonStats(**fields)


def parse(text: str) -> dict:
    return {family.name: family for family in text_string_to_metric_families(text)}


def value(families: dict, name: str, **labels) -> float:
    for family in families.values():
        for sample in family.samples:
            if sample.name == name and sample.labels == labels:
                return sample.value
    raise KeyError((name, labels))


def test_every_metric_family_is_present_with_its_type_and_value():
    text = render_prometheus(sample_stats())
    families = parse(text)
    assert {name: family.type for name, family in families.items()} == EXPECTED_FAMILIES
    assert all(family.documentation for family in families.values())
    assert {sample.labels["status"]: sample.value for sample in families["walqueue_tasks"].samples} == \
        {"ready": 5, "leased": 2, "completed": 30, "dead": 1}
    assert value(families, "walqueue_fsync_duration_seconds", quantile="0.5") == 0.002
    assert value(families, "walqueue_fsync_duration_seconds", quantile="0.99") == 0.031
    assert value(families, "walqueue_fsync_duration_seconds_count") == 60
    assert value(families, "walqueue_fsync_duration_seconds_sum") == 0.75
    assert value(families, "walqueue_requests_total") == 500
    assert value(families, "walqueue_leases_expired_total") == 9
    assert value(families, "walqueue_write_failures_total") == 3
    assert value(families, "walqueue_compactions_total") == 4
    assert value(families, "walqueue_compaction_failures_total") == 2
    assert value(families, "walqueue_compaction_retry_in_seconds") == 3.5
    assert value(families, "walqueue_compaction_in_progress") == 1
    assert value(families, "walqueue_last_compaction_error_info",
                 error='OSError: [Errno 28] No space left on device: "snapshot"') == 1
    assert value(families, "walqueue_snapshot_bytes_written_total") == 8192
    assert value(families, "walqueue_slow_turns_total") == 3
    assert value(families, "walqueue_longest_turn_seconds") == 0.25
    assert value(families, "walqueue_paused") == 1
    assert value(families, "walqueue_oldest_ready_age_seconds") == 42
    assert value(families, "walqueue_wal_bytes") == 12345
    assert value(families, "walqueue_compaction_threshold_bytes") == 64 << 20
    assert value(families, "walqueue_info", directory="/var/lib/walqueue") == 1
    assert value(families, "walqueue_build_info", version="1.2.3", speedups="compiled") == 1
    # One HELP and one TYPE line per family, HELP first, each naming the family.
    lines = text.splitlines()
    helps = [line.split()[2] for line in lines if line.startswith("# HELP ")]
    types = [line.split()[2] for line in lines if line.startswith("# TYPE ")]
    assert helps == types and len(set(types)) == len(types) == len(EXPECTED_FAMILIES)
    for index, line in enumerate(lines):
        if line.startswith("# HELP "):
            assert lines[index + 1].startswith(f"# TYPE {line.split()[2]} ")
    assert text.endswith("\n") and not text.endswith("\n\n")


def test_counters_end_in_total_and_no_gauge_does():
    for line in render_prometheus(sample_stats()).splitlines():
        if line.startswith("# TYPE "):
            _, _, name, kind = line.split()
            assert name.endswith("_total") == (kind == "counter"), line


def test_missing_figures_are_nan_and_the_label_is_escaped():
    awkward = 'C:\\queues\\"prod"\nsecond line'
    families = parse(render_prometheus(sample_stats(
        fsync_p50_seconds=None, fsync_p99_seconds=None, requests_per_fsync=None,
        last_compaction_seconds=None, paused=False, directory=awkward)))
    assert math.isnan(value(families, "walqueue_fsync_duration_seconds", quantile="0.99"))
    assert math.isnan(value(families, "walqueue_requests_per_fsync"))
    assert math.isnan(value(families, "walqueue_last_compaction_duration_seconds"))
    assert value(families, "walqueue_paused") == 0
    assert value(families, "walqueue_info", directory=awkward) == 1


def test_the_daemon_report_crosses_the_wire_field_by_field():
    assert tuple(field.name for field in dataclasses.fields(DaemonStats)) == p.WireDaemonStats.__struct_fields__
    stats = sample_stats(fsync_p50_seconds=None, clock_steps_total=2, clock_offset_seconds=1.5)
    names = [field.name for field in dataclasses.fields(DaemonStats)]

    def without(first_added: str, report: DaemonStats) -> DaemonStats:
        """The report as an older version carries it: the fields added from `first_added` on, at their defaults."""
        return dataclasses.replace(report, **{name: DaemonStats.__dataclass_fields__[name].default
                                              for name in names[names.index(first_added):]})

    version_6 = without("expired_total", stats)
    version_4 = without("slow_turns_total", version_6)
    version_3 = without("compact_wal_ratio", version_4)
    version_2 = without("clock_steps_total", version_3)
    version_1 = dataclasses.replace(version_2, version="")
    reader = p.FrameReader()
    for protocol_version, expected in ((7, stats), (6, version_6), (5, version_6), (4, version_4),
                                       (3, version_3), (2, version_2), (1, version_1)):
        reader.feed(p.encode(p.DaemonStatsOk(id=9, stats=p.daemon_stats_to_wire(stats, protocol_version))))
        decoded = p.decode_response(reader.next_body())
        assert p.daemon_stats_from_wire(decoded.stats) == expected
    request = p.DaemonStatsReq(id=3)
    reader.feed(p.encode(request))
    assert p.decode_request(reader.next_body()) == request


# -- --metrics-listen ----------------------------------------------------------------


@pytest.mark.parametrize("text, expected", [
    ("127.0.0.1:9464", ("127.0.0.1", 9464)),
    ("localhost:0", ("127.0.0.1", 0)),
    ("127.8.9.10:80", ("127.8.9.10", 80)),
    ("[::1]:9464", ("::1", 9464)),
])
def test_loopback_listen_addresses_are_accepted(text, expected):
    assert parse_listen(text, allow_remote=False) == expected


@pytest.mark.parametrize("text, complaint", [
    ("9464", "HOST:PORT"),
    (":9464", "HOST:PORT"),
    ("127.0.0.1:", "port"),
    ("127.0.0.1:65536", "port"),
    ("127.0.0.1:http", "port"),
    ("example.com:9464", "not an IP address"),
    ("::1:9464", "brackets"),
    ("0.0.0.0:9464", "--metrics-allow-remote"),
    ("192.0.2.1:9464", "--metrics-allow-remote"),
    ("[::]:9464", "--metrics-allow-remote"),
])
def test_bad_or_remote_listen_addresses_are_refused(text, complaint):
    with pytest.raises(ListenError, match=complaint.replace("-", "\\-")):
        parse_listen(text, allow_remote=False)


def test_a_remote_listen_address_needs_the_explicit_flag():
    assert parse_listen("0.0.0.0:9464", allow_remote=True) == ("0.0.0.0", 9464)


# -- the endpoint, served from the loop's selector -----------------------------------


class EndpointDriver:
    """A MetricsEndpoint on its own selector, driven turn by turn as the loop does."""

    def __init__(self) -> None:
        import selectors

        from walqueue.daemon import metrics_http

        self.endpoint = metrics_http.MetricsEndpoint("127.0.0.1", 0)
        self.selector = selectors.DefaultSelector()
        self.endpoint.start(self.selector)
        self.monotonic = 0.0
        self.renders = 0

    def turn(self) -> None:
        for key, mask in self.selector.select(0.05):
            assert self.endpoint.owns(key.data)
            self.endpoint.on_event(key.data, mask, self.monotonic)
        self.endpoint.expire(self.monotonic)
        if self.endpoint.wanted:
            self.renders += 1
            self.endpoint.publish(f"text {self.renders}\n", self.monotonic)

    def scrape(self, request: bytes = b"GET /metrics HTTP/1.0\r\n\r\n"):
        import socket

        sock = socket.create_connection(self.endpoint.address, timeout=5)
        sock.sendall(request)
        return sock

    def answer(self, sock) -> bytes:
        sock.setblocking(False)
        data = b""
        for _ in range(100):
            self.turn()
            try:
                chunk = sock.recv(65536)
            except BlockingIOError:
                continue
            if not chunk:
                sock.close()
                return data
            data += chunk
        raise AssertionError(f"no complete answer in 100 turns: {data!r}")

    def close(self) -> None:
        self.endpoint.close()
        self.selector.close()


@pytest.fixture
def endpoint_driver():
    driver = EndpointDriver()
    yield driver
    driver.close()


def test_scrapes_within_a_second_share_one_render(endpoint_driver):
    driver = endpoint_driver
    assert driver.answer(driver.scrape()).endswith(b"\r\n\r\ntext 1\n")
    assert driver.answer(driver.scrape()).endswith(b"text 1\n") and driver.renders == 1
    driver.monotonic += 1.0
    answer = driver.answer(driver.scrape(b"GET /metrics?x=1 HTTP/1.1\r\nHost: a\r\n\r\n"))
    assert answer.startswith(b"HTTP/1.0 200 OK\r\n") and answer.endswith(b"text 2\n")
    assert b"Content-Type: text/plain; version=0.0.4; charset=utf-8\r\n" in answer


@pytest.mark.parametrize("request_bytes, status", [
    (b"GET / HTTP/1.0\r\n\r\n", b"404"),
    (b"POST /metrics HTTP/1.0\r\n\r\n", b"405"),
    (b"HEAD /metrics HTTP/1.0\r\n\r\n", b"405"),
    (b"nonsense\r\n\r\n", b"400"),
    (b"GET /metrics HTTP/1.0\r\nX: " + b"y" * 9000, b"431"),
])
def test_anything_but_get_metrics_is_answered_with_its_error(endpoint_driver, request_bytes, status):
    answer = endpoint_driver.answer(endpoint_driver.scrape(request_bytes))
    assert answer.startswith(b"HTTP/1.0 " + status), answer
    assert endpoint_driver.renders == 0


def closed_by_the_endpoint(sock) -> bytes:
    """What the endpoint sent before it closed ``sock`` (it must have closed it already)."""
    sock.setblocking(False)
    data = b""
    try:
        while chunk := sock.recv(65536):
            data += chunk
    except ConnectionResetError:
        pass  # closed with bytes of ours unread: what it sent may be lost
    except BlockingIOError:
        raise AssertionError(f"still open after {data!r}") from None
    sock.close()
    return data


def still_open(sock) -> bool:
    sock.setblocking(False)
    try:
        return sock.recv(1, socket.MSG_PEEK) is None
    except BlockingIOError:
        return True
    except OSError:
        return False


def test_a_newcomer_takes_the_slot_of_the_oldest_unfinished_scrape(endpoint_driver):
    # Once a ninth scrape was refused while eight connections that never sent a
    # request held every slot until their deadline: one local loop keeping them
    # full left 0 of 148 honest scrapes served.
    from walqueue.daemon import metrics_http

    driver = endpoint_driver
    idle = [driver.scrape(b"G") for _ in range(metrics_http.MAX_CONNECTIONS)]
    driver.turn()
    assert driver.answer(driver.scrape()).endswith(b"text 1\n")
    assert closed_by_the_endpoint(idle[0]).startswith(b"HTTP/1.0 503")
    assert all(still_open(sock) for sock in idle[1:])
    for sock in idle[1:]:
        sock.close()


def test_a_request_that_arrived_meanwhile_is_served_not_evicted(endpoint_driver):
    from walqueue.daemon import metrics_http

    driver = endpoint_driver
    idle = [driver.scrape(b"GET /metrics HTTP/1.0\r\n") for _ in range(metrics_http.MAX_CONNECTIONS)]
    driver.turn()
    idle[0].sendall(b"\r\n")  # the oldest one's head is complete now, unread by the endpoint
    newcomer = driver.scrape()
    assert driver.answer(newcomer).endswith(b"text 1\n")
    assert driver.answer(idle[0]).endswith(b"text 1\n")  # given its one last read before eviction
    assert closed_by_the_endpoint(idle[1]).startswith(b"HTTP/1.0 503")
    for sock in idle[2:]:
        sock.close()


def test_the_peer_holding_the_most_slots_gives_one_up(endpoint_driver, monkeypatch):
    from walqueue.daemon import metrics_http

    # Every loopback address is one peer; here each address is its own, so that two can be told apart.
    monkeypatch.setattr(metrics_http, "peer_of", lambda address: address)
    driver = endpoint_driver
    other = socket.create_connection(driver.endpoint.address, timeout=5, source_address=("127.0.0.2", 0))
    other.sendall(b"G")  # the oldest slot, of a peer that holds one
    driver.turn()
    flooding = [driver.scrape(b"G") for _ in range(metrics_http.MAX_CONNECTIONS - 1)]
    driver.turn()
    assert driver.answer(driver.scrape()).endswith(b"text 1\n")
    assert still_open(other)
    assert closed_by_the_endpoint(flooding[0]).startswith(b"HTTP/1.0 503")
    for sock in [other, *flooding[1:]]:
        sock.close()


def test_only_complete_requests_in_every_slot_refuse_a_newcomer(endpoint_driver):
    from walqueue.daemon import metrics_http

    driver = endpoint_driver
    # All arrive before one turn: the first eight wait for the turn's render, the ninth is refused.
    socks = [driver.scrape() for _ in range(metrics_http.MAX_CONNECTIONS + 1)]
    assert driver.answer(socks[-1]).startswith(b"HTTP/1.0 503")
    assert all(driver.answer(sock).endswith(b"text 1\n") for sock in socks[:-1])
    assert driver.renders == 1


def test_a_request_head_must_arrive_within_its_deadline_whatever_it_trickles(endpoint_driver):
    from walqueue.daemon import metrics_http

    driver = endpoint_driver
    slow = driver.scrape(b"G")
    driver.turn()
    driver.monotonic += metrics_http.HEAD_DEADLINE_SECONDS - 0.1
    slow.sendall(b"ET /metrics HTTP/1.0\r\n")  # more bytes do not extend the deadline
    driver.turn()
    assert driver.endpoint.next_deadline() == metrics_http.HEAD_DEADLINE_SECONDS
    driver.monotonic += 0.1
    driver.turn()
    assert driver.endpoint.next_deadline() is None
    assert closed_by_the_endpoint(slow).startswith(b"HTTP/1.0 408")


def test_an_answer_not_taken_is_cut_at_the_total_deadline(endpoint_driver):
    from walqueue.daemon import metrics_http

    driver = endpoint_driver
    sock = socket.socket()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4096)
    sock.connect(driver.endpoint.address)
    sock.sendall(b"GET /metrics HTTP/1.0\r\n\r\n")
    for _ in range(100):  # the turn up to its render: until the request waits for the text
        for key, mask in driver.selector.select(0.05):
            driver.endpoint.on_event(key.data, mask, driver.monotonic)
        if driver.endpoint.wanted:
            break
    driver.endpoint.publish("x" * (16 << 20) + "\n", driver.monotonic)  # far more than the buffers hold
    assert driver.endpoint.next_deadline() == metrics_http.REQUEST_DEADLINE_SECONDS
    driver.monotonic += metrics_http.REQUEST_DEADLINE_SECONDS
    driver.turn()
    assert driver.endpoint.next_deadline() is None
    sock.close()


def test_a_turn_accepts_at_most_its_bound_of_connections(endpoint_driver, monkeypatch):
    import selectors

    from walqueue.daemon import metrics_http

    monkeypatch.setattr(metrics_http, "MAX_ACCEPTS_PER_TURN", 3)
    driver = endpoint_driver
    socks = [driver.scrape() for _ in range(4)]
    driver.endpoint.on_event(driver.endpoint, selectors.EVENT_READ, driver.monotonic)
    assert len(driver.endpoint._scrapes) + sum(not still_open(sock) for sock in socks) == 3
    for sock in socks:
        sock.close()


@pytest.mark.parametrize("address, peer", [
    ("127.0.0.1", "loopback"), ("127.0.0.2", "loopback"), ("::1", "loopback"),
    ("::ffff:127.0.0.1", "loopback"), ("192.0.2.7", "192.0.2.7"), ("::ffff:192.0.2.7", "192.0.2.7"),
    ("2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"), ("fe80::1%eth0", "fe80::/64"),
])
def test_a_peer_is_an_address_a_v6_64_or_every_loopback_address_at_once(address, peer):
    from walqueue.daemon.metrics_http import peer_of

    assert peer_of(address) == peer
