"""walqueued's optional ``GET /metrics`` endpoint (``walqueued serve --metrics-listen``).

Served from the daemon's own selector loop, with non-blocking sockets and no
thread: the process stays single-threaded (so it may fork a child to write
a snapshot), and only the loop ever reads the Queue. The loop registers the
endpoint's sockets in its selector, hands their events to `on_event`, and at
the end of a turn in which a complete scrape waits for text (`wanted`)
renders the text and `publish`es it. Text younger than FRESH_SECONDS is
served again without a render, so the loop renders at most about once per
FRESH_SECONDS whatever the scrape rate.

Bounds, so that scrapers cannot take what the daemon needs:

* at most MAX_CONNECTIONS scrapes at a time: a further one is answered 503
  (best effort, without waiting for its request) and closed. These descriptors are counted
  in the daemon's descriptor budget (`DESCRIPTORS`, cli.descriptor_budget);
* every scrape has a total deadline of REQUEST_DEADLINE_SECONDS from its
  accept to its last byte sent, never renewed by traffic: a scraper
  trickling one byte at a time is cut off at the deadline;
* a request head is at most MAX_REQUEST_HEAD_BYTES (431 beyond); a body is
  never read.

Only ``GET /metrics`` is served (a query string is ignored): other paths
get 404, other methods 405. Every answer closes the connection. The address
must be loopback unless the operator allows remote scrapes explicitly
(`parse_listen`).
"""

from __future__ import annotations

import ipaddress
import selectors
import socket
from collections import deque
from urllib.parse import urlsplit

from .descriptors import OUT_OF_DESCRIPTORS, RateLimitedLog, SpareDescriptor
from .log import log, one_line

FRESH_SECONDS = 1.0
MAX_CONNECTIONS = 8
# The listener plus one per scrape: what cli.descriptor_budget reserves.
DESCRIPTORS = MAX_CONNECTIONS + 1
REQUEST_DEADLINE_SECONDS = 5.0
MAX_REQUEST_HEAD_BYTES = 8 * 1024
RECEIVE_BYTES = 4096
LISTEN_BACKLOG = 64
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PATH = "/metrics"
SERVER_NAME = "walqueued-metrics"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            431: "Request Header Fields Too Large", 503: "Service Unavailable"}


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


def response(status: int, body: bytes, content_type: str = "text/plain; charset=utf-8",
             *, allow: str | None = None, head_only: bool = False) -> bytes:
    """A complete HTTP/1.0 answer that closes the connection."""
    lines = [f"HTTP/1.0 {status} {_REASONS[status]}", f"Server: {SERVER_NAME}",
             f"Content-Type: {content_type}", f"Content-Length: {len(body)}", "Connection: close"]
    if allow is not None:
        lines.append(f"Allow: {allow}")
    head = ("\r\n".join(lines) + "\r\n\r\n").encode("ascii")
    return head if head_only else head + body


def _plain(status: int, message: str, **options) -> bytes:
    return response(status, message.encode(), **options)


def answer_to(head: bytes) -> bytes | None:
    """The answer to a complete request head, or None for ``GET /metrics`` (it needs the text)."""
    request_line = head.split(b"\n", 1)[0].rstrip(b"\r")
    parts = request_line.split(b" ")
    if len(parts) != 3 or not parts[2].startswith(b"HTTP/"):
        return _plain(400, "bad request line\n")
    method, target = parts[0].decode("latin-1"), parts[1].decode("latin-1")
    if method != "GET":
        return _plain(405, f"method {one_line(method)[:32]} not allowed: only GET {PATH}\n", allow="GET",
                      head_only=method == "HEAD")
    if urlsplit(target).path != PATH:
        return _plain(404, f"not found: only GET {PATH} is served\n")
    return None


class Scrape:
    """One metrics connection: its request head so far, its answer, its deadline."""

    def __init__(self, sock: socket.socket, peer: str, deadline_seconds: float) -> None:
        self.sock = sock
        self.peer = peer
        self.deadline_seconds = deadline_seconds  # monotonic: accept + REQUEST_DEADLINE_SECONDS
        self.head = bytearray()
        self.out = bytearray()
        self.waiting = False  # a complete GET /metrics waits for the loop's text
        self.events = 0  # the selector events it is registered for
        self.closed = False


