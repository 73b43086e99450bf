"""The ``walqueued`` command: ``walqueued serve DIRECTORY [options]``, ``--version``, ``-h``.

It parses the options, sets up logging, opens (recovers) the Queue while
telling systemd it is starting, takes the listening socket (its own, or the
one systemd passed) and hands everything to the loop (walqueue.daemon.loop).
Each failure to start exits with the code documented in ``--help``.
"""

from __future__ import annotations

import importlib
import logging
import os
import resource
import sys
import time
from collections.abc import Callable

import click

import walqueue
from walqueue import CorruptStore, QueueLocked
from walqueue.fs import DIRECTORY_MODE, check_directory_safety
from walqueue.wal import MAX_PREALLOCATE_BYTES

from .compaction import CHILD_DEADLINE_FLOOR_SECONDS, DEFAULT_COMPACT_WAL_RATIO
from .exits import (
    EXIT_CORRUPT,
    EXIT_DIRECTORY_UNSAFE,
    EXIT_DIRECTORY_UNUSABLE,
    EXIT_FAILURE,
    EXIT_LOCKED,
    DaemonExit,
    open_failure_code,
)
from .freeing import MAX_FILES_BEING_FREED, FreeingInSteps
from .log import log
from .loop import DEFAULT_HELLO_TIMEOUT_SECONDS, DEFAULT_MAX_CONNECTIONS, Loop, bind_listener
from .metrics_http import DESCRIPTORS as METRICS_DESCRIPTORS
from .metrics_http import ListenError, MetricsEndpoint, parse_listen
from .systemd import SD_LISTEN_FDS_START, Notifier, activated_listener, open_reporting_progress

SOCKET_NAME = "walqueued.sock"
DEFAULT_SOCKET_MODE = 0o660
DEFAULT_COMPACT_WAL_BYTES = 64 * 1024 * 1024
# Off by default: with a preallocated segment, a frame torn by a power cut (or a
# write cut short at a page boundary by SIGKILL) is followed by zeros, which
# SPEC §5 makes CorruptStore — a daemon that will not start until an operator
# cuts the segment. Appending, the same tear is a torn tail, cut at open. The
# 13-25% it buys per sync is not worth a manual step after a crash by default.
DEFAULT_PREALLOCATE_WAL_BYTES = 0
# Descriptors the daemon needs besides its connections: 24 for its own
# (listener, selector, wakeup pair, WAL segment, lock, directory fsyncs,
# notify socket, logs, the spare descriptors that refuse a connection on
# EMFILE, a compaction's pipe, pidfd and files), plus the deleted files held
# open while their blocks are freed (at most MAX_FILES_BEING_FREED).
RESERVED_DESCRIPTORS = 24 + MAX_FILES_BEING_FREED


def _load_hook(spec: str, option: str = "--test-hook") -> Callable:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise click.BadParameter("expected MODULE:CALLABLE", param_hint=option)
    return getattr(importlib.import_module(module_name), attribute)


def _parse_mode(value: str) -> int:
    try:
        mode = int(value, 8)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an octal mode such as 0660") from None
    if not 0 <= mode <= 0o777:
        raise click.BadParameter(f"{value!r} is outside 0000..0777")
    return mode


EXIT_CODES_HELP = """\b
Exit codes:
  0  stopped by SIGTERM/SIGINT: last batch fsynced and answered, socket removed
  1  failure: cannot open the directory for a passing reason (e.g. EIO,
     EMFILE), bind the socket or listen on the --metrics-listen address, or
     reopening the queue after a failed write failed; or an unexpected error
     (a bug: its traceback is logged)
  2  usage error (a bad --metrics-listen, or a non-loopback one without
     --metrics-allow-remote, included); the socket path is not a socket;
     a descriptor passed by systemd is not a Unix stream socket
  3  another walqueued owns the directory (QueueLocked) or listens on the socket
  4  the directory is corrupt (CorruptStore), at start or at a reopen
  5  the directory cannot be used as it is: read-only file system, no
     permission, an entry of the wrong type (e.g. CURRENT.tmp a directory),
     disk full; a restart cannot fix it (RestartPreventExitStatus=3 4 5 6)
  6  the directory or a parent is not safe: owned by another user, or
     writable by a group or others who could plant links in it; the log
     says what to chown or chmod (nothing was opened)
"""


