"""walqueue-ctl: the operator's command line for walqueued (SPEC §8) and for
a queue on PostgreSQL (SPEC §9, `--dsn URL`).

A thin layer over a client: each command is one or a few calls of SPEC's
client methods, its output is data (JSON, one object per line) or a report
(`stats`, `dead`, `tasks`, `next`, `top` and `verify` print for a human
unless `--json`), and every failure maps to one documented exit code with a
message that says what to do next. `verify` is the exception: it talks to no
daemon and reads a directory offline through `walqueue.verify` (read-only; no
lock taken).

One output convention, on every command:

* `--json`: the output is JSON with SPEC's field names (a `TaskView` or a
  `Lease` is one object, a listing one object per line), and errors are one
  JSON object each on stderr: `{"code": N, "error": "Name", "message": "..."}`
  (plus `task_id`, `status`, `generation` for a stale lease and `line` for a
  line of stdin). Data commands (`put`, `reserve`, `get`, ...) print JSON
  anyway.
* For a human, every name (task id, key, worker, directory) and every
  message from the daemon goes through `walqueue.display`, so control, bidi
  and invisible characters are escaped; JSON keeps every value exact.

The group builds one `Ctl` context object (where the daemon is, how long to
wait for it, whether errors are JSON) that the commands share. Its `client`
is created on first use by `open_client`, the one place a backend is chosen,
so `verify` and `--help` never touch a socket. With `--dsn URL` (or
WALQUEUE_DSN) that client is `walqueue.pg.Client` for the queue `--queue
NAME`; the commands that only mean something for walqueued (verify, backup,
compact, pause, resume, metrics, top) then exit 2 naming the PostgreSQL tool
to use, and `migrate` creates or upgrades the schema.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import stat
import sys
import time
from collections.abc import Callable, Iterator
from typing import Any

import click

from walqueue import (
    CorruptStore,
    InvalidRequest,
    KeyConflict,
    QueueClosed,
    StaleLease,
    Unavailable,
    WalQueueError,
    __version__,
    display,
    top,
)
from walqueue.backup import (
    BackupError,
    BackupIncomplete,
    DestinationNotEmpty,
    SourceUnreadable,
    check_destination,
    copy_manifest,
)
from walqueue.client import SOCKET_NAME, Client, DaemonUnavailable, socket_path
from walqueue.dsn import redacted
from walqueue.metrics import DaemonStats, render_prometheus
from walqueue.verify import verify_directory

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
EXIT_CORRUPT = 4
EXIT_STALE_LEASE = 5
EXIT_KEY_CONFLICT = 6
EXIT_NOT_FOUND = 7
EXIT_UNREADABLE = 8
EXIT_DEST_NOT_EMPTY = 9
EXIT_BACKUP_INCOMPLETE = 10
EXIT_NO_QUEUE = 11

DEFAULT_SOCKET = "/run/walqueue/walqueued.sock"  # where systemd/walqueued.service puts it
DEFAULT_TIMEOUT_SECONDS = 30.0
DEFAULT_NEXT_LIMIT = 10
PAYLOAD_COLUMN_CHARS = 60
STATUSES = ("ready", "leased", "completed", "dead")

# Each code's meaning, pre-wrapped for --help: the whole table in the
# group's help, each command's own codes in its help.
EXIT_MEANINGS = {
    EXIT_OK: "success (also: reserve that leased nothing; verify of a healthy\n"
             "     directory, torn tail included)",
    EXIT_FAILURE: "failure: the daemon could not make the request durable (a failed\n"
                  "     write; it reopened its queue; retry) or an unexpected error",
    EXIT_USAGE: "usage error or invalid input (bad option, malformed JSON, a request\n"
                "     the queue rejects as InvalidRequest); nothing was written",
    EXIT_UNAVAILABLE: "the daemon is unavailable (not running, wrong socket, no permission,\n"
                      "     or the connection broke before the answer)",
    EXIT_CORRUPT: "corrupt: verify found corruption (the daemon would refuse to start),\n"
                  "     or the copy backup made does not verify",
    EXIT_STALE_LEASE: "stale lease: ack/release/touch with a lease that is not current",
    EXIT_KEY_CONFLICT: "key conflict: put with a key or task id already used differently",
    EXIT_NOT_FOUND: "not found: get of an unknown task",
    EXIT_UNREADABLE: "verify or backup could not read the queue directory or one of its\n"
                     "     files (run as the daemon's user or a member of its group)",
    EXIT_DEST_NOT_EMPTY: "backup: DEST exists and is not an empty directory (nothing written)",
    EXIT_BACKUP_INCOMPLETE: "backup: the copy failed half way; DEST is incomplete (it will not\n"
                            "     open as a queue): delete it and run backup again",
    EXIT_NO_QUEUE: "verify: the directory holds no queue (empty, or e.g. the parent of\n"
                   "     queue directories, which it names)",
}

# The codes of a command that talks to the daemon, before its own.
DAEMON_CODES = (EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_UNAVAILABLE)


def exit_codes_help(codes: tuple[int, ...]) -> str:
    lines = "\n".join(f"{code:>3}  {EXIT_MEANINGS[code]}" for code in codes)
    return f"\b\nExit codes:\n{lines}\n"


GROUP_EPILOG = exit_codes_help(tuple(EXIT_MEANINGS)) + """\
\b
Where the daemon is: --socket PATH, or --dir DIRECTORY (its walqueued.sock),
or $WALQUEUE_SOCKET; default /run/walqueue/walqueued.sock.
A queue on PostgreSQL instead: --dsn URL (or $WALQUEUE_DSN) and --queue NAME
(default "default"); needs walqueue[postgres]. verify, backup, compact,
pause, resume, metrics and top are walqueued's alone and exit 2 there.
Keep its password in ~/.pgpass or PGPASSWORD (a command line is public to
the host's users); a password in it is never printed: shown as ***.
\b
--json on any command: JSON output, and errors as one JSON object each on
stderr: {"code": N, "error": "Name", "message": "..."}.
\b
Shell completion (bash; zsh_source and fish_source likewise):
  eval "$(_WALQUEUE_CTL_COMPLETE=bash_source walqueue-ctl)"
"""


def command_epilog(codes: tuple[int, ...]) -> str:
    return exit_codes_help(codes) + "(walqueue-ctl --help explains them all.)\n"


# -- errors -------------------------------------------------------------------------


class CtlError(click.ClickException):
    """An error with its exit code; click prints `Error: <message>` to stderr.

    `name` and `fields` are what `--json` reports besides the message.
    """

    def __init__(self, message: str, exit_code: int, name: str = "Error",
                 fields: dict[str, Any] | None = None) -> None:
        super().__init__(message)
        self.exit_code = exit_code
        self.name = name
        self.fields = fields or {}


def error_object(error: click.ClickException) -> dict[str, Any]:
    """The JSON form of an error: {"code", "error", "message"} and its own fields."""
    if isinstance(error, CtlError):
        name, fields = error.name, error.fields
    else:
        name, fields = ("UsageError" if isinstance(error, click.UsageError) else "Error"), {}
    return {"code": error.exit_code, "error": name, "message": error.format_message(), **fields}


class JsonError(click.ClickException):
    """An error shown as one JSON object on stderr (under --json), with its exit code."""

    def __init__(self, error: click.ClickException) -> None:
        super().__init__(error.format_message())
        self.exit_code = error.exit_code
        self.error = error

    def show(self, file=None) -> None:
        click.echo(display.json_line(error_object(self.error)), err=True)


def what_is_at(path: str) -> tuple[str, bool] | None:
    """Why `path` cannot be walqueued's socket, and whether it is there at all;
    None when it is a socket (or cannot be looked at)."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        parent = os.path.dirname(os.path.abspath(path))
        if not os.path.isdir(parent):
            return f"its directory {display.name(parent)} does not exist", False
        return "no such file (no daemon has created its socket there)", False
    except OSError:
        return None  # e.g. no permission: the client's own message says so
    if stat.S_ISSOCK(mode):
        return None
    kind = "a directory" if stat.S_ISDIR(mode) else "a regular file" if stat.S_ISREG(mode) else "a file"
    return f"it is {kind}, not a socket", True


def error_for(exc: BaseException, path: str, dsn: str | None = None) -> CtlError:
    """The exit code and next-step message for a library or client exception.

    `path` is the daemon's socket, or `dsn` the PostgreSQL database, that the
    command talked to.
    """
    message = display.text(str(exc) if dsn is None else redacted(str(exc), dsn))  # SPEC §8b
    name = type(exc).__name__
    if dsn is not None and isinstance(exc, (Unavailable, ConnectionError)):
        return CtlError(f"{message}\nIs PostgreSQL running, and does --dsn (or WALQUEUE_DSN) "
                        f"name it, with a role that may use the walqueue schema?",
                        EXIT_UNAVAILABLE, name)
    if dsn is not None and name == "SchemaError":
        return CtlError(f"{message}\nRun walqueue-ctl --dsn URL migrate as a role that owns the "
                        f"schema (docs/postgres.md).", EXIT_FAILURE, name)
    if isinstance(exc, (DaemonUnavailable, ConnectionError)):
        found = what_is_at(path)
        if found is not None:
            message = f"cannot connect to walqueued at {display.name(path)}: {found[0]}"
        if found is not None and found[1]:
            advice = (f"Point --socket at walqueued's socket, or --dir at its queue directory "
                      f"(default {DEFAULT_SOCKET}).")
        else:
            advice = (f"Is walqueued running and is {display.name(path)} its socket? Start it "
                      f"(systemctl start walqueued, or walqueued serve DIRECTORY), or point "
                      f"--socket, --dir or WALQUEUE_SOCKET at it.")
        return CtlError(f"{message}\n{advice}", EXIT_UNAVAILABLE, "DaemonUnavailable")
    if isinstance(exc, StaleLease):
        if exc.status is None:
            now = "is unknown to the daemon"
        else:
            now = f"is now {exc.status} at generation {exc.generation}"
        return CtlError(f"{message}\nThe task {now}. The lease is no longer yours: reserve again "
                        f"(a retried ack that finds the task completed at your own generation "
                        f"means the first ack succeeded).", EXIT_STALE_LEASE, name,
                        {"task_id": exc.task_id, "status": exc.status, "generation": exc.generation})
    if isinstance(exc, KeyConflict):
        return CtlError(f"{message}\nUse a new task id and key, or repeat the original request "
                        f"exactly (an identical put is idempotent).", EXIT_KEY_CONFLICT, name)
    if isinstance(exc, InvalidRequest):
        return CtlError(f"{message}\nNothing was written; fix the request.", EXIT_USAGE, name)
    if isinstance(exc, QueueClosed):
        return CtlError(f"{message}\nThe daemon failed to write (disk full? I/O error?) and "
                        f"reopened its queue, so this request may or may not have been applied. "
                        f"Check its log, then retry: a put is idempotent, and an ack that then "
                        f"finds the task completed at your generation had succeeded.",
                        EXIT_FAILURE, name)
    if isinstance(exc, CorruptStore):
        return CtlError(f"{message}\nRun walqueue-ctl verify on the daemon's directory.",
                        EXIT_CORRUPT, name)
    return CtlError(f"{name}: {message}", EXIT_FAILURE, name)


# -- the context object and the backend ---------------------------------------------


class GuardedClient:
    """A client whose exceptions arrive as CtlErrors, so commands call SPEC's methods plainly."""

    def __init__(self, client: Any, path: str, dsn: str | None = None) -> None:
        self._client = client
        self._path = path
        self._dsn = dsn

    def __getattr__(self, method: str) -> Callable[..., Any]:
        call = getattr(self._client, method)

        def guarded(*args, **kwargs):
            try:
                return call(*args, **kwargs)
            except (WalQueueError, OSError) as exc:
                raise error_for(exc, self._path, self._dsn) from exc

        return guarded


# Tests replace this to run the commands against a fake daemon.
CLIENT_FACTORY: Callable[..., Any] = Client


@dataclasses.dataclass
class Ctl:
    """The group's context object: where the daemon is, and one lazily opened client."""

    socket_path: str
    timeout: float
    json: bool | None = None  # set by a command's --json once parsed
    dsn: str | None = None  # a PostgreSQL database instead of the daemon (SPEC §9)
    queue: str = "default"  # the queue in that database
    _client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                client = open_client(self)
            except (WalQueueError, OSError) as exc:
                raise error_for(exc, self.socket_path, self.dsn) from exc
            self._client = GuardedClient(client, self.socket_path, self.dsn)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def open_client(ctl: Ctl) -> Any:
    """The backend of this invocation: walqueued's client at ctl.socket_path, or
    walqueue.pg's Client for ctl.dsn.

    The one place a backend is chosen; commands only call SPEC's client
    methods. A PostgreSQL client never creates the schema here (`migrate`
    does, as a role allowed to) and runs no reaper of its own.
    """
    if ctl.dsn is not None:
        return postgres_backend().Client(ctl.dsn, queue=ctl.queue, migrate=False, reaper=False,
                                         listen=False, connect_seconds=ctl.timeout, retry_seconds=0)
    return CLIENT_FACTORY(ctl.socket_path, timeout=ctl.timeout, retry_seconds=0,
                          name="walqueue-ctl")


# walqueued's own commands: their message on PostgreSQL comes from walqueue.pg;
# top has no PostgreSQL counterpart of its own.
DAEMON_ONLY_COMMANDS = ("verify", "backup", "compact", "pause", "resume", "metrics", "top")


def postgres_backend():
    """walqueue.pg, imported only for --dsn (it needs the extra walqueue[postgres])."""
    try:
        import walqueue.pg as backend
    except ImportError as exc:
        raise CtlError(f"--dsn needs the PostgreSQL backend, which is not installed ({exc}): "
                       f"pip install 'walqueue[postgres]'", EXIT_USAGE, "UsageError") from None
    return backend


def refuse_on_postgres(command_name: str | None) -> None:
    """Exit 2, saying what to use instead, for a walqueued-only command under --dsn."""
    if command_name not in DAEMON_ONLY_COMMANDS:
        return
    messages = {**postgres_backend().UNSUPPORTED_COMMANDS,
                "top": "top shows walqueued's own figures; on PostgreSQL use `walqueue-ctl "
                       "--dsn URL stats` and pg_stat_activity"}
    raise CtlError(f"{command_name} is not available with --dsn: {messages[command_name]}",
                   EXIT_USAGE, "Unsupported")


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
@click.pass_context
def cli(ctx: click.Context, socket_option: str | None, directory: str | None, dsn: str | None,
        queue_name: str | None, timeout: float) -> None:
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
    ctl = Ctl(path, timeout, dsn=dsn, queue=queue_name or "default")
    ctx.obj = ctl
    ctx.call_on_close(ctl.close)
    if dsn is not None:
        refuse_on_postgres(ctx.invoked_subcommand)


pass_ctl = click.make_pass_decorator(Ctl)


def command(*codes: int, short_help: str | None = None, name: str | None = None):
    """A walqueue-ctl command whose --help lists its own exit codes."""
    return cli.command(name, epilog=command_epilog(codes), short_help=short_help)


def emit(value: Any) -> None:
    """Print one JSON value on one line (dataclasses as objects)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    click.echo(display.json_line(value))


def json_kind(value: Any) -> str:
    """How JSON names the type of a decoded value."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return "an array"
    if isinstance(value, str):
        return "a string"
    return "a number"


def parse_json_object(text: str, what: str) -> dict:
    """`text` as a JSON object; raises CtlError (exit 2) naming `what` otherwise."""
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CtlError(f"{what} is not valid JSON: {exc}", EXIT_USAGE, "InvalidJSON") from None
    if not isinstance(value, dict):
        raise CtlError(f"{what} must be a JSON object, not {json_kind(value)}", EXIT_USAGE,
                       "InvalidJSON")
    return value


# -- tasks in ---------------------------------------------------------------------


@command(*DAEMON_CODES, EXIT_KEY_CONFLICT, short_help='Put a task (idempotent by key).')
@click.argument("task_id")
@click.argument("payload", required=False, default="{}", metavar="[PAYLOAD_JSON|-]")
@click.option("--key", default=None,
              help="Idempotency key [default: the task id]. A key already used by a different "
                   "request is a key conflict (exit 6).")
@click.option("--delay", type=click.IntRange(min=0), default=None,
              help="Due this many seconds from now (computed once, so a retry keeps its identity).")
@click.option("--available-at", type=click.IntRange(min=0), default=None,
              help="Due at this Unix time (seconds). Not with --delay.")
@click.option("--max-attempts", type=click.IntRange(min=1), default=3, show_default=True,
              help="Leases after which a task that keeps failing (released or expired) is dead.")
@json_option(JSON_ALREADY)
@pass_ctl
def put(ctl: Ctl, task_id: str, payload: str, key: str | None, delay: int | None,
        available_at: int | None, max_attempts: int, as_json: bool) -> None:
    """Put a task; PAYLOAD_JSON is a JSON object ('-' reads it from stdin; default {}).

    Prints {"task_id": ...}. Putting the identical request again is a no-op
    that prints the same id. Tasks are leased in (available_at, task_id)
    order, so ids that should run in arrival order must sort that way
    (zero-padded numbers, or time-ordered ids).
    """
    if delay is not None and available_at is not None:
        raise click.UsageError("give --delay or --available-at, not both")
    text = sys.stdin.read() if payload == "-" else payload
    value = parse_json_object(text, "the payload" + (" on stdin" if payload == "-" else ""))
    task = ctl.client.put(task_id, value, key=key, available_at=available_at or 0,
                          delay=delay, max_attempts=max_attempts)
    emit({"task_id": task})


# -- leases -----------------------------------------------------------------------


@command(*DAEMON_CODES, short_help='Lease due tasks for WORKER.')
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
    Tasks are leased in (available_at, task_id) order; `next` shows that
    order without leasing.
    """
    for lease in ctl.client.reserve(worker, lease_seconds=lease_seconds, limit=limit, wait=wait):
        emit(lease)


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


@command(*DAEMON_CODES, short_help="End the current leases of tasks by id, whoever holds them.")
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
    task is unknown or not leased, none is released (exit 2). Prints
    {"task_ids": [...]}.
    """
    unique = list(dict.fromkeys(task_ids))
    if not yes:
        if not sys.stdin.isatty():
            raise CtlError("force-release asks for confirmation on a terminal; give --yes to "
                           "release without asking", EXIT_USAGE, "UsageError")
        rows = [["TASK_ID", "WORKER", "GENERATION", "DEADLINE"]]
        for task_id in unique:
            task = ctl.client.get(task_id)
            if task is None or task.status != "leased":
                state = "unknown" if task is None else task.status
                raise CtlError(f"task '{display.name(task_id)}' is {state}, not leased: nothing "
                               f"was released", EXIT_USAGE, "InvalidRequest")
            rows.append([display.name(task.task_id), display.name(task.worker),
                         str(task.generation), str(task.deadline)])
        table(rows, err=True)  # stdout stays the JSON answer
        if not click.confirm("End these leases now? Each counts as an attempt; a task at "
                             "max_attempts becomes dead.", default=False, err=True):
            raise CtlError("nothing released", EXIT_FAILURE, "Aborted")
    emit({"task_ids": ctl.client.force_release(unique)})


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


# -- inspection -------------------------------------------------------------------


@command(*DAEMON_CODES, EXIT_NOT_FOUND)
@click.argument("task_id")
@json_option(JSON_ALREADY)
@pass_ctl
def get(ctl: Ctl, task_id: str, as_json: bool) -> None:
    """Print one task as JSON (exit 7 if there is no such task)."""
    task = ctl.client.get(task_id)
    if task is None:
        raise CtlError(f"no task '{display.name(task_id)}' in the queue (completed and dead "
                       f"tasks stay listed, so it was never put)", EXIT_NOT_FOUND, "NotFound")
    emit(task)


def table(rows: list[list[str]], *, err: bool = False) -> None:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip(),
                   err=err)


