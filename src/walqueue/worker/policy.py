"""The Worker's policy, written once for the thread Worker and the asyncio Worker.

``Policy`` decides everything a Worker does; ``walqueue.worker.Worker``
(threads) and ``walqueue.worker.aio.Worker`` (asyncio tasks) subclass it and
only add ``run()``, which starts the policy's loops and waits for them.

How one policy serves both: every loop here is a generator that yields
*steps*, zero-argument callables (a client call, the handler, a wait on the
clock), and receives each step's result, or has its exception thrown in at
the ``yield``. ``drive`` runs a generator in a thread by calling each step;
``drive_async`` runs it in a task and awaits any step that returns an
awaitable. So the policy does no I/O of its own, reads time only through
the clock it is given, and starts nothing.

What a Worker does
------------------
``concurrency`` slots each run this loop (``slot()``):

1. Reserve a task, waiting up to ``wait`` seconds in the service. Only one
   slot of a Worker reserves at a time (it holds the *turn*): it asks for
   one task for itself and one for each slot waiting for the turn, and hands
   those over. So N idle slots cost one waiting reserve, not N (walqueued
   parks at most 64 per connection), and N free slots fill in one round trip.
2. Hold the lease for the toucher and call ``handler(lease)``.
3. On return, ack. When the slot will take another task it acks with
   ``ack_and_reserve`` (the ack and the next reservation share one round
   trip, and one fsync in walqueued); if it can take the turn, that reserve
   may wait and fetch for the waiting slots too, else it asks for one task
   without waiting. On an exception, release the task with ``backoff(attempts)``
   seconds of delay, then look the task up to log whether it is due again or
   dead (the lease does not carry ``max_attempts``). "An exception" is what
   ``HANDLER_FAILURES`` names: any ``Exception``, and ``SystemExit`` too, so
   a handler's ``sys.exit(3)`` fails its task rather than ending the Worker
   (and walqueue-worker with 3, its "unreachable" code). The thread Worker
   adds ``KeyboardInterrupt`` (see ``walqueue.worker.Worker``); the asyncio
   Worker lets it end ``run()``, as a Ctrl-C. ``CancelledError`` and
   ``GeneratorExit`` are never a failure.
4. An ack or release whose answer was lost (``Unavailable``, or
   ``QueueClosed`` from the service) is sent again, up to ``FINISH_ATTEMPTS``
   attempts ``RECONNECT_PAUSE_SECONDS`` apart. A ``StaleLease`` answering such
   a retry says whether the lost attempt took effect: after an ack, status
   ``completed`` at the lease's own generation; after a release, ``ready`` or
   ``dead`` at it (the lease has ended; a release and an expiry look alike
   and leave nothing to do). Any other ``StaleLease`` means the lease was
   lost: the task will run again (delivery is at-least-once).

One toucher (``touching()``) extends every held lease every
``max(1, lease_seconds / 3)`` seconds; a ``StaleLease`` ends touching that
lease, a lost answer is tried again at the next interval. A lease is taken
from the toucher before it is acked or released, waiting for a touch in
flight, so no touch races the ack.

``stop()`` makes the slots take no new task: a slot waiting in the service
returns within ``wait`` seconds, the others at once, each after the task in
hand. With ``stop_timeout_seconds``, ``supervise()`` releases the leases
still held that long after ``stop()`` (their handlers cannot be interrupted
in a thread; the asyncio Worker cancels them) and lets ``run()`` return; a
handler that returns later finds its lease released and finishes nothing.

Log lines (logger ``walqueue.worker``): one per task outcome, naming the
task id (escaped by ``walqueue.display.name``), its generation and
attempt; a handler's exception is logged with its traceback (its message
escaped by ``walqueue.display.text``, so the outcome stays one line). A
program that configured no logging gets them on stderr (``log_by_default``).

What a backend must provide (``client``)
----------------------------------------
Any object with SPEC §8/§9's methods, as plain methods for the thread
Worker and as coroutine functions (or methods returning awaitables) for the
asyncio Worker: ``reserve(worker, *, lease_seconds, limit, wait)``,
``ack(lease)``, ``ack_and_reserve(lease, *, lease_seconds, limit, wait)``,
``release(lease, *, delay)``, ``touch(lease, *, lease_seconds)`` and
``get(task_id)``. They return the library's ``Lease``/``TaskView`` values and
raise ``StaleLease`` with ``task_id``, ``status`` and ``generation`` for a
lease that is not current, ``walqueue.errors.Unavailable`` (or a subclass:
``DaemonUnavailable``, ``DatabaseUnavailable``) when the service cannot be
reached and the outcome is unknown, and optionally ``QueueClosed`` for a
failed write the service recovered from. An optional ``closed`` attribute,
true once the client was closed, ends the loops instead of retrying. With
``concurrency > 1`` the thread Worker calls the client from several threads
at once, and a waiting ``reserve`` must not hold up the other threads'
calls (``walqueue.client.Client`` keeps a connection per thread).

What a clock must provide (``clock``)
-------------------------------------
``now()``: seconds, monotonic. ``event()``: a new event (``set``,
``clear``, ``is_set``) that ``wait`` can wait on. ``wait(event, seconds)``:
True once ``event`` is set, False after ``seconds`` of this clock (``None``:
no limit); for the asyncio Worker a coroutine. ``walqueue.worker.clock`` has
the real ones; tests pass clocks that move only when told.
"""

