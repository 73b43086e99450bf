"""The backend of one walqueue-ctl invocation: walqueued's client, or walqueue.pg's.

`Ctl` is the group's context object (where the daemon is, how long to wait
for it, whether errors are JSON) that the commands share. Its `client` is
created on first use by `open_client`, the one place a backend is chosen,
so `verify` and `--help` never touch a socket; it is a `GuardedClient`, whose
exceptions arrive as CtlErrors, so commands call SPEC's methods plainly.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

from walqueue import WalQueueError
from walqueue.client import Client
from walqueue.ctl.errors import EXIT_USAGE, CtlError, error_for


class GuardedClient:
    """A client whose exceptions arrive as CtlErrors, so commands call SPEC's methods plainly."""

    def __init__(self, client: Any, path: str, dsn: str | None = None) -> None:
        self._client = client
        self._path = path
        self._dsn = dsn

    def __getattr__(self, method: str) -> Callable[..., Any]:
        call = getattr(self._client, method)

        def guarded(*args, **kwargs):
            try:
                return call(*args, **kwargs)
            except (WalQueueError, OSError) as exc:
                raise error_for(exc, self._path, self._dsn) from exc

        return guarded


# Tests replace this to run the commands against a fake daemon.
CLIENT_FACTORY: Callable[..., Any] = Client


@dataclasses.dataclass
class Ctl:
    """The group's context object: where the daemon is, and one lazily opened client."""

    socket_path: str
    timeout: float
    json: bool | None = None  # set by a command's --json once parsed
    dsn: str | None = None  # a PostgreSQL database instead of the daemon (SPEC §9)
    queue: str = "default"  # the queue in that database
    _client: Any = None

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                client = open_client(self)
            except (WalQueueError, OSError) as exc:
                raise error_for(exc, self.socket_path, self.dsn) from exc
            self._client = GuardedClient(client, self.socket_path, self.dsn)
        return self._client

    def close(self) -> None:
        if self._client is not None:
            self._client.close()
            self._client = None


def open_client(ctl: Ctl) -> Any:
    """The backend of this invocation: walqueued's client at ctl.socket_path, or
    walqueue.pg's Client for ctl.dsn.

    The one place a backend is chosen; commands only call SPEC's client
    methods. A PostgreSQL client never creates the schema here (`migrate`
    does, as a role allowed to) and runs no reaper of its own.
    """
    if ctl.dsn is not None:
        return postgres_backend().Client(ctl.dsn, queue=ctl.queue, migrate=False, reaper=False,
                                         listen=False, connect_seconds=ctl.timeout, retry_seconds=0)
    return CLIENT_FACTORY(ctl.socket_path, timeout=ctl.timeout, retry_seconds=0,
                          name="walqueue-ctl")


# walqueued's own commands: their message on PostgreSQL comes from walqueue.pg;
# top has no PostgreSQL counterpart of its own.
DAEMON_ONLY_COMMANDS = ("verify", "backup", "compact", "pause", "resume", "metrics", "top")


def postgres_backend():
    """walqueue.pg, imported only for --dsn (it needs the extra walqueue[postgres])."""
    try:
        import walqueue.pg as backend
    except ImportError as exc:
        raise CtlError(f"--dsn needs the PostgreSQL backend, which is not installed ({exc}): "
                       f"pip install 'walqueue[postgres]'", EXIT_USAGE, "UsageError") from None
    return backend


def refuse_on_postgres(command_name: str | None) -> None:
    """Exit 2, saying what to use instead, for a walqueued-only command under --dsn."""
    if command_name not in DAEMON_ONLY_COMMANDS:
        return
    messages = {**postgres_backend().UNSUPPORTED_COMMANDS,
                "top": "top shows walqueued's own figures; on PostgreSQL use `walqueue-ctl "
                       "--dsn URL stats` and pg_stat_activity"}
    raise CtlError(f"{command_name} is not available with --dsn: {messages[command_name]}",
                   EXIT_USAGE, "Unsupported")