def payload_cell(payload: dict | None) -> str:
    if payload is None:
        return "-"
    text = display.json_line(payload)  # JSON's own escapes, and no character shown raw
    if len(text) > PAYLOAD_COLUMN_CHARS:
        text = text[:PAYLOAD_COLUMN_CHARS - 3] + "..."
    return text


def _optional(value: Any, render: Callable[[Any], str] = str) -> str:
    return "-" if value is None else render(value)


# How each column of a task table shows a TaskView (now: this machine's clock, in seconds).
TASK_COLUMNS: dict[str, Callable[[Any, int], str]] = {
    "TASK_ID": lambda task, now: display.name(task.task_id),
    "KEY": lambda task, now: display.name(task.key),
    "STATUS": lambda task, now: task.status,
    "DUE": lambda task, now: top.due_text(task.available_at, now),
    "ATTEMPTS": lambda task, now: f"{task.attempts}/{task.max_attempts}",
    "GENERATION": lambda task, now: str(task.generation),
    "AVAILABLE_AT": lambda task, now: str(task.available_at),
    "WORKER": lambda task, now: _optional(task.worker, display.name),
    "DEADLINE": lambda task, now: _optional(task.deadline),
    "PAYLOAD": lambda task, now: payload_cell(task.payload),
}


def print_tasks(tasks: list, total: int, columns: tuple[str, ...], as_json: bool, nothing: str) -> None:
    """A listing: one TaskView JSON per line, or a table; says how many were left out."""
    if as_json:
        for task in tasks:
            emit(task)
        return
    if not tasks:
        click.echo(nothing)
        return
    now = int(time.time())
    table([list(columns)] + [[TASK_COLUMNS[column](task, now) for column in columns] for task in tasks])
    if total > len(tasks):
        click.echo(f"... and {total - len(tasks)} more (--limit)")


