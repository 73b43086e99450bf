"""The faces of the conformance suite: the library and every client behind one set of calls.

A face is a backend seen through the library Queue's call shapes (SPEC §1): ``now`` is an
argument (``reserve(worker, now=, lease_seconds=, limit=)``, ``ack(lease, now=)``,
``release(lease, now=, delay=)``, ``touch(lease, now=, lease_seconds=)``, ``revive(ids,
now=)``), ``put`` takes an absolute ``available_at``, and ``get``, ``tasks`` and ``stats`` are
the clients' own. A face sets its backend's clock to ``now`` before the call, so one test body
of tests/unit/test_semantics.py runs on every face (``open_face``):

    library       walqueue.Queue itself
    memory        tests/unit/memory_client.py's MemoryClient, on a clock the face sets
    daemon        walqueue.client.Client, on walqueued's real Loop run in a thread of this
                  process (InProcessDaemon) on a clock the face sets
    daemon-aio    the daemon's asyncio client (daemon_async_client_class) on the same
    postgres      walqueue.pg.Client on the session's cluster (tests/postgres.py), a fresh
                  queue each, under the schema's test clock (postgres_set_now)
    postgres-aio  walqueue.pg.AsyncClient on the same

The asyncio clients run on an event loop of their own in a thread (EventLoopThread); each
call is awaited there.

What a face offers beyond the calls, for the tests to say what they mean once for all:

- ``written()``: a fingerprint of everything the backend has stored; equal before and after a
  call means the call wrote nothing (the library: every file of its directory and the phases
  its hook saw; the daemon: every file of its directory; PostgreSQL: this queue's rows with
  their ``xmin``, which any UPDATE changes, even one that sets the same values; memory: its
  count of changes and its tasks).
- ``advance_to(now)``: the backend's clock reads ``now``, and a backend that ends leases on its
  own (SPEC §8a) has done so: the daemon answers a round trip after the reap of that turn.
- ``reaps_on_its_own``: the daemon reaps expired leases by itself (SPEC §8a), and so does the
  memory backend, before each call; the library reaps only in ``reserve`` (SPEC §2).
  PostgreSQL's reaper (SPEC §9) runs on a thread of its own about every second of real time,
  not when the test moves the clock, so what it ended would depend on timing. So these faces
  run with ``reaper=False``, and PostgreSQL reaps, like the library, in ``reserve``.
- ``wal_directory``: the directory whose WAL a face writes (library and daemon; None where
  SPEC §9 says nothing of §3-§6 applies), and ``wal_records()``.

Every wait is bounded (BOUND_SECONDS); the daemon's thread and the event loops' threads are
stopped and joined when the face closes.
"""

from __future__ import annotations

import asyncio
import contextlib
import copy
import gc
import shutil
import tempfile
import threading
from pathlib import Path

import pytest

from tests.unit.frames import read_dir, wal_records
from walqueue import Queue, validation
from walqueue.engine import Engine

BOUND_SECONDS = 30.0  # the longest any call, start or stop here may take
# A clock the test moves ends no select timeout, as real time would: the daemon's loop wakes
# at least this often (in real seconds), so its own due work is never held up for long even
# with no request. The faces never rely on it: a request, and stop(), wake the loop at once.
DAEMON_TURN_SECONDS = 0.5
NEVER_COMPACT_BYTES = 10**15

FACES = ("library", "memory", "daemon", "daemon-aio", "postgres", "postgres-aio")
DAEMON_FACES = frozenset({"daemon", "daemon-aio"})
POSTGRES_FACES = frozenset({"postgres", "postgres-aio"})
CLIENT_FACES = frozenset(FACES) - {"library"}


def daemon_async_client_class():
    """The daemon's asyncio client (walqueue.aio.Client today): the one place that imports it."""
    from walqueue.aio import Client

    return Client


# -- PostgreSQL's test clock: the one place that knows how it is set --------------------------

_LISTENER_KEY = "_walqueue_conformance_listener"
_CLOCK_SCHEMA_KEY = "walqueue_conformance_clock_schema"


