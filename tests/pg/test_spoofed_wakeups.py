"""Spoofed wake-ups: a notification is only a hint, and it costs a waiter a bounded rate.

In PostgreSQL any role that may connect to a database may NOTIFY any channel
in it; no GRANT controls it. So a role with no rights on the walqueue schema
can send the listener's own payload ("DUE NEXT_AT QUEUE") as fast as the
server commits. Once (issue 20 item 11) each such notification made every
idle waiter of the queue reserve again: 20 waiting reserves went from 11 to
10,662 transactions/s.

What it proves:
- under a flood of notifications from a role without grants (a DO block that
  commits one pg_notify per transaction, on the server, so the flood does not
  share this process's CPU), K waiting reserves make reserve attempts in
  proportion to K × the flood's duration (at most one per
  wakeup.HINT_HOLD_SECONDS per waiter, checked with 3× slack), not in
  proportion to the notifications; and a task put during the flood is still
  leased by one of them, the rest by the others after it (sync and async);
- a genuine put that arrives while a waiter holds back after a false hint is
  deferred to the end of the hold, not dropped (the safety poll is out of
  reach, so a dropped wake-up shows as a reserve that returns empty).

The attempts are counted in the clients (every reserve statement their
`_execute` runs), so the flood's own transactions do not count.
"""

from __future__ import annotations

import asyncio
import threading
import time

import psycopg
import pytest
from psycopg import sql

from tests.pg.test_wakeup import Reserver, waiting
from tests.postgres import unique_name
from walqueue.pg import AsyncClient, migrate, wakeup
from walqueue.pg.queries import channel
from walqueue.pg.schema import DEFAULT_SCHEMA

WAIT_SECONDS = 60
WAITERS = 8
FLOOD_SECONDS = 2.0
FLOOD_AT_LEAST = 20_000   # notifications: the flood runs until both are reached
SLACK = 3


@pytest.fixture
def no_safety_poll(monkeypatch):
    monkeypatch.setattr(wakeup, "SAFETY_POLL_SECONDS", 300.0)


@pytest.fixture
def intruder(postgres):
    """The DSN of a role that may log in and has no grant on any walqueue schema."""
    role = unique_name("intruder").replace("-", "_")
    migrate(postgres.dsn)  # the schema whose tables the role cannot read
    with psycopg.connect(postgres.dsn, autocommit=True) as admin:
        admin.execute(sql.SQL("CREATE ROLE {} LOGIN").format(sql.Identifier(role)))
    try:
        dsn = f"host={postgres.base} port={postgres.port} user={role} dbname=postgres"
        with psycopg.connect(dsn, autocommit=True) as connection:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                connection.execute(sql.SQL("SELECT * FROM {}").format(
                    sql.Identifier(DEFAULT_SCHEMA, "live")))
        yield dsn
    finally:
        with psycopg.connect(postgres.dsn, autocommit=True) as admin:
            admin.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(role)))


class Flood(threading.Thread):
    """Notifications on the schema's channel, one per transaction, waking every waiter of `queue`.

    `sent` is how many; `started` and `ended` bracket the statement (monotonic).
    """

    def __init__(self, dsn: str, queue: str) -> None:
        super().__init__(daemon=True)
        self.dsn, self.queue = dsn, queue
        self.sent = 0
        self.started = self.ended = 0.0
        self.running = threading.Event()
        self.error: BaseException | None = None

    def run(self) -> None:
        block = sql.SQL("""
            DO $flood$
            DECLARE
                v_end timestamptz := clock_timestamp() + make_interval(secs => {seconds});
                v_sent bigint := 0;
            BEGIN
                WHILE clock_timestamp() < v_end OR v_sent < {at_least} LOOP
                    PERFORM pg_notify({channel}, {payload});
                    COMMIT;
                    v_sent := v_sent + 1;
                END LOOP;
                RAISE NOTICE '%', v_sent;
            END $flood$""").format(seconds=sql.Literal(FLOOD_SECONDS),
                                   at_least=sql.Literal(FLOOD_AT_LEAST),
                                   channel=sql.Literal(channel(DEFAULT_SCHEMA)),
                                   payload=sql.Literal(f"1000000 0 {self.queue}"))
        try:
            with psycopg.connect(self.dsn, autocommit=True) as connection:
                connection.add_notice_handler(
                    lambda notice: setattr(self, "sent", int(notice.message_primary)))
                self.started = time.monotonic()
                self.running.set()
                connection.execute(block)
                self.ended = time.monotonic()
        except BaseException as error:  # noqa: BLE001 - reported by the test
            self.error = error
            self.running.set()


def count_reserves(client) -> list[float]:
    """The monotonic times of every reserve statement `client` runs from now on."""
    times: list[float] = []
    real = client._execute
    if asyncio.iscoroutinefunction(real):
        async def counting(call):
            if call.statement == client._statements.reserve:
                times.append(time.monotonic())
            return await real(call)
    else:
        def counting(call):
            if call.statement == client._statements.reserve:
                times.append(time.monotonic())
            return real(call)
    client._execute = counting
    return times


def designed_bound(waiters: int, seconds: float) -> int:
    """Reserve attempts the design allows: per waiter the first wake-up's at once, one
    per HINT_HOLD_SECONDS after it, and one that straddles the end of the window."""
    return waiters * (2 + int(seconds / wakeup.HINT_HOLD_SECONDS))