LIMIT_OPTION = click.option("--limit", type=click.IntRange(min=1), default=None,
                            help="Show at most this many tasks [default: all].")
LISTING_JSON = "Print each task as a JSON line (TaskView's fields); errors as JSON on stderr."


@command(*DAEMON_CODES, short_help="List tasks (all, or those of one --status).")
@click.option("--status", type=click.Choice(STATUSES), default=None,
              help="Only tasks with this status [default: every status].")
@LIMIT_OPTION
@json_option(LISTING_JSON)
@pass_ctl
def tasks(ctl: Ctl, status: str | None, limit: int | None, as_json: bool) -> None:
    """List tasks in task_id order, as a table or (--json) one task per line.

    Completed tasks stay listed for ever (as tombstones without payload), so
    on a long-lived queue use --status or --limit.
    """
    listing = ctl.client.tasks(status)
    print_tasks(listing[:limit], len(listing),
                ("TASK_ID", "STATUS", "ATTEMPTS", "AVAILABLE_AT", "WORKER", "DEADLINE", "PAYLOAD"),
                as_json, f"no {status} tasks" if status else "no tasks")


@command(*DAEMON_CODES, name="next", short_help="The next tasks reserve would lease, unleased.")
@click.option("--limit", type=click.IntRange(min=1), default=DEFAULT_NEXT_LIMIT, show_default=True,
              help="Show at most this many tasks.")
