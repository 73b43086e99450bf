"""walqueue-ctl schedule FILE: a walqueue-scheduler file's next runs and last periods put.

The body is walqueue.schedule.show's; this module only registers the command
and says whether a queue was named (then the last period put is looked up).
"""

from __future__ import annotations

import time

import click

from walqueue import display
from walqueue.ctl.backends import Ctl
from walqueue.ctl.errors import DAEMON_CODES, EXIT_USAGE, CtlError
from walqueue.ctl.group import command, json_option
from walqueue.ctl.output import emit


@command(*DAEMON_CODES, short_help="Show a schedule file's next runs and last periods put.")
@click.argument("schedule_file", type=click.Path(dir_okay=False))
@click.option("--count", type=click.IntRange(1, 100), default=3, show_default=True,
              help="Next runs shown per entry.")
@json_option("Print one JSON object per entry; errors as JSON on stderr.")
@click.pass_context
def schedule(ctx: click.Context, schedule_file: str, count: int, as_json: bool) -> None:
    """Show each entry of a walqueue-scheduler SCHEDULE_FILE: its next runs (local time and
    UTC) and, with --socket, --dir or --dsn, the last period put. Puts nothing.

    The last period put is found by getting the task ids of the entry's
    latest periods (up to 100). A schedule file that walqueue-scheduler would
    refuse is an error naming its line (exit 2). Needs walqueue[scheduler].
    """
    try:
        from walqueue.schedule import entries, show
    except ImportError as exc:
        raise CtlError(str(exc), EXIT_USAGE, "UsageError") from None
    ctl = ctx.find_object(Ctl)
    group = ctx.parent
    sources = (click.core.ParameterSource.COMMANDLINE, click.core.ParameterSource.ENVIRONMENT)
    named = (ctl.dsn is not None or group.params.get("directory") is not None
             or group.get_parameter_source("socket_option") in sources)
    now = int(time.time())
    try:
        found = entries.load(schedule_file, now=now)
    except entries.ScheduleFileError as exc:
        raise CtlError(display.text(str(exc)), EXIT_USAGE, "ScheduleFileError") from None
    reports = show.report(found, now=now, count=count, lookup=ctl.client.get if named else None)
    if as_json:
        for item in reports:
            emit(show.to_json(item))
    else:
        click.echo(show.render(reports, target=ctl.socket_path if named else None))
