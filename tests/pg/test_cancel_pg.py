"""walqueue.pg's cancel (SPEC §8b) where only a database can show it: a reserve that takes the
row while the cancel waits for its lock wins, and the task is never completed under that
lease. The semantics every backend shares are tests/unit/test_semantics_steer.py's.
"""

from __future__ import annotations

import threading
import time

import psycopg
import pytest

from walqueue import InvalidRequest

BOUND_SECONDS = 20.0


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + BOUND_SECONDS
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.01)


def test_a_reserve_that_takes_the_row_first_wins_and_the_cancel_is_refused(postgres, make_client):
    client = make_client()
    client.put("t", {"n": 1})
    outcome: list[BaseException | None] = []
    with psycopg.connect(postgres.dsn) as holder, psycopg.connect(postgres.dsn, autocommit=True) as watcher:
        # A reserve in flight: the row locked and leased, not yet committed.
        holder.execute("UPDATE walqueue.live SET status = 'leased', attempts = attempts + 1, "
                       "generation = generation + 1, worker = 'racer'::bytea, deadline = 2^62::bigint "
                       "WHERE queue = %s AND task_id = 't'::bytea", (client.queue,))

        def cancel() -> None:
            try:
                client.cancel("t")
            except BaseException as error:  # noqa: BLE001 - judged by the test
                outcome.append(error)
            else:
                outcome.append(None)

        thread = threading.Thread(target=cancel)
        thread.start()
        try:
            wait_for(lambda: watcher.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' "
                "AND query LIKE '%%DELETE FROM%%'").fetchone()[0] == 1, "the cancel to wait for the row")
            holder.commit()
        finally:
            thread.join(BOUND_SECONDS)
    assert not thread.is_alive()
    (error,) = outcome
    assert isinstance(error, InvalidRequest) and "changed while it was being cancelled" in str(error)
    task = client.get("t")
    assert (task.status, task.worker, task.generation) == ("leased", "racer", 1)


def test_a_cancelled_task_keeps_its_row_in_task_so_its_key_stays_taken(postgres, make_client):
    client = make_client()
    client.put("t", {"n": 1}, key="k")
    client.cancel("t")
    with psycopg.connect(postgres.dsn) as reader:
        rows = reader.execute("SELECT (SELECT count(*) FROM walqueue.task WHERE queue = %s AND key = 'k'::bytea), "
                              "(SELECT count(*) FROM walqueue.live WHERE queue = %s), "
                              "(SELECT count(*) FROM walqueue.completed WHERE queue = %s)",
                              (client.queue, client.queue, client.queue)).fetchone()
    assert rows == (1, 0, 1)
    with pytest.raises(InvalidRequest, match="reserved"):
        client.reserve("walqueue:cancel")


@pytest.mark.parametrize("status", [None, "dead", "completed"])
def test_a_page_is_an_index_scan_stopped_by_its_limit_not_a_sort_of_every_row(postgres, make_client, status):
    """2,000 ready tasks, 1,000 completed, 20 dead: a page of the few dead ones reads the index
    of migration 2 (the status is in its condition, not a filter over every live row)."""
    from walqueue.pg import calls

    client = make_client()
    client.put_many([{"task_id": f"t{i:05d}", "payload": {}} for i in range(3000)])
    for lease in client.reserve("w", limit=1000):
        client.ack(lease)
    client.put_many([{"task_id": f"d{i:02d}", "payload": {}, "max_attempts": 1} for i in range(20)])
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        connection.execute("UPDATE walqueue.live SET status = 'dead', attempts = 1 "
                           "WHERE queue = %s AND task_id < 't'::bytea", (client.queue,))
        connection.execute("ANALYZE walqueue.task, walqueue.live, walqueue.completed")
        call = calls.tasks_page_call(calls.statements("walqueue"), client.queue, status,
                                     after="d05" if status == "dead" else "t01000", limit=10)
        plan = "\n".join(row[0] for row in connection.execute("EXPLAIN " + call.statement, call.params))
    assert "Index" in plan and "Sort" not in plan and "Seq Scan" not in plan, plan
    if status == "dead":
        assert "live_status_task" in plan, plan
    assert [task.task_id for task in client.tasks(status, after="d05", limit=3)] == (
        ["d06", "d07", "d08"] if status != "completed" else ["t00000", "t00001", "t00002"])
