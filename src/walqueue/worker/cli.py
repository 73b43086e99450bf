"""``walqueue-worker``: a Worker process for a handler named on the command line.

Imports ``module:function`` (from the current directory first, then
``sys.path``), opens a client for TARGET (a walqueued socket or queue
directory, or a ``postgresql://`` DSN), checks the service answers, and runs
``walqueue.worker.Worker`` (threads), or ``walqueue.worker.aio.Worker`` when the
handler is an ``async def``, until SIGTERM/SIGINT or ``--max-tasks``. All
decisions are the Worker's (``walqueue.worker.policy``); this module only
parses options, loads the handler, handles signals and maps outcomes to
exit codes. Logs go to stderr, one line per task outcome.
"""

from __future__ import annotations

import asyncio
import importlib
import inspect
import logging
import os
import signal
import socket
import sys
from collections.abc import Callable
from typing import Any

import click

import walqueue
from walqueue import display, paths
from walqueue.backend import is_postgres_target
from walqueue.dsn import redacted
from walqueue.errors import InvalidRequest, Unavailable, WalQueueError

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3

log = logging.getLogger("walqueue.worker")


class Unreachable(click.ClickException):
    """Nothing answered at TARGET when the worker started."""

    exit_code = EXIT_UNAVAILABLE

    def __init__(self, target: str, error: BaseException) -> None:
        super().__init__(f"cannot reach {shown(target)}: {redacted(str(error), target)}")


class Refused(click.ClickException):
    """The service answered at start and refused the worker (e.g. no such database): one
    line, at once; retrying would not help."""

    exit_code = EXIT_UNAVAILABLE

    def __init__(self, target: str, error: BaseException) -> None:
        super().__init__(f"{shown(target)} refused the worker: {redacted(str(error), target)}")


def shown(target: str) -> str:
    """TARGET as the log and messages show it: without a DSN's password (SPEC §8b), escaped."""
    return display.name(redacted(target))

EPILOG = """\b
Exit codes:
  0  stopped by SIGTERM or SIGINT (tasks in hand finished, or released at
     --stop-timeout), or --max-tasks tasks handled
  1  failure: the Worker ended on an error it does not retry (logged)
  2  usage: a bad option, or a handler that cannot be imported or called
  3  the service (walqueued, PostgreSQL) could not be reached at start, or
     refused the worker (no such database, a refused login: at once)
A handler's sys.exit(N) is never the worker's exit code: it fails the task.

\b
Examples:
  walqueue-worker """ + paths.template_socket("orders") + """ myapp.tasks:send_email --concurrency 4
  walqueue-worker var/walqueue jobs:handle --max-tasks 100
  walqueue-worker postgresql://worker@db/app jobs:handle --queue orders

\b
Give a PostgreSQL password in ~/.pgpass, PGPASSFILE or PGPASSWORD, not in
TARGET: other users of the host can read a command line. Where TARGET holds
one anyway, the worker shows it as ***.
"""


class HandlerParameter(click.ParamType):
    """``module:function``, imported; a usage error (exit 2) says why it could not be."""

    name = "MODULE:FUNCTION"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Callable:
        if callable(value):
            return value
        module_name, _, attribute = str(value).partition(":")
        if not module_name or not attribute:
            self.fail(f"{value!r} is not MODULE:FUNCTION (e.g. myapp.tasks:send_email)", param, ctx)
        if os.getcwd() not in sys.path:
            sys.path.insert(0, os.getcwd())  # like `python -m`: handlers next to where the worker runs
        try:
            target: Any = importlib.import_module(module_name)
        except Exception as exc:  # anything the module raises while importing is the handler's fault
            self.fail(f"cannot import {module_name}: {type(exc).__name__}: {exc}", param, ctx)
        for part in attribute.split("."):
            try:
                target = getattr(target, part)
            except AttributeError:
                self.fail(f"{module_name} has no attribute {attribute!r}", param, ctx)
        if not callable(target):
            self.fail(f"{value} is a {type(target).__name__}, not a function", param, ctx)
        return target


