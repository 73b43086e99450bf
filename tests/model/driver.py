"""Drive a real Queue and the reference model side by side, step by step.

What it proves (through test_stateful.py): after every call, the real
`walqueue.Queue` and the SPEC-only `ReferenceQueue` agree on the result or on
the exact error class (and, for `StaleLease`, on the reported status and
generation); on every task's full TaskView, in task_id order and per status;
on `stats()` including `last_seq` (one frame per writing call, none for
no-ops), `snapshot_seq` and `wal_bytes`; and on the bytes on disk (the WAL
records after the snapshot, the snapshot entries and CURRENT, read with an
independent §4 reader). Payload copies are scribbled on after every boundary
crossing, so aliasing shows up as a disagreement. The hook phases of every call
are checked too: each frame bracketed by `wal.before_write`/`wal.after_write`,
one `wal.after_sync` per writing call or per batch (at its exit, also on an
exception; a nested batch joins; exactly one for a cancel's two or three frames,
SPEC §8b), none for a call that writes nothing, and the
five compaction phases in order. A `crash` action dies at a random hook call
of a random writing call or batch, from whatever state the walk is in, and the
reopened queue must hold exactly the frames that were complete.

Reusable pieces for other suites (e.g. deliberately broken Queue variants):

- `Driver(queue_factory, directory)`: `step(action)`, `check_state()`.
- `ActionGenerator(chooser, driver)`: one vocabulary of actions, drawn either
  from hypothesis (`DataChooser`) or from a seeded `random.Random`
  (`RandomChooser`).
- `run_model_check(queue_factory, seed, steps)`: a seeded random walk; raises
  `ModelMismatch` naming the seed and the whole trace.
- `make_state_machine(queue_factory)`: the hypothesis RuleBasedStateMachine.

`queue_factory(directory, hook=None)` must build a Queue-like object.
"""

from __future__ import annotations

import copy
import random
import shutil
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any

from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, rule

import walqueue
from tests.model import disk
from tests.model.reference import (
    STATUSES,
    ModelError,
    ModelLease,
    ModelStaleLease,
    ReferenceQueue,
    lease_tuple,
    stats_tuple,
    view_tuple,
)

QueueFactory = Callable[..., Any]

COMPACTION_PHASES = (
    "wal.after_rotate",
    "snapshot.after_write",
    "current.after_write",
    "current.after_publish",
    "compact.after_delete",
)

TASK_IDS = ("a", "b", "c", "d", "e", "é-ü", "f")
KEYS = ("a", "b", "k1", "k2")
WORKERS = ("w1", "w2", "w3")
DELTAS = (0, 1, 3, 7, 15, -2, -10)
HUGE_TIME = 2**63 - 1


def default_factory(directory: Path, hook: Any = None) -> Any:
    return walqueue.Queue(directory, hook=hook)


def make_payload(index: int) -> dict[str, Any]:
    """A fresh payload object each call (callers may mutate what they get)."""
    payloads: list[dict[str, Any]] = [
        {"n": 0},
        {"n": 1, "tags": ("x", "y")},  # a tuple is stored as a list
        {"deep": {"list": [1, 2.5, None, True, {"k": "v"}]}, "s": "ünïcode ✓"},
        {},
        # Any mapping with str keys is a JSON object; integers span the wire's 64 bits.
        {"proxy": MappingProxyType({"k": [-0.0, 1e300]}), "big": 2**64 - 1, "neg": -(2**63)},
    ]
    return payloads[index % len(payloads)]


def invalid_payload(index: int) -> Any:
    payloads: list[Any] = [
        {"x": float("nan")},
        {1: "non-str key"},
        ["not", "an", "object"],
        {"x": "\ud800"},
        {"x": {"y": float("inf")}},
        {"x": object()},
        {"x": [2**64]},  # beyond what the daemon's wire can carry
    ]
    return payloads[index % len(payloads)]


class ModelMismatch(AssertionError):
    """The real queue and the reference model disagree."""


class ArmableHook:
    """A hook that does nothing until armed; then dies at the n-th call from there."""

    def __init__(self) -> None:
        self.countdown: int | None = None
        self.frames_complete = 0
        self.phases: list[str] = []
        self.log: list[str] = []  # every call, armed or not
        self.raised: BaseException | None = None

    def arm(self, countdown: int) -> None:
        self.countdown, self.frames_complete, self.raised = countdown, 0, None
        self.phases = []

    def disarm(self) -> None:
        self.countdown = None

    def __call__(self, phase: str) -> None:
        self.log.append(phase)
        if self.countdown is None:
            return
        self.phases.append(phase)
        self.frames_complete += phase == "wal.after_write"
        if self.countdown == 0:
            self.countdown = None
            self.raised = walqueue.InjectedCrash(f"injected at {phase}")
            raise self.raised
        self.countdown -= 1


