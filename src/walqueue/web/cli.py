"""``walqueue-web TARGET``: the dashboard (SPEC §8b, docs/web.md).

Checks the options (the listening address against the certificate and
password file, security.check_listen), opens the client for TARGET with
`walqueue.connect` (a walqueued socket or queue directory, or a PostgreSQL
URL/DSN, by walqueue.backend's one rule), checks that it answers (exit 3 if
not), and serves the app (walqueue.web.app) with uvicorn inside the bounds
of walqueue.web.bounds until SIGTERM or SIGINT (exit 0). Logs go to stderr,
one line an event; every write is logged with who asked.
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import sys
from typing import Any

import click

import walqueue
from walqueue import display, paths
from walqueue.backend import is_postgres_target
from walqueue.dsn import redacted
from walqueue.errors import InvalidRequest, Unavailable, WalQueueError

EXIT_OK = 0
EXIT_USAGE = 2
EXIT_UNAVAILABLE = 3
DEFAULT_LISTEN = "127.0.0.1:8765"
CLIENT_TIMEOUT_SECONDS = 10.0

log = logging.getLogger("walqueue.web")

EPILOG = """\b
Exit codes:
  0  stopped by SIGTERM or SIGINT
  2  usage: a bad option, a non-loopback --listen without --certificate and
     --password-file, an unusable password file, or walqueue[web] not installed
  3  the queue (walqueued, PostgreSQL) could not be reached at start

\b
Examples:
  walqueue-web """ + paths.PLAIN_SOCKET + """
  walqueue-web /srv/queue --allow-writes
  walqueue-web postgresql://dashboard@db/app --queue orders
  walqueue-web /srv/queue --listen 0.0.0.0:8443 --certificate /etc/walqueue/web.pem \\
      --password-file /etc/walqueue/web.passwords --allow-writes
"""


class Unreachable(click.ClickException):
    exit_code = EXIT_UNAVAILABLE


def parse_listen(value: str) -> tuple[str, int]:
    """(host, port) of HOST:PORT ([V6]:PORT for IPv6; localhost means 127.0.0.1)."""
    host, separator, port_text = value.rpartition(":")
    if not separator or not host:
        raise click.BadParameter(f"{value!r} is not HOST:PORT (e.g. {DEFAULT_LISTEN})")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise click.BadParameter(f"{value!r}: write an IPv6 address in brackets, e.g. [::1]:8765")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise click.BadParameter(f"{value!r}: {host!r} is not an IP address (or localhost)") from None
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise click.BadParameter(f"{value!r}: port {port_text!r} is not a number in 0..65535")
    return str(address), int(port_text)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on (host, port), bound here so that port 0 is known before serving."""
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    try:
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(128)
    except OSError:
        listener.close()
        raise
    return listener


def target_label(target: str, queue: str | None) -> str:
    """TARGET for the log, without a password (SPEC §8b)."""
    if is_postgres_target(target):
        from walqueue.pg import describe

        return f"PostgreSQL at {describe(target)}, queue {display.name(queue or 'default')}"
    return f"walqueued at {display.name(target)}"


def open_client(target: str, queue: str | None) -> Any:
    """walqueue.connect's client for TARGET: no retries (a page shows the error at once), and
    on PostgreSQL no schema migration, no reaper and no LISTEN (the dashboard only reads and
    writes the operators' calls)."""
    if is_postgres_target(target):
        return walqueue.connect(target, queue=queue or "default", retry_seconds=0, migrate=False,
                                reaper=False, listen=False)
    if queue is not None:
        raise click.UsageError("--queue names a queue on PostgreSQL; a walqueued socket serves one queue")
    return walqueue.connect(target, name="walqueue-web", retry_seconds=0, timeout=CLIENT_TIMEOUT_SECONDS)


@click.command(epilog=EPILOG, context_settings={"help_option_names": ["-h", "--help"]})
@click.argument("target")
@click.option("--listen", default=DEFAULT_LISTEN, show_default=True, metavar="HOST:PORT",
              help="Where to serve. Beyond loopback it needs --certificate and --password-file.")
@click.option("--allow-writes", is_flag=True,
              help="Allow revive, force-release and cancel (POSTs with a CSRF token, each logged).")
