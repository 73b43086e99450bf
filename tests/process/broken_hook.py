"""TEST ONLY: the kill hook, inside a walqueued running a deliberately broken library or daemon.

``--test-hook tests.process.broken_hook:hook`` with ``WALQUEUE_BROKEN=<name>``
in the daemon's environment patches the variant ``name`` into the daemon's
process when walqueued loads the hook (before it opens its Queue), and keeps
it for the life of the process; the hook itself is tests/process/kill_hook.py's.
``name`` is a library variant of tests/broken.py or one of the daemon variants
below (``DAEMON_VARIANTS``), which only a running walqueued can show and so
are kept out of the library suites that tests/crash/test_broken_variants.py
runs every tests/broken.py variant through. The crash harness uses it to
show that real kills catch a broken library, not only that they pass a
working one.
"""

from __future__ import annotations

import contextlib
import os
import sys
from collections.abc import Callable, Iterator
from unittest import mock

from tests import broken
from walqueue import protocol as p
from walqueue.errors import InvalidRequest, KeyConflict, StaleLease

from .kill_hook import hook


def _reserving_before_acking(real_handle: Callable) -> Callable:
    def _handle(self, conn, request, now):
        """ack_and_reserve that leases first "so the ack cannot hold up the next task": the
        reserve frame precedes the ack frame, and a stale ack leaves its leases granted."""
        if not isinstance(request, p.AckReserve):
            return real_handle(self, conn, request, now)
        try:
            leases = self._lease_due(request.worker, now, request.lease_seconds, request.limit)
            self.queue.ack(self._lease(request), now=now)
        except (InvalidRequest, KeyConflict, StaleLease) as exc:
            self._answer(conn, request.id, [p.error_to_wire(request.id, exc)])
            return None
        self._answer(conn, request.id, self._lease_messages(request.id, leases))
        return None
    return _handle


def _reserving_after_a_stale_ack(real_handle: Callable) -> Callable:
    def _handle(self, conn, request, now):
        """ack_and_reserve that leases even when the ack is refused ("the worker is free either way"),
        then answers StaleLease: the leases are granted to a worker that never hears of them."""
        if not isinstance(request, p.AckReserve):
            return real_handle(self, conn, request, now)
        try:
            self.queue.ack(self._lease(request), now=now)
        except StaleLease as exc:
            self._lease_due(request.worker, now, request.lease_seconds, request.limit)
            self._answer(conn, request.id, [p.error_to_wire(request.id, exc)])
            return None
        except (InvalidRequest, KeyConflict) as exc:
            self._answer(conn, request.id, [p.error_to_wire(request.id, exc)])
            return None
        self._reserve(conn, request, now)
        return None
    return _handle


@contextlib.contextmanager
def _patch_running_server(method: str, wrap: Callable[[Callable], Callable]) -> Iterator[None]:
    """Patch ``Server.method`` of the walqueued module this process runs.

    ``python -m walqueue.server`` runs it as ``__main__``, a module object other
    than an imported ``walqueue.server``: both are patched when present.
    """
    with contextlib.ExitStack() as stack:
        for name in ("__main__", "walqueue.server"):
            module = sys.modules.get(name)
            server = getattr(module, "Server", None)
            if server is not None and hasattr(server, method) \
                    and getattr(module, "__file__", "").endswith(os.path.join("walqueue", "server.py")):
                stack.enter_context(mock.patch.object(server, method, wrap(getattr(server, method))))
        yield


DAEMON_VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "ack_and_reserve_reserves_before_acking":
        lambda: _patch_running_server("_handle", _reserving_before_acking),
    "ack_and_reserve_reserves_after_a_stale_ack":
        lambda: _patch_running_server("_handle", _reserving_after_a_stale_ack),
}


def active(name: str) -> contextlib.AbstractContextManager:
    """The named variant, library (tests/broken.py) or daemon. KeyError for an unknown name."""
    if name in DAEMON_VARIANTS:
        return DAEMON_VARIANTS[name]()
    return broken.active(name)


_variant = contextlib.ExitStack()
if os.environ.get("WALQUEUE_BROKEN"):
    _variant.enter_context(active(os.environ["WALQUEUE_BROKEN"]))

__all__ = ["hook"]
