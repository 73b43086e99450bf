"""Every deliberately broken variant (tests/broken.py) is caught; the real library is not.

Four kinds of evidence, each run against every variant:
  - the crash matrix (tests/crash/matrix.py), in process, with the variant
    patched in, appending and with a preallocated WAL (caught if either goes red);
  - the power-loss suite (tests/crash/test_power_loss.py, one power cut at
    every hook call on the simulated disk), appending and preallocated;
  - seeded random walks against the reference model (tests/model/driver.py);
  - the example-based unit tests, the one named for the variant in a child pytest
    with WALQUEUE_BROKEN set (the same test passes on the real library in the suite).
CAUGHT says which checks must go red for which variant; a variant that a
check should catch and does not fails the test, and so does a check that
goes red where it should not (the variant would then be broken in more ways
than its one change, which would make the evidence worthless).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import broken
from tests.crash import test_power_loss as power_loss
from tests.crash.matrix import preallocating_factory, run_crash_matrix
from tests.model.driver import run_model_check
from walqueue import Queue

ROOT = Path(__file__).resolve().parents[2]
MODEL_SEEDS = range(6)
MODEL_STEPS = 150

MATRIX_FACTORIES = (Queue, preallocating_factory)
POWER_LOSS_MODES = (power_loss.APPEND, power_loss.PREALLOCATE)

# variant -> (caught by the crash matrix, caught by the power-loss suite,
#             caught by the model walks, the unit test that catches it: the one that says
#             what the variant breaks, not its whole file, so a child pytest runs one test)
CAUGHT = {
    "recovery_trusts_the_newest_snapshot": (True, False, True,
        "tests/unit/test_recovery.py::test_an_orphan_snapshot_newer_than_currents_is_ignored"),
    "compaction_deletes_before_publishing": (True, True, True,
        "tests/unit/test_format.py::test_a_second_compaction_deletes_the_previous_snapshot_and_segment"),
    "snapshot_drops_lease_state": (True, True, True,
        "tests/unit/test_format.py::test_compaction_writes_the_exact_snapshot_and_current_and_rotates_the_wal"),
    "snapshot_drops_tombstones": (True, True, True,
        "tests/unit/test_format.py::test_compaction_writes_the_exact_snapshot_and_current_and_rotates_the_wal"),
    "stale_ack_appends_a_frame": (True, False, True,
        "tests/unit/test_semantics.py::test_a_lease_presented_by_another_worker_is_stale"),
    "reap_forgets_the_old_deadline": (True, False, True,
        "tests/unit/test_semantics.py::test_reaping_a_lease_sets_available_at_to_its_old_deadline"),
    "lease_valid_at_its_deadline": (False, False, True,
        "tests/unit/test_semantics.py::test_a_lease_is_stale_from_its_deadline_on"),
    "torn_tail_left_in_place": (True, False, False,
        "tests/unit/test_recovery.py::test_a_final_frame_torn_at_any_byte_is_truncated_and_the_sequence_continues"),
    # Only a dead process between rotation and publishing leaves the sealed
    # segment on disk (the preallocating matrix), or a power cut there.
    "seal_without_trim": (True, True, False,
        "tests/unit/test_preallocation.py::test_a_crash_right_after_rotation_leaves_the_sealed_segment_trimmed"),
    # A process death keeps the page cache: only a power cut shows it.
    "prealloc_no_sync": (False, True, False,
        "tests/unit/test_preallocation.py::test_an_answered_put_survives_a_power_cut_that_keeps_nothing_unsynced"),
    "backup_copies_current_file_sizes": (False, False, False,
        "tests/unit/test_backup.py::test_only_the_manifest_length_of_a_preallocated_active_segment_is_copied"),
    # Only a copy that stops while it writes CURRENT shows it.
    "backup_unmarks_before_publishing": (False, False, False,
        "tests/unit/test_backup.py::test_a_copy_killed_half_way_is_an_incomplete_backup_to_verify_not_a_corrupt_queue"),
    # A link planted in the directory: no crash or model walk plants one.
    "opens_follow_links": (False, False, False,
        "tests/unit/test_links.py::test_a_linked_lock_file_is_refused_and_its_target_not_created"),
    # A path flipped or replaced under the daemon: no crash or model walk touches the path.
    "queue_reaches_the_path_again": (False, False, False,
        "tests/unit/test_directory.py::test_walqueued_serves_the_directory_it_judged_though_the_link_is_flipped_before_the_open"),
    "walk_trusts_every_link": (False, False, False,
        "tests/unit/test_directory.py::test_walqueued_refuses_a_path_through_a_link_others_may_replace"),
    # Only a hand-written snapshot holds a tombstone entry that breaks a rule.
    "plain_tombstones_unchecked": (False, False, False,
        "tests/unit/test_tombstones.py::test_a_tombstone_entry_breaking_a_rule_is_corrupt_and_named_by_its_offset"),
    # Its frames are the real cancel's, so every crash leaves a state some prefix of them gives:
    # what catches it is the count of fsyncs, one per cancel (SPEC §8b: one batch).
    "cancel_in_two_batches": (True, False, True,
        "tests/unit/test_cancel.py::test_a_cancel_is_one_batch_made_durable_by_one_fsync"),
}


def _matrix_failures() -> list[str]:
    failures = []
    for factory in MATRIX_FACTORIES:
        failures += run_crash_matrix(factory).failures
    return failures


def _power_loss_failures() -> list[str]:
    failures = []
    for mode in POWER_LOSS_MODES:
        failures += power_loss.all_power_loss_failures(mode=mode, stop_at_first=True)
    return failures


def test_every_variant_in_tests_broken_has_an_expectation() -> None:
    assert set(CAUGHT) == set(broken.VARIANTS)


def test_the_real_library_passes_the_checks_that_catch_the_variants() -> None:
    assert _matrix_failures() == []
    assert _power_loss_failures() == []
    for seed in MODEL_SEEDS:
        run_model_check(Queue, seed, steps=MODEL_STEPS)


@pytest.mark.parametrize("variant", sorted(CAUGHT))
def test_the_crash_matrix_catches_exactly_the_expected_variants(variant: str) -> None:
    with broken.active(variant):
        try:
            failures = _matrix_failures()
        except Exception as error:  # noqa: BLE001 - the harness tripping over the variant is a catch
            failures = [f"the matrix raised {type(error).__name__}: {error}"]
    expected, _, _, _ = CAUGHT[variant]
    assert bool(failures) == expected, failures[:3]


@pytest.mark.parametrize("variant", sorted(CAUGHT))
def test_the_power_loss_suite_catches_exactly_the_expected_variants(variant: str) -> None:
    with broken.active(variant):
        try:
            failures = _power_loss_failures()
        except Exception as error:  # noqa: BLE001 - the harness tripping over the variant is a catch
            failures = [f"the power-loss suite raised {type(error).__name__}: {error}"]
    _, expected, _, _ = CAUGHT[variant]
    assert bool(failures) == expected, failures[:3]


@pytest.mark.parametrize("variant", sorted(CAUGHT))
def test_the_model_walks_catch_exactly_the_expected_variants(variant: str) -> None:
    caught = []
    with broken.active(variant):
        for seed in MODEL_SEEDS:
            try:
                run_model_check(Queue, seed, steps=MODEL_STEPS)
            except AssertionError as error:
                caught.append((seed, str(error).splitlines()[0]))
            except Exception as error:  # noqa: BLE001 - a crash of the walk is a catch too
                caught.append((seed, f"{type(error).__name__}: {error}"))
    _, _, expected, _ = CAUGHT[variant]
    assert bool(caught) == expected, caught[:3]


@pytest.mark.parametrize("variant", sorted(CAUGHT))
def test_the_unit_test_named_for_each_variant_goes_red_under_it(variant: str) -> None:
    _, _, _, suite = CAUGHT[variant]
    env = {**os.environ, "WALQUEUE_BROKEN": variant}
    result = subprocess.run(
        [sys.executable, "-m", "pytest", "-x", "-q", "-rf", "-p", "no:cacheprovider", suite],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    summary = result.stdout.strip().splitlines()[-3:]
    # Exit code 1 means tests ran and failed (not a collection or usage error).
    assert result.returncode == 1, (result.returncode, summary, result.stderr[-2000:])
    assert any(line.startswith("FAILED") for line in result.stdout.splitlines()), summary
