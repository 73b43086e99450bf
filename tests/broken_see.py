"""Deliberately broken variants for issue 24's last gaps (a cancel cut short, the expiry
counters), each one plausible change applied by patching one function for the length of a test.
The tests that make the claims (tests/unit/test_cancel.py, tests/unit/test_expiries.py) run
their checks under each and require them to go red; they are green on the real code.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from unittest import mock

from walqueue import cancel as cancelling
from walqueue.engine import Engine

_real_records = cancelling.records


def _lapsed_cancel_acked_alone(task, now):
    """The records before the lapsed case: an interrupted cancel is always finished by its ack
    alone, which is stale once its lease has lapsed (the retry then fails)."""
    if task.status == "leased":
        return [{"generation": task.generation, "now": now, "op": "ack", "task_id": task.task_id,
                 "worker": cancelling.CANCEL_WORKER}]
    return _real_records(task, now)


_real_reap = Engine._reap


def _reap_counted_only_alone(self, now):
    """Expiries counted by expire_due (walqueued's timer) but not by reserve's own reap."""
    before = self.expired_total
    count = _real_reap(self, now)
    self.expired_total = before
    return count


def _expire_due_counting(self, *, now):
    self.check_open()
    with self.batch():
        count = _real_reap(self, now)
    self.expired_total += count
    return count


@contextlib.contextmanager
def _reap_uncounted_in_reserve():
    with mock.patch.object(Engine, "_reap", _reap_counted_only_alone), \
            mock.patch.object(Engine, "expire_due", _expire_due_counting):
        yield


VARIANTS = {
    "lapsed_cancel_acked_alone": lambda: mock.patch.object(cancelling, "records", _lapsed_cancel_acked_alone),
    "reap_uncounted_in_reserve": _reap_uncounted_in_reserve,
}


@contextlib.contextmanager
def active(name: str) -> Iterator[None]:
    with VARIANTS[name]():
        yield