@json_option(LISTING_JSON)
@pass_ctl
def next_tasks(ctl: Ctl, limit: int, as_json: bool) -> None:
    """The ready tasks in the order reserve leases them, without leasing any.

    That order is (available_at, task_id), not arrival order: `job-10` comes
    before `job-9`. Tasks not yet due are listed after the due ones, with
    when they become due (DUE, by this machine's clock). This reads the
    whole ready listing (`tasks --status ready`) and sorts it here, so it
    costs as much as that listing.
    """
    ready = sorted(ctl.client.tasks("ready"), key=lambda task: (task.available_at, task.task_id))
    print_tasks(ready[:limit], len(ready),
                ("TASK_ID", "DUE", "AVAILABLE_AT", "ATTEMPTS", "PAYLOAD"), as_json, "no ready tasks")


@command(*DAEMON_CODES)
@LIMIT_OPTION
@json_option(LISTING_JSON)
@pass_ctl
def dead(ctl: Ctl, limit: int | None, as_json: bool) -> None:
    """List dead tasks (out of attempts); bring them back with `revive`."""
    listing = ctl.client.tasks("dead")
    print_tasks(listing[:limit], len(listing),
                ("TASK_ID", "KEY", "ATTEMPTS", "GENERATION", "AVAILABLE_AT", "PAYLOAD"),
                as_json, "no dead tasks")