from __future__ import annotations

import functools
import inspect
import logging
import math
import os
import threading
from collections.abc import Callable, Generator
from dataclasses import dataclass
from typing import Any

from walqueue import display
from walqueue.errors import InvalidRequest, QueueClosed, StaleLease, Unavailable
from walqueue.outage import Outage
from walqueue.values import Lease, TaskView

log = logging.getLogger("walqueue.worker")
DEFAULT_LOG_FORMAT = "%(asctime)s walqueue.worker %(levelname)s %(message)s"


class DefaultLogHandler(logging.StreamHandler):
    """The Worker's own stderr handler, for a program that configured no logging.

    It steps aside for good once the program configures logging after all
    (the root logger has a handler): from then on the lines go there, once.
    """

    def emit(self, record: logging.LogRecord) -> None:
        if logging.getLogger().handlers:
            log.removeHandler(self)
            if log.level == logging.INFO:
                log.setLevel(logging.NOTSET)  # the level this handler set, back to the program's
            return  # propagated to the root's handlers, which log it
        super().emit(record)


def log_by_default() -> None:
    """Log the Worker's task lines on stderr where nothing else would (as `rq worker` does).

    Without a handler anywhere, Python shows only warnings (its last-resort
    handler), so a plain script saw no "done" line for its tasks. Only when
    neither the root logger nor walqueue.worker has a handler: a program that
    configured logging keeps exactly what it configured, and nothing is
    logged twice.
    """
    if logging.getLogger().handlers or log.handlers:
        return
    handler = DefaultLogHandler()
    handler.setFormatter(logging.Formatter(DEFAULT_LOG_FORMAT))
    log.addHandler(handler)
    if log.level == logging.NOTSET:
        log.setLevel(logging.INFO)

MAX_BACKOFF_SECONDS = 300
RECONNECT_PAUSE_SECONDS = 1.0
FINISH_ATTEMPTS = 3
MIN_TOUCH_INTERVAL_SECONDS = 1.0
MAX_RESERVE_LIMIT = 1000  # SPEC §1's bound on limit

# What a StaleLease answering a retried operation shows when the lost
# attempt took effect (at the lease's own generation).
ENDED_BY = {"ack": frozenset({"completed"}), "release": frozenset({"ready", "dead"})}
# Failures a retry may cure: the service unreachable, or a write it failed and recovered from.
LOST_ANSWER = (Unavailable, QueueClosed)

Step = Callable[[], Any]
Steps = Generator[Step, Any, Any]

# What a handler may raise and fail only its task (the thread Worker adds KeyboardInterrupt).
HANDLER_FAILURES: tuple[type[BaseException], ...] = (Exception, SystemExit)


def exponential_backoff(attempts: int) -> int:
    """Seconds before a failed task is due again: 1, 2, 4, ... capped at 300."""
    return min(MAX_BACKOFF_SECONDS, 2 ** max(0, attempts - 1))


def drive(steps: Steps) -> Any:
    """Run a policy generator in this thread: call each step, send back its result or throw in its error."""
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        value, error = None, None
        try:
            value = step()
        except BaseException as exc:  # thrown into the policy, which decides; it re-raises the rest
            error = exc


