"""walqueue-ctl: the operator's command line for walqueued (SPEC §8).

A thin layer over `walqueue.client.Client`: each command is one or a few
client calls, its output is data (JSON, one object per line) or a report
(`stats`, `dead` and `verify` print tables unless `--json`), and every
failure maps to one documented exit code with a message that says what to
do next. `verify` is the exception: it talks to no daemon and reads a
directory offline through `walqueue.verify` (read-only; no lock taken).

The group builds one `Ctl` context object (where the daemon is, how long to
wait for it) that the commands share; the client is created on first use, so
`verify` and `--help` never touch a socket.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Iterator
from typing import Any

import click

from walqueue import (
    CorruptStore,
    InvalidRequest,
    KeyConflict,
    QueueClosed,
    StaleLease,
    WalQueueError,
)
from walqueue.backup import (
    BackupError,
    BackupIncomplete,
    DestinationNotEmpty,
    SourceUnreadable,
    check_destination,
    copy_manifest,
)
from walqueue.client import SOCKET_NAME, Client, DaemonUnavailable
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

DEFAULT_SOCKET = "/run/walqueue/walqueued.sock"  # where systemd/walqueued.service puts it
DEFAULT_TIMEOUT_SECONDS = 30.0
PAYLOAD_COLUMN_CHARS = 60

EXIT_CODES_HELP = """\b
Exit codes:
  0  success (also: reserve that leased nothing; verify of a healthy
     directory, torn tail included)
  1  failure: the daemon could not make the request durable (a failed
     write; it reopened its queue; retry) or an unexpected error
  2  usage error or invalid input (bad option, malformed JSON, a request
     the queue rejects as InvalidRequest); nothing was written
  3  the daemon is unavailable (not running, wrong socket, no permission,
     or the connection broke before the answer)
  4  corrupt: verify found corruption (the daemon would refuse to start),
     or the copy backup made does not verify
  5  stale lease: ack/release/touch with a lease that is not current
  6  key conflict: put with a key or task id already used differently
  7  not found: get of an unknown task
  8  verify or backup could not read the queue directory or one of its
     files (run as the daemon's user or a member of its group)
  9  backup: DEST exists and is not an empty directory (nothing written)
 10  backup: the copy failed half way; DEST is incomplete (it will not
     open as a queue): delete it and run backup again
 11  verify: the directory holds no queue (empty, or e.g. the parent of
     queue directories, which it names)
\b
Where the daemon is: --socket PATH, or --dir DIRECTORY (its walqueued.sock),
or $WALQUEUE_SOCKET; default /run/walqueue/walqueued.sock.
"""


class CtlError(click.ClickException):
    """An error with its exit code; click prints `Error: <message>` to stderr."""

    def __init__(self, message: str, exit_code: int) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def error_for(exc: BaseException, socket_path: str) -> CtlError:
    """The exit code and next-step message for a library or client exception."""
    if isinstance(exc, (DaemonUnavailable, ConnectionError)):
        return CtlError(f"{exc}\nIs walqueued running and is {socket_path} its socket? Start it "
                        f"(systemctl start walqueued, or walqueued serve DIRECTORY), or point "
                        f"--socket, --dir or WALQUEUE_SOCKET at it.", EXIT_UNAVAILABLE)
    if isinstance(exc, StaleLease):
        if exc.status is None:
            now = "is unknown to the daemon"
        else:
            now = f"is now {exc.status} at generation {exc.generation}"
        return CtlError(f"{exc}\nThe task {now}. The lease is no longer yours: reserve again "
                        f"(a retried ack that finds the task completed at your own generation "
                        f"means the first ack succeeded).", EXIT_STALE_LEASE)
    if isinstance(exc, KeyConflict):
        return CtlError(f"{exc}\nUse a new task id and key, or repeat the original request exactly "
                        f"(an identical put is idempotent).", EXIT_KEY_CONFLICT)
    if isinstance(exc, InvalidRequest):
        return CtlError(f"{exc}\nNothing was written; fix the request.", EXIT_USAGE)
    if isinstance(exc, QueueClosed):
        return CtlError(f"{exc}\nThe daemon failed to write (disk full? I/O error?) and reopened "
                        f"its queue, so this request may or may not have been applied. Check its "
                        f"log, then retry: a put is idempotent, and an ack that then finds the task "
                        f"completed at your generation had succeeded.", EXIT_FAILURE)
    if isinstance(exc, CorruptStore):
        return CtlError(f"{exc}\nRun walqueue-ctl verify on the daemon's directory.", EXIT_CORRUPT)
    return CtlError(f"{type(exc).__name__}: {exc}", EXIT_FAILURE)


@dataclasses.dataclass
class Ctl:
    """The group's context object: where the daemon is and one lazily opened Client."""

    socket_path: str
    timeout: float
    client_factory: Callable[..., Any] = Client
    _client: Any = None

    @property
    def client(self):
        if self._client is None:
            self._client = self.client_factory(self.socket_path, timeout=self.timeout,
                                               retry_seconds=0, name="walqueue-ctl")
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None

    def call(self, method: str, *args, **kwargs):
        """Call a Client method, turning its exceptions into CtlErrors."""
        try:
            return getattr(self.client, method)(*args, **kwargs)
        except (WalQueueError, OSError) as exc:
            raise error_for(exc, self.socket_path) from exc


# Tests replace this to run the commands against a fake daemon.
CLIENT_FACTORY: Callable[..., Any] = Client


def emit(value: Any) -> None:
    """Print one JSON value on one line (dataclasses as objects)."""
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        value = dataclasses.asdict(value)
    click.echo(json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(",", ":")))


