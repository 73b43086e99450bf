"""walqueued's optional metrics outputs: ``GET /metrics`` (``walqueued serve --metrics-listen``)
and the textfile (``--metrics-textfile``, walqueue.daemon.metrics_textfile).

Served from the daemon's own selector loop, with non-blocking sockets and no
thread: the process stays single-threaded (so it may fork a child to write
a snapshot), and only the loop ever reads the Engine. The loop registers the
endpoint's sockets in its selector, hands their events to `on_event`, and at
the end of a turn in which a complete scrape or the textfile waits for text
(`wanted`) renders the text and `publish`es it. Text younger than
FRESH_SECONDS is served again without a render, so scrapes make the loop
render at most about once per FRESH_SECONDS whatever their rate.

Bounds, so that scrapers cannot take what the daemon needs:

* at most MAX_CONNECTIONS scrapes at a time. These descriptors are counted
  in the daemon's descriptor budget (`DESCRIPTORS`, cli.descriptor_budget);
* a scrape's request head must be complete HEAD_DEADLINE_SECONDS after its
  accept (408 and closed otherwise), and the whole scrape is over
  REQUEST_DEADLINE_SECONDS after it, never renewed by traffic: a scraper
  trickling one byte at a time is cut off at the head deadline;
* a request head is at most MAX_REQUEST_HEAD_BYTES (431 beyond); a body is
  never read;
* at most MAX_ACCEPTS_PER_TURN accepts a turn, so a flood of connections
  cannot keep the loop from its other work.

Who gets a slot (issue 20 item 5: one local loop that kept the slots full
left 0 of 148 honest scrapes served). Holding a slot must not be enough to
keep it, so when the slots are full a newcomer takes one instead of being
refused: the victim is the oldest unfinished scrape (its head not in, or its
answer not yet taken by the peer) of the peer that holds the most slots, so
a flooding peer evicts its own connections and never those of a peer with
fewer; the victim gets 503. A scrape whose complete request waits for the text is
never evicted, and before a victim goes its socket is read once more, so a
request that arrived meanwhile is served instead. A newcomer's socket is
read at its accept, since a scraper sends its request right after it
connects. Only when every slot holds a complete request (in one turn) is a
newcomer refused with 503. A peer is an IP address, an IPv6 /64, or
"loopback" for every loopback address (any local user can connect from
127.0.0.2 as well as from 127.0.0.1), so locally every scraper shares the
slots with any local attacker: most honest scrapes are still served (the
attacker must win a race for each of them), not all. A path no connection
can block is the textfile (docs/metrics.md).

Only ``GET /metrics`` is served (a query string is ignored): other paths
get 404, other methods 405. Every answer closes the connection. The address
must be loopback unless the operator allows remote scrapes explicitly
(`parse_listen`).
"""

from __future__ import annotations

import ipaddress
import selectors
import socket
from collections import Counter
from urllib.parse import urlsplit

from .descriptors import OUT_OF_DESCRIPTORS, RateLimitedLog, SpareDescriptor
from .log import log, one_line
from .metrics_textfile import Textfile

FRESH_SECONDS = 1.0
MAX_CONNECTIONS = 8
# The listener plus one per scrape: what cli.descriptor_budget reserves.
DESCRIPTORS = MAX_CONNECTIONS + 1
# A scraper sends its request head as soon as it is connected: a second is
# ample even over a slow link, and is all a silent connection can hold.
HEAD_DEADLINE_SECONDS = 1.0
REQUEST_DEADLINE_SECONDS = 5.0
MAX_REQUEST_HEAD_BYTES = 8 * 1024
RECEIVE_BYTES = 4096
LISTEN_BACKLOG = 64
MAX_ACCEPTS_PER_TURN = LISTEN_BACKLOG
LOOPBACK_PEER = "loopback"
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
PATH = "/metrics"
SERVER_NAME = "walqueued-metrics"
_REASONS = {200: "OK", 400: "Bad Request", 404: "Not Found", 405: "Method Not Allowed",
            408: "Request Timeout", 431: "Request Header Fields Too Large", 503: "Service Unavailable"}


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


