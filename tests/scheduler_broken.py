"""Deliberately broken variants of walqueue.schedule, each one plausible change.

Like tests/broken.py for the library: the real scheduler with one change
patched in for the length of a test. tests/unit/test_scheduler.py runs its
key checks against each variant in process and requires them to go red;
tests/process/scheduler_proc.py runs `walqueue-scheduler` with a variant
active, so the process tests show the same against walqueued and PostgreSQL.

- random_task_ids: each put gets a fresh id and key (what a scheduler without
  period keys does): two schedulers, or one restarted, put a period twice.
- available_at_of_the_clock: available_at is the putter's clock, not the
  period start: the identity differs between schedulers, so all but the
  first get KeyConflict, and a restarted one conflicts with itself.
- no_catch_up: the window is always the current period alone, whatever
  catch_up says: a scheduler that was down loses the periods it should put.
- gives_up_on_outage: a put that meets Unavailable is logged and the period
  counted as handled: an outage loses periods still in their window.
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from unittest import mock

from walqueue.errors import Unavailable
from walqueue.schedule import periods, runner

_real_window = periods.window
_real_put = runner.Scheduler._put
_real_init = runner.Scheduler.__init__


def _random_task_id(name: str, start: int) -> str:
    return f"{name}@{uuid.uuid4()}"


class _ClockedPuts:
    """A client whose puts carry the scheduler's clock as available_at."""

    def __init__(self, client, clock) -> None:
        self._client = client
        self._clock = clock

    def put(self, task_id, payload, **options):
        options["available_at"] = int(self._clock.now())
        return self._client.put(task_id, payload, **options)

    def __getattr__(self, name):
        return getattr(self._client, name)


def _init_with_clocked_puts(self, client, entries, **options):
    _real_init(self, client, entries, **options)
    self.client = _ClockedPuts(client, self.clock)


def _put_forgetting_outages(self, *args, **kwargs):
    try:
        _real_put(self, *args, **kwargs)
    except Unavailable as error:
        self.log.warning("gave the period up: %s", error)


VARIANTS = {
    "random_task_ids": lambda: mock.patch.object(periods, "task_id", _random_task_id),
    "available_at_of_the_clock": lambda: mock.patch.object(runner.Scheduler, "__init__",
                                                           _init_with_clocked_puts),
    "no_catch_up": lambda: mock.patch.object(periods, "window",
                                             lambda timing, at, count: _real_window(timing, at, 1)),
    "gives_up_on_outage": lambda: mock.patch.object(runner.Scheduler, "_put", _put_forgetting_outages),
}


@contextlib.contextmanager
def active(name: str | None) -> Iterator[None]:
    """The body with the named variant patched in (None: the real scheduler)."""
    if name is None:
        yield
        return
    with VARIANTS[name]():
        yield