async def drive_async(steps: Steps) -> Any:
    """Run a policy generator in this task: like ``drive``, awaiting steps that return awaitables.

    ``drive``'s twin, line for line but for the await: these ten lines are all
    that the two Workers' decisions do not share.
    """
    value: Any = None
    error: BaseException | None = None
    while True:
        try:
            step = steps.send(value) if error is None else steps.throw(error)
        except StopIteration as done:
            return done.value
        value, error = None, None
        try:
            value = step()
            if inspect.isawaitable(value):
                value = await value
        except BaseException as exc:  # CancelledError too: the policy unwinds and re-raises it
            error = exc


@dataclass(eq=False)
class _Held:
    """A lease in hand: the toucher's schedule for it, and whether the stop deadline took it."""

    lease: Lease
    touch_at: float
    touch_done: Any  # a clock event, set while no touch of this lease is in flight
    touching: bool = False
    abandoned: bool = False


def _describe_stale(error: StaleLease) -> str:
    if error.status is None:
        return "the service knows no such task"
    return f"the task is {error.status} at generation {error.generation}"


class Policy:
    """The decisions of a Worker; see the module docstring.

    ``client`` is a client object (the backend contract above) or a
    socket/directory path, for which the subclass makes a walqueue.client
    client named after the worker. ``lease_seconds`` of each lease, ``wait``
    in one reserve, ``backoff(attempts)`` seconds before a failed task is due
    again, ``touch`` to extend leases while handlers run, ``concurrency``
    tasks in hand at once, ``stop_timeout_seconds`` after ``stop()`` before
    the leases still held are released, and the ``clock`` to wait on (the
    subclass's real one by default). Raises InvalidRequest for a bad option.

    Subclasses add ``run()`` and define ``_client_for_path`` and
    ``_default_clock``, and may refuse handlers in ``_check_handler`` or
    widen ``handler_failures``.
    """

    handler_failures: tuple[type[BaseException], ...] = HANDLER_FAILURES

    def __init__(
        self,
        client: Any,
        worker: str,
        handler: Callable[[Lease], Any],
        *,
        lease_seconds: int = 30,
        wait: float = 30,
        backoff: Callable[[int], int] = exponential_backoff,
        touch: bool = True,
        concurrency: int = 1,
        stop_timeout_seconds: float | None = None,
        clock: Any = None,
    ) -> None:
        _check_count("lease_seconds", lease_seconds, minimum=1)
        _check_count("concurrency", concurrency, minimum=1)
        _check_seconds("wait", wait)
        if stop_timeout_seconds is not None:
            _check_seconds("stop_timeout_seconds", stop_timeout_seconds)
        if not isinstance(worker, str) or not worker:
            raise InvalidRequest(f"worker must be a non-empty str, got {worker!r}")
        if not callable(handler):
            raise InvalidRequest(f"handler must be callable, got {type(handler).__name__}")
        self._check_handler(handler)
        if isinstance(client, str | os.PathLike):
            client = self._client_for_path(client, worker)
        clock = clock or self._default_clock()
        self.client = client
        self.worker = worker
        self.handler = handler
        self.lease_seconds = lease_seconds
        self.wait = wait
        self.backoff = backoff
        self.touch = touch
        self.concurrency = concurrency
        self.stop_timeout_seconds = stop_timeout_seconds
        self.clock = clock
        self.processed = 0  # handled and acked, over the Worker's life
        self.failed = 0  # the handler raised
        self.touch_interval_seconds = max(MIN_TOUCH_INTERVAL_SECONDS, lease_seconds / 3)
        # Held only between steps, never across one, so a plain lock serves threads and tasks alike.
        self._state = threading.Lock()
        # A service that keeps failing is logged once when it starts and once when it heals.
        self._outages = {"reserve": Outage(), "touch": Outage()}
        self._stopping = False
        self._forced = False  # stop(force=True): the tasks in hand are given up now
        self._stopped_at: float | None = None
        self._stop_event = clock.event()  # cuts pauses short
        self._turn_taken = False
        self._turn_waiters = 0  # slots waiting for the turn, for whom its holder reserves too
        self._turn_free = clock.event()  # set when the turn is given back or leases are handed over, and by stop()
        self._spare: list[Lease] = []  # leases reserved by the turn's holder for the waiting slots
        self._settled = clock.event()  # set when a slot ends, and by stop()
        self._touch_changed = clock.event()  # set when a lease is held, and to end touching
        self._touching_ended = False
        self._held: dict[tuple[str, int], _Held] = {}
        self._running = 0
        self._taken = 0  # tasks taken this run (run()'s return value)
        self._max_tasks: int | None = None

    def _check_handler(self, handler: Callable) -> None:
        """Raise InvalidRequest for a handler this kind of Worker cannot run."""

    def _client_for_path(self, path: str | os.PathLike, worker: str) -> Any:
        raise NotImplementedError

    def _default_clock(self) -> Any:
        raise NotImplementedError

    # -- control ------------------------------------------------------------------

    @property
    def stopping(self) -> bool:
        """True once ``stop()`` was called."""
        return self._stopping

    def stop(self, *, force: bool = False) -> None:
        """Take no new task; ``run()`` returns after the tasks in hand (see ``stop_timeout_seconds``).

        With ``force`` (a second Ctrl-C, as Celery's cold shutdown), the
        stop deadline is now: the leases in hand are released at once, as at
        ``stop_timeout_seconds``, and ``run()`` returns without waiting for
        their handlers. The thread Worker's ``stop()`` may be called from any
        thread or a signal handler; the asyncio Worker's from its event loop.
        """
        if self._stopped_at is None:
            self._stopped_at = self.clock.now()
        self._stopping = True
        self._forced = self._forced or force
        for event in (self._stop_event, self._turn_free, self._settled):
            event.set()

    def _begin(self, max_tasks: int | None) -> None:
        """Ready the counters of one run(); the shell starts the loops after this."""
        if max_tasks is not None:
            _check_count("max_tasks", max_tasks, minimum=0)
        log_by_default()
        with self._state:
            self._max_tasks = max_tasks
            self._taken = 0
            self._running = self.concurrency
            self._touching_ended = False

    def _end_touching(self) -> None:
        self._touching_ended = True
        self._touch_changed.set()

    def _client_closed(self) -> bool:
        return bool(getattr(self.client, "closed", False))

    def _pause(self, seconds: float) -> Step:
        """A step that waits ``seconds`` unless stop() comes first."""
        return functools.partial(self.clock.wait, self._stop_event, seconds)

    # -- a slot -------------------------------------------------------------------

    def slot(self) -> Steps:
        """One task at a time until stopped, or until the run has taken ``max_tasks``."""
        try:
            leases: list[Lease] = []
            while True:
                if not leases:
                    if not self._take_ticket():
                        return
                    leases = yield from self._reserve()
                    if not leases:
                        self._return_ticket()
                        continue
                leases = yield from self._process(leases[0])
        finally:
            with self._state:
                self._running -= 1
            self._settled.set()

    def _take_ticket(self) -> bool:
        """Count one more task for this run, unless stopping or ``max_tasks`` are taken."""
        with self._state:
            if self._stopping or (self._max_tasks is not None and self._taken >= self._max_tasks):
                return False
            self._taken += 1
            return True

    def _return_ticket(self) -> None:
        with self._state:
            self._taken -= 1

    def _wait_for_turn(self) -> Generator[Step, Any, list[Lease] | None]:
        """Take the turn (None), or a lease the turn's holder reserved for this slot ([lease]).

        [] if stop() came first.
        """
        waiting = False
        try:
            while True:
                with self._state:
                    if self._spare or self._stopping or not self._turn_taken:
                        # Leave and stop being counted in one step: a holder counting
                        # the waiters right after must not reserve for this slot.
                        if waiting:
                            self._turn_waiters -= 1
                            waiting = False
                        if self._spare:
                            return [self._spare.pop(0)]
                        if self._stopping:
                            return []
                        self._turn_taken = True
                        return None
                    if not waiting:
                        self._turn_waiters += 1
                        waiting = True
                    self._turn_free.clear()
                if self._stopping:  # stop() takes no lock: it may have set the event just before the clear
                    return []
                yield functools.partial(self.clock.wait, self._turn_free, None)
        finally:
            if waiting:  # left by stop() or an exception
                with self._state:
                    self._turn_waiters -= 1

    def _try_take_turn(self) -> bool:
        with self._state:
            if self._turn_taken or self._stopping:
                return False
            self._turn_taken = True
            return True

    def _give_turn(self) -> None:
        with self._state:
            self._turn_taken = False
        self._turn_free.set()

    def _reserve_limit(self) -> int:
        """One lease for the turn's holder and one for each slot waiting for the turn."""
        with self._state:
            return min(MAX_RESERVE_LIMIT, 1 + self._turn_waiters)

    def _keep_one(self, leases: list[Lease]) -> list[Lease]:
        """The first lease for this slot; the others go to the slots waiting for the turn."""
        if len(leases) > 1:
            with self._state:
                self._spare.extend(leases[1:])
            self._turn_free.set()
        return leases[:1]

    def _reserve(self) -> Generator[Step, Any, list[Lease]]:
        handed = yield from self._wait_for_turn()
        if handed is not None:
            return handed
        try:
            leases = yield functools.partial(self.client.reserve, self.worker, lease_seconds=self.lease_seconds,
                                             limit=self._reserve_limit(), wait=self.wait)
            self._service_worked("reserve")
            return self._keep_one(leases)
        except LOST_ANSWER as exc:
            if self._client_closed():
                raise
            self._service_failed("reserve", f"trying again every {RECONNECT_PAUSE_SECONDS:g} s", exc)
            yield self._pause(RECONNECT_PAUSE_SECONDS)
            return []
        finally:
            self._give_turn()

    def _process(self, lease: Lease) -> Generator[Step, Any, list[Lease]]:
        """Run the handler on ``lease`` and finish it; returns the next leases if it reserved them."""
        held = self._hold(lease)
        started = self.clock.now()
        try:
            outcome = yield functools.partial(self.handler, lease)
            if inspect.isawaitable(outcome):  # only the thread Worker sees one: it cannot await it
                _discard(outcome)
                raise TypeError("the handler returned an awaitable; run async handlers on walqueue.aio.Worker")
        except self.handler_failures as failure:
            if (yield from self._let_go(held)):
                yield from self._failed(lease, failure)
            return []
        if not (yield from self._let_go(held)):
            return []
        return (yield from self._succeeded(lease, self.clock.now() - started))

    def _succeeded(self, lease: Lease, seconds: float) -> Generator[Step, Any, list[Lease]]:
        with self._state:
            self.processed += 1
        if not self._take_ticket():
            error = yield from self._finish(lease, "ack")
            _log_acked(lease, seconds, error)
            return []
        took_turn = self._try_take_turn()
        try:
            leases = yield functools.partial(self.client.ack_and_reserve, lease, lease_seconds=self.lease_seconds,
                                             limit=self._reserve_limit() if took_turn else 1,
                                             wait=self.wait if took_turn else 0)
            leases = self._keep_one(leases)
        except StaleLease as lost:
            self._return_ticket()
            _log_acked(lease, seconds, lost)
            return []
        except LOST_ANSWER:
            self._return_ticket()
            # The ack may or may not have been applied: send it alone, as a retry.
            error = yield from self._finish(lease, "ack", retry=True)
            _log_acked(lease, seconds, error)
            return []
        finally:
            if took_turn:
                self._give_turn()
        if not leases:
            self._return_ticket()
        _log_acked(lease, seconds, None)
        return leases

    def _failed(self, lease: Lease, failure: BaseException) -> Steps:
        with self._state:
            self.failed += 1
        delay = self.backoff(lease.attempts)
        error = yield from self._finish(lease, "release", delay=delay)
        if error is None:
            outcome = _after_release(lease, (yield from self._look_up(lease)), delay)
        elif isinstance(error, StaleLease):
            outcome = f"the lease was lost before the release ({_describe_stale(error)})"
        else:
            outcome = f"not released ({error}): it is due again when its lease expires"
        # sys.exit() is str()'d to "" (no status) or the status itself: show the status, None included.
        message = str(failure.code) if isinstance(failure, SystemExit) else str(failure)
        log.warning("task %s generation %d attempt %d: the handler raised %s: %s; %s",
                    display.name(lease.task_id), lease.generation, lease.attempts, type(failure).__name__,
                    display.text(message), outcome, exc_info=failure)

    def _look_up(self, lease: Lease) -> Generator[Step, Any, TaskView | None]:
        try:
            return (yield functools.partial(self.client.get, lease.task_id))
        except LOST_ANSWER:
            return None

    def _finish(self, lease: Lease, operation: str, *, delay: int = 0,
                retry: bool = False) -> Generator[Step, Any, BaseException | None]:
        """Ack or release ``lease``, sending it again after a lost answer.

        Returns None once it took effect, else the error that says why not
        (``StaleLease``: the lease was lost; a lost answer: gave up).
        ``retry`` means an earlier attempt's answer was lost already.
        """
        if operation == "ack":
            step = functools.partial(self.client.ack, lease)
        else:
            step = functools.partial(self.client.release, lease, delay=delay)
        for attempt in range(1 if retry else 0, FINISH_ATTEMPTS):
            try:
                yield step
                return None
            except LOST_ANSWER as exc:
                if attempt == FINISH_ATTEMPTS - 1 or self._client_closed():
                    return exc
                yield self._pause(RECONNECT_PAUSE_SECONDS)
            except StaleLease as exc:
                if attempt > 0 and exc.generation == lease.generation and exc.status in ENDED_BY[operation]:
                    return None  # the lost attempt was applied before its answer was lost
                return exc
        raise AssertionError("unreachable: the last attempt returns")

    # -- leases in hand and the toucher -------------------------------------------

    def _hold(self, lease: Lease) -> _Held:
        held = _Held(lease, self.clock.now() + self.touch_interval_seconds, self.clock.event())
        held.touch_done.set()
        with self._state:
            self._held[lease.task_id, lease.generation] = held
        self._touch_changed.set()
        return held

    def _let_go(self, held: _Held) -> Generator[Step, Any, bool]:
        """Take ``held`` from the toucher (after a touch in flight); False if the stop deadline took it."""
        with self._state:
            self._held.pop((held.lease.task_id, held.lease.generation), None)
            touching = held.touching
        if touching:
            yield functools.partial(self.clock.wait, held.touch_done, None)
        if held.abandoned:
            log.warning("task %s generation %d: the handler returned after the stop deadline; "
                        "its lease was released then", display.name(held.lease.task_id), held.lease.generation)
        return not held.abandoned

    def touching(self) -> Steps:
        """Extend every held lease every ``touch_interval_seconds`` until the run ends."""
        while True:
            with self._state:
                if self._touching_ended:
                    return
                self._touch_changed.clear()
                now = self.clock.now()
                due = [held for held in self._held.values() if held.touch_at <= now]
                for held in due:
                    held.touching = True
                    held.touch_done.clear()
                later = min((held.touch_at for held in self._held.values() if held.touch_at > now), default=None)
            open_client = True
            for held in due:  # every one, so none is left marked as being touched
                open_client = (yield from self._touch(held)) and open_client
            if not open_client:
                return
            if not due:
                yield functools.partial(self.clock.wait, self._touch_changed, None if later is None else later - now)

    def _touch(self, held: _Held) -> Generator[Step, Any, bool]:
        """Touch one held lease; False if the client was closed (touching ends)."""
        lease, touch_at = held.lease, math.inf
        try:
            lease = yield functools.partial(self.client.touch, held.lease, lease_seconds=self.lease_seconds)
            self._service_worked("touch")
            touch_at = self.clock.now() + self.touch_interval_seconds
        except StaleLease as lost:
            log.warning("task %s generation %d: lost the lease while the handler ran (%s); "
                        "it may run again elsewhere", display.name(lease.task_id), lease.generation, _describe_stale(lost))
        except LOST_ANSWER as exc:
            if self._client_closed():
                return False
            log.debug("task %s generation %d: touch failed: %s", display.name(lease.task_id),
                      lease.generation, exc)
            self._service_failed("touch", f"trying each lease again every {self.touch_interval_seconds:g} s", exc)
            touch_at = self.clock.now() + self.touch_interval_seconds
        finally:
            with self._state:
                held.lease, held.touch_at, held.touching = lease, touch_at, False
            held.touch_done.set()
        return True

    def _service_failed(self, what: str, retrying: str, exc: BaseException) -> None:
        """Log a failed `what` (reserve, touch): a warning for the first of an outage, DEBUG after."""
        with self._state:
            first = self._outages[what].failed(self.clock.now())
        if first:
            log.warning("worker %s: %s failed, %s: %s (logged again when it works)",
                        display.name(self.worker), what, retrying, exc)
        else:
            log.debug("worker %s: %s failed again: %s", display.name(self.worker), what, exc)

    def _service_worked(self, what: str) -> None:
        with self._state:
            healed = self._outages[what].healed(self.clock.now())
        if healed is not None:
            log.info("worker %s: %s works again after %d failed attempt(s) over %.0f s",
                     display.name(self.worker), what, healed.failures, healed.seconds)

    # -- the run as a whole -------------------------------------------------------

    def supervise(self) -> Steps:
        """Until every slot has ended (at the stop deadline, releasing the leases still held);
        then release leases reserved for slots that stopped before taking them."""
        yield from self._until_slots_end()
        with self._state:
            spare, self._spare = self._spare, []
        for lease in spare:
            error = yield from self._finish(lease, "release")
            log.info("task %s generation %d: reserved for a slot that stopped first; %s", display.name(lease.task_id),
                     lease.generation, "released" if error is None else f"not released: {error}")

    def _until_slots_end(self) -> Steps:
        while True:
            with self._state:
                if self._running == 0:
                    return
                self._settled.clear()
            if self._forced:
                yield from self._abandon()
                return
            if not self._stopping or self.stop_timeout_seconds is None:
                yield functools.partial(self.clock.wait, self._settled, None)
                continue
            remaining = self._stopped_at + self.stop_timeout_seconds - self.clock.now()
            if remaining <= 0:
                yield from self._abandon()
                return
            yield functools.partial(self.clock.wait, self._settled, remaining)

    def _abandon(self) -> Steps:
        with self._state:
            abandoned = list(self._held.values())
            self._held.clear()
            for held in abandoned:
                held.abandoned = True
        for held in abandoned:
            if not held.touch_done.is_set():
                yield functools.partial(self.clock.wait, held.touch_done, None)
            error = yield from self._finish(held.lease, "release")
            outcome = "released" if error is None else f"not released ({error}): due again when its lease expires"
            when = "at a forced stop" if self._forced else f"{self.stop_timeout_seconds:g} s after stop()"
            log.warning("task %s generation %d: not done %s; %s", display.name(held.lease.task_id),
                        held.lease.generation, when, outcome)


