"""The faces of the conformance suite (tests/backends/faces.py) are what they claim to be.

What it proves: each face runs on the backend it names; every client keeps the names of
walqueue.backend's contract (Backend, AsyncBackend); the ``now`` a test gives reaches each
backend's clock (a lease's deadline is that ``now`` plus its seconds, on every face); the
in-process daemon refuses a ``now`` that goes back (SPEC §8) instead of quietly testing
something else; and closing a face stops the threads it started.
"""

from __future__ import annotations

import threading

import pytest

from tests.backends.faces import CLIENT_FACES, FACES, daemon_async_client_class, open_face
from walqueue.backend import CAPABILITIES, AsyncBackend, Backend

ASYNC_FACES = frozenset({"daemon-aio", "postgres-aio"})
FACE_THREADS = ("walqueued-in-process", "face-event-loop")


def client_class(name):
    if name == "memory":
        from tests.unit.memory_client import MemoryClient

        return MemoryClient
    if name == "daemon":
        from walqueue.client import Client

        return Client
    if name == "daemon-aio":
        return daemon_async_client_class()
    from walqueue.pg import AsyncClient, Client

    return AsyncClient if name in ASYNC_FACES else Client


@pytest.fixture(params=FACES)
def face(request, tmp_path):
    with open_face(request.param, request, tmp_path) as face:
        yield face


@pytest.mark.parametrize("name", sorted(CLIENT_FACES))
def test_each_face_runs_on_the_client_it_names(request, tmp_path, name):
    with open_face(name, request, tmp_path) as face:
        made, named = type(face.client), client_class(name)
        if name in ("postgres", "postgres-aio"):
            # tests/pg/clock.py's subclass: the production client, its estimate of the
            # server's clock following the test clock, and nothing else of its own.
            assert issubclass(made, named)
            added = {attribute for cls in made.__mro__[:made.__mro__.index(named)]
                     for attribute in vars(cls) if not attribute.startswith("__")}
            assert added <= {"server_time"}, added
        else:
            assert made is named


@pytest.mark.parametrize("name", sorted(CLIENT_FACES))
def test_every_client_has_the_calls_of_the_backend_contract(name):
    contract = AsyncBackend if name in ASYNC_FACES else Backend
    calls = sorted(contract.__protocol_attrs__ - {"capabilities"})
    assert [call for call in calls if not hasattr(client_class(name), call)] == []


@pytest.mark.parametrize("name", sorted(CLIENT_FACES))
def test_every_client_declares_its_capabilities(request, tmp_path, name):
    with open_face(name, request, tmp_path) as face:
        assert isinstance(face.client.capabilities, frozenset)
        assert face.client.capabilities <= CAPABILITIES
        assert isinstance(face.client, AsyncBackend if name in ASYNC_FACES else Backend)


def test_the_now_a_test_gives_reaches_the_backends_clock(face):
    face.put("t", {})
    (lease,) = face.reserve("w", now=100, lease_seconds=10, limit=1)
    assert lease.deadline == 110
    assert face.touch(lease, now=105, lease_seconds=20).deadline == 125


def test_the_daemon_face_refuses_a_now_that_goes_back(request, tmp_path):
    with open_face("daemon", request, tmp_path) as face:
        face.put("t", {})
        face.reserve("w", now=100, lease_seconds=10)
        with pytest.raises(AssertionError, match="never goes backwards"):
            face.reserve("w", now=99, lease_seconds=10)


@pytest.mark.parametrize("name", ["daemon", "daemon-aio", "postgres-aio"])
def test_closing_a_face_stops_the_threads_it_started(request, tmp_path, name):
    with open_face(name, request, tmp_path) as face:
        face.stats()
        assert {thread.name for thread in threading.enumerate()} & set(FACE_THREADS)
    assert not {thread.name for thread in threading.enumerate()} & set(FACE_THREADS)