@click.option("--certificate", type=click.Path(dir_okay=False, exists=True), default=None,
              help="TLS: a PEM file with the certificate chain (and the key, unless --key).")
@click.option("--key", type=click.Path(dir_okay=False, exists=True), default=None,
              help="TLS: the PEM file of the certificate's private key.")
@click.option("--password-file", type=click.Path(dir_okay=False), default=None,
              help="A file of name:password lines (mode 600): every request needs one (HTTP Basic).")
@click.option("--queue", default=None, help="The queue's name, for a PostgreSQL TARGET (default: default).")
@click.option("--log-level", type=click.Choice(["debug", "info", "warning", "error"]), default="info",
              show_default=True, help="Log level on stderr; info logs every write.")
@click.option("--sample-seconds", type=click.FloatRange(min=0.1), default=None, hidden=True,
              help="How often the overview's history is sampled (tests; default 10).")
@click.version_option(walqueue.__version__, "--version", prog_name="walqueue-web",
                      message="%(prog)s %(version)s", help="Print the version and exit.")
def main(target: str, listen: str, allow_writes: bool, certificate: str | None, key: str | None,
         password_file: str | None, queue: str | None, log_level: str,
         sample_seconds: float | None) -> None:
    """Serve a dashboard of the queue at TARGET: counts and rates, tasks, dead tasks, leases,
    workers; with --allow-writes also revive, force-release and cancel.

    TARGET is a walqueued socket, a queue directory (meaning its
    walqueued.sock), or a PostgreSQL URL or key=value DSN.
    """
    logging.basicConfig(level=log_level.upper(), stream=sys.stderr,
                        format="%(asctime)s walqueue-web[%(process)d] %(levelname)s %(message)s")
    try:
        import uvicorn

        from walqueue.web.app import Settings, create_app
        from walqueue.web.bounds import server_options
        from walqueue.web.samples import SAMPLE_SECONDS
        from walqueue.web.security import Origin, SecurityError, check_listen, read_passwords
        from walqueue.web.source import Source
    except ImportError as error:
        raise click.UsageError(f"walqueue-web needs the extra walqueue[web] ({error}): "
                               f"from the clone, pip install -e '.[web]' (docs/web.md)") from None
    host, port = parse_listen(listen)
    if key is not None and certificate is None:
        raise click.UsageError("--key goes with --certificate")
    try:
        check_listen(host, certificate=certificate, password_file=password_file)
        passwords = read_passwords(password_file) if password_file is not None else None
    except SecurityError as error:
        raise click.UsageError(str(error)) from None
    try:
        client = open_client(target, queue)
    except Unavailable as error:
        raise Unreachable(f"cannot reach {target_label(target, queue)}: {display.text(str(error))}") from error
    except InvalidRequest as error:
        raise click.UsageError(display.text(redacted(str(error), target))) from None
    except WalQueueError as error:
        raise Unreachable(f"{target_label(target, queue)} refused the dashboard: "
                          f"{display.text(str(error))}") from None
    try:
        client.stats()  # fail fast (exit 3) if nothing answers at TARGET
    except Unavailable as error:
        client.close()
        raise Unreachable(f"cannot reach {target_label(target, queue)}: {display.text(str(error))}") from error
    try:
        listener = bind(host, port)
    except OSError as error:
        client.close()
        raise click.UsageError(f"cannot listen on {listen}: {error.strerror or error}") from None
    port = listener.getsockname()[1]  # the one chosen, for --listen HOST:0
    scheme = "https" if certificate is not None else "http"
    source = Source(client)
    config = uvicorn.Config(
        create_app(source, Settings(origin=Origin(scheme, host, port), allow_writes=allow_writes,
                                    passwords=passwords,
                                    sample_seconds=sample_seconds or SAMPLE_SECONDS)),
        log_level=log_level, access_log=log_level == "debug",
        ssl_certfile=certificate, ssl_keyfile=key, **server_options())
    server = uvicorn.Server(config)
    log.info("serving %s for %s at %s://%s:%d/ (%s)", "read-write" if allow_writes else "read-only",
             target_label(target, queue), scheme, f"[{host}]" if ":" in host else host, port,
             "passwords required" if passwords else "no passwords: loopback only")
    try:
        server.run(sockets=[listener])
    finally:
        listener.close()
    sys.exit(EXIT_OK)


if __name__ == "__main__":
    main()
