"""The backend of one walqueue-ctl invocation: walqueued's client, or walqueue.pg's.

`Ctl` is the group's context object (where the daemon is, how long to wait
for it, whether errors are JSON) that the commands share. Its `client` is
created on first use by `open_client`, the one place a backend is chosen,
so `verify` and `--help` never touch a socket; it is a `GuardedClient`, whose
exceptions arrive as CtlErrors, so commands call SPEC's methods plainly.

What a command may do is the backend's `capabilities` (walqueue.backend),
known from its class before anything connects: `refuse_unable` turns a
command whose capability the backend lacks into exit 2 with the reason and,
on PostgreSQL, the tool to use instead (walqueue.pg.UNSUPPORTED_COMMANDS).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Iterable
from typing import Any

from walqueue import WalQueueError
from walqueue.client import Client
from walqueue.ctl.errors import EXIT_USAGE, CtlError, error_for, not_found


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
    json: bool | None = None  # set by the group's --json, or a command's once parsed
    dsn: str | None = None  # a PostgreSQL database instead of the daemon (SPEC §9)
    queue: str = "default"  # the queue in that database
    _client: Any = None

    @property
    def capabilities(self) -> frozenset[str]:
        """What this invocation's backend does beyond the common calls, known before connecting."""
        backend = postgres_backend().Client if self.dsn is not None else Client
        return backend.capabilities

    @property
    def client(self) -> Any:
        if self._client is None:
            try:
                client = open_client(self)
            except (WalQueueError, OSError) as exc:
                raise error_for(exc, self.socket_path, self.dsn) from exc
            self._client = GuardedClient(client, self.socket_path, self.dsn)
        return self._client

    def unknown_task(self, task_ids: Iterable[str], consequence: str) -> CtlError | None:
        """NotFound (exit 7) for the first of `task_ids` the queue does not hold, or None.

        For a refused revive or force-release: the queue answers InvalidRequest
        for an unknown id and for a task in the wrong state alike.
        """
        for task_id in task_ids:
            if self.client.get(task_id) is None:
                return not_found(task_id, consequence)
        return None

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


# What to use instead of top on PostgreSQL; walqueue.pg says it for the other commands.
TOP_ON_POSTGRES = ("top shows walqueued's own figures; on PostgreSQL use `walqueue-ctl --dsn URL "
                   "stats` and pg_stat_activity")


def postgres_backend():
    """walqueue.pg, imported only for --dsn (it needs the extra walqueue[postgres])."""
    try:
        import walqueue.pg as backend
    except ImportError as exc:
        raise CtlError(f"--dsn needs the PostgreSQL backend, which is not installed ({exc}): "
                       f"from the clone, pip install -e '.[postgres]' (docs/postgres.md)", EXIT_USAGE, "UsageError") from None
    return backend


def refuse_unable(ctl: Ctl, command_name: str, needs: str | None, offline: bool) -> None:
    """Exit 2, saying why, if this backend cannot run the command.

    `needs` is the capability the command calls for (None: only the common
    calls); an `offline` command reads a walqueued directory itself, which a
    queue on PostgreSQL does not have.
    """
    able = needs is None or needs in ctl.capabilities
    if ctl.dsn is None:
        if able:
            return
        reason = f"this walqueued client lacks the capability {needs!r}"
    else:
        if able and not offline:
            return
        advice = {**postgres_backend().UNSUPPORTED_COMMANDS, "top": TOP_ON_POSTGRES}
        reason = advice.get(command_name) or (f"the PostgreSQL backend lacks the capability "
                                              f"{needs!r} (walqueue.backend)")
    where = "--dsn" if ctl.dsn is not None else "walqueued"
    raise CtlError(f"{command_name} is not available with {where}: {reason}", EXIT_USAGE,
                   "Unsupported")
