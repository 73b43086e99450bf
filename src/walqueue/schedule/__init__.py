"""walqueue.schedule: periodic tasks put once per period, by any number of schedulers (SPEC §8b).

Needs the extra walqueue[scheduler] (cronsim, for cron expressions). For use
inside an application:

```python
import walqueue
from walqueue.schedule import Scheduler, load

entries = load("schedule.toml", now=int(time.time()))   # ScheduleFileError names the line
with walqueue.connect("/run/walqueue/walqueued.sock") as client:
    scheduler = Scheduler(client, entries)
    scheduler.run()          # until scheduler.stop(), e.g. from a signal handler
```

Modules, one concept each: `entries` (the schedule file and its checks),
`periods` (when periods start: pure functions of a time; the only user of
cronsim), `runner` (`Scheduler`), `clock` (the real clock and the tests'
jumping one), `show` (what `walqueue-ctl schedule` prints), `cli`
(`walqueue-scheduler`). docs/scheduler.md describes the file, the task ids
and what happens after a scheduler was down.
"""

from __future__ import annotations

import importlib
from typing import Any

# Loaded on first use, so that `walqueue.schedule.cli` can say which extra is
# missing when cronsim is not installed, instead of failing at import.
_EXPORTS = {
    "Entry": "entries", "ScheduleFileError": "entries", "load": "entries", "parse": "entries",
    "JumpingClock": "clock", "SystemClock": "clock", "Timing": "periods", "task_id": "periods",
    "Scheduler": "runner",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'walqueue.schedule' has no attribute {name!r}")
    return getattr(importlib.import_module(f"walqueue.schedule.{_EXPORTS[name]}"), name)