def parse_json_object(text: str, what: str) -> dict:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise CtlError(f"{what} is not valid JSON: {exc}", EXIT_USAGE) from None
    if not isinstance(value, dict):
        raise CtlError(f"{what} must be a JSON object, not {type(value).__name__}", EXIT_USAGE)
    return value


@click.group(epilog=EXIT_CODES_HELP, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("--socket", "socket_path", envvar="WALQUEUE_SOCKET", type=click.Path(dir_okay=True),
              help="walqueued's socket (or its directory). [env: WALQUEUE_SOCKET]")
@click.option("--dir", "directory", type=click.Path(file_okay=False),
              help="The daemon's queue DIRECTORY: use DIRECTORY/walqueued.sock.")
@click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=DEFAULT_TIMEOUT_SECONDS,
              show_default=True, help="Seconds to wait for each answer (plus --wait for reserve).")
@click.pass_context
def cli(ctx: click.Context, socket_path: str | None, directory: str | None, timeout: float) -> None:
    """Operate walqueued, the WALQueue daemon, and verify queue directories.

    Data is printed as JSON, one object per line, so that
    `walqueue-ctl reserve w | walqueue-ctl ack -` works.
    """
    if directory is not None and ctx.get_parameter_source("socket_path") == \
            click.core.ParameterSource.COMMANDLINE:
        raise click.UsageError("give --socket or --dir, not both")
    if directory is not None:
        path = os.path.join(directory, SOCKET_NAME)
    else:
        path = socket_path or DEFAULT_SOCKET
    ctl = Ctl(path, timeout, CLIENT_FACTORY)
    ctx.obj = ctl
    ctx.call_on_close(ctl.close)


pass_ctl = click.make_pass_decorator(Ctl)


# -- tasks in ---------------------------------------------------------------------


@cli.command(epilog=EXIT_CODES_HELP, short_help='Put a task (idempotent by key).')
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
@pass_ctl
def put(ctl: Ctl, task_id: str, payload: str, key: str | None, delay: int | None,
        available_at: int | None, max_attempts: int) -> None:
    """Put a task; PAYLOAD_JSON is a JSON object ('-' reads it from stdin; default {}).

    Prints {"task_id": ...}. Putting the identical request again is a no-op
    that prints the same id.
    """
    if delay is not None and available_at is not None:
        raise click.UsageError("give --delay or --available-at, not both")
    text = sys.stdin.read() if payload == "-" else payload
    value = parse_json_object(text, "the payload" + (" on stdin" if payload == "-" else ""))
    task = ctl.call("put", task_id, value, key=key, available_at=available_at or 0,
                    delay=delay, max_attempts=max_attempts)
    emit({"task_id": task})


# -- leases -----------------------------------------------------------------------


@cli.command(epilog=EXIT_CODES_HELP, short_help='Lease due tasks for WORKER.')
@click.argument("worker")
@click.option("--lease-seconds", type=click.IntRange(min=1), default=30, show_default=True,
              help="Lease length. The daemon's clock is whole seconds, so a lease of L seconds "
                   "lasts between L-1 and L seconds of wall time.")
@click.option("--limit", type=click.IntRange(1, 1000), default=1, show_default=True,
              help="At most this many tasks in one lease batch.")
