"""walqueue-ctl's operator commands: the daemon's report (stats, metrics, top), and
keeping it (compact, pause, resume, backup)."""

from __future__ import annotations

import dataclasses
import os
from typing import Any

import click

from walqueue import display
from walqueue.backend import BACKUP, COMPACT, DAEMON_STATS, PAUSE
from walqueue.backup import (
    BackupError,
    BackupIncomplete,
    DestinationNotEmpty,
    SourceUnreadable,
    check_destination,
    copy_manifest,
)
from walqueue.ctl import top
from walqueue.ctl.backends import Ctl
from walqueue.ctl.errors import (
    DAEMON_CODES,
    EXIT_BACKUP_INCOMPLETE,
    EXIT_CORRUPT,
    EXIT_DEST_NOT_EMPTY,
    EXIT_UNREADABLE,
    EXIT_USAGE,
    CtlError,
)
from walqueue.ctl.group import JSON_ALREADY, command, json_option, pass_ctl
from walqueue.ctl.output import cell, emit, table
from walqueue.metrics import DaemonStats, render_prometheus
from walqueue.verify import verify_directory

# The queue's WAL figures: always 0 on a backend without a WAL of its own (it cannot
# compact), so its stats table leaves them out; --json keeps every key.
WAL_FIELDS = ("last_seq", "snapshot_seq", "wal_bytes")


def stats_fields(report: DaemonStats) -> dict[str, Any]:
    """The report flat: the QueueStats keys first (as `stats --json` always had), then the rest."""
    fields = dataclasses.asdict(report.queue)
    fields.update((field.name, getattr(report, field.name))
                  for field in dataclasses.fields(report) if field.name != "queue")
    return fields


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
    table shows the queue's counts only; --json also gives last_seq,
    snapshot_seq and wal_bytes, which are 0 there.
    """
    if DAEMON_STATS in ctl.capabilities:
        fields = stats_fields(ctl.client.daemon_stats())
    else:
        fields = dataclasses.asdict(ctl.client.stats())
    if as_json:
        emit(fields)
        return
    hidden = () if COMPACT in ctl.capabilities else WAL_FIELDS
    table([[name, cell(value)] for name, value in fields.items() if name not in hidden])


@command(*DAEMON_CODES, needs=DAEMON_STATS)
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


@command(*DAEMON_CODES, name="top", short_help="A live view of the daemon, refreshed every second.",
         needs=DAEMON_STATS)
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


@command(*DAEMON_CODES, needs=COMPACT)
@json_option(JSON_ALREADY)
@pass_ctl
def compact(ctl: Ctl, as_json: bool) -> None:
    """Snapshot the queue now and drop the WAL it covers. Prints {"seq": S}.

    The daemon serves nothing while it compacts (about 1.3 s per 100,000
    live tasks on the development machine); it also compacts on its own
    past --compact-wal-bytes.
    """
    emit({"seq": ctl.client.compact()})


@command(*DAEMON_CODES, short_help='Stop handing out tasks until resume.', needs=PAUSE)
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


@command(*DAEMON_CODES, short_help='Hand out tasks again.', needs=PAUSE)
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
         short_help='Copy the queue, consistent, into DEST while it serves.', needs=BACKUP)
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
    except KeyboardInterrupt:
        raise interrupted(dest) from None
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


def interrupted(dest: str) -> CtlError:
    """What a Ctrl-C during the copy left in DEST (copy_manifest has cleaned up what it could)."""
    if not os.path.lexists(dest):
        left = f"the partial copy {display.name(dest)} was removed"
    elif os.path.isdir(dest) and not os.listdir(dest):
        left = f"{display.name(dest)} is empty again"
    else:
        left = (f"{display.name(dest)} is incomplete (verify says so): delete it")
    return CtlError(f"backup interrupted: {left}; nothing was backed up. The queue itself is "
                    f"not affected: run backup again.", EXIT_BACKUP_INCOMPLETE, "Interrupted")


def end_backup(ctl: Ctl) -> None:
    """Release the daemon's pin; a lost connection has released it already."""
    try:
        ctl.client.backup_end()
    except CtlError as exc:
        # The copy does not depend on it: every file was opened while pinned,
        # and an open file stays readable even if compaction deletes it.
        click.echo(f"note: ending the backup pin: {exc.format_message().splitlines()[0]} "
                   f"(the pin ends with the connection)", err=True)
