"""The compiled twin of State.apply (walqueue.replay, _apply.c) against the reference.

Recovery replays the WAL's records through `replay.applier(state)`: on the
compiled path, walqueue._speedups.Applier, which decides put, reserve and ack
itself and leaves everything else, and every record a check rejects, to
`state.apply`. The differential (tests/replay_cases.py) applies seeded random
traffic, a quarter of it broken in one field, both ways and compares what
each said and the whole state after every record; the deliberately broken
twins (tests/broken_speedups.py, TWIN_VARIANTS) show it can fail. The Engine
checks a record before writing its frame and commits it after, through the
same twin (`replay.writer_steps`): `writer_differs` and WRITER_VARIANTS do
the same for that pair. The crash matrix, the model walks and the recovery
tests run through the twin on the compiled path and through State's own
methods on the pure one (scripts/test).
"""

from __future__ import annotations

import random

import pytest

from tests import broken_speedups
from tests.replay_cases import replay_differs, writer_differs
from walqueue import Queue, recovery, replay, speedups, validation
from walqueue.engine import Engine
from walqueue.errors import StaleLease
from walqueue.state import State

compiled_only = pytest.mark.skipif(not speedups.COMPILED, reason=speedups.describe())
SEED = 22_2026_12


def first_difference(seed: int, cases: int, differs=replay_differs) -> tuple[int, str] | None:
    for case in range(cases):
        difference = differs(random.Random(seed + case))
        if difference is not None:
            return case, difference
    return None


@compiled_only
def test_seeded_random_traffic_applies_alike_both_ways():
    found = first_difference(SEED, 100)
    assert found is None, f"seed {SEED + found[0]}: {found[1]}"


@compiled_only
@pytest.mark.parametrize("name", sorted(broken_speedups.TWIN_VARIANTS))
def test_the_differential_finds_each_broken_twin(name):
    with broken_speedups.installed(name):
        found = first_difference(SEED, 100)
    assert found is not None, f"the differential missed the broken twin {name}"


@compiled_only
def test_seeded_random_traffic_is_checked_and_committed_alike_both_ways():
    found = first_difference(SEED, 100, writer_differs)
    assert found is None, f"seed {SEED + found[0]}: {found[1]}"


@compiled_only
@pytest.mark.parametrize("name", sorted(broken_speedups.WRITER_VARIANTS))
def test_the_writers_differential_finds_each_broken_twin(name):
    with broken_speedups.installed(name):
        found = first_difference(SEED, 100, writer_differs)
    assert found is not None, f"the differential missed the broken twin {name}"


@compiled_only
def test_the_engine_checks_and_commits_put_reserve_ack_through_the_twin(tmp_path):
    with Engine(tmp_path / "q") as engine:
        twin = engine._check.__self__
        ids = engine.put([validation.put_request(f"t{index}", {"n": index}) for index in range(3)])
        (task,) = engine.reserve("w", now=1, lease_seconds=60)
        engine.ack(task.task_id, "w", task.generation, now=2)
        with pytest.raises(StaleLease):
            engine.ack(task.task_id, "w", task.generation, now=2)   # the reference's check says why
        engine.revive([], now=3)
        assert ids == ["t0", "t1", "t2"]
        assert (twin.applied, twin.declined) == (3, 0)
        (task,) = engine.reserve("w", now=4, lease_seconds=60)
        engine.release(task.task_id, "w", task.generation, now=5)   # left to State.check/commit
        assert (twin.applied, twin.declined) == (4, 1)


@compiled_only
def test_a_commit_of_a_change_its_check_did_not_pass_is_a_bug_not_a_silent_apply():
    state = State()
    check, commit = replay.writer_steps(state)
    record = {"op": "put", "seq": 1, "tasks": [validation.put_request("t", {})]}
    assert check(record) is record
    state.last_seq = 5   # what no writer does between check and commit
    with pytest.raises(SystemError, match="no longer passes"):
        commit(record, 10)
    assert state.tasks == {}


@compiled_only
def test_recovery_replays_put_reserve_ack_through_the_twin(tmp_path, monkeypatch):
    queue = Queue(tmp_path / "q")
    for index in range(30):
        queue.put(f"t{index:03d}", {"n": index})
    for lease in queue.reserve("w", now=1, lease_seconds=60, limit=30):
        queue.ack(lease, now=2)
    queue.put("late", {}, available_at=5)
    queue.close()
    made, real = [], replay.applier

    def spied(state):
        made.append(real(state))
        return made[-1]

    monkeypatch.setattr(recovery.replay, "applier", spied)
    reopened = Queue(tmp_path / "q")
    try:
        assert (reopened.stats().completed, reopened.stats().ready) == (30, 1)
    finally:
        reopened.close()
    (twin,) = made
    assert (twin.applied, twin.declined) == (62, 0)


@compiled_only
def test_a_replaced_state_method_or_another_state_class_gets_the_reference(monkeypatch):
    assert replay.applier(State()).__class__.__name__ == "Applier"

    class Other(State):
        pass

    other = Other()
    assert replay.applier(other) == other.apply
    assert replay.writer_steps(other) == (other.check, other.commit)
    monkeypatch.setattr(State, "_current_lease", lambda self, record: None)
    state = State()
    assert replay.applier(state) == state.apply
    assert replay.writer_steps(state) == (state.check, state.commit)


def test_without_the_extension_recovery_applies_through_state_apply(monkeypatch):
    monkeypatch.setattr(speedups, "COMPILED", False)
    state = State()
    assert replay.applier(state) == state.apply
    assert replay.writer_steps(state) == (state.check, state.commit)
