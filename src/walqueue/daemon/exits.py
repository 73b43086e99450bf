"""walqueued's exit codes, and the exception that carries one out of the loop."""

from __future__ import annotations

import errno

from walqueue.fs import NotARegularFile

EXIT_OK = 0
EXIT_FAILURE = 1
EXIT_USAGE = 2
EXIT_LOCKED = 3
EXIT_CORRUPT = 4
# The directory cannot be used as it is, and starting again will not change
# that: an operator must act (units: RestartPreventExitStatus=3 4 5 6).
EXIT_DIRECTORY_UNUSABLE = 5
# The directory, or a parent, lets another user plant files or links in it
# (walqueue.fs.check_directory_safety): refused before any file is opened.
EXIT_DIRECTORY_UNSAFE = 6
# What opening the directory raises when the fault is in the directory or its
# file system, not in the moment: a read-only mount, a permission, an entry of
# the wrong type (CURRENT a directory or a FIFO: walqueue.fs.NotARegularFile), a full disk.
OPERATOR_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM, errno.EISDIR, errno.ENOTDIR,
                             errno.ELOOP, errno.ENAMETOOLONG, errno.ENOSPC, errno.EDQUOT})


def open_failure_code(exc: OSError) -> int:
    """The exit code for an OSError from opening the directory at start."""
    if isinstance(exc, NotARegularFile) or exc.errno in OPERATOR_ERRNOS:
        return EXIT_DIRECTORY_UNUSABLE
    return EXIT_FAILURE


class DaemonExit(Exception):
    """Stop serving and exit with ``code`` (after the usual cleanup)."""

    def __init__(self, code: int, message: str) -> None:
        super().__init__(message)
        self.code = code
