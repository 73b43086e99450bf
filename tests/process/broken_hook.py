"""TEST ONLY: the kill hook, inside a walqueued running a deliberately broken library or daemon.

``--test-hook tests.process.broken_hook:hook`` with ``WALQUEUE_BROKEN=<name>``
in the daemon's environment patches the variant ``name`` into the daemon's
process when walqueued loads the hook (before it opens its Engine), and keeps
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
import math
import os
import time
from collections.abc import Callable
from unittest import mock

from tests import broken
from walqueue.daemon import compaction
from walqueue.daemon.compaction import ChildReport, Compactor, InFlight, SnapshotChild
from walqueue.daemon.service import QueueService
from walqueue.engine import Engine
from walqueue.errors import StaleLease

from .kill_hook import child_hook, hook

CHILD_WRITE_SECONDS = 0.5  # the time _publishing_when_the_child_starts' child takes to write


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
    """Patch ``QueueService.method`` of walqueued's sans-IO service (before the daemon builds it)."""
    return mock.patch.object(QueueService, method, wrap(getattr(QueueService, method)))


@contextlib.contextmanager
def _publishing_when_the_child_starts():
    """A snapshot child taken for done once it has started ("it forked, the snapshot is on its way"):
    CURRENT is published, and the covered WAL deleted, before the child's fsync.

    The harness's snapshots are a few KB, which a child may write before the
    loop's next turn publishes: the damage would then depend on who wins that
    race (the suite run beside another once let the child win three seeds in
    a row). So the child here first waits CHILD_WRITE_SECONDS, as writing any
    real snapshot takes time; the real library does not mind (it publishes
    only after the child exits), this variant's CURRENT then names a file
    still being written whenever a kill follows the publication.
    """
    real_write = Engine.write_compaction_snapshot

    def poll(self):
        if self.report is None:
            self.report = ChildReport(True, snapshot_bytes=0)
        return self.report

    def slow_write(self, compaction_in_steps, **options):
        time.sleep(CHILD_WRITE_SECONDS)
        return real_write(self, compaction_in_steps, **options)

    with mock.patch.object(SnapshotChild, "poll", poll), \
            mock.patch.object(Engine, "write_compaction_snapshot", slow_write):
        yield


@contextlib.contextmanager
def _forking_after_the_next_turn():
    """A compaction that fixes its seq at the end of one turn but forks at the end of the next
    ("the fork can wait for a quieter turn"), with the library's seq guard bypassed in the child:
    the snapshot named S holds the state after the next turn's requests too."""
    begun: dict[Compactor, tuple] = {}
    real_maybe_start = Compactor.maybe_start
    real_write = Engine.write_compaction_snapshot

    def _start(self, queue, reason, now):
        compaction_in_steps = queue.begin_compaction()
        if compaction_in_steps is not None:
            begun[self] = (queue, compaction_in_steps, reason, now)

    def maybe_start(self, wrote, **options):
        if self not in begun:
            return real_maybe_start(self, wrote, **options)
        queue, compaction_in_steps, reason, now = begun.pop(self)
        child = SnapshotChild(queue, compaction_in_steps, self.directory, self._child_hook)
        self.in_flight = InFlight(compaction_in_steps, child, now, reason, deadline=math.inf)
        self._watch(child.fileno())

    def write_compaction_snapshot(self, compaction_in_steps, **options):
        self._state.last_seq = compaction_in_steps.seq  # in the child: "the guard is only a check"
        return real_write(self, compaction_in_steps, **options)

    with mock.patch.object(Compactor, "_start", _start), \
            mock.patch.object(Compactor, "maybe_start", maybe_start), \
            mock.patch.object(Engine, "write_compaction_snapshot", write_compaction_snapshot):
        yield


def _finishing_with_deletes_first() -> contextlib.AbstractContextManager:
    """finish_compaction that deletes the covered WAL and the old snapshot before publishing CURRENT
    ("it is replaced next anyway"): the daemon's twin of tests/broken.py's
    compaction_deletes_before_publishing, which patches compact()'s steps, a path walqueued no
    longer takes. A crash in between leaves CURRENT naming a deleted snapshot, or a WAL gap."""
    def finish_compaction(self, compaction_in_steps):
        self._check_open()
        self._check_in_progress(compaction_in_steps)
        self._compaction = None
        try:
            self._call_hook("snapshot.after_write")
            self._delete_covered(compaction_in_steps.seq)
            self._publish(compaction_in_steps.seq)
        except BaseException:
            self._die()
            raise
        return compaction_in_steps.seq
    return mock.patch.object(Engine, "finish_compaction", finish_compaction)


def _outliving_the_parent() -> contextlib.AbstractContextManager:
    """A snapshot child that neither asks to die with its parent nor closes what it inherited
    ("it only writes a file"): a killed daemon's child lives on, holding the directory's LOCK."""
    stack = contextlib.ExitStack()
    stack.enter_context(mock.patch.object(compaction, "_die_with_parent", lambda parent_pid: None))
    stack.enter_context(mock.patch.object(compaction, "_close_inherited_descriptors", lambda keep_fd: None))
    return stack


DAEMON_VARIANTS: dict[str, Callable[[], contextlib.AbstractContextManager]] = {
    "ack_and_reserve_reserves_before_acking":
        lambda: _patch_service("_ack_and_reserve", _reserving_before_acking),
    "ack_and_reserve_reserves_after_a_stale_ack":
        lambda: _patch_service("_ack_and_reserve", _reserving_after_a_stale_ack),
    "stats_handler_has_a_bug":
        lambda: _patch_service("_stats", _stats_with_a_bug),
    "compaction_publishes_when_the_child_starts": _publishing_when_the_child_starts,
    "compaction_forks_after_the_next_turn": _forking_after_the_next_turn,
    "compaction_finish_deletes_before_publishing": _finishing_with_deletes_first,
    "snapshot_child_outlives_its_parent": _outliving_the_parent,
}


def active(name: str) -> contextlib.AbstractContextManager:
    """The named variant, library (tests/broken.py) or daemon. KeyError for an unknown name."""
    if name in DAEMON_VARIANTS:
        return DAEMON_VARIANTS[name]()
    return broken.active(name)


_variant = contextlib.ExitStack()
if os.environ.get("WALQUEUE_BROKEN"):
    _variant.enter_context(active(os.environ["WALQUEUE_BROKEN"]))

__all__ = ["child_hook", "hook"]
