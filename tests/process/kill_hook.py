"""TEST ONLY: a ``--test-hook`` that SIGKILLs walqueued at the n-th occurrence of a phase.

walqueued passes ``hook`` to ``Queue(hook=...)``; the crash harness
(tests/process/crash_harness.py) arms each daemon incarnation through
environment variables:

* ``WALQUEUE_KILL_PHASE``: one of ``walqueue.PHASES``; unset = never kill.
* ``WALQUEUE_KILL_AT``: kill at this occurrence of the phase (1 = the first).
* ``WALQUEUE_KILL_LOG``: a file that gets one JSON line
  ``{"phase": P, "occurrence": N, "pid": PID, "torn_bytes": B, "children": [PID, ...]}``
  appended and fsynced before the kill, so the harness can count kills per
  phase from outside the dead process, and check that the daemon's snapshot
  children died with it.
* ``WALQUEUE_KILL_TEAR_DIRECTORY``: with phase ``wal.before_write``, first
  append the first ``WALQUEUE_KILL_TEAR_BYTES`` bytes of a frame that is never
  completed to the newest WAL segment of this queue directory: the process dies
  in the middle of a write, leaving a torn tail for the next open to truncate
  (so that it reaches ``recover.after_truncate``). An append cut short: the
  daemon must run with ``--preallocate-wal-bytes 0``, or the fragment would
  land after the zeros of its preallocated segment.

The kill is ``os.kill(os.getpid(), SIGKILL)``: no exception unwinds, no
``finally`` runs, no buffer is flushed — a real death, unlike a hook that
raises. Nothing here inspects task ids or changes what the library does; it
only decides *when* the process dies.

``child_hook`` is walqueued's ``--test-child-hook``: it runs in each forked
snapshot child before the child writes. With ``WALQUEUE_KILL_PHASE`` set to
``CHILD_WRITING`` (a kill point of the harness, not a phase of SPEC §6) the
n-th child (``WALQUEUE_KILL_AT``, counted in ``WALQUEUE_KILL_LOG``.children
across the forks) logs the kill with its own pid as ``child_pid``, SIGKILLs
its parent — the daemon dies while its child writes — and then lingers
``CHILD_LINGER_SECONDS`` before writing, standing for a long snapshot: a
child that does not die with its parent is still there when the harness
looks, holding whatever it did not close.
"""

from __future__ import annotations

import json
import os
import signal
import struct
import threading
import time

CHILD_WRITING = "child.writing"
CHILD_LINGER_SECONDS = 20.0  # well past the harness's CHILD_EXIT_SECONDS

_lock = threading.Lock()
_occurrences: dict[str, int] = {}


def torn_frame_prefix(length: int) -> bytes:
    """The first ``length`` bytes of a frame whose body would be 200 bytes long.

    A 4-byte big-endian length, then JSON that never ends; ``length`` is below
    4 + 200 + 32, so the frame always runs past the end of the file (SPEC §5:
    an incomplete final frame, i.e. a torn tail).
    """
    body = (b'{"op":"put","seq":' + b"9" * 200)[:200]
    frame = struct.pack(">I", len(body)) + body
    return frame[: max(1, min(length, len(frame) - 1))]


def _newest_segment(directory: str) -> str | None:
    names = sorted(name for name in os.listdir(directory) if name.startswith("wal-") and name.endswith(".log"))
    return os.path.join(directory, names[-1]) if names else None


def _append_synced(path: str, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        os.write(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def _children() -> list[int]:
    """This process's children (its snapshot children), which must die with it."""
    try:
        with open(f"/proc/self/task/{os.getpid()}/children") as file:
            return [int(pid) for pid in file.read().split()]
    except OSError:
        return []


def hook(phase: str) -> None:
    wanted = os.environ.get("WALQUEUE_KILL_PHASE")
    if phase != wanted:
        return
    with _lock:
        _occurrences[phase] = _occurrences.get(phase, 0) + 1
        occurrence = _occurrences[phase]
    if occurrence != int(os.environ.get("WALQUEUE_KILL_AT", "1")):
        return
    torn_bytes = 0
    tear_directory = os.environ.get("WALQUEUE_KILL_TEAR_DIRECTORY")
    if tear_directory and phase == "wal.before_write":
        segment = _newest_segment(tear_directory)
        if segment is not None:
            torn = torn_frame_prefix(int(os.environ.get("WALQUEUE_KILL_TEAR_BYTES", "10")))
            _append_synced(segment, torn)
            torn_bytes = len(torn)
    kill_log = os.environ.get("WALQUEUE_KILL_LOG")
    if kill_log:
        line = {"phase": phase, "occurrence": occurrence, "pid": os.getpid(), "torn_bytes": torn_bytes,
                "children": _children()}
        _append_synced(kill_log, (json.dumps(line, sort_keys=True) + "\n").encode())
    os.kill(os.getpid(), signal.SIGKILL)


def child_hook() -> None:
    if os.environ.get("WALQUEUE_KILL_PHASE") != CHILD_WRITING:
        return
    kill_log = os.environ["WALQUEUE_KILL_LOG"]
    # A fork does not carry counts back to its parent: count the children in a file.
    _append_synced(kill_log + ".children", b"c")
    occurrence = os.path.getsize(kill_log + ".children")
    if occurrence != int(os.environ.get("WALQUEUE_KILL_AT", "1")):
        return
    parent = os.getppid()
    line = {"phase": CHILD_WRITING, "occurrence": occurrence, "pid": parent, "child_pid": os.getpid(),
            "torn_bytes": 0}
    _append_synced(kill_log, (json.dumps(line, sort_keys=True) + "\n").encode())
    os.kill(parent, signal.SIGKILL)
    time.sleep(CHILD_LINGER_SECONDS)  # the long write the parent's death interrupts
