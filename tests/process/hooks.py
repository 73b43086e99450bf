"""TEST ONLY: fault-injection hooks for walqueued's hidden ``--test-hook`` option.

``hook`` is passed to ``Queue(hook=...)`` inside the daemon. It is configured
through environment variables so a test can steer a daemon it runs as a
subprocess:

* ``WALQUEUE_TEST_SYNC_LOG``: a file that gets one byte appended per
  ``wal.after_sync`` — its size is the daemon's number of durable fsyncs.
* ``WALQUEUE_TEST_FAIL_FILE``: while this file exists, the next
  ``wal.before_write`` deletes it and raises OSError(ENOSPC) — one injected
  write failure per file the test creates.
* ``WALQUEUE_TEST_RECOVERY_SECONDS``: sleep this long at
  ``recover.after_truncate``, to make a recovery (of a torn tail) slow.
* ``WALQUEUE_TEST_CORRUPT_SEGMENT``: with the above, also append a zero
  length prefix and non-zero bytes to this WAL segment before raising, so the
  daemon's reopen meets a corrupt directory.

``child_hook`` is for ``--test-child-hook`` (it runs in each forked snapshot
child before the child writes):

* ``WALQUEUE_TEST_CHILD_ENOSPC``: the child fails with OSError(ENOSPC), as
  a snapshot write on a full disk does.
* ``WALQUEUE_TEST_CHILD_GATE``: a FIFO; the child appends its pid to
  ``<FIFO>.pids``, then blocks until a byte (or EOF) comes through the FIFO,
  so a test can act while a child is writing.
"""

import errno
import os
import time


def hook(phase: str) -> None:
    recovery_seconds = os.environ.get("WALQUEUE_TEST_RECOVERY_SECONDS")
    if recovery_seconds and phase == "recover.after_truncate":
        time.sleep(float(recovery_seconds))  # stands for a long recovery
    sync_log = os.environ.get("WALQUEUE_TEST_SYNC_LOG")
    if sync_log and phase == "wal.after_sync":
        fd = os.open(sync_log, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o600)
        try:
            os.write(fd, b"s")
        finally:
            os.close(fd)
    fail_file = os.environ.get("WALQUEUE_TEST_FAIL_FILE")
    if fail_file and phase == "wal.before_write":
        try:
            os.unlink(fail_file)
        except FileNotFoundError:
            return
        segment = os.environ.get("WALQUEUE_TEST_CORRUPT_SEGMENT")
        if segment:
            with open(segment, "ab") as file:
                file.write(b"\0\0\0\0not a frame")
        raise OSError(errno.ENOSPC, "injected by the test hook: no space left on device")


def child_hook() -> None:
    if os.environ.get("WALQUEUE_TEST_CHILD_ENOSPC"):
        raise OSError(errno.ENOSPC, "injected by the test child hook: no space left on device")
    gate = os.environ.get("WALQUEUE_TEST_CHILD_GATE")
    if gate:
        with open(gate + ".pids", "a") as pids:
            pids.write(f"{os.getpid()}\n")
        fd = os.open(gate, os.O_RDONLY)  # blocks until the test opens it for writing
        try:
            os.read(fd, 1)
        finally:
            os.close(fd)
