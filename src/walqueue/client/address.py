"""Where a client finds walqueued, and what a failed connect means.

``socket_path`` maps a queue directory to its ``walqueued.sock``;
``unix_address`` (from ``walqueue.unix_socket``, shared with the daemon)
makes any path fit in ``sun_path``; ``connect_error`` turns
the ``OSError`` of a failed connect into the ``DaemonUnavailable`` that says
why. A path that does not exist, or exists and is not a socket, is a mistake
to report at once (``NoSocket``, never retried) on a client that has never
reached a daemon there; once it has, a missing socket file is a daemon
restarting (walqueued removes its socket when it stops) and stays a plain,
retryable ``DaemonUnavailable``, as does a refused connect on a socket file.
"""

from __future__ import annotations

import os
import stat

from walqueue.client.calls import DaemonUnavailable, NoSocket
from walqueue.dsn import redacted
from walqueue.unix_socket import MAX_SOCKET_PATH_BYTES, unix_address  # noqa: F401 (re-exported)

SOCKET_NAME = "walqueued.sock"
_FILE_KINDS = ((stat.S_ISREG, "a regular file"), (stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO"),
               (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
               (stat.S_ISLNK, "a dangling symbolic link"))


def socket_path(socket_or_directory: str | os.PathLike) -> str:
    """A directory means its ``walqueued.sock``; anything else is the socket path."""
    path = os.fspath(socket_or_directory)
    if os.path.isdir(path):
        return os.path.join(path, SOCKET_NAME)
    return path


def not_a_socket(path: str) -> str | None:
    """Why nothing can listen at ``path`` (it is missing, or not a socket); None if it is a socket."""
    try:
        mode = os.stat(path).st_mode
    except FileNotFoundError:
        try:
            mode = os.lstat(path).st_mode
        except FileNotFoundError:
            return "no such file"
    except OSError:
        return None  # e.g. permission denied on a parent: connect's own error says it
    if stat.S_ISSOCK(mode):
        return None
    kind = next((name for test, name in _FILE_KINDS if test(mode)), "a file of another kind")
    return f"it is {kind}, not a socket"


def connect_error(path: str, error: OSError, *, reached_before: bool) -> DaemonUnavailable:
    """The DaemonUnavailable for a connect to ``path`` that failed with ``error``.

    ``NoSocket`` (not retried) when the path is not a socket, or is missing
    and this client never reached a daemon there; a plain DaemonUnavailable
    otherwise (a refused connect on a socket file: a daemon restarting).
    """
    reason = not_a_socket(path) if isinstance(error, FileNotFoundError | ConnectionRefusedError) else None
    path = redacted(path)  # a PostgreSQL key=value DSN taken for a path (SPEC §9) keeps its password
    if reason == "no such file" and reached_before:
        return DaemonUnavailable(f"cannot connect to walqueued at {path}: no such file "
                                 "(the daemon removes it when it stops: restarting?)")
    if reason is not None:
        hint = ("is walqueued running, with this --socket? A queue directory means "
                f"DIRECTORY/{SOCKET_NAME}") if reason == "no such file" else "is this the daemon's --socket?"
        return NoSocket(f"cannot connect to walqueued at {path}: {reason} ({hint})")
    return DaemonUnavailable(f"cannot connect to walqueued at {path}: {error}")
