"""A PostgreSQL restart under a running worker is logged once when it starts and once when it
heals, not once a second (issue 23: 20 warnings in 8 s).

Against a cluster of this test's own: a thread Worker on a walqueue.pg Client; the server is
stopped, and kept down until the listener has failed to reconnect three times (a log event, not
a timer); then it starts again and a task put afterwards must be done. Every log record of
walqueue.* and psycopg.pool is collected: the worker warns once about its reserve and says once
that it works again, the listener likewise, and the pool says each kind of thing once.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter

import pytest

from walqueue.pg import Client
from walqueue.worker import Worker

WAIT_SECONDS = 30.0


class Records(logging.Handler):
    """Every record of the loggers it is attached to; waits for one by an event."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records: list[logging.LogRecord] = []
        self._changed = threading.Condition()

    def emit(self, record):
        with self._changed:
            self.records.append(record)
            self._changed.notify_all()

    def wait_for(self, predicate, what):
        with self._changed:
            if not self._changed.wait_for(lambda: predicate(self.messages()), WAIT_SECONDS):
                raise AssertionError(f"no {what} in {WAIT_SECONDS} s; warnings: {self.warnings()}")

    def messages(self):
        return [record.getMessage() for record in self.records]

    def warnings(self):
        return [f"{record.name}: {record.getMessage()}" for record in self.records
                if record.levelno >= logging.WARNING]


@pytest.fixture
def records():
    handler = Records()
    loggers = [logging.getLogger(name) for name in ("walqueue", "psycopg.pool")]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.DEBUG)
        logger.addHandler(handler)
    yield handler
    for logger, level in zip(loggers, levels, strict=True):
        logger.removeHandler(handler)
        logger.setLevel(level)


def test_a_restart_is_one_warning_and_one_all_clear_per_part_of_the_worker(durable_server, records):
    client = Client(durable_server.dsn, queue="outage", connect_seconds=10)
    done = threading.Event()
    worker = Worker(client, "w1", lambda lease: done.set(), wait=1, lease_seconds=10)
    thread = threading.Thread(target=worker.run, daemon=True)
    thread.start()
    try:
        records.wait_for(lambda messages: any("listener" not in m for m in messages), "worker start")
        before = len(records.records)
        durable_server.stop()
        records.wait_for(lambda messages: sum("walqueue listener" in m and "reconnect" in m
                                              for m in messages[before:]) >= 3,
                         "three failed reconnections of the listener")
        records.wait_for(lambda messages: any("reserve failed" in m for m in messages),
                         "the worker's failed reserve")
        durable_server.start()
        client.put("after", {})
        assert done.wait(WAIT_SECONDS), records.messages()
        records.wait_for(lambda messages: any("reconnected after" in m for m in messages),
                         "the listener's all-clear")
        records.wait_for(lambda messages: any("reserve works again" in m for m in messages),
                         "the worker's all-clear")
    finally:
        worker.stop()
        thread.join(WAIT_SECONDS)
        client.close()
    warnings = [line for line in records.warnings() if "fsync=off" not in line
                and "synchronous_commit=off" not in line]
    kinds = Counter(("reserve failed" if "reserve failed" in line else
                     "listener" if "walqueue listener" in line else
                     line.split(":", 2)[1].strip()[:30]) for line in warnings)
    assert kinds["reserve failed"] == 1 and kinds["listener"] == 1, warnings
    assert all(count == 1 for count in kinds.values()), warnings
    all_clear = [m for m in records.messages() if "works again" in m or "reconnected after" in m]
    assert len(all_clear) == 2, all_clear


def test_the_pool_filter_lets_one_warning_through_per_outage_and_leaves_other_pools_alone():
    from walqueue.pg.pool_log import QUIET_SECONDS, OnePerOutage

    now = [1000.0]
    only = OnePerOutage(clock=lambda: now[0])

    def passes(name, message="error connecting in %r: %s"):
        record = logging.LogRecord("psycopg.pool", logging.WARNING, __file__, 1, message,
                                   (name, "connection refused"), None)
        return only.filter(record)

    assert passes("walqueue:q")
    now[0] += 1
    assert not passes("walqueue:q")                 # the same outage, a second later
    assert passes("walqueue-async:q")               # another pool: its own first line
    assert passes("someone-else") and passes("someone-else")  # not walqueue's: untouched
    now[0] += QUIET_SECONDS - 1
    assert not passes("walqueue:q")                 # still failing: still the same outage
    now[0] += QUIET_SECONDS + 1
    assert passes("walqueue:q")                     # quiet for a minute: a new outage