def is_async(handler: Callable) -> bool:
    """An ``async def`` function, or an object whose ``__call__`` is one."""
    call = type(handler).__call__ if not inspect.isroutine(handler) else None
    return inspect.iscoroutinefunction(handler) or (call is not None and inspect.iscoroutinefunction(call))


def open_client(target: str, *, name: str, queue: str | None, asynchronous: bool) -> Any:
    """The client for TARGET: the asyncio one for an async handler."""
    if is_postgres_target(target):   # SPEC §9's one rule: a URL or a key=value DSN
        options = {} if queue is None else {"queue": queue}
        if not asynchronous:
            return walqueue.connect(target, **options)
        from walqueue.pg import AsyncClient

        return AsyncClient(target, **options)
    if queue is not None:
        raise click.UsageError("--queue names a queue in PostgreSQL; a walqueued socket serves one queue")
    if asynchronous:
        from walqueue.client.aio import Client

        return Client(target, name=name)
    return walqueue.connect(target, name=name)


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target")
@click.argument("handler", type=HandlerParameter())
@click.option("--concurrency", type=click.IntRange(min=1), default=1, show_default=True,
              help="Tasks in hand at once: threads, or asyncio tasks for an async handler.")
@click.option("--lease-seconds", type=click.IntRange(min=1), default=30, show_default=True,
              help="Length of each lease; it is touched every third of it while the handler runs.")
@click.option("--max-tasks", type=click.IntRange(min=0), default=None,
              help="Exit 0 after this many tasks (default: until stopped).")
@click.option("--wait", "wait_seconds", type=click.FloatRange(min=0, max=300), default=5, show_default=True,
              help="Seconds one reserve waits in the service for a task; an idle worker notices a stop "
                   "within this. Keep it below --stop-timeout.")
@click.option("--name", default=None, help="Worker name recorded in each lease (default: HOST-PID).")
@click.option("--stop-timeout", "stop_timeout_seconds", type=click.FloatRange(min=0), default=30,
              show_default=True,
              help="After SIGTERM/SIGINT, seconds the tasks in hand get to finish; then their leases are "
                   "released (due again at once) and the worker exits.")
