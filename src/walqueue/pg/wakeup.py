"""Waking waiting reserves, and reaping leases, for the PostgreSQL clients of one process.

One `Service` per process and (dsn, schema), shared by every Client and
AsyncClient there, runs one thread with one dedicated connection that:

- LISTENs on the schema's channel. The operation functions NOTIFY inside the
  writing transaction (so a notification is delivered only if the write
  commits) with the payload "DUE NEXT_AT QUEUE": DUE tasks became due now,
  or one becomes due at NEXT_AT. One notification per transaction, and only
  while some process waits on that queue (a `listener` row), because NOTIFY
  takes a database-wide lock at commit.
- wakes, for DUE, as many local waiters of that queue as tasks became due,
  oldest first (no thundering herd in a process; across processes each
  wakes at most DUE of its own), and for NEXT_AT the head waiter, which
  keeps the one timer of the queue in this process: at the next due
  available_at or lease deadline, as the reserve function reports it;
- reaps every known queue's expired leases every REAP_SECONDS, so `get` and
  `stats` show them ended even when nobody reserves (SPEC §9);
- removes its `listener` rows once a queue has had no waiter for
  LINGER_SECONDS, and rows of processes that are gone.

No lost wake-up: a waiter joins the local list, registers the queue (under
an exclusive advisory lock that writers take shared before they look for a
listener, so every writer either sees the registration or committed before
it), then reserves again before sleeping. A waiter that leased a full
`limit` wakes the next one, in case more became due than were announced.
Every waiter also polls every SAFETY_POLL_SECONDS, in case a notification
was lost (the listener reconnected, say). Behind a transaction-mode pooler
LISTEN does not work: the service notices (its backend pid changes between
transactions, or its own probe notification never arrives) and waiters poll
every POLL_SECONDS instead.

A notification is only a hint: any role that may connect to the database may
NOTIFY this channel (PostgreSQL has no privilege for it), with any payload.
It never makes anything leased that is not due (the reserve reads the
tables), but each one made every idle waiter reserve again, so a flood of
them turned waiting reserves into a busy loop. So a waiter whose wake-up
found nothing holds back: it reserves for its next wake-up no sooner than
HINT_HOLD_SECONDS after that fruitless reserve (see `Waiter`). A wake-up in
the hold is deferred to its end, never dropped, so a task that becomes due
while reserves wait is still leased within HINT_HOLD_SECONDS plus a round
trip, inside SPEC §9's one second; and a flood costs each waiter at most
1 / HINT_HOLD_SECONDS reserves a second, whatever the notifications' rate.
"""

from __future__ import annotations

import contextlib
import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import psycopg

from walqueue.dsn import redacted
from walqueue.outage import Outage
from walqueue.pg.queries import Queries, channel

log = logging.getLogger("walqueue.pg")

REAP_SECONDS = 1.0
SAFETY_POLL_SECONDS = 5.0
POLL_SECONDS = 0.5           # without LISTEN: keeps SPEC §9's "leased within one second"
LINGER_SECONDS = 10.0
PROBE_SECONDS = 2.0
RECONNECT_SECONDS = 1.0
STALE_SWEEP_SECONDS = 30.0
# After a wake-up whose reserve found nothing, a waiter's next wake-up waits
# this long after that reserve: at most 4 wake-up reserves a second per
# waiter, and a due task still leased within SPEC §9's one second.
HINT_HOLD_SECONDS = 0.25
# When a due task exists but a concurrent transaction held it, look again this soon.
BUSY_PAUSE_SECONDS = 0.05
# The statements of the listener and of a waiter's registration, in sql/wakeup.sql.
WAKEUP_FILE = "wakeup.sql"


def wait_pause(next_due: int | None, is_head: bool, polling: bool, server_time: float) -> float:
    """How long a waiter whose reserve leased nothing sleeps before reserving again, unless woken.

    `next_due` is the server time at which a task next becomes due or a
    lease expires, as that reserve reported it (None: nothing pending); only
    the head waiter keeps that timer, the others wait to be woken.
    """
    pause = POLL_SECONDS if polling else SAFETY_POLL_SECONDS
    if next_due is not None and is_head:
        until_due = next_due - server_time
        pause = min(pause, max(BUSY_PAUSE_SECONDS, until_due + 0.01))
    return pause