class MetricsEndpoint:
    """GET /metrics on the loop's selector; see the module docstring."""

    def __init__(self, host: str, port: int) -> None:
        """Bind and listen now (raises OSError if the address is unusable); serve after `start()`."""
        family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
        self._listener = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
        try:
            self._listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            self._listener.bind((host, port))
            self._listener.listen(LISTEN_BACKLOG)
        except OSError:
            self._listener.close()
            raise
        self._listener.setblocking(False)
        self.address: tuple[str, int] = self._listener.getsockname()[:2]
        self._selector: selectors.BaseSelector | None = None
        self._scrapes: deque[Scrape] = deque()  # accept order, so deadlines ascend
        self._text: bytes | None = None
        self._rendered_seconds = float("-inf")
        self.wanted = False  # read by the loop at the end of each turn
        self._spare = SpareDescriptor()
        self._busy = RateLimitedLog(f"refused a metrics scrape: {MAX_CONNECTIONS} in progress")

    @property
    def url(self) -> str:
        host, port = self.address
        return f"http://[{host}]:{port}{PATH}" if ":" in host else f"http://{host}:{port}{PATH}"

    def start(self, selector: selectors.BaseSelector) -> None:
        """Serve from now on: the loop hands the events of ``selector`` keyed to it to `on_event`."""
        self._selector = selector
        selector.register(self._listener, selectors.EVENT_READ, self)

    def owns(self, data: object) -> bool:
        """True for the selector data of the endpoint's sockets."""
        return data is self or type(data) is Scrape

    def close(self) -> None:
        for scrape in list(self._scrapes):
            self._close(scrape)
        if self._selector is not None:
            try:
                self._selector.unregister(self._listener)
            except (KeyError, ValueError):
                pass
        self._listener.close()
        self._spare.close()

    # -- the loop's side ----------------------------------------------------------

    def on_event(self, data: object, mask: int, monotonic_seconds: float) -> None:
        if data is self:
            self._accept(monotonic_seconds)
            return
        scrape: Scrape = data  # type: ignore[assignment]
        if scrape.closed:
            return
        if mask & selectors.EVENT_READ and not scrape.out and not scrape.waiting:
            self._receive(scrape, monotonic_seconds)
        if scrape.out and not scrape.closed:
            self._send(scrape)

    def next_deadline(self) -> float | None:
        """The monotonic second at which the oldest scrape's deadline passes."""
        return self._scrapes[0].deadline_seconds if self._scrapes else None

    def expire(self, monotonic_seconds: float) -> None:
        """Close the scrapes whose total deadline has passed, answered or not."""
        while self._scrapes and self._scrapes[0].deadline_seconds <= monotonic_seconds:
            scrape = self._scrapes[0]
            log.debug("metrics %s: closed at its %g s deadline", scrape.peer, REQUEST_DEADLINE_SECONDS)
            self._close(scrape)

    def publish(self, text: str, monotonic_seconds: float) -> None:
        """Answer every scrape that waits for text with ``text`` (the loop just rendered it)."""
        self._text = text.encode()
        self._rendered_seconds = monotonic_seconds
        self.wanted = False
        for scrape in list(self._scrapes):
            if scrape.waiting:
                scrape.waiting = False
                scrape.out += response(200, self._text, CONTENT_TYPE)
                self._send(scrape)

    # -- connections ----------------------------------------------------------------

    def _accept(self, monotonic_seconds: float) -> None:
        while True:
            try:
                sock, address = self._listener.accept()
            except (BlockingIOError, InterruptedError):
                return
            except OSError as exc:
                if exc.errno in OUT_OF_DESCRIPTORS and self._spare.refuse_one(
                        self._listener, monotonic_seconds, exc):
                    continue
                return  # the next readiness event tries again
            sock.setblocking(False)
            peer = f"{address[0]}:{address[1]}"
            if len(self._scrapes) >= MAX_CONNECTIONS:
                self._busy.event(monotonic_seconds, peer)
                try:
                    # What already came is read, so that closing does not
                    # reset the connection before the 503 arrives.
                    sock.recv(MAX_REQUEST_HEAD_BYTES)
                    sock.send(_plain(503, "too many scrapes in progress; try again\n"))
                except OSError:
                    pass
                sock.close()
                continue
            scrape = Scrape(sock, peer, monotonic_seconds + REQUEST_DEADLINE_SECONDS)
            self._scrapes.append(scrape)
            self._watch(scrape, selectors.EVENT_READ)

    def _receive(self, scrape: Scrape, monotonic_seconds: float) -> None:
        try:
            data = scrape.sock.recv(RECEIVE_BYTES)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            self._close(scrape)
            return
        if not data:
            self._close(scrape)
            return
        scrape.head += data
        end = scrape.head.find(b"\r\n\r\n")
        if end < 0:
            end = scrape.head.find(b"\n\n")
        if end < 0:
            if len(scrape.head) > MAX_REQUEST_HEAD_BYTES:
                self._answer(scrape, _plain(431, f"request head above {MAX_REQUEST_HEAD_BYTES} bytes\n"))
            return
        head = bytes(scrape.head[:end])
        log.debug("metrics %s: %s", scrape.peer, one_line(head.split(b"\n", 1)[0].decode("latin-1"))[:200])
        answer = answer_to(head)
        if answer is not None:
            self._answer(scrape, answer)
        elif self._text is not None and monotonic_seconds - self._rendered_seconds < FRESH_SECONDS:
            self._answer(scrape, response(200, self._text, CONTENT_TYPE))
        else:
            scrape.waiting = True
            self.wanted = True
            self._watch(scrape, 0)  # nothing to read or write until the text comes

    def _answer(self, scrape: Scrape, data: bytes) -> None:
        scrape.out += data
        self._send(scrape)

    def _send(self, scrape: Scrape) -> None:
        try:
            sent = scrape.sock.send(scrape.out)
        except (BlockingIOError, InterruptedError):
            sent = 0
        except OSError:
            self._close(scrape)
            return
        del scrape.out[:sent]
        if scrape.out:
            self._watch(scrape, selectors.EVENT_WRITE)
        else:
            self._close(scrape)

    def _watch(self, scrape: Scrape, events: int) -> None:
        """Register exactly ``events`` for the scrape's socket."""
        assert self._selector is not None
        if events == scrape.events:
            return
        if not scrape.events:
            self._selector.register(scrape.sock, events, scrape)
        elif not events:
            self._selector.unregister(scrape.sock)
        else:
            self._selector.modify(scrape.sock, events, scrape)
        scrape.events = events

    def _close(self, scrape: Scrape) -> None:
        if scrape.closed:
            return
        scrape.closed = True
        self._watch(scrape, 0)
        scrape.sock.close()
        self._scrapes.remove(scrape)