def stats_fields(report: DaemonStats) -> dict[str, Any]:
    """The report flat: the QueueStats keys first (as `stats --json` always had), then the rest."""
    fields = dataclasses.asdict(report.queue)
    fields.update((field.name, getattr(report, field.name))
                  for field in dataclasses.fields(report) if field.name != "queue")
    return fields


def _cell(value: Any) -> str:
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.3f}" if abs(value) >= 1e5 else f"{value:.6g}"
    if isinstance(value, bool):
        return str(value).lower()
    return display.name(value) if isinstance(value, str) else str(value)


@command(*DAEMON_CODES)
@json_option("Print the report as one JSON object (the queue's stats keys at the top level); "
             "errors as JSON on stderr.")
@pass_ctl
def stats(ctl: Ctl, as_json: bool) -> None:
    """The daemon's report: the queue and the daemon's own figures.

    \b
    Queue: ready, leased, completed, dead (task counts), last_seq,
      snapshot_seq, wal_bytes (WAL since the snapshot).
    Daemon: oldest_ready_age_seconds (how long the longest-waiting due
      ready task has waited; 0 if none), leases_past_half, wal_segments,
      compact_wal_bytes (the compaction threshold), fsyncs_total,
      fsync_seconds_total, fsync_p50/p99_seconds and requests_per_fsync
      (over fsync_window recent fsyncs of the last minute; - if none),
      requests_total, write_failures_total, compactions_total,
      last_compaction_seconds, connections, parked_reserves, paused,
      uptime_seconds, start_time_seconds, last_recovery_seconds, directory.
    docs/metrics.md defines each one and what to alert on. With --dsn, the
    queue's counts only (last_seq, snapshot_seq and wal_bytes are 0).
    """
    if ctl.dsn is not None:
        fields = dataclasses.asdict(ctl.client.stats())
    else:
        fields = stats_fields(ctl.client.daemon_stats())
    if as_json:
        emit(fields)
        return
    table([[name, _cell(value)] for name, value in fields.items()])


