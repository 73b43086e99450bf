"""The PostgreSQL client agrees with the SPEC §2 reference model, call by call.

What it proves: for seeded random walks of put / put_many (identical
retries, in-list duplicates, conflicts), reserve (several workers, limits,
lease lengths, reaping, a clock that goes backwards and reaches 2**63-1),
ack / release / touch with current and stale leases, revive and get, the
PostgreSQL backend returns what tests/model/reference.py returns or raises
the same error class (StaleLease: the same task, status and generation),
and after every call holds the same tasks (every TaskView field, in task_id
order, per status) and the same counts. The actions come from the
library's own model driver (tests/model/driver.py) without what has no
meaning here (compaction, batches, hook crashes, reopening).

The clock is the schema's test clock (tests/pg/clock.py, which production
walqueue.pg cannot install): each call runs with the action's `now`. The reaper is off, so leases expire
only when a reserve reaps, as in the model. A deliberately broken schema
(leases handed out in the wrong order) must be caught.
"""

from __future__ import annotations

import random

import psycopg
import pytest

from tests.model.driver import (
    Action,
    ActionGenerator,
    ModelMismatch,
    RandomChooser,
    call_model,
    call_real,
    model_outcome,
    real_outcome,
)
from tests.model.reference import STATUSES, ReferenceQueue, stats_tuple, view_tuple
from tests.pg.broken import broken_schema
from tests.pg.clock import ClockedClient, SettableClock, install_test_clock
from tests.postgres import session_server, unique_name
from walqueue import validation
from walqueue.pg import schema

ACTIONS = ("put",) * 5 + ("put_many",) * 3 + ("reserve",) * 5 + ("ack", "release", "touch") * 2 \
    + ("revive",) * 2 + ("get",)


class PostgresQueue:
    """The library's Queue API (explicit `now`) over a walqueue.pg.Client with the test clock."""

    def __init__(self, client: ClockedClient) -> None:
        self.client = client

    def _at(self, now):
        self.client.clock.set(validation.integer(now, "now"))

    def put(self, task_id, payload, **options):
        return self.client.put(task_id, payload, **options)

    def put_many(self, requests):
        return self.client.put_many(requests)

    def reserve(self, worker, *, now, lease_seconds, limit=1):
        validation.name(worker, "worker")
        self._at(now)
        return self.client.reserve(worker, lease_seconds=lease_seconds, limit=limit)

    def ack(self, lease, *, now):
        self._at(now)
        return self.client.ack(lease)

    def release(self, lease, *, now, delay=0):
        self._at(now)
        return self.client.release(lease, delay=delay)

    def touch(self, lease, *, now, lease_seconds):
        self._at(now)
        return self.client.touch(lease, lease_seconds=lease_seconds)

    def revive(self, task_ids, *, now):
        self._at(now)
        return self.client.revive(task_ids)

    def get(self, task_id):
        return self.client.get(task_id)


class Walk:
    """What ActionGenerator needs of a driver, and the comparison after each step."""

    def __init__(self, client: ClockedClient) -> None:
        self.queue = PostgresQueue(client)
        self.client = client
        self.model = ReferenceQueue()
        self.trace: list[Action] = []
        self.leases_seen: list = []
        self.puts_seen: list = []
        self.clock = 0
        self.fresh_ids = 0

    def fail(self, message: str) -> None:
        lines = "\n".join(f"  {index}: {action!r}" for index, action in enumerate(self.trace))
        raise ModelMismatch(f"{message}\ntrace ({len(self.trace)} actions):\n{lines}")

    def step(self, action: Action) -> None:
        self.trace.append(action)
        real = real_outcome(lambda: call_real(self.queue, action))
        model = model_outcome(lambda: call_model(self.model, action))
        if model[0] == "ok" and action.name == "reserve":
            self.leases_seen.extend(model[1])
        if real != model:
            self.fail(f"{action!r}:\n  real  {real!r}\n  model {model!r}")

    def check_state(self) -> None:
        real = [view_tuple(view) for view in self.client.tasks()]
        if real != self.model.tasks():
            self.fail(f"tasks() differ:\n  real  {real!r}\n  model {self.model.tasks()!r}")
        for status in STATUSES:
            real_status = [view_tuple(view) for view in self.client.tasks(status)]
            if real_status != self.model.tasks(status):
                self.fail(f"tasks({status!r}) differ: real {real_status!r}")
        counts = stats_tuple(self.client.stats())[:4]
        if counts != self.model.stats()[:4]:
            self.fail(f"stats differ: real {counts!r}, model {self.model.stats()[:4]!r}")


@pytest.fixture(scope="module")
def clock_schema(request):
    """A schema whose clock() reads the test clock (tests/pg/clock.py; never in production)."""
    server = session_server(request)
    name = unique_name("model")
    with psycopg.connect(server.dsn, autocommit=True) as connection:
        schema.migrate_connection(connection, name)
        install_test_clock(connection, name)
    return server, name


def run_walk(server, schema_name: str, seed: int, steps: int) -> None:
    rng = random.Random(seed)
    clock = SettableClock(server.dsn, schema_name)
    client = ClockedClient(server.dsn, clock=clock, queue=unique_name("walk"), schema=schema_name,
                           reaper=False, migrate=False)
    try:
        walk = Walk(client)
        generator = ActionGenerator(RandomChooser(rng), walk)
        for _ in range(steps):
            walk.step(generator.by_name(rng.choice(ACTIONS)))
            walk.check_state()
    except ModelMismatch as error:
        raise ModelMismatch(f"seed={seed}: {error}") from None
    finally:
        client.close()
        clock.close()


@pytest.mark.parametrize("seed", [1, 2, 3, 4, 5, 6])
def test_a_seeded_random_walk_agrees_with_the_reference_model(clock_schema, seed):
    server, name = clock_schema
    run_walk(server, name, seed, steps=150)


def test_the_walk_catches_a_schema_that_leases_in_the_wrong_order(request, monkeypatch):
    server = session_server(request)
    with broken_schema(server, "wrong_order", monkeypatch) as name:
        with psycopg.connect(server.dsn, autocommit=True) as connection:
            install_test_clock(connection, name)
        with pytest.raises(ModelMismatch, match="seed=1"):
            run_walk(server, name, 1, steps=150)