@click.group(
    help="walqueued: serve one WALQueue directory to local workers over a Unix socket.",
    epilog=EXIT_CODES_HELP,
    context_settings={"help_option_names": ["-h", "--help"]},
)
@click.version_option(walqueue.__version__, "--version", prog_name="walqueued",
                      message="%(prog)s %(version)s", help="Print the walqueue version and exit.")
def cli() -> None:
    pass


@cli.command(epilog=EXIT_CODES_HELP, short_help="Serve DIRECTORY in the foreground.")
@click.argument("directory", type=click.Path(file_okay=False))
@click.option("--socket", "socket_path", type=click.Path(dir_okay=False), default=None,
              help="Socket path [default: DIRECTORY/walqueued.sock]. Ignored when systemd passes "
                   "a listening socket (LISTEN_FDS).")
@click.option("--socket-mode", default=f"{DEFAULT_SOCKET_MODE:04o}", show_default=True, metavar="MODE",
              help="Permissions of the socket file, in octal. Ignored under socket activation "
                   "(the .socket unit's SocketMode applies).")
@click.option("--compact-wal-bytes", type=click.IntRange(min=1), default=DEFAULT_COMPACT_WAL_BYTES,
              show_default=True, metavar="BYTES",
              help="Compact (write a snapshot, drop the WAL it covers) when the WAL since the last "
                   "snapshot grows past this many bytes (the floor) and past --compact-wal-ratio "
                   "times the snapshot's size. A forked child writes the snapshot while the daemon "
                   "serves.")
@click.option("--compact-wal-ratio", type=click.FloatRange(min=0), default=DEFAULT_COMPACT_WAL_RATIO,
              show_default=True, metavar="RATIO",
              help="Compact only once the WAL since the last snapshot is past RATIO times that "
                   "snapshot's size (and past --compact-wal-bytes), so the snapshot bytes written "
                   "stay within about 1/RATIO + 0.5 times the WAL bytes however large the history "
                   "(docs/daemon.md). 0 leaves only the floor.")
@click.option("--max-connections", type=click.IntRange(min=1), default=DEFAULT_MAX_CONNECTIONS,
              show_default=True,
              help="Connections beyond this are answered with an error and closed. Lowered to fit "
                   "the open-file limit (RLIMIT_NOFILE), with a log line saying so.")
@click.option("--hello-timeout", "hello_timeout_seconds", type=click.FloatRange(min=0, min_open=True),
              default=DEFAULT_HELLO_TIMEOUT_SECONDS, show_default=True, metavar="SECONDS",
              help="Seconds a new connection has to send its hello before it is closed.")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"], case_sensitive=False),
              default="info", show_default=True,
              help="Least severe log line written. Logs go to stderr, one line per event.")
@click.option("--preallocate-wal-bytes", type=click.IntRange(min=0, max=MAX_PREALLOCATE_BYTES),
              default=DEFAULT_PREALLOCATE_WAL_BYTES, show_default=True,
              help="Preallocate the active WAL segment in steps of this many bytes (e.g. 4194304) and "
                   "sync it with fdatasync: faster syncs, but a frame torn by a crash inside the "
                   "preallocated space stops the next start until an operator cuts the segment "
                   "(docs/daemon.md). 0, the default, appends and fsyncs.")
@click.option("--metrics-listen", metavar="HOST:PORT", default=None,
              help="Serve Prometheus metrics at http://HOST:PORT/metrics (off by default). HOST is "
                   "an IP address ([::1] for IPv6) or localhost and must be loopback unless "
                   "--metrics-allow-remote is given; PORT 0 picks a free port (logged).")
@click.option("--metrics-allow-remote", is_flag=True, default=False,
              help="Allow a non-loopback --metrics-listen address (anyone who can reach it reads "
                   "the queue's directory and load; put a firewall in front).")
@click.option("--test-hook", default=None, hidden=True,
              help="TEST ONLY: MODULE:CALLABLE passed to Queue(hook=...) for fault injection.")
@click.option("--test-child-hook", default=None, hidden=True,
              help="TEST ONLY: MODULE:CALLABLE called in each snapshot child before it writes.")
