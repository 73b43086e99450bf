"""``walqueue.aio``: the asyncio Client and Worker in one import, as docs/daemon.md has shown them
since 0.2. They live in ``walqueue.client.aio`` and ``walqueue.worker.aio``."""

from walqueue.client.aio import AsyncConnection, Client, DaemonUnavailable
from walqueue.worker.aio import Worker

__all__ = ["AsyncConnection", "Client", "DaemonUnavailable", "Worker"]