# --- actions ------------------------------------------------------------------------


@dataclass
class Action:
    name: str
    args: dict[str, Any] = field(default_factory=dict)

    def __repr__(self) -> str:
        if self.name == "batch":
            inner = "; ".join(repr(action) for action in self.args["actions"])
            flags = ", nested" if self.args["nested"] else ""
            flags += ", raises" if self.args["raise_after"] else ""
            return f"batch[{inner}{flags}]"
        if self.name == "crash":
            return f"crash at hook call {self.args['at_hook_call']} of {self.args['action']!r}"
        parts = ", ".join(f"{key}={value!r}" for key, value in self.args.items())
        return f"{self.name}({parts})"


class Chooser:
    def integer(self, low: int, high: int, label: str) -> int:
        raise NotImplementedError

    def choice(self, options: Sequence[Any], label: str) -> Any:
        return options[self.integer(0, len(options) - 1, label)]

    def rare(self, label: str) -> bool:
        """True about one time in eight; shrinks to False."""
        return self.integer(0, 7, label) == 7


class RandomChooser(Chooser):
    def __init__(self, rng: random.Random):
        self.rng = rng

    def integer(self, low: int, high: int, label: str) -> int:
        return self.rng.randint(low, high)


class DataChooser(Chooser):
    def __init__(self, data: Any):
        self.data = data

    def integer(self, low: int, high: int, label: str) -> int:
        return self.data.draw(st.integers(low, high), label=label)

    def choice(self, options: Sequence[Any], label: str) -> Any:
        return self.data.draw(st.sampled_from(list(options)), label=label)


