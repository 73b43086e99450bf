"""walqueue-ctl's steering commands (SPEC §8b): cancel tasks that should not run, and see the
workers (who holds leases, who is connected)."""

from __future__ import annotations

import click

from walqueue import display
from walqueue.ctl.backends import Ctl
from walqueue.ctl.errors import DAEMON_CODES, EXIT_NOT_FOUND, CtlError, not_found
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
@json_option("Print each worker as a JSON line (WorkerView's fields: worker, leases, connected).")
@pass_ctl
def workers(ctl: Ctl, as_json: bool) -> None:
    """List the worker names that hold a lease, or that a connection open now used, by name.

    LEASES is how many leases each holds; CONNECTED says whether a connection
    to walqueued that used the name is open now. On PostgreSQL only the
    lease holders are known (a database does not see its clients' worker
    names), and CONNECTED is always "no".
    """
    views = ctl.client.workers()
    if as_json:
        for view in views:
            emit(view)
        return
    if not views:
        click.echo("no workers")
        return
    table([["WORKER", "LEASES", "CONNECTED"]]
          + [[display.name(view.worker), str(view.leases), "yes" if view.connected else "no"]
             for view in views])
