"""An in-memory backend for the Workers: SPEC §2's lease rules for the calls a Worker makes,
with no daemon and no database, and faults to inject. ``MemoryClient`` is its sync face,
``AsyncMemoryClient`` its asyncio face: neither is walqueue.client nor walqueue.pg, which
is the point (the Workers need only walqueue.worker.policy's contract)."""

import threading

from walqueue import Lease, StaleLease, TaskView
from walqueue.errors import Unavailable


class LostAnswer(Unavailable):
    """Stands for DaemonUnavailable / DatabaseUnavailable: the Workers catch the base class."""


class MemoryQueue:
    """Tasks and leases; ``now`` comes from the test's clock."""

    def __init__(self, clock):
        self.clock = clock
        self.tasks = {}
        self.calls = []  # (operation, task_id or worker, ...) in call order
        self.faults = {}  # operation -> list of "lost" (applied, answer lost), "down" (not applied), None
        self._lock = threading.Lock()

    def put(self, task_id, payload=None, *, max_attempts=3, available_at=0):
        self.tasks[task_id] = {"status": "ready", "attempts": 0, "max_attempts": max_attempts, "generation": 0,
                               "available_at": available_at, "deadline": None, "worker": None,
                               "payload": payload or {}}

    def view(self, task_id):
        task = self.tasks.get(task_id)
        if task is None:
            return None
        return TaskView(task_id, task_id, task["status"], task["attempts"], task["max_attempts"], task["generation"],
                        task["available_at"], task["deadline"], task["worker"], dict(task["payload"]))

    def call(self, operation, subject, apply, *details):
        with self._lock:
            self.calls.append((operation, subject, *details))
            faults = self.faults.get(operation)
            fault = faults.pop(0) if faults else None
            if fault == "down":
                raise LostAnswer(f"{operation}: the service is down")
            value = apply()
            if fault == "lost":
                raise LostAnswer(f"{operation}: the answer was lost")
            return value

    def _reap(self, now):
        for task in self.tasks.values():
            if task["status"] == "leased" and task["deadline"] <= now:
                dead = task["attempts"] >= task["max_attempts"]
                task.update(status="dead" if dead else "ready", available_at=task["deadline"], deadline=None,
                            worker=None)

    def reserve(self, worker, lease_seconds, limit):
        now = int(self.clock.now())
        self._reap(now)
        due = sorted((task["available_at"], task_id) for task_id, task in self.tasks.items()
                     if task["status"] == "ready" and task["available_at"] <= now)
        leases = []
        for _, task_id in due[:limit]:
            task = self.tasks[task_id]
            task.update(status="leased", attempts=task["attempts"] + 1, generation=task["generation"] + 1,
                        worker=worker, deadline=now + lease_seconds)
            leases.append(Lease(task_id, worker, task["generation"], task["deadline"], task["attempts"],
                                dict(task["payload"])))
        return leases

    def current(self, lease):
        now = int(self.clock.now())
        self._reap(now)
        task = self.tasks.get(lease.task_id)
        if (task is None or task["status"] != "leased" or task["generation"] != lease.generation
                or task["worker"] != lease.worker):
            raise StaleLease(f"task {lease.task_id!r}: stale", task_id=lease.task_id,
                             status=None if task is None else task["status"],
                             generation=None if task is None else task["generation"])
        return task

    def ack(self, lease):
        self.current(lease).update(status="completed", deadline=None, worker=None, payload={})

    def release(self, lease, delay):
        task = self.current(lease)
        dead = task["attempts"] >= task["max_attempts"]
        task.update(status="dead" if dead else "ready", available_at=int(self.clock.now()) + delay, deadline=None,
                    worker=None)

    def touch(self, lease, lease_seconds):
        task = self.current(lease)
        task["deadline"] = int(self.clock.now()) + lease_seconds
        return Lease(lease.task_id, lease.worker, lease.generation, task["deadline"], lease.attempts, lease.payload)


class MemoryClient:
    """The sync face: the six methods of the Worker's backend contract, and ``closed``."""

    def __init__(self, queue):
        self.queue = queue
        self.closed = False

    def reserve(self, worker, *, lease_seconds=30, limit=1, wait=0):
        return self.queue.call("reserve", worker, lambda: self.queue.reserve(worker, lease_seconds, limit), wait,
                               limit)

    def ack(self, lease):
        return self.queue.call("ack", lease.task_id, lambda: self.queue.ack(lease))

    def ack_and_reserve(self, lease, *, lease_seconds=30, limit=1, wait=0):
        def apply():
            self.queue.ack(lease)
            return self.queue.reserve(lease.worker, lease_seconds, limit)

        return self.queue.call("ack_and_reserve", lease.task_id, apply, wait)

    def release(self, lease, *, delay=0):
        return self.queue.call("release", lease.task_id, lambda: self.queue.release(lease, delay), delay)

    def touch(self, lease, *, lease_seconds):
        return self.queue.call("touch", lease.task_id, lambda: self.queue.touch(lease, lease_seconds))

    def get(self, task_id):
        return self.queue.call("get", task_id, lambda: self.queue.view(task_id))


class AsyncMemoryClient:
    """The asyncio face of the same queue."""

    def __init__(self, queue):
        self._sync = MemoryClient(queue)
        self.queue = queue

    @property
    def closed(self):
        return self._sync.closed

    async def reserve(self, worker, **options):
        return self._sync.reserve(worker, **options)

    async def ack(self, lease):
        return self._sync.ack(lease)

    async def ack_and_reserve(self, lease, **options):
        return self._sync.ack_and_reserve(lease, **options)

    async def release(self, lease, **options):
        return self._sync.release(lease, **options)

    async def touch(self, lease, **options):
        return self._sync.touch(lease, **options)

    async def get(self, task_id):
        return self._sync.get(task_id)
