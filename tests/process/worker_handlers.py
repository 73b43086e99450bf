"""Handlers that tests/process/test_worker_process.py runs in ``walqueue-worker`` processes.

They talk to the test through files in ``$WQ_TEST_DIR``: ``done`` (one task id
a line), and two FIFOs: the handler writes its task id to ``started`` and then
blocks opening ``go`` until the test opens it; a test that never does leaves
the handler hung.
"""

import asyncio
import os
import sys


def _path(name):
    return os.path.join(os.environ["WQ_TEST_DIR"], name)


def record(lease):
    with open(_path("done"), "a") as done:
        done.write(lease.task_id + "\n")


def exits(lease):
    """``sys.exit(N)`` for a task whose payload has ``"exit": N``; the others are recorded."""
    if "exit" in lease.payload:
        sys.exit(lease.payload["exit"])
    record(lease)


async def exits_async(lease):
    exits(lease)


def _say_started(lease):
    fd = os.open(_path("started"), os.O_WRONLY)  # the test holds the reading end open
    try:
        os.write(fd, (lease.task_id + "\n").encode())
    finally:
        os.close(fd)


def blocking(lease):
    _say_started(lease)
    with open(_path("go")) as go:  # blocks until the test opens it for writing
        go.read()
    record(lease)


async def sleeping(lease):
    await asyncio.sleep(lease.payload.get("seconds", 0))
    record(lease)


async def hanging(lease):
    _say_started(lease)
    await asyncio.Event().wait()  # until cancelled at the stop deadline
