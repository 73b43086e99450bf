"""The dashboard's connection bounds: the same as walqueued's metrics endpoint
(walqueue.daemon.metrics_http), so a browser tab left open, or a peer that
connects and says nothing, cannot take what the operators need.

* at most MAX_CONNECTIONS connections at a time; a request on one more is
  answered 503 and closed (uvicorn's `limit_concurrency`, which counts the
  refused connection itself, hence the + 1 in `server_options`);
* a request head must be complete HEAD_DEADLINE_SECONDS after the connection
  opened, or after the previous answer on a kept-alive connection: otherwise
  the connection is closed. A peer trickling one byte at a time holds a slot
  for at most that long;
* a request head is at most MAX_REQUEST_HEAD_BYTES (h11 refuses it beyond,
  400, and closes);
* a form body (the writes' POSTs) is at most MAX_FORM_BYTES, read by the app
  (walqueue.web.forms) before anything else is done with it;
* an idle kept-alive connection is closed after KEEP_ALIVE_SECONDS.

`BoundedH11Protocol` is uvicorn's h11 protocol with the head deadline added;
`server_options()` is the keyword arguments of `uvicorn.Config` that set the
rest. The figures are the metrics endpoint's, except its 1 s head deadline:
a browser behind a slow link or a TLS handshake needs more, so 5 s (the
metrics endpoint's whole-request deadline).
"""

from __future__ import annotations

import asyncio

from uvicorn.protocols.http.h11_impl import H11Protocol

MAX_CONNECTIONS = 8
HEAD_DEADLINE_SECONDS = 5.0
MAX_REQUEST_HEAD_BYTES = 8 * 1024
MAX_FORM_BYTES = 256 * 1024  # a page's worth of selected ids (100 ids of up to 1 KiB, encoded)
KEEP_ALIVE_SECONDS = 5


class BoundedH11Protocol(H11Protocol):
    """uvicorn's HTTP/1.1 protocol that closes a connection whose request head is not in
    HEAD_DEADLINE_SECONDS after it opened (or after its previous answer)."""

    _head_timer: asyncio.TimerHandle | None = None
    _head_cycle: object = None  # the request cycle the timer was armed after

    def connection_made(self, transport) -> None:  # type: ignore[override]
        super().connection_made(transport)
        self._arm_head_deadline()

    def handle_events(self) -> None:
        super().handle_events()
        if self.cycle is not None and self.cycle is not self._head_cycle:
            self._disarm_head_deadline()  # a new request's head is in

    def on_response_complete(self) -> None:
        super().on_response_complete()
        if not self.transport.is_closing() and self.cycle is not None and self.cycle.response_complete:
            self._head_cycle = self.cycle
            self._arm_head_deadline()

    def connection_lost(self, exc: Exception | None) -> None:
        self._disarm_head_deadline()
        super().connection_lost(exc)

    def _arm_head_deadline(self) -> None:
        self._disarm_head_deadline()
        self._head_timer = self.loop.call_later(HEAD_DEADLINE_SECONDS, self._head_too_late)

    def _disarm_head_deadline(self) -> None:
        if self._head_timer is not None:
            self._head_timer.cancel()
            self._head_timer = None

    def _head_too_late(self) -> None:
        self._head_timer = None
        if self.transport.is_closing():
            return
        self.logger.debug("closed a connection from %s: no request head within %g s",
                          self.client, HEAD_DEADLINE_SECONDS)
        self.transport.close()


def server_options() -> dict:
    """The `uvicorn.Config` keyword arguments that enforce the bounds above."""
    return {
        "http": BoundedH11Protocol,
        "limit_concurrency": MAX_CONNECTIONS + 1,  # uvicorn counts the connection it refuses
        "h11_max_incomplete_event_size": MAX_REQUEST_HEAD_BYTES,
        "timeout_keep_alive": KEEP_ALIVE_SECONDS,
        "ws": "none",
        "lifespan": "on",
        "server_header": False,
        "date_header": True,
    }