@click.option("--queue", default=None, help="The queue's name, for a PostgreSQL TARGET (default: default).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True, help="Log level on stderr; info logs one line per task outcome.")
@click.version_option(walqueue.__version__, "--version", prog_name="walqueue-worker",
                      message="%(prog)s %(version)s", help="Print the version and exit.")
def main(target: str, handler: Callable, concurrency: int, lease_seconds: int, max_tasks: int | None,
         wait_seconds: float, name: str | None, stop_timeout_seconds: float, queue: str | None,
         log_level: str) -> None:
    """Run HANDLER on the tasks of the queue at TARGET.

    TARGET is a walqueued socket, a queue directory (meaning its
    walqueued.sock), or a postgresql:// DSN. HANDLER is MODULE:FUNCTION,
    imported from the current directory or sys.path; it is called with
    each task's Lease (lease.task_id, lease.payload, ...) and must be
    idempotent: delivery is at-least-once. An `async def` handler runs on
    the asyncio Worker.

    A handler that returns acks the task; one that raises (SystemExit from
    sys.exit() too) releases it with a delay of 1, 2, 4, ... seconds (capped
    at 300) until it runs out of attempts and is dead; the worker goes on. SIGTERM or SIGINT stops reserving; the tasks in
    hand finish, or are released at --stop-timeout. A second SIGTERM or SIGINT
    (Ctrl-C twice) releases them at once and exits.
    """
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s walqueue-worker[%(process)d] %(levelname)s %(message)s")
    name = name or f"{socket.gethostname()}-{os.getpid()}"
    asynchronous = is_async(handler)
    try:
        client = open_client(target, name=name, queue=queue, asynchronous=asynchronous)
    except Unavailable as exc:
        raise Unreachable(target, exc) from exc
    except InvalidRequest as exc:  # a DSN libpq cannot parse, a bad --queue name
        raise click.UsageError(redacted(str(exc), target)) from None
    except WalQueueError as exc:  # PostgreSQL refused it (walqueue.pg.DatabaseRefused), a schema
        raise Refused(target, exc) from None
    options = {"lease_seconds": lease_seconds, "wait": wait_seconds, "concurrency": concurrency,
               "stop_timeout_seconds": stop_timeout_seconds}
    runner = run_async if asynchronous else run_threads
    sys.exit(runner(client, name, handler, options, target=target, max_tasks=max_tasks))


def _started(target: str, name: str, handler: Callable, options: dict) -> None:
    log.info("worker %s: serving %s with %s (%s), concurrency %d", display.name(name), shown(target),
             display.name(getattr(handler, "__qualname__", repr(handler))),
             "asyncio" if is_async(handler) else "threads", options["concurrency"])


class _Stopping:
    """The SIGTERM/SIGINT handler: the first stops taking tasks; a second one (Ctrl-C twice)
    forces the exit."""

    def __init__(self, worker: Any) -> None:
        self.worker = worker
        self.signals = 0

    def __call__(self, signal_number: int) -> None:
        # Counted before anything else: a second signal can run this handler again while the
        # first is still logging, before worker.stop() has made worker.stopping true.
        self.signals += 1
        name = signal.Signals(signal_number).name
        if self.signals > 1 or self.worker.stopping:
            log.warning("%s again: forcing the stop; releasing the leases in hand now (their "
                        "handlers are not waited for)", name)
            self.worker.stop(force=True)
            return
        log.info("%s: taking no new task; the tasks in hand get %g s to finish (send it again, "
                 "or Ctrl-C again, to release them now)", name, self.worker.stop_timeout_seconds)
        self.worker.stop()


def _ended(worker: Any, handled: int | None, error: BaseException | None, target: str) -> int:
    if error is not None:
        log.error("worker %s stopped on an error: %s: %s", display.name(worker.worker), type(error).__name__,
                  redacted(str(error), target), exc_info=error)
        return EXIT_FAILURE
    log.info("worker %s stopped: %d task(s) taken, %d done, %d failed", display.name(worker.worker), handled,
             worker.processed, worker.failed)
    return EXIT_OK


def run_threads(client: Any, name: str, handler: Callable, options: dict, *, target: str,
                max_tasks: int | None) -> int:
    from walqueue.worker import Worker

    try:
        client.stats()  # fail fast (exit 3) if nothing answers at TARGET
    except Unavailable as exc:
        client.close()
        raise Unreachable(target, exc) from exc
    worker = Worker(client, name, handler, **options)
    # Worker.run() waits in timed joins, so stop() runs in the handler soon whichever thread got the signal.
    stopping = _Stopping(worker)
    for number in (signal.SIGTERM, signal.SIGINT):
        signal.signal(number, lambda signal_number, frame: stopping(signal_number))
    _started(target, name, handler, options)
    try:
        handled = worker.run(max_tasks=max_tasks)
    except Exception as exc:
        return _ended(worker, None, exc, target)
    finally:
        client.close()
    return _ended(worker, handled, None, target)


def run_async(client: Any, name: str, handler: Callable, options: dict, *, target: str,
              max_tasks: int | None) -> int:
    from walqueue.worker.aio import Worker

    async def serve() -> int:
        try:
            try:
                await client.stats()
            except Unavailable as exc:
                raise Unreachable(target, exc) from exc
            worker = Worker(client, name, handler, **options)
            loop = asyncio.get_running_loop()
            stopping = _Stopping(worker)
            for number in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(number, stopping, number)
            _started(target, name, handler, options)
            try:
                handled = await worker.run(max_tasks=max_tasks)
            except Exception as exc:
                return _ended(worker, None, exc, target)
            return _ended(worker, handled, None, target)
        finally:
            await client.close()

    return asyncio.run(serve())


if __name__ == "__main__":
    main()
