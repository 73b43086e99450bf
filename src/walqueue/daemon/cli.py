"""The ``walqueued`` command: ``walqueued serve DIRECTORY [options]``, ``--version``, ``-h``.

It parses the options, sets up logging, opens (recovers) the Engine while
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
from walqueue import CorruptStore, QueueLocked, speedups
from walqueue.directory import LAST, Directory, foreign_entries, open_queue_directory
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
from .loop import (
    DEFAULT_HELLO_TIMEOUT_SECONDS,
    DEFAULT_MAX_CONNECTIONS,
    Loop,
    bind_listener,
    refuse_a_live_socket,
)
from .metrics_http import DESCRIPTORS as METRICS_DESCRIPTORS
from .metrics_http import ListenError, MetricsEndpoint, parse_listen
from .metrics_textfile import DEFAULT_INTERVAL_SECONDS as DEFAULT_TEXTFILE_INTERVAL_SECONDS
from .metrics_textfile import DEFAULT_MODE as DEFAULT_TEXTFILE_MODE
from .metrics_textfile import DESCRIPTORS as TEXTFILE_DESCRIPTORS
from .metrics_textfile import MIN_INTERVAL_SECONDS as MIN_TEXTFILE_INTERVAL_SECONDS
from .metrics_textfile import Textfile, TextfileError
from .service import DEFAULT_MAX_LEASE_SECONDS
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


def _parse_mode(value: str, option: str | None = None) -> int:
    try:
        mode = int(value, 8)
    except ValueError:
        raise click.BadParameter(f"{value!r} is not an octal mode such as 0660", param_hint=option) from None
    if not 0 <= mode <= 0o777:
        raise click.BadParameter(f"{value!r} is outside 0000..0777", param_hint=option)
    return mode


EXIT_CODES_HELP = """\b
Exit codes:
  0  stopped by SIGTERM/SIGINT: last batch fsynced and answered, socket removed
  1  failure: cannot open the directory for a passing reason (e.g. EIO,
     EMFILE), bind the socket, listen on the --metrics-listen address or
     write the --metrics-textfile, or reopening the queue after a failed
     write failed; or an unexpected error (a bug: its traceback is logged)
  2  usage error (a bad --metrics-listen, or a non-loopback one without
     --metrics-allow-remote, or a --metrics-textfile not ending in .prom,
     included); the socket path is not a socket; a descriptor passed by
     systemd is not a Unix stream socket
  3  another walqueued owns the directory (QueueLocked) or listens on the socket
  4  the directory is corrupt (CorruptStore), at start or at a reopen
  5  the directory cannot be used as it is: read-only file system, no
     permission, an entry of the wrong type (e.g. CURRENT a directory or a
     FIFO), the path a file, a missing parent (only the last component is
     created), disk full; a restart cannot fix it (RestartPreventExitStatus=3 4 5 6)
  6  the directory, a parent, or a directory holding a link on the way is
     not safe: owned by another user, or writable by a group or others who
     could plant links in it; or an entry in it belongs to another user; the
     log says what to chown or chmod (nothing was opened or created)
