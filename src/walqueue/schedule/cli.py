"""``walqueue-scheduler TARGET SCHEDULE_FILE``: puts the periodic tasks of a schedule file (SPEC §8b).

Reads and checks the file (a broken one is refused at start, exit 2, the
line named), opens the client for TARGET with `walqueue.connect` (a
walqueued socket or queue directory, or a PostgreSQL URL/DSN, by
walqueue.backend's one rule), checks that it answers (exit 3 if not), and
runs `walqueue.schedule.Scheduler` until SIGTERM or SIGINT (exit 0). All
decisions are the Scheduler's; this module parses options, handles signals
and maps outcomes to exit codes. Logs go to stderr, one line an event.
"""

from __future__ import annotations

import logging
import os
import signal
import sys
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

log = logging.getLogger("walqueue.scheduler")

EPILOG = """\b
Exit codes:
  0  stopped by SIGTERM or SIGINT
  1  failure: an error the scheduler does not retry (logged)
  2  usage: a bad option, a schedule file that cannot be read or is
     broken (the message names its line), or cronsim not installed
  3  the queue (walqueued, PostgreSQL) could not be reached at start, or
     refused the scheduler (no such database, a refused login: at once);
     once running, the scheduler retries with a back-off instead

\b
The schedule file (TOML; docs/scheduler.md):
  [[task]]
  name = "nightly-report"          # task ids nightly-report@2026-12-02T01:30:00Z
  cron = "30 2 * * *"              # or: every = 3600 (seconds, from the epoch)
  timezone = "Europe/Berlin"       # cron only; default UTC
  payload = { kind = "report" }    # default {}
  max_attempts = 3                 # default 3
  catch_up = 1                     # periods put after a stop; default 1

\b
Examples:
  walqueue-scheduler """ + paths.PLAIN_SOCKET + """ /etc/walqueue/schedule.toml
  walqueue-scheduler postgresql://scheduler@db/app schedule.toml --queue orders
  walqueue-ctl --socket """ + paths.PLAIN_SOCKET + """ schedule schedule.toml
"""


class Unreachable(click.ClickException):
    """Nothing answered at TARGET when the scheduler started."""

    exit_code = EXIT_UNAVAILABLE


def target_label(target: str, queue: str | None) -> str:
    """TARGET for the log, without a password (SPEC §8b)."""
    if is_postgres_target(target):
        from walqueue.pg import describe

        return f"PostgreSQL at {describe(target)}, queue {display.name(queue or 'default')}"
    return f"walqueued at {display.name(target)}"


def open_client(target: str, queue: str | None) -> Any:
    """walqueue.connect's client for TARGET, with the options a scheduler wants.

    It does its own retrying (with a back-off it logs), so the clients do
    none; on PostgreSQL it needs no reaper and no LISTEN (it only puts and gets).
    """
    if is_postgres_target(target):
        return walqueue.connect(target, queue=queue or "default", retry_seconds=0, reaper=False,
                                listen=False)
    if queue is not None:
        raise click.UsageError("--queue names a queue on PostgreSQL; a walqueued socket serves one queue")
    return walqueue.connect(target, name="walqueue-scheduler", retry_seconds=0)


def choose_clock() -> Any:
    from walqueue.schedule.clock import TEST_CLOCK_VARIABLE, SystemClock, clock_from_variable

    value = os.environ.get(TEST_CLOCK_VARIABLE)
    if not value:
        return SystemClock()
    try:
        clock = clock_from_variable(value)
    except ValueError as error:
        raise click.UsageError(str(error)) from None
    log.warning("%s is set: a test clock from %d to %d, not the wall clock (for tests only)",
                TEST_CLOCK_VARIABLE, clock.now(), clock.end)
    return clock


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target")
@click.argument("schedule_file", type=click.Path(dir_okay=False))
@click.option("--queue", default=None, help="The queue's name, for a PostgreSQL TARGET (default: default).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True, help="Log level on stderr; info logs one line per put, catch-up, skip "
                                      "and conflict.")
@click.version_option(walqueue.__version__, "--version", prog_name="walqueue-scheduler",
                      message="%(prog)s %(version)s", help="Print the version and exit.")
def main(target: str, schedule_file: str, queue: str | None, log_level: str) -> None:
    """Put the periodic tasks of SCHEDULE_FILE into the queue at TARGET.

    TARGET is a walqueued socket, a queue directory (meaning its
    walqueued.sock), or a PostgreSQL URL or key=value DSN. Each entry's
    period starting at S is put as the task NAME@S (UTC,
    YYYY-MM-DDTHH:MM:SSZ) with that key and available_at S, so any number
    of schedulers on the same queue put each period once. After a stop,
    the last catch_up periods of each entry are put; older ones are logged
    as skipped. A period put before with another payload is a conflict,
    logged and left as it is.
    """
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s walqueue-scheduler[%(process)d] %(levelname)s %(message)s")
    try:
        from walqueue.schedule.entries import ScheduleFileError, load
        from walqueue.schedule.runner import Scheduler
    except ImportError as error:
        raise click.UsageError(str(error)) from None
    clock = choose_clock()
    try:
        entries = load(schedule_file, now=int(clock.now()))
    except ScheduleFileError as error:
        raise click.UsageError(display.text(str(error))) from None
    try:
        client = open_client(target, queue)
    except Unavailable as error:
        raise Unreachable(f"cannot reach {target_label(target, queue)}: {display.text(str(error))}") from error
    except InvalidRequest as error:  # a DSN libpq cannot parse, a bad --queue name
        raise click.UsageError(display.text(redacted(str(error), target))) from None
    except WalQueueError as error:  # PostgreSQL refused it at once (walqueue.pg.DatabaseRefused)
        raise Unreachable(f"{target_label(target, queue)} refused the scheduler: "
                          f"{display.text(str(error))}") from None
    try:
        scheduler = Scheduler(client, entries, clock=clock)
        for number in (signal.SIGTERM, signal.SIGINT):
            signal.signal(number, lambda signal_number, frame: _stopping(scheduler, signal_number))
        try:
            client.stats()  # fail fast (exit 3) if nothing answers at TARGET
        except Unavailable as error:
            raise Unreachable(f"cannot reach {target_label(target, queue)}: "
                              f"{display.text(str(error))}") from error
        log.info("putting %d entr%s of %s into %s", len(entries), "y" if len(entries) == 1 else "ies",
                 display.name(schedule_file), target_label(target, queue))
        for entry in entries:
            log.info("entry %s: %s, catch_up %d", display.name(entry.name), display.name(entry.describe()),
                     entry.catch_up)
        try:
            scheduler.run()
        except WalQueueError as error:
            log.error("stopped on an error: %s: %s", type(error).__name__, display.text(str(error)))
            sys.exit(EXIT_FAILURE)
        counts = scheduler.counts
        log.info("stopped: %d put, %d caught up, %d already put, %d skipped, %d conflict(s)",
                 counts["put"], counts["caught_up"], counts["already_put"], counts["skipped"],
                 counts["conflicts"])
    finally:
        client.close()
    sys.exit(EXIT_OK)


def _stopping(scheduler: Any, signal_number: int) -> None:
    log.info("%s: stopping after the call in flight", signal.Signals(signal_number).name)
    scheduler.stop()


if __name__ == "__main__":
    main()
