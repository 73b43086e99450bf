"""How records are applied: `State.apply`, `State.check` and `State.commit`, or their compiled twin.

`walqueue._speedups.Applier` (_apply.c) is State.apply with put, reserve and
ack written in C: the same checks, then the same changes on the same objects,
and for anything else, or any record a check would reject, it calls
`state.apply` itself before changing anything. Recovery replays through it
(`applier`). The writer (the Engine) checks a record before it writes its
frame and commits it after the write, and gets the same twin as that pair
(`writer_steps`): `check` runs the twin's checks and changes nothing, and
hands anything it does not decide to `state.check`; `commit` makes the
changes, of the record it checked or, for any other change, by
`state.commit`. So the service and recovery apply the same code.

It is the twin of State's methods as they are in state.py: where one of them
has been replaced (a test's deliberately broken variant, tests/broken.py), or
the state is not a State, or walqueue.speedups runs the pure path, both get
State's own methods.
"""

from __future__ import annotations

import heapq
from collections.abc import Callable
from typing import Any

from . import snapshot_size, speedups, validation
from .puts import identity_digest
from .state import COMPLETED, LEASED, READY, State, Task

# What the twin stands for: State's methods, as they are at import.
_TWINNED = {name: State.__dict__[name] for name in (
    "apply", "check", "commit", "_check_put", "_commit_put", "_check_reserve",
    "_commit_reserve", "_check_ack", "_commit_ack", "_current_lease", "_listed_tasks",
    "_check_due", "_key_taken", "_tidy")}


def applier(state: State) -> Callable[..., None]:
    """A callable that does what `state.apply(record, body_bytes)` does, as fast as it can."""
    twin = _twin(state)
    return state.apply if twin is None else twin


def writer_steps(state: State) -> tuple[Callable[[dict], Any], Callable[[Any, int], None]]:
    """(check, commit) that do what `state.check(record)` and `state.commit(change, body_bytes)`
    do, as fast as they can; a change from this check goes to this commit only."""
    twin = _twin(state)
    if twin is None or not hasattr(twin, "commit"):  # (a broken variant may be apply alone)
        return state.check, state.commit
    return twin.check, twin.commit


def _twin(state: State):
    """The compiled twin of `state`'s methods, or None where it would not be their twin."""
    if (not speedups.COMPILED or type(state) is not State
            or any(State.__dict__.get(name) is not method for name, method in _TWINNED.items())):
        return None
    put_extra, reserve_base, ack_base = snapshot_size.compiled_terms()
    return speedups.speedups.Applier(
        state=state, task_type=Task, identity_digest=identity_digest, fromhex=bytes.fromhex,
        heappush=heapq.heappush, statuses=(READY, LEASED, COMPLETED), put_extra=put_extra,
        reserve_base=reserve_base, ack_base=ack_base, max_name=validation.MAX_NAME_BYTES,
        max_reserve=validation.MAX_RESERVE_LIMIT, max_int=validation.MAX_INT)