def check_flood(flood: Flood, attempts: list[float]) -> None:
    assert flood.error is None, flood.error
    seconds = flood.ended - flood.started
    made = sum(flood.started <= at <= flood.ended for at in attempts)
    bound = SLACK * designed_bound(WAITERS, seconds)
    print(f"{flood.sent} notifications in {seconds:.2f} s: {made} reserve attempts by "
          f"{WAITERS} waiters (bound {bound})")
    assert flood.sent >= FLOOD_AT_LEAST
    assert made > 0, "no reserve was counted: the count would bound nothing"
    assert made <= bound, (f"{WAITERS} waiters made {made} reserves during {flood.sent} spoofed "
                           f"notifications in {seconds:.2f} s; at most {bound} allowed")


def test_a_notification_flood_from_a_role_without_grants_costs_waiters_a_bounded_rate(
        make_client, postgres, intruder, no_safety_poll):
    consumer = make_client(pool_size=WAITERS, reaper=False)
    producer = make_client(queue=consumer.queue)
    reservers = [Reserver(consumer, f"w{n}", wait=WAIT_SECONDS) for n in range(WAITERS)]
    for reserver in reservers:
        reserver.start()
    service = consumer._service_for_waits()
    waiting(service, consumer.queue, WAITERS)
    attempts = count_reserves(consumer)
    flood = Flood(intruder, consumer.queue)
    flood.start()
    assert flood.running.wait(30)
    producer.put("during", {})  # genuine, in the middle of the flood
    flood.join(120)
    assert not flood.is_alive()
    check_flood(flood, attempts)
    deadline = time.monotonic() + 30
    while not any(reserver.leases for reserver in reservers if not reserver.is_alive()):
        assert time.monotonic() < deadline, "the task put during the flood was not leased"
        time.sleep(0.01)
    producer.put_many([{"task_id": f"after{n}", "payload": {}} for n in range(WAITERS - 1)])
    for reserver in reservers:
        reserver.join(WAIT_SECONDS + 5)
        assert reserver.error is None, reserver.error
    leased = sorted(lease.task_id for reserver in reservers for lease in reserver.leases)
    assert leased == sorted(["during", *(f"after{n}" for n in range(WAITERS - 1))])


def test_a_notification_flood_costs_async_waiters_a_bounded_rate(postgres, intruder,
                                                                 no_safety_poll):
    async def main():
        queue = unique_name("aio-flood")
        async with AsyncClient(postgres.dsn, queue=queue, pool_size=WAITERS,
                               reaper=False) as consumer, \
                AsyncClient(postgres.dsn, queue=queue, reaper=False) as producer:
            waits = [asyncio.create_task(consumer.reserve(f"w{n}", wait=WAIT_SECONDS))
                     for n in range(WAITERS)]
            await asyncio.to_thread(waiting, consumer._service_for_waits(), queue, WAITERS)
            attempts = count_reserves(consumer)
            flood = Flood(intruder, queue)
            flood.start()
            assert await asyncio.to_thread(flood.running.wait, 30)
            await producer.put("during", {})
            await asyncio.to_thread(flood.join, 120)
            check_flood(flood, attempts)
            done, _ = await asyncio.wait(waits, timeout=30, return_when=asyncio.FIRST_COMPLETED)
            assert done, "the task put during the flood was not leased"
            await producer.put_many([{"task_id": f"after{n}", "payload": {}}
                                     for n in range(WAITERS - 1)])
            results = await asyncio.wait_for(asyncio.gather(*waits), WAIT_SECONDS + 5)
            assert sorted(lease.task_id for leases in results for lease in leases) == \
                sorted(["during", *(f"after{n}" for n in range(WAITERS - 1))])

    asyncio.run(main())


def test_a_put_during_the_hold_after_a_false_hint_is_deferred_not_dropped(
        make_client, intruder, no_safety_poll, monkeypatch):
    # A hold long enough that the genuine put surely lands inside it.
    monkeypatch.setattr(wakeup, "HINT_HOLD_SECONDS", 5.0)
    consumer = make_client(reaper=False)
    producer = make_client(queue=consumer.queue)
    reserver = Reserver(consumer, "w", wait=WAIT_SECONDS)
    reserver.start()
    service = consumer._service_for_waits()
    waiting(service, consumer.queue, 1)
    attempts = count_reserves(consumer)
    with psycopg.connect(intruder, autocommit=True) as connection:
        connection.execute("SELECT pg_notify(%s, %s)",
                           (channel(DEFAULT_SCHEMA), f"1 0 {consumer.queue}"))
    deadline = time.monotonic() + 30
    while True:  # until the false hint's reserve found nothing and set the hold
        with service._lock:
            waiters = service._queues[consumer.queue].waiters
            holding = bool(waiters) and waiters[0].hold_until > time.monotonic()
        if attempts and holding:
            break
        assert time.monotonic() < deadline, f"{len(attempts)} attempts, holding={holding}"
        time.sleep(0.01)
    producer.put("t", {})
    # Well before the reserve's own wait ends (a dropped wake-up would sleep until then).
    reserver.join(WAIT_SECONDS / 2)
    assert not reserver.is_alive(), "the put's wake-up, deferred by the hold, was dropped"
    assert reserver.error is None, reserver.error
    assert [lease.task_id for lease in reserver.leases] == ["t"]
    assert len(attempts) == 2  # the false hint's, and the one at the end of the hold

