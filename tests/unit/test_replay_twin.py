"""The compiled twin of State.apply (walqueue.replay, _apply.c) against the reference.

Recovery replays the WAL's records through `replay.applier(state)`: on the
compiled path, walqueue._speedups.Applier, which decides put, reserve and ack
itself and leaves everything else, and every record a check rejects, to
`state.apply`. The differential (tests/replay_cases.py) applies seeded random
traffic, a quarter of it broken in one field, both ways and compares what
each said and the whole state after every record; the deliberately broken
twins (tests/broken_speedups.py, TWIN_VARIANTS) show it can fail. The crash
matrix, the model walks and the recovery tests run through the twin on the
compiled path and through State.apply on the pure one (scripts/test).
"""

from __future__ import annotations

import random

import pytest

from tests import broken_speedups
from tests.replay_cases import replay_differs
from walqueue import Queue, recovery, replay, speedups
from walqueue.state import State

compiled_only = pytest.mark.skipif(not speedups.COMPILED, reason=speedups.describe())
SEED = 22_2026_12


def first_difference(seed: int, cases: int) -> tuple[int, str] | None:
    for case in range(cases):
        difference = replay_differs(random.Random(seed + case))
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
    monkeypatch.setattr(State, "_current_lease", lambda self, record: None)
    state = State()
    assert replay.applier(state) == state.apply


def test_without_the_extension_recovery_applies_through_state_apply(monkeypatch):
    monkeypatch.setattr(speedups, "COMPILED", False)
    state = State()
    assert replay.applier(state) == state.apply