def peer_of(address: str) -> str:
    """Whom a connection from ``address`` counts against: its IP address, its IPv6 /64, or
    LOOPBACK_PEER for any loopback address (IPv4-mapped ones included)."""
    ip = ipaddress.ip_address(address.partition("%")[0])  # a link-local address may carry a %zone
    if ip.version == 6 and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if ip.is_loopback:
        return LOOPBACK_PEER
    if ip.version == 6:
        return str(ipaddress.ip_network(f"{ip}/64", strict=False))
    return str(ip)


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
    """One metrics connection: its request head so far, its answer, its deadlines."""

    def __init__(self, sock: socket.socket, name: str, peer: str, accepted_seconds: float) -> None:
        self.sock = sock
        self.name = name  # address:port, for the log
        self.peer = peer  # whom it counts against (peer_of)
        self.accepted_seconds = accepted_seconds  # monotonic
        self.head = bytearray()
        self.out = bytearray()
        self.waiting = False  # a complete GET /metrics waits for the loop's text
        self.events = 0  # the selector events it is registered for
        self.closed = False

    @property
    def reading(self) -> bool:
        """Its request head is not complete yet."""
        return not self.waiting and not self.out

    @property
    def deadline_seconds(self) -> float:
        """The monotonic second at which it is closed, answered or not."""
        if self.reading:
            return self.accepted_seconds + HEAD_DEADLINE_SECONDS
        return self.accepted_seconds + REQUEST_DEADLINE_SECONDS