def postgres_clock_schema(request) -> tuple[str, str]:
    """(dsn, schema): the session's cluster and a schema whose clock() a client can set.

    Made once a session, on the session's cluster (tests/postgres.py session_server).
    """
    import psycopg

    from tests.pg.clock import install_test_clock
    from tests.postgres import session_server, unique_name
    from walqueue.pg import schema, wakeup

    server = session_server(request)
    name = getattr(request.config, _CLOCK_SCHEMA_KEY, None)
    if name is None:
        name = unique_name("conformance")
        with psycopg.connect(server.dsn, autocommit=True) as connection:
            schema.migrate_connection(connection, name)
            install_test_clock(connection, name)
        setattr(request.config, _CLOCK_SCHEMA_KEY, name)
    # Every AsyncClient shares the process's listener (walqueue.pg.wakeup) from its first
    # call; the last one to close stops it, a wait of up to half a second. Held here for the
    # test module, as a process with clients coming and going holds it, so it starts once a
    # module; not for the session, whose later tests fork (tests/crash/test_process_death.py)
    # and must not fork a process that runs another thread.
    module = request.node.getparent(pytest.Module)
    if not getattr(module, _LISTENER_KEY, False):
        service = wakeup.acquire(server.dsn, name)
        module.addfinalizer(lambda: wakeup.release(service))
        setattr(module, _LISTENER_KEY, True)
    return server.dsn, name


def postgres_set_now(client, now: int) -> None:
    """The clock of `client`'s calls reads `now` from here on (either PostgreSQL client, made
    with tests/pg/clock.py's ClockedClient or ClockedAsyncClient: it moves its schema's clock)."""
    client.clock.set(now)


# -- the daemon, in this process --------------------------------------------------------------


class SettableClock:
    """The daemon's clocks, moved only by the test: the wall and boot clocks read ``seconds``.

    One attribute, so the loop's thread never reads a wall clock of one time beside a boot
    clock of another (that would count as a wall-clock step). The monotonic clock stands
    still: it times what peers do (hello and frame deadlines, waits, the turn's work), and
    here no peer is ever late. Moving the other two alone is a suspend to the daemon, which
    its ``now`` follows (walqueue.daemon.clock).
    """

    def __init__(self) -> None:
        self.seconds = 0

    def wall_seconds(self) -> int:
        return self.seconds

    def boot_seconds(self) -> int:
        return self.seconds

    def monotonic_seconds(self) -> float:
        return 0.0


