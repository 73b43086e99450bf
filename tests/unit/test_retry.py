"""walqueue.retry, the one retry policy of both backends: which calls, which failures, how long.

What it proves: every public call of the four clients (walqueued's sync and
asyncio ones, PostgreSQL's sync and asyncio ones) has a rule, and the rule
is the same whichever backend serves it: the reads and put/put_many (and
the daemon's pause/resume) are sent again after a lost answer, no other
write is; a name without a rule is an error rather than a silent default;
only a lost answer (Unavailable, QueueClosed) is retried, never an answer
of the queue's (KeyConflict, StaleLease, InvalidRequest), a client's
incurable kind (NoSocket) or anything once the client was closed; the
pauses back off and never pass the deadline. That each client follows the
rule is shown per backend: tests/unit/test_client_core.py and
tests/process/test_client_shells.py (walqueued), tests/pg/test_api.py
(PostgreSQL).
"""

from __future__ import annotations

import inspect

import pytest

from walqueue import InvalidRequest, KeyConflict, QueueClosed, StaleLease, aio, retry
from walqueue.client import Client, DaemonUnavailable, NoSocket
from walqueue.pg import AsyncClient, DatabaseUnavailable
from walqueue.pg import Client as PostgresClient

# Not calls: the shells' own plumbing.
PLUMBING = {"close", "closed", "server_time", "capabilities"}


def api_calls(cls: type) -> set[str]:
    return {name for name, _ in inspect.getmembers(cls) if not name.startswith("_")} - PLUMBING


def test_every_call_of_every_client_has_one_rule():
    for cls in (Client, aio.Client, PostgresClient, AsyncClient):
        calls = api_calls(cls)
        for name in calls:
            retry.retried(name)  # raises for a call without a rule
        assert {"get", "tasks", "stats", "put", "reserve", "ack"} <= calls, cls


def test_the_reads_and_puts_are_retried_and_no_other_write_is():
    daemon, postgres = api_calls(Client), api_calls(PostgresClient)
    assert {name for name in daemon if retry.retried(name)} == {
        "get", "tasks", "workers", "connections", "stats", "daemon_stats", "put", "put_many", "pause", "resume",
        "cancel"}
    assert {name for name in postgres if retry.retried(name)} == {"get", "tasks", "workers", "stats", "expired_total", "put",
                                                                  "put_many", "cancel"}
    for name in ("reserve", "ack", "ack_and_reserve", "release", "touch", "revive", "force_release"):
        assert not retry.retried(name)
        assert retry.retry_for(name, retry_seconds=10, now=0) is None


def test_a_call_without_a_rule_is_an_error():
    with pytest.raises(ValueError, match="no rule for the call 'frobnicate'"):
        retry.retried("frobnicate")
    assert retry.call_name(lambda: None) == "<lambda>"
    with pytest.raises(ValueError):
        retry.retried(retry.call_name(object()))


@pytest.mark.parametrize("lost", [DaemonUnavailable("connection lost"), DatabaseUnavailable("connection lost"),
                                  QueueClosed("the daemon failed a write and reopened")],
                         ids=["daemon", "postgres", "queue-closed"])
def test_only_a_lost_answer_is_retried(lost):
    attempt = retry.retry_for("get", retry_seconds=10, now=0, incurable=(NoSocket,))
    assert attempt.pause_after(lost, now=0, client_closed=False) == retry.RETRY_BACKOFF_SECONDS[0]
    for answer in (NoSocket("no such file"), KeyConflict("k"), InvalidRequest("bad"),
                   StaleLease("s", task_id="t", status=None, generation=None), ValueError("a bug")):
        assert attempt.pause_after(answer, now=0, client_closed=False) is None, answer
    assert attempt.pause_after(lost, now=0, client_closed=True) is None


def test_retries_back_off_and_stop_at_the_deadline():
    attempt = retry.retry_for("put", retry_seconds=3, now=100)
    lost = DatabaseUnavailable("lost")
    pauses = [attempt.pause_after(lost, now=100 + elapsed, client_closed=False) for elapsed in (0, 0.1, 0.3, 0.6)]
    assert pauses == [0.05, 0.1, 0.2, 0.5]
    assert attempt.pause_after(lost, now=101.5, client_closed=False) == 1.0
    assert attempt.pause_after(lost, now=101.5, client_closed=False) == 1.0  # the last pause repeats
    assert attempt.pause_after(lost, now=102.6, client_closed=False) == pytest.approx(0.4)  # never past it
    assert attempt.pause_after(lost, now=103, client_closed=False) is None
