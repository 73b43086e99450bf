"""A fake backend for walqueue-web's view tests: a dict of TaskViews with the calls the
dashboard makes (SPEC §8b's paged `tasks`, `cancel`, `workers`; revive, force_release,
daemon_stats where asked for), recording every listing's arguments so a test can check that
no page reads the whole queue. Not a queue: it models only what the pages show and change.
"""

from __future__ import annotations

import bisect
from dataclasses import replace

from walqueue import InvalidRequest, QueueStats, TaskView
from walqueue.backend import DAEMON_STATS, FORCE_RELEASE
from walqueue.protocol import DaemonStats


def task(task_id, status="ready", *, available_at=0, worker=None, deadline=None, attempts=0,
         max_attempts=3, payload=None, generation=0):
    return TaskView(task_id=task_id, key=task_id, status=status, attempts=attempts,
                    max_attempts=max_attempts, generation=generation, available_at=available_at,
                    deadline=deadline, worker=worker, payload=payload if payload is not None else {})


class WorkerRow:
    def __init__(self, worker, leases, connected):
        self.worker, self.leases, self.connected = worker, leases, connected


class FakeBackend:
    def __init__(self, tasks=(), *, daemon=True, clock=lambda: 1_000_000.0):
        self.capabilities = frozenset({DAEMON_STATS, FORCE_RELEASE}) if daemon else frozenset()
        self.by_id = {view.task_id: view for view in tasks}
        self.ids = sorted(self.by_id)
        self.listings: list[tuple] = []  # (status, after, limit) of every tasks() call
        self.calls: list[tuple] = []
        self.clock = clock
        self.closed = False
        self.open_connections = []  # what connections() answers
        self.expired = 0  # leases expired so far: daemon_stats().expired_total, or expired_total()

    def add(self, view):
        if view.task_id not in self.by_id:
            bisect.insort(self.ids, view.task_id)
        self.by_id[view.task_id] = view

    def get(self, task_id):
        return self.by_id.get(task_id)

    def tasks(self, status=None, *, after=None, limit=None):
        self.listings.append((status, after, limit))
        start = 0 if after is None else bisect.bisect_right(self.ids, after)
        for task_id in self.ids[start:]:
            if limit is not None and limit <= 0:
                return
            view = self.by_id[task_id]
            if status is None or view.status == status:
                if limit is not None:
                    limit -= 1
                yield view

    def stats(self):
        counts = {status: 0 for status in ("ready", "leased", "completed", "dead")}
        for view in self.by_id.values():
            counts[view.status] += 1
        return QueueStats(**counts, last_seq=0, snapshot_seq=0, wal_bytes=0)

    def daemon_stats(self):
        if DAEMON_STATS not in self.capabilities:
            raise AttributeError("daemon_stats")
        return DaemonStats(queue=self.stats(), oldest_ready_age_seconds=65, leases_past_half=0,
                           wal_segments=1, compact_wal_bytes=0, fsyncs_total=10, fsync_seconds_total=0.1,
                           fsync_p50_seconds=0.001, fsync_p99_seconds=0.0042, fsync_window=10,
                           requests_total=40, requests_per_fsync=4.0, write_failures_total=0,
                           compactions_total=2, last_compaction_seconds=0.5, connections=3,
                           parked_reserves=0, paused=False, uptime_seconds=100.0,
                           start_time_seconds=1.0, last_recovery_seconds=0.0, directory="/q",
                           slow_turns_total=7, expired_total=self.expired)

    def expired_total(self):  # PostgreSQL's count (walqueue.pg.Client.expired_total)
        return self.expired

    def revive(self, task_ids):
        task_ids = list(task_ids)
        self.calls.append(("revive", task_ids))
        for task_id in task_ids:
            view = self.by_id.get(task_id)
            if view is None or view.status != "dead":
                raise InvalidRequest(f"task {task_id!r} is not dead")
        for task_id in task_ids:
            self.by_id[task_id] = replace(self.by_id[task_id], status="ready", attempts=0)
        return task_ids

    def force_release(self, task_ids):
        task_ids = list(task_ids)
        self.calls.append(("force_release", task_ids))
        for task_id in task_ids:
            view = self.by_id.get(task_id)
            if view is None or view.status != "leased":
                raise InvalidRequest(f"task {task_id!r} is not leased")
        for task_id in task_ids:
            self.by_id[task_id] = replace(self.by_id[task_id], status="ready", worker=None, deadline=None)
        return task_ids

    def cancel(self, task_id):
        self.calls.append(("cancel", task_id))
        view = self.by_id.get(task_id)
        if view is None:
            raise InvalidRequest(f"no task {task_id!r}")
        if view.status == "leased":
            raise InvalidRequest(f"task {task_id!r} is leased by {view.worker!r}")
        if view.status in ("ready", "dead"):
            self.by_id[task_id] = replace(view, status="completed")

    def workers(self):
        held = {}
        for view in self.by_id.values():
            if view.worker is not None:
                held[view.worker] = held.get(view.worker, 0) + 1
        return [WorkerRow(worker, count, 1) for worker, count in sorted(held.items())]

    def connections(self):  # walqueued's (walqueue.protocol.ConnectionView); PostgreSQL has none
        if DAEMON_STATS not in self.capabilities:
            raise AttributeError("connections")
        return list(self.open_connections)

    def close(self):
        self.closed = True
