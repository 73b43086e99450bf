"""walqueue-ctl's lease commands: reserve, then ack, release or touch a lease (one
TASK_ID, or `-` for the lease JSON lines reserve prints), and force-release for
an operator who must end leases that are not theirs."""

from __future__ import annotations

import dataclasses
import sys
from collections.abc import Callable, Iterator

import click

from walqueue import display
from walqueue.backend import DAEMON_STATS, FORCE_RELEASE, PAUSE
from walqueue.ctl.backends import Ctl
from walqueue.ctl.errors import (
    DAEMON_CODES,
    EXIT_FAILURE,
    EXIT_NOT_FOUND,
    EXIT_PAUSED,
    EXIT_STALE_LEASE,
    EXIT_UNAVAILABLE,
    EXIT_USAGE,
    CtlError,
    error_object,
    not_found,
)
from walqueue.ctl.group import JSON_ALREADY, command, json_option, pass_ctl
from walqueue.ctl.output import emit, parse_json_object, table


@command(*DAEMON_CODES, EXIT_PAUSED, short_help='Lease due tasks for WORKER.')
@click.argument("worker")
@click.option("--lease-seconds", type=click.IntRange(min=1), default=30, show_default=True,
              help="Lease length. The daemon's clock is whole seconds, so a lease of L seconds "
                   "lasts between L-1 and L seconds of wall time.")
@click.option("--limit", type=click.IntRange(1, 1000), default=1, show_default=True,
              help="At most this many tasks in one lease batch.")
@click.option("--wait", type=click.FloatRange(0, 300), default=0, show_default=True,
              help="Seconds to wait for a task to become due.")
@json_option(JSON_ALREADY)
@pass_ctl
def reserve(ctl: Ctl, worker: str, lease_seconds: int, limit: int, wait: float, as_json: bool) -> None:
    """Lease up to --limit due tasks for WORKER; prints one lease JSON per line.

    Prints nothing (exit 0) when no task was due within --wait seconds.
    While the daemon is paused it leases nothing: reserve says so on stderr
    and exits 12. Tasks are leased in (available_at, task_id) order; `next`
    shows that order without leasing.
    """
    leases = ctl.client.reserve(worker, lease_seconds=lease_seconds, limit=limit, wait=wait)
    for lease in leases:
        emit(lease)
    if not leases and paused(ctl):
        raise CtlError("walqueued is paused, so this reserve leased nothing (tasks that are due "
                       "stay ready); walqueue-ctl resume hands them out again", EXIT_PAUSED,
                       "Paused")


def paused(ctl: Ctl) -> bool:
    """Whether the daemon is paused: asked only after a reserve that leased nothing, so
    the common answer costs no extra round trip (a backend without pause never is)."""
    if PAUSE not in ctl.capabilities or DAEMON_STATS not in ctl.capabilities:
        return False
    return ctl.client.daemon_stats().paused


@dataclasses.dataclass(frozen=True)
class LeaseRef:
    """What ack/release/touch need of a lease."""

    task_id: str
    worker: str
    generation: int


def leases_from(source: str, worker: str | None, generation: int | None
                ) -> Iterator[tuple[int | None, LeaseRef | CtlError]]:
    """(stdin line number or None, the lease or the error in that input) for `-` or one TASK_ID."""
    if source != "-":
        if worker is None or generation is None:
            raise click.UsageError("give --worker and --generation with a TASK_ID (or '-' to read "
                                   "leases as JSON lines from stdin)")
        yield None, LeaseRef(source, worker, generation)
        return
    if worker is not None or generation is not None:
        raise click.UsageError("--worker and --generation go with a TASK_ID, not with '-'")
    for number, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        try:
            value = parse_json_object(line, "the lease")
        except CtlError as exc:
            yield number, exc
            continue
        task_id, lease_worker, lease_generation = (value.get("task_id"), value.get("worker"),
                                                   value.get("generation"))
        if not (isinstance(task_id, str) and isinstance(lease_worker, str)
                and type(lease_generation) is int):
            yield number, CtlError('the lease needs "task_id" and "worker" strings and an '
                                   'integer "generation" (as reserve prints)', EXIT_USAGE,
                                   "InvalidJSON")
            continue
        yield number, LeaseRef(task_id, lease_worker, lease_generation)


def for_each_lease(ctl: Ctl, source: str, worker: str | None, generation: int | None,
                   action: Callable[[LeaseRef], None]) -> None:
    """Run `action` on every lease; with '-', go on after a failed line and exit
    with the code of the first failure (each failure is reported on stderr)."""
    first_failure: CtlError | None = None
    for number, lease in leases_from(source, worker, generation):
        try:
            if isinstance(lease, CtlError):
                raise lease
            action(lease)
        except CtlError as exc:
            if number is None:
                raise
            if ctl.json:
                click.echo(display.json_line({**error_object(exc), "line": number}), err=True)
            else:
                click.echo(f"Error: stdin line {number}: {exc.format_message()}", err=True)
            first_failure = first_failure or exc
            if exc.exit_code == EXIT_UNAVAILABLE:
                break  # every later line would fail the same way
    if first_failure is not None:
        click.get_current_context().exit(first_failure.exit_code)