class ActionGenerator:
    """Builds actions from the current situation (the model's tasks and leases)."""

    def __init__(self, chooser: Chooser, driver: Driver):
        self.c = chooser
        self.driver = driver

    def now(self) -> int:
        if self.c.rare("extreme time"):
            return self.c.choice((HUGE_TIME, HUGE_TIME - 1, 0), "extreme")
        clock = max(0, self.driver.clock + self.c.choice(DELTAS, "time delta"))
        self.driver.clock = clock
        return clock

    def put_fields(self) -> dict[str, Any]:
        history = self.driver.puts_seen
        if history and self.c.integer(0, 2, "repeat an old put?") == 2:
            return copy.deepcopy(self.c.choice(history[::-1], "old put"))
        task_id = self.c.choice((*TASK_IDS, *("fresh",) * 6), "task_id")
        if task_id == "fresh":
            task_id = f"n{self.driver.fresh_ids}"
            self.driver.fresh_ids += 1
        fields: dict[str, Any] = {
            "task_id": task_id,
            "payload": ("valid", self.c.integer(0, 4, "payload")),
        }
        key = self.c.choice(("omit", "omit", "omit", None, *KEYS), "key")
        if key != "omit":
            fields["key"] = key
        available_at = self.c.choice(("omit", 0, 5, 20), "available_at")
        if available_at != "omit":
            fields["available_at"] = available_at
        max_attempts = self.c.choice(("omit", 1, 2), "max_attempts")
        if max_attempts != "omit":
            fields["max_attempts"] = max_attempts
        if self.c.rare("invalid put?"):
            kind = self.c.integer(0, 6, "invalid put kind")
            if kind == 0:
                fields["payload"] = ("invalid", self.c.integer(0, 6, "bad payload"))
            elif kind == 1:
                fields["task_id"] = self.c.choice(("", "x" * 1025, "\udc80", 7), "bad id")
            elif kind == 2:
                fields["key"] = self.c.choice(("", "é" * 513), "bad key")
            elif kind == 3:
                fields["available_at"] = self.c.choice((-1, True, 2**63, 1.5), "bad time")
            elif kind == 4:
                fields["max_attempts"] = self.c.choice((0, False, 2**63), "bad max")
            elif kind == 5:
                fields["available_at"] = HUGE_TIME  # valid, at the edge
            else:
                fields["task_id"] = "é" * 512  # valid: exactly 1024 bytes
        else:
            history.append(copy.deepcopy(fields))
        return fields

    def put(self) -> Action:
        return Action("put", self.put_fields())

    def put_many(self) -> Action:
        requests: list[dict[str, Any]] = []
        for _ in range(self.c.integer(0, 4, "requests")):
            if requests and self.c.integer(0, 3, "duplicate within the list?") == 3:
                fields = copy.deepcopy(self.c.choice(requests, "duplicate"))["fields"]
            else:
                fields = self.put_fields()
            form = self.c.choice(("mapping", "PutRequest"), "request form")
            requests.append({"form": form, "fields": fields})
        return Action("put_many", {"requests": requests})

    def reserve(self) -> Action:
        args: dict[str, Any] = {
            "worker": self.c.choice(WORKERS, "worker"),
            "now": self.now(),
            "lease_seconds": self.c.choice((1, 2, 5, 10), "lease_seconds"),
            "limit": self.c.integer(1, 4, "limit"),
        }
        if self.c.rare("invalid reserve?"):
            name, value = self.c.choice(
                (
                    ("limit", 0),
                    ("limit", 1001),
                    ("limit", 1000),  # valid edge
                    ("lease_seconds", 0),
                    ("now", -1),
                    ("now", HUGE_TIME),  # now + lease_seconds reaches 2**63
                    ("worker", ""),
                    ("lease_seconds", True),
                ),
                "invalid reserve",
            )
            args[name] = value
        return Action("reserve", args)

    def lease(self) -> ModelLease:
        seen = self.driver.leases_seen
        live = [
            ModelLease(v.task_id, v.worker, v.generation, v.deadline, v.attempts, v.payload)
            for v in self.driver.model.tasks("leased")
        ]
        if live and self.c.integer(0, 2, "a live lease?") < 2:
            base = self.c.choice(live, "live lease")
        elif seen:
            base = self.c.choice(seen[::-1][:12], "old lease")
        else:
            task_id = self.c.choice(TASK_IDS, "task_id")
            return ModelLease(task_id, self.c.choice(WORKERS, "worker"), 1, 10, 1, None)
        variant = self.c.choice(
            ("as issued",) * 4 + ("other worker", "older", "newer", "unknown task"),
            "lease variant",
        )
        if variant == "other worker":
            others = [worker for worker in WORKERS if worker != base.worker]
            base = base._replace(worker=self.c.choice(others, "other worker"))
        elif variant == "older":
            base = base._replace(generation=max(0, base.generation - 1))
        elif variant == "newer":
            base = base._replace(generation=base.generation + 1)
        elif variant == "unknown task":
            base = base._replace(task_id="no-such-task")
        return base

    def lease_now(self, lease: ModelLease) -> int:
        choice = self.c.choice(("before", "just before", "clock", "at deadline"), "when")
        if choice == "before":
            return max(0, lease.deadline - self.c.integer(2, 6, "how long before"))
        if choice == "just before":
            return max(0, lease.deadline - 1)
        if choice == "at deadline":
            return lease.deadline
        return self.now()

    def lease_action(self, name: str) -> Action:
        lease = self.lease()
        args: dict[str, Any] = {"lease": lease, "now": self.lease_now(lease)}
        if name == "release":
            args["delay"] = self.c.choice((0, 0, 3, 30), "delay")
        if name == "touch":
            args["lease_seconds"] = self.c.choice((1, 5, 20), "lease_seconds")
        if self.c.rare("invalid lease call?"):
            kind = self.c.integer(0, 3, "invalid kind")
            if kind == 0:
                args["lease"] = lease._replace(generation=-1)
            elif kind == 1:
                args["lease"] = lease._replace(generation=True)
            elif kind == 2:
                args["now"] = -1
            elif name == "release":
                args["delay"] = self.c.choice((-1, HUGE_TIME), "bad delay")
            elif name == "touch":
                args["lease_seconds"] = self.c.choice((0, HUGE_TIME), "bad lease_seconds")
            else:
                args["lease"] = lease._replace(worker="")
        return Action(name, args)

    def revive(self) -> Action:
        dead = [view.task_id for view in self.driver.model.tasks("dead")]
        pool = dead + dead + list(TASK_IDS)
        ids = [self.c.choice(pool, "revive id") for _ in range(self.c.integer(0, 3, "ids"))]
        if dead and self.c.integer(0, 1, "revive all the dead?"):
            ids = dead + ids[:1]
        now = self.now()
        if self.c.rare("invalid revive?"):
            ids = [*ids, ""]
        return Action("revive", {"task_ids": ids, "now": now})

    def get(self) -> Action:
        return Action("get", {"task_id": self.c.choice((*TASK_IDS, "no-such-task"), "id")})

    def cancel(self) -> Action:
        """SPEC §8b's cancel, mostly of a dead or ready task (some not due), sometimes of
        a leased, completed or unknown one."""
        model = self.driver.model
        likely = [view.task_id for status in ("dead", "ready") for view in model.tasks(status)]
        pool = likely + likely + [*TASK_IDS, "no-such-task"]
        return Action("cancel", {"task_id": self.c.choice(pool, "cancel id"), "now": self.now()})

    def compact(self) -> Action:
        return Action("compact")

    def single(self) -> Action:
        kind = self.c.choice(
            ("put", "reserve", "ack", "release", "touch", "put_many", "revive", "get", "compact",
             "cancel"),
            "action",
        )
        return self.by_name(kind)

    def by_name(self, name: str) -> Action:
        if name in ("ack", "release", "touch"):
            return self.lease_action(name)
        return getattr(self, name)()

    def batch(self) -> Action:
        actions = [self.single() for _ in range(self.c.integer(1, 4, "batch size"))]
        return Action(
            "batch",
            {
                "actions": actions,
                "nested": self.c.integer(0, 2, "nested?") == 2,
                "raise_after": self.c.integer(0, 3, "raise inside?") == 3,
            },
        )

    def crash(self) -> Action:
        """A writing action (or a batch of them) that dies at one of its next hook calls."""
        writing = ("put", "put_many", "reserve", "ack", "release", "touch", "revive", "compact",
                   "cancel")
        if self.c.integer(0, 2, "crash inside a batch?") == 2:
            inner = [
                self.by_name(self.c.choice(writing, "action"))
                for _ in range(self.c.integer(1, 3, "batch size"))
            ]
            action = Action("batch", {"actions": inner, "nested": False, "raise_after": False})
        else:
            action = self.by_name(self.c.choice(writing, "action"))
        return Action("crash", {"at_hook_call": self.c.integer(0, 3, "crash at"), "action": action})

    def any(self) -> Action:
        kind = self.c.choice(
            (
                ("put",) * 5
                + ("put_many",) * 3
                + ("reserve",) * 5
                + ("ack", "release", "touch") * 2
                + ("revive",) * 2
                + ("cancel",) * 2
                + ("get", "compact", "reopen")
                + ("batch",) * 2
                + ("crash",) * 2
            ),
            "action",
        )
        if kind == "crash":
            return self.crash()
        if kind == "reopen":
            return Action("reopen", {"discard": self.c.integer(0, 1, "discard, not close?") == 1})
        if kind == "batch":
            return self.batch()
        return self.by_name(kind)