def _log_acked(lease: Lease, seconds: float, error: BaseException | None) -> None:
    shown = display.name(lease.task_id)
    if error is None:
        log.info("task %s generation %d attempt %d: done in %.3f s", shown, lease.generation, lease.attempts, seconds)
    elif isinstance(error, StaleLease):
        log.warning("task %s generation %d attempt %d: handled in %.3f s, but the lease was lost before the "
                    "ack (%s): it may run again", shown, lease.generation, lease.attempts, seconds,
                    _describe_stale(error))
    else:
        log.error("task %s generation %d attempt %d: handled in %.3f s, but the ack was not answered (%s): "
                  "it runs again when its lease expires", shown, lease.generation, lease.attempts, seconds, error)


def _after_release(lease: Lease, view: TaskView | None, delay: int) -> str:
    """What became of a released task, from a look at it afterwards (None: it could not be looked up)."""
    if view is None or view.generation != lease.generation:
        return f"released with a delay of {delay} s"
    if view.status == "dead":
        return f"dead after {view.attempts} of {view.max_attempts} attempts (walqueue-ctl revive brings it back)"
    return f"due again in {delay} s (attempt {view.attempts} of {view.max_attempts})"


def _discard(awaitable: Any) -> None:
    close = getattr(awaitable, "close", None)
    if close is not None:
        close()  # a coroutine never awaited would warn at garbage collection


def _check_count(name: str, value: Any, *, minimum: int) -> None:
    if type(value) is not int or value < minimum:
        raise InvalidRequest(f"{name} must be an int >= {minimum}, got {value!r}")


def _check_seconds(name: str, value: Any) -> None:
    if type(value) is bool or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise InvalidRequest(f"{name} must be a number of seconds >= 0, got {value!r}")
