"""walqueue-ctl's exit codes and errors: every failure is one documented code and a
message that says what to do next.

`CtlError` carries the code (click prints `Error: <message>` to stderr);
`error_for` maps a library or client exception to one; `JsonError` shows any
error as one JSON object on stderr under `--json`. The codes' meanings are
here too, pre-wrapped for `--help`.
"""

from __future__ import annotations

import os
import stat
from typing import Any

import click

from walqueue import (
    CorruptStore,
    InvalidRequest,
    KeyConflict,
    QueueClosed,
    StaleLease,
    Unavailable,
    display,
    paths,
)
from walqueue.client import DaemonUnavailable
from walqueue.dsn import redacted

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
EXIT_PAUSED = 12

DEFAULT_SOCKET = paths.PLAIN_SOCKET  # where systemd/walqueued.service puts it

# Each code's meaning, pre-wrapped for --help: the whole table in the
# group's help, each command's own codes in its help.
EXIT_MEANINGS = {
    EXIT_OK: "success (also: reserve that leased nothing from a queue that is not\n"
             "     paused; verify of a healthy directory, torn tail included)",
    EXIT_FAILURE: "failure: the daemon could not make the request durable (a failed\n"
                  "     write; it reopened its queue; retry) or an unexpected error",
    EXIT_USAGE: "usage error or invalid input (bad option, malformed JSON, a request\n"
                "     the queue rejects as InvalidRequest); nothing was written",
    EXIT_UNAVAILABLE: "the daemon is unavailable (not running, wrong socket, no permission,\n"
                      "     or the connection broke before the answer); with --dsn also a\n"
                      "     database that refuses the connection (no such database, bad login)",
    EXIT_CORRUPT: "corrupt: verify found corruption (the daemon would refuse to start),\n"
                  "     or the copy backup made does not verify",
    EXIT_STALE_LEASE: "stale lease: ack/release/touch with a lease that is not current",
    EXIT_KEY_CONFLICT: "key conflict: put with a key or task id already used differently",
    EXIT_NOT_FOUND: "no such task: get, revive or force-release of a task id the queue\n"
                    "     does not hold (nothing changed; a lease of one is stale: 5)",
    EXIT_UNREADABLE: "verify or backup could not read the queue directory or one of its\n"
                     "     files (run as the daemon's user or a member of its group)",
    EXIT_DEST_NOT_EMPTY: "backup: DEST exists and is not an empty directory (nothing written)",
    EXIT_BACKUP_INCOMPLETE: "backup: the copy failed or was interrupted half way: DEST was\n"
                            "     removed, or is incomplete (verify calls it an incomplete backup):\n"
                            "     delete it and run backup again; verify: such a DEST",
    EXIT_NO_QUEUE: "verify: the directory holds no queue (empty, or e.g. the parent of\n"
                   "     queue directories, which it names)",
    EXIT_PAUSED: "reserve: the daemon is paused (walqueue-ctl pause), so it leased\n"
                 "     nothing; walqueue-ctl resume hands out tasks again",
}

# The codes of a command that talks to the daemon, before its own.
DAEMON_CODES = (EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_UNAVAILABLE)


def exit_codes_help(codes: tuple[int, ...]) -> str:
    lines = "\n".join(f"{code:>3}  {EXIT_MEANINGS[code]}" for code in codes)
    return f"\b\nExit codes:\n{lines}\n"


def command_epilog(codes: tuple[int, ...]) -> str:
    return exit_codes_help(codes) + "(walqueue-ctl --help explains them all.)\n"


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


def not_found(task_id: str, consequence: str) -> CtlError:
    """Exit 7, the one code for a task id the queue does not hold, whatever the command."""
    return CtlError(f"no task '{display.name(task_id)}' in the queue{consequence}", EXIT_NOT_FOUND,
                    "NotFound")


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
    if dsn is not None and name == "DatabaseRefused":  # walqueue.pg.refusals: at once, no retry
        return CtlError(f"{message}\nFix --dsn (or WALQUEUE_DSN), or the role's grants, and run "
                        f"the command again.", EXIT_UNAVAILABLE, name)
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
