"""``walqueue.client``: the client of walqueued (SPEC §8), one core under two thin shells.

    calls.py     without I/O: API arguments to requests, answers to values and exceptions
    api.py       SPEC §8's methods, written once for both clients
    address.py   the socket path, sun_path, and what a failed connect means
    blocking.py  the sync shell: Connection and Client over blocking sockets
    aio.py       the asyncio shell over the same core: AsyncConnection and Client
                 (not imported here: ``walqueue.client.aio.Client``); walqueue.retry,
                 shared with walqueue.pg, says which calls are retried, for how long

This package exports the public names: ``Client``, ``Connection``,
``DaemonUnavailable`` (and ``NoSocket``, the kind raised at once for a path
that is not a socket), ``socket_path``, ``unix_address``, ``SOCKET_NAME``,
and the I/O-free call builders that tools use to pipeline.
"""

from walqueue.client import calls
from walqueue.client.address import SOCKET_NAME, socket_path, unix_address
from walqueue.client.api import DEFAULT_TIMEOUT_SECONDS
from walqueue.client.blocking import Client, Connection
from walqueue.client.calls import *  # noqa: F403 - its __all__: the call builders, Call, the errors
from walqueue.retry import DEFAULT_RETRY_SECONDS

__all__ = [
    "DEFAULT_RETRY_SECONDS", "DEFAULT_TIMEOUT_SECONDS", "SOCKET_NAME", "Client", "Connection", "socket_path",
    "unix_address", *calls.__all__,
]