# --- executing one action on either side --------------------------------------------


class _RaisedInsideBatch(Exception):
    """An ordinary exception thrown inside `with q.batch()` by the test."""


def _materialize_payload(spec: Any) -> Any:
    if isinstance(spec, tuple) and len(spec) == 2 and spec[0] in ("valid", "invalid"):
        return make_payload(spec[1]) if spec[0] == "valid" else invalid_payload(spec[1])
    return copy.deepcopy(spec)  # the caller may scribble on it


def _put_arguments(fields: dict[str, Any]) -> tuple[Any, Any, dict[str, Any]]:
    options = {k: v for k, v in fields.items() if k not in ("task_id", "payload")}
    return fields["task_id"], _materialize_payload(fields["payload"]), options


def _scribble(value: Any) -> None:
    """Mutate a payload the caller holds; the store must not notice."""
    if isinstance(value, dict):
        value["scribbled"] = True
        for item in list(value.values()):
            _scribble(item)
    elif isinstance(value, list):
        value.append("scribbled")


def call_real(queue: Any, action: Action) -> Any:
    """Run `action` on a real queue, scribbling on every payload crossing the API."""
    name, args = action.name, action.args
    if name == "put":
        task_id, payload, options = _put_arguments(args)
        result = queue.put(task_id, payload, **options)
        _scribble(payload)
        return result
    if name == "put_many":
        requests = []
        for request in args["requests"]:
            task_id, payload, options = _put_arguments(request["fields"])
            if request["form"] == "mapping":
                requests.append({"task_id": task_id, "payload": payload, **options})
            else:
                requests.append(walqueue.PutRequest(task_id, payload, **options))
        result = queue.put_many(requests)
        for request in requests:
            _scribble(request["payload"] if isinstance(request, dict) else request.payload)
        return result
    if name == "reserve":
        leases = queue.reserve(
            args["worker"],
            now=args["now"],
            lease_seconds=args["lease_seconds"],
            limit=args["limit"],
        )
        result = [lease_tuple(lease) for lease in leases]
        for lease in leases:
            _scribble(lease.payload)
        return result
    if name in ("ack", "release", "touch"):
        lease = walqueue.Lease(*copy.deepcopy(tuple(args["lease"])))
        options = {k: v for k, v in args.items() if k != "lease"}
        result = getattr(queue, name)(lease, **options)
        if name == "touch":
            returned = lease_tuple(result)
            _scribble(result.payload)
            return returned
        return result
    if name == "revive":
        return queue.revive(list(args["task_ids"]), now=args["now"])
    if name == "cancel":
        return queue.cancel(args["task_id"], now=args["now"])
    if name == "get":
        view = queue.get(args["task_id"])
        if view is None:
            return None
        result = view_tuple(view)
        _scribble(view.payload)
        return result
    if name == "compact":
        return queue.compact()
    raise AssertionError(f"unknown action {name}")