class MetricsEndpoint:
    """GET /metrics on the loop's selector, and the textfile; see the module docstring."""

    def __init__(self, host: str | None = None, port: int = 0, *, textfile: Textfile | None = None) -> None:
        """Bind and listen now if ``host`` is given (raises OSError if the address is unusable);
        serve after `start()`. ``textfile`` is written every ``textfile.interval_seconds``."""
        self._listener: socket.socket | None = None
        self.address: tuple[str, int] | None = None
        if host is not None:
            family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
            listener = socket.socket(family, socket.SOCK_STREAM | socket.SOCK_CLOEXEC)
            try:
                listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                listener.bind((host, port))
                listener.listen(LISTEN_BACKLOG)
            except OSError:
                listener.close()
                raise
            listener.setblocking(False)
            self._listener = listener
            self.address = listener.getsockname()[:2]
        self.textfile = textfile
        self._textfile_due_seconds = float("-inf")  # monotonic: written in the first turn
        self._selector: selectors.BaseSelector | None = None
        self._scrapes: list[Scrape] = []  # accept order; at most MAX_CONNECTIONS
        self._text: bytes | None = None
        self._rendered_seconds = float("-inf")
        self.wanted = False  # read by the loop at the end of each turn
        self._spare = SpareDescriptor()
        self._busy = RateLimitedLog(f"refused a metrics scrape: {MAX_CONNECTIONS} complete requests in progress")
        self._evictions = RateLimitedLog(f"closed an unfinished metrics scrape to make room: "
                                         f"{MAX_CONNECTIONS} in progress")

    @property
    def url(self) -> str | None:
        if self.address is None:
            return None
        host, port = self.address
        return f"http://[{host}]:{port}{PATH}" if ":" in host else f"http://{host}:{port}{PATH}"

    def start(self, selector: selectors.BaseSelector) -> None:
        """Serve from now on: the loop hands the events of ``selector`` keyed to it to `on_event`."""
        self._selector = selector
        if self._listener is not None:
            selector.register(self._listener, selectors.EVENT_READ, self)

    def owns(self, data: object) -> bool:
        """True for the selector data of the endpoint's sockets."""
        return data is self or type(data) is Scrape

    def close(self) -> None:
        for scrape in list(self._scrapes):
            self._close(scrape)
        if self._listener is not None:
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
        if mask & selectors.EVENT_READ and scrape.reading:
            self._receive(scrape, monotonic_seconds)
        if scrape.out and not scrape.closed:
            self._send(scrape)

    def next_deadline(self) -> float | None:
        """The monotonic second of the next scrape deadline or textfile write, if any."""
        deadlines = [scrape.deadline_seconds for scrape in self._scrapes]
        if self.textfile is not None:
            deadlines.append(self._textfile_due_seconds)
        return min(deadlines, default=None)

    def expire(self, monotonic_seconds: float) -> None:
        """Close the scrapes past a deadline, answered or not; want text if the textfile is due."""
        for scrape in [scrape for scrape in self._scrapes if scrape.deadline_seconds <= monotonic_seconds]:
            if scrape.reading:
                log.debug("metrics %s: no request head within %g s", scrape.name, HEAD_DEADLINE_SECONDS)
                self._refuse(scrape, _plain(408, f"no request head within {HEAD_DEADLINE_SECONDS:g} s\n"))
            else:
                log.debug("metrics %s: closed at its %g s deadline", scrape.name, REQUEST_DEADLINE_SECONDS)
                self._close(scrape)
        if self.textfile is not None and monotonic_seconds >= self._textfile_due_seconds:
            self.wanted = True

    def publish(self, text: str, monotonic_seconds: float) -> None:
        """Answer every scrape that waits for text with ``text`` (the loop just rendered it), and
        write the textfile if it is due."""
        self._text = text.encode()
        self._rendered_seconds = monotonic_seconds
        self.wanted = False
        for scrape in list(self._scrapes):
            if scrape.waiting:
                scrape.waiting = False
                scrape.out += response(200, self._text, CONTENT_TYPE)
                self._send(scrape)
        if self.textfile is not None and monotonic_seconds >= self._textfile_due_seconds:
            self.textfile.write(self._text, monotonic_seconds)
            self._textfile_due_seconds = monotonic_seconds + self.textfile.interval_seconds

    # -- connections ----------------------------------------------------------------

    def _accept(self, monotonic_seconds: float) -> None:
        assert self._listener is not None
        for _ in range(MAX_ACCEPTS_PER_TURN):  # the listener stays readable for the next turn
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
            scrape = Scrape(sock, f"{address[0]}:{address[1]}", peer_of(address[0]), monotonic_seconds)
            if not self._make_room(scrape.peer, monotonic_seconds):
                self._busy.event(monotonic_seconds, scrape.name)
                try:
                    # What already came is read, so that closing does not
                    # reset the connection before the 503 arrives.
                    sock.recv(MAX_REQUEST_HEAD_BYTES)
                    sock.send(_plain(503, "too many scrapes in progress; try again\n"))
                except OSError:
                    pass
                sock.close()
                continue
            self._scrapes.append(scrape)
            self._watch(scrape, selectors.EVENT_READ)
            self._receive(scrape, monotonic_seconds)  # a scraper sends its request as it connects

    def _make_room(self, peer: str, monotonic_seconds: float) -> bool:
        """Free a slot for a newcomer from ``peer`` if all are taken; False if none can be freed."""
        while len(self._scrapes) >= MAX_CONNECTIONS:
            victim = self._victim(peer)
            if victim is None:
                return False
            if victim.reading:
                # One last read: a request that came since the last turn is served, not evicted.
                self._receive(victim, monotonic_seconds)
                if victim.closed or not victim.reading:
                    continue
                self._evictions.event(monotonic_seconds, f"{victim.name}, for a newcomer from {peer}")
                self._refuse(victim, _plain(503, "closed to make room for another scrape; try again\n"))
            else:
                self._evictions.event(monotonic_seconds, f"{victim.name} (its answer not taken), "
                                                         f"for a newcomer from {peer}")
                self._close(victim)  # part of an answer is out: nothing more can be said
        return True

    def _victim(self, newcomer: str) -> Scrape | None:
        """The oldest unfinished scrape of the peer holding the most slots, the newcomer counted."""
        held = Counter(scrape.peer for scrape in self._scrapes)
        held[newcomer] += 1
        victim = None
        for scrape in self._scrapes:  # oldest first: a later one must hold strictly more to win
            if not scrape.waiting and (victim is None or held[scrape.peer] > held[victim.peer]):
                victim = scrape
        return victim

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
        log.debug("metrics %s: %s", scrape.name, one_line(head.split(b"\n", 1)[0].decode("latin-1"))[:200])
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

    def _refuse(self, scrape: Scrape, data: bytes) -> None:
        """Send ``data`` if the socket takes it at once, and close: nothing is waited for."""
        try:
            scrape.sock.send(data)
        except OSError:
            pass
        self._close(scrape)

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
