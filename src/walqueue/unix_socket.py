"""Unix socket addresses longer than sun_path allows, for the daemon and its clients alike.

Daemon layer, shared: walqueued binds its socket through `unix_address` and
walqueue.client connects through it, so neither imports the other.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

# sun_path holds 108 bytes including the terminating NUL.
MAX_SOCKET_PATH_BYTES = 107


@contextlib.contextmanager
def unix_address(path: str) -> Iterator[str]:
    """An address for ``path`` that fits in sun_path.

    A longer path is reached through the parent directory's descriptor
    (``/proc/self/fd/N/NAME``, Linux), which works for bind and connect alike.
    """
    if len(os.fsencode(path)) <= MAX_SOCKET_PATH_BYTES:
        yield path
        return
    parent, name = os.path.split(os.path.abspath(path))
    fd = os.open(parent, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        yield f"/proc/self/fd/{fd}/{name}"
    finally:
        os.close(fd)
