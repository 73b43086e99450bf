"""The real Queue behaves, call by call, like the SPEC §2 reference model.

What it proves: for random sequences of put / put_many (with identical
retries, in-list duplicates and conflicts), reserve (several workers, limits,
lease lengths, reaping), ack / release / touch with current and stale leases
(old and new generations, wrong worker, unknown task, at and past the
deadline), revive, get, compact, close-and-reopen, discard-and-reopen,
`with q.batch()` groups (nested, and left by an exception), deaths at a
random hook call of a random writing call, batch or compaction, and a clock
that jumps backwards, the library returns what the model returns or raises
the same error class, calls the hook phases SPEC §6 prescribes, and after
every step holds the same tasks, counts, `last_seq`, `snapshot_seq`,
`wal_bytes` and on-disk records as the model. Invalid arguments are mixed in
and must raise `InvalidRequest` without writing. See driver.py for details.

Hypothesis runs derandomized (a fixed seed) so CI is deterministic; a failure
prints the shrunk steps and the trace of actions. The seeded random walks
print their seed.
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, settings

import walqueue
from tests.model.driver import ModelMismatch, default_factory, make_state_machine, run_model_check

QueueAgainstReferenceModel = make_state_machine(default_factory)


class TestTheQueueAgreesWithTheReferenceModelAfterEveryStep(QueueAgainstReferenceModel.TestCase):
    settings = settings(
        max_examples=75,
        stateful_step_count=40,
        deadline=None,
        derandomize=True,
        database=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
    )


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6, 7, 8])
def test_a_seeded_random_walk_of_300_calls_agrees_with_the_reference_model(seed: int) -> None:
    run_model_check(default_factory, seed, steps=300)


class _LeasesInReverseOrder(walqueue.Queue):
    def reserve(self, *args, **kwargs):  # type: ignore[no-untyped-def]
        return list(reversed(super().reserve(*args, **kwargs)))


def test_the_random_walk_catches_a_queue_that_leases_in_the_wrong_order() -> None:
    with pytest.raises(ModelMismatch, match="seed=1"):
        run_model_check(lambda directory, hook=None: _LeasesInReverseOrder(directory, hook=hook), 1)
