"""walqueue.pg's two clients are one API (walqueue.pg.api) over two shells, and follow walqueue.retry.

What it proves: every public call of Client and AsyncClient is the very
function of ClientApi (the shells add only their I/O: neither defines a
call, builds a statement or decides a retry), so the two call lists are one;
after a lost answer (DatabaseUnavailable, injected at the shell's one
statement primitive) the reads and put/put_many are sent again and answer,
while reserve, ack, release, touch and revive raise at once, sent once —
the rule walqueue.retry gives walqueued's clients too (tests/unit/test_retry.py).
"""

from __future__ import annotations

import asyncio
import inspect

import pytest

import walqueue.pg.aio
import walqueue.pg.client
from tests.postgres import unique_name
from walqueue.pg import AsyncClient, Client, DatabaseUnavailable
from walqueue.pg.api import ClientApi

SHELL_STEPS = {"close", "closed", "server_time"}


def public_calls(cls: type) -> dict[str, object]:
    return {name: member for name, member in inspect.getmembers(cls)
            if not name.startswith("_") and callable(member)}


def test_both_shells_run_the_one_api_class():
    api = {name: member for name, member in public_calls(ClientApi).items() if name not in SHELL_STEPS}
    assert {"put", "put_many", "reserve", "ack", "ack_and_reserve", "release", "touch", "revive", "get",
            "tasks", "stats"} <= set(api)
    for shell in (Client, AsyncClient):
        assert issubclass(shell, ClientApi)
        calls = {name: member for name, member in public_calls(shell).items() if name not in SHELL_STEPS}
        assert calls == api, shell  # the same functions, not look-alikes
    for module in (walqueue.pg.client, walqueue.pg.aio):
        source = inspect.getsource(module)
        assert not [name for name in api if f"def {name}(" in source], module.__name__
        assert "_call(" not in source and "Retry(" not in source and "import retry" not in source, module.__name__
        assert "SELECT" not in source, module.__name__


def inject_lost_answers(client, count: int) -> list[str]:
    """Make the next `count` statements of `client` fail as a broken connection would; returns the
    names of the calls it runs from now on, one per attempt."""
    real = client._execute
    attempts: list[str] = []

    def failed(call):
        attempts.append(call.name)
        return len(attempts) <= count

    if asyncio.iscoroutinefunction(real):
        async def execute(call):
            if failed(call):
                raise DatabaseUnavailable("the connection broke (injected)")
            return await real(call)
    else:
        def execute(call):
            if failed(call):
                raise DatabaseUnavailable("the connection broke (injected)")
            return real(call)
    client._execute = execute
    return attempts


def test_the_reads_and_puts_are_sent_again_after_a_lost_answer(make_client):
    client = make_client(reaper=False)
    for name, call in (("put", lambda: client.put("t", {"n": 1})),
                       ("put_many", lambda: client.put_many([{"task_id": "u", "payload": {}}])),
                       ("get", lambda: client.get("t")), ("tasks", client.tasks), ("stats", client.stats)):
        attempts = inject_lost_answers(client, 1)
        call()
        assert attempts == [name, name], name
    assert client.get("t").payload == {"n": 1} and client.stats().ready == 2


def test_no_other_write_is_sent_twice_after_a_lost_answer(make_client):
    client = make_client(reaper=False)
    client.put("t", {}, max_attempts=1)
    (lease,) = client.reserve("w", lease_seconds=60)
    for name, call in (("reserve", lambda: client.reserve("w")), ("ack", lambda: client.ack(lease)),
                       ("release", lambda: client.release(lease)),
                       ("touch", lambda: client.touch(lease, lease_seconds=60)),
                       ("ack_and_reserve", lambda: client.ack_and_reserve(lease)),
                       ("revive", lambda: client.revive(["t"]))):
        attempts = inject_lost_answers(client, 1)
        with pytest.raises(DatabaseUnavailable):
            call()
        assert attempts == [name], name
    assert client.get("t").status == "leased"  # nothing was sent


def test_the_async_client_follows_the_same_rule(postgres):
    async def main():
        async with AsyncClient(postgres.dsn, queue=unique_name("aio"), reaper=False) as client:
            attempts = inject_lost_answers(client, 1)
            assert await client.put("t", {}) == "t"
            assert (await client.get("t")).status == "ready"
            assert attempts == ["put", "put", "get"]
            attempts = inject_lost_answers(client, 1)
            with pytest.raises(DatabaseUnavailable):
                await client.reserve("w")
            assert attempts == ["reserve"]

    asyncio.run(main())
