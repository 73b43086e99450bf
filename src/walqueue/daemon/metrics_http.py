"""walqueued's optional ``GET /metrics`` endpoint (``walqueued serve --metrics-listen``).

A stdlib ``ThreadingHTTPServer`` runs in a daemon thread, but only the event
loop ever reads the Queue: the HTTP thread never builds the numbers itself.
When a scrape finds no text younger than FRESH_SECONDS, it raises a flag,
wakes the loop through a callback (the server's wakeup socket) and waits up
to RENDER_WAIT_SECONDS; the loop sees the flag at the end of its turn and
publishes freshly rendered text. Scrapes arriving together share one render,
so the loop renders at most about once per FRESH_SECONDS whatever the scrape
rate. If the loop is busy past the wait (a long compaction), the previous
text is served; before any text exists the answer is 503.

Only ``GET /metrics`` is served (a query string is ignored): other paths
get 404, other methods 405. The address must be loopback unless the
operator allows remote scrapes explicitly (`parse_listen`).
"""

from __future__ import annotations

import ipaddress
import logging
import socket
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import urlsplit

log = logging.getLogger("walqueued")

FRESH_SECONDS = 1.0
RENDER_WAIT_SECONDS = 5.0
# A scraper that connects and says nothing must not hold a thread for long.
REQUEST_TIMEOUT_SECONDS = 10.0
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PATH = "/metrics"


class ListenError(ValueError):
    """A --metrics-listen value that cannot be used; the message says why."""


def parse_listen(value: str, *, allow_remote: bool) -> tuple[str, int]:
    """(host, port) of ``HOST:PORT`` (``[V6]:PORT`` for IPv6; ``localhost`` means 127.0.0.1).

    HOST must be an IP address or ``localhost``; a non-loopback address needs
    ``allow_remote``. PORT 0 picks a free port (logged at start). Raises
    ListenError naming what is wrong.
    """
    host, separator, port_text = value.rpartition(":")
    if not separator or not host:
        raise ListenError(f"{value!r} is not HOST:PORT (e.g. 127.0.0.1:9464)")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    elif ":" in host:
        raise ListenError(f"{value!r}: write an IPv6 address in brackets, e.g. [::1]:9464")
    if host == "localhost":
        host = "127.0.0.1"
    try:
        address = ipaddress.ip_address(host)
    except ValueError:
        raise ListenError(f"{value!r}: {host!r} is not an IP address (or localhost)") from None
    if not port_text.isdigit() or not 0 <= int(port_text) <= 65535:
        raise ListenError(f"{value!r}: port {port_text!r} is not a number in 0..65535")
    if not address.is_loopback and not allow_remote:
        raise ListenError(f"{value!r} is not a loopback address; the metrics carry the queue's "
                          f"directory and load, so serving them beyond this machine needs "
                          f"--metrics-allow-remote as well")
    return str(address), int(port_text)


class _Server(ThreadingHTTPServer):
    daemon_threads = True
    endpoint: MetricsEndpoint


class _Handler(BaseHTTPRequestHandler):
    server: _Server
    timeout = REQUEST_TIMEOUT_SECONDS
    server_version = "walqueued-metrics"
    sys_version = ""

    def version_string(self) -> str:
        return self.server_version

    def do_GET(self) -> None:  # noqa: N802 (the http.server naming)
        if urlsplit(self.path).path != PATH:
            self._plain(404, f"not found: only GET {PATH} is served\n")
            return
        text = self.server.endpoint.text()
        if text is None:
            self._plain(503, "the daemon has not rendered its metrics yet; try again\n")
            return
        self._send(200, CONTENT_TYPE, text.encode())

    def _not_allowed(self) -> None:
        self._plain(405, f"method {self.command} not allowed: only GET {PATH}\n", allow="GET")

    do_HEAD = do_POST = do_PUT = do_DELETE = do_PATCH = do_OPTIONS = _not_allowed  # noqa: N815

    def _plain(self, status: int, message: str, allow: str | None = None) -> None:
        self._send(status, "text/plain; charset=utf-8", message.encode(), allow)

    def _send(self, status: int, content_type: str, body: bytes, allow: str | None = None) -> None:
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        if allow is not None:
            self.send_header("Allow", allow)
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(body)

    def log_message(self, format: str, *args) -> None:  # noqa: A002 (the http.server signature)
        log.debug("metrics %s: %s", self.address_string(), format % args)


class MetricsEndpoint:
    """The HTTP thread's side and the loop's side of GET /metrics (see the module docstring)."""

    def __init__(self, host: str, port: int) -> None:
        """Bind now (raises OSError if the address is unusable); serve after `start()`."""
        self._wake: Callable[[], None] = lambda: None
        self._condition = threading.Condition()
        self._text: str | None = None
        self._rendered_at = float("-inf")
        self._renders = 0  # how many texts were published: a scrape waits for the next one
        self.wanted = False  # read by the loop every turn: a plain attribute, set under the lock
        server_class = _Server
        if ipaddress.ip_address(host).version == 6:
            server_class = type("_Server6", (_Server,), {"address_family": socket.AF_INET6})
        self._server = server_class((host, port), _Handler)
        self._server.endpoint = self
        self.address: tuple[str, int] = self._server.server_address[:2]
        self._thread = threading.Thread(target=self._server.serve_forever, name="metrics-http",
                                        daemon=True)

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}{PATH}" if ":" in host else f"http://{host}:{port}{PATH}"

    def start(self, wake: Callable[[], None]) -> None:
        """Serve from now on; ``wake()`` (thread-safe) makes the loop look at `wanted`."""
        self._wake = wake
        self._thread.start()

    def close(self) -> None:
        if self._thread.is_alive():
            self._server.shutdown()
        self._server.server_close()

    # -- the loop's side ----------------------------------------------------------

    def publish(self, text: str) -> None:
        with self._condition:
            self._text = text
            self._rendered_at = time.monotonic()
            self._renders += 1
            self.wanted = False
            self._condition.notify_all()

    # -- the HTTP thread's side ---------------------------------------------------

    def _fresh(self) -> bool:
        return time.monotonic() - self._rendered_at < FRESH_SECONDS

    def text(self) -> str | None:
        """Text at most FRESH_SECONDS old, else whatever the loop publishes within the wait."""
        with self._condition:
            if self._fresh():
                return self._text
            self.wanted = True
            asked_after = self._renders
        self._wake()
        with self._condition:
            self._condition.wait_for(lambda: self._renders > asked_after, RENDER_WAIT_SECONDS)
            return self._text
