"""walqueued's exit codes, and the exception that carries one out of the loop."""

from __future__ import annotations

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_LOCKED = 3
EXIT_CORRUPT = 4


class DaemonExit(Exception):
    """Stop serving and exit with ``code`` (after the usual cleanup)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