class InProcessDaemon:
    """walqueued's Loop over a fresh queue directory, turned by a thread of this process.

    The real clients connect to its socket. ``set_now`` moves its clock; the daemon's ``now``
    never goes backwards (SPEC §8), so asking it to is an error of the test.
    """

    def __init__(self) -> None:
        from walqueue.daemon.loop import Loop, bind_listener
        from walqueue.daemon.systemd import Notifier

        # Not pytest's tmp_path: a socket path must fit sun_path, and test ids here are long.
        self.base = Path(tempfile.mkdtemp(prefix="wq-face-", dir="/tmp"))
        self.directory = self.base / "queue"
        self.socket_path = str(self.base / "walqueued.sock")
        self.clock = SettableClock()
        with contextlib.ExitStack() as undo:  # what was made so far, should a step fail
            undo.callback(shutil.rmtree, self.base, ignore_errors=True)
            queue = undo.enter_context(Engine(self.directory))
            listener = undo.enter_context(bind_listener(self.socket_path, 0o600))
            self.loop = Loop(str(self.directory), queue, listener, socket_path=self.socket_path,
                             compact_wal_bytes=NEVER_COMPACT_BYTES, max_connections=16, hook=None,
                             notifier=Notifier({}), clock=self.clock)
            # The Loop froze the heap (gc.freeze, for a daemon's recovered state). In a test
            # process that is everything the session made so far, put out of the collector's
            # reach for good (cycles among it are never freed) once more per face.
            gc.unfreeze()
            self.loop.register_listener()
            undo.pop_all()  # the loop owns them now: its _shutdown() closes them
        timeout = self.loop._timeout
        self.loop._timeout = lambda: min(DAEMON_TURN_SECONDS, _or_forever(timeout()))
        self.failure: BaseException | None = None
        self._thread = threading.Thread(target=self._serve, name="walqueued-in-process", daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        try:
            while not self.loop.stopping:
                self.loop.one_turn()
        except BaseException as exc:  # the test reads it in stop(); the loop's run() would exit
            self.failure = exc
        finally:
            self.loop._shutdown()

    def set_now(self, now: int) -> None:
        if now < self.clock.seconds:
            raise AssertionError(f"the daemon's now never goes backwards (SPEC §8): {now} after "
                                 f"{self.clock.seconds}; list the test in its table of differences")
        self.clock.seconds = now

    def stop(self) -> None:
        self.loop.stopping = True
        with contextlib.suppress(OSError):
            self.loop._wakeup.wake()  # what a signal would do: end the turn's select now
        self._thread.join(BOUND_SECONDS)
        try:
            if self._thread.is_alive():
                raise AssertionError(f"the in-process daemon did not stop within {BOUND_SECONDS} s")
            if self.failure is not None:
                raise AssertionError("the in-process daemon's loop failed") from self.failure
        finally:
            shutil.rmtree(self.base, ignore_errors=True)


def _or_forever(seconds: float | None) -> float:
    return float("inf") if seconds is None else seconds


class EventLoopThread:
    """An event loop running in a thread of its own; ``run(coroutine)`` awaits it there (bounded)."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self.loop.run_forever, name="face-event-loop", daemon=True)
        self._thread.start()

    def run(self, coroutine):
        future = asyncio.run_coroutine_threadsafe(asyncio.wait_for(coroutine, BOUND_SECONDS), self.loop)
        return future.result(BOUND_SECONDS + 5)

    def close(self) -> None:
        self.run(self.loop.shutdown_asyncgens())
        self.loop.call_soon_threadsafe(self.loop.stop)
        self._thread.join(BOUND_SECONDS)
        if self._thread.is_alive():
            raise AssertionError(f"the event loop did not stop within {BOUND_SECONDS} s")
        self.loop.close()


# -- faces -----------------------------------------------------------------------------------


class Face:
    """A backend behind the library Queue's calls; see the module docstring."""

    reaps_on_its_own = False
    wal_directory: Path | None = None

    def __init__(self, name: str) -> None:
        self.name = name

    # What each kind of face provides.
    def _call(self, method: str, *args, **kwargs):
        raise NotImplementedError

    def _call_at(self, now: int, method: str, *args, **kwargs):
        raise NotImplementedError

    def written(self):
        raise NotImplementedError

    def advance_to(self, now: int) -> None:
        """The backend's clock reads `now`; what it does on its own when time passes is done."""

    @property
    def has_wal(self) -> bool:
        return self.wal_directory is not None

    def wal_records(self) -> list[dict]:
        assert self.wal_directory is not None, f"the {self.name} face writes no WAL"
        return wal_records(self.wal_directory)

    # The Queue's calls.
    def put(self, task_id, payload, *, key=None, available_at=0, max_attempts=3):
        return self._call("put", task_id, payload, key=key, available_at=available_at,
                          max_attempts=max_attempts)

    def put_many(self, requests):
        return self._call("put_many", requests)

    def reserve(self, worker, *, now, lease_seconds, limit=1):
        return self._call_at(now, "reserve", worker, lease_seconds=lease_seconds, limit=limit)

    def ack(self, lease, *, now):
        return self._call_at(now, "ack", lease)

    def release(self, lease, *, now, delay=0):
        return self._call_at(now, "release", lease, delay=delay)

    def touch(self, lease, *, now, lease_seconds):
        return self._call_at(now, "touch", lease, lease_seconds=lease_seconds)

    def revive(self, task_ids, *, now):
        return self._call_at(now, "revive", task_ids)

    def get(self, task_id):
        return self._call("get", task_id)

    def tasks(self, status=None, **page):
        return self._call("tasks", status, **page)

    # SPEC §8b's calls (tests/unit/test_semantics_steer.py).
    def cancel(self, task_id, *, now):
        return self._call_at(now, "cancel", task_id)

    def workers(self):
        return self._call("workers")

    def stats(self):
        return self._call("stats")


class LibraryFace(Face):
    """walqueue.Queue, whose calls take `now` themselves; its hook records the phases."""

    def __init__(self, queue: Queue, directory: Path, phases: list[str]) -> None:
        super().__init__("library")
        self.queue = queue
        self.wal_directory = directory
        self.phases = phases

    def _call(self, method, *args, **kwargs):
        return getattr(self.queue, method)(*args, **kwargs)

    def _call_at(self, now, method, *args, **kwargs):
        return getattr(self.queue, method)(*args, now=now, **kwargs)

    def written(self):
        return read_dir(self.wal_directory), len(self.phases)


class ClientFace(Face):
    """A client of SPEC §8 or §9 (or the memory backend's): `now` goes to its clock first."""

    def __init__(self, name: str, client, *, set_now, written, run=None, reaps_on_its_own=False,
                 wal_directory: Path | None = None) -> None:
        super().__init__(name)
        self.client = client
        self.reaps_on_its_own = reaps_on_its_own
        self.wal_directory = wal_directory
        self._set_now = set_now
        self._written = written
        # An asyncio client's calls are coroutines: `run` awaits them on the face's event loop.
        self._run = run or (lambda result: result)

    def _call(self, method, *args, **kwargs):
        return self._run(getattr(self.client, method)(*args, **kwargs))

    def _call_at(self, now, method, *args, **kwargs):
        self._set_now(validation.integer(now, "now"))
        return self._call(method, *args, **kwargs)

    def written(self):
        return self._written()

    def advance_to(self, now: int) -> None:
        self._set_now(validation.integer(now, "now"))
        if self.reaps_on_its_own:
            self.stats()  # answered after the turn (or the call) that reaped what expired

    def close(self) -> None:
        self._run(self.client.close())


class FaceClock:
    """The memory backend's clock: ``now()`` reads what the face set."""

    def __init__(self) -> None:
        self.seconds = 0

    def now(self) -> int:
        return self.seconds


# Each maker registers, on `stack`, the undoing of what it made as soon as it made it, so a
# face that fails half-way is torn down as far as it got.


def _library_face(stack: contextlib.ExitStack, tmp_path: Path) -> Face:
    directory, phases = tmp_path / "queue", []
    queue = stack.enter_context(Queue(directory, hook=phases.append))
    return LibraryFace(queue, directory, phases)


def _memory_face(stack: contextlib.ExitStack) -> Face:
    from tests.unit.memory_client import MemoryClient, MemoryQueue

    clock = FaceClock()
    queue = MemoryQueue(clock)

    def set_now(now):
        clock.seconds = now

    face = ClientFace("memory", MemoryClient(queue), set_now=set_now,
                      written=lambda: (queue.writes, copy.deepcopy(queue.tasks)), reaps_on_its_own=True)
    stack.callback(face.close)
    return face


def _event_loop(stack: contextlib.ExitStack) -> EventLoopThread:
    loop = EventLoopThread()
    stack.callback(loop.close)
    return loop


def _daemon_face(stack: contextlib.ExitStack, name: str) -> Face:
    from walqueue.client import Client

    daemon = InProcessDaemon()
    stack.callback(daemon.stop)
    options = {"timeout": BOUND_SECONDS, "retry_seconds": 0}
    if name == "daemon":
        client, run = Client(daemon.socket_path, **options), None
    else:
        run = _event_loop(stack).run
        client = daemon_async_client_class()(daemon.socket_path, **options)
    face = ClientFace(name, client, set_now=daemon.set_now, written=lambda: read_dir(daemon.directory),
                      run=run, reaps_on_its_own=True, wal_directory=daemon.directory)
    stack.callback(face.close)
    return face


def _postgres_face(stack: contextlib.ExitStack, name: str, request) -> Face:
    import psycopg
    from psycopg import sql

    from tests.pg.clock import ClockedAsyncClient, ClockedClient, SettableClock
    from tests.postgres import unique_name

    dsn, schema_name = postgres_clock_schema(request)
    queue = unique_name("q")
    options = {"queue": queue, "schema": schema_name, "migrate": False, "reaper": False,
               "retry_seconds": 0, "connect_seconds": BOUND_SECONDS}
    reader = stack.enter_context(psycopg.connect(dsn, autocommit=True))
    # Every row of this queue with the transaction that last wrote it: any write shows.
    statements = [sql.SQL("SELECT xmin::text, t.* FROM {} AS t WHERE t.queue = %s ORDER BY t.task_id")
                  .format(sql.Identifier(schema_name, table)) for table in ("task", "live", "completed")]

    def written():
        return [reader.execute(statement, (queue,)).fetchall() for statement in statements]

    clock = SettableClock(dsn, schema_name)
    stack.callback(clock.close)
    if name == "postgres":
        client, run = ClockedClient(dsn, clock=clock, **options), None
    else:
        run = _event_loop(stack).run
        client = ClockedAsyncClient(dsn, clock=clock, **options)
    face = ClientFace(name, client, set_now=lambda now: postgres_set_now(client, now), written=written,
                      run=run)
    stack.callback(face.close)
    return face


@contextlib.contextmanager
def open_face(name: str, request, tmp_path: Path):
    """The face `name` (one of FACES) on a fresh, empty queue; closed (and its threads joined) after."""
    with contextlib.ExitStack() as stack:
        if name == "library":
            face = _library_face(stack, tmp_path)
        elif name == "memory":
            face = _memory_face(stack)
        elif name in DAEMON_FACES:
            face = _daemon_face(stack, name)
        elif name in POSTGRES_FACES:
            face = _postgres_face(stack, name, request)
        else:
            raise ValueError(f"unknown face {name!r}; one of {FACES}")
        yield face
