"""walqueue.pg's force_release: an operator ends leases by task id, as on walqueued.

What it proves: each current lease ends as a release at the server's now
would (ready, the attempt counted, or dead at max_attempts; the holder's
next ack is stale); all or nothing: a task that is unknown, ready,
completed or leased past its deadline is refused by name and nothing
changes; duplicates are dropped; the asyncio client does the same; and a
ctl on PostgreSQL (`walqueue-ctl --dsn ... force-release`) runs it.
"""

from __future__ import annotations

import asyncio
import json

import psycopg
import pytest
from click.testing import CliRunner

from tests.pg.clock import ClockedClient, SettableClock, install_test_clock
from tests.postgres import unique_name
from walqueue import InvalidRequest, StaleLease
from walqueue.backend import FORCE_RELEASE
from walqueue.pg import AsyncClient, schema


def test_the_current_lease_ends_as_a_release_now_and_the_holder_s_ack_is_stale(make_client):
    client = make_client()
    client.put("a", {"n": 1})
    client.put("last", {}, max_attempts=1)
    leases = client.reserve("w", limit=2, lease_seconds=600)
    assert client.force_release(["a", "last", "a"]) == ["a", "last"]
    a, last = client.get("a"), client.get("last")
    assert (a.status, a.attempts, a.generation, a.worker, a.deadline) == ("ready", 1, 1, None, None)
    assert a.available_at <= int(client.server_time()) + 1
    assert (last.status, last.attempts) == ("dead", 1)
    with pytest.raises(StaleLease):
        client.ack(leases[0])
    (again,) = client.reserve("w2")
    assert (again.task_id, again.generation, again.attempts) == ("a", 2, 2)


@pytest.mark.parametrize("other", ["ready", "completed", "unknown"])
def test_one_task_without_a_lease_refuses_all_by_name_and_changes_nothing(make_client, other):
    client = make_client()
    client.put("held", {})
    (lease,) = client.reserve("w", lease_seconds=600)
    if other != "unknown":
        client.put(other, {})
    if other == "completed":
        client.ack(client.reserve("w")[0])
    with pytest.raises(InvalidRequest, match=f"task '{other}' is {other}, not leased"):
        client.force_release(["held", other])
    held = client.get("held")
    assert (held.status, held.generation, held.deadline) == ("leased", 1, lease.deadline)
    client.ack(lease)  # the lease is still the holder's


def test_a_lease_past_its_deadline_is_expired_not_released(postgres):
    name = unique_name("clock")
    with psycopg.connect(postgres.dsn, autocommit=True) as connection:
        schema.migrate_connection(connection, name)
        install_test_clock(connection, name)
    clock = SettableClock(postgres.dsn, name)
    with ClockedClient(postgres.dsn, clock=clock, queue=unique_name("q"), schema=name, migrate=False,
                       reaper=False) as client:
        clock.set(1000)
        client.put("t", {})
        client.reserve("w", lease_seconds=30)
        clock.set(1030)
        with pytest.raises(InvalidRequest, match="task 't' is expired, not leased"):
            client.force_release(["t"])
        clock.set(1029)
        assert client.force_release(["t"]) == ["t"]
        assert client.get("t").available_at == 1029
    clock.close()


def test_the_async_client_force_releases_too(postgres):
    async def main():
        async with AsyncClient(postgres.dsn, queue=unique_name("aio")) as client:
            assert FORCE_RELEASE in client.capabilities
            await client.put("a", {})
            await client.reserve("w")
            assert await client.force_release(["a"]) == ["a"]
            assert await client.force_release([]) == []
            assert (await client.get("a")).status == "ready"
            with pytest.raises(InvalidRequest, match="is ready, not leased"):
                await client.force_release(["a"])

    asyncio.run(main())


def test_walqueue_ctl_force_release_on_postgresql(postgres, make_client):
    from walqueue.ctl import cli

    client = make_client()
    client.put("stuck", {})
    client.reserve("w", lease_seconds=600)
    options = ["--dsn", postgres.dsn, "--queue", client.queue]
    result = CliRunner().invoke(cli, [*options, "force-release", "stuck", "--yes"])
    assert result.exit_code == 0, result.output
    assert json.loads(result.stdout) == {"task_ids": ["stuck"]}
    assert client.get("stuck").status == "ready"
