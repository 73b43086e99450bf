"""The walqueue-ctl group: its options, its help, `--json`, and how commands are declared.

Every command module registers its commands on `cli` with `command(...)`,
which puts the command's own exit codes in its `--help`, and takes the
group's `Ctl` with `pass_ctl`. Under `--json` every error, usage errors
included, is reported as one JSON object on stderr (`CtlGroup.invoke`).
"""

from __future__ import annotations

import os
from typing import Any

import click

from walqueue import __version__, paths
from walqueue.client import SOCKET_NAME, socket_path
from walqueue.ctl.backends import Ctl, refuse_unable
from walqueue.ctl.errors import (
    DEFAULT_SOCKET,
    EXIT_MEANINGS,
    JsonError,
    command_epilog,
    exit_codes_help,
)

DEFAULT_TIMEOUT_SECONDS = 30.0

GROUP_EPILOG = exit_codes_help(tuple(EXIT_MEANINGS)) + """\
\b
Where the daemon is: --socket PATH, or --dir DIRECTORY (its walqueued.sock),
or $WALQUEUE_SOCKET; default """ + paths.PLAIN_SOCKET + """.
A queue on PostgreSQL instead: --dsn URL (or $WALQUEUE_DSN) and --queue NAME
(default "default"); needs walqueue[postgres]. verify, backup, compact,
pause, resume, metrics and top are walqueued's alone and exit 2 there.
Keep its password in ~/.pgpass or PGPASSWORD (a command line is public to
the host's users); a password in it is never printed: shown as ***.
\b
--json, before or after any command: JSON output, and errors as one JSON
object each on stderr: {"code": N, "error": "Name", "message": "..."}.
\b
Shell completion (bash; zsh_source and fish_source likewise):
  eval "$(_WALQUEUE_CTL_COMPLETE=bash_source walqueue-ctl)"
"""


class CtlCommand(click.Command):
    """A command and what it needs of the backend: `needs`, a capability of
    walqueue.backend, or `offline`: it reads a walqueued directory itself."""

    def __init__(self, *args: Any, needs: str | None = None, offline: bool = False,
                 **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.needs = needs
        self.offline = offline


class CtlGroup(click.Group):
    """The walqueue-ctl group: under --json, every error is reported as a JSON object."""

    def parse_args(self, ctx: click.Context, args: list[str]) -> list[str]:
        ctx.meta["walqueue-ctl.args"] = list(args)
        return super().parse_args(ctx, args)

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except click.ClickException as exc:
            if wants_json(ctx):
                raise JsonError(exc) from exc
            raise


def wants_json(ctx: click.Context) -> bool:
    ctl = ctx.find_object(Ctl)
    if ctl is not None and ctl.json is not None:
        return ctl.json
    # The command line did not parse as far as --json: look for it by hand.
    args = ctx.meta.get("walqueue-ctl.args", [])
    return "--json" in (args[:args.index("--")] if "--" in args else args)


def _remember_json(ctx: click.Context, parameter: click.Parameter, value: bool) -> bool:
    ctl = ctx.find_object(Ctl)
    if ctl is not None:
        value = value or bool(ctl.json)  # the group's --json counts for the command
        ctl.json = value
    return value


def json_option(help_text: str):
    return click.option("--json", "as_json", is_flag=True, callback=_remember_json, help=help_text)


JSON_ALREADY = "Report errors as JSON objects on stderr (the output is JSON already)."


@click.group(cls=CtlGroup, epilog=GROUP_EPILOG,
             context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, "--version", prog_name="walqueue-ctl",
                      message="%(prog)s %(version)s", help="Print the version and exit.")
@click.option("--socket", "socket_option", envvar="WALQUEUE_SOCKET", type=click.Path(dir_okay=True),
              help="walqueued's socket (or its directory). [env: WALQUEUE_SOCKET]")
@click.option("--dir", "directory", type=click.Path(file_okay=False),
              help="The daemon's queue DIRECTORY: use DIRECTORY/walqueued.sock.")
@click.option("--dsn", envvar="WALQUEUE_DSN", metavar="URL",
              help="A queue on PostgreSQL instead of walqueued: a libpq URL or key=value string "
                   "(SPEC §9; needs walqueue[postgres]). [env: WALQUEUE_DSN]")
@click.option("--queue", "queue_name", metavar="NAME", default=None,
              help='With --dsn: the queue in that database [default: "default"].')
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_TIMEOUT_SECONDS,
              show_default=True, help="Seconds to wait for each answer (plus --wait for reserve).")
@click.option("--json", "as_json", is_flag=True,
              help="JSON output and JSON errors, as the command's own --json gives.")
@click.pass_context
def cli(ctx: click.Context, socket_option: str | None, directory: str | None, dsn: str | None,
        queue_name: str | None, timeout: float, as_json: bool) -> None:
    """Operate walqueued, the WALQueue daemon, and verify queue directories.

    Data is printed as JSON, one object per line, so that
    `walqueue-ctl reserve w | walqueue-ctl ack -` works.
    """
    commandline = click.core.ParameterSource.COMMANDLINE
    socket_given = ctx.get_parameter_source("socket_option") == commandline
    if directory is not None and socket_given:
        raise click.UsageError("give --socket or --dir, not both")
    if dsn is not None and (directory is not None or socket_given):
        if ctx.get_parameter_source("dsn") == commandline:
            raise click.UsageError("give --dsn or --socket/--dir, not both")
        dsn = None  # a daemon named on the command line beats WALQUEUE_DSN
    if queue_name is not None and dsn is None:
        raise click.UsageError("--queue names a queue on PostgreSQL: give --dsn too (walqueued "
                               "serves the one queue of its directory)")
    if directory is not None:
        path = os.path.join(directory, SOCKET_NAME)
    else:
        path = socket_path(socket_option or DEFAULT_SOCKET)
    ctl = Ctl(path, timeout, json=as_json or None, dsn=dsn, queue=queue_name or "default")
    ctx.obj = ctl
    ctx.call_on_close(ctl.close)
    command = cli.commands.get(ctx.invoked_subcommand or "")
    if isinstance(command, CtlCommand):  # before anything connects
        refuse_unable(ctl, command.name, command.needs, command.offline)


pass_ctl = click.make_pass_decorator(Ctl)


def command(*codes: int, short_help: str | None = None, name: str | None = None,
            needs: str | None = None, offline: bool = False):
    """A walqueue-ctl command whose --help lists its own exit codes; `needs` is the
    capability it calls for, refused with exit 2 by a backend without it."""
    return cli.command(name, cls=CtlCommand, epilog=command_epilog(codes), short_help=short_help,
                       needs=needs, offline=offline)