@command(*DAEMON_CODES)
@json_option("Print the report as `stats --json` does instead; errors as JSON on stderr.")
@pass_ctl
def metrics(ctl: Ctl, as_json: bool) -> None:
    """Print the daemon's report in the Prometheus text format.

    For node_exporter's textfile collector, write it atomically, e.g.
    `walqueue-ctl metrics > DIR/walqueue.prom.tmp && mv DIR/walqueue.prom.tmp
    DIR/walqueue.prom` from a timer. `walqueued serve --metrics-listen`
    serves the same text over HTTP.
    """
    report = ctl.client.daemon_stats()
    if as_json:
        emit(stats_fields(report))
        return
    click.echo(render_prometheus(report), nl=False)


@command(*DAEMON_CODES, name="top", short_help="A live view of the daemon, refreshed every second.")
@click.option("--interval", type=click.FloatRange(0.1, 3600), default=1.0, show_default=True,
              help="Seconds between refreshes.")
@click.option("--count", type=click.IntRange(min=1), default=None,
              help="Stop after this many refreshes [default: until q or Ctrl-C].")
@json_option("Print each refresh's figures as one JSON line (no screen handling); errors as "
             "JSON on stderr.")
@pass_ctl
def top_command(ctl: Ctl, interval: float, count: int | None, as_json: bool) -> None:
    """A live view: task counts, rates, oldest ready age, fsync p99,
    requests per fsync, connections, parked reserves.

    Press q (or Ctrl-C) to quit. Rates are per second between two refreshes.
    On a terminal the view redraws in place; piped, each refresh is printed
    after the previous one. A daemon that goes away is shown, and the view
    reconnects when it is back.
    """
    first = ctl.client.daemon_stats()  # fail at once (exit 3) if there is no daemon

    def sample() -> DaemonStats | str:
        try:
            return ctl.client.daemon_stats()
        except CtlError as exc:  # shown in the view, which keeps trying
            return exc.format_message().splitlines()[0]

    top.run(first, sample, interval=interval, count=count, as_json=as_json)


# -- maintenance ------------------------------------------------------------------


