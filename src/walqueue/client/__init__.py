"""``walqueue.client``: the client of walqueued (SPEC §8), one core under two thin shells.

    calls.py     without I/O: API arguments to requests, answers to values and exceptions
    api.py       SPEC §8's methods, written once for both clients
    address.py   the socket path, sun_path, and what a failed connect means
    blocking.py  the sync shell: Connection and Client over blocking sockets
    (walqueue.aio is the asyncio shell over the same core; walqueue.retry, shared
    with walqueue.pg, says which calls are retried, for how long, the back-off)

This package exports the public names: ``Client``, ``Connection``,
``DaemonUnavailable`` (and ``NoSocket``, the kind raised at once for a path
that is not a socket), ``socket_path``, ``unix_address``, ``SOCKET_NAME``,
and the I/O-free call builders that tools use to pipeline.
"""

from walqueue.client.address import SOCKET_NAME, socket_path, unix_address
from walqueue.client.api import DEFAULT_TIMEOUT_SECONDS
from walqueue.client.blocking import Client, Connection
from walqueue.client.calls import (
    Call,
    DaemonUnavailable,
    NoSocket,
    ack_and_reserve_call,
    ack_call,
    backup_begin_call,
    backup_end_call,
    compact_call,
    complete,
    daemon_stats_call,
    encode_request,
    force_release_call,
    get_call,
    hello_answer,
    hello_request,
    pause_call,
    put_call,
    put_many_call,
    release_call,
    reserve_call,
    result,
    resume_call,
    revive_call,
    stats_call,
    tasks_call,
    touch_call,
)
from walqueue.retry import DEFAULT_RETRY_SECONDS

__all__ = [
    "DEFAULT_RETRY_SECONDS", "DEFAULT_TIMEOUT_SECONDS", "SOCKET_NAME", "Call", "Client", "Connection",
    "DaemonUnavailable", "NoSocket", "ack_and_reserve_call", "ack_call", "backup_begin_call",
    "backup_end_call", "compact_call", "complete", "daemon_stats_call", "encode_request", "get_call",
    "hello_answer", "hello_request", "pause_call", "put_call", "put_many_call", "release_call",
    "reserve_call", "result", "resume_call", "revive_call", "force_release_call", "socket_path", "stats_call", "tasks_call",
    "touch_call", "unix_address",
]