@dataclass(eq=False)
class Waiter:
    """One waiting reserve. `wake` must be callable from the service thread.

    `woken` is set by the service when it wakes the waiter, and cleared by the
    waiter just before it reserves again; while set, notifications wake other
    waiters instead. `hinted` says the coming reserve is for a wake-up (a
    notification, or another waiter passing one on), not for its own timer;
    `hold_until` (monotonic) is when a wake-up may make it reserve again.
    """

    wake: Callable[[], None]
    woken: bool = False
    hinted: bool = False
    hold_until: float = 0.0

    def reserved_nothing(self, now: float) -> None:
        """After a reserve that leased nothing: if a wake-up asked for it, the hint was
        false (a spoofed NOTIFY, or a task another waiter took first), so the next
        wake-up waits until HINT_HOLD_SECONDS from now."""
        if self.hinted:
            self.hold_until = now + HINT_HOLD_SECONDS

    def hold(self, signalled: bool, now: float, timer_end: float) -> float:
        """After the wait ended (`signalled`: by a wake-up, else by its timer): the
        seconds to wait yet before reserving. A wake-up inside the hold is
        deferred to its end, or to the waiter's own timer if that comes first;
        the waiter stays `woken` meanwhile, so the service wakes others."""
        self.hinted = signalled
        if not signalled:
            return 0.0
        return max(0.0, min(self.hold_until, timer_end) - now)


@dataclass
class _Queue:
    waiters: list[Waiter] = field(default_factory=list)
    registered: bool = False
    idle_since: float = 0.0
    reaping: int = 0           # clients of this process that want it reaped