def call_model(model: ReferenceQueue, action: Action) -> Any:
    name, args = action.name, action.args
    if name == "put":
        task_id, payload, options = _put_arguments(args)
        return model.put(task_id, payload, **options)
    if name == "put_many":
        requests = []
        for request in args["requests"]:
            task_id, payload, options = _put_arguments(request["fields"])
            requests.append({"task_id": task_id, "payload": payload, **options})
        return model.put_many(requests)
    if name == "reserve":
        return model.reserve(
            args["worker"],
            now=args["now"],
            lease_seconds=args["lease_seconds"],
            limit=args["limit"],
        )
    if name in ("ack", "release", "touch"):
        options = {k: v for k, v in args.items() if k != "lease"}
        return getattr(model, name)(args["lease"], **options)
    if name == "revive":
        return model.revive(list(args["task_ids"]), now=args["now"])
    if name == "cancel":
        return model.cancel(args["task_id"], now=args["now"])
    if name == "get":
        return model.get(args["task_id"])
    if name == "compact":
        return model.compact()
    raise AssertionError(f"unknown action {name}")


def real_outcome(function: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("ok", function())
    except walqueue.StaleLease as error:
        return ("error", type(error).__name__, (error.task_id, error.status, error.generation))
    except walqueue.WalQueueError as error:
        return ("error", type(error).__name__, None)
    except Exception as error:  # noqa: BLE001 - reported as a disagreement, never swallowed
        return ("unexpected", f"{type(error).__name__}: {error}")


def model_outcome(function: Callable[[], Any]) -> tuple[Any, ...]:
    try:
        return ("ok", function())
    except ModelStaleLease as error:
        return ("error", error.spec_name, (error.task_id, error.status, error.generation))
    except ModelError as error:
        return ("error", error.spec_name, None)


# --- the driver ---------------------------------------------------------------------


class Driver:
    """One real queue and one model, compared after every call."""

    def __init__(self, queue_factory: QueueFactory, directory: Path):
        self.factory = queue_factory
        self.directory = Path(directory)
        self.hook = ArmableHook()
        self.queue = queue_factory(self.directory, hook=self.hook)
        self.model = ReferenceQueue()
        self.trace: list[Action] = []
        self.leases_seen: list[ModelLease] = []
        self.puts_seen: list[dict[str, Any]] = []
        self.clock = 0
        self.fresh_ids = 0
        self.leftovers_possible = False
        self.snapshot_entries: list[dict[str, Any]] | None = None

    def fail(self, message: str) -> None:
        lines = "\n".join(f"  {index}: {action!r}" for index, action in enumerate(self.trace))
        raise ModelMismatch(f"{message}\ntrace ({len(self.trace)} actions):\n{lines}")

    def close(self) -> None:
        if self.queue is not None:
            self.queue.close()

    # -- steps --

    def step(self, action: Action) -> None:
        self.trace.append(action)
        if action.name == "reopen":
            self.reopen(discard=action.args.get("discard", False))
        elif action.name == "crash":
            self.crash(action)
        elif action.name == "batch":
            self.batch(action)
        else:
            self.one(action)

    def one(self, action: Action) -> None:
        mark, seq, snapshot_seq = len(self.hook.log), self.model.last_seq, self.model.snapshot_seq
        real = real_outcome(lambda: call_real(self.queue, action))
        model = model_outcome(lambda: self._model_call(action))
        if real != model:
            self.fail(f"{action!r}:\n  real  {real!r}\n  model {model!r}")
        phases = self.hook.log[mark:]
        frames = self.model.last_seq - seq
        if action.name == "compact":
            expected = list(COMPACTION_PHASES) if self.model.snapshot_seq != snapshot_seq else []
            if phases != expected:
                self.fail(f"{action!r}: hook phases {phases}, expected {expected}")
            return
        written = [phase for phase in phases if phase != "wal.after_sync"]
        syncs = len(phases) - len(written)
        if (
            written != ["wal.before_write", "wal.after_write"] * frames
            or (frames and not (1 <= syncs <= frames and phases[-1] == "wal.after_sync"))
            or (not frames and syncs)
        ):
            self.fail(f"{action!r} wrote {frames} frames; hook phases {phases}")
        if action.name == "cancel" and frames and syncs != 1:
            # SPEC §8b: a cancel's records are one batch, made durable by one fsync.
            self.fail(f"{action!r} wrote its {frames} frames with {syncs} fsyncs, not one batch")

    def _model_call(self, action: Action) -> Any:
        result = call_model(self.model, action)
        if action.name == "reserve":
            self.leases_seen.extend(result)
        elif action.name == "touch":
            self.leases_seen.append(result)
        elif action.name == "compact":
            self.snapshot_entries = self.model.snapshot_entries()
        return result

    def batch(self, action: Action) -> None:
        actions: list[Action] = action.args["actions"]
        nested, raise_after = action.args["nested"], action.args["raise_after"]
        outcomes: list[tuple[Any, ...]] = []
        raised = False
        mark, seq = len(self.hook.log), self.model.last_seq
        try:
            with self.queue.batch():
                for index, inner in enumerate(actions):
                    if nested and index == len(actions) - 1:
                        with self.queue.batch():
                            outcomes.append(real_outcome(lambda a=inner: call_real(self.queue, a)))
                    else:
                        outcomes.append(real_outcome(lambda a=inner: call_real(self.queue, a)))
                if raise_after:
                    raise _RaisedInsideBatch("thrown by the test")
        except _RaisedInsideBatch:
            raised = True
        except Exception as error:  # noqa: BLE001 - reported as a disagreement
            self.fail(f"{action!r}: the batch block raised {type(error).__name__}: {error}")
        if raised != raise_after:
            self.fail(f"{action!r}: an exception raised inside batch() did not propagate")
        for inner, real in zip(actions, outcomes, strict=True):
            model = model_outcome(lambda a=inner: self._model_call(a))
            if real != model:
                self.fail(f"{inner!r} inside {action!r}:\n  real  {real!r}\n  model {model!r}")
        self.check_batch_phases(action, self.hook.log[mark:], self.model.last_seq - seq)

    def check_batch_phases(self, action: Action, phases: list[str], frames: int) -> None:
        """One fsync per batch, at its exit (also on an exception), nested ones joining;
        a compaction inside syncs the batch first (SPEC §5, §6)."""
        written = [phase for phase in phases if phase in ("wal.before_write", "wal.after_write")]
        if written != ["wal.before_write", "wal.after_write"] * frames:
            self.fail(f"{action!r} wrote {frames} frames; hook phases {phases}")
        for index, phase in enumerate(phases):
            following = phases[index + 1] if index + 1 < len(phases) else None
            if phase == "wal.after_sync" and following not in (None, "wal.after_rotate"):
                self.fail(f"{action!r}: wal.after_sync before the batch's exit: {phases}")
        compacted = "wal.after_rotate" in phases
        if frames and not compacted and phases.count("wal.after_sync") != 1:
            self.fail(f"{action!r}: expected one wal.after_sync at the batch's exit: {phases}")
        last_write = max((i for i, p in enumerate(phases) if p == "wal.after_write"), default=-1)
        if frames and "wal.after_sync" not in phases[last_write:]:
            self.fail(f"{action!r}: frames left unsynced at the batch's exit: {phases}")

    def crash(self, action: Action) -> None:
        """Die at a hook call inside `action`; the reopened queue must hold exactly the
        model state after the frames that were complete at that moment."""
        inner: Action = action.args["action"]
        actions = inner.args["actions"] if inner.name == "batch" else [inner]
        future = self.model.clone()
        start = future.last_seq
        published: list[tuple[int, list[dict[str, Any]]]] = []  # (seq, entries) per compaction
        for each in actions:
            before = future.snapshot_seq
            model_outcome(lambda a=each: call_model(future, a))
            if future.snapshot_seq != before:
                published.append((future.snapshot_seq, future.snapshot_entries()))
        new_records = future.records[start:]
        self.hook.arm(action.args["at_hook_call"])
        try:
            if inner.name == "batch":
                with self.queue.batch():
                    for each in actions:
                        real_outcome(lambda a=each: call_real(self.queue, a))
            else:
                real_outcome(lambda: call_real(self.queue, inner))
        except walqueue.InjectedCrash as error:
            if error is not self.hook.raised:
                self.fail(f"{action!r}: a different InjectedCrash reached the caller")
        except Exception as error:  # noqa: BLE001 - reported as a disagreement
            self.fail(f"{action!r}: raised {type(error).__name__}: {error}")
        else:
            # Fewer hook calls than the countdown: the calls simply happened.
            self.hook.disarm()
            self.model = future
            if published:
                self.snapshot_entries = published[-1][1]
            self._remember(future)
            return
        crashed = self.queue
        try:
            crashed.stats()
        except walqueue.QueueClosed:
            pass
        else:
            self.fail(f"{action!r}: the queue still answers after dying")
        mark = len(self.hook.log)
        crashed.close()
        try:
            self.queue = self.factory(self.directory, hook=self.hook)
        except walqueue.QueueLocked:
            self.fail(f"{action!r}: the dead queue still holds the lock")
        # A death by exception leaves whole frames only: nothing to truncate.
        self._no_phases_since(mark, f"reopening after {action!r}")
        expected = self.model.clone()
        for record in new_records[: self.hook.frames_complete]:
            expected._append({k: v for k, v in record.items() if k != "seq"})
        publications = self.hook.phases.count("current.after_publish")
        if publications:
            expected.snapshot_seq, self.snapshot_entries = published[publications - 1]
        if self.hook.phases.count("wal.after_rotate") > self.hook.phases.count(
            "compact.after_delete"
        ):
            # A compaction died half-way: open MAY delete its leftovers (SPEC §5), so
            # from here on the layout and wal_bytes are not exact.
            self.leftovers_possible = True
        self.model = expected
        self._remember(future)

    def _remember(self, future: ReferenceQueue) -> None:
        for task_id in sorted(future.tasks_by_id):
            task = future.tasks_by_id[task_id]
            if task.status == "leased":
                self.leases_seen.append(future._lease_of(task))

    def reopen(self, discard: bool = False) -> None:
        try:
            second = self.factory(self.directory)
        except walqueue.QueueLocked:
            pass
        else:
            second.close()
            self.fail("a second Queue on an owned directory did not raise QueueLocked")
        mark = len(self.hook.log)
        if discard:
            # SPEC §3: discarding a Queue object releases its lock.
            self.queue = None
            try:
                self.queue = self.factory(self.directory, hook=self.hook)
            except walqueue.QueueLocked:
                self.fail("a discarded (unclosed) Queue kept its lock")
            self._no_phases_since(mark, "discarding and reopening")
            return
        self.queue.close()
        self.queue.close()  # close() is idempotent
        try:
            self.queue.stats()
        except walqueue.QueueClosed:
            pass
        else:
            self.fail("stats() after close() did not raise QueueClosed")
        self.queue = None
        self.queue = self.factory(self.directory, hook=self.hook)
        self._no_phases_since(mark, "closing and reopening")

    def _no_phases_since(self, mark: int, what: str) -> None:
        """No sync at close, and nothing to truncate on a clean open (SPEC §6)."""
        if self.hook.log[mark:]:
            self.fail(f"{what} called the hook with {self.hook.log[mark:]}")

    # -- the full comparison --

    def check_state(self) -> None:
        real_views = list(self.queue.tasks())
        real = [view_tuple(view) for view in real_views]
        model = self.model.tasks()
        if real != model:
            self.fail(f"tasks() differ:\n  real  {real!r}\n  model {model!r}")
        for status in STATUSES:
            real_status = [view_tuple(view) for view in self.queue.tasks(status)]
            if real_status != self.model.tasks(status):
                self.fail(f"tasks({status!r}) differ: real {real_status!r}")
        for status in (None, *STATUSES):  # SPEC §8b's pages, cut from the model's listing
            expected = self.model.tasks(status)
            cursor = expected[len(expected) // 2].task_id if expected else "c"
            page = [view_tuple(view) for view in self.queue.tasks(status, after=cursor, limit=2)]
            if page != [view for view in expected if view.task_id > cursor][:2]:
                self.fail(f"tasks({status!r}, after={cursor!r}, limit=2) differ: real {page!r}")
        real_stats = stats_tuple(self.queue.stats())
        model_stats = self.model.stats()
        if self.leftovers_possible:
            real_stats = real_stats._replace(wal_bytes=None)
            model_stats = model_stats._replace(wal_bytes=None)
        if real_stats != model_stats:
            self.fail(f"stats differ:\n  real  {real_stats!r}\n  model {model_stats!r}")
        for view in real_views:
            _scribble(view.payload)
        self.check_disk()

    def check_disk(self) -> None:
        model = self.model
        try:
            current = disk.read_current(self.directory)
            records = [r for r in disk.wal_records(self.directory) if r["seq"] > model.snapshot_seq]
        except disk.FrameError as error:
            self.fail(f"disk: {error}")
        if records != model.records[model.snapshot_seq :]:
            self.fail(
                f"WAL records after the snapshot differ:\n  disk  {records!r}\n"
                f"  model {model.records[model.snapshot_seq :]!r}"
            )
        snapshots = sorted(path.name for path in self.directory.glob("snapshot-*.snap"))
        if model.snapshot_seq == 0:
            if current is not None or (snapshots and not self.leftovers_possible):
                self.fail(f"no compaction yet, but CURRENT={current!r}, snapshots={snapshots}")
            return
        name = f"snapshot-{model.snapshot_seq:020d}.snap"
        expected_current = {"format": 1, "seq": model.snapshot_seq, "snapshot": name}
        if current != expected_current:
            self.fail(f"CURRENT is {current!r}, expected {expected_current!r}")
        if snapshots != [name] and not (self.leftovers_possible and name in snapshots):
            self.fail(f"snapshot files {snapshots}, expected only {name}")
        snapshot = disk.read_snapshot(self.directory / name)
        entries = self.snapshot_entries
        assert entries is not None
        expected_header = {
            "format": 1,
            "kind": "walqueue.snapshot",
            "seq": model.snapshot_seq,
            "task_count": len(entries),
        }
        if snapshot.header != expected_header:
            self.fail(f"snapshot header {snapshot.header!r}, expected {expected_header!r}")
        if snapshot.entries != entries:
            self.fail(
                f"snapshot entries differ:\n  disk  {snapshot.entries!r}\n  model {entries!r}"
            )
        if snapshot.end != {"kind": "end", "task_count": len(entries)}:
            self.fail(f"snapshot end frame {snapshot.end!r}")


# --- entry points for other suites --------------------------------------------------


def run_model_check(queue_factory: QueueFactory, seed: int, steps: int = 200) -> None:
    """A seeded random walk of `steps` actions; raises ModelMismatch naming the seed."""
    rng = random.Random(seed)
    root = Path(tempfile.mkdtemp(prefix=f"walqueue-walk-{seed}-"))
    driver = None
    try:
        driver = Driver(queue_factory, root / "queue")
        generator = ActionGenerator(RandomChooser(rng), driver)
        driver.check_state()
        for _ in range(steps):
            driver.step(generator.any())
            driver.check_state()
    except ModelMismatch as error:
        raise ModelMismatch(f"seed={seed}: {error}") from None
    except Exception as error:
        raise ModelMismatch(f"seed={seed}: {type(error).__name__}: {error}") from error
    finally:
        if driver is not None:
            try:
                driver.close()
            except Exception:  # noqa: BLE001 - a broken queue may fail to close
                pass
        shutil.rmtree(root, ignore_errors=True)


def make_state_machine(queue_factory: QueueFactory) -> type[RuleBasedStateMachine]:
    """The hypothesis state machine for `queue_factory`; its `.TestCase` runs it."""

    class QueueAgainstReferenceModel(RuleBasedStateMachine):
        def __init__(self) -> None:
            super().__init__()
            self.root = Path(tempfile.mkdtemp(prefix="walqueue-model-"))
            self.driver = Driver(queue_factory, self.root / "queue")

        def _step(self, data: Any, build: Callable[[ActionGenerator], Action]) -> None:
            action = build(ActionGenerator(DataChooser(data), self.driver))
            self.driver.step(action)

        @rule(data=st.data())
        def put(self, data: Any) -> None:
            self._step(data, ActionGenerator.put)

        @rule(data=st.data())
        def put_many(self, data: Any) -> None:
            self._step(data, ActionGenerator.put_many)

        @rule(data=st.data())
        def reserve(self, data: Any) -> None:
            self._step(data, ActionGenerator.reserve)

        @rule(data=st.data())
        def ack(self, data: Any) -> None:
            self._step(data, lambda g: g.lease_action("ack"))

        @rule(data=st.data())
        def release(self, data: Any) -> None:
            self._step(data, lambda g: g.lease_action("release"))

        @rule(data=st.data())
        def touch(self, data: Any) -> None:
            self._step(data, lambda g: g.lease_action("touch"))

        @rule(data=st.data())
        def revive(self, data: Any) -> None:
            self._step(data, ActionGenerator.revive)

        @rule(data=st.data())
        def get(self, data: Any) -> None:
            self._step(data, ActionGenerator.get)

        @rule()
        def compact(self) -> None:
            self.driver.step(Action("compact"))

        @rule()
        def close_and_reopen(self) -> None:
            self.driver.step(Action("reopen"))

        @rule()
        def discard_and_reopen(self) -> None:
            self.driver.step(Action("reopen", {"discard": True}))

        @rule(data=st.data())
        def batch(self, data: Any) -> None:
            self._step(data, ActionGenerator.batch)

        @rule(data=st.data())
        def crash_and_reopen(self, data: Any) -> None:
            self._step(data, ActionGenerator.crash)

        @invariant()
        def queue_agrees_with_model(self) -> None:
            self.driver.check_state()

        def teardown(self) -> None:
            try:
                self.driver.close()
            finally:
                shutil.rmtree(self.root, ignore_errors=True)

    return QueueAgainstReferenceModel