@click.option("--wait", type=click.FloatRange(0, 300), default=0, show_default=True,
              help="Seconds to wait for a task to become due.")
@pass_ctl
def reserve(ctl: Ctl, worker: str, lease_seconds: int, limit: int, wait: float) -> None:
    """Lease up to --limit due tasks for WORKER; prints one lease JSON per line.

    Prints nothing (exit 0) when no task was due within --wait seconds.
    """
    for lease in ctl.call("reserve", worker, lease_seconds=lease_seconds, limit=limit, wait=wait):
        emit(lease)


@dataclasses.dataclass(frozen=True)
class LeaseRef:
    """What ack/release/touch need of a lease."""

    task_id: str
    worker: str
    generation: int


def leases_from(source: str, worker: str | None, generation: int | None) -> Iterator[tuple[str, LeaseRef | CtlError]]:
    """(where, lease or the error in that input) for `-` (stdin lines) or one TASK_ID."""
    if source != "-":
        if worker is None or generation is None:
            raise click.UsageError("give --worker and --generation with a TASK_ID (or '-' to read "
                                   "leases as JSON lines from stdin)")
        yield source, LeaseRef(source, worker, generation)
        return
    if worker is not None or generation is not None:
        raise click.UsageError("--worker and --generation go with a TASK_ID, not with '-'")
    for number, line in enumerate(sys.stdin, 1):
        if not line.strip():
            continue
        where = f"stdin line {number}"
        try:
            value = parse_json_object(line, where)
            task_id, lease_worker, lease_generation = (value.get("task_id"), value.get("worker"),
                                                       value.get("generation"))
            if not (isinstance(task_id, str) and isinstance(lease_worker, str)
                    and type(lease_generation) is int):
                raise CtlError(f"{where} is not a lease: it needs \"task_id\" and \"worker\" "
                               f"strings and an integer \"generation\" (as reserve prints)",
                               EXIT_USAGE)
        except CtlError as exc:
            yield where, exc
            continue
        yield where, LeaseRef(task_id, lease_worker, lease_generation)


def for_each_lease(ctl: Ctl, source: str, worker: str | None, generation: int | None,
                   action: Callable[[LeaseRef], None]) -> None:
    """Run `action` on every lease; with '-', go on after a failed line and exit
    with the code of the first failure (each failure is reported on stderr)."""
    first_failure: CtlError | None = None
    for where, lease in leases_from(source, worker, generation):
        try:
            if isinstance(lease, CtlError):
                raise lease
            action(lease)
        except CtlError as exc:
            if source != "-":
                raise
            click.echo(f"Error: {where}: {exc.format_message()}", err=True)
            first_failure = first_failure or exc
            if exc.exit_code == EXIT_UNAVAILABLE:
                break  # every later line would fail the same way
    if first_failure is not None:
        ctx = click.get_current_context()
        ctx.exit(first_failure.exit_code)


def lease_arguments(command):
    command = click.option("--generation", type=click.IntRange(min=0), default=None,
                           help="The lease's generation (with TASK_ID).")(command)
    command = click.option("--worker", default=None, help="The lease's worker (with TASK_ID).")(command)
    return click.argument("lease", metavar="(- | TASK_ID)")(command)


@cli.command(epilog=EXIT_CODES_HELP, short_help='Complete leased tasks.')
@lease_arguments
@pass_ctl
def ack(ctl: Ctl, lease: str, worker: str | None, generation: int | None) -> None:
    """Complete leased tasks: TASK_ID --worker W --generation G, or '-' to read
    the lease JSON lines `reserve` prints from stdin. Prints nothing."""
    for_each_lease(ctl, lease, worker, generation, lambda ref: ctl.call("ack", ref))


@cli.command(epilog=EXIT_CODES_HELP, short_help='Give leased tasks back, due again after --delay.')
@lease_arguments
@click.option("--delay", type=click.IntRange(min=0), default=0, show_default=True,
              help="Seconds before the task is due again.")
@pass_ctl
def release(ctl: Ctl, lease: str, worker: str | None, generation: int | None, delay: int) -> None:
    """Give leased tasks back (dead once out of attempts): TASK_ID --worker W
    --generation G, or '-' for lease JSON lines on stdin. Prints nothing."""
    for_each_lease(ctl, lease, worker, generation,
                   lambda ref: ctl.call("release", ref, delay=delay))


@cli.command(epilog=EXIT_CODES_HELP, short_help='Extend live leases.')
@lease_arguments
@click.option("--lease-seconds", type=click.IntRange(min=1), required=True,
              help="The new deadline, in seconds from the daemon's now.")
