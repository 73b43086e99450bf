"""walqueue-ctl verify: check a queue directory offline, through `walqueue.verify`.

The one command that talks to no backend: it reads the directory itself
(read-only; no lock taken), so it needs no daemon and works on a copy.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator

import click

from walqueue import display, paths
from walqueue.ctl.errors import (
    EXIT_BACKUP_INCOMPLETE,
    EXIT_CORRUPT,
    EXIT_FAILURE,
    EXIT_NO_QUEUE,
    EXIT_OK,
    EXIT_UNREADABLE,
    EXIT_USAGE,
    CtlError,
)
from walqueue.ctl.group import command, json_option
from walqueue.ctl.output import emit
from walqueue.verify import verify_directory


@command(EXIT_OK, EXIT_FAILURE, EXIT_USAGE, EXIT_CORRUPT, EXIT_UNREADABLE, EXIT_BACKUP_INCOMPLETE,
         EXIT_NO_QUEUE,
         short_help='Check a queue directory offline.', offline=True)
@click.argument("directory", type=click.Path(file_okay=False))
@json_option("Print the report as one JSON object; errors as JSON on stderr.")
def verify(directory: str, as_json: bool) -> None:
    """Check a queue DIRECTORY offline (no daemon; nothing is changed or locked).

    Checks CURRENT, its snapshot, every WAL frame (checksum, canonical JSON,
    seq continuity, records valid against the state) and lists every
    problem with its file and offset. Exit 0 when the directory would open
    (a torn tail is reported, not an error), 4 when it is corrupt, 8 when a
    file cannot be read, 10 when it is a backup that did not finish (its
    BACKUP-INCOMPLETE marker), 11 when it holds no queue (it names
    subdirectories that do). On a terminal a progress bar on stderr shows the bytes read.

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
                       f"directory (e.g. {paths.PLAIN_QUEUE_DIRECTORY})", EXIT_UNREADABLE, "Unreadable") from None
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