@click.option("--test-child-deadline-floor", "child_deadline_floor_seconds",
              type=click.FloatRange(min=0, min_open=True), default=CHILD_DEADLINE_FLOOR_SECONDS,
              hidden=True, help="TEST ONLY: the floor of a snapshot child's deadline, in seconds.")
def serve(directory: str, socket_path: str | None, socket_mode: str, compact_wal_bytes: int,
          compact_wal_ratio: float, max_connections: int, hello_timeout_seconds: float, log_level: str,
          metrics_listen: str | None, metrics_allow_remote: bool, test_hook: str | None,
          test_child_hook: str | None, preallocate_wal_bytes: int,
          child_deadline_floor_seconds: float) -> None:
    """Serve DIRECTORY in the foreground until SIGTERM or SIGINT.

    DIRECTORY is created (mode 0750) if missing; the daemon holds its lock, so
    a second walqueued on it exits 3. Start it under a supervisor (systemd/
    has units); it does not fork. Stopping with SIGTERM answers the requests
    in progress after their fsync, then removes the socket.
    """
    metrics_address = None
    if metrics_listen is not None:
        try:
            metrics_address = parse_listen(metrics_listen, allow_remote=metrics_allow_remote)
        except ListenError as exc:
            raise click.BadParameter(str(exc), param_hint="--metrics-listen") from None
    elif metrics_allow_remote:
        raise click.BadParameter("is only meaningful with --metrics-listen",
                                 param_hint="--metrics-allow-remote")
    logging.basicConfig(
        stream=sys.stderr,
        level=getattr(logging, log_level.upper()),
        format="%(asctime)s walqueued[%(process)d] %(levelname)s %(message)s",
    )
    mode = _parse_mode(socket_mode)
    hook = None
    if test_hook is not None:
        hook = _load_hook(test_hook)
        log.warning("TEST ONLY fault-injection hook loaded: %s", test_hook)
    child_hook = None
    if test_child_hook is not None:
        child_hook = _load_hook(test_child_hook, "--test-child-hook")
        log.warning("TEST ONLY snapshot child hook loaded: %s", test_child_hook)
    sys.exit(serve_directory(directory, socket_path=socket_path, mode=mode,
                             compact_wal_bytes=compact_wal_bytes, compact_wal_ratio=compact_wal_ratio,
                             max_connections=max_connections, hook=hook, child_hook=child_hook,
                             hello_timeout_seconds=hello_timeout_seconds,
                             preallocate_wal_bytes=preallocate_wal_bytes, metrics_address=metrics_address,
                             child_deadline_floor_seconds=child_deadline_floor_seconds))


def descriptor_budget(max_connections: int, other_descriptors: int = 0) -> int:
    """Raise the soft RLIMIT_NOFILE as far as needed and allowed; return the usable connection bound.

    ``other_descriptors`` are what else the daemon may hold at once (the
    metrics endpoint's listener and scrapes): reserved as the daemon's own.
    """
    reserved = RESERVED_DESCRIPTORS + other_descriptors
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    wanted = max_connections + reserved
    if soft != resource.RLIM_INFINITY and soft < wanted:
        target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
            soft = target
        except (ValueError, OSError) as exc:
            log.warning("cannot raise the open-file limit to %d: %s", target, exc)
    if soft != resource.RLIM_INFINITY and soft - reserved < max_connections:
        usable = max(1, soft - reserved)
        log.warning("--max-connections %d lowered to %d by the open-file limit %d",
                    max_connections, usable, soft)
        return usable
    return max_connections


def unsafe_directory_findings(directory: str) -> list[str]:
    """What lets another user plant files or links in `directory` (issue 12 item 1).

    A missing directory is created first (mode 0750, its name fsynced), so
    the checked directory is the one the Queue then opens: the library's
    Queue only warns, the daemon refuses. Raises OSError.
    """
    if not os.path.isdir(directory):
        parent = os.path.dirname(directory)
        os.makedirs(directory, mode=DIRECTORY_MODE, exist_ok=True)
        fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    return check_directory_safety(directory)