@pass_ctl
def touch(ctl: Ctl, lease: str, worker: str | None, generation: int | None, lease_seconds: int) -> None:
    """Extend live leases: TASK_ID --worker W --generation G, or '-' for lease
    JSON lines on stdin. Prints each new lease as a JSON line."""
    for_each_lease(ctl, lease, worker, generation,
                   lambda ref: emit(ctl.call("touch", ref, lease_seconds=lease_seconds)))


# -- inspection and maintenance ---------------------------------------------------


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("task_id")
@pass_ctl
def get(ctl: Ctl, task_id: str) -> None:
    """Print one task as JSON (exit 7 if there is no such task)."""
    task = ctl.call("get", task_id)
    if task is None:
        raise CtlError(f"no task {task_id!r} in the queue (completed and dead tasks stay "
                       f"listed, so it was never put)", EXIT_NOT_FOUND)
    emit(task)


def table(rows: list[list[str]]) -> None:
    widths = [max(len(row[column]) for row in rows) for column in range(len(rows[0]))]
    for row in rows:
        click.echo("  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip())


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
    return str(value).lower() if isinstance(value, bool) else str(value)


@cli.command(epilog=EXIT_CODES_HELP)
@click.option("--json", "as_json", is_flag=True,
              help="Print the report as one JSON object (the queue's stats keys at the top level).")
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
    docs/metrics.md defines each one and what to alert on.
    """
    fields = stats_fields(ctl.call("daemon_stats"))
    if as_json:
        emit(fields)
        return
    table([[name, _cell(value)] for name, value in fields.items()])


@cli.command(epilog=EXIT_CODES_HELP)
@pass_ctl
def metrics(ctl: Ctl) -> None:
    """Print the daemon's report in the Prometheus text format.

    For node_exporter's textfile collector, write it atomically, e.g.
    `walqueue-ctl metrics > DIR/walqueue.prom.tmp && mv DIR/walqueue.prom.tmp
    DIR/walqueue.prom` from a timer. `walqueued serve --metrics-listen`
    serves the same text over HTTP.
    """
    click.echo(render_prometheus(ctl.call("daemon_stats")), nl=False)


@cli.command(epilog=EXIT_CODES_HELP)
@click.option("--json", "as_json", is_flag=True, help="Print each dead task as a JSON line.")
@pass_ctl
def dead(ctl: Ctl, as_json: bool) -> None:
    """List dead tasks (out of attempts); bring them back with `revive`."""
    tasks = ctl.call("tasks", "dead")
    if as_json:
        for task in tasks:
            emit(task)
        return
    if not tasks:
        click.echo("no dead tasks")
        return
    rows = [["TASK_ID", "KEY", "ATTEMPTS", "GENERATION", "AVAILABLE_AT", "PAYLOAD"]]
    for task in tasks:
        payload = json.dumps(task.payload, ensure_ascii=False, sort_keys=True, separators=(",", ":"))
        if len(payload) > PAYLOAD_COLUMN_CHARS:
            payload = payload[:PAYLOAD_COLUMN_CHARS - 3] + "..."
        rows.append([task.task_id, task.key, f"{task.attempts}/{task.max_attempts}",
                     str(task.generation), str(task.available_at), payload])
    table(rows)


@cli.command(epilog=EXIT_CODES_HELP)
@click.argument("task_ids", nargs=-1, required=True, metavar="TASK_ID...")
@pass_ctl
def revive(ctl: Ctl, task_ids: tuple[str, ...]) -> None:
    """Make dead tasks ready again (attempts reset). Prints {"task_ids": [...]}.

    All or nothing: if one listed task is not dead, none is revived (exit 2).
    """
    emit({"task_ids": ctl.call("revive", list(task_ids))})


@cli.command(epilog=EXIT_CODES_HELP)
@pass_ctl
def compact(ctl: Ctl) -> None:
    """Snapshot the queue now and drop the WAL it covers. Prints {"seq": S}.

    The daemon serves nothing while it compacts (about 1.3 s per 100,000
    live tasks on the development machine); it also compacts on its own
    past --compact-wal-bytes.
    """
    emit({"seq": ctl.call("compact")})


@cli.command(epilog=EXIT_CODES_HELP, short_help='Stop handing out tasks until resume.')
@pass_ctl
def pause(ctl: Ctl) -> None:
    """Stop handing out tasks: every reserve gets nothing (waiting ones wait).

    Puts, acks, releases, touches and revives go on, so running workers
    finish what they hold. For deploying new worker code (docs/upgrades.md).
    The pause lives in the daemon's memory: a daemon restart resumes.
    Prints {"paused": true}.
    """
    emit({"paused": ctl.call("pause")})


@cli.command(epilog=EXIT_CODES_HELP, short_help='Hand out tasks again.')
@pass_ctl
def resume(ctl: Ctl) -> None:
    """Hand out tasks again; waiting reserves are served first, in arrival order.

    Prints {"paused": false}.
    """
    emit({"paused": ctl.call("resume")})


@cli.command(epilog=EXIT_CODES_HELP, short_help='Copy the queue, consistent, into DEST while it serves.')
@click.argument("dest", type=click.Path())
@click.option("--json", "as_json", is_flag=True,
              help='Print {"seq", "files", "bytes", "directory"} as one JSON object.')
@pass_ctl
def backup(ctl: Ctl, dest: str, as_json: bool) -> None:
    """Copy the daemon's queue, consistent as of one seq, into DEST while it serves.

    DEST must not exist (it is created, mode 0750) or be an empty directory.
    The daemon makes everything durable and pins the files of the copy (it
    compacts nothing meanwhile); this command reads them from the daemon's
    directory, so run it as the daemon's user or a member of its group. Files
    are fsynced, CURRENT last, then DEST is verified like `verify DEST`.
    Restore: docs/backup.md.
    """
    try:
        check_destination(dest)  # before the daemon pins anything
    except DestinationNotEmpty as exc:
        raise CtlError(str(exc), EXIT_DEST_NOT_EMPTY) from None
    manifest = ctl.call("backup_begin")
    try:
        result = copy_manifest(manifest, dest)
    except DestinationNotEmpty as exc:
        raise CtlError(str(exc), EXIT_DEST_NOT_EMPTY) from None
    except SourceUnreadable as exc:
        if isinstance(exc.__cause__, PermissionError):
            advice = ("Run backup as the daemon's user or as a member of its group (the queue "
                      "directory is 0750, its files 0640)")
        else:
            advice = (f"The daemon's directory {manifest.directory} must be reachable at the "
                      f"same path from here; if it is, the daemon restarted during the backup: "
                      f"run backup again")
        raise CtlError(f"{exc}\n{advice}. Nothing was written to {dest}.", EXIT_UNREADABLE) from None
    except BackupIncomplete as exc:
        raise CtlError(str(exc), EXIT_BACKUP_INCOMPLETE) from None
    except BackupError as exc:  # a DEST inside the queue directory, or a bad manifest
        raise CtlError(f"{exc}\nNothing was written.", EXIT_USAGE) from None
    finally:
        end_backup(ctl)
    report = verify_directory(result.directory)
    if report.corrupt or report.unreadable:
        click.echo(report.render(), err=True)
        raise CtlError(f"the copy in {result.directory} does not verify (above); delete it and "
                       f"run backup again, and keep the daemon's log", EXIT_CORRUPT)
    if as_json:
        emit(result.to_json())
    else:
        click.echo(f"backed up seq {result.seq} ({result.files} files, {result.bytes} bytes) "
                   f"into {result.directory}; it verifies")


def end_backup(ctl: Ctl) -> None:
    """Release the daemon's pin; a lost connection has released it already."""
    try:
        ctl.client.backup_end()
    except (WalQueueError, OSError) as exc:
        # The copy does not depend on it: every file was opened while pinned,
        # and an open file stays readable even if compaction deletes it.
        click.echo(f"note: ending the backup pin: {exc} (the pin ends with the connection)",
                   err=True)


# -- verify (offline) -------------------------------------------------------------

@cli.command(epilog=EXIT_CODES_HELP, short_help='Check a queue directory offline.')
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--json", "as_json", is_flag=True, help="Print the report as one JSON object.")
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
        raise CtlError(f"{directory} does not exist; give the daemon's queue directory "
                       f"(e.g. /var/lib/walqueue)", EXIT_UNREADABLE) from None
    except OSError as exc:
        raise CtlError(f"cannot read {directory}: {exc.strerror or exc}; run verify as a user "
                       f"in the daemon's group (the directory is 0750, files 0640)",
                       EXIT_UNREADABLE) from None
    if as_json:
        emit(report.to_json())
    else:
        click.echo(report.render())
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
    cli()


if __name__ == "__main__":
    main()
