"""Fixtures for the PostgreSQL backend's own tests: the session's cluster, clients on fresh queues."""

from __future__ import annotations

import pytest

from tests.postgres import PostgresServer, session_server, unique_name


@pytest.fixture
def postgres(request) -> PostgresServer:
    return session_server(request)


@pytest.fixture
def make_client(postgres):
    """make_client(queue=None, **options): a walqueue.pg.Client on a fresh queue, closed after the test."""
    from walqueue.pg import Client

    clients = []

    def make(queue: str | None = None, **options):
        client = Client(postgres.dsn, queue=queue or unique_name("q"), **options)
        clients.append(client)
        return client

    yield make
    for client in clients:
        client.close()


@pytest.fixture
def durable_server():
    """A cluster of its own with fsync=on and synchronous_commit=on, for tests that kill it."""
    server = PostgresServer(fsync=True)
    try:
        server.start()
        yield server
    finally:
        print(f"--- postgres log ---\n{server.log()}")
        server.cleanup()