@command(*DAEMON_CODES)
@click.argument("task_ids", nargs=-1, required=True, metavar="TASK_ID...")
@json_option(JSON_ALREADY)
@pass_ctl
def revive(ctl: Ctl, task_ids: tuple[str, ...], as_json: bool) -> None:
    """Make dead tasks ready again (attempts reset). Prints {"task_ids": [...]}.

    All or nothing: if one listed task is not dead, none is revived (exit 2).
    """
    emit({"task_ids": ctl.client.revive(list(task_ids))})


@command(*DAEMON_CODES)
@json_option(JSON_ALREADY)
@pass_ctl
def compact(ctl: Ctl, as_json: bool) -> None:
    """Snapshot the queue now and drop the WAL it covers. Prints {"seq": S}.

    The daemon serves nothing while it compacts (about 1.3 s per 100,000
    live tasks on the development machine); it also compacts on its own
    past --compact-wal-bytes.
    """
    emit({"seq": ctl.client.compact()})


@command(*DAEMON_CODES, short_help='Stop handing out tasks until resume.')
@json_option(JSON_ALREADY)
@pass_ctl
def pause(ctl: Ctl, as_json: bool) -> None:
    """Stop handing out tasks: every reserve gets nothing (waiting ones wait).

    Puts, acks, releases, touches and revives go on, so running workers
    finish what they hold. For deploying new worker code (docs/upgrades.md).
    The pause lives in the daemon's memory: a daemon restart resumes.
    Prints {"paused": true}.
    """
    emit({"paused": ctl.client.pause()})


@command(*DAEMON_CODES, short_help='Hand out tasks again.')
@json_option(JSON_ALREADY)
@pass_ctl
def resume(ctl: Ctl, as_json: bool) -> None:
    """Hand out tasks again; waiting reserves are served first, in arrival order.

    Prints {"paused": false}.
    """
    emit({"paused": ctl.client.resume()})


def check_parent(dest: str) -> None:
    """A DEST to be created needs an existing parent directory (usage error, exit 2)."""
    parent = os.path.dirname(os.path.abspath(dest))
    if not os.path.isdir(parent):
        what = "is not a directory" if os.path.exists(parent) else "does not exist"
        raise CtlError(f"the parent of DEST, {display.name(parent)}, {what}; create it first "
                       f"(mkdir -p), or give another DEST. Nothing was written.", EXIT_USAGE,
                       "UsageError")


@command(*DAEMON_CODES, EXIT_CORRUPT, EXIT_UNREADABLE, EXIT_DEST_NOT_EMPTY, EXIT_BACKUP_INCOMPLETE,
         short_help='Copy the queue, consistent, into DEST while it serves.')
@click.argument("dest", type=click.Path())
@json_option('Print {"seq", "files", "bytes", "directory"} as one JSON object; errors as JSON '
             'on stderr.')
@pass_ctl
def backup(ctl: Ctl, dest: str, as_json: bool) -> None:
    """Copy the daemon's queue, consistent as of one seq, into DEST while it serves.

    DEST must not exist (it is created, mode 0750, in an existing parent) or
    be an empty directory. The daemon makes everything durable and pins the
    files of the copy (it compacts nothing meanwhile); this command reads
    them from the daemon's directory, so run it as the daemon's user or a
    member of its group. Files are fsynced, CURRENT last, then DEST is
    verified like `verify DEST`. Restore: docs/backup.md.
    """
    try:
        if check_destination(dest):  # before the daemon pins anything
            check_parent(dest)
    except DestinationNotEmpty as exc:
        raise CtlError(str(exc), EXIT_DEST_NOT_EMPTY, type(exc).__name__) from None
    manifest = ctl.client.backup_begin()
    try:
        result = copy_manifest(manifest, dest)
    except DestinationNotEmpty as exc:
        raise CtlError(str(exc), EXIT_DEST_NOT_EMPTY, type(exc).__name__) from None
    except SourceUnreadable as exc:
        if isinstance(exc.__cause__, PermissionError):
            advice = ("Run backup as the daemon's user or as a member of its group (the queue "
                      "directory is 0750, its files 0640)")
        else:
            advice = (f"The daemon's directory {display.name(manifest.directory)} must be "
                      f"reachable at the same path from here; if it is, the daemon restarted "
                      f"during the backup: run backup again")
        raise CtlError(f"{exc}\n{advice}. Nothing was written to {display.name(dest)}.",
                       EXIT_UNREADABLE, type(exc).__name__) from None
    except BackupIncomplete as exc:
        raise CtlError(str(exc), EXIT_BACKUP_INCOMPLETE, type(exc).__name__) from None
    except BackupError as exc:  # a DEST inside the queue directory, or a bad manifest
        raise CtlError(f"{exc}\nNothing was written.", EXIT_USAGE, type(exc).__name__) from None
    finally:
        end_backup(ctl)
    report = verify_directory(result.directory)
    if report.corrupt or report.unreadable:
        click.echo(report.render(), err=True)
        raise CtlError(f"the copy in {display.name(result.directory)} does not verify (above); "
                       f"delete it and run backup again, and keep the daemon's log",
                       EXIT_CORRUPT, "CorruptStore")
    if as_json:
        emit(result.to_json())
    else:
        click.echo(f"backed up seq {result.seq} ({result.files} files, {result.bytes} bytes) "
                   f"into {display.name(result.directory)}; it verifies")