"""


@click.group(
    help="walqueued: serve one WALQueue directory to local workers over a Unix socket.",
    epilog=EXIT_CODES_HELP,
    context_settings={"help_option_names": ["-h", "--help"]},
)
# The one --version line of every tool, then which path runs the hot loops (issue 22).
@click.version_option(walqueue.__version__, "--version", prog_name="walqueued",
                      message="%(prog)s %(version)s\n" + speedups.describe().replace("%", "%%"),
                      help="Print the version and which path runs the hot loops (compiled or pure), "
                           "and exit.")
def cli() -> None:
    pass


@cli.command(epilog=EXIT_CODES_HELP, short_help="Serve DIRECTORY in the foreground.")
@click.argument("directory", type=click.Path())
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
@click.option("--max-lease-seconds", type=click.IntRange(min=1), default=DEFAULT_MAX_LEASE_SECONDS,
              show_default=True, metavar="SECONDS",
              help="The longest lease a reserve or touch may ask for (12 h by default); a longer "
                   "one is refused as InvalidRequest naming this bound, and writes nothing. A "
                   "handler that runs longer touches its lease.")
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
@click.option("--metrics-textfile", metavar="PATH", type=click.Path(dir_okay=False), default=None,
              help="Write the same metrics text to PATH (NAME.prom in node_exporter's textfile "
                   "directory) every --metrics-textfile-interval seconds, atomically (a temporary "
                   "PATH.tmp renamed over it). Needs no port, and no connection can keep it from "
                   "Prometheus: the way to scrape under the shipped units (docs/metrics.md).")
@click.option("--metrics-textfile-interval", type=click.FloatRange(min=MIN_TEXTFILE_INTERVAL_SECONDS),
              default=DEFAULT_TEXTFILE_INTERVAL_SECONDS, show_default=True, metavar="SECONDS",
              help="Seconds between two writes of --metrics-textfile.")
@click.option("--metrics-textfile-mode", default=f"{DEFAULT_TEXTFILE_MODE:04o}", show_default=True,
              metavar="MODE",
              help="Permissions of --metrics-textfile, in octal, whatever the umask (node_exporter "
                   "runs as another user and must read it).")
@click.option("--test-hook", default=None, hidden=True,
              help="TEST ONLY: MODULE:CALLABLE passed to Engine(hook=...) for fault injection.")
@click.option("--test-child-hook", default=None, hidden=True,
              help="TEST ONLY: MODULE:CALLABLE called in each snapshot child before it writes.")
@click.option("--test-child-deadline-floor", "child_deadline_floor_seconds",
              type=click.FloatRange(min=0, min_open=True), default=CHILD_DEADLINE_FLOOR_SECONDS,
              hidden=True, help="TEST ONLY: the floor of a snapshot child's deadline, in seconds.")
def serve(directory: str, socket_path: str | None, socket_mode: str, compact_wal_bytes: int,
          compact_wal_ratio: float, max_connections: int, max_lease_seconds: int,
          hello_timeout_seconds: float, log_level: str,
          metrics_listen: str | None, metrics_allow_remote: bool, metrics_textfile: str | None,
          metrics_textfile_interval: float, metrics_textfile_mode: str, test_hook: str | None,
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
    textfile = None
    if metrics_textfile is not None:
        try:
            textfile = Textfile(metrics_textfile, interval_seconds=metrics_textfile_interval,
                                mode=_parse_mode(metrics_textfile_mode, "--metrics-textfile-mode"))
        except TextfileError as exc:
            raise click.BadParameter(str(exc), param_hint="--metrics-textfile") from None
    else:
        context = click.get_current_context()
        for name in ("metrics_textfile_interval", "metrics_textfile_mode"):
            if context.get_parameter_source(name) is not click.core.ParameterSource.DEFAULT:
                raise click.BadParameter("is only meaningful with --metrics-textfile",
                                         param_hint="--" + name.replace("_", "-"))
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
                             metrics_textfile=textfile, max_lease_seconds=max_lease_seconds,
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


def reach_directory(directory: str) -> Directory:
    """Reach the queue directory once (walqueue.directory), as a descriptor, or exit.

    Created when only its last component is missing (SPEC §8b); refused,
    with nothing created, when the way to it, the directory itself or an
    entry in it lets another user change the queue. Raises DaemonExit.
    """
    try:
        reached = open_queue_directory(directory, create=LAST)
    except FileNotFoundError as exc:
        raise DaemonExit(EXIT_DIRECTORY_UNUSABLE, f"cannot serve {directory}: {exc.strerror}; "
                         f"walqueued creates only the queue directory itself, in a parent that "
                         f"exists: create the parent, or give the right path (nothing was "
                         f"created)") from None
    except OSError as exc:
        raise DaemonExit(open_failure_code(exc), f"cannot examine {directory}: {exc}") from exc
    findings = list(reached.findings)
    if reached.directory is not None:
        try:
            findings += foreign_entries(reached.directory)
        except OSError as exc:
            os.close(reached.directory.fd)
            raise DaemonExit(open_failure_code(exc), f"cannot list {directory}: {exc}") from exc
    if findings:
        for finding in findings:
            log.error("refusing to serve %s: %s", directory, finding)
        if reached.directory is not None:
            os.close(reached.directory.fd)
        raise DaemonExit(EXIT_DIRECTORY_UNSAFE, f"refusing to serve {directory}: another user "
                         f"could change it (above); nothing was opened")
    if reached.created:
        log.info("created a new, empty queue at %s", reached.directory.path)
    return reached.directory


def open_metrics(address: tuple[str, int] | None, textfile: Textfile | None) -> MetricsEndpoint:
    """Listen on ``address`` and check that ``textfile`` can be written; raises OSError (logged)."""
    if textfile is not None:
        try:
            textfile.probe()
        except OSError as exc:
            log.error("--metrics-textfile %s: cannot write: %s", textfile.path, exc)
            raise
    try:
        endpoint = MetricsEndpoint(*(address or (None, 0)), textfile=textfile)
    except OSError as exc:
        log.error("--metrics-listen %s:%d: cannot listen: %s", *address, exc)
        raise
    if endpoint.url is not None:
        log.info("serving metrics at %s", endpoint.url)
    if textfile is not None:
        log.info("writing metrics to %s every %g s (mode %04o)", textfile.path, textfile.interval_seconds,
                 textfile.mode)
    return endpoint


def serve_directory(directory: str, *, socket_path: str | None, mode: int, compact_wal_bytes: int,
                    max_connections: int, hook: Callable[[str], None] | None,
                    hello_timeout_seconds: float = DEFAULT_HELLO_TIMEOUT_SECONDS,
                    preallocate_wal_bytes: int = DEFAULT_PREALLOCATE_WAL_BYTES,
                    metrics_address: tuple[str, int] | None = None,
                    compact_wal_ratio: float = DEFAULT_COMPACT_WAL_RATIO,
                    child_hook: Callable[[], None] | None = None,
                    metrics_textfile: Textfile | None = None,
                    child_deadline_floor_seconds: float = CHILD_DEADLINE_FLOOR_SECONDS,
                    max_lease_seconds: int = DEFAULT_MAX_LEASE_SECONDS) -> int:
    """Open ``directory``, listen, serve until stopped; returns the exit code."""
    directory = os.path.abspath(directory)
    metrics_descriptors = ((0 if metrics_address is None else METRICS_DESCRIPTORS)
                           + (0 if metrics_textfile is None else TEXTFILE_DESCRIPTORS))
    max_connections = descriptor_budget(max_connections, metrics_descriptors)
    notifier = Notifier(dict(os.environ))
    notifier.notify("STATUS=recovering " + directory)
    listener = None
    try:
        listener = activated_listener(dict(os.environ))
        if listener is None and socket_path is not None:
            refuse_a_live_socket(socket_path)   # before anything is created
        reached = reach_directory(directory)
    except DaemonExit as exc:
        log.error("%s", exc)
        if listener is not None:
            listener.close()
        return exc.code
    try:
        # The default socket is named in the directory the walk reached, not through the path
        # again (walqueue.directory).
        return _serve(directory, reached, listener, socket_path or os.path.join(reached.path, SOCKET_NAME),
                      mode=mode, compact_wal_bytes=compact_wal_bytes, max_connections=max_connections,
                      hook=hook, notifier=notifier, hello_timeout_seconds=hello_timeout_seconds,
                      preallocate_wal_bytes=preallocate_wal_bytes, metrics_address=metrics_address,
                      metrics_textfile=metrics_textfile, compact_wal_ratio=compact_wal_ratio,
                      child_hook=child_hook, child_deadline_floor_seconds=child_deadline_floor_seconds,
                      max_lease_seconds=max_lease_seconds)
    finally:
        os.close(reached.fd)
        notifier.close()


def _serve(directory: str, reached: Directory, listener, socket_path: str, *, mode: int,
           compact_wal_bytes: int, max_connections: int, hook, notifier: Notifier,
           hello_timeout_seconds: float, preallocate_wal_bytes: int,
           metrics_address: tuple[str, int] | None, metrics_textfile: Textfile | None,
           compact_wal_ratio: float, child_hook, child_deadline_floor_seconds: float,
           max_lease_seconds: int) -> int:
    """serve_directory once the directory is reached: recover, listen, run the loop."""
    if listener is None:
        try:
            refuse_a_live_socket(socket_path)   # before the Engine creates its files
        except DaemonExit as exc:
            log.error("%s", exc)
            return exc.code
    log.info("opening %s", directory)
    filesystem = FreeingInSteps()
    started = time.monotonic()
    try:
        queue = open_reporting_progress(directory, hook, notifier, preallocate_wal_bytes, filesystem,
                                        opened=reached)
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
    log.info("recovered %s in %.3f s: %s (walqueue %s, speedups %s)", directory, recovery_seconds,
             queue.stats(), walqueue.__version__, speedups.PATH)
    owned_path = None
    if listener is not None:
        log.info("listening on the socket passed by systemd (fd %d)", SD_LISTEN_FDS_START)
    else:
        try:
            listener = bind_listener(socket_path, mode)
        except DaemonExit as exc:
            log.error("%s", exc)
            queue.close()
            return exc.code
        owned_path = socket_path
        log.info("listening on %s (mode %04o)", socket_path, mode)
    metrics_endpoint = None
    if metrics_address is not None or metrics_textfile is not None:
        try:
            metrics_endpoint = open_metrics(metrics_address, metrics_textfile)
        except OSError:
            queue.close()
            if owned_path is not None:
                os.unlink(owned_path)
            listener.close()
            return EXIT_FAILURE
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
        opened=reached,
        child_deadline_floor_seconds=child_deadline_floor_seconds,
        max_lease_seconds=max_lease_seconds,
    )
    return loop.run()


def main() -> None:
    """Console-script entry point (``walqueued``)."""
    cli()


if __name__ == "__main__":
    main()
