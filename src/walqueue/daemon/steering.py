"""SPEC §8b's operator calls on the sans-IO service: cancel, workers, and listing in pages.

`SteeringRequests` is a part of walqueue.daemon.service.QueueService (a base
class of it, so the service's table holds these handlers beside the others);
`WorkerNames` is what the service remembers of the worker names each open
connection used.

* Cancel: the Queue writes the records (walqueue.cancel) inside the turn's
  batch, so the answer goes out after the turn's one fsync, like any write.
* Workers: every worker name that holds a lease (the Queue's lease holders)
  or that a connection open now used in a request that succeeded (reserve,
  ack, release, touch, ack_and_reserve), in name order. A connection counts
  at most MAX_WORKER_NAMES_PER_CONNECTION names (its most recent), so a
  client inventing names cannot make the daemon's memory grow.
* Connections (not SPEC's; walqueue-web's Workers page and `walqueue-ctl
  workers --connections`): each open connection that sent a request, in the
  order of its first one, with its worker names, the leases they hold, its
  requests and its last request's age. `Activity` keeps two numbers per
  open connection, noted on every request (a dict lookup: the hot path).
* Pages: ``TasksPage`` is answered at once, in the turn, with at most
  ``limit`` views (walqueue.listing.MAX_PAGE_TASKS): O(limit), never O(tasks).

No I/O, no clock, like the service.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from walqueue import WorkerView, protocol
from walqueue.engine import view_of

Peer = Any  # walqueue.daemon.service.Peer (which imports this module)

MAX_WORKER_NAMES_PER_CONNECTION = 64


class WorkerNames:
    """The worker names each open connection used (its most recent, bounded), by connection."""

    def __init__(self) -> None:
        self._by_peer: dict[int, dict[str, None]] = {}   # id(peer) -> names, oldest first
        self._peers_using: dict[str, int] = {}           # name -> how many connections use it

    def note(self, peer: Peer, worker: str) -> None:
        names = self._by_peer.setdefault(id(peer), {})
        if worker in names:
            names[worker] = names.pop(worker)  # the most recent last
            return
        names[worker] = None
        self._peers_using[worker] = self._peers_using.get(worker, 0) + 1
        if len(names) > MAX_WORKER_NAMES_PER_CONNECTION:
            self._drop(next(iter(names)), names)

    def forget(self, peer: Peer) -> None:
        """The connection closed: its names count no more."""
        names = self._by_peer.pop(id(peer), {})
        for worker in list(names):
            self._drop(worker, names)

    def _drop(self, worker: str, names: dict[str, None]) -> None:
        del names[worker]
        left = self._peers_using[worker] - 1
        if left:
            self._peers_using[worker] = left
        else:
            del self._peers_using[worker]

    def connected(self) -> set[str]:
        return set(self._peers_using)

    def of(self, peer: Peer) -> list[str]:
        """The names `peer` used (its most recent), by name."""
        return sorted(self._by_peer.get(id(peer), ()))


class Activity:
    """Each open connection's requests and the monotonic time of its last one, in the order of
    its first request."""

    def __init__(self) -> None:
        self._by_peer: dict[int, list] = {}   # id(peer) -> [peer, requests, last request's seconds]

    def note(self, peer: Peer, monotonic_seconds: float) -> None:
        entry = self._by_peer.get(id(peer))
        if entry is None:
            self._by_peer[id(peer)] = [peer, 1, monotonic_seconds]
        else:
            entry[1] += 1
            entry[2] = monotonic_seconds

    def forget(self, peer: Peer) -> None:
        self._by_peer.pop(id(peer), None)

    def view(self, names: WorkerNames, lease_holders: list[tuple[str, int]],
             monotonic_seconds: float) -> list[protocol.ConnectionView]:
        leases = dict(lease_holders)
        views = []
        for peer, requests, last_seconds in self._by_peer.values():
            workers = names.of(peer)
            views.append(protocol.ConnectionView(peer.name, tuple(workers),
                                                 sum(leases.get(worker, 0) for worker in workers),
                                                 requests, max(0.0, monotonic_seconds - last_seconds)))
        return views


def workers_view(lease_holders: list[tuple[str, int]], connected: set[str]) -> list[WorkerView]:
    """The daemon's answer: lease holders (worker, leases) and connected names merged, by name."""
    leases = dict(lease_holders)
    return [WorkerView(worker, leases.get(worker, 0), worker in connected)
            for worker in sorted(leases.keys() | connected)]


class SteeringRequests:
    """The handlers of Cancel, Workers and TasksPage (mixed into QueueService)."""

    queue: Any  # the service's walqueue.engine.Engine
    now: int
    monotonic_seconds: float
    worker_names: WorkerNames
    activity: Activity

    _chunked: Callable[[int, list, type], list]  # walqueue.daemon.service.chunked

    def _answer(self, peer: Peer, request_id: int | None, messages: list) -> None:  # the service's
        raise NotImplementedError

    def _steering_handlers(self) -> dict[type, Any]:
        return {protocol.Cancel: self._cancel, protocol.Workers: self._workers,
                protocol.TasksPage: self._tasks_page, protocol.Connections: self._connections}

    def _cancel(self, peer: Peer, request: protocol.Cancel) -> None:
        self.queue.cancel(request.task_id, now=self.now)
        self._answer(peer, request.id, [protocol.Done(id=request.id)])

    def _workers(self, peer: Peer, request: protocol.Workers) -> None:
        views = workers_view(self.queue.lease_holders(), self.worker_names.connected())
        self._answer(peer, request.id, [protocol.WorkerList(id=request.id, workers=views)])

    def _connections(self, peer: Peer, request: protocol.Connections) -> None:
        views = self.activity.view(self.worker_names, self.queue.lease_holders(), self.monotonic_seconds)
        self._answer(peer, request.id, [protocol.ConnectionList(id=request.id, connections=views)])

    def _tasks_page(self, peer: Peer, request: protocol.TasksPage) -> None:
        tasks = self.queue.page(request.status, after=request.after, limit=request.limit)
        items = [protocol.Raw(protocol.encode_value(view_of(task))) for task in tasks]
        self._answer(peer, request.id, self._chunked(request.id, items, protocol.TaskList))