def end_backup(ctl: Ctl) -> None:
    """Release the daemon's pin; a lost connection has released it already."""
    try:
        ctl.client.backup_end()
    except CtlError as exc:
        # The copy does not depend on it: every file was opened while pinned,
        # and an open file stays readable even if compaction deletes it.
        click.echo(f"note: ending the backup pin: {exc.format_message().splitlines()[0]} "
                   f"(the pin ends with the connection)", err=True)


@command(EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_UNAVAILABLE,
         short_help="Create or upgrade the walqueue schema on PostgreSQL (--dsn).")
@json_option(JSON_ALREADY)
@pass_ctl
def migrate(ctl: Ctl, as_json: bool) -> None:
    """Create or upgrade the walqueue schema in the --dsn database. Prints {"schema_version": N}.

    Run it as a role that may create the schema (a worker role needs no
    DDL: docs/postgres.md lists its grants). Safe to run from several hosts
    at once, and again: an up-to-date schema is left as it is. A schema newer
    than this walqueue knows is refused, naming both versions.
    """
    if ctl.dsn is None:
        raise CtlError("migrate is for a queue on PostgreSQL: give --dsn URL (or WALQUEUE_DSN); "
                       "walqueued's directory needs no migration", EXIT_USAGE, "UsageError")
    backend = postgres_backend()
    try:
        version = backend.migrate(ctl.dsn)
    except (WalQueueError, OSError) as exc:
        raise error_for(exc, ctl.socket_path, ctl.dsn) from exc
    emit({"schema_version": version})


# -- schedule (the body is walqueue.schedule.show's) ------------------------------

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


# -- verify (offline) -------------------------------------------------------------

@command(EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_CORRUPT, EXIT_UNREADABLE, EXIT_NO_QUEUE,
         short_help='Check a queue directory offline.')
@click.argument("directory", type=click.Path(file_okay=False))
@json_option("Print the report as one JSON object; errors as JSON on stderr.")
def verify(directory: str, as_json: bool) -> None:
    """Check a queue DIRECTORY offline (no daemon; nothing is changed or locked).

    Checks CURRENT, its snapshot, every WAL frame (checksum, canonical JSON,
    seq continuity, records valid against the state) and lists every
    problem with its file and offset. Exit 0 when the directory would open
    (a torn tail is reported, not an error), 4 when it is corrupt, 8 when a
    file cannot be read, 11 when it holds no queue (it names subdirectories
    that do). On a terminal a progress bar on stderr shows the bytes read.

    Run it on a stopped daemon's directory or on a copy (a live daemon may be
    mid-append, which looks like a torn tail). `python -m walqueue.verify`
    is the same check with the standard library only. How to read the
    report: docs/operations.md, "Reading verify output".
    """
    try:
        with _progress_bar_on_a_terminal("verifying") as progress:
            report = verify_directory(directory, progress=progress)
    except FileNotFoundError:
        raise CtlError(f"{display.name(directory)} does not exist; give the daemon's queue "
                       f"directory (e.g. /var/lib/walqueue)", EXIT_UNREADABLE, "Unreadable") from None
    except OSError as exc:
        raise CtlError(f"cannot read {display.name(directory)}: {exc.strerror or exc}; run verify "
                       f"as a user in the daemon's group (the directory is 0750, files 0640)",
                       EXIT_UNREADABLE, "Unreadable") from None
    if as_json:
        emit(report.to_json())
    else:
        click.echo(report.render())   # escaped there: file names come from the directory
    if report.exit_code() != EXIT_OK:
        sys.exit(report.exit_code())


@contextlib.contextmanager
def _progress_bar_on_a_terminal(label: str) -> Iterator[Callable[[int, int], None] | None]:
    """A progress(done, total) callback drawing click's bar on stderr; None unless stderr is a terminal."""
    if not sys.stderr.isatty():
        yield None
        return
    with contextlib.ExitStack() as stack:
        bar = None

        def progress(done: int, total: int) -> None:
            nonlocal bar
            if bar is None:
                bar = stack.enter_context(click.progressbar(length=total, label=label,
                                                            file=sys.stderr))
            bar.length = total  # a live owner may have grown a segment
            bar.update(done - bar.pos)

        yield progress


def main() -> None:
    """Console-script entry point (`walqueue-ctl`)."""
    # The program name fixes the completion variable: _WALQUEUE_CTL_COMPLETE.
    cli.main(prog_name="walqueue-ctl")


if __name__ == "__main__":
    main()