def lease_arguments(command):
    command = json_option("Report errors as JSON objects on stderr, one per failed lease "
                          "(with its stdin line).")(command)
    command = click.option("--generation", type=click.IntRange(min=0), default=None,
                           help="The lease's generation (with TASK_ID).")(command)
    command = click.option("--worker", default=None, help="The lease's worker (with TASK_ID).")(command)
    return click.argument("lease", metavar="(- | TASK_ID)")(command)


LEASE_CODES = (*DAEMON_CODES, EXIT_STALE_LEASE)


@command(*LEASE_CODES, short_help='Complete leased tasks.')
@lease_arguments
@pass_ctl
def ack(ctl: Ctl, lease: str, worker: str | None, generation: int | None, as_json: bool) -> None:
    """Complete leased tasks: TASK_ID --worker W --generation G, or '-' to read
    the lease JSON lines `reserve` prints from stdin. Prints nothing."""
    for_each_lease(ctl, lease, worker, generation, lambda ref: ctl.client.ack(ref))


@command(*LEASE_CODES, short_help='Give leased tasks back, due again after --delay.')
@lease_arguments
@click.option("--delay", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seconds before the task is due again.")
@pass_ctl
def release(ctl: Ctl, lease: str, worker: str | None, generation: int | None, delay: int,
            as_json: bool) -> None:
    """Give leased tasks back (dead once out of attempts): TASK_ID --worker W
    --generation G, or '-' for lease JSON lines on stdin. Prints nothing.

    To end a lease that is not yours (say, one granted while the clock was
    far ahead), see `force-release`."""
    for_each_lease(ctl, lease, worker, generation, lambda ref: ctl.client.release(ref, delay=delay))


@command(*DAEMON_CODES, EXIT_NOT_FOUND,
         short_help="End the current leases of tasks by id, whoever holds them.", needs=FORCE_RELEASE)
@click.argument("task_ids", nargs=-1, required=True, metavar="TASK_ID...")
@click.option("--yes", is_flag=True, help="Do not ask for confirmation (needed when stdin is not "
                                          "a terminal).")
@json_option(JSON_ALREADY)
@pass_ctl
def force_release(ctl: Ctl, task_ids: tuple[str, ...], yes: bool, as_json: bool) -> None:
    """End the current leases of TASK_IDs now, without their worker and generation.

    For an operator: e.g. after the wall clock was set far ahead and back,
    leases granted meanwhile would last as long as the jump
    (docs/security.md). Each is written as an ordinary release at the
    daemon's now: it counts as an attempt, and a task at max_attempts
    becomes dead. The worker that held it gets StaleLease on its next ack.
    Shows each lease and asks first, unless --yes. All or nothing: if a
    task is not leased, none is released (exit 2; exit 7 if the queue does
    not hold one of them). Prints {"task_ids": [...]}.
    """
    unique = list(dict.fromkeys(task_ids))
    if not yes:
        if not sys.stdin.isatty():
            raise CtlError("force-release asks for confirmation on a terminal; give --yes to "
                           "release without asking", EXIT_USAGE, "UsageError")
        rows = [["TASK_ID", "WORKER", "GENERATION", "DEADLINE"]]
        for task_id in unique:
            task = ctl.client.get(task_id)
            if task is None:
                raise not_found(task_id, ": nothing was released")
            if task.status != "leased":
                raise CtlError(f"task '{display.name(task_id)}' is {task.status}, not leased: "
                               f"nothing was released", EXIT_USAGE, "InvalidRequest")
            rows.append([display.name(task.task_id), display.name(task.worker),
                         str(task.generation), str(task.deadline)])
        table(rows, err=True)  # stdout stays the JSON answer
        if not click.confirm("End these leases now? Each counts as an attempt; a task at "
                             "max_attempts becomes dead.", default=False, err=True):
            raise CtlError("nothing released", EXIT_FAILURE, "Aborted")
    try:
        released = ctl.client.force_release(unique)
    except CtlError as exc:
        unknown = ctl.unknown_task(unique, ": nothing was released") if exc.name == "InvalidRequest" else None
        if unknown is None:
            raise
        raise unknown from exc
    emit({"task_ids": released})


@command(*LEASE_CODES, short_help='Extend live leases.')
@lease_arguments
@click.option("--lease-seconds", type=click.IntRange(min=1), required=True,
              help="The new deadline, in seconds from the daemon's now.")
@pass_ctl
def touch(ctl: Ctl, lease: str, worker: str | None, generation: int | None, lease_seconds: int,
          as_json: bool) -> None:
    """Extend live leases: TASK_ID --worker W --generation G, or '-' for lease
    JSON lines on stdin. Prints each new lease as a JSON line."""
    for_each_lease(ctl, lease, worker, generation,
                   lambda ref: emit(ctl.client.touch(ref, lease_seconds=lease_seconds)))