def serve_directory(directory: str, *, socket_path: str | None, mode: int, compact_wal_bytes: int,
                    max_connections: int, hook: Callable[[str], None] | None,
                    hello_timeout_seconds: float = DEFAULT_HELLO_TIMEOUT_SECONDS,
                    preallocate_wal_bytes: int = DEFAULT_PREALLOCATE_WAL_BYTES,
                    metrics_address: tuple[str, int] | None = None,
                    compact_wal_ratio: float = DEFAULT_COMPACT_WAL_RATIO,
                    child_hook: Callable[[], None] | None = None,
                    child_deadline_floor_seconds: float = CHILD_DEADLINE_FLOOR_SECONDS) -> int:
    """Open ``directory``, listen, serve until stopped; returns the exit code."""
    directory = os.path.abspath(directory)
    metrics_descriptors = 0 if metrics_address is None else METRICS_DESCRIPTORS
    max_connections = descriptor_budget(max_connections, metrics_descriptors)
    notifier = Notifier(dict(os.environ))
    notifier.notify("STATUS=recovering " + directory)
    try:
        unsafe = unsafe_directory_findings(directory)
    except OSError as exc:
        log.error("cannot examine %s: %s", directory, exc)
        return open_failure_code(exc)
    if unsafe:
        for finding in unsafe:
            log.error("refusing to serve %s: %s", directory, finding)
        return EXIT_DIRECTORY_UNSAFE
    log.info("opening %s", directory)
    filesystem = FreeingInSteps()
    started = time.monotonic()
    try:
        queue = open_reporting_progress(directory, hook, notifier, preallocate_wal_bytes, filesystem)
    except QueueLocked as exc:
        log.error("another walqueued owns %s: %s", directory, exc)
        print(f"walqueued: another process owns {directory}: {exc}", file=sys.stderr)
        return EXIT_LOCKED
    except CorruptStore as exc:
        log.error("cannot open %s: %s", directory, exc)
        return EXIT_CORRUPT
    except OSError as exc:
        code = open_failure_code(exc)
        if code == EXIT_DIRECTORY_UNUSABLE:
            log.error("cannot open %s: %s; restarting will not help: fix the directory or its file "
                      "system (exit %d)", directory, exc, code)
        else:
            log.error("cannot open %s: %s", directory, exc)
        return code
    recovery_seconds = time.monotonic() - started
    log.info("recovered %s in %.3f s: %s (walqueue %s)", directory, recovery_seconds, queue.stats(),
             walqueue.__version__)
    try:
        listener = activated_listener(dict(os.environ))
        owned_path = None
        if listener is not None:
            log.info("listening on the socket passed by systemd (fd %d)", SD_LISTEN_FDS_START)
        else:
            path = socket_path or os.path.join(directory, SOCKET_NAME)
            listener = bind_listener(path, mode)
            owned_path = path
            log.info("listening on %s (mode %04o)", path, mode)
    except DaemonExit as exc:
        log.error("%s", exc)
        queue.close()
        return exc.code
    metrics_endpoint = None
    if metrics_address is not None:
        try:
            metrics_endpoint = MetricsEndpoint(*metrics_address)
        except OSError as exc:
            log.error("--metrics-listen %s:%d: cannot listen: %s", *metrics_address, exc)
            queue.close()
            if owned_path is not None:
                os.unlink(owned_path)
            listener.close()
            return EXIT_FAILURE
        log.info("serving metrics at %s", metrics_endpoint.url)
    loop = Loop(
        directory,
        queue,
        listener,
        socket_path=owned_path,
        compact_wal_bytes=compact_wal_bytes,
        max_connections=max_connections,
        hook=hook,
        notifier=notifier,
        hello_timeout_seconds=hello_timeout_seconds,
        preallocate_wal_bytes=preallocate_wal_bytes,
        recovery_seconds=recovery_seconds,
        metrics_endpoint=metrics_endpoint,
        compact_wal_ratio=compact_wal_ratio,
        child_hook=child_hook,
        filesystem=filesystem,
        child_deadline_floor_seconds=child_deadline_floor_seconds,
    )
    try:
        return loop.run()
    finally:
        notifier.close()


def main() -> None:
    """Console-script entry point (``walqueued``)."""
    cli()


if __name__ == "__main__":
    main()