class Service:
    """See the module docstring. Get it with `acquire(dsn, schema)`, give it back with `release`."""

    def __init__(self, dsn: str, schema: str, *, listen: bool = True) -> None:
        self.dsn = dsn
        self.schema = schema
        self.channel = channel(schema)
        self.statements = Queries(WAKEUP_FILE, schema)
        self._lock = threading.Lock()
        self._queues: dict[str, _Queue] = {}
        self._listening = threading.Event()    # set once LISTEN works, or polling was chosen
        self.requested_polling = not listen
        self.polling = not listen               # True: no LISTEN (a pooler, or asked)
        self.pid: int | None = None             # the listening backend
        self.woken = 0                          # waiters woken by notifications (tests count it)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name=f"walqueue-pg-{schema}", daemon=True)
        self._thread.start()

    # -- used by the clients ---------------------------------------------------

    def wanted_reaping(self, queue: str, wanted: bool) -> None:
        with self._lock:
            self._queues.setdefault(queue, _Queue()).reaping += 1 if wanted else -1

    def ready(self, timeout: float) -> bool:
        """Wait (bounded) until notifications flow or polling was chosen."""
        return self._listening.wait(timeout)

    def add(self, queue: str, wake: Callable[[], None]) -> Waiter:
        waiter = Waiter(wake)
        with self._lock:
            self._queues.setdefault(queue, _Queue()).waiters.append(waiter)
        return waiter

    def remove(self, queue: str, waiter: Waiter) -> None:
        with self._lock:
            state = self._queues[queue]
            was_head = bool(state.waiters) and state.waiters[0] is waiter
            state.waiters.remove(waiter)
            if not state.waiters:
                state.idle_since = time.monotonic()
            elif was_head:
                # The new head takes over the queue's timer: it reserves once
                # more, learns the next due time and sleeps until then.
                self._wake(state.waiters[0])

    def is_head(self, queue: str, waiter: Waiter) -> bool:
        with self._lock:
            waiters = self._queues[queue].waiters
            return bool(waiters) and waiters[0] is waiter

    def pass_on(self, queue: str, waiter: Waiter) -> None:
        """`waiter` leased all it asked for: more may be due, so wake the next one."""
        with self._lock:
            for other in self._queues[queue].waiters:
                if other is not waiter and not other.woken:
                    self._wake(other)
                    return

    def needs_registration(self, queue: str) -> bool:
        with self._lock:
            state = self._queues.setdefault(queue, _Queue())
            return not (state.registered or self.polling or self.pid is None)

    def registration(self, queue: str) -> tuple[str, tuple]:
        """The statement that makes writers of `queue` notify this process.

        The caller runs it (one statement, so one transaction) on its own
        connection, while it is in the waiter list (so the row is not removed meanwhile), then
        calls `registered`. Its commit comes after every writer that did not
        see it has committed.
        """
        return self.statements.register, (queue, self.pid)

    def registered(self, queue: str, pid: int) -> None:
        with self._lock:
            if pid == self.pid:
                self._queues[queue].registered = True

    def close(self) -> None:
        self._stop.set()
        self._thread.join(10)

    # -- the thread --------------------------------------------------------------

    def _wake(self, waiter: Waiter) -> None:
        waiter.woken = True
        waiter.wake()

    def _deliver(self, payload: str) -> None:
        try:
            due_text, next_text, queue = payload.split(" ", 2)
            due, next_at = int(due_text), int(next_text)
        except ValueError:
            return  # our own probe, or a NOTIFY that is not ours
        if due < 0 or next_at < 0:
            return  # not ours either (a negative slice would wake all but a few)
        with self._lock:
            state = self._queues.get(queue)
            if state is None:
                return
            idle = [waiter for waiter in state.waiters if not waiter.woken]
            for waiter in idle[:due]:
                self._wake(waiter)
                self.woken += 1
            if next_at and not due and idle and state.waiters[0] is idle[0]:
                self._wake(idle[0])  # the head re-reads the next due time

    def _wake_all(self) -> None:
        with self._lock:
            for state in self._queues.values():
                for waiter in state.waiters:
                    self._wake(waiter)

    def _connect(self) -> psycopg.Connection:
        connection = psycopg.connect(self.dsn, autocommit=True, connect_timeout=10,
                                     application_name="walqueue listener")
        if self.polling:
            return connection
        connection.execute(self.statements.listen)
        pids = {connection.execute(self.statements.backend_pid).fetchone()[0] for _ in range(2)}
        probe = f"probe {id(self)}"
        connection.execute(self.statements.probe, (probe,))
        received = any(notify.payload == probe
                       for notify in connection.notifies(timeout=PROBE_SECONDS, stop_after=1))
        if len(pids) != 1 or not received:
            log.warning("LISTEN/NOTIFY does not work on %s (a transaction-mode pooler?): "
                        "waiting reserves poll every %s s instead", self.schema, POLL_SECONDS)
            self.polling = True
        else:
            self.pid = pids.pop()
        return connection

    def _run(self) -> None:
        connection = None
        last_reap = last_sweep = 0.0
        outage = Outage()  # one warning when the connection is lost, one line when it is back
        while not self._stop.is_set():
            try:
                if connection is None or connection.closed or connection.broken:
                    with self._lock:
                        for state in self._queues.values():
                            state.registered = False
                    self.pid = None
                    connection = self._connect()
                    healed = outage.healed(time.monotonic())
                    if healed is not None:
                        log.info("walqueue listener on %s: reconnected after %d failed attempt(s) "
                                 "over %.0f s", self.schema, healed.failures, healed.seconds)
                    self._listening.set()
                    self._wake_all()  # notifications may have been missed meanwhile
                if self.polling:
                    self._stop.wait(min(REAP_SECONDS, POLL_SECONDS))
                else:
                    for notify in connection.notifies(timeout=REAP_SECONDS / 2):
                        self._deliver(notify.payload)
                now = time.monotonic()
                if now - last_reap >= REAP_SECONDS:
                    last_reap = now
                    self._reap(connection)
                    self._unregister_idle(connection, now)
                if now - last_sweep >= STALE_SWEEP_SECONDS:
                    last_sweep = now
                    connection.execute(self.statements.sweep)
            except psycopg.Error as error:
                said = " ".join(redacted(str(error), self.dsn).split())
                if outage.failed(time.monotonic()):
                    log.warning("walqueue listener on %s: %s; reconnecting every %g s (logged again "
                                "when it is back)", self.schema, said, RECONNECT_SECONDS)
                else:
                    log.debug("walqueue listener on %s: %s; reconnecting", self.schema, said)
                if connection is not None:
                    with contextlib.suppress(psycopg.Error):
                        connection.close()
                connection = None
                self._stop.wait(RECONNECT_SECONDS)
        if connection is not None:
            with contextlib.suppress(psycopg.Error):
                connection.close()

    def _reap(self, connection: psycopg.Connection) -> None:
        with self._lock:
            queues = [queue for queue, state in self._queues.items() if state.reaping > 0]
        for queue in queues:
            connection.execute(self.statements.reap, (queue,))

    def _unregister_idle(self, connection: psycopg.Connection, now: float) -> None:
        with self._lock:
            for queue, state in self._queues.items():
                if state.registered and not state.waiters and now - state.idle_since > LINGER_SECONDS:
                    # Under the lock, so a waiter arriving now registers again after this.
                    connection.execute(self.statements.unregister, (queue, self.pid))
                    state.registered = False


_services: dict[tuple[str, str, bool], Service] = {}
_users: dict[tuple[str, str, bool], int] = {}
_services_lock = threading.Lock()


def acquire(dsn: str, schema: str, *, listen: bool = True) -> Service:
    """The process's Service for (dsn, schema), started on first use; `release` it when done."""
    key = (dsn, schema, listen)
    with _services_lock:
        found = _services.get(key)
        if found is None or not found._thread.is_alive():
            found = _services[key] = Service(dsn, schema, listen=listen)
            _users[key] = 0
        _users[key] += 1
        return found


def release(found: Service) -> None:
    """One user fewer; the last one stops the thread and closes its connection."""
    key = (found.dsn, found.schema, not found.requested_polling)
    with _services_lock:
        if _services.get(key) is not found:
            found.close()
            return
        _users[key] -= 1
        if _users[key] > 0:
            return
        del _services[key], _users[key]
    found.close()
