"""walqueued's ``--metrics-textfile PATH``: the metrics text written to a file for node_exporter.

node_exporter's textfile collector reads every ``*.prom`` file in its
``--collector.textfile.directory`` at each scrape. The daemon renders its
report every ``--metrics-textfile-interval`` seconds in its own loop (the
metrics endpoint asks for the text, walqueue.daemon.metrics_http) and
writes it here. No connection is involved, so no local user can keep
Prometheus from it, and the shipped units' ``PrivateNetwork=yes`` stays.

A write, so that a reader sees the old file or the new one, never half a file:

1. unlink ``PATH.tmp`` if it is there (left by a crash, or planted);
2. create ``PATH.tmp`` with ``O_EXCL | O_NOFOLLOW`` (never through a link),
   set its mode to exactly ``--metrics-textfile-mode`` (the umask is not
   applied: node_exporter runs as another user), write the text;
3. rename it over ``PATH``.

There is no fsync: the file is a view of memory, rewritten every few
seconds and at every start. After a power cut it may be empty or old until
the daemon's first write. A failed write is logged (rate-limited) and tried
again at the next interval; serving never depends on it. The file is left in
place when the daemon stops: its age (``node_textfile_mtime_seconds``) tells
a stopped daemon from a live one.
"""

from __future__ import annotations

import os

from .descriptors import RateLimitedLog
from .log import log

SUFFIX = ".prom"  # the only files node_exporter's textfile collector reads
TEMPORARY_SUFFIX = ".tmp"
DEFAULT_INTERVAL_SECONDS = 15.0
MIN_INTERVAL_SECONDS = 1.0
DEFAULT_MODE = 0o644
# The temporary file, while a write is in progress.
DESCRIPTORS = 1


class TextfileError(ValueError):
    """A --metrics-textfile value that cannot be used; the message says why."""


def check_path(path: str) -> str:
    """The absolute form of ``path``; raises TextfileError naming what is wrong with it."""
    if not path.endswith(SUFFIX) or os.path.basename(path) == SUFFIX:
        raise TextfileError(f"{path!r} does not end in NAME{SUFFIX}; node_exporter's textfile collector "
                            f"reads only *{SUFFIX} files")
    return os.path.abspath(path)


class Textfile:
    """One textfile at ``path``, written whole every ``interval_seconds`` with mode ``mode``."""

    def __init__(self, path: str, *, interval_seconds: float = DEFAULT_INTERVAL_SECONDS,
                 mode: int = DEFAULT_MODE) -> None:
        self.path = check_path(path)
        self.temporary_path = self.path + TEMPORARY_SUFFIX
        self.interval_seconds = interval_seconds
        self.mode = mode
        self.writes = 0
        self._failing = False
        self._failures = RateLimitedLog(f"cannot write the metrics textfile {self.path} (tried again "
                                        f"every {interval_seconds:g} s)")

    def probe(self) -> None:
        """Check at start that the file can be written: create and remove its temporary file.

        Raises OSError (the directory is missing, not writable, read-only, ...)
        and IsADirectoryError if ``path`` is a directory.
        """
        if os.path.isdir(self.path):
            raise IsADirectoryError(f"{self.path} is a directory")
        fd = self._create()
        os.close(fd)
        os.unlink(self.temporary_path)

    def write(self, text: bytes, monotonic_seconds: float) -> bool:
        """Replace the file with ``text`` (see the module docstring); False if that failed (logged)."""
        try:
            fd = self._create()
            try:
                view = memoryview(text)
                while view:
                    view = view[os.write(fd, view):]
            finally:
                os.close(fd)
            os.rename(self.temporary_path, self.path)
        except OSError as exc:
            self._failing = True
            self._failures.event(monotonic_seconds, str(exc))
            try:
                os.unlink(self.temporary_path)
            except OSError:
                pass
            return False
        if self._failing:
            self._failing = False
            log.info("the metrics textfile %s is written again", self.path)
        self.writes += 1
        return True

    def _create(self) -> int:
        try:
            os.unlink(self.temporary_path)
        except FileNotFoundError:
            pass
        fd = os.open(self.temporary_path,
                     os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o600)
        try:
            os.fchmod(fd, self.mode)
        except OSError:
            os.close(fd)
            raise
        return fd
