"""walqueue-scheduler against a real PostgreSQL (SPEC §9): two schedulers side by side put
each of 100 periods exactly once, through the DSN rule of walqueue.connect and --queue;
a scheduler with random ids (tests/scheduler_broken.py) is caught putting duplicates; the
DSN's password is never logged (SPEC §8b)."""

from __future__ import annotations

import pytest

from tests.postgres import unique_name
from tests.process.schedulers import check_each_period_once, two_schedulers_side_by_side


def test_two_schedulers_side_by_side_put_each_of_100_periods_once(postgres, make_client, tmp_path):
    queue = unique_name("scheduled")
    logs = two_schedulers_side_by_side(tmp_path, postgres.dsn, args=("--queue", queue))
    check_each_period_once(make_client(queue).tasks(), logs)
    for log in logs:
        assert "into PostgreSQL at " in log and f"queue {queue}" in log


def test_the_check_catches_a_scheduler_that_puts_random_ids(postgres, make_client, tmp_path):
    queue = unique_name("scheduled")
    logs = two_schedulers_side_by_side(tmp_path, postgres.dsn, args=("--queue", queue),
                                       variant="random_task_ids")
    tasks = make_client(queue).tasks()
    assert len(tasks) == 200
    with pytest.raises(AssertionError):
        check_each_period_once(tasks, logs)


def test_a_password_in_the_dsn_is_not_logged(postgres, make_client, tmp_path):
    queue = unique_name("scheduled")
    dsn = f"{postgres.dsn} password=sekrit-4711"  # a socket connection ignores it (trust)
    logs = two_schedulers_side_by_side(tmp_path, dsn, args=("--queue", queue))
    check_each_period_once(make_client(queue).tasks(), logs)
    assert all("sekrit-4711" not in log for log in logs)
