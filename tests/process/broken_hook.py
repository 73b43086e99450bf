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
from collections.abc import Callable
from unittest import mock

from tests import broken
from walqueue.daemon.service import Service
from walqueue.errors import StaleLease

from .kill_hook import hook


def _reserving_before_acking(real: Callable) -> Callable:
    def _ack_and_reserve(self, peer, request):
        """ack_and_reserve that leases first "so the ack cannot hold up the next task": the
        reserve frame precedes the ack frame, and a stale ack leaves its leases granted."""
        leases = self._lease_due(request.worker, request.lease_seconds, request.limit)
        self.queue.ack(request, now=self.now)
        self._answer_leases(peer, request.id, leases)
    return _ack_and_reserve


def _reserving_after_a_stale_ack(real: Callable) -> Callable:
    def _ack_and_reserve(self, peer, request):
        """ack_and_reserve that leases even when the ack is refused ("the worker is free either way"),
        then answers StaleLease: the leases are granted to a worker that never hears of them."""
        try:
            self.queue.ack(request, now=self.now)
        except StaleLease:
            self._lease_due(request.worker, request.lease_seconds, request.limit)
            raise
        self._reserve_or_park(peer, request)
    return _ack_and_reserve


def _stats_with_a_bug(real: Callable) -> Callable:
    def _stats(self, peer, request):
        """A handler with a bug in it (not a broken library: the daemon must stop, loudly)."""
        raise TypeError("stats() takes a bug, got a request")
    return _stats


def _patch_service(method: str, wrap: Callable[[Callable], Callable]) -> contextlib.AbstractContextManager:
    """Patch ``Service.method`` of walqueued's sans-IO service (before the daemon builds it)."""
    return mock.patch.object(Service, method, wrap(getattr(Service, method)))


DAEMON_VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "ack_and_reserve_reserves_before_acking":
        lambda: _patch_service("_ack_and_reserve", _reserving_before_acking),
    "ack_and_reserve_reserves_after_a_stale_ack":
        lambda: _patch_service("_ack_and_reserve", _reserving_after_a_stale_ack),
    "stats_handler_has_a_bug":
        lambda: _patch_service("_stats", _stats_with_a_bug),
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
