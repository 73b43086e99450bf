"""walqueue-ctl's steering commands (SPEC §8b): cancel tasks that should not run, and see the
workers (who holds leases, who is connected)."""

from __future__ import annotations

import click

from walqueue import display
from walqueue.ctl.backends import Ctl
from walqueue.ctl.errors import DAEMON_CODES, EXIT_NOT_FOUND, EXIT_USAGE, CtlError, not_found
from walqueue.ctl.group import JSON_ALREADY, command, json_option, pass_ctl
from walqueue.ctl.output import emit, table


@command(*DAEMON_CODES, EXIT_NOT_FOUND, short_help="Complete tasks without running them.")
@click.argument("task_ids", nargs=-1, required=True, metavar="TASK_ID...")
@json_option(JSON_ALREADY)
@pass_ctl
def cancel(ctl: Ctl, task_ids: tuple[str, ...], as_json: bool) -> None:
    """Complete ready (due) or dead tasks without any worker running them.

    Each keeps its key, so an identical put stays a no-op. A task already
    completed is left as it is. A task not yet due or leased is refused
    (exit 2) with when it becomes cancellable or which lease holds it; an
    unknown one is exit 7. Tasks are cancelled one by one, in order: on a
    refusal the ones before it are cancelled and the rest are not tried.
    Prints {"task_ids": [...]}, the ids cancelled (or already completed).
    """
    unique = list(dict.fromkeys(task_ids))
    done: list[str] = []
    for task_id in unique:
        try:
            ctl.client.cancel(task_id)
        except CtlError as exc:
            consequence = _consequence(done, unique[len(done) + 1:])
            if exc.name == "InvalidRequest" and ctl.client.get(task_id) is None:
                raise not_found(task_id, consequence) from exc
            first, *rest = exc.format_message().splitlines()
            raise CtlError("\n".join([first + consequence, *rest]), exc.exit_code, exc.name,
                           exc.fields) from exc
        done.append(task_id)
    emit({"task_ids": done})


def _consequence(done: list[str], untried: list[str]) -> str:
    parts = []
    if done:
        parts.append(f"cancelled before it: {', '.join(map(display.name, done))}")
    if untried:
        parts.append(f"not tried: {', '.join(map(display.name, untried))}")
    return f" ({'; '.join(parts)})" if parts else ": nothing was cancelled"


@command(*DAEMON_CODES, short_help="The workers: who holds leases, who is connected.")
@click.option("--connections", "connections_only", is_flag=True,
              help="Only the connections to walqueued (each one's worker names, leases, requests and "
                   "last request's age); as JSON lines with --json.")
@json_option("Print each worker as a JSON line (WorkerView's fields: worker, leases, connected).")
@pass_ctl
def workers(ctl: Ctl, connections_only: bool, as_json: bool) -> None:
    """List the worker names that hold a lease, or that a connection open now used, by name.

    LEASES is how many leases each holds; CONNECTED says whether a connection
    to walqueued that used the name is open now. On walqueued a second table
    follows: each open connection that sent a request (as the daemon's log
    names it), the worker names it used, the leases they hold, its requests
    and how long ago its last one came. On PostgreSQL only the lease holders
    are known (a database does not see its clients' worker names), and
    CONNECTED is always "no".
    """
    if connections_only:
        if ctl.dsn is not None:
            raise CtlError("--connections: a database does not know its clients' worker names; see "
                           "pg_stat_activity for its connections", EXIT_USAGE, "UsageError")
        views = ctl.client.connections()
        if as_json:
            for view in views:
                emit(view)
        else:
            _connections_table(views)
        return
    views = ctl.client.workers()
    if as_json:
        for view in views:
            emit(view)
        return
    if not views:
        click.echo("no workers")
    else:
        table([["WORKER", "LEASES", "CONNECTED"]]
              + [[display.name(view.worker), str(view.leases), "yes" if view.connected else "no"]
                 for view in views])
    connections = _daemon_connections(ctl)
    if connections:
        click.echo("")
        _connections_table(connections)


def _daemon_connections(ctl: Ctl) -> list:
    """walqueued's connections, or [] on PostgreSQL and from a daemon too old to know the request."""
    if ctl.dsn is not None or not callable(getattr(ctl.client, "connections", None)):
        return []
    try:
        return ctl.client.connections()
    except CtlError as exc:
        if exc.name == "UnknownRequest":
            return []
        raise


def _connections_table(views: list) -> None:
    if not views:
        click.echo("no connections")
        return
    table([["CONNECTION", "WORKERS", "LEASES", "REQUESTS", "LAST REQUEST"]]
          + [[display.name(view.connection), ", ".join(map(display.name, view.workers)) or "-",
              str(view.leases), str(view.requests), f"{view.last_request_age_seconds:.1f} s ago"]
             for view in views])
